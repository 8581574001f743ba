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
/// through, and the buffer's registration.
pub(crate) struct TmPost {
    iface: usize,
    ctx: Rc<uct::TagRecvContext>,
    _memh: Option<uct::MemH>,
}

impl Core {
    /// Posts receive `rid` (buffer `seg`) for `tag` to the tag matching of interface `iface`.
    pub(super) fn tag_post(&self, rid: Id, iface: usize, tag: Tag, seg: Seg, hint: Option<Id>) {
        let refused = |core: &Core| core.with_engine(|e| e.tag.offload_post_failed(&mut e.sh, rid));
        let memh = if seg.len > 0 {
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
                    core.with_engine(|e| e.tag.offload_completed(&mut e.sh, rid, tag, imm, len, status));
                    drop(post);
                });
            }),
            rndv: Box::new(move |tag, header, _status| {
                with_core(&w3, |core| {
                    let post = core.tm_posts.borrow_mut().remove(&rid.raw());
                    core.with_engine(|e| e.tag.offload_rndv(&mut e.sh, rid, tag, header));
                    drop(post);
                });
            }),
        });
        let iov = [uct::Iov::new(seg.ptr, seg.len, memh.as_ref())];
        let Some(wi) = self.ifaces.get(iface) else { return refused(self) };
        // SAFETY: the buffer is the receive's, valid until the receive completes (the contract
        // of its `UserBuf`); the transport writes it only until it reports completion or a
        // cancel takes it back (forced when software matches the receive instead).
        match unsafe { wi.iface.tag_recv_zcopy(tag, crate::tag::matcher::FULL_MASK, &iov, ctx.clone()) } {
            Ok(()) => {
                self.tm_posts.borrow_mut().insert(rid.raw(), TmPost { iface, ctx, _memh: memh });
            }
            Err(e) => {
                tracing::debug!("ucp: tag offload: {} refused a receive: {e}", wi.name());
                refused(self);
            }
        }
    }

    /// Cancels receive `rid` in its transport: `force` at once (software took it), else the
    /// transport reports the cancel (or the match that came first).
    pub(super) fn tag_cancel(&self, rid: Id, force: bool) {
        let post = if force {
            self.tm_posts.borrow_mut().remove(&rid.raw()).map(|p| (p.iface, p.ctx))
        } else {
            self.tm_posts.borrow().get(&rid.raw()).map(|p| (p.iface, p.ctx.clone()))
        };
        let Some((iface, ctx)) = post else { return };
        if let Err(e) = self.ifaces[iface].iface.tag_recv_cancel(&ctx, force) {
            // Matched there meanwhile: it completes through its report.
            tracing::debug!("ucp: tag offload: cancel of a posted receive: {e}");
        }
    }
}
