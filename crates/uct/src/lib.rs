//! # uct - Unified Communication Transport API
//!
//! The transport layer of ucx-rs, mirroring UCX's `uct.h`: a small set of traits every
//! transport (shared memory, InfiniBand, TCP) implements, so that protocols above use one API.
//!
//! ```text
//! Component --md_open--> Md --iface_open(worker)--> Iface --ep_create--> Ep
//!  (posix)               (registration, rkeys)      (AM handlers,         (put/get, am,
//!                                                     progress, events)     atomics, flush)
//! ```
//!
//! * [`Component`] / [`Md`]: discovery ([`query_resources`], [`find_resource`] by `tl/dev` name),
//!   memory registration and allocation ([`MemH`]), remote keys packed as bytes and unpacked
//!   with validation ([`RemoteKey`]).
//! * [`Worker`]: the progress engine interfaces register with.
//! * [`Iface`]: one transport on one device: capabilities and performance model
//!   ([`IfaceAttr`]), active-message handlers ([`AmTable`], [`AmRecv`], [`AmDesc`]), addresses,
//!   reachability, flush, wakeup (`event_fd`/`event_arm`), hardware tag matching. What every
//!   interface has - attributes, AM table, pending queue, progress registration, failure
//!   handler, the cleanup when it goes - is one [`BaseIface`] each transport keeps.
//! * [`Ep`]: every operation family of the UCT design - put/get short/bcopy/zcopy, active
//!   messages short/bcopy/zcopy with ids 0..32, 32/64-bit atomics, flush, fence, pending,
//!   peer check, to-ep connection, and the tag-offload family.
//!
//! ## The contract
//! * `Ok(Outcome::Done(_))`: completed locally, buffers reusable, no callback.
//! * `Ok(Outcome::InProgress)`: started; the [`Completion`] passed along (counter + callback +
//!   first error, shareable by many operations) fires from a later progress call.
//! * `Ok(Outcome::NoResource)`: nothing started; queue a [`PendingReq`] with
//!   [`Ep::pending_add`] and retry from its callback. Pending requests are served round robin
//!   across endpoints ([`PendingQueue`]).
//! * `Err(status)`: failed; nothing was started.
//! * Short and bcopy operations never return `InProgress`. Remote completion is known only
//!   through flush. Send completions are reported in order.
//! * AM handlers may send, but not progress; they may keep a message ([`AmRecv::keep`]).
//!
//! Objects of this crate are single-threaded (`!Send`): an interface and its endpoints share
//! state without locks, as in UCX where the worker serialises access. Upper layers that offer
//! multi-threaded modes wrap a whole worker in a lock.
//!
//! With the `conformance` feature, [`conformance`] provides reusable checks that every
//! transport crate runs against each transport it provides.

mod am;
mod attr;
mod base;
pub mod cm;
mod completion;
mod iface;
mod md;
mod mem;
mod params;
mod pending;
mod tag;
mod worker;

#[cfg(feature = "conformance")]
pub mod conformance;

pub use am::{check_am_id, check_length, AmDesc, AmHandler, AmRecv, AmTable, AM_ID_MAX};
pub use attr::{
    AtomicCaps, AtomicOp, AtomicOps, BandwidthModel, DeviceType, EventFlags, IfaceAttr, IfaceFlags, LinearFunc, MdAttr,
    MdFlags, MemAccess, OpCaps, TagCaps, TlResource,
};
pub use base::BaseIface;
pub use cm::{Cm, CmClient, CmClientState, CmConnRequest, CmListener};
pub use completion::Completion;
pub use iface::{
    Ep, EpConnect, EpParams, ErrHandler, FlushFlags, Iface, IfaceParams, PackFn, ProgressFlags, SendFlags,
};
pub use md::{
    component, components, find_resource, iface_open_by_name, query_resources, register_component,
    unavailable_components, Component, Md, ResourceDesc,
};
pub use mem::{iov_total_len, Iov, MemH, MemRegion, PackedKey, RemoteKey};
pub use pending::{PendingHandle, PendingOutcome, PendingQueue, PendingReq, Resources};
pub use tag::{RndvOp, Tag, TagCompletedFn, TagHandlers, TagRecvContext, TagRndvFn, TagUnexpEager, TagUnexpRndv};
pub use ucs::{OpResult, Outcome, Status, UcsResult};
pub use worker::{ProgressRegistration, Worker};
