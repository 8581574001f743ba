//! # uct-ib - InfiniBand/RoCE transports
//!
//! Will implement the `uct` transport traits over verbs (`rdma-core-sys`): the IB memory domain
//! with a registration cache, `rc_verbs` (reliable connected QPs) and `ud_verbs` (software
//! reliability over datagrams), and report tag-matching offload when a device has it.
//! Nothing is registered with `uct` yet: discovery lists zero InfiniBand devices and
//! [`unavailable_reason`] says why.

/// Why this build provides no InfiniBand transports.
pub fn unavailable_reason() -> String {
    match rdma_core_sys::DeviceList::get() {
        Ok(_) => "uct-ib: the verbs transports are not built yet".into(),
        Err(why) => why.0,
    }
}
