//! The request handle of the raw API (`void *request`).

use ucs::idtable::Id;
use ucs::Status;

use super::Worker;
use crate::request::RecvInfo;

/// A handle to an operation in progress (`void *request`). Dropping it is `ucp_request_free`:
/// the operation continues and its callback still runs.
pub struct Request<'w> {
    pub(crate) worker: &'w Worker,
    pub(crate) id: Id,
}

impl std::fmt::Debug for Request<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("id", &self.id).field("status", &self.status()).finish()
    }
}

impl<'w> Request<'w> {
    /// `InProgress` while running, then the final status (`ucp_request_check_status`).
    #[inline]
    pub fn status(&self) -> Status {
        self.worker.request_status(self.id).0
    }

    /// True once completed.
    #[inline]
    pub fn is_completed(&self) -> bool {
        self.status() != Status::InProgress
    }

    /// For receives: what arrived (`ucp_tag_recv_request_test`); `None` while in progress.
    pub fn recv_info(&self) -> Option<RecvInfo> {
        let (s, info) = self.worker.request_status(self.id);
        (s != Status::InProgress).then_some(info)
    }

    /// Cancels the operation if it has not progressed too far (`ucp_request_cancel`): a posted
    /// receive not yet matched completes with `Canceled`.
    pub fn cancel(&self) {
        self.worker.request_cancel(self.id);
    }

    /// Progresses the worker until the request completes; returns its outcome.
    pub fn wait(self) -> Result<RecvInfo, Status> {
        loop {
            let (s, info) = self.worker.request_status(self.id);
            match s {
                Status::InProgress => {
                    self.worker.progress();
                }
                Status::Ok => return Ok(info),
                e => return Err(e),
            }
        }
    }

    /// The worker-wide id (for logs).
    pub fn id(&self) -> u64 {
        self.id.raw()
    }
}

impl Drop for Request<'_> {
    #[inline]
    fn drop(&mut self) {
        self.worker.request_release(self.id);
    }
}
