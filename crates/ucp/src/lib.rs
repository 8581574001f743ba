//! # ucp - Unified Communication Protocols
//!
//! The layer applications program against: context, worker, endpoints with wireup, MPI-grade tag
//! matching, eager/rendezvous protocols, RMA, atomics, active messages and stream. It discovers
//! transports through `uct` and chooses among them by capability and performance model; it never
//! names a concrete transport.

pub mod address;
pub mod config;
pub mod context;
pub(crate) mod core;
pub(crate) mod ep;
pub mod lanes;
pub mod mem;
pub mod request;
pub mod tag;
pub mod wire;
pub mod worker;

pub use address::{IfaceRecord, WorkerAddress};
pub use config::{ContextConfig, RndvScheme, Thresh};
pub use context::{Context, ContextParams, Features};
pub use ep::{EpInfo, LaneInfo};
pub use mem::MemHandle;
pub use request::{Callback, IoVec, RecvInfo, Request, RequestFlags, RequestParam};
pub use tag::{Tag, FULL_MASK};
pub use worker::{
    block_on, CloseMode, Endpoint, Message, RecvData, RecvFuture, RecvResult, SendData, SendFuture, ThreadMode,
    Worker, WorkerParams,
};

pub use ucs::Status;
