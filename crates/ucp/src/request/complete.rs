//! How requests complete: under the engine, a request is marked complete (and freed when the
//! user let go of it); what calls out to the user - callbacks, a future's waker, dropping a
//! buffer the worker held for a future - is returned as a [`Done`] and run by the driver once
//! the engine is released, since a callback may call the worker again.

use std::task::Waker;

use ucs::idtable::{Id, Occupied};
use ucs::Status;

use super::{Callback, CallbackFn, RecvInfo, ReqExt, ReqKind, ReqState, Reqs};
use crate::tag::matcher::Tag;

/// The plain callback of a request completed and freed already (the common case): what is
/// left to do outside the engine. Small, so the 8-byte receive path hands it back by value.
#[derive(Clone, Copy)]
pub(crate) struct Done {
    f: CallbackFn,
    data: usize,
    status: Status,
    info: RecvInfo,
}

impl std::fmt::Debug for Done {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Done({})", self.status)
    }
}

impl Done {
    /// Runs the callback.
    #[inline(always)]
    pub fn run(self) {
        (self.f)(self.status, self.info, self.data)
    }
}

/// What [`Reqs::deliver_expected`] did.
pub(crate) enum Delivered {
    /// No receive waits for the tag: nothing changed.
    NoMatch,
    /// Delivered; a plain callback to run, if the request had one.
    Done(Option<Done>),
    /// Delivered into request `id`, which needs [`Reqs::complete_full`] with this status.
    Full(Id, Status),
    /// Receive `id` matched but was posted to a transport's tag matching too: taken off the
    /// queues, nothing delivered (the caller cancels it there, then delivers).
    Offloaded(Id),
}

/// What remains of completing a request that had more than a plain callback.
pub(crate) struct CompletedFull {
    status: Status,
    info: RecvInfo,
    cb_fn: Option<(CallbackFn, usize)>,
    callback: Option<Callback>,
    waker: Option<Waker>,
    owned: Option<Box<dyn std::any::Any + Send>>,
    dt: Option<std::rc::Rc<crate::dt::GenState>>,
}

impl std::fmt::Debug for CompletedFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompletedFull({})", self.status)
    }
}

impl CompletedFull {
    /// Drops a held buffer and a generic datatype's state (its `finish`), runs the callbacks,
    /// wakes the future.
    #[inline(never)]
    pub fn run(self) {
        let CompletedFull { status, info, cb_fn, callback, waker, owned, dt } = self;
        drop(owned);
        drop(dt);
        if let Some(cb) = callback {
            cb(status, info);
        }
        if let Some((f, data)) = cb_fn {
            f(status, info, data);
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A request completed at creation (`NO_IMM_CMPL` on an operation that completed at once):
/// its callbacks run, and it stays for the caller to read.
pub(crate) fn completed_at_once(
    callback: Option<Callback>,
    cb_fn: Option<(CallbackFn, usize)>,
    status: Status,
    info: RecvInfo,
) -> CompletedFull {
    CompletedFull { status, info, cb_fn, callback, waker: None, owned: None, dt: None }
}

impl Reqs {
    /// Completes request `id` with `status` (once; later calls and unknown ids are ignored):
    /// `Ok` with the plain callback to run, if any, when the request was freed on the fast
    /// path; `Err(status)` when it needs [`Reqs::complete_full`] (not done yet).
    #[inline]
    pub fn finish(&mut self, id: Id, status: Status) -> Result<Option<Done>, Status> {
        self.complete_with(id, |_| Some(status))
    }

    /// [`Self::finish`] with the status from `fill`, which sees the request first (to deliver
    /// data into it) under the same lookup; `fill` returning `None` leaves the request as it
    /// was. The protocol state (registrations, keys) is dropped with the request.
    #[inline(always)]
    pub fn complete_with(
        &mut self,
        id: Id,
        fill: impl FnOnce(&mut ReqState) -> Option<Status>,
    ) -> Result<Option<Done>, Status> {
        let Some(mut entry) = self.tab.occupied(id) else { return Ok(None) };
        let r = entry.get_mut();
        if r.status != Status::InProgress {
            return Ok(None);
        }
        let Some(status) = fill(r) else { return Ok(None) };
        Self::complete_fast(entry, status).map_err(|()| status)
    }

    /// Takes the earliest receive posted for `tag` off the expected queues and delivers the
    /// whole message `payload` into it.
    #[inline(always)]
    pub fn deliver_expected(&mut self, tag: Tag, payload: &[u8]) -> Delivered {
        let Some(i) = self.exp.take(&mut self.tab, tag) else { return Delivered::NoMatch };
        let Some(mut entry) = self.tab.occupied_at(i) else { return Delivered::Done(None) };
        let r = entry.get_mut();
        if r.status != Status::InProgress {
            return Delivered::Done(None);
        }
        if r.exp.is_offloaded() {
            return Delivered::Offloaded(entry.id());
        }
        let Some(status) = fill_whole(r, tag, payload) else { return Delivered::Done(None) };
        let id = entry.id();
        match Self::complete_fast(entry, status) {
            Ok(done) => Delivered::Done(done),
            Err(()) => Delivered::Full(id, status),
        }
    }

    /// Takes the earliest receive posted for `tag` off the expected queues; its id.
    #[inline]
    pub fn take_expected(&mut self, tag: Tag) -> Option<Id> {
        let i = self.exp.take(&mut self.tab, tag)?;
        self.tab.occupied_at(i).map(|mut e| e.id())
    }

    /// The completion of a request the user let go of with at most a plain callback (the
    /// common case): frees it. `Err` when it needs [`Reqs::complete_full`] (a handle, a
    /// waker, a callback box or a held buffer, or a receive still posted).
    #[inline(always)]
    fn complete_fast(mut entry: Occupied<'_, ReqState>, status: Status) -> Result<Option<Done>, ()> {
        let r = entry.get_mut();
        if !(r.released && r.ext.is_none()) || r.exp.is_posted() {
            return Err(());
        }
        let (info, cb_fn) = (r.info, r.cb_fn);
        if r.owns_nothing() {
            entry.discard_owning_nothing();
        } else {
            entry.discard();
        }
        Ok(cb_fn.map(|(f, data)| Done { f, data, status, info }))
    }
}

/// Copies a whole message into the receive `r` (nothing past its buffer); the status.
#[inline(always)]
pub(crate) fn fill_whole(r: &mut ReqState, tag: Tag, payload: &[u8]) -> Option<Status> {
    let ReqKind::Recv(rr) = &mut r.kind else { return None };
    let status = match rr.buf.copy_in(0, payload) {
        Ok(()) => Status::Ok,
        Err(e) => e,
    };
    r.info = RecvInfo { length: payload.len(), sender_tag: tag };
    Some(status)
}

impl Reqs {
    /// A completion of a request still held, or with a callback, waker or owned buffer: marks
    /// it complete with `status` and frees it if the user released it; the callbacks, waker
    /// and a user's buffer are returned.
    #[inline(never)]
    pub fn complete_full(&mut self, id: Id, status: Status) -> Option<CompletedFull> {
        // A receive completed while still posted (not by a match or a cancel, which take it
        // off first) leaves the queues now, before its slot can be freed.
        self.unpost(id);
        let r = self.tab.get_mut(id)?;
        // A generic datatype's state goes now (dropped outside the engine: the user's
        // `finish`), and a callback's error is what the request reports.
        let dt = r.ext.as_mut().and_then(|e| e.dt.take());
        let status = crate::dt::fold_status(status, dt.as_deref());
        r.status = status;
        let info = r.info;
        let cb_fn = r.cb_fn.take();
        let (callback, waker, owned) = if r.released {
            let taken = r.take_ext();
            self.tab.discard(id);
            taken
        } else {
            r.kind = ReqKind::Done;
            // An owned buffer stays for the future to take back.
            match &mut r.ext {
                Some(e) => (e.callback.take(), e.waker.take(), None),
                None => (None, None, None),
            }
        };
        if cb_fn.is_none() && callback.is_none() && waker.is_none() && owned.is_none() && dt.is_none() {
            return None;
        }
        Some(CompletedFull { status, info, cb_fn, callback, waker, owned, dt })
    }

    /// Status and receive info of a request (`NoElem` for an unknown one).
    #[inline]
    pub fn status(&self, id: Id) -> (Status, RecvInfo) {
        match self.tab.get(id) {
            Some(r) => (r.status, r.info),
            None => (Status::NoElem, RecvInfo::default()),
        }
    }

    /// The user dropped the handle: free now if complete, else when it completes. Returns what
    /// must be dropped outside the engine (a callback or buffer may run user code in `drop`).
    #[inline]
    pub fn release(&mut self, id: Id) -> Option<Box<ReqExt>> {
        let r = self.tab.get_mut(id)?;
        if r.status == Status::InProgress {
            r.released = true;
            if let Some(e) = &mut r.ext {
                e.waker = None;
            }
            return None;
        }
        let ext = r.ext.take();
        self.tab.discard(id);
        ext
    }
}
