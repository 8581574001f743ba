//! Byte copies tuned for the small sizes of eager messages, and safe from a slow path of
//! large ones.
//!
//! `ptr::copy_nonoverlapping` with a run-time length becomes a call to the C library's `memcpy`,
//! whose dispatch costs more than the copy itself for a few bytes. [`copy`] moves up to 16 bytes
//! with at most two (possibly overlapping) loads and stores per width, and calls `memcpy` above.
//!
//! One exception above: on x86-64 `memcpy` moves kilobytes with `rep movsb`, which this
//! machine's CPUs (AMD EPYC) run twenty times slower when the destination starts 1 to 31 bytes
//! after the source modulo 4 KiB (1.5-2.2 GB/s instead of 35-45 GB/s for 8 KiB,
//! `tools/bench/movsb-alias.c`): the CPU takes the pair for possibly overlapping. Such pairs
//! are common here - a FIFO descriptor's payload sits a header's length past a page-aligned
//! user buffer's offset - so [`copy`] moves them with vector loads and stores instead
//! ([`copy_aliased`]).

/// Copies `n` bytes from `src` to `dst`.
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes, and the two ranges must not
/// overlap (as for [`std::ptr::copy_nonoverlapping`]).
#[inline(always)]
pub unsafe fn copy(src: *const u8, dst: *mut u8, n: usize) {
    // SAFETY: each access lies within the first `n` bytes of its range
    // (offsets `0` and `n - w` for a width `w <= n`); unaligned accesses are used throughout.
    unsafe {
        if n > 16 {
            if n <= 64 {
                move_small(src, dst, n);
            } else if n >= ALIAS_MIN && aliased(src, dst) {
                copy_aliased(src, dst, n);
            } else {
                std::ptr::copy_nonoverlapping(src, dst, n);
            }
        } else if n >= 8 {
            let a = src.cast::<u64>().read_unaligned();
            let b = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(a);
            dst.add(n - 8).cast::<u64>().write_unaligned(b);
        } else if n >= 4 {
            let a = src.cast::<u32>().read_unaligned();
            let b = src.add(n - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(a);
            dst.add(n - 4).cast::<u32>().write_unaligned(b);
        } else if n > 0 {
            // 1 to 3 bytes: first, middle and last (some the same byte).
            let (a, m, z) = (src.read(), src.add(n / 2).read(), src.add(n - 1).read());
            dst.write(a);
            dst.add(n / 2).write(m);
            dst.add(n - 1).write(z);
        }
    }
}

/// Moves 17 to 64 bytes with 16-byte loads and stores (the first and last 16 or 32 bytes,
/// overlapping in the middle), every load before any store: no call into the C library,
/// whose `memcpy` dispatch costs about as much as the copy at these sizes; and correct for
/// overlapping ranges too (`memmove` semantics). [`copy`]'s path for those sizes.
///
/// # Safety
/// `src` valid for reads and `dst` for writes of `n` bytes, `17 <= n <= 64`.
#[inline(always)]
pub unsafe fn move_small(src: *const u8, dst: *mut u8, n: usize) {
    debug_assert!((17..=64).contains(&n));
    // SAFETY: every access is 16 bytes at offset 0, 16, n - 32 or n - 16 (the latter two only
    // when n > 32, so n - 32 >= 1), all within the `n` bytes of each range; unaligned.
    unsafe {
        type V = [u8; 16];
        let a = src.cast::<V>().read_unaligned();
        let z = src.add(n - 16).cast::<V>().read_unaligned();
        if n > 32 {
            let b = src.add(16).cast::<V>().read_unaligned();
            let y = src.add(n - 32).cast::<V>().read_unaligned();
            dst.cast::<V>().write_unaligned(a);
            dst.add(16).cast::<V>().write_unaligned(b);
            dst.add(n - 32).cast::<V>().write_unaligned(y);
            dst.add(n - 16).cast::<V>().write_unaligned(z);
        } else {
            dst.cast::<V>().write_unaligned(a);
            dst.add(n - 16).cast::<V>().write_unaligned(z);
        }
    }
}

/// The smallest copy the C library moves with `rep movsb` is larger than this (2 KiB copies
/// ran at full speed at every offset).
const ALIAS_MIN: usize = 1024;

/// Whether `dst` starts 1 to 63 bytes after `src` modulo 4 KiB: the pairs `rep movsb` runs
/// slowly (1 to 31 bytes measured twenty times slower; up to 63 kept out with a margin).
#[inline(always)]
fn aliased(src: *const u8, dst: *mut u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    d != 0 && d < 64
}

/// Copies `n >= 64` bytes with 16-byte vector loads and stores, 64 bytes per step (the last
/// step overlaps the one before), never `rep movsb`.
///
/// # Safety
/// As [`copy`], and `n >= 64`.
#[inline(never)]
pub unsafe fn copy_aliased(src: *const u8, dst: *mut u8, n: usize) {
    debug_assert!(n >= 64);
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_storeu_si128};
        /// Copies the 64 bytes at `s` to `d`.
        ///
        /// # Safety
        /// Both ranges valid (for reads, for writes) for 64 bytes.
        #[inline(always)]
        unsafe fn step(s: *const u8, d: *mut u8) {
            // SAFETY: the caller's: 64 readable bytes at `s`, 64 writable at `d`; unaligned
            // loads and stores (SSE2, part of x86-64).
            unsafe {
                let a = _mm_loadu_si128(s.cast::<__m128i>());
                let b = _mm_loadu_si128(s.add(16).cast::<__m128i>());
                let c = _mm_loadu_si128(s.add(32).cast::<__m128i>());
                let e = _mm_loadu_si128(s.add(48).cast::<__m128i>());
                _mm_storeu_si128(d.cast::<__m128i>(), a);
                _mm_storeu_si128(d.add(16).cast::<__m128i>(), b);
                _mm_storeu_si128(d.add(32).cast::<__m128i>(), c);
                _mm_storeu_si128(d.add(48).cast::<__m128i>(), e);
            }
        }
        let mut i = 0;
        while i + 64 <= n {
            // SAFETY: `i + 64 <= n`: within both ranges (the caller's promise).
            unsafe { step(src.add(i), dst.add(i)) };
            i += 64;
        }
        if i < n {
            // SAFETY: `n >= 64`: the last 64 bytes of both ranges; the ranges do not overlap,
            // so copying some bytes twice writes the same values.
            unsafe { step(src.add(n - 64), dst.add(n - 64)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: forwarded from the caller.
    unsafe {
        std::ptr::copy_nonoverlapping(src, dst, n)
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_small_length_and_offset() {
        let src: Vec<u8> = (0..96u8).map(|i| i.wrapping_mul(37).wrapping_add(1)).collect();
        for n in 0..=80 {
            for off in 0..8 {
                let mut dst = vec![0xeeu8; 96];
                // SAFETY: both buffers hold `off + n + 8 <= 96` bytes; distinct allocations.
                unsafe { super::copy(src.as_ptr().add(off), dst.as_mut_ptr().add(off), n) };
                assert_eq!(&dst[off..off + n], &src[off..off + n], "n {n} off {off}");
                assert!(dst[..off].iter().all(|&b| b == 0xee), "n {n} off {off}: wrote before");
                assert!(dst[off + n..].iter().all(|&b| b == 0xee), "n {n} off {off}: wrote after");
            }
        }
    }

    #[test]
    fn aliased_pairs_copy_exactly() {
        let src: Vec<u8> = (0..12_000u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in [64, 65, 127, 1024, 1500, 8240] {
            for delta in [1usize, 8, 24, 63] {
                let mut dst = vec![0xeeu8; 13_000];
                // Destination `delta` bytes after the source modulo 4 KiB.
                let so = 100;
                let base = (src.as_ptr() as usize + so + delta) % 4096;
                let doff = (base + 4096 - dst.as_ptr() as usize % 4096) % 4096;
                assert!(super::aliased(src[so..].as_ptr(), dst[doff..].as_mut_ptr()));
                // SAFETY: `doff < 4096` and `n <= 8240`: within both vectors.
                unsafe { super::copy(src.as_ptr().add(so), dst.as_mut_ptr().add(doff), n) };
                assert_eq!(&dst[doff..doff + n], &src[so..so + n], "n {n} delta {delta}");
                assert!(dst[..doff].iter().all(|&b| b == 0xee) && dst[doff + n..].iter().all(|&b| b == 0xee));
            }
        }
    }

    #[test]
    fn small_moves_handle_overlap() {
        for n in 17..=64 {
            for shift in [1usize, 7, 16, 33] {
                let orig: Vec<u8> = (0..160u8).collect();
                let mut a = orig.clone();
                // Forward and backward overlapping moves, as memmove.
                // SAFETY: both ranges lie within `a` (`shift + n <= 97 < 160`).
                unsafe { super::move_small(a.as_ptr(), a.as_mut_ptr().add(shift), n) };
                assert_eq!(&a[shift..shift + n], &orig[..n], "n {n} shift {shift} forward");
                let mut b = orig.clone();
                // SAFETY: as above.
                unsafe { super::move_small(b.as_ptr().add(shift), b.as_mut_ptr(), n) };
                assert_eq!(&b[..n], &orig[shift..shift + n], "n {n} shift {shift} backward");
            }
        }
    }
}
