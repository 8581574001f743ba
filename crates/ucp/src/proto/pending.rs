//! An endpoint's queue, served by protocol: the front operation's protocol describes its next
//! transmission ([`Shared::next_tx`]) and takes the driver's report of it
//! ([`Shared::tx_done`]). The operation stays at the front until it needs nothing more from
//! the queue (all its pieces went), so operations never overtake each other.

use ucs::idtable::Id;
use ucs::Status;

use super::{eager, rndv, Proto};
use crate::dt::UserBuf;
use crate::engine::ep::{EpStatus, Park};
use crate::engine::{Action, Flow, Lane, Next, Pending, Shared, Step, Tx, TxOf, TxOp, TxResult, TxStatus, ZcDone};
use crate::request::{ReqKind, ReqState, SendPhase};
use crate::tag::Tag;

/// A whole eager message at the front of an endpoint's queue, for the driver to send straight
/// to the AM lane ([`Shared::front_eager`]).
pub(crate) struct FrontEager<L> {
    /// The endpoint's lanes.
    pub io: L,
    /// The send's request.
    pub rid: Id,
    /// Eager short or bcopy.
    pub proto: Proto,
    pub buf: UserBuf,
    pub tag: Tag,
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
            return None;
        }
        if let Some(c) = ep.wireup_q.pop_front() {
            ep.busy = true;
            return Some(Tx { io: ep.io.clone(), lane: Lane::Wireup, op: TxOp::Ctrl(c), of: TxOf::Wireup });
        }
        if ep.status != EpStatus::Connected || ep.park == Park::Parked {
            return None;
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

    /// The common case of a replay, without a [`Tx`]: a send at the front of endpoint `id`'s
    /// queue that goes whole in one eager short or bcopy message (not synchronous), the
    /// endpoint connected with nothing else to send first. The driver sends it as the direct
    /// path does and reports with [`Shared::eager_replayed`]; the endpoint is busy until then.
    /// `None`: anything else ([`Shared::next_tx`] has it).
    #[inline]
    pub fn front_eager(&mut self, id: Id) -> Option<FrontEager<L>> {
        let Shared { eps, reqs, .. } = self;
        let ep = eps.get_mut(id)?;
        if ep.busy || ep.status != EpStatus::Connected || ep.park == Park::Parked || !ep.wireup_q.is_empty() {
            return None;
        }
        let &Pending::Send(rid) = ep.queue.front()? else { return None };
        let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = reqs.tab.get(rid) else {
            return None;
        };
        if s.phase != SendPhase::Queued || s.sync || !matches!(s.proto, Proto::EagerShort | Proto::EagerBcopy) {
            return None;
        }
        ep.kicked = false;
        ep.busy = true;
        Some(FrontEager { io: ep.io.clone(), rid, proto: s.proto, buf: s.buf, tag: s.tag })
    }

    /// The driver sent (or the lane refused) the message [`Shared::front_eager`] gave it.
    #[inline]
    pub fn eager_replayed(&mut self, id: Id, rid: Id, proto: Proto, status: TxStatus) -> Flow {
        let Some(ep) = self.eps.get_mut(id) else { return Flow::Continue };
        ep.busy = false;
        if status == TxStatus::NoResource {
            return self.blocked(id, Lane::Am);
        }
        // The queue changed during the call (the endpoint failed): the send was settled then.
        if !matches!(ep.queue.front(), Some(&Pending::Send(r)) if r == rid) {
            return Flow::Continue;
        }
        ep.queue.pop_front();
        match status {
            TxStatus::Failed(e) => self.finish(rid, e),
            _ => {
                if proto == Proto::EagerShort {
                    self.counts.eager_short += 1;
                } else {
                    self.counts.eager_bcopy += 1;
                }
                self.finish(rid, Status::Ok);
            }
        }
        Flow::Continue
    }

    /// The driver made transmission `tx` of endpoint `id` (or the lane refused it).
    pub fn tx_done(&mut self, id: Id, tx: Tx<L>, res: TxResult) -> Flow {
        let Some(ep) = self.eps.get_mut(id) else { return Flow::Continue };
        ep.busy = false;
        let step = match tx.of {
            TxOf::Wireup | TxOf::Ctrl => {
                let TxOp::Ctrl(c) = tx.op else { return Flow::Continue };
                match res.status {
                    TxStatus::NoResource => {
                        if ep.error().is_none() {
                            if tx.of == TxOf::Wireup {
                                ep.wireup_q.push_front(c);
                            } else {
                                ep.queue.push_front(Pending::Ctrl(c));
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
            TxOf::Req { rid, offset, len } => {
                let front = match ep.queue.front() {
                    Some(&Pending::Send(r)) if r == rid => Pending::Send(r),
                    Some(&Pending::Rtr(r)) if r == rid => Pending::Rtr(r),
                    Some(&Pending::Get(r)) if r == rid => Pending::Get(r),
                    Some(&Pending::Put(r)) if r == rid => Pending::Put(r),
                    // The queue changed during the transmission (the endpoint failed): the
                    // operation was settled then; a zero-copy one completes through its token.
                    _ => return Flow::Continue,
                };
                let step = match front {
                    Pending::Send(_) => eager::send_done(self, rid, offset, len, &tx.op, res),
                    Pending::Rtr(_) => rndv::rtr_done(self, rid, res),
                    Pending::Get(_) => rndv::get_done(self, id, rid, res),
                    Pending::Put(_) => rndv::put_done(self, id, rid, res),
                    Pending::Ctrl(_) => Step::Finished,
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
        }
    }
}
