//! The receive path of a `ud_verbs` interface: receive buffers and their refill, receive
//! completions, loss injection, validation, and delivery of active messages and puts.

use rdma_core_sys as sys;
use ucs::mpool::PoolBuf;
use uct::AmRecv;

use super::{bump, IfaceInner, GRH_LEN, PUT_HDR_LEN};
use crate::pool::RecvSlots;
use crate::ud::conn::{ReleaseReason, RxOutcome};
use crate::ud::loss::{Fate, LossHook};
use crate::ud::wire::{self, Creq, CtlPacket, Neth, Packet, PacketKind, NETH_LEN};
use crate::verbs::remote_write_allowed;

/// A received datagram as the reliability core holds it: the pool buffer (GRH area first) and
/// the length of the packet after the GRH area.
#[derive(Debug)]
pub(crate) struct RxDesc {
    pub(super) buf: Option<PoolBuf>,
    pub(super) len: usize,
}

impl AsRef<[u8]> for RxDesc {
    fn as_ref(&self) -> &[u8] {
        self.buf.as_ref().and_then(|b| b.as_slice().get(GRH_LEN..GRH_LEN + self.len)).unwrap_or(&[])
    }
}

/// Receive side: one slot per posted receive (the slot index is the work request id).
pub(super) struct Rx {
    /// The posted receive buffers.
    pub(super) ring: RecvSlots,
    /// Datagrams the loss injector holds back, processed after the next poll.
    pub(super) delayed: Vec<RxDesc>,
}

impl IfaceInner {
    /// Takes the buffer of a receive completion; `None` (buffer back in its slot) for errors.
    pub(super) fn take_rx(&self, wc: &sys::ibv_wc) -> Option<RxDesc> {
        let idx = wc.wr_id as usize;
        let mut rx = self.rx.borrow_mut();
        let Some(buf) = rx.ring.slots.get_mut(idx).and_then(Option::take) else {
            tracing::error!(wr_id = wc.wr_id, "ud_verbs: receive completion for an empty slot");
            return None;
        };
        if wc.status != sys::IBV_WC_SUCCESS {
            rx.ring.slots[idx] = Some(buf);
            // A flushed receive means the QP is going away: do not post it again.
            if wc.status != sys::IBV_WC_WR_FLUSH_ERR {
                tracing::warn!("ud_verbs: receive completion with error: {}", sys::wc_status_str(wc.status));
                rx.ring.refill.push(idx as u32);
            }
            return None;
        }
        rx.ring.refill.push(idx as u32);
        let total = wc.byte_len as usize;
        if total < GRH_LEN + NETH_LEN || total > self.rx_buf_len {
            drop(rx);
            bump(&self.stats, |s| s.rx_malformed += 1);
            tracing::debug!(byte_len = total, "ud_verbs: dropped a datagram of impossible length");
            return None;
        }
        Some(RxDesc { buf: Some(buf), len: total - GRH_LEN })
    }

    /// Processes one receive completion: loss injection, then the core.
    pub(super) fn handle_rx(&self, now: u64, wc: &sys::ibv_wc) -> usize {
        let Some(desc) = self.take_rx(wc) else { return 0 };
        bump(&self.stats, |s| s.rx_datagrams += 1);
        let fate = self.loss.borrow_mut().as_mut().map_or(Fate::Deliver, LossHook::fate);
        match fate {
            Fate::Deliver => self.on_datagram(now, desc),
            Fate::Drop => {
                bump(&self.stats, |s| s.loss_dropped += 1);
                0
            }
            Fate::Reorder => {
                bump(&self.stats, |s| s.loss_reordered += 1);
                self.rx.borrow_mut().delayed.push(desc);
                0
            }
            Fate::Duplicate => {
                bump(&self.stats, |s| s.loss_duplicated += 1);
                let copy = self.rx_pool.get_buf().map(|mut b| {
                    let n = (GRH_LEN + desc.len).min(b.len());
                    if let Some(src) = desc.buf.as_ref() {
                        b[..n].copy_from_slice(&src[..n]);
                    }
                    RxDesc { buf: Some(b), len: desc.len }
                });
                let mut n = self.on_datagram(now, desc);
                if let Some(c) = copy {
                    n += self.on_datagram(now, c);
                }
                n
            }
        }
    }

    /// Checks a connection request's device address before the core sees it (it creates an
    /// endpoint for any well-formed request), and creates the address handle the reply needs.
    pub(super) fn creq_acceptable(&self, creq: &Creq) -> bool {
        match self.ah_for(&creq.dev_addr) {
            Ok(_) => true,
            Err(e) => {
                if !self.warned_creq.replace(true) {
                    tracing::warn!(
                        dev = ?creq.dev_addr,
                        "ud_verbs: dropped a connection request from an unusable address: {e} (further ones are \
                         logged at debug level)"
                    );
                } else {
                    tracing::debug!(dev = ?creq.dev_addr, "ud_verbs: dropped a connection request: {e}");
                }
                false
            }
        }
    }

    /// Hands one datagram to the core and delivers what became deliverable.
    pub(super) fn on_datagram(&self, now: u64, desc: RxDesc) -> usize {
        let to_null = Neth::decode(desc.as_ref()).is_ok_and(|n| n.dest_ep_id == wire::EP_NULL_ID);
        if to_null {
            if let Ok(Packet::Ctl { ctl: CtlPacket::Creq(creq), .. }) = Packet::decode(desc.as_ref()) {
                if !self.creq_acceptable(&creq) {
                    bump(&self.stats, |s| s.rx_malformed += 1);
                    return 0;
                }
            }
        }
        let outcome = self.core.borrow_mut().on_packet(now, desc);
        self.note_activity(now);
        let ep = outcome.ep();
        let mut n = 1;
        match outcome {
            RxOutcome::Deliver { ep, kind, desc } => self.deliver(ep, kind, desc),
            RxOutcome::Held { .. } => {}
            RxOutcome::Release { reason, .. } => match reason {
                ReleaseReason::Invalid(e) => {
                    bump(&self.stats, |s| s.rx_malformed += 1);
                    tracing::debug!("ud_verbs: dropped a malformed datagram: {e}");
                }
                ReleaseReason::Rejected => tracing::debug!("ud_verbs: rejected a control packet"),
                ReleaseReason::UnknownEp => tracing::trace!("ud_verbs: datagram for an unknown endpoint"),
                _ => {}
            },
        }
        if let Some(ep) = ep {
            loop {
                let next = self.core.borrow_mut().pull(ep);
                match next {
                    Some((kind @ (PacketKind::Am(_) | PacketKind::Put), desc)) => {
                        self.deliver(ep, kind, desc);
                        n += 1;
                    }
                    Some(_) => {}
                    None => break,
                }
            }
            self.after_ep_activity(ep);
        }
        n
    }

    /// Gives an in-order active message to its handler, or performs a put.
    pub(super) fn deliver(&self, ep: u32, kind: PacketKind, mut desc: RxDesc) {
        match kind {
            PacketKind::Am(id) => {
                let len = desc.len.saturating_sub(NETH_LEN);
                let _ = self.base.am.invoke(id, AmRecv::from_desc(&mut desc.buf, GRH_LEN + NETH_LEN, len));
            }
            PacketKind::Put => self.do_put(ep, desc.as_ref().get(NETH_LEN..).unwrap_or(&[])),
            _ => {}
        }
    }

    /// Writes a put (remote address, remote key, data) into local memory, if a live
    /// registration with remote write access covers it.
    pub(super) fn do_put(&self, ep: u32, payload: &[u8]) {
        let Some((hdr, data)) = payload.split_first_chunk::<PUT_HDR_LEN>() else {
            bump(&self.stats, |s| s.rx_malformed += 1);
            tracing::debug!(ep, "ud_verbs: put shorter than its header");
            return;
        };
        let addr = u64::from_le_bytes(hdr[..8].try_into().unwrap_or_default());
        let rkey = u32::from_le_bytes(hdr[8..].try_into().unwrap_or_default());
        if data.is_empty() {
            return;
        }
        if !remote_write_allowed(&self.pd, rkey, addr, data.len()) {
            bump(&self.stats, |s| s.put_rejected += 1);
            if !self.warned_put.replace(true) {
                tracing::warn!(
                    ep,
                    addr,
                    rkey,
                    len = data.len(),
                    "ud_verbs: refused a put outside every registration with remote write access (further ones \
                     are logged at debug level)"
                );
            } else {
                tracing::debug!(ep, addr, rkey, len = data.len(), "ud_verbs: refused a put");
            }
            return;
        }
        // SAFETY: [addr, addr + len) lies inside a live registration of this protection domain
        // with remote write access (checked just above, on this thread, which owns every such
        // registration): memory its owner mapped and exposed to remote writes, exactly what an
        // RDMA WRITE with that key could reach. `copy` (not `copy_nonoverlapping`): nothing
        // stops a user from registering the range of a receive buffer.
        unsafe { std::ptr::copy(data.as_ptr(), addr as usize as *mut u8, data.len()) };
    }

    pub(super) fn refill(&self) -> usize {
        let qp = self.qp.as_ptr();
        let mut rx = self.rx.borrow_mut();
        rx.ring.refill(&self.rx_pool, &self.rx_chunks, self.rx_buf_len, "ud_verbs: ibv_post_recv", |wrs| {
            let mut bad = std::ptr::null_mut();
            // SAFETY: the QP is live; the chain and its SGEs live in the ring's arrays for the
            // call; every buffer is a registered pool slot of `rx_buf_len` bytes kept in its
            // slot until its completion (and the QP is destroyed before the slots).
            unsafe { sys::ibv_post_recv(qp, wrs, &mut bad) }
        })
    }
}
