//! # ucp - Unified Communication Protocols
//!
//! The layer applications program against: a [`Context`] (features, `UCX_*` configuration,
//! resources), a [`Worker`] (progress, wakeup, the address peers connect to), [`Endpoint`]s
//! with wireup, MPI tag matching with eager and rendezvous protocols, [`Request`]s and futures,
//! remote memory access and atomics ([`RemoteKey`], `Endpoint::put_nbx` ...), active messages
//! (`Endpoint::am_send_nbx`, `Worker::set_am_recv_handler`), the stream API
//! (`Endpoint::stream_send_nbx` ...), and contiguous, iov and generic datatypes
//! ([`Datatype`], `ucp_dt_create_generic`) for all of them but remote memory access. It
//! discovers transports through `uct` and chooses among them by capability and performance
//! model; it never names a concrete transport.
//!
//! ## How it is built
//!
//! * A sans-IO protocol engine (`engine`) owns the requests, the tag matcher and every
//!   endpoint's protocol state. It takes events - a message arrived, a transmission went or was
//!   refused, a zero-copy operation completed, a peer died, time passed, the user posted an
//!   operation - and leaves work: transmissions for the driver to pull, and actions (run a
//!   completion's callbacks, build or connect an endpoint's lanes, check a peer). It calls no
//!   transport, clock or user callback; `sim` runs two of them on virtual time.
//! * Its parts: what every protocol shares (requests, endpoints, the driver's work); each
//!   family's state with its handlers (`tag`, `wireup`); the shared machinery as functions over
//!   the shared part (`proto`: one protocol selection, eager, rendezvous, the queue's service).
//! * A thin driver (`core`) owns the interfaces and transport endpoints and turns that work into
//!   uct calls, never holding the engine across one (a loop-back transport delivers inside the
//!   send call). A whole eager short or bcopy message on a ready endpoint goes straight to the
//!   transport, with no request.
//! * Wire formats are typed headers with strict decoders ([`wire`]); user memory enters
//!   through one `unsafe` constructor at the API boundary (`dt`); the public handles
//!   ([`worker`]) carry ids, never a reference into the engine.
//!
//! `docs/ucp.md` in the repository has the code map (object -> file) and the life of an
//! 8-byte and a 1 MiB message through the files.

pub(crate) mod am;
pub mod config;
pub mod context;
pub(crate) mod core;
pub(crate) mod dt;
pub(crate) mod engine;
pub mod mem;
pub(crate) mod proto;
pub mod request;
pub(crate) mod rma;
#[cfg(test)]
mod sim;
pub(crate) mod stream;
pub mod tag;
pub mod wire;
mod wireup;
pub mod worker;

pub use wireup::{address, lanes};

pub use address::{IfaceRecord, WorkerAddress};
pub use config::{AtomicMode, ContextConfig, RndvScheme, Thresh};
pub use context::{Context, ContextParams, Features};
pub use dt::{Datatype, GenericBuf, GenericDatatype, PackState, UnpackState};
pub use engine::ProtoCounts;
pub use mem::MemHandle;
pub use request::{Callback, CallbackFn, IoVec, RecvInfo, RequestFlags, RequestParam};
pub use tag::{Tag, FULL_MASK};
pub use worker::{
    block_on, AmData, AmHandlerFlags, AmMsg, AmRndv, AmSendFlags, AmoFuture, AtomicOp, CloseMode, ConnRequest,
    ConnectFuture, Endpoint, EpInfo, EventSource, LaneInfo, Listener, MemAttr, Message, Operand, ProgressDriver,
    RecvData, RecvFuture, RecvResult, RemoteKey, Request, SendData, SendFuture, StreamData, StreamRecvFlags,
    ThreadMode, Worker, WorkerParams, CONNECT_TIMEOUT,
};

pub use ucs::Status;
