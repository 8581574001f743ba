//! Memory-mapped transports (`posix`, `sysv`): a receive FIFO per interface in a shared segment.
//!
//! Work in progress for the shared-memory issue: the FIFO protocol ([`fifo`]) is implemented
//! and tested across threads; segments, interfaces and endpoints follow.

pub mod config;
pub mod fifo;
pub mod segment;
