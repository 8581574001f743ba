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
//!
//! Two layers:
//! * [`ExpQueues`] and [`UnexpQueue`]: the queues themselves. An expected receive's matching
//!   fields and links ([`ExpEntry`]) live in the caller's storage ([`ExpStore`]), so a posted
//!   receive can be one object with its request, as in UCX, and matching an arrival names the
//!   request's slot directly.
//! * [`TagMatcher`]: both queues with a slab of its own for the receives, for callers (and
//!   tests) that want a self-contained matcher.

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

/// Storage whose entries carry the links of one list: the list operations below work on any.
trait LinkStore {
    fn links(&mut self, i: u32) -> &mut Links;
}

/// Unlinks `i` from `list`.
fn unlink(s: &mut impl LinkStore, list: &mut List, i: u32) {
    let Links { prev, next } = *s.links(i);
    if prev == NIL {
        list.head = next;
    } else {
        s.links(prev).next = next;
    }
    if next == NIL {
        list.tail = prev;
    } else {
        s.links(next).prev = prev;
    }
    *s.links(i) = UNLINKED;
}

/// Appends `i` to `list`.
#[inline]
fn push_back(s: &mut impl LinkStore, list: &mut List, i: u32) {
    *s.links(i) = Links { prev: list.tail, next: NIL };
    if list.tail == NIL {
        list.head = i;
    } else {
        s.links(list.tail).next = i;
    }
    list.tail = i;
}

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

    #[inline]
    /// The slot index the next [`insert`](Self::insert) uses.
    fn next_index(&self) -> u32 {
        if (self.free as usize) < self.slots.len() {
            self.free
        } else {
            self.slots.len() as u32
        }
    }

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

// ---- expected receives ------------------------------------------------------------------------

/// The matching fields and list links of one expected receive, kept in the caller's storage
/// ([`ExpStore`]). Made by [`ExpQueues::post_at`]; only the queues change it.
#[derive(Clone, Copy, Debug)]
pub struct ExpEntry {
    /// The receive's tag with its mask applied.
    tag: Tag,
    mask: Tag,
    /// Posting sequence number.
    sn: u64,
    links: Links,
    /// On a queue (from [`ExpQueues::post_at`] until its match or removal).
    posted: bool,
    /// Also posted to a transport's tag matching (UCX's `UCP_REQUEST_FLAG_OFFLOADED`): the
    /// queues keep it as the transport's shadow ([`ExpQueues::set_offloaded`]).
    offloaded: bool,
}

impl ExpEntry {
    /// An entry of no receive: never posted.
    pub const NONE: ExpEntry = ExpEntry { tag: 0, mask: 0, sn: 0, links: UNLINKED, posted: false, offloaded: false };

    /// True while the receive waits on a queue.
    #[inline]
    pub fn is_posted(&self) -> bool {
        self.posted
    }

    /// True when the receive was posted to a transport's tag matching too (and was not
    /// taken back): a software match must cancel it there.
    #[inline]
    pub fn is_offloaded(&self) -> bool {
        self.offloaded
    }

    /// The receive's tag (with its mask applied) and mask.
    pub fn tag_mask(&self) -> (Tag, Tag) {
        (self.tag, self.mask)
    }

    /// The entry of a receive off the queues, no longer offloaded.
    pub fn without_offload(self) -> ExpEntry {
        debug_assert!(!self.posted, "a waiting receive changes its mark through the queues");
        ExpEntry { offloaded: false, ..self }
    }
}

/// Where the [`ExpEntry`]s of posted receives live, by slot index. Every index the queues were
/// given ([`ExpQueues::post_at`]) must name the same entry until it is matched or removed.
pub trait ExpStore {
    /// The entry of slot `i`.
    fn exp_entry(&mut self, i: u32) -> &mut ExpEntry;
}

/// The expected entries' links, for the list operations.
struct ExpLinks<'a, S: ?Sized>(&'a mut S);

impl<S: ExpStore + ?Sized> LinkStore for ExpLinks<'_, S> {
    #[inline]
    fn links(&mut self, i: u32) -> &mut Links {
        &mut self.0.exp_entry(i).links
    }
}

/// The queues of expected receives: a hash of buckets for full masks, a wildcard list for the
/// rest, posting sequence numbers. The entries live in an [`ExpStore`].
pub struct ExpQueues {
    buckets: Box<[List; BUCKETS]>,
    wild: List,
    next_sn: u64,
    count: usize,
    /// How many of the waiting receives are offloaded.
    offloaded: usize,
}

impl Default for ExpQueues {
    fn default() -> Self {
        Self::new()
    }
}

impl ExpQueues {
    /// Empty queues.
    pub fn new() -> Self {
        ExpQueues { buckets: Box::new([EMPTY; BUCKETS]), wild: EMPTY, next_sn: 0, count: 0, offloaded: 0 }
    }

    /// Number of posted receives waiting.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no receive waits.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Number of waiting receives that are not offloaded: while there is one, no later
    /// receive may be offloaded (the transport would match before software sees a message
    /// that receive should take).
    pub fn sw_only(&self) -> usize {
        self.count - self.offloaded
    }

    /// Marks the waiting receive in slot `i` as offloaded (`on`) or not.
    pub fn set_offloaded(&mut self, s: &mut (impl ExpStore + ?Sized), i: u32, on: bool) {
        let e = s.exp_entry(i);
        if !e.posted || e.offloaded == on {
            return;
        }
        e.offloaded = on;
        if on {
            self.offloaded += 1;
        } else {
            self.offloaded -= 1;
        }
    }

    /// Queues a receive for `(tag, mask)` about to be stored in slot `i` (which the store does
    /// not hold yet), after every receive posted before it, and returns its entry with the next
    /// sequence number, already linked: store it in slot `i` before the queues are used again.
    /// Slot `i` itself is never looked up.
    #[inline]
    pub fn post_at(&mut self, s: &mut (impl ExpStore + ?Sized), tag: Tag, mask: Tag, i: u32) -> ExpEntry {
        let sn = self.next_sn;
        self.next_sn += 1;
        let list = if mask == FULL_MASK { &mut self.buckets[bucket_index(tag & mask)] } else { &mut self.wild };
        let prev = list.tail;
        if prev == NIL {
            list.head = i;
        } else {
            s.exp_entry(prev).links.next = i;
        }
        list.tail = i;
        self.count += 1;
        ExpEntry { tag: tag & mask, mask, sn, links: Links { prev, next: NIL }, posted: true, offloaded: false }
    }

    /// A message tagged `tag` arrived: unlinks the earliest-posted matching receive and returns
    /// its slot (the caller queues the message as unexpected when there is none).
    #[inline(always)]
    pub fn take(&mut self, s: &mut (impl ExpStore + ?Sized), tag: Tag) -> Option<u32> {
        if self.wild.head == NIL {
            // No wildcard receive waits: the answer is the first receive of the tag's bucket
            // for this tag, usually the bucket's head, taken off the front here.
            let b = bucket_index(tag);
            let head = self.buckets[b].head;
            if head == NIL {
                return None;
            }
            let e = s.exp_entry(head);
            if e.tag == tag {
                // Off the front of the bucket (its links are left as they are: an entry that
                // is not posted has none that count).
                e.posted = false;
                self.offloaded -= e.offloaded as usize;
                let next = e.links.next;
                let bucket = &mut self.buckets[b];
                bucket.head = next;
                if next == NIL {
                    bucket.tail = NIL;
                } else {
                    s.exp_entry(next).links.prev = NIL;
                }
                self.count -= 1;
                return Some(head);
            }
        }
        let i = self.find(s, tag)?;
        self.unlink(s, i);
        Some(i)
    }

    fn find(&self, s: &mut (impl ExpStore + ?Sized), tag: Tag) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        let mut hashed = NIL;
        let mut i = self.buckets[bucket_index(tag)].head;
        while i != NIL {
            let e = s.exp_entry(i);
            if e.tag == tag {
                hashed = i;
                break;
            }
            i = e.links.next;
        }
        let mut wild = NIL;
        let mut i = self.wild.head;
        while i != NIL {
            let e = s.exp_entry(i);
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
            (h, w) => Some(if s.exp_entry(h).sn < s.exp_entry(w).sn { h } else { w }),
        }
    }

    fn unlink(&mut self, s: &mut (impl ExpStore + ?Sized), i: u32) {
        let e = *s.exp_entry(i);
        let list = if e.mask == FULL_MASK { &mut self.buckets[bucket_index(e.tag)] } else { &mut self.wild };
        unlink(&mut ExpLinks(&mut *s), list, i);
        s.exp_entry(i).posted = false;
        self.offloaded -= e.offloaded as usize;
        self.count -= 1;
    }

    /// Takes the receive in slot `i` off its queue (a cancel); false when it is not posted.
    pub fn remove(&mut self, s: &mut (impl ExpStore + ?Sized), i: u32) -> bool {
        if !s.exp_entry(i).posted {
            return false;
        }
        self.unlink(s, i);
        true
    }

    /// The slots of the waiting receives that are not offloaded, in posting order.
    pub fn sw_only_slots(&self, s: &mut (impl ExpStore + ?Sized)) -> Vec<u32> {
        let mut all: Vec<(u64, u32)> = Vec::with_capacity(self.count - self.offloaded);
        for list in self.buckets.iter().chain(std::iter::once(&self.wild)) {
            let mut i = list.head;
            while i != NIL {
                let e = s.exp_entry(i);
                if !e.offloaded {
                    all.push((e.sn, i));
                }
                i = e.links.next;
            }
        }
        all.sort_unstable();
        all.into_iter().map(|(_, i)| i).collect()
    }

    /// Takes every posted receive off the queues; their slots, in posting order.
    pub fn drain(&mut self, s: &mut (impl ExpStore + ?Sized)) -> Vec<u32> {
        let mut all: Vec<(u64, u32)> = Vec::with_capacity(self.count);
        let lists = self.buckets.iter().chain(std::iter::once(&self.wild));
        for list in lists {
            let mut i = list.head;
            while i != NIL {
                let e = s.exp_entry(i);
                all.push((e.sn, i));
                i = e.links.next;
            }
        }
        all.sort_unstable();
        for &(_, i) in &all {
            self.unlink(s, i);
        }
        all.into_iter().map(|(_, i)| i).collect()
    }
}

// ---- unexpected messages ----------------------------------------------------------------------

struct Unexpected<U> {
    tag: Tag,
    by_tag: Links,
    by_arrival: Links,
    value: U,
}

struct ByTag<'a, U>(&'a mut Slab<Unexpected<U>>);
struct ByArrival<'a, U>(&'a mut Slab<Unexpected<U>>);

impl<U> LinkStore for ByTag<'_, U> {
    fn links(&mut self, i: u32) -> &mut Links {
        &mut self.0.get_mut(i).by_tag
    }
}

impl<U> LinkStore for ByArrival<'_, U> {
    fn links(&mut self, i: u32) -> &mut Links {
        &mut self.0.get_mut(i).by_arrival
    }
}

/// Identifies a posted receive of a [`TagMatcher`], for [`TagMatcher::cancel`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecvHandle {
    index: u32,
    gen: u32,
}

/// Identifies an unexpected message, for [`UnexpQueue::get_mut`] and [`UnexpQueue::take`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UnexpHandle {
    index: u32,
    gen: u32,
}

/// Unexpected messages (`U`): hash buckets by tag plus one list in arrival order.
pub struct UnexpQueue<U> {
    slab: Slab<Unexpected<U>>,
    buckets: Box<[List; BUCKETS]>,
    arrival: List,
    count: usize,
}

impl<U> Default for UnexpQueue<U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<U> UnexpQueue<U> {
    /// An empty queue.
    pub fn new() -> Self {
        UnexpQueue { slab: Slab::new(), buckets: Box::new([EMPTY; BUCKETS]), arrival: EMPTY, count: 0 }
    }

    /// Number of messages waiting.
    pub fn len(&self) -> usize {
        self.count
    }

    /// True when no message waits.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// The earliest-arrived message matching `(tag, mask)`.
    #[inline]
    fn find(&self, tag: Tag, mask: Tag) -> Option<u32> {
        if self.count == 0 {
            return None;
        }
        if mask == FULL_MASK {
            let mut i = self.buckets[bucket_index(tag)].head;
            while i != NIL {
                let e = self.slab.get(i);
                if e.tag == tag {
                    return Some(i);
                }
                i = e.by_tag.next;
            }
        } else {
            let mut i = self.arrival.head;
            while i != NIL {
                let e = self.slab.get(i);
                if tag_matches(e.tag, tag, mask) {
                    return Some(i);
                }
                i = e.by_arrival.next;
            }
        }
        None
    }

    fn remove(&mut self, i: u32) -> (Tag, U) {
        let tag = self.slab.get(i).tag;
        unlink(&mut ByTag(&mut self.slab), &mut self.buckets[bucket_index(tag)], i);
        unlink(&mut ByArrival(&mut self.slab), &mut self.arrival, i);
        self.count -= 1;
        let e = self.slab.remove(i);
        (e.tag, e.value)
    }

    /// Removes and returns the earliest message matching `(tag, mask)`: what a receive being
    /// posted takes before it would wait.
    #[inline]
    pub fn take_match(&mut self, tag: Tag, mask: Tag) -> Option<(Tag, U)> {
        let i = self.find(tag, mask)?;
        Some(self.remove(i))
    }

    /// Queues a message.
    pub fn push(&mut self, tag: Tag, msg: U) -> UnexpHandle {
        let (index, gen) = self.slab.insert(Unexpected { tag, by_tag: UNLINKED, by_arrival: UNLINKED, value: msg });
        push_back(&mut ByTag(&mut self.slab), &mut self.buckets[bucket_index(tag)], index);
        push_back(&mut ByArrival(&mut self.slab), &mut self.arrival, index);
        self.count += 1;
        UnexpHandle { index, gen }
    }

    /// The earliest message matching `(tag, mask)`, without removing it.
    pub fn probe(&mut self, tag: Tag, mask: Tag) -> Option<(UnexpHandle, Tag, &mut U)> {
        let i = self.find(tag, mask)?;
        let gen = self.slab.slots[i as usize].gen;
        let e = self.slab.get_mut(i);
        Some((UnexpHandle { index: i, gen }, e.tag, &mut e.value))
    }

    /// The message `h`, while queued.
    pub fn get_mut(&mut self, h: UnexpHandle) -> Option<&mut U> {
        if !self.slab.live(h.index, h.gen) {
            return None;
        }
        Some(&mut self.slab.get_mut(h.index).value)
    }

    /// Removes the message `h`.
    pub fn take(&mut self, h: UnexpHandle) -> Option<(Tag, U)> {
        if !self.slab.live(h.index, h.gen) {
            return None;
        }
        Some(self.remove(h.index))
    }

    /// Removes every message, in arrival order.
    pub fn drain(&mut self) -> Vec<(Tag, U)> {
        let mut out = Vec::with_capacity(self.count);
        while self.arrival.head != NIL {
            out.push(self.remove(self.arrival.head));
        }
        out
    }
}

// ---- the self-contained matcher ---------------------------------------------------------------

/// A receive of a [`TagMatcher`]: its entry and the caller's value.
struct ExpSlot<R> {
    entry: ExpEntry,
    value: R,
}

impl<R> ExpStore for Slab<ExpSlot<R>> {
    #[inline]
    fn exp_entry(&mut self, i: u32) -> &mut ExpEntry {
        &mut self.get_mut(i).entry
    }
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

/// Expected receives (`R`, in a slab of its own) and unexpected messages (`U`).
pub struct TagMatcher<R, U> {
    exp: Slab<ExpSlot<R>>,
    queues: ExpQueues,
    unexp: UnexpQueue<U>,
}

impl<R, U> Default for TagMatcher<R, U> {
    fn default() -> Self {
        Self::new()
    }
}

impl<R, U> TagMatcher<R, U> {
    /// Empty queues.
    pub fn new() -> Self {
        TagMatcher { exp: Slab::new(), queues: ExpQueues::new(), unexp: UnexpQueue::new() }
    }

    /// Number of posted receives waiting.
    pub fn expected_len(&self) -> usize {
        self.queues.len()
    }

    /// Number of unexpected messages waiting.
    pub fn unexpected_len(&self) -> usize {
        self.unexp.len()
    }

    /// Posts a receive for `(tag, mask)`: matches the earliest unexpected message, or waits.
    pub fn post(&mut self, tag: Tag, mask: Tag, recv: R) -> Posted<R, U> {
        if let Some((tag, msg)) = self.unexp.take_match(tag, mask) {
            return Posted::Matched { recv, tag, msg };
        }
        Posted::Waiting(self.post_expected(tag, mask, recv))
    }

    /// Queues a receive without looking at unexpected messages (the caller searched already).
    pub fn post_expected(&mut self, tag: Tag, mask: Tag, recv: R) -> RecvHandle {
        let at = self.exp.next_index();
        let entry = self.queues.post_at(&mut self.exp, tag, mask, at);
        let (index, gen) = self.exp.insert(ExpSlot { entry, value: recv });
        debug_assert_eq!(index, at);
        RecvHandle { index, gen }
    }

    /// Removes and returns the earliest unexpected message matching `(tag, mask)`.
    pub fn take_unexpected_match(&mut self, tag: Tag, mask: Tag) -> Option<(Tag, U)> {
        self.unexp.take_match(tag, mask)
    }

    /// A message tagged `tag` arrived: the earliest-posted matching receive, or `msg` is queued
    /// as unexpected (`make_msg` builds it only then).
    pub fn arrive(&mut self, tag: Tag, make_msg: impl FnOnce() -> U) -> Arrived<R> {
        match self.take_expected(tag) {
            Some(r) => Arrived::Matched(r),
            None => Arrived::Unexpected(self.unexp.push(tag, make_msg())),
        }
    }

    /// A message tagged `tag` arrived: removes and returns the earliest-posted matching
    /// receive, if any (the caller queues the message as unexpected otherwise).
    pub fn take_expected(&mut self, tag: Tag) -> Option<R> {
        let i = self.queues.take(&mut self.exp, tag)?;
        Some(self.exp.remove(i).value)
    }

    /// Queues an unexpected message.
    pub fn push_unexpected(&mut self, tag: Tag, msg: U) -> UnexpHandle {
        self.unexp.push(tag, msg)
    }

    /// Cancels a posted receive; `None` when it already matched or was cancelled.
    pub fn cancel(&mut self, h: RecvHandle) -> Option<R> {
        if !self.exp.live(h.index, h.gen) {
            return None;
        }
        self.queues.remove(&mut self.exp, h.index);
        Some(self.exp.remove(h.index).value)
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
        self.unexp.probe(tag, mask)
    }

    /// The unexpected message `h`, while queued.
    pub fn unexpected_mut(&mut self, h: UnexpHandle) -> Option<&mut U> {
        self.unexp.get_mut(h)
    }

    /// Removes the unexpected message `h`.
    pub fn take_unexpected(&mut self, h: UnexpHandle) -> Option<(Tag, U)> {
        self.unexp.take(h)
    }

    /// Removes every posted receive, in posting order.
    pub fn drain_expected(&mut self) -> Vec<R> {
        let order = self.queues.drain(&mut self.exp);
        order.into_iter().map(|i| self.exp.remove(i).value).collect()
    }

    /// Removes every unexpected message, in arrival order.
    pub fn drain_unexpected(&mut self) -> Vec<(Tag, U)> {
        self.unexp.drain()
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
