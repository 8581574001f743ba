//! Test support: a global allocator that counts allocations per thread, for the tests that
//! prove a steady-state path allocates nothing. A test binary declares it as its allocator:
//!
//! ```ignore
//! #[global_allocator]
//! static ALLOC: ucs::testing::CountingAlloc = ucs::testing::CountingAlloc;
//! ```
//!
//! Counts are kept per thread, so the test harness's other threads do not disturb them.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The system allocator, counting the allocations (and reallocations) each thread makes.
pub struct CountingAlloc;

thread_local! {
    // const-initialised and without Drop, so touching it from the allocator never allocates.
    static ALLOCS: Cell<u64> = const { Cell::new(0) };
}

fn bump() {
    let _ = ALLOCS.try_with(|c| c.set(c.get() + 1));
}

// SAFETY: every call is forwarded unchanged to the system allocator; counting touches only a
// const-initialised thread local, which never allocates.
unsafe impl GlobalAlloc for CountingAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded with the caller's guarantees about `layout`.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        bump();
        // SAFETY: forwarded with the caller's guarantees about `layout`.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        bump();
        // SAFETY: forwarded with the caller's guarantees; `ptr` came from System via this type.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by System (through this type) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

/// Allocations this thread has made so far (counted only when [`CountingAlloc`] is the global
/// allocator).
pub fn allocations() -> u64 {
    ALLOCS.with(Cell::get)
}

/// Runs `f`; returns the allocations this thread made meanwhile.
pub fn count_allocations(f: impl FnOnce()) -> u64 {
    let before = allocations();
    f();
    allocations() - before
}
