//! # uct-shm - shared-memory transports
//!
//! Implements the `uct` traits for transports within one machine:
//!
//! | transport | device | what it does |
//! |---|---|---|
//! | `self` | `memory0` | loopback inside one process: handlers run inside the send call |
//! | `posix`, `sysv` | `memory` | a receive FIFO per interface in shared memory ([`mm`]) |
//!
//! | `cma` | `memory` | single-copy put/get zcopy with `process_vm_writev`/`readv` ([`cma`]) |
//! Call [`register`] once to make the components visible to `uct` discovery.

pub mod cma;
pub mod mm;
pub mod self_;
mod sm;

/// Registers this crate's components with `uct` (idempotent).
pub fn register() {
    uct::register_component(&self_::COMPONENT);
    uct::register_component(&mm::POSIX);
    uct::register_component(&mm::SYSV);
    uct::register_component(&cma::COMPONENT);
}
