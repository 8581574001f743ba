//! A fixed-size broadcast ring of unmap events.
//!
//! Producers are the libc hooks: any thread, possibly inside `free()` with malloc's locks
//! held or inside a signal handler. A producer therefore only touches atomics: no
//! allocation, no lock, no loop that waits for another thread, no panic.
//!
//! Every consumer sees every event through its own [`Cursor`] (a sequence number), so any
//! number of caches read the same ring without coordinating. A consumer that falls more than
//! a ring's length behind, or that finds an event it can no longer read, is told to drop
//! everything ([`UnmapEvent::All`]) instead of missing an event.
//!
//! Slot protocol (`seq` per slot, event number `s` lives in slot `s % N`):
//! - `complete(s) = 2(s+1)`: the slot holds event `s`;
//! - `writing(s) = 2s+1`: the producer of `s` owns the slot and is writing it;
//! - 0: never written.
//!
//! A producer claims `s` from `head`, takes the slot by compare-and-swap from an older
//! complete value, writes the range and publishes `complete(s)`. If the slot is still being
//! written by an older producer (only possible with `N` events in flight at once), the new
//! event is dropped and the `lost` counter tells every consumer to drop everything. A
//! consumer reads a slot like a seqlock: `seq`, data, `seq` again.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::SeqCst};

/// Number of slots of the process-wide ring (24 bytes each).
pub(crate) const RING_SIZE: usize = 4096;

/// Attempts a producer makes to take its slot when another producer changes it under it.
const CLAIM_ATTEMPTS: usize = 4;

/// A range of memory that was unmapped (or whose pages were released), or every range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnmapEvent {
    /// `[addr, addr + len)` was unmapped or released.
    Range {
        /// First byte.
        addr: usize,
        /// Length in bytes (not rounded; the kernel acts on whole pages).
        len: usize,
    },
    /// Events were lost or cannot be described precisely: treat all memory as unmapped.
    All,
}

struct Slot {
    seq: AtomicU64,
    addr: AtomicUsize,
    len: AtomicUsize,
}

impl Slot {
    const fn new() -> Self {
        Slot { seq: AtomicU64::new(0), addr: AtomicUsize::new(0), len: AtomicUsize::new(0) }
    }
}

const fn complete(s: u64) -> u64 {
    s.wrapping_add(1).wrapping_mul(2)
}

const fn writing(s: u64) -> u64 {
    s.wrapping_mul(2).wrapping_add(1)
}

/// What a consumer finds in the slot of event `s`.
enum Read {
    Event(usize, usize),
    /// The producer of `s` has not published it yet.
    Pending,
    /// A newer event took the slot: `s` can no longer be read.
    Overwritten,
}

/// A consumer's position: the next event to read and the lost-event count it has seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Cursor {
    next: u64,
    lost: u64,
}

/// The ring; `N` must be a power of two.
pub(crate) struct Ring<const N: usize> {
    head: AtomicU64,
    lost: AtomicU64,
    slots: [Slot; N],
}

impl<const N: usize> Ring<N> {
    const MASK: u64 = {
        assert!(N.is_power_of_two(), "ring size must be a power of two");
        N as u64 - 1
    };

    /// An empty ring.
    pub(crate) const fn new() -> Self {
        Ring { head: AtomicU64::new(0), lost: AtomicU64::new(0), slots: [const { Slot::new() }; N] }
    }

    fn slot(&self, s: u64) -> Option<&Slot> {
        // `s & MASK < N`: `get` never fails, and never panics either way.
        self.slots.get((s & Self::MASK) as usize)
    }

    /// Records an event. Async-signal-safe: atomics only, bounded, never panics.
    pub(crate) fn push(&self, addr: usize, len: usize) {
        let s = self.head.fetch_add(1, SeqCst);
        let Some(slot) = self.slot(s) else { return };
        for _ in 0..CLAIM_ATTEMPTS {
            let cur = slot.seq.load(SeqCst);
            // Odd: an older producer is still writing; at or past `writing(s)`: a newer one
            // already took the slot (this producer was delayed by a whole ring's length).
            if cur & 1 == 1 || cur >= writing(s) {
                break;
            }
            if slot.seq.compare_exchange(cur, writing(s), SeqCst, SeqCst).is_ok() {
                slot.addr.store(addr, SeqCst);
                slot.len.store(len, SeqCst);
                slot.seq.store(complete(s), SeqCst);
                return;
            }
        }
        self.lost.fetch_add(1, SeqCst);
    }

    /// Number of events pushed so far (the ring's generation counter).
    pub(crate) fn head(&self) -> u64 {
        self.head.load(SeqCst)
    }

    /// A cursor that will see the events pushed from now on.
    pub(crate) fn cursor(&self) -> Cursor {
        // `lost` first: a loss counted between the two loads is then reported once more
        // than needed, never missed.
        let lost = self.lost.load(SeqCst);
        Cursor { next: self.head.load(SeqCst), lost }
    }

    /// True when events (or losses) arrived since `cursor` last drained.
    #[inline]
    pub(crate) fn has_news(&self, cursor: &Cursor) -> bool {
        self.head.load(SeqCst) != cursor.next || self.lost.load(SeqCst) != cursor.lost
    }

    fn read(&self, s: u64) -> Read {
        let Some(slot) = self.slot(s) else { return Read::Overwritten };
        let seq = slot.seq.load(SeqCst);
        if seq == complete(s) {
            let addr = slot.addr.load(SeqCst);
            let len = slot.len.load(SeqCst);
            if slot.seq.load(SeqCst) == seq {
                Read::Event(addr, len)
            } else {
                Read::Overwritten
            }
        } else if seq < complete(s) {
            Read::Pending
        } else {
            Read::Overwritten
        }
    }

    /// Passes every event since `cursor` to `f` and advances `cursor`; returns the number of
    /// events passed. When events were lost or the cursor fell too far behind, `f` gets a
    /// single [`UnmapEvent::All`].
    ///
    /// An event whose producer has not published it yet stays ahead of the cursor and is
    /// read again by the next call, together with the published events after it (which are
    /// passed now, and again next time: consumers must treat events as idempotent).
    pub(crate) fn drain(&self, cursor: &mut Cursor, mut f: impl FnMut(UnmapEvent)) -> usize {
        let lost = self.lost.load(SeqCst);
        let head = self.head.load(SeqCst);
        let behind = head.wrapping_sub(cursor.next);
        if lost != cursor.lost || behind > N as u64 {
            *cursor = Cursor { next: head, lost };
            f(UnmapEvent::All);
            return 1;
        }
        let mut first_pending = None;
        let mut passed = 0;
        let mut s = cursor.next;
        while s != head {
            match self.read(s) {
                Read::Event(addr, len) => {
                    f(UnmapEvent::Range { addr, len });
                    passed += 1;
                }
                Read::Pending => {
                    first_pending.get_or_insert(s);
                }
                Read::Overwritten => {
                    *cursor = Cursor { next: head, lost };
                    f(UnmapEvent::All);
                    return passed + 1;
                }
            }
            s = s.wrapping_add(1);
        }
        *cursor = Cursor { next: first_pending.unwrap_or(head), lost };
        passed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain_all<const N: usize>(ring: &Ring<N>, cursor: &mut Cursor) -> Vec<UnmapEvent> {
        let mut out = Vec::new();
        ring.drain(cursor, |e| out.push(e));
        out
    }

    #[test]
    fn every_consumer_sees_every_event() {
        let ring = Ring::<8>::new();
        let mut a = ring.cursor();
        ring.push(0x1000, 10);
        let mut b = ring.cursor();
        ring.push(0x2000, 20);
        assert!(ring.has_news(&a));
        assert_eq!(
            drain_all(&ring, &mut a),
            [UnmapEvent::Range { addr: 0x1000, len: 10 }, UnmapEvent::Range { addr: 0x2000, len: 20 }]
        );
        assert!(!ring.has_news(&a));
        assert_eq!(drain_all(&ring, &mut b), [UnmapEvent::Range { addr: 0x2000, len: 20 }]);
        assert!(drain_all(&ring, &mut a).is_empty());
    }

    #[test]
    fn falling_behind_by_more_than_the_ring_reports_all() {
        let ring = Ring::<4>::new();
        let mut c = ring.cursor();
        for i in 0..4 {
            ring.push(i, 1);
        }
        assert_eq!(drain_all(&ring, &mut c).len(), 4, "exactly a ring's length is still readable");
        for i in 0..5 {
            ring.push(i, 1);
        }
        assert_eq!(drain_all(&ring, &mut c), [UnmapEvent::All]);
        assert!(!ring.has_news(&c));
        ring.push(7, 7);
        assert_eq!(drain_all(&ring, &mut c), [UnmapEvent::Range { addr: 7, len: 7 }]);
    }

    #[test]
    fn a_stuck_older_producer_makes_the_event_lost() {
        let ring = Ring::<2>::new();
        let mut c = ring.cursor();
        // Event 0 claimed but never published: its slot stays `writing(0)`.
        ring.head.store(1, SeqCst);
        ring.slots[0].seq.store(writing(0), SeqCst);
        ring.push(0x10, 1); // event 1, slot 1
        assert_eq!(drain_all(&ring, &mut c), [UnmapEvent::Range { addr: 0x10, len: 1 }]);
        // Event 0 is pending: the cursor stays on it and the next drain passes event 1 again.
        assert!(ring.has_news(&c));
        assert_eq!(drain_all(&ring, &mut c), [UnmapEvent::Range { addr: 0x10, len: 1 }]);
        // Event 2 needs slot 0, still owned by event 0's producer: it is lost.
        ring.push(0x20, 1);
        assert_eq!(ring.lost.load(SeqCst), 1);
        assert_eq!(drain_all(&ring, &mut c), [UnmapEvent::All]);
        assert!(!ring.has_news(&c));
    }

    #[test]
    fn a_pending_event_overtaken_by_the_ring_reports_all() {
        let ring = Ring::<2>::new();
        let mut c = ring.cursor();
        ring.head.store(1, SeqCst); // event 0 claimed, not yet published
        ring.push(1, 1); // event 1
        drain_all(&ring, &mut c);
        // Event 0's producer finally publishes, then event 2 reuses its slot before the
        // consumer reads it.
        ring.slots[0].seq.store(complete(0), SeqCst);
        ring.push(2, 2);
        assert_eq!(drain_all(&ring, &mut c), [UnmapEvent::All]);
    }

    #[test]
    fn producers_on_many_threads_lose_nothing_when_the_consumer_keeps_up() {
        let ring = std::sync::Arc::new(Ring::<1024>::new());
        let mut c = ring.cursor();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let ring = ring.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        ring.push(t * 1000 + i, 1);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let mut seen: Vec<usize> = drain_all(&ring, &mut c)
            .into_iter()
            .map(|e| match e {
                UnmapEvent::Range { addr, .. } => addr,
                UnmapEvent::All => panic!("nothing may be lost"),
            })
            .collect();
        seen.sort_unstable();
        let mut want: Vec<usize> = (0..4).flat_map(|t| (0..200).map(move |i| t * 1000 + i)).collect();
        want.sort_unstable();
        assert_eq!(seen, want);
    }
}
