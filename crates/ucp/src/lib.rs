//! # ucp - Unified Communication Protocols
//!
//! The layer applications program against: context, worker, endpoints with wireup, MPI-grade tag
//! matching, eager/rendezvous protocols, RMA, atomics, active messages and stream. It discovers
//! transports through `uct` and chooses among them by capability and performance model; it never
//! names a concrete transport.

pub mod address;
pub mod config;
pub mod context;
pub mod lanes;
pub mod tag;
pub mod worker;

pub use address::{IfaceRecord, WorkerAddress};
pub use config::{ContextConfig, RndvScheme, Thresh};
pub use context::{Context, ContextParams, Features};
pub use worker::{Worker, WorkerParams};

pub use ucs::Status;
