//! Interval timer queue (UCX `ucs_timer_queue`).
//!
//! Pure bookkeeping: the caller passes the current [`Time`] in, so tests drive it with virtual
//! time. Each timer has an interval and a deadline; [`TimerQueue::expire`] reports every timer
//! whose deadline has passed once, however many intervals were missed, and moves its deadline to
//! `now + interval` so a late wakeup does not cause a burst of catch-up calls.
//!
//! Timer counts are small (a few per worker), so timers live in a vector scanned linearly; the
//! minimum deadline is cached so [`TimerQueue::next_expiry`] is O(1).

use std::time::Duration;

use crate::time::{self, Time};

#[derive(Clone, Copy, Debug)]
struct Timer {
    id: u64,
    interval: Time,
    deadline: Time,
}

/// A set of periodic timers keyed by caller-chosen ids. Single-thread structure.
#[derive(Debug, Default, Clone)]
pub struct TimerQueue {
    timers: Vec<Timer>,
    /// Smallest deadline, `Time::MAX` when empty.
    min_deadline: Time,
}

impl TimerQueue {
    /// An empty queue.
    pub const fn new() -> Self {
        TimerQueue { timers: Vec::new(), min_deadline: Time::MAX }
    }

    fn recompute_min(&mut self) {
        self.min_deadline = self.timers.iter().map(|t| t.deadline).min().unwrap_or(Time::MAX);
    }

    /// Adds timer `id` firing every `interval`, first at `now + interval`. Re-adding an existing
    /// id replaces its interval and restarts it. A zero interval fires on every
    /// [`expire`](Self::expire) call.
    pub fn add(&mut self, id: u64, interval: Duration, now: Time) {
        let interval = time::from_duration(interval);
        let deadline = now.saturating_add(interval);
        match self.timers.iter_mut().find(|t| t.id == id) {
            Some(t) => {
                t.interval = interval;
                t.deadline = deadline;
                self.recompute_min();
            }
            None => {
                self.timers.push(Timer { id, interval, deadline });
                self.min_deadline = self.min_deadline.min(deadline);
            }
        }
    }

    /// Removes timer `id`; false if there was none.
    pub fn remove(&mut self, id: u64) -> bool {
        match self.timers.iter().position(|t| t.id == id) {
            Some(pos) => {
                let t = self.timers.swap_remove(pos);
                if t.deadline == self.min_deadline {
                    self.recompute_min();
                }
                true
            }
            None => false,
        }
    }

    /// The earliest deadline, if any timer is registered.
    #[inline]
    pub fn next_expiry(&self) -> Option<Time> {
        (!self.timers.is_empty()).then_some(self.min_deadline)
    }

    /// Calls `f(id)` once for each timer whose deadline is at or before `now`, and moves those
    /// deadlines to `now + interval`. Returns how many fired. Allocates nothing.
    pub fn expire(&mut self, now: Time, mut f: impl FnMut(u64)) -> usize {
        if now < self.min_deadline {
            return 0;
        }
        let mut fired = 0;
        let mut min = Time::MAX;
        for t in &mut self.timers {
            if t.deadline <= now {
                t.deadline = now.saturating_add(t.interval);
                f(t.id);
                fired += 1;
            }
            min = min.min(t.deadline);
        }
        self.min_deadline = min;
        fired
    }

    /// Number of timers.
    #[inline]
    pub fn len(&self) -> usize {
        self.timers.len()
    }

    /// True when no timer is registered.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.timers.is_empty()
    }

    /// True when timer `id` is registered.
    pub fn contains(&self, id: u64) -> bool {
        self.timers.iter().any(|t| t.id == id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Time = 1_000_000;

    fn fired(q: &mut TimerQueue, now: Time) -> Vec<u64> {
        let mut v = Vec::new();
        q.expire(now, |id| v.push(id));
        v.sort_unstable();
        v
    }

    #[test]
    fn virtual_time() {
        let mut q = TimerQueue::new();
        assert_eq!(q.next_expiry(), None);
        q.add(1, Duration::from_millis(10), 0);
        q.add(2, Duration::from_millis(3), 0);
        assert_eq!(q.len(), 2);
        assert_eq!(q.next_expiry(), Some(3 * MS));
        assert!(fired(&mut q, 2 * MS).is_empty());
        assert_eq!(fired(&mut q, 3 * MS), vec![2]);
        assert_eq!(q.next_expiry(), Some(6 * MS));
        // Far past both: each fires once, deadlines restart from now.
        assert_eq!(fired(&mut q, 100 * MS), vec![1, 2]);
        assert_eq!(q.next_expiry(), Some(103 * MS));
        assert!(q.remove(2));
        assert!(!q.remove(2));
        assert_eq!(q.next_expiry(), Some(110 * MS));
        // Re-add replaces.
        q.add(1, Duration::from_millis(1), 200 * MS);
        assert_eq!(q.len(), 1);
        assert_eq!(q.next_expiry(), Some(201 * MS));
        assert!(q.contains(1));
        assert!(q.remove(1));
        assert!(q.is_empty());
        assert_eq!(q.next_expiry(), None);
    }

    #[test]
    fn saturates_near_max() {
        let mut q = TimerQueue::new();
        q.add(1, Duration::from_secs(u64::MAX), Time::MAX - 5);
        assert_eq!(q.next_expiry(), Some(Time::MAX));
        assert_eq!(fired(&mut q, Time::MAX), vec![1]);
    }

    mod prop {
        use super::*;
        use proptest::prelude::*;

        #[derive(Debug, Clone)]
        enum Op {
            Add(u8, u16),
            Remove(u8),
            Advance(u16),
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                (0u8..6, 0u16..50).prop_map(|(i, d)| Op::Add(i, d)),
                (0u8..6).prop_map(Op::Remove),
                (0u16..80).prop_map(Op::Advance),
            ]
        }

        proptest! {
            #[test]
            fn matches_naive_model(ops in proptest::collection::vec(op(), 0..60)) {
                let mut q = TimerQueue::new();
                // id -> (interval, deadline)
                let mut model: std::collections::BTreeMap<u64, (Time, Time)> = Default::default();
                let mut now: Time = 0;
                for op in ops {
                    match op {
                        Op::Add(id, iv) => {
                            q.add(u64::from(id), Duration::from_nanos(u64::from(iv)), now);
                            model.insert(u64::from(id), (u64::from(iv), now + u64::from(iv)));
                        }
                        Op::Remove(id) => {
                            prop_assert_eq!(q.remove(u64::from(id)), model.remove(&u64::from(id)).is_some());
                        }
                        Op::Advance(d) => {
                            now += u64::from(d);
                            let mut want: Vec<u64> = Vec::new();
                            for (id, (iv, dl)) in model.iter_mut() {
                                if *dl <= now {
                                    want.push(*id);
                                    *dl = now + *iv;
                                }
                            }
                            prop_assert_eq!(fired(&mut q, now), want);
                        }
                    }
                    prop_assert_eq!(q.len(), model.len());
                    prop_assert_eq!(q.next_expiry(), model.values().map(|v| v.1).min());
                }
            }
        }
    }
}
