//! A safe arithmetic evaluator for the `calculate` tool: numbers, `+ - * / % ^`, parentheses and
//! `sqrt`, plus the spoken forms a transcript carries ("twelve times seven", "half of 30").
//! It parses; it never runs code.

/// Why an expression has no value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CalcError {
    /// Something in the expression is not arithmetic.
    #[error("cannot read {0:?} in the expression")]
    Unexpected(String),
    /// The expression stopped half way.
    #[error("the expression is incomplete")]
    Incomplete,
    /// Division by zero, or a result too large to be a number.
    #[error("the result is not a finite number")]
    NotFinite,
    /// The expression is longer or deeper than a spoken question would be.
    #[error("the expression is too long")]
    TooLong,
}

const MAX_CHARS: usize = 256;
const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Number(f64),
    Op(char),
    Open,
    Close,
    Sqrt,
}

/// Evaluates `expression`.
pub fn evaluate(expression: &str) -> Result<f64, CalcError> {
    if expression.chars().count() > MAX_CHARS {
        return Err(CalcError::TooLong);
    }
    parse(&tokenize(expression)?)
}

fn parse(tokens: &[Token]) -> Result<f64, CalcError> {
    let mut parser = Parser {
        tokens,
        at: 0,
        depth: 0,
    };
    let value = parser.sum()?;
    match tokens.get(parser.at) {
        None if value.is_finite() => Ok(value),
        None => Err(CalcError::NotFinite),
        Some(t) => Err(CalcError::Unexpected(format!("{t:?}"))),
    }
}

/// Formats a result the way it is said: no trailing `.0`, at most six decimals.
pub fn format_number(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 {
        format!("{}", value as i64)
    } else {
        let text = format!("{value:.6}");
        text.trim_end_matches('0').trim_end_matches('.').to_owned()
    }
}

fn small_number(word: &str) -> Option<f64> {
    const UNITS: [&str; 20] = [
        "zero",
        "one",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
        "thirteen",
        "fourteen",
        "fifteen",
        "sixteen",
        "seventeen",
        "eighteen",
        "nineteen",
    ];
    const TENS: [&str; 8] = [
        "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety",
    ];
    if let Some(i) = UNITS.iter().position(|u| *u == word) {
        return Some(i as f64);
    }
    TENS.iter()
        .position(|t| *t == word)
        .map(|i| (i as f64 + 2.0) * 10.0)
}

/// Whether `word` (lowercase) is one a number is said in: "seven", "forty", "hundred", or the
/// "and" of "one hundred and four".
pub fn is_number_word(word: &str) -> bool {
    word == "and" || small_number(word).is_some() || scale(word).is_some()
}

fn scale(word: &str) -> Option<f64> {
    match word {
        "hundred" => Some(100.0),
        "thousand" => Some(1e3),
        "million" => Some(1e6),
        "billion" => Some(1e9),
        _ => None,
    }
}

/// Spoken operators, longest first so "divided by" wins over a lone "by".
/// "square root on" is Whisper's: on espeak-ng voices it often hears "of" as "on" ("What is
/// the square root on the 81?", "what day on the week", "the capital city on Italy").
const SPOKEN_OPS: [(&str, &str); 16] = [
    ("% of", "% *"),
    ("to the power of", "^"),
    ("multiplied by", "*"),
    ("divided by", "/"),
    ("square root of", "sqrt"),
    ("square root on", "sqrt"),
    ("percent of", "% *"),
    ("half of", "0.5 *"),
    ("times", "*"),
    ("plus", "+"),
    ("minus", "-"),
    ("over", "/"),
    ("modulo", "%"),
    ("mod", "%"),
    ("squared", "^ 2"),
    ("x", "*"),
];

/// The most words a spoken sum (its numbers, operators and verb) is read from.
const MAX_SUM_WORDS: usize = 24;

/// The arithmetic a sentence asks for, written the way [`evaluate`] reads it: "What is
/// seventeen times twenty three?" gives `17 * 23`, "Can you add 3.5 and 4.25?" `3.5 + 4.25`.
/// Verbs that put their operands around a preposition ("add 3 to 5", "subtract 4 from 10",
/// "multiply 6 by 7", "divide 100 by 4") are read too. `None` when the words hold no sum: fewer
/// than two numbers, or one without a square root, a square or a percentage.
pub fn read_arithmetic(sentence: &str) -> Option<String> {
    let text = symbols(sentence);
    let words: Vec<&str> = text
        .split_whitespace()
        .map(|w| w.trim_end_matches('.'))
        .filter(|w| !w.is_empty())
        .collect();
    if let Some(expression) = read_verb(&words) {
        return Some(expression);
    }
    // The longest run of words that is a sum (one said aloud is never longer than
    // MAX_SUM_WORDS: the bound keeps a long transcript from costing the cube of its length).
    // A run with a word that is no number, operator or filler cannot be a sum: only runs of
    // such words are tried.
    let usable: Vec<bool> = words.iter().map(|w| sum_word(w)).collect();
    let mut best: Option<Vec<Token>> = None;
    for start in 0..words.len() {
        let run_end = usable[start..]
            .iter()
            .position(|u| !u)
            .map_or(words.len(), |i| start + i);
        let last = run_end.min(start + MAX_SUM_WORDS);
        for end in (start + 1..=last).rev() {
            if best.as_ref().is_some_and(|b| b.len() >= end - start) {
                break;
            }
            let Ok(tokens) = tokenize_words(&words[start..end]) else {
                continue;
            };
            if is_sum(&tokens) && parse(&tokens).is_ok() {
                best = Some(tokens);
                break;
            }
        }
    }
    best.map(|tokens| write(&tokens))
}

/// Whether `word` (after [`symbols`]) can be part of a sum: a number in digits or words, a
/// scale, an operator, a bracket, or a word [`tokenize`] reads past ("and", "what", "the").
fn sum_word(word: &str) -> bool {
    small_number(word).is_some()
        || scale(word).is_some()
        || matches!(
            word,
            "and" | "what" | "is" | "whats" | "what's" | "the" | "of" | "(" | ")" | "sqrt"
        )
        || matches!(word, "+" | "-" | "*" | "/" | "%" | "^")
        || word.parse::<f64>().is_ok()
}

/// "add A to B", "subtract A from B", "multiply A by B", "divide A by B", "the sum of A and B".
fn read_verb(words: &[&str]) -> Option<String> {
    const VERBS: [(&str, &[&str], &str, bool); 7] = [
        ("add", &["to", "and"], "+", false),
        ("subtract", &["from"], "-", true),
        ("take", &["from"], "-", true),
        ("multiply", &["by", "and"], "*", false),
        ("divide", &["by"], "/", false),
        ("sum", &["and"], "+", false),
        ("product", &["and"], "*", false),
    ];
    for (verb, joins, op, swapped) in VERBS {
        let Some(at) = words.iter().position(|w| *w == verb) else {
            continue;
        };
        let rest: Vec<&str> = words[at + 1..]
            .iter()
            .copied()
            .filter(|w| *w != "away")
            .take(MAX_SUM_WORDS)
            .collect();
        for join in joins {
            // The last join word whose two sides are numbers ("three hundred and five to two").
            for split in (0..rest.len()).rev().filter(|&i| rest[i] == *join) {
                let left = (0..split).find_map(|s| number_of(&rest[s..split]));
                let right = (split + 1..=rest.len())
                    .rev()
                    .find_map(|e| number_of(&rest[split + 1..e]));
                if let (Some(a), Some(b)) = (left, right) {
                    let (a, b) = if swapped { (b, a) } else { (a, b) };
                    return Some(format!("{} {op} {}", format_number(a), format_number(b)));
                }
            }
        }
    }
    None
}

/// The value of words that say one number ("three hundred and five", "4.25").
pub fn read_number(words: &str) -> Option<f64> {
    let text = symbols(words);
    number_of(&text.split_whitespace().collect::<Vec<_>>())
}

/// The value of words already through [`symbols`] that say one number.
fn number_of(words: &[&str]) -> Option<f64> {
    match tokenize_words(words).ok()?.as_slice() {
        [Token::Number(n)] => Some(*n),
        _ => None,
    }
}

/// Two numbers and an operator, or one with a square root, a square or a percentage.
fn is_sum(tokens: &[Token]) -> bool {
    let numbers = tokens
        .iter()
        .filter(|t| matches!(t, Token::Number(_)))
        .count();
    let operators = tokens.iter().any(|t| matches!(t, Token::Op(_)));
    let root = tokens.contains(&Token::Sqrt);
    (numbers >= 2 && operators) || (numbers == 1 && (root || tokens.contains(&Token::Op('%'))))
}

/// Tokens as an expression, one space apart.
fn write(tokens: &[Token]) -> String {
    tokens
        .iter()
        .map(|t| match t {
            Token::Number(n) => format_number(*n),
            Token::Op(op) => op.to_string(),
            Token::Open => "(".into(),
            Token::Close => ")".into(),
            Token::Sqrt => "sqrt".into(),
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// An expression in words a voice can say: `17 * 23` is "17 times 23", `sqrt 81` "the square
/// root of 81", `15 % * 80` "15 percent of 80". Unreadable text comes back as it was.
pub fn say_expression(expression: &str) -> String {
    let Ok(tokens) = tokenize(expression) else {
        return expression.to_owned();
    };
    let mut words = Vec::new();
    let mut at = 0;
    while let Some(token) = tokens.get(at) {
        let next = tokens.get(at + 1);
        words.push(match token {
            Token::Number(n) => format_number(*n),
            Token::Op('%') if next == Some(&Token::Op('*')) => {
                at += 1;
                "percent of".into()
            }
            Token::Op('%')
                if matches!(next, Some(Token::Number(_) | Token::Open | Token::Sqrt)) =>
            {
                "modulo".into()
            }
            Token::Op('%') => "percent".into(),
            Token::Op('^') if next == Some(&Token::Number(2.0)) && tokens.len() == at + 2 => {
                at += 1;
                "squared".into()
            }
            Token::Op(op) => match op {
                '*' => "times",
                '/' => "divided by",
                '+' => "plus",
                '-' => "minus",
                _ => "to the power of",
            }
            .into(),
            Token::Open | Token::Close => String::new(),
            Token::Sqrt => "the square root of".into(),
        });
        at += 1;
    }
    words.retain(|w| !w.is_empty());
    words.join(" ")
}

/// Lower case, spoken operators as symbols, punctuation dropped, one space between words.
fn symbols(expression: &str) -> String {
    // A hyphen between letters joins words ("twenty-five"); elsewhere it is a minus.
    let chars: Vec<char> = expression.chars().collect();
    let joined: String = chars
        .iter()
        .enumerate()
        .map(|(i, &c)| {
            let letter = |j: Option<usize>| {
                j.and_then(|j| chars.get(j))
                    .is_some_and(|c| c.is_alphabetic())
            };
            if c == '-' && letter(i.checked_sub(1)) && letter(Some(i + 1)) {
                ' '
            } else {
                c
            }
        })
        .collect();
    let mut text = format!(
        " {} ",
        joined
            .to_lowercase()
            .replace(['×', '·'], "*")
            .replace('÷', "/")
            .replace([',', '?', '!', '='], "")
    );
    for symbol in ['+', '-', '*', '/', '%', '^', '(', ')'] {
        text = text.replace(symbol, &format!(" {symbol} "));
    }
    text = format!(
        " {} ",
        text.split_whitespace().collect::<Vec<_>>().join(" ")
    );
    for (words, symbol) in SPOKEN_OPS {
        text = text.replace(&format!(" {words} "), &format!(" {symbol} "));
    }
    for scale in ["hundred", "thousand", "million"] {
        text = text.replace(&format!(" a {scale} "), &format!(" one {scale} "));
    }
    text
}

fn tokenize(expression: &str) -> Result<Vec<Token>, CalcError> {
    // Words first: lower-case, spoken operators to symbols.
    let text = symbols(expression);
    tokenize_words(&text.split_whitespace().collect::<Vec<_>>())
}

/// Tokens of words already through [`symbols`] (the readers above try many runs of one
/// sentence's words, and put the sentence through [`symbols`] once); filler is dropped.
fn tokenize_words(words: &[&str]) -> Result<Vec<Token>, CalcError> {
    let words = words
        .iter()
        .copied()
        .filter(|w| !matches!(*w, "what" | "is" | "whats" | "what's" | "the" | "of"));

    let mut tokens = Vec::new();
    let mut spoken: Option<(f64, f64)> = None; // (finished groups, current group)
    // An "and" after a round number in digits: the next number may complete it.
    let mut joining = false;
    let flush = |spoken: &mut Option<(f64, f64)>, tokens: &mut Vec<Token>| {
        if let Some((total, group)) = spoken.take() {
            tokens.push(Token::Number(total + group));
        }
    };
    for word in words {
        if let Some(n) = small_number(word) {
            let (total, group) = spoken.unwrap_or((0.0, 0.0));
            spoken = Some((total, group + n));
            continue;
        }
        if let Some(s) = scale(word) {
            let (total, group) = spoken.ok_or_else(|| CalcError::Unexpected(word.into()))?;
            let group = if group == 0.0 { 1.0 } else { group };
            spoken = Some(if s >= 1e3 {
                (total + group * s, 0.0)
            } else {
                (total, group * s)
            });
            continue;
        }
        if word == "and" && spoken.is_some() {
            continue;
        }
        flush(&mut spoken, &mut tokens);
        if word == "and" && matches!(tokens.last(), Some(Token::Number(n)) if place(*n).is_some()) {
            joining = true;
            continue;
        }
        if std::mem::take(&mut joining) {
            // Whisper writes "two hundred and fifty" as "200 and 50": a round number in
            // digits, "and", and a number below its place are one number.
            let part = word.parse::<f64>().ok();
            match (tokens.last_mut(), part) {
                (Some(Token::Number(whole)), Some(part))
                    if part.fract() == 0.0
                        && place(*whole).is_some_and(|p| part >= 1.0 && part < p) =>
                {
                    *whole += part;
                    continue;
                }
                _ => return Err(CalcError::Unexpected("and".into())),
            }
        }
        let token = match word {
            "(" => Token::Open,
            ")" => Token::Close,
            "sqrt" => Token::Sqrt,
            "+" | "-" | "*" | "/" | "%" | "^" => Token::Op(word.chars().next().unwrap_or('+')),
            _ => {
                let n = word
                    .parse::<f64>()
                    .map_err(|_| CalcError::Unexpected(word.into()))?;
                // Whisper writes "thirty seven" as "30 7": tens and a unit next to each other
                // are one number.
                if let Some(Token::Number(tens)) = tokens.last_mut()
                    && is_tens(*tens)
                    && (1.0..=9.0).contains(&n)
                    && n.fract() == 0.0
                {
                    *tens += n;
                    continue;
                }
                Token::Number(n)
            }
        };
        tokens.push(token);
    }
    flush(&mut spoken, &mut tokens);
    if joining {
        return Err(CalcError::Unexpected("and".into()));
    }
    if tokens.is_empty() {
        return Err(CalcError::Incomplete);
    }
    Ok(tokens)
}

/// Twenty, thirty, … ninety.
fn is_tens(n: f64) -> bool {
    (20.0..=90.0).contains(&n) && n % 10.0 == 0.0
}

/// The place a round number in digits leaves open below it: 100 for 200, 1,000 for 3,000;
/// `None` for a number that is not round.
fn place(n: f64) -> Option<f64> {
    if n <= 0.0 || n.fract() != 0.0 {
        return None;
    }
    [1e6, 1e3, 1e2].into_iter().find(|p| n % p == 0.0)
}

struct Parser<'a> {
    tokens: &'a [Token],
    at: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Option<Token> {
        let token = self.tokens.get(self.at).cloned();
        self.at += 1;
        token
    }

    /// sum := product (('+' | '-') product)*
    fn sum(&mut self) -> Result<f64, CalcError> {
        let mut value = self.product()?;
        while let Some(Token::Op(op @ ('+' | '-'))) = self.peek().cloned() {
            self.at += 1;
            let rhs = self.product()?;
            value = if op == '+' { value + rhs } else { value - rhs };
        }
        Ok(value)
    }

    /// product := unary (('*' | '/' | '%') unary)*
    fn product(&mut self) -> Result<f64, CalcError> {
        let mut value = self.unary()?;
        while let Some(Token::Op(op @ ('*' | '/' | '%'))) = self.peek().cloned() {
            self.at += 1;
            let rhs = self.unary()?;
            value = match op {
                '*' => value * rhs,
                '/' if rhs == 0.0 => return Err(CalcError::NotFinite),
                '/' => value / rhs,
                _ => value % rhs,
            };
        }
        Ok(value)
    }

    /// unary := ('-' | '+') unary | power
    fn unary(&mut self) -> Result<f64, CalcError> {
        match self.peek() {
            Some(Token::Op('-')) => {
                self.at += 1;
                Ok(-self.nested(Self::unary)?)
            }
            Some(Token::Op('+')) => {
                self.at += 1;
                self.nested(Self::unary)
            }
            _ => self.power(),
        }
    }

    /// power := percent ('^' unary)?
    fn power(&mut self) -> Result<f64, CalcError> {
        let base = self.percent()?;
        if let Some(Token::Op('^')) = self.peek() {
            self.at += 1;
            let exponent = self.nested(Self::unary)?;
            return Ok(base.powf(exponent));
        }
        Ok(base)
    }

    /// percent := atom ['%'], where a '%' with no operand after it makes a percentage:
    /// "15 %" is 0.15, and "15 percent of 80" reads as `15 % * 80`.
    fn percent(&mut self) -> Result<f64, CalcError> {
        let value = self.atom()?;
        if let Some(Token::Op('%')) = self.peek() {
            let operand_follows = matches!(
                self.tokens.get(self.at + 1),
                Some(Token::Number(_) | Token::Open | Token::Sqrt | Token::Op('-'))
            );
            if !operand_follows {
                self.at += 1;
                return Ok(value / 100.0);
            }
        }
        Ok(value)
    }

    /// atom := number | '(' sum ')' | 'sqrt' atom
    fn atom(&mut self) -> Result<f64, CalcError> {
        match self.next() {
            Some(Token::Number(n)) => Ok(n),
            Some(Token::Open) => {
                let value = self.nested(Self::sum)?;
                match self.next() {
                    Some(Token::Close) => Ok(value),
                    Some(t) => Err(CalcError::Unexpected(format!("{t:?}"))),
                    None => Err(CalcError::Incomplete),
                }
            }
            Some(Token::Sqrt) => {
                let value = self.nested(Self::unary)?;
                if value < 0.0 {
                    return Err(CalcError::NotFinite);
                }
                Ok(value.sqrt())
            }
            Some(t) => Err(CalcError::Unexpected(format!("{t:?}"))),
            None => Err(CalcError::Incomplete),
        }
    }

    fn nested(&mut self, rule: fn(&mut Self) -> Result<f64, CalcError>) -> Result<f64, CalcError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return Err(CalcError::TooLong);
        }
        let value = rule(self);
        self.depth -= 1;
        value
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str) -> f64 {
        evaluate(text).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[test]
    fn a_sum_at_the_end_of_a_long_monologue_is_still_read() {
        let long = format!(
            "{} so what is seventeen times twenty three",
            "and then we went on and on about the weather ".repeat(60)
        );
        assert_eq!(read_arithmetic(&long).as_deref(), Some("17 * 23"));
        let verb = format!("{} add three to five", "one two ".repeat(200));
        assert!(read_arithmetic(&verb).is_some());
    }

    #[test]
    fn symbols_follow_precedence_and_associativity() {
        assert_eq!(eval("2 + 3 * 4"), 14.0);
        assert_eq!(eval("(2 + 3) * 4"), 20.0);
        assert_eq!(eval("10 - 4 - 3"), 3.0);
        assert_eq!(eval("2 ^ 3 ^ 2"), 512.0);
        assert_eq!(eval("-2 ^ 2"), -4.0);
        assert_eq!(eval("17 % 5"), 2.0);
        assert_eq!(eval("sqrt(16) + 1"), 5.0);
        assert_eq!(eval("1,250 / 5"), 250.0);
        assert_eq!(eval("3 × 4 ÷ 2"), 6.0);
        assert_eq!(eval("7.5*2"), 15.0);
    }

    #[test]
    fn spoken_arithmetic_is_understood() {
        assert_eq!(eval("twelve times seven"), 84.0);
        assert_eq!(eval("What is twenty five plus seventeen?"), 42.0);
        assert_eq!(eval("three hundred and five divided by five"), 61.0);
        assert_eq!(eval("two thousand twenty six minus 1990"), 36.0);
        assert_eq!(eval("15 percent of 80"), 12.0);
        assert_eq!(eval("15% of 80"), 12.0);
        assert_eq!(eval("half of 30"), 15.0);
        assert_eq!(eval("nine squared"), 81.0);
        assert_eq!(eval("square root of 81"), 9.0);
        assert_eq!(eval("6 x 7"), 42.0);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert_eq!(evaluate("1 / 0"), Err(CalcError::NotFinite));
        assert_eq!(evaluate("sqrt(-1)"), Err(CalcError::NotFinite));
        assert_eq!(evaluate("2 +"), Err(CalcError::Incomplete));
        assert_eq!(evaluate(""), Err(CalcError::Incomplete));
        assert!(matches!(
            evaluate("rm -rf /"),
            Err(CalcError::Unexpected(_))
        ));
        assert!(matches!(evaluate("2 3"), Err(CalcError::Unexpected(_))));
        assert_eq!(evaluate(&"(".repeat(100)), Err(CalcError::TooLong));
        assert_eq!(evaluate(&"1+".repeat(200)), Err(CalcError::TooLong));
        assert_eq!(evaluate("10 ^ 400"), Err(CalcError::NotFinite));
    }

    #[test]
    fn the_arithmetic_in_a_sentence_is_found() {
        let read = |s: &str| read_arithmetic(s);
        assert_eq!(
            read("What is seventeen times twenty three?").as_deref(),
            Some("17 * 23")
        );
        assert_eq!(
            read("What's twenty-five plus 17?").as_deref(),
            Some("25 + 17")
        );
        assert_eq!(
            read("Can you add 3.5 and 4.25?").as_deref(),
            Some("3.5 + 4.25")
        );
        assert_eq!(
            read("Please add three hundred and forty two to fifty eight.").as_deref(),
            Some("342 + 58")
        );
        assert_eq!(
            read("Subtract 4 from ten, please.").as_deref(),
            Some("10 - 4")
        );
        assert_eq!(read("Divide 100 by 8").as_deref(), Some("100 / 8"));
        assert_eq!(
            read("How much is 250 divided by 5?").as_deref(),
            Some("250 / 5")
        );
        assert_eq!(
            read("What is the square root of 144?").as_deref(),
            Some("sqrt 144")
        );
        assert_eq!(read("Calculate 15% of 80.").as_deref(), Some("15 % * 80"));
        assert_eq!(read("What is 10 - 4?").as_deref(), Some("10 - 4"));
        assert_eq!(
            read("How much is a hundred minus 37?").as_deref(),
            Some("100 - 37")
        );
        // Whisper's digits for "two hundred and fifty", "three hundred and forty two".
        assert_eq!(
            read("How much is 200 and 50 divided by 5?").as_deref(),
            Some("250 / 5")
        );
        // And for "thirty seven", "30 7".
        assert_eq!(
            read("How much is that 100 minus 30 7?").as_deref(),
            Some("100 - 37")
        );
        assert_eq!(read("What is 7 30?"), None);
        assert_eq!(
            read("What is the square root of 100 and 44?").as_deref(),
            Some("sqrt 144")
        );
        assert_eq!(
            read("What is the square root on the 81?").as_deref(),
            Some("sqrt 81")
        );
        assert_eq!(
            read("Please add 300 and 42 to 58.").as_deref(),
            Some("342 + 58")
        );
        assert_eq!(read("Add 12 and 30.").as_deref(), Some("12 + 30"));
        assert_eq!(read("What is 100 and 200?").as_deref(), None);
        for chat in [
            "What time is it right now?",
            "Is it going to be a busy afternoon for you?",
            "Set a timer for ten minutes.",
            "I was born in 1990.",
            "Take it easy.",
        ] {
            assert_eq!(read(chat), None, "{chat}");
        }
    }

    #[test]
    fn expressions_are_said_in_words() {
        assert_eq!(say_expression("17 * 23"), "17 times 23");
        assert_eq!(say_expression("sqrt 144"), "the square root of 144");
        assert_eq!(say_expression("15 % * 80"), "15 percent of 80");
        assert_eq!(say_expression("17 % 5"), "17 modulo 5");
        assert_eq!(say_expression("9 ^ 2"), "9 squared");
        assert_eq!(say_expression("100 / 8 - 2"), "100 divided by 8 minus 2");
    }

    #[test]
    fn numbers_are_formatted_for_speech() {
        assert_eq!(format_number(84.0), "84");
        assert_eq!(format_number(2.5), "2.5");
        assert_eq!(format_number(1.0 / 3.0), "0.333333");
        assert_eq!(format_number(-4.0), "-4");
    }
}
