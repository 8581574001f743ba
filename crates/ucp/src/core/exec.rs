//! The driver's half of a transmission: turning a [`Tx`] into uct calls (registering memory
//! and packing or unpacking keys on the way), and the completions of zero-copy operations.

use std::cell::{Cell, RefCell};
use std::rc::Rc;

use ucs::Status;

use super::lanes::EpLanes;
use super::Core;
use crate::dt::UserBuf;
use crate::engine::{Lane, Mem, Tx, TxOp, TxResult, TxStatus, ZcDone};
use crate::wire::{self, len, Ctrl, DataHdr, Header};

/// Free completions the worker keeps for reuse at most.
const ZC_COMPS_KEPT: usize = 256;

/// What a reusable zero-copy completion reports when it fires, and the resources its
/// operation needs until then (the registration and unpacked key of a get or put).
pub(crate) struct ZcSlot {
    what: Cell<Option<ZcDone>>,
    keep: RefCell<Option<(uct::MemH, uct::RemoteKey)>>,
    /// The registration (if any) and remote key of an RMA operation.
    keep_rma: RefCell<Option<(Option<uct::MemH>, Rc<super::rma::Rkey>)>>,
}

impl ZcSlot {
    /// Sets what the completion reports (an operation that got its request after the call).
    pub(crate) fn set_what(&self, what: ZcDone) {
        self.what.set(Some(what));
    }

    /// Keeps an RMA operation's registration and remote key until the completion fires.
    pub(crate) fn keep_rma(&self, memh: Option<uct::MemH>, rkey: Rc<super::rma::Rkey>) {
        *self.keep_rma.borrow_mut() = Some((memh, rkey));
    }
}

/// A free reusable completion.
pub(crate) struct ZcComp {
    pub comp: Rc<uct::Completion>,
    pub slot: Rc<ZcSlot>,
}

/// Writes a header and `n` bytes of `data` from `offset` into a transport buffer; the length.
/// The engine sized the message to fit the lane, so a failure is a bug: logged, and the
/// message goes out empty (the peer drops it as malformed).
#[inline(always)]
pub(crate) fn pack_data(dst: &mut [u8], h: &impl Header, data: &UserBuf, offset: usize, n: usize) -> usize {
    if let Ok(at) = h.encode(dst) {
        if let Some(room) = dst.get_mut(at..at + n) {
            if data.copy_out(offset, room).is_ok() {
                return at + n;
            }
        }
    }
    packing_failed(h.am_id())
}

#[cold]
#[inline(never)]
fn packing_failed(id: u8) -> usize {
    tracing::error!("ucp: a {} message does not fit its transport buffer", wire::am_name(id));
    0
}

/// Sends control message `c` with `am_bcopy` on `ep`.
#[inline]
pub(super) fn send_ctrl(ep: &dyn uct::Ep, c: &Ctrl) -> ucs::OpResult {
    ep.am_bcopy(c.am_id(), &mut |dst| pack_header(dst, &|b| c.encode(b), c.am_id()), uct::SendFlags::empty())
        .map(|o| o.map(|_| ()))
}

/// Writes a header into a transport buffer; its length (0, logged, when it does not fit).
fn pack_header(dst: &mut [u8], h: &dyn Fn(&mut [u8]) -> Result<usize, wire::WireError>, id: u8) -> usize {
    h(dst).unwrap_or_else(|e| {
        tracing::error!("ucp: {} message: {e}", wire::am_name(id));
        0
    })
}

/// Writes an RTS, and an active message's user header after it, into a transport buffer; the
/// length (0, logged, when it does not fit).
fn pack_rts(dst: &mut [u8], hdr: &wire::RtsHdr, user: Option<&wire::UserHdr>, id: u8) -> usize {
    let n = pack_header(dst, &|b| hdr.encode(b), id);
    let Some(u) = user else { return n };
    match dst.get_mut(n..n + u.len()).map(|d| u.0.copy_out(0, d)) {
        Some(Ok(())) if n > 0 => n + u.len(),
        _ => packing_failed(id),
    }
}

/// Copies `n` bytes of `data` from `offset` into a transport buffer, alone (a tagged message's
/// payload: the transport carries the tag); the length, or 0 (logged) when they do not fit.
fn pack_payload(dst: &mut [u8], data: &UserBuf, offset: usize, n: usize) -> usize {
    match dst.get_mut(..n).map(|d| data.copy_out(offset, d)) {
        Some(Ok(())) => n,
        _ => {
            tracing::error!("ucp: a tagged message does not fit its transport buffer");
            0
        }
    }
}

/// Sends a whole tagged message (`hdr`: eager or eager sync, which names this side's endpoint
/// at the receiver, `rep`, as the immediate value) through the tag lane `ep`.
pub(super) fn tag_eager(ep: &dyn uct::Ep, hdr: &DataHdr, data: &UserBuf, offset: usize, n: usize) -> ucs::OpResult {
    let (tag, imm) = match hdr {
        DataHdr::Eager(h) => (h.tag, 0),
        // (Never 0: endpoint ids carry a generation from 1 on.)
        DataHdr::EagerSync(h) if h.ep != 0 => (h.tag, h.ep),
        _ => return Err(Status::InvalidParam),
    };
    ep.tag_eager_bcopy(tag, imm, &mut |dst| pack_payload(dst, data, offset, n), uct::SendFlags::empty())
        .map(|o| o.map(|_| ()))
}

impl Core {
    /// Makes transmission `tx` on its endpoint's lanes.
    pub(crate) fn exec(&self, tx: &Tx<Rc<EpLanes>>) -> TxResult {
        let lanes = &*tx.io;
        let ep = lanes.uct(tx.lane);
        if tx.lane == Lane::Tag {
            return self.exec_tag(lanes, ep, &tx.op);
        }
        match &tx.op {
            TxOp::Short { id, hdr, data } => {
                TxResult::from_uct(ep.am_short(*id, *hdr, data.contig_bytes().unwrap_or(&[])))
            }
            TxOp::Bcopy { hdr, data, offset, len } => TxResult::from_uct(ep.am_bcopy(
                hdr.am_id(),
                &mut |dst| pack_data(dst, hdr, data, *offset, *len),
                uct::SendFlags::empty(),
            )),
            TxOp::Ctrl(c) => TxResult::from_uct(send_ctrl(ep, c)),
            TxOp::Rts { hdr, offer, mem, user } => {
                let mut hdr = *hdr;
                let memh = mem.as_ref().and_then(|m| self.expose(lanes, m, offer.key.then_some(&mut hdr.rkey)));
                let id = if user.is_some() { wire::AM_AM_RTS } else { wire::AM_RNDV_RTS };
                let mut r = TxResult::from_uct(ep.am_bcopy(
                    id,
                    &mut |dst| pack_rts(dst, &hdr, user.as_ref(), id),
                    uct::SendFlags::empty(),
                ));
                r.keyed = !hdr.rkey.is_empty();
                r.memh = memh;
                r
            }
            TxOp::Rtr { hdr, mem } => {
                let mut hdr = *hdr;
                let memh = mem.as_ref().and_then(|m| self.expose(lanes, m, Some(&mut hdr.rkey)));
                let mut r = TxResult::from_uct(ep.am_bcopy(
                    wire::AM_RNDV_RTR,
                    &mut |dst| pack_header(dst, &|b| hdr.encode(b), wire::AM_RNDV_RTR),
                    uct::SendFlags::empty(),
                ));
                r.keyed = !hdr.rkey.is_empty();
                r.memh = if r.keyed { memh } else { None };
                r
            }
            TxOp::AmZcopy { hdr, mem, offset, len, token } => {
                let Some(piece) = mem.seg.sub(*offset, *len) else {
                    return TxResult::of(TxStatus::Failed(Status::InvalidParam));
                };
                let iface = lanes.uct_eps[lanes.am_idx].pair.local;
                let (memh, new) = match &mem.memh {
                    Some(m) => (m.clone(), false),
                    None => match self.memh_for(mem.hint, iface, mem.seg) {
                        Ok(m) => (m, true),
                        Err(e) => return TxResult::of(TxStatus::Failed(e)),
                    },
                };
                let mut h = [0u8; len::MAX_DATA_HDR];
                let Ok(n) = hdr.encode(&mut h) else { return TxResult::of(TxStatus::Failed(Status::InvalidParam)) };
                let (comp, _) = self.zc_completion(*token);
                let iov = [uct::Iov::new(piece.ptr, piece.len, Some(&memh))];
                // SAFETY: the user's buffer stays valid and unmodified until the send completes
                // (the contract of its `UserBuf`), which the engine does only after this
                // fragment's completion; the registration lives in the request until then.
                let r = unsafe { ep.am_zcopy(hdr.am_id(), &h[..n], &iov, uct::SendFlags::empty(), Some(&comp)) };
                let mut r = TxResult::from_uct(r);
                r.memh = new.then_some(memh);
                r
            }
            TxOp::Get { mem, remote, rkey, token } => self.rma(lanes, mem, *remote, rkey, *token, true),
            TxOp::Put { mem, remote, rkey, token } => self.rma(lanes, mem, *remote, rkey, *token, false),
            TxOp::Rma(t) => match tx.lane {
                crate::engine::Lane::Uct(l) => self.exec_rma(lanes, l, t),
                _ => TxResult::of(TxStatus::Failed(Status::InvalidParam)),
            },
            TxOp::RmaGetData { reply, len } => self.exec_get_data(lanes, reply, *len),
            // (Only on the tag lane.)
            TxOp::TagRndv { .. } => TxResult::of(TxStatus::Failed(Status::InvalidParam)),
            TxOp::Flush { token } => match tx.lane {
                crate::engine::Lane::Uct(l) => self.exec_flush(lanes, l, *token),
                _ => TxResult::of(TxStatus::Done),
            },
        }
    }

    /// Makes a tagged send's transmission on the tag lane `ep`: the whole message, or the RTS
    /// as a software rendezvous request.
    #[inline(never)]
    fn exec_tag(&self, lanes: &EpLanes, ep: &dyn uct::Ep, op: &TxOp) -> TxResult {
        match op {
            TxOp::Short { hdr, data, .. } => {
                TxResult::from_uct(ep.tag_eager_short(*hdr, data.contig_bytes().unwrap_or(&[])))
            }
            TxOp::Bcopy { hdr, data, offset, len } => TxResult::from_uct(tag_eager(ep, hdr, data, *offset, *len)),
            TxOp::Rts { hdr, offer, mem, user: None } => {
                let mut hdr = *hdr;
                let memh = mem.as_ref().and_then(|m| self.expose(lanes, m, offer.key.then_some(&mut hdr.rkey)));
                let mut b = [0u8; 512];
                let n = pack_header(&mut b, &|d| hdr.encode(d), wire::AM_RNDV_RTS);
                if n == 0 {
                    return TxResult::of(TxStatus::Failed(Status::InvalidParam));
                }
                let mut r = TxResult::from_uct(ep.tag_rndv_request(hdr.tag, &b[..n], uct::SendFlags::empty()));
                r.keyed = !hdr.rkey.is_empty();
                r.memh = memh;
                r
            }
            TxOp::TagRndv { tag, hdr, mem, token } => {
                let Some(t) = lanes.tag else { return TxResult::of(TxStatus::Failed(Status::InvalidParam)) };
                let iface = lanes.uct_eps[t as usize].pair.local;
                let (memh, new) = match &mem.memh {
                    Some(m) => (m.clone(), false),
                    None => match self.memh_for(mem.hint, iface, mem.seg) {
                        Ok(m) => (m, true),
                        Err(e) => return TxResult::of(TxStatus::Failed(e)),
                    },
                };
                let (comp, _) = self.zc_completion(*token);
                let iov = [uct::Iov::new(mem.seg.ptr, mem.seg.len, Some(&memh))];
                // SAFETY: the user's buffer stays valid and unmodified until the send completes
                // (the contract of its `UserBuf`); the engine completes it only after the
                // transport's completion (the FIN) or once the operation was cancelled after
                // the receiver finished in software; the registration lives in the request.
                let r = unsafe { ep.tag_rndv_zcopy(*tag, &hdr.to_bytes(), &iov, uct::SendFlags::empty(), Some(&comp)) };
                let mut res = match r {
                    Ok(ucs::Outcome::Done(op)) => {
                        let mut x = TxResult::of(TxStatus::Started);
                        x.tm_op = Some(op.0);
                        x
                    }
                    Ok(ucs::Outcome::InProgress) => TxResult::of(TxStatus::Started),
                    Ok(ucs::Outcome::NoResource) => TxResult::of(TxStatus::NoResource),
                    Err(e) => TxResult::of(TxStatus::Failed(e)),
                };
                res.memh = new.then_some(memh);
                res
            }
            _ => {
                tracing::error!("ucp: an operation other than a tagged send on the tag lane");
                TxResult::of(TxStatus::Failed(Status::InvalidParam))
            }
        }
    }

    /// Registers `mem` on the endpoint's rendezvous lane (or takes its registration) and packs
    /// a key into `key`; the registration, or `None` when that failed (then the data goes by
    /// active messages, which need neither).
    fn expose(&self, lanes: &EpLanes, mem: &Mem, key: Option<&mut uct::PackedKey>) -> Option<uct::MemH> {
        let rl = lanes.rndv?;
        let memh = match &mem.memh {
            Some(m) => m.clone(),
            None => match self.memh_for(mem.hint, rl.iface, mem.seg) {
                Ok(m) => m,
                Err(e) => {
                    tracing::debug!("rndv: cannot register the buffer ({e}); data goes by active messages");
                    return None;
                }
            },
        };
        if let Some(k) = key {
            match self.ifaces[rl.iface].md.mkey_pack(&memh) {
                Ok(packed) => *k = packed,
                Err(e) => tracing::debug!("rndv: cannot pack a key ({e}); data goes by active messages"),
            }
        }
        Some(memh)
    }

    /// A rendezvous get (into `mem`) or put (from it) on the rendezvous lane.
    fn rma(
        &self,
        lanes: &EpLanes,
        mem: &Mem,
        remote: u64,
        packed: &uct::PackedKey,
        token: ZcDone,
        get: bool,
    ) -> TxResult {
        let Some(rl) = lanes.rndv else { return TxResult::of(TxStatus::Failed(Status::Unsupported)) };
        let wi = &self.ifaces[rl.iface];
        let rkey = match wi.md.component().rkey_unpack(packed) {
            Ok(k) => k,
            Err(e) => {
                tracing::warn!("rndv: bad remote key ({e})");
                return TxResult::of(TxStatus::Failed(e));
            }
        };
        let (memh, new) = match &mem.memh {
            Some(m) => (m.clone(), false),
            None => match self.memh_for(mem.hint, rl.iface, mem.seg) {
                Ok(m) => (m, true),
                Err(e) => return TxResult::of(TxStatus::Failed(e)),
            },
        };
        let (comp, slot) = self.zc_completion(token);
        let iov = [uct::Iov::new(mem.seg.ptr, mem.seg.len, Some(&memh))];
        let ep = &*lanes.uct_eps[rl.uct].ep;
        // SAFETY: the user's buffer stays valid (for a get: and untouched) until the request
        // completes (the contract of its `UserBuf`, or the worker holds it for a future); the
        // engine completes it only after this operation's completion, and the registration
        // and key live in the completion's slot until it fires.
        let r = unsafe {
            if get {
                ep.get_zcopy(&iov, remote, &rkey, Some(&comp))
            } else {
                ep.put_zcopy(&iov, remote, &rkey, Some(&comp))
            }
        };
        if let Ok(ucs::Outcome::InProgress) = r {
            *slot.keep.borrow_mut() = Some((memh.clone(), rkey));
        } else {
            self.zc_unused(comp, slot);
        }
        let mut r = TxResult::from_uct(r);
        r.memh = new.then_some(memh);
        r
    }

    /// A completion for one zero-copy operation that reports `what` when it fires: a free one
    /// of the worker's, or a new one. A completion goes back to the free list when it fired, and
    /// is reused only once nobody else holds it (the transport that completed it), so a late
    /// completion can never hit a new operation.
    pub(crate) fn zc_completion(&self, what: ZcDone) -> (Rc<uct::Completion>, Rc<ZcSlot>) {
        let free = {
            let mut comps = self.zc_comps.borrow_mut();
            comps.pop().filter(|z| Rc::strong_count(&z.comp) == 1)
        };
        let z = free.unwrap_or_else(|| self.new_zc_comp());
        z.comp.set_count(1);
        z.slot.what.set(Some(what));
        (z.comp, z.slot)
    }

    /// The spare completion, for an operation that usually completes within its call (a
    /// fetching atomic on a shared-memory lane): armed (count 1, reporting nothing), held by
    /// nobody else. Give it back with [`Core::zc_spare_back`] unless the transport kept it;
    /// a kept one becomes that operation's ([`ZcSlot::set_what`]) and goes to the free list
    /// when it fires, and the next call takes a new spare.
    #[inline(always)]
    pub(crate) fn zc_spare(&self) -> ZcComp {
        match self.zc_spare.take() {
            Some(z) => z,
            None => self.zc_new_spare(),
        }
    }

    #[cold]
    fn zc_new_spare(&self) -> ZcComp {
        let free = self.zc_comps.borrow_mut().pop().filter(|z| Rc::strong_count(&z.comp) == 1);
        let z = free.unwrap_or_else(|| self.new_zc_comp());
        z.comp.set_count(1);
        z.slot.what.set(None);
        z
    }

    /// The spare from [`Core::zc_spare`], which the transport did not keep: it is the spare
    /// again (still armed: the transport neither fired nor holds it).
    #[inline(always)]
    pub(crate) fn zc_spare_back(&self, z: ZcComp) {
        if Rc::strong_count(&z.comp) == 1 {
            let old = self.zc_spare.replace(Some(z));
            debug_assert!(old.is_none(), "one spare at a time");
        }
    }

    /// A completion the transport did not take (the operation completed at once, or was
    /// refused): back to the free list, unless something still holds it.
    pub(crate) fn zc_unused(&self, comp: Rc<uct::Completion>, slot: Rc<ZcSlot>) {
        if Rc::strong_count(&comp) != 1 {
            return;
        }
        slot.what.set(None);
        let mut comps = self.zc_comps.borrow_mut();
        if comps.len() < ZC_COMPS_KEPT {
            comps.push(ZcComp { comp, slot });
        }
    }

    #[cold]
    fn new_zc_comp(&self) -> ZcComp {
        let slot = Rc::new(ZcSlot { what: Cell::new(None), keep: RefCell::new(None), keep_rma: RefCell::new(None) });
        let (core, s) = (self.weak.clone(), slot.clone());
        let comp = uct::Completion::new_cyclic(1, move |me| {
            move |st| {
                let done = s.what.take();
                let kept = (s.keep.borrow_mut().take(), s.keep_rma.borrow_mut().take());
                let Some(core) = core.upgrade() else { return };
                if let Some(what) = done {
                    core.with_engine(|e| e.sh.zc_done(what, st));
                }
                drop(kept);
                if let Some(comp) = me.upgrade() {
                    let mut comps = core.zc_comps.borrow_mut();
                    if comps.len() < ZC_COMPS_KEPT {
                        comps.push(ZcComp { comp, slot: s.clone() });
                    }
                }
            }
        });
        ZcComp { comp, slot }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Context, ContextParams, Features};

    fn core() -> Rc<Core> {
        uct_shm::register();
        let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "self")).unwrap();
        Core::new(&ctx, "zc").unwrap()
    }

    #[test]
    fn a_completion_is_reused_only_once_nobody_holds_it() {
        let core = core();
        let what = ZcDone::EagerFrag { rid: ucs::idtable::Id::from_raw(0) };
        let (a, _) = core.zc_completion(what);
        // Fired while a transport (here: `a`) still holds it: back on the free list, but not
        // handed out again while held.
        a.complete(Status::Ok);
        let (b, _) = core.zc_completion(what);
        assert!(!Rc::ptr_eq(&a, &b));
        // Fired and let go of: the next operation gets it, re-armed.
        b.complete(Status::IoError);
        let b_ptr = Rc::as_ptr(&b);
        drop(b);
        let (c, _) = core.zc_completion(what);
        assert_eq!(Rc::as_ptr(&c), b_ptr);
        assert_eq!((c.count(), c.status()), (1, Status::Ok));
        // One that never fired (the operation was refused) is simply freed.
        drop(c);
        let (d, _) = core.zc_completion(what);
        assert_eq!(d.count(), 1);
        drop(a);
    }

    #[test]
    fn the_spare_is_lent_again_unless_the_transport_keeps_it() {
        let core = core();
        let what = ZcDone::EagerFrag { rid: ucs::idtable::Id::from_raw(0) };
        // The first spare comes from the free list when it has one.
        let (a, _) = core.zc_completion(what);
        a.complete(Status::Ok);
        let a_ptr = Rc::as_ptr(&a);
        drop(a);
        let z = core.zc_spare();
        assert_eq!((Rc::as_ptr(&z.comp), z.comp.count(), z.slot.what.get().is_none()), (a_ptr, 1, true));
        // Given back unused (the operation completed in its call): lent again.
        core.zc_spare_back(z);
        let z = core.zc_spare();
        assert_eq!(Rc::as_ptr(&z.comp), a_ptr);
        // Kept by the transport: it is that operation's; the next spare is another one.
        let held = z.comp.clone();
        z.slot.set_what(what);
        drop(z);
        let n = core.zc_spare();
        assert!(!Rc::ptr_eq(&n.comp, &held));
        assert_eq!(n.comp.count(), 1);
        // A spare the transport still holds when given back is not lent again.
        let extra = n.comp.clone();
        core.zc_spare_back(n);
        let m = core.zc_spare();
        assert!(!Rc::ptr_eq(&m.comp, &extra));
        // The kept one fires: back on the free list, not the spare.
        held.complete(Status::Ok);
        drop(held);
        core.zc_spare_back(m);
    }
}
