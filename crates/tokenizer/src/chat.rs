use minijinja::{Environment, ErrorKind, Value as JValue};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::{Result, TokenizerError};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage { role: role.into(), content: content.into() }
    }
}

/// Instructions one render may execute: far beyond what a real template spends on a long
/// conversation, so a template that loops for ever (or for a very long time) fails quickly.
const TEMPLATE_FUEL: u64 = 20_000_000;
/// The most text a render may produce: well past any context window's worth of prompt.
const MAX_RENDERED_BYTES: usize = 32 << 20;

/// The rendering's sink: fails once the text passes [`MAX_RENDERED_BYTES`], so a template that
/// repeats a string into gigabytes stops at the bound instead of taking the memory.
struct BoundedOutput(Vec<u8>);

impl std::io::Write for BoundedOutput {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_RENDERED_BYTES {
            return Err(std::io::Error::other(format!("the rendered prompt passes {MAX_RENDERED_BYTES} bytes")));
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A Jinja chat template, compiled once, rendered with the environment transformers uses:
/// `trim_blocks`, `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, and Python
/// string/dict methods (minijinja-contrib's pycompat).
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

fn raise_exception(message: String) -> std::result::Result<String, minijinja::Error> {
    Err(minijinja::Error::new(ErrorKind::InvalidOperation, message))
}

/// Python's `strftime` raises on a directive it does not know; chrono's formatter reports one
/// as a `fmt::Error` (which `to_string` would turn into a panic), so it becomes the template's
/// error.
fn strftime_now(format: String) -> std::result::Result<String, minijinja::Error> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| {
        minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}"))
    })?;
    Ok(out)
}

/// transformers' `tojson` filter, which is Python's `json.dumps(x, ensure_ascii=False,
/// indent=indent, separators=separators, sort_keys=sort_keys)`: `", "` and `": "` between items
/// unless indented, keys in insertion order, non-ASCII text as is. Templates print tool schemas
/// with it, so its spacing is part of the prompt.
fn tojson(value: JValue, kwargs: minijinja::value::Kwargs) -> std::result::Result<String, minijinja::Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    // ensure_ascii=True would escape non-ASCII text; templates do not ask for it.
    let _: Option<bool> = kwargs.get("ensure_ascii")?;
    kwargs.assert_all_used()?;
    let (item, key) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => return Err(minijinja::Error::new(ErrorKind::InvalidOperation, "separators must be a pair")),
        None if indent.is_some() => (",".to_string(), ": ".to_string()),
        None => (", ".to_string(), ": ".to_string()),
    };
    let json =
        serde_json::to_value(&value).map_err(|e| minijinja::Error::new(ErrorKind::InvalidOperation, e.to_string()))?;
    let mut out = String::new();
    write_py_json(
        &mut out,
        &json,
        &PyJson { indent, item: &item, key: &key, sort_keys: sort_keys.unwrap_or(false) },
        0,
    );
    Ok(out)
}

struct PyJson<'a> {
    indent: Option<usize>,
    item: &'a str,
    key: &'a str,
    sort_keys: bool,
}

fn write_py_json(out: &mut String, v: &Value, f: &PyJson<'_>, depth: usize) {
    let newline = |out: &mut String, depth: usize| {
        if let Some(n) = f.indent {
            out.push('\n');
            out.push_str(&" ".repeat(n * depth));
        }
    };
    match v {
        Value::Array(items) if !items.is_empty() => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(f.item);
                }
                newline(out, depth + 1);
                write_py_json(out, item, f, depth + 1);
            }
            newline(out, depth);
            out.push(']');
        }
        Value::Object(map) if !map.is_empty() => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            if f.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(b.0));
            }
            out.push('{');
            for (i, (k, item)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.push_str(f.item);
                }
                newline(out, depth + 1);
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(f.key);
                write_py_json(out, item, f, depth + 1);
            }
            newline(out, depth);
            out.push('}');
        }
        // Scalars and empty containers print as serde_json prints them, which is Python's
        // spelling too (`[]`, `{}`, `1.5`, escapes in lower-case hex).
        other => out.push_str(&other.to_string()),
    }
}

impl ChatTemplate {
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        // Templates can come from requests (`--trust-request-chat-template`): bound their work.
        // No loader is set, so `include`/`import` reach no file.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned("chat", source.clone()).map_err(|e| TokenizerError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(|m| serde_json::json!(m)).collect();
        self.render_chat(&ChatRender { messages: &messages, add_generation_prompt, ..Default::default() })
    }

    /// Renders as transformers' `apply_chat_template(messages, tools=..., add_generation_prompt=...,
    /// continue_final_message=..., **kwargs)`: the kwargs join the special tokens in the template's
    /// variables, and a continued final message is cut where its content ends.
    pub fn render_chat(&self, r: &ChatRender<'_>) -> Result<String> {
        let template = self.env.get_template("chat").map_err(|e| TokenizerError::Template(e.to_string()))?;
        let mut vars = Map::new();
        vars.insert("bos_token".into(), self.bos_token.clone().into());
        vars.insert("eos_token".into(), self.eos_token.clone().into());
        if let Some(kwargs) = r.kwargs {
            vars.extend(kwargs.clone());
        }
        vars.insert("messages".into(), Value::Array(r.messages.to_vec()));
        vars.insert("tools".into(), r.tools.map_or(Value::Null, |t| Value::Array(t.to_vec())));
        vars.insert("documents".into(), Value::Null);
        vars.insert("add_generation_prompt".into(), r.add_generation_prompt.into());
        let mut out = BoundedOutput(Vec::new());
        // minijinja 2.24 panics on some input (`''[::-1]` indexes an empty string); a template
        // from a request must not take the server down with it. The environment is not changed
        // by rendering, so nothing is left half-updated after the unwind.
        let rendered = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            template.render_captured_to(JValue::from_serialize(&vars), &mut out)
        }))
        .map_err(|panic| TokenizerError::Template(format!("the template engine failed: {}", panic_text(&panic))))?;
        rendered.map_err(|e| {
            TokenizerError::Template(match std::error::Error::source(&e) {
                Some(cause) => format!("{e}: {cause}"),
                None => e.to_string(),
            })
        })?;
        let rendered = String::from_utf8(out.0).map_err(|e| TokenizerError::Template(e.to_string()))?;
        if r.continue_final_message {
            continue_final_message(rendered, r.messages.last())
        } else {
            Ok(rendered)
        }
    }
}

pub(crate) fn panic_text(panic: &(dyn std::any::Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("panic")
}

/// What a chat template renders: transformers' `apply_chat_template` arguments.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatRender<'a> {
    /// OpenAI-style message objects (role, content, tool_calls, tool_call_id, ...).
    pub messages: &'a [Value],
    /// `tools` as the request lists them (`{"type": "function", "function": {...}}`).
    pub tools: Option<&'a [Value]>,
    pub add_generation_prompt: bool,
    /// Leave the last message open for the model to continue.
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub kwargs: Option<&'a Map<String, Value>>,
}

/// transformers' cut for `continue_final_message`: the rendering up to the end of the final
/// message's content (its text part for a list of parts), wherever the template put it last.
fn continue_final_message(rendered: String, last: Option<&Value>) -> Result<String> {
    let content = last.and_then(|m| m.get("content"));
    let text = match content {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Array(parts)) => {
            parts.iter().rev().find_map(|p| p.get("text").and_then(Value::as_str)).ok_or_else(|| {
                TokenizerError::Template("continue_final_message: the final message has no text".into())
            })?
        }
        _ => return Err(TokenizerError::Template("continue_final_message: the final message has no content".into())),
    };
    let Some(at) = rendered.rfind(text.trim()) else {
        return Err(TokenizerError::Template(
            "continue_final_message is set but the final message does not appear in the chat after applying the \
             chat template"
                .into(),
        ));
    };
    let kept = text.trim_start();
    let end = if rendered[at..].starts_with(kept) { at + kept.len() } else { at + text.trim().len() };
    Ok(rendered[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] | trim + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_generation_prompt_and_python_methods() {
        let t = ChatTemplate::new(CHATML.into(), String::new(), String::new()).unwrap();
        let out = t.render(&[ChatMessage::new("user", " Hi ")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
        let py = ChatTemplate::new("{{ messages[0].content.strip().upper() }}".into(), String::new(), String::new())
            .unwrap();
        assert_eq!(py.render(&[ChatMessage::new("user", " x ")], false).unwrap(), "X");
    }

    /// Real templates (Qwen3, Qwen2.5, Llama-3.2, Mistral-Nemo, DeepSeek-V3) against what
    /// transformers renders for tools, tool calls and results, continued messages and kwargs
    /// (fixtures/chat_templates, from tools/oracle/generate_chat_template_goldens.py).
    #[test]
    fn real_templates_render_as_transformers_does() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat_templates");
        let mut checked = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let spec: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
            let text = |k: &str| spec[k].as_str().unwrap().to_string();
            let t = ChatTemplate::new(text("chat_template"), text("bos_token"), text("eos_token")).unwrap();
            for case in spec["cases"].as_array().unwrap() {
                let messages = case["messages"].as_array().unwrap();
                let tools = case["tools"].as_array().map(Vec::as_slice);
                let r = ChatRender {
                    messages,
                    tools,
                    add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
                    continue_final_message: case["continue_final_message"].as_bool().unwrap(),
                    kwargs: case["kwargs"].as_object(),
                };
                let got = t.render_chat(&r);
                match case.get("rendered").and_then(Value::as_str) {
                    Some(want) => assert_eq!(got.unwrap(), want, "{} / {}", path.display(), case["name"]),
                    None => assert!(got.is_err(), "{} / {}: transformers refused it", path.display(), case["name"]),
                }
                checked += 1;
            }
        }
        assert!(checked >= 30, "{checked} cases");
    }

    /// The fuel bound leaves room for long real conversations: 2000 turns with tools through the
    /// Llama-3.2 template (the busiest of the fixtures).
    #[test]
    fn long_real_conversations_fit_the_fuel() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/chat_templates/llama3_2.json");
        let spec: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let t = ChatTemplate::new(
            spec["chat_template"].as_str().unwrap().into(),
            "<|begin_of_text|>".into(),
            String::new(),
        )
        .unwrap();
        let messages: Vec<Value> = (0..2000)
            .map(|i| serde_json::json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": "a fairly ordinary sentence of text"}))
            .collect();
        let tools = spec["cases"][1]["tools"].as_array().unwrap();
        let kwargs = spec["cases"][1]["kwargs"].as_object().unwrap();
        let r = ChatRender {
            messages: &messages,
            tools: Some(tools),
            add_generation_prompt: true,
            continue_final_message: false,
            kwargs: Some(kwargs),
        };
        assert!(t.render_chat(&r).unwrap().len() > 2000 * 30);
    }

    #[test]
    fn hostile_templates_fail_fast_and_bounded() {
        let render = |src: &str| {
            let t = ChatTemplate::new(src.into(), String::new(), String::new()).unwrap();
            let start = std::time::Instant::now();
            let err = t.render(&[ChatMessage::new("user", "x")], false).unwrap_err().to_string();
            (err, start.elapsed())
        };
        let (err, took) = render("{% for i in range(10000) %}{% for j in range(10000) %}x{% endfor %}{% endfor %}");
        assert!(err.contains("fuel"), "{err}");
        assert!(took < std::time::Duration::from_secs(20), "{took:?}");
        let (err, _) = render("{% for i in range(100) %}{{ 'x' * 10000000 }}{% endfor %}");
        assert!(err.contains("bytes"), "{err}");
        let (err, _) = render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
        assert!(err.contains("recursion"), "{err}");
        let (err, _) = render("{% include '/etc/passwd' %}");
        assert!(err.contains("not found") || err.contains("template"), "{err}");
    }

    /// Found by `tests/hostile_templates.rs`: minijinja 2.24 indexes past an empty string when
    /// reversing it. The render fails; the caller goes on.
    #[test]
    fn a_panic_inside_the_template_engine_is_an_error() {
        let t = ChatTemplate::new("{{ messages[0].content[::-1] }}".into(), String::new(), String::new()).unwrap();
        let err = t.render(&[ChatMessage::new("user", "")], false).unwrap_err().to_string();
        assert!(err.contains("the template engine failed"), "{err}");
        assert_eq!(t.render(&[ChatMessage::new("user", "abc")], false).unwrap(), "cba");
    }

    /// Found by `tests/hostile_templates.rs`: an unknown `strftime` directive panicked inside
    /// chrono's `to_string`.
    #[test]
    fn a_bad_strftime_format_is_the_templates_error() {
        let t = ChatTemplate::new("{{ strftime_now('%Y %Q') }}".into(), String::new(), String::new()).unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("bad format"), "{err}");
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}".into(), String::new(), String::new()).unwrap();
        assert_eq!(t.render(&[], false).unwrap().len(), 4);
    }

    #[test]
    fn raise_exception_surfaces_as_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), String::new(), String::new())
            .unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }
}
