//! # rdma-core-sys - verbs ABI bindings, loaded at run time
//!
//! This crate will carry the rdma-core 44 verbs ABI (checked-in bindings), load
//! `libibverbs.so.1` with `dlopen` at run time, and provide Rust versions of the static-inline
//! data path of `verbs.h`. Until the InfiniBand issue lands it only reports that no verbs stack
//! is loaded, so builders need neither libibverbs nor its headers.

/// Why no verbs devices are available in this build.
pub fn unavailable_reason() -> &'static str {
    "rdma-core-sys: verbs bindings are not built yet (InfiniBand support lands in a later issue)"
}
