//! The memory-mapped interface: a receive FIFO and its receive descriptors in one segment.
//!
//! ```text
//! segment: [ FIFO control | FIFO elements | descriptors (2 x FIFO size) x SEG_SIZE ]
//! ```
//! Every FIFO element is lent one descriptor, into which senders pack bcopy data. The
//! receiver tracks which descriptor each element has in private memory (a peer cannot redirect
//! it); a handler that keeps a descriptor gets to keep the buffer, and the element is lent a
//! fresh one before its slot is released. When every spare descriptor is kept, messages are
//! copied instead of lent.
//!
//! Trust model: handlers read inline data and descriptors in place (as UCX does). Producers
//! that follow the protocol never write a slot the consumer owns, nor a descriptor after
//! publishing it; every header field is read once and validated, so a peer that breaks the
//! protocol can corrupt message contents but never make this process access memory outside
//! its mappings.

use std::cell::{Cell, RefCell};
use std::ptr::NonNull;
use std::rc::{Rc, Weak};
use std::sync::OnceLock;

use ucs::arbiter::GroupId;
use ucs::mpool::{ChunkAlloc, MemPool, MpoolParams, PoolBuf};
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    AmRecv, AtomicCaps, AtomicOps, BandwidthModel, BaseIface, Completion, Ep, EpConnect, EpParams, EventFlags,
    FlushFlags, Iface, IfaceAttr, IfaceFlags, IfaceParams, LinearFunc, OpCaps, ProgressFlags, Resources, Worker,
    AM_ID_MAX,
};

use super::config::MmIfaceConfig;
use super::ep::{EpShared, MmEp, RemoteIface};
use super::fifo::{Consumer, Fifo};
use super::md::MmComponent;
use super::segment::{SegId, Segment};
use super::signal::SignalSocket;

/// Bytes of an interface address.
pub(crate) const IFACE_ADDR_LEN: usize = SegId::PACKED_LEN + 8 + 4 + 4 + 4 + 4;

/// A value identifying this machine (boot id), so that only local peers are reachable.
pub(crate) fn machine_id() -> u64 {
    static ID: OnceLock<u64> = OnceLock::new();
    *ID.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
        // FNV-1a: stable across processes, unlike the std hasher.
        text.trim().bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3))
    })
}

/// Hands the descriptor area of the receive segment to a memory pool, once.
struct DescArea {
    seg: Rc<Segment>,
    offset: usize,
    len: usize,
    taken: Cell<bool>,
}

// SAFETY: `alloc` hands out the descriptor area of a freshly created (zero-filled) segment
// exactly once; the area lies within the mapping, which the pool keeps alive through `seg`.
// Peers write a descriptor only while it is lent to a FIFO slot they claimed.
unsafe impl ChunkAlloc for DescArea {
    fn alloc(&self, min_size: usize) -> UcsResult<(NonNull<u8>, usize)> {
        if self.taken.replace(true) || min_size > self.len {
            return Err(Status::NoMemory);
        }
        // SAFETY: offset + len lies within the segment (computed in `open`).
        Ok((unsafe { self.seg.base().add(self.offset) }, self.len))
    }

    unsafe fn release(&self, _ptr: NonNull<u8>, _size: usize) {}
}

struct Rx {
    consumer: Consumer,
    /// The descriptor lent to each FIFO slot (receiver-private).
    lent: Vec<Option<PoolBuf>>,
}

pub(crate) struct Inner {
    /// Attributes, AM handlers, pending queue, progress registration, failure handler.
    pub(crate) base: BaseIface,
    pub(crate) comp: &'static MmComponent,
    pub(crate) cfg: MmIfaceConfig,
    pub(crate) id: u64,
    pub(crate) signal_tx: SignalSocket,
    pub(crate) eps: RefCell<Vec<(GroupId, Weak<EpShared>)>>,
    /// Bounce buffer for put_bcopy near the end of a region.
    signal_rx: SignalSocket,
    rx: RefCell<Rx>,
    descs: Rc<MemPool>,
    seg: Rc<Segment>,
}

impl Inner {
    /// Byte offset of a pool descriptor inside the segment.
    fn desc_offset(&self, buf: &PoolBuf) -> u32 {
        (buf.as_ptr() as usize - self.seg.base().as_ptr() as usize) as u32
    }

    /// Handles up to `max_poll` published elements. The receive side stays borrowed while the
    /// handlers run (they may send, not progress): a progress call from inside a handler finds
    /// it borrowed and polls nothing here.
    fn poll_rx(&self) -> usize {
        let Ok(mut rx) = self.rx.try_borrow_mut() else { return 0 };
        let rx = &mut *rx;
        let mut n = 0;
        while n < self.cfg.max_poll {
            let Some(e) = rx.consumer.peek() else { break };
            if n > 0 {
                // A second message in one poll: they are streaming in.
                rx.consumer.prefetch_next();
            }
            // Copies of the header fields (taken once from shared memory by `peek`), kept in
            // registers: the warnings below only borrow them on their cold paths.
            let (am_id, len, inline) = (e.am_id, e.length as usize, e.inline);
            if am_id >= AM_ID_MAX {
                tracing::warn!(am_id, "{}: dropped a message with an invalid AM id", self.comp.name);
            } else if inline {
                if len > self.cfg.layout.max_inline() {
                    tracing::warn!(len, "{}: dropped an inline message longer than the element", self.comp.name);
                } else {
                    // SAFETY: `len` bytes of inline data lie within the published element, which
                    // stays ours (no producer may claim the slot) until `advance` releases it.
                    let data = unsafe { std::slice::from_raw_parts(rx.consumer.inline_ptr(), len) };
                    let _ = self.base.am.invoke(am_id, AmRecv::borrowed(data));
                }
            } else if len > self.cfg.seg_size {
                tracing::warn!(len, "{}: dropped a bcopy message longer than a descriptor", self.comp.name);
            } else {
                self.bcopy_rx(rx, am_id, len);
            }
            rx.consumer.advance();
            n += 1;
        }
        n
    }

    /// Hands the descriptor lent to the current element to its handler; lends the slot a fresh
    /// one if the handler kept it.
    fn bcopy_rx(&self, rx: &mut Rx, am_id: u8, len: usize) {
        let slot = rx.consumer.index_slot();
        let mut lent = rx.lent[slot].take();
        if self.descs.num_free() > 0 {
            let _ = self.base.am.invoke(am_id, AmRecv::from_desc(&mut lent, 0, len));
        } else if let Some(b) = lent.as_ref() {
            // No spare descriptor to swap in: the handler gets a copy to keep.
            let _ = self.base.am.invoke(am_id, AmRecv::borrowed(&b.as_slice()[..len]));
        }
        if lent.is_none() {
            // Kept: lend the slot a fresh descriptor before releasing it.
            lent = self.descs.get_buf();
            if let Some(b) = lent.as_ref() {
                rx.consumer.set_desc_offset(self.desc_offset(b));
            }
        }
        rx.lent[slot] = lent;
    }

    /// Polls the FIFO and serves pending requests. The idle case (nothing published, nothing
    /// pending) is a few instructions, inlined into the worker's progress.
    #[inline]
    pub(crate) fn progress(&self) -> usize {
        // A borrowed receive side (not expected: handlers may not progress) takes the full path.
        if self.base.pending.is_empty() && !self.rx.try_borrow().map_or(true, |rx| rx.consumer.ready()) {
            return 0;
        }
        self.progress_busy()
    }

    #[inline(never)]
    fn progress_busy(&self) -> usize {
        let mut n = self.poll_rx();
        if !self.base.pending.is_empty() {
            n += self.base.pending.dispatch(|g| {
                let ep = self.eps.borrow().iter().find(|(x, _)| *x == g).and_then(|(_, w)| w.upgrade());
                match ep {
                    Some(ep) if ep.has_room() => Resources::Available,
                    _ => Resources::EpNotReady,
                }
            });
        }
        n
    }
}

/// A `posix` or `sysv` interface.
pub struct MmIface {
    pub(crate) inner: Rc<Inner>,
}

impl MmIface {
    pub(crate) fn open(comp: &'static MmComponent, worker: &Worker, params: &IfaceParams) -> UcsResult<Self> {
        let cfg = MmIfaceConfig::read(comp.prefixes, None, &params.config)?;
        let fifo_len = cfg.layout.total_len().next_multiple_of(64);
        let desc_stride = cfg.seg_size.next_multiple_of(64);
        let n_descs = 2 * cfg.layout.fifo_size as usize;
        // The pool asks for alignment slack on top of the descriptors themselves.
        let desc_area = n_descs * desc_stride + 64;
        let seg = Rc::new(Segment::create(comp.kind, fifo_len + desc_area)?);
        let mut mp = MpoolParams::new(cfg.seg_size);
        mp.alignment = 64;
        mp.elems_per_chunk = n_descs;
        mp.max_elems = n_descs;
        mp.name = "mm_recv_desc";
        let area = DescArea { seg: seg.clone(), offset: fifo_len, len: desc_area, taken: Cell::new(false) };
        let descs = Rc::new(MemPool::new(mp, Box::new(area))?);
        descs.grow(n_descs)?;
        // SAFETY: the segment maps `len` bytes for as long as `seg` lives, which outlives the
        // consumer (both in `Inner`, the segment also held by the pool).
        let fifo = unsafe { Fifo::from_raw(seg.base(), seg.len(), cfg.layout)? };
        let mut lent = Vec::with_capacity(cfg.layout.fifo_size as usize);
        for _ in 0..cfg.layout.fifo_size {
            lent.push(Some(descs.get_buf().ok_or(Status::NoMemory)?));
        }
        let base = seg.base().as_ptr() as usize;
        fifo.init(std::process::id(), |i| lent[i as usize].as_ref().map_or(0, |b| (b.as_ptr() as usize - base) as u32));
        let consumer = Consumer::new(fifo, cfg.release_batch)?;
        let id = crate::sm::unique_iface_id();
        let max_inline = cfg.layout.max_inline();
        let cpu = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        let atomics = AtomicCaps { op_flags: cpu, fop_flags: cpu | AtomicOps::SWAP | AtomicOps::CSWAP };
        let mut flags = IfaceFlags::AM_SHORT
            | IfaceFlags::AM_BCOPY
            | IfaceFlags::PUT_SHORT
            | IfaceFlags::PUT_BCOPY
            | IfaceFlags::GET_SHORT
            | IfaceFlags::GET_BCOPY
            | IfaceFlags::ATOMIC_CPU
            | IfaceFlags::PENDING
            | IfaceFlags::CB_SYNC
            | IfaceFlags::CONNECT_TO_IFACE
            | IfaceFlags::EP_CHECK;
        if cfg.error_handling {
            flags |= IfaceFlags::ERRHANDLE_PEER_FAILURE;
        }
        // Puts and gets are copies into and out of the peer's mapped segment: no size limit
        // but the region's (as UCX's mm: put_short up to 4 GiB, put_bcopy and get_bcopy
        // unlimited).
        let rma = OpCaps {
            max_short: u32::MAX as usize,
            max_bcopy: usize::MAX,
            opt_zcopy_align: 1,
            align_mtu: 1,
            max_iov: 1,
            ..Default::default()
        };
        let attr = IfaceAttr {
            flags,
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV | EventFlags::FD,
            put: rma,
            get: rma,
            am: OpCaps {
                max_short: max_inline,
                max_bcopy: cfg.seg_size,
                opt_zcopy_align: 1,
                align_mtu: 1,
                max_iov: usize::MAX,
                ..Default::default()
            },
            atomic32: atomics,
            atomic64: atomics,
            device_addr_len: 8,
            iface_addr_len: IFACE_ADDR_LEN,
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 10e-9,
            bandwidth: BandwidthModel { dedicated: 0.0, shared: 15360.0 * 1024.0 * 1024.0 },
            latency: LinearFunc { c: 80e-9, m: 0.0 },
            priority: 0,
            ..Default::default()
        };
        Ok(MmIface {
            inner: Rc::new(Inner {
                comp,
                base: BaseIface::new(worker, params, attr),
                id,
                signal_tx: SignalSocket::sender()?,
                eps: RefCell::default(),
                signal_rx: SignalSocket::bind(id)?,
                rx: RefCell::new(Rx { consumer, lent }),
                descs,
                seg,
                cfg,
            }),
        })
    }
}

impl Drop for MmIface {
    fn drop(&mut self) {
        self.inner.base.close();
    }
}

impl Iface for MmIface {
    fn base(&self) -> &BaseIface {
        &self.inner.base
    }

    fn progress(&self) -> usize {
        self.inner.progress()
    }

    fn progress_enable(&self, _flags: ProgressFlags) {
        self.inner.base.progress.enable_for(&self.inner, Inner::progress);
    }

    fn device_address(&self) -> Vec<u8> {
        machine_id().to_le_bytes().to_vec()
    }

    fn iface_address(&self) -> Vec<u8> {
        let c = &self.inner.cfg;
        let mut out = Vec::with_capacity(IFACE_ADDR_LEN);
        self.inner.seg.id().pack(&mut out);
        out.extend_from_slice(&self.inner.id.to_le_bytes());
        out.extend_from_slice(&c.layout.fifo_size.to_le_bytes());
        out.extend_from_slice(&c.layout.elem_size.to_le_bytes());
        out.extend_from_slice(&(c.seg_size as u32).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out
    }

    fn is_reachable(&self, dev_addr: &[u8], iface_addr: Option<&[u8]>) -> bool {
        dev_addr == machine_id().to_le_bytes()
            && iface_addr.is_some_and(|a| RemoteIface::parse(self.inner.comp, a).is_ok())
    }

    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>> {
        match params.connect {
            EpConnect::ToIface { dev_addr, iface_addr } => {
                if dev_addr != machine_id().to_le_bytes() {
                    return Err(Status::Unreachable);
                }
                Ok(Box::new(MmEp::connect(&self.inner, iface_addr, params.user_data)?))
            }
            EpConnect::ToEp => Err(Status::Unsupported),
        }
    }

    fn flush(&self, _flags: FlushFlags, _comp: Option<&Rc<Completion>>) -> OpResult {
        // Sends are complete once published; remote completion needs nothing more on a
        // coherent shared-memory machine.
        Ok(Outcome::Done(()))
    }

    fn event_fd(&self) -> UcsResult<std::os::fd::RawFd> {
        Ok(self.inner.signal_rx.raw_fd())
    }

    fn event_arm(&self, events: EventFlags) -> UcsResult<()> {
        if events.contains(EventFlags::SEND_COMP) && !self.inner.base.pending.is_empty() {
            // Queued sends wait for FIFO space, which frees without a signal to us.
            return Err(Status::Busy);
        }
        if !events.intersects(EventFlags::RECV | EventFlags::RECV_SIG) {
            return Ok(());
        }
        // Borrowed: a handler of this interface is arming from inside progress, which is busy.
        let Ok(rx) = self.inner.rx.try_borrow() else { return Err(Status::Busy) };
        rx.consumer.arm()?;
        drop(rx);
        // A signal waiting in the socket (from a producer that found the FIFO armed before
        // the messages were polled) would wake the sleeper at once: take it, and have the
        // caller progress and arm again instead, as UCX does.
        if self.inner.signal_rx.take_one() {
            return Err(Status::Busy);
        }
        Ok(())
    }
}
