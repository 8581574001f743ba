//! Asynchronous events and timers (UCX `ucs_async`).
//!
//! | module | what it holds |
//! |---|---|
//! | [`event_set`] | [`EventSet`] over epoll, [`Events`] flags, [`EventFd`] wakeup |
//! | [`timerq`] | [`TimerQueue`], interval timers on caller-supplied (possibly virtual) time |
//! | [`block`] | [`BlockState`], the block/unblock protocol and its missed-event queue |
//! | [`context`] | [`AsyncContext`], which runs event and timer handlers on a background thread ([`AsyncMode::Thread`]) or inside [`AsyncContext::poll`] ([`AsyncMode::Poll`]) |
//!
//! Data flow: a descriptor becomes ready or a timer expires -> the context's thread (or a
//! `poll` caller) asks [`BlockState`] whether handlers may run -> the handler runs now, or its
//! event is queued as missed and replayed when the block ends.
//!
//! Under `--cfg loom` the context (threads, epoll loop) is compiled out; the loom tests drive
//! [`BlockState`] directly, which is the cross-thread logic the context relies on.

pub mod block;
#[cfg(not(loom))]
pub mod context;
pub mod event_set;
pub mod timerq;

pub use block::BlockState;
#[cfg(not(loom))]
pub use context::{AsyncContext, AsyncMode, BlockGuard, HandlerId};
pub use event_set::{EventFd, EventSet, Events, TimerFd, MAX_WAIT_EVENTS};
pub use timerq::TimerQueue;
