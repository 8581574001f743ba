//! # ucs - Unified Communication Services
//!
//! The bottom layer of ucx-rs, mirroring UCX's UCS: services every upper layer (uct transports,
//! ucp protocols) shares, with no knowledge of networking.
//!
//! | module | what it holds |
//! |---|---|
//! | [`status`] | [`Status`] (one variant per `ucs_status_t` code), [`Outcome`] / [`OpResult`] for non-blocking calls |
//! | [`queue`] | FIFO queue that allows removal while iterating |
//! | [`arbiter`] | fair round-robin over groups of pending elements (one group per endpoint) |
//! | [`mpool`] | fixed-size object pool with chunked growth, no allocation once warm |
//! | [`idtable`] | index -> object table with O(1) insert and remove |
//! | [`callbackq`] | progress callback queue: add/remove from any thread, dispatch by the owner |
//! | [`fraglist`] | 16-bit serial numbers with wrap-around and an ordered fragment list (UD reliability) |
//! | [`async_`] | epoll event set, timer queue, and the async context that runs their handlers |
//! | [`config`] | declarative `UCX_*` environment configuration with UCX's value syntax |
//! | [`log`] | `UCX_LOG_LEVEL` names and their `tracing` levels |
//! | [`memory`] | byte copies tuned for small messages |
//! | [`rcache`] | memory registration cache: merge, LRU limits, invalidation on unmap |
//! | [`memhooks`] | process-wide unmap events from patched libc functions (UCX's UCM) |
//! | [`time`] | fast monotonic clock |
//! | [`sync`] | atomics/locks facade that loom replaces in model-checking builds |
//!
//! Data flows upward only: nothing here depends on `uct` or `ucp`. Structures come in a
//! single-thread version; the cross-thread ones ([`callbackq`], [`async_`]) take their atomics
//! from [`sync`] so the loom tests check the real code.

pub mod arbiter;
pub mod async_;
pub mod callbackq;
pub mod config;
pub mod fraglist;
pub mod idtable;
pub mod log;
pub mod memhooks;
pub mod memory;
pub mod mpool;
pub mod queue;
pub mod rcache;
pub mod status;
pub mod sync;
pub mod testing;
pub mod time;

pub use status::{op_result, OpResult, Outcome, Status, UcsResult};

/// Thread-safety level requested for a worker or context, as `ucs_thread_mode_t`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum ThreadMode {
    /// Only one thread ever uses the object.
    #[default]
    Single,
    /// Several threads may use it, never at the same time.
    Serialized,
    /// Several threads may use it concurrently.
    Multi,
}
