//! Structured outputs: a request's constraint (JSON schema, regex, choice, grammar, structural
//! tag) compiled by llguidance, the engine behind vLLM's `guidance` backend, into a matcher that
//! gives the tokens allowed next as a bitmask.
//!
//! The engine compiles a request's constraint once when it admits the request (a bad schema or
//! grammar is the request's 400), gives each sequence its own [`TokenConstraint`], fills each
//! constrained row's mask on CPU threads while the model step runs, and masks the logits before
//! the sampler. Speculative decoding will use the matcher's `validate_tokens` / `rollback`
//! (llguidance's) to check draft tokens and undo rejected ones; this crate exposes neither yet.

mod gbnf;
mod grammar;
mod vocab;

use std::sync::Arc;

use ferrite_tokenizer::Tokenizer;
use llguidance::{Matcher, ParserFactory};
use toktrie::TokEnv;

pub use grammar::{Constraint, JsonOptions};

#[derive(Debug, thiserror::Error)]
pub enum StructuredError {
    /// The request's constraint does not compile; the message is the compiler's.
    #[error("{0}")]
    Invalid(String),
    /// This model's tokenizer cannot be described to the grammar engine.
    #[error("structured outputs are unavailable with this tokenizer: {0}")]
    Tokenizer(String),
}

/// A request's structured-output constraint with its JSON options.
#[derive(Debug, Clone, PartialEq)]
pub struct StructuredOutputs {
    pub constraint: Constraint,
    pub options: JsonOptions,
}

impl StructuredOutputs {
    pub fn new(constraint: Constraint) -> StructuredOutputs {
        StructuredOutputs { constraint, options: JsonOptions::default() }
    }
}

/// Compiles constraints for one model: its tokenizer's vocabulary, padded to the width of its
/// logits, ending on its end-of-sequence ids.
pub struct GrammarCompiler {
    factory: ParserFactory,
    defaults: JsonOptions,
    eos_words: Arc<[u32]>,
}

impl GrammarCompiler {
    pub fn new(
        tokenizer: &Tokenizer,
        vocab_size: usize,
        eos_token_ids: &[u32],
        defaults: JsonOptions,
    ) -> Result<GrammarCompiler, StructuredError> {
        let env: TokEnv = vocab::token_env(tokenizer, vocab_size, eos_token_ids)?;
        let eos_words = env.tok_trie().eos_token_set().as_slice().into();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| StructuredError::Tokenizer(e.to_string()))?;
        // Errors go back to the client; llguidance's own stderr logging would only repeat them.
        factory.quiet();
        Ok(GrammarCompiler { factory, defaults, eos_words })
    }

    /// Compiles a request's constraint; the error is the compiler's message.
    pub fn compile(&self, spec: &StructuredOutputs) -> Result<Grammar, StructuredError> {
        let top = grammar::top_level(&spec.constraint, &self.defaults.with(&spec.options))?;
        let parser = self.factory.create_parser(top).map_err(|e| StructuredError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(StructuredError::Invalid(e));
        }
        Ok(Grammar { matcher, eos_words: self.eos_words.clone() })
    }
}

/// A compiled constraint at its start; each sequence of the request starts its own copy.
pub struct Grammar {
    matcher: Matcher,
    eos_words: Arc<[u32]>,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    pub fn start(&self) -> TokenConstraint {
        TokenConstraint { matcher: self.matcher.deep_clone(), eos_words: self.eos_words.clone(), warned: false }
    }
}

/// One sequence's place in its grammar.
pub struct TokenConstraint {
    matcher: Matcher,
    eos_words: Arc<[u32]>,
    warned: bool,
}

impl TokenConstraint {
    /// Writes the tokens allowed next into `words` (bit `i % 32` of word `i / 32` for token
    /// `i`; ids past the grammar's vocabulary stay disallowed). A finished grammar allows only
    /// the end-of-sequence tokens, and so does one in an error state, as in vLLM.
    pub fn fill_mask(&mut self, words: &mut [u32]) {
        words.fill(0);
        match self.matcher.compute_mask_or_eos() {
            Ok(mask) => copy_words(mask.as_slice(), words),
            Err(e) => {
                self.warn(&e.to_string());
                copy_words(&self.eos_words, words);
            }
        }
    }

    /// Advances past a sampled token. Tokens after the grammar finished are ignored (the EOS
    /// that ends it, or what `ignore_eos` lets through).
    pub fn accept(&mut self, token: u32) {
        if self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            self.warn(&e.to_string());
        }
    }

    /// The masks of a speculative verify step: row `j` of `rows` (`words` words each) gets the
    /// tokens allowed after `drafts[..j]`. Once the grammar is complete every later row allows
    /// only the end of the sequence, as single steps would. Other rows past the first draft
    /// the grammar refuses keep what they hold: the draw before them cannot equal that draft,
    /// so verification stops there. The constraint is left where it was.
    pub fn fill_masks_along(&mut self, drafts: &[u32], rows: &mut [u32], words: usize) {
        let valid = if self.matcher.is_stopped() {
            0
        } else {
            match self.matcher.validate_tokens(drafts) {
                Ok(n) => n,
                Err(e) => {
                    self.warn(&e.to_string());
                    0
                }
            }
        };
        let mut consumed = 0;
        for (j, row) in rows.chunks_mut(words).enumerate() {
            if j > valid && !self.matcher.is_stopped() {
                break;
            }
            self.fill_mask(row);
            if j < valid {
                match self.matcher.consume_token(drafts[j]) {
                    Ok(()) => consumed += 1,
                    Err(e) => {
                        self.warn(&e.to_string());
                        break;
                    }
                }
            }
        }
        if consumed > 0 {
            if let Err(e) = self.matcher.rollback(consumed) {
                self.warn(&e.to_string());
            }
        }
    }

    /// Whether the grammar is complete: only the end of the sequence may follow.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    fn warn(&mut self, error: &str) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(error, "structured outputs: the grammar matcher failed; only EOS is allowed from here");
        }
    }
}

fn copy_words(from: &[u32], to: &mut [u32]) {
    let n = from.len().min(to.len());
    to[..n].copy_from_slice(&from[..n]);
}

/// Words of a token bitmask over `vocab` tokens.
pub fn mask_words(vocab: usize) -> usize {
    vocab.div_ceil(32)
}
