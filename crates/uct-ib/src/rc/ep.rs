//! `rc_verbs` endpoints: one RC queue pair each, connected to one remote endpoint.
//!
//! Every work request carries the endpoint's sequence number as its id. Only every
//! `TX_CQ_MODERATION`-th request (and those whose completion someone waits for) asks for a
//! completion; a completion of number `n` retires every request up to `n`, since a QP completes
//! in order. Retired requests return their send-queue credits and release their descriptors,
//! copy out get/atomic results and fire user completions.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;

use rdma_core_sys as sys;
use ucs::arbiter::GroupId;
use ucs::mpool::PoolBuf;
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    check_am_id, check_length, iov_total_len, AtomicOp, Completion, Ep, FlushFlags, Iov, PackFn, PendingHandle,
    RemoteKey, RndvOp, SendFlags, Tag,
};

use super::iface::IfaceInner;
use super::tm::RcTm;
use super::{unpack_ep_addr, DevAddr, FC_HARD_REQ, FC_PURE_GRANT, FC_SOFT_REQ};
use crate::device::LinkLayer;
use crate::md::{IbRegion, NAME as COMPONENT};
use crate::tm::wire::{Rvh, Tmh, TmhOp, TMH_LEN};
use crate::verbs::Qp;

/// What a work request leaves behind until it is retired.
enum Op {
    /// A bcopy descriptor, released (dropped) when the request retires.
    Desc(#[allow(dead_code)] PoolBuf),
    /// A user completion.
    Comp(Rc<Completion>),
    /// An RDMA READ into a descriptor, copied to the user's buffer when done.
    GetBcopy { desc: PoolBuf, dst: *mut u8, len: usize, comp: Option<Rc<Completion>> },
    /// An atomic whose old value lands in a descriptor, copied to `result` when done.
    Fetch { desc: PoolBuf, result: *mut u8, size: usize, comp: Option<Rc<Completion>> },
    /// The tag device's rendezvous READ into a posted receive (tag matching, emulated).
    TmRead(u64),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Created,
    Connected,
    Failed(Status),
}

pub(crate) struct EpShared {
    iface: Rc<IfaceInner>,
    qp: Qp,
    user_data: u64,
    group: GroupId,
    state: Cell<State>,
    /// Send-queue credits.
    sq_available: Cell<i64>,
    unsignaled: Cell<u32>,
    /// Signaled requests not completed yet (their CQ entries).
    signaled: Cell<i64>,
    /// Number of the last posted request, and of the last retired one.
    sn: Cell<u64>,
    done_sn: Cell<u64>,
    outstanding: RefCell<VecDeque<(u64, Op)>>,
    /// Active messages that may go out before the peer grants more.
    fc_wnd: Cell<i64>,
    grant_owed: Cell<bool>,
}

fn wc_status(status: sys::ibv_wc_status) -> Status {
    match status {
        sys::IBV_WC_RETRY_EXC_ERR | sys::IBV_WC_RNR_RETRY_EXC_ERR => Status::EndpointTimeout,
        sys::IBV_WC_REM_ACCESS_ERR | sys::IBV_WC_REM_INV_REQ_ERR | sys::IBV_WC_REM_OP_ERR => Status::ConnectionReset,
        sys::IBV_WC_WR_FLUSH_ERR => Status::Canceled,
        _ => Status::IoError,
    }
}

impl EpShared {
    pub(crate) fn is_failed(&self) -> bool {
        matches!(self.state.get(), State::Failed(_))
    }

    /// True when a request could be posted now (queue and CQ credits, AM window aside).
    pub(crate) fn has_send_resources(&self) -> bool {
        self.sq_available.get() > 0 && self.iface.cq_available.get() > 0
    }

    fn check_state(&self) -> UcsResult<()> {
        match self.state.get() {
            State::Connected => Ok(()),
            State::Created => Err(Status::NotConnected),
            State::Failed(st) => Err(st),
        }
    }

    /// `NoResource` when the queue is full or others wait before us.
    #[inline]
    fn ready(&self, signal: bool) -> OpResult<()> {
        self.check_state()?;
        if self.sq_available.get() <= 0 || !self.iface.base.pending.may_send(self.group) {
            return Ok(Outcome::NoResource);
        }
        let need_cq =
            signal || self.unsignaled.get() + 1 >= self.iface.cfg.tx_cq_moderation || self.sq_available.get() == 1;
        if need_cq && self.iface.cq_available.get() <= 0 {
            return Ok(Outcome::NoResource);
        }
        Ok(Outcome::Done(()))
    }

    /// Posts `wr` (after [`EpShared::ready`] said yes), leaving `op` to be retired.
    fn post(&self, wr: &mut sys::ibv_send_wr, signal: bool, op: Option<Op>) -> UcsResult<()> {
        let signal =
            signal || self.unsignaled.get() + 1 >= self.iface.cfg.tx_cq_moderation || self.sq_available.get() == 1;
        let sn = self.sn.get() + 1;
        wr.wr_id = sn;
        if signal {
            wr.send_flags |= sys::IBV_SEND_SIGNALED;
        }
        let mut bad = std::ptr::null_mut();
        // SAFETY: the QP is live and connected; wr and its SGEs are valid for the call; SGEs
        // point at registered memory that stays alive until the request is retired (the
        // descriptor in `op`, or user memory the caller vouched for), or are inline.
        let r = unsafe { sys::ibv_post_send(self.qp.as_ptr(), wr, &mut bad) };
        if r != 0 {
            tracing::error!("rc_verbs: ibv_post_send failed: {}", std::io::Error::from_raw_os_error(r));
            return Err(Status::IoError);
        }
        self.sn.set(sn);
        self.sq_available.set(self.sq_available.get() - 1);
        if signal {
            self.unsignaled.set(0);
            self.signaled.set(self.signaled.get() + 1);
            self.iface.cq_available.set(self.iface.cq_available.get() - 1);
        } else {
            self.unsignaled.set(self.unsignaled.get() + 1);
        }
        if let Some(op) = op {
            self.outstanding.borrow_mut().push_back((sn, op));
        }
        Ok(())
    }

    fn retire(&self, op: Op, status: Status) {
        match op {
            Op::Desc(_) => {}
            Op::Comp(c) => c.complete(status),
            Op::GetBcopy { desc, dst, len, comp } => {
                if status == Status::Ok {
                    // SAFETY: the caller of get_bcopy keeps `dst` valid for `len` bytes until
                    // completion; the descriptor holds at least `len` bytes (checked at post).
                    unsafe { std::ptr::copy_nonoverlapping(desc.as_ptr(), dst, len) };
                }
                if let Some(c) = comp {
                    c.complete(status);
                }
            }
            Op::Fetch { desc, result, size, comp } => {
                if status == Status::Ok && size > 0 {
                    // SAFETY: the caller keeps `result` valid for a write of `size` bytes until
                    // completion; the descriptor holds the fetched value.
                    unsafe { std::ptr::copy_nonoverlapping(desc.as_ptr(), result, size) };
                }
                if let Some(c) = comp {
                    c.complete(status);
                }
            }
            Op::TmRead(read) => {
                if let Some(tm) = &self.iface.tm {
                    tm.read_finished(&self.iface, read, status == Status::Ok);
                }
            }
        }
    }

    pub(crate) fn on_send_completion(&self, wc: &sys::ibv_wc) {
        if wc.status != sys::IBV_WC_SUCCESS {
            self.fail(wc_status(wc.status), Some(wc));
            return;
        }
        let sn = wc.wr_id;
        self.signaled.set(self.signaled.get() - 1);
        self.iface.cq_available.set(self.iface.cq_available.get() + 1);
        let retired = sn.saturating_sub(self.done_sn.get());
        self.done_sn.set(sn.max(self.done_sn.get()));
        self.sq_available.set(self.sq_available.get() + retired as i64);
        loop {
            let next = {
                let mut q = self.outstanding.borrow_mut();
                match q.front() {
                    Some((s, _)) if *s <= sn => q.pop_front().map(|(_, op)| op),
                    _ => None,
                }
            };
            match next {
                Some(op) => self.retire(op, Status::Ok),
                None => break,
            }
        }
        if retired > 0 && !self.iface.base.pending.group_is_empty(self.group) {
            self.iface.base.pending.schedule(self.group);
        }
    }

    /// Fails the endpoint: moves the QP to the error state, completes everything outstanding
    /// with `status` and tells the user's error handler, once.
    fn fail(&self, status: Status, wc: Option<&sys::ibv_wc>) {
        if self.is_failed() {
            return;
        }
        if let Some(wc) = wc {
            tracing::debug!(
                "rc_verbs: send completion with error on qpn {:#x}: {} (vendor error {:#x})",
                wc.qp_num,
                sys::wc_status_str(wc.status),
                wc.vendor_err
            );
        }
        self.state.set(State::Failed(status));
        self.to_error_state();
        // The CQ entries of signaled requests are given back now; the flushed entries that
        // still arrive for this QP are ignored by `on_send_completion` (failed already).
        self.iface.cq_available.set(self.iface.cq_available.get() + self.signaled.replace(0));
        let ops: Vec<(u64, Op)> = self.outstanding.borrow_mut().drain(..).collect();
        for (_, op) in ops {
            self.retire(op, status);
        }
        if let Some(tm) = &self.iface.tm {
            tm.ep_gone(&self.iface, self.qp.qp_num(), status);
        }
        self.iface.report_failure(self.user_data, status);
        if !self.iface.base.pending.group_is_empty(self.group) {
            self.iface.base.pending.schedule(self.group);
        }
    }

    fn to_error_state(&self) {
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::IBV_QPS_ERR;
        let _ = self.qp.modify(&mut attr, sys::IBV_QP_STATE, "ERR");
    }

    pub(crate) fn on_grant(&self) {
        self.fc_wnd.set(self.iface.cfg.fc_wnd_size as i64);
        if !self.iface.base.pending.group_is_empty(self.group) {
            self.iface.base.pending.schedule(self.group);
        }
    }

    pub(crate) fn owe_grant(self: &Rc<Self>) {
        if !self.grant_owed.replace(true) {
            self.iface.grants.borrow_mut().push(Rc::downgrade(self));
        }
    }

    /// Sends a pure credit grant; false when it has to wait for resources.
    pub(crate) fn send_grant(&self) -> bool {
        if !self.grant_owed.get() || self.is_failed() {
            self.grant_owed.set(false);
            return true;
        }
        if self.check_state().is_err() || self.sq_available.get() <= 0 || self.iface.cq_available.get() <= 0 {
            return false;
        }
        // (The NO_TAG prefix first when tag matching is on.)
        let hdr = [0, FC_PURE_GRANT];
        let off = self.iface.am_off;
        if self.post_inline(sys::IBV_WR_SEND, &hdr[1 - off..], 0, 0).is_ok() {
            self.grant_owed.set(false);
        }
        true
    }

    fn post_inline(&self, opcode: sys::ibv_wr_opcode, data: &[u8], remote_addr: u64, rkey: u32) -> UcsResult<()> {
        let mut sge = sys::ibv_sge { addr: data.as_ptr() as u64, length: data.len() as u32, lkey: 0 };
        let mut wr = send_wr(opcode, &mut sge, 1, sys::IBV_SEND_INLINE);
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
        self.post(&mut wr, false, None)
    }

    /// The tag device's rendezvous READ `read`: the sender's data (`rvh`) into the posted
    /// buffer at `buf` (registered with `lkey`).
    pub(crate) fn tm_read(&self, read: u64, rvh: &Rvh, buf: *mut u8, lkey: u32) -> OpResult {
        if let Outcome::NoResource = self.ready(true)? {
            return Ok(Outcome::NoResource);
        }
        let mut sge = sys::ibv_sge { addr: buf as u64, length: rvh.len, lkey };
        let mut wr = send_wr(sys::IBV_WR_RDMA_READ, &mut sge, (rvh.len > 0) as i32, 0);
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr: rvh.va, rkey: rvh.rkey };
        self.post(&mut wr, true, Some(Op::TmRead(read)))?;
        Ok(Outcome::InProgress)
    }

    /// The tag device's FIN of a rendezvous (TMH and RVH, inline).
    pub(crate) fn tm_fin(&self, msg: &[u8]) -> OpResult {
        if let Outcome::NoResource = self.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        self.post_inline(sys::IBV_WR_SEND, msg, 0, 0)?;
        Ok(Outcome::Done(()))
    }

    /// Checks that tag matching is on; its state.
    fn tm(&self) -> UcsResult<&RcTm> {
        self.iface.tm.as_ref().ok_or_else(|| {
            tracing::debug!("rc_verbs: tag operations need tag matching on (UCX_RC_TM_ENABLE=y and tag handlers)");
            Status::Unsupported
        })
    }

    /// Sends a tagged message of `parts` inline, as a `SEND_WITH_IMM` when `imm` is given.
    fn send_tagged_inline(&self, parts: &[&[u8]], imm: Option<u32>) -> OpResult {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        if total > self.iface.max_inline {
            return Err(Status::InvalidParam);
        }
        if let Outcome::NoResource = self.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let mut buf = [0u8; 1024];
        let mut off = 0;
        for p in parts {
            buf[off..off + p.len()].copy_from_slice(p);
            off += p.len();
        }
        let mut sge = sys::ibv_sge { addr: buf.as_ptr() as u64, length: total as u32, lkey: 0 };
        let opcode = if imm.is_some() { sys::IBV_WR_SEND_WITH_IMM } else { sys::IBV_WR_SEND };
        let mut wr = send_wr(opcode, &mut sge, 1, sys::IBV_SEND_INLINE);
        wr.__bindgen_anon_1.imm_data = imm.unwrap_or(0).to_be();
        self.post(&mut wr, false, None)?;
        Ok(Outcome::Done(()))
    }

    /// Takes a send descriptor, or `None` when the pool is exhausted.
    fn desc(&self) -> Option<PoolBuf> {
        self.iface.tx_pool.get_buf()
    }

    fn desc_sge(&self, desc: &PoolBuf, len: usize) -> sys::ibv_sge {
        let lkey = self.iface.tx_chunks.lkey(desc.as_ptr()).unwrap_or(0);
        sys::ibv_sge { addr: desc.as_ptr() as u64, length: len as u32, lkey }
    }

    /// AM header byte with the flow-control request due at the current window; `None` when
    /// the window is closed.
    fn am_hdr(&self, id: u8) -> Option<u8> {
        let cfg = &self.iface.cfg;
        if cfg.fc_wnd_size == 0 {
            return Some(id);
        }
        let wnd = self.fc_wnd.get();
        if wnd <= 0 {
            return None;
        }
        Some(if wnd == cfg.fc_hard_thresh as i64 {
            id | FC_HARD_REQ
        } else if wnd == cfg.fc_soft_thresh as i64 {
            id | FC_SOFT_REQ
        } else {
            id
        })
    }

    fn am_sent(&self) {
        if self.iface.cfg.fc_wnd_size != 0 {
            self.fc_wnd.set(self.fc_wnd.get() - 1);
        }
    }

    fn sges_from_iov(&self, iov: &[Iov<'_>], out: &mut [sys::ibv_sge]) -> UcsResult<usize> {
        let mut n = 0;
        for e in iov {
            if e.count == 0 || e.length == 0 {
                continue;
            }
            let region = e.memh.and_then(|m| m.downcast_ref::<IbRegion>()).ok_or_else(|| {
                tracing::debug!("rc_verbs: a zero-copy iov entry without an ib memory handle");
                Status::InvalidParam
            })?;
            let stride = if e.stride == 0 { e.length } else { e.stride };
            for k in 0..e.count {
                let ptr = e.buffer.wrapping_add(k * stride);
                if !e.memh.is_some_and(|m| m.contains(ptr, e.length)) {
                    tracing::debug!("rc_verbs: iov entry outside its memory handle");
                    return Err(Status::InvalidParam);
                }
                if n == out.len() {
                    return Err(Status::InvalidParam);
                }
                out[n] = sys::ibv_sge { addr: ptr as u64, length: e.length as u32, lkey: region.lkey() };
                n += 1;
            }
        }
        Ok(n)
    }

    pub(crate) fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        if let State::Failed(_) = self.state.get() {
            return Ok(Outcome::Done(()));
        }
        if self.state.get() == State::Created {
            return Ok(Outcome::Done(()));
        }
        if flags.contains(FlushFlags::CANCEL) {
            self.fail(Status::Canceled, None);
            return Ok(Outcome::Done(()));
        }
        if self.outstanding.borrow().is_empty() && self.unsignaled.get() == 0 && self.sn.get() == self.done_sn.get() {
            return Ok(Outcome::Done(()));
        }
        if !self.iface.base.pending.may_send(self.group) {
            return Ok(Outcome::NoResource);
        }
        if self.unsignaled.get() > 0 || self.outstanding.borrow().is_empty() {
            // Nothing signaled covers the last requests: a signaled empty write does.
            if let Outcome::NoResource = self.ready(true)? {
                return Ok(Outcome::NoResource);
            }
            let mut wr = send_wr(sys::IBV_WR_RDMA_WRITE, std::ptr::null_mut(), 0, 0);
            self.post(&mut wr, true, comp.map(|c| Op::Comp(c.clone())))?;
        } else if let Some(c) = comp {
            let sn = self.sn.get();
            self.outstanding.borrow_mut().push_back((sn, Op::Comp(c.clone())));
        }
        Ok(Outcome::InProgress)
    }
}

fn send_wr(opcode: sys::ibv_wr_opcode, sge: *mut sys::ibv_sge, num_sge: i32, flags: u32) -> sys::ibv_send_wr {
    // SAFETY: zero is a valid bit pattern for a work request.
    let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
    wr.opcode = opcode;
    wr.sg_list = sge;
    wr.num_sge = num_sge;
    wr.send_flags = flags;
    wr
}

/// An `rc_verbs` endpoint.
pub struct RcEp {
    s: Rc<EpShared>,
}

impl RcEp {
    pub(crate) fn create(iface: &Rc<IfaceInner>, user_data: u64) -> UcsResult<RcEp> {
        let cap = sys::ibv_qp_cap {
            max_send_wr: iface.cfg.ib.tx_queue_len,
            max_recv_wr: 0,
            max_send_sge: iface.max_send_sge as u32,
            max_recv_sge: 1,
            max_inline_data: iface.max_inline as u32,
        };
        let qp = Qp::create(&iface.pd, sys::IBV_QPT_RC, &iface.send_cq, &iface.recv_cq, Some(&iface.srq), cap)?;
        // RESET -> INIT now, so the QP can receive as soon as the peer connects.
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = iface.port.num;
        a.qp_access_flags = sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ | sys::IBV_ACCESS_REMOTE_ATOMIC;
        qp.modify(
            &mut a,
            sys::IBV_QP_STATE | sys::IBV_QP_PKEY_INDEX | sys::IBV_QP_PORT | sys::IBV_QP_ACCESS_FLAGS,
            "INIT",
        )?;
        let group = iface.base.pending.add_group();
        let s = Rc::new(EpShared {
            iface: iface.clone(),
            user_data,
            group,
            state: Cell::new(State::Created),
            sq_available: Cell::new(qp.cap.max_send_wr.min(iface.cfg.ib.tx_queue_len) as i64),
            unsignaled: Cell::new(0),
            signaled: Cell::new(0),
            sn: Cell::new(0),
            done_sn: Cell::new(0),
            outstanding: RefCell::new(VecDeque::new()),
            fc_wnd: Cell::new(iface.cfg.fc_wnd_size as i64),
            grant_owed: Cell::new(false),
            qp,
        });
        iface.eps.borrow_mut().insert(s.qp.qp_num(), Rc::downgrade(&s));
        iface.groups.borrow_mut().insert(group, Rc::downgrade(&s));
        Ok(RcEp { s })
    }

    fn connect(&self, peer: DevAddr, qpn: u32) -> UcsResult<()> {
        let s = &self.s;
        let i = &s.iface;
        let eth = i.port.link_layer == LinkLayer::Ethernet;
        if peer.eth != eth {
            tracing::error!("rc_verbs: peer link layer differs (Ethernet {} here, {} there)", eth, peer.eth);
            return Err(Status::Unreachable);
        }
        if peer.tm != i.tm.is_some() {
            tracing::error!(
                "rc_verbs: peer's tag matching differs (on {} here, {} there): UCX_RC_TM_ENABLE must agree",
                i.tm.is_some(),
                peer.tm
            );
            return Err(Status::Unreachable);
        }
        let mut mtu = (i.port.mtu_enum).min(peer.mtu_enum as u32);
        if let Some(cap) = i.cfg.path_mtu {
            mtu = mtu.min(cap);
        }
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::IBV_QPS_RTR;
        a.path_mtu = mtu;
        a.dest_qp_num = qpn;
        a.rq_psn = 0;
        a.max_dest_rd_atomic = i.max_rd_atomic as u8;
        a.min_rnr_timer = i.cfg.min_rnr_timer;
        a.ah_attr.port_num = i.port.num;
        a.ah_attr.sl = i.cfg.ib.sl;
        a.ah_attr.dlid = peer.lid;
        if eth || peer.gid[..8] != i.gid.gid[..8] {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid.raw = peer.gid;
            a.ah_attr.grh.sgid_index = i.gid.index;
            a.ah_attr.grh.hop_limit = i.cfg.ib.hop_limit;
            a.ah_attr.grh.traffic_class = i.cfg.ib.traffic_class;
        }
        s.qp.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_AV
                | sys::IBV_QP_PATH_MTU
                | sys::IBV_QP_DEST_QPN
                | sys::IBV_QP_RQ_PSN
                | sys::IBV_QP_MAX_DEST_RD_ATOMIC
                | sys::IBV_QP_MIN_RNR_TIMER,
            "RTR",
        )?;
        // SAFETY: as above.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::IBV_QPS_RTS;
        a.sq_psn = 0;
        a.timeout = i.cfg.timeout_exp;
        a.retry_cnt = i.cfg.retry_count;
        a.rnr_retry = i.cfg.rnr_retry;
        a.max_rd_atomic = i.max_rd_atomic as u8;
        s.qp.modify(
            &mut a,
            sys::IBV_QP_STATE
                | sys::IBV_QP_TIMEOUT
                | sys::IBV_QP_RETRY_CNT
                | sys::IBV_QP_RNR_RETRY
                | sys::IBV_QP_SQ_PSN
                | sys::IBV_QP_MAX_QP_RD_ATOMIC,
            "RTS",
        )?;
        s.state.set(State::Connected);
        Ok(())
    }

    fn rkey_checked(&self, rkey: &RemoteKey, remote_addr: u64, len: usize) -> UcsResult<u32> {
        rkey.check(COMPONENT, remote_addr, len)?;
        Ok(rkey.rkey() as u32)
    }

    fn send_am_inline(&self, id: u8, parts: &[&[u8]]) -> OpResult {
        let s = &self.s;
        check_am_id(id)?;
        let off = s.iface.am_off;
        let total: usize = off + 1 + parts.iter().map(|p| p.len()).sum::<usize>();
        check_length(total - 1 - off, s.iface.base.attr.am.max_short, "am_short")?;
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let Some(hdr) = s.am_hdr(id) else { return Ok(Outcome::NoResource) };
        // (Zeroed: the NO_TAG prefix, when there is one, is 0.)
        let mut buf = [0u8; 1024];
        let Some(dst) = buf.get_mut(..total) else { return Err(Status::InvalidParam) };
        dst[off] = hdr;
        let mut off = off + 1;
        for p in parts {
            dst[off..off + p.len()].copy_from_slice(p);
            off += p.len();
        }
        s.post_inline(sys::IBV_WR_SEND, &buf[..total], 0, 0)?;
        s.am_sent();
        Ok(Outcome::Done(()))
    }

    #[allow(clippy::too_many_arguments)]
    fn fetch_op(
        &self,
        opcode: sys::ibv_wr_opcode,
        add_or_compare: u64,
        swap: u64,
        result: *mut u8,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let s = &self.s;
        if s.iface.base.attr.atomic64.fop_flags.is_empty() {
            return Err(Status::Unsupported);
        }
        if remote_addr % 8 != 0 {
            tracing::debug!(remote_addr, "rc_verbs: 64-bit atomic on an unaligned address");
            return Err(Status::InvalidParam);
        }
        let rk = self.rkey_checked(rkey, remote_addr, 8)?;
        if let Outcome::NoResource = s.ready(true)? {
            return Ok(Outcome::NoResource);
        }
        let Some(desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let mut sge = s.desc_sge(&desc, 8);
        let mut wr = send_wr(opcode, &mut sge, 1, 0);
        wr.wr.atomic =
            sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 { remote_addr, compare_add: add_or_compare, swap, rkey: rk };
        let op = if result.is_null() {
            Op::Fetch { desc, result: std::ptr::null_mut(), size: 0, comp: comp.cloned() }
        } else {
            Op::Fetch { desc, result, size: 8, comp: comp.cloned() }
        };
        s.post(&mut wr, true, Some(op))?;
        Ok(Outcome::InProgress)
    }
}

impl RcEp {
    /// RDMA WRITE or READ between registered local memory (`iov`) and the remote region;
    /// reads always ask for a completion, writes when the caller waits for one.
    ///
    /// # Safety
    /// The iov buffers must stay valid (and, for writes, unmodified) until completion.
    unsafe fn rdma_zcopy(
        &self,
        opcode: sys::ibv_wr_opcode,
        max: usize,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let s = &self.s;
        let len = iov_total_len(iov);
        check_length(len, max, if opcode == sys::IBV_WR_RDMA_READ { "get_zcopy" } else { "put_zcopy" })?;
        let rk = self.rkey_checked(rkey, remote_addr, len)?;
        let mut sges = [sys::ibv_sge { addr: 0, length: 0, lkey: 0 }; 8];
        let n = s.sges_from_iov(iov, &mut sges[..s.iface.max_send_sge.min(8)])?;
        let signal = opcode == sys::IBV_WR_RDMA_READ || comp.is_some();
        if let Outcome::NoResource = s.ready(signal)? {
            return Ok(Outcome::NoResource);
        }
        let mut wr = send_wr(opcode, sges.as_mut_ptr(), n as i32, 0);
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey: rk };
        s.post(&mut wr, signal, comp.map(|c| Op::Comp(c.clone())))?;
        Ok(Outcome::InProgress)
    }
}

impl Drop for RcEp {
    fn drop(&mut self) {
        let s = &self.s;
        let i = &s.iface;
        i.eps.borrow_mut().remove(&s.qp.qp_num());
        i.groups.borrow_mut().remove(&s.group);
        i.base.pending.remove_group(s.group);
        // Completions still in the CQ for this QP are ignored; give their entries back.
        i.cq_available.set(i.cq_available.get() + s.signaled.replace(0));
        s.to_error_state();
        let ops: Vec<(u64, Op)> = s.outstanding.borrow_mut().drain(..).collect();
        for (_, op) in ops {
            s.retire(op, Status::Canceled);
        }
        if let Some(tm) = &i.tm {
            tm.ep_gone(i, s.qp.qp_num(), Status::Canceled);
        }
    }
}

impl Ep for RcEp {
    fn put_short(&self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        let s = &self.s;
        check_length(data.len(), s.iface.base.attr.put.max_short, "put_short")?;
        let rk = self.rkey_checked(rkey, remote_addr, data.len())?;
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        s.post_inline(sys::IBV_WR_RDMA_WRITE, data, remote_addr, rk)?;
        Ok(Outcome::Done(()))
    }

    fn put_bcopy(&self, pack: PackFn<'_>, remote_addr: u64, rkey: &RemoteKey) -> OpResult<usize> {
        let s = &self.s;
        rkey.check(COMPONENT, remote_addr, 0)?;
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let Some(mut desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let len = pack(&mut desc[..]);
        check_length(len, s.iface.cfg.ib.seg_size, "put_bcopy packed")?;
        let rk = self.rkey_checked(rkey, remote_addr, len)?;
        let mut sge = s.desc_sge(&desc, len);
        let mut wr = send_wr(sys::IBV_WR_RDMA_WRITE, &mut sge, 1, 0);
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey: rk };
        s.post(&mut wr, false, Some(Op::Desc(desc)))?;
        Ok(Outcome::Done(len))
    }

    unsafe fn put_zcopy(
        &self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let max = self.s.iface.base.attr.put.max_zcopy;
        // SAFETY: forwarded (caller).
        unsafe { self.rdma_zcopy(sys::IBV_WR_RDMA_WRITE, max, iov, remote_addr, rkey, comp) }
    }

    unsafe fn get_bcopy(
        &self,
        buffer: *mut u8,
        length: usize,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let s = &self.s;
        check_length(length, s.iface.base.attr.get.max_bcopy, "get_bcopy")?;
        let rk = self.rkey_checked(rkey, remote_addr, length)?;
        if let Outcome::NoResource = s.ready(true)? {
            return Ok(Outcome::NoResource);
        }
        let Some(desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let mut sge = s.desc_sge(&desc, length);
        let mut wr = send_wr(sys::IBV_WR_RDMA_READ, &mut sge, 1, 0);
        wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey: rk };
        s.post(&mut wr, true, Some(Op::GetBcopy { desc, dst: buffer, len: length, comp: comp.cloned() }))?;
        Ok(Outcome::InProgress)
    }

    unsafe fn get_zcopy(
        &self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let max = self.s.iface.base.attr.get.max_zcopy;
        // SAFETY: forwarded (caller).
        unsafe { self.rdma_zcopy(sys::IBV_WR_RDMA_READ, max, iov, remote_addr, rkey, comp) }
    }

    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> OpResult {
        self.send_am_inline(id, &[&header.to_le_bytes(), payload])
    }

    fn am_short_iov(&self, id: u8, iov: &[&[u8]]) -> OpResult {
        if iov.len() > 16 {
            return Err(Status::InvalidParam);
        }
        self.send_am_inline(id, iov)
    }

    fn am_bcopy(&self, id: u8, pack: PackFn<'_>, _flags: SendFlags) -> OpResult<usize> {
        let s = &self.s;
        check_am_id(id)?;
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let Some(hdr) = s.am_hdr(id) else { return Ok(Outcome::NoResource) };
        let Some(mut desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let off = s.iface.am_off;
        desc[0] = 0;
        desc[off] = hdr;
        let len = pack(&mut desc[off + 1..]);
        check_length(len, s.iface.cfg.ib.seg_size - 1 - off, "am_bcopy packed")?;
        let mut sge = s.desc_sge(&desc, off + 1 + len);
        let mut wr = send_wr(sys::IBV_WR_SEND, &mut sge, 1, 0);
        s.post(&mut wr, false, Some(Op::Desc(desc)))?;
        s.am_sent();
        Ok(Outcome::Done(len))
    }

    unsafe fn am_zcopy(
        &self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        _flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let s = &self.s;
        check_am_id(id)?;
        check_length(header.len(), s.iface.base.attr.am.max_hdr, "am_zcopy header")?;
        let len = iov_total_len(iov);
        check_length(header.len() + len, s.iface.base.attr.am.max_zcopy, "am_zcopy")?;
        let mut sges = [sys::ibv_sge { addr: 0, length: 0, lkey: 0 }; 8];
        let max = s.iface.max_send_sge.min(8);
        let n = s.sges_from_iov(iov, &mut sges[1..max])?;
        if let Outcome::NoResource = s.ready(comp.is_some())? {
            return Ok(Outcome::NoResource);
        }
        let Some(hdr) = s.am_hdr(id) else { return Ok(Outcome::NoResource) };
        let Some(mut desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let off = s.iface.am_off;
        desc[0] = 0;
        desc[off] = hdr;
        desc[off + 1..off + 1 + header.len()].copy_from_slice(header);
        sges[0] = s.desc_sge(&desc, off + 1 + header.len());
        let mut wr = send_wr(sys::IBV_WR_SEND, sges.as_mut_ptr(), (n + 1) as i32, 0);
        let signal = comp.is_some();
        s.post(&mut wr, signal, Some(Op::Desc(desc)))?;
        if let Some(c) = comp {
            let sn = s.sn.get();
            s.outstanding.borrow_mut().push_back((sn, Op::Comp(c.clone())));
        }
        s.am_sent();
        Ok(Outcome::InProgress)
    }

    fn atomic64_post(&self, op: AtomicOp, value: u64, remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        if op != AtomicOp::Add || !self.s.iface.base.attr.atomic64.op_flags.has(op) {
            return Err(Status::Unsupported);
        }
        // A fetch-add whose result nobody reads; complete locally at once.
        match self.fetch_op(
            sys::IBV_WR_ATOMIC_FETCH_AND_ADD,
            value,
            0,
            std::ptr::null_mut(),
            remote_addr,
            rkey,
            None,
        )? {
            Outcome::NoResource => Ok(Outcome::NoResource),
            _ => Ok(Outcome::Done(())),
        }
    }

    unsafe fn atomic64_fetch(
        &self,
        op: AtomicOp,
        value: u64,
        result: *mut u64,
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        if op != AtomicOp::Add {
            return Err(Status::Unsupported);
        }
        self.fetch_op(sys::IBV_WR_ATOMIC_FETCH_AND_ADD, value, 0, result.cast(), remote_addr, rkey, comp)
    }

    unsafe fn atomic_cswap64(
        &self,
        compare: u64,
        swap: u64,
        remote_addr: u64,
        rkey: &RemoteKey,
        result: *mut u64,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        self.fetch_op(sys::IBV_WR_ATOMIC_CMP_AND_SWP, compare, swap, result.cast(), remote_addr, rkey, comp)
    }

    fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        self.s.flush(flags, comp)
    }

    fn check(&self, comp: Option<&Rc<Completion>>) -> OpResult {
        let s = &self.s;
        s.check_state()?;
        if let Outcome::NoResource = s.ready(true)? {
            return Ok(Outcome::NoResource);
        }
        // An empty signaled write reaches the peer's adapter; it fails if the peer is gone.
        let mut wr = send_wr(sys::IBV_WR_RDMA_WRITE, std::ptr::null_mut(), 0, 0);
        s.post(&mut wr, true, comp.map(|c| Op::Comp(c.clone())))?;
        Ok(if comp.is_some() { Outcome::InProgress } else { Outcome::Done(()) })
    }

    fn pending_add(&self, req: PendingHandle) -> UcsResult<()> {
        let s = &self.s;
        let window_open = s.iface.cfg.fc_wnd_size == 0 || s.fc_wnd.get() > 0;
        if s.has_send_resources() && window_open && s.iface.base.pending.group_is_empty(s.group) && !s.is_failed() {
            return Err(Status::Busy);
        }
        s.iface.base.pending.push(s.group, req);
        Ok(())
    }

    fn pending_purge(&self, sink: &mut dyn FnMut(PendingHandle)) {
        self.s.iface.base.pending.purge(self.s.group, sink);
    }

    fn address(&self) -> UcsResult<Vec<u8>> {
        Ok(self.s.qp.qp_num().to_le_bytes().to_vec())
    }

    fn connect_to_ep(&self, dev_addr: &[u8], ep_addr: &[u8]) -> UcsResult<()> {
        if self.s.state.get() != State::Created {
            return Err(Status::AlreadyExists);
        }
        let peer = DevAddr::unpack(dev_addr).ok_or_else(|| {
            tracing::debug!(len = dev_addr.len(), "rc_verbs: malformed device address");
            Status::InvalidAddr
        })?;
        let qpn = unpack_ep_addr(ep_addr).ok_or_else(|| {
            tracing::debug!(len = ep_addr.len(), "rc_verbs: malformed endpoint address");
            Status::InvalidAddr
        })?;
        self.connect(peer, qpn)
    }

    fn tag_eager_short(&self, tag: Tag, data: &[u8]) -> OpResult {
        let s = &self.s;
        s.tm()?;
        check_length(data.len(), s.iface.base.attr.tag.eager.max_short, "tag_eager_short")?;
        let tmh = Tmh { op: TmhOp::Eager, app_ctx: 0, tag }.to_bytes();
        s.send_tagged_inline(&[&tmh, data], None)
    }

    fn tag_eager_bcopy(&self, tag: Tag, imm: u64, pack: PackFn<'_>, _flags: SendFlags) -> OpResult<usize> {
        let s = &self.s;
        s.tm()?;
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let Some(mut desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let (app_ctx, imm_data) = split_imm(imm);
        desc[..TMH_LEN].copy_from_slice(&Tmh { op: TmhOp::Eager, app_ctx, tag }.to_bytes());
        let len = pack(&mut desc[TMH_LEN..]);
        check_length(len, s.iface.base.attr.tag.eager.max_bcopy, "tag_eager_bcopy packed")?;
        let mut sge = s.desc_sge(&desc, TMH_LEN + len);
        let mut wr = send_wr(imm_opcode(imm), &mut sge, 1, 0);
        wr.__bindgen_anon_1.imm_data = imm_data.to_be();
        s.post(&mut wr, false, Some(Op::Desc(desc)))?;
        Ok(Outcome::Done(len))
    }

    unsafe fn tag_eager_zcopy(
        &self,
        tag: Tag,
        imm: u64,
        iov: &[Iov<'_>],
        _flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let s = &self.s;
        s.tm()?;
        check_length(iov_total_len(iov), s.iface.base.attr.tag.eager.max_zcopy, "tag_eager_zcopy")?;
        let mut sges = [sys::ibv_sge { addr: 0, length: 0, lkey: 0 }; 8];
        let max = s.iface.max_send_sge.min(8);
        let n = s.sges_from_iov(iov, &mut sges[1..max])?;
        if let Outcome::NoResource = s.ready(comp.is_some())? {
            return Ok(Outcome::NoResource);
        }
        let Some(mut desc) = s.desc() else { return Ok(Outcome::NoResource) };
        let (app_ctx, imm_data) = split_imm(imm);
        desc[..TMH_LEN].copy_from_slice(&Tmh { op: TmhOp::Eager, app_ctx, tag }.to_bytes());
        sges[0] = s.desc_sge(&desc, TMH_LEN);
        let mut wr = send_wr(imm_opcode(imm), sges.as_mut_ptr(), (n + 1) as i32, 0);
        wr.__bindgen_anon_1.imm_data = imm_data.to_be();
        s.post(&mut wr, comp.is_some(), Some(Op::Desc(desc)))?;
        if let Some(c) = comp {
            let sn = s.sn.get();
            s.outstanding.borrow_mut().push_back((sn, Op::Comp(c.clone())));
        }
        Ok(Outcome::InProgress)
    }

    unsafe fn tag_rndv_zcopy(
        &self,
        tag: Tag,
        header: &[u8],
        iov: &[Iov<'_>],
        _flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult<RndvOp> {
        let s = &self.s;
        let tm = s.tm()?;
        check_length(header.len(), s.iface.base.attr.tag.rndv.max_hdr, "tag_rndv_zcopy header")?;
        let (va, len, rkey) = match iov {
            [] => (0, 0, 0),
            [e] if e.count <= 1 => {
                let len = if e.count == 0 { 0 } else { e.length };
                if len > u32::MAX as usize {
                    return Err(Status::InvalidParam);
                }
                let rkey = match e.memh.and_then(|m| m.downcast_ref::<IbRegion>()) {
                    Some(r) if e.memh.is_some_and(|m| m.contains(e.buffer, len)) => r.rkey(),
                    _ if len == 0 => 0,
                    _ => {
                        tracing::debug!("rc_verbs: a rendezvous send's buffer needs an ib registration that covers it");
                        return Err(Status::InvalidParam);
                    }
                };
                (e.buffer as u64, len as u32, rkey)
            }
            _ => {
                tracing::debug!("rc_verbs: an offloaded rendezvous sends one contiguous buffer");
                return Err(Status::InvalidParam);
            }
        };
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let Some(app_ctx) = tm.send_start(s.qp.qp_num(), va, len, comp.cloned()) else {
            return Ok(Outcome::NoResource);
        };
        let tmh = Tmh { op: TmhOp::Rndv, app_ctx, tag }.to_bytes();
        let rvh = Rvh { va, rkey, len }.to_bytes();
        match s.send_tagged_inline(&[&tmh, &rvh, header], None) {
            Ok(Outcome::Done(())) => Ok(Outcome::Done(RndvOp(app_ctx as u64))),
            Ok(_) => {
                tm.send_forget(app_ctx);
                Ok(Outcome::NoResource)
            }
            Err(e) => {
                tm.send_forget(app_ctx);
                Err(e)
            }
        }
    }

    fn tag_rndv_cancel(&self, op: RndvOp) -> UcsResult<()> {
        let tm = self.s.tm()?;
        match u32::try_from(op.0) {
            Ok(app_ctx) if tm.send_forget(app_ctx) => Ok(()),
            _ => Err(Status::NoElem),
        }
    }

    fn tag_rndv_request(&self, tag: Tag, header: &[u8], _flags: SendFlags) -> OpResult {
        let s = &self.s;
        s.tm()?;
        check_length(header.len(), s.iface.base.attr.tag.eager.max_bcopy, "tag_rndv_request header")?;
        // An eager TMH in a SEND_WITH_IMM of 0: the receiver's software completes it.
        let tmh = Tmh { op: TmhOp::Eager, app_ctx: 0, tag }.to_bytes();
        if TMH_LEN + header.len() <= s.iface.max_inline {
            return s.send_tagged_inline(&[&tmh, header], Some(0));
        }
        if let Outcome::NoResource = s.ready(false)? {
            return Ok(Outcome::NoResource);
        }
        let Some(mut desc) = s.desc() else { return Ok(Outcome::NoResource) };
        desc[..TMH_LEN].copy_from_slice(&tmh);
        desc[TMH_LEN..TMH_LEN + header.len()].copy_from_slice(header);
        let mut sge = s.desc_sge(&desc, TMH_LEN + header.len());
        let mut wr = send_wr(sys::IBV_WR_SEND_WITH_IMM, &mut sge, 1, 0);
        wr.__bindgen_anon_1.imm_data = 0;
        s.post(&mut wr, false, Some(Op::Desc(desc)))?;
        Ok(Outcome::Done(()))
    }
}

/// The TMH's `app_ctx` (the high half) and the immediate value (the low half) of a tagged
/// message's 64-bit immediate value, as UCX's `rc_mlx5` splits it.
fn split_imm(imm: u64) -> (u32, u32) {
    ((imm >> 32) as u32, imm as u32)
}

/// `SEND_WITH_IMM` for a message with an immediate value, else `SEND`.
fn imm_opcode(imm: u64) -> sys::ibv_wr_opcode {
    if imm != 0 {
        sys::IBV_WR_SEND_WITH_IMM
    } else {
        sys::IBV_WR_SEND
    }
}
