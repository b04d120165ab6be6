//! The bound on work in flight (`--max-num-seqs` running plus `--max-queue` waiting), counted
//! in sequences (prompts × n), past which a new request gets 503 instead of an ever longer
//! queue.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::error::ApiError;
use crate::AppState;

pub struct Admission {
    in_flight: AtomicUsize,
    limit: usize,
}

/// Holds a request's sequences in the count until it is dropped (finished, failed or
/// disconnected).
pub struct Permit {
    state: Arc<AppState>,
    sequences: usize,
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.state.admission.in_flight.fetch_sub(self.sequences, Ordering::AcqRel);
    }
}

impl Admission {
    pub fn new(limit: usize) -> Admission {
        Admission { in_flight: AtomicUsize::new(0), limit: limit.max(1) }
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Counts `sequences` in, or refuses: 400 for a request larger than the whole bound (it
    /// could never be admitted), 503 while the bound is full.
    pub fn acquire(state: &Arc<AppState>, sequences: usize) -> Result<Permit, ApiError> {
        let admission = &state.admission;
        if sequences > admission.limit {
            return Err(ApiError::bad_request(format!(
                "This request asks for {sequences} sequences (prompts × n); the server accepts at most {} at once.",
                admission.limit
            )));
        }
        let mut current = admission.in_flight.load(Ordering::Acquire);
        loop {
            if current + sequences > admission.limit {
                tracing::warn!(in_flight = current, limit = admission.limit, "overloaded: rejecting request");
                return Err(ApiError::unavailable(format!(
                    "The server is overloaded ({current} sequences in flight, limit {}); retry later.",
                    admission.limit
                )));
            }
            match admission.in_flight.compare_exchange_weak(
                current,
                current + sequences,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Ok(Permit { state: state.clone(), sequences }),
                Err(actual) => current = actual,
            }
        }
    }
}
