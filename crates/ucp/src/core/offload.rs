//! The driver's half of tag offload ([`crate::tag::offload`]): posting receives to a
//! transport's tag matching and cancelling them there, with the transport's reports routed
//! back into the engine.

use std::rc::Rc;

use ucs::idtable::Id;

use super::iface::with_core;
use super::Core;
use crate::dt::Seg;
use crate::tag::Tag;

/// A receive posted to a transport: its interface, the context the transport reports
/// through, and the buffer's registration; or the bounce buffer it was posted with, and the
/// user's buffer the data is copied to at completion.
pub(crate) struct TmPost {
    iface: usize,
    ctx: Rc<uct::TagRecvContext>,
    _memh: Option<uct::MemH>,
    bounce: Option<(Bounce, Seg)>,
}

/// A preregistered bounce buffer (`UCX_TM_MAX_BB_SIZE`) of interface `iface`'s memory domain.
pub(crate) struct Bounce {
    iface: usize,
    /// (Before `buf`: the registration is dropped before the memory it covers.)
    memh: uct::MemH,
    buf: Box<[u8]>,
}

impl Core {
    /// A bounce buffer of `len` bytes or more on interface `iface`: from the pool, or made (and
    /// registered) when the pool has none.
    fn bounce_get(&self, iface: usize, len: usize) -> ucs::UcsResult<Bounce> {
        let mut pool = self.tm_bounce.borrow_mut();
        if let Some(i) = pool.iter().position(|b| b.iface == iface && b.buf.len() >= len) {
            return Ok(pool.swap_remove(i));
        }
        drop(pool);
        let size = self.ctx.config().tm_max_bb_size.max(len);
        let mut buf = vec![0u8; size].into_boxed_slice();
        // SAFETY: the buffer is kept with its registration in a `Bounce` (in the pool or a
        // posted receive), whose field order drops the registration before the buffer.
        let memh = unsafe { self.ifaces[iface].md.mem_reg(buf.as_mut_ptr(), size, uct::MemAccess::all())? };
        Ok(Bounce { iface, memh, buf })
    }

    /// Posts receive `rid` (buffer `seg`) for `tag` to the tag matching of interface `iface`,
    /// with a bounce buffer when `bounce`.
    pub(super) fn tag_post(&self, rid: Id, iface: usize, tag: Tag, seg: Seg, hint: Option<Id>, bounce: bool) {
        let refused = |core: &Core| core.with_engine(|e| e.tag.offload_post_failed(&mut e.sh, rid));
        let mut bb = None;
        let memh = if bounce {
            match self.bounce_get(iface, seg.len) {
                Ok(b) => {
                    bb = Some(b);
                    None
                }
                Err(e) => {
                    tracing::debug!("ucp: tag offload: cannot register a bounce buffer: {e}");
                    return refused(self);
                }
            }
        } else if seg.len > 0 {
            match self.memh_for(hint, iface, seg) {
                Ok(m) => Some(m),
                Err(e) => {
                    tracing::debug!("ucp: tag offload: cannot register a receive buffer: {e}");
                    return refused(self);
                }
            }
        } else {
            None
        };
        let (w1, w2, w3) = (self.weak.clone(), self.weak.clone(), self.weak.clone());
        let ctx = Rc::new(uct::TagRecvContext {
            tag_consumed: Box::new(move || {
                with_core(&w1, |core| core.with_engine(|e| e.tag.offload_consumed(&mut e.sh, rid)));
            }),
            completed: Box::new(move |tag, imm, len, status| {
                with_core(&w2, |core| {
                    let post = core.tm_posts.borrow_mut().remove(&rid.raw());
                    if let Some(p) = post {
                        core.bounce_back(
                            p,
                            if status == ucs::Status::Ok || status == ucs::Status::MessageTruncated { len } else { 0 },
                        );
                    }
                    core.with_engine(|e| e.tag.offload_completed(&mut e.sh, rid, tag, imm, len, status));
                });
            }),
            rndv: Box::new(move |tag, header, _status| {
                with_core(&w3, |core| {
                    let post = core.tm_posts.borrow_mut().remove(&rid.raw());
                    if let Some(p) = post {
                        core.bounce_back(p, 0);
                    }
                    core.with_engine(|e| e.tag.offload_rndv(&mut e.sh, rid, tag, header));
                });
            }),
        });
        let iov = match &bb {
            // (The receive's own length: the transport truncates as it would the user's buffer.)
            Some(b) => [uct::Iov::new(b.buf.as_ptr() as *mut u8, seg.len, Some(&b.memh))],
            None => [uct::Iov::new(seg.ptr, seg.len, memh.as_ref())],
        };
        let Some(wi) = self.ifaces.get(iface) else { return refused(self) };
        // SAFETY: the buffer is the receive's (valid until the receive completes, the contract
        // of its `UserBuf`) or a bounce buffer kept in the posted receive's entry; the transport
        // writes it only until it reports completion or a cancel takes it back (forced when
        // software matches the receive instead).
        match unsafe { wi.iface.tag_recv_zcopy(tag, crate::tag::matcher::FULL_MASK, &iov, ctx.clone()) } {
            Ok(()) => {
                let bounce = bb.map(|b| (b, seg));
                self.tm_posts.borrow_mut().insert(rid.raw(), TmPost { iface, ctx, _memh: memh, bounce });
            }
            Err(e) => {
                tracing::debug!("ucp: tag offload: {} refused a receive: {e}", wi.name());
                if let Some(b) = bb {
                    self.tm_bounce.borrow_mut().push(b);
                }
                refused(self);
            }
        }
    }

    /// A posted receive is done with its transport: its bounce buffer's first `len` bytes go to
    /// the user's buffer (a completion), and the buffer back to the pool.
    fn bounce_back(&self, p: TmPost, len: usize) {
        if let Some((b, user)) = p.bounce {
            let n = len.min(user.len).min(b.buf.len());
            if n > 0 {
                // SAFETY: the user's buffer is valid for `user.len >= n` bytes until the receive
                // completes, which happens right after this; the bounce buffer holds `n`.
                unsafe { ucs::memory::copy(b.buf.as_ptr(), user.ptr, n) };
            }
            self.tm_bounce.borrow_mut().push(b);
        }
    }

    /// Cancels receive `rid` in its transport: `force` at once (software took it), else the
    /// transport reports the cancel (or the match that came first).
    pub(super) fn tag_cancel(&self, rid: Id, force: bool) {
        if force {
            let Some(p) = self.tm_posts.borrow_mut().remove(&rid.raw()) else { return };
            if let Err(e) = self.ifaces[p.iface].iface.tag_recv_cancel(&p.ctx, true) {
                tracing::debug!("ucp: tag offload: cancel of a posted receive: {e}");
            }
            self.bounce_back(p, 0);
            return;
        }
        let post = self.tm_posts.borrow().get(&rid.raw()).map(|p| (p.iface, p.ctx.clone()));
        let Some((iface, ctx)) = post else { return };
        if let Err(e) = self.ifaces[iface].iface.tag_recv_cancel(&ctx, false) {
            // Matched there meanwhile: it completes through its report.
            tracing::debug!("ucp: tag offload: cancel of a posted receive: {e}");
        }
    }
}
