//! Index -> object table with O(1) insert and remove and generation-checked ids.
//!
//! UCX hands out small integer ids for objects a peer may later name (memory keys, request ids,
//! endpoint ids). A peer can name an object that has since been removed, or send garbage; the
//! id therefore carries the generation of its slot, and a lookup only succeeds while the slot
//! still holds the object the id was issued for.
//!
//! Layout: a vector of slots; vacant slots form a LIFO free list, so insert and remove are O(1)
//! and reuse memory without allocating once the table reached its high-water mark.

use std::fmt;

/// Identifier of an [`IdTable`] entry: slot index in the low 32 bits, slot generation in the
/// high 32 bits.
///
/// Generations start at 1, so `Id::from_raw(0)` never names a live entry and can serve as a
/// "no object" value on the wire.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Id(u64);

impl Id {
    /// Reinterprets a raw value, e.g. one received from a peer. Any value is accepted; a bad one
    /// simply matches no entry.
    #[inline]
    pub const fn from_raw(raw: u64) -> Id {
        Id(raw)
    }

    /// The raw value, for sending to a peer.
    #[inline]
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// Slot index part.
    #[inline]
    pub const fn index(self) -> u32 {
        self.0 as u32
    }

    /// Generation part.
    #[inline]
    pub const fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }

    const fn new(index: u32, generation: u32) -> Id {
        Id(((generation as u64) << 32) | index as u64)
    }
}

impl fmt::Debug for Id {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Id({}#{})", self.index(), self.generation())
    }
}

enum Entry<T> {
    Occupied(T),
    /// Next vacant slot index, or `NONE`.
    Vacant(u32),
}

struct Slot<T> {
    generation: u32,
    entry: Entry<T>,
}

const NONE: u32 = u32::MAX;

/// Table mapping generation-checked [`Id`]s to objects.
///
/// Single-thread structure: mutation takes `&mut self`.
pub struct IdTable<T> {
    slots: Vec<Slot<T>>,
    free_head: u32,
    len: usize,
}

impl<T> IdTable<T> {
    /// An empty table; allocates nothing until the first insert.
    pub const fn new() -> Self {
        IdTable { slots: Vec::new(), free_head: NONE, len: 0 }
    }

    /// An empty table with room for `n` entries before it allocates.
    pub fn with_capacity(n: usize) -> Self {
        IdTable { slots: Vec::with_capacity(n), free_head: NONE, len: 0 }
    }

    /// Stores `value` and returns its id.
    ///
    /// # Panics
    /// If the table already holds `u32::MAX` entries (index space exhausted; memory runs out
    /// long before that for any real payload).
    #[inline(always)]
    pub fn insert(&mut self, value: T) -> Id {
        match self.try_insert(value) {
            Ok(id) => id,
            // Moved out, so no drop glue for the whole result runs on the common path.
            Err(value) => Self::exhausted(value),
        }
    }

    #[cold]
    #[inline(never)]
    fn exhausted(_value: T) -> ! {
        panic!("IdTable index space exhausted")
    }

    /// Stores `value` and returns its id, or gives the value back when the index space (`u32`,
    /// minus one reserved value) is exhausted.
    #[inline(always)]
    pub fn try_insert(&mut self, value: T) -> Result<Id, T> {
        // The common case (a free slot to reuse) inline, so the value is built in place.
        let index = self.free_head;
        if let Some(slot) = self.slots.get_mut(index as usize) {
            if let Entry::Vacant(next) = slot.entry {
                self.free_head = next;
                slot.entry = Entry::Occupied(value);
                self.len += 1;
                return Ok(Id::new(index, slot.generation));
            }
        }
        self.insert_grow(value)
    }

    /// The slot index the next [`insert`](Self::insert) uses (the id's generation is known
    /// only then), for structures that link the new entry before it is stored.
    #[inline]
    pub fn next_index(&self) -> u32 {
        if (self.free_head as usize) < self.slots.len() {
            self.free_head
        } else {
            self.slots.len() as u32
        }
    }

    /// The id the next [`insert`](Self::insert) returns, for callers that must hand the id out
    /// (to a transport, say) before the value exists. Valid until the table changes.
    pub fn next_id(&self) -> Id {
        match self.slots.get(self.free_head as usize) {
            Some(slot) => Id::new(self.free_head, slot.generation),
            None => Id::new(self.slots.len() as u32, 1),
        }
    }

    /// `try_insert` without a free slot: a new one at the end.
    #[inline(never)]
    fn insert_grow(&mut self, value: T) -> Result<Id, T> {
        if (self.free_head as usize) < self.slots.len() {
            // The free list only links vacant slots; refuse rather than overwrite.
            return Err(value);
        }
        let Ok(index) = u32::try_from(self.slots.len()) else {
            return Err(value);
        };
        if index == NONE {
            return Err(value);
        }
        self.slots.push(Slot { generation: 1, entry: Entry::Occupied(value) });
        self.len += 1;
        Ok(Id::new(index, 1))
    }

    fn slot(&self, id: Id) -> Option<&Slot<T>> {
        self.slots.get(id.index() as usize).filter(|s| s.generation == id.generation())
    }

    /// The object `id` names, if it is still in the table.
    #[inline]
    pub fn get(&self, id: Id) -> Option<&T> {
        match &self.slot(id)?.entry {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    /// The object `id` names, mutably.
    #[inline]
    pub fn get_mut(&mut self, id: Id) -> Option<&mut T> {
        let slot = self.slots.get_mut(id.index() as usize).filter(|s| s.generation == id.generation())?;
        match &mut slot.entry {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    /// True if `id` names a live entry.
    #[inline]
    pub fn contains(&self, id: Id) -> bool {
        self.get(id).is_some()
    }

    /// Removes the object `id` names and drops it in place (no move); false if there was none.
    /// The slot's generation is bumped as by [`IdTable::remove`].
    #[inline]
    pub fn discard(&mut self, id: Id) -> bool {
        match self.occupied(id) {
            Some(o) => {
                o.discard();
                true
            }
            None => false,
        }
    }

    /// The object `id` names, to read or change and then perhaps free under the same lookup.
    #[inline]
    pub fn occupied(&mut self, id: Id) -> Option<Occupied<'_, T>> {
        if self.slots.get(id.index() as usize)?.generation != id.generation() {
            return None;
        }
        self.occupied_at(id.index())
    }

    /// The object in slot `index`, whatever its generation: for structures that link a table's
    /// objects by slot index (an object stays in its slot while it is in the table).
    #[inline]
    pub fn get_at_mut(&mut self, index: u32) -> Option<&mut T> {
        match &mut self.slots.get_mut(index as usize)?.entry {
            Entry::Occupied(v) => Some(v),
            Entry::Vacant(_) => None,
        }
    }

    /// [`IdTable::occupied`] by slot index, whatever the generation ([`Occupied::id`] gives the
    /// object's id).
    #[inline]
    pub fn occupied_at(&mut self, index: u32) -> Option<Occupied<'_, T>> {
        match self.slots.get(index as usize)?.entry {
            Entry::Occupied(_) => Some(Occupied { table: self, index }),
            Entry::Vacant(_) => None,
        }
    }

    /// Removes and returns the object `id` names. The slot's generation is bumped, so `id` and
    /// every copy of it stop matching.
    #[inline]
    pub fn remove(&mut self, id: Id) -> Option<T> {
        let index = id.index();
        let slot = self.slots.get_mut(index as usize).filter(|s| s.generation == id.generation())?;
        if matches!(slot.entry, Entry::Vacant(_)) {
            return None;
        }
        let Entry::Occupied(value) = std::mem::replace(&mut slot.entry, Entry::Vacant(self.free_head)) else {
            return None;
        };
        // Skip 0 on wrap-around so a raw id of 0 stays invalid forever.
        slot.generation = match slot.generation.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.free_head = index;
        self.len -= 1;
        Some(value)
    }

    /// Number of live entries.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when no entry is live.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Iterates the live entries in slot order.
    pub fn iter(&self) -> impl Iterator<Item = (Id, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| match &s.entry {
            // Indexes fit u32: try_insert never creates a slot beyond u32::MAX - 1.
            Entry::Occupied(v) => Some((Id::new(i as u32, s.generation), v)),
            Entry::Vacant(_) => None,
        })
    }

    /// Iterates the live entries in slot order, mutably.
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (Id, &mut T)> + '_ {
        self.slots.iter_mut().enumerate().filter_map(|(i, s)| match &mut s.entry {
            Entry::Occupied(v) => Some((Id::new(i as u32, s.generation), v)),
            Entry::Vacant(_) => None,
        })
    }

    /// Removes every entry, handing each to `sink`; all outstanding ids become stale.
    pub fn drain(&mut self, mut sink: impl FnMut(Id, T)) {
        for i in 0..self.slots.len() {
            let id = Id::new(i as u32, self.slots[i].generation);
            if let Some(v) = self.remove(id) {
                sink(id, v);
            }
        }
    }
}

/// A live entry of an [`IdTable`] ([`IdTable::occupied`]): its object, and freeing it, without
/// looking the id up again.
pub struct Occupied<'a, T> {
    table: &'a mut IdTable<T>,
    /// A slot holding an object (checked when made; the table cannot change meanwhile).
    index: u32,
}

impl<T> Occupied<'_, T> {
    #[inline(always)]
    fn slot(&mut self) -> &mut Slot<T> {
        // SAFETY: `index` named an occupied slot when this was made, and the table is borrowed
        // mutably by `self` since, so it still does.
        unsafe { self.table.slots.get_unchecked_mut(self.index as usize) }
    }

    /// The object's id.
    #[inline(always)]
    pub fn id(&mut self) -> Id {
        let index = self.index;
        Id::new(index, self.slot().generation)
    }

    /// The object.
    #[inline(always)]
    pub fn get_mut(&mut self) -> &mut T {
        match &mut self.slot().entry {
            Entry::Occupied(v) => v,
            // SAFETY: made only for an occupied slot, which stays occupied while `self` borrows
            // the table (see `slot`); `Occupied` has no way to vacate it short of consuming
            // itself.
            Entry::Vacant(_) => unsafe { std::hint::unreachable_unchecked() },
        }
    }

    /// Removes the object, dropping it in place; its id and every copy stop matching.
    #[inline(always)]
    pub fn discard(self) {
        self.vacate(true)
    }

    /// [`Occupied::discard`] without running the object's destructor: for objects the caller
    /// knows own nothing (no heap parts, no handles), where skipping the drop glue saves time
    /// on a hot path. For anything else, the owned parts leak.
    #[inline(always)]
    pub fn discard_owning_nothing(self) {
        self.vacate(false)
    }

    #[inline(always)]
    fn vacate(mut self, run_drop: bool) {
        let free_head = self.table.free_head;
        let index = self.index;
        let slot = self.slot();
        if run_drop {
            slot.entry = Entry::Vacant(free_head);
        } else {
            std::mem::forget(std::mem::replace(&mut slot.entry, Entry::Vacant(free_head)));
        }
        slot.generation = match slot.generation.wrapping_add(1) {
            0 => 1,
            g => g,
        };
        self.table.free_head = index;
        self.table.len -= 1;
    }
}

impl<T> Default for IdTable<T> {
    fn default() -> Self {
        IdTable::new()
    }
}

impl<T: fmt::Debug> fmt::Debug for IdTable<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let mut t = IdTable::new();
        let a = t.insert("a");
        let b = t.insert("b");
        assert_ne!(a, b);
        assert_eq!(t.len(), 2);
        assert_eq!(t.get(a), Some(&"a"));
        *t.get_mut(b).unwrap() = "B";
        assert_eq!(t.remove(b), Some("B"));
        assert_eq!(t.remove(b), None);
        assert_eq!(t.get(b), None);
        assert_eq!(t.len(), 1);
        assert!(!t.is_empty());
    }

    #[test]
    fn next_id_names_the_next_insert() {
        let mut t = IdTable::new();
        for round in 0..3 {
            let want = t.next_id();
            let a = t.insert(round);
            assert_eq!(a, want, "fresh slot, round {round}");
            let want = t.next_id();
            let b = t.insert(round);
            assert_eq!(b, want);
            t.remove(a);
            // A reused slot: its bumped generation.
            assert_eq!(t.next_id(), Id::new(a.index(), a.generation() + 1));
            assert_eq!(t.insert(round), Id::new(a.index(), a.generation() + 1));
        }
    }

    #[test]
    fn discard_drops_in_place_and_invalidates() {
        let mut t = IdTable::new();
        let rc = std::rc::Rc::new(());
        let a = t.insert(rc.clone());
        assert_eq!(std::rc::Rc::strong_count(&rc), 2);
        assert!(t.discard(a));
        assert_eq!(std::rc::Rc::strong_count(&rc), 1, "dropped");
        assert!(!t.discard(a));
        assert!(t.get(a).is_none());
        let b = t.insert(rc.clone());
        assert_ne!(a, b, "the slot is reused under a new generation");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn occupied_entries_change_and_free_under_one_lookup() {
        let mut t = IdTable::new();
        let rc = std::rc::Rc::new(());
        let a = t.insert((1, rc.clone()));
        let b = t.insert((2, rc.clone()));
        t.occupied(a).unwrap().get_mut().0 = 10;
        assert_eq!(t.get(a).map(|v| v.0), Some(10));
        t.occupied(a).unwrap().discard();
        assert_eq!(std::rc::Rc::strong_count(&rc), 2, "dropped in place");
        let d = t.insert((4, std::rc::Rc::new(())));
        let leaked = std::rc::Rc::downgrade(&t.get(d).unwrap().1);
        t.occupied(d).unwrap().discard_owning_nothing();
        assert!(leaked.upgrade().is_some() && t.get(d).is_none(), "freed without its destructor");
        assert!(t.occupied(a).is_none() && t.get(a).is_none(), "the id no longer matches");
        assert_eq!((t.len(), t.get(b).map(|v| v.0)), (1, Some(2)));
        let c = t.insert((3, rc.clone()));
        assert_eq!(c.index(), d.index(), "the last freed slot is reused first");
        assert!(t.occupied(a).is_none(), "under a new generation");
    }

    #[test]
    fn slots_are_reached_by_index_whatever_the_generation() {
        let mut t = IdTable::new();
        let a = t.insert(1);
        *t.get_at_mut(a.index()).unwrap() = 5;
        assert_eq!(t.occupied_at(a.index()).unwrap().id(), a);
        t.remove(a);
        assert!(t.get_at_mut(a.index()).is_none() && t.occupied_at(a.index()).is_none(), "vacant");
        assert!(t.get_at_mut(7).is_none() && t.occupied_at(7).is_none(), "beyond the table");
        let b = t.insert(2);
        assert_eq!(b.index(), a.index());
        let mut e = t.occupied_at(b.index()).unwrap();
        assert_eq!((e.id(), *e.get_mut()), (b, 2), "the new generation's object and id");
    }

    #[test]
    fn next_index_is_the_slot_the_next_insert_takes() {
        let mut t = IdTable::new();
        assert_eq!(t.next_index(), 0, "empty: the first slot");
        let ids: Vec<Id> = (0..4).map(|i| t.insert(i)).collect();
        assert_eq!(t.next_index(), 4, "no free slot: a new one at the end");
        t.remove(ids[1]);
        t.remove(ids[3]);
        for _ in 0..3 {
            let at = t.next_index();
            assert_eq!(t.insert(9).index(), at, "freed slots (latest first), then the end");
        }
        assert_eq!(t.next_index(), 5);
    }

    #[test]
    fn stale_ids_are_rejected_after_reuse() {
        let mut t = IdTable::new();
        let a = t.insert(1);
        t.remove(a);
        let b = t.insert(2);
        assert_eq!(a.index(), b.index(), "slot is reused");
        assert_ne!(a.generation(), b.generation());
        assert_eq!(t.get(a), None);
        assert_eq!(t.get_mut(a), None);
        assert_eq!(t.remove(a), None);
        assert_eq!(t.get(b), Some(&2));
    }

    #[test]
    fn garbage_ids_never_panic() {
        let mut t = IdTable::new();
        let a = t.insert(5u8);
        for raw in [0, 1, u64::MAX, u32::MAX as u64, 1 << 32, a.raw() + 1, a.raw() ^ (1 << 40)] {
            let id = Id::from_raw(raw);
            if id != a {
                assert_eq!(t.get(id), None, "{id:?}");
                assert_eq!(t.remove(id), None);
            }
        }
        assert_eq!(Id::from_raw(a.raw()), a);
        assert_eq!(t.get(Id::from_raw(0)), None);
    }

    #[test]
    fn iter_and_drain() {
        let mut t = IdTable::with_capacity(4);
        let ids: Vec<Id> = (0..5).map(|i| t.insert(i)).collect();
        t.remove(ids[1]);
        let seen: Vec<(Id, i32)> = t.iter().map(|(id, v)| (id, *v)).collect();
        assert_eq!(seen, [(ids[0], 0), (ids[2], 2), (ids[3], 3), (ids[4], 4)]);
        for (_, v) in t.iter_mut() {
            *v += 10;
        }
        let mut out = Vec::new();
        t.drain(|id, v| out.push((id, v)));
        assert_eq!(out.len(), 4);
        assert_eq!(out[0], (ids[0], 10));
        assert!(t.is_empty());
        assert!(ids.iter().all(|&id| !t.contains(id)));
        assert_eq!(format!("{t:?}"), "{}");
    }

    #[test]
    fn generation_skips_zero_on_wrap() {
        let mut t = IdTable::new();
        let a = t.insert(());
        t.slots[0].generation = u32::MAX;
        let top = Id::new(a.index(), u32::MAX);
        assert_eq!(t.remove(top), Some(()));
        let b = t.insert(());
        assert_eq!(b.generation(), 1);
    }
}
