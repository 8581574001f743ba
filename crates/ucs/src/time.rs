//! A fast monotonic clock.
//!
//! UCX reads the CPU cycle counter; here the clock is `CLOCK_MONOTONIC` through the vDSO, which
//! costs about 20 ns and never goes backwards. Time values are nanoseconds in a `u64`, cheap to
//! compare and store in timer queues.

use std::time::Duration;

/// A point on the monotonic clock, in nanoseconds since an arbitrary origin.
pub type Time = u64;

/// Nanoseconds since an arbitrary, fixed origin (`CLOCK_MONOTONIC`).
#[inline]
pub fn now() -> Time {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_MONOTONIC is always supported on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Converts a duration to clock units, saturating.
#[inline]
pub fn from_duration(d: Duration) -> Time {
    d.as_nanos().min(u64::MAX as u128) as u64
}

/// Converts clock units to a duration.
#[inline]
pub fn to_duration(t: Time) -> Duration {
    Duration::from_nanos(t)
}

/// Converts clock units to seconds.
#[inline]
pub fn to_sec(t: Time) -> f64 {
    t as f64 * 1e-9
}

/// Converts seconds to clock units (negative values give 0).
#[inline]
pub fn from_sec(s: f64) -> Time {
    if s <= 0.0 {
        0
    } else {
        (s * 1e9) as Time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic() {
        let a = now();
        let b = now();
        assert!(b >= a);
        assert_eq!(from_duration(Duration::from_millis(10)), 10_000_000);
        assert_eq!(to_duration(1_500), Duration::from_nanos(1_500));
        assert_eq!(from_sec(1.5), 1_500_000_000);
        assert!((to_sec(2_000_000_000) - 2.0).abs() < 1e-12);
    }
}

/// The CPU's timestamp counter where it is usable (x86_64, invariant TSC assumed as UCX does),
/// else [`now`]. Units are cycles; convert with [`cycles_per_sec`]. About 10 ns to read.
#[inline]
pub fn cycles() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC is available on every x86_64 CPU and has no memory effects.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        now()
    }
}

/// How many [`cycles`] make a second, measured once against the monotonic clock (about 10 ms).
pub fn cycles_per_sec() -> f64 {
    static RATE: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *RATE.get_or_init(|| {
        if cfg!(not(target_arch = "x86_64")) {
            return 1e9;
        }
        let (t0, c0) = (now(), cycles());
        while now() - t0 < 10_000_000 {
            std::hint::spin_loop();
        }
        let (t1, c1) = (now(), cycles());
        let rate = (c1.wrapping_sub(c0)) as f64 / ((t1 - t0) as f64 * 1e-9);
        if rate.is_finite() && rate > 1e6 {
            rate
        } else {
            1e9
        }
    })
}

#[cfg(test)]
mod cycle_tests {
    use super::*;

    #[test]
    fn cycles_advance_and_calibrate() {
        let rate = cycles_per_sec();
        assert!(rate > 1e6, "rate {rate}");
        let (c0, t0) = (cycles(), now());
        while now() - t0 < 2_000_000 {}
        let secs = cycles().wrapping_sub(c0) as f64 / rate;
        assert!(secs > 0.001 && secs < 1.0, "2 ms measured as {secs} s");
    }
}
