//! JSON as vLLM's parsers read and write it: Python's `json.loads` and `json.dumps(value,
//! ensure_ascii=False)`, whole ([`Json`]) or as a stream of text ([`JsonStream`]).
//!
//! vLLM re-serializes most tool-call arguments with `json.dumps`, so clients see `", "` and
//! `": "` separators, keys in the model's order and floats in Python's `repr`. Both sides here
//! write exactly that text, so a stream's argument pieces add up to the non-streaming arguments.
//! NaN and infinities, which Python reads and writes but no JSON parser accepts, are refused.

use std::fmt::Write;

/// Deeper nesting is refused rather than recursed into (Python stops at its recursion limit).
const MAX_DEPTH: usize = 512;

/// A parsed JSON value. Objects keep their keys in order of first appearance (a repeated key
/// takes the later value, as a Python dict does) and integers keep their digits, so
/// [`Json::dumps`] writes what `json.dumps(json.loads(text))` writes.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Json {
    Null,
    Bool(bool),
    /// Decimal digits, `-` first when negative: Python integers have no size limit.
    Int(String),
    Float(f64),
    Str(String),
    Array(Vec<Json>),
    Object(Vec<(String, Json)>),
}

impl Json {
    /// `json.loads(text)`: one value, with JSON whitespace allowed around it.
    pub(crate) fn parse(text: &str) -> Option<Json> {
        let mut parser = Parser { text, pos: 0, depth: 0 };
        parser.skip_ws();
        let value = parser.value()?;
        parser.skip_ws();
        (parser.pos == text.len()).then_some(value)
    }

    /// `JSONDecoder().raw_decode(text)`: the value that starts `text` (no whitespace first) and
    /// the bytes it spans; what follows is left to the caller.
    pub(crate) fn parse_prefix(text: &str) -> Option<(Json, usize)> {
        let mut parser = Parser { text, pos: 0, depth: 0 };
        let value = parser.value()?;
        Some((value, parser.pos))
    }

    pub(crate) fn dumps(&self) -> String {
        let mut out = String::new();
        self.write(&mut out);
        out
    }

    pub(crate) fn write(&self, out: &mut String) {
        match self {
            Json::Null => out.push_str("null"),
            Json::Bool(true) => out.push_str("true"),
            Json::Bool(false) => out.push_str("false"),
            Json::Int(digits) => out.push_str(digits),
            Json::Float(value) => push_float(out, *value),
            Json::Str(text) => push_string(out, text),
            Json::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    item.write(out);
                }
                out.push(']');
            }
            Json::Object(members) => {
                out.push('{');
                for (i, (key, value)) in members.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    push_string(out, key);
                    out.push_str(": ");
                    value.write(out);
                }
                out.push('}');
            }
        }
    }

    /// An object's member.
    pub(crate) fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Object(members) => members.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    pub(crate) fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(text) => Some(text),
            _ => None,
        }
    }
}

/// Inserts as a Python dict does: a repeated key keeps its place and takes the new value.
pub(crate) fn insert_member(members: &mut Vec<(String, Json)>, key: String, value: Json) {
    match members.iter_mut().find(|(k, _)| *k == key) {
        Some(slot) => slot.1 = value,
        None => members.push((key, value)),
    }
}

/// `text` as a JSON string literal, escaped as `json.dumps(ensure_ascii=False)` escapes.
pub(crate) fn push_string(out: &mut String, text: &str) {
    out.push('"');
    for c in text.chars() {
        push_string_char(out, c);
    }
    out.push('"');
}

/// One character of a JSON string literal's body.
pub(crate) fn push_string_char(out: &mut String, c: char) {
    match c {
        '"' => out.push_str("\\\""),
        '\\' => out.push_str("\\\\"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        '\u{8}' => out.push_str("\\b"),
        '\u{c}' => out.push_str("\\f"),
        c if (c as u32) < 0x20 => {
            let _ = write!(out, "\\u{:04x}", c as u32);
        }
        c => out.push(c),
    }
}

/// A finite float as Python's `repr` writes it: the shortest digits that read back, in
/// positional notation for exponents -4..16 (always with a fraction) and as `1.5e+16` beyond.
pub(crate) fn push_float(out: &mut String, value: f64) {
    if value == 0.0 {
        out.push_str(if value.is_sign_negative() { "-0.0" } else { "0.0" });
        return;
    }
    if value.is_sign_negative() {
        out.push('-');
    }
    // `{:e}` gives the shortest round-tripping digits, which is what `repr` picks too.
    let scientific = format!("{:e}", value.abs());
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if (-4..16).contains(&exponent) {
        if exponent >= 0 {
            let int_len = exponent as usize + 1;
            if digits.len() <= int_len {
                out.push_str(&digits);
                out.extend(std::iter::repeat_n('0', int_len - digits.len()));
                out.push_str(".0");
            } else {
                out.push_str(&digits[..int_len]);
                out.push('.');
                out.push_str(&digits[int_len..]);
            }
        } else {
            out.push_str("0.");
            out.extend(std::iter::repeat_n('0', (-exponent - 1) as usize));
            out.push_str(&digits);
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        let _ = write!(out, "e{}{:02}", if exponent < 0 { '-' } else { '+' }, exponent.abs());
    }
}

/// The number that starts `text` under Python's JSON number pattern
/// (`-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?`), as `json.dumps` writes it back, and its length.
/// Integers keep their digits; anything with a fraction or exponent is a float.
fn number_prefix(text: &str) -> Option<(Json, usize)> {
    let bytes = text.as_bytes();
    let digits_from = |mut i: usize| {
        while i < bytes.len() && bytes[i].is_ascii_digit() {
            i += 1;
        }
        i
    };
    let mut end = usize::from(bytes.first() == Some(&b'-'));
    match bytes.get(end) {
        Some(b'0') => end += 1,
        Some(b'1'..=b'9') => end = digits_from(end + 1),
        _ => return None,
    }
    let int_end = end;
    if bytes.get(end) == Some(&b'.') && bytes.get(end + 1).is_some_and(u8::is_ascii_digit) {
        end = digits_from(end + 1);
    }
    if matches!(bytes.get(end), Some(b'e' | b'E')) {
        let sign = usize::from(matches!(bytes.get(end + 1), Some(b'+' | b'-')));
        if bytes.get(end + 1 + sign).is_some_and(u8::is_ascii_digit) {
            end = digits_from(end + 1 + sign);
        }
    }
    let literal = &text[..end];
    if end == int_end {
        let digits = if literal == "-0" { "0" } else { literal };
        return Some((Json::Int(digits.to_owned()), end));
    }
    let value: f64 = literal.parse().ok()?;
    value.is_finite().then_some((Json::Float(value), end))
}

/// A number token that must be whole: the streaming side only sees a number once it has ended.
fn number_exact(text: &str) -> Option<Json> {
    number_prefix(text).and_then(|(value, len)| (len == text.len()).then_some(value))
}

struct Parser<'a> {
    text: &'a str,
    pos: usize,
    depth: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.as_bytes().get(self.pos).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.pos += 1;
        }
    }

    fn eat(&mut self, byte: u8) -> bool {
        let found = self.peek() == Some(byte);
        if found {
            self.pos += 1;
        }
        found
    }

    fn value(&mut self) -> Option<Json> {
        let rest = &self.text[self.pos..];
        match self.peek()? {
            b'{' => self.nested(Parser::object),
            b'[' => self.nested(Parser::array),
            b'"' => self.string().map(Json::Str),
            b'n' if rest.starts_with("null") => {
                self.pos += 4;
                Some(Json::Null)
            }
            b't' if rest.starts_with("true") => {
                self.pos += 4;
                Some(Json::Bool(true))
            }
            b'f' if rest.starts_with("false") => {
                self.pos += 5;
                Some(Json::Bool(false))
            }
            _ => {
                let (value, len) = number_prefix(rest)?;
                self.pos += len;
                Some(value)
            }
        }
    }

    fn nested(&mut self, parse: fn(&mut Self) -> Option<Json>) -> Option<Json> {
        if self.depth >= MAX_DEPTH {
            return None;
        }
        self.depth += 1;
        let value = parse(self);
        self.depth -= 1;
        value
    }

    fn object(&mut self) -> Option<Json> {
        self.pos += 1;
        let mut members = Vec::new();
        self.skip_ws();
        if self.eat(b'}') {
            return Some(Json::Object(members));
        }
        loop {
            self.skip_ws();
            if self.peek() != Some(b'"') {
                return None;
            }
            let key = self.string()?;
            self.skip_ws();
            if !self.eat(b':') {
                return None;
            }
            self.skip_ws();
            let value = self.value()?;
            insert_member(&mut members, key, value);
            self.skip_ws();
            if self.eat(b'}') {
                return Some(Json::Object(members));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    fn array(&mut self) -> Option<Json> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.eat(b']') {
            return Some(Json::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value()?);
            self.skip_ws();
            if self.eat(b']') {
                return Some(Json::Array(items));
            }
            if !self.eat(b',') {
                return None;
            }
        }
    }

    /// A string literal at `pos` (which holds the opening quote), decoded.
    fn string(&mut self) -> Option<String> {
        self.pos += 1;
        let mut decoder = StrDecoder::default();
        let mut text = String::new();
        let rest = &self.text[self.pos..];
        for (i, c) in rest.char_indices() {
            match decoder.push(c, &mut |c| text.push(c)) {
                StrStep::More => {}
                StrStep::End => {
                    self.pos += i + 1;
                    return Some(text);
                }
                StrStep::Invalid => return None,
            }
        }
        None
    }
}

/// Decodes a string literal's body one character at a time, as Python's strict scanner does:
/// raw control characters are refused, `\uD83D\uDE00` pairs join, and a lone surrogate (which
/// Rust strings cannot hold) becomes U+FFFD.
#[derive(Default)]
struct StrDecoder {
    esc: Esc,
}

#[derive(Default, Clone, Copy)]
enum Esc {
    #[default]
    None,
    /// After `\`; `high` is a high surrogate waiting for its low half.
    Backslash {
        high: Option<u32>,
    },
    Hex {
        code: u32,
        digits: u8,
        high: Option<u32>,
    },
    /// A high surrogate was read; a `\uDC00`-`\uDFFF` may complete it.
    High(u32),
}

enum StrStep {
    More,
    End,
    Invalid,
}

impl StrDecoder {
    fn push(&mut self, c: char, emit: &mut dyn FnMut(char)) -> StrStep {
        match self.esc {
            Esc::None => match c {
                '"' => return StrStep::End,
                '\\' => self.esc = Esc::Backslash { high: None },
                c if (c as u32) < 0x20 => return StrStep::Invalid,
                c => emit(c),
            },
            Esc::High(high) => {
                if c == '\\' {
                    self.esc = Esc::Backslash { high: Some(high) };
                } else {
                    emit(char::REPLACEMENT_CHARACTER);
                    self.esc = Esc::None;
                    return self.push(c, emit);
                }
            }
            Esc::Backslash { high } => {
                if c == 'u' {
                    self.esc = Esc::Hex { code: 0, digits: 0, high };
                    return StrStep::More;
                }
                let decoded = match c {
                    '"' => '"',
                    '\\' => '\\',
                    '/' => '/',
                    'b' => '\u{8}',
                    'f' => '\u{c}',
                    'n' => '\n',
                    'r' => '\r',
                    't' => '\t',
                    _ => return StrStep::Invalid,
                };
                if high.is_some() {
                    emit(char::REPLACEMENT_CHARACTER);
                }
                emit(decoded);
                self.esc = Esc::None;
            }
            Esc::Hex { code, digits, high } => {
                let Some(digit) = c.to_digit(16) else { return StrStep::Invalid };
                let code = code * 16 + digit;
                if digits < 3 {
                    self.esc = Esc::Hex { code, digits: digits + 1, high };
                    return StrStep::More;
                }
                self.esc = Esc::None;
                match high {
                    Some(high) if (0xDC00..=0xDFFF).contains(&code) => {
                        let joined = 0x10000 + ((high - 0xD800) << 10) + (code - 0xDC00);
                        emit(char::from_u32(joined).unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                    _ => {
                        if high.is_some() {
                            emit(char::REPLACEMENT_CHARACTER);
                        }
                        if (0xD800..=0xDBFF).contains(&code) {
                            self.esc = Esc::High(code);
                        } else {
                            emit(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                        }
                    }
                }
            }
        }
        StrStep::More
    }
}

/// Where a streamed object is in its member list: a top-level member's key and where its value
/// sits in [`JsonStream::out`] (`end` once the value is complete).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Member {
    pub(crate) key: String,
    pub(crate) start: Option<usize>,
    pub(crate) end: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Open,
    Done,
    Failed,
}

/// One JSON value read as it streams in, written back as `json.dumps` would write it as far as
/// it is certain: a string's characters as they come, a number or literal once it ends, a
/// bracket once it is seen. Each step's output extends the previous one's, and the output of
/// a complete value is `Json::parse(text).dumps()` (repeated keys aside: both are written).
///
/// A top-level object's members are tracked ([`JsonStream::members`]) so a tool call's name and
/// arguments can be cut out of the output while it grows.
pub(crate) struct JsonStream {
    out: String,
    stack: Vec<Container>,
    state: State,
    members: Vec<Member>,
    status: Status,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Container {
    Object,
    Array,
}

enum State {
    /// A value must come: at the top, after `:` or after `,` in an array.
    Value,
    /// After `[`: a value or `]`.
    ArrayStart,
    /// After `{`: a key or `}`.
    ObjectStart,
    /// After `,` in an object: a key.
    Key,
    Colon,
    /// After a value: `,` or the container's close.
    After,
    Str {
        key: bool,
        decoder: StrDecoder,
    },
    Number(String),
    Word(String),
}

impl Default for JsonStream {
    fn default() -> Self {
        JsonStream {
            out: String::new(),
            stack: Vec::new(),
            state: State::Value,
            members: Vec::new(),
            status: Status::Open,
        }
    }
}

impl JsonStream {
    /// Reads `text` until the value ends or turns out invalid; returns the bytes read.
    pub(crate) fn feed(&mut self, text: &str) -> usize {
        for (i, c) in text.char_indices() {
            if !self.push(c) {
                return i;
            }
        }
        text.len()
    }

    /// The normalized text so far.
    pub(crate) fn out(&self) -> &str {
        &self.out
    }

    pub(crate) fn members(&self) -> &[Member] {
        &self.members
    }

    pub(crate) fn status(&self) -> Status {
        self.status
    }

    /// Whether a value of the top-level object is being read.
    fn at_member_level(&self) -> bool {
        self.stack.len() == 1 && self.stack[0] == Container::Object
    }

    /// Reads one character; false when it was not taken (the value ended before it, or the
    /// text stopped being JSON).
    fn push(&mut self, c: char) -> bool {
        if self.status != Status::Open {
            return false;
        }
        let is_ws = matches!(c, ' ' | '\t' | '\n' | '\r');
        match std::mem::replace(&mut self.state, State::Value) {
            State::Str { key, mut decoder } => {
                let out = &mut self.out;
                let mut key_text = String::new();
                let step = decoder.push(c, &mut |decoded| {
                    push_string_char(out, decoded);
                    if key {
                        key_text.push(decoded);
                    }
                });
                if key && self.stack.len() == 1 {
                    if let Some(member) = self.members.last_mut() {
                        member.key.push_str(&key_text);
                    }
                }
                match step {
                    StrStep::More => self.state = State::Str { key, decoder },
                    StrStep::End => {
                        self.out.push('"');
                        if key {
                            self.state = State::Colon;
                        } else {
                            self.value_done();
                        }
                    }
                    StrStep::Invalid => self.status = Status::Failed,
                }
                true
            }
            State::Number(mut token) => {
                if c.is_ascii_digit() || matches!(c, '-' | '+' | '.' | 'e' | 'E') {
                    token.push(c);
                    self.state = State::Number(token);
                    return true;
                }
                match number_exact(&token) {
                    Some(number) => {
                        number.write(&mut self.out);
                        self.value_done();
                        self.push(c)
                    }
                    None => {
                        self.status = Status::Failed;
                        false
                    }
                }
            }
            State::Word(mut word) => {
                word.push(c);
                let literal = match word.as_str() {
                    "true" | "false" | "null" => Some(word.clone()),
                    w if ["true", "false", "null"].iter().any(|t| t.starts_with(w)) => None,
                    _ => {
                        self.status = Status::Failed;
                        return false;
                    }
                };
                match literal {
                    Some(literal) => {
                        self.out.push_str(&literal);
                        self.value_done();
                    }
                    None => self.state = State::Word(word),
                }
                true
            }
            state @ (State::Value | State::ArrayStart) => {
                if is_ws {
                    self.state = state;
                    return true;
                }
                if matches!(state, State::ArrayStart) && c == ']' {
                    return self.close(Container::Array);
                }
                self.start_value(c)
            }
            state @ (State::ObjectStart | State::Key) => {
                if is_ws {
                    self.state = state;
                    return true;
                }
                if matches!(state, State::ObjectStart) && c == '}' {
                    return self.close(Container::Object);
                }
                if c != '"' {
                    self.status = Status::Failed;
                    return false;
                }
                if self.stack.len() == 1 {
                    self.members.push(Member { key: String::new(), start: None, end: None });
                }
                self.out.push('"');
                self.state = State::Str { key: true, decoder: StrDecoder::default() };
                true
            }
            State::Colon => {
                match c {
                    _ if is_ws => self.state = State::Colon,
                    ':' => self.out.push_str(": "),
                    _ => {
                        self.status = Status::Failed;
                        return false;
                    }
                }
                true
            }
            State::After => {
                let top = self.stack.last().copied();
                match (c, top) {
                    _ if is_ws => self.state = State::After,
                    (',', Some(Container::Object)) => {
                        self.out.push_str(", ");
                        self.state = State::Key;
                    }
                    (',', Some(Container::Array)) => self.out.push_str(", "),
                    ('}', Some(Container::Object)) => return self.close(Container::Object),
                    (']', Some(Container::Array)) => return self.close(Container::Array),
                    _ => {
                        self.status = Status::Failed;
                        return false;
                    }
                }
                true
            }
        }
    }

    /// The first character of a value.
    fn start_value(&mut self, c: char) -> bool {
        if self.at_member_level() {
            if let Some(member) = self.members.last_mut() {
                member.start = Some(self.out.len());
            }
        }
        match c {
            '{' | '[' => {
                if self.stack.len() >= MAX_DEPTH {
                    self.status = Status::Failed;
                    return false;
                }
                let (container, state) = if c == '{' {
                    (Container::Object, State::ObjectStart)
                } else {
                    (Container::Array, State::ArrayStart)
                };
                self.stack.push(container);
                self.out.push(c);
                self.state = state;
            }
            '"' => {
                self.out.push('"');
                self.state = State::Str { key: false, decoder: StrDecoder::default() };
            }
            '-' | '0'..='9' => self.state = State::Number(c.to_string()),
            't' | 'f' | 'n' => self.state = State::Word(c.to_string()),
            _ => {
                self.status = Status::Failed;
                return false;
            }
        }
        true
    }

    fn close(&mut self, container: Container) -> bool {
        self.stack.pop();
        self.out.push(if container == Container::Object { '}' } else { ']' });
        self.value_done();
        true
    }

    fn value_done(&mut self) {
        if self.stack.is_empty() {
            self.status = Status::Done;
            return;
        }
        self.state = State::After;
        if self.at_member_level() {
            if let Some(member) = self.members.last_mut() {
                member.end = Some(self.out.len());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dumps(text: &str) -> Option<String> {
        Json::parse(text).map(|v| v.dumps())
    }

    #[test]
    fn dumps_like_python() {
        // Expected strings are CPython 3.12's json.dumps(json.loads(text), ensure_ascii=False).
        let cases = [
            (r#"{"a":1,"b":[true,false,null],"c":{}}"#, r#"{"a": 1, "b": [true, false, null], "c": {}}"#),
            (r#"  [ ]  "#, "[]"),
            ("-0", "0"),
            ("12345678901234567890123", "12345678901234567890123"),
            ("1.0", "1.0"),
            ("1e5", "100000.0"),
            ("1E-5", "1e-05"),
            ("0.0001", "0.0001"),
            ("1e16", "1e+16"),
            ("123456789012345678.0", "1.2345678901234568e+17"),
            ("3.14", "3.14"),
            ("-2.5e-3", "-0.0025"),
            ("-0.0", "-0.0"),
            (r#""\u00e9\/\ud83d\ude00\u001f""#, "\"é/😀\\u001f\""),
            (r#""tab\there""#, r#""tab\there""#),
            (r#"{"a": 1, "a": 2, "b": 3}"#, r#"{"a": 2, "b": 3}"#),
        ];
        for (text, expected) in cases {
            assert_eq!(dumps(text).as_deref(), Some(expected), "{text}");
        }
    }

    #[test]
    fn refuses_what_python_refuses() {
        for text in ["", "{", "[1,]", "{\"a\" 1}", "01", "1.", "\"a\nb\"", "tru", "{'a': 1}", "NaN", "1e999", "[1] x"] {
            assert_eq!(Json::parse(text), None, "{text}");
        }
        let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
        assert_eq!(Json::parse(&deep), None);
    }

    #[test]
    fn raw_decode_leaves_the_rest() {
        let (value, len) = Json::parse_prefix(r#"{"a": [1, 2]} tail {"#).unwrap();
        assert_eq!(value.dumps(), r#"{"a": [1, 2]}"#);
        assert_eq!(len, 13);
        assert_eq!(Json::parse_prefix(" {}"), None);
    }

    const DOCS: &[&str] = &[
        r#"{"name": "get_weather", "arguments": {"city": "San Francisco", "days": 3}}"#,
        r#"{ "a" : [ 1 , -2.50 , 3e2 , true , null , "x\"y\\z" ] , "b" : { } , "c" : [ ] }"#,
        r#"{"emoji":"\ud83d\ude00 \u00e9 é","ctl":"\u0001\b\f\n\r\t","slash":"\/"}"#,
        r#"{"nested": {"deep": {"deeper": [[[{"k": 0}]]]}}, "big": 123456789012345678901234567890}"#,
        r#"[1, "two", {"three": 3.0}]"#,
        r#"{"lone": "\ud800x", "pair-split": "\ud83d\u0041"}"#,
    ];

    #[test]
    fn stream_matches_whole_parse_for_any_split() {
        for doc in DOCS {
            let expected = dumps(doc).unwrap();
            for size in 1..=5 {
                let mut stream = JsonStream::default();
                let mut previous = String::new();
                let chars: Vec<char> = doc.chars().collect();
                for chunk in chars.chunks(size) {
                    let chunk: String = chunk.iter().collect();
                    assert_eq!(stream.feed(&chunk), chunk.len());
                    assert!(stream.out().starts_with(&previous), "output only grows");
                    assert!(expected.starts_with(stream.out()), "{} is not a prefix of {expected}", stream.out());
                    previous = stream.out().to_owned();
                }
                assert_eq!(stream.status(), Status::Done);
                assert_eq!(stream.out(), expected);
            }
        }
    }

    #[test]
    fn stream_stops_at_the_end_of_the_value() {
        let mut stream = JsonStream::default();
        let text = r#"{"a": 1}</tool_call>"#;
        assert_eq!(stream.feed(text), 8);
        assert_eq!(stream.status(), Status::Done);
        let members = stream.members();
        assert_eq!(members.len(), 1);
        assert_eq!(members[0].key, "a");
        assert_eq!(&stream.out()[members[0].start.unwrap()..members[0].end.unwrap()], "1");
    }

    #[test]
    fn stream_fails_on_bad_input() {
        for text in ["{\"a\": tru}", "{\"a\" 1}", "[01]", "{\"a\": 1,}", "x", "{\"a\": \"\u{1}\"}"] {
            let mut stream = JsonStream::default();
            stream.feed(text);
            assert_eq!(stream.status(), Status::Failed, "{text}");
        }
    }
}
