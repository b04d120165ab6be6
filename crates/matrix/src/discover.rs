//! Finds the workspace's test functions by scanning source text.
//!
//! A test id is `<package>::<module path>::<fn>`:
//! - integration tests (`crates/<dir>/tests/<stem>.rs`): the module path starts with `<stem>`;
//! - unit tests (`crates/<dir>/src/**/*.rs`): the module path is the file's module path
//!   (`src/lib.rs` and `src/main.rs` are the root, `src/a/mod.rs` is `a`, `src/a/b.rs` is `a::b`);
//! - either way, inline `mod name { ... }` blocks append `name` (so `#[cfg(test)] mod tests`
//!   gives `...::tests::<fn>`), matching what `cargo test` prints after the target name.
//!
//! `<package>` is the `[package] name` of `crates/<dir>/Cargo.toml`. A function counts as a test
//! when `#[test]` or `<path>::test` (e.g. `#[tokio::test]`, with or without arguments) is among
//! the attributes right before its `fn`. Tests that a `macro_rules!` macro defined earlier in the
//! same file generates from `ident` arguments count too (`parity! { llama => "llama" }` gives
//! `llama`), since that is how parity batteries are written. This is a lexical scan, not a parse:
//! other generated tests are not seen, which only matters if the inventory names one.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Test ids of every crate under `<workspace_root>/crates/`. Unreadable crates and files are
/// skipped: a test that cannot be seen is reported by [`crate::check`] as unknown, which is the
/// failure a reader needs to see anyway.
pub fn discover_test_ids(workspace_root: impl AsRef<Path>) -> BTreeSet<String> {
    let mut ids = BTreeSet::new();
    for crate_dir in sorted_entries(&workspace_root.as_ref().join("crates")) {
        let Some(package) = package_name(&crate_dir.join("Cargo.toml")) else {
            continue;
        };
        for file in sorted_entries(&crate_dir.join("tests")) {
            if let (Some(stem), true) = (file_stem(&file), is_rust(&file)) {
                collect(&file, &[stem], &package, &mut ids);
            }
        }
        let src = crate_dir.join("src");
        for file in rust_files_under(&src) {
            let Ok(relative) = file.strip_prefix(&src) else {
                continue;
            };
            collect(&file, &module_path(relative), &package, &mut ids);
        }
    }
    ids
}

fn collect(file: &Path, module: &[String], package: &str, ids: &mut BTreeSet<String>) {
    let Ok(text) = std::fs::read_to_string(file) else {
        return;
    };
    for path in test_ids_in_source(&text) {
        let id: Vec<&str> = std::iter::once(package)
            .chain(module.iter().map(String::as_str))
            .chain(path.iter().map(String::as_str))
            .collect();
        ids.insert(id.join("::"));
    }
}

fn package_name(manifest: &Path) -> Option<String> {
    let text = std::fs::read_to_string(manifest).ok()?;
    let table: toml::Table = text.parse().ok()?;
    Some(table.get("package")?.get("name")?.as_str()?.to_string())
}

fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut paths: Vec<PathBuf> = entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
    paths.sort();
    paths
}

fn rust_files_under(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for path in sorted_entries(dir) {
        if path.is_dir() {
            files.extend(rust_files_under(&path));
        } else if is_rust(&path) {
            files.push(path);
        }
    }
    files
}

fn is_rust(path: &Path) -> bool {
    path.is_file() && path.extension().is_some_and(|e| e == "rs")
}

fn file_stem(path: &Path) -> Option<String> {
    Some(path.file_stem()?.to_str()?.to_string())
}

/// Module path of a file relative to `src/`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let Some(last) = parts.pop() else {
        return parts;
    };
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    let is_root = parts.is_empty() && (stem == "lib" || stem == "main");
    if stem != "mod" && !is_root {
        parts.push(stem.to_string());
    }
    parts
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token<'a> {
    Ident(&'a str),
    Punct(char),
}

/// Test functions in one file, each as its inline-module path plus the function name.
fn test_ids_in_source(source: &str) -> Vec<Vec<String>> {
    scan(&tokenize(source), &mut Vec::new())
        .into_iter()
        .filter_map(|found| match found.name {
            Name::Fn(name) => Some(found.modules.into_iter().chain([name]).collect()),
            Name::Metavariable(_) => None,
        })
        .collect()
}

/// What follows `fn`: a name, or inside a macro body a `$metavariable` bound at the call site.
enum Name {
    Fn(String),
    Metavariable(String),
}

struct Found {
    modules: Vec<String>,
    name: Name,
}

/// A `macro_rules!` macro whose expansion contains test functions named by an `ident` fragment
/// (`parity! { llama => "llama", ... }`). What follows each such fragment in the matcher is what
/// picks the test names out of an invocation.
struct TestMacro<'a> {
    name: &'a str,
    followers: Vec<Follower<'a>>,
}

/// What a call site puts right after a test name.
#[derive(Clone, Copy)]
enum Follower<'a> {
    /// The token that follows the fragment in the matcher (`=>` in `$test:ident => ...`).
    Token(Token<'a>),
    /// The fragment ends the matcher or a `$( ... )` repetition: a separator or nothing.
    SeparatorOrEnd,
}

fn scan<'a>(tokens: &[Token<'a>], macros: &mut Vec<TestMacro<'a>>) -> Vec<Found> {
    let mut found = Vec::new();
    // Inline modules that are open, with the brace depth their body opened at.
    let mut modules: Vec<(&str, usize)> = Vec::new();
    let module_path = |modules: &[(&str, usize)]| modules.iter().map(|(m, _)| m.to_string()).collect::<Vec<_>>();
    let mut depth = 0usize;
    let mut test_attribute_pending = false;
    let mut i = 0;
    while i < tokens.len() {
        match tokens[i] {
            Token::Punct('#') => {
                let inner = tokens.get(i + 1) == Some(&Token::Punct('!'));
                let open = if inner { i + 2 } else { i + 1 };
                if tokens.get(open) == Some(&Token::Punct('[')) {
                    let close = matching(tokens, open);
                    if !inner && is_test_attribute(&tokens[open + 1..close]) {
                        test_attribute_pending = true;
                    }
                    i = close + 1;
                    continue;
                }
                test_attribute_pending = false;
            }
            Token::Ident("fn") => {
                let name = match (tokens.get(i + 1), tokens.get(i + 2)) {
                    (Some(Token::Ident(name)), _) => Some(Name::Fn(name.to_string())),
                    (Some(Token::Punct('$')), Some(Token::Ident(var))) => Some(Name::Metavariable(var.to_string())),
                    _ => None,
                };
                if let (true, Some(name)) = (test_attribute_pending, name) {
                    found.push(Found { modules: module_path(&modules), name });
                }
                test_attribute_pending = false;
            }
            Token::Ident("mod") => {
                if let (Some(Token::Ident(name)), Some(Token::Punct('{'))) = (tokens.get(i + 1), tokens.get(i + 2)) {
                    modules.push((name, depth + 1));
                }
                test_attribute_pending = false;
            }
            Token::Ident("macro_rules") => {
                if let (Some(Token::Punct('!')), Some(Token::Ident(name)), Some(open)) =
                    (tokens.get(i + 1), tokens.get(i + 2), tokens.get(i + 3).and_then(closer).map(|_| i + 3))
                {
                    let close = matching(tokens, open);
                    if let Some(test_macro) = test_macro(name, &tokens[open + 1..close]) {
                        macros.push(test_macro);
                    }
                    i = close + 1;
                    continue;
                }
                test_attribute_pending = false;
            }
            Token::Ident(name) if tokens.get(i + 1) == Some(&Token::Punct('!')) => {
                let test_macro = macros.iter().find(|m| m.name == name);
                if let (Some(test_macro), Some(open)) = (test_macro, tokens.get(i + 2).and_then(closer).map(|_| i + 2))
                {
                    let close = matching(tokens, open);
                    for name in invoked_test_names(test_macro, &tokens[open + 1..close]) {
                        found.push(Found { modules: module_path(&modules), name: Name::Fn(name.to_string()) });
                    }
                    i = close + 1;
                    continue;
                }
                test_attribute_pending = false;
            }
            // Qualifiers that may sit between the attributes and `fn`.
            Token::Ident("pub") => {
                if tokens.get(i + 1) == Some(&Token::Punct('(')) {
                    i = matching(tokens, i + 1) + 1;
                    continue;
                }
            }
            Token::Ident("async" | "unsafe" | "const" | "extern") => {}
            Token::Punct('{') => {
                depth += 1;
                test_attribute_pending = false;
            }
            Token::Punct('}') => {
                if modules.last().is_some_and(|&(_, d)| d == depth) {
                    modules.pop();
                }
                depth = depth.saturating_sub(1);
                test_attribute_pending = false;
            }
            _ => test_attribute_pending = false,
        }
        i += 1;
    }
    found
}

/// Reads the rules of a `macro_rules!` body (`(matcher) => {expansion};`...) and keeps the
/// macro if some expansion defines a test named by one of the matcher's `ident` fragments.
fn test_macro<'a>(name: &'a str, rules: &[Token<'a>]) -> Option<TestMacro<'a>> {
    let mut followers = Vec::new();
    let mut i = 0;
    while i < rules.len() && closer(&rules[i]).is_some() {
        let matcher_open = i;
        let matcher_close = matching(rules, matcher_open);
        let arrow = matcher_close + 1;
        let body_open = arrow + 2;
        if rules.get(arrow) != Some(&Token::Punct('=')) || rules.get(body_open).and_then(closer).is_none() {
            break;
        }
        let body_close = matching(rules, body_open);
        let matcher = &rules[matcher_open + 1..matcher_close];
        for found in scan(&rules[body_open + 1..body_close], &mut Vec::new()) {
            if let Name::Metavariable(var) = found.name {
                followers.extend(fragment_follower(matcher, &var));
            }
        }
        i = body_close + 1;
        if rules.get(i) == Some(&Token::Punct(';')) {
            i += 1;
        }
    }
    (!followers.is_empty()).then_some(TestMacro { name, followers })
}

/// What follows `$var:ident` in `matcher`; nothing when the matcher does not bind `var` as an
/// `ident`.
fn fragment_follower<'a>(matcher: &[Token<'a>], var: &str) -> Option<Follower<'a>> {
    let at = matcher
        .windows(4)
        .position(|w| w == [Token::Punct('$'), Token::Ident(var), Token::Punct(':'), Token::Ident("ident")])?;
    Some(match matcher.get(at + 4) {
        None | Some(Token::Punct(')' | ']' | '}')) => Follower::SeparatorOrEnd,
        Some(&token) => Follower::Token(token),
    })
}

/// Identifiers in a test macro's invocation that sit where a test name fragment goes: right
/// after the opening delimiter or a `,`/`;`, and right before that fragment's follower.
fn invoked_test_names<'a>(test_macro: &TestMacro<'a>, args: &[Token<'a>]) -> Vec<&'a str> {
    let mut names = Vec::new();
    let mut depth = 0usize;
    for (j, token) in args.iter().enumerate() {
        match token {
            _ if closer(token).is_some() => depth += 1,
            Token::Punct(')' | ']' | '}') => depth = depth.saturating_sub(1),
            Token::Ident(name) if depth == 0 => {
                let starts_item = j == 0 || matches!(args[j - 1], Token::Punct(',' | ';'));
                let next = args.get(j + 1).copied();
                let fits = test_macro.followers.iter().any(|follower| match follower {
                    Follower::Token(token) => next == Some(*token),
                    Follower::SeparatorOrEnd => {
                        matches!(next, None | Some(Token::Punct(',' | ';')))
                    }
                });
                if starts_item && fits && !names.contains(name) {
                    names.push(*name);
                }
            }
            _ => {}
        }
    }
    names
}

/// `test`, or a path ending in `::test` (`tokio::test`), optionally followed by arguments.
fn is_test_attribute(attribute: &[Token]) -> bool {
    let mut i = 0;
    let mut last = None;
    while let Some(Token::Ident(segment)) = attribute.get(i) {
        last = Some(*segment);
        i += 1;
        if attribute.get(i) == Some(&Token::Punct(':')) && attribute.get(i + 1) == Some(&Token::Punct(':')) {
            i += 2;
        } else {
            break;
        }
    }
    last == Some("test") && matches!(attribute.get(i), None | Some(Token::Punct('(')))
}

/// The closing delimiter for an opening one.
fn closer(token: &Token) -> Option<char> {
    match token {
        Token::Punct('(') => Some(')'),
        Token::Punct('[') => Some(']'),
        Token::Punct('{') => Some('}'),
        _ => None,
    }
}

/// Index of the delimiter closing the one at `open`, or the last index when unbalanced.
fn matching(tokens: &[Token], open: usize) -> usize {
    let left = tokens[open];
    let right = closer(&left).map(Token::Punct);
    let mut depth = 0usize;
    for (i, token) in tokens.iter().enumerate().skip(open) {
        if *token == left {
            depth += 1;
        } else if Some(*token) == right {
            depth -= 1;
            if depth == 0 {
                return i;
            }
        }
    }
    tokens.len().saturating_sub(1)
}

/// Identifiers and punctuation; comments, string and char literals, lifetimes and numbers are
/// dropped so that braces and `#[test]` inside them cannot confuse the scan.
fn tokenize(source: &str) -> Vec<Token<'_>> {
    let chars: Vec<(usize, char)> = source.char_indices().collect();
    let at = |i: usize| chars.get(i).map(|&(_, c)| c);
    let mut tokens = Vec::new();
    let mut i = 0;
    while let Some(c) = at(i) {
        if c.is_whitespace() {
            i += 1;
        } else if c == '/' && at(i + 1) == Some('/') {
            while at(i).is_some_and(|c| c != '\n') {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == Some('*') {
            let mut nesting = 0usize;
            while let Some(c) = at(i) {
                if c == '/' && at(i + 1) == Some('*') {
                    nesting += 1;
                    i += 2;
                } else if c == '*' && at(i + 1) == Some('/') {
                    nesting -= 1;
                    i += 2;
                    if nesting == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if c == '"' {
            i = skip_string(&chars, i + 1);
        } else if c == '\'' {
            if at(i + 1) == Some('\\') {
                // Escaped char literal: '\n', '\'', '\u{1F600}'.
                i += 3;
                while at(i).is_some_and(|c| c != '\'') {
                    i += 1;
                }
                i += 1;
            } else if at(i + 2) == Some('\'') {
                i += 3;
            } else {
                // Lifetime or label: the identifier after it is not a token.
                i += 1;
                while at(i).is_some_and(is_ident_char) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit() {
            while at(i).is_some_and(is_ident_char) {
                i += 1;
            }
        } else if is_ident_char(c) {
            let start = i;
            while at(i).is_some_and(is_ident_char) {
                i += 1;
            }
            let word = slice(source, &chars, start, i);
            let hashes = chars[i..].iter().take_while(|&&(_, c)| c == '#').count();
            match (word, at(i), at(i + hashes)) {
                ("r" | "br" | "cr", _, Some('"')) => i = skip_raw_string(&chars, i + hashes + 1, hashes),
                ("b" | "c", Some('"'), _) => i = skip_string(&chars, i + 1),
                // Byte literal b'x': the char-literal branch skips the rest on the next turn.
                ("b", Some('\''), _) => {}
                ("r", Some('#'), _) if hashes == 1 => {
                    // Raw identifier r#name.
                    let start = i + 1;
                    i = start;
                    while at(i).is_some_and(is_ident_char) {
                        i += 1;
                    }
                    tokens.push(Token::Ident(slice(source, &chars, start, i)));
                }
                _ => tokens.push(Token::Ident(word)),
            }
        } else {
            tokens.push(Token::Punct(c));
            i += 1;
        }
    }
    tokens
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn slice<'a>(source: &'a str, chars: &[(usize, char)], start: usize, end: usize) -> &'a str {
    let from = chars[start].0;
    let to = chars.get(end).map_or(source.len(), |&(b, _)| b);
    &source[from..to]
}

/// Index just past the closing quote of a string whose body starts at `i`.
fn skip_string(chars: &[(usize, char)], mut i: usize) -> usize {
    while let Some(&(_, c)) = chars.get(i) {
        i += if c == '\\' { 2 } else { 1 };
        if c == '"' {
            break;
        }
    }
    i
}

/// Index just past `"` followed by `hashes` `#`s, for a raw string whose body starts at `i`.
fn skip_raw_string(chars: &[(usize, char)], mut i: usize, hashes: usize) -> usize {
    while let Some(&(_, c)) = chars.get(i) {
        i += 1;
        if c == '"' && (0..hashes).all(|k| chars.get(i + k).is_some_and(|&(_, c)| c == '#')) {
            return i + hashes;
        }
    }
    i
}

#[cfg(test)]
mod tests {
    use super::*;

    fn found(source: &str) -> Vec<String> {
        test_ids_in_source(source).into_iter().map(|p| p.join("::")).collect()
    }

    #[test]
    fn finds_plain_tokio_and_decorated_tests() {
        let source = r#"
            #[test]
            fn plain() {}

            #[tokio::test(flavor = "multi_thread")]
            async fn on_tokio() {}

            #[test]
            #[ignore = "needs weights"]
            #[should_panic(expected = "boom")]
            pub(crate) fn decorated() {}

            /// Doc comments may sit before and between attributes.
            #[test]
            /// Like this.
            fn documented() {}

            fn helper() {}
            #[cfg(test)]
            fn not_a_test() {}
            #[test_case(1)]
            fn parameterized() {}
        "#;
        assert_eq!(found(source), ["plain", "on_tokio", "decorated", "documented"]);
    }

    #[test]
    fn inline_modules_nest_and_close() {
        let source = r"
            mod declared_elsewhere;
            #[cfg(test)]
            mod tests {
                use super::*;
                #[test]
                fn outer() { if true { let _ = 1; } }
                mod nested {
                    #[test]
                    fn inner() {}
                }
                #[test]
                fn after_nested() {}
            }
            #[test]
            fn top_level() {}
        ";
        assert_eq!(found(source), ["tests::outer", "tests::nested::inner", "tests::after_nested", "top_level"]);
    }

    #[test]
    fn literals_and_comments_cannot_fake_structure() {
        let source = r###"
            // #[test] fn in_line_comment() {}
            /* #[test] fn in_block /* nested */ comment() { */
            const A: &str = "#[test] fn in_string() { \" }";
            const B: &str = r##"#[test] fn in_raw_string() "# { "##;
            const C: char = '{';
            const D: char = '\'';
            const E: u8 = b'}';
            fn lifetimes<'a>(x: &'a str) -> &'a str { 'outer: loop { break 'outer x; } }
            mod m {
                #[test]
                fn real() {}
            }
        "###;
        assert_eq!(found(source), ["m::real"]);
    }

    #[test]
    fn tests_generated_by_a_local_macro() {
        let source = r#"
            macro_rules! parity {
                ($($test:ident => $fixture:literal),* $(,)?) => {$(
                    #[test]
                    fn $test() { gate($fixture); }
                )*};
            }
            parity! {
                llama => "llama",
                mistral_sliding_window => "mistral",
                qwen3 => concat!("qwen", "3"),
            }
            macro_rules! one {
                ($name:ident, $fixture:literal) => {
                    #[test]
                    fn $name() { gate($fixture); }
                };
            }
            mod single {
                one!(gemma, "gemma");
            }
            macro_rules! listed {
                ($($name:ident),*) => { $( #[test] fn $name() {} )* };
            }
            listed!(a, b);
            macro_rules! not_tests {
                ($name:ident) => { fn $name() {} };
            }
            not_tests!(helper);
            fn gate(_: &str) { assert!(1 != 2); }
        "#;
        assert_eq!(found(source), ["llama", "mistral_sliding_window", "qwen3", "single::gemma", "a", "b"]);
    }

    #[test]
    fn file_module_paths() {
        let path = |p: &str| module_path(Path::new(p)).join("::");
        assert_eq!(path("lib.rs"), "");
        assert_eq!(path("main.rs"), "");
        assert_eq!(path("registry.rs"), "registry");
        assert_eq!(path("layers/mod.rs"), "layers");
        assert_eq!(path("layers/attention.rs"), "layers::attention");
        assert_eq!(path("layers/lib.rs"), "layers::lib");
    }

    #[test]
    fn discovers_this_crate() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let ids = discover_test_ids(&root);
        assert!(ids.contains("ferrite-matrix::discover::tests::discovers_this_crate"), "{ids:?}");
        assert!(ids.contains("ferrite-matrix::consistency::inventory_matches_code"), "{ids:?}");
    }
}
