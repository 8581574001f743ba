//! The `posix` and `sysv` components and memory domains.
//!
//! Both allocate shareable memory as a [`Segment`]; a packed key carries the segment id and the
//! owner's address of its start. Unpacking attaches the segment (after checking its real
//! size), and the key keeps that mapping alive; every access is bounded by the mapping.

use std::rc::Rc;

use ucs::{Status, UcsResult};
use uct::{
    Component, DeviceType, Iface, IfaceParams, LinearFunc, Md, MdAttr, MdFlags, MemAccess, MemH, MemRegion, PackedKey,
    RemoteKey, TlResource, Worker,
};

use super::segment::{SegId, SegKind, Segment};

/// The device of the memory-mapped transports.
pub const DEVICE: &str = "memory";

const RKEY_MAGIC: u32 = u32::from_le_bytes(*b"MMRK");
const RKEY_LEN: usize = 4 + SegId::PACKED_LEN + 8;

/// A memory-mapped component (`posix` or `sysv`).
pub struct MmComponent {
    /// Component, memory domain and transport name.
    pub name: &'static str,
    /// Segment kind.
    pub kind: SegKind,
    /// Every configuration prefix, most specific first (`POSIX_` or `SYSV_`, then `MM_`).
    pub prefixes: &'static [&'static str],
}

/// The `posix` component.
pub static POSIX: MmComponent = MmComponent { name: "posix", kind: SegKind::Posix, prefixes: &["POSIX_", "MM_"] };
/// The `sysv` component.
pub static SYSV: MmComponent = MmComponent { name: "sysv", kind: SegKind::Sysv, prefixes: &["SYSV_", "MM_"] };

impl Component for MmComponent {
    fn name(&self) -> &'static str {
        self.name
    }

    fn md_names(&self) -> Vec<String> {
        vec![self.name.to_string()]
    }

    fn md_open(&self, md_name: &str) -> UcsResult<Rc<dyn Md>> {
        if md_name != self.name {
            return Err(Status::NoDevice);
        }
        let comp: &'static MmComponent = if self.kind == SegKind::Posix { &POSIX } else { &SYSV };
        Ok(Rc::new(MmMd {
            comp,
            attr: MdAttr {
                flags: MdFlags::ALLOC | MdFlags::NEED_RKEY,
                max_alloc: isize::MAX as usize,
                max_reg: 0,
                rkey_packed_size: RKEY_LEN,
                reg_cost: LinearFunc { c: 0.0, m: 0.0 },
            },
        }))
    }

    fn rkey_unpack(&self, packed: &[u8]) -> UcsResult<RemoteKey> {
        if packed.len() != RKEY_LEN || packed[..4] != RKEY_MAGIC.to_le_bytes() {
            tracing::debug!(component = self.name, len = packed.len(), "malformed remote key");
            return Err(Status::InvalidParam);
        }
        let id = SegId::unpack(&packed[4..4 + SegId::PACKED_LEN]).map_err(|_| Status::InvalidParam)?;
        if id.kind != self.kind {
            return Err(Status::InvalidParam);
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&packed[4 + SegId::PACKED_LEN..]);
        let base = u64::from_le_bytes(b);
        if base.checked_add(id.len).is_none() {
            return Err(Status::InvalidParam);
        }
        let seg = Segment::attach(id)?;
        let (map, len) = (seg.base(), seg.len());
        let key = RemoteKey::new(self.name, 0, base, id.len, Some(Box::new(Rc::new(seg))));
        // SAFETY: the key's handle owns the segment, which keeps `len` bytes at `map` mapped.
        Ok(unsafe { key.with_local_mapping(map, len) })
    }
}

/// Memory allocated by a memory-mapped domain: a segment peers can attach.
pub(crate) struct MmRegion {
    seg: Segment,
}

impl MemRegion for MmRegion {
    fn address(&self) -> *mut u8 {
        self.seg.base().as_ptr()
    }
    fn length(&self) -> usize {
        self.seg.len()
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// A `posix` or `sysv` memory domain.
pub struct MmMd {
    comp: &'static MmComponent,
    attr: MdAttr,
}

impl Md for MmMd {
    fn name(&self) -> &str {
        self.comp.name
    }

    fn component(&self) -> &'static dyn Component {
        self.comp
    }

    fn attr(&self) -> &MdAttr {
        &self.attr
    }

    fn tl_resources(&self) -> Vec<TlResource> {
        vec![TlResource {
            tl_name: self.comp.name.into(),
            dev_name: DEVICE.into(),
            dev_type: DeviceType::Shm,
            config_prefixes: self.comp.prefixes,
        }]
    }

    fn iface_open(&self, worker: &Worker, params: &IfaceParams) -> UcsResult<Box<dyn Iface>> {
        if params.tl_name != self.comp.name || params.dev_name != DEVICE {
            return Err(Status::NoDevice);
        }
        Ok(Box::new(super::iface::MmIface::open(self.comp, worker, params)?))
    }

    fn mem_alloc(&self, len: usize, _access: MemAccess, _name: &str) -> UcsResult<MemH> {
        Ok(MemH::new(MmRegion { seg: Segment::create(self.comp.kind, len)? }))
    }

    fn mkey_pack(&self, memh: &MemH) -> UcsResult<PackedKey> {
        let r = memh.downcast_ref::<MmRegion>().ok_or(Status::InvalidParam)?;
        let mut out = PackedKey::new();
        out.push(&RKEY_MAGIC.to_le_bytes())?;
        out.push(&r.seg.id().to_bytes())?;
        out.push(&(r.seg.base().as_ptr() as u64).to_le_bytes())?;
        Ok(out)
    }
}
