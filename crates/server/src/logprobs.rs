//! Engine logprobs -> the two OpenAI shapes: the completions API's parallel lists
//! (`tokens`, `token_logprobs`, `top_logprobs`, `text_offset`) and the chat API's
//! `content: [{token, logprob, bytes, top_logprobs}]`.
//!
//! Token strings are each id decoded alone with special tokens kept, as vLLM does, so a byte
//! piece of a multi-byte character shows as U+FFFD.

use ferrite_tokenizer::Tokenizer;
use serde_json::{Map, Value};

use crate::protocol::{ChatTokenLogprob, ChatTopLogprob, CompletionLogprobs};

/// JSON has no -inf; vLLM clamps to this floor.
const LOGPROB_FLOOR: f32 = -9999.0;

/// One position: the token there, its logprob, and the `k` most likely tokens, best first.
#[derive(Debug, Clone, PartialEq)]
pub struct Position {
    pub token: u32,
    pub logprob: f32,
    /// 1-based rank of `token` in the vocabulary.
    pub rank: usize,
    pub top: Vec<(u32, f32)>,
}

/// vLLM's `prompt_logprobs`: per prompt position `null` (the first, which has no context) or
/// `{"<token id>": {"logprob", "rank", "decoded_token"}}` for the prompt's own token and the
/// `top_n` most likely ones (ranked by their place).
pub fn prompt_entries(
    tokenizer: &Tokenizer,
    positions: &[Option<Position>],
    top_n: usize,
) -> Vec<Option<Map<String, Value>>> {
    positions
        .iter()
        .map(|p| {
            let p = p.as_ref()?;
            let entry = |id: u32, logprob: f32, rank: usize| {
                serde_json::json!({"logprob": clamp(logprob), "rank": rank, "decoded_token": token_str(tokenizer, id)})
            };
            let mut out = Map::new();
            out.insert(p.token.to_string(), entry(p.token, p.logprob, p.rank));
            for (i, &(id, lp)) in p.top.iter().take(top_n).enumerate() {
                out.entry(id.to_string()).or_insert_with(|| entry(id, lp, i + 1));
            }
            Some(out)
        })
        .collect()
}

fn clamp(logprob: f32) -> f32 {
    if logprob.is_nan() {
        LOGPROB_FLOOR
    } else {
        logprob.max(LOGPROB_FLOOR)
    }
}

pub fn token_str(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// How logprob entries name tokens: decoded text, or `token_id:<id>` (vLLM's
/// `return_tokens_as_token_ids`, for tokens whose text does not round-trip).
#[derive(Clone, Copy)]
pub struct Names<'a> {
    pub tokenizer: &'a Tokenizer,
    pub as_ids: bool,
}

impl Names<'_> {
    fn of(&self, id: u32) -> String {
        if self.as_ids {
            format!("token_id:{id}")
        } else {
            token_str(self.tokenizer, id)
        }
    }
}

/// Appends tokens to completions-format logprobs. `positions[i]` is `None` where there is no
/// logprob (the first prompt token under `echo`). `offset` is the running character offset of
/// the choice's text, carried across stream chunks.
pub fn extend_completion(
    out: &mut CompletionLogprobs,
    names: Names<'_>,
    tokens: &[u32],
    positions: &[Option<Position>],
    offset: &mut usize,
) {
    for (i, &id) in tokens.iter().enumerate() {
        let text = names.of(id);
        out.text_offset.push(*offset);
        *offset += text.chars().count();
        match positions.get(i).and_then(Option::as_ref) {
            Some(p) => {
                out.token_logprobs.push(Some(clamp(p.logprob)));
                // vLLM's dict holds the sampled token as well as the top k.
                let mut top = Map::new();
                top.insert(text.clone(), Value::from(clamp(p.logprob)));
                for &(tid, lp) in &p.top {
                    top.insert(names.of(tid), Value::from(clamp(lp)));
                }
                out.top_logprobs.push(Some(top));
            }
            None => {
                out.token_logprobs.push(None);
                out.top_logprobs.push(None);
            }
        }
        out.tokens.push(text);
    }
}

pub fn chat_entries(names: Names<'_>, positions: &[Position], top_n: usize) -> Vec<ChatTokenLogprob> {
    positions
        .iter()
        .map(|p| {
            let token = names.of(p.token);
            ChatTokenLogprob {
                bytes: token.as_bytes().to_vec(),
                token,
                logprob: clamp(p.logprob),
                top_logprobs: p
                    .top
                    .iter()
                    .take(top_n)
                    .map(|&(id, lp)| {
                        let token = names.of(id);
                        ChatTopLogprob { bytes: token.as_bytes().to_vec(), token, logprob: clamp(lp) }
                    })
                    .collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama");
        Tokenizer::from_dir(&dir).unwrap()
    }

    #[test]
    fn completion_lists_stay_parallel_and_offsets_accumulate() {
        let tok = tokenizer();
        let ids = tok.encode("hello world", false).unwrap();
        assert!(ids.len() >= 2);
        let positions: Vec<Option<Position>> = ids
            .iter()
            .enumerate()
            .map(|(i, &id)| {
                (i > 0).then(|| Position { token: id, logprob: f32::NEG_INFINITY, rank: 1, top: vec![(1, -0.5)] })
            })
            .collect();
        let mut out = CompletionLogprobs::default();
        let mut offset = 0;
        extend_completion(&mut out, Names { tokenizer: &tok, as_ids: false }, &ids, &positions, &mut offset);
        assert_eq!(out.tokens.concat(), "hello world");
        assert_eq!(offset, "hello world".len());
        assert_eq!(out.text_offset[0], 0);
        assert_eq!(out.text_offset[1], out.tokens[0].len());
        assert_eq!(out.token_logprobs[0], None);
        assert_eq!(out.token_logprobs[1], Some(LOGPROB_FLOOR));
        assert!(out.top_logprobs[0].is_none());
        let top = out.top_logprobs[1].as_ref().unwrap();
        assert_eq!(top.len(), 2, "sampled token plus the top 1: {top:?}");
        assert_eq!(top["<|im_start|>"], Value::from(-0.5f32));
    }

    #[test]
    fn chat_entries_carry_utf8_bytes_and_at_most_top_n() {
        let tok = tokenizer();
        let id = tok.encode("hello", false).unwrap()[0];
        let p = Position { token: id, logprob: -0.25, rank: 1, top: vec![(id, -0.25), (1, -2.0), (2, -3.0)] };
        let e = chat_entries(Names { tokenizer: &tok, as_ids: false }, &[p], 2);
        assert_eq!(e[0].bytes, e[0].token.as_bytes());
        assert_eq!(e[0].top_logprobs.len(), 2);
        assert_eq!(e[0].top_logprobs[1].token, "<|im_start|>");
    }
}
