//! Synchronisation facade.
//!
//! Cross-thread structures import their atomics, mutexes and `Arc` from here, never from `std`
//! directly, so that building with `RUSTFLAGS="--cfg loom"` swaps in loom's model-checked
//! versions and the loom tests explore every interleaving of the real code.

#[cfg(not(loom))]
pub use std::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

#[cfg(loom)]
pub use loom::sync::{
    atomic::{fence, AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering},
    Arc, Mutex, MutexGuard,
};

/// Spin-loop hint (a model-checker yield under loom).
#[inline]
pub fn spin_loop() {
    #[cfg(not(loom))]
    std::hint::spin_loop();
    #[cfg(loom)]
    loom::thread::yield_now();
}

/// Locks a facade mutex, ignoring poisoning: a panicking holder cannot leave the protected data
/// in a state the structures here cannot handle.
#[inline]
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}
