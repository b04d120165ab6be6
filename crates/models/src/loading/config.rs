//! Reading Hugging Face `config.json`: the raw JSON is kept so each family can deserialize the
//! typed config it needs (unknown fields are ignored; a missing required field is an error that
//! names the file and the field).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::{ModelError, Result};

#[derive(Debug, Clone)]
pub struct RawConfig {
    /// Where the config came from (a `config.json`, or a GGUF file whose metadata it was built from).
    pub path: PathBuf,
    pub value: Value,
}

impl RawConfig {
    pub fn from_file(path: &Path) -> Result<RawConfig> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ModelError::Io { path: path.to_path_buf(), source })?;
        let value: Value = serde_json::from_str(&python_json_literals(&text))
            .map_err(|e| ModelError::Config { path: path.to_path_buf(), message: format!("invalid JSON: {e}") })?;
        if !value.is_object() {
            return Err(ModelError::Config { path: path.to_path_buf(), message: "expected a JSON object".into() });
        }
        Ok(RawConfig { path: path.to_path_buf(), value })
    }

    /// The text model's config of a `*ForConditionalGeneration` checkpoint: its `text_config`, with
    /// the top-level `architectures`, and `tie_word_embeddings` where the text config does not say.
    pub fn text_config(&self) -> Result<RawConfig> {
        let mut text = self.value.get("text_config").filter(|t| t.is_object()).cloned().ok_or_else(|| {
            self.error("missing field `text_config` (the text model's config of a ForConditionalGeneration checkpoint)")
        })?;
        let obj = text.as_object_mut().expect("checked above");
        // transformers ties by the model class's config, the top level, whatever `text_config`
        // says (Gemma 3's repeats the text class's default, `true`, under a top-level `false`).
        if let Some(tie) = self.value.get("tie_word_embeddings").filter(|t| t.is_boolean()) {
            obj.insert("tie_word_embeddings".into(), tie.clone());
        }
        if let Some(archs) = self.value.get("architectures") {
            obj.insert("architectures".into(), archs.clone());
        }
        Ok(RawConfig { path: self.path.clone(), value: text })
    }

    /// A vision-language config's image placeholder token: `image_token_id` (transformers 5), or
    /// `image_token_index` (llava-hf's configs), else `default`.
    pub fn image_token_id(&self, default: u64) -> Result<u32> {
        let id = ["image_token_id", "image_token_index"]
            .iter()
            .find_map(|key| self.value.get(*key).and_then(Value::as_u64))
            .unwrap_or(default);
        u32::try_from(id).map_err(|_| self.error(format!("image token id {id} is too large")))
    }

    /// The first entry of `architectures`, which selects the model class (as transformers does).
    pub fn architecture(&self) -> Result<String> {
        self.value
            .get("architectures")
            .and_then(|a| a.as_array())
            .and_then(|a| a.first())
            .and_then(|a| a.as_str())
            .map(str::to_owned)
            .ok_or_else(|| self.error("missing field `architectures` (a list naming the model class)"))
    }

    pub fn parse<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_value(self.value.clone()).map_err(|e| self.error(e.to_string()))
    }

    /// The config with keys renamed `(from, to)`, for families that spell the common keys their
    /// own way (`n_embd` for `hidden_size`). The common key then means the family's key alone: a
    /// stray one the family never reads is dropped (an OPT config's `intermediate_size` is not its
    /// `ffn_dim`).
    pub fn renamed(&self, names: &[(&str, &str)]) -> RawConfig {
        let mut value = self.value.clone();
        if let Some(obj) = value.as_object_mut() {
            for (from, to) in names {
                match obj.remove(*from) {
                    Some(v) => obj.insert((*to).to_owned(), v),
                    None => obj.remove(*to),
                };
            }
        }
        RawConfig { path: self.path.clone(), value }
    }

    /// A number whose transformers default applies only when the key is absent (`null` turns the
    /// feature off, e.g. Gemma 2's soft-caps).
    pub fn f64_or(&self, key: &str, default: Option<f64>) -> Option<f64> {
        match self.value.get(key) {
            None => default,
            Some(v) => v.as_f64(),
        }
    }

    /// The whole number at `key`, or `default` where the config leaves it out (absent or null).
    pub fn count_or(&self, key: &str, default: usize) -> Result<usize> {
        match self.value.get(key) {
            None | Some(serde_json::Value::Null) => Ok(default),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| self.error(format!("`{key}` is {v}: it must be a whole number"))),
        }
    }

    pub fn error(&self, message: impl Into<String>) -> ModelError {
        ModelError::Config { path: self.path.clone(), message: message.into() }
    }
}

/// `text` with the non-standard literals Python's `json` writes for non-finite floats outside
/// strings (real Nemotron-H and Mamba2 configs have `"time_step_limit": [0.0, Infinity]`)
/// replaced by JSON: `Infinity` by the largest finite f64 (with its sign), `NaN` by `null`.
fn python_json_literals(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains("Infinity") && !text.contains("NaN") {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len());
    let (mut in_string, mut escaped) = (false, false);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if in_string {
            (in_string, escaped) = (escaped || c != '"', !escaped && c == '\\');
        } else if c == '"' {
            in_string = true;
        } else if let Some(tail) = rest.strip_prefix("Infinity") {
            out.push_str("1.7976931348623157e308");
            rest = tail;
            continue;
        } else if let Some(tail) = rest.strip_prefix("NaN") {
            out.push_str("null");
            rest = tail;
            continue;
        }
        out.push(c);
        rest = &rest[c.len_utf8()..];
    }
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[allow(dead_code)]
    struct Needs {
        hidden_size: usize,
    }

    #[test]
    fn python_non_finite_literals_parse() {
        let text = r#"{"time_step_limit": [0.0, Infinity], "low": -Infinity, "x": NaN, "s": "NaN \" Infinity"}"#;
        let v: Value = serde_json::from_str(&python_json_literals(text)).unwrap();
        assert_eq!(v["time_step_limit"][1].as_f64(), Some(f64::MAX));
        assert_eq!(v["low"].as_f64(), Some(-f64::MAX));
        assert!(v["x"].is_null());
        assert_eq!(v["s"], "NaN \" Infinity");
    }

    #[test]
    fn missing_field_error_names_file_and_field() {
        let raw =
            RawConfig { path: "dir/config.json".into(), value: serde_json::json!({"vocab_size": 3, "extra": true}) };
        let err = raw.parse::<Needs>().unwrap_err().to_string();
        assert!(err.contains("dir/config.json") && err.contains("hidden_size"), "{err}");
        assert!(raw.architecture().unwrap_err().to_string().contains("architectures"));
    }
}
