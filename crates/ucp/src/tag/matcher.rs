//! MPI tag matching, sans IO: expected receives and unexpected messages, nothing else.
//!
//! * A message with tag `t` matches a receive `(tag, mask)` iff `(t ^ tag) & mask == 0`.
//! * Expected receives with a full mask live in hash buckets (by tag); the others in one
//!   wildcard list. Every receive gets a posting sequence number; an arriving message takes the
//!   earliest-posted matching receive, comparing the first match of its bucket with the first
//!   match of the wildcard list.
//! * Unexpected messages live in hash buckets (by tag) and in one list in arrival order. A
//!   full-mask receive searches its bucket; any other searches the arrival list. Either way it
//!   gets the earliest arrival that matches, so messages from one sender are never overtaken.
//!
//! Entries live in slabs linked by index, so after warm-up posting and matching allocate
//! nothing. Handles carry a generation, so a stale handle never reaches a reused slot.

/// A 64-bit message tag.
pub type Tag = u64;

/// The mask that makes a receive match one tag exactly.
pub const FULL_MASK: Tag = u64::MAX;

/// Number of hash buckets, a power of two: the bucket is the top bits of a multiplicative
/// hash (UCX takes the tag modulo a prime; this spreads as well at a fraction of the cost).
const BUCKET_BITS: u32 = 10;
const BUCKETS: usize = 1 << BUCKET_BITS;

const NIL: u32 = u32::MAX;

/// The hash bucket of `tag` (exposed for tests that need tags sharing a bucket).
#[doc(hidden)]
#[inline]
pub fn bucket_index(tag: Tag) -> usize {
    // Fold the high half in, then keep the top bits of a Fibonacci hash.
    ((tag ^ (tag >> 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - BUCKET_BITS)) as usize
}

/// True when a message tagged `sent` matches a receive for `tag` under `mask`.
#[inline]
pub fn tag_matches(sent: Tag, tag: Tag, mask: Tag) -> bool {
    (sent ^ tag) & mask == 0
}

/// Links of one list an entry is on.
#[derive(Clone, Copy, Debug)]
struct Links {
    prev: u32,
    next: u32,
}

const UNLINKED: Links = Links { prev: NIL, next: NIL };

/// Head and tail of a list threaded through a slab.
#[derive(Clone, Copy, Debug)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List { head: NIL, tail: NIL };

/// A slab of entries with a free list (threaded through the free slots) and generations.
struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: u32,
}

struct Slot<T> {
    gen: u32,
    /// The next free slot, while this one is free.
    next_free: u32,
    val: Option<T>,
}

impl<T> Slab<T> {
    fn new() -> Self {
        Slab { slots: Vec::new(), free: NIL }
    }

    /// The index and generation the next `insert` will return.
    #[inline]
    fn next_handle(&self) -> (u32, u32) {
        match self.slots.get(self.free as usize) {
            Some(s) => (self.free, s.gen),
            None => (self.slots.len() as u32, 0),
        }
    }

    #[inline]
    fn insert(&mut self, v: T) -> (u32, u32) {
        let i = self.free;
        if let Some(s) = self.slots.get_mut(i as usize) {
            self.free = s.next_free;
            s.val = Some(v);
            (i, s.gen)
        } else {
            self.slots.push(Slot { gen: 0, next_free: NIL, val: Some(v) });
            ((self.slots.len() - 1) as u32, 0)
        }
    }

    #[inline]
    fn remove(&mut self, i: u32) -> T {
        let s = &mut self.slots[i as usize];
        s.gen = s.gen.wrapping_add(1);
        s.next_free = self.free;
        self.free = i;
        s.val.take().expect("removing a free slab slot")
    }

    #[inline]
    fn get(&self, i: u32) -> &T {
        self.slots[i as usize].val.as_ref().expect("free slab slot")
    }

    #[inline]
    fn get_mut(&mut self, i: u32) -> &mut T {
        self.slots[i as usize].val.as_mut().expect("free slab slot")
    }

    fn live(&self, i: u32, gen: u32) -> bool {
        self.slots.get(i as usize).is_some_and(|s| s.gen == gen && s.val.is_some())
    }
}

/// Unlinks `i` from `list`, where `links(i)` gives the entry's links on that list.
fn unlink<T>(slab: &mut Slab<T>, list: &mut List, i: u32, links: impl Fn(&mut T) -> &mut Links) {
    let Links { prev, next } = *links(slab.get_mut(i));
    if prev == NIL {
        list.head = next;
    } else {
        links(slab.get_mut(prev)).next = next;
    }
    if next == NIL {
        list.tail = prev;
    } else {
        links(slab.get_mut(next)).prev = prev;
    }
    *links(slab.get_mut(i)) = UNLINKED;
}

/// Appends `i` to `list`.
fn push_back<T>(slab: &mut Slab<T>, list: &mut List, i: u32, links: impl Fn(&mut T) -> &mut Links) {
    *links(slab.get_mut(i)) = Links { prev: list.tail, next: NIL };
    if list.tail == NIL {
        list.head = i;
    } else {
        links(slab.get_mut(list.tail)).next = i;
    }
    list.tail = i;
}

/// Unlinks the head of a non-empty `list` ([`unlink`] for the head, without its general
/// cases: the hot path of an arrival that matches the first receive of its bucket).
#[inline]
fn pop_front<T>(slab: &mut Slab<T>, list: &mut List, links: impl Fn(&mut T) -> &mut Links) {
    let head = list.head;
    let next = links(slab.get_mut(head)).next;
    list.head = next;
    if next == NIL {
        list.tail = NIL;
    } else {
        links(slab.get_mut(next)).prev = NIL;
    }
}

struct Expected<R> {
    tag: Tag,
    mask: Tag,
    sn: u64,
    links: Links,
    value: R,
}

struct Unexpected<U> {
    tag: Tag,
    by_tag: Links,
    by_arrival: Links,
    value: U,
}

/// Identifies a posted receive, for [`TagMatcher::cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecvHandle {
    index: u32,
    gen: u32,
}

/// Identifies an unexpected message, for [`TagMatcher::unexpected_mut`] and
/// [`TagMatcher::take_unexpected`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnexpHandle {
    index: u32,
    gen: u32,
}

/// Result of posting a receive.
#[derive(Debug)]
pub enum Posted<R, U> {
    /// No unexpected message matched: the receive waits.
    Waiting(RecvHandle),
    /// An unexpected message matched; both come back to the caller.
    Matched {
        /// The receive.
        recv: R,
        /// The message's tag.
        tag: Tag,
        /// The message.
        msg: U,
    },
}

/// Result of a message arriving.
#[derive(Debug)]
pub enum Arrived<R> {
    /// The earliest-posted matching receive, removed from the expected queue.
    Matched(R),
    /// No receive matched: the message is queued as unexpected.
    Unexpected(UnexpHandle),
}

/// Expected receives (`R`) and unexpected messages (`U`).
pub struct TagMatcher<R, U> {
    exp: Slab<Expected<R>>,
    exp_buckets: Box<[List; BUCKETS]>,
    wild: List,
    next_sn: u64,
    exp_count: usize,
    unexp: Slab<Unexpected<U>>,
    unexp_buckets: Box<[List; BUCKETS]>,
    arrival: List,
    unexp_count: usize,
}

impl<R, U> Default for TagMatcher<R, U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R, U> TagMatcher<R, U> {
    /// Empty queues.
    pub fn new() -> Self {
        TagMatcher {
            exp: Slab::new(),
            exp_buckets: Box::new([EMPTY; BUCKETS]),
            wild: EMPTY,
            next_sn: 0,
            exp_count: 0,
            unexp: Slab::new(),
            unexp_buckets: Box::new([EMPTY; BUCKETS]),
            arrival: EMPTY,
            unexp_count: 0,
        }
    }

    /// Number of posted receives waiting.
    pub fn expected_len(&self) -> usize {
        self.exp_count
    }

    /// Number of unexpected messages waiting.
    pub fn unexpected_len(&self) -> usize {
        self.unexp_count
    }

    /// The earliest-arrived unexpected message matching `(tag, mask)`.
    #[inline]
    fn find_unexpected(&self, tag: Tag, mask: Tag) -> Option<u32> {
        if self.unexp_count == 0 {
            return None;
        }
        if mask == FULL_MASK {
            let mut i = self.unexp_buckets[bucket_index(tag)].head;
            while i != NIL {
                let e = self.unexp.get(i);
                if e.tag == tag {
                    return Some(i);
                }
                i = e.by_tag.next;
            }
        } else {
            let mut i = self.arrival.head;
            while i != NIL {
                let e = self.unexp.get(i);
                if tag_matches(e.tag, tag, mask) {
                    return Some(i);
                }
                i = e.by_arrival.next;
            }
        }
        None
    }

    fn remove_unexpected(&mut self, i: u32) -> (Tag, U) {
        let tag = self.unexp.get(i).tag;
        unlink(&mut self.unexp, &mut self.unexp_buckets[bucket_index(tag)], i, |e| &mut e.by_tag);
        unlink(&mut self.unexp, &mut self.arrival, i, |e| &mut e.by_arrival);
        self.unexp_count -= 1;
        let e = self.unexp.remove(i);
        (e.tag, e.value)
    }

    /// Posts a receive for `(tag, mask)`: matches the earliest unexpected message, or waits.
    pub fn post(&mut self, tag: Tag, mask: Tag, recv: R) -> Posted<R, U> {
        if let Some(i) = self.find_unexpected(tag, mask) {
            let (tag, msg) = self.remove_unexpected(i);
            return Posted::Matched { recv, tag, msg };
        }
        Posted::Waiting(self.post_expected(tag, mask, recv))
    }

    /// Queues a receive without looking at unexpected messages (the caller searched already).
    #[inline]
    pub fn post_expected(&mut self, tag: Tag, mask: Tag, recv: R) -> RecvHandle {
        self.post_expected_with(tag, mask, |_| recv)
    }

    /// Removes and returns the earliest unexpected message matching `(tag, mask)`: what a
    /// receive being posted takes before it would wait.
    #[inline]
    pub fn take_unexpected_match(&mut self, tag: Tag, mask: Tag) -> Option<(Tag, U)> {
        let i = self.find_unexpected(tag, mask)?;
        Some(self.remove_unexpected(i))
    }

    /// [`Self::post_expected`] for a receive that learns its own handle first.
    #[inline]
    pub fn post_expected_with(&mut self, tag: Tag, mask: Tag, make: impl FnOnce(RecvHandle) -> R) -> RecvHandle {
        let (index, gen) = self.exp.next_handle();
        let recv = make(RecvHandle { index, gen });
        let sn = self.next_sn;
        self.next_sn += 1;
        let inserted = self.exp.insert(Expected { tag: tag & mask, mask, sn, links: UNLINKED, value: recv });
        debug_assert_eq!(inserted, (index, gen));
        let list = if mask == FULL_MASK { &mut self.exp_buckets[bucket_index(tag)] } else { &mut self.wild };
        push_back(&mut self.exp, list, index, |e| &mut e.links);
        self.exp_count += 1;
        RecvHandle { index, gen }
    }

    /// A message tagged `tag` arrived: the earliest-posted matching receive, or `msg` is queued
    /// as unexpected (`make_msg` builds it only then).
    pub fn arrive(&mut self, tag: Tag, make_msg: impl FnOnce() -> U) -> Arrived<R> {
        if let Some(i) = self.find_expected(tag) {
            return Arrived::Matched(self.remove_expected(i));
        }
        Arrived::Unexpected(self.push_unexpected(tag, make_msg()))
    }

    /// A message tagged `tag` arrived: removes and returns the earliest-posted matching
    /// receive, if any (the caller queues the message as unexpected otherwise).
    #[inline]
    pub fn take_expected(&mut self, tag: Tag) -> Option<R> {
        if self.wild.head == NIL {
            // No wildcard receive waits: the answer is the first receive of the tag's bucket
            // for this tag, usually the bucket's head, taken off the front here.
            let b = bucket_index(tag);
            let head = self.exp_buckets[b].head;
            if head == NIL {
                return None;
            }
            if self.exp.get(head).tag == tag {
                pop_front(&mut self.exp, &mut self.exp_buckets[b], |e| &mut e.links);
                self.exp_count -= 1;
                return Some(self.exp.remove(head).value);
            }
        }
        let i = self.find_expected(tag)?;
        Some(self.remove_expected(i))
    }

    #[inline]
    fn find_expected(&self, tag: Tag) -> Option<u32> {
        if self.exp_count == 0 {
            return None;
        }
        let mut hashed = NIL;
        let mut i = self.exp_buckets[bucket_index(tag)].head;
        while i != NIL {
            let e = self.exp.get(i);
            if e.tag == tag {
                hashed = i;
                break;
            }
            i = e.links.next;
        }
        let mut wild = NIL;
        let mut i = self.wild.head;
        while i != NIL {
            let e = self.exp.get(i);
            if tag_matches(tag, e.tag, e.mask) {
                wild = i;
                break;
            }
            i = e.links.next;
        }
        match (hashed, wild) {
            (NIL, NIL) => None,
            (h, NIL) => Some(h),
            (NIL, w) => Some(w),
            (h, w) => Some(if self.exp.get(h).sn < self.exp.get(w).sn { h } else { w }),
        }
    }

    #[inline]
    fn remove_expected(&mut self, i: u32) -> R {
        let e = self.exp.get(i);
        let list = if e.mask == FULL_MASK { &mut self.exp_buckets[bucket_index(e.tag)] } else { &mut self.wild };
        unlink(&mut self.exp, list, i, |e| &mut e.links);
        self.exp_count -= 1;
        self.exp.remove(i).value
    }

    /// Queues an unexpected message.
    pub fn push_unexpected(&mut self, tag: Tag, msg: U) -> UnexpHandle {
        let (index, gen) = self.unexp.insert(Unexpected { tag, by_tag: UNLINKED, by_arrival: UNLINKED, value: msg });
        push_back(&mut self.unexp, &mut self.unexp_buckets[bucket_index(tag)], index, |e| &mut e.by_tag);
        push_back(&mut self.unexp, &mut self.arrival, index, |e| &mut e.by_arrival);
        self.unexp_count += 1;
        UnexpHandle { index, gen }
    }

    /// Cancels a posted receive; `None` when it already matched or was cancelled.
    pub fn cancel(&mut self, h: RecvHandle) -> Option<R> {
        if !self.exp.live(h.index, h.gen) {
            return None;
        }
        Some(self.remove_expected(h.index))
    }

    /// The posted receive `h`, while it waits.
    pub fn expected_mut(&mut self, h: RecvHandle) -> Option<&mut R> {
        if !self.exp.live(h.index, h.gen) {
            return None;
        }
        Some(&mut self.exp.get_mut(h.index).value)
    }

    /// The earliest unexpected message matching `(tag, mask)`, without removing it.
    pub fn probe(&mut self, tag: Tag, mask: Tag) -> Option<(UnexpHandle, Tag, &mut U)> {
        let i = self.find_unexpected(tag, mask)?;
        let gen = self.unexp.slots[i as usize].gen;
        let e = self.unexp.get_mut(i);
        Some((UnexpHandle { index: i, gen }, e.tag, &mut e.value))
    }

    /// The unexpected message `h`, while queued.
    pub fn unexpected_mut(&mut self, h: UnexpHandle) -> Option<&mut U> {
        if !self.unexp.live(h.index, h.gen) {
            return None;
        }
        Some(&mut self.unexp.get_mut(h.index).value)
    }

    /// Removes the unexpected message `h`.
    pub fn take_unexpected(&mut self, h: UnexpHandle) -> Option<(Tag, U)> {
        if !self.unexp.live(h.index, h.gen) {
            return None;
        }
        Some(self.remove_unexpected(h.index))
    }

    /// Removes every posted receive, in posting order.
    pub fn drain_expected(&mut self) -> Vec<R> {
        let mut all: Vec<(u64, u32)> = Vec::with_capacity(self.exp_count);
        for (i, s) in self.exp.slots.iter().enumerate() {
            if let Some(e) = &s.val {
                all.push((e.sn, i as u32));
            }
        }
        all.sort_unstable();
        all.into_iter().map(|(_, i)| self.remove_expected(i)).collect()
    }

    /// Removes every unexpected message, in arrival order.
    pub fn drain_unexpected(&mut self) -> Vec<(Tag, U)> {
        let mut out = Vec::with_capacity(self.unexp_count);
        while self.arrival.head != NIL {
            out.push(self.remove_unexpected(self.arrival.head));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earliest_posted_wins_between_hash_and_wildcard() {
        let mut m: TagMatcher<&str, ()> = TagMatcher::new();
        assert!(matches!(m.post(5, 0, "wild-first"), Posted::Waiting(_)));
        assert!(matches!(m.post(5, FULL_MASK, "exact-second"), Posted::Waiting(_)));
        assert!(matches!(m.arrive(5, || ()), Arrived::Matched("wild-first")));
        assert!(matches!(m.arrive(5, || ()), Arrived::Matched("exact-second")));
        assert!(matches!(m.arrive(5, || ()), Arrived::Unexpected(_)));
    }

    #[test]
    fn unexpected_in_arrival_order_and_by_tag() {
        let mut m: TagMatcher<(), u32> = TagMatcher::new();
        for (i, t) in [7u64, 8, 7, 9].into_iter().enumerate() {
            assert!(matches!(m.arrive(t, || i as u32), Arrived::Unexpected(_)));
        }
        assert!(matches!(m.post(7, FULL_MASK, ()), Posted::Matched { msg: 0, .. }));
        assert!(matches!(m.post(0, 0, ()), Posted::Matched { msg: 1, tag: 8, .. }));
        assert!(matches!(m.post(7, FULL_MASK, ()), Posted::Matched { msg: 2, .. }));
        assert_eq!(m.unexpected_len(), 1);
    }

    #[test]
    fn stale_handles_are_ignored() {
        let mut m: TagMatcher<u32, ()> = TagMatcher::new();
        let Posted::Waiting(h) = m.post(1, FULL_MASK, 10) else { panic!() };
        assert_eq!(m.cancel(h), Some(10));
        assert_eq!(m.cancel(h), None);
        let Posted::Waiting(h2) = m.post(1, FULL_MASK, 11) else { panic!() };
        assert_eq!(h2.index, h.index, "slot reused");
        assert_eq!(m.cancel(h), None, "old handle must not cancel the new receive");
        assert_eq!(m.cancel(h2), Some(11));
    }
}
