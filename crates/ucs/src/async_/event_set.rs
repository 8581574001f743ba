//! epoll event set and eventfd (UCX `ucs_sys_event_set`, `ucs_async_pipe`).
//!
//! [`EventSet`] watches file descriptors and reports, for each ready one, the caller's 64-bit
//! token and the [`Events`] that fired. Waiting fills a fixed-size array on the stack, so a
//! wait allocates nothing. [`EventFd`] is the wakeup primitive the async thread and upper layers
//! (worker wakeup) signal across threads.
//!
//! Every system call goes through `cvt`, which turns the C convention (`-1` + `errno`) into a
//! [`Status`].

use std::fmt;
use std::ops::{BitAnd, BitOr, BitOrAssign, Sub};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::{Status, UcsResult};

/// Maps a `-1` system-call result to the `errno` status; passes other values through.
#[inline]
pub(crate) fn cvt<T: Copy + PartialEq + From<i8>>(ret: T) -> UcsResult<T> {
    if ret == T::from(-1) {
        Err(last_status())
    } else {
        Ok(ret)
    }
}

fn last_errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn last_status() -> Status {
    Status::from_errno(last_errno())
}

/// A set of I/O event kinds (UCX `ucs_event_set_types_t`), combined with `|`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Events(u32);

impl Events {
    /// The descriptor is readable (`EPOLLIN`).
    pub const READ: Events = Events(1 << 0);
    /// The descriptor is writable (`EPOLLOUT`).
    pub const WRITE: Events = Events(1 << 1);
    /// An error or hang-up happened (`EPOLLERR`, `EPOLLHUP`); always reported by epoll.
    pub const ERR: Events = Events(1 << 2);
    /// Registration flag: edge-triggered (`EPOLLET`), report only changes of readiness.
    pub const EDGE: Events = Events(1 << 3);
    /// Registration flag: disarm after one report until re-armed with
    /// [`EventSet::modify`] (`EPOLLONESHOT`).
    pub const ONESHOT: Events = Events(1 << 4);

    const ALL: u32 = 0x1f;
    const NAMES: [(Events, &'static str); 5] = [
        (Events::READ, "READ"),
        (Events::WRITE, "WRITE"),
        (Events::ERR, "ERR"),
        (Events::EDGE, "EDGE"),
        (Events::ONESHOT, "ONESHOT"),
    ];

    /// No event.
    #[inline]
    pub const fn empty() -> Events {
        Events(0)
    }

    /// The raw bits.
    #[inline]
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The set with `bits`, unknown bits dropped.
    #[inline]
    pub const fn from_bits_truncate(bits: u32) -> Events {
        Events(bits & Self::ALL)
    }

    /// True when no bit is set.
    #[inline]
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// True when every bit of `other` is set in `self`.
    #[inline]
    pub const fn contains(self, other: Events) -> bool {
        self.0 & other.0 == other.0
    }

    /// True when `self` and `other` share a bit.
    #[inline]
    pub const fn intersects(self, other: Events) -> bool {
        self.0 & other.0 != 0
    }

    fn to_epoll(self) -> u32 {
        let mut e = 0u32;
        if self.contains(Events::READ) {
            e |= libc::EPOLLIN as u32;
        }
        if self.contains(Events::WRITE) {
            e |= libc::EPOLLOUT as u32;
        }
        if self.contains(Events::ERR) {
            e |= libc::EPOLLERR as u32;
        }
        if self.contains(Events::EDGE) {
            e |= libc::EPOLLET as u32;
        }
        if self.contains(Events::ONESHOT) {
            e |= libc::EPOLLONESHOT as u32;
        }
        e
    }

    fn from_epoll(e: u32) -> Events {
        let mut ev = Events::empty();
        if e & (libc::EPOLLIN | libc::EPOLLPRI) as u32 != 0 {
            ev |= Events::READ;
        }
        if e & libc::EPOLLOUT as u32 != 0 {
            ev |= Events::WRITE;
        }
        if e & (libc::EPOLLERR | libc::EPOLLHUP) as u32 != 0 {
            ev |= Events::ERR;
        }
        ev
    }
}

impl BitOr for Events {
    type Output = Events;
    #[inline]
    fn bitor(self, rhs: Events) -> Events {
        Events(self.0 | rhs.0)
    }
}

impl BitOrAssign for Events {
    #[inline]
    fn bitor_assign(&mut self, rhs: Events) {
        self.0 |= rhs.0;
    }
}

impl BitAnd for Events {
    type Output = Events;
    #[inline]
    fn bitand(self, rhs: Events) -> Events {
        Events(self.0 & rhs.0)
    }
}

impl Sub for Events {
    type Output = Events;
    #[inline]
    fn sub(self, rhs: Events) -> Events {
        Events(self.0 & !rhs.0)
    }
}

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str("Events(empty)");
        }
        f.write_str("Events(")?;
        let mut first = true;
        for (flag, name) in Self::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str(" | ")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        f.write_str(")")
    }
}

/// Most events one [`EventSet::wait`] reports; more stay queued in the kernel for the next call.
pub const MAX_WAIT_EVENTS: usize = 32;

/// An epoll instance.
#[derive(Debug)]
pub struct EventSet {
    epfd: OwnedFd,
}

/// Rounds up so a wait never returns before the deadline it was computed from, which would make
/// a timer loop spin with zero timeouts.
fn timeout_ms(timeout: Option<Duration>) -> i32 {
    match timeout {
        None => -1,
        Some(d) => {
            let ms = d.as_nanos().div_ceil(1_000_000);
            ms.min(i32::MAX as u128) as i32
        }
    }
}

impl EventSet {
    /// Creates an empty set (close-on-exec).
    pub fn new() -> UcsResult<Self> {
        // SAFETY: no pointer arguments; the result is checked before use.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by epoll_create1 and nothing else owns it.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventSet { epfd })
    }

    fn ctl(&self, op: i32, fd: RawFd, events: Events, token: u64) -> UcsResult<()> {
        if fd < 0 {
            return Err(Status::InvalidParam);
        }
        let mut ev = libc::epoll_event { events: events.to_epoll(), u64: token };
        // SAFETY: `ev` is a valid epoll_event for the duration of the call; the kernel validates
        // both descriptors and reports bad ones through errno.
        cvt(unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    /// Starts watching `fd` for `events`; `token` is reported back by [`wait`](Self::wait).
    /// Fails with [`Status::AlreadyExists`] if `fd` is already in the set.
    pub fn add(&self, fd: RawFd, events: Events, token: u64) -> UcsResult<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, token)
    }

    /// Replaces the events and token of a watched `fd` (also re-arms a one-shot registration).
    pub fn modify(&self, fd: RawFd, events: Events, token: u64) -> UcsResult<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, token)
    }

    /// Stops watching `fd`.
    pub fn remove(&self, fd: RawFd) -> UcsResult<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, Events::empty(), 0)
    }

    /// Waits up to `timeout` (`None`: forever, rounded up to whole milliseconds) and calls
    /// `f(token, events)` for each ready descriptor, at most [`MAX_WAIT_EVENTS`] per call.
    /// Returns how many were reported; an interrupted wait reports 0.
    ///
    /// `f` may add, modify or remove registrations of this set.
    pub fn wait(&self, timeout: Option<Duration>, mut f: impl FnMut(u64, Events)) -> UcsResult<usize> {
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; MAX_WAIT_EVENTS];
        // SAFETY: `evs` is a writable array of MAX_WAIT_EVENTS entries, the count passed.
        let r = unsafe {
            libc::epoll_wait(self.epfd.as_raw_fd(), evs.as_mut_ptr(), MAX_WAIT_EVENTS as i32, timeout_ms(timeout))
        };
        if r < 0 {
            let errno = last_errno();
            return if errno == libc::EINTR { Ok(0) } else { Err(Status::from_errno(errno)) };
        }
        let n = r as usize;
        for ev in &evs[..n] {
            // Copy out of the (packed on x86-64) struct before use.
            let (bits, token) = (ev.events, ev.u64);
            f(token, Events::from_epoll(bits));
        }
        Ok(n)
    }
}

impl EventSet {
    /// The epoll descriptor, e.g. to nest this set in another one or in a user's poll loop.
    #[inline]
    pub fn as_raw_fd(&self) -> RawFd {
        self.epfd.as_raw_fd()
    }
}

impl AsRawFd for EventSet {
    fn as_raw_fd(&self) -> RawFd {
        self.epfd.as_raw_fd()
    }
}

/// Reads and resets the 8-byte counter of a non-blocking eventfd or timerfd; 0 when it is
/// not readable.
fn read_counter(fd: &OwnedFd) -> UcsResult<u64> {
    let mut v: u64 = 0;
    loop {
        // SAFETY: reads 8 bytes into a live, writable u64, as eventfd and timerfd require.
        let r = unsafe { libc::read(fd.as_raw_fd(), (&mut v as *mut u64).cast(), std::mem::size_of::<u64>()) };
        match cvt(r) {
            Ok(_) => return Ok(v),
            Err(_) => match last_errno() {
                libc::EINTR => continue,
                libc::EAGAIN => return Ok(0),
                e => return Err(Status::from_errno(e)),
            },
        }
    }
}

/// A non-blocking, close-on-exec eventfd used as a cross-thread wakeup.
#[derive(Debug)]
pub struct EventFd {
    fd: OwnedFd,
}

impl EventFd {
    /// Creates an eventfd with counter 0.
    pub fn new() -> UcsResult<Self> {
        // SAFETY: no pointer arguments; the result is checked before use.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(EventFd { fd })
    }

    /// Makes the descriptor readable. A counter already at its maximum is as readable as it
    /// gets, so that case succeeds too.
    pub fn signal(&self) -> UcsResult<()> {
        let one: u64 = 1;
        loop {
            // SAFETY: writes 8 bytes from a live u64, as eventfd requires.
            let r =
                unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), std::mem::size_of::<u64>()) };
            match cvt(r) {
                Ok(_) => return Ok(()),
                Err(_) => match last_errno() {
                    libc::EINTR => continue,
                    libc::EAGAIN => return Ok(()),
                    e => return Err(Status::from_errno(e)),
                },
            }
        }
    }

    /// Resets the counter; returns the accumulated count (0 if it was not signalled).
    pub fn drain(&self) -> UcsResult<u64> {
        read_counter(&self.fd)
    }
}

impl EventFd {
    /// The descriptor, to register in an [`EventSet`] or hand to a user's poll loop.
    #[inline]
    pub fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// A non-blocking, close-on-exec periodic timer descriptor (`timerfd`, monotonic clock): it
/// becomes readable every `interval` until drained.
#[derive(Debug)]
pub struct TimerFd {
    fd: OwnedFd,
    /// The time `due_ns` counts from.
    origin: std::time::Instant,
    /// Nanoseconds after `origin` before which the timer cannot have fired since the last
    /// drain ([`TimerFd::drain_if_due`]).
    due_ns: std::sync::atomic::AtomicU64,
}

impl TimerFd {
    /// Creates a timer that fires every `interval` (which must not be zero).
    pub fn periodic(interval: Duration) -> UcsResult<Self> {
        if interval.is_zero() {
            return Err(Status::InvalidParam);
        }
        // SAFETY: no pointer arguments; the result is checked before use.
        let fd = cvt(unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) })?;
        // SAFETY: `fd` was just returned by timerfd_create and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let ts = libc::timespec {
            tv_sec: interval.as_secs().min(i64::MAX as u64) as libc::time_t,
            tv_nsec: interval.subsec_nanos() as libc::c_long,
        };
        let spec = libc::itimerspec { it_interval: ts, it_value: ts };
        let origin = std::time::Instant::now();
        // SAFETY: `spec` is a valid itimerspec for the call; the old value is not requested.
        cvt(unsafe { libc::timerfd_settime(fd.as_raw_fd(), 0, &spec, std::ptr::null_mut()) })?;
        Ok(TimerFd { fd, origin, due_ns: std::sync::atomic::AtomicU64::new(0) })
    }

    /// Returns how many times the timer fired since the last call (0: not yet).
    pub fn drain(&self) -> UcsResult<u64> {
        read_counter(&self.fd)
    }

    /// [`TimerFd::drain`] without a system call while the timer cannot have fired: `Ok(0)`
    /// before the next expiry the kernel reported at the last drain. For a loop that drains
    /// before every sleep, such as arming a worker's wakeup.
    pub fn drain_if_due(&self) -> UcsResult<u64> {
        use std::sync::atomic::Ordering;
        let since =
            |t: std::time::Instant| t.saturating_duration_since(self.origin).as_nanos().min(u64::MAX as u128) as u64;
        if since(std::time::Instant::now()) < self.due_ns.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let n = self.drain()?;
        // The kernel's time to the next expiry, counted from before the call: never later than
        // the real expiry (both clocks are CLOCK_MONOTONIC), so no expiry is left unread.
        let before = since(std::time::Instant::now());
        // SAFETY: an all-zero itimerspec is a valid value to overwrite.
        let mut cur: libc::itimerspec = unsafe { std::mem::zeroed() };
        // SAFETY: valid timer descriptor and a valid itimerspec to fill.
        if unsafe { libc::timerfd_gettime(self.fd.as_raw_fd(), &mut cur) } == 0 {
            let left = cur.it_value.tv_sec.max(0) as u64 * 1_000_000_000 + cur.it_value.tv_nsec.max(0) as u64;
            self.due_ns.store(before.saturating_add(left), Ordering::Relaxed);
        }
        Ok(n)
    }
}

impl AsRawFd for TimerFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn events_ops_and_debug() {
        let e = Events::READ | Events::EDGE;
        assert!(e.contains(Events::READ));
        assert!(!e.contains(Events::WRITE));
        assert!(e.intersects(Events::EDGE | Events::WRITE));
        assert_eq!(e - Events::EDGE, Events::READ);
        assert_eq!(Events::from_bits_truncate(u32::MAX).bits(), 0x1f);
        assert_eq!(format!("{e:?}"), "Events(READ | EDGE)");
        assert_eq!(format!("{:?}", Events::empty()), "Events(empty)");
    }

    #[test]
    fn timeout_rounds_up() {
        assert_eq!(timeout_ms(None), -1);
        assert_eq!(timeout_ms(Some(Duration::ZERO)), 0);
        assert_eq!(timeout_ms(Some(Duration::from_micros(1))), 1);
        assert_eq!(timeout_ms(Some(Duration::from_millis(3))), 3);
        assert_eq!(timeout_ms(Some(Duration::from_secs(u64::MAX))), i32::MAX);
    }

    #[test]
    fn timerfd_fires_periodically() {
        assert_eq!(TimerFd::periodic(Duration::ZERO).err(), Some(Status::InvalidParam));
        let set = EventSet::new().unwrap();
        let t = TimerFd::periodic(Duration::from_millis(5)).unwrap();
        assert_eq!(t.drain().unwrap(), 0);
        set.add(t.as_raw_fd(), Events::READ, 3).unwrap();
        assert_eq!(set.wait(Some(Duration::from_secs(5)), |tok, _| assert_eq!(tok, 3)).unwrap(), 1);
        assert!(t.drain().unwrap() >= 1);
        // Fires again after being drained.
        assert_eq!(set.wait(Some(Duration::from_secs(5)), |tok, _| assert_eq!(tok, 3)).unwrap(), 1);
    }

    #[test]
    fn timer_drained_when_due_is_never_left_readable() {
        let set = EventSet::new().unwrap();
        let t = TimerFd::periodic(Duration::from_millis(3)).unwrap();
        set.add(t.as_raw_fd(), Events::READ, 7).unwrap();
        // Not due yet: nothing to take, and the descriptor stays quiet.
        assert_eq!(t.drain_if_due().unwrap(), 0);
        for round in 0..5 {
            // Whenever the descriptor is readable, the timer is due: draining takes the
            // expiry and the descriptor is quiet again (else a sleeper would spin).
            assert_eq!(set.wait(Some(Duration::from_secs(5)), |tok, _| assert_eq!(tok, 7)).unwrap(), 1);
            assert!(t.drain_if_due().unwrap() >= 1, "round {round}: a readable timer was not drained");
            assert_eq!(set.wait(Some(Duration::ZERO), |_, _| {}).unwrap(), 0, "round {round}");
        }
    }

    #[test]
    fn eventfd_in_event_set() {
        let set = EventSet::new().unwrap();
        let efd = EventFd::new().unwrap();
        set.add(efd.as_raw_fd(), Events::READ, 42).unwrap();
        assert_eq!(set.add(efd.as_raw_fd(), Events::READ, 42), Err(Status::AlreadyExists));
        assert_eq!(set.wait(Some(Duration::ZERO), |_, _| panic!()).unwrap(), 0);
        efd.signal().unwrap();
        efd.signal().unwrap();
        let mut seen = Vec::new();
        assert_eq!(set.wait(Some(Duration::from_secs(5)), |t, e| seen.push((t, e))).unwrap(), 1);
        assert_eq!(seen, vec![(42, Events::READ)]);
        assert_eq!(efd.drain().unwrap(), 2);
        assert_eq!(efd.drain().unwrap(), 0);
        assert_eq!(set.wait(Some(Duration::ZERO), |_, _| panic!()).unwrap(), 0);

        // One-shot: reported once, then silent until re-armed.
        set.modify(efd.as_raw_fd(), Events::READ | Events::ONESHOT, 7).unwrap();
        efd.signal().unwrap();
        assert_eq!(set.wait(Some(Duration::ZERO), |t, _| assert_eq!(t, 7)).unwrap(), 1);
        assert_eq!(set.wait(Some(Duration::ZERO), |_, _| panic!()).unwrap(), 0);
        set.modify(efd.as_raw_fd(), Events::READ | Events::ONESHOT, 8).unwrap();
        assert_eq!(set.wait(Some(Duration::ZERO), |t, _| assert_eq!(t, 8)).unwrap(), 1);

        set.remove(efd.as_raw_fd()).unwrap();
        assert_eq!(set.remove(efd.as_raw_fd()), Err(Status::NoDevice));
        assert_eq!(set.add(-1, Events::READ, 0), Err(Status::InvalidParam));
    }
}
