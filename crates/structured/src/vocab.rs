//! The vocabulary as llguidance sees it: the bytes each token id stands for, in a token trie.
//!
//! This follows `toktrie_hf_tokenizers` (what vLLM's guidance backend builds through
//! `llguidance.hf.from_tokenizer`), written here against the `tokenizers` version ferrite uses:
//! that crate pins an older one. Byte-level BPE maps each byte to a printable character (GPT-2's
//! table); SentencePiece-style vocabularies spell bytes as `<0xNN>` and spaces as `▁`. Special
//! tokens (and added tokens shaped `<...>`) get the trie's special marker, so text can never spell
//! them.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ferrite_tokenizer::Tokenizer;
use tokenizers::{normalizers, pre_tokenizers, DecoderWrapper, NormalizerWrapper, PreTokenizerWrapper};
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::StructuredError;

struct ByteTokenizerEnv {
    /// The tokenizer with its space-prepending steps removed: llguidance tokenizes fragments
    /// of text in the middle of an output, where no leading space belongs.
    tokenizer: tokenizers::Tokenizer,
    trie: TokTrie,
}

impl TokenizerEnv for ByteTokenizerEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| match self.tokenizer.encode(text, false) {
            Ok(encoding) => encoding.get_ids().to_vec(),
            Err(e) => {
                tracing::warn!(error = %e, "structured outputs: the tokenizer failed on a grammar fragment");
                Vec::new()
            }
        })
    }
}

/// GPT-2's byte-to-character table, inverted: the printable bytes stand for themselves, the
/// others for the characters from U+0100 on, in byte order.
fn byte_level_chars() -> HashMap<char, u8> {
    let self_mapped = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if self_mapped(b) {
                (char::from(b), b)
            } else {
                let c = char::from_u32(next).expect("U+0100..U+0143 are characters");
                next += 1;
                (c, b)
            }
        })
        .collect()
}

fn without_prepend(n: NormalizerWrapper) -> Option<NormalizerWrapper> {
    match n {
        NormalizerWrapper::Prepend(_) => None,
        NormalizerWrapper::Sequence(seq) => {
            let kept: Vec<_> = seq.as_ref().iter().filter_map(|n| without_prepend(n.clone())).collect();
            (!kept.is_empty()).then(|| NormalizerWrapper::Sequence(normalizers::Sequence::new(kept)))
        }
        n => Some(n),
    }
}

fn metaspace_never_prepends(p: PreTokenizerWrapper) -> PreTokenizerWrapper {
    match p {
        PreTokenizerWrapper::Metaspace(mut m) => {
            m.prepend_scheme = pre_tokenizers::metaspace::PrependScheme::Never;
            PreTokenizerWrapper::Metaspace(m)
        }
        PreTokenizerWrapper::Sequence(seq) => PreTokenizerWrapper::Sequence(pre_tokenizers::sequence::Sequence::new(
            seq.as_ref().iter().map(|p| metaspace_never_prepends(p.clone())).collect(),
        )),
        p => p,
    }
}

#[derive(Default)]
struct DecoderKind {
    byte_level: bool,
    byte_fallback: bool,
    space: Option<char>,
}

impl DecoderKind {
    fn scan(&mut self, d: &DecoderWrapper) {
        match d {
            DecoderWrapper::ByteLevel(_) => self.byte_level = true,
            DecoderWrapper::ByteFallback(_) => self.byte_fallback = true,
            DecoderWrapper::Replace(r) if r.content == " " => {
                // The pattern has no accessor; its serialized form names it.
                let pattern =
                    serde_json::to_value(r).ok().and_then(|v| v["pattern"]["String"].as_str().map(str::to_owned));
                let mut chars = pattern.as_deref().unwrap_or_default().chars();
                if let (Some(c), None) = (chars.next(), chars.next()) {
                    self.space = Some(c);
                }
            }
            DecoderWrapper::Sequence(seq) => seq.get_decoders().iter().for_each(|d| self.scan(d)),
            _ => {}
        }
    }
}

/// The token environment of `tokenizer` for logits of `vocab_size` columns (ids past the
/// tokenizer's own vocabulary become placeholders that no text spells), ending on `eos` ids.
pub(crate) fn token_env(tokenizer: &Tokenizer, vocab_size: usize, eos: &[u32]) -> Result<TokEnv, StructuredError> {
    let unsupported = |why: String| StructuredError::Tokenizer(why);
    let mut hf = tokenizer.inner().clone();
    if let Some(n) = hf.get_normalizer().cloned() {
        hf.with_normalizer(without_prepend(n)).map_err(|e| unsupported(e.to_string()))?;
    }
    if let Some(p) = hf.get_pre_tokenizer().cloned() {
        hf.with_pre_tokenizer(Some(metaspace_never_prepends(p)));
    }
    let mut kind = DecoderKind::default();
    if let Some(d) = hf.get_decoder() {
        kind.scan(d);
    }
    if !kind.byte_level && !kind.byte_fallback {
        return Err(unsupported(
            "its decoder is neither byte-level nor byte-fallback, so token bytes are unknown".into(),
        ));
    }
    let Some((&first_eos, _)) = eos.split_first() else {
        return Err(unsupported("it has no end-of-sequence token".into()));
    };

    let own = hf.get_vocab_size(true);
    let total = own.max(vocab_size);
    let mut words: Vec<Vec<u8>> = vec![Vec::new(); total];
    let mut specials = HashSet::new();
    for (id, token) in hf.get_added_tokens_decoder() {
        let Some(word) = words.get_mut(id as usize) else { continue };
        if token.special || (token.content.starts_with('<') && token.content.ends_with('>')) {
            specials.insert(id);
            word.push(TokTrie::SPECIAL_TOKEN_MARKER);
            word.extend_from_slice(token.content.as_bytes());
        } else {
            *word = token.content.into_bytes();
        }
    }
    let chars = byte_level_chars();
    let space = kind.space.unwrap_or(' ');
    for id in 0..own as u32 {
        if specials.contains(&id) {
            continue;
        }
        let Some(name) = hf.id_to_token(id) else { continue };
        let bytes = if kind.byte_fallback {
            match name.strip_prefix("<0x").and_then(|h| h.strip_suffix('>')) {
                Some(hex) if hex.len() == 2 => u8::from_str_radix(hex, 16).map(|b| vec![b]).ok(),
                _ => Some(name.replace(space, " ").into_bytes()),
            }
        } else {
            name.chars().map(|c| chars.get(&c).copied()).collect::<Option<Vec<u8>>>()
        };
        match bytes {
            // Added tokens were spelled above, from their content.
            Some(bytes) if words[id as usize].is_empty() => words[id as usize] = bytes,
            Some(_) => {}
            None => tracing::debug!(id, token = %name, "structured outputs: token has no byte spelling"),
        }
    }
    for (id, word) in words.iter_mut().enumerate().skip(own) {
        word.push(TokTrie::SPECIAL_TOKEN_MARKER);
        word.extend_from_slice(format!("<[{id}]>").as_bytes());
    }
    let vocab = u32::try_from(total).map_err(|_| unsupported(format!("a vocabulary of {total} tokens")))?;
    if let Some(bad) = eos.iter().find(|&&id| id >= vocab) {
        return Err(unsupported(format!("end-of-sequence id {bad} is past the vocabulary")));
    }
    let mut info = TokRxInfo::new(vocab, first_eos);
    info.tok_bos = tokenizer.bos_token_id();
    let mut trie = TokTrie::from(&info, &words);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(eos);
    }
    Ok(Arc::new(ByteTokenizerEnv { tokenizer: hf, trie }))
}
