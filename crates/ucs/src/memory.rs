//! Byte copies tuned for the small sizes of eager messages.
//!
//! `ptr::copy_nonoverlapping` with a run-time length becomes a call to the C library's `memcpy`,
//! whose dispatch costs more than the copy itself for a few bytes. [`copy`] moves up to 16 bytes
//! with at most two (possibly overlapping) loads and stores per width, and calls `memcpy` above.

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
            std::ptr::copy_nonoverlapping(src, dst, n);
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

#[cfg(test)]
mod tests {
    #[test]
    fn every_small_length_and_offset() {
        let src: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37).wrapping_add(1)).collect();
        for n in 0..=40 {
            for off in 0..8 {
                let mut dst = vec![0xeeu8; 64];
                // SAFETY: both buffers hold `off + n + 8 <= 64` bytes; distinct allocations.
                unsafe { super::copy(src.as_ptr().add(off), dst.as_mut_ptr().add(off), n) };
                assert_eq!(&dst[off..off + n], &src[off..off + n], "n {n} off {off}");
                assert!(dst[..off].iter().all(|&b| b == 0xee), "n {n} off {off}: wrote before");
                assert!(dst[off + n..].iter().all(|&b| b == 0xee), "n {n} off {off}: wrote after");
            }
        }
    }
}
