//! The driver's half of `ucp_mem_map`: registering a region with every memory domain that
//! zero-copy protocols use, and finding the registration a zero-copy operation needs.

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::Core;
use crate::dt::Seg;
use crate::mem::MemHandle;

/// A registration made by `Worker::mem_map`: one handle per interface that needs one.
pub(crate) struct MemMap {
    pub addr: usize,
    pub len: usize,
    pub regs: Vec<Option<uct::MemH>>,
}

impl Core {
    /// Registers `[addr, addr + len)` with every interface's memory domain that needs it.
    ///
    /// # Safety
    /// The region must stay mapped until [`Core::mem_unmap`].
    pub unsafe fn mem_map(&self, addr: *mut u8, len: usize) -> UcsResult<MemHandle> {
        if addr.is_null() || (addr as usize).checked_add(len).is_none() {
            tracing::error!("ucp mem_map: invalid region {addr:p}+{len}");
            return Err(Status::InvalidParam);
        }
        let mut regs = Vec::with_capacity(self.ifaces.len());
        for wi in &self.ifaces {
            let zcopy = wi
                .attr
                .flags
                .intersects(uct::IfaceFlags::GET_ZCOPY | uct::IfaceFlags::PUT_ZCOPY | uct::IfaceFlags::AM_ZCOPY);
            if !zcopy || !wi.md.attr().flags.contains(uct::MdFlags::REG) {
                regs.push(None);
                continue;
            }
            // SAFETY: the caller keeps the region mapped until unmap, which drops the handles.
            regs.push(Some(unsafe { wi.md.mem_reg(addr, len, uct::MemAccess::all())? }));
        }
        let id = self.mems.borrow_mut().insert(MemMap { addr: addr as usize, len, regs });
        Ok(MemHandle { id, address: addr as usize, length: len })
    }

    /// Releases a registration.
    pub fn mem_unmap(&self, h: MemHandle) -> UcsResult<()> {
        let gone = self.mems.borrow_mut().remove(h.id);
        match gone {
            Some(m) => {
                drop(m);
                Ok(())
            }
            None => Err(Status::InvalidParam),
        }
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
