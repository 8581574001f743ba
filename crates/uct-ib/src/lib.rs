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
//! [`unavailable_reason`] says why. `rc_verbs` offers hardware tag matching
//! (`UCX_RC_TM_ENABLE=y`) over an emulated device ([`tm`]: a software model of the adapter's
//! matching, since Soft-RoCE has none); DC is not implemented.

pub mod device;
pub mod ib_config;
pub mod md;
mod pool;
pub mod rc;
pub mod tm;
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

/// Support for tests that need an RDMA device.
pub mod testing {
    /// Whether this process has an active InfiniBand/RoCE port (an `rc_verbs` resource). Without
    /// one it prints why and returns false, so the calling test can pass as "not applicable here";
    /// with `UCX_RS_REQUIRE_RDMA=1` (set by `tools/rdma-vm/test`, inside the Soft-RoCE VM) it
    /// panics instead, so a missing device fails the test.
    pub fn rdma_available() -> bool {
        super::register();
        if uct::query_resources().iter().any(|r| r.tl.tl_name == crate::rc::NAME) {
            return true;
        }
        let why = super::unavailable_reason().unwrap_or_else(|| "no active port".into());
        assert!(
            std::env::var("UCX_RS_REQUIRE_RDMA").as_deref() != Ok("1"),
            "UCX_RS_REQUIRE_RDMA=1 but there is no RDMA device: {why}"
        );
        eprintln!("no RDMA device here ({why}); run in tools/rdma-vm/test");
        false
    }
}
