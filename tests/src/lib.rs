//! # tests - integration tests across backends and processes
//!
//! Integration tests that run the same checks over every transport resource this machine
//! provides, and the tests that need a second process. The second process is one of this
//! package's programs, which the tests start through Cargo's `CARGO_BIN_EXE_<name>`:
//!
//! | program | what it is |
//! |---|---|
//! | `kit-agent` | the uct conformance kit's agent ([`uct::conformance::serve_agent`]) |
//! | `shm-peer` | a uct shared-memory peer: sender, receiver, target memory (`shm_two_process`) |
//! | `ucp-peer` | a ucp worker: a tag sender driven by commands, a peer that dies in a rendezvous, an echoing peer that sleeps in `wait`, a client by socket address |
//!
//! Every peer prints the lines meant for the test prefixed with [`peer::PREFIX`] and reads its
//! commands from stdin; the tests read them through [`peer::Peer`], always with a time limit.
//! This library holds what the programs and the tests share.

pub mod generic;
pub mod netns;
pub mod peer;
pub mod sockaddr;
pub mod stream;
pub mod tag;
pub mod text;
pub mod wakeup;

use uct::conformance::Options;

/// Registers every transport crate of the workspace that the cross-backend tests cover.
pub fn register_all_transports() {
    uct_shm::register();
    uct_tcp::register();
}

/// Conformance options for a resource, including the overrides that make its send resources
/// scarce for the pending checks.
pub fn options_for(resource: &str) -> Options {
    let opts = Options::new(resource);
    match resource.split('/').next() {
        Some("self") => opts.with_scarce_config("RX_MAX_BUFS", "16"),
        Some("posix" | "sysv") => opts.with_scarce_config("FIFO_SIZE", "8"),
        // Small socket buffers, so that sends run out of room without progress.
        Some("tcp") => opts
            .with_scarce_config("TX_SEG_SIZE", "64")
            .with_scarce_config("SNDBUF", "1k")
            .with_scarce_config("RCVBUF", "1k"),
        _ => opts,
    }
}
