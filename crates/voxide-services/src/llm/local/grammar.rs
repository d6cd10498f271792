//! The grammar of a tool call's arguments, derived from the tool's JSON schema.
//!
//! The local model writes argument values one token at a time, but only tokens the grammar allows
//! are eligible; keys, quotes and separators are written for it. Every call it makes therefore
//! parses and validates against the schema. Flat objects of strings, numbers, integers, booleans
//! and string enums are covered, which is what voice-bot tools use; a tool with other shapes is
//! not offered to the local model.

use serde_json::Value;

use voxide_core::context::FunctionSchema;

/// Longest string value the model may write.
const MAX_STRING_CHARS: usize = 80;
/// Longest number the model may write (digits, sign and point).
const MAX_NUMBER_CHARS: usize = 12;

/// The shape of one argument value.
#[derive(Debug, Clone, PartialEq)]
pub enum ValueKind {
    /// A JSON string.
    String,
    /// A JSON number with an optional fraction.
    Number,
    /// A JSON integer.
    Integer,
    /// `true` or `false`.
    Boolean,
    /// One of these strings.
    Enum(Vec<String>),
}

/// One argument the model writes.
#[derive(Debug, Clone, PartialEq)]
pub struct Field {
    /// The property name.
    pub name: String,
    /// What its value may be.
    pub kind: ValueKind,
}

/// The arguments of one tool, in the order the model writes them.
#[derive(Debug, Clone, PartialEq)]
pub struct ArgumentsGrammar {
    /// Required properties; optional ones are left out, so their defaults apply.
    pub fields: Vec<Field>,
}

impl ArgumentsGrammar {
    /// The grammar of `schema`'s arguments, or why the local model cannot write them.
    pub fn from_schema(schema: &FunctionSchema) -> Result<Self, String> {
        let fields = schema
            .required
            .iter()
            .map(|name| {
                let property = schema
                    .properties
                    .get(name)
                    .ok_or_else(|| format!("required property {name} is not described"))?;
                Ok(Field {
                    name: name.clone(),
                    kind: value_kind(property).ok_or_else(|| {
                        format!("property {name} has a shape the local model cannot write")
                    })?,
                })
            })
            .collect::<Result<_, String>>()?;
        Ok(Self { fields })
    }
}

fn value_kind(property: &Value) -> Option<ValueKind> {
    if let Some(values) = property.get("enum").and_then(Value::as_array) {
        let values: Option<Vec<String>> = values
            .iter()
            .map(|v| v.as_str().map(str::to_owned))
            .collect();
        return values.filter(|v| !v.is_empty()).map(ValueKind::Enum);
    }
    Some(match property.get("type")?.as_str()? {
        "string" => ValueKind::String,
        "number" => ValueKind::Number,
        "integer" => ValueKind::Integer,
        "boolean" => ValueKind::Boolean,
        _ => return None,
    })
}

/// What the grammar makes of the next token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The token extends the value.
    Take,
    /// The token ends the value (its text is not kept; the separator is written for the model).
    Close,
    /// Not allowed here.
    Reject,
}

impl ValueKind {
    /// Whether the value is written between quotes.
    pub fn quoted(&self) -> bool {
        matches!(self, Self::String | Self::Enum(_))
    }

    /// The verdict on `piece` after `so_far` has been written.
    pub fn judge(&self, so_far: &str, piece: &str) -> Verdict {
        if piece.is_empty() || piece.contains('\u{fffd}') {
            return Verdict::Reject;
        }
        match self {
            Self::String => {
                if piece.starts_with('"') {
                    return if so_far.trim().is_empty() {
                        Verdict::Reject
                    } else {
                        Verdict::Close
                    };
                }
                let clean = !piece
                    .chars()
                    .any(|c| c == '"' || c == '\\' || c.is_control());
                let fits = so_far.chars().count() + piece.chars().count() <= MAX_STRING_CHARS;
                if clean && fits && !(so_far.is_empty() && piece.starts_with(' ')) {
                    Verdict::Take
                } else {
                    Verdict::Reject
                }
            }
            Self::Number | Self::Integer => {
                if ends_number(piece) {
                    return if is_number(so_far, matches!(self, Self::Integer)) {
                        Verdict::Close
                    } else {
                        Verdict::Reject
                    };
                }
                let candidate = format!("{so_far}{piece}");
                if candidate.len() <= MAX_NUMBER_CHARS
                    && number_prefix(&candidate, matches!(self, Self::Integer))
                {
                    Verdict::Take
                } else {
                    Verdict::Reject
                }
            }
            Self::Boolean => literal(&["true", "false"], so_far, piece, ends_number),
            Self::Enum(values) => {
                let values: Vec<&str> = values.iter().map(String::as_str).collect();
                literal(&values, so_far, piece, |p| p.starts_with('"'))
            }
        }
    }

    /// True when `so_far` is complete and nothing longer could follow, so the value ends without
    /// asking the model.
    pub fn complete(&self, so_far: &str) -> bool {
        let values: Vec<&str> = match self {
            Self::Boolean => vec!["true", "false"],
            Self::Enum(values) => values.iter().map(String::as_str).collect(),
            Self::String => return so_far.chars().count() >= MAX_STRING_CHARS,
            Self::Number | Self::Integer => return so_far.len() >= MAX_NUMBER_CHARS,
        };
        values.contains(&so_far)
            && !values
                .iter()
                .any(|v| v.len() > so_far.len() && v.starts_with(so_far))
    }

    /// True when `so_far` is a whole value the grammar accepts.
    pub fn valid(&self, so_far: &str) -> bool {
        match self {
            Self::String => !so_far.trim().is_empty(),
            Self::Number => is_number(so_far, false),
            Self::Integer => is_number(so_far, true),
            Self::Boolean => so_far == "true" || so_far == "false",
            Self::Enum(values) => values.iter().any(|v| v == so_far),
        }
    }
}

fn ends_number(piece: &str) -> bool {
    piece.starts_with([',', '}', ' ', '\n'])
}

/// A whole literal out of `values`, token by token.
fn literal(values: &[&str], so_far: &str, piece: &str, ends: impl Fn(&str) -> bool) -> Verdict {
    if ends(piece) {
        return if values.contains(&so_far) {
            Verdict::Close
        } else {
            Verdict::Reject
        };
    }
    let candidate = format!("{so_far}{piece}");
    if values.iter().any(|v| v.starts_with(&candidate)) {
        Verdict::Take
    } else {
        Verdict::Reject
    }
}

/// True when `text` can still grow into a number.
fn number_prefix(text: &str, integer: bool) -> bool {
    let digits = text.strip_prefix('-').unwrap_or(text);
    let mut seen_point = false;
    for (i, c) in digits.chars().enumerate() {
        match c {
            '0'..='9' => {}
            '.' if !integer && !seen_point && i > 0 => seen_point = true,
            _ => return false,
        }
    }
    // No leading zeros: JSON forbids them.
    !(digits.len() > 1 && digits.starts_with('0') && !digits.starts_with("0."))
}

fn is_number(text: &str, integer: bool) -> bool {
    number_prefix(text, integer) && text.ends_with(|c: char| c.is_ascii_digit())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn schema_becomes_required_fields_in_order() {
        let schema = FunctionSchema::new("set_timer", "")
            .property("seconds", json!({"type": "integer"}), true)
            .property("label", json!({"type": "string"}), false)
            .property("unit", json!({"enum": ["s", "min"]}), true);
        let grammar = ArgumentsGrammar::from_schema(&schema).expect("supported");
        assert_eq!(
            grammar.fields,
            vec![
                Field {
                    name: "seconds".into(),
                    kind: ValueKind::Integer
                },
                Field {
                    name: "unit".into(),
                    kind: ValueKind::Enum(vec!["s".into(), "min".into()])
                },
            ]
        );
        let nested = FunctionSchema::new("f", "").property("x", json!({"type": "object"}), true);
        assert!(ArgumentsGrammar::from_schema(&nested).is_err());
    }

    #[test]
    fn numbers_take_digits_and_close_on_a_separator() {
        let int = ValueKind::Integer;
        assert_eq!(int.judge("", "30"), Verdict::Take);
        assert_eq!(int.judge("", "-"), Verdict::Take);
        assert_eq!(int.judge("", "}"), Verdict::Reject);
        assert_eq!(int.judge("-", ","), Verdict::Reject);
        assert_eq!(int.judge("30", ","), Verdict::Close);
        assert_eq!(int.judge("3", "."), Verdict::Reject);
        assert_eq!(int.judge("", "0"), Verdict::Take);
        assert_eq!(int.judge("0", "5"), Verdict::Reject);
        assert_eq!(int.judge("", "ten"), Verdict::Reject);
        let num = ValueKind::Number;
        assert_eq!(num.judge("3", "."), Verdict::Take);
        assert_eq!(num.judge("3.", "}"), Verdict::Reject);
        assert_eq!(num.judge("3.5", "}"), Verdict::Close);
        assert!(num.valid("-2.25") && !num.valid("2.") && !num.valid(""));
    }

    #[test]
    fn strings_refuse_quotes_escapes_and_an_empty_value() {
        let s = ValueKind::String;
        assert_eq!(s.judge("", "\""), Verdict::Reject);
        assert_eq!(s.judge("", "tea"), Verdict::Take);
        assert_eq!(s.judge("tea", " time"), Verdict::Take);
        assert_eq!(s.judge("tea", "\"}"), Verdict::Close);
        assert_eq!(s.judge("tea", "a\"b"), Verdict::Reject);
        assert_eq!(s.judge("tea", "\\n"), Verdict::Reject);
        assert_eq!(s.judge("tea", "\u{fffd}"), Verdict::Reject);
    }

    #[test]
    fn literals_follow_their_prefixes_and_complete_alone() {
        let e = ValueKind::Enum(vec!["celsius".into(), "fahrenheit".into()]);
        assert_eq!(e.judge("", "c"), Verdict::Take);
        assert_eq!(e.judge("c", "elsius"), Verdict::Take);
        assert_eq!(e.judge("c", "at"), Verdict::Reject);
        assert_eq!(e.judge("celsius", "\""), Verdict::Close);
        assert!(e.complete("celsius") && !e.complete("cel"));
        let b = ValueKind::Boolean;
        assert_eq!(b.judge("", "true"), Verdict::Take);
        assert_eq!(b.judge("", "yes"), Verdict::Reject);
        assert!(b.complete("false"));
    }
}
