use crate::Tokenizer;

/// Turns a growing list of token ids into text deltas without splitting UTF-8 characters or
/// byte-level merges: text is only emitted once the decoded tail no longer ends in a partial
/// character (the prefix/read offset scheme vLLM and text-generation-inference use).
pub struct IncrementalDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    prefix_offset: usize,
    read_offset: usize,
}

impl<'a> IncrementalDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        IncrementalDecoder { tokenizer, skip_special_tokens, ids: Vec::new(), prefix_offset: 0, read_offset: 0 }
    }

    /// Adds one token and returns the text it completes (possibly empty).
    pub fn push(&mut self, id: u32) -> crate::Result<String> {
        self.ids.push(id);
        let prefix =
            self.tokenizer.decode(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let full = self.tokenizer.decode(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if full.len() > prefix.len() && !full.ends_with('\u{FFFD}') && full.is_char_boundary(prefix.len()) {
            let delta = full[prefix.len()..].to_string();
            self.prefix_offset = self.read_offset;
            self.read_offset = self.ids.len();
            Ok(delta)
        } else {
            Ok(String::new())
        }
    }

    pub fn ids(&self) -> &[u32] {
        &self.ids
    }
}
