//! Futures over owned buffers (the safe API): the buffer lives inside the worker until the
//! transport is done with it; a minimal executor; the progress driver and event source of
//! async runtimes.

use std::future::Future;
use std::os::fd::RawFd;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::task::{Context as TaskContext, Poll};

use ucs::idtable::Id;
use ucs::Status;

use super::Worker;
use crate::request::RecvInfo;

pub(crate) enum FutState<B> {
    Ready(Option<B>, Result<RecvInfo, Status>),
    Pending(Id),
    Gone,
}

/// A receive into an owned buffer; resolves to `(buffer, outcome)`. Polling progresses the
/// worker once; while pending it asks to be polled again at once (busy polling), so it runs
/// under any executor without a separate progress task.
pub struct RecvFuture<B: 'static> {
    pub(crate) worker: Worker,
    pub(crate) state: FutState<B>,
}

impl<B: Send + 'static> RecvFuture<B> {
    /// The future of an operation on the owned buffer `boxed`, given how starting it went:
    /// `Ok(None)`, completed at once with `done`; `Ok(Some(id))`, request `id`, which holds the
    /// buffer until it completes; an error, at once.
    pub(crate) fn owned(worker: &Worker, boxed: Box<B>, r: ucs::UcsResult<Option<Id>>, done: RecvInfo) -> Self {
        let state = match r {
            Ok(None) => FutState::Ready(Some(*boxed), Ok(done)),
            Err(e) => FutState::Ready(Some(*boxed), Err(e)),
            Ok(Some(id)) => {
                worker.give(id, boxed);
                FutState::Pending(id)
            }
        };
        RecvFuture { worker: worker.clone(), state }
    }
}

impl<B: 'static> Unpin for RecvFuture<B> {}

impl<B: 'static> Future for RecvFuture<B> {
    type Output = (B, Result<RecvInfo, Status>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        match std::mem::replace(&mut self.state, FutState::Gone) {
            FutState::Ready(Some(b), r) => Poll::Ready((b, r)),
            FutState::Pending(id) => {
                let driven = self.worker.driven();
                if !driven && self.worker.request_status(id).0 == Status::InProgress {
                    self.worker.progress();
                }
                if self.worker.register_waker(id, cx.waker()) == Status::InProgress {
                    self.state = FutState::Pending(id);
                    if !driven {
                        cx.waker().wake_by_ref();
                    }
                    return Poll::Pending;
                }
                let (b, status, info) = self.worker.take_back::<B>(id);
                match b {
                    Some(b) => Poll::Ready((b, if status.is_err() { Err(status) } else { Ok(info) })),
                    None => {
                        // Only if the worker refused entry (wrong thread): nothing to return.
                        self.state = FutState::Gone;
                        Poll::Pending
                    }
                }
            }
            FutState::Ready(None, _) | FutState::Gone => Poll::Pending,
        }
    }
}

impl<B: 'static> Drop for RecvFuture<B> {
    fn drop(&mut self) {
        if let FutState::Pending(id) = self.state {
            // Cancel a receive still waiting for a match; anything further along keeps its
            // buffer inside the worker until the transport is done.
            self.worker.request_cancel(id);
            self.worker.request_release(id);
        }
    }
}

/// A send of an owned buffer; resolves to `(buffer, outcome)`. Dropping it does not stop the
/// send: the worker keeps the buffer until the transport is done with it.
pub struct SendFuture<B: 'static> {
    pub(crate) inner: RecvFuture<B>,
}

impl<B: 'static> Future for SendFuture<B> {
    type Output = (B, Result<(), Status>);

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.inner).poll(cx).map(|(b, r)| (b, r.map(|_| ())))
    }
}

impl<B: 'static> Drop for SendFuture<B> {
    fn drop(&mut self) {
        if let FutState::Pending(id) = self.inner.state {
            self.inner.state = FutState::Gone;
            self.inner.worker.request_release(id);
        }
    }
}

/// A worker's event descriptor together with a handle that keeps it open (see
/// [`Worker::event_source`]).
#[derive(Debug, Clone)]
pub struct EventSource {
    pub(crate) worker: Worker,
    pub(crate) fd: RawFd,
}

impl EventSource {
    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }
}

impl std::os::fd::AsRawFd for EventSource {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl std::os::fd::AsFd for EventSource {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor belongs to the worker's wakeup set, which the worker handle in
        // `self` keeps open (it closes only when the last handle drops), so it is valid for the
        // borrow of `self`.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.fd) }
    }
}

/// Keeps the futures of a worker from progressing it while alive; see
/// [`Worker::progress_driver`].
#[derive(Debug)]
pub struct ProgressDriver {
    pub(crate) worker: Worker,
}

impl ProgressDriver {
    /// The driven worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }
}

impl Drop for ProgressDriver {
    fn drop(&mut self) {
        self.worker.shared.drivers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Runs a future to completion on this thread (a minimal executor for examples and tests).
pub fn block_on<F: Future>(fut: F) -> F::Output {
    use std::task::{RawWaker, RawWakerVTable, Waker};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: the vtable's functions ignore the data pointer and do nothing.
    let waker = unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) };
    let mut cx = TaskContext::from_waker(&waker);
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return v;
        }
    }
}
