//! Device discovery: the device's attributes, its ports (state, link layer, LID, MTU, speed) and
//! the GID each port is addressed by, with the latency and bandwidth model derived from them.

use std::rc::Rc;

use rdma_core_sys as sys;
use ucs::{Status, UcsResult};

use crate::verbs::{verbs_error, Context};

/// Link layer of a port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkLayer {
    /// InfiniBand: LID routing, GRH only across subnets.
    InfiniBand,
    /// Ethernet (RoCE): every packet carries a GRH with the GID.
    Ethernet,
}

/// RoCE version of a GID entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GidType {
    /// InfiniBand GID.
    Ib,
    /// RoCE v1 (Ethernet frames, no IP).
    RoceV1,
    /// RoCE v2 (UDP/IP).
    RoceV2,
}

/// A port's address: the GID chosen for it and its index in the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GidChoice {
    /// Index in the port's GID table.
    pub index: u8,
    /// The GID, 16 bytes in network order.
    pub gid: [u8; 16],
    /// Its type.
    pub gid_type: GidType,
}

impl GidChoice {
    /// True for an IPv4-mapped GID (`::ffff:a.b.c.d`).
    pub fn is_ipv4(&self) -> bool {
        is_ipv4_mapped(&self.gid)
    }
}

fn is_ipv4_mapped(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// One active port.
#[derive(Clone, Debug)]
pub struct Port {
    /// Port number (from 1).
    pub num: u8,
    /// Link layer.
    pub link_layer: LinkLayer,
    /// Local identifier (InfiniBand only; 0 on Ethernet).
    pub lid: u16,
    /// Active MTU in bytes.
    pub mtu: usize,
    /// Active MTU as the verbs enum (`IBV_MTU_*`).
    pub mtu_enum: sys::ibv_mtu,
    /// Number of GID table entries.
    pub gid_tbl_len: u32,
    /// Signalling rate of one lane in Gbit/s, and the number of lanes.
    pub lane_gbps: f64,
    /// Lanes.
    pub width: u32,
    /// Payload bandwidth of the link, bytes per second.
    pub bandwidth: f64,
    /// Base latency of the link, seconds.
    pub latency: f64,
}

/// An opened device with its attributes and active ports.
pub struct IbDevice {
    /// Device name (`mlx5_0`, `rxe0`).
    pub name: String,
    /// The open context.
    pub ctx: Rc<Context>,
    /// Device attributes (extended query).
    pub attr: sys::ibv_device_attr_ex,
    /// Active ports.
    pub ports: Vec<Port>,
}

/// Names of the devices present, or why there are none.
pub fn device_names() -> Result<Vec<String>, String> {
    let list = sys::DeviceList::get().map_err(|e| e.0)?;
    Ok((0..list.len()).filter_map(|i| list.name(i)).collect())
}

/// Lane rate in Gbit/s and encoding efficiency for `IBV_SPEED`-style `active_speed` values.
fn lane_rate(active_speed: u8) -> Option<(f64, f64)> {
    Some(match active_speed {
        1 => (2.5, 0.8),           // SDR
        2 => (5.0, 0.8),           // DDR
        4 => (10.0, 0.8),          // QDR
        8 => (10.3125, 64. / 66.), // FDR10
        16 => (14.0625, 64. / 66.),
        32 => (25.78125, 64. / 66.),
        64 => (53.125, 64. / 66.),  // HDR
        128 => (106.25, 64. / 66.), // NDR
        _ => return None,
    })
}

fn lanes(active_width: u8) -> Option<u32> {
    Some(match active_width {
        1 => 1,
        2 => 4,
        4 => 8,
        8 => 12,
        16 => 2,
        _ => return None,
    })
}

/// UCX's base latency per link generation (seconds), plus 200 ns on Ethernet.
fn link_latency(active_speed: u8, link: LinkLayer) -> f64 {
    let base = match active_speed {
        1 => 5000e-9,
        2 => 2500e-9,
        4 => 1300e-9,
        8 | 16 => 700e-9,
        _ => 600e-9,
    };
    base + if link == LinkLayer::Ethernet { 200e-9 } else { 0.0 }
}

/// MTU in bytes of an `IBV_MTU_*` value.
pub fn mtu_bytes(mtu: sys::ibv_mtu) -> usize {
    match mtu {
        sys::IBV_MTU_256 => 256,
        sys::IBV_MTU_512 => 512,
        sys::IBV_MTU_1024 => 1024,
        sys::IBV_MTU_2048 => 2048,
        _ => 4096,
    }
}

impl IbDevice {
    /// Opens `name` and reads its attributes and active ports.
    pub fn open(name: &str) -> UcsResult<IbDevice> {
        let ctx = Context::open(name)?;
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut attr: sys::ibv_device_attr_ex = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and attr valid for a write.
        let r = unsafe { sys::ibv_query_device_ex(ctx.lib, ctx.as_ptr(), std::ptr::null(), &mut attr) };
        if r != 0 {
            return Err(verbs_error(&format!("ibv_query_device_ex({name})"), std::io::Error::from_raw_os_error(r)));
        }
        let mut ports = Vec::new();
        for num in 1..=attr.orig_attr.phys_port_cnt {
            // SAFETY: zero is a valid bit pattern for the attribute struct.
            let mut pa: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
            // SAFETY: the context is open and pa valid for a write.
            let r = unsafe { sys::ibv_query_port(ctx.lib, ctx.as_ptr(), num, &mut pa) };
            if r != 0 {
                tracing::warn!("{name}:{num}: ibv_query_port failed: {}", std::io::Error::from_raw_os_error(r));
                continue;
            }
            if pa.state != sys::IBV_PORT_ACTIVE {
                tracing::debug!("{name}:{num}: port not active (state {})", pa.state);
                continue;
            }
            let link_layer = match pa.link_layer as u32 {
                sys::IBV_LINK_LAYER_ETHERNET => LinkLayer::Ethernet,
                _ => LinkLayer::InfiniBand,
            };
            let (lane_gbps, eff) = lane_rate(pa.active_speed).unwrap_or((10.0, 64. / 66.));
            let width = lanes(pa.active_width).unwrap_or(1);
            let mtu = mtu_bytes(pa.active_mtu);
            // Per-packet headers beyond the payload: LRH+BTH+ICRC+VCRC on IB; Ethernet, IP,
            // UDP, BTH, ICRC, FCS and the inter-frame gap on RoCE v2.
            let extra = if link_layer == LinkLayer::Ethernet { 82.0 } else { 26.0 };
            let wire = lane_gbps * width as f64 * eff * 1e9 / 8.0;
            let bandwidth = wire * mtu as f64 / (mtu as f64 + extra);
            ports.push(Port {
                num,
                link_layer,
                lid: pa.lid,
                mtu,
                mtu_enum: pa.active_mtu,
                gid_tbl_len: pa.gid_tbl_len.max(0) as u32,
                lane_gbps,
                width,
                bandwidth,
                latency: link_latency(pa.active_speed, link_layer),
            });
        }
        Ok(IbDevice { name: name.to_string(), ctx, attr, ports })
    }

    /// The active port `num`.
    pub fn port(&self, num: u8) -> Option<&Port> {
        self.ports.iter().find(|p| p.num == num)
    }

    /// Reads GID entry `index` of `port`; `None` for an empty entry.
    pub fn gid_entry(&self, port: u8, index: u32) -> Option<GidChoice> {
        // SAFETY: zero is a valid bit pattern for the entry.
        let mut e: sys::ibv_gid_entry = unsafe { std::mem::zeroed() };
        // SAFETY: the context is open and e valid for a write.
        let r = unsafe { sys::ibv_query_gid_ex(self.ctx.lib, self.ctx.as_ptr(), port as u32, index, &mut e, 0) };
        if r != 0 {
            return None;
        }
        // SAFETY: the union's raw view covers all 16 bytes.
        let gid = unsafe { e.gid.raw };
        if gid.iter().all(|&b| b == 0) {
            return None;
        }
        let gid_type = match e.gid_type {
            sys::IBV_GID_TYPE_ROCE_V2 => GidType::RoceV2,
            sys::IBV_GID_TYPE_ROCE_V1 => GidType::RoceV1,
            _ => GidType::Ib,
        };
        Some(GidChoice { index: u8::try_from(index).ok()?, gid, gid_type })
    }

    /// The GID `port` is addressed by: `UCX_IB_GID_INDEX` when given (it must name a valid
    /// entry), else on Ethernet the first RoCE v2 IPv4-mapped GID, then RoCE v2 IPv6, then
    /// RoCE v1 IPv4, then RoCE v1 IPv6 (UCX's order); on InfiniBand entry 0.
    pub fn select_gid(&self, port: &Port, forced: Option<u32>) -> UcsResult<GidChoice> {
        let limit = port.gid_tbl_len.min(256);
        if let Some(i) = forced {
            if i >= limit {
                tracing::error!(
                    "UCX_IB_GID_INDEX={i} is out of range for {}:{} ({limit} entries)",
                    self.name,
                    port.num
                );
                return Err(Status::InvalidParam);
            }
            return self.gid_entry(port.num, i).ok_or_else(|| {
                tracing::error!("UCX_IB_GID_INDEX={i}: entry {i} of {}:{} is empty", self.name, port.num);
                Status::InvalidParam
            });
        }
        if port.link_layer == LinkLayer::InfiniBand {
            return self.gid_entry(port.num, 0).ok_or(Status::NoDevice);
        }
        let entries: Vec<GidChoice> = (0..limit).filter_map(|i| self.gid_entry(port.num, i)).collect();
        let prefs =
            [(GidType::RoceV2, true), (GidType::RoceV2, false), (GidType::RoceV1, true), (GidType::RoceV1, false)];
        for (ty, v4) in prefs {
            if let Some(g) = entries.iter().find(|g| g.gid_type == ty && g.is_ipv4() == v4) {
                return Ok(*g);
            }
        }
        tracing::error!("{}:{}: no usable RoCE GID (is the interface up with an address?)", self.name, port.num);
        Err(Status::NoDevice)
    }

    /// Device-wide atomic support (`IBV_ATOMIC_HCA` or `IBV_ATOMIC_GLOB`).
    pub fn has_atomics(&self) -> bool {
        self.attr.orig_attr.atomic_cap != sys::IBV_ATOMIC_NONE
    }

    /// Tag-matching offload limits of the device (zero on devices without it, e.g. rxe).
    pub fn tm_caps(&self) -> sys::ibv_tm_caps {
        self.attr.tm_caps
    }

    /// The context's asynchronous-event descriptor.
    pub fn async_fd(&self) -> i32 {
        self.ctx.async_fd()
    }
}

/// Parses a `dev:port` device name (`rxe0:1`).
pub fn parse_dev_port(name: &str) -> UcsResult<(&str, u8)> {
    let (dev, port) = name.rsplit_once(':').ok_or_else(|| {
        tracing::debug!("InfiniBand device name {name:?} lacks a :port suffix");
        Status::NoDevice
    })?;
    let port: u8 = port.parse().map_err(|_| {
        tracing::debug!("InfiniBand device name {name:?}: bad port number");
        Status::NoDevice
    })?;
    if dev.is_empty() || port == 0 {
        return Err(Status::NoDevice);
    }
    Ok((dev, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_port_names() {
        assert_eq!(parse_dev_port("rxe0:1"), Ok(("rxe0", 1)));
        assert_eq!(parse_dev_port("mlx5_0:2"), Ok(("mlx5_0", 2)));
        assert!(parse_dev_port("rxe0").is_err());
        assert!(parse_dev_port("rxe0:0").is_err());
        assert!(parse_dev_port(":1").is_err());
        assert!(parse_dev_port("rxe0:x").is_err());
    }

    #[test]
    fn ipv4_mapped() {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..].copy_from_slice(&[10, 77, 0, 1]);
        assert!(is_ipv4_mapped(&g));
        g[0] = 0xfe;
        assert!(!is_ipv4_mapped(&g));
    }

    #[test]
    fn models() {
        assert_eq!(mtu_bytes(sys::IBV_MTU_1024), 1024);
        assert_eq!(lanes(2), Some(4));
        assert!(link_latency(32, LinkLayer::Ethernet) > link_latency(32, LinkLayer::InfiniBand));
    }
}
