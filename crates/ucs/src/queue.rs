//! FIFO queue that allows removal while iterating (UCX `ucs_queue`).
//!
//! UCX's queue is intrusive: elements embed the link and the caller may unlink the element it is
//! looking at during a walk. [`Queue`] owns its elements instead, so "remove while iterating"
//! becomes [`Queue::retain`], [`Queue::extract_if`] and [`Queue::remove_first`], each of which
//! walks in FIFO order and keeps the order of what stays.
//!
//! Storage is a ring buffer: once its capacity covers the high-water mark, `push`, `pop` and the
//! removal walks allocate nothing.

use std::collections::{vec_deque, VecDeque};
use std::fmt;

/// An owning FIFO queue with in-order removal while iterating.
///
/// Single-thread structure: mutation takes `&mut self`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Queue<T> {
    items: VecDeque<T>,
}

impl<T> Queue<T> {
    /// An empty queue; allocates nothing until the first push.
    pub const fn new() -> Self {
        Queue { items: VecDeque::new() }
    }

    /// An empty queue that can hold `n` elements before it allocates again.
    pub fn with_capacity(n: usize) -> Self {
        Queue { items: VecDeque::with_capacity(n) }
    }

    /// Appends `elem` at the tail.
    #[inline]
    pub fn push(&mut self, elem: T) {
        self.items.push_back(elem);
    }

    /// Inserts `elem` at the head, so the next [`pop`](Self::pop) returns it.
    #[inline]
    pub fn push_front(&mut self, elem: T) {
        self.items.push_front(elem);
    }

    /// Removes and returns the head element.
    #[inline]
    pub fn pop(&mut self) -> Option<T> {
        self.items.pop_front()
    }

    /// The head element, if any.
    #[inline]
    pub fn peek(&self) -> Option<&T> {
        self.items.front()
    }

    /// The head element, mutably.
    #[inline]
    pub fn peek_mut(&mut self) -> Option<&mut T> {
        self.items.front_mut()
    }

    /// The tail element (the most recently pushed one), if any.
    #[inline]
    pub fn peek_back(&self) -> Option<&T> {
        self.items.back()
    }

    /// Number of elements.
    #[inline]
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when the queue holds nothing.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// How many elements fit before the queue allocates again.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.items.capacity()
    }

    /// Makes room for at least `additional` more elements.
    pub fn reserve(&mut self, additional: usize) {
        self.items.reserve(additional);
    }

    /// Iterates head to tail.
    pub fn iter(&self) -> Iter<'_, T> {
        Iter { inner: self.items.iter() }
    }

    /// Iterates head to tail with mutable access.
    pub fn iter_mut(&mut self) -> IterMut<'_, T> {
        IterMut { inner: self.items.iter_mut() }
    }

    /// Keeps only the elements for which `keep` returns true, visiting head to tail; the kept
    /// elements stay in their order.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        self.items.retain_mut(|e| keep(e));
    }

    /// Walks head to tail and moves every element for which `pred` returns true into `sink`,
    /// in queue order; the others stay, in their order.
    ///
    /// This is UCX's "iterate safely and unlink": `pred` sees each element once and may modify
    /// it, `sink` takes ownership of the removed ones. If `pred` or `sink` panics, every element
    /// not yet handed to `sink` is still in the queue, in its original order.
    pub fn extract_if(&mut self, mut pred: impl FnMut(&mut T) -> bool, mut sink: impl FnMut(T)) {
        // Rotating through the ring (pop the head, keep it by pushing it back at the tail) visits
        // every element once, preserves order, and never grows past the current capacity.
        let mut rotation = Rotation { items: &mut self.items, remaining: 0 };
        rotation.remaining = rotation.items.len();
        while rotation.remaining > 0 {
            // `pred` runs on the element in place so that, should it unwind, the element is
            // still queued and counted as unvisited.
            let Some(front) = rotation.items.front_mut() else {
                break;
            };
            let take = pred(front);
            rotation.remaining -= 1;
            let Some(elem) = rotation.items.pop_front() else {
                break;
            };
            if take {
                sink(elem);
            } else {
                rotation.items.push_back(elem);
            }
        }
    }

    /// Removes and returns the first element (from the head) for which `pred` returns true.
    pub fn remove_first(&mut self, pred: impl FnMut(&mut T) -> bool) -> Option<T> {
        let pos = self.items.iter_mut().position(pred)?;
        self.items.remove(pos)
    }

    /// Removes every element, keeping the capacity.
    pub fn clear(&mut self) {
        self.items.clear();
    }

    /// Removes every element, handing them to `sink` head to tail; keeps the capacity.
    pub fn drain_into(&mut self, mut sink: impl FnMut(T)) {
        for elem in self.items.drain(..) {
            sink(elem);
        }
    }
}

/// Finishes an [`Queue::extract_if`] walk if a callback unwinds, so the kept elements end up in
/// their original order instead of rotated.
struct Rotation<'a, T> {
    items: &'a mut VecDeque<T>,
    /// Elements at the head not yet visited; everything behind them was kept.
    remaining: usize,
}

impl<T> Drop for Rotation<'_, T> {
    fn drop(&mut self) {
        // On normal exit `remaining` is 0 and this is a no-op. On unwind the unvisited elements
        // sit at the head, ahead of the kept ones, and must move behind them.
        let n = self.remaining.min(self.items.len());
        self.items.rotate_left(n);
    }
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.items.iter()).finish()
    }
}

impl<T> Extend<T> for Queue<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, iter: I) {
        self.items.extend(iter);
    }
}

impl<T> FromIterator<T> for Queue<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        Queue { items: iter.into_iter().collect() }
    }
}

/// Borrowing iterator over a [`Queue`], head to tail.
#[derive(Clone)]
pub struct Iter<'a, T> {
    inner: vec_deque::Iter<'a, T>,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;
    #[inline]
    fn next(&mut self) -> Option<&'a T> {
        self.inner.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<T> DoubleEndedIterator for Iter<'_, T> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back()
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}

/// Mutably borrowing iterator over a [`Queue`], head to tail.
pub struct IterMut<'a, T> {
    inner: vec_deque::IterMut<'a, T>,
}

impl<'a, T> Iterator for IterMut<'a, T> {
    type Item = &'a mut T;
    #[inline]
    fn next(&mut self) -> Option<&'a mut T> {
        self.inner.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<T> DoubleEndedIterator for IterMut<'_, T> {
    fn next_back(&mut self) -> Option<Self::Item> {
        self.inner.next_back()
    }
}

impl<T> ExactSizeIterator for IterMut<'_, T> {}

/// Owning iterator over a [`Queue`], head to tail.
pub struct IntoIter<T> {
    inner: vec_deque::IntoIter<T>,
}

impl<T> Iterator for IntoIter<T> {
    type Item = T;
    #[inline]
    fn next(&mut self) -> Option<T> {
        self.inner.next()
    }
    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl<T> DoubleEndedIterator for IntoIter<T> {
    fn next_back(&mut self) -> Option<T> {
        self.inner.next_back()
    }
}

impl<T> ExactSizeIterator for IntoIter<T> {}

impl<T> IntoIterator for Queue<T> {
    type Item = T;
    type IntoIter = IntoIter<T>;
    fn into_iter(self) -> IntoIter<T> {
        IntoIter { inner: self.items.into_iter() }
    }
}

impl<'a, T> IntoIterator for &'a Queue<T> {
    type Item = &'a T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

impl<'a, T> IntoIterator for &'a mut Queue<T> {
    type Item = &'a mut T;
    type IntoIter = IterMut<'a, T>;
    fn into_iter(self) -> IterMut<'a, T> {
        self.iter_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fifo_and_push_front() {
        let mut q = Queue::new();
        assert!(q.is_empty() && q.pop().is_none() && q.peek().is_none());
        q.push(1);
        q.push(2);
        q.push_front(0);
        assert_eq!(q.peek(), Some(&0));
        *q.peek_mut().unwrap() = 10;
        assert_eq!(q.len(), 3);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), [10, 1, 2]);
        assert_eq!(q.pop(), Some(10));
        assert_eq!(q.into_iter().collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn extract_if_keeps_order_and_feeds_sink_in_order() {
        let mut q: Queue<i32> = (0..10).collect();
        let mut out = Vec::new();
        q.extract_if(
            |e| {
                *e *= 10;
                *e % 20 == 0
            },
            |e| out.push(e),
        );
        assert_eq!(out, [0, 20, 40, 60, 80]);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), [10, 30, 50, 70, 90]);
    }

    #[test]
    fn extract_if_panic_keeps_unvisited_in_order() {
        let mut q: Queue<i32> = (0..6).collect();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            q.extract_if(
                |e| {
                    assert!(*e != 3, "boom");
                    *e == 1
                },
                drop,
            )
        }));
        assert!(r.is_err());
        // 1 was extracted before the panic; everything else is still there, in order.
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), [0, 2, 3, 4, 5]);
    }

    #[test]
    fn retain_remove_first_clear() {
        let mut q: Queue<i32> = (0..8).collect();
        q.retain(|e| *e % 2 == 1);
        assert_eq!(q.iter().copied().collect::<Vec<_>>(), [1, 3, 5, 7]);
        assert_eq!(q.remove_first(|e| *e > 2), Some(3));
        assert_eq!(q.remove_first(|e| *e > 100), None);
        for e in &mut q {
            *e += 1;
        }
        assert_eq!((&q).into_iter().copied().collect::<Vec<_>>(), [2, 6, 8]);
        let cap = q.capacity();
        q.clear();
        assert!(q.is_empty());
        assert_eq!(q.capacity(), cap);
        q.extend([4, 5]);
        let mut v = Vec::new();
        q.drain_into(|e| v.push(e));
        assert_eq!(v, [4, 5]);
    }

    #[test]
    fn no_growth_once_warm() {
        let mut q = Queue::with_capacity(4);
        let cap = q.capacity();
        for round in 0..100 {
            for i in 0..4 {
                q.push(round * 4 + i);
            }
            q.extract_if(|e| *e % 2 == 0, drop);
            while q.pop().is_some() {}
        }
        assert_eq!(q.capacity(), cap);
        assert_eq!(format!("{:?}", Queue::<u8>::default()), "[]");
    }
}
