//! A small JSON reader for `TF_CONFIG`: bounded, panic-free, with byte offsets in errors.
//!
//! It reads RFC 8259 JSON into a tree of [`Value`]s, each with the byte offset where it
//! starts. Limits: [`MAX_INPUT`] bytes of input, [`MAX_DEPTH`] nested arrays and objects.
//! Numbers keep their text (only small integers are ever needed). An object with the same
//! key twice is an error: in a configuration it is a mistake, and which one wins differs
//! between readers.

use std::fmt;

/// Longest accepted input, 1 MiB.
pub const MAX_INPUT: usize = 1 << 20;
/// Deepest nesting of arrays and objects.
pub const MAX_DEPTH: usize = 64;

/// A JSON value and where it starts.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Node {
    /// Byte offset of the value's first character.
    pub at: usize,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Null,
    Bool(bool),
    /// The number as written; its grammar has been checked.
    Number(String),
    String(String),
    Array(Vec<Node>),
    /// Members in input order; keys are unique.
    Object(Vec<(String, Node)>),
}

impl Value {
    /// What kind of value this is, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "an array",
            Value::Object(_) => "an object",
        }
    }
}

/// Malformed JSON: what and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JsonError {
    /// Byte offset of the problem, from 0.
    pub offset: usize,
    /// What is wrong.
    pub message: String,
}

impl fmt::Display for JsonError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid JSON at byte {}: {}", self.offset, self.message)
    }
}

impl std::error::Error for JsonError {}

/// Parses one JSON value that makes up all of `text` (white space around it allowed).
pub(crate) fn parse(text: &str) -> Result<Node, JsonError> {
    if text.len() > MAX_INPUT {
        return Err(JsonError {
            offset: MAX_INPUT,
            message: format!("input longer than {MAX_INPUT} bytes"),
        });
    }
    let mut p = Parser {
        bytes: text.as_bytes(),
        text,
        pos: 0,
    };
    p.skip_ws();
    let node = p.value(0)?;
    p.skip_ws();
    if p.pos < p.bytes.len() {
        return Err(p.error("unexpected text after the JSON value"));
    }
    Ok(node)
}

struct Parser<'a> {
    bytes: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn error(&self, message: impl Into<String>) -> JsonError {
        JsonError {
            offset: self.pos,
            message: message.into(),
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    /// What the next character is, for "expected X, found Y" messages.
    fn found(&self) -> String {
        match self.text.get(self.pos..).and_then(|s| s.chars().next()) {
            None => "end of input".to_owned(),
            Some(c) => format!("{c:?}"),
        }
    }

    fn expect_literal(&mut self, word: &str, value: Value) -> Result<Node, JsonError> {
        let at = self.pos;
        if self.bytes[at..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(Node { at, value })
        } else {
            Err(self.error(format!("expected a JSON value, found {}", self.found())))
        }
    }

    fn value(&mut self, depth: usize) -> Result<Node, JsonError> {
        match self.peek() {
            Some(b'{') => self.object(depth + 1),
            Some(b'[') => self.array(depth + 1),
            Some(b'"') => {
                let at = self.pos;
                let s = self.string()?;
                Ok(Node {
                    at,
                    value: Value::String(s),
                })
            }
            Some(b't') => self.expect_literal("true", Value::Bool(true)),
            Some(b'f') => self.expect_literal("false", Value::Bool(false)),
            Some(b'n') => self.expect_literal("null", Value::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            _ => Err(self.error(format!("expected a JSON value, found {}", self.found()))),
        }
    }

    fn enter(&self, depth: usize) -> Result<(), JsonError> {
        if depth > MAX_DEPTH {
            Err(self.error(format!("nested deeper than {MAX_DEPTH} levels")))
        } else {
            Ok(())
        }
    }

    fn array(&mut self, depth: usize) -> Result<Node, JsonError> {
        self.enter(depth)?;
        let at = self.pos;
        self.pos += 1; // '['
        let mut items = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b']') {
            self.pos += 1;
            return Ok(Node {
                at,
                value: Value::Array(items),
            });
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth)?);
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Node {
                        at,
                        value: Value::Array(items),
                    });
                }
                _ => return Err(self.error(format!("expected ',' or ']', found {}", self.found()))),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Node, JsonError> {
        self.enter(depth)?;
        let at = self.pos;
        self.pos += 1; // '{'
        let mut members: Vec<(String, Node)> = Vec::new();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.pos += 1;
            return Ok(Node {
                at,
                value: Value::Object(members),
            });
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return Err(self.error(format!(
                    "expected a member name in double quotes, found {}",
                    self.found()
                )));
            }
            let key_at = self.pos;
            let key = self.string()?;
            if members.iter().any(|(k, _)| *k == key) {
                return Err(JsonError {
                    offset: key_at,
                    message: format!("duplicate member {key:?}"),
                });
            }
            self.skip_ws();
            if self.peek() != Some(b':') {
                return Err(self.error(format!(
                    "expected ':' after the member name, found {}",
                    self.found()
                )));
            }
            self.pos += 1;
            self.skip_ws();
            let value = self.value(depth)?;
            members.push((key, value));
            self.skip_ws();
            match self.peek() {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Node {
                        at,
                        value: Value::Object(members),
                    });
                }
                _ => {
                    return Err(self.error(format!("expected ',' or '}}', found {}", self.found())))
                }
            }
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Node, JsonError> {
        let at = self.pos;
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.pos += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.error("a number cannot have leading zeros"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.error("expected a digit")),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.error("expected a digit after '.'"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.error("expected a digit in the exponent"));
            }
        }
        Ok(Node {
            at,
            value: Value::Number(self.text[at..self.pos].to_owned()),
        })
    }

    /// A string starting at the current `"`.
    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // '"'
        let mut out = String::new();
        loop {
            // Copy the run of plain characters at once; the input is valid UTF-8 and the
            // run ends at an ASCII byte, so the slice is on character boundaries.
            let start = self.pos;
            while let Some(b) = self.peek() {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[start..self.pos]);
            match self.peek() {
                None => return Err(self.error("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let c = self.escape()?;
                    out.push(c);
                }
                Some(_) => {
                    return Err(self.error("control character in a string (escape it)"));
                }
            }
        }
    }

    /// The character of the escape after a `\`.
    fn escape(&mut self) -> Result<char, JsonError> {
        let Some(b) = self.peek() else {
            return Err(self.error("unterminated string"));
        };
        self.pos += 1;
        Ok(match b {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let at = self.pos - 2;
                let first = self.hex4()?;
                let code = match first {
                    0xD800..=0xDBFF => {
                        if !self.bytes[self.pos..].starts_with(b"\\u") {
                            return Err(JsonError {
                                offset: at,
                                message: "unpaired surrogate in \\u escape".into(),
                            });
                        }
                        self.pos += 2;
                        let second = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&second) {
                            return Err(JsonError {
                                offset: at,
                                message: "unpaired surrogate in \\u escape".into(),
                            });
                        }
                        0x10000 + ((first - 0xD800) << 10) + (second - 0xDC00)
                    }
                    0xDC00..=0xDFFF => {
                        return Err(JsonError {
                            offset: at,
                            message: "unpaired surrogate in \\u escape".into(),
                        })
                    }
                    c => c,
                };
                match char::from_u32(code) {
                    Some(c) => c,
                    None => {
                        return Err(JsonError {
                            offset: at,
                            message: "invalid \\u escape".into(),
                        })
                    }
                }
            }
            _ => {
                self.pos -= 1;
                return Err(self.error(format!("invalid escape \\{}", self.found_char())));
            }
        })
    }

    fn found_char(&self) -> String {
        self.text
            .get(self.pos..)
            .and_then(|s| s.chars().next())
            .map_or_else(String::new, |c| c.to_string())
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let mut v = 0u32;
        for _ in 0..4 {
            let d = match self.peek() {
                Some(b @ b'0'..=b'9') => b - b'0',
                Some(b @ b'a'..=b'f') => b - b'a' + 10,
                Some(b @ b'A'..=b'F') => b - b'A' + 10,
                _ => return Err(self.error("expected four hex digits after \\u")),
            };
            v = v * 16 + u32::from(d);
            self.pos += 1;
        }
        Ok(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> (usize, String) {
        let e = parse(text).unwrap_err();
        (e.offset, e.message)
    }

    fn value(text: &str) -> Value {
        parse(text).unwrap().value
    }

    #[test]
    fn values() {
        assert_eq!(value(" null "), Value::Null);
        assert_eq!(value("true"), Value::Bool(true));
        assert_eq!(value("false"), Value::Bool(false));
        assert_eq!(value("-0.5e+10"), Value::Number("-0.5e+10".into()));
        assert_eq!(value("0"), Value::Number("0".into()));
        assert_eq!(value("[]"), Value::Array(vec![]));
        assert_eq!(value("{}"), Value::Object(vec![]));
        let Value::Object(m) = value(r#"{"a": [1, {"b": null}], "c": "d"}"#) else {
            panic!()
        };
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].0, "a");
        assert_eq!(m[0].1.at, 6);
        assert_eq!(m[1].1.value, Value::String("d".into()));
    }

    #[test]
    fn strings_and_escapes() {
        assert_eq!(
            value(r#""a\"b\\c\/d\b\f\n\r\t""#),
            Value::String("a\"b\\c/d\u{8}\u{c}\n\r\t".into())
        );
        assert_eq!(value(r#""\u00e9\u4e2D""#), Value::String("é中".into()));
        assert_eq!(value(r#""\ud83d\ude00""#), Value::String("😀".into()));
        assert_eq!(value("\"héllo 😀\""), Value::String("héllo 😀".into()));
        assert_eq!(value(r#""\u0000""#), Value::String("\0".into()));
    }

    #[test]
    fn errors_with_offsets() {
        assert_eq!(
            err(""),
            (0, "expected a JSON value, found end of input".into())
        );
        assert_eq!(
            err("{\"a\" 1}"),
            (5, "expected ':' after the member name, found '1'".into())
        );
        assert_eq!(
            err("{\"a\":1,}"),
            (
                7,
                "expected a member name in double quotes, found '}'".into()
            )
        );
        assert_eq!(err("[1 2]"), (3, "expected ',' or ']', found '2'".into()));
        assert_eq!(
            err("{\"a\":1 \"b\":2}"),
            (7, "expected ',' or '}', found '\"'".into())
        );
        assert_eq!(err("[1,]"), (3, "expected a JSON value, found ']'".into()));
        assert_eq!(err("tru"), (0, "expected a JSON value, found 't'".into()));
        assert_eq!(err("\"abc"), (4, "unterminated string".into()));
        assert_eq!(
            err("\"a\nb\""),
            (2, "control character in a string (escape it)".into())
        );
        assert_eq!(err(r#""\x""#), (2, "invalid escape \\x".into()));
        assert_eq!(
            err(r#""\u12g4""#),
            (5, "expected four hex digits after \\u".into())
        );
        assert_eq!(
            err(r#""\ud83d""#),
            (1, "unpaired surrogate in \\u escape".into())
        );
        assert_eq!(
            err(r#""\ud83dx""#),
            (1, "unpaired surrogate in \\u escape".into())
        );
        assert_eq!(
            err(r#""\ude00""#),
            (1, "unpaired surrogate in \\u escape".into())
        );
        assert_eq!(
            err(r#""\ud83d\u0041""#),
            (1, "unpaired surrogate in \\u escape".into())
        );
        assert_eq!(err("01"), (1, "a number cannot have leading zeros".into()));
        assert_eq!(err("-"), (1, "expected a digit".into()));
        assert_eq!(err("1."), (2, "expected a digit after '.'".into()));
        assert_eq!(err("1e"), (2, "expected a digit in the exponent".into()));
        assert_eq!(
            err("{} x"),
            (3, "unexpected text after the JSON value".into())
        );
        assert_eq!(
            err(r#"{"a":1,"a":2}"#),
            (7, "duplicate member \"a\"".into())
        );
        assert_eq!(err("é"), (0, "expected a JSON value, found 'é'".into()));
        assert!(parse("\"\u{7f}\"").is_ok());
    }

    #[test]
    fn limits() {
        let deep_ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse(&deep_ok).is_ok());
        let too_deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert_eq!(err(&too_deep).0, MAX_DEPTH);
        // Deep nesting never recurses past the limit, however deep the input.
        let very_deep = "[".repeat(MAX_INPUT);
        assert!(parse(&very_deep).is_err());
        let long = format!("\"{}\"", "a".repeat(MAX_INPUT));
        assert_eq!(err(&long).0, MAX_INPUT);
    }
}
