//! # tests - cross-backend integration tests
//!
//! Integration tests that run the same checks over every transport resource this machine
//! provides: today `self`, `posix`, `sysv` and `cma`; InfiniBand joins as its crate implements it.
//! The tests live in `tests/tests/`; this library holds what they share.

use uct::conformance::Options;

/// Registers every transport crate of the workspace with `uct`.
pub fn register_all_transports() {
    uct_shm::register();
}

/// Conformance options for a resource, including the overrides that make its send resources
/// scarce for the pending checks.
pub fn options_for(resource: &str) -> Options {
    let opts = Options::new(resource);
    match resource.split('/').next() {
        Some("self") => opts.with_scarce_config("RX_MAX_BUFS", "16"),
        Some("posix" | "sysv") => opts.with_scarce_config("FIFO_SIZE", "8"),
        _ => opts,
    }
}
