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
pub use engine::ProtoCounts;
pub use mem::MemHandle;
pub use request::{Callback, CallbackFn, IoVec, RecvInfo, RequestFlags, RequestParam};
pub use tag::{Tag, FULL_MASK};
pub use worker::{
    block_on, CloseMode, Endpoint, EpInfo, EventSource, LaneInfo, Message, ProgressDriver, RecvData, RecvFuture,
    RecvResult, Request, SendData, SendFuture, ThreadMode, Worker, WorkerParams,
};

pub use ucs::Status;
