//! Vision-encoder outputs by content, as vLLM's encoder cache keeps them: requests that bring the
//! same image or video (the sequences of an `n > 1` request, a conversation resent with one more
//! turn, the same picture in several prompts) share one encoding. An entry a request still reads
//! stays; entries nothing reads are kept while their rows fit the capacity, the least recently
//! used evicted first.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use ferrite_models::Encoded;

use crate::params::VisualInput;

/// What identifies an encoding: the item's content hash, its grid and its kind.
pub(crate) type EncoderKey = (u64, [usize; 3], &'static str);

/// The runner's cache, which the scheduler reads to charge only encodings not at hand.
pub type SharedEncoderCache = Arc<Mutex<EncoderCache>>;

/// Encodings made and encodings served from the cache.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EncoderCacheStats {
    pub encoded: u64,
    pub hits: u64,
}

#[derive(Debug)]
pub struct EncoderCache {
    entries: HashMap<EncoderKey, Entry>,
    /// Embedding rows kept for items no request reads any more.
    capacity_rows: usize,
    clock: u64,
    pub(crate) stats: EncoderCacheStats,
}

#[derive(Debug)]
struct Entry {
    encoded: Arc<Encoded>,
    last_used: u64,
}

impl EncoderCache {
    pub(crate) fn new(capacity_rows: usize) -> EncoderCache {
        EncoderCache { entries: HashMap::new(), capacity_rows, clock: 0, stats: EncoderCacheStats::default() }
    }

    /// What identifies `item`'s encoding.
    pub(crate) fn key(item: &VisualInput) -> EncoderKey {
        (item.hash, item.grid_thw, item.visual.modality())
    }

    /// Whether the encoding of the item with `key` is at hand.
    pub(crate) fn contains(&self, key: &EncoderKey) -> bool {
        self.entries.contains_key(key)
    }

    /// The encoding of `item`: the cached one, or `encode`'s, kept for later readers.
    pub(crate) fn get_or_encode<E>(
        &mut self,
        item: &VisualInput,
        encode: impl FnOnce() -> Result<Encoded, E>,
    ) -> Result<Arc<Encoded>, E> {
        self.clock += 1;
        let key = Self::key(item);
        if let Some(entry) = self.entries.get_mut(&key) {
            entry.last_used = self.clock;
            self.stats.hits += 1;
            return Ok(entry.encoded.clone());
        }
        let encoded = Arc::new(encode()?);
        self.stats.encoded += 1;
        self.make_room(encoded.embeddings.rows());
        self.entries.insert(key, Entry { encoded: encoded.clone(), last_used: self.clock });
        Ok(encoded)
    }

    /// Drops the least recently used entries no request holds until they and an entry of
    /// `incoming` rows (unread once its readers are done) fit the capacity.
    fn make_room(&mut self, incoming: usize) {
        let rows = |e: &Entry| e.encoded.embeddings.rows();
        let mut unread: Vec<(u64, EncoderKey, usize)> = self
            .entries
            .iter()
            .filter(|(_, e)| Arc::strong_count(&e.encoded) == 1)
            .map(|(key, e)| (e.last_used, *key, rows(e)))
            .collect();
        let mut kept: usize = unread.iter().map(|u| u.2).sum();
        unread.sort_unstable_by_key(|u| u.0);
        for (_, key, rows) in unread {
            if kept + incoming <= self.capacity_rows {
                break;
            }
            self.entries.remove(&key);
            kept -= rows;
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferrite_models::Visual;
    use ferrite_tensor::Tensor;

    fn item(hash: u64) -> VisualInput {
        VisualInput { visual: Visual::Image, pixel_values: vec![0.0; 4].into(), grid_thw: [1, 2, 2], hash }
    }

    fn encoding(rows: usize) -> Result<Encoded, String> {
        Ok(Encoded { embeddings: Tensor::from_f32(vec![0.5; rows * 2], &[rows, 2]).unwrap(), deepstack: Vec::new() })
    }

    #[test]
    fn the_same_content_is_encoded_once() {
        let mut cache = EncoderCache::new(100);
        let first = cache.get_or_encode(&item(1), || encoding(4)).unwrap();
        let again = cache.get_or_encode(&item(1), || -> Result<Encoded, String> { panic!("encoded twice") }).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        cache.get_or_encode(&item(2), || encoding(4)).unwrap();
        assert_eq!(cache.stats, EncoderCacheStats { encoded: 2, hits: 1 });
        // A failed encoding leaves nothing behind.
        assert!(cache.get_or_encode(&item(3), || Err("bad pixels".to_string())).is_err());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn unread_entries_are_evicted_oldest_first_and_read_ones_stay() {
        let mut cache = EncoderCache::new(8);
        let held = cache.get_or_encode(&item(1), || encoding(6)).unwrap();
        drop(cache.get_or_encode(&item(2), || encoding(4)).unwrap());
        drop(cache.get_or_encode(&item(3), || encoding(4)).unwrap());
        // 2 and 3 are unread (8 rows, the capacity); 1 is held and does not count.
        assert_eq!(cache.len(), 3);
        drop(cache.get_or_encode(&item(4), || encoding(4)).unwrap());
        // 4 needs room: 2, the least recently used, goes; the held 1 stays.
        assert_eq!(cache.len(), 3);
        cache.get_or_encode(&item(3), || -> Result<Encoded, String> { panic!("3 was kept") }).unwrap();
        cache.get_or_encode(&item(1), || -> Result<Encoded, String> { panic!("1 is held") }).unwrap();
        cache.get_or_encode(&item(2), || encoding(4)).unwrap();
        assert_eq!(cache.stats.encoded, 5);
        drop(held);
    }
}
