//! The driver's half of `ucp_mem_map`: registering a region (the caller's, or one it
//! allocates where every peer transport can reach it) with every memory domain that remote
//! memory access and zero-copy protocols use; finding the registration a zero-copy operation
//! needs; packing the region's remote key.

use std::ptr::NonNull;

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::Core;
use crate::dt::Seg;
use crate::mem::MemHandle;
use crate::wire::rkey::{PackedRkey, RkeyEntry};

/// Memory `mem_map` allocated when no memory domain could: page-aligned, zeroed, freed with
/// the registration.
pub(crate) struct HeapRegion {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

impl HeapRegion {
    fn new(len: usize) -> UcsResult<HeapRegion> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).map_err(|_| Status::InvalidParam)?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).ok_or(Status::NoMemory)?;
        Ok(HeapRegion { ptr, layout })
    }
}

impl Drop for HeapRegion {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// Who owns the memory of a mapped region.
pub(crate) enum Backing {
    /// The caller.
    User,
    /// The allocation of the memory domain named (e.g. a shared segment), freed with the last
    /// handle.
    Md(uct::MemH, String),
    /// The worker's heap allocation.
    Heap(HeapRegion),
}

/// A registration made by `Worker::mem_map`: one handle per interface that needs one.
pub(crate) struct MemMap {
    pub addr: usize,
    pub len: usize,
    pub regs: Vec<Option<uct::MemH>>,
    /// Dropped after `regs` (field order): registrations go before the memory.
    pub _backing: Backing,
}

impl Core {
    /// Whether interface `i`'s memory domain takes registrations that some operation of this
    /// worker uses: remote memory access and atomics (a peer's puts, gets and atomics land
    /// in it), or zero-copy protocols.
    fn registers(&self, i: usize) -> bool {
        use uct::IfaceFlags as F;
        let wi = &self.ifaces[i];
        let used = F::GET_ZCOPY
            | F::PUT_ZCOPY
            | F::AM_ZCOPY
            | F::PUT_SHORT
            | F::PUT_BCOPY
            | F::GET_SHORT
            | F::GET_BCOPY
            | F::ATOMIC_CPU
            | F::ATOMIC_DEVICE;
        wi.attr.flags.intersects(used) && wi.md.attr().flags.contains(uct::MdFlags::REG)
    }

    /// Registers `[addr, addr + len)` with every interface's memory domain that needs it.
    ///
    /// # Safety
    /// The region must stay mapped until [`Core::mem_unmap`].
    pub unsafe fn mem_map(&self, addr: *mut u8, len: usize) -> UcsResult<MemHandle> {
        if addr.is_null() || (addr as usize).checked_add(len).is_none() {
            tracing::error!("ucp mem_map: invalid region {addr:p}+{len}");
            return Err(Status::InvalidParam);
        }
        // SAFETY: forwarded from the caller.
        unsafe { self.register(addr, len, Backing::User) }
    }

    /// Allocates `len` bytes that every peer transport of this worker can reach
    /// (`UCP_MEM_MAP_ALLOCATE`) and registers them: a shared segment of the first memory domain
    /// that allocates one (sysv, then posix, as UCX's default allocator order), else the heap.
    pub fn mem_map_alloc(&self, len: usize) -> UcsResult<MemHandle> {
        if len == 0 {
            tracing::error!("ucp mem_map: cannot allocate 0 bytes");
            return Err(Status::InvalidParam);
        }
        let order = ["sysv", "posix"];
        let alloc = order.iter().find_map(|name| {
            let wi = self.ifaces.iter().find(|w| w.md.name() == *name)?;
            if !wi.md.attr().flags.contains(uct::MdFlags::ALLOC) {
                return None;
            }
            wi.md
                .mem_alloc(len, uct::MemAccess::all(), "ucp mem_map")
                .inspect_err(|e| tracing::debug!("mem_map: {name} cannot allocate {len} bytes: {e}"))
                .ok()
                .map(|h| (h, name.to_string()))
        });
        let backing = match alloc {
            Some((h, md)) => Backing::Md(h, md),
            None => Backing::Heap(HeapRegion::new(len)?),
        };
        let addr = match &backing {
            Backing::Md(h, _) => h.address(),
            Backing::Heap(r) => r.ptr.as_ptr(),
            Backing::User => return Err(Status::InvalidParam),
        };
        // SAFETY: the memory is the registration's own (`backing`), freed after the handles.
        unsafe { self.register(addr, len, backing) }
    }

    /// # Safety
    /// `[addr, addr + len)` stays mapped while the registration lives.
    unsafe fn register(&self, addr: *mut u8, len: usize, backing: Backing) -> UcsResult<MemHandle> {
        let mut regs = Vec::with_capacity(self.ifaces.len());
        for (i, wi) in self.ifaces.iter().enumerate() {
            if let Backing::Md(h, md) = &backing {
                // The allocating domain's handle serves its own interfaces.
                if wi.md.name() == md {
                    regs.push(Some(h.clone()));
                    continue;
                }
            }
            if !self.registers(i) {
                regs.push(None);
                continue;
            }
            // SAFETY: the caller keeps the region mapped until unmap, which drops the handles.
            regs.push(Some(unsafe { wi.md.mem_reg(addr, len, uct::MemAccess::all())? }));
        }
        let id = self.mems.borrow_mut().insert(MemMap { addr: addr as usize, len, regs, _backing: backing });
        Ok(MemHandle { id, worker: self.address.uuid, address: addr as usize, length: len })
    }

    /// The live registration `h` names; `InvalidParam` (logged) for an unmapped handle or one
    /// of another worker.
    fn mem_check(&self, h: &MemHandle, what: &str) -> UcsResult<()> {
        let ok = h.worker == self.address.uuid
            && self.mems.borrow().get(h.id).is_some_and(|m| m.addr == h.address && m.len == h.length);
        if ok {
            return Ok(());
        }
        tracing::error!(
            "ucp {what}: memory handle {:#x}+{} is not mapped on this worker (unmapped, or another worker's)",
            h.address,
            h.length
        );
        Err(Status::InvalidParam)
    }

    /// Address and length of a mapped region (`ucp_mem_query`).
    pub fn mem_query(&self, h: &MemHandle) -> UcsResult<(usize, usize)> {
        self.mem_check(h, "mem_query")?;
        Ok((h.address, h.length))
    }

    /// Releases a registration.
    pub fn mem_unmap(&self, h: MemHandle) -> UcsResult<()> {
        self.mem_check(&h, "mem_unmap")?;
        let gone = self.mems.borrow_mut().remove(h.id);
        drop(gone);
        Ok(())
    }

    /// The remote key of a mapped region (`ucp_rkey_pack`): one transport key per memory
    /// domain that registered it.
    pub fn rkey_pack(&self, h: &MemHandle) -> UcsResult<Vec<u8>> {
        self.mem_check(h, "rkey_pack")?;
        let mems = self.mems.borrow();
        let m = mems.get(h.id).ok_or(Status::InvalidParam)?;
        let mut keys: Vec<(&'static str, &str, uct::PackedKey)> = Vec::new();
        for (wi, reg) in self.ifaces.iter().zip(&m.regs) {
            let Some(reg) = reg else { continue };
            if keys.iter().any(|(_, md, _)| *md == wi.md.name()) {
                continue;
            }
            match wi.md.mkey_pack(reg) {
                Ok(k) => keys.push((wi.md.component().name(), wi.md.name(), k)),
                Err(e) => tracing::debug!("rkey_pack: {} packs no key for this region: {e}", wi.md.name()),
            }
        }
        let entries = keys.iter().map(|(c, md, k)| RkeyEntry { component: c, md, key: k.as_slice() }).collect();
        let packed = PackedRkey { uuid: self.address.uuid, address: m.addr as u64, length: m.len as u64, entries };
        packed.encode().map_err(|e| {
            tracing::error!("rkey_pack: {e}");
            Status::from(e)
        })
    }

    /// A registration covering `seg` on interface `iface`: from the hint when it covers the
    /// range, else a fresh one.
    pub(crate) fn memh_for(&self, hint: Option<Id>, iface: usize, seg: Seg) -> UcsResult<uct::MemH> {
        if let Some(h) = hint {
            let mems = self.mems.borrow();
            if let Some(m) = mems.get(h) {
                let (a, e) = (seg.ptr as usize, (seg.ptr as usize).saturating_add(seg.len));
                if a >= m.addr && e <= m.addr + m.len {
                    if let Some(Some(r)) = m.regs.get(iface) {
                        return Ok(r.clone());
                    }
                }
            }
        }
        let md = &self.ifaces[iface].md;
        // SAFETY: the segment belongs to an operation in flight, whose user buffer stays valid
        // until it completes (the contract of its `UserBuf`); the handle is dropped with the
        // operation.
        unsafe { md.mem_reg(seg.ptr, seg.len, uct::MemAccess::all()) }
    }
}
