//! The `ib` component and its memory domains, one per device: protection domain, memory
//! registration, allocation of registered memory, and remote keys.
//!
//! A packed remote key is 24 bytes: `"IBRK"`, the 32-bit rkey, then the region's base and
//! length (little endian), so the sender can check an access against the region before posting
//! it; the remote adapter checks the key itself in any case.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::rc::Rc;

use ucs::config::{Config, Ternary};
use ucs::rcache::{Rcache, RcacheConfig, RcacheHandle, RcacheParams, RegBackend, RegRequest, UnmapEvents};
use ucs::{Status, UcsResult};
use uct::{
    Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, MemAccess, MemH, MemRegion, PackedKey,
    RemoteKey, TlResource, Worker,
};

use rdma_core_sys as sys;

use crate::device::{device_names, parse_dev_port, IbDevice};
use crate::verbs::{Mr, Pd};

/// Component name.
pub const NAME: &str = "ib";

const RKEY_MAGIC: [u8; 4] = *b"IBRK";
pub(crate) const RKEY_LEN: usize = 4 + 4 + 8 + 8;

/// The packed form of remote key `rkey` for `len` bytes at `base` (what `mkey_pack` gives for
/// such a registration): for keys that arrive in a peer's headers, e.g. a rendezvous request.
pub(crate) fn pack_rkey(rkey: u32, base: u64, len: u64) -> [u8; RKEY_LEN] {
    let mut out = [0u8; RKEY_LEN];
    out[..4].copy_from_slice(&RKEY_MAGIC);
    out[4..8].copy_from_slice(&rkey.to_le_bytes());
    out[8..16].copy_from_slice(&base.to_le_bytes());
    out[16..24].copy_from_slice(&len.to_le_bytes());
    out
}

/// The `ib` component.
pub struct IbComponent;

/// The registered instance.
pub static COMPONENT: IbComponent = IbComponent;

impl Component for IbComponent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn md_names(&self) -> Vec<String> {
        device_names().unwrap_or_default()
    }

    fn md_open(&self, md_name: &str) -> UcsResult<Rc<dyn Md>> {
        Ok(IbMd::open(md_name)?)
    }

    fn rkey_unpack(&self, packed: &[u8]) -> UcsResult<RemoteKey> {
        if packed.len() != RKEY_LEN || packed[..4] != RKEY_MAGIC {
            tracing::debug!(len = packed.len(), "ib: malformed remote key");
            return Err(Status::InvalidParam);
        }
        let rkey = u32::from_le_bytes(packed[4..8].try_into().map_err(|_| Status::InvalidParam)?);
        let base = u64::from_le_bytes(packed[8..16].try_into().map_err(|_| Status::InvalidParam)?);
        let len = u64::from_le_bytes(packed[16..24].try_into().map_err(|_| Status::InvalidParam)?);
        if base.checked_add(len).is_none() {
            tracing::debug!(base, len, "ib: remote key region wraps around");
            return Err(Status::InvalidParam);
        }
        Ok(RemoteKey::new(NAME, rkey as u64, base, len, None))
    }

    fn unavailable_reason(&self) -> Option<String> {
        match device_names() {
            Ok(names) if !names.is_empty() => None,
            Ok(_) => Some("no RDMA devices".into()),
            Err(why) => Some(why),
        }
    }
}

ucs::config_table! {
    /// Options of the `ib` memory domain (`UCX_IB_*`).
    pub struct IbMdConfigTable {
        pub rcache: Ternary = ("RCACHE", "try",
            "Registration cache: yes (fail without it), no, or try (use it when memory events are available)."),
    }
}

/// Registers with the protection domain for the registration cache.
pub struct PdBackend {
    pd: Rc<Pd>,
}

impl RegBackend for PdBackend {
    type Reg = Mr;

    fn register(&self, req: &RegRequest) -> Result<Mr, Status> {
        // SAFETY: the cache registers ranges users asked for (mapped memory); when the memory
        // is unmapped the memory hooks invalidate the region, so it is not handed out again.
        let r = unsafe { Mr::register_quiet(&self.pd, req.addr as *mut u8, req.len, req.access) };
        if let Err(e) = &r {
            if req.merged {
                tracing::debug!("ib: merged registration of {:#x}+{} failed ({e}); retrying alone", req.addr, req.len);
            } else {
                tracing::error!("ib: ibv_reg_mr({:#x}, {}, access {:#x}) failed: {e}", req.addr, req.len, req.access);
            }
        }
        r
    }

    fn deregister(&self, reg: Mr) {
        drop(reg);
    }
}

enum RegionKind {
    /// A region of the registration cache (possibly larger than the request).
    Cached(RcacheHandle<PdBackend>),
    /// A registration of the domain's own allocation, with the mapping to unmap afterwards.
    Alloc { mr: ManuallyDrop<Mr>, mapping: (NonNull<u8>, usize) },
}

/// A registration (or a registered allocation) of the `ib` memory domain.
pub struct IbRegion {
    kind: RegionKind,
    addr: *mut u8,
    len: usize,
}

impl IbRegion {
    fn mr(&self) -> &Mr {
        match &self.kind {
            RegionKind::Cached(h) => h.reg(),
            RegionKind::Alloc { mr, .. } => mr,
        }
    }

    /// Local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.mr().lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr().rkey()
    }
}

impl MemRegion for IbRegion {
    fn address(&self) -> *mut u8 {
        self.addr
    }
    fn length(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for IbRegion {
    fn drop(&mut self) {
        if let RegionKind::Alloc { mr, mapping } = &mut self.kind {
            // Deregister first, then unmap.
            // SAFETY: dropped exactly once, here; the field is not used afterwards.
            unsafe { ManuallyDrop::drop(mr) };
            // SAFETY: the mapping came from mmap in mem_alloc with this length; its
            // registration is gone and no handle refers to it any more.
            unsafe { libc::munmap(mapping.0.as_ptr().cast(), mapping.1) };
        }
    }
}

/// Access flags for every registration: local write and remote read/write, plus atomics when
/// the device has them.
fn access_flags(dev: &IbDevice) -> u32 {
    let mut a = sys::IBV_ACCESS_LOCAL_WRITE | sys::IBV_ACCESS_REMOTE_WRITE | sys::IBV_ACCESS_REMOTE_READ;
    if dev.has_atomics() {
        a |= sys::IBV_ACCESS_REMOTE_ATOMIC;
    }
    a
}

/// The memory domain of one device.
pub struct IbMd {
    /// The device.
    pub dev: Rc<IbDevice>,
    /// Its protection domain.
    pub pd: Rc<Pd>,
    rcache: Rcache<PdBackend>,
    access: u32,
    attr: MdAttr,
}

impl IbMd {
    /// Opens the device `name` and allocates a protection domain.
    pub fn open(name: &str) -> UcsResult<Rc<IbMd>> {
        let dev = Rc::new(IbDevice::open(name)?);
        let pd = Pd::alloc(&dev.ctx)?;
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let md_cfg = IbMdConfigTable::read(&["IB_"]).map_err(report)?;
        let rc_cfg = RcacheConfig::read(&["IB_", ""]).map_err(report)?;
        let mut params = RcacheParams::from_config(name, &rc_cfg);
        if md_cfg.rcache == Ternary::No {
            // No caching at all: every registration is made and released on demand.
            params.events = UnmapEvents::Required;
            params.max_regions = 0;
        }
        let rcache = Rcache::new(PdBackend { pd: pd.clone() }, params)?;
        if !rcache.is_caching() {
            if md_cfg.rcache == Ternary::Yes {
                tracing::error!(
                    "UCX_IB_RCACHE=yes but the registration cache cannot work here: {}",
                    rcache.disabled_reason().unwrap_or("disabled")
                );
                return Err(Status::Unsupported);
            }
            tracing::debug!("{name}: registration cache off: {:?}", rcache.disabled_reason());
        }
        let attr = MdAttr {
            flags: MdFlags::REG | MdFlags::ALLOC | MdFlags::NEED_MEMH | MdFlags::NEED_RKEY,
            max_alloc: usize::MAX,
            max_reg: dev.attr.orig_attr.max_mr_size as usize,
            rkey_packed_size: RKEY_LEN,
            // UCX's model of a verbs registration: 16 us + 0.06 ns per byte.
            reg_cost: LinearFunc { c: 16e-6, m: 0.06e-9 },
        };
        let access = access_flags(&dev);
        Ok(Rc::new(IbMd { dev, pd, rcache, access, attr }))
    }

    /// Registers `[addr, addr + len)` through the registration cache and returns the region.
    pub fn register(&self, addr: *mut u8, len: usize) -> UcsResult<IbRegion> {
        let h = self.rcache.get(addr as usize, len, self.access)?;
        Ok(IbRegion { kind: RegionKind::Cached(h), addr, len })
    }

    /// The registration cache (statistics, explicit invalidation).
    pub fn rcache(&self) -> &Rcache<PdBackend> {
        &self.rcache
    }
}

impl Md for IbMd {
    fn name(&self) -> &str {
        &self.dev.name
    }

    fn component(&self) -> &'static dyn Component {
        &COMPONENT
    }

    fn attr(&self) -> &MdAttr {
        &self.attr
    }

    fn tl_resources(&self) -> Vec<TlResource> {
        let mut out = Vec::new();
        for p in &self.dev.ports {
            for (tl, config_prefixes) in
                [(crate::rc::NAME, crate::rc::CONFIG_PREFIXES), (crate::ud::NAME, crate::ud::CONFIG_PREFIXES)]
            {
                out.push(TlResource {
                    tl_name: tl.into(),
                    dev_name: format!("{}:{}", self.dev.name, p.num),
                    dev_type: DeviceType::Net,
                    config_prefixes,
                });
            }
        }
        out
    }

    fn iface_open(&self, worker: &Worker, params: &IfaceParams) -> UcsResult<Box<dyn Iface>> {
        let (dev, port) = parse_dev_port(&params.dev_name)?;
        if dev != self.dev.name || self.dev.port(port).is_none() {
            return Err(Status::NoDevice);
        }
        match params.tl_name.as_str() {
            crate::rc::NAME => Ok(Box::new(crate::rc::RcIface::open(self, port, worker, params)?)),
            crate::ud::NAME => Ok(Box::new(crate::ud::UdVerbsIface::open(self, port, worker, params)?)),
            _ => Err(Status::NoDevice),
        }
    }

    unsafe fn mem_reg(&self, addr: *mut u8, len: usize, _access: MemAccess) -> UcsResult<MemH> {
        if len == 0 || (addr as usize).checked_add(len).is_none() {
            return Err(Status::InvalidParam);
        }
        Ok(MemH::new(self.register(addr, len)?))
    }

    fn mem_alloc(&self, len: usize, _access: MemAccess, name: &str) -> UcsResult<MemH> {
        if len == 0 {
            return Err(Status::InvalidParam);
        }
        let mapping = crate::pool::map_anon(len, name)?;
        let base = mapping.as_ptr();
        // SAFETY: the mapping lives until the region's drop unmaps it, after deregistration.
        // Allocations bypass the cache: they are registered exactly once, for their lifetime.
        match unsafe { Mr::register(&self.pd, base, len, self.access) } {
            Ok(mr) => Ok(MemH::new(IbRegion {
                kind: RegionKind::Alloc { mr: ManuallyDrop::new(mr), mapping: (mapping, len) },
                addr: base,
                len,
            })),
            Err(e) => {
                // SAFETY: our own mapping, not registered.
                unsafe { libc::munmap(base.cast(), len) };
                Err(e)
            }
        }
    }

    fn mkey_pack(&self, memh: &MemH) -> UcsResult<PackedKey> {
        let r = memh.downcast_ref::<IbRegion>().ok_or(Status::InvalidParam)?;
        let mut out = PackedKey::new();
        out.push(&RKEY_MAGIC)?;
        out.push(&r.rkey().to_le_bytes())?;
        out.push(&(r.addr as u64).to_le_bytes())?;
        out.push(&(r.len as u64).to_le_bytes())?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rkey_unpack_rejects_garbage() {
        let c = &COMPONENT;
        assert!(c.rkey_unpack(&[]).is_err());
        assert!(c.rkey_unpack(&[0; RKEY_LEN]).is_err());
        let mut k = Vec::from(RKEY_MAGIC);
        k.extend_from_slice(&7u32.to_le_bytes());
        k.extend_from_slice(&u64::MAX.to_le_bytes());
        k.extend_from_slice(&2u64.to_le_bytes());
        assert_eq!(c.rkey_unpack(&k).err(), Some(Status::InvalidParam), "wrapping region");
        k[8..16].copy_from_slice(&0x1000u64.to_le_bytes());
        let key = c.rkey_unpack(&k).unwrap();
        assert_eq!((key.rkey(), key.base(), key.length()), (7, 0x1000, 2));
        assert!(c.rkey_unpack(&k[..RKEY_LEN - 1]).is_err());
    }
}
