//! Tag protocols: eager short, eager bcopy (one fragment or many), eager zero-copy, eager sync,
//! and rendezvous (get_zcopy, put_zcopy, or data in active messages), on both sides.
//!
//! Protocol choice for a message of `len` bytes on an endpoint (see `EpConfig`):
//! `len < short_lim` and not sync: eager short; `len < rndv_thresh`: eager zero-copy from
//! `zcopy_thresh` for a contiguous buffer (the same messages as bcopy, sent from the user's
//! registered buffer), else eager bcopy, one fragment when it fits, else first + middle
//! fragments; otherwise rendezvous. Every message from one
//! endpoint goes through its AM lane in order, and matching happens when the first piece (the
//! only fragment, the first fragment or the RTS) arrives, so messages never overtake each
//! other.

use std::rc::Rc;

use ucs::idtable::Id;
use ucs::{Outcome, Status, UcsResult};

use crate::core::{Core, FragTarget, Rts, Unexp, ZcDone};
use crate::ep::{Ctrl, Ep, Pending};
use crate::request::{
    zc_mut, Buf, RecvInfo, RecvReq, ReqKind, ReqState, RequestFlags, RequestParam, SendPhase, SendReq,
};
use crate::tag::Tag;
use crate::wire::{self, len, Header};
use crate::RndvScheme;

/// Reassembly buffers kept for reuse by a worker.
const FRAG_BUFS_KEPT: usize = 16;
/// Largest capacity of a kept reassembly buffer (messages up to the rendezvous threshold fit).
const FRAG_BUF_KEPT_MAX: usize = 256 * 1024;

/// Outcome of a receive call.
#[derive(Debug)]
pub(crate) enum RecvOut {
    /// Completed at once.
    Done(RecvInfo),
    /// In progress (or completed with NO_IMM_CMPL).
    Req(Id),
}

/// A view of a contiguous segment's bytes (empty for zero length, whatever the pointer).
///
/// # Safety
/// For a non-zero length, `ptr` must be valid for reads of `len` bytes for the returned life.
#[inline]
unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: non-null and readable for `len` bytes (the caller's guarantee).
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// A tag send's arguments, carried along its paths off the common one.
struct TagSend {
    ep: Rc<Ep>,
    ep_id: Id,
    buf: Buf,
    tag: Tag,
    sync: bool,
    param: RequestParam,
}

impl Core {
    // ---- send side ---------------------------------------------------------------------------

    /// Starts a tagged send. `Ok(None)`: completed at once.
    ///
    /// # Safety
    /// The buffers in `buf` must stay valid and unmodified until the request completes.
    #[inline(always)]
    pub unsafe fn tag_send(
        &self,
        ep_id: Id,
        buf: Buf,
        tag: Tag,
        sync: bool,
        param: RequestParam,
    ) -> UcsResult<Option<Id>> {
        let Some(ep) = self.ep(ep_id) else {
            return Self::no_endpoint(ep_id);
        };
        // The common case first: a connected endpoint with nothing queued (so no error and
        // nothing to replay) and a message that may complete at once.
        if Self::may_complete_now(&ep, &buf, sync, &param) && ep.ready() {
            if let Some(seg) = Self::short_seg(&ep, &buf) {
                // Eager short, tested here rather than through `eager_now`'s wrapped outcome.
                let r = self.send_short(&ep, seg, tag);
                if let Ok(Outcome::Done(())) = r {
                    return Ok(None);
                }
                return self.eager_not_done(TagSend { ep, ep_id, buf, tag, sync, param }, r);
            }
            return match self.eager_bcopy_now(&ep, &buf, tag) {
                Some(Ok(Outcome::Done(()))) => Ok(None),
                Some(r) => self.eager_not_done(TagSend { ep, ep_id, buf, tag, sync, param }, r),
                // More than one fragment: the request path.
                None => self.tag_send_queued(TagSend { ep, ep_id, buf, tag, sync, param }, true).map(Some),
            };
        }
        self.tag_send_general(TagSend { ep, ep_id, buf, tag, sync, param })
    }

    /// Whether a send may complete before it returns: not synchronous, under the rendezvous
    /// threshold, and allowed to (no `NO_IMM_CMPL`).
    #[inline(always)]
    fn may_complete_now(ep: &Ep, buf: &Buf, sync: bool, param: &RequestParam) -> bool {
        !sync && buf.len() < ep.cfg.rndv_thresh && !param.flags.contains(RequestFlags::NO_IMM_CMPL)
    }

    #[cold]
    #[inline(never)]
    fn no_endpoint<T>(ep_id: Id) -> UcsResult<T> {
        tracing::error!("tag send: endpoint {ep_id:?} does not exist (closed?)");
        Err(Status::InvalidParam)
    }

    /// What an immediate eager attempt that did not complete leads to: a full lane queues the
    /// send (without trying again at once), an error fails it.
    #[inline(never)]
    fn eager_not_done(&self, s: TagSend, r: UcsResult<Outcome<()>>) -> UcsResult<Option<Id>> {
        match r {
            Ok(Outcome::NoResource) => self.tag_send_queued(s, false).map(Some),
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A send off the common path: a failed, closed or not yet ready endpoint (replaying what
    /// it queued first), a synchronous or large message, or one that must not complete at once.
    #[inline(never)]
    fn tag_send_general(&self, s: TagSend) -> UcsResult<Option<Id>> {
        if let Some(e) = s.ep.error() {
            return Err(e);
        }
        if Self::may_complete_now(&s.ep, &s.buf, s.sync, &s.param) && self.ready_after_replay(&s.ep) {
            if let Some(r) = self.eager_now(&s.ep, &s.buf, s.tag) {
                return self.eager_not_done(s, r);
            }
        }
        self.tag_send_queued(s, true).map(Some)
    }

    /// The request path of a send: starts it now if the endpoint is ready and `try_now`, else
    /// queues it.
    #[inline(never)]
    fn tag_send_queued(&self, s: TagSend, try_now: bool) -> UcsResult<Id> {
        let TagSend { ep, ep_id, buf, tag, sync, param } = s;
        if param.flags.contains(RequestFlags::FORCE_IMM_CMPL) {
            return Err(Status::NoResource);
        }
        let len = buf.len();
        let req =
            SendReq { ep: ep_id, tag, buf, sync, phase: SendPhase::Queued, zc: None, hint: param.memh.map(|m| m.id) };
        let mut st = ReqState::new(ReqKind::Send(req), param.callback, param.callback_fn, param.detached);
        st.info = RecvInfo { length: len, sender_tag: tag };
        let rid = self.reqs.borrow_mut().insert(st);
        if !(try_now && ep.ready() && self.send_progress(&ep, rid)) {
            self.queue(&ep, Pending::Send(rid));
        }
        Ok(rid)
    }

    /// The immediate eager path: short, or one bcopy fragment; `None` when the message needs
    /// more than one fragment.
    #[inline]
    fn eager_now(&self, ep: &Ep, buf: &Buf, tag: Tag) -> Option<UcsResult<Outcome<()>>> {
        match Self::short_seg(ep, buf) {
            Some(seg) => Some(self.send_short(ep, seg, tag)),
            None => self.eager_bcopy_now(ep, buf, tag),
        }
    }

    /// [`Self::eager_now`] for a message that does not fit eager short: one bcopy fragment, or
    /// `None`.
    #[inline]
    fn eager_bcopy_now(&self, ep: &Ep, buf: &Buf, tag: Tag) -> Option<UcsResult<Outcome<()>>> {
        let len = buf.len();
        if len + len::EAGER_ONLY <= ep.cfg.bcopy_max && !Self::zcopy(ep, buf) {
            let r = ep.am().am_bcopy(
                wire::AM_EAGER_ONLY,
                // SAFETY: the buffer is valid (caller) and `len` bytes fit (checked above).
                &mut |dst| unsafe { pack_data(dst, &wire::EagerHdr { tag }, buf, 0, len) },
                uct::SendFlags::empty(),
            );
            if let Ok(Outcome::Done(_)) = r {
                self.count(|c| &mut c.eager_bcopy);
            }
            return Some(r.map(|o| o.map(|_| ())));
        }
        None
    }

    /// The buffer of a message that fits eager short on `ep` (contiguous, under the limit).
    #[inline]
    fn short_seg(ep: &Ep, buf: &Buf) -> Option<crate::request::Seg> {
        if buf.len() < ep.cfg.short_lim {
            buf.contig()
        } else {
            None
        }
    }

    /// Sends one eager-short message from `seg` (counted when it went out).
    #[inline(always)]
    fn send_short(&self, ep: &Ep, seg: crate::request::Seg, tag: Tag) -> uct::OpResult {
        // SAFETY: the caller of `tag_send` keeps the buffer valid until the send completes.
        let data = unsafe { bytes(seg.ptr, seg.len) };
        let r = ep.am().am_short(wire::AM_EAGER_ONLY, tag, data);
        if let Ok(Outcome::Done(())) = r {
            self.count(|c| &mut c.eager_short);
        }
        r
    }

    /// Whether an eager message goes zero-copy on `ep`.
    #[inline]
    fn zcopy(ep: &Ep, buf: &Buf) -> bool {
        let len = buf.len();
        len >= ep.cfg.zcopy_thresh && len > 0 && buf.contig().is_some()
    }

    /// Posts the eager zero-copy fragments of send `rid` (phase `Zcopy`) from the user's buffer,
    /// registered once; the request completes when the transport completed every fragment (a
    /// sync send: and the receiver matched). True unless the lane ran out of resources.
    fn send_zcopy(&self, ep: &Rc<Ep>, rid: Id) -> bool {
        let (seg, tag, sync, hint, (mut offset, mut msg_id), zc) = {
            let reqs = self.reqs.borrow();
            match reqs.get(rid) {
                Some(ReqState {
                    kind: ReqKind::Send(s @ SendReq { phase: SendPhase::Zcopy { offset, msg_id }, .. }),
                    status: Status::InProgress,
                    ..
                }) => match s.buf.contig() {
                    Some(seg) => (
                        seg,
                        s.tag,
                        s.sync,
                        s.hint,
                        (*offset, *msg_id),
                        s.zc.as_ref().and_then(|z| Some((z.comp.clone()?, z.memh.clone()))),
                    ),
                    None => return true,
                },
                _ => return true,
            }
        };
        let len = seg.len;
        let cfg = ep.cfg;
        let single = len + if sync { len::EAGER_SYNC_ONLY } else { len::EAGER_ONLY } <= cfg.zcopy_max;
        let (comp, memh) = match zc {
            Some(state) => state,
            None => {
                let memh = match self.memh_for(hint, ep.uct_eps[ep.am_idx].pair.local, seg.ptr, len) {
                    Ok(m) => m,
                    Err(e) => {
                        self.finish(rid, e);
                        return true;
                    }
                };
                // One count for "still posting"; one more per fragment in flight.
                let c = self.zc_completion(1, ZcDone::EagerSent { rid });
                if let Some(ReqState { kind: ReqKind::Send(s), .. }) = self.reqs.borrow_mut().get_mut(rid) {
                    let z = zc_mut(&self.zc_pool, &mut s.zc);
                    z.memh = Some(memh.clone());
                    z.comp = Some(c.clone());
                }
                self.count(|c| &mut c.eager_zcopy);
                if sync {
                    self.count(|c| &mut c.eager_sync);
                }
                if !single {
                    msg_id = self.msg_id();
                }
                (c, Some(memh))
            }
        };
        let set_phase = |offset: usize| {
            if let Some(ReqState { kind: ReqKind::Send(s), .. }) = self.reqs.borrow_mut().get_mut(rid) {
                s.phase = SendPhase::Zcopy { offset, msg_id };
            }
        };
        let (rep, sreq) = (ep.remote_id.get(), rid.raw());
        while offset < len {
            let mut hdr = [0u8; len::MAX_DATA_HDR];
            let (id, h) = match (single, sync) {
                (true, false) => encode(&mut hdr, &wire::EagerHdr { tag }),
                (true, true) => encode(&mut hdr, &wire::EagerSyncHdr { tag, ep: rep, sreq }),
                (false, _) => encode_frag(&mut hdr, FragHdr { tag, rep, msg_id, len, offset, sync, sreq }),
            };
            let n = (len - offset).min(cfg.zcopy_max - h);
            // SAFETY: `offset + n <= len`, inside the user's buffer.
            let ptr = unsafe { seg.ptr.add(offset) };
            let iov = [uct::Iov::new(ptr, n, memh.as_ref())];
            // SAFETY: the caller of tag_send keeps the buffer valid and unmodified until the
            // request completes, which is after the transport completed this fragment; the
            // registration lives in the request until then.
            let r = unsafe { ep.am().am_zcopy(id, &hdr[..h], &iov, uct::SendFlags::empty(), Some(&comp)) };
            match r {
                Ok(Outcome::NoResource) => {
                    set_phase(offset);
                    return false;
                }
                Ok(Outcome::InProgress) => comp.add_count(1),
                Ok(_) => {}
                Err(e) => {
                    set_phase(len);
                    comp.complete(e);
                    return true;
                }
            }
            offset += n;
        }
        set_phase(len);
        comp.complete(Status::Ok);
        true
    }

    /// A reusable zero-copy completion fired.
    pub(crate) fn zc_fired(&self, what: ZcDone, status: Status) {
        match what {
            ZcDone::Idle => {}
            ZcDone::EagerSent { rid } => self.zcopy_sent(rid, status),
            ZcDone::Get { ep, rid, sreq } => self.rndv_get_done(ep, rid, sreq, status),
            ZcDone::Put { ep, sreq, rreq } => self.rndv_put_done(ep, sreq, rreq, status),
        }
    }

    /// The transport completed every eager zero-copy fragment of send `rid`.
    fn zcopy_sent(&self, rid: Id, status: Status) {
        let sync = match self.reqs.borrow().get(rid) {
            Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) => s.sync,
            _ => return,
        };
        if status.is_err() {
            self.finish(rid, status);
        } else {
            self.sent_all(rid, sync);
        }
    }

    /// How send `rid` starts when it is queued and not started yet, for the two starts that
    /// need not take the buffer out and back: an eager-short send (the common retry after a
    /// full lane) and a rendezvous (its RTS). `None`: the general path.
    #[inline]
    fn quick_start(&self, ep: &Ep, rid: Id) -> Option<QuickStart> {
        let reqs = self.reqs.borrow();
        let Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) = reqs.get(rid) else {
            return None;
        };
        if !matches!(s.phase, SendPhase::Queued) {
            return None;
        }
        if s.buf.len() >= ep.cfg.rndv_thresh {
            return Some(QuickStart::Rts);
        }
        if s.sync || Self::zcopy(ep, &s.buf) {
            return None;
        }
        Some(QuickStart::Short(Self::short_seg(ep, &s.buf)?, s.tag))
    }

    /// Takes the user buffer out of a send request, so nothing is borrowed while sending.
    fn take_send(&self, rid: Id) -> Option<(Buf, Tag, bool, SendPhaseView)> {
        let mut reqs = self.reqs.borrow_mut();
        match reqs.get_mut(rid) {
            Some(ReqState { kind: ReqKind::Send(s), status: Status::InProgress, .. }) => {
                let buf = std::mem::replace(
                    &mut s.buf,
                    Buf::Contig(crate::request::Seg { ptr: std::ptr::null_mut(), len: 0 }),
                );
                let view = match s.phase {
                    SendPhase::Queued => SendPhaseView::Start,
                    SendPhase::Frags { offset, msg_id } => SendPhaseView::Frags { offset, msg_id },
                    SendPhase::Zcopy { .. } => SendPhaseView::Zcopy,
                    SendPhase::RndvFrags { rreq, offset } => SendPhaseView::RndvFrags { rreq, offset },
                    _ => SendPhaseView::Nothing,
                };
                Some((buf, s.tag, s.sync, view))
            }
            _ => None,
        }
    }

    /// Puts the buffer back and records the new phase; returns whether the request still runs.
    fn put_send(&self, rid: Id, buf: Buf, phase: Option<SendPhase>) -> bool {
        let mut reqs = self.reqs.borrow_mut();
        match reqs.get_mut(rid) {
            Some(ReqState { kind: ReqKind::Send(s), .. }) => {
                s.buf = buf;
                if let Some(p) = phase {
                    s.phase = p;
                }
                true
            }
            _ => false,
        }
    }

    /// Advances a send; true when it needs nothing more from the queue (finished, or waiting
    /// for the peer), false when the lane had no resources.
    #[inline]
    pub fn send_progress(&self, ep: &Rc<Ep>, rid: Id) -> bool {
        match self.quick_start(ep, rid) {
            Some(QuickStart::Rts) => self.send_rts(ep, rid),
            Some(QuickStart::Short(seg, tag)) => match self.send_short(ep, seg, tag) {
                Ok(Outcome::NoResource) => false,
                Ok(_) => {
                    self.finish(rid, Status::Ok);
                    true
                }
                Err(e) => {
                    self.finish(rid, e);
                    true
                }
            },
            None => self.send_progress_general(ep, rid),
        }
    }

    /// [`Self::send_progress`] for everything but a queued eager-short send or rendezvous.
    #[inline(never)]
    fn send_progress_general(&self, ep: &Rc<Ep>, rid: Id) -> bool {
        let Some((buf, tag, sync, view)) = self.take_send(rid) else { return true };
        let len = buf.len();
        let cfg = ep.cfg;
        let (mut offset, msg_id, rndv_rreq) = match view {
            SendPhaseView::Nothing => {
                self.put_send(rid, buf, None);
                return true;
            }
            SendPhaseView::Zcopy => {
                self.put_send(rid, buf, None);
                return self.send_zcopy(ep, rid);
            }
            SendPhaseView::Start => {
                // A rendezvous started in `send_progress`.
                debug_assert!(len < cfg.rndv_thresh);
                if Self::zcopy(ep, &buf) {
                    self.put_send(rid, buf, Some(SendPhase::Zcopy { offset: 0, msg_id: 0 }));
                    return self.send_zcopy(ep, rid);
                }
                // One piece?
                let hdr = if sync { len::EAGER_SYNC_ONLY } else { len::EAGER_ONLY };
                let one = if sync {
                    (len + hdr <= cfg.bcopy_max).then(|| {
                        let (rep, sreq) = (ep.remote_id.get(), rid.raw());
                        ep.am()
                            .am_bcopy(
                                wire::AM_EAGER_SYNC_ONLY,
                                // SAFETY: valid buffer (caller of tag_send); fits (checked).
                                &mut |dst| unsafe {
                                    pack_data(dst, &wire::EagerSyncHdr { tag, ep: rep, sreq }, &buf, 0, len)
                                },
                                uct::SendFlags::empty(),
                            )
                            .map(|o| o.status())
                    })
                } else {
                    self.eager_now(ep, &buf, tag).map(|r| r.map(|o| o.status()))
                };
                match one {
                    None => {}
                    Some(Ok(Status::NoResource)) => {
                        self.put_send(rid, buf, None);
                        return false;
                    }
                    Some(Ok(_)) => {
                        if sync {
                            self.count(|c| &mut c.eager_sync);
                        }
                        self.put_send(rid, buf, None);
                        self.sent_all(rid, sync);
                        return true;
                    }
                    Some(Err(e)) => {
                        self.put_send(rid, buf, None);
                        self.finish(rid, e);
                        return true;
                    }
                }
                self.count(|c| &mut c.eager_multi);
                if sync {
                    self.count(|c| &mut c.eager_sync);
                }
                (0, self.msg_id(), None)
            }
            SendPhaseView::Frags { offset, msg_id } => (offset, msg_id, None),
            SendPhaseView::RndvFrags { rreq, offset } => (offset, 0, Some(rreq)),
        };
        // Fragments.
        loop {
            let hdr = match rndv_rreq {
                Some(_) => len::RNDV_DATA,
                None => frag_kind(offset, sync).1,
            };
            let n = (len - offset).min(cfg.bcopy_max.saturating_sub(hdr));
            if n == 0 && len > 0 {
                tracing::error!("tag send: AM lane's bcopy size {} leaves no room for data", cfg.bcopy_max);
                self.put_send(rid, buf, None);
                self.finish(rid, Status::InvalidParam);
                return true;
            }
            let (rep, sreq) = (ep.remote_id.get(), rid.raw());
            let frag = FragHdr { tag, rep, msg_id, len, offset, sync, sreq };
            let id = match rndv_rreq {
                Some(_) => wire::AM_RNDV_DATA,
                None => frag_kind(offset, sync).0,
            };
            let r = ep.am().am_bcopy(
                id,
                &mut |dst| {
                    // SAFETY: valid buffer (caller of tag_send); `offset + n <= len` and `n`
                    // bytes fit after the header.
                    unsafe {
                        match rndv_rreq {
                            Some(rreq) => pack_data(dst, &wire::RndvDataHdr { rreq, offset }, &buf, offset, n),
                            None if offset == 0 => pack_data(dst, &frag.first(), &buf, offset, n),
                            None => pack_data(dst, &frag.middle(), &buf, offset, n),
                        }
                    }
                },
                uct::SendFlags::empty(),
            );
            match r {
                Ok(Outcome::NoResource) => {
                    let phase = match rndv_rreq {
                        Some(rreq) => SendPhase::RndvFrags { rreq, offset },
                        None => SendPhase::Frags { offset, msg_id },
                    };
                    self.put_send(rid, buf, Some(phase));
                    return false;
                }
                Ok(_) => {
                    offset += n;
                    if offset >= len {
                        self.put_send(rid, buf, None);
                        if rndv_rreq.is_some() {
                            self.finish(rid, Status::Ok);
                        } else {
                            self.sent_all(rid, sync);
                        }
                        return true;
                    }
                }
                Err(e) => {
                    self.put_send(rid, buf, None);
                    self.finish(rid, e);
                    return true;
                }
            }
        }
    }

    /// Every byte of an eager send went out: done, or wait for the sync ack (unless it came
    /// already, which the loop-back transport makes possible).
    fn sent_all(&self, rid: Id, sync: bool) {
        if sync {
            let still = {
                let mut reqs = self.reqs.borrow_mut();
                match reqs.get_mut(rid) {
                    Some(ReqState { kind: ReqKind::Send(s), .. }) if s.sync => {
                        s.phase = SendPhase::WaitAck;
                        true
                    }
                    _ => false,
                }
            };
            if still {
                return;
            }
        }
        self.finish(rid, Status::Ok);
    }

    /// Sends the RTS of a rendezvous, registering the buffer when a zero-copy lane can use it.
    fn send_rts(&self, ep: &Rc<Ep>, rid: Id) -> bool {
        let (seg, tag, len, hint, has_memh) = {
            let mut reqs = self.reqs.borrow_mut();
            match reqs.get_mut(rid) {
                Some(ReqState { kind: ReqKind::Send(s), .. }) => {
                    s.phase = SendPhase::Rts { sent: false };
                    (s.buf.contig(), s.tag, s.buf.len(), s.hint, s.zc.as_ref().is_some_and(|z| z.memh.is_some()))
                }
                _ => return true,
            }
        };
        let mut rkey = uct::PackedKey::new();
        if let Some(seg) = seg {
            if let Some(lane) = ep.rndv {
                let want_get = lane.get && matches!(ep.cfg.scheme, RndvScheme::Auto | RndvScheme::GetZcopy);
                let want_put = lane.put && matches!(ep.cfg.scheme, RndvScheme::Auto | RndvScheme::PutZcopy);
                if (want_get || want_put) && len <= lane.max_zcopy && len > 0 {
                    let memh = if has_memh {
                        None
                    } else {
                        match self.memh_for(hint, lane.iface, seg.ptr, seg.len) {
                            Ok(m) => Some(m),
                            Err(e) => {
                                tracing::debug!("rndv: cannot register the send buffer ({e}); data goes by AM");
                                None
                            }
                        }
                    };
                    let mut reqs = self.reqs.borrow_mut();
                    if let Some(ReqState { kind: ReqKind::Send(s), .. }) = reqs.get_mut(rid) {
                        if memh.is_some() {
                            zc_mut(&self.zc_pool, &mut s.zc).memh = memh;
                        }
                        if want_get {
                            if let Some(m) = s.zc.as_ref().and_then(|z| z.memh.as_ref()) {
                                match self.ifaces[lane.iface].md.mkey_pack(m) {
                                    Ok(k) => rkey = k,
                                    Err(e) => tracing::debug!("rndv: cannot pack a key ({e})"),
                                }
                            }
                        }
                    }
                }
            }
        }
        let addr = seg.map(|s| s.ptr as u64).unwrap_or(0);
        let (rep, sreq) = (ep.remote_id.get(), rid.raw());
        let rts = wire::RtsHdr { tag, ep: rep, sreq, size: len, addr, contig: seg.is_some(), rkey };
        let r = ep.am().am_bcopy(wire::AM_RNDV_RTS, &mut |dst| pack_header(dst, &rts), uct::SendFlags::empty());
        match r {
            Ok(Outcome::NoResource) => {
                self.put_send_phase(rid, SendPhase::Queued);
                false
            }
            Ok(_) => {
                let mut reqs = self.reqs.borrow_mut();
                if let Some(ReqState { kind: ReqKind::Send(s), .. }) = reqs.get_mut(rid) {
                    if matches!(s.phase, SendPhase::Rts { sent: false }) {
                        s.phase = SendPhase::Rts { sent: true };
                    }
                }
                true
            }
            Err(e) => {
                self.finish(rid, e);
                true
            }
        }
    }

    fn put_send_phase(&self, rid: Id, phase: SendPhase) {
        if let Some(ReqState { kind: ReqKind::Send(s), .. }) = self.reqs.borrow_mut().get_mut(rid) {
            s.phase = phase;
        }
    }

    /// ATS: the receiver is done with our buffer (or gave up).
    pub fn on_ats(&self, h: wire::Ats) {
        let Some(rid) = self.sreq_from_wire(h.sreq, "rndv ats") else { return };
        self.finish(rid, if h.status == Status::MessageTruncated { Status::Ok } else { h.status });
    }

    /// RTR: the receiver is ready; put the data (with its key) or send it in fragments.
    pub fn on_rtr(&self, h: wire::RtrHdr) {
        let wire::RtrHdr { ep: ep_raw, sreq, rreq, addr, len: rlen, rkey: key } = h;
        let Some(ep) = self.ep_from_wire(ep_raw, "rndv rtr") else { return };
        let Some(rid) = self.sreq_from_wire(sreq, "rndv rtr") else { return };
        let (seg, len, hint) = match self.reqs.borrow().get(rid) {
            Some(ReqState { kind: ReqKind::Send(s), .. }) if matches!(s.phase, SendPhase::Rts { .. }) => {
                (s.buf.contig(), s.buf.len(), s.hint)
            }
            _ => {
                tracing::warn!("rndv rtr: request {sreq:#x} is not waiting for one; dropped");
                return;
            }
        };
        if rlen as usize != len {
            tracing::warn!("rndv rtr: peer asked for {rlen} bytes of a {len}-byte message; failing the send");
            self.finish(rid, Status::InvalidParam);
            return;
        }
        if !key.is_empty() {
            let (Some(lane), Some(seg)) = (ep.rndv, seg) else {
                tracing::warn!("rndv rtr: a key for a put this endpoint cannot do; failing the send");
                self.finish(rid, Status::Unsupported);
                return;
            };
            let wi = &self.ifaces[lane.iface];
            let rkey = match wi.md.component().rkey_unpack(&key) {
                Ok(k) => k,
                Err(e) => {
                    tracing::warn!("rndv rtr: bad remote key ({e}); failing the send");
                    self.finish(rid, e);
                    return;
                }
            };
            let memh = match self.memh_for(hint, lane.iface, seg.ptr, seg.len) {
                Ok(m) => m,
                Err(e) => {
                    self.finish(rid, e);
                    return;
                }
            };
            let comp = self.zc_completion(1, ZcDone::Put { ep: ep.id.get(), sreq: rid, rreq });
            self.put_send_phase(rid, SendPhase::Put);
            let iov = [uct::Iov::new(seg.ptr, seg.len, Some(&memh))];
            // SAFETY: the send buffer stays valid until the request completes (caller of
            // tag_send), which happens only in `rndv_put_done`; the handle and key are kept in
            // the request until then.
            let res = unsafe { ep.uct_eps[lane.uct].ep.put_zcopy(&iov, addr, &rkey, Some(&comp)) };
            if let Some(ReqState { kind: ReqKind::Send(s), .. }) = self.reqs.borrow_mut().get_mut(rid) {
                let z = zc_mut(&self.zc_pool, &mut s.zc);
                z.memh = Some(memh);
                z.rkey = Some(rkey);
            }
            match res {
                Ok(Outcome::Done(())) => comp.complete(Status::Ok),
                Ok(Outcome::InProgress) => {}
                Ok(Outcome::NoResource) => comp.complete(Status::NoResource),
                Err(e) => comp.complete(e),
            }
        } else {
            self.put_send_phase(rid, SendPhase::RndvFrags { rreq, offset: 0 });
            if !(ep.ready() && self.send_progress(&ep, rid)) {
                self.queue(&ep, Pending::Send(rid));
            }
        }
    }

    fn rndv_put_done(&self, ep_id: Id, sreq: Id, rreq: u64, status: Status) {
        if !status.is_err() {
            if let Some(ep) = self.ep(ep_id) {
                self.send_ctrl(&ep, Ctrl::Atp(wire::Atp { rreq }));
            }
        }
        self.finish(sreq, status);
    }

    // ---- receive side ------------------------------------------------------------------------

    /// Posts a tagged receive.
    ///
    /// # Safety
    /// The buffers in `buf` must stay valid, and not be accessed, until the request completes.
    #[inline]
    pub unsafe fn tag_recv(&self, buf: Buf, tag: Tag, mask: Tag, param: RequestParam) -> UcsResult<RecvOut> {
        let matched = self.unexp.borrow_mut().take_match(tag, mask);
        if let Some((tag, msg)) = matched {
            return self.recv_matched(buf, tag, msg, param);
        }
        if param.flags.contains(RequestFlags::FORCE_IMM_CMPL) {
            return Err(Status::NoResource);
        }
        let hint = param.memh.map(|m| m.id);
        let mut guard = self.reqs.borrow_mut();
        let reqs = &mut *guard;
        // Queued first, by the slot it is about to take, so the slot is not looked up again.
        let at = reqs.tab.next_index();
        let exp = reqs.exp.post_at(&mut reqs.tab, tag, mask, at);
        let mut st =
            ReqState::new(ReqKind::Recv(recv_req(buf, hint)), param.callback, param.callback_fn, param.detached);
        st.exp = exp;
        let rid = reqs.tab.insert(st);
        debug_assert_eq!(rid.index(), at, "the request took another slot than the queues were told");
        Ok(RecvOut::Req(rid))
    }

    /// A buffer for reassembling an unexpected multi-fragment message that starts with
    /// `first`: a kept one when there is one (its capacity from an earlier message, so the
    /// steady state allocates nothing), else a new one. It grows with the data that arrives,
    /// never with the length the peer announced.
    fn frag_buf(&self, first: &[u8]) -> Vec<u8> {
        let mut v = self.frag_bufs.borrow_mut().pop().unwrap_or_default();
        v.extend_from_slice(first);
        v
    }

    /// Gives a reassembly buffer back for reuse: up to [`FRAG_BUFS_KEPT`] of them, each of up to
    /// [`FRAG_BUF_KEPT_MAX`] bytes of capacity (a larger one is freed).
    fn recycle_frag_buf(&self, mut v: Vec<u8>) {
        let mut kept = self.frag_bufs.borrow_mut();
        if kept.len() < FRAG_BUFS_KEPT && v.capacity() <= FRAG_BUF_KEPT_MAX {
            v.clear();
            kept.push(v);
        }
    }

    /// A receive met an unexpected message (at posting, or from a probed handle).
    #[inline(never)]
    pub(crate) fn recv_matched(&self, buf: Buf, tag: Tag, msg: Unexp, param: RequestParam) -> UcsResult<RecvOut> {
        let info = RecvInfo { length: msg.length(), sender_tag: tag };
        match msg {
            Unexp::Eager { desc, offset, sync } => self.recv_whole_now(&buf, info, &desc[offset..], sync, param),
            Unexp::Frag { data, total, sync, .. } if data.len() == total => {
                let out = self.recv_whole_now(&buf, info, &data, sync, param);
                self.recycle_frag_buf(data);
                out
            }
            Unexp::Frag { key, total, data, sync } => {
                let mut r = recv_req(buf, param.memh.map(|m| m.id));
                r.total = total;
                r.received = data.len();
                r.sync = sync;
                if total > r.buf.len() {
                    r.truncated = true;
                } else {
                    // SAFETY: valid buffer (caller); `data.len() < total <= buffer length`.
                    unsafe { r.buf.copy_in(0, &data) };
                }
                self.recycle_frag_buf(data);
                let rid = self.req_with(ReqKind::Recv(r), param);
                self.set_info(rid, info);
                self.frags.borrow_mut().insert(key, FragTarget::Req(rid));
                Ok(RecvOut::Req(rid))
            }
            Unexp::Rts(rts) => {
                let hint = param.memh.map(|m| m.id);
                let rid = self.req_with(ReqKind::Recv(recv_req(buf, hint)), param);
                self.set_info(rid, info);
                self.rndv_matched(rid, rts);
                Ok(RecvOut::Req(rid))
            }
        }
    }

    /// A whole unexpected message for a receive being posted: copy, acknowledge, and complete
    /// at once (or through a completed request with NO_IMM_CMPL).
    fn recv_whole_now(
        &self,
        buf: &Buf,
        info: RecvInfo,
        payload: &[u8],
        sync: Option<(u64, u64)>,
        param: RequestParam,
    ) -> UcsResult<RecvOut> {
        let status = if payload.len() > buf.len() {
            Status::MessageTruncated
        } else {
            // SAFETY: the caller of `tag_recv` keeps the buffer valid; the payload fits.
            unsafe { buf.copy_in(0, payload) };
            Status::Ok
        };
        if let Some((ep, sreq)) = sync {
            self.sync_ack(ep, sreq);
        }
        if param.flags.contains(RequestFlags::NO_IMM_CMPL) {
            let rid = self.req_new(ReqKind::Done, None);
            if let Some(r) = self.reqs.borrow_mut().get_mut(rid) {
                r.info = info;
                r.status = status;
            }
            // The callback of a request completed at creation runs now.
            if let Some(cb) = param.callback {
                cb(status, info);
            }
            if let Some((f, data)) = param.callback_fn {
                f(status, info, data);
            }
            return Ok(RecvOut::Req(rid));
        }
        if status.is_err() {
            Err(status)
        } else {
            Ok(RecvOut::Done(info))
        }
    }

    fn set_info(&self, rid: Id, info: RecvInfo) {
        if let Some(r) = self.reqs.borrow_mut().get_mut(rid) {
            r.info = info;
        }
    }

    fn sync_ack(&self, ep: u64, sreq: u64) {
        if let Some(ep) = self.ep_from_wire(ep, "eager sync") {
            self.send_ctrl(&ep, Ctrl::SyncAck(wire::SyncAck { sreq }));
        }
    }

    /// A whole message for a matched receive.
    #[inline]
    fn deliver_whole(&self, rid: Id, tag: Tag, payload: &[u8], sync: Option<(u64, u64)>) {
        // Matched: the sender's sync request may complete.
        if let Some((ep, sreq)) = sync {
            self.sync_ack(ep, sreq);
        }
        self.complete_with(rid, |r| Self::fill_whole(r, tag, payload));
    }

    /// Copies a whole message into the receive `r` (nothing past its buffer); the status.
    #[inline(always)]
    pub(crate) fn fill_whole(r: &mut ReqState, tag: Tag, payload: &[u8]) -> Option<Status> {
        let ReqKind::Recv(rr) = &mut r.kind else { return None };
        let status = if payload.len() > rr.buf.len() {
            Status::MessageTruncated
        } else {
            // SAFETY: the caller of `tag_recv` keeps the buffer valid; it fits.
            unsafe { rr.buf.copy_in(0, payload) };
            Status::Ok
        };
        r.info = RecvInfo { length: payload.len(), sender_tag: tag };
        Some(status)
    }

    #[inline(always)]
    pub fn on_eager_only(&self, m: uct::AmRecv<'_>) {
        let (wire::EagerHdr { tag }, payload) = match wire::EagerHdr::decode(m.data()) {
            Ok(v) => v,
            Err(e) => return malformed(e),
        };
        if !self.deliver_expected(tag, payload) {
            self.count(|c| &mut c.unexpected);
            let desc = m.keep_in(&self.kept_msgs);
            self.unexp.borrow_mut().push(tag, Unexp::Eager { desc, offset: len::EAGER_ONLY, sync: None });
        }
    }

    pub fn on_eager_sync_only(&self, m: uct::AmRecv<'_>) {
        let (wire::EagerSyncHdr { tag, ep, sreq }, payload) = match wire::EagerSyncHdr::decode(m.data()) {
            Ok(v) => v,
            Err(e) => return malformed(e),
        };
        let hit = self.take_expected(tag);
        match hit {
            Some(rid) => self.deliver_whole(rid, tag, payload, Some((ep, sreq))),
            None => {
                self.count(|c| &mut c.unexpected);
                let desc = m.keep_in(&self.kept_msgs);
                let u = Unexp::Eager { desc, offset: len::EAGER_SYNC_ONLY, sync: Some((ep, sreq)) };
                self.unexp.borrow_mut().push(tag, u);
            }
        }
    }

    pub fn on_eager_first(&self, h: wire::EagerFirstHdr, payload: &[u8]) {
        let wire::EagerFirstHdr { tag, ep, msg_id, total, sreq } = h;
        let key = (ep, msg_id);
        let sync = sreq.map(|s| (ep, s));
        let hit = self.take_expected(tag);
        match hit {
            Some(rid) if payload.len() == total => self.deliver_whole(rid, tag, payload, sync),
            Some(rid) => {
                {
                    let mut reqs = self.reqs.borrow_mut();
                    let Some(st) = reqs.get_mut(rid) else { return };
                    st.info = RecvInfo { length: total, sender_tag: tag };
                    let ReqKind::Recv(rr) = &mut st.kind else { return };
                    rr.total = total;
                    rr.received = payload.len();
                    rr.sync = sync;
                    if total > rr.buf.len() {
                        rr.truncated = true;
                    } else {
                        // SAFETY: valid buffer (caller of tag_recv); the payload is within it.
                        unsafe { rr.buf.copy_in(0, payload) };
                    }
                }
                self.frags.borrow_mut().insert(key, FragTarget::Req(rid));
            }
            None => {
                self.count(|c| &mut c.unexpected);
                let u = Unexp::Frag { key, total, data: self.frag_buf(payload), sync };
                let complete = payload.len() == total;
                let h = self.unexp.borrow_mut().push(tag, u);
                if !complete {
                    self.frags.borrow_mut().insert(key, FragTarget::Unexp(h));
                }
            }
        }
    }

    pub fn on_eager_middle(&self, h: wire::EagerMiddleHdr, payload: &[u8]) {
        let wire::EagerMiddleHdr { ep, msg_id, offset } = h;
        let key = (ep, msg_id);
        let Some(target) = self.frags.borrow().get(&key).copied() else {
            tracing::warn!("eager middle: no message {msg_id:#x} in progress; dropped");
            return;
        };
        let append = |data: &mut Vec<u8>, total: usize| -> Option<bool> {
            if offset != data.len() || offset + payload.len() > total {
                return None;
            }
            data.extend_from_slice(payload);
            Some(data.len() == total)
        };
        let complete = match target {
            FragTarget::Unexp(h) => match self.unexp.borrow_mut().get_mut(h) {
                Some(Unexp::Frag { data, total, .. }) => append(data, *total),
                _ => None,
            },
            FragTarget::Probed(id) => match self.probed.borrow_mut().get_mut(id) {
                Some((_, Unexp::Frag { data, total, .. })) => append(data, *total),
                _ => None,
            },
            FragTarget::Req(rid) => {
                let mut reqs = self.reqs.borrow_mut();
                match reqs.get_mut(rid) {
                    Some(ReqState { kind: ReqKind::Recv(rr), .. })
                        if offset == rr.received && offset + payload.len() <= rr.total =>
                    {
                        if !rr.truncated {
                            // SAFETY: valid buffer (caller of tag_recv); in bounds (checked,
                            // and total <= buffer length when not truncated).
                            unsafe { rr.buf.copy_in(offset, payload) };
                        }
                        rr.received += payload.len();
                        Some(rr.received == rr.total)
                    }
                    _ => None,
                }
            }
        };
        match complete {
            None => tracing::warn!("eager middle: fragment at {offset} does not continue message {msg_id:#x}; dropped"),
            Some(false) => {}
            Some(true) => {
                self.frags.borrow_mut().remove(&key);
                if let FragTarget::Req(rid) = target {
                    self.recv_frags_done(rid);
                }
            }
        }
    }

    /// All fragments of a matched message arrived.
    fn recv_frags_done(&self, rid: Id) {
        let (sync, truncated) = match self.reqs.borrow_mut().get_mut(rid) {
            Some(ReqState { kind: ReqKind::Recv(rr), .. }) => (rr.sync.take(), rr.truncated),
            _ => return,
        };
        if let Some((ep, sreq)) = sync {
            self.sync_ack(ep, sreq);
        }
        self.finish(rid, if truncated { Status::MessageTruncated } else { Status::Ok });
    }

    /// Looks at the unexpected queue (`ucp_tag_probe_nb`); with `remove`, takes the message
    /// out into a handle for [`Core::msg_recv`].
    pub fn probe(&self, tag: Tag, mask: Tag, remove: bool) -> Option<(RecvInfo, Option<Id>)> {
        let mut unexp = self.unexp.borrow_mut();
        let (h, t, msg) = unexp.probe(tag, mask)?;
        let info = RecvInfo { length: msg.length(), sender_tag: t };
        if !remove {
            return Some((info, None));
        }
        let (t, msg) = unexp.take(h)?;
        drop(unexp);
        let key = match &msg {
            Unexp::Frag { key, data, total, .. } if data.len() < *total => Some(*key),
            _ => None,
        };
        let id = self.probed.borrow_mut().insert((t, msg));
        if let Some(k) = key {
            self.frags.borrow_mut().insert(k, FragTarget::Probed(id));
        }
        Some((info, Some(id)))
    }

    /// Receives a probed message (`ucp_tag_msg_recv_nbx`).
    ///
    /// # Safety
    /// As [`Core::tag_recv`].
    pub unsafe fn msg_recv(&self, buf: Buf, msg: Id, param: RequestParam) -> UcsResult<RecvOut> {
        let Some((tag, m)) = self.probed.borrow_mut().remove(msg) else {
            tracing::error!("tag msg recv: message handle {msg:?} is not a probed message (received already?)");
            return Err(Status::InvalidParam);
        };
        self.recv_matched(buf, tag, m, param)
    }

    // ---- rendezvous, receive side -------------------------------------------------------------

    pub fn on_rts(&self, h: wire::RtsHdr) {
        let wire::RtsHdr { tag, ep, sreq, size, addr, contig, rkey } = h;
        let rts = Rts { ep, sreq, size, addr, rkey, contig };
        let hit = self.take_expected(tag);
        match hit {
            Some(rid) => {
                self.set_info(rid, RecvInfo { length: size, sender_tag: tag });
                self.rndv_matched(rid, rts);
            }
            None => {
                self.count(|c| &mut c.unexpected);
                self.unexp.borrow_mut().push(tag, Unexp::Rts(rts));
            }
        }
    }

    /// A receive matched an RTS: fetch (get), invite a put (RTR with a key), or invite AM
    /// fragments (RTR without a key).
    fn rndv_matched(&self, rid: Id, rts: Rts) {
        let Some(ep) = self.ep_from_wire(rts.ep, "rndv rts") else {
            self.finish(rid, Status::ConnectionReset);
            return;
        };
        if let Some(e) = ep.error() {
            // The sender's endpoint failed after the RTS arrived: no data will come.
            self.finish(rid, e);
            return;
        }
        let (seg, buflen, hint) = match self.reqs.borrow_mut().get_mut(rid) {
            Some(ReqState { kind: ReqKind::Recv(rr), .. }) => {
                rr.total = rts.size;
                (rr.buf.contig(), rr.buf.len(), rr.hint)
            }
            _ => return,
        };
        if rts.size > buflen || rts.size == 0 {
            let status = if rts.size > buflen { Status::MessageTruncated } else { Status::Ok };
            self.send_ctrl(&ep, Ctrl::Ats(wire::Ats { sreq: rts.sreq, status }));
            self.finish(rid, status);
            return;
        }
        let scheme = ep.cfg.scheme;
        let lane = ep.rndv.filter(|l| rts.size <= l.max_zcopy);
        let get_ok = lane.is_some_and(|l| l.get)
            && !rts.rkey.is_empty()
            && seg.is_some()
            && matches!(scheme, RndvScheme::Auto | RndvScheme::GetZcopy);
        let put_ok = lane.is_some_and(|l| l.put)
            && rts.contig
            && seg.is_some()
            && matches!(scheme, RndvScheme::Auto | RndvScheme::PutZcopy);
        let (sreq, rep) = (rts.sreq, ep.remote_id.get());
        if get_ok {
            self.count(|c| &mut c.rndv_get);
            if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = self.reqs.borrow_mut().get_mut(rid) {
                zc_mut(&self.zc_pool, &mut rr.zc).rts = Some(rts);
            }
            if !(ep.ready() && self.rndv_get_start(&ep, rid)) {
                self.queue(&ep, Pending::Get(rid));
            }
            return;
        }
        let mut key = uct::PackedKey::new();
        if put_ok {
            if let (Some(l), Some(s)) = (lane, seg) {
                match self.memh_for(hint, l.iface, s.ptr, s.len) {
                    Ok(m) => {
                        if let Ok(k) = self.ifaces[l.iface].md.mkey_pack(&m) {
                            key = k;
                            if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = self.reqs.borrow_mut().get_mut(rid)
                            {
                                zc_mut(&self.zc_pool, &mut rr.zc).memh = Some(m);
                            }
                        }
                    }
                    Err(e) => tracing::debug!("rndv: cannot register the receive buffer ({e}); data goes by AM"),
                }
            }
        }
        if key.is_empty() {
            self.count(|c| &mut c.rndv_am);
        } else {
            self.count(|c| &mut c.rndv_put);
        }
        let addr = seg.map(|s| s.ptr as u64).unwrap_or(0);
        let len = rts.size as u64;
        if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = self.reqs.borrow_mut().get_mut(rid) {
            // Kept so a failure of the sender's endpoint fails this receive.
            zc_mut(&self.zc_pool, &mut rr.zc).rts = Some(rts);
        }
        self.send_ctrl(&ep, Ctrl::Rtr(wire::RtrHdr { ep: rep, sreq, rreq: rid.raw(), addr, len, rkey: key }));
    }

    /// Issues the get of a matched rendezvous; false when the lane had no resources.
    pub fn rndv_get_start(&self, ep: &Rc<Ep>, rid: Id) -> bool {
        let Some(lane) = ep.rndv else { return true };
        let component = self.ifaces[lane.iface].md.component();
        let (seg, size, addr, unpacked, sreq, hint) = match self.reqs.borrow().get(rid) {
            Some(ReqState { kind: ReqKind::Recv(rr), status: Status::InProgress, .. }) => {
                match (rr.zc.as_ref().and_then(|z| z.rts.as_ref()), rr.buf.contig()) {
                    // The key is unpacked in place (unpacking calls nothing of the worker).
                    (Some(rts), Some(seg)) => {
                        (seg, seg.len.min(rr.total), rts.addr, component.rkey_unpack(&rts.rkey), rts.sreq, rr.hint)
                    }
                    _ => return true,
                }
            }
            _ => return true,
        };
        let fail = |e: Status| {
            self.send_ctrl(ep, Ctrl::Ats(wire::Ats { sreq, status: e }));
            self.finish(rid, e);
            true
        };
        let rkey = match unpacked {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!("rndv rts: bad remote key ({e})");
                return fail(e);
            }
        };
        let memh = match self.memh_for(hint, lane.iface, seg.ptr, size) {
            Ok(m) => m,
            Err(e) => return fail(e),
        };
        let comp = self.zc_completion(1, ZcDone::Get { ep: ep.id.get(), rid, sreq });
        let iov = [uct::Iov::new(seg.ptr, size, Some(&memh))];
        // SAFETY: the receive buffer stays valid and untouched until the request completes
        // (caller of tag_recv, or the worker holds it for a future); completion happens only in
        // `rndv_get_done`, and the handle and key live in the request until then.
        let res = unsafe { ep.uct_eps[lane.uct].ep.get_zcopy(&iov, addr, &rkey, Some(&comp)) };
        if let Ok(Outcome::NoResource) = res {
            return false;
        }
        if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = self.reqs.borrow_mut().get_mut(rid) {
            let z = zc_mut(&self.zc_pool, &mut rr.zc);
            z.memh = Some(memh);
            z.rkey = Some(rkey);
        }
        match res {
            Ok(Outcome::Done(())) => comp.complete(Status::Ok),
            Ok(_) => {}
            Err(e) => comp.complete(e),
        }
        true
    }

    fn rndv_get_done(&self, ep_id: Id, rid: Id, sreq: u64, status: Status) {
        if let Some(ep) = self.ep(ep_id) {
            self.send_ctrl(&ep, Ctrl::Ats(wire::Ats { sreq, status }));
        }
        self.finish(rid, status);
    }

    pub fn on_rndv_data(&self, h: wire::RndvDataHdr, payload: &[u8]) {
        let wire::RndvDataHdr { rreq, offset } = h;
        let Some(rid) = self.rreq_from_wire(rreq, "rndv data") else { return };
        let done = {
            let mut reqs = self.reqs.borrow_mut();
            let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = reqs.get_mut(rid) else { return };
            if offset.checked_add(payload.len()).is_none_or(|e| e > rr.total || e > rr.buf.len()) {
                tracing::warn!(
                    "rndv data: {} bytes at {offset} outside the {}-byte message; dropped",
                    payload.len(),
                    rr.total
                );
                return;
            }
            // SAFETY: valid buffer (caller of tag_recv); in bounds (checked).
            unsafe { rr.buf.copy_in(offset, payload) };
            rr.received += payload.len();
            rr.received >= rr.total
        };
        if done {
            self.finish(rid, Status::Ok);
        }
    }

    pub fn on_atp(&self, h: wire::Atp) {
        if let Some(rid) = self.rreq_from_wire(h.rreq, "rndv atp") {
            self.finish(rid, Status::Ok);
        }
    }
}

/// The fields of an eager fragment's header.
struct FragHdr {
    tag: Tag,
    rep: u64,
    msg_id: u64,
    len: usize,
    offset: usize,
    sync: bool,
    sreq: u64,
}

/// The AM id and header length of the eager fragment at `offset`: `EAGER_FIRST` or
/// `EAGER_SYNC_FIRST` at offset 0, else `EAGER_MIDDLE`.
fn frag_kind(offset: usize, sync: bool) -> (u8, usize) {
    match (offset, sync) {
        (0, true) => (wire::AM_EAGER_SYNC_FIRST, len::EAGER_SYNC_FIRST),
        (0, false) => (wire::AM_EAGER_FIRST, len::EAGER_FIRST),
        _ => (wire::AM_EAGER_MIDDLE, len::EAGER_MIDDLE),
    }
}

impl FragHdr {
    /// The header of the first fragment.
    fn first(&self) -> wire::EagerFirstHdr {
        let sreq = self.sync.then_some(self.sreq);
        wire::EagerFirstHdr { tag: self.tag, ep: self.rep, msg_id: self.msg_id, total: self.len, sreq }
    }

    /// The header of a later fragment.
    fn middle(&self) -> wire::EagerMiddleHdr {
        wire::EagerMiddleHdr { ep: self.rep, msg_id: self.msg_id, offset: self.offset }
    }
}

/// Encodes the header of the eager fragment at `h.offset` into `buf`; its AM id and length.
fn encode_frag(buf: &mut [u8], h: FragHdr) -> (u8, usize) {
    if h.offset == 0 {
        encode(buf, &h.first())
    } else {
        encode(buf, &h.middle())
    }
}

/// Encodes a header into a buffer the caller sized for it; its AM id and length.
fn encode(buf: &mut [u8], h: &impl Header) -> (u8, usize) {
    (h.am_id(), pack_header(buf, h))
}

/// Writes a header into a transport buffer; its length. The callers size their messages to
/// fit the lane, so a failure is a bug: logged, and the message goes out empty (the peer
/// drops it as malformed).
fn pack_header(dst: &mut [u8], h: &impl Header) -> usize {
    h.encode(dst).unwrap_or_else(|e| {
        tracing::error!("ucp: {}: {e}", wire::am_name(h.am_id()));
        0
    })
}

/// Writes a header and `n` bytes of `buf` from `offset` into a transport buffer; the length.
///
/// # Safety
/// `buf`'s segments must be valid for reads, and `offset + n <= buf.len()`.
#[inline(always)]
unsafe fn pack_data(dst: &mut [u8], h: &impl Header, buf: &Buf, offset: usize, n: usize) -> usize {
    match h.encode(dst) {
        Ok(at) if at + n <= dst.len() => {
            // SAFETY: forwarded from the caller; `n` bytes fit after the header (checked).
            unsafe { buf.copy_out(offset, &mut dst[at..at + n]) };
            at + n
        }
        _ => pack_header(&mut [], h),
    }
}

/// A malformed protocol message: logged with what was wrong, and dropped.
#[cold]
#[inline(never)]
fn malformed(e: wire::WireError) {
    tracing::warn!("ucp: {e}; message dropped");
}

/// A start of a queued send that [`Core::send_progress`] makes without taking the buffer out.
enum QuickStart {
    /// Eager short from this segment, with this tag.
    Short(crate::request::Seg, Tag),
    /// The RTS of a rendezvous.
    Rts,
}

/// What `send_progress` has to do next.
enum SendPhaseView {
    Start,
    Frags { offset: usize, msg_id: u64 },
    Zcopy,
    RndvFrags { rreq: u64, offset: usize },
    Nothing,
}

#[inline]
fn recv_req(buf: Buf, hint: Option<Id>) -> RecvReq {
    RecvReq { buf, received: 0, total: 0, zc: None, sync: None, truncated: false, hint }
}
