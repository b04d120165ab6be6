use minijinja::{Environment, ErrorKind, Value as JValue};
use serde::{Deserialize, Serialize};

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

fn strftime_now(format: String) -> String {
    chrono::Local::now().format(&format).to_string()
}

impl ChatTemplate {
    pub fn new(source: String, bos_token: String, eos_token: String) -> Result<ChatTemplate> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        minijinja_contrib::add_to_environment(&mut env);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.clone()).map_err(|e| TokenizerError::Template(e.to_string()))?;
        Ok(ChatTemplate { env, source, bos_token, eos_token })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let template = self.env.get_template("chat").map_err(|e| TokenizerError::Template(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => JValue::from_serialize(messages),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.clone(),
                eos_token => self.eos_token.clone(),
            })
            .map_err(|e| TokenizerError::Template(e.to_string()))
    }
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

    #[test]
    fn raise_exception_surfaces_as_an_error() {
        let t = ChatTemplate::new("{{ raise_exception('roles must alternate') }}".into(), String::new(), String::new())
            .unwrap();
        let err = t.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("roles must alternate"), "{err}");
    }
}
