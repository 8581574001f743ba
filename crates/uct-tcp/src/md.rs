//! The `tcp` component and memory domain, and the devices: every network interface that is up
//! and has an IPv4 or IPv6 address (loopback included, for tests on one host), as UCX lists
//! them. The memory domain registers nothing: the transport copies every message.

use std::ffi::CStr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::rc::Rc;

use ucs::{Status, UcsResult};
use uct::{Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, RemoteKey, TlResource, Worker};

/// Component, memory domain and transport name.
pub const NAME: &str = "tcp";

/// The `tcp` component.
pub struct TcpComponent;

/// The registered instance.
pub static COMPONENT: TcpComponent = TcpComponent;

impl Component for TcpComponent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn md_names(&self) -> Vec<String> {
        vec![NAME.to_string()]
    }

    fn md_open(&self, md_name: &str) -> UcsResult<Rc<dyn Md>> {
        if md_name != NAME {
            return Err(Status::NoDevice);
        }
        Ok(Rc::new(TcpMd {
            attr: MdAttr {
                flags: MdFlags::empty(),
                max_alloc: 0,
                max_reg: 0,
                rkey_packed_size: 0,
                reg_cost: LinearFunc { c: 0.0, m: 0.0 },
            },
        }))
    }

    fn rkey_unpack(&self, packed: &[u8]) -> UcsResult<RemoteKey> {
        tracing::debug!(len = packed.len(), "tcp: no remote keys (the transport has no remote memory access)");
        Err(Status::Unsupported)
    }

    fn cm_open(&self) -> Option<UcsResult<Box<dyn uct::Cm>>> {
        Some(Ok(Box::new(crate::sockcm::TcpSockCm)))
    }
}

/// The `tcp` memory domain.
pub struct TcpMd {
    attr: MdAttr,
}

impl Md for TcpMd {
    fn name(&self) -> &str {
        NAME
    }

    fn component(&self) -> &'static dyn Component {
        &COMPONENT
    }

    fn attr(&self) -> &MdAttr {
        &self.attr
    }

    fn tl_resources(&self) -> Vec<TlResource> {
        devices()
            .into_iter()
            .map(|d| TlResource {
                tl_name: NAME.into(),
                dev_name: d.name,
                dev_type: DeviceType::Net,
                config_prefixes: crate::config::CONFIG_PREFIXES,
            })
            .collect()
    }

    /// Nothing to register: zero-copy sends write from the caller's memory (a handle that is
    /// only the range).
    unsafe fn mem_reg(&self, addr: *mut u8, len: usize, _access: uct::MemAccess) -> UcsResult<uct::MemH> {
        Ok(uct::MemH::bounds(NAME, addr, len))
    }

    fn iface_open(&self, worker: &Worker, params: &IfaceParams) -> UcsResult<Box<dyn Iface>> {
        if params.tl_name != NAME {
            return Err(Status::NoDevice);
        }
        let Some(dev) = devices().into_iter().find(|d| d.name == params.dev_name) else {
            tracing::debug!(dev = %params.dev_name, "tcp: no such network device (or it is down, or has no address)");
            return Err(Status::NoDevice);
        };
        Ok(Box::new(crate::iface::TcpIface::open(worker, params, &dev)?))
    }
}

/// A network device the transport can use.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NetDevice {
    /// The interface's name (`lo`, `eth0`).
    pub name: String,
    /// Its address: the first IPv4 one, else the first IPv6 one.
    pub addr: IpAddr,
    /// IPv6 scope (interface index) for a link-local address.
    pub scope_id: u32,
}

/// The network interfaces that are up and running and have an IPv4 or IPv6 address, in the
/// order the system lists them.
pub fn devices() -> Vec<NetDevice> {
    let mut out: Vec<NetDevice> = Vec::new();
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: `getifaddrs` writes a list head into `ifap`; freed below with `freeifaddrs`.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        tracing::warn!("tcp: getifaddrs failed: {}", std::io::Error::last_os_error());
        return out;
    }
    let mut p = ifap;
    while !p.is_null() {
        // SAFETY: `p` is a node of the list `getifaddrs` returned, alive until `freeifaddrs`.
        let ifa = unsafe { &*p };
        p = ifa.ifa_next;
        let up = libc::IFF_UP as u32 | libc::IFF_RUNNING as u32;
        if ifa.ifa_addr.is_null() || ifa.ifa_flags & up != up || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null `ifa_name` is a NUL-terminated string of the list.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy().into_owned();
        // SAFETY: a non-null `ifa_addr` points at a sockaddr whose family says its type.
        let family = unsafe { (*ifa.ifa_addr).sa_family } as i32;
        let (addr, scope_id) = match family {
            libc::AF_INET => {
                // SAFETY: the family is AF_INET, so this is a `sockaddr_in`.
                let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                (IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr))), 0)
            }
            libc::AF_INET6 => {
                // SAFETY: the family is AF_INET6, so this is a `sockaddr_in6`.
                let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                (IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr)), sin6.sin6_scope_id)
            }
            _ => continue,
        };
        match out.iter_mut().find(|d| d.name == name) {
            // IPv4 first: replace an IPv6 address found before.
            Some(d) if d.addr.is_ipv6() && addr.is_ipv4() => {
                d.addr = addr;
                d.scope_id = 0;
            }
            Some(_) => {}
            None => out.push(NetDevice { name, addr, scope_id }),
        }
    }
    // SAFETY: `ifap` came from `getifaddrs` and is freed once.
    unsafe { libc::freeifaddrs(ifap) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_is_listed_with_an_address() {
        let devs = devices();
        let lo = devs.iter().find(|d| d.name == "lo").expect("the loopback device");
        assert!(lo.addr.is_loopback(), "{lo:?}");
    }
}
