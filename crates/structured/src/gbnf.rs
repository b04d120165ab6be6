//! Conversion of llama.cpp GBNF grammars to the Lark dialect compiled by llguidance.
//!
//! vLLM's guidance backend hands `structured_outputs.grammar` / `guided_grammar` to llguidance's
//! Python `grammar_from("grammar", ...)`, which runs `any_to_lark` from llguidance's
//! `gbnf_to_lark.py`. This module follows that script so that the same request text is accepted
//! and means the same thing here:
//!
//! * text that already looks like Lark (a line starting with `%llguidance` or `start:`) passes
//!   through unchanged; everything else is parsed as GBNF;
//! * `root` becomes `start`; `-` and camelCase in names become `_`; rules whose bodies use only
//!   literals, character classes and other such rules become upper-case Lark terminals (lexemes),
//!   everything else stays a lower-case rule;
//! * `#` comments are carried over as `//` comments in front of the rule they precede;
//! * the GBNF syntax itself (alternatives, groups, `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}`, `.`,
//!   literals and `[...]` classes with `\n \r \t \\ \" \[ \] \xNN \uNNNN \UNNNNNNNN` escapes,
//!   continuation lines after `::=`, after `|` and inside parentheses) is read as in the script,
//!   which in turn mirrors llama.cpp's own parser.
//!
//! Where the script emits Lark that llguidance would then reject, this module produces valid Lark
//! instead, or a GBNF error that names the line and column:
//!
//! * literals and classes are decoded and re-escaped for their Lark context (Lark strings take
//!   JSON escapes only, so `\[`, `\U...` and zero-stripped `\u` escapes cannot be copied through);
//! * class members that are special to Rust's regex syntax (`&&`, `--`, `~~`, `[`, ...) are escaped;
//! * names Lark cannot spell (leading digit, non-ASCII) are rewritten and clashing names get a
//!   numeric suffix instead of failing;
//! * `start ::= ...` counts as GBNF (the script's `start\s*:` test mistakes it for Lark);
//! * `x{0}` becomes `""`, and `(x*)*` keeps its parentheses;
//! * empty classes, reversed ranges, invalid code points and bad repetition bounds are reported
//!   here rather than by llguidance.
//!
//! Two places where parity with the script means departing from llama.cpp: `.` becomes `/./`,
//! which does not match a newline; and terminals are lexed greedily, without backtracking, so in
//! llama.cpp's arithmetic.gbnf `NUM: /[0-9]/+ WS` swallows the `"\n"` that `root` expects next
//! and `1=1\n` cannot complete, under vLLM as here.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

/// Nesting bound for parenthesised groups, so hostile input cannot overflow the stack; llguidance
/// rejects Lark nested much less deeply than this anyway.
const MAX_NESTING: usize = 100;

/// Indentation the script uses for the second and later top-level alternatives of a rule.
const ALT_SEPARATOR: &str = "\n     | ";

/// Returns `text` unchanged if it already looks like Lark, otherwise converts it from GBNF.
pub fn any_to_lark(text: &str) -> Result<String, String> {
    if is_lark_syntax(text) {
        Ok(text.to_owned())
    } else {
        gbnf_to_lark(text)
    }
}

/// The script's test `(?m)^\s*(%llguidance\b|start\s*:)`, minus its false positive on the GBNF
/// definition `start ::=`.
fn is_lark_syntax(text: &str) -> bool {
    let line_starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1));
    line_starts.map(|start| text[start..].trim_start()).any(|rest| {
        if let Some(after) = rest.strip_prefix("%llguidance") {
            !after.starts_with(|c: char| c.is_alphanumeric() || c == '_')
        } else if let Some(after) = rest.strip_prefix("start") {
            let after = after.trim_start();
            after.starts_with(':') && !after.starts_with("::=")
        } else {
            false
        }
    })
}

fn gbnf_to_lark(text: &str) -> Result<String, String> {
    let rules = Parser::new(text).parse_grammar()?;
    let grammar = Grammar::resolve(rules, text)?;
    Ok(grammar.render())
}

#[derive(Debug)]
enum Node {
    /// Decoded characters; escaping for Lark happens on output.
    Literal(String),
    Class {
        negated: bool,
        ranges: Vec<(char, char)>,
    },
    AnyChar,
    /// `at` is the byte offset of the reference, for "undefined rule" errors.
    Ref {
        name: String,
        at: usize,
    },
    Repeat {
        node: Box<Node>,
        min: u32,
        max: Option<u32>,
    },
    Seq(Vec<Node>),
    Alt(Vec<Node>),
}

#[derive(Debug)]
struct Rule {
    name: String,
    body: Node,
    /// `//` comment lines collected since the previous rule ended.
    comment: String,
}

struct Parser<'a> {
    src: &'a str,
    pos: usize,
    pending_comment: String,
    depth: usize,
}

impl<'a> Parser<'a> {
    fn new(src: &'a str) -> Self {
        Parser { src, pos: 0, pending_comment: String::new(), depth: 0 }
    }

    fn peek(&self) -> Option<char> {
        self.src[self.pos..].chars().next()
    }

    fn peek_second(&self) -> Option<char> {
        self.src[self.pos..].chars().nth(1)
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.peek()?;
        self.pos += c.len_utf8();
        Some(c)
    }

    fn error_at(&self, at: usize, msg: impl std::fmt::Display) -> String {
        located(self.src, at, msg)
    }

    fn unexpected(&self, expected: &str) -> String {
        match self.peek() {
            Some(c) => self.error_at(self.pos, format!("expected {expected}, found {c:?}")),
            None => self.error_at(self.pos, format!("expected {expected}, found end of input")),
        }
    }

    /// Later definitions of a rule replace earlier ones but keep the first one's place, like the
    /// script's dict and llama.cpp's rule table.
    fn parse_grammar(mut self) -> Result<Vec<Rule>, String> {
        let mut rules: Vec<Rule> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        self.skip_space(true);
        while self.peek().is_some() {
            let rule = self.parse_rule()?;
            match index.get(&rule.name) {
                Some(&i) => rules[i] = rule,
                None => {
                    index.insert(rule.name.clone(), rules.len());
                    rules.push(rule);
                }
            }
            self.skip_space(true);
        }
        Ok(rules)
    }

    fn parse_rule(&mut self) -> Result<Rule, String> {
        let name = self.parse_name().ok_or_else(|| self.unexpected("a rule name"))?;
        self.skip_space(false);
        if !self.src[self.pos..].starts_with("::=") {
            return Err(self.unexpected(&format!("'::=' after rule name '{name}'")));
        }
        self.pos += 3;
        self.skip_space(true);
        let body = self.parse_alternatives(false)?;
        // A top-level sequence stops at a newline or at anything it cannot parse; only the former
        // ends the rule properly.
        match self.peek() {
            None => {}
            Some('\r') => {
                self.bump();
                if self.peek() == Some('\n') {
                    self.bump();
                }
            }
            Some('\n') => {
                self.bump();
            }
            Some(c) => return Err(self.error_at(self.pos, format!("unexpected character {c:?}"))),
        }
        Ok(Rule { name, body, comment: std::mem::take(&mut self.pending_comment) })
    }

    fn parse_alternatives(&mut self, nested: bool) -> Result<Node, String> {
        let mut alternatives = Vec::new();
        loop {
            alternatives.push(self.parse_sequence(nested)?);
            self.skip_space(nested);
            if self.peek() != Some('|') {
                break;
            }
            self.bump();
            self.skip_space(true);
        }
        Ok(Node::Alt(alternatives))
    }

    fn parse_sequence(&mut self, nested: bool) -> Result<Node, String> {
        let mut nodes = Vec::new();
        while let Some(c) = self.peek() {
            if c == '|' || c == ')' || (!nested && (c == '\r' || c == '\n')) {
                break;
            }
            let node = match c {
                '"' => self.parse_literal()?,
                '[' => self.parse_class()?,
                '(' => self.parse_group()?,
                '.' => {
                    self.bump();
                    Node::AnyChar
                }
                _ => {
                    let at = self.pos;
                    match self.parse_name() {
                        Some(name) => Node::Ref { name, at },
                        None => break,
                    }
                }
            };
            self.skip_space(nested);
            let node = self.parse_repetition(node)?;
            nodes.push(node);
            self.skip_space(nested);
        }
        Ok(Node::Seq(nodes))
    }

    fn parse_group(&mut self) -> Result<Node, String> {
        let open = self.pos;
        self.bump();
        self.depth += 1;
        if self.depth > MAX_NESTING {
            return Err(self.error_at(open, format!("groups nested more than {MAX_NESTING} deep")));
        }
        self.skip_space(true);
        let alternatives = self.parse_alternatives(true)?;
        if self.peek() != Some(')') {
            return Err(self.unexpected("')'"));
        }
        self.bump();
        self.depth -= 1;
        Ok(alternatives)
    }

    fn parse_repetition(&mut self, node: Node) -> Result<Node, String> {
        let (min, max) = match self.peek() {
            Some('*') => (0, None),
            Some('+') => (1, None),
            Some('?') => (0, Some(1)),
            Some('{') => return self.parse_braces(node),
            _ => return Ok(node),
        };
        self.bump();
        Ok(Node::Repeat { node: Box::new(node), min, max })
    }

    fn parse_braces(&mut self, node: Node) -> Result<Node, String> {
        let open = self.pos;
        self.bump();
        self.skip_space(true);
        let min = self.parse_count()?;
        self.skip_space(true);
        let max = match self.peek() {
            Some('}') => Some(min),
            Some(',') => {
                self.bump();
                self.skip_space(true);
                let max =
                    if self.peek().is_some_and(|c| c.is_ascii_digit()) { Some(self.parse_count()?) } else { None };
                self.skip_space(true);
                if self.peek() != Some('}') {
                    return Err(self.unexpected("'}'"));
                }
                max
            }
            _ => return Err(self.unexpected("',' or '}'")),
        };
        self.bump();
        if max.is_some_and(|max| max < min) {
            return Err(self.error_at(open, "repetition maximum is less than its minimum"));
        }
        Ok(Node::Repeat { node: Box::new(node), min, max })
    }

    /// Lark reads repetition bounds as `i32`, so larger ones are refused here.
    fn parse_count(&mut self) -> Result<u32, String> {
        let start = self.pos;
        while self.peek().is_some_and(|c| c.is_ascii_digit()) {
            self.bump();
        }
        if start == self.pos {
            return Err(self.unexpected("a repetition count"));
        }
        self.src[start..self.pos]
            .parse::<i32>()
            .ok()
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| self.error_at(start, "repetition count is too large"))
    }

    fn parse_name(&mut self) -> Option<String> {
        let start = self.pos;
        while self.peek().is_some_and(is_word_char) {
            self.bump();
        }
        (self.pos > start).then(|| self.src[start..self.pos].to_owned())
    }

    fn parse_literal(&mut self) -> Result<Node, String> {
        let open = self.pos;
        self.bump();
        let mut value = String::new();
        loop {
            match self.parse_char()? {
                None => return Err(self.error_at(open, "unterminated string literal")),
                Some(('"', false)) => return Ok(Node::Literal(value)),
                Some((c, _)) => value.push(c),
            }
        }
    }

    /// Follows llama.cpp: `a-b` is a range unless the `-` comes right before the closing `]`.
    fn parse_class(&mut self) -> Result<Node, String> {
        let open = self.pos;
        self.bump();
        let negated = self.peek() == Some('^');
        if negated {
            self.bump();
        }
        let unterminated = |p: &Self| p.error_at(open, "unterminated character class");
        let mut ranges = Vec::new();
        loop {
            let start = self.pos;
            let lo = match self.parse_char()? {
                None => return Err(unterminated(self)),
                Some((']', false)) => break,
                Some((c, _)) => c,
            };
            let mut hi = lo;
            if self.peek() == Some('-') && self.peek_second() != Some(']') {
                self.bump();
                hi = self.parse_char()?.ok_or_else(|| unterminated(self))?.0;
                if hi < lo {
                    return Err(self.error_at(start, format!("character range {lo:?}-{hi:?} is reversed")));
                }
            }
            ranges.push((lo, hi));
        }
        if ranges.is_empty() {
            return Err(self.error_at(open, "empty character class"));
        }
        Ok(Node::Class { negated, ranges })
    }

    /// Reads one possibly escaped character; the flag tells an escaped `"` or `]` from a closing one.
    fn parse_char(&mut self) -> Result<Option<(char, bool)>, String> {
        let at = self.pos;
        let Some(c) = self.bump() else { return Ok(None) };
        if c != '\\' {
            return Ok(Some((c, false)));
        }
        let decoded = match self.bump() {
            None => return Err(self.error_at(at, "incomplete escape sequence")),
            Some(c @ ('"' | '\\' | '[' | ']')) => c,
            Some('n') => '\n',
            Some('r') => '\r',
            Some('t') => '\t',
            Some('x') => self.parse_hex_escape(at, 2)?,
            Some('u') => self.parse_hex_escape(at, 4)?,
            Some('U') => self.parse_hex_escape(at, 8)?,
            Some(c) => return Err(self.error_at(at, format!("invalid escape sequence \\{c}"))),
        };
        Ok(Some((decoded, true)))
    }

    fn parse_hex_escape(&mut self, at: usize, digits: usize) -> Result<char, String> {
        let hex = self.src[self.pos..].chars().take(digits).collect::<String>();
        if hex.len() != digits || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(self.error_at(at, format!("escape sequence needs {digits} hex digits")));
        }
        self.pos += digits;
        u32::from_str_radix(&hex, 16)
            .ok()
            .and_then(char::from_u32)
            .ok_or_else(|| self.error_at(at, format!("U+{hex} is not a valid Unicode character")))
    }

    fn skip_space(&mut self, allow_newlines: bool) {
        while let Some(c) = self.peek() {
            match c {
                ' ' | '\t' => {
                    self.bump();
                }
                '\r' | '\n' if allow_newlines => {
                    self.bump();
                }
                '#' => {
                    self.bump();
                    let start = self.pos;
                    while self.peek().is_some_and(|c| c != '\r' && c != '\n') {
                        self.bump();
                    }
                    let text = &self.src[start..self.pos];
                    self.pending_comment.push_str("//");
                    self.pending_comment.push_str(text);
                    self.pending_comment.push('\n');
                }
                _ => break,
            }
        }
    }
}

fn is_word_char(c: char) -> bool {
    c.is_alphanumeric() || c == '-' || c == '_'
}

fn located(src: &str, at: usize, msg: impl std::fmt::Display) -> String {
    let before = &src[..at];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    format!("GBNF grammar error at line {line}, column {column}: {msg}")
}

/// Rules after simplification, with the terminal/rule split and final Lark names decided.
struct Grammar {
    rules: Vec<Rule>,
    lark_names: HashMap<String, String>,
}

impl Grammar {
    fn resolve(mut rules: Vec<Rule>, src: &str) -> Result<Self, String> {
        if rules.is_empty() {
            return Err("GBNF grammar is empty: expected at least a `root ::= ...` rule".to_owned());
        }
        let index: HashMap<&str, usize> = rules.iter().enumerate().map(|(i, r)| (r.name.as_str(), i)).collect();
        let Some(&root) = index.get("root") else {
            return Err("GBNF grammar has no 'root' rule".to_owned());
        };
        for rule in &rules {
            check_refs(&rule.body, &index, src)?;
        }

        // Fixpoint: a rule is a terminal once everything it uses is. Recursive rules never get
        // there, and `start` must stay a rule for Lark.
        let mut terminal = vec![false; rules.len()];
        let mut changed = true;
        while changed {
            changed = false;
            for (i, rule) in rules.iter().enumerate() {
                if i != root && !terminal[i] && is_terminal(&rule.body, &index, &terminal) {
                    terminal[i] = true;
                    changed = true;
                }
            }
        }

        let mut used = HashSet::from(["start".to_owned()]);
        let mut lark_names = HashMap::from([("root".to_owned(), "start".to_owned())]);
        for (rule, &is_term) in rules.iter().zip(&terminal) {
            if rule.name == "root" {
                continue;
            }
            let base = lark_name(&rule.name, is_term);
            let mut name = base.clone();
            let mut n = 2;
            while !used.insert(name.clone()) {
                name = format!("{base}_{n}");
                n += 1;
            }
            lark_names.insert(rule.name.clone(), name);
        }

        for rule in &mut rules {
            rule.body = simplify(std::mem::replace(&mut rule.body, Node::Seq(Vec::new())));
        }
        Ok(Grammar { rules, lark_names })
    }

    /// Same layout as the script: multi-line rules (alternatives or comments) are set off by
    /// blank lines, runs of one-line rules are not.
    fn render(&self) -> String {
        let mut out = String::from("%llguidance {}\n\n");
        let mut prev_multiline = true;
        for rule in &self.rules {
            let mut text = rule.comment.clone();
            text.push_str(&self.lark_names[&rule.name]);
            text.push_str(": ");
            match &rule.body {
                Node::Alt(alternatives) => {
                    for (i, alt) in alternatives.iter().enumerate() {
                        if i > 0 {
                            text.push_str(ALT_SEPARATOR);
                        }
                        self.render_node(alt, &mut text);
                    }
                }
                body => self.render_node(body, &mut text),
            }
            let multiline = text.contains('\n');
            if multiline && !prev_multiline {
                out.push('\n');
            }
            out.push_str(&text);
            out.push('\n');
            if multiline {
                out.push('\n');
            }
            prev_multiline = multiline;
        }
        out
    }

    fn render_node(&self, node: &Node, out: &mut String) {
        match node {
            Node::Literal(value) => push_lark_string(out, value),
            Node::Class { negated, ranges } => push_lark_class(out, *negated, ranges),
            Node::AnyChar => out.push_str("/./"),
            Node::Ref { name, .. } => out.push_str(&self.lark_names[name]),
            // Lark refuses a zero upper bound.
            Node::Repeat { max: Some(0), .. } => out.push_str("\"\""),
            Node::Repeat { node, min, max } => {
                let needs_parens =
                    matches!(**node, Node::Repeat { .. }) || matches!(&**node, Node::Seq(n) if n.len() > 1);
                if needs_parens {
                    out.push('(');
                }
                self.render_node(node, out);
                if needs_parens {
                    out.push(')');
                }
                match (min, max) {
                    (0, None) => out.push('*'),
                    (1, None) => out.push('+'),
                    (0, Some(1)) => out.push('?'),
                    (min, None) => _ = write!(out, "{{{min},}}"),
                    (min, Some(max)) => _ = write!(out, "{{{min},{max}}}"),
                }
            }
            Node::Seq(nodes) if nodes.is_empty() => out.push_str("\"\""),
            Node::Seq(nodes) => {
                for (i, n) in nodes.iter().enumerate() {
                    if i > 0 {
                        out.push(' ');
                    }
                    self.render_node(n, out);
                }
            }
            Node::Alt(alternatives) => {
                out.push('(');
                for (i, alt) in alternatives.iter().enumerate() {
                    if i > 0 {
                        out.push_str(" | ");
                    }
                    self.render_node(alt, out);
                }
                out.push(')');
            }
        }
    }
}

fn check_refs(node: &Node, index: &HashMap<&str, usize>, src: &str) -> Result<(), String> {
    match node {
        Node::Ref { name, at } if !index.contains_key(name.as_str()) => {
            Err(located(src, *at, format!("reference to undefined rule '{name}'")))
        }
        Node::Repeat { node, .. } => check_refs(node, index, src),
        Node::Seq(nodes) | Node::Alt(nodes) => nodes.iter().try_for_each(|n| check_refs(n, index, src)),
        _ => Ok(()),
    }
}

fn is_terminal(node: &Node, index: &HashMap<&str, usize>, terminal: &[bool]) -> bool {
    match node {
        Node::Literal(_) | Node::Class { .. } | Node::AnyChar => true,
        Node::Ref { name, .. } => index.get(name.as_str()).is_some_and(|&i| terminal[i]),
        Node::Repeat { node, .. } => is_terminal(node, index, terminal),
        Node::Seq(nodes) | Node::Alt(nodes) => nodes.iter().all(|n| is_terminal(n, index, terminal)),
    }
}

/// Drops the one-element sequences and alternations that every group and rule body parses into.
fn simplify(node: Node) -> Node {
    fn unwrap_single(nodes: Vec<Node>, wrap: fn(Vec<Node>) -> Node) -> Node {
        let nodes: Vec<Node> = nodes.into_iter().map(simplify).collect();
        match <[Node; 1]>::try_from(nodes) {
            Ok([single]) => single,
            Err(nodes) => wrap(nodes),
        }
    }
    match node {
        Node::Seq(nodes) => unwrap_single(nodes, Node::Seq),
        Node::Alt(nodes) => unwrap_single(nodes, Node::Alt),
        Node::Repeat { node, min, max } => Node::Repeat { node: Box::new(simplify(*node)), min, max },
        other => other,
    }
}

/// The script's renaming (`-` to `_`, `fooBar` to `foo_bar`, case by kind), plus the fixes Lark
/// needs: names must be ASCII and start with a letter (after at most one `_`).
fn lark_name(gbnf_name: &str, terminal: bool) -> String {
    let mut name = String::new();
    let mut prev_lower = false;
    for c in gbnf_name.chars() {
        if prev_lower && c.is_ascii_uppercase() {
            name.push('_');
        }
        prev_lower = c.is_ascii_lowercase();
        match c {
            '-' => name.push('_'),
            c if c.is_ascii_alphanumeric() || c == '_' => name.push(c.to_ascii_lowercase()),
            c => _ = write!(name, "u{:x}", u32::from(c)),
        }
    }
    if !name.strip_prefix('_').unwrap_or(&name).starts_with(|c: char| c.is_ascii_lowercase()) {
        name.insert_str(0, "r_");
    }
    if terminal {
        name.make_ascii_uppercase();
    }
    name
}

/// Control and non-space whitespace characters are written as hex escapes so the Lark text stays
/// readable and Lark's string token (which forbids raw control characters) accepts it. None of
/// these lie outside the BMP, so four hex digits always suffice.
fn needs_hex_escape(c: char) -> bool {
    (c.is_control() || (c.is_whitespace() && c != ' ')) && u32::from(c) <= 0xFFFF
}

/// Writes `c` as an escape understood both by Lark strings (JSON plus `\xNN`) and by Rust regex
/// syntax, if it needs one; returns whether it did.
fn push_common_escape(out: &mut String, c: char) -> bool {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if needs_hex_escape(c) && u32::from(c) <= 0xFF => _ = write!(out, "\\x{:02X}", u32::from(c)),
        c if needs_hex_escape(c) => _ = write!(out, "\\u{:04X}", u32::from(c)),
        _ => return false,
    }
    true
}

fn push_lark_string(out: &mut String, value: &str) {
    out.push('"');
    for c in value.chars() {
        if push_common_escape(out, c) {
            continue;
        }
        if c == '"' || c == '\\' {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('"');
}

fn push_lark_class(out: &mut String, negated: bool, ranges: &[(char, char)]) {
    out.push_str("/[");
    if negated {
        out.push('^');
    }
    for &(lo, hi) in ranges {
        push_class_char(out, lo);
        if hi != lo {
            out.push('-');
            push_class_char(out, hi);
        }
    }
    out.push_str("]/");
}

/// Always escaping these is simpler than tracking where Rust's class syntax would read them as
/// set operators (`&&`, `--`, `~~`), nested classes, negation or a range; `/` ends the Lark regex.
fn push_class_char(out: &mut String, c: char) {
    if push_common_escape(out, c) {
        return;
    }
    if matches!(c, '\\' | ']' | '[' | '^' | '-' | '&' | '~' | '/') {
        out.push('\\');
    }
    out.push(c);
}

#[cfg(test)]
mod tests {
    use super::any_to_lark;
    use llguidance::api::TopLevelGrammar;
    use llguidance::{Matcher, ParserFactory};
    use toktrie::ApproximateTokEnv;

    const SAMPLES: &[(&str, &str)] = &[
        ("arithmetic", include_str!("testdata/arithmetic.gbnf")),
        ("c", include_str!("testdata/c.gbnf")),
        ("chess", include_str!("testdata/chess.gbnf")),
        ("english", include_str!("testdata/english.gbnf")),
        ("japanese", include_str!("testdata/japanese.gbnf")),
        ("json", include_str!("testdata/json.gbnf")),
        ("json_arr", include_str!("testdata/json_arr.gbnf")),
        ("list", include_str!("testdata/list.gbnf")),
        ("vllm-sql", include_str!("testdata/vllm-sql.gbnf")),
    ];

    fn sample(name: &str) -> &'static str {
        SAMPLES.iter().find(|(n, _)| *n == name).map(|(_, text)| *text).expect("known sample")
    }

    /// Byte-level vocabulary: token `b` is the byte `b`, so a sentence is fed byte by byte.
    fn factory() -> ParserFactory {
        let mut factory = ParserFactory::new_simple(&ApproximateTokEnv::single_byte_env()).expect("factory");
        factory.quiet();
        factory
    }

    fn matcher(factory: &ParserFactory, lark: &str) -> Matcher {
        let parser = factory.create_parser(TopLevelGrammar::from_lark(lark.to_owned()));
        if let Err(e) = &parser {
            panic!("llguidance rejected the Lark grammar: {e}\n{lark}");
        }
        Matcher::new(parser)
    }

    /// Feeds `input` byte by byte; returns the index of the first byte the mask refuses, or
    /// `None` if every byte was allowed and the matcher can stop (EOS allowed) at the end.
    fn first_refused_byte(factory: &ParserFactory, lark: &str, input: &[u8]) -> Option<usize> {
        let mut m = matcher(factory, lark);
        for (i, &b) in input.iter().enumerate() {
            let mask = m.compute_mask().expect("mask");
            if !mask.is_allowed(u32::from(b)) {
                return Some(i);
            }
            m.consume_token(u32::from(b)).expect("consume allowed byte");
        }
        assert!(m.is_accepting().expect("is_accepting"), "{input:?} is incomplete for\n{lark}");
        None
    }

    fn convert(gbnf: &str) -> String {
        let lark = any_to_lark(gbnf).unwrap_or_else(|e| panic!("conversion failed: {e}"));
        matcher(&factory(), &lark);
        lark
    }

    fn convert_err(gbnf: &str) -> String {
        any_to_lark(gbnf).expect_err("conversion should fail")
    }

    #[test]
    fn literal_escapes() {
        assert_eq!(
            convert(r#"root ::= "a\"b\\c\n\r\t\x41\u00e9\U0001F600[\[\]]\x0b/""#),
            "%llguidance {}\n\nstart: \"a\\\"b\\\\c\\n\\r\\tAé😀[[]]\\x0B/\"\n"
        );
        // Raw control characters cannot appear inside a Lark string.
        assert_eq!(convert("root ::= \"a\u{7}\u{2028}b\""), "%llguidance {}\n\nstart: \"a\\x07\\u2028b\"\n");
    }

    #[test]
    fn char_classes() {
        assert_eq!(
            convert(r#"root ::= [a-z0-9_] [^"\\\n] [-+*/] [\x00-\x1F\u2028] [\]^[] [a-] [&&~~] [+--] [ぁ-ゟ]"#),
            "%llguidance {}\n\nstart: /[a-z0-9_]/ /[^\"\\\\\\n]/ /[\\-+*\\/]/ /[\\x00-\\x1F\\u2028]/ /[\\]\\^\\[]/ \
             /[a\\-]/ /[\\&\\&\\~\\~]/ /[+-\\-]/ /[ぁ-ゟ]/\n"
        );
        assert_eq!(convert("root ::= . \"x\""), "%llguidance {}\n\nstart: /./ \"x\"\n");
    }

    #[test]
    fn repetitions() {
        assert_eq!(
            convert(r#"root ::= "a"{3} "b"{2,} "c"{ 1 , 4 } "d"{0,1} "e"{0,} "f"{1,} ("g" "h"){2} "i"{0} ("j"*)*"#),
            "%llguidance {}\n\nstart: \"a\"{3,3} \"b\"{2,} \"c\"{1,4} \"d\"? \"e\"* \"f\"+ (\"g\" \"h\"){2,2} \"\" (\"j\"*)*\n"
        );
    }

    #[test]
    fn rules_terminals_and_renaming() {
        let gbnf = "\
root ::= greeting ws name
greeting ::= \"hi\" | \"hello\"
ws ::= [ ]+
firstName ::= [A-Z] [a-z]*
name ::= firstName | name \"-\" firstName
";
        let expected = "%llguidance {}

start: GREETING WS name

GREETING: \"hi\"
     | \"hello\"

WS: /[ ]/+
FIRST_NAME: /[A-Z]/ /[a-z]/*

name: FIRST_NAME
     | name \"-\" FIRST_NAME

";
        assert_eq!(convert(gbnf), expected);
    }

    #[test]
    fn names_lark_cannot_take() {
        // `start ::=` is GBNF, not Lark; the user's `start` and the clashing names get suffixes.
        let gbnf = "root ::= start a-b a_b 1x é\nstart ::= \"s\" start | \"t\"\na-b ::= \"x\" a-b | \"y\"\n\
                    a_b ::= \"z\" a_b | \"w\"\n1x ::= \"1\"\né ::= \"e\"\n";
        let lark = convert(gbnf);
        assert!(lark.starts_with("%llguidance {}\n\nstart: start_2 a_b a_b_2 R_1X UE9\n"), "{lark}");
        assert!(lark.contains("\nstart_2: \"s\" start_2\n"), "{lark}");
    }

    #[test]
    fn comments_and_continuation_lines() {
        let gbnf = "# top comment\nroot ::=\n  (\n    \"a\" |   # first\n    \"b\"\n  ) c\r\nc ::= \"x\" |\n      \"y\"\n# dropped\n";
        assert_eq!(
            convert(gbnf),
            "%llguidance {}\n\n// top comment\n// first\nstart: (\"a\" | \"b\") C\n\nC: \"x\"\n     | \"y\"\n\n"
        );
    }

    #[test]
    fn last_definition_wins() {
        assert_eq!(convert("root ::= a\na ::= \"1\"\na ::= \"2\"\n"), "%llguidance {}\n\nstart: A\nA: \"2\"\n");
    }

    #[test]
    fn lark_passes_through() {
        for lark in ["start: \"a\" | b\nb: /x+/\n", "%llguidance {}\nstart: foo\nfoo: \"x\"\n", "  start : \"a\"\n"] {
            assert_eq!(any_to_lark(lark).as_deref(), Ok(lark));
        }
    }

    #[test]
    fn errors_name_the_problem_and_line() {
        let cases: &[(&str, &str)] = &[
            ("", "empty"),
            ("\n  # only a comment\n", "empty"),
            ("foo ::= \"a\"", "no 'root' rule"),
            ("root ::= \"abc", "line 1, column 10: unterminated string literal"),
            ("root ::= [a-z", "line 1, column 10: unterminated character class"),
            ("root ::= x\n\nx ::= y", "line 3, column 7: reference to undefined rule 'y'"),
            ("root ::= \"a\"\nfoo = \"b\"", "line 2, column 5: expected '::=' after rule name 'foo'"),
            ("root ::= \"\\q\"", "line 1, column 11: invalid escape sequence \\q"),
            ("root ::= \"\\x4\"", "escape sequence needs 2 hex digits"),
            ("root ::= \"\\uD800\"", "not a valid Unicode character"),
            ("root ::= []", "empty character class"),
            ("root ::= [z-a]", "reversed"),
            ("root ::= \"a\"{3,1}", "maximum is less than its minimum"),
            ("root ::= \"a\"{x}", "expected a repetition count"),
            ("root ::= \"a\"{99999999999}", "too large"),
            ("root ::= \"a\" ; \"b\"", "line 1, column 14: unexpected character ';'"),
            ("root ::= (\"a\" \"b\"\n", "expected ')', found end of input"),
            ("root ::= \"a\"\n  | \"b\"", "line 2, column 3: expected a rule name, found '|'"),
            ("root ::= \"a\"**", "unexpected character '*'"),
        ];
        for (gbnf, expected) in cases {
            let err = convert_err(gbnf);
            assert!(err.contains(expected), "{gbnf:?}: {err:?} does not mention {expected:?}");
        }
        let deep = format!("root ::= {}\"a\"{}", "(".repeat(10_000), ")".repeat(10_000));
        assert!(convert_err(&deep).contains("nested more than"));
    }

    #[test]
    fn all_samples_compile() {
        let factory = factory();
        for (name, gbnf) in SAMPLES {
            let lark = any_to_lark(gbnf).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert!(lark.starts_with("%llguidance {}\n"), "{name} was not converted");
            matcher(&factory, &lark);
        }
    }

    #[test]
    fn samples_accept_and_refuse_sentences() {
        let factory = factory();
        let arithmetic = any_to_lark(sample("arithmetic")).expect("arithmetic");
        // Lines end after `)`: a NUM or IDENT lexeme would swallow the newline (see module doc).
        assert_eq!(first_refused_byte(&factory, &arithmetic, b"(a+12)*3= (x_1)\n(1)=(b /2)\n"), None);
        assert_eq!(first_refused_byte(&factory, &arithmetic, b"1+=2\n"), Some(2));

        let json = any_to_lark(sample("json")).expect("json");
        let doc = br#"{"a": [1, -2.5e3, "x\n\u00e9"], "b": {"c": true, "d": null}}"#;
        assert_eq!(first_refused_byte(&factory, &json, doc), None);
        assert_eq!(first_refused_byte(&factory, &json, br#"{"a": tru}"#), Some(9));

        let sql = any_to_lark(sample("vllm-sql")).expect("vllm-sql");
        assert_eq!(first_refused_byte(&factory, &sql, b"SELECTcol_2fromtable_1wherecol_1=2"), None);
        assert_eq!(first_refused_byte(&factory, &sql, b"SELECT * from"), Some(6));
    }
}
