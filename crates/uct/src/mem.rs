//! Memory handles, allocations and remote keys.

use std::any::Any;
use std::fmt;
use std::rc::Rc;

use ucs::{Status, UcsResult};

/// A registered (or allocated) memory region, as a transport implements it.
pub trait MemRegion: Any {
    /// Start of the region.
    fn address(&self) -> *mut u8;
    /// Length of the region in bytes.
    fn length(&self) -> usize;
    /// For downcasting to the transport's own type.
    fn as_any(&self) -> &dyn Any;
}

/// A memory handle (`uct_mem_h`). The registration lives until the last clone is dropped
/// (in-flight zero-copy operations hold a clone), then it is deregistered or freed.
#[derive(Clone)]
pub struct MemH(Rc<dyn MemRegion>);

impl MemH {
    /// Wraps a transport's region.
    pub fn new(region: impl MemRegion) -> Self {
        MemH(Rc::new(region))
    }

    /// Start of the region.
    pub fn address(&self) -> *mut u8 {
        self.0.address()
    }

    /// Length of the region.
    pub fn length(&self) -> usize {
        self.0.length()
    }

    /// The region as the transport's type, if it is one.
    pub fn downcast_ref<T: MemRegion>(&self) -> Option<&T> {
        self.0.as_any().downcast_ref::<T>()
    }

    /// True when `[addr, addr + len)` lies within the region.
    pub fn contains(&self, addr: *const u8, len: usize) -> bool {
        let start = self.address() as usize;
        let a = addr as usize;
        a >= start && a.checked_add(len).is_some_and(|e| e <= start + self.length())
    }
}

impl fmt::Debug for MemH {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemH").field("address", &self.address()).field("length", &self.length()).finish()
    }
}

/// An unpacked remote key (`uct_rkey_bundle_t`): what a transport needs to reach a region
/// registered by a peer, plus the region's bounds so every access can be checked.
pub struct RemoteKey {
    component: &'static str,
    rkey: u64,
    base: u64,
    length: u64,
    handle: Option<Box<dyn Any>>,
    /// Where the region is mapped in this process, for transports that map it (shared
    /// memory): start and length of the mapping, kept alive by `handle`.
    local: Option<(std::ptr::NonNull<u8>, usize)>,
}

impl RemoteKey {
    /// Builds a key for `component`, covering `[base, base + length)` on the peer. `handle`
    /// keeps transport resources (e.g. a mapped segment) alive while the key exists.
    pub fn new(component: &'static str, rkey: u64, base: u64, length: u64, handle: Option<Box<dyn Any>>) -> Self {
        RemoteKey { component, rkey, base, length, handle, local: None }
    }

    /// Records where the region is mapped locally (`uct_rkey_ptr`), so operations reach it
    /// without looking into the handle.
    ///
    /// # Safety
    /// `len` bytes at `base` must stay mapped for as long as the key lives (e.g. because
    /// `handle` owns the mapping).
    pub unsafe fn with_local_mapping(mut self, base: std::ptr::NonNull<u8>, len: usize) -> Self {
        self.local = Some((base, len));
        self
    }

    /// The local mapping recorded by [`RemoteKey::with_local_mapping`]: start and length.
    #[inline]
    pub fn local_mapping(&self) -> Option<(std::ptr::NonNull<u8>, usize)> {
        self.local
    }

    /// Name of the component that unpacked the key.
    pub fn component(&self) -> &'static str {
        self.component
    }

    /// The transport's key value (e.g. an IB rkey, or a registration id).
    pub fn rkey(&self) -> u64 {
        self.rkey
    }

    /// Remote start address of the region.
    pub fn base(&self) -> u64 {
        self.base
    }

    /// Length of the region.
    pub fn length(&self) -> u64 {
        self.length
    }

    /// The transport's resources for this key.
    pub fn handle<T: Any>(&self) -> Option<&T> {
        self.handle.as_ref().and_then(|h| h.downcast_ref::<T>())
    }

    /// Checks that the key belongs to `component` and `[remote_addr, remote_addr + len)` lies
    /// within the region the key declares; returns the offset into it. Errors: `InvalidParam`
    /// (wrong component) or `OutOfRange`.
    ///
    /// The bounds come from the packed key, i.e. from the peer. This check makes bad requests
    /// fail early with a clear status; it does not by itself make an access memory-safe. A
    /// transport bounds its real memory accesses by state it validated itself (the mapping it
    /// created, the live registration it looked up), as `self` and the shared-memory
    /// transports do.
    #[inline]
    pub fn check(&self, component: &'static str, remote_addr: u64, len: usize) -> UcsResult<u64> {
        // Components pass their static name: pointer equality is the fast path.
        if !std::ptr::eq(self.component, component) && self.component != component {
            tracing::debug!(key = self.component, transport = component, "remote key of another component");
            return Err(Status::InvalidParam);
        }
        let off = remote_addr.checked_sub(self.base).ok_or(Status::OutOfRange)?;
        let end = off.checked_add(len as u64).ok_or(Status::OutOfRange)?;
        if end > self.length {
            tracing::debug!(remote_addr, len, base = self.base, length = self.length, "remote access out of range");
            return Err(Status::OutOfRange);
        }
        Ok(off)
    }
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteKey")
            .field("component", &self.component)
            .field("rkey", &format_args!("{:#x}", self.rkey))
            .field("base", &format_args!("{:#x}", self.base))
            .field("length", &self.length)
            .finish()
    }
}

/// One entry of a zero-copy scatter/gather list (`uct_iov_t`).
///
/// The memory must stay valid until the operation completes; that is why zero-copy operations
/// are `unsafe fn`.
#[derive(Clone, Copy, Debug)]
pub struct Iov<'a> {
    /// Start of the buffer.
    pub buffer: *mut u8,
    /// Length of one element.
    pub length: usize,
    /// Registration covering the buffer, when the memory domain needs one.
    pub memh: Option<&'a MemH>,
    /// Distance between elements (0 or `length` for contiguous).
    pub stride: usize,
    /// Number of elements.
    pub count: usize,
}

impl<'a> Iov<'a> {
    /// A contiguous buffer.
    pub fn new(buffer: *mut u8, length: usize, memh: Option<&'a MemH>) -> Self {
        Iov { buffer, length, memh, stride: 0, count: 1 }
    }

    /// Total bytes described.
    pub fn total_len(&self) -> usize {
        self.length.saturating_mul(self.count)
    }
}

/// Total bytes of an iov list.
pub fn iov_total_len(iov: &[Iov<'_>]) -> usize {
    iov.iter().map(Iov::total_len).fold(0usize, usize::saturating_add)
}
