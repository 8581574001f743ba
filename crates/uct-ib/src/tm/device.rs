//! The tag-matching device model: the receive side of a verbs TM-SRQ as a pure state machine
//! (no IO, no clock, no unsafe code), for devices without tag matching (Soft-RoCE). It keeps
//! the contract of rdma-core's `Documentation/tag_matching.md`, `ibv_post_srq_ops(3)` and the
//! mlx5 provider where the text is silent (`docs/notes/tm-offload-brief.md`, sections 1 and 2):
//!
//! * a bounded list of tagged buffers, added and removed by list operations that run in the
//!   order they were posted ([`TmDevice::post`], [`TmDevice::step`]), at most `max_ops` of
//!   them outstanding; an ADD's handle names its slot, and a slot is reused only once every
//!   completion that names it has been polled (mlx5's ledger);
//! * an arriving tagged message matches the earliest-added enabled buffer whose masked tag it
//!   carries ([`TmDevice::arrive`]); a matched eager message's payload is placed in the buffer
//!   (an action for the driver) and completes with `MATCH | DATA_VALID`; anything else is
//!   unexpected: it stays whole in a shared receive queue buffer, counts in the device's
//!   unexpected count, and completes as a plain tagged receive without flags (mlx5);
//!   untagged messages complete as `NO_TAG` and do not count;
//! * phases: an ADD records the unexpected count software last reported (its own, with
//!   `TM_SYNC`); the entry is enabled only if that equals the device's count when the ADD
//!   runs. Otherwise it stays disabled until a later list operation reports a count equal to
//!   the device's: then every listed entry is enabled again ("tag matching is disabled for new
//!   tags until software and hardware synchronize"; what hardware does at that point is not
//!   documented, and this is the reading UCX relies on: it never reads `SYNC_REQ`, and with
//!   entries left disabled for good a later receive for the same tag could be enabled and
//!   take a message ahead of them). List completions whose phase differs from the device's
//!   carry `SYNC_REQ`, as does an unexpected completion once the device is 0x3fff ahead of
//!   software.
//!
//! * a matched rendezvous request completes with `MATCH` at once; the device then reads the
//!   sender's data into the buffer (an action: the driver posts the RDMA read on the queue pair
//!   the request came on and reports back with [`TmDevice::read_done`]), sends the FIN (an
//!   action) and completes with `DATA_VALID`; a request for more than the buffer holds places
//!   its headers in the buffer and completes with `RNDV_INCOMPLETE`, for software to finish.
//!
//! Not modelled: multi-packet eager messages (a message arrives whole). Labelled "emulated"
//! wherever users see it once a transport uses it.

use std::collections::VecDeque;

use super::wire::{Rvh, TmMsg, Tmh, TmhOp};

/// The device's limits (`ibv_tm_caps` / `ibv_srq_init_attr_ex.tm_cap`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmCaps {
    /// Tagged buffers the list holds at most.
    pub max_num_tags: u32,
    /// List operations outstanding at most.
    pub max_ops: u32,
}

/// A list operation (`struct ibv_ops_wr`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListOp {
    /// Append a tagged buffer (`IBV_WR_TAG_ADD`).
    Add {
        /// Names the operation in its completion.
        wr_id: u64,
        /// Names the buffer in the completions of the message it receives.
        recv_wr_id: u64,
        /// The tag, compared under `mask`.
        tag: u64,
        /// The bits of the tag that must match.
        mask: u64,
        /// The buffer's length.
        len: usize,
        /// Whether the operation completes visibly (`IBV_OPS_SIGNALED`).
        signaled: bool,
        /// Software's count of unexpected messages handled (`IBV_OPS_TM_SYNC`), if reported.
        unexpected_cnt: Option<u16>,
    },
    /// Remove a tagged buffer by handle (`IBV_WR_TAG_DEL`).
    Del {
        /// Names the operation in its completion.
        wr_id: u64,
        /// The ADD's handle.
        handle: u32,
        /// As for `Add`.
        signaled: bool,
        /// As for `Add`.
        unexpected_cnt: Option<u16>,
    },
    /// Report the unexpected count only (`IBV_WR_TAG_SYNC`).
    Sync {
        /// Names the operation in its completion.
        wr_id: u64,
        /// As for `Add`.
        signaled: bool,
        /// As for `Add`.
        unexpected_cnt: Option<u16>,
    },
}

/// Why a list operation was refused when posted (`ibv_post_srq_ops` returning an errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PostError {
    /// The list or the operation queue is full (`ENOMEM`).
    Full,
    /// A DEL names a handle that is not an added buffer's, nor one whose completions are still
    /// to be polled (`EINVAL`).
    BadHandle(u32),
}

impl std::fmt::Display for PostError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PostError::Full => write!(f, "tag list or list-operation queue full"),
            PostError::BadHandle(h) => write!(f, "tag-list handle {h} names no added buffer"),
        }
    }
}

impl std::error::Error for PostError {}

/// What a completion reports (`ibv_wc_opcode` of the TM completions).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqeKind {
    /// An ADD ran (`IBV_WC_TM_ADD`).
    Add,
    /// A DEL ran (`IBV_WC_TM_DEL`); `status` says whether the buffer was still there.
    Del,
    /// A SYNC ran (`IBV_WC_TM_SYNC`).
    Sync,
    /// A tagged message arrived (`IBV_WC_TM_RECV`): matched (`flags.matched`) or unexpected.
    Recv,
    /// An untagged message arrived (`IBV_WC_TM_NO_TAG`).
    NoTag,
}

/// A completion's status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqeStatus {
    /// `IBV_WC_SUCCESS`.
    Success,
    /// The DEL found the buffer consumed by a message already (`IBV_WC_TM_ERR`).
    TmErr,
    /// A matched eager message was longer than the buffer; its first `len` bytes were placed
    /// (`IBV_WC_LOC_LEN_ERR`; a model choice, hardware's behaviour is not documented).
    LocLenErr,
    /// A matched rendezvous request wants more than the buffer holds: its headers are in the
    /// buffer, and software completes the transfer (`IBV_WC_TM_RNDV_INCOMPLETE`).
    RndvIncomplete,
    /// The rendezvous read failed (the transport's error is the driver's to report; a model
    /// status).
    ReadErr,
}

/// A completion of the device's queue (`struct ibv_wc` with `ibv_wc_read_tm_info`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmCqe {
    /// What completed.
    pub kind: CqeKind,
    /// Its status.
    pub status: CqeStatus,
    /// The list operation's `wr_id`, the matched buffer's `recv_wr_id`, or for an unexpected
    /// or untagged message the shared receive queue buffer's `wr_id`.
    pub wr_id: u64,
    /// `IBV_WC_TM_MATCH`: a tagged buffer received the message.
    pub matched: bool,
    /// `IBV_WC_TM_DATA_VALID`: the data is in the tagged buffer.
    pub data_valid: bool,
    /// `IBV_WC_TM_SYNC_REQ`: software must report its unexpected count.
    pub sync_req: bool,
    /// Bytes placed (the payload of a matched message, the whole message otherwise).
    pub byte_len: usize,
    /// The matched message's tag and application context (`ibv_wc_tm_info`); zero otherwise.
    pub tag: u64,
    /// As `tag`: the TMH's `app_ctx`.
    pub app_ctx: u32,
    /// The slot the completion names, if any (for the reuse ledger).
    slot: Option<u32>,
}

/// What the driver must do for the device (the model's side effects).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TmAction {
    /// Copy `len` bytes of the arrived message, from offset `from` in it, into the tagged
    /// buffer of `recv_wr_id`.
    Place {
        /// The buffer.
        recv_wr_id: u64,
        /// Offset in the arrived message.
        from: usize,
        /// Bytes.
        len: usize,
    },
    /// Read the sender's data (`rvh`) into the start of the tagged buffer of `recv_wr_id`, on
    /// queue pair `qp`, then call [`TmDevice::read_done`] with `read`.
    Read {
        /// Names the read for `read_done`.
        read: u64,
        /// The queue pair the request came on.
        qp: u32,
        /// The buffer.
        recv_wr_id: u64,
        /// Where the data is, its key and length.
        rvh: Rvh,
    },
    /// Send this FIN (the request's headers with the FIN opcode) on queue pair `qp`.
    Fin {
        /// The queue pair.
        qp: u32,
        /// The FIN's TMH.
        tmh: Tmh,
        /// The request's RVH.
        rvh: Rvh,
    },
}

/// A rendezvous read the driver is making for the device.
#[derive(Clone, Copy, Debug)]
struct PendingRead {
    read: u64,
    qp: u32,
    slot: u32,
    recv_wr_id: u64,
    tmh: Tmh,
    rvh: Rvh,
}

/// One tagged buffer's slot.
#[derive(Clone, Copy, Debug, Default)]
struct Slot {
    tag: u64,
    mask: u64,
    recv_wr_id: u64,
    len: usize,
    enabled: bool,
    /// In the list (added, not consumed or deleted).
    listed: bool,
    /// Added or queued to be, and neither consumed nor deleted.
    allocated: bool,
    /// Completions that will still name the slot (mlx5's `expect_cqe`); reused at 0.
    expect: u32,
}

/// The emulated device: see the module's text.
#[derive(Debug)]
pub struct TmDevice {
    caps: TmCaps,
    slots: Vec<Slot>,
    free: VecDeque<u32>,
    /// Listed slots in the order they were added.
    list: Vec<u32>,
    ops: VecDeque<(ListOp, Option<u32>)>,
    cq: VecDeque<TmCqe>,
    /// Unexpected tagged messages the device has seen (16 bits, wrapping).
    hw_unexp: u16,
    /// The count software last reported.
    sw_cnt: u16,
    /// Listed entries added at a stale phase and not enabled since.
    disabled: usize,
    /// Rendezvous reads in progress, and the next read's name.
    reads: Vec<PendingRead>,
    next_read: u64,
}

impl TmDevice {
    /// A device with these limits (at least one tag and one operation).
    pub fn new(caps: TmCaps) -> TmDevice {
        let caps = TmCaps { max_num_tags: caps.max_num_tags.max(1), max_ops: caps.max_ops.max(1) };
        TmDevice {
            caps,
            slots: vec![Slot::default(); caps.max_num_tags as usize],
            free: (0..caps.max_num_tags).collect(),
            list: Vec::new(),
            ops: VecDeque::new(),
            cq: VecDeque::new(),
            hw_unexp: 0,
            sw_cnt: 0,
            disabled: 0,
            reads: Vec::new(),
            next_read: 0,
        }
    }

    /// The limits.
    pub fn caps(&self) -> TmCaps {
        self.caps
    }

    /// Posts list operations (`ibv_post_srq_ops`): each ADD's handle, in order (`None` for the
    /// others). All or nothing: on an error nothing was posted.
    pub fn post(&mut self, ops: &[ListOp]) -> Result<Vec<Option<u32>>, PostError> {
        if self.ops.len() + ops.len() > self.caps.max_ops as usize {
            return Err(PostError::Full);
        }
        let adds = ops.iter().filter(|o| matches!(o, ListOp::Add { .. })).count();
        if adds > self.free.len() {
            return Err(PostError::Full);
        }
        for op in ops {
            if let ListOp::Del { handle, .. } = *op {
                // Added (or queued to be), or consumed with its completion not yet polled (the
                // DEL then fails with `TmErr`: the race of a cancel and a match).
                if !self.slots.get(handle as usize).is_some_and(|s| s.allocated || s.expect > 0) {
                    return Err(PostError::BadHandle(handle));
                }
            }
        }
        let mut handles = Vec::with_capacity(ops.len());
        for op in ops {
            let slot = match *op {
                ListOp::Add { signaled, .. } => {
                    let i = self.free.pop_front().expect("counted above");
                    // The message or the DEL that ends it, and the ADD's own completion.
                    self.slots[i as usize] = Slot { allocated: true, expect: 1 + signaled as u32, ..Slot::default() };
                    Some(i)
                }
                ListOp::Del { handle, signaled, .. } => {
                    if signaled {
                        self.slots[handle as usize].expect += 1;
                    }
                    Some(handle)
                }
                ListOp::Sync { .. } => None,
            };
            handles.push(matches!(op, ListOp::Add { .. }).then_some(slot).flatten());
            self.ops.push_back((*op, slot));
        }
        Ok(handles)
    }

    /// Runs the oldest outstanding list operation; false when there was none.
    pub fn step(&mut self) -> bool {
        let Some((op, slot)) = self.ops.pop_front() else { return false };
        match op {
            ListOp::Add { wr_id, recv_wr_id, tag, mask, len, signaled, unexpected_cnt } => {
                let phase = self.report(unexpected_cnt);
                let i = slot.expect("an ADD has its slot");
                let enabled = phase == self.hw_unexp;
                self.disabled += usize::from(!enabled);
                let s = &mut self.slots[i as usize];
                *s = Slot {
                    tag: tag & mask,
                    mask,
                    recv_wr_id,
                    len,
                    enabled,
                    listed: true,
                    allocated: true,
                    expect: s.expect,
                };
                self.list.push(i);
                if signaled {
                    let sync_req = phase != self.hw_unexp;
                    self.cq.push_back(op_cqe(CqeKind::Add, CqeStatus::Success, wr_id, sync_req, Some(i)));
                }
            }
            ListOp::Del { wr_id, handle, signaled, unexpected_cnt } => {
                let phase = self.report(unexpected_cnt);
                let listed = self.slots[handle as usize].listed;
                if listed {
                    self.list.retain(|&x| x != handle);
                    let s = &mut self.slots[handle as usize];
                    self.disabled -= usize::from(!s.enabled);
                    s.listed = false;
                    s.allocated = false;
                    // No message will consume it now.
                    self.release(handle);
                }
                if signaled {
                    let status = if listed { CqeStatus::Success } else { CqeStatus::TmErr };
                    let sync_req = phase != self.hw_unexp;
                    self.cq.push_back(op_cqe(CqeKind::Del, status, wr_id, sync_req, Some(handle)));
                }
            }
            ListOp::Sync { wr_id, signaled, unexpected_cnt } => {
                let phase = self.report(unexpected_cnt);
                if signaled {
                    self.cq.push_back(op_cqe(CqeKind::Sync, CqeStatus::Success, wr_id, phase != self.hw_unexp, None));
                }
            }
        }
        true
    }

    /// A message arrived on queue pair `qp` in the shared receive queue buffer `srq_wr_id`:
    /// matched, unexpected or untagged, with its completion queued; what the driver must do
    /// for it, if it matched.
    pub fn arrive(&mut self, msg: &[u8], srq_wr_id: u64, qp: u32) -> Option<TmAction> {
        let (tmh, rvh) = match TmMsg::decode(msg) {
            Ok(TmMsg::Eager(tmh, _)) => (tmh, None),
            Ok(TmMsg::Rndv(tmh, rvh, _)) => (tmh, Some(rvh)),
            // Untagged, a FIN, and what the model cannot classify (a malformed header) go to
            // software whole, uncounted: software's decoder says what is wrong with a bad one.
            _ => {
                let mut c = op_cqe(CqeKind::NoTag, CqeStatus::Success, srq_wr_id, false, None);
                c.byte_len = msg.len();
                self.cq.push_back(c);
                return None;
            }
        };
        let hit = self.list.iter().position(|&i| {
            let s = &self.slots[i as usize];
            s.enabled && tmh.tag & s.mask == s.tag
        });
        let Some(pos) = hit else {
            self.hw_unexp = self.hw_unexp.wrapping_add(1);
            let sync_req = self.hw_unexp.wrapping_sub(self.sw_cnt) > 0x3fff;
            let mut c = op_cqe(CqeKind::Recv, CqeStatus::Success, srq_wr_id, sync_req, None);
            c.byte_len = msg.len();
            self.cq.push_back(c);
            return None;
        };
        let i = self.list.remove(pos);
        let s = &mut self.slots[i as usize];
        s.listed = false;
        s.allocated = false;
        let (recv_wr_id, room) = (s.recv_wr_id, s.len);
        let Some(rvh) = rvh else {
            let at = super::wire::TMH_LEN;
            let n = msg.len() - at;
            let placed = n.min(room);
            let status = if n > room { CqeStatus::LocLenErr } else { CqeStatus::Success };
            self.cq.push_back(recv_cqe(status, recv_wr_id, placed, &tmh, i, true, true));
            return Some(TmAction::Place { recv_wr_id, from: at, len: placed });
        };
        if rvh.len as usize > room {
            // Software finishes it from the headers, which the buffer receives.
            let placed = msg.len().min(room);
            self.cq.push_back(recv_cqe(CqeStatus::RndvIncomplete, recv_wr_id, placed, &tmh, i, true, true));
            return Some(TmAction::Place { recv_wr_id, from: 0, len: placed });
        }
        // The match completes now; the data's completion names the slot too.
        s.expect += 1;
        self.cq.push_back(recv_cqe(CqeStatus::Success, recv_wr_id, 0, &tmh, i, true, false));
        let read = self.next_read;
        self.next_read = read.wrapping_add(1);
        self.reads.push(PendingRead { read, qp, slot: i, recv_wr_id, tmh, rvh });
        Some(TmAction::Read { read, qp, recv_wr_id, rvh })
    }

    /// The driver finished rendezvous read `read` (`ok`: the data is in the buffer): the data's
    /// completion is queued, and the FIN to send returned. `None` for a read the device does
    /// not know (logged by the caller) or one that failed (its completion says so).
    pub fn read_done(&mut self, read: u64, ok: bool) -> Option<TmAction> {
        let p = self.reads.iter().position(|r| r.read == read)?;
        let r = self.reads.swap_remove(p);
        let status = if ok { CqeStatus::Success } else { CqeStatus::ReadErr };
        let len = if ok { r.rvh.len as usize } else { 0 };
        let mut c = recv_cqe(status, r.recv_wr_id, len, &r.tmh, r.slot, false, true);
        (c.tag, c.app_ctx) = (0, 0);
        self.cq.push_back(c);
        ok.then_some(TmAction::Fin { qp: r.qp, tmh: Tmh { op: TmhOp::Fin, ..r.tmh }, rvh: r.rvh })
    }

    /// Rendezvous reads in progress.
    pub fn reads_in_progress(&self) -> usize {
        self.reads.len()
    }

    /// The oldest completion, if any.
    pub fn poll(&mut self) -> Option<TmCqe> {
        let c = self.cq.pop_front()?;
        if let Some(i) = c.slot {
            self.release(i);
        }
        Some(c)
    }

    /// Outstanding list operations.
    pub fn ops_outstanding(&self) -> usize {
        self.ops.len()
    }

    /// Free slots (an ADD needs one).
    pub fn free_slots(&self) -> usize {
        self.free.len()
    }

    /// The device's unexpected count.
    pub fn unexpected(&self) -> u16 {
        self.hw_unexp
    }

    /// Takes software's count if the operation reports one; the phase the operation carries.
    /// When it equals the device's count, entries added at a stale phase are enabled.
    fn report(&mut self, cnt: Option<u16>) -> u16 {
        if let Some(c) = cnt {
            self.sw_cnt = c;
        }
        if self.disabled > 0 && self.sw_cnt == self.hw_unexp {
            for &i in &self.list {
                self.slots[i as usize].enabled = true;
            }
            self.disabled = 0;
        }
        self.sw_cnt
    }

    /// One completion naming slot `i` is done with it; the slot is free once none is left.
    fn release(&mut self, i: u32) {
        let s = &mut self.slots[i as usize];
        s.expect = s.expect.saturating_sub(1);
        if s.expect == 0 && !s.allocated {
            self.free.push_back(i);
        }
    }
}

fn op_cqe(kind: CqeKind, status: CqeStatus, wr_id: u64, sync_req: bool, slot: Option<u32>) -> TmCqe {
    TmCqe { kind, status, wr_id, matched: false, data_valid: false, sync_req, byte_len: 0, tag: 0, app_ctx: 0, slot }
}

fn recv_cqe(status: CqeStatus, recv_wr_id: u64, len: usize, tmh: &Tmh, slot: u32, matched: bool, data: bool) -> TmCqe {
    TmCqe {
        kind: CqeKind::Recv,
        status,
        wr_id: recv_wr_id,
        matched,
        data_valid: data,
        sync_req: false,
        byte_len: len,
        tag: tmh.tag,
        app_ctx: tmh.app_ctx,
        slot: Some(slot),
    }
}

#[cfg(test)]
mod tests;
