//! Tag matching (MPI semantics) and the tag API.

pub mod matcher;
pub(crate) mod proto;

pub use matcher::{bucket_index, tag_matches, Arrived, Posted, RecvHandle, Tag, TagMatcher, UnexpHandle, FULL_MASK};
