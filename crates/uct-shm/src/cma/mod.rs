//! The `cma` transport: single-copy put/get between processes with `process_vm_writev` /
//! `process_vm_readv` (Linux cross-memory attach).
//!
//! Zero-copy operations are queued per interface and progressed from `progress` in segments of
//! `UCX_CMA_SEG_SIZE` (512 KiB), `UCX_CMA_TX_QUOTA` segments per call; completions are in
//! order. The memory domain's registration only records bounds, so remote keys carry the
//! owner's pid and region and every access is checked against them; the kernel checks the
//! rest (an unmapped address is `EFAULT`, an error status).
//!
//! Availability follows `/proc/sys/kernel/yama/ptrace_scope`: absent or 0, usable; 1, usable
//! after `prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY)`; otherwise the component offers no
//! memory domain and says why. `EPERM`/`ESRCH` from the kernel fail the endpoint with
//! `ConnectionReset` (peer gone or not accessible), reported to the error handler.

mod iface;

use std::rc::Rc;

use ucs::{Status, UcsResult};
use uct::{
    Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, MemAccess, MemH, PackedKey, RemoteKey,
    TlResource, Worker,
};

pub use iface::{CmaEp, CmaIface};

/// Component, memory domain and transport name.
pub const NAME: &str = "cma";
/// Device name.
pub const DEVICE: &str = "memory";

const RKEY_MAGIC: u32 = u32::from_le_bytes(*b"CMAK");
const RKEY_LEN: usize = 4 + 4 + 8 + 8;

/// Why CMA cannot be used here, if it cannot.
fn unavailable() -> Option<String> {
    let scope = match std::fs::read_to_string("/proc/sys/kernel/yama/ptrace_scope") {
        Err(_) => return None,
        Ok(s) => s.trim().parse::<u32>().unwrap_or(3),
    };
    match scope {
        0 => None,
        1 => {
            // SAFETY: plain prctl; allows any process of this user to attach (as UCX does).
            let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
            if r == 0 {
                None
            } else {
                Some(format!("ptrace_scope is 1 and PR_SET_PTRACER failed: {}", std::io::Error::last_os_error()))
            }
        }
        n => Some(format!("/proc/sys/kernel/yama/ptrace_scope is {n}: cross-memory attach is not permitted")),
    }
}

/// The `cma` component.
pub struct CmaComponent;

/// The registered instance.
pub static COMPONENT: CmaComponent = CmaComponent;

impl Component for CmaComponent {
    fn name(&self) -> &'static str {
        NAME
    }

    fn md_names(&self) -> Vec<String> {
        if unavailable().is_some() {
            Vec::new()
        } else {
            vec![NAME.to_string()]
        }
    }

    fn md_open(&self, md_name: &str) -> UcsResult<Rc<dyn Md>> {
        if md_name != NAME {
            return Err(Status::NoDevice);
        }
        if let Some(why) = unavailable() {
            tracing::debug!("cma unavailable: {why}");
            return Err(Status::Unsupported);
        }
        Ok(Rc::new(CmaMd {
            pid: std::process::id(),
            attr: MdAttr {
                flags: MdFlags::REG | MdFlags::NEED_RKEY,
                max_alloc: 0,
                max_reg: usize::MAX,
                rkey_packed_size: RKEY_LEN,
                reg_cost: LinearFunc { c: 0.0, m: 0.0 },
            },
        }))
    }

    fn rkey_unpack(&self, packed: &[u8]) -> UcsResult<RemoteKey> {
        if packed.len() != RKEY_LEN || packed[..4] != RKEY_MAGIC.to_le_bytes() {
            tracing::debug!(len = packed.len(), "cma: malformed remote key");
            return Err(Status::InvalidParam);
        }
        let pid = u32::from_le_bytes([packed[4], packed[5], packed[6], packed[7]]);
        let word = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&packed[i..i + 8]);
            u64::from_le_bytes(b)
        };
        let (base, len) = (word(8), word(16));
        if pid == 0 || base.checked_add(len).is_none() {
            return Err(Status::InvalidParam);
        }
        Ok(RemoteKey::new(NAME, pid as u64, base, len, None))
    }

    fn unavailable_reason(&self) -> Option<String> {
        unavailable()
    }
}

/// The `cma` memory domain.
pub struct CmaMd {
    attr: MdAttr,
    /// This process, for the remote keys (read once: `getpid` is a system call).
    pid: u32,
}

impl Md for CmaMd {
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
            dev_type: DeviceType::Shm,
            config_prefixes: iface::CONFIG_PREFIXES,
        }]
    }

    fn iface_open(&self, worker: &Worker, params: &IfaceParams) -> UcsResult<Box<dyn Iface>> {
        if params.tl_name != NAME || params.dev_name != DEVICE {
            return Err(Status::NoDevice);
        }
        Ok(Box::new(CmaIface::open(worker, params)?))
    }

    unsafe fn mem_reg(&self, addr: *mut u8, len: usize, _access: MemAccess) -> UcsResult<MemH> {
        if (addr as usize).checked_add(len).is_none() {
            return Err(Status::InvalidParam);
        }
        // A registration is only its bounds (for the remote key): nothing to allocate or pin.
        Ok(MemH::bounds(NAME, addr, len))
    }

    fn mkey_pack(&self, memh: &MemH) -> UcsResult<PackedKey> {
        let (base, len) = memh.bounds_of(NAME).ok_or(Status::InvalidParam)?;
        let mut out = PackedKey::new();
        out.push(&RKEY_MAGIC.to_le_bytes())?;
        out.push(&self.pid.to_le_bytes())?;
        out.push(&(base as u64).to_le_bytes())?;
        out.push(&(len as u64).to_le_bytes())?;
        Ok(out)
    }
}
