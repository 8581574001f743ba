//! Remote memory access and atomics, the API (`ucp_put_nbx`, `ucp_get_nbx`,
//! `ucp_atomic_op_nbx`, `ucp_rkey_pack`, `ucp_ep_rkey_unpack`, `ucp_rkey_ptr`, flush, fence).
//!
//! The raw operations take the caller's memory and are `unsafe`, as in UCX; the safe ones are
//! futures over owned buffers: a get or a fetching atomic writes into memory the worker holds
//! until the transport is done, so dropping the future never lets data land in memory the
//! caller owns again.
//!
//! Semantics (UCX's): completion of a put means its local buffer may be reused, not that the
//! data reached the target - that is what a flush ([`Endpoint::flush`], [`Worker::flush`])
//! says; a fence ([`Worker::fence`]) orders the operations issued before it against those
//! after; atomics on one location are atomic with respect to each other from every peer.
//! Beyond UCX: an access outside the region a remote key describes is refused at the origin
//! (`OutOfRange`), where C UCX writes wherever it is told.

use std::ptr::NonNull;
use std::rc::Rc;

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::data::{RecvData, SendData};
use super::future::{RecvFuture, SendFuture};
use super::{Endpoint, Entered, Request, Worker};
use crate::core::rma::{Rkey, RmaOp};
use crate::dt::UserBuf;
use crate::mem::MemHandle;
use crate::proto::select::RmaOpKind;
use crate::request::{RecvInfo, RequestParam};
use crate::rma::AmoArgs;

/// A peer's region, unpacked on an endpoint ([`Endpoint::rkey_unpack`]; `ucp_rkey_h`). It
/// serves operations on that endpoint only; dropping it is `ucp_rkey_destroy` (operations
/// still queued with it then fail with `InvalidParam`).
pub struct RemoteKey {
    worker: Worker,
    pub(crate) ep: Id,
    pub(crate) id: Id,
    /// The unpacked key itself, a strong reference (`Rc::into_raw`) released on drop: the
    /// fast path reads it without looking the id up. Dereferenced, cloned and released only
    /// inside the worker ([`Worker::enter`]).
    rk: NonNull<Rkey>,
    address: u64,
    length: u64,
}

// SAFETY: `rk` is the only non-thread-safe part: its reference count and contents are touched
// only after `Worker::enter`, which serializes access (the owner thread of a single-threaded
// worker, the lock of the others) - the same rule as every object of the worker's core.
unsafe impl Send for RemoteKey {}
// SAFETY: as for `Send`; `&RemoteKey` gives nothing that bypasses `Worker::enter`.
unsafe impl Sync for RemoteKey {}

impl std::fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteKey")
            .field("address", &format_args!("{:#x}", self.address))
            .field("length", &self.length)
            .finish()
    }
}

impl RemoteKey {
    /// Start of the region in the peer's address space.
    pub fn address(&self) -> u64 {
        self.address
    }

    /// Length of the region.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// Where remote address `remote_addr` is mapped in this process (`ucp_rkey_ptr`), for
    /// direct loads and stores: a region a shared-memory transport mapped (memory the peer
    /// allocated with [`Worker::mem_map_alloc`]). `Unreachable` when no transport mapped it,
    /// `OutOfRange` outside the region. Accesses through the pointer race with the peer's like
    /// any shared memory; it stays valid while this key lives.
    pub fn ptr(&self, remote_addr: u64) -> UcsResult<*mut u8> {
        self.worker.enter()?.core.rkey_ptr(self.id, remote_addr)
    }
}

impl RemoteKey {
    /// The unpacked key, for a caller inside the worker.
    #[inline(always)]
    fn rk(&self, _inside: &Entered<'_>) -> &Rkey {
        // SAFETY: `rk` holds a strong reference until `drop`, and the caller is inside the
        // worker (see the field).
        unsafe { self.rk.as_ref() }
    }
}

impl Drop for RemoteKey {
    fn drop(&mut self) {
        // Outside the worker (a single-threaded worker dropped on another thread) the key is
        // leaked rather than released unsynchronized.
        if let Ok(e) = self.worker.enter() {
            // SAFETY: the reference `rk_unpack` made with `Rc::into_raw`, released once, inside
            // the worker.
            drop(unsafe { Rc::from_raw(self.rk.as_ptr().cast_const()) });
            e.core.rkey_destroy(self.id);
        }
    }
}

/// An atomic operation (`ucp_atomic_op_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AtomicOp {
    /// Add; no result.
    Add,
    /// Bitwise and; no result.
    And,
    /// Bitwise or; no result.
    Or,
    /// Bitwise xor; no result.
    Xor,
    /// Add, fetching the old value.
    Fadd,
    /// And, fetching the old value.
    Fand,
    /// Or, fetching the old value.
    For,
    /// Xor, fetching the old value.
    Fxor,
    /// Swap, fetching the old value.
    Swap,
    /// Compare and swap, fetching the old value: the value is stored when the remote value
    /// equals the compared one (in the reply buffer before the call, as in UCX).
    Cswap,
}

impl AtomicOp {
    /// Every operation.
    pub const ALL: [AtomicOp; 10] = [
        AtomicOp::Add,
        AtomicOp::And,
        AtomicOp::Or,
        AtomicOp::Xor,
        AtomicOp::Fadd,
        AtomicOp::Fand,
        AtomicOp::For,
        AtomicOp::Fxor,
        AtomicOp::Swap,
        AtomicOp::Cswap,
    ];

    /// Whether it returns the old value.
    pub fn fetches(self) -> bool {
        !matches!(self, AtomicOp::Add | AtomicOp::And | AtomicOp::Or | AtomicOp::Xor)
    }

    /// The transport operation.
    fn uct(self) -> uct::AtomicOp {
        match self {
            AtomicOp::Add | AtomicOp::Fadd => uct::AtomicOp::Add,
            AtomicOp::And | AtomicOp::Fand => uct::AtomicOp::And,
            AtomicOp::Or | AtomicOp::For => uct::AtomicOp::Or,
            AtomicOp::Xor | AtomicOp::Fxor => uct::AtomicOp::Xor,
            AtomicOp::Swap => uct::AtomicOp::Swap,
            AtomicOp::Cswap => uct::AtomicOp::Cswap,
        }
    }

    /// The new value of a location holding `old` after this operation with `value` (`compare`
    /// for [`AtomicOp::Cswap`]), in `bits` (32 or 64) bits: the model the tests check against.
    pub fn apply(self, old: u64, value: u64, compare: u64, bits: u32) -> u64 {
        let mask = if bits == 32 { u32::MAX as u64 } else { u64::MAX };
        let new = match self {
            AtomicOp::Cswap => {
                if old & mask == compare & mask {
                    value
                } else {
                    old
                }
            }
            op => op.uct().apply64(old, value),
        };
        new & mask
    }
}

/// An atomic operand, 32 or 64 bits (the datatype of `ucp_atomic_op_nbx`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operand {
    /// 32 bits.
    U32(u32),
    /// 64 bits.
    U64(u64),
}

impl Operand {
    fn size(self) -> u8 {
        match self {
            Operand::U32(_) => 4,
            Operand::U64(_) => 8,
        }
    }

    fn bits(self) -> u64 {
        match self {
            Operand::U32(v) => v as u64,
            Operand::U64(v) => v,
        }
    }
}

/// Address and length of a mapped region (`ucp_mem_attr_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemAttr {
    /// Start.
    pub address: usize,
    /// Length.
    pub length: usize,
}

impl Worker {
    /// Allocates `length` bytes that every peer transport of this worker can reach and maps
    /// them (`ucp_mem_map` with `UCP_MEM_MAP_ALLOCATE`): a shared-memory segment when a
    /// shared-memory transport is in use - so peers on this machine store into it directly and
    /// use CPU atomics on it - else zeroed heap memory. Freed by [`Worker::mem_unmap`] (or
    /// with the worker). Read or write it through [`MemHandle::address`] only while no peer
    /// operation may touch it, or with atomics.
    pub fn mem_map_alloc(&self, length: usize) -> UcsResult<MemHandle> {
        self.enter()?.core.mem_map_alloc(length)
    }

    /// Address and length of a mapped region (`ucp_mem_query`); `InvalidParam` for a handle
    /// that is not mapped on this worker.
    pub fn mem_query(&self, h: &MemHandle) -> UcsResult<MemAttr> {
        let (address, length) = self.enter()?.core.mem_query(h)?;
        Ok(MemAttr { address, length })
    }

    /// The remote key of a mapped region (`ucp_rkey_pack`), for the peer to unpack with
    /// [`Endpoint::rkey_unpack`]; send it over any channel.
    pub fn rkey_pack(&self, h: &MemHandle) -> UcsResult<Vec<u8>> {
        self.enter()?.core.rkey_pack(h)
    }

    /// Starts flushing every endpoint (`ucp_worker_flush_nbx`): the request completes once
    /// every operation issued before completed, remotely too. `Ok(None)`: nothing to wait for.
    pub fn flush_nbx(&self, param: RequestParam) -> UcsResult<Option<Request<'_>>> {
        let r = self.enter()?.core.flush_start(None, param)?;
        Ok(r.map(|id| Request { worker: self, id }))
    }

    /// Flushes every endpoint and waits.
    pub fn flush(&self) -> UcsResult<()> {
        match self.flush_nbx(RequestParam::new())? {
            None => Ok(()),
            Some(r) => r.wait().map(|_| ()),
        }
    }

    /// Orders the remote memory access and atomics issued before against those issued after,
    /// on every endpoint (`ucp_worker_fence`): none of the later ones starts before the earlier
    /// ones completed.
    pub fn fence(&self) -> UcsResult<()> {
        self.enter()?.core.fence();
        Ok(())
    }
}

impl Endpoint {
    /// Unpacks a remote key the peer of this endpoint packed (`ucp_ep_rkey_unpack`). The bytes
    /// are checked field by field: truncated or corrupted bytes, a key of another worker, or
    /// one whose memory no lane of this endpoint can reach (the peer unmapped it, say) are
    /// errors that say what was wrong.
    pub fn rkey_unpack(&self, bytes: &[u8]) -> UcsResult<RemoteKey> {
        let e = self.worker.enter()?;
        let (id, rk) = e.core.rkey_unpack(self.id, bytes)?;
        let (address, length) = (rk.base, rk.len);
        // SAFETY: `Rc::into_raw` never returns null.
        let rk = unsafe { NonNull::new_unchecked(Rc::into_raw(rk).cast_mut()) };
        Ok(RemoteKey { worker: self.worker.clone(), ep: self.id, id, rk, address, length })
    }

    #[inline(always)]
    fn rkey_check(&self, rkey: &RemoteKey, what: &str) -> UcsResult<()> {
        if rkey.ep != self.id || !std::sync::Arc::ptr_eq(&rkey.worker.shared, &self.worker.shared) {
            return foreign_key(what);
        }
        Ok(())
    }

    /// Starts an operation; the id of its request if it did not complete at once. The caller
    /// checked the key ([`Endpoint::rkey_check`]): it is this endpoint's, so this worker's,
    /// and entering this worker is entering the key's.
    #[inline(always)]
    fn rma_raw(
        &self,
        kind: RmaOpKind,
        buf: UserBuf,
        remote: u64,
        rkey: &RemoteKey,
        amo: AmoArgs,
        param: RequestParam,
    ) -> UcsResult<Option<Id>> {
        let e = self.worker.enter()?;
        e.core.rma_start(self.id, rkey.rk(&e), RmaOp { kind, buf, remote, rkey: rkey.id, amo }, param)
    }

    /// Writes `data` to `remote_addr` of the peer's region `rkey` (`ucp_put_nbx`). Completion
    /// means the local buffer may be reused; a flush says the data arrived. `Ok(None)`:
    /// completed at once.
    ///
    /// # Safety
    /// The local buffer (every iov entry, and an iov list itself) must stay valid and
    /// unmodified until the request completes.
    #[inline(always)]
    pub unsafe fn put_nbx(
        &self,
        data: SendData<'_>,
        remote_addr: u64,
        rkey: &RemoteKey,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        self.rkey_check(rkey, "put")?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_rma_buf("put_nbx") }) else { return super::data::invalid_data() };
        let r = self.rma_raw(RmaOpKind::Put, buf, remote_addr, rkey, AmoArgs::default(), param)?;
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// Reads the peer's memory at `remote_addr` of region `rkey` into `data` (`ucp_get_nbx`).
    ///
    /// # Safety
    /// The local buffer (every iov entry, and an iov list itself) must stay valid, and must not
    /// be accessed, until the request completes.
    #[inline(always)]
    pub unsafe fn get_nbx(
        &self,
        data: RecvData<'_>,
        remote_addr: u64,
        rkey: &RemoteKey,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        self.rkey_check(rkey, "get")?;
        // SAFETY: forwarded from the caller.
        let Some(buf) = (unsafe { data.into_rma_buf("get_nbx") }) else { return super::data::invalid_data() };
        let r = self.rma_raw(RmaOpKind::Get, buf, remote_addr, rkey, AmoArgs::default(), param)?;
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// An atomic operation on the 32- or 64-bit location `remote_addr` of region `rkey`
    /// (`ucp_atomic_op_nbx`; the location must be aligned to its size). A fetching operation
    /// stores the old value in `reply` (4 or 8 bytes, aligned, as `value`); for
    /// [`AtomicOp::Cswap`] `reply` holds the value to compare with when called.
    ///
    /// # Safety
    /// `reply` must be valid for reads and writes of the operand's size, and not be accessed
    /// otherwise, until the request completes.
    #[inline(always)]
    pub unsafe fn atomic_op_nbx(
        &self,
        op: AtomicOp,
        value: Operand,
        remote_addr: u64,
        rkey: &RemoteKey,
        reply: Option<*mut u8>,
        param: RequestParam,
    ) -> UcsResult<Option<Request<'_>>> {
        self.rkey_check(rkey, "atomic")?;
        let size = value.size();
        let (buf, compare) = match (op.fetches(), reply) {
            (false, _) => (
                // SAFETY: an empty buffer; nothing is accessed through it.
                unsafe { UserBuf::contig(std::ptr::NonNull::<u64>::dangling().as_ptr().cast(), 0) },
                0,
            ),
            (true, Some(p)) if !p.is_null() && (p as usize) % size as usize == 0 => {
                let compare = if op == AtomicOp::Cswap {
                    // SAFETY: the caller's promise: valid for reads of `size` bytes; aligned
                    // (checked above).
                    unsafe {
                        if size == 4 {
                            p.cast::<u32>().read() as u64
                        } else {
                            p.cast::<u64>().read()
                        }
                    }
                } else {
                    0
                };
                // SAFETY: forwarded from the caller.
                (unsafe { UserBuf::contig(p, size as usize) }, compare)
            }
            (true, _) => {
                tracing::error!("atomic {op:?}: a fetching operation needs a reply buffer of {size} aligned bytes");
                return Err(Status::InvalidParam);
            }
        };
        let kind = RmaOpKind::Amo { op: op.uct(), fetch: op.fetches(), size };
        let r = self.rma_raw(kind, buf, remote_addr, rkey, AmoArgs { value: value.bits(), compare }, param)?;
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// Starts flushing this endpoint (`ucp_ep_flush_nbx`): the request completes once every
    /// operation issued on it before completed, remotely too. `Ok(None)`: nothing to wait for.
    pub fn flush_nbx(&self, param: RequestParam) -> UcsResult<Option<Request<'_>>> {
        let r = self.worker.enter()?.core.flush_start(Some(self.id), param)?;
        Ok(r.map(|id| Request { worker: &self.worker, id }))
    }

    /// Flushes this endpoint and waits.
    pub fn flush(&self) -> UcsResult<()> {
        match self.flush_nbx(RequestParam::new())? {
            None => Ok(()),
            Some(r) => r.wait().map(|_| ()),
        }
    }

    /// Writes an owned buffer to `remote_addr` of region `rkey`; resolves to the buffer and the
    /// outcome (local completion, as [`put_nbx`](Self::put_nbx)).
    pub fn put<B: AsRef<[u8]> + Send + 'static>(&self, buf: B, remote_addr: u64, rkey: &RemoteKey) -> SendFuture<B> {
        let boxed = Box::new(buf);
        let s = boxed.as_ref().as_ref();
        // SAFETY: the buffer is boxed and handed to the worker below; it is returned or freed
        // only after the request completed.
        let ub = unsafe { UserBuf::contig(s.as_ptr() as *mut u8, s.len()) };
        let r = self.rkey_check(rkey, "put").and_then(|()| {
            self.rma_raw(RmaOpKind::Put, ub, remote_addr, rkey, AmoArgs::default(), RequestParam::new())
        });
        self.owned_future(boxed, r)
    }

    /// Reads the peer's memory at `remote_addr` into an owned buffer (as long as the buffer);
    /// resolves to the buffer and the outcome. Dropping the future before it resolves leaves
    /// the buffer with the worker until the transport is done with it.
    pub fn get<B: AsMut<[u8]> + Send + 'static>(&self, buf: B, remote_addr: u64, rkey: &RemoteKey) -> SendFuture<B> {
        let mut boxed = Box::new(buf);
        let s = boxed.as_mut().as_mut();
        // SAFETY: as in `put`; nothing else accesses the boxed buffer until it comes back.
        let ub = unsafe { UserBuf::contig(s.as_mut_ptr(), s.len()) };
        let r = self.rkey_check(rkey, "get").and_then(|()| {
            self.rma_raw(RmaOpKind::Get, ub, remote_addr, rkey, AmoArgs::default(), RequestParam::new())
        });
        self.owned_future(boxed, r)
    }

    /// An atomic on `remote_addr` of region `rkey`; resolves to the old value for a fetching
    /// operation (the value itself for the others). For [`AtomicOp::Cswap`] use
    /// [`atomic_cswap`](Self::atomic_cswap).
    pub fn atomic(&self, op: AtomicOp, value: Operand, remote_addr: u64, rkey: &RemoteKey) -> AmoFuture {
        self.amo_owned(op, value, 0, remote_addr, rkey)
    }

    /// Compare and swap on `remote_addr` of region `rkey`: stores `swap` if the location holds
    /// `compare`; resolves to the old value.
    pub fn atomic_cswap(&self, compare: Operand, swap: Operand, remote_addr: u64, rkey: &RemoteKey) -> AmoFuture {
        self.amo_owned(AtomicOp::Cswap, swap, compare.bits(), remote_addr, rkey)
    }

    fn amo_owned(&self, op: AtomicOp, value: Operand, compare: u64, remote_addr: u64, rkey: &RemoteKey) -> AmoFuture {
        let mut boxed = Box::new(AmoReply([0u8; 8]));
        let size = value.size();
        let p = boxed.0.as_mut_ptr();
        let buf = if op.fetches() {
            // SAFETY: the boxed reply is handed to the worker below and comes back only after
            // the request completed.
            unsafe { UserBuf::contig(p, size as usize) }
        } else {
            // SAFETY: empty; nothing is accessed.
            unsafe { UserBuf::contig(p, 0) }
        };
        let kind = RmaOpKind::Amo { op: op.uct(), fetch: op.fetches(), size };
        let r = self.rkey_check(rkey, "atomic").and_then(|()| {
            self.rma_raw(kind, buf, remote_addr, rkey, AmoArgs { value: value.bits(), compare }, RequestParam::new())
        });
        AmoFuture { inner: self.owned_future(boxed, r), value, fetch: op.fetches() }
    }

    /// The future of an operation on an owned buffer, given what starting it returned.
    fn owned_future<B: Send + 'static>(&self, boxed: Box<B>, r: UcsResult<Option<Id>>) -> SendFuture<B> {
        SendFuture { inner: RecvFuture::owned(&self.worker, boxed, r, RecvInfo::default()) }
    }
}

#[cold]
#[inline(never)]
fn foreign_key<T>(what: &str) -> UcsResult<T> {
    tracing::error!("{what}: the remote key was unpacked on another endpoint");
    Err(Status::InvalidParam)
}

/// The reply buffer of an atomic, aligned for either operand size.
#[repr(C, align(8))]
pub struct AmoReply([u8; 8]);

/// An atomic in flight ([`Endpoint::atomic`], [`Endpoint::atomic_cswap`]); resolves to the old
/// value (fetching operations) or the operand (the others). Dropping it leaves the reply
/// buffer with the worker until the transport is done.
pub struct AmoFuture {
    inner: SendFuture<AmoReply>,
    value: Operand,
    fetch: bool,
}

impl std::future::Future for AmoFuture {
    type Output = Result<Operand, Status>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        let (value, fetch) = (self.value, self.fetch);
        std::pin::Pin::new(&mut self.inner).poll(cx).map(|(reply, r)| {
            r?;
            if !fetch {
                return Ok(value);
            }
            Ok(match value {
                Operand::U32(_) => Operand::U32(u32::from_ne_bytes([reply.0[0], reply.0[1], reply.0[2], reply.0[3]])),
                Operand::U64(_) => Operand::U64(u64::from_ne_bytes(reply.0)),
            })
        })
    }
}
