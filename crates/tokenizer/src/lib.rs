//! Text in and out of a model: the Hugging Face tokenizer (`tokenizer.json` through the
//! `tokenizers` crate), the chat template (`tokenizer_config.json` / `chat_template.jinja`,
//! rendered with minijinja as transformers renders it), special tokens from
//! `generation_config.json`. Incremental detokenization lives in the engine's detokenizer.

mod chat;

use std::path::{Path, PathBuf};

use serde_json::Value;

pub use chat::{ChatMessage, ChatRender, ChatTemplate};

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    #[error("chat template: {0}")]
    Template(String),
}

pub type Result<T> = std::result::Result<T, TokenizerError>;

pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    chat_template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    eos_token_ids: Vec<u32>,
    bos_token_id: Option<u32>,
}

fn read_json(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path)
        .map_err(|e| TokenizerError::File { path: path.to_path_buf(), message: e.to_string() })?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| TokenizerError::File { path: path.to_path_buf(), message: format!("invalid JSON: {e}") })
}

/// `bos_token` / `eos_token` in tokenizer_config.json are a string or an AddedToken object.
fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_owned),
        _ => None,
    }
}

fn id_list(v: Option<&Value>) -> Vec<u32> {
    match v {
        Some(Value::Number(n)) => n.as_u64().map(|n| vec![n as u32]).unwrap_or_default(),
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_u64).map(|n| n as u32).collect(),
        _ => Vec::new(),
    }
}

impl Tokenizer {
    /// Loads `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja` and
    /// `generation_config.json` from a checkpoint directory.
    pub fn from_dir(dir: &Path) -> Result<Tokenizer> {
        let tok_path = dir.join("tokenizer.json");
        let json = std::fs::read_to_string(&tok_path)
            .map_err(|e| TokenizerError::File { path: tok_path.clone(), message: e.to_string() })?;
        let config = read_json(&dir.join("tokenizer_config.json"))?.unwrap_or(Value::Null);
        let generation = read_json(&dir.join("generation_config.json"))?;
        let template_path = dir.join("chat_template.jinja");
        let template_file = if template_path.exists() {
            Some(
                std::fs::read_to_string(&template_path)
                    .map_err(|e| TokenizerError::File { path: template_path.clone(), message: e.to_string() })?,
            )
        } else {
            None
        };
        Tokenizer::from_parts(&json, &config, generation.as_ref(), template_file)
            .map_err(|e| TokenizerError::File { path: dir.to_path_buf(), message: e.to_string() })
    }

    /// Builds a tokenizer from the contents of its files (as a GGUF checkpoint provides them).
    pub fn from_parts(
        tokenizer_json: &str,
        tokenizer_config: &Value,
        generation_config: Option<&Value>,
        template_override: Option<String>,
    ) -> Result<Tokenizer> {
        let mut inner = guarded(|| {
            tokenizer_json.parse::<tokenizers::Tokenizer>().map_err(|e| TokenizerError::Tokenizer(e.to_string()))
        })?;
        // transformers overrides the padding and truncation a tokenizer.json carries on every call
        // (`tokenizer(text)` neither pads nor truncates), so they are dropped here; length limits
        // are applied per call ([`Tokenizer::encode_truncated`], [`Tokenizer::encode_pair`]).
        inner.with_padding(None);
        inner.with_truncation(None).map_err(|e| TokenizerError::Tokenizer(e.to_string()))?;
        let bos_token = token_string(tokenizer_config.get("bos_token"));
        let eos_token = token_string(tokenizer_config.get("eos_token"));
        let template_source = template_override.or_else(|| match tokenizer_config.get("chat_template") {
            Some(Value::String(s)) => Some(s.clone()),
            // A list of named templates: transformers uses the one named "default".
            Some(Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(Value::as_str) == Some("default"))
                .and_then(|t| t.get("template").and_then(Value::as_str))
                .map(str::to_owned),
            _ => None,
        });
        let chat_template = template_source
            .map(|src| {
                ChatTemplate::new(src, bos_token.clone().unwrap_or_default(), eos_token.clone().unwrap_or_default())
            })
            .transpose()?;
        let mut eos_token_ids = id_list(generation_config.and_then(|g| g.get("eos_token_id")));
        if let Some(id) = eos_token.as_deref().and_then(|t| inner.token_to_id(t)) {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }
        let bos_token_id = id_list(generation_config.and_then(|g| g.get("bos_token_id")))
            .first()
            .copied()
            .or_else(|| bos_token.as_deref().and_then(|t| inner.token_to_id(t)));
        let tokenizer = Tokenizer { inner, chat_template, bos_token, eos_token, eos_token_ids, bos_token_id };
        // A file whose post-processor or decoder fails on any input is refused now, naming the
        // file, rather than on every request.
        tokenizer.decode(&tokenizer.encode("probe text", true)?, false)?;
        Ok(tokenizer)
    }

    /// This tokenizer with another chat template (vLLM's `--chat-template`).
    pub fn with_chat_template(mut self, source: String) -> Result<Tokenizer> {
        let (bos, eos) = (self.bos_token.clone().unwrap_or_default(), self.eos_token.clone().unwrap_or_default());
        self.chat_template = Some(ChatTemplate::new(source, bos, eos)?);
        Ok(self)
    }

    /// Token ids of `text`; `add_special_tokens` applies the tokenizer's post-processor (BOS and
    /// the like), as `tokenizer(text)` does in transformers.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        guarded(|| {
            self.inner
                .encode(text, add_special_tokens)
                .map(|e| e.get_ids().to_vec())
                .map_err(|e| TokenizerError::Tokenizer(e.to_string()))
        })
    }

    /// Ids of `text` with special tokens, cut to at most `max_length` tokens as transformers'
    /// `tokenizer(text, truncation=True, max_length=n)` does: the text is cut on the right and
    /// the special tokens are kept. `None` does not truncate.
    pub fn encode_truncated(&self, text: &str, max_length: Option<usize>) -> Result<Vec<u32>> {
        let err = |e: tokenizers::Error| TokenizerError::Tokenizer(e.to_string());
        guarded(|| {
            let encoding = self.inner.encode(text, false).map_err(err)?;
            let encoding = match max_length {
                Some(max) => self.truncate(encoding, None, max).0,
                None => encoding,
            };
            Ok(self.inner.post_process(encoding, None, true).map_err(err)?.get_ids().to_vec())
        })
    }

    /// A text pair as a cross-encoder reads it, `tokenizer(a, b, truncation=True, max_length=n)`:
    /// the post-processor's pair template (`[CLS] a [SEP] b [SEP]` for BERT) and its token type
    /// ids (segment 0, then 1). The longer text is cut first when the pair exceeds `max_length`.
    /// Returns `(ids, type_ids)`.
    pub fn encode_pair(&self, a: &str, b: &str, max_length: Option<usize>) -> Result<(Vec<u32>, Vec<u32>)> {
        let err = |e: tokenizers::Error| TokenizerError::Tokenizer(e.to_string());
        guarded(|| {
            let first = self.inner.encode(a, false).map_err(err)?;
            let second = self.inner.encode(b, false).map_err(err)?;
            let (first, second) = match max_length {
                Some(max) => self.truncate(first, Some(second), max),
                None => (first, Some(second)),
            };
            let encoding = self.inner.post_process(first, second, true).map_err(err)?;
            Ok((encoding.get_ids().to_vec(), encoding.get_type_ids().to_vec()))
        })
    }

    /// Longest-first truncation leaving room for the special tokens the post-processor adds.
    ///
    /// tokenizers' own `truncate_encodings` keeps what it cuts as overflowing encodings of
    /// `max_length` tokens each, and its post-processor pairs every overflow of one text with
    /// every overflow of the other: a request with two long texts and a small
    /// `truncate_prompt_tokens` asked for gigabytes. The lengths here are its longest-first rule;
    /// the cut keeps the prefixes only.
    fn truncate(
        &self,
        first: tokenizers::Encoding,
        second: Option<tokenizers::Encoding>,
        max_length: usize,
    ) -> (tokenizers::Encoding, Option<tokenizers::Encoding>) {
        use tokenizers::PostProcessor;
        let added = self.inner.get_post_processor().map(|p| p.added_tokens(second.is_some())).unwrap_or(0);
        let (n1, n2) =
            longest_first(first.len(), second.as_ref().map_or(0, |s| s.len()), max_length.saturating_sub(added));
        (prefix(first, n1), second.map(|s| prefix(s, n2)))
    }

    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        guarded(|| self.inner.decode(ids, skip_special_tokens).map_err(|e| TokenizerError::Tokenizer(e.to_string())))
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.chat_template.as_ref()
    }

    /// Renders a conversation with the model's chat template (an error when it has none).
    pub fn apply_chat_template(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.chat_template
            .as_ref()
            .ok_or_else(|| TokenizerError::Template("this model has no chat template".into()))?
            .render(messages, add_generation_prompt)
    }

    /// Ids of a conversation as transformers' `apply_chat_template(..., tokenize=True)` gives them:
    /// the rendered text already holds its special tokens, so none are added on encode.
    pub fn encode_chat(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
        self.encode(&self.apply_chat_template(messages, add_generation_prompt)?, false)
    }

    /// Ids that end generation: `generation_config.json`'s `eos_token_id` plus the tokenizer's EOS.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos_token_id
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// tokenizers 0.23 panics instead of failing on some malformed `tokenizer.json` files (a BPE
/// merge shorter than the continuing-subword prefix, a post-processor template naming a special
/// token it does not define); a checkpoint from a stranger gets an error instead.
fn guarded<T>(work: impl FnOnce() -> Result<T>) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).unwrap_or_else(|panic| {
        Err(TokenizerError::Tokenizer(format!("the tokenizer failed: {}", chat::panic_text(&panic))))
    })
}

/// How many tokens of each text `truncate_encodings` keeps under `TruncationStrategy::LongestFirst`
/// (tokenizers 0.23, `utils/truncation.rs`); a missing second text has length 0.
fn longest_first(n1: usize, n2: usize, max_length: usize) -> (usize, usize) {
    if n1 + n2 <= max_length {
        return (n1, n2);
    }
    if n2 == 0 {
        return (max_length, 0);
    }
    let (mut short, swapped) = if n1 > n2 { (n2, true) } else { (n1, false) };
    let mut long = if short > max_length { short } else { short.max(max_length - short) };
    if short + long > max_length {
        short = max_length / 2;
        long = short + max_length % 2;
    }
    if swapped {
        (long, short)
    } else {
        (short, long)
    }
}

/// The first `n` tokens of `encoding` (ids, token strings, offsets), nothing kept of the rest.
fn prefix(encoding: tokenizers::Encoding, n: usize) -> tokenizers::Encoding {
    if encoding.len() <= n {
        return encoding;
    }
    let tokens = (0..n)
        .map(|i| {
            tokenizers::Token::new(encoding.get_ids()[i], encoding.get_tokens()[i].clone(), encoding.get_offsets()[i])
        })
        .collect();
    tokenizers::Encoding::from_tokens(tokens, 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoding(n: usize) -> tokenizers::Encoding {
        let tokens = (0..n).map(|i| tokenizers::Token::new(i as u32, format!("t{i}"), (i, i + 1))).collect();
        tokenizers::Encoding::from_tokens(tokens, 0)
    }

    /// The cut lengths equal tokenizers' own longest-first truncation, pairs and single texts.
    #[test]
    fn longest_first_keeps_what_tokenizers_keeps() {
        let params = |max_length| tokenizers::TruncationParams { max_length, ..Default::default() };
        for max in 0..12 {
            for n1 in 0..14 {
                let (single, _) =
                    tokenizers::utils::truncation::truncate_encodings(encoding(n1), None, &params(max)).unwrap();
                assert_eq!(longest_first(n1, 0, max).0, single.len(), "single {n1} max {max}");
                for n2 in 0..14 {
                    let (a, b) = tokenizers::utils::truncation::truncate_encodings(
                        encoding(n1),
                        Some(encoding(n2)),
                        &params(max),
                    )
                    .unwrap();
                    assert_eq!(longest_first(n1, n2, max), (a.len(), b.unwrap().len()), "{n1} {n2} max {max}");
                }
            }
        }
    }

    /// Two long texts cut to a handful of tokens: tokenizers' own truncation paired every
    /// overflow of one with every overflow of the other (millions of encodings here).
    #[test]
    fn a_long_pair_truncates_without_overflow_pairs() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/pooling/bert-rerank");
        let tok = Tokenizer::from_dir(&dir).unwrap();
        let (a, b) = ("alpha ".repeat(1000), "beta ".repeat(3000));
        let (ids, types) = tok.encode_pair(&a, &b, Some(6)).unwrap();
        let (a_ids, b_ids) = (tok.encode(&a, false).unwrap(), tok.encode(&b, false).unwrap());
        assert!(a_ids.len() < b_ids.len());
        let (cls, sep) = (ids[0], ids[2]);
        // 6 - 3 special tokens: one of the shorter text, two of the longer (the odd one).
        assert_eq!(ids, [cls, a_ids[0], sep, b_ids[0], b_ids[1], sep]);
        assert_eq!(tok.encode_pair("", "", None).unwrap().0, [cls, sep, sep]);
        assert_eq!(types, [0, 0, 0, 1, 1, 1]);
    }

    /// Found by `tests/hostile_tokenizer_files.rs`: tokenizers panics at load on a merge
    /// shorter than the continuing-subword prefix, and on every encode when the post-processor's
    /// template names a special token it does not define. Both are load errors.
    #[test]
    fn tokenizer_json_that_panics_tokenizers_is_refused_at_load() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama");
        let json: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("tokenizer.json")).unwrap()).unwrap();
        let config = serde_json::Value::Null;
        let mut bad_template = json.clone();
        bad_template["post_processor"] = serde_json::json!({
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {}
        });
        let err = Tokenizer::from_parts(&bad_template.to_string(), &config, None, None).err().unwrap().to_string();
        assert!(err.contains("the tokenizer failed"), "{err}");
        let mut bad_merge = json.clone();
        bad_merge["model"]["continuing_subword_prefix"] = "##".into();
        bad_merge["model"]["merges"] = serde_json::json!([["a", "b"]]);
        bad_merge["model"]["vocab"]["a"] = 900.into();
        bad_merge["model"]["vocab"]["b"] = 901.into();
        let outcome = Tokenizer::from_parts(&bad_merge.to_string(), &config, None, None);
        assert!(outcome.is_err());
        assert!(Tokenizer::from_parts(&json.to_string(), &config, None, None).is_ok());
    }

    #[test]
    fn a_prefix_keeps_no_overflow() {
        let cut = prefix(encoding(100_000), 3);
        assert_eq!(cut.get_ids(), [0, 1, 2]);
        assert_eq!(cut.get_tokens(), ["t0", "t1", "t2"]);
        assert!(cut.get_overflowing().is_empty());
    }
}
