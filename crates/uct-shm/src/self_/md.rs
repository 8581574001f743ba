//! The `self` component and memory domain: registrations of local memory and their keys.
//!
//! Each registration has a small shared record (bounds plus an `alive` flag under a read-write
//! lock) listed in a process-wide table. A packed key names the registration by a
//! generation-checked id and carries the process id and the bounds; unpacking looks the record
//! up (it must be live and match the bounds exactly) and keeps it in the key. Every access
//! takes the record's read lock and checks `alive`; deregistration takes the write lock, so a
//! stale or forged key fails with an error instead of reaching memory that is no longer
//! registered. No user code runs while a lock is held.

use std::rc::Rc;
use std::sync::{Arc, LazyLock, Mutex, RwLock};

use ucs::idtable::{Id, IdTable};
use ucs::{Status, UcsResult};
use uct::{
    Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, MemAccess, MemH, MemRegion, PackedKey,
    RemoteKey, TlResource, Worker,
};

use crate::sm::LocalRegion;

/// Component, memory domain and transport name.
pub const NAME: &str = "self";
/// The one device of the `self` transport.
pub const DEVICE: &str = "memory0";

const RKEY_MAGIC: u32 = u32::from_le_bytes(*b"SLFK");
const RKEY_LEN: usize = 32;

/// A registered region, shared by its handle, the table and the keys that name it.
struct Registration {
    base: usize,
    len: usize,
    alive: RwLock<bool>,
}

type Table = IdTable<Arc<Registration>>;

static REGISTRATIONS: LazyLock<Mutex<Table>> = LazyLock::new(|| Mutex::new(IdTable::new()));

fn table() -> std::sync::MutexGuard<'static, Table> {
    REGISTRATIONS.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `f` on the registered region named by `rkey` while holding the registration (its read
/// lock), so it cannot end meanwhile. `f` must not call back into user code.
#[inline]
pub(crate) fn with_region<T>(rkey: &RemoteKey, f: impl FnOnce(LocalRegion) -> UcsResult<T>) -> UcsResult<T> {
    let reg = rkey.handle::<Arc<Registration>>().ok_or(Status::InvalidParam)?;
    let alive = reg.alive.read().unwrap_or_else(|p| p.into_inner());
    if !*alive {
        tracing::debug!("self: remote key of a deregistered region");
        return Err(Status::InvalidParam);
    }
    f(LocalRegion { base: reg.base as *mut u8, len: reg.len })
}

struct SelfRegion {
    id: Id,
    reg: Arc<Registration>,
}

impl MemRegion for SelfRegion {
    fn address(&self) -> *mut u8 {
        self.reg.base as *mut u8
    }
    fn length(&self) -> usize {
        self.reg.len
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for SelfRegion {
    fn drop(&mut self) {
        // Waits for accesses in flight; later ones see `alive == false`.
        *self.reg.alive.write().unwrap_or_else(|p| p.into_inner()) = false;
        let removed = table().remove(self.id);
        drop(removed);
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
        let reg = table().get(Id::from_raw(id)).cloned().ok_or_else(|| {
            tracing::debug!(id, "self rkey: no such registration (stale or corrupted key)");
            Status::InvalidParam
        })?;
        if reg.base as u64 != base || reg.len as u64 != len {
            tracing::debug!(base, len, "self rkey: bounds do not match the registration");
            return Err(Status::InvalidParam);
        }
        Ok(RemoteKey::new(NAME, id, base, len, Some(Box::new(reg))))
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
        vec![TlResource {
            tl_name: NAME.into(),
            dev_name: DEVICE.into(),
            dev_type: DeviceType::SelfDev,
            config_prefixes: super::config::CONFIG_PREFIXES,
        }]
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
        let reg = Arc::new(Registration { base: addr as usize, len, alive: RwLock::new(true) });
        let id = table().insert(reg.clone());
        Ok(MemH::new(SelfRegion { id, reg }))
    }

    fn mkey_pack(&self, memh: &MemH) -> UcsResult<PackedKey> {
        let r = memh.downcast_ref::<SelfRegion>().ok_or(Status::InvalidParam)?;
        let mut out = PackedKey::new();
        out.push(&RKEY_MAGIC.to_le_bytes())?;
        out.push(&std::process::id().to_le_bytes())?;
        out.push(&r.id.raw().to_le_bytes())?;
        out.push(&(r.reg.base as u64).to_le_bytes())?;
        out.push(&(r.reg.len as u64).to_le_bytes())?;
        Ok(out)
    }
}
