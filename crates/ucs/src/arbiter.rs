//! Fair round-robin scheduling over groups of pending elements (UCX `ucs_arbiter`).
//!
//! A transport keeps one group per endpoint holding the operations that could not start for lack
//! of resources. When resources come back, the arbiter offers the head element of each scheduled
//! group in turn, so one busy endpoint cannot starve the others. The callback's [`ArbResult`]
//! says what happens next: the element is done, the group should wait for its next turn, the
//! group should leave the schedule until rescheduled, or dispatching should stop.
//!
//! Two ways to dispatch:
//! - [`Arbiter::dispatch`] / [`Arbiter::dispatch_remove`] run a closure over the schedule. The
//!   closure borrows nothing of the arbiter, so it cannot push to it.
//! - [`Arbiter::pop_next`] + [`Arbiter::resolve`] step from outside, for callbacks that must push
//!   to the same arbiter (a pending send that splits, or queues a follow-up on another endpoint).
//!   See [`Arbiter::begin_pass`] for the bounded loop.
//!
//! Layout: groups live in a vector (freed slots are reused together with their element ring,
//! so churn of endpoints does not allocate), and the schedule is a doubly-linked list threaded
//! through the groups by index, so schedule, deschedule and "move to tail" are O(1).

use std::collections::VecDeque;
use std::fmt;

const INDEX_BITS: u32 = 24;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
const GEN_MASK: u32 = u32::MAX >> INDEX_BITS;
const NIL: u32 = u32::MAX;

/// Handle of an arbiter group: slot index in the low 24 bits, slot generation in the high 8.
///
/// The generation makes a removed group's id stop matching (until the slot has been reused 256
/// times); methods given such an id do nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct GroupId(u32);

impl GroupId {
    /// The packed value, e.g. to store in a compact field.
    #[inline]
    pub const fn raw(self) -> u32 {
        self.0
    }

    /// Rebuilds an id from [`raw`](Self::raw). Any value is accepted; a bad one matches nothing.
    #[inline]
    pub const fn from_raw(raw: u32) -> GroupId {
        GroupId(raw)
    }

    #[inline]
    const fn index(self) -> usize {
        (self.0 & INDEX_MASK) as usize
    }

    #[inline]
    const fn generation(self) -> u32 {
        self.0 >> INDEX_BITS
    }
}

/// What a dispatch callback decided about the element it was shown.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ArbResult {
    /// The element is done: remove it; the group goes to the schedule tail if it has more.
    RemoveElem,
    /// Keep the element at the group head; the group goes to the schedule tail.
    NextGroup,
    /// Keep the element; take the group off the schedule until `schedule` or a push.
    DeschedGroup,
    /// Keep the element and the group at the schedule head, and stop dispatching.
    Stop,
}

struct Group<T> {
    elems: VecDeque<T>,
    generation: u32,
    live: bool,
    scheduled: bool,
    /// Schedule neighbours while scheduled.
    prev: u32,
    /// Schedule successor while scheduled; next free slot while not live.
    next: u32,
}

/// Round-robin arbiter over groups of elements of type `T`.
///
/// Invariant: outside a step (see [`pop_next`](Self::pop_next)) every scheduled group is
/// non-empty. Single-thread structure: mutation takes `&mut self`.
pub struct Arbiter<T> {
    groups: Vec<Group<T>>,
    free_head: u32,
    sched_head: u32,
    sched_tail: u32,
    num_scheduled: usize,
    num_elems: usize,
    num_groups: usize,
    step: Option<GroupId>,
}

impl<T> Arbiter<T> {
    /// An empty arbiter; allocates nothing until the first group.
    pub const fn new() -> Self {
        Arbiter {
            groups: Vec::new(),
            free_head: NIL,
            sched_head: NIL,
            sched_tail: NIL,
            num_scheduled: 0,
            num_elems: 0,
            num_groups: 0,
            step: None,
        }
    }

    /// Creates an empty, unscheduled group.
    ///
    /// # Panics
    /// When 2^24 groups are alive at once; use [`try_add_group`](Self::try_add_group) to get
    /// `None` instead.
    pub fn add_group(&mut self) -> GroupId {
        match self.try_add_group() {
            Some(g) => g,
            None => panic!("arbiter group index space (2^24) exhausted"),
        }
    }

    /// Creates an empty, unscheduled group, or `None` when 2^24 groups are alive.
    pub fn try_add_group(&mut self) -> Option<GroupId> {
        let i = if self.free_head != NIL {
            let i = self.free_head;
            self.free_head = self.groups[i as usize].next;
            i
        } else {
            let i = u32::try_from(self.groups.len()).ok().filter(|&i| i <= INDEX_MASK)?;
            self.groups.push(Group {
                elems: VecDeque::new(),
                generation: 0,
                live: false,
                scheduled: false,
                prev: NIL,
                next: NIL,
            });
            i
        };
        let gr = &mut self.groups[i as usize];
        gr.live = true;
        gr.scheduled = false;
        gr.prev = NIL;
        gr.next = NIL;
        self.num_groups += 1;
        Some(GroupId((gr.generation << INDEX_BITS) | i))
    }

    /// Deletes group `g`, handing its elements to `sink` head to tail. Returns false (and does
    /// nothing) if `g` is not a live group. An element of `g` taken out by
    /// [`pop_next`](Self::pop_next) is not included; [`resolve`](Self::resolve) will hand it back.
    pub fn remove_group(&mut self, g: GroupId, mut sink: impl FnMut(T)) -> bool {
        let Some(i) = self.index_of(g) else {
            return false;
        };
        if self.groups[i].scheduled {
            self.unlink(i);
        }
        if self.step == Some(g) {
            self.step = None;
        }
        // Bookkeeping first, so a panicking sink leaves a consistent (freed) slot behind.
        let free_next = self.free_head;
        self.free_head = i as u32;
        self.num_groups -= 1;
        let gr = &mut self.groups[i];
        gr.live = false;
        gr.generation = (gr.generation + 1) & GEN_MASK;
        gr.next = free_next;
        self.num_elems -= gr.elems.len();
        for e in gr.elems.drain(..) {
            sink(e);
        }
        true
    }

    /// True if `g` names a live group.
    #[inline]
    pub fn contains_group(&self, g: GroupId) -> bool {
        self.index_of(g).is_some()
    }

    /// Appends `elem` to group `g` and schedules the group at the schedule tail if it was not
    /// scheduled. Returns `Some(elem)` back, changing nothing, if `g` is not a live group.
    pub fn push(&mut self, g: GroupId, elem: T) -> Option<T> {
        self.push_at(g, elem, false)
    }

    /// Inserts `elem` at the head of group `g` (it is offered next for that group) and schedules
    /// the group at the schedule tail if it was not scheduled. Returns `Some(elem)` back if `g`
    /// is not a live group.
    pub fn push_head(&mut self, g: GroupId, elem: T) -> Option<T> {
        self.push_at(g, elem, true)
    }

    fn push_at(&mut self, g: GroupId, elem: T, front: bool) -> Option<T> {
        let Some(i) = self.index_of(g) else {
            return Some(elem);
        };
        let gr = &mut self.groups[i];
        if front {
            gr.elems.push_front(elem);
        } else {
            gr.elems.push_back(elem);
        }
        self.num_elems += 1;
        if !self.groups[i].scheduled {
            self.link_tail(i);
        }
        None
    }

    /// Puts group `g` at the schedule tail, unless it is empty or already scheduled.
    pub fn schedule(&mut self, g: GroupId) {
        if let Some(i) = self.index_of(g) {
            if !self.groups[i].scheduled && !self.groups[i].elems.is_empty() {
                self.link_tail(i);
            }
        }
    }

    /// Takes group `g` off the schedule; its elements stay.
    pub fn deschedule(&mut self, g: GroupId) {
        if let Some(i) = self.index_of(g) {
            if self.groups[i].scheduled {
                self.unlink(i);
            }
        }
    }

    /// True if `g` is live and scheduled.
    #[inline]
    pub fn is_scheduled(&self, g: GroupId) -> bool {
        self.index_of(g).is_some_and(|i| self.groups[i].scheduled)
    }

    /// Number of elements in group `g` (0 for a dead id).
    #[inline]
    pub fn group_len(&self, g: GroupId) -> usize {
        self.index_of(g).map_or(0, |i| self.groups[i].elems.len())
    }

    /// True if group `g` holds no element (also for a dead id).
    #[inline]
    pub fn group_is_empty(&self, g: GroupId) -> bool {
        self.group_len(g) == 0
    }

    /// The elements of group `g`, head to tail (nothing for a dead id).
    pub fn group_iter(&self, g: GroupId) -> impl Iterator<Item = &T> + '_ {
        self.index_of(g).map(|i| self.groups[i].elems.iter()).into_iter().flatten()
    }

    /// True if no group holds an element.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.num_elems == 0
    }

    /// Total number of elements in all groups.
    #[inline]
    pub fn len(&self) -> usize {
        self.num_elems
    }

    /// Number of live groups.
    #[inline]
    pub fn num_groups(&self) -> usize {
        self.num_groups
    }

    /// Number of scheduled groups.
    #[inline]
    pub fn num_scheduled(&self) -> usize {
        self.num_scheduled
    }

    /// The scheduled groups, from the schedule head (dispatched next) to the tail.
    pub fn scheduled_groups(&self) -> impl Iterator<Item = GroupId> + '_ {
        let mut cur = self.sched_head;
        std::iter::from_fn(move || {
            let i = cur as usize;
            let gr = self.groups.get(i)?;
            cur = gr.next;
            Some(self.id_of(i))
        })
    }

    /// Removes every element of group `g`, handing them to `sink` head to tail. The group stays
    /// live and becomes unscheduled.
    pub fn purge(&mut self, g: GroupId, mut sink: impl FnMut(T)) {
        let Some(i) = self.index_of(g) else {
            return;
        };
        if self.groups[i].scheduled {
            self.unlink(i);
        }
        let gr = &mut self.groups[i];
        self.num_elems -= gr.elems.len();
        for e in gr.elems.drain(..) {
            sink(e);
        }
    }

    /// [`dispatch_remove`](Self::dispatch_remove) that drops removed elements; for callbacks
    /// that take what they need out of the element before returning
    /// [`ArbResult::RemoveElem`].
    pub fn dispatch(&mut self, f: impl FnMut(GroupId, &mut T) -> ArbResult) -> usize {
        self.dispatch_remove(f, |_, e| drop(e))
    }

    /// Offers the head element of each scheduled group in round-robin order, starting at the
    /// schedule head, to `f`; elements for which it returns [`ArbResult::RemoveElem`] are moved
    /// into `sink` (after the arbiter is updated). Returns the number of removed elements.
    ///
    /// Ends when nothing is scheduled, when `f` returns [`ArbResult::Stop`], or when every group
    /// that was scheduled at the last removal (or at the start) has been offered once without a
    /// removal. Returns 0 at once while a [`pop_next`](Self::pop_next) step is outstanding.
    pub fn dispatch_remove(
        &mut self,
        mut f: impl FnMut(GroupId, &mut T) -> ArbResult,
        mut sink: impl FnMut(GroupId, T),
    ) -> usize {
        if self.step.is_some() {
            return 0;
        }
        let mut removed = 0;
        let mut budget = self.num_scheduled;
        let mut idle = 0;
        while idle < budget && self.sched_head != NIL {
            let i = self.sched_head as usize;
            let g = self.id_of(i);
            let Some(head) = self.groups[i].elems.front_mut() else {
                // Not reachable while the invariant holds; repair rather than spin.
                self.unlink(i);
                continue;
            };
            match f(g, head) {
                ArbResult::RemoveElem => {
                    let elem = self.groups[i].elems.pop_front();
                    self.num_elems -= 1;
                    self.unlink(i);
                    if !self.groups[i].elems.is_empty() {
                        self.link_tail(i);
                    }
                    removed += 1;
                    idle = 0;
                    budget = self.num_scheduled;
                    if let Some(elem) = elem {
                        sink(g, elem);
                    }
                }
                ArbResult::NextGroup => {
                    self.unlink(i);
                    self.link_tail(i);
                    idle += 1;
                }
                ArbResult::DeschedGroup => {
                    self.unlink(i);
                    idle += 1;
                }
                ArbResult::Stop => break,
            }
        }
        removed
    }

    /// Number of scheduled groups: the step budget of one pass of an external dispatch loop.
    ///
    /// With [`pop_next`](Self::pop_next) and [`resolve`](Self::resolve) the callback may use the
    /// arbiter freely. A loop with the same termination rule as [`dispatch`](Self::dispatch):
    ///
    /// ```
    /// use ucs::arbiter::{ArbResult, Arbiter};
    /// let mut arb = Arbiter::new();
    /// let (a, b) = (arb.add_group(), arb.add_group());
    /// arb.push(a, 1);
    /// let mut done = Vec::new();
    /// let mut budget = arb.begin_pass();
    /// let mut idle = 0;
    /// while idle < budget {
    ///     let Some((g, elem)) = arb.pop_next() else { break };
    ///     // The "callback": may push to any group, including `g`.
    ///     if elem < 3 {
    ///         arb.push(b, elem + 1);
    ///     }
    ///     let r = ArbResult::RemoveElem;
    ///     if r == ArbResult::RemoveElem {
    ///         arb.resolve(g, None, r);
    ///         done.push(elem);
    ///         idle = 0;
    ///         budget = arb.begin_pass();
    ///     } else {
    ///         arb.resolve(g, Some(elem), r);
    ///         if r == ArbResult::Stop {
    ///             break;
    ///         }
    ///         idle += 1;
    ///     }
    /// }
    /// assert_eq!(done, [1, 2, 3]);
    /// ```
    ///
    /// If callbacks keep adding elements as fast as they remove them, this loop (like any
    /// dispatch) runs as long as they do; cap the total number of steps if that can happen.
    #[inline]
    pub fn begin_pass(&self) -> usize {
        self.num_scheduled
    }

    /// Takes the head element of the schedule-head group out; the group keeps its place at the
    /// schedule head. Every successful call must be followed by one [`resolve`](Self::resolve)
    /// for the returned group; until then `pop_next` returns `None` and `dispatch` returns 0.
    ///
    /// While the element is out, the group may be pushed to, purged, descheduled or removed;
    /// [`group_len`](Self::group_len) and [`len`](Self::len) do not count the element.
    pub fn pop_next(&mut self) -> Option<(GroupId, T)> {
        if self.step.is_some() {
            return None;
        }
        while self.sched_head != NIL {
            let i = self.sched_head as usize;
            if let Some(elem) = self.groups[i].elems.pop_front() {
                self.num_elems -= 1;
                let g = self.id_of(i);
                self.step = Some(g);
                return Some((g, elem));
            }
            // Not reachable while the invariant holds; repair rather than hand out nothing.
            self.unlink(i);
        }
        None
    }

    /// Records the outcome of the step [`pop_next`](Self::pop_next) started on group `g`.
    ///
    /// `elem` is `None` when the element was consumed ([`ArbResult::RemoveElem`]); a `Some`
    /// element goes back to the head of `g`, before anything pushed during the step. Then the
    /// group is placed by `r` regardless of what the step did to its scheduling: at the schedule
    /// tail for `RemoveElem` / `NextGroup` (if non-empty), off the schedule for `DeschedGroup`,
    /// at the schedule head for `Stop` (if non-empty).
    ///
    /// Returns the element back if `g` was removed meanwhile (or is otherwise not live).
    pub fn resolve(&mut self, g: GroupId, elem: Option<T>, r: ArbResult) -> Option<T> {
        if self.step == Some(g) {
            self.step = None;
        }
        let Some(i) = self.index_of(g) else {
            return elem;
        };
        if let Some(e) = elem {
            self.groups[i].elems.push_front(e);
            self.num_elems += 1;
        }
        if self.groups[i].scheduled {
            self.unlink(i);
        }
        let nonempty = !self.groups[i].elems.is_empty();
        match r {
            ArbResult::RemoveElem | ArbResult::NextGroup if nonempty => self.link_tail(i),
            ArbResult::Stop if nonempty => self.link_head(i),
            _ => {}
        }
        None
    }

    /// The group whose element is out through [`pop_next`](Self::pop_next), if any.
    #[inline]
    pub fn step_group(&self) -> Option<GroupId> {
        self.step
    }

    #[inline]
    fn index_of(&self, g: GroupId) -> Option<usize> {
        let i = g.index();
        let gr = self.groups.get(i)?;
        (gr.live && gr.generation == g.generation()).then_some(i)
    }

    #[inline]
    fn id_of(&self, i: usize) -> GroupId {
        GroupId((self.groups[i].generation << INDEX_BITS) | i as u32)
    }

    fn link_tail(&mut self, i: usize) {
        let tail = self.sched_tail;
        let gr = &mut self.groups[i];
        gr.scheduled = true;
        gr.prev = tail;
        gr.next = NIL;
        match tail {
            NIL => self.sched_head = i as u32,
            t => self.groups[t as usize].next = i as u32,
        }
        self.sched_tail = i as u32;
        self.num_scheduled += 1;
    }

    fn link_head(&mut self, i: usize) {
        let head = self.sched_head;
        let gr = &mut self.groups[i];
        gr.scheduled = true;
        gr.prev = NIL;
        gr.next = head;
        match head {
            NIL => self.sched_tail = i as u32,
            h => self.groups[h as usize].prev = i as u32,
        }
        self.sched_head = i as u32;
        self.num_scheduled += 1;
    }

    fn unlink(&mut self, i: usize) {
        let gr = &mut self.groups[i];
        let (prev, next) = (gr.prev, gr.next);
        gr.scheduled = false;
        gr.prev = NIL;
        gr.next = NIL;
        match prev {
            NIL => self.sched_head = next,
            p => self.groups[p as usize].next = next,
        }
        match next {
            NIL => self.sched_tail = prev,
            n => self.groups[n as usize].prev = prev,
        }
        self.num_scheduled -= 1;
    }
}

impl<T> Default for Arbiter<T> {
    fn default() -> Self {
        Arbiter::new()
    }
}

impl<T> fmt::Debug for Arbiter<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arbiter")
            .field("groups", &self.num_groups)
            .field("elems", &self.num_elems)
            .field("scheduled", &self.scheduled_groups().collect::<Vec<_>>())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fair_interleaving() {
        let mut arb = Arbiter::new();
        let gs: Vec<GroupId> = (0..3).map(|_| arb.add_group()).collect();
        for (n, &g) in gs.iter().enumerate() {
            for k in 0..4 {
                arb.push(g, n * 10 + k);
            }
        }
        let mut order = Vec::new();
        let removed = arb.dispatch_remove(|_, _| ArbResult::RemoveElem, |_, e| order.push(e));
        assert_eq!(removed, 12);
        assert_eq!(order, [0, 10, 20, 1, 11, 21, 2, 12, 22, 3, 13, 23]);
        assert!(arb.is_empty() && arb.num_scheduled() == 0);
    }

    #[test]
    fn dead_ids_are_harmless() {
        let mut arb = Arbiter::new();
        let a = arb.add_group();
        arb.push(a, 1);
        arb.push(a, 2);
        let mut out = Vec::new();
        assert!(arb.remove_group(a, |e| out.push(e)));
        assert_eq!(out, [1, 2]);
        assert!(!arb.remove_group(a, drop));
        assert_eq!(arb.push(a, 3), Some(3));
        assert_eq!(arb.push_head(a, 4), Some(4));
        arb.schedule(a);
        arb.deschedule(a);
        arb.purge(a, drop);
        assert!(!arb.is_scheduled(a) && arb.group_is_empty(a) && !arb.contains_group(a));
        assert_eq!(arb.resolve(a, Some(5), ArbResult::NextGroup), Some(5));
        let b = arb.add_group();
        assert_ne!(a, b, "reused slot gets a new generation");
        assert!(!arb.contains_group(GroupId::from_raw(u32::MAX)));
        assert!(arb.is_empty() && arb.num_groups() == 1);
    }
}
