//! Memory registration (`ucp_mem_map`): a region registered once with every memory domain of
//! the worker that remote memory access and zero-copy protocols use - the caller's memory, or
//! memory the worker allocates where every peer transport can reach it - so that peers can
//! reach it with a remote key, and operations that name the handle skip per-message
//! registration.

use ucs::idtable::Id;

/// A mapped region (`ucp_mem_h`), made by [`crate::Worker::mem_map`] or
/// [`crate::Worker::mem_map_alloc`] and released by [`crate::Worker::mem_unmap`]. Calls that
/// take it check that it is mapped on their worker: an unmapped handle, or one of another
/// worker, is `InvalidParam` (as a memory-handle hint of an operation, it is ignored and the
/// operation registers per message instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemHandle {
    pub(crate) id: Id,
    /// The worker that mapped it (its uuid).
    pub(crate) worker: u64,
    /// Start of the region.
    pub address: usize,
    /// Length of the region.
    pub length: usize,
}
