//! # tests - cross-backend integration tests
//!
//! Integration tests that run the same checks over every backend this machine provides (today
//! `self`; shared memory and InfiniBand as they land). The tests live in `tests/tests/`; this
//! library holds helpers they share.

/// Registers every transport crate of the workspace with `uct`.
pub fn register_all_transports() {
    uct_shm::register();
}
