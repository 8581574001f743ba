//! Opens every RDMA device through the run-time loaded verbs and exercises the inline
//! functions: query device (extended) and port (with the macro's semantics), GIDs, a protection
//! domain, a memory registration, a CQ polled empty and armed, an SRQ through the extended call.
//!
//! Outside the VM of `tools/rdma-vm/run` there is no device: the test says why and passes, unless
//! `UCX_RS_REQUIRE_RDMA=1` (set by the VM test runner), where finding no device is a failure.

use std::ptr;

use rdma_core_sys::*;

fn require_rdma() -> bool {
    std::env::var("UCX_RS_REQUIRE_RDMA").is_ok_and(|v| v == "1")
}

#[test]
fn open_query_and_allocate_on_every_device() {
    let list = match DeviceList::get() {
        Ok(l) => l,
        Err(why) => {
            assert!(!require_rdma(), "UCX_RS_REQUIRE_RDMA=1 but no RDMA device: {why}");
            eprintln!("no RDMA devices here ({why}); run it in tools/rdma-vm/run");
            return;
        }
    };
    let lib = list.lib();
    assert!(!list.is_empty());
    for i in 0..list.len() {
        let name = list.name(i).unwrap();
        let dev = list.device(i).unwrap();
        // SAFETY: every call below gets live objects created in this block, destroyed in
        // reverse order, and out-pointers to locals.
        unsafe {
            let ctx = lib.ibv_open_device(dev);
            assert!(!ctx.is_null(), "{name}: ibv_open_device failed");

            let mut attr: ibv_device_attr_ex = std::mem::zeroed();
            assert_eq!(ibv_query_device_ex(lib, ctx, ptr::null(), &mut attr), 0, "{name}: query_device_ex");
            let ports = attr.orig_attr.phys_port_cnt;
            assert!(ports >= 1, "{name}: no ports");
            assert!(attr.orig_attr.max_qp > 0 && attr.orig_attr.max_cqe > 0);

            let mut port: ibv_port_attr = std::mem::zeroed();
            assert_eq!(ibv_query_port(lib, ctx, 1, &mut port), 0, "{name}: query_port");
            assert_eq!(port.state, IBV_PORT_ACTIVE, "{name}: port 1 not active");
            assert!(port.active_mtu >= IBV_MTU_256 && port.active_mtu <= IBV_MTU_4096);
            assert!(port.gid_tbl_len > 0);
            if name.starts_with("rxe") {
                assert_eq!(port.link_layer as u32, IBV_LINK_LAYER_ETHERNET, "Soft-RoCE is Ethernet");
            }

            let mut gid: ibv_gid_entry = std::mem::zeroed();
            assert_eq!(ibv_query_gid_ex(lib, ctx, 1, 0, &mut gid, 0), 0, "{name}: gid 0");
            assert_eq!(gid.gid_index, 0);

            let pd = lib.ibv_alloc_pd(ctx);
            assert!(!pd.is_null(), "{name}: alloc_pd");
            let mut buf = vec![0u8; 65536];
            let access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
            let mr = ibv_reg_mr(lib, pd, buf.as_mut_ptr().cast(), buf.len(), access);
            assert!(!mr.is_null(), "{name}: reg_mr: {}", std::io::Error::last_os_error());
            assert_eq!((*mr).addr, buf.as_mut_ptr().cast());
            assert_eq!((*mr).length, buf.len());

            let chan = lib.ibv_create_comp_channel(ctx);
            assert!(!chan.is_null());
            let cq = lib.ibv_create_cq(ctx, 64, ptr::null_mut(), chan, 0);
            assert!(!cq.is_null(), "{name}: create_cq");
            let mut wc: [ibv_wc; 4] = std::mem::zeroed();
            assert_eq!(ibv_poll_cq(cq, 4, wc.as_mut_ptr()), 0, "empty CQ polls nothing");
            assert_eq!(ibv_req_notify_cq(cq, 0), 0, "arm CQ");

            let mut srq_attr: ibv_srq_init_attr_ex = std::mem::zeroed();
            srq_attr.attr.max_wr = 16;
            srq_attr.attr.max_sge = 1;
            srq_attr.comp_mask = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
            srq_attr.srq_type = IBV_SRQT_BASIC;
            srq_attr.pd = pd;
            let srq = ibv_create_srq_ex(lib, ctx, &mut srq_attr);
            assert!(!srq.is_null(), "{name}: create_srq_ex (basic)");
            let mut sge = ibv_sge { addr: buf.as_ptr() as u64, length: 256, lkey: (*mr).lkey };
            let mut wr = ibv_recv_wr { wr_id: 7, next: ptr::null_mut(), sg_list: &mut sge, num_sge: 1 };
            let mut bad = ptr::null_mut();
            assert_eq!(ibv_post_srq_recv(srq, &mut wr, &mut bad), 0, "post_srq_recv");

            // Tag matching is absent on Soft-RoCE: post_srq_ops reports it.
            if attr.tm_caps.max_num_tags == 0 {
                let mut op: ibv_ops_wr = std::mem::zeroed();
                let mut bad_op = ptr::null_mut();
                // (libibverbs' stub for providers without it returns the error and leaves
                // bad_op as it was; only the inline's own fallback sets it.)
                assert_ne!(ibv_post_srq_ops(srq, &mut op, &mut bad_op), 0);
            }

            assert_eq!(lib.ibv_destroy_srq(srq), 0);
            assert_eq!(lib.ibv_destroy_cq(cq), 0);
            assert_eq!(lib.ibv_destroy_comp_channel(chan), 0);
            assert_eq!(lib.ibv_dereg_mr(mr), 0);
            assert_eq!(lib.ibv_dealloc_pd(pd), 0);
            assert_eq!(lib.ibv_close_device(ctx), 0);
            eprintln!("{name}: {ports} port(s), mtu enum {}, {} GIDs", port.active_mtu, port.gid_tbl_len);
        }
    }
}
