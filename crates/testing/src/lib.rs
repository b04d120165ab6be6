//! Test support shared by the crates' integration tests, kept out of their public APIs: the
//! parity gate against the oracle fixtures.

pub mod gate;
