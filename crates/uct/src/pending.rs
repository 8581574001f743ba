//! Pending requests: what a caller queues on an endpoint after `NoResource`, and the per-interface
//! queue transports keep them in (an arbiter with one group per endpoint, so endpoints are served
//! round robin).

use std::cell::{Cell, RefCell};
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

/// Whether an endpoint may send now, as a transport sees it during dispatch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resources {
    /// Resources are available: call the request.
    Available,
    /// The interface as a whole is out of resources: stop dispatching, every endpoint stays
    /// scheduled.
    IfaceExhausted,
    /// This endpoint alone is out of resources: skip it until the transport calls
    /// [`PendingQueue::schedule`] for it.
    EpExhausted,
    /// This endpoint is out of resources for now (e.g. its peer's FIFO is full): skip it in this
    /// round but keep it scheduled, so a later dispatch checks it again.
    EpNotReady,
}

/// Per-interface pending queue shared by transport implementations.
///
/// Dispatch takes each request out of the queue while its callback runs, so callbacks may add
/// and purge requests (on any endpoint) re-entrantly. Transports keep per-endpoint ordering with
/// [`PendingQueue::may_send`]: while an endpoint has queued requests, new operations on it must
/// return `NoResource` unless they come from that endpoint's own pending callback.
#[derive(Default)]
pub struct PendingQueue {
    arb: RefCell<Arbiter<PendingHandle>>,
    /// Requests queued on all endpoints: lets the send fast path skip the arbiter entirely.
    queued: Cell<usize>,
    /// The endpoint whose request is running, if dispatch is under way.
    dispatching: Cell<Option<GroupId>>,
    /// Every live group, for [`PendingQueue::clear`].
    groups: RefCell<Vec<GroupId>>,
}

impl PendingQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// A group for a new endpoint.
    pub fn add_group(&self) -> GroupId {
        let g = self.arb.borrow_mut().add_group();
        self.groups.borrow_mut().push(g);
        g
    }

    /// Removes an endpoint's group; its requests are dropped (after the queue is released, so
    /// their destructors may use it).
    pub fn remove_group(&self, g: GroupId) {
        let mut taken = Vec::new();
        self.arb.borrow_mut().remove_group(g, |r| taken.push(r));
        self.groups.borrow_mut().retain(|&x| x != g);
        self.queued.set(self.queued.get() - taken.len());
        drop(taken);
    }

    /// Queues `req` at the tail of the endpoint's group.
    pub fn push(&self, g: GroupId, req: PendingHandle) {
        let rejected = self.arb.borrow_mut().push(g, req);
        match rejected {
            None => self.queued.set(self.queued.get() + 1),
            Some(r) => drop(r),
        }
    }

    /// True when no request waits on any endpoint.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.queued.get() == 0
    }

    /// True when no request waits on endpoint `g`.
    #[inline]
    pub fn group_is_empty(&self, g: GroupId) -> bool {
        self.queued.get() == 0 || self.arb.borrow().group_is_empty(g)
    }

    /// True when a new operation on endpoint `g` keeps per-endpoint order: nothing is queued
    /// on it, or the call comes from its own pending callback.
    #[inline]
    pub fn may_send(&self, g: GroupId) -> bool {
        self.queued.get() == 0 || self.dispatching.get() == Some(g) || self.arb.borrow().group_is_empty(g)
    }

    /// Removes every request of endpoint `g`, handing each to `sink`.
    pub fn purge(&self, g: GroupId, mut sink: impl FnMut(PendingHandle)) {
        let mut taken = Vec::new();
        self.arb.borrow_mut().purge(g, |r| taken.push(r));
        self.queued.set(self.queued.get() - taken.len());
        taken.into_iter().for_each(&mut sink);
    }

    /// Drops every request of every endpoint (e.g. when the interface closes, to break
    /// reference cycles through requests that hold endpoints).
    pub fn clear(&self) {
        let groups: Vec<GroupId> = self.groups.borrow().clone();
        for g in groups {
            self.purge(g, drop);
        }
    }

    /// Reschedules endpoint `g` after [`Resources::EpExhausted`] once it has resources again.
    pub fn schedule(&self, g: GroupId) {
        self.arb.borrow_mut().schedule(g);
    }

    /// Calls pending requests round robin over endpoints while `resources(group)` allows.
    /// Returns the number of requests completed.
    pub fn dispatch(&self, mut resources: impl FnMut(GroupId) -> Resources) -> usize {
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
            let verdict = match resources(g) {
                Resources::Available => {
                    self.dispatching.set(Some(g));
                    let outcome = req.progress();
                    self.dispatching.set(None);
                    match outcome {
                        PendingOutcome::Done => ArbResult::RemoveElem,
                        PendingOutcome::KeepContinue => ArbResult::NextGroup,
                        PendingOutcome::KeepStop => ArbResult::Stop,
                    }
                }
                Resources::IfaceExhausted => ArbResult::Stop,
                Resources::EpExhausted => ArbResult::DeschedGroup,
                Resources::EpNotReady => ArbResult::NextGroup,
            };
            let elem = if verdict == ArbResult::RemoveElem { None } else { Some(req.clone()) };
            // The group may have been removed or purged while the callback ran; then the
            // request comes back and is dropped here, outside the borrow.
            let returned = self.arb.borrow_mut().resolve(g, elem, verdict);
            let removed = verdict == ArbResult::RemoveElem || returned.is_some();
            if removed {
                self.queued.set(self.queued.get().saturating_sub(1));
            }
            drop(returned);
            drop(req);
            match verdict {
                ArbResult::RemoveElem => {
                    done += 1;
                    idle_steps = 0;
                }
                ArbResult::Stop => return done,
                // A group that keeps its place without finishing a request: after a whole round
                // of those, stop. A descheduled group leaves the schedule, which is progress.
                ArbResult::NextGroup => idle_steps += 1,
                ArbResult::DeschedGroup => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Req {
        log: Rc<RefCell<Vec<u32>>>,
        id: u32,
        outcomes: RefCell<Vec<PendingOutcome>>,
    }

    impl PendingReq for Req {
        fn progress(&self) -> PendingOutcome {
            self.log.borrow_mut().push(self.id);
            self.outcomes.borrow_mut().pop().unwrap_or(PendingOutcome::Done)
        }
    }

    fn req(log: &Rc<RefCell<Vec<u32>>>, id: u32, outcomes: &[PendingOutcome]) -> PendingHandle {
        Rc::new(Req { log: log.clone(), id, outcomes: RefCell::new(outcomes.iter().rev().copied().collect()) })
    }

    #[test]
    fn iface_exhaustion_keeps_everything_scheduled() {
        let q = PendingQueue::new();
        let log = Rc::default();
        let (a, b) = (q.add_group(), q.add_group());
        q.push(a, req(&log, 1, &[]));
        q.push(b, req(&log, 2, &[]));
        assert!(!q.may_send(a) && !q.may_send(b));
        // Out of resources several times: nothing runs, nothing is lost.
        for _ in 0..3 {
            assert_eq!(q.dispatch(|_| Resources::IfaceExhausted), 0);
        }
        assert_eq!(q.dispatch(|_| Resources::Available), 2);
        assert_eq!(*log.borrow(), [1, 2]);
        assert!(q.is_empty() && q.may_send(a));
    }

    #[test]
    fn ep_exhaustion_deschedules_until_scheduled() {
        let q = PendingQueue::new();
        let log = Rc::default();
        let (a, b) = (q.add_group(), q.add_group());
        q.push(a, req(&log, 1, &[]));
        q.push(b, req(&log, 2, &[]));
        assert_eq!(q.dispatch(|g| if g == a { Resources::EpExhausted } else { Resources::Available }), 1);
        assert_eq!(q.dispatch(|_| Resources::Available), 0, "a stays descheduled");
        q.schedule(a);
        assert_eq!(q.dispatch(|_| Resources::Available), 1);
        assert_eq!(*log.borrow(), [2, 1]);
    }

    #[test]
    fn ep_not_ready_stays_scheduled() {
        let q = PendingQueue::new();
        let log = Rc::default();
        let (a, b) = (q.add_group(), q.add_group());
        q.push(a, req(&log, 1, &[]));
        q.push(b, req(&log, 2, &[]));
        assert_eq!(q.dispatch(|g| if g == a { Resources::EpNotReady } else { Resources::Available }), 1);
        assert_eq!(q.dispatch(|_| Resources::Available), 1, "a is checked again without schedule()");
        assert_eq!(*log.borrow(), [2, 1]);
    }

    #[test]
    fn round_robin_and_reentrant_callbacks() {
        let q = Rc::new(PendingQueue::new());
        let log: Rc<RefCell<Vec<u32>>> = Rc::default();
        let (a, b) = (q.add_group(), q.add_group());
        use PendingOutcome::*;
        q.push(a, req(&log, 1, &[KeepContinue, KeepContinue, Done]));
        q.push(b, req(&log, 2, &[KeepContinue, Done]));
        // A request that adds another request to its own group and purges group b.
        struct Adder(Rc<PendingQueue>, GroupId, GroupId, Rc<RefCell<Vec<u32>>>);
        impl PendingReq for Adder {
            fn progress(&self) -> PendingOutcome {
                self.3.borrow_mut().push(9);
                self.0.push(self.1, req(&self.3, 10, &[]));
                self.0.purge(self.2, drop);
                PendingOutcome::Done
            }
        }
        let mut total = 0;
        for _ in 0..10 {
            total += q.dispatch(|_| Resources::Available);
        }
        assert_eq!(total, 2);
        assert_eq!(*log.borrow(), [1, 2, 1, 2, 1]);
        let c = q.add_group();
        q.push(c, Rc::new(Adder(q.clone(), c, b, log.clone())));
        q.push(b, req(&log, 3, &[]));
        while q.dispatch(|_| Resources::Available) > 0 {}
        assert!(q.is_empty(), "queued count {}", q.queued.get());
        assert_eq!(log.borrow()[5..], [9, 10]);
    }
}
