//! Checks the checked-in bindings against the installed C headers: the system C compiler
//! prints `sizeof`, `_Alignof` and `offsetof` for every struct and field the data path touches,
//! and each must equal what Rust computes for the bindings. Skipped (with a message) where
//! `<infiniband/verbs.h>` is not installed; CI installs libibverbs-dev so it runs there.

use std::mem::{align_of, offset_of, size_of};
use std::path::Path;
use std::process::Command;

use rdma_core_sys::*;

/// `(C expression, value Rust computes)`.
type Check = (String, usize);

/// `layout!(checks; "struct" ty { field, a.b.c, rust.path => "c.path", ... })`
macro_rules! layout {
    ($out:ident; $( $kind:literal $ty:ident { $( $($f:ident).+ $(=> $c:literal)? ),* $(,)? } )*) => {
        $(
            $out.push((format!("sizeof({} {})", $kind, stringify!($ty)), size_of::<$ty>()));
            $out.push((format!("_Alignof({} {})", $kind, stringify!($ty)), align_of::<$ty>()));
            $(
                let c_path = layout!(@cpath $($f).+ $(=> $c)?);
                $out.push((format!("offsetof({} {}, {})", $kind, stringify!($ty), c_path), offset_of!($ty, $($f).+)));
            )*
        )*
    };
    (@cpath $($f:ident).+ => $c:literal) => { $c.to_string() };
    (@cpath $($f:ident).+) => { stringify!($($f).+).replace(' ', "") };
}

fn checks() -> Vec<Check> {
    let mut v = Vec::new();
    layout!(v;
        "struct" ibv_device { node_type, transport_type, name, dev_name, dev_path, ibdev_path }
        "struct" ibv_context_ops { poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv }
        "struct" ibv_context { device, ops, cmd_fd, async_fd, num_comp_vectors, mutex, abi_compat }
        "struct" verbs_context {
            query_port, create_cq_ex, create_srq_ex, query_device_ex, post_srq_ops, sz, context
        }
        "struct" ibv_device_attr {
            fw_ver, node_guid, max_mr_size, page_size_cap, max_qp, max_qp_wr, device_cap_flags,
            max_sge, max_cq, max_cqe, max_mr, max_pd, max_qp_rd_atom, max_qp_init_rd_atom,
            atomic_cap, max_srq, max_srq_wr, max_srq_sge, phys_port_cnt
        }
        "struct" ibv_tm_caps { max_rndv_hdr_size, max_num_tags, flags, max_ops, max_sge }
        "struct" ibv_device_attr_ex {
            orig_attr, comp_mask, odp_caps, completion_timestamp_mask, hca_core_clock,
            device_cap_flags_ex, tm_caps, max_dm_size
        }
        "struct" ibv_port_attr {
            state, max_mtu, active_mtu, gid_tbl_len, port_cap_flags, max_msg_sz, lid, sm_lid,
            lmc, max_vl_num, active_width, active_speed, phys_state, link_layer, flags,
            port_cap_flags2
        }
        "union" ibv_gid { raw, global.subnet_prefix, global.interface_id }
        "struct" ibv_gid_entry { gid, gid_index, port_num, gid_type, ndev_ifindex }
        "struct" ibv_pd { context, handle }
        "struct" ibv_mr { context, pd, addr, length, handle, lkey, rkey }
        "struct" ibv_comp_channel { context, fd, refcnt }
        "struct" ibv_cq { context, channel, cq_context, handle, cqe, comp_events_completed }
        "struct" ibv_cq_init_attr_ex {
            cqe, cq_context, channel, comp_vector, wc_flags, comp_mask, flags, parent_domain
        }
        "struct" ibv_srq_attr { max_wr, max_sge, srq_limit }
        "struct" ibv_srq { context, srq_context, pd, handle, events_completed }
        "struct" ibv_srq_init_attr { srq_context, attr }
        "struct" ibv_srq_init_attr_ex { srq_context, attr, comp_mask, srq_type, pd, xrcd, cq, tm_cap }
        "struct" ibv_qp_cap { max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data }
        "struct" ibv_qp { context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type }
        "struct" ibv_qp_init_attr { qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all }
        "struct" ibv_global_route { dgid, flow_label, sgid_index, hop_limit, traffic_class }
        "struct" ibv_ah_attr { grh, dlid, sl, src_path_bits, static_rate, is_global, port_num }
        "struct" ibv_qp_attr {
            qp_state, cur_qp_state, path_mtu, qkey, rq_psn, sq_psn, dest_qp_num, qp_access_flags,
            cap, ah_attr, pkey_index, max_rd_atomic, max_dest_rd_atomic, min_rnr_timer, port_num,
            timeout, retry_cnt, rnr_retry
        }
        "struct" ibv_ah { context, pd, handle }
        "struct" ibv_sge { addr, length, lkey }
        "struct" ibv_send_wr {
            wr_id, next, sg_list, num_sge, opcode, send_flags,
            __bindgen_anon_1.imm_data => "imm_data",
            wr.rdma.remote_addr, wr.rdma.rkey,
            wr.atomic.remote_addr, wr.atomic.compare_add, wr.atomic.swap, wr.atomic.rkey,
            wr.ud.ah, wr.ud.remote_qpn, wr.ud.remote_qkey
        }
        "struct" ibv_recv_wr { wr_id, next, sg_list, num_sge }
        "struct" ibv_wc {
            wr_id, status, opcode, vendor_err, byte_len, __bindgen_anon_1.imm_data => "imm_data",
            qp_num, src_qp, wc_flags, pkey_index, slid, sl, dlid_path_bits
        }
        "struct" ibv_ops_wr {
            wr_id, next, opcode, flags, tm.unexpected_cnt, tm.handle, tm.add.recv_wr_id,
            tm.add.sg_list, tm.add.num_sge, tm.add.tag, tm.add.mask
        }
        "struct" ibv_async_event { element, event_type }
    );
    // Constants defined by macros that bindgen cannot evaluate, written by hand in the crate.
    v.push(("IBV_ACCESS_OPTIONAL_RANGE".into(), IBV_ACCESS_OPTIONAL_RANGE as usize));
    v.push(("(uintptr_t)__VERBS_ABI_IS_EXTENDED".into(), __VERBS_ABI_IS_EXTENDED as usize));
    v
}

#[test]
fn bindings_match_the_installed_headers() {
    if !Path::new("/usr/include/infiniband/verbs.h").exists() {
        eprintln!("<infiniband/verbs.h> is not installed (libibverbs-dev); layout check skipped");
        return;
    }
    let checks = checks();
    let dir = std::env::temp_dir().join(format!("rdma-core-sys-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut c =
        String::from("#include <stdio.h>\n#include <stddef.h>\n#include <infiniband/verbs.h>\nint main(void) {\n");
    for (expr, _) in &checks {
        c.push_str(&format!("  printf(\"%zu\\n\", (size_t)({expr}));\n"));
    }
    c.push_str("  return 0;\n}\n");
    let src = dir.join("layout.c");
    let exe = dir.join("layout");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc).arg("-o").arg(&exe).arg(&src).output().expect("running the C compiler");
    assert!(out.status.success(), "C compile failed:\n{}", String::from_utf8_lossy(&out.stderr));
    let run = Command::new(&exe).output().unwrap();
    assert!(run.status.success());
    let values: Vec<usize> = String::from_utf8(run.stdout).unwrap().lines().map(|l| l.parse().unwrap()).collect();
    assert_eq!(values.len(), checks.len());
    let wrong: Vec<String> = checks
        .iter()
        .zip(&values)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C {c}, Rust {rust}"))
        .collect();
    std::fs::remove_dir_all(&dir).ok();
    assert!(wrong.is_empty(), "layouts differ from the headers:\n{}", wrong.join("\n"));
    eprintln!("{} layout facts match the installed headers", checks.len());
}

#[test]
fn srq_init_attr_is_a_prefix_of_the_extended_one() {
    // ibv_create_srq_ex relies on it, as the C inline does.
    assert_eq!(offset_of!(ibv_srq_init_attr, srq_context), offset_of!(ibv_srq_init_attr_ex, srq_context));
    assert_eq!(offset_of!(ibv_srq_init_attr, attr), offset_of!(ibv_srq_init_attr_ex, attr));
}
