//! Endpoints' protocol state: status, switch points, the queues of what waits to go out, and
//! how a transmission is pulled, reported, refused, parked and retried; failure and close.
//!
//! Queues: wireup messages have their own ([`EpState::wireup_q`]), served first and in any
//! state but failed or closed; everything else waits in [`EpState::queue`], in order, served
//! once the endpoint is connected. The front operation stays at the front until it needs
//! nothing more from the queue (all its pieces went), so operations never overtake each other.
//!
//! When a lane refuses a transmission the endpoint stops; the driver parks it on that lane
//! (its wake waits in the transport's pending queue, [`Park::Parked`]) or, if the lane has
//! resources again by then, lists it for progress to retry ([`Shared::retry`](super::Shared::retry)). While parked,
//! new operations queue behind; when the wake fires ([`Park::Waking`]) the queue replays, and
//! the endpoint stays parked if something is left.

use std::collections::VecDeque;

use ucs::idtable::Id;
use ucs::Status;

use super::{Action, Flow, Lane, Pending, Reply, Shared};
use crate::proto::config::EpConfig;
use crate::request::ReqKind;
use crate::wire::Ctrl;
use crate::wireup::address::WorkerAddress;
use crate::wireup::lanes::Lanes;

/// Endpoint status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum EpStatus {
    /// Wireup in progress.
    Connecting,
    /// Both sides know each other's endpoint id, and every lane is connected.
    Connected,
    /// A transport failed, or the peer is gone.
    Failed(Status),
    /// Closed by the user.
    Closed,
}

/// Whether an endpoint waits for a lane's wake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Park {
    /// No.
    No,
    /// Its wake sits in a lane's pending queue; nothing retries its queue meanwhile.
    Parked,
    /// The wake fired and the queue replays.
    Waking,
}

/// Where wireup of an endpoint stands (while [`EpStatus::Connecting`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WireupStage {
    /// Request sent (or to be sent); no reply yet.
    Requested,
    /// Connecting the endpoint-to-endpoint lanes to the peer's; then send `then`.
    ConnectingLanes { then: u8 },
    /// Reply sent; the requester's acknowledgement says its lanes are connected too.
    Replied,
}

/// One endpoint's protocol state.
pub(crate) struct EpState<L> {
    /// The driver's lanes.
    pub io: L,
    /// The remote worker.
    pub remote: WorkerAddress,
    /// Connection number (matches endpoints created towards each other).
    pub conn_sn: u32,
    /// The remote endpoint's id (learned in wireup; 0 before).
    pub remote_id: u64,
    pub status: EpStatus,
    pub stage: WireupStage,
    /// Protocol switch points.
    pub cfg: EpConfig,
    /// The lanes chosen (for query and diagnostics).
    pub lanes: Lanes,
    /// Some lane connects endpoint to endpoint (wireup exchanges addresses and acknowledges).
    pub p2p: bool,
    /// The encoded addresses of those lanes, sent in wireup (empty: none).
    pub p2p_addrs: Vec<u8>,
    /// Operations waiting to go out, in order.
    pub queue: VecDeque<Pending>,
    /// Wireup messages waiting for the wireup lane.
    pub wireup_q: VecDeque<Ctrl>,
    /// Control messages that go before [`EpState::queue`] once connected: replies to the
    /// peer's emulated operations (flush and atomic replies, get replies) - a flush waiting at
    /// the front of the queue must not hold them, as the peer's own flush may wait on them -
    /// and direct control messages a lane refused.
    pub reply_q: VecDeque<Reply>,
    /// On the engine's retry list.
    pub listed: bool,
    /// A [`Action::Transmit`] for it waits for the driver.
    pub kicked: bool,
    pub park: Park,
    /// A transmission is with the driver (pulled, not reported yet).
    pub busy: bool,
    /// Remote memory access went out since the last flush or fence (a fence waits for it).
    pub rma_dirty: bool,
    /// Emulated puts or atomics went out since the last flush: the flush ends with a flush
    /// message, answered by the peer once it applied them.
    pub sw_unacked: bool,
    /// The first emulated operation of the peer this worker refused since the peer's last
    /// flush (reported in the flush reply).
    pub sw_error: Option<Status>,
    /// Synchronous sends that went through the tag lane and wait for their acknowledgement,
    /// oldest first: (tag, request). Such an acknowledgement names the tag, not the request.
    pub offload_syncs: VecDeque<(u64, Id)>,
}

impl<L> EpState<L> {
    /// An endpoint being wired up to `remote`, with lanes `io`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(io: L, remote: WorkerAddress, conn_sn: u32, cfg: EpConfig, lanes: Lanes, p2p_addrs: Vec<u8>) -> Self {
        EpState {
            io,
            remote,
            conn_sn,
            remote_id: 0,
            status: EpStatus::Connecting,
            stage: WireupStage::Requested,
            cfg,
            lanes,
            p2p: !p2p_addrs.is_empty(),
            p2p_addrs,
            queue: VecDeque::new(),
            wireup_q: VecDeque::new(),
            reply_q: VecDeque::new(),
            listed: false,
            kicked: false,
            park: Park::No,
            busy: false,
            rma_dirty: false,
            sw_unacked: false,
            sw_error: None,
            offload_syncs: VecDeque::new(),
        }
    }

    /// Ready for a direct send: connected, nothing queued, parked or in transmission.
    #[inline(always)]
    pub fn ready(&self) -> bool {
        self.status == EpStatus::Connected && self.queue.is_empty() && !self.busy && self.park == Park::No
    }

    /// The endpoint's error, if it failed or was closed.
    #[inline]
    pub fn error(&self) -> Option<Status> {
        match self.status {
            EpStatus::Failed(s) => Some(s),
            EpStatus::Closed => Some(Status::Canceled),
            _ => None,
        }
    }

    /// Whether the driver may pull a transmission now.
    pub(crate) fn can_transmit(&self) -> bool {
        !self.busy
            && self.error().is_none()
            && (!self.wireup_q.is_empty()
                || (self.status == EpStatus::Connected
                    && self.park == Park::No
                    && !(self.queue.is_empty() && self.reply_q.is_empty())))
    }
}

impl<L: Clone> Shared<L> {
    /// Inserts an endpoint the driver built; its id.
    pub fn insert_ep(&mut self, st: EpState<L>) -> Id {
        self.eps.insert(st)
    }

    /// Queues `p` on endpoint `id`, and asks the driver to transmit if the endpoint can now.
    pub fn enqueue(&mut self, id: Id, p: Pending) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        ep.queue.push_back(p);
        self.kick(id);
    }

    /// Queues `p` on endpoint `id` after its lane refused a direct attempt: listed for progress
    /// to retry (until the driver parks the endpoint), not transmitted now.
    pub fn enqueue_blocked(&mut self, id: Id, p: Pending) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        ep.queue.push_back(p);
        if ep.park == Park::No && !ep.listed {
            ep.listed = true;
            self.retry.push(id);
        }
    }

    /// Queues a wireup message on endpoint `id` (not on a failed or closed one).
    pub fn enqueue_wireup(&mut self, id: Id, c: Ctrl) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.error().is_some() {
            return;
        }
        ep.wireup_q.push_back(c);
        self.kick(id);
    }

    /// Sends a control message on endpoint `id` (after what it queued): at once when the
    /// endpoint has nothing queued ([`Action::Ctrl`]; busy until the driver reports), else
    /// through its queue.
    pub fn send_ctrl(&mut self, id: Id, c: Ctrl) {
        self.send_ctrl_or_queue(id, c, false);
    }

    /// Sends a reply to the peer's operation on endpoint `id`: at once when the endpoint is
    /// ready, else ahead of its data queue ([`EpState::reply_q`]).
    pub fn send_reply(&mut self, id: Id, c: Ctrl) {
        self.send_ctrl_or_queue(id, c, true);
    }

    /// [`Shared::send_ctrl`] (`reply` false) and [`Shared::send_reply`] (true).
    fn send_ctrl_or_queue(&mut self, id: Id, c: Ctrl, reply: bool) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.ready() && ep.wireup_q.is_empty() && ep.reply_q.is_empty() {
            ep.busy = true;
            let io = ep.io.clone();
            self.push(Action::Ctrl { ep: id, io, ctrl: c });
        } else if reply {
            self.enqueue_reply(id, Reply::Ctrl(c));
        } else {
            self.enqueue(id, Pending::Ctrl(c));
        }
    }

    /// Queues `p` ahead of endpoint `id`'s data queue ([`EpState::reply_q`]).
    pub fn enqueue_reply(&mut self, id: Id, p: Reply) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.error().is_some() {
            return;
        }
        ep.reply_q.push_back(p);
        self.kick(id);
    }

    /// Asks the driver to transmit on `id` if it can now and was not asked already.
    pub fn kick(&mut self, id: Id) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if !ep.kicked && ep.can_transmit() {
            ep.kicked = true;
            self.push(Action::Transmit(id));
        }
    }

    /// A lane refused: the endpoint is listed for progress to retry until the driver parks it.
    pub(crate) fn blocked(&mut self, id: Id, lane: Lane) -> Flow {
        let Some(ep) = self.eps.get_mut(id) else { return Flow::Continue };
        if ep.park == Park::No && !ep.listed {
            ep.listed = true;
            self.retry.push(id);
        }
        Flow::Blocked(lane)
    }

    /// The driver parked endpoint `id`: its wake waits in a lane's pending queue.
    pub fn parked(&mut self, id: Id) {
        if let Some(ep) = self.eps.get_mut(id) {
            if ep.park == Park::No {
                ep.park = Park::Parked;
                self.counts.parked += 1;
            }
        }
    }

    /// Whether endpoint `id` is replaying from its wake (then a refused transmission leaves
    /// the wake queued instead of parking again).
    pub fn waking(&self, id: Id) -> bool {
        self.eps.get(id).is_some_and(|e| e.park == Park::Waking)
    }

    /// The wake of endpoint `id` fired: true when it should replay its queue now (it was
    /// parked, and is connected).
    pub fn wake_begin(&mut self, id: Id) -> bool {
        match self.eps.get_mut(id) {
            Some(ep) if ep.park == Park::Parked => {
                ep.park = Park::Waking;
                true
            }
            _ => false,
        }
    }

    /// The replay of a wake is over: true when the endpoint stays parked (something is left;
    /// the wake stays in the lane's queue, as UCX's pending callbacks do).
    pub fn wake_end(&mut self, id: Id) -> bool {
        let Some(ep) = self.eps.get_mut(id) else { return false };
        if ep.park == Park::Waking && ep.status == EpStatus::Connected && !ep.queue.is_empty() {
            ep.park = Park::Parked;
            return true;
        }
        ep.park = Park::No;
        self.kick(id);
        false
    }

    /// Moves the retry list into `into` (emptied first), unlisting every endpoint: the driver
    /// transmits on each, which lists again those whose lane still refuses.
    pub fn take_retry(&mut self, into: &mut Vec<Id>) {
        into.clear();
        std::mem::swap(&mut self.retry, into);
        for &id in into.iter() {
            if let Some(ep) = self.eps.get_mut(id) {
                ep.listed = false;
            }
        }
    }

    // ---- failure and close --------------------------------------------------------------------

    /// Completes every request of endpoint `id` with `status`: its sends, the receives that
    /// wait for more data from its peer (rendezvous after the match) and `partial` (receives
    /// of partly arrived messages) - except those with a zero-copy operation in flight, which
    /// the transport completes (with an error) first, since it may still access their memory.
    pub fn fail_ep_requests(&mut self, id: Id, status: Status, partial: Vec<Id>) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.park != Park::No {
            ep.park = Park::No;
            let io = ep.io.clone();
            self.push(Action::Unpark(io));
        }
        let Some(ep) = self.eps.get_mut(id) else { return };
        let flushes: Vec<Id> = ep
            .queue
            .iter()
            .filter_map(|p| match p {
                Pending::Flush(pos) => pos.rid,
                _ => None,
            })
            .collect();
        ep.queue.clear();
        ep.wireup_q.clear();
        ep.reply_q.clear();
        for rid in flushes {
            crate::rma::flush::ep_flushed(&mut self.reqs, &mut self.actions, rid, status);
        }
        let mut mine: Vec<Id> = self
            .reqs
            .tab
            .iter()
            .filter(|(_, r)| {
                r.status == Status::InProgress
                    && match &r.kind {
                        ReqKind::Send(s) => s.ep == id && !s.zc.as_ref().is_some_and(|z| z.busy()),
                        // A piece in flight may still access the memory: its completion ends it.
                        ReqKind::Rma(r) => {
                            r.ep == id && (r.inflight == 0 || r.route.proto == crate::proto::select::RmaProto::Sw)
                        }
                        ReqKind::Recv(rr) => rr
                            .zc
                            .as_ref()
                            .is_some_and(|z| !z.busy() && z.rts.as_ref().is_some_and(|rts| rts.ep == id.raw())),
                        _ => false,
                    }
            })
            .map(|(rid, _)| rid)
            .collect();
        mine.extend(partial);
        for rid in mine {
            self.finish(rid, status);
        }
    }

    /// Where the close request `rid` stands: `None` when it finished here (its endpoint is
    /// gone), `Err` with the endpoint when that failed (it goes now), else whether the endpoint
    /// is idle, with its lanes for the driver to flush.
    pub fn close_poll(&mut self, rid: Id) -> Option<Result<(Id, Option<L>), Id>> {
        let ep_id = match self.reqs.tab.get(rid) {
            Some(crate::request::ReqState { kind: ReqKind::Close(c), .. }) => c.ep,
            _ => return None,
        };
        let Some(ep) = self.eps.get(ep_id) else {
            self.finish(rid, Status::Ok);
            return None;
        };
        if ep.error().is_some() {
            return Some(Err(ep_id));
        }
        let busy = !ep.queue.is_empty()
            || !ep.wireup_q.is_empty()
            || !ep.reply_q.is_empty()
            || ep.status == EpStatus::Connecting
            || self.reqs.tab.iter().any(|(_, r)| {
                r.status == Status::InProgress
                    && match &r.kind {
                        ReqKind::Send(s) => s.ep == ep_id,
                        ReqKind::Rma(x) => x.ep == ep_id,
                        _ => false,
                    }
            });
        Some(Ok((ep_id, (!busy).then(|| ep.io.clone()))))
    }

    /// Removes endpoint `id`; its lanes go to the driver to drop.
    pub fn ep_destroy(&mut self, id: Id) {
        self.retry.retain(|e| *e != id);
        if let Some(ep) = self.eps.remove(id) {
            let parked = ep.park != Park::No;
            self.push(Action::Release { io: ep.io, parked });
        }
    }
}
