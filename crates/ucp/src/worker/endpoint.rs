//! Endpoints (`ucp_ep_h`): the tag send API, query and close.

use ucs::idtable::Id;
use ucs::UcsResult;

use super::data::{detach, SendData};
use super::future::{RecvFuture, SendFuture};
use super::Request;
use super::Worker;
use crate::dt::UserBuf;
use crate::request::{RecvInfo, RequestParam};
use crate::tag::Tag;

pub use crate::core::lanes::{EpInfo, LaneInfo};

/// How [`Endpoint::close`] ends an endpoint (`UCP_EP_CLOSE_MODE_*`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseMode {
    /// Outstanding operations finish and the transports flush first.
    Flush,
    /// Outstanding operations complete with `Canceled` now.
    Force,
}

/// An endpoint (`ucp_ep_h`). Clones name the same endpoint; it lives until
/// [`Endpoint::close`] or until the worker goes.
#[derive(Clone)]
pub struct Endpoint {
    pub(crate) worker: Worker,
    pub(crate) id: Id,
}

/// Handles are equal when they name the same endpoint of the same worker (as `ucp_ep_h`
/// pointers compare).
impl PartialEq for Endpoint {
    fn eq(&self, o: &Endpoint) -> bool {
        self.id == o.id && std::sync::Arc::ptr_eq(&self.worker.shared, &o.worker.shared)
    }
}

impl Eq for Endpoint {}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint").field("id", &self.id).finish()
    }
}

impl Endpoint {
    /// The worker.
    pub fn worker(&self) -> &Worker {
        &self.worker
    }

    /// Sends a tagged message (`ucp_tag_send_nbx`). `Ok(None)`: completed at once.
    ///
    /// # Safety
    /// The send buffer (every iov entry) must stay valid and unmodified until the request
    /// completes, and so must an iov list itself (read in place, as in UCX).
    #[inline]
    pub unsafe fn tag_send_nbx(
        &self,
        data: SendData<'_>,
        tag: Tag,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.send_nbx(data, tag, false, param) }
    }

    /// Synchronous send (`ucp_tag_send_sync_nbx`): completes once the receiver matched it.
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    pub unsafe fn tag_send_sync_nbx(
        &self,
        data: SendData<'_>,
        tag: Tag,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        unsafe { self.send_nbx(data, tag, true, param) }
    }

    /// [`tag_send_nbx`](Self::tag_send_nbx) without a request handle, for a caller that learns
    /// of the completion from the parameters' callback alone (see
    /// [`Worker::tag_recv_nbx_detached`]). `Ok(true)`: completed at once, and no callback runs;
    /// `Ok(false)`: the callback reports the completion, possibly already inside this call (a
    /// message sent whole from the request path, or a synchronous send over `self`).
    /// `NO_IMM_CMPL` is refused (`InvalidParam`).
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    pub unsafe fn tag_send_nbx_detached(&self, data: SendData<'_>, tag: Tag, param: RequestParam) -> UcsResult<bool> {
        let param = detach(param, "tag_send_nbx_detached")?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { self.send_raw(data, tag, false, param)? }.is_none())
    }

    /// [`tag_send_sync_nbx`](Self::tag_send_sync_nbx) without a request handle, as
    /// [`tag_send_nbx_detached`](Self::tag_send_nbx_detached).
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    pub unsafe fn tag_send_sync_nbx_detached(
        &self,
        data: SendData<'_>,
        tag: Tag,
        param: RequestParam,
    ) -> UcsResult<bool> {
        let param = detach(param, "tag_send_sync_nbx_detached")?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { self.send_raw(data, tag, true, param)? }.is_none())
    }

    /// A tagged send entered into the core; the id of its request, if it did not complete at
    /// once.
    ///
    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline(always)]
    unsafe fn send_raw(&self, data: SendData<'_>, tag: Tag, sync: bool, param: RequestParam) -> UcsResult<Option<Id>> {
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return super::data::invalid_data() };
        let r = e.core.tag_send(self.id, buf, tag, sync, param);
        super::data::end_call(buf, r, Option::is_none)
    }

    /// # Safety
    /// As [`Endpoint::tag_send_nbx`].
    #[inline]
    unsafe fn send_nbx(
        &self,
        data: SendData<'_>,
        tag: Tag,
        sync: bool,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.send_raw(data, tag, sync, param)? };
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// Sends `data` and progresses the worker until the send completed.
    pub fn tag_send_blocking(&self, data: &[u8], tag: Tag) -> UcsResult<()> {
        // SAFETY: `data` stays borrowed until the request completed (the wait below).
        match unsafe { self.tag_send_nbx(SendData::Contig(data), tag, RequestParam::new())? } {
            None => Ok(()),
            Some(r) => r.wait().map(|_| ()),
        }
    }

    /// Sends an owned buffer; resolves to the buffer and the outcome.
    pub fn tag_send<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, tag: Tag) -> SendFuture<B> {
        self.send_owned(buf, tag, false)
    }

    /// Synchronous send of an owned buffer: resolves once the receiver matched it.
    pub fn tag_send_sync<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, tag: Tag) -> SendFuture<B> {
        self.send_owned(buf, tag, true)
    }

    fn send_owned<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, tag: Tag, sync: bool) -> SendFuture<B> {
        let boxed = Box::new(buf);
        let s = boxed.as_ref().as_ref();
        let len = s.len();
        // SAFETY: the buffer is boxed and handed to the worker below; it is returned or freed
        // only after the request completed.
        let ub = unsafe { UserBuf::contig(s.as_ptr() as *mut u8, len) };
        let r = self.worker.enter().and_then(|e| e.core.tag_send(self.id, ub, tag, sync, RequestParam::new()));
        SendFuture { inner: RecvFuture::owned(&self.worker, boxed, r, RecvInfo { length: len, sender_tag: tag }) }
    }

    /// Names the transport of each lane (`ucp_ep_query`).
    pub fn query(&self) -> UcsResult<EpInfo> {
        self.worker.enter()?.core.ep_query(self.id)
    }

    /// Starts closing (`ucp_ep_close_nbx`); the request completes when the endpoint is gone.
    pub fn close_nbx(&self, mode: CloseMode) -> UcsResult<Request<'_>> {
        let e = self.worker.enter()?;
        let rid = e.core.ep_close(self.id, mode == CloseMode::Force);
        Ok(Request { worker: &self.worker, id: rid })
    }

    /// Closes and waits.
    pub fn close(self, mode: CloseMode) -> UcsResult<()> {
        self.close_nbx(mode)?.wait().map(|_| ())
    }
}
