//! Context messages for asynchronous tool calls, in pipecat's wire format.
//!
//! An async call (registered with `cancel_on_interruption = false`) leaves three kinds of message in
//! the context: *started* (role `tool`, answering the call), then *intermediate* and *final* results
//! (role `developer`). Their content is a JSON string, written the way Python's `json.dumps`
//! writes it (`", "` and `": "` separators, non-ASCII escaped) so contexts interoperate with
//! pipecat byte for byte:
//!
//! `{"type": "async_tool", "status": "running"|"finished", "tool_call_id": ID, "description": TEXT, "result": RESULT}`
//!
//! `result` is absent from *started* and is itself a JSON-encoded string (or `COMPLETED` when the
//! tool returned nothing; a cancelled call's result starts with `CANCELLED`). The typed
//! [`AsyncToolMessagePayload`] is the single source of truth; the string is always derived from it.

use serde_json::{Map, Value};

use super::{Content, InstructionMessage, Message, ToolMessage};

/// The `type` every async-tool payload carries.
pub const ASYNC_TOOL_TYPE: &str = "async_tool";
/// The result of a tool that returned nothing.
pub const COMPLETED: &str = "COMPLETED";
/// The prefix of a cancelled call's result.
pub const CANCELLED: &str = "CANCELLED";

const STARTED_DESCRIPTION: &str = "This tool runs in the background. Its result has not arrived \
yet and will be added to the conversation as a later message. Do not call the tool again for \
the same request and do not guess its result.";
const INTERMEDIATE_DESCRIPTION: &str = "A partial update from a tool that is still running in \
the background. More updates or the final result may follow.";
const FINAL_DESCRIPTION: &str = "The final result of a tool that ran in the background. Answer \
what the user just said first, then share this result once.";
const CANCELLED_DESCRIPTION: &str = "A background tool call was cancelled before it finished. \
It produced no result and is no longer running.";

/// Appended to the system instruction when any async tool is registered.
pub const ASYNC_TOOL_INSTRUCTIONS: &str = "Some tools run in the background. When you call one, \
the conversation goes on while it works. Messages whose content is JSON with \"type\": \
\"async_tool\" report on such a call, matched by its tool_call_id: \"running\" means it is still \
working (a \"result\" there is a partial update), \"finished\" carries its final result. Never \
call the tool again while its call is running, never make up a result that has not arrived, and \
when a final result comes, first answer whatever the user has just said, then tell them the \
result once.";

/// Which message of an async call's life this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncToolMessageKind {
    /// The call began; no result yet.
    Started,
    /// A partial result; the call still runs.
    Intermediate,
    /// The call settled.
    Final,
}

/// The `status` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AsyncToolStatus {
    /// Still running.
    Running,
    /// Settled.
    Finished,
}

impl AsyncToolStatus {
    fn as_str(self) -> &'static str {
        match self {
            AsyncToolStatus::Running => "running",
            AsyncToolStatus::Finished => "finished",
        }
    }
}

/// The typed content of an async-tool message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AsyncToolMessagePayload {
    /// Which message this is.
    pub kind: AsyncToolMessageKind,
    /// The call it is about.
    pub tool_call_id: String,
    /// Running or finished.
    pub status: AsyncToolStatus,
    /// Guidance for the model.
    pub description: String,
    /// The result string (`None` for started).
    pub result: Option<String>,
}

impl AsyncToolMessagePayload {
    /// True when this is a final payload for a cancelled call.
    pub fn is_cancelled(&self) -> bool {
        self.kind == AsyncToolMessageKind::Final
            && self
                .result
                .as_deref()
                .is_some_and(|r| r.starts_with(CANCELLED))
    }

    /// The content string, keys in wire order, formatted as pipecat writes it.
    pub fn to_content(&self) -> String {
        let mut out = String::from("{");
        let mut field = |key: &str, value: &str, first: bool| {
            if !first {
                out.push_str(", ");
            }
            write_py_string(&mut out, key);
            out.push_str(": ");
            write_py_string(&mut out, value);
        };
        field("type", ASYNC_TOOL_TYPE, true);
        field("status", self.status.as_str(), false);
        field("tool_call_id", &self.tool_call_id, false);
        field("description", &self.description, false);
        if let Some(result) = &self.result {
            field("result", result, false);
        }
        out.push('}');
        out
    }

    /// The context message carrying this payload.
    pub fn to_message(&self) -> Message {
        let content = Content::Text(self.to_content());
        match self.kind {
            AsyncToolMessageKind::Started => Message::Tool(ToolMessage {
                tool_call_id: self.tool_call_id.clone(),
                content,
                extra: Map::new(),
            }),
            AsyncToolMessageKind::Intermediate | AsyncToolMessageKind::Final => {
                Message::Developer(InstructionMessage {
                    content,
                    name: None,
                    extra: Map::new(),
                })
            }
        }
    }
}

/// Encodes a tool's return value as the `result` string: JSON as Python writes it, or
/// `COMPLETED` when the tool returned nothing.
pub fn encode_result(result: Option<&Value>) -> String {
    match result {
        None | Some(Value::Null) => COMPLETED.to_owned(),
        Some(value) => python_json(value),
    }
}

/// The *started* message for `tool_call_id`.
pub fn build_started_message(tool_call_id: &str) -> Message {
    AsyncToolMessagePayload {
        kind: AsyncToolMessageKind::Started,
        tool_call_id: tool_call_id.to_owned(),
        status: AsyncToolStatus::Running,
        description: STARTED_DESCRIPTION.to_owned(),
        result: None,
    }
    .to_message()
}

/// An *intermediate* result message.
pub fn build_intermediate_result_message(tool_call_id: &str, result: Option<&Value>) -> Message {
    AsyncToolMessagePayload {
        kind: AsyncToolMessageKind::Intermediate,
        tool_call_id: tool_call_id.to_owned(),
        status: AsyncToolStatus::Running,
        description: INTERMEDIATE_DESCRIPTION.to_owned(),
        result: Some(encode_result(result)),
    }
    .to_message()
}

/// The *final* result message.
pub fn build_final_result_message(tool_call_id: &str, result: Option<&Value>) -> Message {
    AsyncToolMessagePayload {
        kind: AsyncToolMessageKind::Final,
        tool_call_id: tool_call_id.to_owned(),
        status: AsyncToolStatus::Finished,
        description: FINAL_DESCRIPTION.to_owned(),
        result: Some(encode_result(result)),
    }
    .to_message()
}

/// The final message of a cancelled call.
pub fn build_cancelled_message(tool_call_id: &str) -> Message {
    AsyncToolMessagePayload {
        kind: AsyncToolMessageKind::Final,
        tool_call_id: tool_call_id.to_owned(),
        status: AsyncToolStatus::Finished,
        description: CANCELLED_DESCRIPTION.to_owned(),
        result: Some(format!(
            "{CANCELLED}: the call was cancelled and returned no result."
        )),
    }
    .to_message()
}

/// Recognises an async-tool message, whatever its description says. `None` for anything else:
/// other roles, non-string content, invalid JSON, a non-object, another `type`, a missing or
/// non-string id, an unknown status, or a role that does not match the status.
pub fn parse_message(message: &Message) -> Option<AsyncToolMessagePayload> {
    let (content, from_tool) = match message {
        Message::Tool(m) => (&m.content, true),
        Message::Developer(m) => (&m.content, false),
        _ => return None,
    };
    let Content::Text(text) = content else {
        return None;
    };
    let Value::Object(map) = serde_json::from_str::<Value>(text).ok()? else {
        return None;
    };
    if map.get("type")?.as_str()? != ASYNC_TOOL_TYPE {
        return None;
    }
    let tool_call_id = map.get("tool_call_id")?.as_str()?.to_owned();
    let status = match map.get("status")?.as_str()? {
        "running" => AsyncToolStatus::Running,
        "finished" => AsyncToolStatus::Finished,
        _ => return None,
    };
    let description = map
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let result = match map.get("result") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        // A result someone wrote as raw JSON rather than a string: keep it, as text.
        Some(other) => Some(python_json(other)),
    };
    let kind = match (from_tool, status) {
        (true, AsyncToolStatus::Running) => AsyncToolMessageKind::Started,
        (false, AsyncToolStatus::Running) => AsyncToolMessageKind::Intermediate,
        (false, AsyncToolStatus::Finished) => AsyncToolMessageKind::Final,
        // pipecat may rewrite the started placeholder in place with the final payload.
        (true, AsyncToolStatus::Finished) => AsyncToolMessageKind::Final,
    };
    Some(AsyncToolMessagePayload {
        kind,
        tool_call_id,
        status,
        description,
        result,
    })
}

/// Writes `value` as Python's `json.dumps` does by default.
pub fn python_json(value: &Value) -> String {
    let mut out = String::new();
    write_py_value(&mut out, value);
    out
}

fn write_py_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => match (n.as_i64(), n.as_u64(), n.as_f64()) {
            (Some(i), _, _) => out.push_str(&i.to_string()),
            (_, Some(u), _) => out.push_str(&u.to_string()),
            (_, _, Some(f)) => out.push_str(&python_float(f)),
            _ => out.push_str(&n.to_string()),
        },
        Value::String(s) => write_py_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_py_string(out, k);
                out.push_str(": ");
                write_py_value(out, v);
            }
            out.push('}');
        }
    }
}

/// Python's `repr` of a float: always a decimal point or exponent, exponent with a sign.
fn python_float(f: f64) -> String {
    if f.is_nan() {
        return "NaN".to_owned();
    }
    if f.is_infinite() {
        return if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned();
    }
    let abs = f.abs();
    if abs != 0.0 && !(1e-4..1e16).contains(&abs) {
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let exp: i32 = exp.parse().unwrap_or(0);
        let sign = if exp < 0 { '-' } else { '+' };
        return format!("{mantissa}e{sign}{:02}", exp.abs());
    }
    let s = format!("{f}");
    if s.contains('.') { s } else { format!("{s}.0") }
}

/// A JSON string with `ensure_ascii`: non-ASCII as `\uXXXX` (surrogate pairs beyond the BMP).
fn write_py_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (c as u32) > 0x7e => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn started_is_a_tool_message_with_keys_in_wire_order() {
        let m = build_started_message("call_1");
        let v = serde_json::to_value(&m).expect("json");
        assert_eq!(v["role"], "tool");
        assert_eq!(v["tool_call_id"], "call_1");
        let content = v["content"].as_str().expect("string");
        assert!(
            content.starts_with(r#"{"type": "async_tool", "status": "running", "tool_call_id": "call_1", "description": ""#),
            "{content}"
        );
        assert!(!content.contains("\"result\""));
    }

    #[test]
    fn results_are_json_encoded_strings_as_python_writes_them() {
        let m = build_final_result_message(
            "c",
            Some(&json!({"temp": 21.5, "city": "Zürich", "ok": true})),
        );
        let p = parse_message(&m).expect("parses");
        assert_eq!(p.kind, AsyncToolMessageKind::Final);
        assert_eq!(p.status, AsyncToolStatus::Finished);
        assert_eq!(
            p.result.as_deref(),
            Some(r#"{"temp": 21.5, "city": "Z\u00fcrich", "ok": true}"#)
        );
        assert!(m.text().expect("text").ends_with(
            r#""result": "{\"temp\": 21.5, \"city\": \"Z\\u00fcrich\", \"ok\": true}"}"#
        ));
        assert_eq!(serde_json::to_value(&m).expect("json")["role"], "developer");
    }

    #[test]
    fn nothing_returned_is_completed_and_cancelled_is_marked() {
        let p = parse_message(&build_final_result_message("c", None)).expect("parses");
        assert_eq!(p.result.as_deref(), Some(COMPLETED));
        assert!(!p.is_cancelled());
        let p = parse_message(&build_cancelled_message("c")).expect("parses");
        assert!(p.is_cancelled());
        let p = parse_message(&build_intermediate_result_message("c", Some(&json!("50%"))))
            .expect("parses");
        assert_eq!(p.kind, AsyncToolMessageKind::Intermediate);
        assert_eq!(p.result.as_deref(), Some(r#""50%""#));
    }

    #[test]
    fn the_string_is_derived_from_the_payload_and_parses_back_to_it() {
        for m in [
            build_started_message("a"),
            build_intermediate_result_message("b", Some(&json!([1, 2.5, null]))),
            build_final_result_message("c", Some(&json!({"nested": {"x": "y"}}))),
            build_cancelled_message("d"),
        ] {
            let p = parse_message(&m).expect("parses");
            assert_eq!(p.to_message(), m);
        }
    }

    #[test]
    fn parse_accepts_any_description_and_pipecat_formatting() {
        let m = Message::developer(
            r#"{"type":"async_tool","status":"finished","tool_call_id":"x","description":"whatever","result":"42"}"#,
        );
        let p = parse_message(&m).expect("parses");
        assert_eq!(
            (p.tool_call_id.as_str(), p.result.as_deref()),
            ("x", Some("42"))
        );
    }

    #[test]
    fn parse_rejects_everything_else() {
        let valid = r#"{"type": "async_tool", "status": "running", "tool_call_id": "x", "description": "d"}"#;
        assert!(parse_message(&Message::tool("x", valid)).is_some());
        let rejected = [
            Message::user(valid),
            Message::system(valid),
            Message::assistant(valid),
            Message::tool("x", "not json"),
            Message::tool("x", "[1, 2]"),
            Message::tool("x", "\"a string\""),
            Message::tool(
                "x",
                r#"{"type": "sync_tool", "status": "running", "tool_call_id": "x"}"#,
            ),
            Message::tool("x", r#"{"status": "running", "tool_call_id": "x"}"#),
            Message::tool("x", r#"{"type": "async_tool", "status": "running"}"#),
            Message::tool(
                "x",
                r#"{"type": "async_tool", "status": "running", "tool_call_id": 7}"#,
            ),
            Message::tool(
                "x",
                r#"{"type": "async_tool", "status": "paused", "tool_call_id": "x"}"#,
            ),
            Message::tool("x", r#"{"type": "async_tool", "tool_call_id": "x"}"#),
        ];
        for m in rejected {
            assert!(parse_message(&m).is_none(), "{m:?}");
        }
        let parts: Message = serde_json::from_value(
            json!({"role": "developer", "content": [{"type": "text", "text": valid}]}),
        )
        .expect("parses");
        assert!(parse_message(&parts).is_none(), "non-string content");
    }

    #[test]
    fn python_floats_and_escapes() {
        assert_eq!(python_json(&json!(1.0)), "1.0");
        assert_eq!(python_json(&json!(1e20)), "1e+20");
        assert_eq!(python_json(&json!(2.5e-7)), "2.5e-07");
        assert_eq!(
            python_json(&json!("a\"b\\c\n😀")),
            r#""a\"b\\c\n\ud83d\ude00""#
        );
    }
}
