//! The protocol engine, sans IO: everything UCP decides, nothing it does to a transport.
//!
//! The engine owns the requests, the tag matcher and each endpoint's protocol state (status,
//! switch points, the queue of what waits to go out, wireup). It takes events - a message
//! arrived ([`Engine::on_am`]), a transmission went or was refused ([`Shared::tx_done`]), a
//! zero-copy operation completed ([`Shared::zc_done`]), a transport reported a dead peer
//! ([`Engine::on_ep_error`]), a timer fired ([`Shared::on_timer`], with an explicit `now`), the
//! user posted an operation - and yields work for its driver: transmissions, pulled with
//! [`Shared::next_tx`], and [`Action`]s (run a completion's callbacks, build or connect an
//! endpoint's lanes, check a peer), taken with [`Engine::pop_action`]. It never calls a
//! transport, a clock or a user callback, so it runs the same under the real driver
//! ([`crate::core::Core`]) and in memory, two engines against each other on virtual time
//! (`crate::sim`).
//!
//! `L` is the driver's handle on an endpoint's lanes: the engine stores it with the endpoint
//! and hands it back with each transmission, and never looks inside.
//!
//! What lives where: endpoint state and queues in [`ep`], transmissions in [`tx`], keepalive
//! in [`keepalive`]; the protocols in [`crate::proto`], [`crate::tag`] and [`crate::wireup`],
//! each adding its event handlers to the engine.

use std::collections::VecDeque;
use std::rc::Rc;

use ucs::idtable::{Id, IdTable};
use ucs::{Status, UcsResult};

use crate::request::complete::{CompletedFull, Done};
use crate::request::{ReqExt, Reqs, ZcPool, ZC_POOL_CHUNK};
use crate::tag::TagState;
use crate::wire::Ctrl;
use crate::wireup::conn::{AcceptReq, ConnMatch};

pub(crate) mod am;
pub(crate) mod ep;
pub(crate) mod keepalive;
pub(crate) mod tx;

pub(crate) use ep::{EpState, EpStatus, Park};
pub(crate) use tx::{Flow, Lane, Mem, Next, Pending, Reply, Step, Tx, TxOf, TxOp, TxResult, TxStatus, ZcDone};

/// Size of the buffers that keep unexpected messages which arrived inline in a transport's
/// receive buffer (`am_short`): the longest `am_short` message of posix/sysv (120 bytes), rc
/// and ud fits; a longer borrowed message (from `self`) is copied to the heap.
const KEPT_MSG_SIZE: usize = 256;

/// How many messages each tag protocol carried on a worker, counted on the side that chose
/// the protocol (see [`Worker::proto_counts`](crate::Worker::proto_counts)); for tests and diagnostics.
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
    /// Tagged sends through the transport's tag matching (the tag lane), eager (sender).
    pub offload_eager: u64,
    /// Rendezvous requests through the tag lane, as software requests (sender).
    pub offload_sw_rndv: u64,
    /// Eager messages that came through the transport's tag matching unmatched there
    /// (receiver).
    pub offload_rx_eager: u64,
    /// Software rendezvous requests that came through the transport's tag matching (receiver).
    pub offload_rx_sw_rndv: u64,
    /// Receives posted to the transport's tag matching (UCX's `posted`).
    pub offload_posted: u64,
    /// Of those, matched there (UCX's `matched`).
    pub offload_matched: u64,
    /// Of those, taken back because software matched them (forced cancels).
    pub offload_sw_matched: u64,
    /// Receives the transport refused to take (UCX's `block_tag_exceed`).
    pub offload_refused: u64,
    /// Offloaded rendezvous sends, the data read by the receiver's transport (sender).
    pub offload_hw_rndv: u64,
    /// Offloaded rendezvous requests that came unexpected (receiver).
    pub offload_rx_hw_rndv: u64,
    /// Receives posted with a bounce buffer (`UCX_TM_MAX_BB_SIZE`).
    pub offload_bounce: u64,
    /// Receives a large one pushed to the transport before itself (`UCX_TM_FORCE_THRESH`).
    pub offload_forced: u64,
}

/// Work the engine leaves to its driver, in order.
pub(crate) enum Action<L> {
    /// Run a completed request's plain callback.
    Done(Done),
    /// Run a completed request's callbacks, wake its future, drop the buffer it held.
    Full(CompletedFull),
    /// The endpoint has transmissions to make: pull them with [`Shared::next_tx`].
    Transmit(Id),
    /// Send control message `ctrl` on endpoint `ep`'s AM lane now (it had nothing queued; it
    /// is busy until the driver reports with [`Shared::ctrl_replayed`]).
    Ctrl { ep: Id, io: L, ctrl: Ctrl },
    /// A peer's wireup request names no endpoint here: build one ([`ConnMatch::accept`]).
    Accept(Box<AcceptReq>),
    /// Connect the endpoint-to-endpoint lanes of `ep` to the peer's encoded endpoint
    /// addresses, then report with [`ConnMatch::p2p_connected`] (or fail the endpoint, [`Engine::on_ep_error`]).
    ConnectP2p { ep: Id, addrs: Vec<u8> },
    /// An endpoint went: drop its lanes (after taking its wake off its lane if `parked`).
    Release { io: L, parked: bool },
    /// A parked endpoint failed: take its wake off its lane.
    Unpark(L),
    /// Check that the peer of `ep` is alive; report a failure with [`Engine::on_ep_error`].
    CheckPeer(Id),
    /// Drop a request's extras (a callback box, a held buffer) outside the engine.
    Drop(Box<ReqExt>),
    /// Post receive `rid` (buffer `seg`, memory hint `hint`) for `tag` to the tag matching of
    /// interface `iface`; report a refusal with [`crate::tag::TagState::offload_post_failed`].
    /// With `bounce`, through one of the driver's preregistered bounce buffers (copied into
    /// `seg` when the receive completes).
    TagPost { rid: Id, iface: usize, tag: crate::tag::Tag, seg: crate::dt::Seg, hint: Option<Id>, bounce: bool },
    /// Cancel receive `rid` in the transport's tag matching: `force`, at once and without a
    /// report (software took it); else its completion reports `Canceled` (or the match).
    TagCancel { rid: Id, force: bool },
    /// Forget offloaded rendezvous `op` on the tag lane of endpoint `ep` (the receiver answered
    /// in software): its completion will not come.
    TagRndvCancel { ep: Id, op: u64 },
}

impl<L> std::fmt::Debug for Action<L> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Action::Done(d) => write!(f, "{d:?}"),
            Action::Full(c) => write!(f, "{c:?}"),
            Action::Transmit(id) => write!(f, "Transmit({id:?})"),
            Action::Ctrl { ep, ctrl, .. } => write!(f, "Ctrl({ep:?}, {})", ctrl.name()),
            Action::Accept(a) => write!(f, "Accept({})", a.remote.name),
            Action::ConnectP2p { ep, .. } => write!(f, "ConnectP2p({ep:?})"),
            Action::Release { parked, .. } => write!(f, "Release(parked: {parked})"),
            Action::Unpark(_) => write!(f, "Unpark"),
            Action::CheckPeer(id) => write!(f, "CheckPeer({id:?})"),
            Action::Drop(_) => write!(f, "Drop"),
            Action::TagPost { rid, tag, .. } => write!(f, "TagPost({rid:?}, {tag:#x})"),
            Action::TagCancel { rid, force } => write!(f, "TagCancel({rid:?}, force: {force})"),
            Action::TagRndvCancel { ep, op } => write!(f, "TagRndvCancel({ep:?}, {op:#x})"),
        }
    }
}

/// This worker, as wireup presents it.
pub(crate) struct Local {
    /// Its uuid.
    pub uuid: u64,
    /// Its packed address, sent in wireup requests.
    pub packed: Rc<[u8]>,
}

/// The engine: what every protocol shares, and each family's own state. The families'
/// event handlers are methods of their state (`TagState` in [`crate::tag`], `ConnMatch` in
/// [`crate::wireup`]) that take the shared part; the machinery they share works on the
/// shared part alone ([`crate::proto`]).
pub(crate) struct Engine<L> {
    /// Requests, endpoints, the driver's work.
    pub sh: Shared<L>,
    /// Tag matching: unexpected messages, reassembly, probed messages (the posted receives
    /// live with their requests).
    pub tag: TagState,
    /// Endpoints created towards each other, matched by wireup.
    pub conn: ConnMatch,
    /// Active messages: reassembly, rendezvous descriptors.
    pub am: crate::am::AmState,
    /// Every endpoint's byte stream.
    pub stream: crate::stream::StreamState,
}

/// What every protocol shares: the requests, the endpoints, and the work for the driver.
pub(crate) struct Shared<L> {
    /// Requests, with the queues of posted receives.
    pub reqs: Reqs,
    /// Endpoints' protocol state.
    pub eps: EpTable<L>,
    /// This worker.
    pub local: Local,
    /// Work for the driver.
    pub(crate) actions: VecDeque<Action<L>>,
    /// Endpoints whose queued transmissions progress retries (a lane refused, and the
    /// endpoint could not park on it).
    pub retry: Vec<Id>,
    /// Close requests whose endpoints are being flushed.
    pub closing: Vec<Id>,
    /// How many messages each protocol carried.
    pub counts: ProtoCounts,
    next_msg_id: u64,
    /// Keepalive rounds.
    pub keepalive: keepalive::Keepalive,
    /// Zero-copy state of requests.
    pub zc_pool: ZcPool,
    /// Buffers for unexpected messages that arrived inline in a transport's receive buffer
    /// and are too long for the descriptor itself: kept without allocating.
    pub kept_msgs: Rc<ucs::mpool::MemPool>,
}

impl<L: Clone> Engine<L> {
    /// An engine for the worker `local`, with keepalive rounds every `keepalive_ns` (0: none)
    /// over up to `keepalive_eps` endpoints, starting at `now`.
    pub fn new(local: Local, keepalive_ns: u64, keepalive_eps: usize, now: u64) -> UcsResult<Engine<L>> {
        Ok(Engine {
            sh: Shared::new(local, keepalive_ns, keepalive_eps, now)?,
            tag: TagState::default(),
            conn: ConnMatch::default(),
            am: crate::am::AmState::default(),
            stream: crate::stream::StreamState::default(),
        })
    }

    /// The next piece of work for the driver.
    #[inline]
    pub fn pop_action(&mut self) -> Option<Action<L>> {
        self.sh.pop_action()
    }

    /// Whether work waits for the driver.
    #[inline(always)]
    pub fn has_actions(&self) -> bool {
        self.sh.has_actions()
    }

    /// A transport reported a failed endpoint (or keepalive found its peer dead): the
    /// endpoint fails, and its requests with it - its sends, the receives that wait for more
    /// of its data; partly arrived unexpected messages from it are dropped.
    pub fn on_ep_error(&mut self, id: Id, status: Status) {
        let Some(ep) = self.sh.eps.get_mut(id) else { return };
        if matches!(ep.status, EpStatus::Failed(_) | EpStatus::Closed) {
            return;
        }
        tracing::warn!("ucp endpoint to {} failed: {status}", ep.remote.name);
        ep.status = EpStatus::Failed(status);
        self.fail_ep(id, status);
    }

    /// Completes every request waiting for endpoint `id` with `status`.
    fn fail_ep(&mut self, id: Id, status: Status) {
        let name = self.sh.eps.get(id).map(|e| e.remote.name.clone()).unwrap_or_default();
        let partial = self.tag.ep_failed(id.raw(), &name, status);
        self.am.ep_gone(id.raw(), &name, status);
        for rid in self.stream.ep_gone(id.raw()) {
            self.sh.finish(rid, status);
        }
        self.sh.fail_ep_requests(id, status, partial);
    }

    /// Starts closing endpoint `id` for close request `rid`. Force (or a failed endpoint):
    /// every outstanding operation completes with `Canceled` and the endpoint goes now. Flush:
    /// queued and outstanding operations finish, the transports flush (driven by progress,
    /// [`Engine::close_poll`]), then the endpoint goes.
    pub fn ep_close(&mut self, id: Id, force: bool, rid: Id) {
        let Some(ep) = self.sh.eps.get_mut(id) else {
            self.sh.finish(rid, Status::Ok);
            return;
        };
        if force || ep.error().is_some() {
            ep.status = EpStatus::Closed;
            self.fail_ep(id, Status::Canceled);
            self.ep_destroy(id);
            self.sh.finish(rid, Status::Ok);
        } else {
            self.sh.closing.push(rid);
        }
    }

    /// Where the close request `rid` stands: `None` when it finished here (the endpoint went
    /// or failed), else whether its endpoint is idle, with its lanes for the driver to flush.
    pub fn close_poll(&mut self, rid: Id) -> Option<(Id, Option<L>)> {
        match self.sh.close_poll(rid)? {
            Ok(polled) => Some(polled),
            Err(ep_id) => {
                self.ep_destroy(ep_id);
                self.sh.finish(rid, Status::Ok);
                None
            }
        }
    }

    /// The transports of a closing endpoint flushed: it goes, and close request `rid`
    /// completes.
    pub fn close_flushed(&mut self, ep_id: Id, rid: Id) {
        if let Some(ep) = self.sh.eps.get_mut(ep_id) {
            ep.status = EpStatus::Closed;
        }
        self.ep_destroy(ep_id);
        self.sh.finish(rid, Status::Ok);
    }

    /// Removes endpoint `id`; its lanes go to the driver to drop.
    pub fn ep_destroy(&mut self, id: Id) {
        self.conn.forget(id);
        self.am.ep_gone(id.raw(), "a destroyed endpoint", Status::Canceled);
        for rid in self.stream.ep_gone(id.raw()) {
            self.sh.finish(rid, Status::Canceled);
        }
        self.sh.ep_destroy(id);
    }

    /// Every endpoint goes (the worker is dropped); their lanes go to the driver.
    pub fn destroy_all(&mut self) {
        let ids: Vec<Id> = self.sh.eps.iter().map(|(id, _)| id).collect();
        for id in ids {
            self.ep_destroy(id);
        }
    }
}

impl<L: Clone> Shared<L> {
    /// The shared state of an engine for the worker `local` (see [`Engine::new`]).
    fn new(local: Local, keepalive_ns: u64, keepalive_eps: usize, now: u64) -> UcsResult<Shared<L>> {
        let zc_pool = ucs::mpool::ObjPool::new(ZC_POOL_CHUNK, usize::MAX)?;
        let mut kp = ucs::mpool::MpoolParams::new(KEPT_MSG_SIZE);
        kp.elems_per_chunk = 64;
        kp.name = "ucp_kept_msgs";
        let kept_msgs = Rc::new(ucs::mpool::MemPool::new(kp, Box::new(ucs::mpool::HeapChunkAlloc))?);
        Ok(Shared {
            reqs: Reqs::default(),
            eps: EpTable::default(),
            next_msg_id: local.uuid.rotate_left(17),
            local,
            actions: VecDeque::new(),
            retry: Vec::new(),
            closing: Vec::new(),
            counts: ProtoCounts::default(),
            keepalive: keepalive::Keepalive::new(keepalive_ns, keepalive_eps, now),
            zc_pool,
            kept_msgs,
        })
    }

    /// The next piece of work for the driver.
    #[inline]
    pub fn pop_action(&mut self) -> Option<Action<L>> {
        self.actions.pop_front()
    }

    /// Whether work waits for the driver.
    #[inline(always)]
    pub fn has_actions(&self) -> bool {
        !self.actions.is_empty()
    }

    /// Adds work for the driver.
    #[inline]
    pub(crate) fn push(&mut self, a: Action<L>) {
        self.actions.push_back(a);
    }

    /// Whether progress has queued work to retry or closes to flush.
    #[inline(always)]
    pub fn needs_progress(&self) -> bool {
        !self.retry.is_empty() || !self.closing.is_empty()
    }

    /// Completes request `id` with `status`; its callbacks go to the driver.
    #[inline]
    pub fn finish(&mut self, id: Id, status: Status) {
        let r = self.reqs.finish(id, status);
        self.completed(id, r);
    }

    /// What completing request `id` left: a plain callback for the driver, or the full
    /// completion to make.
    #[inline]
    pub(crate) fn completed(&mut self, id: Id, r: Result<Option<Done>, Status>) {
        match r {
            Ok(Some(d)) => self.push(Action::Done(d)),
            Ok(None) => {}
            Err(status) => self.complete_full(id, status),
        }
    }

    /// Completes request `id`, which has more than a plain callback, with `status`.
    #[inline(never)]
    pub(crate) fn complete_full(&mut self, id: Id, status: Status) {
        if let Some(c) = self.reqs.complete_full(id, status) {
            self.push(Action::Full(c));
        }
    }

    /// A fresh message id for multi-fragment sends.
    pub fn msg_id(&mut self) -> u64 {
        let v = self.next_msg_id;
        self.next_msg_id = v.wrapping_add(1);
        v
    }

    /// The user dropped request `id`'s handle: freed now if complete, else when it completes.
    #[inline]
    pub fn release(&mut self, id: Id) {
        if let Some(ext) = self.reqs.release(id) {
            self.push(Action::Drop(ext));
        }
    }

    /// Cancels a posted receive that has not matched (`Canceled`).
    pub fn cancel(&mut self, id: Id) {
        if self.reqs.unpost(id) {
            self.finish(id, Status::Canceled);
        }
    }

    /// A send request named by a peer, if it is a live send; `what` is for the log.
    pub fn sreq_from_wire(&self, raw: u64, what: &str) -> Option<Id> {
        self.req_from_wire(raw, what, "send", |k| matches!(k, crate::request::ReqKind::Send(_)))
    }

    /// A receive request named by a peer, if it is a live receive.
    pub fn rreq_from_wire(&self, raw: u64, what: &str) -> Option<Id> {
        self.req_from_wire(raw, what, "receive", |k| matches!(k, crate::request::ReqKind::Recv(_)))
    }

    fn req_from_wire(&self, raw: u64, what: &str, kind: &str, is: fn(&crate::request::ReqKind) -> bool) -> Option<Id> {
        let id = Id::from_raw(raw);
        if self.reqs.tab.get(id).is_some_and(|r| is(&r.kind)) {
            return Some(id);
        }
        tracing::warn!("{what}: no {kind} request {raw:#x}; dropped");
        None
    }

    /// The endpoint named by a peer's header (its id as this worker gave it), or a warning.
    pub fn ep_from_wire(&self, raw: u64, what: &str) -> Option<Id> {
        let id = Id::from_raw(raw);
        if self.eps.contains(id) {
            return Some(id);
        }
        tracing::warn!("{what}: no endpoint with id {raw:#x}; message dropped");
        None
    }
}

/// The endpoints' table, counting the times it is reached mutably: an endpoint's state (its
/// readiness for a direct call among it) changes only through such an access, so a fast path
/// outside the engine that found an endpoint ready may trust that while the count has not
/// moved ([`EpTable::epoch`], shared with the driver: the remote-memory fast path of
/// `core/rma.rs`). Reading it (`Deref`) counts nothing, so the direct send paths, which only
/// look at their endpoint, pay nothing.
pub(crate) struct EpTable<L> {
    tab: IdTable<EpState<L>>,
    epoch: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<L> Default for EpTable<L> {
    fn default() -> Self {
        EpTable { tab: IdTable::new(), epoch: Default::default() }
    }
}

impl<L> EpTable<L> {
    /// The count of mutable accesses, as a handle the driver reads without the engine.
    pub fn epoch(&self) -> std::rc::Rc<std::cell::Cell<u64>> {
        self.epoch.clone()
    }
}

impl<L> std::ops::Deref for EpTable<L> {
    type Target = IdTable<EpState<L>>;
    #[inline(always)]
    fn deref(&self) -> &Self::Target {
        &self.tab
    }
}

impl<L> std::ops::DerefMut for EpTable<L> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Self::Target {
        self.epoch.set(self.epoch.get().wrapping_add(1));
        &mut self.tab
    }
}

#[cfg(test)]
mod ep_table_tests {
    use super::EpTable;

    #[test]
    fn mutable_access_moves_the_epoch_and_reading_does_not() {
        let mut t: EpTable<()> = EpTable::default();
        let epoch = t.epoch();
        let _ = t.get(ucs::idtable::Id::from_raw(1));
        let _ = t.len();
        assert_eq!(epoch.get(), 0, "reads count nothing");
        let _ = t.get_mut(ucs::idtable::Id::from_raw(1));
        assert_eq!(epoch.get(), 1);
        for _ in t.iter_mut() {}
        assert_eq!(epoch.get(), 2, "every way to reach an endpoint mutably counts");
    }
}
