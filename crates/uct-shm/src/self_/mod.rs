//! The `self` transport: loopback inside one process (UCX's `self`).
//!
//! Active messages short/bcopy (the handler runs inside the send call), put/get short/bcopy and
//! every CPU atomic on memory registered with the `self` memory domain, pending requests, flush
//! and endpoint check. Configuration: `UCX_SELF_SEG_SIZE` (largest message, default 8k) and
//! `UCX_SELF_RX_MAX_BUFS` (how many message buffers handlers may keep at once; `inf` by
//! default, like UCX; a finite value makes sends return `NoResource` while handlers hold that
//! many).

mod config;
mod iface;
mod md;

pub use iface::{SelfEp, SelfIface};
pub use md::{SelfComponent, SelfMd, COMPONENT, DEVICE, NAME};
