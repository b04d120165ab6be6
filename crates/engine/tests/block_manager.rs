//! Property test of the KV cache manager over random request lifecycles: no leak, no double
//! free, reference counts equal to block-table membership, and prefix-cache hits that really
//! hold the prompt's tokens (checked against a shadow of what each slot was written with). In
//! hybrid mode every request also holds a recurrent-state slot, states are kept at block ends,
//! and a hit must restore the state of exactly the hit prefix.

use std::collections::HashMap;

use ferrite_engine::core::KvCacheManager;
use proptest::prelude::*;

const BLOCK: usize = 4;

#[derive(Debug, Clone)]
enum Op {
    /// A new request: a shared stem (prefix sharing) plus a random tail; prefill in chunks.
    Add {
        stem: usize,
        tail: Vec<u32>,
        chunk: usize,
        skip_cache: bool,
    },
    /// Advance request `i % live`: the next prefill chunk, or one decoded token.
    Step {
        i: usize,
        chunk: usize,
        token: u32,
    },
    Free {
        i: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0usize..3, prop::collection::vec(0u32..3, 1..20), 1usize..12, prop::bool::weighted(0.1))
            .prop_map(|(stem, tail, chunk, skip_cache)| Op::Add { stem, tail, chunk, skip_cache }),
        (0usize..64, 1usize..12, 0u32..3).prop_map(|(i, chunk, token)| Op::Step { i, chunk, token }),
        (0usize..64).prop_map(|i| Op::Free { i }),
    ]
}

struct Live {
    id: u64,
    tokens: Vec<u32>,
    computed: usize,
}

struct Model {
    kv: KvCacheManager,
    live: Vec<Live>,
    /// What each (block, offset) slot was last written with: its token and, since keys and
    /// values depend on everything before it, the whole prefix up to it.
    shadow: HashMap<(u32, usize), Vec<u32>>,
    /// Hybrid mode: the prefix each snapshot slot's state follows, and the snapshots the current
    /// step is writing (visible once committed, as the engine commits before its next step).
    kept: HashMap<usize, Vec<u32>>,
    writing: Vec<(usize, Vec<u32>)>,
}

impl Model {
    /// Allocates and "computes" `n` more tokens of `r`, writing them to the shadow slots.
    fn compute(&mut self, idx: usize, n: usize, hits: &[u32], hit_tokens: usize) -> bool {
        let r = &self.live[idx];
        let start = r.computed + hit_tokens;
        if self.kv.allocate_slots(r.id, &r.tokens, r.computed, n, hits).is_none() {
            return false;
        }
        let table = self.kv.block_ids(r.id).to_vec();
        assert!(table.len() * BLOCK >= start + n, "block table too short");
        for p in start..start + n {
            self.shadow.insert((table[p / BLOCK], p % BLOCK), r.tokens[..=p].to_vec());
        }
        let (id, end) = (r.id, start + n);
        if end.is_multiple_of(BLOCK) {
            if let Some(slot) = self.kv.reserve_state_snapshot(id, end) {
                let prefix = self.live[idx].tokens[..end].to_vec();
                self.writing.push((slot, prefix));
            }
        }
        self.live[idx].computed = end;
        true
    }

    fn commit(&mut self) {
        self.kv.commit_state_snapshots();
        for (slot, prefix) in self.writing.drain(..) {
            self.kept.insert(slot, prefix);
        }
    }
}

/// `hybrid`: `(state slots, snapshot slots)`.
fn run(num_blocks: usize, hybrid: Option<(usize, usize)>, ops: Vec<Op>) {
    let stems: [Vec<u32>; 3] = [vec![1; 9], (0..13).map(|i| i % 3).collect(), vec![]];
    let mut kv = KvCacheManager::new(num_blocks, BLOCK, 4096, true);
    if let Some((slots, snapshots)) = hybrid {
        kv = kv.with_state_slots(slots).with_state_snapshots(snapshots);
    }
    let mut m = Model { kv, live: Vec::new(), shadow: HashMap::new(), kept: HashMap::new(), writing: Vec::new() };
    let mut next_id = 0;
    for op in ops {
        m.commit();
        match op {
            Op::Add { stem, tail, chunk, skip_cache } => {
                let mut tokens = stems[stem].clone();
                tokens.extend(tail);
                let id = next_id;
                next_id += 1;
                let (hits, hit_tokens) = m.kv.get_computed_blocks(id, &tokens, skip_cache);
                assert!(hit_tokens < tokens.len(), "the last token must stay uncached");
                for (b, &block) in hits.iter().enumerate() {
                    for o in 0..BLOCK {
                        let p = b * BLOCK + o;
                        assert_eq!(
                            m.shadow.get(&(block, o)).map(Vec::as_slice),
                            Some(&tokens[..=p]),
                            "hit block {block} holds another prefix"
                        );
                    }
                }
                if hybrid.is_some() && hit_tokens > 0 {
                    let slot = m.kv.take_state_restore(id).expect("a hybrid hit restores a kept state");
                    assert_eq!(
                        m.kept.get(&slot),
                        Some(&tokens[..hit_tokens].to_vec()),
                        "restored another prefix's state"
                    );
                }
                m.live.push(Live { id, tokens, computed: 0 });
                let idx = m.live.len() - 1;
                let n = chunk.min(m.live[idx].tokens.len() - hit_tokens);
                if !m.compute(idx, n, &hits, hit_tokens) {
                    m.kv.free(id);
                    m.live.pop();
                }
            }
            Op::Step { i, chunk, token } if !m.live.is_empty() => {
                let idx = i % m.live.len();
                let r = &mut m.live[idx];
                if r.computed == r.tokens.len() {
                    r.tokens.push(token);
                }
                let n = chunk.min(r.tokens.len() - r.computed);
                if !m.compute(idx, n, &[], 0) {
                    // Preempted: blocks back, state dropped (it would recompute from scratch).
                    let r = m.live.swap_remove(idx);
                    m.kv.free(r.id);
                }
            }
            Op::Free { i } if !m.live.is_empty() => {
                let r = m.live.swap_remove(i % m.live.len());
                m.kv.free(r.id);
            }
            _ => {}
        }
        m.kv.check_consistency().unwrap();
        let held: usize = m.live.iter().map(|r| m.kv.block_ids(r.id).len()).sum();
        assert!(num_blocks - m.kv.num_free_blocks() <= held, "blocks in use beyond the block tables");
    }
    for r in std::mem::take(&mut m.live) {
        m.kv.free(r.id);
    }
    m.kv.check_consistency().unwrap();
    assert_eq!(m.kv.num_free_blocks(), num_blocks, "blocks leaked");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn block_manager_keeps_its_invariants(num_blocks in 1usize..24, ops in prop::collection::vec(op(), 1..80)) {
        run(num_blocks, None, ops);
    }

    #[test]
    fn hybrid_block_manager_keeps_its_invariants(
        num_blocks in 1usize..24,
        slots in 1usize..4,
        snapshots in 0usize..4,
        ops in prop::collection::vec(op(), 1..80),
    ) {
        run(num_blocks, Some((slots, snapshots)), ops);
    }
}

/// A hybrid model's hits end where a recurrent state was kept: a state becomes a hit only after
/// the step that writes it, a shared prefix without a kept state is no hit, and the least
/// recently used state makes room for a new one.
#[test]
fn hybrid_hits_end_where_a_state_was_kept() {
    let mut kv = KvCacheManager::new(64, 16, 4096, true).with_state_slots(2).with_state_snapshots(1);
    let first: Vec<u32> = (0..100).collect();
    assert_eq!(kv.get_computed_blocks(1, &first, false).1, 0);
    kv.allocate_slots(1, &first, 0, 96, &[]).unwrap();
    assert_eq!(kv.reserve_state_snapshot(1, 96), Some(2), "the snapshot slot follows the two working slots");
    assert_eq!(kv.reserve_state_snapshot(1, 96), None, "one state per boundary");
    assert_eq!(kv.get_computed_blocks(2, &first, false).1, 0, "a state is no hit before its step ran");
    kv.commit_state_snapshots();
    let (hits, n) = kv.get_computed_blocks(2, &first, false);
    assert_eq!((hits.len(), n, kv.take_state_restore(2)), (6, 96, Some(2)));
    // The first 64 tokens' blocks are cached, but no state was kept after them.
    let other: Vec<u32> = (0..64).chain(1000..1050).collect();
    assert_eq!(kv.get_computed_blocks(3, &other, false).1, 0);
    kv.allocate_slots(3, &other, 0, 112, &[]).unwrap();
    assert_eq!(kv.reserve_state_snapshot(3, 112), Some(2), "the only snapshot slot is reused");
    kv.commit_state_snapshots();
    assert_eq!(kv.get_computed_blocks(4, &first, false).1, 0, "the evicted state is no hit");
    assert_eq!(kv.get_computed_blocks(5, &other, false).1, 112);
    kv.free(1);
    kv.free(3);
    kv.check_consistency().unwrap();
}
