//! Incremental detokenization with stop strings, as vLLM's output processor does it.
//!
//! Text is emitted with the prefix/read-offset scheme: a token's text is the difference between
//! decoding a short window with and without it, released only once it no longer ends in a
//! partial UTF-8 character. The window starts on the tail of the prompt so that tokenizers whose
//! decoding depends on the preceding token (SentencePiece's leading space) render the first
//! generated token as they would in context. Stop strings are searched across token boundaries;
//! while any could still be forming, that many characters are held back from the stream.

use ferrite_tokenizer::Tokenizer;

use crate::params::SamplingParams;

/// The prompt tail decoded as context is at most this long (vLLM's DecodeStream priming).
const MAX_PROMPT_CONTEXT: usize = 24;
const MIN_PROMPT_CONTEXT: usize = 4;

pub struct Detokenizer {
    /// Prompt context followed by the generated tokens.
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
    skip_special_tokens: bool,
    output_text: String,
    num_output_tokens: usize,
    stop: Vec<String>,
    include_stop_str_in_output: bool,
    min_tokens: usize,
    /// Characters held back from streaming while a stop string may be forming.
    stop_buffer_chars: usize,
    streamed_bytes: usize,
}

fn decode(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> String {
    tokenizer.decode(ids, skip_special_tokens).unwrap_or_else(|e| {
        tracing::warn!(error = %e, "cannot decode generated tokens; emitting no text for them");
        String::new()
    })
}

impl Detokenizer {
    pub fn new(tokenizer: &Tokenizer, prompt: &[u32], params: &SamplingParams) -> Detokenizer {
        let skip = params.skip_special_tokens;
        // The shortest tail (of at least 4 tokens) that decodes to whole characters.
        let mut context = &prompt[prompt.len().saturating_sub(MAX_PROMPT_CONTEXT)..];
        if prompt.len() > MIN_PROMPT_CONTEXT {
            for len in MIN_PROMPT_CONTEXT..=prompt.len().min(MAX_PROMPT_CONTEXT - 1) {
                let tail = &prompt[prompt.len() - len..];
                if !decode(tokenizer, tail, skip).contains('\u{FFFD}') {
                    context = tail;
                    break;
                }
            }
        }
        let stop_buffer_chars = if params.include_stop_str_in_output {
            0
        } else {
            params.stop.iter().map(|s| s.chars().count()).max().unwrap_or(1).saturating_sub(1)
        };
        Detokenizer {
            ids: context.to_vec(),
            prefix_offset: 0,
            read_offset: context.len(),
            skip_special_tokens: skip,
            output_text: String::new(),
            num_output_tokens: 0,
            stop: params.stop.clone(),
            include_stop_str_in_output: params.include_stop_str_in_output,
            min_tokens: params.min_tokens,
            stop_buffer_chars,
            streamed_bytes: 0,
        }
    }

    pub fn output_text(&self) -> &str {
        &self.output_text
    }

    fn decode_next(&mut self, tokenizer: &Tokenizer, id: u32) -> String {
        self.ids.push(id);
        let prefix = decode(tokenizer, &self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens);
        let full = decode(tokenizer, &self.ids[self.prefix_offset..], self.skip_special_tokens);
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            full[prefix.len()..].to_string()
        } else {
            String::new()
        }
    }

    /// Adds one step's tokens. `stop_terminated`: the last one is an EOS / stop token, whose
    /// text is left out unless `include_stop_str_in_output`. Returns the stop string that
    /// matched, the text then cut at its start (or after its end when it is to be included).
    pub fn update(&mut self, tokenizer: &Tokenizer, new_ids: &[u32], stop_terminated: bool) -> Option<String> {
        let decoded = if stop_terminated && !self.include_stop_str_in_output {
            &new_ids[..new_ids.len().saturating_sub(1)]
        } else {
            new_ids
        };
        let mut stop_check_offset = self.output_text.len();
        for &id in decoded {
            let text = self.decode_next(tokenizer, id);
            self.output_text.push_str(&text);
            self.num_output_tokens += 1;
            // Text produced before min_tokens is reached cannot stop the sequence.
            if self.num_output_tokens <= self.min_tokens {
                stop_check_offset = self.output_text.len();
            }
        }
        self.num_output_tokens += new_ids.len() - decoded.len();
        if self.stop.is_empty() || self.num_output_tokens <= self.min_tokens {
            return None;
        }
        let new_bytes = self.output_text.len() - stop_check_offset;
        let (stop, truncate_to) =
            check_stop_strings(&self.output_text, new_bytes, &self.stop, self.include_stop_str_in_output)?;
        if let Some(len) = truncate_to {
            self.output_text.truncate(len);
        }
        Some(stop)
    }

    /// The text to stream now: everything new except the characters a forming stop string may
    /// still claim (all of it once `finished`).
    pub fn next_delta(&mut self, finished: bool) -> String {
        let hold = if finished { 0 } else { self.stop_buffer_chars };
        let end = if hold == 0 {
            self.output_text.len()
        } else {
            self.output_text.char_indices().rev().nth(hold - 1).map_or(0, |(i, _)| i)
        };
        if end <= self.streamed_bytes {
            return String::new();
        }
        let delta = self.output_text[self.streamed_bytes..end].to_string();
        self.streamed_bytes = end;
        delta
    }
}

/// vLLM's `check_stop_strings`: the first stop string (in list order) that occurs in text
/// overlapping the `new_bytes` just added, and where to truncate (`None`: nothing to cut).
pub fn check_stop_strings(
    text: &str,
    new_bytes: usize,
    stop: &[String],
    include: bool,
) -> Option<(String, Option<usize>)> {
    if new_bytes == 0 {
        return None;
    }
    for s in stop {
        let mut start = text.len().saturating_sub(new_bytes + s.len() - 1);
        while !text.is_char_boundary(start) {
            start -= 1;
        }
        let Some(at) = text[start..].find(s.as_str()) else {
            continue;
        };
        let index = start + at;
        if include {
            let end = index + s.len();
            return Some((s.clone(), (end < text.len()).then_some(end)));
        }
        return Some((s.clone(), Some(index)));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::check_stop_strings;

    #[test]
    fn stop_strings_are_found_across_the_boundary_of_new_text() {
        let stops = vec!["lo w".to_string(), "xyz".to_string()];
        // "hel" was there before, "lo world" is new: the match starts in old text.
        assert_eq!(check_stop_strings("hello world", 8, &stops, false), Some(("lo w".into(), Some(3))));
        assert_eq!(check_stop_strings("hello world", 8, &stops, true), Some(("lo w".into(), Some(7))));
        // A match entirely inside already-checked text is not found again.
        assert_eq!(check_stop_strings("hello world!", 1, &stops, false), None);
        // Multi-byte text: the search window is widened to a character boundary.
        let s = vec!["é!".to_string()];
        assert_eq!(check_stop_strings("café!", 1, &s, false), Some(("é!".into(), Some(3))));
        assert_eq!(check_stop_strings("café!", 1, &s, true), Some(("é!".into(), None)));
    }
}
