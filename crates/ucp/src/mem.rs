//! Memory registration (`ucp_mem_map`): a user buffer registered once with every memory
//! domain of the worker that zero-copy protocols use, so operations that name the handle skip
//! per-message registration.

use ucs::idtable::Id;

/// A registered region (`ucp_mem_h`), created by [`crate::Worker::mem_map`] and released by
/// [`crate::Worker::mem_unmap`]. A handle of another worker, or an unmapped one, is ignored
/// by operations (they register per message instead).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemHandle {
    pub(crate) id: Id,
    /// Start of the region.
    pub address: usize,
    /// Length of the region.
    pub length: usize,
}
