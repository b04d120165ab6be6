//! Per-request block tables over the [`BlockPool`], with automatic prefix caching (vLLM's
//! `KVCacheManager` for full attention), and for hybrid models one recurrent-state slot per
//! request (the state layers' single "block" of each sequence).
//!
//! A hybrid model's prefix hit needs the recurrent state at the end of the hit, not only the KV
//! blocks: states are kept at block boundaries in snapshot slots (after the working slots),
//! keyed by the hash of the block that ends there and evicted least recently used, and a hit is
//! cut back to the longest cached prefix whose end has a snapshot.

use std::collections::HashMap;

use super::block_pool::{extend_block_hashes, BlockHash, BlockId, BlockPool};
use super::ReqId;

/// Prefix-cache lookups, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    pub requests: u64,
    pub queries: u64,
    pub hits: u64,
}

#[derive(Debug, Default)]
struct RequestBlocks {
    blocks: Vec<BlockId>,
    /// Hashes of the request's full blocks, extended as its tokens grow.
    hashes: Vec<BlockHash>,
    /// Leading blocks already registered in the prefix cache.
    num_cached: usize,
    /// The prompt's images (placeholder positions, content hash), hashed into the blocks over them.
    cache_keys: Vec<(std::ops::Range<usize>, u64)>,
}

#[derive(Debug)]
pub struct KvCacheManager {
    pool: BlockPool,
    block_size: usize,
    max_model_len: usize,
    enable_caching: bool,
    requests: HashMap<ReqId, RequestBlocks>,
    stats: PrefixCacheStats,
    /// Recurrent-state slots not held by a request (none for models without recurrent layers).
    free_state_slots: Vec<usize>,
    state_slots: HashMap<ReqId, usize>,
    num_state_slots: usize,
    snapshots: Snapshots,
    /// Slots allocated past each step's tokens (vLLM's `num_lookahead_tokens`): a draft model
    /// writes its drafts' keys there before the next step schedules them.
    num_lookahead_tokens: usize,
}

/// Recurrent states at block boundaries, for hybrid models' prefix hits.
#[derive(Debug, Default)]
struct Snapshots {
    free: Vec<usize>,
    /// Snapshot slot and last use, by the hash of the block the state follows.
    cached: HashMap<BlockHash, (usize, u64)>,
    /// Filled by the step now being scheduled: usable from the next step on (a hit in the same
    /// step would restore it before it is written).
    pending: Vec<(BlockHash, usize)>,
    /// Requests admitted on a snapshot: the slot their state is restored from.
    restores: HashMap<ReqId, usize>,
    clock: u64,
    num_slots: usize,
}

impl KvCacheManager {
    pub fn new(num_blocks: usize, block_size: usize, max_model_len: usize, enable_caching: bool) -> KvCacheManager {
        KvCacheManager {
            pool: BlockPool::new(num_blocks, enable_caching),
            block_size,
            max_model_len,
            enable_caching,
            requests: HashMap::new(),
            stats: PrefixCacheStats::default(),
            free_state_slots: Vec::new(),
            state_slots: HashMap::new(),
            num_state_slots: 0,
            snapshots: Snapshots::default(),
            num_lookahead_tokens: 0,
        }
    }

    /// Allocates `tokens` slots past every step's tokens (up to `max_model_len`).
    pub fn with_lookahead_tokens(mut self, tokens: usize) -> KvCacheManager {
        self.num_lookahead_tokens = tokens;
        self
    }

    /// Gives every request a recurrent-state slot out of `slots` (a hybrid model's state layers
    /// hold that many sequences).
    pub fn with_state_slots(mut self, slots: usize) -> KvCacheManager {
        self.free_state_slots = (0..slots).rev().collect();
        self.num_state_slots = slots;
        self
    }

    /// Keeps up to `snapshots` recurrent states at block boundaries, in the slots after the
    /// working ones, so that hybrid models get prefix hits (with prefix caching on).
    pub fn with_state_snapshots(mut self, snapshots: usize) -> KvCacheManager {
        let first = self.num_state_slots;
        self.snapshots =
            Snapshots { free: (first..first + snapshots).rev().collect(), num_slots: snapshots, ..Default::default() };
        self
    }

    /// Whether prefix hits need state snapshots (a hybrid model with prefix caching on).
    pub fn snapshots_states(&self) -> bool {
        self.enable_caching && self.num_state_slots > 0
    }

    /// The snapshot slot `req`'s state is restored from, when it was admitted on a prefix hit.
    pub fn take_state_restore(&mut self, req: ReqId) -> Option<usize> {
        self.snapshots.restores.remove(&req)
    }

    /// Reserves a snapshot slot for `req`'s state once its first `end` tokens are computed
    /// (`end` a multiple of the block size, its blocks hashed by `allocate_slots`). `None` when
    /// that state is already kept, `end` ends no full block of the request, or there is no
    /// snapshot capacity.
    pub fn reserve_state_snapshot(&mut self, req: ReqId, end: usize) -> Option<usize> {
        if !self.snapshots_states() || end == 0 || !end.is_multiple_of(self.block_size) {
            return None;
        }
        let hash = *self.requests.get(&req)?.hashes.get(end / self.block_size - 1)?;
        let snaps = &mut self.snapshots;
        if snaps.cached.contains_key(&hash) || snaps.pending.iter().any(|(h, _)| *h == hash) {
            return None;
        }
        let slot = match snaps.free.pop() {
            Some(slot) => slot,
            None => {
                let (&oldest, _) = snaps.cached.iter().min_by_key(|(_, &(_, used))| used)?;
                snaps.cached.remove(&oldest)?.0
            }
        };
        snaps.pending.push((hash, slot));
        Some(slot)
    }

    /// Makes the snapshots of the last step usable (call once that step has run).
    pub fn commit_state_snapshots(&mut self) {
        let clock = self.snapshots.clock;
        for (hash, slot) in std::mem::take(&mut self.snapshots.pending) {
            self.snapshots.cached.insert(hash, (slot, clock));
        }
    }

    /// The request's recurrent-state slot, while it holds one.
    pub fn state_slot(&self, req: ReqId) -> Option<usize> {
        self.state_slots.get(&req).copied()
    }

    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    pub fn stats(&self) -> PrefixCacheStats {
        self.stats
    }

    pub fn num_free_blocks(&self) -> usize {
        self.pool.num_free_blocks()
    }

    pub fn block_ids(&self, req: ReqId) -> &[BlockId] {
        self.requests.get(&req).map(|r| r.blocks.as_slice()).unwrap_or(&[])
    }

    /// Records the images of `req`'s prompt (placeholder positions, content hash) for its block
    /// hashes; set before its first lookup, again after a preemption freed it.
    pub fn set_cache_keys(&mut self, req: ReqId, keys: Vec<(std::ops::Range<usize>, u64)>) {
        let entry = self.requests.entry(req).or_default();
        if entry.hashes.is_empty() {
            entry.cache_keys = keys;
        }
    }

    /// The longest cached prefix of `tokens` in whole blocks, and its length in tokens. The last
    /// token is never a hit: its logits must be computed to sample from them.
    pub fn get_computed_blocks(&mut self, req: ReqId, tokens: &[u32], skip_cache: bool) -> (Vec<BlockId>, usize) {
        if !self.enable_caching || skip_cache || tokens.is_empty() {
            return (Vec::new(), 0);
        }
        let entry = self.requests.entry(req).or_default();
        extend_block_hashes(&mut entry.hashes, tokens, self.block_size, &entry.cache_keys);
        let max_blocks = (tokens.len() - 1) / self.block_size;
        let mut hits: Vec<BlockId> =
            entry.hashes.iter().take(max_blocks).map_while(|h| self.pool.get_cached_block(h)).collect();
        self.snapshots.restores.remove(&req);
        if self.enable_caching && self.num_state_slots > 0 {
            // A hybrid model resumes from a kept state: the hit ends where one was kept.
            let snaps = &mut self.snapshots;
            let kept = (1..=hits.len()).rev().find(|&n| snaps.cached.contains_key(&entry.hashes[n - 1]));
            match kept {
                Some(n) => {
                    snaps.clock += 1;
                    let (slot, used) = snaps.cached.get_mut(&entry.hashes[n - 1]).expect("found above");
                    *used = snaps.clock;
                    snaps.restores.insert(req, *slot);
                    hits.truncate(n);
                }
                None => hits.clear(),
            }
        }
        let hit_tokens = hits.len() * self.block_size;
        self.stats.requests += 1;
        self.stats.queries += tokens.len() as u64;
        self.stats.hits += hit_tokens as u64;
        (hits, hit_tokens)
    }

    /// Grows `req`'s block table to hold `num_computed_tokens + hits + num_new_tokens` tokens,
    /// taking references on the prefix-cache `hits` first. Returns the newly allocated blocks, or
    /// `None` (and changes nothing) when the pool cannot supply them.
    pub fn allocate_slots(
        &mut self,
        req: ReqId,
        tokens: &[u32],
        num_computed_tokens: usize,
        num_new_tokens: usize,
        hits: &[BlockId],
    ) -> Option<Vec<BlockId>> {
        let bs = self.block_size;
        let computed = num_computed_tokens + hits.len() * bs;
        let needed_tokens = (computed + num_new_tokens + self.num_lookahead_tokens).min(self.max_model_len);
        let held = self.requests.get(&req).map_or(0, |r| r.blocks.len());
        let to_allocate = needed_tokens.div_ceil(bs).saturating_sub(held + hits.len());
        // Hits sitting in the free queue stop being allocatable once touched.
        let free_hits = hits.iter().filter(|&&b| self.pool.ref_count(b) == 0).count();
        if to_allocate + free_hits > self.pool.num_free_blocks() {
            return None;
        }
        let needs_state = self.num_state_slots > 0 && !self.state_slots.contains_key(&req);
        if needs_state {
            let slot = self.free_state_slots.pop()?;
            self.state_slots.insert(req, slot);
        }
        self.pool.touch(hits);
        let new_blocks = self.pool.get_new_blocks(to_allocate)?;
        let entry = self.requests.entry(req).or_default();
        if entry.blocks.is_empty() {
            entry.num_cached = hits.len();
        }
        entry.blocks.extend_from_slice(hits);
        entry.blocks.extend_from_slice(&new_blocks);
        if self.enable_caching {
            // Blocks this step fills completely become hits for later requests (and for requests
            // later in the same step: the forward writes every key before attention reads any).
            let full = (computed + num_new_tokens).min(tokens.len()) / bs;
            if full > entry.num_cached {
                extend_block_hashes(&mut entry.hashes, &tokens[..full * bs], bs, &entry.cache_keys);
                self.pool.cache_full_blocks(&entry.blocks, &entry.hashes, entry.num_cached..full);
                entry.num_cached = full;
            }
        }
        Some(new_blocks)
    }

    /// Releases every block of `req`, tail first so that its last blocks are evicted first.
    pub fn free(&mut self, req: ReqId) {
        if let Some(entry) = self.requests.remove(&req) {
            self.pool.free_blocks(entry.blocks.into_iter().rev());
        }
        if let Some(slot) = self.state_slots.remove(&req) {
            self.free_state_slots.push(slot);
        }
        self.snapshots.restores.remove(&req);
    }

    /// Drops the cached content of free blocks and the snapshots the step was to write (after a
    /// failed step).
    pub fn evict_free_cached_blocks(&mut self) {
        self.pool.evict_free_cached_blocks();
        let pending = std::mem::take(&mut self.snapshots.pending);
        self.snapshots.free.extend(pending.into_iter().map(|(_, slot)| slot));
    }

    /// The pool's invariants plus: every block's reference count equals the number of block
    /// tables holding it.
    pub fn check_consistency(&self) -> Result<(), String> {
        self.pool.check_consistency()?;
        let mut refs = vec![0u32; self.pool.num_blocks()];
        for (req, entry) in &self.requests {
            for &b in &entry.blocks {
                refs[b as usize] += 1;
            }
            if entry.num_cached > entry.blocks.len() {
                return Err(format!("request {req} caches {} of {} blocks", entry.num_cached, entry.blocks.len()));
            }
        }
        let mut held: Vec<usize> = self.state_slots.values().chain(&self.free_state_slots).copied().collect();
        held.sort_unstable();
        if held != (0..self.num_state_slots).collect::<Vec<_>>() {
            return Err(format!(
                "state slots held or free {held:?}, expected each of 0..{} once",
                self.num_state_slots
            ));
        }
        let snaps = &self.snapshots;
        let mut kept: Vec<usize> = snaps
            .cached
            .values()
            .map(|&(slot, _)| slot)
            .chain(snaps.pending.iter().map(|&(_, slot)| slot))
            .chain(snaps.free.iter().copied())
            .collect();
        kept.sort_unstable();
        let first = self.num_state_slots;
        if kept != (first..first + snaps.num_slots).collect::<Vec<_>>() {
            return Err(format!("snapshot slots {kept:?}, expected each of {first}..{} once", first + snaps.num_slots));
        }
        for (id, &want) in refs.iter().enumerate() {
            let got = self.pool.ref_count(id as BlockId);
            if got != want {
                return Err(format!("block {id} has {got} references but {want} block tables hold it"));
            }
        }
        Ok(())
    }
}
