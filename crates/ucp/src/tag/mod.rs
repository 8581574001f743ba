//! Tag matching (MPI semantics) and the tag API.

pub mod matcher;

pub use matcher::{tag_matches, Arrived, Posted, RecvHandle, Tag, TagMatcher, UnexpHandle, FULL_MASK};
