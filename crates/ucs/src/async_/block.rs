//! The block/unblock protocol of an async context and its queue of missed events.
//!
//! This is the part of [`AsyncContext`](super::AsyncContext) that decides *who* runs a handler
//! and *when*, with no OS resources, so the loom tests drive it directly.
//!
//! One mutex-protected state holds the block owner (a thread token), the nesting depth, and the
//! missed-event queue. Running a handler also counts as holding the block, which gives the
//! three guarantees:
//!
//! * a handler never runs while any thread holds the block, and two handlers of one context
//!   never run at the same time;
//! * an event that arrives while the context is blocked is queued once per handler (events of
//!   repeated arrivals are OR-ed into the queued entry) instead of being retried in a loop;
//! * no queued event is lost: whoever releases the outermost block level (a user dropping its
//!   guard, or the async thread finishing a handler) replays the queue before returning. Queue
//!   pushes and the blocked check happen in the same critical section as the release, so a push
//!   either sees the context free (and runs the handler itself) or lands before the holder's
//!   release (and the holder's replay sees it).
//!
//! Tokens identify threads (any `u64`, distinct per thread); nesting is allowed only for the
//! token that holds the block. Waiting for the block spins with backoff: holders are handlers
//! and short user critical sections, as in UCX's spinlock async mode.

use std::collections::VecDeque;

use super::Events;
use crate::sync::{self, AtomicUsize, Mutex, Ordering};

/// Spins this many times before yielding the CPU while waiting for the block.
#[cfg(not(loom))]
const SPINS_BEFORE_YIELD: u32 = 64;

#[derive(Debug)]
struct State {
    /// Token of the holder; meaningful only while `depth > 0`.
    owner: u64,
    depth: u32,
    /// At most one entry per handler id.
    missed: VecDeque<(u64, Events)>,
}

/// Block state and missed-event queue of one async context. See the [module docs](self).
#[derive(Debug)]
pub struct BlockState {
    state: Mutex<State>,
    /// Copy of `missed.len()`, readable without the lock so an idle poll costs one load.
    missed_len: AtomicUsize,
}

impl Default for BlockState {
    fn default() -> Self {
        Self::new()
    }
}

impl BlockState {
    /// An unblocked state with an empty queue.
    pub fn new() -> Self {
        BlockState {
            state: Mutex::new(State { owner: 0, depth: 0, missed: VecDeque::with_capacity(8) }),
            missed_len: AtomicUsize::new(0),
        }
    }

    fn sync_len(&self, st: &State) {
        // Only a hint for `has_missed`; correctness rests on the mutex.
        self.missed_len.store(st.missed.len(), Ordering::Release);
    }

    /// Takes the block for `token` if it is free or already held by `token` (nesting).
    pub fn try_block(&self, token: u64) -> bool {
        let mut st = sync::lock(&self.state);
        if st.depth == 0 || st.owner == token {
            st.owner = token;
            st.depth = st.depth.saturating_add(1);
            true
        } else {
            false
        }
    }

    /// Takes the block for `token`, waiting while another thread holds it (for instance while
    /// the async thread runs a handler). Nests when `token` already holds it.
    pub fn block(&self, token: u64) {
        #[cfg(not(loom))]
        let mut spins = 0u32;
        while !self.try_block(token) {
            #[cfg(not(loom))]
            {
                if spins < SPINS_BEFORE_YIELD {
                    spins += 1;
                    sync::spin_loop();
                } else {
                    std::thread::yield_now();
                }
            }
            #[cfg(loom)]
            sync::spin_loop();
        }
    }

    /// Releases one nesting level held by `token`. When that was the outermost level, replays
    /// the missed queue through `run(handler_id, events)` (holding the block around each call)
    /// and returns how many ran. Does nothing if `token` does not hold the block.
    pub fn unblock(&self, token: u64, run: impl FnMut(u64, Events)) -> usize {
        let released = {
            let mut st = sync::lock(&self.state);
            if st.depth == 0 || st.owner != token {
                return 0;
            }
            st.depth -= 1;
            st.depth == 0
        };
        if released {
            self.replay_missed(token, run)
        } else {
            0
        }
    }

    /// Delivers an event for handler `id`: if nobody holds the block, runs `run(id, events)`
    /// now on behalf of `token`, then replays whatever was missed meanwhile, and returns how many
    /// handlers ran. If the block is held (by anyone, `token` included), queues the event as
    /// missed and returns 0.
    pub fn dispatch(&self, token: u64, id: u64, events: Events, mut run: impl FnMut(u64, Events)) -> usize {
        {
            let mut st = sync::lock(&self.state);
            if st.depth > 0 {
                match st.missed.iter_mut().find(|(h, _)| *h == id) {
                    Some(entry) => entry.1 |= events,
                    None => st.missed.push_back((id, events)),
                }
                self.sync_len(&st);
                return 0;
            }
            st.owner = token;
            st.depth = 1;
        }
        self.run_held(token, id, events, &mut run);
        1 + self.replay_missed(token, run)
    }

    /// Runs one handler while `token` holds the block at depth 1, releasing it afterwards even
    /// if the handler unwinds (a leaked block would stall every later blocker).
    fn run_held(&self, token: u64, id: u64, events: Events, run: &mut impl FnMut(u64, Events)) {
        struct Release<'a>(&'a BlockState, u64);
        impl Drop for Release<'_> {
            fn drop(&mut self) {
                // Also drops levels a handler leaked (e.g. a forgotten guard): the block belongs to
                // this run and must end with it.
                let mut st = sync::lock(&self.0.state);
                if st.owner == self.1 {
                    st.depth = 0;
                }
            }
        }
        let _release = Release(self, token);
        run(id, events);
    }

    /// Runs missed events while the block is free, taking it around each call. Returns how many
    /// ran. Stops as soon as another thread holds the block: that holder replays the rest when it
    /// releases.
    pub fn replay_missed(&self, token: u64, mut run: impl FnMut(u64, Events)) -> usize {
        let mut ran = 0;
        loop {
            let next = {
                let mut st = sync::lock(&self.state);
                if st.depth > 0 {
                    None
                } else {
                    let next = st.missed.pop_front();
                    if next.is_some() {
                        st.owner = token;
                        st.depth = 1;
                        self.sync_len(&st);
                    }
                    next
                }
            };
            let Some((id, events)) = next else {
                return ran;
            };
            self.run_held(token, id, events, &mut run);
            ran += 1;
        }
    }

    /// Drops the missed entry of handler `id`, if any (the handler is being removed).
    pub fn remove_missed(&self, id: u64) {
        let mut st = sync::lock(&self.state);
        st.missed.retain(|(h, _)| *h != id);
        self.sync_len(&st);
    }

    /// Whether missed events are queued. A hint read without the lock: it may lag behind a
    /// concurrent push, which is fine because the blocker replays such pushes itself.
    #[inline]
    pub fn has_missed(&self) -> bool {
        self.missed_len.load(Ordering::Acquire) != 0
    }

    /// Whether `token` currently holds the block (inside a handler or a block guard).
    pub fn is_held_by(&self, token: u64) -> bool {
        let st = sync::lock(&self.state);
        st.depth > 0 && st.owner == token
    }

    /// Whether any thread holds the block.
    pub fn is_blocked(&self) -> bool {
        sync::lock(&self.state).depth > 0
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn nesting_missed_and_replay() {
        let b = BlockState::new();
        let mut log = Vec::new();
        assert_eq!(b.dispatch(1, 10, Events::READ, |h, e| log.push((h, e))), 1);
        b.block(2);
        b.block(2);
        assert!(!b.try_block(3));
        assert!(b.is_held_by(2));
        assert_eq!(b.dispatch(1, 10, Events::READ, |_, _| unreachable!()), 0);
        assert_eq!(b.dispatch(1, 10, Events::WRITE, |_, _| unreachable!()), 0);
        assert_eq!(b.dispatch(1, 11, Events::empty(), |_, _| unreachable!()), 0);
        // The holder itself cannot run handlers inline either.
        assert_eq!(b.dispatch(2, 12, Events::READ, |_, _| unreachable!()), 0);
        assert!(b.has_missed());
        b.remove_missed(12);
        assert_eq!(b.unblock(2, |_, _| unreachable!()), 0, "inner level");
        assert_eq!(b.unblock(3, |_, _| unreachable!()), 0, "not the holder");
        assert_eq!(b.unblock(2, |h, e| log.push((h, e))), 2);
        assert!(!b.has_missed());
        assert!(!b.is_blocked());
        assert_eq!(log, vec![(10, Events::READ), (10, Events::READ | Events::WRITE), (11, Events::empty())]);
    }
}
