//! An endpoint's queue, served by protocol: the front operation's protocol describes its next
//! transmission ([`Shared::next_tx`]) and takes the driver's report of it
//! ([`Shared::tx_done`]). The operation stays at the front until it needs nothing more from
//! the queue (all its pieces went), so operations never overtake each other.

use ucs::idtable::Id;
use ucs::Status;

use super::{eager, rndv, Proto};
use crate::dt::UserBuf;
use crate::engine::ep::{EpStatus, Park};
use crate::engine::{
    Action, Flow, Lane, Next, Pending, Reply, Shared, Step, Tx, TxOf, TxOp, TxResult, TxStatus, ZcDone,
};
use crate::request::{ReqKind, ReqState, SendPhase};
use crate::wire::{Ctrl, DataHdr};

/// What the driver sends straight from the front of an endpoint's queue, without a [`Tx`]
/// ([`Shared::front`]): the common replays, as cheap as the direct path.
pub(crate) enum Front<L> {
    /// Bytes `[offset, offset + len)` of a send's data in one active message: a whole eager
    /// message (`short`: `am_short` with the tag of `hdr` as its header; else `am_bcopy` of
    /// `hdr` and the data) or one bcopy fragment, eager or rendezvous.
    Data {
        /// The endpoint's lanes.
        io: L,
        /// The send's request.
        rid: Id,
        short: bool,
        hdr: DataHdr,
        buf: UserBuf,
        offset: usize,
        len: usize,
    },
    /// A control message (sync ack, ATS, ATP), taken off the queue; it goes back to the front
    /// if the lane refuses it ([`Shared::ctrl_replayed`]).
    Ctrl {
        /// The endpoint's lanes.
        io: L,
        ctrl: Ctrl,
    },
}

impl<L: Clone> Shared<L> {
    /// The next transmission of endpoint `id`, or `None` when it has nothing to send now (or
    /// one of its transmissions is with the driver already).
    pub fn next_tx(&mut self, id: Id) -> Option<Tx<L>> {
        let Shared { eps, reqs, actions, .. } = self;
        let ep = eps.get_mut(id)?;
        ep.kicked = false;
        if ep.busy {
            return None;
        }
        if ep.error().is_some() {
            ep.wireup_q.clear();
            ep.queue.clear();
            ep.reply_q.clear();
            return None;
        }
        if let Some(c) = ep.wireup_q.pop_front() {
            ep.busy = true;
            return Some(Tx { io: ep.io.clone(), lane: Lane::Wireup, op: TxOp::Ctrl(c), of: TxOf::Wireup });
        }
        if ep.status != EpStatus::Connected || ep.park == Park::Parked {
            return None;
        }
        // Replies first: nothing of the data queue holds them.
        while let Some(front) = ep.reply_q.front() {
            let (op, of) = match front {
                Reply::Get(g) => match crate::rma::sw::reply_next(ep, g) {
                    Some(op) => (op, TxOf::Reply),
                    None => {
                        ep.reply_q.pop_front();
                        continue;
                    }
                },
                Reply::Ctrl(_) => match ep.reply_q.pop_front() {
                    Some(Reply::Ctrl(c)) => (TxOp::Ctrl(c), TxOf::ReplyCtrl),
                    _ => continue,
                },
            };
            ep.busy = true;
            return Some(Tx { io: ep.io.clone(), lane: Lane::Am, op, of });
        }
        loop {
            let (next, rid) = match ep.queue.front()? {
                Pending::Ctrl(_) => match ep.queue.pop_front() {
                    Some(Pending::Ctrl(c)) => (Next::Tx(Lane::Am, TxOp::Ctrl(c), TxOf::Ctrl), None),
                    _ => (Next::Nothing, None),
                },
                &Pending::Send(rid) => (eager::send_next(reqs, ep, rid), Some(rid)),
                &Pending::Rtr(rid) => (rndv::rtr_next(reqs, ep, rid), Some(rid)),
                &Pending::Get(rid) => (rndv::get_next(reqs, ep, id, rid), Some(rid)),
                &Pending::Put(rid) => (rndv::put_next(reqs, ep, id, rid), Some(rid)),
                &Pending::Rma(rid) => (crate::rma::next(reqs, ep, rid), Some(rid)),
                &Pending::Flush(pos) => {
                    if pos.waiting {
                        (Next::Wait, None)
                    } else if pos.lane >= ep.cfg.uct_lanes {
                        // Then the emulated operations, if any went out.
                        let sw = if pos.lane == ep.cfg.uct_lanes { Shared::sw_flush_next(ep) } else { None };
                        match sw {
                            Some(next) => (next, None),
                            None => {
                                if let Some(rid) = pos.rid {
                                    crate::rma::flush::ep_flushed(reqs, actions, rid, Status::Ok);
                                }
                                (Next::Nothing, None)
                            }
                        }
                    } else {
                        let token = ZcDone::Flush { ep: id };
                        (Next::Tx(Lane::Uct(pos.lane), TxOp::Flush { token }, TxOf::Flush), None)
                    }
                }
            };
            match next {
                Next::Tx(lane, op, of) => {
                    ep.busy = true;
                    return Some(Tx { io: ep.io.clone(), lane, op, of });
                }
                // Nothing to send for the front operation (finished, or waiting for the peer).
                Next::Nothing => {
                    ep.queue.pop_front();
                }
                Next::Wait => return None,
                Next::Fail(status) => {
                    ep.queue.pop_front();
                    if let Some(rid) = rid {
                        match reqs.finish(rid, status) {
                            Ok(Some(d)) => actions.push_back(Action::Done(d)),
                            Ok(None) => {}
                            Err(st) => {
                                if let Some(c) = reqs.complete_full(rid, st) {
                                    actions.push_back(Action::Full(c));
                                }
                            }
                        }
                    }
                }
            }
        }
    }

    /// The common cases of a replay, without a [`Tx`]: at the front of endpoint `id`'s queue
    /// a send that goes whole in one eager short or bcopy message, or a control message; the
    /// endpoint connected with nothing else to send first. The driver sends it as the direct
    /// path does and reports with [`Shared::data_replayed`] or [`Shared::ctrl_replayed`]; the
    /// endpoint is busy until then. `None`: anything else ([`Shared::next_tx`] has it).
    #[inline]
    pub fn front(&mut self, id: Id) -> Option<Front<L>> {
        let Shared { eps, reqs, .. } = self;
        let ep = eps.get_mut(id)?;
        if ep.busy
            || ep.status != EpStatus::Connected
            || ep.park == Park::Parked
            || !ep.wireup_q.is_empty()
            || !ep.reply_q.is_empty()
        {
            return None;
        }
        let front = match ep.queue.front()? {
            Pending::Ctrl(_) => {
                let Some(Pending::Ctrl(ctrl)) = ep.queue.pop_front() else { return None };
                Front::Ctrl { io: ep.io.clone(), ctrl }
            }
            &Pending::Send(rid) => {
                let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = reqs.tab.get(rid)
                else {
                    return None;
                };
                let total = s.buf.len();
                let (rep, max) = (ep.remote_id, ep.cfg.bcopy_max);
                if eager::tag_lane(&ep.cfg, s.msg.get()) == Lane::Tag {
                    // Through the tag lane: the transmission of `next_tx`.
                    return None;
                }
                let (short, hdr, offset, len) = match s.phase {
                    SendPhase::Queued if s.proto == Proto::EagerShort => {
                        (true, eager::short_hdr(s.msg.get(), rep), 0, total)
                    }
                    SendPhase::Queued if s.proto == Proto::EagerBcopy => {
                        (false, eager::whole_hdr(s.msg.get(), s.sync, rep, rid.raw()), 0, total)
                    }
                    SendPhase::Frags { offset, msg_id } => {
                        let sreq = s.sync.then_some(rid.raw());
                        let hdr = eager::frag_hdr(s.msg.get(), rep, msg_id, total, offset, sreq);
                        (false, hdr, offset, eager::piece_len(&hdr, total, offset, max)?)
                    }
                    SendPhase::RndvFrags { rreq, offset } if offset < total => {
                        let hdr = DataHdr::RndvData(crate::wire::RndvDataHdr { rreq, offset });
                        (false, hdr, offset, eager::piece_len(&hdr, total, offset, max)?)
                    }
                    _ => return None,
                };
                Front::Data { io: ep.io.clone(), rid, short, hdr, buf: s.buf, offset, len }
            }
            _ => return None,
        };
        ep.kicked = false;
        ep.busy = true;
        Some(front)
    }

    /// The driver sent (or the lane refused) the data [`Shared::front`] (or
    /// [`send_req`](crate::proto::send::send_req)) gave it: the send advances as after a
    /// [`Tx`] of the same piece ([`eager::send_done`]). Outside its flush loop the driver then
    /// kicks the endpoint ([`Shared::kick`]): over a loop-back lane, the answer to this very
    /// message may have queued meanwhile.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub fn data_replayed(
        &mut self,
        id: Id,
        rid: Id,
        short: bool,
        hdr: DataHdr,
        buf: UserBuf,
        offset: usize,
        len: usize,
        status: TxStatus,
    ) -> Flow {
        let Some(ep) = self.eps.get_mut(id) else { return Flow::Continue };
        ep.busy = false;
        // The queue changed during the call (the endpoint failed): the send was settled then.
        if !matches!(ep.queue.front(), Some(&Pending::Send(r)) if r == rid) {
            return Flow::Continue;
        }
        let op = match short.then(|| eager::short_op(&hdr, buf)).flatten() {
            Some(op) => op,
            None => TxOp::Bcopy { hdr, data: buf, offset, len },
        };
        match eager::send_done(self, rid, offset, len, &op, TxResult::of(status)) {
            Step::Blocked => return self.blocked(id, Lane::Am),
            Step::Finished => {
                if let Some(ep) = self.eps.get_mut(id) {
                    ep.queue.pop_front();
                }
            }
            Step::More => {}
        }
        Flow::Continue
    }

    /// The driver sent (or the lane refused) the control message [`Shared::front`] or
    /// [`Action::Ctrl`] gave it; a refused one comes back to go first again. After an
    /// [`Action::Ctrl`] the driver kicks the endpoint ([`Shared::kick`]) for what queued
    /// meanwhile.
    #[inline]
    pub fn ctrl_replayed(&mut self, id: Id, ctrl: Ctrl, status: TxStatus) -> Flow {
        let Some(ep) = self.eps.get_mut(id) else { return Flow::Continue };
        ep.busy = false;
        match status {
            TxStatus::NoResource => {
                // Ahead of what was queued since the direct attempt, as it would have been.
                if ep.error().is_none() {
                    ep.reply_q.push_front(Reply::Ctrl(ctrl));
                }
                self.blocked(id, Lane::Am)
            }
            TxStatus::Failed(e) => {
                tracing::warn!("ucp: sending {} to '{}' failed: {e}", ctrl.name(), ep.remote.name);
                Flow::Continue
            }
            TxStatus::Done | TxStatus::Started => Flow::Continue,
        }
    }

    /// An [`Action::Ctrl`] for endpoint `id`, which failed or closed (or went) since: the
    /// message is dropped and the endpoint no longer busy. False: it is to be sent.
    #[inline]
    pub fn ctrl_dropped_if_gone(&mut self, id: Id) -> bool {
        match self.eps.get_mut(id) {
            None => true,
            Some(ep) if ep.error().is_some() => {
                ep.busy = false;
                true
            }
            Some(_) => false,
        }
    }

    /// The driver made transmission `tx` of endpoint `id` (or the lane refused it).
    pub fn tx_done(&mut self, id: Id, tx: Tx<L>, res: TxResult) -> Flow {
        let Some(ep) = self.eps.get_mut(id) else { return Flow::Continue };
        ep.busy = false;
        let step = match tx.of {
            TxOf::Wireup | TxOf::Ctrl | TxOf::ReplyCtrl => {
                let TxOp::Ctrl(c) = tx.op else { return Flow::Continue };
                match res.status {
                    TxStatus::NoResource => {
                        if ep.error().is_none() {
                            match tx.of {
                                TxOf::Wireup => ep.wireup_q.push_front(c),
                                TxOf::ReplyCtrl => ep.reply_q.push_front(Reply::Ctrl(c)),
                                _ => ep.queue.push_front(Pending::Ctrl(c)),
                            }
                        }
                        Step::Blocked
                    }
                    TxStatus::Failed(e) => {
                        tracing::warn!("ucp: sending {} to '{}' failed: {e}", c.name(), ep.remote.name);
                        Step::Finished
                    }
                    TxStatus::Done | TxStatus::Started => Step::Finished,
                }
            }
            TxOf::Flush => self.flush_lane_done(id, res),
            TxOf::Reply => {
                let len = if let TxOp::RmaGetData { len, .. } = tx.op { len } else { 0 };
                let step = self.reply_done(id, len, res);
                if step == Step::Finished {
                    if let Some(ep) = self.eps.get_mut(id) {
                        ep.reply_q.pop_front();
                    }
                }
                step
            }
            TxOf::Req { rid, offset, len } => {
                let front = match ep.queue.front() {
                    Some(&Pending::Send(r)) if r == rid => Pending::Send(r),
                    Some(&Pending::Rtr(r)) if r == rid => Pending::Rtr(r),
                    Some(&Pending::Get(r)) if r == rid => Pending::Get(r),
                    Some(&Pending::Put(r)) if r == rid => Pending::Put(r),
                    Some(&Pending::Rma(r)) if r == rid => Pending::Rma(r),
                    // The queue changed during the transmission (the endpoint failed): the
                    // operation was settled then; a zero-copy one completes through its token.
                    _ => return Flow::Continue,
                };
                let step = match front {
                    Pending::Send(_) => eager::send_done(self, rid, offset, len, &tx.op, res),
                    Pending::Rtr(_) => rndv::rtr_done(self, rid, res),
                    Pending::Get(_) => rndv::get_done(self, id, rid, res),
                    Pending::Put(_) => rndv::put_done(self, id, rid, res),
                    Pending::Rma(_) => crate::rma::done(self, rid, offset, len, res),
                    Pending::Ctrl(_) | Pending::Flush(_) => Step::Finished,
                };
                if step == Step::Finished {
                    if let Some(ep) = self.eps.get_mut(id) {
                        ep.queue.pop_front();
                    }
                }
                step
            }
        };
        match step {
            Step::Blocked => self.blocked(id, tx.lane),
            _ => Flow::Continue,
        }
    }

    /// A zero-copy operation completed.
    pub fn zc_done(&mut self, what: ZcDone, status: Status) {
        match what {
            ZcDone::EagerFrag { rid } => eager::frag_done(self, rid, status),
            ZcDone::Get { ep, rid, sreq } => rndv::get_complete(self, ep, rid, sreq, status),
            ZcDone::Put { ep, sreq, rreq } => rndv::put_complete(self, ep, sreq, rreq, status),
            ZcDone::Rma { rid } => crate::rma::zc_done(self, rid, status),
            ZcDone::Flush { ep } => self.flush_lane_complete(ep, status),
            ZcDone::TagRndv { rid } => rndv::tag_rndv_done(self, rid, status),
        }
    }
}
