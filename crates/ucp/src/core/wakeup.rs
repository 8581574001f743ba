//! Worker wakeup (`UCP_FEATURE_WAKEUP`): one file descriptor that becomes readable when the
//! worker has something to progress, so a thread or an async task can sleep instead of polling.
//!
//! The descriptor is an epoll set holding every interface's event descriptor and an eventfd
//! that [`Worker::signal`](crate::Worker::signal) writes from any thread. The protocol is the
//! one of `ucp_worker_arm`/`ucp_worker_wait`:
//!
//! 1. progress until nothing happens;
//! 2. arm: `Err(Busy)` means events are already pending (go back to 1); `Ok` means the
//!    descriptor will become readable on the next event;
//! 3. sleep until the descriptor is readable (`Worker::wait`, `poll`, an async reactor).

use std::os::fd::{AsRawFd, RawFd};

use ucs::async_::{EventFd, EventSet, Events, TimerFd};
use ucs::{Status, UcsResult};
use uct::EventFlags;

use crate::core::Core;
use crate::engine::EpStatus;

/// Token of the signal eventfd in the epoll set; interface `i` has token `i`.
const SIGNAL_TOKEN: u64 = u64::MAX;
/// Token of the keepalive timer.
const TIMER_TOKEN: u64 = u64::MAX - 1;
/// Token of socket-address listeners.
const LISTENER_TOKEN: u64 = u64::MAX - 2;

/// The epoll set and the signal descriptor of a worker created with the WAKEUP feature.
pub(crate) struct Wakeup {
    set: EventSet,
    signal: EventFd,
    /// Wakes a sleeping worker for its keepalive rounds (`UCX_KEEPALIVE_INTERVAL`).
    keepalive: Option<TimerFd>,
}

impl Wakeup {
    /// Builds the set from the interfaces that report events through a descriptor.
    pub fn new(core: &Core) -> UcsResult<Wakeup> {
        let set = EventSet::new()?;
        let signal = EventFd::new()?;
        set.add(signal.as_raw_fd(), Events::READ, SIGNAL_TOKEN)?;
        let interval = core.ctx.config().keepalive_interval;
        let keepalive = if interval.is_zero() { None } else { Some(TimerFd::periodic(interval)?) };
        if let Some(t) = &keepalive {
            set.add(t.as_raw_fd(), Events::READ, TIMER_TOKEN)?;
        }
        for (i, wi) in core.ifaces.iter().enumerate() {
            if !wi.attr.event_flags.contains(EventFlags::FD) {
                continue;
            }
            let fd = wi.iface.event_fd().inspect_err(|e| {
                tracing::error!(
                    "ucp wakeup: interface {}/{} has no event descriptor: {e}",
                    wi.resource.desc.tl.tl_name,
                    wi.resource.desc.tl.dev_name
                )
            })?;
            set.add(fd, Events::READ, i as u64)?;
        }
        Ok(Wakeup { set, signal, keepalive })
    }

    /// The epoll descriptor.
    pub fn fd(&self) -> RawFd {
        self.set.as_raw_fd()
    }

    /// Adds a listener's descriptor (readable when it has connections or requests).
    pub fn add_fd(&self, fd: RawFd) -> UcsResult<()> {
        self.set.add(fd, Events::READ, LISTENER_TOKEN)
    }

    /// Takes a listener's descriptor out of the set.
    pub fn remove_fd(&self, fd: RawFd) -> UcsResult<()> {
        self.set.remove(fd)
    }

    /// Wakes a sleeper; safe from any thread.
    pub fn signal(&self) -> UcsResult<()> {
        self.signal.signal()
    }

    /// Consumes pending signals; true if there were any.
    pub fn take_signals(&self) -> UcsResult<bool> {
        Ok(self.signal.drain()? > 0)
    }

    /// Consumes keepalive timer expirations; true if it fired. No system call before the
    /// next expiry.
    pub fn take_timer(&self) -> UcsResult<bool> {
        match &self.keepalive {
            Some(t) => Ok(t.drain_if_due()? > 0),
            None => Ok(false),
        }
    }

    /// Sleeps until an armed event or a signal (or `timeout`); returns whether anything
    /// reported and which interfaces did (a bit per interface index below 64).
    pub fn sleep(&self, timeout: Option<std::time::Duration>) -> UcsResult<(bool, u64)> {
        let mut fired = 0u64;
        let n = self.set.wait(timeout, |token, _| {
            if token < 64 {
                fired |= 1 << token;
            }
        })?;
        Ok((n > 0, fired))
    }
}

impl Core {
    /// Arms every interface for the next event. `Err(Busy)` when progress has work now: an
    /// interface has events or queued operations, an endpoint has replayable sends, or a close
    /// is being flushed (flushes are polled, not signalled).
    pub fn arm(&self) -> UcsResult<()> {
        let busy = {
            let e = self.engine.borrow();
            let replayable =
                e.sh.retry.iter().any(|&id| e.sh.eps.get(id).is_some_and(|ep| ep.status != EpStatus::Connecting));
            replayable || !e.sh.closing.is_empty()
        };
        if busy {
            return Err(Status::Busy);
        }
        // Listeners are polled now and then by progress: before sleeping, now.
        if self.sockaddr_active.get() && self.progress_sockaddr() > 0 {
            return Err(Status::Busy);
        }
        for (i, wi) in self.ifaces.iter().enumerate() {
            if wi.attr.event_flags.is_empty() {
                continue;
            }
            match wi.iface.event_arm(EventFlags::SEND_COMP | EventFlags::RECV) {
                Ok(()) => {}
                Err(Status::Busy) => {
                    // An interface polled only now and then has work: poll it every time.
                    self.activate(i);
                    return Err(Status::Busy);
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}
