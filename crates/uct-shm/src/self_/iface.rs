//! The `self` interface and endpoint: loopback inside one process.
//!
//! A send copies the message into a buffer from the interface's pool and calls the handler
//! right away (UCX's `self` does the same). The handler may keep the buffer; when
//! `RX_MAX_BUFS` buffers are kept, sends return `NoResource` until one is released, and pending
//! requests are then served from progress, round robin over endpoints.

use std::rc::Rc;

use ucs::arbiter::GroupId;
use ucs::mpool::{HeapChunkAlloc, MemPool, MpoolParams, PoolBuf};
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    check_am_id, check_length, AmRecv, AtomicCaps, AtomicOps, BandwidthModel, BaseIface, Completion, Ep, EpConnect,
    EpParams, EventFlags, FlushFlags, Iface, IfaceAttr, IfaceFlags, IfaceParams, LinearFunc, OpCaps, PackFn,
    PendingHandle, ProgressFlags, RemoteKey, Resources, SendFlags, Worker,
};

use super::config::SelfIfaceConfig;
use super::md::{with_region, NAME};

struct Inner {
    id: u64,
    base: BaseIface,
    pool: Rc<MemPool>,
    max_bufs: usize,
    seg_size: usize,
}

impl Inner {
    /// True when a send could get a buffer now.
    fn has_resources(&self) -> bool {
        self.pool.num_free() > 0 || self.pool.num_elems() < self.max_bufs
    }

    #[inline]
    fn buffer(&self) -> Option<PoolBuf> {
        self.pool.get_buf()
    }

    /// Hands `len` bytes of `buf` to the handler of `id`; the buffer returns to the pool unless
    /// the handler keeps it.
    #[inline]
    fn deliver(&self, id: u8, buf: PoolBuf, len: usize) {
        let mut slot = Some(buf);
        let _ = self.base.am.invoke(id, AmRecv::from_desc(&mut slot, 0, len));
    }

    fn progress(&self) -> usize {
        if self.base.pending.is_empty() {
            return 0;
        }
        self.base
            .pending
            .dispatch(|_| if self.has_resources() { Resources::Available } else { Resources::IfaceExhausted })
    }
}

/// The `self` interface.
pub struct SelfIface {
    inner: Rc<Inner>,
}

impl SelfIface {
    pub(crate) fn open(worker: &Worker, params: &IfaceParams) -> UcsResult<Self> {
        let cfg = SelfIfaceConfig::read(params)?;
        let seg_size = cfg.seg_size;
        if seg_size < 8 {
            tracing::error!(seg_size, "UCX_SELF_SEG_SIZE must be at least 8 bytes");
            return Err(Status::InvalidParam);
        }
        let mut mp = MpoolParams::new(seg_size);
        mp.alignment = 64;
        mp.elems_per_chunk = 16;
        mp.max_elems = cfg.max_bufs;
        mp.name = "self_msg_desc";
        let pool = Rc::new(MemPool::new(mp, Box::new(HeapChunkAlloc))?);
        let all_ops = AtomicOps::ADD | AtomicOps::AND | AtomicOps::OR | AtomicOps::XOR;
        let atomics = AtomicCaps { op_flags: all_ops, fop_flags: all_ops | AtomicOps::SWAP | AtomicOps::CSWAP };
        let attr = IfaceAttr {
            flags: IfaceFlags::CONNECT_TO_IFACE
                | IfaceFlags::AM_SHORT
                | IfaceFlags::AM_BCOPY
                | IfaceFlags::PUT_SHORT
                | IfaceFlags::PUT_BCOPY
                | IfaceFlags::GET_SHORT
                | IfaceFlags::GET_BCOPY
                | IfaceFlags::ATOMIC_CPU
                | IfaceFlags::PENDING
                | IfaceFlags::CB_SYNC
                | IfaceFlags::EP_CHECK,
            // Messages are delivered inside the send call; arming only reports queued sends.
            event_flags: EventFlags::SEND_COMP | EventFlags::RECV,
            put: OpCaps {
                max_short: u32::MAX as usize,
                max_bcopy: seg_size,
                opt_zcopy_align: 1,
                align_mtu: 1,
                max_iov: 1,
                ..Default::default()
            },
            get: OpCaps {
                max_short: u32::MAX as usize,
                max_bcopy: seg_size,
                opt_zcopy_align: 1,
                align_mtu: 1,
                max_iov: 1,
                ..Default::default()
            },
            am: OpCaps {
                max_short: seg_size,
                max_bcopy: seg_size,
                opt_zcopy_align: 1,
                align_mtu: 1,
                max_iov: usize::MAX,
                ..Default::default()
            },
            atomic32: atomics,
            atomic64: atomics,
            device_addr_len: 0,
            iface_addr_len: 8,
            ep_addr_len: 0,
            max_num_eps: usize::MAX,
            overhead: 10e-9,
            bandwidth: BandwidthModel { dedicated: 19360.0 * 1024.0 * 1024.0, shared: 0.0 },
            latency: LinearFunc { c: 0.0, m: 0.0 },
            priority: 0,
            ..Default::default()
        };
        Ok(SelfIface {
            inner: Rc::new(Inner {
                id: crate::sm::unique_iface_id(),
                base: BaseIface::new(worker, params, attr),
                pool,
                max_bufs: cfg.max_bufs,
                seg_size,
            }),
        })
    }
}

impl Drop for SelfIface {
    fn drop(&mut self) {
        self.inner.base.close();
    }
}

impl Iface for SelfIface {
    fn base(&self) -> &BaseIface {
        &self.inner.base
    }

    fn progress(&self) -> usize {
        self.inner.progress()
    }

    fn progress_enable(&self, _flags: ProgressFlags) {
        self.inner.base.enable_progress(&self.inner, Inner::progress);
    }

    fn device_address(&self) -> Vec<u8> {
        Vec::new()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.inner.id.to_le_bytes().to_vec()
    }

    fn is_reachable(&self, _dev_addr: &[u8], iface_addr: Option<&[u8]>) -> bool {
        iface_addr.is_some_and(|a| a == self.inner.id.to_le_bytes())
    }

    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>> {
        match params.connect {
            EpConnect::ToIface { iface_addr, .. } => {
                if iface_addr.len() != 8 {
                    return Err(Status::InvalidAddr);
                }
                if !self.is_reachable(&[], Some(iface_addr)) {
                    return Err(Status::Unreachable);
                }
                let group = self.inner.base.pending.add_group();
                Ok(Box::new(SelfEp { iface: self.inner.clone(), group }))
            }
            EpConnect::ToEp => Err(Status::Unsupported),
        }
    }

    fn flush(&self, _flags: FlushFlags, _comp: Option<&Rc<Completion>>) -> OpResult {
        // Every operation completes inside its call (queued requests are not issued yet).
        Ok(Outcome::Done(()))
    }
    fn event_arm(&self, events: EventFlags) -> UcsResult<()> {
        if events.contains(EventFlags::SEND_COMP) && !self.inner.base.pending.is_empty() {
            // Queued sends go out from progress once a buffer frees.
            return Err(Status::Busy);
        }
        Ok(())
    }
}

/// An endpoint of the `self` interface (to itself).
pub struct SelfEp {
    iface: Rc<Inner>,
    group: GroupId,
}

impl Drop for SelfEp {
    fn drop(&mut self) {
        self.iface.base.pending.remove_group(self.group);
    }
}

impl SelfEp {
    /// Checks the key and that queued requests of this endpoint do not get overtaken.
    #[inline]
    fn check_rkey(&self, rkey: &RemoteKey, remote_addr: u64, len: usize) -> UcsResult<u64> {
        rkey.check(NAME, remote_addr, len)
    }

    /// No fast path: every access looks up the live registration (`sm_access`).
    #[inline(always)]
    fn sm_direct(&self, _rkey: &RemoteKey, _addr: u64, _len: usize) -> Option<*mut u8> {
        None
    }

    /// The shared-memory RMA hook (see `sm::impl_sm_rma`): runs `f` on the live registration.
    #[inline]
    fn sm_access<R>(
        &self,
        rkey: &RemoteKey,
        addr: u64,
        len: usize,
        f: impl FnOnce(crate::sm::LocalRegion, u64) -> UcsResult<R>,
    ) -> OpResult<R> {
        if !self.may_send() {
            return Ok(Outcome::NoResource);
        }
        let off = self.check_rkey(rkey, addr, len)?;
        with_region(rkey, |r| f(r, off)).map(Outcome::Done)
    }

    fn sm_seg_size(&self) -> usize {
        self.iface.seg_size
    }

    /// False when the operation must return `NoResource` to keep per-endpoint order.
    #[inline]
    fn may_send(&self) -> bool {
        self.iface.base.pending.may_send(self.group)
    }
}

macro_rules! ordered {
    ($self:ident) => {
        if !$self.may_send() {
            return Ok(Outcome::NoResource);
        }
    };
}

impl Ep for SelfEp {
    crate::sm::impl_sm_rma!();

    #[inline]
    fn am_short(&self, id: u8, header: u64, payload: &[u8]) -> OpResult {
        ordered!(self);
        check_am_id(id)?;
        let total = payload.len() + 8;
        check_length(total, self.iface.seg_size, "am_short")?;
        let Some(mut buf) = self.iface.buffer() else { return Ok(Outcome::NoResource) };
        let s = buf.as_mut_slice();
        s[..8].copy_from_slice(&header.to_ne_bytes());
        s[8..total].copy_from_slice(payload);
        self.iface.deliver(id, buf, total);
        Ok(Outcome::Done(()))
    }

    fn am_short_iov(&self, id: u8, iov: &[&[u8]]) -> OpResult {
        ordered!(self);
        check_am_id(id)?;
        let total = iov.iter().map(|s| s.len()).fold(0usize, usize::saturating_add);
        check_length(total, self.iface.seg_size, "am_short_iov")?;
        let Some(mut buf) = self.iface.buffer() else { return Ok(Outcome::NoResource) };
        let s = buf.as_mut_slice();
        let mut at = 0;
        for part in iov {
            s[at..at + part.len()].copy_from_slice(part);
            at += part.len();
        }
        self.iface.deliver(id, buf, total);
        Ok(Outcome::Done(()))
    }

    #[inline]
    fn am_bcopy(&self, id: u8, pack: PackFn<'_>, _flags: SendFlags) -> OpResult<usize> {
        ordered!(self);
        check_am_id(id)?;
        let Some(mut buf) = self.iface.buffer() else { return Ok(Outcome::NoResource) };
        let seg = self.iface.seg_size;
        let len = pack(&mut buf.as_mut_slice()[..seg]);
        check_length(len, seg, "am_bcopy")?;
        self.iface.deliver(id, buf, len);
        Ok(Outcome::Done(len))
    }

    fn put_bcopy(&self, pack: PackFn<'_>, remote_addr: u64, rkey: &RemoteKey) -> OpResult<usize> {
        ordered!(self);
        // Pack into our own buffer first: user code never runs while the registration is held,
        // and a bad address is an error, not a short slice handed to the callback.
        let Some(mut buf) = self.iface.buffer() else { return Ok(Outcome::NoResource) };
        let seg = self.iface.seg_size;
        let len = pack(&mut buf.as_mut_slice()[..seg]);
        check_length(len, seg, "put_bcopy")?;
        let off = self.check_rkey(rkey, remote_addr, len)?;
        // SAFETY: `with_region` holds the live registration (valid memory per `mem_reg`).
        with_region(rkey, |r| unsafe { r.write(off, &buf.as_slice()[..len]) })?;
        Ok(Outcome::Done(len))
    }

    fn flush(&self, _flags: FlushFlags, _comp: Option<&Rc<Completion>>) -> OpResult {
        // Every operation completes inside its call; only queued requests are outstanding.
        if self.iface.base.pending.group_is_empty(self.group) {
            Ok(Outcome::Done(()))
        } else {
            Ok(Outcome::NoResource)
        }
    }

    fn check(&self, _comp: Option<&Rc<Completion>>) -> OpResult {
        Ok(Outcome::Done(()))
    }

    fn pending_add(&self, req: PendingHandle) -> UcsResult<()> {
        if self.iface.has_resources() && self.iface.base.pending.group_is_empty(self.group) {
            return Err(Status::Busy);
        }
        self.iface.base.pending.push(self.group, req);
        Ok(())
    }

    fn pending_purge(&self, sink: &mut dyn FnMut(PendingHandle)) {
        self.iface.base.pending.purge(self.group, sink);
    }
}
