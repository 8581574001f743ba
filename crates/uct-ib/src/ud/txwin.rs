//! The send window: packets sent and not yet acknowledged, kept for resending.
//!
//! Slot `i` holds the packet numbered `first + i`, so lookup by sequence number is one
//! subtraction. Buffers of acknowledged packets go to a free list and are reused, so once the
//! window has been as large as it gets, sending allocates nothing.

use std::collections::VecDeque;

use ucs::fraglist::Sn16;

pub(crate) struct TxWindow {
    /// Packets `first ..= first + slots.len() - 1`, header included.
    slots: VecDeque<Vec<u8>>,
    /// Sequence number of `slots[0]`.
    first: Sn16,
    /// Buffers of released packets, ready for reuse.
    free: Vec<Vec<u8>>,
    /// Capacity given to new buffers (largest packet).
    buf_capacity: usize,
}

impl std::fmt::Debug for TxWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TxWindow").field("first", &self.first).field("len", &self.slots.len()).finish()
    }
}

impl TxWindow {
    pub(crate) fn new(first: Sn16, buf_capacity: usize) -> Self {
        TxWindow { slots: VecDeque::new(), first, free: Vec::new(), buf_capacity }
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Appends an empty packet buffer for the next sequence number.
    pub(crate) fn push(&mut self) -> &mut Vec<u8> {
        let mut buf = self.free.pop().unwrap_or_else(|| Vec::with_capacity(self.buf_capacity));
        buf.clear();
        self.slots.push_back(buf);
        let last = self.slots.len() - 1;
        &mut self.slots[last]
    }

    /// Takes back the packet appended last (it was not sent after all).
    pub(crate) fn pop_back(&mut self) {
        if let Some(buf) = self.slots.pop_back() {
            self.free.push(buf);
        }
    }

    /// The packet appended last.
    pub(crate) fn back(&self) -> &[u8] {
        self.slots.back().map_or(&[], |b| b.as_slice())
    }

    /// The packet numbered `psn`, if it is in the window.
    pub(crate) fn get_mut(&mut self, psn: Sn16) -> Option<&mut Vec<u8>> {
        let d = psn.distance(self.first);
        if d < 0 {
            return None;
        }
        self.slots.get_mut(d as usize)
    }

    /// Releases every packet up to and including `psn`.
    pub(crate) fn release_through(&mut self, psn: Sn16) {
        while !self.slots.is_empty() && self.first.le(psn) {
            if let Some(buf) = self.slots.pop_front() {
                self.free.push(buf);
            }
            self.first = self.first.next();
        }
    }

    /// Releases everything; the next packet appended is numbered `next`.
    pub(crate) fn clear(&mut self, next: Sn16) {
        while let Some(buf) = self.slots.pop_front() {
            self.free.push(buf);
        }
        self.first = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_sequence_numbers_across_wrap() {
        let mut w = TxWindow::new(Sn16(65534), 16);
        for i in 0..4u8 {
            w.push().push(i);
        }
        assert_eq!(w.len(), 4);
        assert_eq!(w.back(), &[3]);
        assert_eq!(w.get_mut(Sn16(0)).map(|b| b[0]), Some(2));
        assert_eq!(w.get_mut(Sn16(65533)), None);
        assert_eq!(w.get_mut(Sn16(2)), None);
        w.release_through(Sn16(65535));
        assert_eq!(w.len(), 2);
        assert_eq!(w.get_mut(Sn16(0)).map(|b| b[0]), Some(2));
        w.pop_back();
        assert_eq!(w.back(), &[2]);
        // The buffers come back from the free list.
        let cap = w.free.len();
        w.push();
        assert_eq!(w.free.len(), cap - 1);
        w.clear(Sn16(9));
        assert!(w.is_empty());
        assert_eq!(w.back(), &[] as &[u8]);
        w.release_through(Sn16(100));
        w.push().push(7);
        assert_eq!(w.get_mut(Sn16(9)).map(|b| b[0]), Some(7));
    }
}
