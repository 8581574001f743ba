//! The `ib` component and its memory domains, one per device: protection domain, memory
//! registration, allocation of registered memory, and remote keys.
//!
//! A packed remote key is 24 bytes: `"IBRK"`, the 32-bit rkey, then the region's base and
//! length (little endian), so the sender can check an access against the region before posting
//! it; the remote adapter checks the key itself in any case.

use std::mem::ManuallyDrop;
use std::ptr::NonNull;
use std::rc::Rc;

use ucs::{Status, UcsResult};
use uct::{
    Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, MemAccess, MemH, MemRegion, RemoteKey,
    TlResource, Worker,
};

use rdma_core_sys as sys;

use crate::device::{device_names, parse_dev_port, IbDevice};
use crate::verbs::{last_os_error, Mr, Pd};

/// Component name.
pub const NAME: &str = "ib";

const RKEY_MAGIC: [u8; 4] = *b"IBRK";
const RKEY_LEN: usize = 4 + 4 + 8 + 8;

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

/// A registration (or a registered allocation) of the `ib` memory domain.
pub struct IbRegion {
    mr: ManuallyDrop<Mr>,
    addr: *mut u8,
    len: usize,
    /// For allocations: the mapping to unmap after deregistration.
    mapping: Option<(NonNull<u8>, usize)>,
}

impl IbRegion {
    /// Local key, for scatter/gather entries.
    pub fn lkey(&self) -> u32 {
        self.mr.lkey()
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        self.mr.rkey()
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
        // Deregister first, then unmap an allocation.
        // SAFETY: dropped exactly once, here; the field is not used afterwards.
        unsafe { ManuallyDrop::drop(&mut self.mr) };
        if let Some((p, len)) = self.mapping.take() {
            // SAFETY: the mapping came from mmap in mem_alloc with this length; its
            // registration is gone and no handle refers to it any more.
            unsafe { libc::munmap(p.as_ptr().cast(), len) };
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
    attr: MdAttr,
}

impl IbMd {
    /// Opens the device `name` and allocates a protection domain.
    pub fn open(name: &str) -> UcsResult<Rc<IbMd>> {
        let dev = Rc::new(IbDevice::open(name)?);
        let pd = Pd::alloc(&dev.ctx)?;
        let attr = MdAttr {
            flags: MdFlags::REG | MdFlags::ALLOC | MdFlags::NEED_MEMH | MdFlags::NEED_RKEY,
            max_alloc: usize::MAX,
            max_reg: dev.attr.orig_attr.max_mr_size as usize,
            rkey_packed_size: RKEY_LEN,
            // UCX's model of a verbs registration: 16 us + 0.06 ns per byte.
            reg_cost: LinearFunc { c: 16e-6, m: 0.06e-9 },
        };
        Ok(Rc::new(IbMd { dev, pd, attr }))
    }

    /// Registers `[addr, addr + len)` and returns the region.
    ///
    /// # Safety
    /// The memory must stay mapped while the region lives.
    pub unsafe fn register(&self, addr: *mut u8, len: usize) -> UcsResult<IbRegion> {
        // SAFETY: forwarded (caller).
        let mr = unsafe { Mr::register(&self.pd, addr, len, access_flags(&self.dev))? };
        Ok(IbRegion { mr: ManuallyDrop::new(mr), addr, len, mapping: None })
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
            out.push(TlResource {
                tl_name: crate::rc::NAME.into(),
                dev_name: format!("{}:{}", self.dev.name, p.num),
                dev_type: DeviceType::Net,
            });
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
            _ => Err(Status::NoDevice),
        }
    }

    unsafe fn mem_reg(&self, addr: *mut u8, len: usize, _access: MemAccess) -> UcsResult<MemH> {
        if len == 0 || (addr as usize).checked_add(len).is_none() {
            return Err(Status::InvalidParam);
        }
        // SAFETY: forwarded (caller keeps the memory mapped while registered).
        Ok(MemH::new(unsafe { self.register(addr, len)? }))
    }

    fn mem_alloc(&self, len: usize, _access: MemAccess, name: &str) -> UcsResult<MemH> {
        if len == 0 {
            return Err(Status::InvalidParam);
        }
        // SAFETY: an anonymous private mapping; checked for failure below.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            tracing::error!("ib: mmap of {len} bytes for {name} failed: {}", last_os_error());
            return Err(Status::NoMemory);
        }
        let base = p.cast::<u8>();
        // SAFETY: the mapping lives until the region's drop unmaps it, after deregistration.
        match unsafe { self.register(base, len) } {
            Ok(mut r) => {
                r.mapping = NonNull::new(base).map(|b| (b, len));
                Ok(MemH::new(r))
            }
            Err(e) => {
                // SAFETY: our own mapping, not registered.
                unsafe { libc::munmap(p, len) };
                Err(e)
            }
        }
    }

    fn mkey_pack(&self, memh: &MemH) -> UcsResult<Vec<u8>> {
        let r = memh.downcast_ref::<IbRegion>().ok_or(Status::InvalidParam)?;
        let mut out = Vec::with_capacity(RKEY_LEN);
        out.extend_from_slice(&RKEY_MAGIC);
        out.extend_from_slice(&r.rkey().to_le_bytes());
        out.extend_from_slice(&(r.addr as u64).to_le_bytes());
        out.extend_from_slice(&(r.len as u64).to_le_bytes());
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
