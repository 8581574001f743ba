//! The `self` component and memory domain: registrations of local memory and their keys.
//!
//! Registrations live in a process-wide table. A packed key names the registration by a
//! generation-checked id and carries the process id and the region bounds; unpacking checks all
//! of it, and every access looks the registration up again (under the table lock, which also
//! holds off deregistration), so a stale or forged key fails with an error instead of reaching
//! memory that is no longer registered.

use std::rc::Rc;
use std::sync::{LazyLock, Mutex};

use ucs::idtable::{Id, IdTable};
use ucs::{Status, UcsResult};
use uct::{
    Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, MemAccess, MemH, MemRegion, RemoteKey,
    TlResource, Worker,
};

use crate::sm::LocalRegion;

/// Component, memory domain and transport name.
pub const NAME: &str = "self";
/// The one device of the `self` transport.
pub const DEVICE: &str = "memory0";

const RKEY_MAGIC: u32 = u32::from_le_bytes(*b"SLFK");
const RKEY_LEN: usize = 32;

#[derive(Clone, Copy)]
struct Registration {
    base: usize,
    len: usize,
}

static REGISTRATIONS: LazyLock<Mutex<IdTable<Registration>>> = LazyLock::new(|| Mutex::new(IdTable::new()));

fn table() -> std::sync::MutexGuard<'static, IdTable<Registration>> {
    REGISTRATIONS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the registered region named by `rkey`, holding the table lock so the
/// registration cannot end meanwhile. `off` is the offset `RemoteKey::check` returned.
pub(crate) fn with_region<T>(rkey: &RemoteKey, f: impl FnOnce(LocalRegion) -> UcsResult<T>) -> UcsResult<T> {
    let t = table();
    let reg = t.get(Id::from_raw(rkey.rkey())).ok_or(Status::InvalidParam)?;
    if reg.base as u64 != rkey.base() || reg.len as u64 != rkey.length() {
        return Err(Status::InvalidParam);
    }
    f(LocalRegion { base: reg.base as *mut u8, len: reg.len })
}

struct SelfRegion {
    id: Id,
    base: *mut u8,
    len: usize,
}

impl MemRegion for SelfRegion {
    fn address(&self) -> *mut u8 {
        self.base
    }
    fn length(&self) -> usize {
        self.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for SelfRegion {
    fn drop(&mut self) {
        table().remove(self.id);
    }
}

/// The `self` component.
pub struct SelfComponent;

/// The registered instance.
pub static COMPONENT: SelfComponent = SelfComponent;

impl Component for SelfComponent {
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
        Ok(Rc::new(SelfMd::new()))
    }

    fn rkey_unpack(&self, packed: &[u8]) -> UcsResult<RemoteKey> {
        let bytes: &[u8; RKEY_LEN] = packed.try_into().map_err(|_| {
            tracing::debug!(len = packed.len(), "self rkey: wrong length (expected {RKEY_LEN})");
            Status::InvalidParam
        })?;
        let word = |i: usize| u64::from_le_bytes(bytes[i..i + 8].try_into().unwrap_or_default());
        let magic = u32::from_le_bytes(bytes[0..4].try_into().unwrap_or_default());
        let pid = u32::from_le_bytes(bytes[4..8].try_into().unwrap_or_default());
        if magic != RKEY_MAGIC {
            tracing::debug!("self rkey: bad magic");
            return Err(Status::InvalidParam);
        }
        if pid != std::process::id() {
            tracing::debug!(pid, "self rkey: registered by another process");
            return Err(Status::Unreachable);
        }
        let (id, base, len) = (word(8), word(16), word(24));
        if base.checked_add(len).is_none() {
            return Err(Status::InvalidParam);
        }
        Ok(RemoteKey::new(NAME, id, base, len, None))
    }
}

/// The `self` memory domain.
pub struct SelfMd {
    attr: MdAttr,
}

impl SelfMd {
    fn new() -> Self {
        SelfMd {
            attr: MdAttr {
                flags: MdFlags::REG | MdFlags::NEED_RKEY,
                max_alloc: 0,
                max_reg: usize::MAX,
                rkey_packed_size: RKEY_LEN,
                reg_cost: LinearFunc { c: 0.0, m: 0.0 },
            },
        }
    }
}

impl Md for SelfMd {
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
        vec![TlResource { tl_name: NAME.into(), dev_name: DEVICE.into(), dev_type: DeviceType::SelfDev }]
    }

    fn iface_open(&self, worker: &Worker, params: &IfaceParams) -> UcsResult<Box<dyn Iface>> {
        if params.tl_name != NAME || params.dev_name != DEVICE {
            tracing::debug!(tl = %params.tl_name, dev = %params.dev_name, "self md: no such transport/device");
            return Err(Status::NoDevice);
        }
        Ok(Box::new(super::iface::SelfIface::open(worker, params)?))
    }

    unsafe fn mem_reg(&self, addr: *mut u8, len: usize, _access: MemAccess) -> UcsResult<MemH> {
        if addr.is_null() && len > 0 || (addr as usize).checked_add(len).is_none() {
            return Err(Status::InvalidParam);
        }
        let id = table().insert(Registration { base: addr as usize, len });
        Ok(MemH::new(SelfRegion { id, base: addr, len }))
    }

    fn mkey_pack(&self, memh: &MemH) -> UcsResult<Vec<u8>> {
        let r = memh.downcast_ref::<SelfRegion>().ok_or(Status::InvalidParam)?;
        let mut out = Vec::with_capacity(RKEY_LEN);
        out.extend_from_slice(&RKEY_MAGIC.to_le_bytes());
        out.extend_from_slice(&std::process::id().to_le_bytes());
        out.extend_from_slice(&r.id.raw().to_le_bytes());
        out.extend_from_slice(&(r.base as u64).to_le_bytes());
        out.extend_from_slice(&(r.len as u64).to_le_bytes());
        Ok(out)
    }
}
