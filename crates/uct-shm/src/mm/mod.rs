//! Memory-mapped transports (`posix`, `sysv`): a receive FIFO per interface in a shared
//! segment; senders attach the segment and write elements into it.
//!
//! | module | what it holds |
//! |---|---|
//! | [`fifo`] | the FIFO layout and its lock-free producer/consumer protocol |
//! | [`segment`] | posix (memfd) and sysv segments, size-checked attach |
//! | [`config`] | `UCX_MM_*` with `UCX_POSIX_*`/`UCX_SYSV_*` overrides |
//! | `md`, `iface`, `ep`, `signal` | components, interface, endpoint, wakeup socket |

pub mod config;
mod ep;
pub mod fifo;
mod iface;
mod md;
pub mod segment;
mod signal;

pub use ep::MmEp;
pub(crate) use iface::machine_id;
pub use iface::MmIface;
pub use md::{MmComponent, MmMd, DEVICE, POSIX, SYSV};
