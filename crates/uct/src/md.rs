//! Components and memory domains (`uct_component_h`, `uct_md_h`), and resource discovery.
//!
//! Transport crates register their components with [`register_component`]; `uct` itself names
//! no transport. Discovery walks the registered components, opens their memory domains and
//! lists each domain's transports and devices; resources are opened by `tl/dev` names such as
//! `self/memory0` or `posix/memory`.

use std::fmt;
use std::rc::Rc;
use std::sync::Mutex;

use ucs::{Status, UcsResult};

use crate::attr::{MdAttr, MemAccess, TlResource};
use crate::iface::{Iface, IfaceParams};
use crate::mem::{MemH, PackedKey, RemoteKey};
use crate::worker::Worker;

/// A family of memory domains and transports (`uct_component_t`). Components are stateless
/// singletons registered once per process.
pub trait Component: Send + Sync {
    /// Component name, e.g. `self`, `posix`.
    fn name(&self) -> &'static str;

    /// Names of the memory domains this component can open on this machine.
    fn md_names(&self) -> Vec<String>;

    /// Opens a memory domain.
    fn md_open(&self, md_name: &str) -> UcsResult<Rc<dyn Md>>;

    /// Unpacks a remote key packed by a peer's [`Md::mkey_pack`]. The bytes come from another
    /// process: every field is validated, and malformed input is an error, never a panic.
    fn rkey_unpack(&self, packed: &[u8]) -> UcsResult<RemoteKey>;

    /// Why the component offers no memory domain here, if it does not (e.g. a kernel setting).
    fn unavailable_reason(&self) -> Option<String> {
        None
    }

    /// Opens the component's connection manager (`uct_cm_open`), if it has one: how clients
    /// reach servers by socket address ([`crate::cm`]).
    fn cm_open(&self) -> Option<UcsResult<Box<dyn crate::cm::Cm>>> {
        None
    }
}

/// A memory domain: registers and allocates memory for its transports, and opens their
/// interfaces.
pub trait Md {
    /// The memory domain's name.
    fn name(&self) -> &str;

    /// The component it belongs to.
    fn component(&self) -> &'static dyn Component;

    /// Capabilities.
    fn attr(&self) -> &MdAttr;

    /// Transports and devices usable through this memory domain.
    fn tl_resources(&self) -> Vec<TlResource>;

    /// Opens an interface for `params.tl_name` on `params.dev_name`.
    fn iface_open(&self, worker: &Worker, params: &IfaceParams) -> UcsResult<Box<dyn Iface>>;

    /// Registers `[addr, addr + len)`; the registration ends when the last [`MemH`] clone drops.
    ///
    /// # Safety
    /// The memory must stay valid (mapped, not freed) while registered. While registered it
    /// may be read and written by remote operations at any time: do not hold Rust references
    /// to it across progress calls or while peers may access it.
    unsafe fn mem_reg(&self, addr: *mut u8, len: usize, access: MemAccess) -> UcsResult<MemH> {
        let _ = (addr, len, access);
        Err(Status::Unsupported)
    }

    /// Allocates `len` bytes of memory suited to the domain (e.g. shared), registered; freed when
    /// the last [`MemH`] clone drops.
    fn mem_alloc(&self, len: usize, access: MemAccess, name: &str) -> UcsResult<MemH> {
        let _ = (len, access, name);
        Err(Status::Unsupported)
    }

    /// Packs a remote key for `memh`, to be sent to peers out of band.
    fn mkey_pack(&self, memh: &MemH) -> UcsResult<PackedKey> {
        let _ = memh;
        Err(Status::Unsupported)
    }
}

static REGISTRY: Mutex<Vec<&'static dyn Component>> = Mutex::new(Vec::new());

fn registry() -> std::sync::MutexGuard<'static, Vec<&'static dyn Component>> {
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

/// Registers a component (idempotent by name). Transport crates call this from their
/// `register()` function.
pub fn register_component(c: &'static dyn Component) {
    let mut r = registry();
    if !r.iter().any(|x| x.name() == c.name()) {
        r.push(c);
    }
}

/// Every registered component, in registration order.
pub fn components() -> Vec<&'static dyn Component> {
    registry().clone()
}

/// The registered component called `name`.
pub fn component(name: &str) -> UcsResult<&'static dyn Component> {
    registry().iter().copied().find(|c| c.name() == name).ok_or(Status::NoDevice)
}

/// One usable transport on one device, with the memory domain that offers it.
#[derive(Clone)]
pub struct ResourceDesc {
    /// Component name.
    pub component: &'static str,
    /// Memory domain name.
    pub md_name: String,
    /// Transport and device.
    pub tl: TlResource,
}

impl fmt::Debug for ResourceDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} (component {}, md {})", self.tl.tl_name, self.tl.dev_name, self.component, self.md_name)
    }
}

/// Lists every transport resource of every registered component. Components that cannot open
/// a memory domain here are skipped (see [`unavailable_components`]).
pub fn query_resources() -> Vec<ResourceDesc> {
    let mut out = Vec::new();
    for c in components() {
        for md_name in c.md_names() {
            match c.md_open(&md_name) {
                Ok(md) => out.extend(md.tl_resources().into_iter().map(|tl| ResourceDesc {
                    component: c.name(),
                    md_name: md_name.clone(),
                    tl,
                })),
                Err(e) => tracing::debug!(component = c.name(), md = %md_name, "memory domain unavailable: {e}"),
            }
        }
    }
    out
}

/// Registered components that are not usable here, with the reason.
pub fn unavailable_components() -> Vec<(&'static str, String)> {
    components().into_iter().filter_map(|c| c.unavailable_reason().map(|r| (c.name(), r))).collect()
}

/// Finds a resource by `tl/dev` (e.g. `self/memory0`) or by transport name alone (first
/// device), and opens its memory domain. `NoDevice` when no registered resource matches.
pub fn find_resource(name: &str) -> UcsResult<(Rc<dyn Md>, TlResource)> {
    let (tl, dev) = match name.split_once('/') {
        Some((t, d)) => (t, Some(d)),
        None => (name, None),
    };
    for c in components() {
        for md_name in c.md_names() {
            let Ok(md) = c.md_open(&md_name) else { continue };
            let found = md.tl_resources().into_iter().find(|r| r.tl_name == tl && dev.is_none_or(|d| r.dev_name == d));
            if let Some(r) = found {
                return Ok((md, r));
            }
        }
    }
    Err(Status::NoDevice)
}

/// Opens an interface on the resource named `name` (see [`find_resource`]); `params` supplies
/// everything but the transport and device names.
pub fn iface_open_by_name(
    worker: &Worker,
    name: &str,
    mut params: IfaceParams,
) -> UcsResult<(Rc<dyn Md>, Box<dyn Iface>)> {
    let (md, r) = find_resource(name)?;
    params.tl_name = r.tl_name;
    params.dev_name = r.dev_name;
    let iface = md.iface_open(worker, &params)?;
    Ok((md, iface))
}
