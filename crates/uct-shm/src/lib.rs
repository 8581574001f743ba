//! # uct-shm - shared-memory transports
//!
//! Implements the `uct` traits for transports within one machine:
//!
//! | transport | device | what it does |
//! |---|---|---|
//! | `self` | `memory0` | loopback inside one process: handlers run inside the send call |
//! | `posix`, `sysv` | `memory` | a receive FIFO per interface in shared memory ([`mm`]) |
//!
//! `cma` single-copy arrives with the rest of the shared-memory issue.
//! Call [`register`] once to make the components visible to `uct` discovery.

pub mod mm;
pub mod self_;
mod sm;

/// Registers this crate's components with `uct` (idempotent).
pub fn register() {
    uct::register_component(&self_::COMPONENT);
    uct::register_component(&mm::POSIX);
    uct::register_component(&mm::SYSV);
}
