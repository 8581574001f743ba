//! Interfaces (`uct_iface_h`) and endpoints (`uct_ep_h`): the traits every transport implements.
//!
//! Every method has a default that returns `Unsupported`, so a transport implements exactly the
//! families it advertises in [`IfaceAttr::flags`] and nothing breaks when new families are added.
//!
//! Return values follow the transport contract (see the crate docs): `Ok(Outcome::Done(_))`
//! completed now; `Ok(Outcome::InProgress)` started, the completion fires later;
//! `Ok(Outcome::NoResource)` nothing started, retry (e.g. from a pending request); `Err(status)`
//! failed. Short and bcopy operations never return `InProgress`.

use std::os::fd::RawFd;
use std::rc::Rc;

use bitflags::bitflags;
use ucs::{OpResult, Status, UcsResult};

use crate::am::AmHandler;
use crate::attr::{AtomicOp, EventFlags, IfaceAttr};
use crate::base::BaseIface;
use crate::completion::Completion;
use crate::mem::{Iov, RemoteKey};
pub use crate::params::{ErrHandler, IfaceParams};
use crate::pending::PendingHandle;
use crate::tag::{RndvOp, Tag, TagRecvContext};

bitflags! {
    /// Flush semantics (`UCT_FLUSH_FLAG_*`). The empty set is `LOCAL`.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct FlushFlags: u32 {
        /// Best effort to cancel outstanding operations; they complete with `Canceled`.
        const CANCEL = 1 << 0;
        /// Operations are complete at the target too (remote completion).
        const REMOTE = 1 << 1;
    }
}

impl FlushFlags {
    /// Local completion only (`UCT_FLUSH_FLAG_LOCAL`).
    pub const LOCAL: FlushFlags = FlushFlags::empty();
}

bitflags! {
    /// Send flags (`UCT_SEND_FLAG_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct SendFlags: u32 {
        /// Raise a receive event on the remote side (`RECV_SIG`).
        const SIGNALED = 1 << 0;
        /// Check that the peer is alive before sending.
        const PEER_CHECK = 1 << 1;
    }
}

bitflags! {
    /// What progress is enabled for (`UCT_PROGRESS_*`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct ProgressFlags: u32 {
        /// Send completions and pending requests.
        const SEND = 1 << 0;
        /// Receives.
        const RECV = 1 << 1;
        /// Thread-safe enable/disable.
        const THREAD_SAFE = 1 << 7;
    }
}

/// How a new endpoint connects.
#[derive(Clone, Copy, Debug)]
pub enum EpConnect<'a> {
    /// To a remote interface (transports with `CONNECT_TO_IFACE`).
    ToIface {
        /// The peer's device address.
        dev_addr: &'a [u8],
        /// The peer's interface address.
        iface_addr: &'a [u8],
    },
    /// Unconnected; connect later with [`Ep::connect_to_ep`] (transports with `CONNECT_TO_EP`).
    ToEp,
}

/// Parameters for creating an endpoint (`uct_ep_params_t`).
#[derive(Clone, Copy, Debug)]
pub struct EpParams<'a> {
    /// How to connect.
    pub connect: EpConnect<'a>,
    /// Value passed to the interface's error handler when this endpoint fails.
    pub user_data: u64,
}

impl<'a> EpParams<'a> {
    /// An endpoint to a remote interface.
    pub fn to_iface(dev_addr: &'a [u8], iface_addr: &'a [u8]) -> Self {
        EpParams { connect: EpConnect::ToIface { dev_addr, iface_addr }, user_data: 0 }
    }

    /// An unconnected endpoint for to-ep connection.
    pub fn to_ep() -> Self {
        EpParams { connect: EpConnect::ToEp, user_data: 0 }
    }

    /// Sets the error-handler value.
    pub fn with_user_data(mut self, user_data: u64) -> Self {
        self.user_data = user_data;
        self
    }
}

/// A packing callback for bcopy operations: fills the transport buffer, returns bytes written.
pub type PackFn<'a> = &'a mut dyn FnMut(&mut [u8]) -> usize;

fn unsupported<T>() -> UcsResult<T> {
    Err(Status::Unsupported)
}

/// A communication interface on one device, opened on a [`crate::Worker`].
pub trait Iface {
    /// The part every interface has ([`BaseIface`]); the defaults below use it.
    fn base(&self) -> &BaseIface;

    /// Capabilities and performance model.
    fn attr(&self) -> &IfaceAttr {
        &self.base().attr
    }

    /// Progresses receives, send completions and pending requests; returns the number of events.
    fn progress(&self) -> usize;

    /// Registers this interface's progress with its worker.
    fn progress_enable(&self, flags: ProgressFlags);

    /// Unregisters this interface's progress from its worker.
    fn progress_disable(&self, flags: ProgressFlags) {
        let _ = flags;
        self.base().progress.disable();
    }

    /// Sets (or clears, with `None`) the handler of active message `id` (0..32).
    fn set_am_handler(&self, id: u8, handler: Option<AmHandler>) -> UcsResult<()> {
        self.base().am.set(id, handler)
    }

    /// The device address.
    fn device_address(&self) -> Vec<u8>;

    /// The interface address (empty for transports that connect to endpoints only).
    fn iface_address(&self) -> Vec<u8>;

    /// True when an endpoint of this interface can reach the given peer addresses. Malformed
    /// addresses are unreachable, never an error.
    fn is_reachable(&self, dev_addr: &[u8], iface_addr: Option<&[u8]>) -> bool;

    /// Creates an endpoint.
    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>>;

    /// Flushes every endpoint of the interface.
    fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult;

    /// Orders operations issued before the fence before those issued after it.
    fn fence(&self) -> UcsResult<()> {
        Ok(())
    }

    /// The file descriptor that becomes readable when an armed event happens.
    fn event_fd(&self) -> UcsResult<RawFd> {
        unsupported()
    }

    /// Arms `events`; `Err(Busy)` when such events are already pending (progress first).
    fn event_arm(&self, events: EventFlags) -> UcsResult<()> {
        let _ = events;
        unsupported()
    }

    /// Posts a receive to the hardware tag-matching list.
    ///
    /// # Safety
    /// The iov buffers must stay valid until `ctx.completed` runs or the receive is cancelled.
    unsafe fn tag_recv_zcopy(
        &self,
        tag: Tag,
        tag_mask: Tag,
        iov: &[Iov<'_>],
        ctx: Rc<TagRecvContext>,
    ) -> UcsResult<()> {
        let _ = (tag, tag_mask, iov, ctx);
        unsupported()
    }

    /// Cancels a posted receive; with `force` its completion is not reported.
    fn tag_recv_cancel(&self, ctx: &Rc<TagRecvContext>, force: bool) -> UcsResult<()> {
        let _ = (ctx, force);
        unsupported()
    }
}

/// A connection to a peer interface or endpoint.
///
/// Remote addresses are checked against the remote key's region: an access outside it fails
/// with `OutOfRange` and touches nothing.
#[allow(clippy::too_many_arguments)]
pub trait Ep {
    /// Writes `data` to remote memory.
    fn put_short(&self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        let _ = (data, remote_addr, rkey);
        unsupported()
    }

    /// Writes what `pack` produces to remote memory; returns the length.
    fn put_bcopy(&self, pack: PackFn<'_>, remote_addr: u64, rkey: &RemoteKey) -> OpResult<usize> {
        let _ = (pack, remote_addr, rkey);
        unsupported()
    }

    /// Writes registered local memory to remote memory.
    ///
    /// # Safety
    /// The iov buffers must stay valid and unmodified until the operation completes.
    unsafe fn put_zcopy(
        &self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (iov, remote_addr, rkey, comp);
        unsupported()
    }

    /// Reads remote memory into `buffer`, completing immediately.
    fn get_short(&self, buffer: &mut [u8], remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        let _ = (buffer, remote_addr, rkey);
        unsupported()
    }

    /// Reads `length` bytes of remote memory into `buffer`, possibly later.
    ///
    /// # Safety
    /// `buffer` must be valid for `length` bytes of writes until the operation completes, and
    /// nothing else may access it meanwhile.
    unsafe fn get_bcopy(
        &self,
        buffer: *mut u8,
        length: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (buffer, length, remote_addr, rkey, comp);
        unsupported()
    }

    /// Reads remote memory into registered local memory.
    ///
    /// # Safety
    /// The iov buffers must stay valid, and not be accessed, until the operation completes.
    unsafe fn get_zcopy(
        &self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (iov, remote_addr, rkey, comp);
        unsupported()
    }

    /// Sends active message `id` with an 8-byte header and a payload, inline.
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> OpResult {
        let _ = (id, header, payload);
        unsupported()
    }

    /// Sends active message `id` gathered from several buffers, inline.
    fn am_short_iov(&self, id: u8, iov: &[&[u8]]) -> OpResult {
        let _ = (id, iov);
        unsupported()
    }

    /// Sends active message `id` packed by `pack` into a transport buffer; returns the length.
    fn am_bcopy(&self, id: u8, pack: PackFn<'_>, flags: SendFlags) -> OpResult<usize> {
        let _ = (id, pack, flags);
        unsupported()
    }

    /// Sends active message `id` with a header and registered memory.
    ///
    /// # Safety
    /// The iov buffers must stay valid and unmodified until the operation completes.
    unsafe fn am_zcopy(
        &self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (id, header, iov, flags, comp);
        unsupported()
    }

    /// Applies a 32-bit atomic without fetching the old value.
    fn atomic32_post(&self, op: AtomicOp, value: u32, remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        let _ = (op, value, remote_addr, rkey);
        unsupported()
    }

    /// Applies a 64-bit atomic without fetching the old value.
    fn atomic64_post(&self, op: AtomicOp, value: u64, remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        let _ = (op, value, remote_addr, rkey);
        unsupported()
    }

    /// Applies a 32-bit atomic and stores the old value in `result`.
    ///
    /// # Safety
    /// `result` must be valid for a write until the operation completes.
    unsafe fn atomic32_fetch(
        &self,
        op: AtomicOp,
        value: u32,
        result: *mut u32,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (op, value, result, remote_addr, rkey, comp);
        unsupported()
    }

    /// Applies a 64-bit atomic and stores the old value in `result`.
    ///
    /// # Safety
    /// `result` must be valid for a write until the operation completes.
    unsafe fn atomic64_fetch(
        &self,
        op: AtomicOp,
        value: u64,
        result: *mut u64,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (op, value, result, remote_addr, rkey, comp);
        unsupported()
    }

    /// 32-bit compare-and-swap; the old value goes to `result`.
    ///
    /// # Safety
    /// `result` must be valid for a write until the operation completes.
    unsafe fn atomic_cswap32(
        &self,
        compare: u32,
        swap: u32,
        remote_addr: u64,
        rkey: &RemoteKey,
        result: *mut u32,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (compare, swap, remote_addr, rkey, result, comp);
        unsupported()
    }

    /// 64-bit compare-and-swap; the old value goes to `result`.
    ///
    /// # Safety
    /// `result` must be valid for a write until the operation completes.
    unsafe fn atomic_cswap64(
        &self,
        compare: u64,
        swap: u64,
        remote_addr: u64,
        rkey: &RemoteKey,
        result: *mut u64,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (compare, swap, remote_addr, rkey, result, comp);
        unsupported()
    }

    /// Completes every operation issued so far (locally, or remotely with `REMOTE`).
    fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult;

    /// Orders operations before the fence before those after it.
    fn fence(&self) -> UcsResult<()> {
        Ok(())
    }

    /// Checks that the peer is alive; a dead peer is reported through the error handler.
    fn check(&self, comp: Option<&Rc<Completion>>) -> OpResult {
        let _ = comp;
        unsupported()
    }

    /// Queues `req` until send resources return; `Err(Busy)` when they are available now (retry
    /// the operation instead).
    fn pending_add(&self, req: PendingHandle) -> UcsResult<()> {
        let _ = req;
        unsupported()
    }

    /// Removes every queued request, handing each to `sink`.
    fn pending_purge(&self, sink: &mut dyn FnMut(PendingHandle)) {
        let _ = sink;
    }

    /// This endpoint's address, for a peer's [`Ep::connect_to_ep`].
    fn address(&self) -> UcsResult<Vec<u8>> {
        unsupported()
    }

    /// Connects to a remote endpoint.
    fn connect_to_ep(&self, dev_addr: &[u8], ep_addr: &[u8]) -> UcsResult<()> {
        let _ = (dev_addr, ep_addr);
        unsupported()
    }

    /// Offloaded tag matching: eager short.
    fn tag_eager_short(&self, tag: Tag, data: &[u8]) -> OpResult {
        let _ = (tag, data);
        unsupported()
    }

    /// Offloaded tag matching: eager bcopy with immediate data.
    fn tag_eager_bcopy(&self, tag: Tag, imm: u64, pack: PackFn<'_>, flags: SendFlags) -> OpResult<usize> {
        let _ = (tag, imm, pack, flags);
        unsupported()
    }

    /// Offloaded tag matching: eager zcopy.
    ///
    /// # Safety
    /// The iov buffers must stay valid and unmodified until the operation completes.
    unsafe fn tag_eager_zcopy(
        &self,
        tag: Tag,
        imm: u64,
        iov: &[Iov<'_>],
        flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = (tag, imm, iov, flags, comp);
        unsupported()
    }

    /// Offloaded tag matching: rendezvous with the data fetched by the receiver's hardware.
    /// `Done(op)` when started (completion through `comp`), or `NoResource`.
    ///
    /// # Safety
    /// The iov buffers must stay valid and unmodified until the operation completes.
    unsafe fn tag_rndv_zcopy(
        &self,
        tag: Tag,
        header: &[u8],
        iov: &[Iov<'_>],
        flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult<RndvOp> {
        let _ = (tag, header, iov, flags, comp);
        unsupported()
    }

    /// Cancels an offloaded rendezvous send.
    fn tag_rndv_cancel(&self, op: RndvOp) -> UcsResult<()> {
        let _ = op;
        unsupported()
    }

    /// Offloaded tag matching: a rendezvous request completed in software by the receiver.
    fn tag_rndv_request(&self, tag: Tag, header: &[u8], flags: SendFlags) -> OpResult {
        let _ = (tag, header, flags);
        unsupported()
    }
}
