//! Python literals as vLLM reads them with `ast`: for the `pythonic` format's call arguments and
//! for `ast.literal_eval` fallbacks. [`Literal`] reads a literal and writes it as JSON the way
//! `json.dumps(value, ensure_ascii=False)` would, as it goes: what it has written is final, so
//! reading a growing text again yields the same text plus more.

use std::fmt::Write;

use super::json::{push_float, push_string_char, Json};

/// Python refuses deeper nesting too ("too many nested parentheses").
const MAX_DEPTH: usize = 200;

/// Why reading stopped before a literal ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stop {
    /// The text ran out; more may complete it.
    End,
    /// The text is not a literal of the supported kind.
    Invalid,
}

/// A cursor over Python source that writes the literals it reads as JSON into `out`.
pub(crate) struct Literal<'a> {
    text: &'a str,
    pub(crate) pos: usize,
    pub(crate) out: String,
    /// The text ends where it ends: at the end a token is complete rather than cut short.
    complete: bool,
    /// Tuples read as arrays (`ast.literal_eval`); otherwise they are refused, as vLLM's
    /// pythonic parser refuses them.
    tuples: bool,
    /// A literal was read that JSON cannot carry (bytes, complex, sets, f-strings, names,
    /// non-finite floats): the syntax was followed but the value is unusable.
    pub(crate) unsupported: bool,
    depth: usize,
}

type Read = Result<(), Stop>;

impl<'a> Literal<'a> {
    pub(crate) fn new(text: &'a str, complete: bool, tuples: bool) -> Self {
        Literal { text, pos: 0, out: String::new(), complete, tuples, unsupported: false, depth: 0 }
    }

    pub(crate) fn at(text: &'a str, pos: usize, complete: bool) -> Self {
        Literal { pos, ..Literal::new(text, complete, false) }
    }

    fn rest(&self) -> &'a str {
        self.text.get(self.pos..).unwrap_or("")
    }

    pub(crate) fn peek(&self) -> Option<char> {
        self.rest().chars().next()
    }

    fn peek_at(&self, n: usize) -> Option<char> {
        self.rest().chars().nth(n)
    }

    /// `Err(End)` at the end of a text that may still grow, `Ok(None)` at the end of a whole one.
    fn next_char(&self) -> Result<Option<char>, Stop> {
        match self.peek() {
            Some(c) => Ok(Some(c)),
            None if self.complete => Ok(None),
            None => Err(Stop::End),
        }
    }

    pub(crate) fn eat(&mut self, c: char) -> bool {
        let found = self.peek() == Some(c);
        if found {
            self.pos += c.len_utf8();
        }
        found
    }

    /// Skips what may separate tokens inside brackets: spaces, newlines, line continuations and
    /// comments.
    pub(crate) fn skip_space(&mut self) {
        loop {
            let rest = self.rest();
            if let Some(c) = rest.chars().next().filter(|c| matches!(c, ' ' | '\t' | '\n' | '\r' | '\u{c}')) {
                self.pos += c.len_utf8();
            } else if rest.starts_with("\\\n") {
                self.pos += 2;
            } else if rest.starts_with('#') {
                self.pos += rest.find('\n').unwrap_or(rest.len());
            } else {
                return;
            }
        }
    }

    /// An identifier as vLLM's pythonic pattern allows (`[a-zA-Z]+\w*`), or `None` when there is
    /// none here. At the end of a growing text the identifier may go on: `Err(End)`.
    pub(crate) fn identifier(&mut self) -> Result<Option<&'a str>, Stop> {
        let rest = self.rest();
        if rest.is_empty() && !self.complete {
            return Err(Stop::End);
        }
        if !rest.starts_with(|c: char| c.is_ascii_alphabetic()) {
            return Ok(None);
        }
        let len = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if len == rest.len() && !self.complete {
            return Err(Stop::End);
        }
        self.pos += len;
        Ok(Some(&rest[..len]))
    }

    /// One literal, written to `out`.
    pub(crate) fn value(&mut self) -> Read {
        self.skip_space();
        let c = self.peek().ok_or(Stop::End)?;
        match c {
            '[' => self.nested(|p| p.sequence('[', ']')),
            '(' => self.nested(Literal::parenthesized),
            '{' => self.nested(Literal::dict),
            '-' | '+' => self.signed_number(),
            '0'..='9' | '.' => self.number(false),
            '\'' | '"' => self.string(),
            c if c.is_alphabetic() || c == '_' => {
                if self.string_prefix_len().is_some() {
                    return self.string();
                }
                self.word()
            }
            _ => Err(Stop::Invalid),
        }
    }

    fn nested(&mut self, read: impl FnOnce(&mut Self) -> Read) -> Read {
        if self.depth >= MAX_DEPTH {
            return Err(Stop::Invalid);
        }
        self.depth += 1;
        let result = read(self);
        self.depth -= 1;
        result
    }

    /// `[a, b]` (or a tuple's items) as a JSON array; a trailing comma is allowed.
    fn sequence(&mut self, open: char, close: char) -> Read {
        self.eat(open);
        self.out.push('[');
        let mut count = 0;
        loop {
            self.skip_space();
            if self.eat(close) {
                self.out.push(']');
                return Ok(());
            }
            if self.peek().is_none() {
                return Err(Stop::End);
            }
            if count > 0 {
                self.out.push_str(", ");
            }
            self.value()?;
            count += 1;
            self.skip_space();
            if !self.eat(',') {
                self.skip_space();
                match self.peek() {
                    Some(c) if c == close => {}
                    Some(_) => return Err(Stop::Invalid),
                    None => return Err(Stop::End),
                }
            }
        }
    }

    /// `(a, b)` is a tuple, `(a)` just `a`. Only whole texts read them: which one it is shows
    /// late, after output that could not be taken back.
    fn parenthesized(&mut self) -> Read {
        if !self.tuples || !self.complete {
            return Err(Stop::Invalid);
        }
        let start = self.out.len();
        let open = self.pos;
        self.sequence('(', ')')?;
        let inner = &self.text[open + 1..self.pos - 1];
        let is_tuple = inner.trim().is_empty() || {
            let mut probe = Literal::new(inner, true, true);
            probe.value().is_ok() && {
                probe.skip_space();
                probe.peek() == Some(',')
            }
        };
        if !is_tuple {
            // `(a)`: drop the brackets written around the one item.
            self.out.truncate(self.out.len() - 1);
            self.out.remove(start);
        }
        Ok(())
    }

    /// `{k: v}` as a JSON object; keys are written as `json.dumps` converts them.
    fn dict(&mut self) -> Read {
        self.eat('{');
        self.out.push('{');
        let mut count = 0;
        loop {
            self.skip_space();
            if self.eat('}') {
                self.out.push('}');
                return Ok(());
            }
            if self.peek().is_none() {
                return Err(Stop::End);
            }
            if count > 0 {
                self.out.push_str(", ");
            }
            self.key()?;
            self.skip_space();
            match self.peek() {
                Some(':') => self.pos += 1,
                Some(',' | '}') => {
                    // `{a, b}` is a set.
                    self.unsupported = true;
                    return self.set_rest();
                }
                Some(_) => return Err(Stop::Invalid),
                None => return Err(Stop::End),
            }
            self.out.push_str(": ");
            self.value()?;
            count += 1;
            self.skip_space();
            if !self.eat(',') {
                self.skip_space();
                match self.peek() {
                    Some('}') => {}
                    Some(_) => return Err(Stop::Invalid),
                    None => return Err(Stop::End),
                }
            }
        }
    }

    /// The rest of a set literal, read for its syntax only.
    fn set_rest(&mut self) -> Read {
        loop {
            self.skip_space();
            if self.eat('}') {
                return Ok(());
            }
            if !self.eat(',') {
                return Err(if self.peek().is_none() { Stop::End } else { Stop::Invalid });
            }
            self.skip_space();
            if self.eat('}') {
                return Ok(());
            }
            self.value()?;
        }
    }

    /// A dict key: strings as they are; numbers, booleans and None as the strings `json.dumps`
    /// makes of them; anything else unusable.
    fn key(&mut self) -> Read {
        let start = self.out.len();
        self.value()?;
        let written = &self.out[start..];
        if written.starts_with('"') {
            return Ok(());
        }
        if written.starts_with('[') || written.starts_with('{') {
            self.unsupported = true;
        }
        self.out.insert(start, '"');
        self.out.push('"');
        Ok(())
    }

    /// `True`, `False`, `None` and the JSON spellings some models use; other names are not
    /// literals.
    fn word(&mut self) -> Read {
        let rest = self.rest();
        let len = rest.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(rest.len());
        if len == rest.len() && !self.complete {
            return Err(Stop::End);
        }
        self.pos += len;
        match &rest[..len] {
            "True" | "true" => self.out.push_str("true"),
            "False" | "false" => self.out.push_str("false"),
            "None" | "null" => self.out.push_str("null"),
            _ => self.unsupported = true,
        }
        Ok(())
    }

    fn signed_number(&mut self) -> Read {
        let mut negative = false;
        while let Some(sign @ ('-' | '+')) = self.peek() {
            negative ^= sign == '-';
            self.pos += 1;
            self.skip_space();
        }
        match self.peek() {
            Some('0'..='9' | '.') => self.number(negative),
            Some(_) => Err(Stop::Invalid),
            None => Err(Stop::End),
        }
    }

    /// A number token, written once it has ended.
    fn number(&mut self, negative: bool) -> Read {
        let rest = self.rest();
        let bytes = rest.as_bytes();
        let mut len = 0;
        while len < bytes.len() {
            let b = bytes[len];
            let exponent_sign = matches!(b, b'+' | b'-')
                && len > 0
                && matches!(bytes[len - 1], b'e' | b'E')
                && !rest[..len].to_ascii_lowercase().starts_with("0x");
            if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' || exponent_sign {
                len += 1;
            } else {
                break;
            }
        }
        if len == bytes.len() && !self.complete {
            return Err(Stop::End);
        }
        let token = &rest[..len];
        self.pos += len;
        match python_number(token) {
            Some(Number::Int(digits)) => {
                if negative && digits != "0" {
                    self.out.push('-');
                }
                self.out.push_str(&digits);
            }
            Some(Number::Float(value)) if value.is_finite() => {
                push_float(&mut self.out, if negative { -value } else { value });
            }
            Some(Number::Float(_) | Number::Unsupported) => self.unsupported = true,
            None => return Err(Stop::Invalid),
        }
        Ok(())
    }

    /// The length of a string prefix (`r`, `b`, `rb`, ...) followed by a quote, here.
    fn string_prefix_len(&self) -> Option<usize> {
        let rest = self.rest();
        let letters = rest.find(|c: char| !c.is_ascii_alphabetic()).unwrap_or(rest.len());
        let prefix = rest[..letters].to_ascii_lowercase();
        let known = ["r", "u", "b", "f", "br", "rb", "fr", "rf"].contains(&prefix.as_str());
        (known && matches!(rest[letters..].chars().next(), Some('\'' | '"'))).then_some(letters)
    }

    /// A string literal and any literals right after it (`'a' 'b'` is `'ab'`). The closing
    /// quote is written once what follows shows the string is over.
    fn string(&mut self) -> Read {
        self.out.push('"');
        loop {
            self.string_piece()?;
            let before_space = self.pos;
            self.skip_space();
            match self.next_char()? {
                Some('\'' | '"') => {}
                Some(c) if c.is_ascii_alphabetic() => {
                    let letters = self.rest().find(|c: char| !c.is_ascii_alphabetic());
                    if letters.is_none() && !self.complete {
                        return Err(Stop::End);
                    }
                    if self.string_prefix_len().is_none() {
                        self.pos = before_space;
                        break;
                    }
                }
                _ => {
                    self.pos = before_space;
                    break;
                }
            }
        }
        self.out.push('"');
        Ok(())
    }

    /// One quoted piece, its text written as it is read.
    fn string_piece(&mut self) -> Read {
        let prefix_len = self.string_prefix_len().unwrap_or(0);
        let prefix = self.rest()[..prefix_len].to_ascii_lowercase();
        if prefix.contains('b') || prefix.contains('f') {
            // Bytes and f-strings are not constants vLLM can serialize.
            self.unsupported = true;
        }
        let raw = prefix.contains('r');
        self.pos += prefix_len;
        let quote = self.peek().ok_or(Stop::End)?;
        let triple = self.rest().starts_with(&format!("{quote}{quote}{quote}"));
        if triple {
            self.pos += 3;
        } else {
            if self.rest().len() < 3 && !self.complete && self.rest().chars().all(|c| c == quote) {
                // `''` could still be the start of `'''`.
                return Err(Stop::End);
            }
            self.pos += 1;
        }
        loop {
            let c = self.peek().ok_or(if self.complete { Stop::Invalid } else { Stop::End })?;
            if c == quote {
                if !triple {
                    self.pos += 1;
                    return Ok(());
                }
                let closing = self.rest().chars().take(3).take_while(|&q| q == quote).count();
                if closing == 3 {
                    self.pos += 3;
                    return Ok(());
                }
                if self.rest().len() == closing && !self.complete {
                    return Err(Stop::End);
                }
                self.pos += 1;
                push_string_char(&mut self.out, c);
                continue;
            }
            if c == '\n' && !triple {
                return Err(Stop::Invalid);
            }
            if c == '\\' {
                self.escape(raw)?;
                continue;
            }
            self.pos += c.len_utf8();
            push_string_char(&mut self.out, c);
        }
    }

    /// A backslash escape in a string body, written as the character it means.
    fn escape(&mut self, raw: bool) -> Read {
        let Some(next) = self.peek_at(1) else {
            return Err(if self.complete { Stop::Invalid } else { Stop::End });
        };
        if raw {
            // Raw strings keep the backslash; an escaped quote does not end them.
            self.pos += 1 + next.len_utf8();
            push_string_char(&mut self.out, '\\');
            push_string_char(&mut self.out, next);
            return Ok(());
        }
        let simple = match next {
            '\n' => Some(None),
            '\\' => Some(Some('\\')),
            '\'' => Some(Some('\'')),
            '"' => Some(Some('"')),
            'a' => Some(Some('\u{7}')),
            'b' => Some(Some('\u{8}')),
            'f' => Some(Some('\u{c}')),
            'n' => Some(Some('\n')),
            'r' => Some(Some('\r')),
            't' => Some(Some('\t')),
            'v' => Some(Some('\u{b}')),
            _ => None,
        };
        if let Some(decoded) = simple {
            self.pos += 2;
            if let Some(c) = decoded {
                push_string_char(&mut self.out, c);
            }
            return Ok(());
        }
        let body = &self.rest()[2..];
        let (len, code) = match next {
            '0'..='7' => {
                let digits = body.chars().take(2).take_while(|c| c.is_digit(8)).count();
                let more_may_come = digits < 2 && body.len() == digits && !self.complete;
                if more_may_come {
                    return Err(Stop::End);
                }
                let text = &self.rest()[1..2 + digits];
                (1 + digits, u32::from_str_radix(text, 8).unwrap_or(0))
            }
            'x' | 'u' | 'U' => {
                let want = match next {
                    'x' => 2,
                    'u' => 4,
                    _ => 8,
                };
                let hex = body.chars().take(want).take_while(char::is_ascii_hexdigit).count();
                if hex < want {
                    return Err(if body.len() == hex && !self.complete { Stop::End } else { Stop::Invalid });
                }
                (1 + want, u32::from_str_radix(&body[..want], 16).unwrap_or(u32::MAX))
            }
            'N' => {
                // Unicode names would need Python's name table.
                let Some(close) = body.find('}') else {
                    return Err(if self.complete { Stop::Invalid } else { Stop::End });
                };
                self.pos += 2 + close + 1;
                self.unsupported = true;
                return Ok(());
            }
            other => {
                // Python keeps unknown escapes as written.
                self.pos += 1 + other.len_utf8();
                push_string_char(&mut self.out, '\\');
                push_string_char(&mut self.out, other);
                return Ok(());
            }
        };
        if code > 0x10FFFF {
            return Err(Stop::Invalid);
        }
        self.pos += 1 + len;
        push_string_char(&mut self.out, char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
        Ok(())
    }
}

enum Number {
    /// Decimal digits, no sign.
    Int(String),
    Float(f64),
    /// Complex, or an integer too large to convert from another base here.
    Unsupported,
}

/// Digits with single underscores between them, as Python's grammar allows.
fn digits_ok(text: &str, radix: u32) -> bool {
    !text.is_empty()
        && !text.starts_with('_')
        && !text.ends_with('_')
        && !text.contains("__")
        && text.chars().all(|c| c == '_' || c.is_digit(radix))
}

/// A Python number token (no sign), or `None` when the token is not a number.
fn python_number(token: &str) -> Option<Number> {
    let lower = token.to_ascii_lowercase();
    if let Some(imaginary) = lower.strip_suffix('j') {
        return python_number(imaginary).map(|_| Number::Unsupported);
    }
    for (prefix, radix) in [("0x", 16), ("0o", 8), ("0b", 2)] {
        if let Some(digits) = lower.strip_prefix(prefix) {
            let digits = digits.strip_prefix('_').unwrap_or(digits);
            if !digits_ok(digits, radix) {
                return None;
            }
            return Some(match u128::from_str_radix(&digits.replace('_', ""), radix) {
                Ok(value) => Number::Int(value.to_string()),
                Err(_) => Number::Unsupported,
            });
        }
    }
    if digits_ok(&lower, 10) {
        let digits = lower.replace('_', "");
        let trimmed = digits.trim_start_matches('0');
        if trimmed.is_empty() {
            return Some(Number::Int("0".to_owned()));
        }
        // `007` is a syntax error in Python 3.
        return (trimmed.len() == digits.len()).then_some(Number::Int(digits));
    }
    if !(lower.contains('.') || lower.contains('e')) || !decimal_ok(&lower) {
        return None;
    }
    lower.replace('_', "").parse().ok().map(Number::Float)
}

/// A decimal number as Python's float grammar (and `float()`) allows it: digits with single
/// underscores, an optional fraction, an optional exponent; leading zeros are fine.
fn decimal_ok(lower: &str) -> bool {
    let (mantissa, exponent) = match lower.split_once('e') {
        Some((m, e)) => (m, Some(e)),
        None => (lower, None),
    };
    let (int_part, frac_part) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    (int_part.is_empty() || digits_ok(int_part, 10))
        && (frac_part.is_empty() || digits_ok(frac_part, 10))
        && !(int_part.is_empty() && frac_part.is_empty())
        && exponent.is_none_or(|e| digits_ok(e.strip_prefix(['+', '-']).unwrap_or(e), 10))
}

/// `ast.literal_eval(text)` as JSON, or `None` when it would raise or give a value
/// `json.dumps` cannot write as JSON.
pub(crate) fn literal_eval(text: &str) -> Option<Json> {
    // literal_eval strips leading spaces and tabs; trailing newlines end the expression.
    let text = text.trim_matches([' ', '\t', '\n', '\r']);
    let mut literal = Literal::new(text, true, true);
    literal.value().ok()?;
    literal.skip_space();
    if literal.pos != text.len() || literal.unsupported {
        return None;
    }
    Json::parse(&literal.out)
}

/// `int(text)`: surrounding whitespace, a sign, and digits with single underscores; the value's
/// decimal digits.
pub(crate) fn python_int(text: &str) -> Option<String> {
    let text = text.trim();
    let (negative, digits) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if !digits_ok(digits, 10) {
        return None;
    }
    let digits = digits.replace('_', "");
    let digits = digits.trim_start_matches('0');
    Some(match (digits.is_empty(), negative) {
        (true, _) => "0".to_owned(),
        (false, true) => format!("-{digits}"),
        (false, false) => digits.to_owned(),
    })
}

/// `float(text)`: as Python reads it, including `inf` and `nan`.
pub(crate) fn python_float(text: &str) -> Option<f64> {
    let text = text.trim();
    let (negative, unsigned) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    let lower = unsigned.to_ascii_lowercase();
    let value = match lower.as_str() {
        "inf" | "infinity" => f64::INFINITY,
        "nan" => f64::NAN,
        _ if decimal_ok(&lower) => lower.replace('_', "").parse().ok()?,
        _ => return None,
    };
    Some(if negative { -value } else { value })
}

/// An integral float as the integer Python's `int()` makes of it (all its digits).
pub(crate) fn integral_digits(value: f64) -> String {
    let mut digits = String::new();
    let _ = write!(digits, "{value:.0}");
    if digits == "-0" {
        digits = "0".to_owned();
    }
    digits
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str) -> Option<String> {
        literal_eval(text).map(|v| v.dumps())
    }

    #[test]
    fn literal_eval_like_python() {
        let cases = [
            ("{'key': 'value'}", r#"{"key": "value"}"#),
            ("[1, 2.5, -3, True, None, False]", "[1, 2.5, -3, true, null, false]"),
            ("('a', 1)", r#"["a", 1]"#),
            ("(1)", "1"),
            ("()", "[]"),
            ("'a' \"b\"", r#""ab""#),
            (r"'tab\there\x41\101\u00e9\N{x}'", ""),
            ("0x1F", "31"),
            ("1_000", "1000"),
            ("1e3", "1000.0"),
            ("{1: 'a', 2.5: 'b', None: 'c'}", r#"{"1": "a", "2.5": "b", "null": "c"}"#),
            ("'''multi\nline'''", r#""multi\nline""#),
            (r"r'\d+'", r#""\\d+""#),
            ("  42  ", "42"),
        ];
        for (text, expected) in cases {
            let want = (!expected.is_empty()).then(|| expected.to_owned());
            assert_eq!(eval(text), want, "{text}");
        }
        assert_eq!(eval(r"'tab\there\x41\101\u00e9'").as_deref(), Some(r#""tab\thereAAé""#));
    }

    #[test]
    fn literal_eval_refuses() {
        for text in ["hello world", "{1, 2}", "b'x'", "1j", "1e999", "007", "f(x)", "[1, 2", "'open", "x", "{'a': 1,,}"]
        {
            assert_eq!(eval(text), None, "{text}");
        }
    }

    #[test]
    fn growing_text_only_adds_output() {
        let text = r#"['San Francisco', {'a': [1, -2.5e3], "b": 'it\'s'}, True] "#;
        let mut previous = String::new();
        for end in 0..=text.len() {
            let mut literal = Literal::new(&text[..end], false, false);
            let result = literal.value();
            assert!(literal.out.starts_with(&previous), "{:?} then {:?}", previous, literal.out);
            assert!(result.is_ok() || result == Err(Stop::End), "{end}: {result:?}");
            previous = literal.out;
        }
        assert_eq!(previous, r#"["San Francisco", {"a": [1, -2500.0], "b": "it's"}, true]"#);
    }

    #[test]
    fn numbers_as_python_reads_them() {
        assert_eq!(python_int(" -0_7 ").as_deref(), Some("-7"));
        assert_eq!(python_int("+12").as_deref(), Some("12"));
        assert_eq!(python_int("1.0"), None);
        assert_eq!(python_float(" 2.75 "), Some(2.75));
        assert_eq!(python_float("1_0.5"), Some(10.5));
        assert_eq!(python_float("007"), Some(7.0));
        assert!(python_float("inf").is_some_and(f64::is_infinite));
        assert_eq!(python_float("abc"), None);
        assert_eq!(integral_digits(1e20), "100000000000000000000");
        assert_eq!(integral_digits(-0.0), "0");
    }
}
