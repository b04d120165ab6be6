//! A Hugging Face `tokenizer.json` rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! This reproduces, field for field, the backend tokenizer transformers 5.24 builds for
//! `AutoTokenizer.from_pretrained(dir, gguf_file=...)`
//! (`integrations/gguf/gguf_tokenizer_mapping.py` plus the special-token and post-processor steps
//! of `TokenizersBackend.__init__`), so encoding through the `tokenizers` crate gives the ids
//! transformers gives. It deliberately does not try to match llama.cpp's own tokenizer where the
//! two differ (e.g. SmolLM2's `smollm` pre-tokenizer, which transformers does not special-case).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Value};

use super::{GgufError, GgufErrorKind, GgufFile, GgufValue};

/// llama.cpp's `LLAMA_TOKEN_TYPE_CONTROL`: a special token such as `<|im_end|>`.
const TOKEN_TYPE_CONTROL: i64 = 3;
/// llama.cpp's `LLAMA_TOKEN_TYPE_USER_DEFINED`: an added, non-special token such as `<think>`.
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
/// SentencePiece's word-boundary marker.
const SPIECE_UNDERLINE: char = '\u{2581}';

// The pre-tokenizer splits transformers applies for some `tokenizer.ggml.pre` values
// (`GGUF_PRE_TOKENIZER_SPLITS`). Every other value keeps the builder's own pre-tokenizer.
const LLAMA3_SPLIT: &str = concat!(
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const TEKKEN_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*",
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const GPT4O_SPLIT: &str = concat!(
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

fn pre_tokenizer_split(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        _ => return None,
    })
}

/// Which of transformers' tokenizer builders a file gets (`select_tokenizer_builder`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Builder {
    /// `tokenizer.ggml.model = "gpt2"`: byte-level BPE (`GPT2Tokenizer`).
    ByteLevel,
    /// `"llama"` on a Gemma architecture: SentencePiece BPE via `GemmaTokenizer`.
    Gemma,
    /// `"llama"` elsewhere: SentencePiece BPE via `LlamaTokenizer`.
    Llama,
}

// The tokenizer.json pieces, as `tokenizers` serializes them (field order included, so the output
// is byte-identical to `Tokenizer.to_str()` in Python).

#[derive(serde::Serialize)]
enum Pattern {
    String(String),
    Regex(String),
}

#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum Normalizer {
    Replace { pattern: Pattern, content: String },
}

#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum PreTokenizer {
    ByteLevel { add_prefix_space: bool, trim_offsets: bool, use_regex: bool },
    Split { pattern: Pattern, behavior: &'static str, invert: bool },
    Metaspace { replacement: char, prepend_scheme: &'static str, split: bool },
    Sequence { pretokenizers: Vec<PreTokenizer> },
}

#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum Decoder {
    ByteLevel { add_prefix_space: bool, trim_offsets: bool, use_regex: bool },
    Replace { pattern: Pattern, content: String },
    ByteFallback,
    Fuse,
    Strip { content: char, start: usize, stop: usize },
    Sequence { decoders: Vec<Decoder> },
}

#[derive(serde::Serialize)]
enum Piece {
    Sequence { id: &'static str, type_id: u32 },
    SpecialToken { id: String, type_id: u32 },
}

#[derive(serde::Serialize)]
struct SpecialTokenEntry {
    id: String,
    ids: Vec<u32>,
    tokens: Vec<String>,
}

#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum PostProcessor {
    TemplateProcessing { single: Vec<Piece>, pair: Vec<Piece>, special_tokens: BTreeMap<String, SpecialTokenEntry> },
}

#[derive(serde::Serialize, Clone)]
struct AddedToken {
    id: u32,
    content: String,
    single_word: bool,
    lstrip: bool,
    rstrip: bool,
    normalized: bool,
    special: bool,
}

/// The BPE vocabulary, serialized as `tokenizers` does: a map in id order.
struct OrderedVocab(Vec<(String, u32)>);

impl Serialize for OrderedVocab {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (token, id) in &self.0 {
            map.serialize_entry(token, id)?;
        }
        map.end()
    }
}

#[derive(serde::Serialize)]
#[serde(tag = "type")]
enum Model {
    #[serde(rename = "BPE")]
    Bpe {
        dropout: Option<f32>,
        unk_token: Option<String>,
        continuing_subword_prefix: Option<String>,
        end_of_word_suffix: Option<String>,
        fuse_unk: bool,
        byte_fallback: bool,
        ignore_merges: bool,
        vocab: OrderedVocab,
        merges: Vec<(String, String)>,
    },
}

#[derive(serde::Serialize)]
struct TokenizerJson {
    version: &'static str,
    truncation: Option<()>,
    padding: Option<()>,
    added_tokens: Vec<AddedToken>,
    normalizer: Option<Normalizer>,
    pre_tokenizer: Option<PreTokenizer>,
    post_processor: PostProcessor,
    decoder: Decoder,
    model: Model,
}

/// A Python dict built from `(key, value)` pairs: keys keep the position of their first
/// occurrence, values are the last one's. transformers builds its vocabularies that way, so a
/// vocabulary with repeated tokens behaves as it does there.
struct PyDict<'a, V> {
    order: Vec<&'a str>,
    map: HashMap<&'a str, V>,
}

impl<'a, V> PyDict<'a, V> {
    fn new(items: impl IntoIterator<Item = (&'a str, V)>) -> Self {
        let (mut order, mut map) = (Vec::new(), HashMap::new());
        for (k, v) in items {
            if map.insert(k, v).is_none() {
                order.push(k);
            }
        }
        PyDict { order, map }
    }
}

/// GPT-2's printable spelling of each byte (`bytes_to_unicode`).
fn byte_alphabet() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 33..=126 | 161..=172 | 174..=255);
        let code = if printable {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        // Every code here is below 0x200, so always a valid scalar value.
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

/// Python's `str.isspace` for one character: Rust's White_Space plus the four ASCII separators
/// (U+001C..U+001F) that Python also counts.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// The tokenizer metadata of a file, borrowed from it.
struct Vocab<'a> {
    tokens: Vec<&'a str>,
    token_types: Vec<i64>,
    scores: Option<Vec<f64>>,
    merges: Option<Vec<&'a str>>,
}

impl GgufFile {
    fn string_array(&self, key: &str) -> Result<Option<Vec<&str>>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let items = value.as_array().ok_or_else(|| self.metadata_error(key, "expected an array of strings"))?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| v.as_str().ok_or_else(|| self.metadata_error(key, format!("element {i} is not a string"))))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn number_array<T>(&self, key: &str, get: impl Fn(&GgufValue) -> Option<T>) -> Result<Option<Vec<T>>, GgufError> {
        let Some(value) = self.get(key) else {
            return Ok(None);
        };
        let items = value.as_array().ok_or_else(|| self.metadata_error(key, "expected an array of numbers"))?;
        items
            .iter()
            .enumerate()
            .map(|(i, v)| get(v).ok_or_else(|| self.metadata_error(key, format!("element {i} is not a number"))))
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn vocab(&self) -> Result<Vocab<'_>, GgufError> {
        const TOKENS: &str = "tokenizer.ggml.tokens";
        let tokens = self.string_array(TOKENS)?.ok_or_else(|| self.metadata_error(TOKENS, "missing"))?;
        let token_types = self.number_array("tokenizer.ggml.token_type", GgufValue::as_i64)?.unwrap_or_default();
        let scores = self.number_array("tokenizer.ggml.scores", GgufValue::as_f64)?;
        let merges = self.string_array("tokenizer.ggml.merges")?;
        Ok(Vocab { tokens, token_types, scores, merges })
    }

    /// The file's token for a `tokenizer.ggml.*_token_id` key, as transformers resolves it.
    fn special_token<'a>(&self, vocab: &Vocab<'a>, key: &str) -> Result<Option<&'a str>, GgufError> {
        let Some(id) = self.get_u64(key)? else {
            return Ok(None);
        };
        let token = usize::try_from(id).ok().and_then(|i| vocab.tokens.get(i)).copied();
        token.map(Some).ok_or_else(|| {
            self.metadata_error(key, format!("token id {id} is outside the {}-token vocabulary", vocab.tokens.len()))
        })
    }

    fn builder(&self) -> Result<Builder, GgufError> {
        const MODEL: &str = "tokenizer.ggml.model";
        let model = self.get_str(MODEL)?.ok_or_else(|| self.metadata_error(MODEL, "missing"))?;
        match model {
            "gpt2" => Ok(Builder::ByteLevel),
            "llama" if matches!(self.architecture()?, "gemma" | "gemma2" | "gemma3") => Ok(Builder::Gemma),
            "llama" => Ok(Builder::Llama),
            other => Err(self.error(GgufErrorKind::Unsupported(format!(
                "tokenizer model `{other}` is not supported (ferrite builds `gpt2` and `llama` tokenizers)"
            )))),
        }
    }

    /// `tokenizer.chat_template`, the Jinja template the file ships, if any.
    pub fn chat_template(&self) -> Option<String> {
        self.get("tokenizer.chat_template").and_then(GgufValue::as_str).map(str::to_string)
    }

    /// The BOS and EOS token ids the file declares.
    pub fn bos_eos(&self) -> (Option<u32>, Option<u32>) {
        let id = |key: &str| self.get(key).and_then(GgufValue::as_u64).and_then(|v| u32::try_from(v).ok());
        (id("tokenizer.ggml.bos_token_id"), id("tokenizer.ggml.eos_token_id"))
    }

    /// Whether transformers adds BOS / EOS when encoding (`get_gguf_tokenizer`): the file's flags,
    /// except that a SentencePiece vocabulary without the flag gets BOS, as llama.cpp does.
    fn add_bos_eos(&self, builder: Builder) -> Result<(bool, bool), GgufError> {
        let bos = self.get_bool("tokenizer.ggml.add_bos_token")?;
        let eos = self.get_bool("tokenizer.ggml.add_eos_token")?;
        let bos_default = builder != Builder::ByteLevel;
        Ok((bos.unwrap_or(bos_default), eos.unwrap_or(false)))
    }

    /// The named special tokens transformers sets on the tokenizer, in its attribute order.
    fn named_special_tokens<'a>(
        &self,
        vocab: &Vocab<'a>,
        builder: Builder,
    ) -> Result<Vec<(&'static str, &'a str)>, GgufError> {
        let mut named = Vec::new();
        for (name, key) in [
            ("bos_token", "tokenizer.ggml.bos_token_id"),
            ("eos_token", "tokenizer.ggml.eos_token_id"),
            ("unk_token", "tokenizer.ggml.unknown_token_id"),
            ("pad_token", "tokenizer.ggml.padding_token_id"),
        ] {
            if let Some(token) = self.special_token(vocab, key)? {
                named.push((name, token));
            }
        }
        // The only one the file cannot override: `GemmaTokenizer`'s own default.
        if builder == Builder::Gemma {
            named.push(("mask_token", "<mask>"));
        }
        Ok(named)
    }

    /// A `tokenizer.json` equivalent to the one transformers builds from this file.
    pub fn hf_tokenizer_json(&self) -> Result<String, GgufError> {
        let builder = self.builder()?;
        let vocab = self.vocab()?;
        if !vocab.token_types.is_empty() && vocab.token_types.len() != vocab.tokens.len() {
            return Err(self.metadata_error(
                "tokenizer.ggml.token_type",
                format!("has {} entries for {} tokens", vocab.token_types.len(), vocab.tokens.len()),
            ));
        }

        // The vocabulary as the model spells it.
        let spelled: Vec<String> = match builder {
            Builder::ByteLevel => {
                let alphabet = byte_alphabet();
                let in_alphabet: HashSet<char> = alphabet.iter().copied().collect();
                vocab
                    .tokens
                    .iter()
                    .map(|t| {
                        if t.chars().all(|c| in_alphabet.contains(&c)) {
                            t.to_string()
                        } else {
                            t.bytes().map(|b| alphabet[b as usize]).collect()
                        }
                    })
                    .collect()
            }
            // Gemma files store runs of spaces as real spaces, where the tokenizer looks them up
            // as U+2581 runs (transformers' `gemma_tokenizer`, fix 1).
            Builder::Gemma => vocab
                .tokens
                .iter()
                .map(|t| {
                    if t.contains(' ') && t.chars().all(py_isspace) {
                        std::iter::repeat_n(SPIECE_UNDERLINE, t.chars().count()).collect()
                    } else {
                        t.to_string()
                    }
                })
                .collect(),
            Builder::Llama => vocab.tokens.iter().map(|t| t.to_string()).collect(),
        };
        let model_vocab = PyDict::new(spelled.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)));

        let merges = match &vocab.merges {
            Some(merges) => merges
                .iter()
                .map(|m| {
                    let (a, b) = m.split_once(' ').ok_or_else(|| {
                        self.metadata_error("tokenizer.ggml.merges", format!("merge {m:?} is not two tokens"))
                    })?;
                    if b.contains(' ') {
                        return Err(
                            self.metadata_error("tokenizer.ggml.merges", format!("merge {m:?} is not two tokens"))
                        );
                    }
                    Ok((a.to_string(), b.to_string()))
                })
                .collect::<Result<Vec<_>, _>>()?,
            None => {
                let scores: Vec<(&str, f64)> = match builder {
                    // Gemma's scores do not follow its merge order; the file order does
                    // (transformers' `gemma_tokenizer`, fix 2).
                    Builder::Gemma => spelled.iter().enumerate().map(|(i, t)| (t.as_str(), -(i as f64))).collect(),
                    _ => {
                        const SCORES: &str = "tokenizer.ggml.scores";
                        let scores = vocab.scores.as_ref().ok_or_else(|| {
                            self.metadata_error(SCORES, "missing, and without merges or scores BPE cannot be rebuilt")
                        })?;
                        if scores.len() != vocab.tokens.len() {
                            return Err(self.metadata_error(
                                SCORES,
                                format!("has {} entries for {} tokens", scores.len(), vocab.tokens.len()),
                            ));
                        }
                        spelled.iter().map(String::as_str).zip(scores.iter().copied()).collect()
                    }
                };
                generate_merges(&model_vocab, &PyDict::new(scores))
            }
        };

        let mut added = AddedTokens::new(&model_vocab);
        let types = vocab.token_types.iter().copied();
        // Control tokens become special added tokens. In a byte-level vocabulary one spelled
        // outside the byte alphabet is a llama.cpp mislabel, and transformers skips it.
        let alphabet: HashSet<char> = byte_alphabet().into_iter().collect();
        for (token, ty) in vocab.tokens.iter().zip(types.clone()) {
            if ty == TOKEN_TYPE_CONTROL
                && (builder != Builder::ByteLevel || token.chars().all(|c| alphabet.contains(&c)))
            {
                added.add(token, true);
            }
        }
        // User-defined tokens are matched whole but are not special; only those the vocabulary
        // (or the added tokens) already spell this way.
        for (token, ty) in vocab.tokens.iter().zip(types) {
            if ty == TOKEN_TYPE_USER_DEFINED && added.id_of(token).is_some() {
                added.add(token, false);
            }
        }
        let named = self.named_special_tokens(&vocab, builder)?;
        for (_, token) in &named {
            added.add(token, true);
        }

        // Without a token to add, transformers turns the flag off.
        let (add_bos, add_eos) = self.add_bos_eos(builder)?;
        let token_of = |name: &str| named.iter().find(|(n, _)| *n == name).map(|(_, t)| t.to_string());
        let (bos, eos) = (token_of("bos_token"), token_of("eos_token"));
        let with_id = |token: Option<String>, key: &str| -> Result<Option<(u32, String)>, GgufError> {
            token
                .map(|t| match added.id_of(&t) {
                    Some(id) => Ok((id, t)),
                    None => Err(self.metadata_error(key, format!("token {t:?} cannot be added to the vocabulary"))),
                })
                .transpose()
        };
        let post_processor = template_processing(
            with_id(bos.filter(|_| add_bos), "tokenizer.ggml.bos_token_id")?,
            with_id(eos.filter(|_| add_eos), "tokenizer.ggml.eos_token_id")?,
        );

        let (normalizer, mut pre_tokenizer, decoder, unk_token) = match builder {
            Builder::ByteLevel => (
                None,
                Some(PreTokenizer::ByteLevel { add_prefix_space: false, trim_offsets: true, use_regex: true }),
                Decoder::ByteLevel { add_prefix_space: true, trim_offsets: true, use_regex: true },
                None,
            ),
            Builder::Gemma => (
                Some(Normalizer::Replace { pattern: Pattern::String(" ".into()), content: SPIECE_UNDERLINE.into() }),
                Some(PreTokenizer::Split {
                    pattern: Pattern::String(" ".into()),
                    behavior: "MergedWithPrevious",
                    invert: false,
                }),
                sentencepiece_decoder(false),
                Some("<unk>".to_string()),
            ),
            Builder::Llama => (
                None,
                Some(PreTokenizer::Metaspace { replacement: SPIECE_UNDERLINE, prepend_scheme: "first", split: false }),
                sentencepiece_decoder(true),
                None,
            ),
        };
        if let Some(split) = self.get_str("tokenizer.ggml.pre")?.and_then(pre_tokenizer_split) {
            pre_tokenizer = Some(PreTokenizer::Sequence {
                pretokenizers: vec![
                    PreTokenizer::Split { pattern: Pattern::Regex(split.into()), behavior: "Isolated", invert: false },
                    PreTokenizer::ByteLevel { add_prefix_space: false, trim_offsets: true, use_regex: false },
                ],
            });
        }

        let mut ordered: Vec<(String, u32)> = model_vocab.map.iter().map(|(t, &id)| (t.to_string(), id)).collect();
        ordered.sort_by_key(|&(_, id)| id);
        let sentencepiece = builder != Builder::ByteLevel;
        let json = TokenizerJson {
            version: "1.0",
            truncation: None,
            padding: None,
            added_tokens: added.into_sorted(),
            normalizer,
            pre_tokenizer,
            post_processor,
            decoder,
            model: Model::Bpe {
                dropout: None,
                unk_token,
                continuing_subword_prefix: (!sentencepiece).then(String::new),
                end_of_word_suffix: (!sentencepiece).then(String::new),
                fuse_unk: sentencepiece,
                byte_fallback: sentencepiece,
                ignore_merges: false,
                vocab: OrderedVocab(ordered),
                merges,
            },
        };
        serde_json::to_string(&json)
            .map_err(|e| self.error(GgufErrorKind::Malformed(format!("tokenizer.json serialization failed: {e}"))))
    }

    /// The `tokenizer_config.json` settings transformers derives from the file: special tokens,
    /// BOS/EOS insertion and the chat template.
    pub fn hf_tokenizer_config_json(&self) -> Result<Value, GgufError> {
        let builder = self.builder()?;
        let vocab = self.vocab()?;
        let (add_bos, add_eos) = self.add_bos_eos(builder)?;
        let mut config = serde_json::Map::new();
        let class = if builder == Builder::Gemma { "GemmaTokenizer" } else { "TokenizersBackend" };
        config.insert("tokenizer_class".into(), json!(class));
        for name in ["bos_token", "eos_token", "unk_token", "pad_token"] {
            config.insert(name.into(), Value::Null);
        }
        for (name, token) in self.named_special_tokens(&vocab, builder)? {
            config.insert(name.into(), json!(token));
        }
        config.insert("add_bos_token".into(), json!(add_bos));
        config.insert("add_eos_token".into(), json!(add_eos));
        if let Some(template) = self.chat_template() {
            config.insert("chat_template".into(), json!(template));
        }
        Ok(Value::Object(config))
    }
}

fn sentencepiece_decoder(strip_prefix_space: bool) -> Decoder {
    let mut decoders = vec![
        Decoder::Replace { pattern: Pattern::String(SPIECE_UNDERLINE.into()), content: " ".into() },
        Decoder::ByteFallback,
        Decoder::Fuse,
    ];
    if strip_prefix_space {
        decoders.push(Decoder::Strip { content: ' ', start: 1, stop: 0 });
    }
    Decoder::Sequence { decoders }
}

/// transformers' `update_post_processor`: `[bos] $A [eos]`, and the same around `$B`.
fn template_processing(bos: Option<(u32, String)>, eos: Option<(u32, String)>) -> PostProcessor {
    let sequence = |type_id: u32| {
        let mut pieces = Vec::new();
        if let Some((_, t)) = &bos {
            pieces.push(Piece::SpecialToken { id: t.clone(), type_id });
        }
        pieces.push(Piece::Sequence { id: if type_id == 0 { "A" } else { "B" }, type_id });
        if let Some((_, t)) = &eos {
            pieces.push(Piece::SpecialToken { id: t.clone(), type_id });
        }
        pieces
    };
    let single = sequence(0);
    let mut pair = sequence(0);
    pair.extend(sequence(1));
    let special_tokens = bos
        .iter()
        .chain(&eos)
        .map(|(id, t)| (t.clone(), SpecialTokenEntry { id: t.clone(), ids: vec![*id], tokens: vec![t.clone()] }))
        .collect();
    PostProcessor::TemplateProcessing { single, pair, special_tokens }
}

/// The added-token table, with the id rules of `tokenizers`' `AddedVocabulary::add_tokens`.
struct AddedTokens<'v> {
    model_vocab: &'v PyDict<'v, u32>,
    model_size: u32,
    by_content: HashMap<String, u32>,
    by_id: BTreeMap<u32, AddedToken>,
}

impl<'v> AddedTokens<'v> {
    fn new(model_vocab: &'v PyDict<'v, u32>) -> Self {
        AddedTokens {
            model_vocab,
            model_size: model_vocab.map.len() as u32,
            by_content: HashMap::new(),
            by_id: BTreeMap::new(),
        }
    }

    fn id_of(&self, content: &str) -> Option<u32> {
        self.by_content.get(content).or_else(|| self.model_vocab.map.get(content)).copied()
    }

    fn add(&mut self, content: &str, special: bool) {
        // Tokens compare by content, so a repeat is a no-op, as is an empty token.
        if content.is_empty() || self.by_content.contains_key(content) {
            return;
        }
        let id = self.id_of(content).unwrap_or_else(|| match self.by_id.keys().next_back() {
            Some(&max) if max >= self.model_size => max + 1,
            _ => self.model_size,
        });
        let token = AddedToken {
            id,
            content: content.to_string(),
            single_word: false,
            lstrip: false,
            rstrip: false,
            normalized: false,
            special,
        };
        if let Some(previous) = self.by_id.insert(id, token) {
            self.by_content.remove(&previous.content);
        }
        self.by_content.insert(content.to_string(), id);
    }

    fn into_sorted(self) -> Vec<AddedToken> {
        self.by_id.into_values().collect()
    }
}

/// transformers' `generate_merges` with scores: every split of every token into two tokens of the
/// vocabulary, best score first, ties by shorter left then right piece (lengths in characters),
/// then in vocabulary order. Python's `sorted(reverse=True)` is stable, and so is `sort_by`.
fn generate_merges(vocab: &PyDict<'_, u32>, scores: &PyDict<'_, f64>) -> Vec<(String, String)> {
    struct Merge<'a> {
        left: &'a str,
        right: &'a str,
        score: f64,
        left_len: usize,
        right_len: usize,
    }
    let mut merges = Vec::new();
    for &token in &scores.order {
        let score = scores.map[token];
        let mut local: Vec<Merge<'_>> = token
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| {
                let (left, right) = token.split_at(at);
                (vocab.map.contains_key(left) && vocab.map.contains_key(right)).then(|| Merge {
                    left,
                    right,
                    score,
                    left_len: left.chars().count(),
                    right_len: right.chars().count(),
                })
            })
            .collect();
        local.sort_by_key(|m| (vocab.map[m.left], vocab.map[m.right]));
        merges.extend(local);
    }
    merges.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then(b.left_len.cmp(&a.left_len)).then(b.right_len.cmp(&a.right_len))
    });
    merges.into_iter().map(|m| (m.left.to_string(), m.right.to_string())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_alphabet_matches_gpt2() {
        let a = byte_alphabet();
        assert_eq!(a[b'!' as usize], '!');
        assert_eq!(a[b' ' as usize], '\u{120}', "space is Ġ");
        assert_eq!(a[b'\n' as usize], '\u{10a}', "newline is Ċ");
        assert_eq!(a[0], '\u{100}');
        assert_eq!(a[173], '\u{143}');
        let distinct: std::collections::HashSet<char> = a.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn generated_merges_follow_python_order() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let vocab = PyDict::new(tokens.iter().enumerate().map(|(i, &t)| (t, i as u32)));
        // Equal scores: longer left pieces first, then vocabulary order.
        let scores = PyDict::new(tokens.iter().map(|&t| (t, 0.0)));
        let merges = generate_merges(&vocab, &scores);
        let pairs: Vec<(&str, &str)> = merges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(pairs, [("ab", "c"), ("a", "bc"), ("a", "b"), ("b", "c")]);
        // Higher scores first.
        let scores = PyDict::new([("abc", 1.0), ("ab", 2.0), ("bc", 3.0)]);
        let merges = generate_merges(&vocab, &scores);
        let pairs: Vec<(&str, &str)> = merges.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(pairs, [("b", "c"), ("a", "b"), ("ab", "c"), ("a", "bc")]);
    }

    #[test]
    fn added_token_ids_follow_tokenizers() {
        let vocab = PyDict::new([("a", 0u32), ("b", 1)]);
        let mut added = AddedTokens::new(&vocab);
        added.add("b", true);
        added.add("<new>", true);
        added.add("<newer>", false);
        added.add("<new>", false);
        let ids: Vec<(u32, &str, bool)> = added.by_id.values().map(|t| (t.id, t.content.as_str(), t.special)).collect();
        assert_eq!(ids, [(1, "b", true), (2, "<new>", true), (3, "<newer>", false)]);
    }

    #[test]
    fn python_whitespace() {
        assert!(py_isspace('\u{1f}') && py_isspace(' ') && py_isspace('\u{3000}'));
        assert!(!py_isspace('\u{200b}') && !py_isspace('a'));
    }
}
