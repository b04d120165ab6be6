//! The engine core's bookkeeping, each part testable alone: the block pool, the KV cache manager
//! on top of it, the request state and the scheduler that turns waiting and running requests
//! into a [`SchedulerOutput`] for the model runner.

pub mod block_pool;
pub mod kv_cache_manager;
pub mod request;
pub mod scheduler;

/// The engine's id of one sequence (each of a request's `n` sequences has its own).
pub type ReqId = u64;

pub use block_pool::{BlockHash, BlockId, BlockPool};
pub use kv_cache_manager::{KvCacheManager, PrefixCacheStats};
pub use request::{Request, RequestStatus};
pub use scheduler::{CachedRequestData, EngineCoreOutput, NewRequestData, Scheduler, SchedulerConfig, SchedulerOutput};
