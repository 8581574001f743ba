//! The target's half of emulated remote memory access and atomics: a peer's put, get or
//! atomic applied to this worker's memory - only to memory this worker mapped
//! (`Worker::mem_map`), checked on every message, so a peer that names anything else gets a
//! refusal and this worker's memory is never written outside its regions.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::lanes::EpLanes;
use super::Core;
use crate::engine::{TxResult, TxStatus};
use crate::rma::sw::GetReply;
use crate::wire::rma::{AmoReq, GetRep};
use crate::wire::{self, Header, Msg};

/// Whether active message `id` is an emulated operation the target applies.
#[inline]
pub(crate) fn is_target_id(id: u8) -> bool {
    matches!(id, wire::AM_RMA_PUT | wire::AM_RMA_GET_REQ | wire::AM_AMO_REQ)
}

/// A region id no table ever holds: a get whose region was not found.
const NO_REGION: u64 = u64::MAX;

impl Core {
    /// The region `[addr, addr + len)` lies in, with the address as a pointer; `None` when it
    /// is not within one region this worker mapped.
    fn region_of(&self, addr: u64, len: u64) -> Option<(Id, *mut u8)> {
        let end = addr.checked_add(len)?;
        let mems = self.mems.borrow();
        let found = mems
            .iter()
            .find(|(_, m)| addr >= m.addr as u64 && end <= (m.addr as u64).saturating_add(m.len as u64))
            .map(|(id, _)| (id, addr as usize as *mut u8));
        found
    }

    /// Whether region `mem` still covers `[addr, addr + len)`; the address as a pointer.
    fn still_mapped(&self, mem: Id, addr: u64, len: u64) -> Option<*mut u8> {
        let end = addr.checked_add(len)?;
        let mems = self.mems.borrow();
        let m = mems.get(mem)?;
        (addr >= m.addr as u64 && end <= (m.addr as u64).saturating_add(m.len as u64))
            .then_some(addr as usize as *mut u8)
    }

    /// A peer's emulated put, get or atomic arrived.
    pub(crate) fn rma_target(&self, id: u8, data: &[u8]) {
        match Msg::decode(id, data) {
            Ok(Msg::RmaPut(h, payload)) => {
                let Some(ep) = self.engine.borrow().sh.ep_from_wire(h.ep, "rma put") else { return };
                match self.region_of(h.addr, payload.len() as u64) {
                    Some((_, p)) => {
                        // SAFETY: `[p, p + len)` lies within a region this worker mapped (checked
                        // just now), which stays mapped while in the table; a mapped region may be
                        // written by peers at any time (the contract of `mem_map`). The payload is
                        // the transport's buffer, not that memory.
                        unsafe { std::ptr::copy_nonoverlapping(payload.as_ptr(), p, payload.len()) }
                    }
                    None => self.refuse(ep, "put", h.addr, payload.len() as u64),
                }
            }
            Ok(Msg::RmaGet(h)) => {
                let Some(ep) = self.engine.borrow().sh.ep_from_wire(h.ep, "rma get") else { return };
                let mem = match self.region_of(h.addr, h.len) {
                    Some((m, _)) => m,
                    None => Id::from_raw(NO_REGION),
                };
                // The reply goes in pieces through the endpoint's queue; each piece checks the
                // region again (and a missing one sends the refusal).
                self.with_engine(|e| e.sh.rma_get_reply(ep, h.rreq, h.addr, h.len.max(1), mem));
            }
            Ok(Msg::Amo(h)) => {
                let Some(ep) = self.engine.borrow().sh.ep_from_wire(h.ep, "atomic") else { return };
                let r = self.apply_atomic(&h);
                self.with_engine(|e| match r {
                    Ok(old) if h.fetch => e.sh.rma_amo_reply(ep, h.rreq, old, Status::Ok),
                    Ok(_) => {}
                    Err(st) if h.fetch => e.sh.rma_amo_reply(ep, h.rreq, 0, st),
                    Err(st) => e.sh.rma_target_error(ep, st),
                });
            }
            Ok(_) => {}
            Err(e) => crate::engine::am::malformed(e),
        }
    }

    /// Logs a refused operation of the peer of `ep`; its next flush reports it.
    fn refuse(&self, ep: Id, what: &str, addr: u64, len: u64) {
        let name = self.engine.borrow().sh.eps.get(ep).map(|e| e.remote.name.clone()).unwrap_or_default();
        tracing::warn!("ucp: peer '{name}' sent an emulated {what} of {len} bytes at {addr:#x}, outside every region this worker mapped; refused");
        self.with_engine(|e| e.sh.rma_target_error(ep, Status::OutOfRange));
    }

    /// Applies an emulated atomic to this worker's memory; the old value.
    fn apply_atomic(&self, h: &AmoReq) -> UcsResult<u64> {
        let size = h.size as u64;
        if h.addr % size != 0 {
            tracing::warn!("ucp: emulated atomic at {:#x}: not aligned to {size} bytes; refused", h.addr);
            return Err(Status::InvalidParam);
        }
        let Some((_, p)) = self.region_of(h.addr, size) else {
            tracing::warn!("ucp: emulated atomic at {:#x}: outside every region this worker mapped; refused", h.addr);
            return Err(Status::OutOfRange);
        };
        use uct::AtomicOp as Op;
        let o = Ordering::SeqCst;
        // SAFETY: `p` is aligned to the operand's size (checked) and lies within a region this
        // worker mapped (checked just now, and mapped while in the table); peers and this
        // process access such memory only atomically while atomics may target it, as for the
        // transports' own CPU atomics.
        let old = unsafe {
            if size == 4 {
                let a = AtomicU32::from_ptr(p.cast());
                let v = h.value as u32;
                (match h.op {
                    Op::Add => a.fetch_add(v, o),
                    Op::And => a.fetch_and(v, o),
                    Op::Or => a.fetch_or(v, o),
                    Op::Xor => a.fetch_xor(v, o),
                    Op::Swap => a.swap(v, o),
                    Op::Cswap => a.compare_exchange(h.compare as u32, v, o, o).unwrap_or_else(|x| x),
                }) as u64
            } else {
                let a = AtomicU64::from_ptr(p.cast());
                let v = h.value;
                match h.op {
                    Op::Add => a.fetch_add(v, o),
                    Op::And => a.fetch_and(v, o),
                    Op::Or => a.fetch_or(v, o),
                    Op::Xor => a.fetch_xor(v, o),
                    Op::Swap => a.swap(v, o),
                    Op::Cswap => a.compare_exchange(h.compare, v, o, o).unwrap_or_else(|x| x),
                }
            }
        };
        Ok(old)
    }

    /// Sends `len` bytes of a get reply from this worker's memory, or the refusal when the
    /// region is not (or no longer) mapped.
    pub(crate) fn exec_get_data(&self, lanes: &EpLanes, g: &GetReply, len: usize) -> TxResult {
        let at = g.addr.wrapping_add(g.offset);
        let src = self.still_mapped(g.mem, at, len as u64);
        let status = if src.is_some() { Status::Ok } else { Status::OutOfRange };
        if src.is_none() {
            tracing::warn!(
                "ucp: a peer's emulated get of {} bytes at {:#x} is outside every region this worker mapped; refused",
                g.len,
                g.addr
            );
        }
        let hdr = GetRep { rreq: g.rreq, offset: g.offset, status };
        let r = lanes.am().am_bcopy(
            wire::AM_RMA_GET_REP,
            &mut |dst| {
                let Ok(n) = hdr.encode(dst) else { return 0 };
                match (src, dst.get_mut(n..n + len)) {
                    (Some(p), Some(room)) => {
                        // SAFETY: `[p, p + len)` lies within a region this worker mapped
                        // (checked just before this call; nothing runs in between: the
                        // transport packs before it delivers anything).
                        unsafe { std::ptr::copy_nonoverlapping(p, room.as_mut_ptr(), len) };
                        n + len
                    }
                    _ => n,
                }
            },
            uct::SendFlags::empty(),
        );
        let mut res = TxResult::from_uct(r.map(|o| o.map(|_| ())));
        if src.is_none() && res.status == TxStatus::Done {
            res.status = TxStatus::Failed(Status::OutOfRange);
        }
        res
    }
}
