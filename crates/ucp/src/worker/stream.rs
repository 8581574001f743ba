//! The stream API (`ucp_stream_*`): a byte stream per endpoint.
//!
//! | UCX | here |
//! |---|---|
//! | `ucp_stream_send_nbx` | [`Endpoint::stream_send_nbx`] (raw), [`Endpoint::stream_send`] (owned buffer, a future) |
//! | `ucp_stream_recv_nbx` (`UCP_STREAM_RECV_FLAG_WAITALL`) | [`Endpoint::stream_recv_nbx`] (raw), [`Endpoint::stream_recv`] (owned buffer, a future); [`StreamRecvFlags::WAITALL`] |
//! | `ucp_stream_recv_data_nb`, `ucp_stream_data_release` | [`Endpoint::stream_recv_data_nb`]: a [`StreamData`] released when dropped |
//! | `ucp_stream_worker_poll` | [`Worker::stream_poll`] |

use bitflags::bitflags;
use ucs::UcsResult;

use super::am::AmData;
use super::data::{RecvData, RecvResult, SendData};
use super::future::{RecvFuture, SendFuture};
use super::{Endpoint, Request, Worker};
use crate::dt::UserBuf;
use crate::request::{RecvInfo, RequestParam};
use crate::stream::StreamRecvOut;

bitflags! {
    /// Stream receive flags (`ucp_stream_recv_flags_t`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct StreamRecvFlags: u32 {
        /// Complete only when the whole buffer is filled (`UCP_STREAM_RECV_FLAG_WAITALL`);
        /// without it a receive completes with the bytes there are (at least one).
        const WAITALL = 1 << 0;
    }
}

/// A piece of a stream received without a copy (`ucp_stream_recv_data_nb`): derefs to its
/// bytes, released (`ucp_stream_data_release`) when dropped.
pub type StreamData = AmData;

impl Endpoint {
    /// Sends `data` on the endpoint's stream (`ucp_stream_send_nbx`). `Ok(None)`: completed
    /// at once.
    ///
    /// # Safety
    /// The data (every iov entry, and an iov list itself) must stay valid and unmodified until
    /// the request completes.
    pub unsafe fn stream_send_nbx(&self, data: SendData<'_>, param: RequestParam) -> UcsResult<Option<Request<'_>>> {
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return super::data::invalid_data() };
        let r = e.core.stream_send(self.id, buf, param);
        let r = super::data::end_call(buf, r, Option::is_none)?;
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// [`stream_send_nbx`](Self::stream_send_nbx) without a request handle (as
    /// [`Endpoint::tag_send_nbx_detached`]): `Ok(true)`: completed at once, and no callback
    /// runs; `Ok(false)`: the callback reports the completion.
    ///
    /// # Safety
    /// As [`Endpoint::stream_send_nbx`].
    pub unsafe fn stream_send_nbx_detached(&self, data: SendData<'_>, param: RequestParam) -> UcsResult<bool> {
        let param = super::data::detach(param, "stream_send_nbx_detached")?;
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return super::data::invalid_data() };
        let r = e.core.stream_send(self.id, buf, param);
        Ok(super::data::end_call(buf, r, Option::is_none)?.is_none())
    }

    /// Sends an owned buffer on the stream; resolves to the buffer and the outcome.
    pub fn stream_send<B: AsRef<[u8]> + Send + 'static>(&self, data: B) -> SendFuture<B> {
        let boxed = Box::new(data);
        let s = boxed.as_ref().as_ref();
        let len = s.len();
        // SAFETY: the data is boxed and handed to the worker below; it is returned or freed
        // only after the request completed.
        let ub = unsafe { UserBuf::contig(s.as_ptr() as *mut u8, len) };
        let r = self.worker.enter().and_then(|e| e.core.stream_send(self.id, ub, RequestParam::new()));
        SendFuture { inner: RecvFuture::owned(&self.worker, boxed, r, RecvInfo { length: len, sender_tag: 0 }) }
    }

    /// Receives from the endpoint's stream into `data` (`ucp_stream_recv_nbx`): completes with
    /// the bytes there are (at least one; [`RecvInfo::length`] says how many), or with
    /// [`StreamRecvFlags::WAITALL`] when `data` is full. Bytes go to receives in the order
    /// they were posted.
    ///
    /// # Safety
    /// The buffer (every iov entry, and an iov list itself) must stay valid, and not be
    /// accessed, until the request completes.
    pub unsafe fn stream_recv_nbx(
        &self,
        data: RecvData<'_>,
        flags: StreamRecvFlags,
        param: RequestParam,
    ) -> UcsResult<RecvResult<'_>> {
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return super::data::invalid_data() };
        let r = e.core.stream_recv(self.id, buf, flags.contains(StreamRecvFlags::WAITALL), param);
        Ok(match super::data::end_call(buf, r, |o| matches!(o, StreamRecvOut::Done(_)))? {
            StreamRecvOut::Done(n) => RecvResult::Done(RecvInfo { length: n, sender_tag: 0 }),
            StreamRecvOut::Req(id) => RecvResult::Pending(Request { worker: &self.worker, id }),
        })
    }

    /// [`stream_recv_nbx`](Self::stream_recv_nbx) without a request handle (as
    /// [`Worker::tag_recv_nbx_detached`](crate::Worker::tag_recv_nbx_detached); in C, a request
    /// freed right away or in its callback with `ucp_request_free`): `Ok(Some(info))`:
    /// completed at once, and no callback runs; `Ok(None)`: the callback reports the completion
    /// and how many bytes arrived ([`RecvInfo::length`]). Such a receive cannot be cancelled on
    /// its own; one still waiting when the endpoint fails or closes completes with the error.
    /// `NO_IMM_CMPL` asks for a handle, so it is refused (`InvalidParam`).
    ///
    /// # Safety
    /// As [`Endpoint::stream_recv_nbx`].
    pub unsafe fn stream_recv_nbx_detached(
        &self,
        data: RecvData<'_>,
        flags: StreamRecvFlags,
        param: RequestParam,
    ) -> UcsResult<Option<RecvInfo>> {
        let param = super::data::detach(param, "stream_recv_nbx_detached")?;
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return super::data::invalid_data() };
        let r = e.core.stream_recv(self.id, buf, flags.contains(StreamRecvFlags::WAITALL), param);
        Ok(match super::data::end_call(buf, r, |o| matches!(o, StreamRecvOut::Done(_)))? {
            StreamRecvOut::Done(n) => Some(RecvInfo { length: n, sender_tag: 0 }),
            StreamRecvOut::Req(_) => None,
        })
    }

    /// Receives from the stream into an owned buffer; resolves to the buffer and what arrived
    /// (its first [`RecvInfo::length`] bytes). Dropping a pending future cancels the receive:
    /// bytes it had taken go back to the stream, for the next receive.
    pub fn stream_recv<B>(&self, buf: B, flags: StreamRecvFlags) -> RecvFuture<B>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        let mut boxed = Box::new(buf);
        let s = boxed.as_mut().as_mut();
        // SAFETY: the buffer is boxed and handed to the worker below before any data can
        // arrive into it from progress; the worker frees or returns it only once the request
        // completed.
        let ub = unsafe { UserBuf::contig(s.as_mut_ptr(), s.len()) };
        let waitall = flags.contains(StreamRecvFlags::WAITALL);
        let r = self.worker.enter().and_then(|e| e.core.stream_recv(self.id, ub, waitall, RequestParam::new()));
        let (r, n) = match r {
            Ok(StreamRecvOut::Done(n)) => (Ok(None), n),
            Ok(StreamRecvOut::Req(rid)) => (Ok(Some(rid)), 0),
            Err(e) => (Err(e), 0),
        };
        RecvFuture::owned(&self.worker, boxed, r, RecvInfo { length: n, sender_tag: 0 })
    }

    /// The oldest piece of the stream that arrived and no receive took, without a copy
    /// (`ucp_stream_recv_data_nb`); `None` when there is none (or receives wait for bytes).
    pub fn stream_recv_data_nb(&self) -> UcsResult<Option<StreamData>> {
        let e = self.worker.enter()?;
        Ok(e.core.stream_recv_data(self.id).map(|(kept, p, n)| AmData::new(self.worker.clone(), kept, p, n)))
    }
}

impl Worker {
    /// The endpoints whose streams have bytes to receive (`ucp_stream_worker_poll`): each once
    /// until more bytes come; up to `max`.
    pub fn stream_poll(&self, max: usize) -> UcsResult<Vec<Endpoint>> {
        let e = self.enter()?;
        Ok(e.core.stream_poll(max).into_iter().map(|id| Endpoint { worker: self.clone(), id }).collect())
    }

    /// Releases a piece of a stream (`ucp_stream_data_release`); the same as dropping it.
    pub fn stream_data_release(&self, data: StreamData) {
        drop(data);
    }
}
