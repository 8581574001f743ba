//! Active messages (`ucp_am_*`): handlers by 16-bit id, sends with a user header, and data a
//! handler keeps beyond its call.
//!
//! | UCX | here |
//! |---|---|
//! | `ucp_worker_set_am_recv_handler` | [`Worker::set_am_recv_handler`] (`None` removes) |
//! | `ucp_am_recv_callback_t` | `Fn(&mut AmMsg<'_>)`: header, data, [`AmMsg::reply_ep`], [`AmMsg::data_persistent`] |
//! | returning `UCS_INPROGRESS` | [`AmMsg::take_data`]: an [`AmData`] that holds the data |
//! | `ucp_am_data_release` | dropping the [`AmData`] (or [`Worker::am_data_release`]) |
//! | `UCP_AM_RECV_ATTR_FLAG_RNDV`, the descriptor | [`AmMsg::is_rndv`], [`AmMsg::take_rndv`]: an [`AmRndv`] |
//! | `ucp_am_recv_data_nbx` | [`Worker::am_recv_data_nbx`] (raw), [`Worker::am_recv_data`] (owned buffer, a future) |
//! | `ucp_am_send_nbx` | [`Endpoint::am_send_nbx`] (raw), [`Endpoint::am_send`] (owned buffers, a future) |
//! | `ucp_worker_query`'s `max_am_header` | [`Worker::am_max_header`] |

use std::ops::Deref;
use std::sync::Weak;

use bitflags::bitflags;
use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::data::{RecvData, SendData};
use super::future::{RecvFuture, SendFuture};
use super::{Endpoint, Request, Shared, Worker};
use crate::core::am::{AmEntry, AmIn};
use crate::dt::UserBuf;
use crate::proto::Force;
use crate::request::{RecvInfo, RequestParam};

bitflags! {
    /// How a handler takes its messages (`ucp_am_cb_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AmHandlerFlags: u32 {
        /// The whole message in one call (`UCP_AM_FLAG_WHOLE_MSG`). Messages are always
        /// delivered whole, with or without this flag, as in UCX.
        const WHOLE_MSG = 1 << 0;
        /// The data of every message can be kept ([`AmMsg::take_data`] never returns `None`;
        /// `UCP_AM_FLAG_PERSISTENT_DATA`): a message that arrived inline in the transport's
        /// buffer is copied before the handler runs.
        const PERSISTENT_DATA = 1 << 1;
    }
}

bitflags! {
    /// How an active message goes (`ucp_send_am_flags`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct AmSendFlags: u32 {
        /// The receiver's handler gets an endpoint to reply on (`UCP_AM_SEND_FLAG_REPLY`).
        const REPLY = 1 << 0;
        /// Eager protocols only (`UCP_AM_SEND_FLAG_EAGER`).
        const EAGER = 1 << 1;
        /// Rendezvous only (`UCP_AM_SEND_FLAG_RNDV`).
        const RNDV = 1 << 2;
        /// The header is copied, so it need only be valid during the call
        /// (`UCP_AM_SEND_FLAG_COPY_HEADER`).
        const COPY_HEADER = 1 << 3;
    }
}

/// An arrived active message, as its handler sees it.
pub struct AmMsg<'a> {
    inner: AmIn<'a>,
    reply: Option<Endpoint>,
    worker: &'a Weak<Shared>,
}

impl<'a> AmMsg<'a> {
    /// The id it was sent with.
    pub fn id(&self) -> u16 {
        self.inner.id
    }

    /// The user header (valid during the call).
    pub fn header(&self) -> &[u8] {
        self.inner.hdr
    }

    /// The data (valid during the call; see [`AmMsg::take_data`]). Empty for a rendezvous
    /// message ([`AmMsg::is_rndv`]), whose data is received with [`Worker::am_recv_data_nbx`].
    pub fn data(&self) -> &[u8] {
        self.inner.data
    }

    /// The data's length (of a rendezvous message: what its sender sends).
    pub fn length(&self) -> usize {
        self.inner.length
    }

    /// Whether the message came by rendezvous (`UCP_AM_RECV_ATTR_FLAG_RNDV`): its data is
    /// still with the sender; take the descriptor ([`AmMsg::take_rndv`]) to receive it, now
    /// or later. Not taken, the data is dropped when the handler returns and the sender's
    /// send completes.
    pub fn is_rndv(&self) -> bool {
        self.inner.rndv.is_some()
    }

    /// Takes a rendezvous message's descriptor (UCX's callback returning `UCS_INPROGRESS`
    /// with it); `None` for an eager message, or when taken already.
    pub fn take_rndv(&mut self) -> Option<AmRndv> {
        let desc = self.inner.rndv?;
        let worker = self.take()?;
        Some(AmRndv { worker, desc, length: self.inner.length, used: false })
    }

    /// Marks what the message holds (kept data or a descriptor) as the caller's: the worker
    /// for the handle; `None` when taken already.
    fn take(&mut self) -> Option<Worker> {
        if self.inner.taken.get() {
            return None;
        }
        let worker = self.worker()?;
        self.inner.taken.set(true);
        Some(worker)
    }

    /// The worker the message arrived on (to receive a rendezvous message's data from inside
    /// the handler, say); `None` only while the worker is being destroyed.
    pub fn worker(&self) -> Option<Worker> {
        self.worker.upgrade().map(|shared| Worker { shared })
    }

    /// The endpoint to reply on, when the sender asked for one ([`AmSendFlags::REPLY`];
    /// `UCP_AM_RECV_ATTR_FIELD_REPLY_EP`).
    pub fn reply_ep(&self) -> Option<&Endpoint> {
        self.reply.as_ref()
    }

    /// Whether the data can be kept beyond the call (`UCP_AM_RECV_ATTR_FLAG_DATA`): it came in
    /// a transport descriptor or several fragments, or the handler was registered with
    /// [`AmHandlerFlags::PERSISTENT_DATA`].
    pub fn data_persistent(&self) -> bool {
        self.inner.keep.possible()
    }

    /// Keeps the data beyond the call (a handler returning `UCS_INPROGRESS` in UCX): the
    /// returned handle holds it until dropped. `None` when the data is not persistent
    /// ([`AmMsg::data_persistent`]) or was taken already.
    pub fn take_data(&mut self) -> Option<AmData> {
        if !self.inner.keep.possible() || self.inner.taken.get() {
            return None;
        }
        let worker = self.worker()?;
        let kept = self.inner.keep.entry()?;
        self.inner.taken.set(true);
        let (ptr, len) = (self.inner.data.as_ptr(), self.inner.data.len());
        Some(AmData { worker, kept, ptr, len })
    }
}

impl std::fmt::Debug for AmMsg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmMsg")
            .field("id", &self.inner.id)
            .field("header", &self.inner.hdr.len())
            .field("length", &self.inner.length)
            .field("rndv", &self.inner.rndv.is_some())
            .field("reply_ep", &self.reply)
            .field("persistent", &self.inner.keep.possible())
            .finish()
    }
}

/// An active message's data kept beyond its handler (`ucp_am_data_release` when dropped).
/// Derefs to the bytes, which stay where they are until the handle drops.
pub struct AmData {
    worker: Worker,
    kept: Id,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the bytes are only read through `&self` (nobody writes them while the handle
// lives), and the storage is released by `drop` inside the worker (entering it from any
// thread as the worker's thread mode allows).
unsafe impl Send for AmData {}
// SAFETY: as above; shared access only reads.
unsafe impl Sync for AmData {}

impl AmData {
    /// A handle on kept message `kept`, whose data is `len` bytes at `ptr`.
    pub(super) fn new(worker: Worker, kept: Id, ptr: *const u8, len: usize) -> AmData {
        AmData { worker, kept, ptr, len }
    }
}

impl Deref for AmData {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        // SAFETY: the kept message's storage does not move and lives until this handle
        // releases it in `drop` (`core::am`).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for AmData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmData").field("len", &self.len).finish()
    }
}

impl Drop for AmData {
    fn drop(&mut self) {
        // Outside the worker (a single-threaded worker's data dropped on another thread) the
        // message is leaked rather than released unsynchronized.
        if let Ok(e) = self.worker.enter() {
            e.core.am_release_into_engine(self.kept);
        } else {
            tracing::error!("AmData dropped outside its worker's thread; the message is leaked");
        }
    }
}

/// The descriptor of a rendezvous active message whose data is still with its sender: receive
/// it with [`Worker::am_recv_data_nbx`] or [`Worker::am_recv_data`]. Dropped without that, the
/// data is dropped and the sender's send completes with `Canceled` (UCX's
/// `ucp_am_data_release` of a rendezvous descriptor).
pub struct AmRndv {
    worker: Worker,
    desc: Id,
    length: usize,
    used: bool,
}

impl AmRndv {
    /// Length of the data the sender sends.
    pub fn length(&self) -> usize {
        self.length
    }
}

impl std::fmt::Debug for AmRndv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmRndv").field("length", &self.length).finish()
    }
}

impl Drop for AmRndv {
    fn drop(&mut self) {
        if self.used {
            return;
        }
        if let Ok(e) = self.worker.enter() {
            e.core.am_drop_rndv(self.desc, Status::Canceled);
        } else {
            tracing::error!("AmRndv dropped outside its worker's thread; the sender is not told");
        }
    }
}

impl Worker {
    /// Receives a rendezvous active message's data into `data` (`ucp_am_recv_data_nbx`), from
    /// inside its handler or later. The request completes once the data is there (or with
    /// `MessageTruncated` when `data` is shorter than [`AmRndv::length`]); the sender's send
    /// completes then too.
    ///
    /// # Safety
    /// The buffer (every iov entry, and an iov list itself) must stay valid, and not be
    /// accessed, until the request completes.
    pub unsafe fn am_recv_data_nbx(
        &self,
        mut desc: AmRndv,
        data: RecvData<'_>,
        param: RequestParam,
    ) -> UcsResult<Request<'_>> {
        desc.used = true;
        let e = self.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else {
            let r = super::data::invalid_data();
            e.core.am_drop_rndv(desc.desc, r.as_ref().err().copied().unwrap_or(Status::InvalidParam));
            return r;
        };
        let r = e.core.am_recv_data(desc.desc, buf, param);
        let rid = super::data::end_call(buf, r, |_| false)?;
        Ok(Request { worker: self, id: rid })
    }

    /// Receives a rendezvous active message's data into an owned buffer; resolves to the
    /// buffer and what arrived. Dropping the future cancels the receive (the buffer stays with
    /// the worker until no transport writes into it).
    pub fn am_recv_data<B>(&self, mut desc: AmRndv, buf: B) -> RecvFuture<B>
    where
        B: AsMut<[u8]> + Send + 'static,
    {
        desc.used = true;
        let mut boxed = Box::new(buf);
        let s = boxed.as_mut().as_mut();
        // SAFETY: the buffer is boxed and handed to the worker below before any data can
        // arrive into it from progress; the worker frees or returns it only once the request
        // completed.
        let ub = unsafe { UserBuf::contig(s.as_mut_ptr(), s.len()) };
        let r = self.enter().and_then(|e| e.core.am_recv_data(desc.desc, ub, RequestParam::new()));
        RecvFuture::owned(self, boxed, r.map(Some), RecvInfo::default())
    }

    /// Sets the handler of active-message id `id` (`ucp_worker_set_am_recv_handler`); `None`
    /// removes it. A message goes to the handler set when it arrived whole; one that arrives
    /// with no handler set is dropped (logged). The handler may send, reply, and set or
    /// remove handlers (its own included) from inside the call.
    pub fn set_am_recv_handler<F>(&self, id: u16, handler: Option<F>, flags: AmHandlerFlags) -> UcsResult<()>
    where
        F: Fn(&mut AmMsg<'_>) + Send + 'static,
    {
        let e = self.enter()?;
        let entry = handler.map(|f| {
            let weak = std::sync::Arc::downgrade(&self.shared);
            let cb = move |inner: AmIn<'_>| {
                let reply = match inner.reply {
                    Some(id) => match weak.upgrade() {
                        Some(shared) => Some(Endpoint { worker: Worker { shared }, id }),
                        None => return,
                    },
                    None => None,
                };
                let mut msg = AmMsg { inner, reply, worker: &weak };
                f(&mut msg);
            };
            AmEntry { cb: std::rc::Rc::new(cb), persistent: flags.contains(AmHandlerFlags::PERSISTENT_DATA) }
        });
        e.core.set_am_handler(id, entry);
        Ok(())
    }

    /// Releases kept active-message data (`ucp_am_data_release`); the same as dropping it.
    pub fn am_data_release(&self, data: AmData) {
        drop(data);
    }

    /// The largest user header an active message may carry (`max_am_header` of
    /// `ucp_worker_query`).
    pub fn am_max_header(&self) -> usize {
        self.enter().map_or(0, |e| e.core.am_max_header())
    }
}

#[cold]
#[inline(never)]
fn both_protocols<T>() -> UcsResult<T> {
    tracing::error!("am_send_nbx: the EAGER and RNDV flags exclude each other");
    Err(Status::InvalidParam)
}

impl Endpoint {
    /// Sends an active message (`ucp_am_send_nbx`): `header` (up to
    /// [`Worker::am_max_header`] bytes) and `data` to the handler of `id` on the peer.
    /// `Ok(None)`: completed at once.
    ///
    /// # Safety
    /// The data (every iov entry, and an iov list itself) must stay valid and unmodified until
    /// the request completes; so must the header, unless `flags` has
    /// [`AmSendFlags::COPY_HEADER`].
    pub unsafe fn am_send_nbx(
        &self,
        id: u16,
        header: &[u8],
        data: SendData<'_>,
        flags: AmSendFlags,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        // SAFETY: forwarded from the caller.
        let r = unsafe { self.am_send_raw(id, header, data, flags, param)? };
        Ok(r.map(|rid| Request { worker: &self.worker, id: rid }))
    }

    /// [`am_send_nbx`](Self::am_send_nbx) without a request handle, for a caller that learns
    /// of the completion from the parameters' callback alone (as
    /// [`Endpoint::tag_send_nbx_detached`]). `Ok(true)`: completed at once, and no callback
    /// runs; `Ok(false)`: the callback reports the completion.
    ///
    /// # Safety
    /// As [`Endpoint::am_send_nbx`].
    #[inline]
    pub unsafe fn am_send_nbx_detached(
        &self,
        id: u16,
        header: &[u8],
        data: SendData<'_>,
        flags: AmSendFlags,
        param: RequestParam,
    ) -> UcsResult<bool> {
        let param = super::data::detach(param, "am_send_nbx_detached")?;
        // SAFETY: forwarded from the caller.
        Ok(unsafe { self.am_send_raw(id, header, data, flags, param)? }.is_none())
    }

    /// # Safety
    /// As [`Endpoint::am_send_nbx`].
    #[inline(always)]
    unsafe fn am_send_raw(
        &self,
        id: u16,
        header: &[u8],
        data: SendData<'_>,
        flags: AmSendFlags,
        mut param: RequestParam,
    ) -> UcsResult<Option<Id>> {
        let force = match (flags.contains(AmSendFlags::EAGER), flags.contains(AmSendFlags::RNDV)) {
            (false, false) => Force::Auto,
            (true, false) => Force::Eager,
            (false, true) => Force::Rndv,
            (true, true) => return both_protocols(),
        };
        let e = self.worker.enter()?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_buf() }) else { return super::data::invalid_data() };
        let hdr = if flags.contains(AmSendFlags::COPY_HEADER) && !header.is_empty() {
            copy_header(header, &mut param)
        } else {
            // SAFETY: the caller's promise: valid until the send completes.
            unsafe { UserBuf::contig(header.as_ptr() as *mut u8, header.len()) }
        };
        let r = e.core.am_send(self.id, id, hdr, buf, flags.contains(AmSendFlags::REPLY), force, param);
        super::data::end_call(buf, r, Option::is_none)
    }
}

/// A copy of an active message's header that lives until the send completes: in the
/// request's callback (dropped when it completes, or at once when the send completes at once).
#[cold]
#[inline(never)]
fn copy_header(header: &[u8], param: &mut RequestParam) -> UserBuf {
    let copy: Box<[u8]> = header.into();
    // SAFETY: the box's bytes do not move and live until the callback is dropped,
    // which the request does only once the send completed.
    let hdr = unsafe { UserBuf::contig(copy.as_ptr() as *mut u8, copy.len()) };
    let user = param.callback.take();
    param.callback = Some(Box::new(move |st, info| {
        drop(copy);
        if let Some(cb) = user {
            cb(st, info);
        }
    }));
    hdr
}

impl Endpoint {
    /// Sends an active message with owned header and data; resolves to the data and the
    /// outcome. Dropping the future does not stop the send.
    pub fn am_send<B: AsRef<[u8]> + Send + 'static>(
        &self,
        id: u16,
        header: &[u8],
        data: B,
        flags: AmSendFlags,
    ) -> SendFuture<B> {
        let boxed = Box::new(data);
        let s = boxed.as_ref().as_ref();
        let len = s.len();
        let flags = flags | AmSendFlags::COPY_HEADER;
        // SAFETY: the data is boxed and handed to the worker below; it is returned or freed
        // only after the request completed; the header is copied (COPY_HEADER).
        let r = unsafe { self.am_send_raw(id, header, SendData::Contig(s), flags, RequestParam::new()) };
        SendFuture { inner: RecvFuture::owned(&self.worker, boxed, r, RecvInfo { length: len, sender_tag: 0 }) }
    }

    /// Sends an active message and progresses the worker until the send completed.
    pub fn am_send_blocking(&self, id: u16, header: &[u8], data: &[u8], flags: AmSendFlags) -> UcsResult<()> {
        // SAFETY: header and data stay borrowed until the request completed (the wait below).
        match unsafe { self.am_send_nbx(id, header, SendData::Contig(data), flags, RequestParam::new())? } {
            None => Ok(()),
            Some(r) => r.wait().map(|_| ()),
        }
    }
}
