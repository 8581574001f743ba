//! # ucp - Unified Communication Protocols
//!
//! The layer applications program against: context, worker, endpoints with wireup, MPI-grade tag
//! matching, eager/rendezvous protocols, RMA, atomics, active messages and stream. It discovers
//! transports through `uct` and chooses among them by capability and performance model; it never
//! names a concrete transport.

pub mod config;
pub mod context;
pub(crate) mod core;
pub(crate) mod dt;
pub(crate) mod engine;
pub mod mem;
pub(crate) mod proto;
pub mod request;
#[cfg(test)]
mod sim;
pub mod tag;
pub mod wire;
mod wireup;
pub mod worker;

pub use wireup::{address, lanes};

pub use address::{IfaceRecord, WorkerAddress};
pub use config::{ContextConfig, RndvScheme, Thresh};
pub use context::{Context, ContextParams, Features};
pub use mem::MemHandle;
pub use request::{Callback, CallbackFn, IoVec, RecvInfo, Request, RequestFlags, RequestParam};
pub use tag::{Tag, FULL_MASK};
pub use worker::{
    block_on, CloseMode, Endpoint, EpInfo, EventSource, LaneInfo, Message, ProgressDriver, RecvData, RecvFuture,
    RecvResult, SendData, SendFuture, ThreadMode, Worker, WorkerParams,
};

pub use ucs::Status;

/// How many messages each tag protocol carried on a worker, counted on the side that chose
/// the protocol (see [`Worker::proto_counts`]); for tests and diagnostics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProtoCounts {
    /// Eager short (sender).
    pub eager_short: u64,
    /// Eager bcopy in one fragment (sender).
    pub eager_bcopy: u64,
    /// Eager bcopy in several fragments (sender).
    pub eager_multi: u64,
    /// Synchronous eager (sender).
    pub eager_sync: u64,
    /// Eager zero-copy, one fragment or several (sender).
    pub eager_zcopy: u64,
    /// Rendezvous where the receiver got the data (receiver).
    pub rndv_get: u64,
    /// Rendezvous where the sender put the data (receiver).
    pub rndv_put: u64,
    /// Rendezvous with the data in active messages (receiver).
    pub rndv_am: u64,
    /// Messages that arrived before their receive was posted (receiver).
    pub unexpected: u64,
    /// Times an endpoint's queue parked on its AM lane until the transport had send resources
    /// again (sender; e.g. the peer's FIFO was full).
    pub parked: u64,
}
