//! The pool of KV blocks: reference counts, the free-block queue (LRU order for eviction) and the
//! hash -> block map of the prefix cache, as vLLM's `BlockPool`.

use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};

pub type BlockId = u32;

/// Identifies a full block by its tokens and everything before them: the hash chains the
/// parent block's hash with the block's token ids, so equal hashes mean equal prefixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BlockHash(u128);

impl BlockHash {
    pub fn new(parent: Option<BlockHash>, tokens: &[u32]) -> BlockHash {
        BlockHash::with_keys(parent, tokens, &[])
    }

    /// A block's hash that also covers `keys`: the content hashes of the images whose
    /// placeholder tokens the block holds (vLLM's extra keys), so that equal placeholders over
    /// different images never match.
    pub fn with_keys(parent: Option<BlockHash>, tokens: &[u32], keys: &[u64]) -> BlockHash {
        // Two independently keyed 64-bit hashes: a collision would silently serve another
        // prompt's keys and values, so 64 bits alone are too few for a long-running cache.
        let half = |key: u8| {
            let mut h = DefaultHasher::new();
            key.hash(&mut h);
            parent.hash(&mut h);
            tokens.hash(&mut h);
            if !keys.is_empty() {
                keys.hash(&mut h);
            }
            h.finish()
        };
        BlockHash((u128::from(half(1)) << 64) | u128::from(half(0)))
    }
}

/// The hashes of every full block of `tokens`, extending `hashes` (already computed for a prefix).
/// `keys` are the prompt's images: each one's placeholder positions and content hash.
pub fn extend_block_hashes(
    hashes: &mut Vec<BlockHash>,
    tokens: &[u32],
    block_size: usize,
    keys: &[(std::ops::Range<usize>, u64)],
) {
    let full = tokens.len() / block_size;
    for i in hashes.len()..full {
        let parent = i.checked_sub(1).map(|p| hashes[p]);
        let span = i * block_size..(i + 1) * block_size;
        let overlapping: Vec<u64> =
            keys.iter().filter(|(at, _)| at.start < span.end && span.start < at.end).map(|(_, h)| *h).collect();
        hashes.push(BlockHash::with_keys(parent, &tokens[span], &overlapping));
    }
}

const NIL: u32 = u32::MAX;

/// Free blocks as an intrusive doubly linked list, so a cached block that gets reused can leave
/// the middle of the queue in O(1). Allocation takes from the front (least recently freed).
#[derive(Debug)]
struct FreeBlockQueue {
    prev: Vec<u32>,
    next: Vec<u32>,
    queued: Vec<bool>,
    head: u32,
    tail: u32,
    len: usize,
}

impl FreeBlockQueue {
    fn new(num_blocks: usize) -> FreeBlockQueue {
        let n = num_blocks as u32;
        FreeBlockQueue {
            prev: (0..n).map(|i| if i == 0 { NIL } else { i - 1 }).collect(),
            next: (0..n).map(|i| if i + 1 == n { NIL } else { i + 1 }).collect(),
            queued: vec![true; num_blocks],
            head: if n == 0 { NIL } else { 0 },
            tail: if n == 0 { NIL } else { n - 1 },
            len: num_blocks,
        }
    }

    fn pop_front(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.remove(id);
        Some(id)
    }

    fn remove(&mut self, id: BlockId) {
        let i = id as usize;
        debug_assert!(self.queued[i], "block {id} is not in the free queue");
        let (p, n) = (self.prev[i], self.next[i]);
        if p == NIL {
            self.head = n;
        } else {
            self.next[p as usize] = n;
        }
        if n == NIL {
            self.tail = p;
        } else {
            self.prev[n as usize] = p;
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
        self.queued[i] = false;
        self.len -= 1;
    }

    fn push_back(&mut self, id: BlockId) {
        let i = id as usize;
        debug_assert!(!self.queued[i], "block {id} is already in the free queue");
        self.prev[i] = self.tail;
        self.next[i] = NIL;
        if self.tail == NIL {
            self.head = id;
        } else {
            self.next[self.tail as usize] = id;
        }
        self.tail = id;
        self.queued[i] = true;
        self.len += 1;
    }

    fn iter(&self) -> impl Iterator<Item = BlockId> + '_ {
        std::iter::successors((self.head != NIL).then_some(self.head), |&id| {
            let n = self.next[id as usize];
            (n != NIL).then_some(n)
        })
    }
}

#[derive(Debug)]
pub struct BlockPool {
    ref_cnt: Vec<u32>,
    hash: Vec<Option<BlockHash>>,
    free: FreeBlockQueue,
    /// Several blocks may hold the same content (computed concurrently before either was cached).
    cached: HashMap<BlockHash, Vec<BlockId>>,
    enable_caching: bool,
}

impl BlockPool {
    pub fn new(num_blocks: usize, enable_caching: bool) -> BlockPool {
        BlockPool {
            ref_cnt: vec![0; num_blocks],
            hash: vec![None; num_blocks],
            free: FreeBlockQueue::new(num_blocks),
            cached: HashMap::new(),
            enable_caching,
        }
    }

    pub fn num_blocks(&self) -> usize {
        self.ref_cnt.len()
    }

    /// Blocks no request holds, cached or not (cached ones are evicted when taken).
    pub fn num_free_blocks(&self) -> usize {
        self.free.len
    }

    pub fn ref_count(&self, id: BlockId) -> u32 {
        self.ref_cnt[id as usize]
    }

    pub fn get_cached_block(&self, hash: &BlockHash) -> Option<BlockId> {
        self.cached.get(hash).and_then(|ids| ids.first().copied())
    }

    /// Takes `n` blocks from the front of the free queue, evicting their cached content.
    /// `None` (and nothing taken) when fewer than `n` are free.
    pub fn get_new_blocks(&mut self, n: usize) -> Option<Vec<BlockId>> {
        if n > self.free.len {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let id = self.free.pop_front()?;
            self.evict(id);
            self.ref_cnt[id as usize] = 1;
            out.push(id);
        }
        Some(out)
    }

    /// Takes a reference on cache hits; a hit that was free leaves the free queue.
    pub fn touch(&mut self, ids: &[BlockId]) {
        for &id in ids {
            if self.ref_cnt[id as usize] == 0 {
                self.free.remove(id);
            }
            self.ref_cnt[id as usize] += 1;
        }
    }

    /// Drops one reference per block, in eviction order: the first block to reach zero is the
    /// first to be reused.
    pub fn free_blocks(&mut self, ids: impl IntoIterator<Item = BlockId>) {
        for id in ids {
            let rc = &mut self.ref_cnt[id as usize];
            debug_assert!(*rc > 0, "double free of block {id}");
            if *rc == 0 {
                continue;
            }
            *rc -= 1;
            if *rc == 0 {
                self.free.push_back(id);
            }
        }
    }

    /// Registers `blocks[i]` under `hashes[i]` for `i` in `range` (full blocks just computed).
    pub fn cache_full_blocks(&mut self, blocks: &[BlockId], hashes: &[BlockHash], range: std::ops::Range<usize>) {
        if !self.enable_caching {
            return;
        }
        for i in range {
            let id = blocks[i];
            if self.hash[id as usize].is_some() {
                continue;
            }
            self.hash[id as usize] = Some(hashes[i]);
            self.cached.entry(hashes[i]).or_default().push(id);
        }
    }

    /// Forgets the content of every free block (after a failed step may have left some of them
    /// half-written).
    pub fn evict_free_cached_blocks(&mut self) {
        let free: Vec<BlockId> = self.free.iter().collect();
        for id in free {
            self.evict(id);
        }
    }

    fn evict(&mut self, id: BlockId) {
        let Some(hash) = self.hash[id as usize].take() else {
            return;
        };
        if let Some(ids) = self.cached.get_mut(&hash) {
            ids.retain(|&b| b != id);
            if ids.is_empty() {
                self.cached.remove(&hash);
            }
        }
    }

    /// Checks the pool's invariants: the free queue holds exactly the unreferenced blocks, once
    /// each, and the hash map and per-block hashes agree.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut seen = vec![false; self.num_blocks()];
        let mut count = 0;
        for id in self.free.iter() {
            if std::mem::replace(&mut seen[id as usize], true) {
                return Err(format!("block {id} is twice in the free queue"));
            }
            if self.ref_cnt[id as usize] != 0 {
                return Err(format!("block {id} is free with {} references", self.ref_cnt[id as usize]));
            }
            count += 1;
        }
        if count != self.free.len {
            return Err(format!("free queue has {count} blocks but counts {}", self.free.len));
        }
        let unreferenced = self.ref_cnt.iter().filter(|&&r| r == 0).count();
        if unreferenced != count {
            return Err(format!("{unreferenced} blocks have no reference but {count} are free"));
        }
        for (hash, ids) in &self.cached {
            for &id in ids {
                if self.hash[id as usize] != Some(*hash) {
                    return Err(format!("block {id} is cached under a hash it does not carry"));
                }
            }
        }
        let hashed = self.hash.iter().filter(|h| h.is_some()).count();
        let mapped: usize = self.cached.values().map(Vec::len).sum();
        if hashed != mapped {
            return Err(format!("{hashed} blocks carry a hash but the map holds {mapped}"));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eviction_takes_least_recently_freed_and_forgets_its_hash() {
        let mut pool = BlockPool::new(3, true);
        let blocks = pool.get_new_blocks(3).unwrap();
        let hashes: Vec<BlockHash> = (0..3).map(|i| BlockHash::new(None, &[i])).collect();
        pool.cache_full_blocks(&blocks, &hashes, 0..3);
        // Freed tail first, as the cache manager does: block 2 becomes the first to reuse.
        pool.free_blocks(blocks.iter().rev().copied());
        assert_eq!(pool.num_free_blocks(), 3);
        assert_eq!(pool.get_cached_block(&hashes[0]), Some(blocks[0]));
        let taken = pool.get_new_blocks(1).unwrap();
        assert_eq!(taken, vec![blocks[2]]);
        assert_eq!(pool.get_cached_block(&hashes[2]), None);
        // A hit on a free block pulls it out of the middle of the queue.
        pool.touch(&[blocks[0]]);
        assert_eq!(pool.num_free_blocks(), 1);
        assert_eq!(pool.get_new_blocks(2), None);
        pool.check_consistency().unwrap();
    }

    #[test]
    fn chained_hashes_depend_on_the_whole_prefix() {
        let mut a = Vec::new();
        extend_block_hashes(&mut a, &[1, 2, 3, 4, 5], 2, &[]);
        assert_eq!(a.len(), 2);
        let mut b = Vec::new();
        extend_block_hashes(&mut b, &[9, 9, 3, 4], 2, &[]);
        assert_ne!(a[1], b[1], "same block tokens after a different prefix must not match");
        let mut c = a[..1].to_vec();
        extend_block_hashes(&mut c, &[1, 2, 3, 4, 5, 6], 2, &[]);
        assert_eq!(&c[..2], &a[..]);
    }

    #[test]
    fn blocks_over_different_images_differ() {
        // Placeholders at positions 2..5 (blocks 1 and 2 of size 2); the first block precedes them.
        let tokens = [1, 2, 7, 7, 7, 3];
        let hashes = |image: u64| {
            let mut h = Vec::new();
            extend_block_hashes(&mut h, &tokens, 2, &[(2..5, image)]);
            h
        };
        let (a, b) = (hashes(10), hashes(11));
        assert_eq!(a[0], b[0], "the text before the image is shared");
        assert_ne!(a[1], b[1]);
        assert_ne!(a[2], b[2]);
        assert_eq!(hashes(10), a);
    }
}
