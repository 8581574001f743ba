//! Tag matching (MPI semantics) and the tag API.

pub mod matcher;
pub(crate) mod proto;

pub use matcher::{
    bucket_index, tag_matches, Arrived, ExpEntry, ExpQueues, ExpStore, Posted, RecvHandle, Tag, TagMatcher,
    UnexpHandle, UnexpQueue, FULL_MASK,
};
