//! Pending requests: what a caller queues on an endpoint after `NoResource`, and the per-interface
//! queue transports keep them in (an arbiter with one group per endpoint, so endpoints are served
//! round robin).

use std::cell::RefCell;
use std::rc::Rc;

use ucs::arbiter::{ArbResult, Arbiter, GroupId};

/// What a pending request's callback achieved.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingOutcome {
    /// The request is done: remove it (`UCS_OK`).
    Done,
    /// Progress was made but the request stays; serve other endpoints next (`UCS_INPROGRESS`).
    KeepContinue,
    /// No resources: keep the request and stop dispatching (`UCS_ERR_NO_RESOURCE`).
    KeepStop,
}

/// A request waiting for send resources on an endpoint (`uct_pending_req_t`).
///
/// The callback is called when the endpoint may have resources again; it typically retries the
/// operation that returned `NoResource`.
pub trait PendingReq {
    /// Retries the operation.
    fn progress(&self) -> PendingOutcome;
}

/// A queued request. Reference counted so the caller may keep its own handle to it.
pub type PendingHandle = Rc<dyn PendingReq>;

/// Per-interface pending queue shared by transport implementations.
///
/// Dispatch takes each request out of the queue while its callback runs, so callbacks may add
/// requests (to any endpoint) re-entrantly.
#[derive(Default)]
pub struct PendingQueue {
    arb: RefCell<Arbiter<PendingHandle>>,
}

impl PendingQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A group for a new endpoint.
    pub fn add_group(&self) -> GroupId {
        self.arb.borrow_mut().add_group()
    }

    /// Removes an endpoint's group, handing back its requests.
    pub fn remove_group(&self, g: GroupId, mut sink: impl FnMut(PendingHandle)) {
        let mut taken = Vec::new();
        self.arb.borrow_mut().remove_group(g, |r| taken.push(r));
        taken.into_iter().for_each(&mut sink);
    }

    /// Queues `req` at the tail of the endpoint's group.
    pub fn push(&self, g: GroupId, req: PendingHandle) {
        self.arb.borrow_mut().push(g, req);
    }

    /// True when no request waits on any endpoint.
    pub fn is_empty(&self) -> bool {
        self.arb.borrow().is_empty()
    }

    /// True when no request waits on endpoint `g`.
    pub fn group_is_empty(&self, g: GroupId) -> bool {
        self.arb.borrow().group_is_empty(g)
    }

    /// Removes every request of endpoint `g`, handing each to `sink`.
    pub fn purge(&self, g: GroupId, mut sink: impl FnMut(PendingHandle)) {
        let mut taken = Vec::new();
        self.arb.borrow_mut().purge(g, |r| taken.push(r));
        taken.into_iter().for_each(&mut sink);
    }

    /// Reschedules endpoint `g` (after it was descheduled for lack of its own resources).
    pub fn schedule(&self, g: GroupId) {
        self.arb.borrow_mut().schedule(g);
    }

    /// Calls pending requests round robin over endpoints while `has_resources(group)` allows;
    /// an endpoint without resources of its own is descheduled until [`PendingQueue::schedule`].
    /// Returns the number of requests completed.
    pub fn dispatch(&self, mut has_resources: impl FnMut(GroupId) -> bool) -> usize {
        let mut done = 0;
        let mut idle_steps = 0;
        loop {
            let budget = self.arb.borrow().num_scheduled();
            if budget == 0 || idle_steps >= budget {
                return done;
            }
            let Some((g, req)) = self.arb.borrow_mut().pop_next() else {
                return done;
            };
            if !has_resources(g) {
                self.arb.borrow_mut().resolve(g, Some(req), ArbResult::DeschedGroup);
                idle_steps += 1;
                continue;
            }
            match req.progress() {
                PendingOutcome::Done => {
                    self.arb.borrow_mut().resolve(g, None, ArbResult::RemoveElem);
                    done += 1;
                    idle_steps = 0;
                }
                PendingOutcome::KeepContinue => {
                    self.arb.borrow_mut().resolve(g, Some(req), ArbResult::NextGroup);
                    idle_steps += 1;
                }
                PendingOutcome::KeepStop => {
                    self.arb.borrow_mut().resolve(g, Some(req), ArbResult::Stop);
                    return done;
                }
            }
        }
    }
}
