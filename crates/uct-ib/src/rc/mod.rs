//! `rc_verbs`: reliable connected queue pairs over verbs.
//!
//! One QP per endpoint, connected to one remote endpoint (to-ep: the two sides exchange device
//! and endpoint addresses out of band, then each calls `connect_to_ep`). Active messages go as
//! SENDs into a shared receive queue of the interface, refilled from a pool of registered
//! descriptors; put and get are RDMA WRITE and READ; 64-bit fetch-add and compare-swap are the
//! verbs atomics. Send-queue credits per endpoint, completion-queue credits per interface, and
//! an active-message flow-control window per endpoint bound what may be in flight; pending
//! requests wait in an arbiter until credits return.
//!
//! Wire format of an active message: one header byte, the AM id in bits 0..5 and the
//! flow-control bits above it (soft credit request, hard credit request, pure grant), then the
//! payload (`am_short`: the 8-byte header, then the data). With tag matching on
//! (`UCX_RC_TM_ENABLE=y` and tag handlers given; emulated, see [`crate::tm`]) every active
//! message starts with one more byte before that header, the TMH opcode `NO_TAG`, so that the
//! tag-matching receive side passes it to software untouched (UCX's `rc_mlx5` does the same),
//! and tagged messages start with a 16-byte TMH. The two formats do not mix: the device address
//! carries a tag-matching flag, and interfaces reach only peers with the same setting.

mod config;
mod ep;
mod iface;
mod tm;

pub use config::RcConfig;
pub use ep::RcEp;
pub use iface::RcIface;
pub use tm::TmStats;

/// Transport name.
pub const NAME: &str = "rc_verbs";

/// Prefixes of rc_verbs' `UCX_*` settings, most specific first.
pub const CONFIG_PREFIXES: &[&str] = &["RC_VERBS_", "RC_", "IB_"];

/// Flow-control bits of the AM header byte (above the 5 bits of the AM id).
pub(crate) const FC_SOFT_REQ: u8 = 1 << 5;
pub(crate) const FC_HARD_REQ: u8 = 1 << 6;
pub(crate) const FC_PURE_GRANT: u8 = 1 << 7;
pub(crate) const AM_ID_MASK: u8 = 0x1f;

/// Bytes of a device address: flags, MTU, LID, GID.
pub(crate) const DEV_ADDR_LEN: usize = 1 + 1 + 2 + 16;
/// Bytes of an endpoint address: the QP number.
pub(crate) const EP_ADDR_LEN: usize = 4;

const DEV_FLAG_ETH: u8 = 1 << 0;
const DEV_FLAG_TM: u8 = 1 << 1;

/// A peer's device address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct DevAddr {
    pub eth: bool,
    /// Tag matching on: active messages carry the `NO_TAG` prefix.
    pub tm: bool,
    pub mtu_enum: u8,
    pub lid: u16,
    pub gid: [u8; 16],
}

impl DevAddr {
    pub fn pack(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(DEV_ADDR_LEN);
        v.push(if self.eth { DEV_FLAG_ETH } else { 0 } | if self.tm { DEV_FLAG_TM } else { 0 });
        v.push(self.mtu_enum);
        v.extend_from_slice(&self.lid.to_le_bytes());
        v.extend_from_slice(&self.gid);
        v
    }

    /// Parses bytes from a peer; `None` when malformed.
    pub fn unpack(b: &[u8]) -> Option<DevAddr> {
        if b.len() != DEV_ADDR_LEN || b[0] & !(DEV_FLAG_ETH | DEV_FLAG_TM) != 0 || !(1..=5).contains(&b[1]) {
            return None;
        }
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&b[4..20]);
        Some(DevAddr {
            eth: b[0] & DEV_FLAG_ETH != 0,
            tm: b[0] & DEV_FLAG_TM != 0,
            mtu_enum: b[1],
            lid: u16::from_le_bytes([b[2], b[3]]),
            gid,
        })
    }
}

/// Parses an endpoint address (a 24-bit QP number in 4 bytes); `None` when malformed.
pub(crate) fn unpack_ep_addr(b: &[u8]) -> Option<u32> {
    let qpn = u32::from_le_bytes(b.try_into().ok()?);
    (qpn != 0 && qpn < (1 << 24)).then_some(qpn)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_round_trip_and_reject_garbage() {
        let a = DevAddr { eth: true, tm: false, mtu_enum: 3, lid: 0, gid: [7; 16] };
        assert_eq!(DevAddr::unpack(&a.pack()), Some(a));
        let t = DevAddr { tm: true, ..a };
        assert_eq!(DevAddr::unpack(&t.pack()), Some(t));
        assert_eq!(DevAddr::unpack(&a.pack()[..DEV_ADDR_LEN - 1]), None);
        let mut bad = a.pack();
        bad[1] = 9;
        assert_eq!(DevAddr::unpack(&bad), None, "MTU enum out of range");
        bad[1] = 3;
        bad[0] = 0x80;
        assert_eq!(DevAddr::unpack(&bad), None, "unknown flag");
        assert_eq!(unpack_ep_addr(&0x1234u32.to_le_bytes()), Some(0x1234));
        assert_eq!(unpack_ep_addr(&0u32.to_le_bytes()), None);
        assert_eq!(unpack_ep_addr(&(1u32 << 24).to_le_bytes()), None);
        assert_eq!(unpack_ep_addr(&[1, 2, 3]), None);
    }
}
