//! Suffix decoding's drafter (vLLM's `suffix` method, after Arctic Inference's
//! `SuffixDecodingCache`): token sequences are indexed in suffix trees cut at `max_tree_depth`,
//! one per request over its prompt and one global over responses (the running requests' and
//! the last `max_cached_requests` finished ones). A draft continues the longest suffix of the
//! request's tokens found in a tree, following at each node the most frequent next token while
//! its share of the node's count stays at least `min_token_prob`, for at most
//! `max_spec_factor` times the match length. The global tree keeps at most `MAX_CACHED_TOKENS`
//! finished response tokens, oldest evicted first.

use std::collections::{HashMap, VecDeque};

use crate::core::ReqId;

/// A trie of every suffix of the inserted sequences, each cut at `depth` tokens; a node counts
/// the suffixes through it.
#[derive(Debug, Default)]
struct SuffixTree {
    /// `children[n]`: node `n`'s children by token, `count[n]`: suffixes through it. Node 0 is
    /// the root.
    children: Vec<HashMap<u32, usize>>,
    count: Vec<u32>,
    free: Vec<usize>,
}

impl SuffixTree {
    fn new() -> SuffixTree {
        SuffixTree { children: vec![HashMap::new()], count: vec![0], free: Vec::new() }
    }

    fn child(&self, node: usize, token: u32) -> Option<usize> {
        self.children[node].get(&token).copied()
    }

    /// The child of `node` for `token`, created if missing, with its count raised.
    fn enter(&mut self, node: usize, token: u32) -> usize {
        let next = match self.child(node, token) {
            Some(next) => next,
            None => {
                let next = match self.free.pop() {
                    Some(n) => n,
                    None => {
                        self.children.push(HashMap::new());
                        self.count.push(0);
                        self.children.len() - 1
                    }
                };
                self.children[node].insert(token, next);
                next
            }
        };
        self.count[next] += 1;
        next
    }

    /// Adds every suffix of `tokens` (cut at `depth`).
    fn insert(&mut self, tokens: &[u32], depth: usize) {
        for start in 0..tokens.len() {
            let mut node = 0;
            for &t in &tokens[start..(start + depth).min(tokens.len())] {
                node = self.enter(node, t);
            }
        }
    }

    /// Takes back what [`SuffixTree::insert`] added for `tokens`, freeing emptied nodes.
    fn remove(&mut self, tokens: &[u32], depth: usize) {
        for start in 0..tokens.len() {
            let mut node = 0;
            for &t in &tokens[start..(start + depth).min(tokens.len())] {
                let Some(next) = self.child(node, t) else { break };
                self.count[next] -= 1;
                if self.count[next] == 0 {
                    self.children[node].remove(&t);
                    self.release(next);
                    break;
                }
                node = next;
            }
        }
    }

    fn release(&mut self, node: usize) {
        let children: Vec<usize> = self.children[node].drain().map(|(_, c)| c).collect();
        self.count[node] = 0;
        self.free.push(node);
        for c in children {
            self.release(c);
        }
    }

    /// The node reached by `pattern` from the root, if `pattern` occurs.
    fn find(&self, pattern: &[u32]) -> Option<usize> {
        pattern.iter().try_fold(0, |node, &t| self.child(node, t))
    }

    /// The draft after the longest suffix of `context` that occurs (at most `depth` tokens),
    /// and its score (the expected number of accepted tokens, as the product of the shares).
    fn speculate(&self, context: &[u32], depth: usize, params: &SuffixParams, max_tokens: usize) -> (Vec<u32>, f32) {
        let longest = depth.min(context.len());
        let Some((match_len, mut node)) =
            (1..=longest).rev().find_map(|m| self.find(&context[context.len() - m..]).map(|n| (m, n)))
        else {
            return (Vec::new(), 0.0);
        };
        let limit = max_tokens.min((match_len as f32 * params.max_spec_factor) as usize);
        let (mut draft, mut score, mut prob) = (Vec::new(), 0.0f32, 1.0f32);
        while draft.len() < limit {
            // The most frequent continuation; the lowest token id among equals, for determinism.
            let Some((&token, &next)) =
                self.children[node].iter().max_by_key(|(&t, &c)| (self.count[c], std::cmp::Reverse(t)))
            else {
                break;
            };
            let share = self.count[next] as f32 / self.count[node] as f32;
            if share < params.min_token_prob {
                break;
            }
            prob *= share;
            score += prob;
            draft.push(token);
            node = next;
        }
        (draft, score)
    }
}

/// vLLM's `suffix_decoding_*` settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SuffixParams {
    pub max_tree_depth: usize,
    pub max_cached_requests: usize,
    pub max_spec_factor: f32,
    pub min_token_prob: f32,
}

impl Default for SuffixParams {
    fn default() -> Self {
        SuffixParams { max_tree_depth: 24, max_cached_requests: 10_000, max_spec_factor: 1.0, min_token_prob: 0.1 }
    }
}

#[derive(Debug)]
struct Active {
    prompt: SuffixTree,
    /// Response tokens already in the global tree.
    response: Vec<u32>,
}

/// Response tokens the global tree keeps at most, whatever `max_cached_requests` says: a tree
/// holds up to `max_tree_depth` nodes per token, so this bounds its memory (about 6 million
/// nodes at the default depth) where vLLM's 10,000 cached requests of long answers would not.
const MAX_CACHED_TOKENS: usize = 1 << 18;

/// The suffix trees of every request the engine has seen, kept in step with their tokens.
#[derive(Debug)]
pub struct SuffixCache {
    params: SuffixParams,
    global: SuffixTree,
    active: HashMap<ReqId, Active>,
    /// Finished responses still in the global tree, oldest first, and their total length.
    cached: VecDeque<Vec<u32>>,
    cached_tokens: usize,
}

impl SuffixCache {
    pub fn new(params: SuffixParams) -> SuffixCache {
        SuffixCache {
            params,
            global: SuffixTree::new(),
            active: HashMap::new(),
            cached: VecDeque::new(),
            cached_tokens: 0,
        }
    }

    /// Up to `max_tokens` drafts for request `id`, whose tokens are `tokens` (the first
    /// `num_prompt` its prompt). Registers the request on first sight and indexes the response
    /// tokens it has not seen yet.
    pub fn propose(&mut self, id: ReqId, tokens: &[u32], num_prompt: usize, max_tokens: usize) -> Vec<u32> {
        let depth = self.params.max_tree_depth;
        let (prompt, output) = tokens.split_at(num_prompt.min(tokens.len()));
        let active = self.active.entry(id).or_insert_with(|| {
            let mut tree = SuffixTree::new();
            tree.insert(prompt, depth);
            Active { prompt: tree, response: Vec::new() }
        });
        if output.len() > active.response.len() {
            // Suffixes ending in the new tokens: the old ones lose their cut, so re-add the
            // tail whose suffixes change.
            let from = active.response.len().saturating_sub(depth - 1);
            self.global.remove(&active.response[from..], depth);
            active.response.extend_from_slice(&output[active.response.len()..]);
            self.global.insert(&active.response[from..], depth);
        }
        if max_tokens == 0 {
            return Vec::new();
        }
        let local = active.prompt.speculate(tokens, depth, &self.params, max_tokens);
        let global = self.global.speculate(tokens, depth, &self.params, max_tokens);
        if global.1 > local.1 {
            global.0
        } else {
            local.0
        }
    }

    /// The request ended: its response stays in the global tree among the cached ones.
    pub fn finish(&mut self, id: ReqId) {
        let Some(active) = self.active.remove(&id) else { return };
        if self.params.max_cached_requests == 0 {
            self.global.remove(&active.response, self.params.max_tree_depth);
            return;
        }
        self.cached_tokens += active.response.len();
        self.cached.push_back(active.response);
        while self.cached.len() > self.params.max_cached_requests || self.cached_tokens > MAX_CACHED_TOKENS {
            let Some(old) = self.cached.pop_front() else { break };
            self.cached_tokens -= old.len();
            self.global.remove(&old, self.params.max_tree_depth);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(depth: usize, min_token_prob: f32) -> SuffixParams {
        SuffixParams { max_tree_depth: depth, max_cached_requests: 2, max_spec_factor: 1.0, min_token_prob }
    }

    #[test]
    fn drafts_follow_the_most_frequent_continuation_of_the_longest_match() {
        let mut t = SuffixTree::new();
        // After [1, 2]: 3 twice, 4 once; after [9, 1, 2]: only 4.
        t.insert(&[1, 2, 3, 7, 1, 2, 3, 8, 9, 1, 2, 4, 5], 8);
        let p = params(8, 0.1);
        // [1, 2] matched (two tokens): 3, then 7 and 8 once each (the lower id on a tie).
        assert_eq!(t.speculate(&[0, 1, 2], 8, &p, 4).0, [3, 7]);
        // The longest match [9, 1, 2] decides, and it continues [4, 5].
        assert_eq!(t.speculate(&[9, 1, 2], 8, &p, 4).0, [4, 5]);
        // A continuation below min_token_prob is not drafted: after [2], 3 has 2 of 3.
        assert_eq!(t.speculate(&[2], 8, &params(8, 0.7), 4).0, Vec::<u32>::new());
        // max_spec_factor 1: a match of one token drafts one.
        assert_eq!(t.speculate(&[2], 8, &p, 4).0, [3]);
        assert!(t.speculate(&[6], 8, &p, 4).0.is_empty());
    }

    /// Every path from the root with its count, whatever the node numbering.
    fn paths(t: &SuffixTree) -> std::collections::BTreeMap<Vec<u32>, u32> {
        let mut out = std::collections::BTreeMap::new();
        let mut stack = vec![(0usize, Vec::new())];
        while let Some((node, path)) = stack.pop() {
            for (&tok, &child) in &t.children[node] {
                let mut p = path.clone();
                p.push(tok);
                out.insert(p.clone(), t.count[child]);
                stack.push((child, p));
            }
        }
        out
    }

    #[test]
    fn growing_a_response_indexes_what_inserting_it_whole_does() {
        let tokens: Vec<u32> = (0..40).map(|i| (i * 7 % 11) as u32).collect();
        let mut whole = SuffixCache::new(params(5, 0.0));
        let mut grown = SuffixCache::new(params(5, 0.0));
        whole.propose(1, &tokens, 3, 0);
        for n in 4..=tokens.len() {
            grown.propose(1, &tokens[..n], 3, 0);
        }
        assert_eq!(paths(&grown.global), paths(&whole.global));
        for probe in [&tokens[..10], &tokens[20..33], &[3, 10][..]] {
            let (a, b) = (grown.propose(1, probe, 0, 6), whole.propose(1, probe, 0, 6));
            assert_eq!(a, b);
        }
    }

    #[test]
    fn finished_responses_are_cached_until_evicted() {
        let mut c = SuffixCache::new(params(6, 0.1));
        let answer = [40, 41, 42, 43, 44, 45];
        let mut tokens = vec![1, 2, 3];
        tokens.extend_from_slice(&answer);
        c.propose(1, &tokens, 3, 0);
        c.finish(1);
        // Another request starting the same answer gets the rest of it from the global tree.
        assert_eq!(c.propose(2, &[9, 40, 41, 42], 2, 3), [43, 44, 45]);
        // Two more finished requests push the first out (two are cached).
        for id in [2, 3] {
            c.propose(id, &[7, 8, 9], 3, 0);
            c.finish(id);
        }
        c.propose(3, &[7, 8, 9], 3, 0);
        c.finish(3);
        assert!(c.propose(4, &[9, 40, 41, 42], 2, 3).is_empty());
        // Removing frees the nodes it emptied.
        let live = c.global.count.iter().filter(|&&n| n > 0).count();
        assert_eq!(live + c.global.free.len() + 1, c.global.count.len());
    }
}
