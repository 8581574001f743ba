//! # ucp - Unified Communication Protocols
//!
//! The layer applications program against: context, worker, endpoints with wireup, MPI-grade tag
//! matching, eager/rendezvous protocols, RMA, atomics, active messages and stream. It discovers
//! transports through `uct` and chooses among them by capability and performance model; it never
//! names a concrete transport. The protocol layer lands in a later issue; this crate currently
//! re-exports the layers it builds on.

pub use ucs::Status;
