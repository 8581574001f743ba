//! 16-bit serial numbers with wrap-around, and an ordered fragment list (UCX `ucs_frag_list`).
//!
//! UD reliability numbers packets with a 16-bit sequence number that wraps. [`Sn16`] compares
//! such numbers RFC 1982 style: `a` is "less than" `b` when `b` is less than half the number space
//! ahead of `a`. [`FragList`] sits on the receive side: it remembers the last delivered number
//! (the head), delivers an in-order packet at once, holds early packets until the gap before
//! them closes, and rejects duplicates and packets beyond the receive window.
//!
//! Held packets live in a ring indexed by their distance from the head, so insert and pull are
//! O(1) and, once the ring covers the window in use, allocate nothing.

use std::collections::VecDeque;
use std::fmt;

/// A 16-bit serial number with wrap-around comparison.
///
/// There is deliberately no `Ord`: serial-number order is not transitive across the whole
/// space. Use [`lt`](Self::lt) and friends, or [`distance`](Self::distance).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Sn16(pub u16);

impl Sn16 {
    /// Signed difference `self - other`, wrap-aware, in `-32768..=32767`.
    ///
    /// `Sn16(1).distance(Sn16(65535)) == 2`: 1 comes two steps after 65535.
    #[inline]
    pub const fn distance(self, other: Sn16) -> i32 {
        self.0.wrapping_sub(other.0) as i16 as i32
    }

    /// `self` comes before `other`.
    #[inline]
    pub const fn lt(self, other: Sn16) -> bool {
        self.distance(other) < 0
    }

    /// `self` comes before `other` or equals it.
    #[inline]
    pub const fn le(self, other: Sn16) -> bool {
        self.distance(other) <= 0
    }

    /// `self` comes after `other`.
    #[inline]
    pub const fn gt(self, other: Sn16) -> bool {
        self.distance(other) > 0
    }

    /// `self` comes after `other` or equals it.
    #[inline]
    pub const fn ge(self, other: Sn16) -> bool {
        self.distance(other) >= 0
    }

    /// The following serial number (65535 -> 0).
    #[inline]
    pub const fn next(self) -> Sn16 {
        Sn16(self.0.wrapping_add(1))
    }

    /// The serial number `n` steps ahead, wrapping.
    #[inline]
    pub const fn add(self, n: u16) -> Sn16 {
        Sn16(self.0.wrapping_add(n))
    }
}

impl fmt::Display for Sn16 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

/// What [`FragList::insert`] did with an element.
#[derive(Debug, PartialEq, Eq)]
pub enum FragInsert<T> {
    /// The element is the next in order and nothing held can follow it yet: deliver it now.
    /// The head has advanced to its number; [`FragList::pull`] would return `None`.
    InOrder(T),
    /// The element is the next in order and the held element after it is now deliverable:
    /// deliver this one, then call [`FragList::pull`] until it returns `None`.
    Ready(T),
    /// Out of order but inside the window: stored until the gap before it closes.
    Held,
    /// At or before the head, or already held: handed back, nothing changed.
    Duplicate(T),
    /// Further ahead of the head than the window allows: handed back, nothing changed.
    OutOfWindow(T),
}

/// Receive-side reorder list keyed by [`Sn16`].
///
/// Single-thread structure: mutation takes `&mut self`.
pub struct FragList<T> {
    /// Last delivered serial number.
    head: Sn16,
    /// Largest accepted distance ahead of the head.
    max_window: u16,
    /// Slot `i` holds the element numbered `head + 1 + i`, if it arrived.
    held: VecDeque<Option<T>>,
    num_held: usize,
}

/// Distances of half the space or more read as "behind", so a window cannot reach that far.
const MAX_WINDOW: u16 = i16::MAX as u16;

impl<T> FragList<T> {
    /// A list whose last delivered number is `initial_head` (the first expected element is
    /// `initial_head.next()`), accepting elements up to `max_window` ahead of the head.
    ///
    /// `max_window` is capped at 32767, the largest distance serial arithmetic can tell from
    /// "behind". The next in-order element is always accepted, even with a window of 0.
    pub fn new(initial_head: Sn16, max_window: u16) -> Self {
        FragList { head: initial_head, max_window: max_window.min(MAX_WINDOW), held: VecDeque::new(), num_held: 0 }
    }

    /// The last delivered serial number.
    #[inline]
    pub fn head_sn(&self) -> Sn16 {
        self.head
    }

    /// The serial number expected next.
    #[inline]
    pub fn expected_sn(&self) -> Sn16 {
        self.head.next()
    }

    /// The window given at construction (after capping).
    #[inline]
    pub fn max_window(&self) -> u16 {
        self.max_window
    }

    /// Number of elements held out of order.
    #[inline]
    pub fn num_held(&self) -> usize {
        self.num_held
    }

    /// Offers the element numbered `sn`.
    pub fn insert(&mut self, sn: Sn16, elem: T) -> FragInsert<T> {
        let d = sn.distance(self.head);
        if d <= 0 {
            return FragInsert::Duplicate(elem);
        }
        if d == 1 {
            if let Some(Some(_)) = self.held.front() {
                // Already held: the caller was told `Ready` and has not pulled everything yet.
                return FragInsert::Duplicate(elem);
            }
            self.head = sn;
            // Drop the (empty) slot of `sn` and look at the one after.
            self.held.pop_front();
            return if matches!(self.held.front(), Some(Some(_))) {
                FragInsert::Ready(elem)
            } else {
                FragInsert::InOrder(elem)
            };
        }
        if d > i32::from(self.max_window) {
            return FragInsert::OutOfWindow(elem);
        }
        // d is in 2..=32767, so the index fits.
        let idx = (d - 1) as usize;
        if self.held.len() <= idx {
            self.held.resize_with(idx + 1, || None);
        }
        match &mut self.held[idx] {
            Some(_) => FragInsert::Duplicate(elem),
            slot @ None => {
                *slot = Some(elem);
                self.num_held += 1;
                FragInsert::Held
            }
        }
    }

    /// Takes the held element numbered `head + 1`, if it is there, and advances the head to it.
    pub fn pull(&mut self) -> Option<T> {
        let elem = self.held.front_mut()?.take()?;
        self.held.pop_front();
        self.num_held -= 1;
        self.head = self.head.next();
        Some(elem)
    }

    /// Removes every held element, handing them to `sink` in serial-number order. The head does
    /// not move.
    pub fn purge(&mut self, mut sink: impl FnMut(T)) {
        self.purge_with_sn(|_, elem| sink(elem));
    }

    /// As [`purge`](Self::purge), also passing each element's serial number.
    pub fn purge_with_sn(&mut self, mut sink: impl FnMut(Sn16, T)) {
        let mut sn = self.head;
        self.num_held = 0;
        for slot in self.held.drain(..) {
            sn = sn.next();
            if let Some(elem) = slot {
                sink(sn, elem);
            }
        }
    }
}

impl<T> fmt::Debug for FragList<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FragList")
            .field("head", &self.head)
            .field("max_window", &self.max_window)
            .field("num_held", &self.num_held)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn serial_compare_wraps() {
        let (a, b) = (Sn16(65534), Sn16(2));
        assert!(a.lt(b) && a.le(b) && b.gt(a) && b.ge(a));
        assert!(!b.lt(a) && a.le(a) && a.ge(a) && !a.gt(a));
        assert_eq!(b.distance(a), 4);
        assert_eq!(a.distance(b), -4);
        assert_eq!(Sn16(65535).next(), Sn16(0));
        assert_eq!(Sn16(65530).add(10), Sn16(4));
        assert_eq!(Sn16(0).distance(Sn16(32768)), -32768);
        assert_eq!(Sn16(7).to_string(), "7");
    }

    #[test]
    fn in_order_out_of_order_across_wrap() {
        let mut fl = FragList::new(Sn16(65533), 16);
        assert_eq!(fl.insert(Sn16(65534), 'a'), FragInsert::InOrder('a'));
        assert_eq!(fl.insert(Sn16(1), 'd'), FragInsert::Held);
        assert_eq!(fl.insert(Sn16(0), 'c'), FragInsert::Held);
        assert_eq!(fl.insert(Sn16(0), 'x'), FragInsert::Duplicate('x'));
        assert_eq!(fl.insert(Sn16(65534), 'y'), FragInsert::Duplicate('y'));
        assert_eq!(fl.num_held(), 2);
        assert_eq!(fl.pull(), None);
        assert_eq!(fl.insert(Sn16(65535), 'b'), FragInsert::Ready('b'));
        assert_eq!(fl.pull(), Some('c'));
        assert_eq!(fl.pull(), Some('d'));
        assert_eq!(fl.pull(), None);
        assert_eq!(fl.head_sn(), Sn16(1));
        assert_eq!(fl.num_held(), 0);
    }

    #[test]
    fn gap_after_next_gives_in_order() {
        let mut fl = FragList::new(Sn16(10), 8);
        assert_eq!(fl.insert(Sn16(13), 3), FragInsert::Held);
        assert_eq!(fl.insert(Sn16(11), 1), FragInsert::InOrder(1));
        assert_eq!(fl.pull(), None);
        assert_eq!(fl.insert(Sn16(12), 2), FragInsert::Ready(2));
        assert_eq!(fl.insert(Sn16(13), 33), FragInsert::Duplicate(33), "held, not yet pulled");
        assert_eq!(fl.num_held(), 1);
        assert_eq!(fl.pull(), Some(3));
        assert_eq!(fl.expected_sn(), Sn16(14));
    }

    #[test]
    fn window_limits() {
        let mut fl = FragList::new(Sn16(100), 4);
        assert_eq!(fl.insert(Sn16(105), ()), FragInsert::OutOfWindow(()));
        assert_eq!(fl.insert(Sn16(104), ()), FragInsert::Held);
        // Half the space or more ahead reads as behind: a duplicate, never a panic.
        assert_eq!(fl.insert(Sn16(100 + 40000), ()), FragInsert::Duplicate(()));
        let mut zero = FragList::new(Sn16(0), 0);
        assert_eq!(zero.insert(Sn16(2), 2), FragInsert::OutOfWindow(2));
        assert_eq!(zero.insert(Sn16(1), 1), FragInsert::InOrder(1));
        assert_eq!(FragList::<()>::new(Sn16(0), u16::MAX).max_window(), 32767);
        let mut big = FragList::new(Sn16(0), u16::MAX);
        assert_eq!(big.insert(Sn16(32767), 1), FragInsert::Held);
        assert_eq!(big.insert(Sn16(32768), 2), FragInsert::Duplicate(2));
    }

    #[test]
    fn purge_hands_back_in_order() {
        let mut fl = FragList::new(Sn16(65535), 10);
        fl.insert(Sn16(3), 'c');
        fl.insert(Sn16(1), 'a');
        let mut out = Vec::new();
        fl.purge_with_sn(|sn, e| out.push((sn, e)));
        assert_eq!(out, [(Sn16(1), 'a'), (Sn16(3), 'c')]);
        assert_eq!(fl.num_held(), 0);
        assert_eq!(fl.head_sn(), Sn16(65535));
        assert_eq!(fl.insert(Sn16(0), 'z'), FragInsert::InOrder('z'));
        fl.insert(Sn16(2), 'b');
        let mut plain = Vec::new();
        fl.purge(|e| plain.push(e));
        assert_eq!(plain, ['b']);
        assert!(format!("{fl:?}").contains("head"));
    }
}
