//! The event descriptor of a `ud_verbs` interface: an epoll set holding the completion
//! channel and a one-shot timer.
//!
//! UD reliability needs time to pass, not only completions: a packet that is never
//! acknowledged must be resent, and a dead peer must be noticed, even by a process that sleeps
//! on [`Iface::event_fd`](uct::Iface::event_fd). UCX drives these timers from an async thread;
//! here they run from progress, and `event_arm` sets the timer to the reliability core's next
//! deadline, so a sleeping process wakes up exactly when a resend (or the peer timeout) is due.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ucs::async_::{EventSet, Events};
use ucs::{Status, UcsResult};

use crate::verbs::{last_os_error, verbs_error};

/// Token of the completion channel in the set.
const TOKEN_CHANNEL: u64 = 1;
/// Token of the timer in the set.
const TOKEN_TIMER: u64 = 2;

/// An epoll set over the completion channel and a one-shot `CLOCK_MONOTONIC` timer.
pub(crate) struct Wakeup {
    set: EventSet,
    timer: OwnedFd,
}

impl Wakeup {
    /// A set watching `channel_fd` (the completion channel) and a fresh, disarmed timer.
    pub(crate) fn new(channel_fd: RawFd) -> UcsResult<Wakeup> {
        // SAFETY: no pointer arguments; the result is checked before use.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(verbs_error("timerfd_create", last_os_error()));
        }
        // SAFETY: `fd` was just returned by timerfd_create and nothing else owns it.
        let timer = unsafe { OwnedFd::from_raw_fd(fd) };
        let set = EventSet::new()?;
        set.add(channel_fd, Events::READ, TOKEN_CHANNEL)?;
        set.add(timer.as_raw_fd(), Events::READ, TOKEN_TIMER)?;
        Ok(Wakeup { set, timer })
    }

    /// The descriptor users wait on: readable when a CQ event arrived or the timer expired.
    pub(crate) fn fd(&self) -> RawFd {
        self.set.as_raw_fd()
    }

    /// Makes the timer expire at `deadline` (nanoseconds of `CLOCK_MONOTONIC`, the clock of
    /// [`ucs::time::now`]); `None` disarms it. A deadline in the past expires at once.
    pub(crate) fn set_timer(&self, deadline: Option<u64>) -> UcsResult<()> {
        let ts = |ns: u64| libc::timespec {
            tv_sec: (ns / 1_000_000_000).min(i64::MAX as u64) as libc::time_t,
            tv_nsec: (ns % 1_000_000_000) as libc::c_long,
        };
        // A zero it_value disarms; an absolute deadline of 0 would too, so use 1 ns.
        let value = deadline.map_or(ts(0), |d| ts(d.max(1)));
        let spec = libc::itimerspec { it_interval: ts(0), it_value: value };
        // SAFETY: `spec` is a valid itimerspec for the call; the old value is not requested.
        let r = unsafe {
            libc::timerfd_settime(self.timer.as_raw_fd(), libc::TFD_TIMER_ABSTIME, &spec, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(verbs_error("timerfd_settime", last_os_error()));
        }
        Ok(())
    }

    /// Reads the timer's expiry count (0 when it has not expired), which also makes it
    /// unreadable again.
    pub(crate) fn drain_timer(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live, writable u64, as timerfd requires; the descriptor
        // is non-blocking, so an unexpired timer gives EAGAIN (-1), treated as 0.
        let r = unsafe { libc::read(self.timer.as_raw_fd(), (&mut v as *mut u64).cast(), std::mem::size_of::<u64>()) };
        if r == std::mem::size_of::<u64>() as isize {
            v
        } else {
            0
        }
    }

    /// Waits up to `timeout` for the descriptor to become readable (tests and examples);
    /// true when it did.
    pub(crate) fn wait(&self, timeout: Option<std::time::Duration>) -> UcsResult<bool> {
        let mut any = false;
        self.set.wait(timeout, |_, _| any = true).map_err(|e| {
            tracing::error!("ud_verbs: waiting for events failed: {e}");
            Status::IoError
        })?;
        Ok(any)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn timer_wakes_the_set_at_its_deadline() {
        // Any readable descriptor stands in for the completion channel: an idle pipe end.
        let mut p = [0i32; 2];
        // SAFETY: `p` is a valid two-element array for pipe2 to fill.
        assert_eq!(unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: both descriptors were just created and are owned here.
        let (r, _w) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let w = Wakeup::new(r.as_raw_fd()).unwrap();
        assert!(!w.wait(Some(Duration::ZERO)).unwrap(), "nothing armed: not readable");
        w.set_timer(Some(ucs::time::now() + 20_000_000)).unwrap();
        assert!(!w.wait(Some(Duration::ZERO)).unwrap(), "not yet");
        let start = std::time::Instant::now();
        assert!(w.wait(Some(Duration::from_secs(5))).unwrap());
        assert!(start.elapsed() >= Duration::from_millis(15), "woke early: {:?}", start.elapsed());
        assert_eq!(w.drain_timer(), 1);
        assert!(!w.wait(Some(Duration::ZERO)).unwrap(), "drained");
        w.set_timer(Some(1)).unwrap();
        assert!(w.wait(Some(Duration::from_secs(5))).unwrap(), "a past deadline expires at once");
        w.drain_timer();
        w.set_timer(Some(ucs::time::now() + 10_000_000)).unwrap();
        w.set_timer(None).unwrap();
        assert!(!w.wait(Some(Duration::from_millis(30))).unwrap(), "disarmed");
    }
}
