//! The protocol machinery every communication family shares (UCX's `src/ucp/proto` and
//! `rndv`): how an operation's data goes, chosen once per operation by [`select()`]; the eager
//! protocols (short, bcopy in one fragment or several, zero-copy) in [`eager`]; rendezvous
//! (RTS, then get_zcopy, put_zcopy or active-message fragments, then ATS/ATP) in [`rndv`]; the
//! switch points of an endpoint in [`config`]; sends with a request in [`send`]. A family (tag
//! matching, active messages) supplies its headers and its matching or dispatch; the machinery
//! moves the bytes.
//!
//! Everything here is part of the sans-IO engine: it changes protocol state and describes
//! transmissions; the driver makes them. [`pending`] serves an endpoint's queue: it asks
//! each waiting operation's protocol for its next transmission and hands it the outcome.

pub(crate) mod config;
pub(crate) mod eager;
pub(crate) mod pending;
pub(crate) mod rndv;
pub(crate) mod select;
pub(crate) mod send;

pub(crate) use config::{EpConfig, LaneModels, RndvCaps};
pub(crate) use select::{select, Force, Op, OpKind, Proto};
