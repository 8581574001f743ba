//! `ud_verbs` endpoints: a handle on one endpoint of the interface's reliability core.
//!
//! Every operation copies its data into the endpoint's send window (the core keeps it until
//! the peer acknowledges it, for resending) and posts the packet at once, so short, bcopy and
//! zero-copy sends all complete locally when they return (`Done`). Remote completion is known
//! through flush: the peer's acknowledgements. When the endpoint is not connected yet, its
//! window is full, or the send queue is, operations return `NoResource`; queued pending
//! requests run when acknowledgements (or send completions) free resources.

use std::rc::Rc;

use ucs::arbiter::GroupId;
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    check_am_id, check_length, iov_total_len, Completion, Ep, FlushFlags, Iov, PackFn, PendingHandle, RemoteKey,
    SendFlags,
};

use super::verbs_iface::{IfaceInner, PUT_HDR_LEN};
use super::wire::{self, PacketKind, PeerAddr, NETH_LEN};
use crate::md::NAME as COMPONENT;
use crate::rc::unpack_ep_addr;

/// A `ud_verbs` endpoint, connected to a remote interface.
pub struct UdVerbsEp {
    iface: Rc<IfaceInner>,
    id: u32,
    group: GroupId,
}

impl UdVerbsEp {
    /// Creates the endpoint to the interface at `dev_addr` / `iface_addr` and sends its
    /// connection request (or adopts the endpoint that interface's request already created).
    pub(crate) fn create(
        iface: &Rc<IfaceInner>,
        dev_addr: &[u8],
        iface_addr: &[u8],
        user_data: u64,
    ) -> UcsResult<UdVerbsEp> {
        let qp_num = unpack_ep_addr(iface_addr).ok_or_else(|| {
            tracing::debug!(len = iface_addr.len(), "ud_verbs: malformed interface address");
            Status::InvalidAddr
        })?;
        let dev = wire::DevAddr::new(dev_addr).map_err(|_| {
            tracing::debug!(len = dev_addr.len(), "ud_verbs: malformed device address");
            Status::InvalidAddr
        })?;
        // Validates the device address and creates the address handle.
        iface.ah_for(&dev)?;
        let now = ucs::time::now();
        let id = iface.core.borrow_mut().connect_to_iface(now, PeerAddr { dev_addr: dev, qp_num }, 0)?;
        let group = iface.base.pending.add_group();
        iface.groups.borrow_mut().insert(group, id);
        iface.with_state(id, |st| {
            st.user = true;
            st.user_data = user_data;
            st.group = Some(group);
            st.closed_at = None;
            st.reported = false;
        });
        iface.note_activity(now);
        iface.drain_transmits(now);
        // A claimed passive endpoint may have failed already: its operations return the
        // failure status; the error handler is not called (the failure predates the endpoint).
        let failed = iface.core.borrow().ep(id).and_then(|r| r.status().err());
        if let Some(st) = failed {
            tracing::debug!(ep = id, "ud_verbs: new endpoint adopted a failed connection: {st}");
            iface.with_state(id, |s| s.reported = true);
        }
        Ok(UdVerbsEp { iface: iface.clone(), id, group })
    }

    /// The endpoint's failure status, if it failed.
    fn failed(&self) -> Option<Status> {
        self.iface.core.borrow().ep(self.id).and_then(|r| r.status().err())
    }

    /// `NoResource` unless the endpoint may send a packet now; the failure status once failed.
    fn ready(&self) -> OpResult<()> {
        if let Some(st) = self.failed() {
            return Err(st);
        }
        let i = &self.iface;
        if !i.base.pending.may_send(self.group) || !i.tx_available() || !i.core.borrow().can_send(self.id) {
            return Ok(Outcome::NoResource);
        }
        Ok(Outcome::Done(()))
    }

    /// Sends one sequenced packet whose payload `pack` appends (after [`ready`](Self::ready)).
    fn send(&self, kind: PacketKind, pack: impl FnOnce(&mut Vec<u8>)) -> OpResult {
        if let Outcome::NoResource = self.ready()? {
            return Ok(Outcome::NoResource);
        }
        let i = &self.iface;
        let now = ucs::time::now();
        {
            let mut core = i.core.borrow_mut();
            let t = match core.send_with(now, self.id, kind, pack) {
                Ok(t) => t,
                Err(Status::NoResource) => return Ok(Outcome::NoResource),
                Err(e) => return Err(e),
            };
            if let Err(e) = i.post_transmit(&t, None) {
                // In the window already: the resend timer will post it again.
                tracing::debug!(ep = self.id, "ud_verbs: first transmission failed: {e}");
            }
        }
        i.note_activity(now);
        Ok(Outcome::Done(()))
    }

    /// Packs a bcopy payload (after `prefix`) into a registered descriptor, with nothing of the
    /// interface borrowed while user code runs, copies it into the send window and posts the
    /// descriptor.
    fn send_bcopy(&self, kind: PacketKind, prefix: &[u8], pack: PackFn<'_>, max: usize) -> OpResult<usize> {
        if let Outcome::NoResource = self.ready()? {
            return Ok(Outcome::NoResource);
        }
        let i = &self.iface;
        let Some(mut desc) = i.tx_desc() else { return Ok(Outcome::NoResource) };
        let start = NETH_LEN + prefix.len();
        let Some(room) = desc.as_mut_slice().get_mut(start..start + max) else { return Err(Status::InvalidParam) };
        let len = pack(room);
        check_length(len, max, "bcopy packed")?;
        if let Some(p) = desc.as_mut_slice().get_mut(NETH_LEN..start) {
            p.copy_from_slice(prefix);
        }
        let now = ucs::time::now();
        {
            let mut core = i.core.borrow_mut();
            let body = &desc[NETH_LEN..start + len];
            let t = match core.send_with(now, self.id, kind, |buf| buf.extend_from_slice(body)) {
                Ok(t) => t,
                Err(Status::NoResource) => return Ok(Outcome::NoResource),
                Err(e) => return Err(e),
            };
            // The descriptor already holds everything after the network header.
            if let Err(e) = i.post_transmit(&t, Some((desc, NETH_LEN))) {
                tracing::debug!(ep = self.id, "ud_verbs: first transmission failed: {e}");
            }
        }
        i.note_activity(now);
        Ok(Outcome::Done(len))
    }

    fn am_gather(&self, id: u8, parts: &[&[u8]], max: usize) -> OpResult {
        check_am_id(id)?;
        let total = parts.iter().map(|p| p.len()).fold(0usize, usize::saturating_add);
        check_length(total, max, "am_short")?;
        self.send(PacketKind::Am(id), |buf| {
            for p in parts {
                buf.extend_from_slice(p);
            }
        })
    }
}

impl Drop for UdVerbsEp {
    fn drop(&mut self) {
        let i = &self.iface;
        i.groups.borrow_mut().remove(&self.group);
        i.base.pending.remove_group(self.group);
        let now = ucs::time::now();
        let flushes = i.with_state(self.id, |st| {
            st.user = false;
            st.group = None;
            st.closed_at = Some(now);
            std::mem::take(&mut st.flushes)
        });
        for (_, c) in flushes {
            c.complete(Status::Canceled);
        }
        // The endpoint lingers: it keeps answering its peer until it is destroyed.
        i.note_activity(now);
    }
}

impl Ep for UdVerbsEp {
    fn put_short(&self, data: &[u8], remote_addr: u64, rkey: &RemoteKey) -> OpResult {
        check_length(data.len(), self.iface.base.attr.put.max_short, "put_short")?;
        rkey.check(COMPONENT, remote_addr, data.len())?;
        let rk = rkey.rkey() as u32;
        self.send(PacketKind::Put, |buf| {
            buf.extend_from_slice(&remote_addr.to_le_bytes());
            buf.extend_from_slice(&rk.to_le_bytes());
            buf.extend_from_slice(data);
        })
    }

    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> OpResult {
        self.am_gather(id, &[&header.to_ne_bytes(), payload], self.iface.base.attr.am.max_short)
    }

    fn am_short_iov(&self, id: u8, iov: &[&[u8]]) -> OpResult {
        self.am_gather(id, iov, self.iface.base.attr.am.max_short)
    }

    fn am_bcopy(&self, id: u8, pack: PackFn<'_>, _flags: SendFlags) -> OpResult<usize> {
        check_am_id(id)?;
        self.send_bcopy(PacketKind::Am(id), &[], pack, self.iface.base.attr.am.max_bcopy)
    }

    unsafe fn am_zcopy(
        &self,
        id: u8,
        header: &[u8],
        iov: &[Iov<'_>],
        _flags: SendFlags,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        let _ = comp;
        check_am_id(id)?;
        let caps = &self.iface.base.attr.am;
        check_length(header.len(), caps.max_hdr, "am_zcopy header")?;
        let len = iov_total_len(iov);
        check_length(header.len().saturating_add(len), caps.max_bcopy, "am_zcopy")?;
        if iov.iter().map(|e| e.count).sum::<usize>() > caps.max_iov {
            return Err(Status::InvalidParam);
        }
        // The data is copied into the send window, so the user's buffers are free at return:
        // `Done`, and the completion is never used.
        self.send(PacketKind::Am(id), |buf| {
            buf.extend_from_slice(header);
            for e in iov {
                let stride = if e.stride == 0 { e.length } else { e.stride };
                for k in 0..e.count {
                    // SAFETY: the caller of this unsafe fn guarantees every iov element is
                    // valid for reads of `length` bytes at `buffer + k * stride` until the
                    // operation completes, which is before this call returns.
                    let part = unsafe { std::slice::from_raw_parts(e.buffer.wrapping_add(k * stride), e.length) };
                    buf.extend_from_slice(part);
                }
            }
        })
    }

    fn flush(&self, flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        if !self.iface.base.pending.may_send(self.group) {
            return Ok(Outcome::NoResource);
        }
        self.iface.flush_ep(self.id, flags, comp)
    }

    fn check(&self, _comp: Option<&Rc<Completion>>) -> OpResult {
        if let Some(st) = self.failed() {
            return Err(st);
        }
        let (connected, idle) = {
            let core = self.iface.core.borrow();
            core.ep(self.id).map_or((false, true), |r| (r.is_connected(), r.is_idle()))
        };
        if !connected || !idle {
            // Packets waiting for acknowledgement already tell whether the peer lives: the
            // endpoint fails after UCX_UD_TIMEOUT without one.
            return Ok(Outcome::Done(()));
        }
        // An empty put (UCX's check): acknowledged by a live peer, resent until the peer
        // timeout otherwise.
        match self.send(PacketKind::Put, |buf| buf.extend_from_slice(&[0u8; PUT_HDR_LEN]))? {
            Outcome::NoResource => Ok(Outcome::NoResource),
            _ => Ok(Outcome::Done(())),
        }
    }

    fn pending_add(&self, req: PendingHandle) -> UcsResult<()> {
        let i = &self.iface;
        let (can_send, failed) = {
            let core = i.core.borrow();
            core.ep(self.id).map_or((false, true), |r| (r.can_send(), r.status().is_err()))
        };
        if can_send && i.tx_available() && i.base.pending.group_is_empty(self.group) && !failed {
            return Err(Status::Busy);
        }
        i.base.pending.push(self.group, req);
        Ok(())
    }

    fn pending_purge(&self, sink: &mut dyn FnMut(PendingHandle)) {
        self.iface.base.pending.purge(self.group, sink);
    }
}

impl std::fmt::Debug for UdVerbsEp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdVerbsEp").field("id", &self.id).finish()
    }
}
