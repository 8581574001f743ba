//! The `ib` memory domain on a real device: registrations through the registration cache
//! (hits, and invalidation when the memory is unmapped, so a stale registration is never
//! handed out), registered allocations, and remote keys. Needs an RDMA device (run with
//! `tools/rdma-vm/test`); without one it says so and passes, unless `UCX_RS_REQUIRE_RDMA=1`.

use uct::{Md, MemAccess};
use uct_ib::IbMd;

fn md() -> Option<std::rc::Rc<IbMd>> {
    if !uct_ib::testing::rdma_available() {
        return None;
    }
    let names = uct_ib::device::device_names().expect("device names");
    Some(IbMd::open(&names[0]).expect("open the ib memory domain"))
}

#[test]
fn registrations_are_cached_and_invalidated_on_unmap() {
    let Some(md) = md() else { return };
    assert!(md.rcache().is_caching(), "rcache off: {:?}", md.rcache().disabled_reason());

    let mut buf = vec![7u8; 1 << 20];
    let ptr = buf.as_mut_ptr();
    // SAFETY: the buffer outlives the handles (dropped before it).
    let (a, b) = unsafe {
        (md.mem_reg(ptr, 4096, MemAccess::ALL).unwrap(), md.mem_reg(ptr.add(100), 50, MemAccess::ALL).unwrap())
    };
    let s = md.rcache().stats();
    assert_eq!((s.misses, s.hits), (1, 1), "the second registration is served by the first region");
    let ra = a.downcast_ref::<uct_ib::IbRegion>().unwrap();
    let rb = b.downcast_ref::<uct_ib::IbRegion>().unwrap();
    assert_eq!(ra.rkey(), rb.rkey(), "one registration serves both");
    drop((a, b));

    // A large Vec is its own mapping; glibc's free unmaps it, which the memory hooks report.
    let regs_before = md.rcache().stats().regs;
    drop(buf);
    let mut again = vec![9u8; 1 << 20];
    // SAFETY: `again` outlives the handle.
    let c = unsafe { md.mem_reg(again.as_mut_ptr(), 4096, MemAccess::ALL).unwrap() };
    let s = md.rcache().stats();
    assert!(s.unmap_events >= 1 && s.invalidations >= 1, "the unmap must invalidate the cached region: {s:?}");
    assert_eq!(s.regs, regs_before + 1, "the new buffer is registered afresh, never served stale: {s:?}");
    drop(c);
    drop(again);
}

#[test]
fn allocations_and_remote_keys() {
    let Some(md) = md() else { return };
    let memh = md.mem_alloc(1 << 16, MemAccess::ALL, "test").unwrap();
    assert_eq!(memh.length(), 1 << 16);
    let packed = md.mkey_pack(&memh).unwrap();
    let key = md.component().rkey_unpack(&packed).unwrap();
    assert_eq!((key.base(), key.length()), (memh.address() as u64, 1 << 16));
    assert_eq!(key.rkey() as u32, memh.downcast_ref::<uct_ib::IbRegion>().unwrap().rkey());
    assert!(md.component().rkey_unpack(&packed[..packed.len() - 1]).is_err());
}
