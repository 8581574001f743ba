//! # uct-ib - InfiniBand/RoCE transports
//!
//! The `uct` transport traits over verbs (`rdma-core-sys`, libibverbs loaded at run time):
//!
//! * the `ib` component: one memory domain per device ([`md::IbMd`]): protection domain,
//!   registration, registered allocations, remote keys;
//! * device discovery ([`device`]): active ports, link layer, LID, the GID each port is
//!   addressed by (RoCE v2 IPv4-mapped first, `UCX_IB_GID_INDEX` to force one), MTU and the
//!   latency/bandwidth model from the link speed;
//! * `rc_verbs` ([`rc`]): reliable connected QPs, connected endpoint to endpoint;
//! * `ud_verbs` ([`ud`]): one UD QP per interface, connected interface to interface, made
//!   reliable in software by a sans-IO core (sequence numbers, acknowledgements, resends,
//!   congestion window, peer timeout).
//!
//! Resources are named `tl/dev:port`, e.g. `rc_verbs/rxe0:1`, `ud_verbs/rxe0:1`. Without a
//! verbs stack (no libibverbs, no kernel support, no device) the component lists nothing and
//! [`unavailable_reason`] says why. Hardware tag matching is not offered (no supported device
//! here has it); DC is not implemented.

pub mod device;
pub mod ib_config;
pub mod md;
mod pool;
pub mod rc;
pub mod ud;
pub mod verbs;

pub use md::{IbComponent, IbMd, IbRegion, COMPONENT};

/// Registers the `ib` component with `uct` (idempotent).
pub fn register() {
    uct::register_component(&md::COMPONENT);
}

/// Why this process has no InfiniBand transports, or `None` when it has devices.
pub fn unavailable_reason() -> Option<String> {
    uct::Component::unavailable_reason(&md::COMPONENT)
}
