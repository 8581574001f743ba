//! The send path of a `ud_verbs` interface: posting datagrams (inline or from registered
//! descriptors), send-queue credits, send completions.

use std::collections::VecDeque;

use rdma_core_sys as sys;
use ucs::mpool::PoolBuf;
use ucs::{Status, UcsResult};

use super::{bump, IfaceInner, QKEY};
use crate::ud::conn::Transmit;
use crate::verbs::Ah;

/// Send completions are requested every this many sends (UCX `UCT_UD_TX_MODERATION`).
pub(super) const TX_MODERATION: u32 = 64;

/// Send side: send-queue credits and the descriptors of posted, unretired sends.
pub(super) struct Tx {
    pub(super) available: i64,
    pub(super) unsignaled: u32,
    /// Number of the last posted request, and of the last retired one.
    pub(super) sn: u64,
    pub(super) done_sn: u64,
    pub(super) outstanding: VecDeque<(u64, PoolBuf)>,
}

impl IfaceInner {
    /// Posts one datagram to `qpn` through `ah`: inline when it fits, else from a registered
    /// descriptor: `desc`, whose bytes from `filled` on already equal `bytes` (the packed
    /// payload of a bcopy), or a fresh one. The caller checked that a send-queue slot is free.
    pub(super) fn post(&self, bytes: &[u8], ah: &Ah, qpn: u32, desc: Option<(PoolBuf, usize)>) -> UcsResult<()> {
        let inline = bytes.len() <= self.max_inline;
        let mut keep = None;
        let mut sge = sys::ibv_sge { addr: bytes.as_ptr() as u64, length: bytes.len() as u32, lkey: 0 };
        if !inline {
            let (mut d, filled) = match desc {
                Some((d, filled)) => (d, filled.min(bytes.len())),
                None => (self.tx_pool.get_buf().ok_or(Status::NoResource)?, bytes.len()),
            };
            let dst = d.as_mut_slice().get_mut(..filled).ok_or(Status::InvalidParam)?;
            dst.copy_from_slice(&bytes[..filled]);
            if d.len() < bytes.len() {
                return Err(Status::InvalidParam);
            }
            let lkey = self.tx_chunks.lkey(d.as_ptr()).ok_or(Status::IoError)?;
            sge = sys::ibv_sge { addr: d.as_ptr() as u64, length: bytes.len() as u32, lkey };
            keep = Some(d);
        }
        let mut tx = self.tx.borrow_mut();
        let signal = tx.unsignaled + 1 >= TX_MODERATION.min(self.cfg.ib.tx_queue_len / 2).max(1) || tx.available <= 1;
        // SAFETY: zero is a valid bit pattern for a work request.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        let sn = tx.sn + 1;
        wr.wr_id = sn;
        wr.opcode = sys::IBV_WR_SEND;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.send_flags = if inline { sys::IBV_SEND_INLINE } else { 0 } | if signal { sys::IBV_SEND_SIGNALED } else { 0 };
        wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 { ah: ah.as_ptr(), remote_qpn: qpn, remote_qkey: QKEY };
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live; wr and its SGE are valid for the call; the SGE points at
        // inline bytes (copied by the post) or at a registered descriptor kept in
        // `tx.outstanding` until a completion retires the request; the address handle lives in
        // `ahs` for as long as the interface (whose QP is destroyed first).
        let r = unsafe { sys::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if r != 0 {
            tracing::error!("ud_verbs: ibv_post_send failed: {}", std::io::Error::from_raw_os_error(r));
            return Err(Status::IoError);
        }
        tx.sn = sn;
        tx.available -= 1;
        tx.unsignaled = if signal { 0 } else { tx.unsignaled + 1 };
        if let Some(d) = keep {
            tx.outstanding.push_back((sn, d));
        }
        drop(tx);
        bump(&self.stats, |s| s.tx_posted += 1);
        Ok(())
    }

    /// True when a send-queue slot is free.
    pub(crate) fn tx_available(&self) -> bool {
        self.tx.borrow().available > 0
    }

    /// Posts what the core returned for a send (see [`post`](Self::post) for `desc`).
    pub(crate) fn post_transmit(&self, t: &Transmit<'_>, desc: Option<(PoolBuf, usize)>) -> UcsResult<()> {
        let ah = self.ah_for(&t.peer.dev_addr)?;
        self.post(t.bytes, &ah, t.peer.qp_num, desc)
    }

    /// A registered send descriptor (for bcopy packing), or `None` when the pool is exhausted.
    pub(crate) fn tx_desc(&self) -> Option<PoolBuf> {
        self.tx_pool.get_buf()
    }

    /// Posts the control packets, resends and acknowledgements the core has, while send-queue
    /// slots last.
    pub(crate) fn drain_transmits(&self, now: u64) -> usize {
        let mut n = 0;
        while self.tx_available() {
            let mut core = self.core.borrow_mut();
            let Some(t) = core.poll_transmit(now) else { break };
            if let Err(e) = self.post_transmit(&t, None) {
                // The datagram is lost; the reliability layer recovers from that.
                tracing::debug!(ep = t.ep, "ud_verbs: could not post a {:?} datagram: {e}", t.kind);
            }
            n += 1;
        }
        n
    }

    /// Retires send requests up to the one a completion names.
    pub(super) fn handle_tx(&self, wc: &sys::ibv_wc) {
        if wc.status != sys::IBV_WC_SUCCESS && wc.status != sys::IBV_WC_WR_FLUSH_ERR {
            tracing::error!(
                "ud_verbs: send completion with error: {} (vendor error {:#x})",
                sys::wc_status_str(wc.status),
                wc.vendor_err
            );
            // A send error leaves a UD QP in the send-queue-error state; the datagram is lost
            // (the reliability layer resends it), the QP goes back to sending.
            // SAFETY: zero is a valid bit pattern for the attribute struct.
            let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
            a.qp_state = sys::IBV_QPS_RTS;
            let _ = self.qp.modify(&mut a, sys::IBV_QP_STATE, "SQE->RTS");
        }
        let mut tx = self.tx.borrow_mut();
        let sn = wc.wr_id;
        if sn <= tx.done_sn || sn > tx.sn {
            return;
        }
        tx.available += (sn - tx.done_sn) as i64;
        tx.done_sn = sn;
        while tx.outstanding.front().is_some_and(|(s, _)| *s <= sn) {
            tx.outstanding.pop_front();
        }
    }
}
