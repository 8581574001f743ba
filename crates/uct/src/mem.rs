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
pub struct MemH(Handle);

#[derive(Clone)]
enum Handle {
    /// A transport's region, with state of its own.
    Region(Rc<dyn MemRegion>),
    /// Only an address range, for memory domains whose registration is nothing more (nothing
    /// is allocated or pinned): `owner` names the domain that made it.
    Bounds { owner: &'static str, addr: *mut u8, len: usize },
}

impl MemH {
    /// Wraps a transport's region.
    pub fn new(region: impl MemRegion) -> Self {
        MemH(Handle::Region(Rc::new(region)))
    }

    /// A handle that is only the range `[addr, addr + len)`, made by the memory domain named
    /// `owner` (pass a `'static` name; [`bounds_of`](Self::bounds_of) compares it). Creating
    /// and cloning it allocates nothing: for domains that need no registration state, such as
    /// cross-memory attach.
    pub fn bounds(owner: &'static str, addr: *mut u8, len: usize) -> Self {
        MemH(Handle::Bounds { owner, addr, len })
    }

    /// Start of the region.
    #[inline]
    pub fn address(&self) -> *mut u8 {
        match &self.0 {
            Handle::Region(r) => r.address(),
            Handle::Bounds { addr, .. } => *addr,
        }
    }

    /// Length of the region.
    #[inline]
    pub fn length(&self) -> usize {
        match &self.0 {
            Handle::Region(r) => r.length(),
            Handle::Bounds { len, .. } => *len,
        }
    }

    /// The region as the transport's type, if it is one (never for a [`bounds`](Self::bounds)
    /// handle).
    pub fn downcast_ref<T: MemRegion>(&self) -> Option<&T> {
        match &self.0 {
            Handle::Region(r) => r.as_any().downcast_ref::<T>(),
            Handle::Bounds { .. } => None,
        }
    }

    /// Start and length of a [`bounds`](Self::bounds) handle made by `owner`; `None` for any
    /// other handle.
    #[inline]
    pub fn bounds_of(&self, owner: &'static str) -> Option<(*mut u8, usize)> {
        match &self.0 {
            Handle::Bounds { owner: o, addr, len } if std::ptr::eq(*o, owner) || *o == owner => Some((*addr, *len)),
            _ => None,
        }
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

/// A packed remote key, as [`Md::mkey_pack`](crate::Md::mkey_pack) makes it and peers
/// unpack it: at most [`PackedKey::MAX`] bytes, kept inline so that packing a key and carrying
/// it in a protocol's state allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct PackedKey {
    len: u8,
    bytes: [u8; PackedKey::MAX],
}

impl PackedKey {
    /// The longest key any memory domain may pack.
    pub const MAX: usize = 64;

    /// An empty key.
    pub const fn new() -> Self {
        PackedKey { len: 0, bytes: [0; PackedKey::MAX] }
    }

    /// A copy of `bytes`; `InvalidParam` when they are longer than [`PackedKey::MAX`] (e.g.
    /// a corrupt length from a peer).
    pub fn from_slice(bytes: &[u8]) -> UcsResult<Self> {
        let mut k = PackedKey::new();
        k.push(bytes)?;
        Ok(k)
    }

    /// Appends `bytes`; `InvalidParam` (and the key unchanged) when the result would be longer
    /// than [`PackedKey::MAX`].
    #[inline]
    pub fn push(&mut self, bytes: &[u8]) -> UcsResult<()> {
        let at = self.len as usize;
        let end = at.checked_add(bytes.len()).filter(|&e| e <= PackedKey::MAX).ok_or_else(|| {
            tracing::debug!(len = at + bytes.len(), max = PackedKey::MAX, "packed remote key too long");
            Status::InvalidParam
        })?;
        self.bytes[at..end].copy_from_slice(bytes);
        self.len = end as u8;
        Ok(())
    }

    /// The packed bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len as usize]
    }
}

impl Default for PackedKey {
    fn default() -> Self {
        PackedKey::new()
    }
}

impl std::ops::Deref for PackedKey {
    type Target = [u8];
    #[inline]
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for PackedKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PackedKey(")?;
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
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
    /// How far from `base` both the region and the local mapping reach (0 without a mapping):
    /// the one bound [`RemoteKey::local_at`] checks.
    local_span: u64,
}

impl RemoteKey {
    /// Builds a key for `component`, covering `[base, base + length)` on the peer. `handle`
    /// keeps transport resources (e.g. a mapped segment) alive while the key exists.
    pub fn new(component: &'static str, rkey: u64, base: u64, length: u64, handle: Option<Box<dyn Any>>) -> Self {
        RemoteKey { component, rkey, base, length, handle, local: None, local_span: 0 }
    }

    /// Records where the region is mapped locally (`uct_rkey_ptr`), so operations reach it
    /// without looking into the handle.
    ///
    /// # Safety
    /// `len` bytes at `base` must stay mapped for as long as the key lives (e.g. because
    /// `handle` owns the mapping).
    pub unsafe fn with_local_mapping(mut self, base: std::ptr::NonNull<u8>, len: usize) -> Self {
        self.local = Some((base, len));
        self.local_span = self.length.min(len as u64);
        self
    }

    /// The local mapping recorded by [`RemoteKey::with_local_mapping`]: start and length.
    #[inline]
    pub fn local_mapping(&self) -> Option<(std::ptr::NonNull<u8>, usize)> {
        self.local
    }

    /// The local address of `[remote_addr, remote_addr + len)` when the key is `component`'s
    /// (the same static name), the range lies within both the key's region and its local
    /// mapping ([`RemoteKey::with_local_mapping`]); `None` otherwise, without saying why
    /// ([`RemoteKey::check`] does): the fast path of shared-memory transports.
    #[inline(always)]
    pub fn local_at(&self, component: &'static str, remote_addr: u64, len: usize) -> Option<*mut u8> {
        let (base, _) = self.local?;
        let off = remote_addr.wrapping_sub(self.base);
        // Components give their static name: its address identifies them (one load fewer
        // than comparing the `&str` with its length).
        let ok = std::ptr::eq(self.component.as_ptr(), component.as_ptr())
            && remote_addr >= self.base
            && (len as u64) <= self.local_span
            && off <= self.local_span - len as u64;
        ok.then(|| base.as_ptr().wrapping_add(off as usize))
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
    #[inline(always)]
    pub fn check(&self, component: &'static str, remote_addr: u64, len: usize) -> UcsResult<u64> {
        // Components pass their static name: pointer equality is the fast path.
        if !std::ptr::eq(self.component, component) && self.component != component {
            return self.wrong_component(component);
        }
        // `off + len <= length` without overflow: `len <= length && off <= length - len`.
        match remote_addr.checked_sub(self.base) {
            Some(off) if (len as u64) <= self.length && off <= self.length - len as u64 => Ok(off),
            _ => self.out_of_range(remote_addr, len),
        }
    }

    #[cold]
    #[inline(never)]
    fn wrong_component(&self, component: &'static str) -> UcsResult<u64> {
        tracing::debug!(key = self.component, transport = component, "remote key of another component");
        Err(Status::InvalidParam)
    }

    #[cold]
    #[inline(never)]
    fn out_of_range(&self, remote_addr: u64, len: usize) -> UcsResult<u64> {
        tracing::debug!(remote_addr, len, base = self.base, length = self.length, "remote access out of range");
        Err(Status::OutOfRange)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_at_stays_within_both_the_region_and_the_mapping() {
        // (Compared as the same static name, as components give theirs.)
        static POSIX: &str = "posix";
        let mut mem = [0u8; 64];
        let map = std::ptr::NonNull::new(mem.as_mut_ptr()).unwrap();
        let at = |k: &RemoteKey, addr: u64, len: usize| {
            k.local_at(POSIX, addr, len).map(|p| p as usize - map.as_ptr() as usize)
        };
        // A region of 48 bytes at 0x1000, mapped for 64: the region bounds it.
        // SAFETY: `mem` outlives the keys.
        let k = unsafe { RemoteKey::new(POSIX, 0, 0x1000, 48, None).with_local_mapping(map, 64) };
        assert_eq!(at(&k, 0x1000, 48), Some(0));
        assert_eq!(at(&k, 0x1008, 8), Some(8));
        assert_eq!(at(&k, 0x1028, 8), Some(0x28));
        assert_eq!(at(&k, 0x102c, 8), None, "past the region's end");
        assert_eq!(at(&k, 0x1000, 49), None);
        assert_eq!(at(&k, 0xff8, 8), None, "below the region");
        assert_eq!(at(&k, u64::MAX, 2), None);
        assert_eq!(at(&k, 0x1000, usize::MAX), None);
        assert_eq!(k.local_at("sysv", 0x1000, 8), None, "another component's key");
        // A region of 64 bytes mapped for 32: the mapping bounds it.
        // SAFETY: as above.
        let k = unsafe { RemoteKey::new(POSIX, 0, 0x1000, 64, None).with_local_mapping(map, 32) };
        assert_eq!(at(&k, 0x1018, 8), Some(0x18));
        assert_eq!(at(&k, 0x101c, 8), None, "past the mapping's end");
        // Without a mapping nothing is local.
        assert_eq!(RemoteKey::new(POSIX, 0, 0x1000, 64, None).local_at(POSIX, 0x1000, 8), None);
    }

    #[test]
    fn packed_key_holds_up_to_max_bytes() {
        let mut k = PackedKey::new();
        assert!(k.is_empty());
        k.push(&[1, 2, 3]).unwrap();
        k.push(&[4; PackedKey::MAX - 3]).unwrap();
        assert_eq!(k.len(), PackedKey::MAX);
        assert_eq!(&k[..4], &[1, 2, 3, 4]);
        // One byte more is refused and leaves the key as it was.
        assert_eq!(k.push(&[9]), Err(Status::InvalidParam));
        assert_eq!(k.len(), PackedKey::MAX);
        assert_eq!(PackedKey::from_slice(&[0; PackedKey::MAX + 1]), Err(Status::InvalidParam));
        let copy = PackedKey::from_slice(&k).unwrap();
        assert_eq!(copy, k);
        assert_eq!(format!("{:?}", PackedKey::from_slice(&[0xab, 1]).unwrap()), "PackedKey(ab01)");
    }

    struct Region(Box<[u8]>);

    impl MemRegion for Region {
        fn address(&self) -> *mut u8 {
            self.0.as_ptr().cast_mut()
        }
        fn length(&self) -> usize {
            self.0.len()
        }
        fn as_any(&self) -> &dyn Any {
            self
        }
    }

    #[test]
    fn bounds_handles_name_their_domain() {
        static OWNER: &str = "owner";
        let mut buf = [0u8; 64];
        let h = MemH::bounds(OWNER, buf.as_mut_ptr(), 64);
        assert_eq!((h.address(), h.length()), (buf.as_mut_ptr(), 64));
        assert_eq!(h.clone().bounds_of(OWNER), Some((buf.as_mut_ptr(), 64)));
        // Another domain's name, or a region handle, is not a bounds handle of `owner`.
        assert_eq!(h.bounds_of("other"), None);
        assert!(h.downcast_ref::<Region>().is_none());
        assert!(h.contains(buf[8..].as_ptr(), 56));
        assert!(!h.contains(buf[8..].as_ptr(), 57));
        let r = MemH::new(Region(vec![0; 16].into_boxed_slice()));
        assert_eq!(r.bounds_of(OWNER), None);
        assert_eq!(r.downcast_ref::<Region>().map(|x| x.0.len()), Some(16));
    }
}
