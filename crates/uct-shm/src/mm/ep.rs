//! The memory-mapped endpoint: writes into a peer interface's FIFO and descriptors, and
//! accesses memory the peer allocated through remote keys.

use std::cell::Cell;
use std::rc::Rc;

use ucs::arbiter::GroupId;
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{check_am_id, check_length, Completion, Ep, FlushFlags, PackFn, PendingHandle, RemoteKey, SendFlags};

use super::fifo::{FifoLayout, Producer};
use super::iface::{Inner, IFACE_ADDR_LEN};
use super::md::MmComponent;
use super::segment::{SegId, Segment};
use super::signal::SignalAddr;
use crate::sm::LocalRegion;

/// A peer interface, as its address describes it (validated).
pub(crate) struct RemoteIface {
    seg: SegId,
    id: u64,
    layout: FifoLayout,
    seg_size: usize,
}

impl RemoteIface {
    /// Parses and validates an interface address of component `comp`.
    pub(crate) fn parse(comp: &MmComponent, a: &[u8]) -> UcsResult<Self> {
        if a.len() != IFACE_ADDR_LEN {
            return Err(Status::InvalidAddr);
        }
        let seg = SegId::unpack(&a[..SegId::PACKED_LEN])?;
        let word = |i: usize| u32::from_le_bytes([a[i], a[i + 1], a[i + 2], a[i + 3]]);
        let at = SegId::PACKED_LEN;
        let mut id = [0u8; 8];
        id.copy_from_slice(&a[at..at + 8]);
        let layout = FifoLayout::new(word(at + 8), word(at + 12)).map_err(|_| Status::InvalidAddr)?;
        let seg_size = word(at + 16) as usize;
        if seg.kind != comp.kind || seg_size == 0 || seg_size > u16::MAX as usize || layout.total_len() as u64 > seg.len
        {
            return Err(Status::InvalidAddr);
        }
        Ok(RemoteIface { seg, id: u64::from_le_bytes(id), layout, seg_size })
    }
}

/// What the interface's pending dispatch needs to know about an endpoint.
pub(crate) struct EpShared {
    producer: Producer,
    /// The peer's segment; declared after `producer`, whose FIFO view points into it.
    seg: Segment,
    remote: RemoteIface,
    failed: Cell<Option<Status>>,
    last_check: Cell<u64>,
    /// "No resources" answers since the clock was last read.
    full_count: Cell<u32>,
    /// Where wakeup signals for the peer go.
    signal_to: SignalAddr,
}

impl EpShared {
    pub(crate) fn has_room(&self) -> bool {
        self.failed.get().is_none() && self.producer.has_room()
    }
}

/// An endpoint to a `posix` or `sysv` interface.
pub struct MmEp {
    shared: Rc<EpShared>,
    iface: Rc<Inner>,
    group: GroupId,
    user_data: u64,
    max_short: usize,
}

const PEER_CHECK_INTERVAL_NS: u64 = 1_000_000;

impl MmEp {
    pub(crate) fn connect(iface: &Rc<Inner>, addr: &[u8], user_data: u64) -> UcsResult<Self> {
        let remote = RemoteIface::parse(iface.comp, addr)?;
        let seg = Segment::attach(remote.seg)?;
        // SAFETY: the mapping lives in `EpShared::seg`, dropped after the producer.
        let fifo = unsafe { super::fifo::Fifo::from_raw(seg.base(), seg.len(), remote.layout)? };
        let signal_to = SignalAddr::new(remote.seg.pid, remote.id);
        let shared = Rc::new(EpShared {
            producer: Producer::new(fifo),
            seg,
            remote,
            failed: Cell::new(None),
            last_check: Cell::new(0),
            full_count: Cell::new(0),
            signal_to,
        });
        let group = iface.base.pending.add_group();
        iface.eps.borrow_mut().push((group, Rc::downgrade(&shared)));
        let max_short = iface.base.attr.am.max_short.min(shared.remote.layout.max_inline());
        Ok(MmEp { shared, iface: iface.clone(), group, user_data, max_short })
    }

    /// The error status once the peer is known to be gone.
    #[inline]
    fn check_failed(&self) -> UcsResult<()> {
        match self.shared.failed.get() {
            None => Ok(()),
            Some(s) => Err(s),
        }
    }

    /// The peer process is gone: fail the endpoint and tell the error handler once.
    fn fail(&self, status: Status) -> Status {
        if self.shared.failed.replace(Some(status)).is_none() {
            tracing::debug!(pid = self.shared.remote.seg.pid, "{}: peer process is gone", self.iface.comp.name);
            self.iface.base.report_failure(self.user_data, status);
        }
        status
    }

    fn peer_alive(&self) -> bool {
        // SAFETY: signal 0 only checks for existence and permission.
        let r = unsafe { libc::kill(self.shared.remote.seg.pid as libc::pid_t, 0) };
        r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
    }

    /// On a full FIFO: check (at most every millisecond, and every 64th call) whether the
    /// receiver died.
    #[cold]
    fn no_resource<T>(&self) -> OpResult<T> {
        // A sender retries a full FIFO in a tight loop: read the clock every 64th time only.
        let k = self.shared.full_count.get().wrapping_add(1);
        self.shared.full_count.set(k);
        if k % 64 != 1 {
            return Ok(Outcome::NoResource);
        }
        let now = ucs::time::now();
        if now.saturating_sub(self.shared.last_check.get()) > PEER_CHECK_INTERVAL_NS {
            self.shared.last_check.set(now);
            if !self.peer_alive() {
                return Err(self.fail(Status::ConnectionReset));
            }
        }
        Ok(Outcome::NoResource)
    }

    #[inline]
    fn signal(&self) {
        self.iface.signal_tx.signal(&self.shared.signal_to);
    }

    /// Region of a remote key, bounded by the mapping the key attached.
    #[inline]
    fn region(&self, rkey: &RemoteKey, addr: u64, len: usize) -> UcsResult<(LocalRegion, u64)> {
        let off = rkey.check(self.iface.comp.name, addr, len)?;
        let (base, len) = rkey.local_mapping().ok_or(Status::InvalidParam)?;
        Ok((LocalRegion { base: base.as_ptr(), len }, off))
    }

    /// The shared-memory fast path (see `sm::impl_sm_rma`): the endpoint is usable, nothing of
    /// it is queued, and the range lies in the key's mapping.
    #[inline(always)]
    fn sm_direct(&self, rkey: &RemoteKey, addr: u64, len: usize) -> Option<*mut u8> {
        if self.shared.failed.get().is_some() || !self.iface.base.pending.may_send(self.group) {
            return None;
        }
        rkey.local_at(self.iface.comp.name, addr, len)
    }

    /// The shared-memory RMA hook (see `sm::impl_sm_rma`): the key's mapping stays valid
    /// while the key lives.
    #[inline]
    fn sm_access<R>(
        &self,
        rkey: &RemoteKey,
        addr: u64,
        len: usize,
        f: impl FnOnce(LocalRegion, u64) -> UcsResult<R>,
    ) -> OpResult<R> {
        self.check_failed()?;
        if !self.iface.base.pending.may_send(self.group) {
            return Ok(Outcome::NoResource);
        }
        let (r, off) = self.region(rkey, addr, len)?;
        f(r, off).map(Outcome::Done)
    }

    /// The largest get_bcopy: unlimited (a copy out of the mapped segment, bounded by the
    /// region).
    fn sm_seg_size(&self) -> usize {
        usize::MAX
    }

    fn send_inline(&self, id: u8, total: usize, fill: impl FnOnce(*mut u8)) -> OpResult {
        check_am_id(id)?;
        check_length(total, self.max_short, "am_short")?;
        self.check_failed()?;
        if !self.iface.base.pending.may_send(self.group) {
            return Ok(Outcome::NoResource);
        }
        let Some(claim) = self.shared.producer.claim() else { return self.no_resource() };
        fill(claim.inline_ptr());
        let armed = claim.armed;
        self.shared.producer.publish(claim, id, total as u16, true);
        if armed {
            self.signal();
        }
        Ok(Outcome::Done(()))
    }
}

impl Drop for MmEp {
    fn drop(&mut self) {
        self.iface.base.pending.remove_group(self.group);
        self.iface.eps.borrow_mut().retain(|(g, _)| *g != self.group);
    }
}

macro_rules! ordered {
    ($self:ident) => {
        $self.check_failed()?;
        if !$self.iface.base.pending.may_send($self.group) {
            return Ok(Outcome::NoResource);
        }
    };
}

impl Ep for MmEp {
    crate::sm::impl_sm_rma!();

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> OpResult {
        self.send_inline(id, 8 + payload.len(), |dst| {
            // SAFETY: `dst` is the claimed element's inline area, at least `max_short` bytes,
            // and 8 + payload.len() <= max_short was checked.
            unsafe {
                dst.cast::<u64>().write_unaligned(header);
                ucs::memory::copy(payload.as_ptr(), dst.add(8), payload.len());
            }
        })
    }

    fn am_short_iov(&self, id: u8, iov: &[&[u8]]) -> OpResult {
        let total = iov.iter().map(|s| s.len()).fold(0usize, usize::saturating_add);
        self.send_inline(id, total, |dst| {
            let mut at = 0;
            for part in iov {
                // SAFETY: the parts total at most `max_short` bytes (checked).
                unsafe { std::ptr::copy_nonoverlapping(part.as_ptr(), dst.add(at), part.len()) };
                at += part.len();
            }
        })
    }

    #[inline]
    fn am_bcopy(&self, id: u8, pack: PackFn<'_>, _flags: SendFlags) -> OpResult<usize> {
        check_am_id(id)?;
        ordered!(self);
        let Some(claim) = self.shared.producer.claim() else { return self.no_resource() };
        let seg_size = self.shared.remote.seg_size;
        let off = claim.desc_offset() as usize;
        let in_bounds = off >= self.shared.remote.layout.total_len()
            && off.checked_add(seg_size).is_some_and(|e| e <= self.shared.seg.len());
        if !in_bounds {
            // A corrupt peer: publish an empty message to an invalid id so its FIFO moves on.
            self.shared.producer.publish(claim, u8::MAX, 0, true);
            tracing::warn!(off, "{}: peer lent a descriptor outside its segment", self.iface.comp.name);
            return Err(self.fail(Status::IoError));
        }
        // SAFETY: [off, off + seg_size) lies within the peer's mapping (checked), and the
        // descriptor is lent to the slot we claimed, so no one else writes it until we publish.
        let dst = unsafe { std::slice::from_raw_parts_mut(self.shared.seg.base().as_ptr().add(off), seg_size) };
        let len = pack(dst);
        if len > seg_size {
            self.shared.producer.publish(claim, u8::MAX, 0, true);
            return Err(Status::InvalidParam);
        }
        let armed = claim.armed;
        self.shared.producer.publish(claim, id, len as u16, false);
        if armed {
            self.signal();
        }
        Ok(Outcome::Done(len))
    }

    fn put_bcopy(&self, pack: PackFn<'_>, remote_addr: u64, rkey: &RemoteKey) -> OpResult<usize> {
        ordered!(self);
        let (r, off) = self.region(rkey, remote_addr, 0)?;
        // Pack straight into the peer's memory, up to the end of the key's region (which the
        // mapping covers): no size limit but the region's, as UCX's mm. Remote memory is only
        // written, never referenced, by us.
        let room = rkey.length().saturating_sub(off).min((r.len as u64).saturating_sub(off)) as usize;
        // SAFETY: [off, off + room) lies within the mapping the key keeps alive and within the
        // key's region (`off` came from the key's check, `room` is bounded by both).
        let dst = unsafe { std::slice::from_raw_parts_mut(r.base.add(off as usize), room) };
        let len = pack(dst);
        if len > room {
            // It claims more than the buffer, which ends with the region: what it wrote is
            // within the region; the rest would be past it.
            tracing::debug!(len, room, "put_bcopy: packed past the remote region");
            return Err(Status::OutOfRange);
        }
        Ok(Outcome::Done(len))
    }

    fn flush(&self, _flags: FlushFlags, _comp: Option<&Rc<Completion>>) -> OpResult {
        self.check_failed()?;
        if self.iface.base.pending.group_is_empty(self.group) {
            Ok(Outcome::Done(()))
        } else {
            Ok(Outcome::NoResource)
        }
    }

    fn check(&self, _comp: Option<&Rc<Completion>>) -> OpResult {
        self.check_failed()?;
        if self.peer_alive() {
            Ok(Outcome::Done(()))
        } else {
            Err(self.fail(Status::ConnectionReset))
        }
    }

    fn pending_add(&self, req: PendingHandle) -> UcsResult<()> {
        self.check_failed()?;
        if self.iface.base.pending.group_is_empty(self.group) && self.shared.producer.has_room() {
            return Err(Status::Busy);
        }
        self.iface.base.pending.push(self.group, req);
        Ok(())
    }

    fn pending_purge(&self, sink: &mut dyn FnMut(PendingHandle)) {
        self.iface.base.pending.purge(self.group, sink);
    }
}
