//! Local-memory access shared by the shared-memory transports: bounds-checked copies and CPU
//! atomics on memory a remote key has resolved to a local address.
//!
//! Callers pass the local address of the region start (`base`), the region length and the
//! offset the remote key check produced; everything here re-checks the range and alignment, so
//! a bad offset is an error status, never a stray write.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use ucs::{Status, UcsResult};
use uct::AtomicOp;

/// `std::ptr::copy` (memmove) with the sizes of small operations, 4 to 64 bytes, done inline:
/// every load before any store, so overlapping ranges come out as memmove leaves them. From
/// 1 KiB, distinct ranges go through `ucs::memory::copy` (clear of `rep movsb`'s slow
/// distances).
///
/// # Safety
/// As `std::ptr::copy`: `src` valid for reads and `dst` for writes of `len` bytes.
#[inline(always)]
pub(crate) unsafe fn move_bytes(src: *const u8, dst: *mut u8, len: usize) {
    // The ladder of `ucs::memory::copy`: one comparison for 8 to 16 bytes (the RMA word), two
    // for 17 to 64, without a call.
    if len > 16 {
        if len <= 64 {
            // SAFETY: the caller's contract; `move_small` loads everything before it stores.
            unsafe { ucs::memory::move_small(src, dst, len) }
        } else if len >= 1024
            && ((src as usize).wrapping_add(len) <= dst as usize || (dst as usize).wrapping_add(len) <= src as usize)
        {
            // Distinct ranges (the common case): the copy that keeps clear of `rep movsb`'s
            // slow distances (`ucs::memory`).
            // SAFETY: the caller's contract, and the ranges do not overlap (checked).
            unsafe { ucs::memory::copy(src, dst, len) }
        } else {
            // SAFETY: the caller's contract.
            unsafe { std::ptr::copy(src, dst, len) }
        }
    } else if len >= 8 {
        // SAFETY: the accesses are the first and last 8 bytes of the `len`-byte ranges the
        // caller vouches for, unaligned; both loads come before the stores.
        unsafe {
            let a = src.cast::<u64>().read_unaligned();
            let b = src.add(len - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(a);
            dst.add(len - 8).cast::<u64>().write_unaligned(b);
        }
    } else if len >= 4 {
        // SAFETY: the first and last 4 bytes of the ranges, as above.
        unsafe {
            let a = src.cast::<u32>().read_unaligned();
            let b = src.add(len - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(a);
            dst.add(len - 4).cast::<u32>().write_unaligned(b);
        }
    } else {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy(src, dst, len) }
    }
}

/// The 64-bit atomic at `p` (an address `sm_direct` returned), if aligned.
///
/// # Safety
/// `p`, when given, must be valid for 8 bytes for `'a`, and accessed only atomically.
#[inline(always)]
pub(crate) unsafe fn aligned64<'a>(p: Option<*mut u8>) -> Option<&'a AtomicU64> {
    let p = p.filter(|p| (*p as usize) % 8 == 0)?;
    // SAFETY: aligned (checked), valid (the caller's promise).
    Some(unsafe { AtomicU64::from_ptr(p.cast()) })
}

/// The 32-bit atomic at `p`, as [`aligned64`].
///
/// # Safety
/// As [`aligned64`], for 4 bytes.
#[inline(always)]
pub(crate) unsafe fn aligned32<'a>(p: Option<*mut u8>) -> Option<&'a AtomicU32> {
    let p = p.filter(|p| (*p as usize) % 4 == 0)?;
    // SAFETY: as in `aligned64`.
    Some(unsafe { AtomicU32::from_ptr(p.cast()) })
}

/// Runs `f` out of line: the slow path of an operation whose fast path is inline, so the fast
/// one does not pay for the registers and stack of the slow one.
#[cold]
#[inline(never)]
pub(crate) fn cold<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// A region of memory the transport may access: `len` bytes at `base`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct LocalRegion {
    pub base: *mut u8,
    pub len: usize,
}

impl LocalRegion {
    /// The address of `[off, off + len)`, or `OutOfRange`.
    #[inline]
    fn at(&self, off: u64, len: usize) -> UcsResult<*mut u8> {
        let off = usize::try_from(off).map_err(|_| Status::OutOfRange)?;
        match off.checked_add(len) {
            Some(end) if end <= self.len => Ok(self.base.wrapping_add(off)),
            _ => Err(Status::OutOfRange),
        }
    }

    /// Copies `data` into the region at `off`.
    ///
    /// # Safety
    /// The region must be valid for writes for its whole length for the duration of the call.
    #[inline]
    pub unsafe fn write(&self, off: u64, data: &[u8]) -> UcsResult<()> {
        let dst = self.at(off, data.len())?;
        // SAFETY: `at` checked that [dst, dst + len) lies inside the region, which the caller
        // guarantees is valid; `data` is a distinct Rust slice, so the ranges cannot overlap
        // unless the user registered memory they also borrow, which `mem_reg` forbids.
        unsafe { move_bytes(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Copies `len` bytes of the region at `off` to `dst`.
    ///
    /// # Safety
    /// The region must be valid for reads, and `dst` valid for `len` bytes of writes.
    #[inline]
    pub unsafe fn read(&self, off: u64, dst: *mut u8, len: usize) -> UcsResult<()> {
        let src = self.at(off, len)?;
        // SAFETY: source range checked above; the caller vouches for `dst`. `copy` tolerates
        // overlap (a get into the same registered buffer).
        unsafe { move_bytes(src, dst, len) };
        Ok(())
    }

    /// The 64-bit atomic at `off` (which must be 8-byte aligned).
    ///
    /// # Safety
    /// The region must be valid, and the word accessed only atomically while in use.
    #[inline]
    pub unsafe fn atomic64<'a>(&self, off: u64) -> UcsResult<&'a AtomicU64> {
        let p = self.at(off, 8)?;
        if (p as usize) % 8 != 0 {
            return Err(Status::InvalidParam);
        }
        // SAFETY: in bounds and aligned (checked); atomic-only access is the caller's obligation.
        Ok(unsafe { AtomicU64::from_ptr(p.cast()) })
    }

    /// The 32-bit atomic at `off` (which must be 4-byte aligned).
    ///
    /// # Safety
    /// As [`LocalRegion::atomic64`].
    #[inline]
    pub unsafe fn atomic32<'a>(&self, off: u64) -> UcsResult<&'a AtomicU32> {
        let p = self.at(off, 4)?;
        if (p as usize) % 4 != 0 {
            return Err(Status::InvalidParam);
        }
        // SAFETY: in bounds and aligned (checked); atomic-only access is the caller's obligation.
        Ok(unsafe { AtomicU32::from_ptr(p.cast()) })
    }
}

/// An interface id unique within this process (and unlikely to repeat across processes or
/// runs): names `self` interfaces and the wakeup sockets of `mm` interfaces.
pub(crate) fn unique_iface_id() -> u64 {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    ((std::process::id() as u64) << 32) ^ n ^ ucs::time::now().rotate_left(17)
}

/// Applies `op` to a 64-bit word, returning the old value.
#[inline]
pub(crate) fn atomic_op64(a: &AtomicU64, op: AtomicOp, value: u64) -> u64 {
    let o = Ordering::SeqCst;
    match op {
        AtomicOp::Add => a.fetch_add(value, o),
        AtomicOp::And => a.fetch_and(value, o),
        AtomicOp::Or => a.fetch_or(value, o),
        AtomicOp::Xor => a.fetch_xor(value, o),
        AtomicOp::Swap | AtomicOp::Cswap => a.swap(value, o),
    }
}

/// Applies `op` to a 32-bit word, returning the old value.
#[inline]
pub(crate) fn atomic_op32(a: &AtomicU32, op: AtomicOp, value: u32) -> u32 {
    let o = Ordering::SeqCst;
    match op {
        AtomicOp::Add => a.fetch_add(value, o),
        AtomicOp::And => a.fetch_and(value, o),
        AtomicOp::Or => a.fetch_or(value, o),
        AtomicOp::Xor => a.fetch_xor(value, o),
        AtomicOp::Swap | AtomicOp::Cswap => a.swap(value, o),
    }
}

/// Compare-and-swap returning the old value.
#[inline]
pub(crate) fn cswap64(a: &AtomicU64, compare: u64, swap: u64) -> u64 {
    match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(v) | Err(v) => v,
    }
}

/// Compare-and-swap returning the old value.
#[inline]
pub(crate) fn cswap32(a: &AtomicU32, compare: u32, swap: u32) -> u32 {
    match a.compare_exchange(compare, swap, Ordering::SeqCst, Ordering::SeqCst) {
        Ok(v) | Err(v) => v,
    }
}

/// The put/get short, get bcopy and CPU atomic operations of the shared-memory transports,
/// written once. Expands inside `impl Ep for T`, where `T` has
/// `fn sm_access<R>(&self, rkey, addr, len, f: impl FnOnce(LocalRegion, u64) -> UcsResult<R>) -> OpResult<R>`
/// (ordering and failure checks, the key check, and a region valid while `f` runs: `f` gets the
/// region and the offset of `addr` in it), `fn sm_direct(&self, rkey, addr, len) -> Option<*mut u8>`
/// (the same checks, passed, as the address of the range in a mapping valid while the key
/// lives; `None` for anything else, which `sm_access` then handles with its statuses) and
/// `fn sm_seg_size(&self) -> usize`.
macro_rules! impl_sm_rma {
    () => {
        #[inline]
        fn put_short(&self, data: &[u8], remote_addr: u64, rkey: &uct::RemoteKey) -> ucs::OpResult {
            if let Some(dst) = self.sm_direct(rkey, remote_addr, data.len()) {
                // SAFETY: `sm_direct` returned `len` bytes inside a mapping the key keeps.
                unsafe { crate::sm::move_bytes(data.as_ptr(), dst, data.len()) };
                return Ok(ucs::Outcome::Done(()));
            }
            crate::sm::cold(move || {
                self.sm_access(rkey, remote_addr, data.len(), |r, off| {
                    // SAFETY: `sm_access` keeps the region valid while the closure runs;
                    // `write` checks bounds.
                    unsafe { r.write(off, data) }
                })
            })
        }

        #[inline]
        fn get_short(&self, buffer: &mut [u8], remote_addr: u64, rkey: &uct::RemoteKey) -> ucs::OpResult {
            let len = buffer.len();
            if let Some(src) = self.sm_direct(rkey, remote_addr, len) {
                // SAFETY: as in `put_short`; `buffer` is an exclusive slice of `len` bytes.
                unsafe { crate::sm::move_bytes(src, buffer.as_mut_ptr(), len) };
                return Ok(ucs::Outcome::Done(()));
            }
            crate::sm::cold(move || {
                // SAFETY: region valid (as above); `buffer` is an exclusive slice of `len` bytes.
                self.sm_access(rkey, remote_addr, len, |r, off| unsafe { r.read(off, buffer.as_mut_ptr(), len) })
            })
        }

        unsafe fn get_bcopy(
            &self,
            buffer: *mut u8,
            length: usize,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
            _comp: Option<&std::rc::Rc<uct::Completion>>,
        ) -> ucs::OpResult {
            uct::check_length(length, self.sm_seg_size(), "get_bcopy")?;
            // SAFETY: region valid (as above); the caller vouches for `buffer`.
            self.sm_access(rkey, remote_addr, length, |r, off| unsafe { r.read(off, buffer, length) })
        }

        fn atomic32_post(
            &self,
            op: uct::AtomicOp,
            value: u32,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
        ) -> ucs::OpResult {
            if matches!(op, uct::AtomicOp::Swap | uct::AtomicOp::Cswap) {
                return Err(ucs::Status::Unsupported);
            }
            // SAFETY: `sm_direct` returns an address inside a mapping the key keeps; the
            // location is only accessed atomically.
            if let Some(a) = unsafe { $crate::sm::aligned32(self.sm_direct(rkey, remote_addr, 4)) } {
                $crate::sm::atomic_op32(a, op, value);
                return Ok(ucs::Outcome::Done(()));
            }
            $crate::sm::cold(move || {
                self.sm_access(rkey, remote_addr, 4, |r, off| {
                    // SAFETY: region valid (as above); `atomic32` checks bounds and alignment.
                    unsafe { r.atomic32(off) }.map(|a| {
                        $crate::sm::atomic_op32(a, op, value);
                    })
                })
            })
        }

        fn atomic64_post(
            &self,
            op: uct::AtomicOp,
            value: u64,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
        ) -> ucs::OpResult {
            if matches!(op, uct::AtomicOp::Swap | uct::AtomicOp::Cswap) {
                return Err(ucs::Status::Unsupported);
            }
            // SAFETY: `sm_direct` returns an address inside a mapping the key keeps; the
            // location is only accessed atomically.
            if let Some(a) = unsafe { $crate::sm::aligned64(self.sm_direct(rkey, remote_addr, 8)) } {
                $crate::sm::atomic_op64(a, op, value);
                return Ok(ucs::Outcome::Done(()));
            }
            $crate::sm::cold(move || {
                self.sm_access(rkey, remote_addr, 8, |r, off| {
                    // SAFETY: region valid (as above); `atomic64` checks bounds and alignment.
                    unsafe { r.atomic64(off) }.map(|a| {
                        $crate::sm::atomic_op64(a, op, value);
                    })
                })
            })
        }

        unsafe fn atomic32_fetch(
            &self,
            op: uct::AtomicOp,
            value: u32,
            result: *mut u32,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
            _comp: Option<&std::rc::Rc<uct::Completion>>,
        ) -> ucs::OpResult {
            if op == uct::AtomicOp::Cswap {
                return Err(ucs::Status::Unsupported);
            }
            // SAFETY: `sm_direct` returns an address inside a mapping the key keeps; the
            // location is only accessed atomically.
            if let Some(a) = unsafe { $crate::sm::aligned32(self.sm_direct(rkey, remote_addr, 4)) } {
                let old = $crate::sm::atomic_op32(a, op, value);
                // SAFETY: the caller vouches for `result`.
                unsafe { result.write(old) };
                return Ok(ucs::Outcome::Done(()));
            }
            $crate::sm::cold(move || {
                // SAFETY: region valid; checked by `atomic32`; the caller vouches for `result`.
                self.sm_access(rkey, remote_addr, 4, |r, off| unsafe {
                    r.atomic32(off).map(|a| result.write($crate::sm::atomic_op32(a, op, value)))
                })
            })
        }

        unsafe fn atomic64_fetch(
            &self,
            op: uct::AtomicOp,
            value: u64,
            result: *mut u64,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
            _comp: Option<&std::rc::Rc<uct::Completion>>,
        ) -> ucs::OpResult {
            if op == uct::AtomicOp::Cswap {
                return Err(ucs::Status::Unsupported);
            }
            // SAFETY: `sm_direct` returns an address inside a mapping the key keeps; the
            // location is only accessed atomically.
            if let Some(a) = unsafe { $crate::sm::aligned64(self.sm_direct(rkey, remote_addr, 8)) } {
                let old = $crate::sm::atomic_op64(a, op, value);
                // SAFETY: the caller vouches for `result`.
                unsafe { result.write(old) };
                return Ok(ucs::Outcome::Done(()));
            }
            $crate::sm::cold(move || {
                // SAFETY: region valid; checked by `atomic64`; the caller vouches for `result`.
                self.sm_access(rkey, remote_addr, 8, |r, off| unsafe {
                    r.atomic64(off).map(|a| result.write($crate::sm::atomic_op64(a, op, value)))
                })
            })
        }

        unsafe fn atomic_cswap32(
            &self,
            compare: u32,
            swap: u32,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
            result: *mut u32,
            _comp: Option<&std::rc::Rc<uct::Completion>>,
        ) -> ucs::OpResult {
            // SAFETY: `sm_direct` returns an address inside a mapping the key keeps; the
            // location is only accessed atomically.
            if let Some(a) = unsafe { $crate::sm::aligned32(self.sm_direct(rkey, remote_addr, 4)) } {
                let old = $crate::sm::cswap32(a, compare, swap);
                // SAFETY: the caller vouches for `result`.
                unsafe { result.write(old) };
                return Ok(ucs::Outcome::Done(()));
            }
            $crate::sm::cold(move || {
                // SAFETY: region valid; checked by `atomic32`; the caller vouches for `result`.
                self.sm_access(rkey, remote_addr, 4, |r, off| unsafe {
                    r.atomic32(off).map(|a| result.write($crate::sm::cswap32(a, compare, swap)))
                })
            })
        }

        unsafe fn atomic_cswap64(
            &self,
            compare: u64,
            swap: u64,
            remote_addr: u64,
            rkey: &uct::RemoteKey,
            result: *mut u64,
            _comp: Option<&std::rc::Rc<uct::Completion>>,
        ) -> ucs::OpResult {
            // SAFETY: `sm_direct` returns an address inside a mapping the key keeps; the
            // location is only accessed atomically.
            if let Some(a) = unsafe { $crate::sm::aligned64(self.sm_direct(rkey, remote_addr, 8)) } {
                let old = $crate::sm::cswap64(a, compare, swap);
                // SAFETY: the caller vouches for `result`.
                unsafe { result.write(old) };
                return Ok(ucs::Outcome::Done(()));
            }
            $crate::sm::cold(move || {
                // SAFETY: region valid; checked by `atomic64`; the caller vouches for `result`.
                self.sm_access(rkey, remote_addr, 8, |r, off| unsafe {
                    r.atomic64(off).map(|a| result.write($crate::sm::cswap64(a, compare, swap)))
                })
            })
        }
    };
}

pub(crate) use impl_sm_rma;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_and_alignment() {
        let mut buf = [0u64; 4];
        let r = LocalRegion { base: buf.as_mut_ptr().cast(), len: 32 };
        // SAFETY: `buf` outlives every access below and is only touched through `r`.
        unsafe {
            assert_eq!(r.write(30, &[1, 2, 3]), Err(Status::OutOfRange));
            assert_eq!(r.write(u64::MAX, &[1]), Err(Status::OutOfRange));
            r.write(8, &5u64.to_ne_bytes()).unwrap();
            assert_eq!(atomic_op64(r.atomic64(8).unwrap(), AtomicOp::Add, 2), 5);
            assert_eq!(r.atomic64(4).err(), Some(Status::InvalidParam));
            assert_eq!(r.atomic64(32).err(), Some(Status::OutOfRange));
            assert_eq!(cswap32(r.atomic32(8).unwrap(), 7, 1), 7);
        }
        assert_eq!(buf[1], 1);
    }

    #[test]
    fn copies_of_every_small_size_match_memmove_also_overlapping() {
        for len in 0..=24usize {
            for (src_at, dst_at) in [(0usize, 40usize), (3, 45), (0, 5), (5, 0), (2, 2)] {
                let mut a: Vec<u8> = (0..80u8).collect();
                let mut b = a.clone();
                // SAFETY: both ranges lie inside the 80-byte vectors (at most 45 + 24 bytes).
                unsafe {
                    move_bytes(a.as_ptr().add(src_at), a.as_mut_ptr().add(dst_at), len);
                    std::ptr::copy(b.as_ptr().add(src_at), b.as_mut_ptr().add(dst_at), len);
                }
                assert_eq!(a, b, "len {len}, from {src_at} to {dst_at}");
            }
        }
    }
}
