//! Flush (`ucp_ep_flush_nbx`, `ucp_worker_flush_nbx`) and fence (`ucp_worker_fence`).
//!
//! A flush waits in its endpoint's queue ([`Pending::Flush`]) behind everything issued
//! before it. At the front it flushes the endpoint's lanes one after the other: each lane's
//! transport completes what it still holds (for remote memory access: the data reached the
//! target), possibly later through a completion ([`ZcDone::Flush`]). A worker flush is one
//! request over every endpoint; it completes when the last endpoint is flushed.
//!
//! A fence is a flush without a request, queued on every endpoint that did remote memory
//! access since its last flush or fence: operations after it queue behind it, so none of them
//! starts before every operation before the fence completed (UCX's strong fence).

use ucs::idtable::Id;
use ucs::Status;

use crate::engine::{Action, Pending, Shared, Step, TxResult, TxStatus};
use crate::request::{ReqKind, ReqState, Reqs};

/// A flush in flight: endpoints still to flush, and the first error.
#[derive(Debug)]
pub(crate) struct FlushReq {
    pub remaining: u32,
    pub error: Option<Status>,
}

/// Where one endpoint's flush stands (its entry in the endpoint's queue).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FlushPos {
    /// The flush request (`None`: a fence).
    pub rid: Option<Id>,
    /// The next lane to flush.
    pub lane: u8,
    /// The lane's flush is in flight.
    pub waiting: bool,
}

impl<L: Clone> Shared<L> {
    /// Starts flushing `eps` for a request made from `param`; `None` when there is nothing to
    /// flush (no endpoint), i.e. it completed at once.
    pub(crate) fn flush_start(
        &mut self,
        eps: &[Id],
        param: crate::request::RequestParam,
    ) -> Result<Option<Id>, Status> {
        if let [one] = eps {
            if let Some(e) = self.eps.get(*one).and_then(|e| e.error()) {
                return Err(e);
            }
        }
        let n = eps.iter().filter(|id| self.eps.contains(**id)).count();
        if n == 0 {
            return Ok(None);
        }
        let req = FlushReq { remaining: n as u32, error: None };
        let rid =
            self.reqs.tab.insert(ReqState::new(ReqKind::Flush(req), param.callback, param.callback_fn, param.detached));
        for &id in eps {
            if !self.eps.contains(id) {
                continue;
            }
            match self.eps.get_mut(id) {
                Some(ep) if ep.error().is_none() => {
                    ep.rma_dirty = false;
                    self.enqueue(id, Pending::Flush(FlushPos { rid: Some(rid), lane: 0, waiting: false }));
                }
                Some(ep) => {
                    let st = ep.error().unwrap_or(Status::Canceled);
                    ep_flushed(&mut self.reqs, &mut self.actions, rid, st);
                }
                None => ep_flushed(&mut self.reqs, &mut self.actions, rid, Status::Ok),
            }
        }
        Ok(Some(rid))
    }

    /// Fences every endpoint that did remote memory access since its last flush or fence.
    pub(crate) fn fence(&mut self) {
        let dirty: Vec<Id> =
            self.eps.iter().filter(|(_, e)| e.rma_dirty && e.error().is_none()).map(|(id, _)| id).collect();
        for id in dirty {
            if let Some(ep) = self.eps.get_mut(id) {
                ep.rma_dirty = false;
            }
            self.enqueue(id, Pending::Flush(FlushPos { rid: None, lane: 0, waiting: false }));
        }
    }

    /// The driver flushed (or could not flush) the lane at the front flush of endpoint `id`.
    pub(crate) fn flush_lane_done(&mut self, id: Id, res: TxResult) -> Step {
        let Some(ep) = self.eps.get_mut(id) else { return Step::Finished };
        let lanes = ep.cfg.uct_lanes;
        let Some(Pending::Flush(pos)) = ep.queue.front_mut() else { return Step::Finished };
        match res.status {
            TxStatus::NoResource => return Step::Blocked,
            TxStatus::Started => pos.waiting = true,
            // The flush message of emulated operations went: wait for the peer's reply.
            TxStatus::Done if pos.lane == lanes => {
                pos.waiting = true;
                ep.sw_unacked = false;
            }
            TxStatus::Done => pos.lane += 1,
            TxStatus::Failed(e) => {
                pos.lane += 1;
                if let Some(rid) = pos.rid {
                    if let Some(ReqState { kind: ReqKind::Flush(f), .. }) = self.reqs.tab.get_mut(rid) {
                        f.error.get_or_insert(e);
                    }
                }
            }
        }
        Step::More
    }

    /// The flush of the current lane of endpoint `id` completed.
    pub(crate) fn flush_lane_complete(&mut self, id: Id, status: Status) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        let Some(Pending::Flush(pos)) = ep.queue.front_mut() else { return };
        if !pos.waiting {
            return;
        }
        pos.waiting = false;
        pos.lane += 1;
        if status.is_err() {
            if let Some(rid) = pos.rid {
                if let Some(ReqState { kind: ReqKind::Flush(f), .. }) = self.reqs.tab.get_mut(rid) {
                    f.error.get_or_insert(status);
                }
            }
        }
        self.kick(id);
    }
}

/// One endpoint of flush request `rid` is flushed (with `status`); the request completes with
/// the last.
pub(crate) fn ep_flushed<L>(
    reqs: &mut Reqs,
    actions: &mut std::collections::VecDeque<Action<L>>,
    rid: Id,
    status: Status,
) {
    let Some(ReqState { kind: ReqKind::Flush(f), status: Status::InProgress, .. }) = reqs.tab.get_mut(rid) else {
        return;
    };
    if status.is_err() {
        f.error.get_or_insert(status);
    }
    f.remaining = f.remaining.saturating_sub(1);
    if f.remaining > 0 {
        return;
    }
    let st = f.error.unwrap_or(Status::Ok);
    match reqs.finish(rid, st) {
        Ok(Some(d)) => actions.push_back(Action::Done(d)),
        Ok(None) => {}
        Err(st) => {
            if let Some(c) = reqs.complete_full(rid, st) {
                actions.push_back(Action::Full(c));
            }
        }
    }
}
