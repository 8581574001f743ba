//! The static-inline functions and macros of `verbs.h`, which libibverbs does not export.
//!
//! The data path (`post_send`, `post_recv`, `post_srq_recv`, `poll_cq`, `req_notify_cq`) calls
//! the provider through the context's operation table; the extended verbs (`create_cq_ex`,
//! `create_srq_ex`, `query_device_ex`, `post_srq_ops`, `query_port`) go through
//! `struct verbs_context`, which sits in front of `struct ibv_context` when the provider
//! supports the extended ABI, with the same size checks as `verbs_get_ctx_op`.
//!
//! Functions that may fall back to an exported symbol take the [`IbvLib`] table.

use std::mem::{offset_of, size_of};
use std::os::raw::c_int;

use crate::bindings::*;

/// `verbs_get_ctx`: the extended context around `ctx`, if the provider uses the extended ABI.
///
/// # Safety
/// `ctx` must be a live context from `ibv_open_device`.
#[inline]
pub unsafe fn verbs_get_ctx(ctx: *mut ibv_context) -> Option<*mut verbs_context> {
    // SAFETY: ctx is live (caller); abi_compat is its first field.
    if unsafe { (*ctx).abi_compat } != __VERBS_ABI_IS_EXTENDED {
        return None;
    }
    // SAFETY: with the extended ABI the context is the last field of a verbs_context.
    Some(unsafe { ctx.cast::<u8>().sub(offset_of!(verbs_context, context)) }.cast())
}

/// `verbs_get_ctx_op`: the extended context when the provider's table is large enough to hold
/// the operation at `op_offset` (an `offset_of!(verbs_context, op)`) and sets it.
macro_rules! ctx_op {
    ($ctx:expr, $op:ident) => {{
        // SAFETY: the caller of the enclosing function guarantees a live context.
        match unsafe { verbs_get_ctx($ctx) } {
            // SAFETY: vctx points at a live verbs_context; `sz` is valid for every provider
            // with the extended ABI, and the op is read only when `sz` covers it.
            Some(vctx) if unsafe { (*vctx).sz } >= size_of::<verbs_context>() - offset_of!(verbs_context, $op) => {
                // SAFETY: as above, the table covers the field.
                unsafe { (*vctx).$op }
            }
            _ => None,
        }
    }};
}

/// `ibv_post_send`.
///
/// # Safety
/// `qp` must be live; `wr` a valid chain whose buffers stay registered until completion;
/// `bad_wr` valid for a write.
#[inline]
pub unsafe fn ibv_post_send(qp: *mut ibv_qp, wr: *mut ibv_send_wr, bad_wr: *mut *mut ibv_send_wr) -> c_int {
    // SAFETY: qp is live (caller), so its context and operation table are.
    match unsafe { (*(*qp).context).ops.post_send } {
        // SAFETY: the provider's function, called with the arguments the caller vouched for.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_recv`.
///
/// # Safety
/// `qp` must be live; `wr` a valid chain whose buffers stay valid until completion; `bad_wr`
/// valid for a write.
#[inline]
pub unsafe fn ibv_post_recv(qp: *mut ibv_qp, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    // SAFETY: qp is live (caller).
    match unsafe { (*(*qp).context).ops.post_recv } {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(qp, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_recv`.
///
/// # Safety
/// `srq` must be live; `wr` a valid chain whose buffers stay valid until completion; `bad_wr`
/// valid for a write.
#[inline]
pub unsafe fn ibv_post_srq_recv(srq: *mut ibv_srq, wr: *mut ibv_recv_wr, bad_wr: *mut *mut ibv_recv_wr) -> c_int {
    // SAFETY: srq is live (caller).
    match unsafe { (*(*srq).context).ops.post_srq_recv } {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(srq, wr, bad_wr) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_post_srq_ops` (tag-matching list operations); `EOPNOTSUPP` without support.
///
/// # Safety
/// `srq` must be live; `op` a valid chain; `bad_op` valid for a write.
#[inline]
pub unsafe fn ibv_post_srq_ops(srq: *mut ibv_srq, op: *mut ibv_ops_wr, bad_op: *mut *mut ibv_ops_wr) -> c_int {
    // SAFETY: srq is live (caller).
    let ctx = unsafe { (*srq).context };
    match ctx_op!(ctx, post_srq_ops) {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(srq, op, bad_op) },
        None => {
            // SAFETY: bad_op is valid for a write (caller).
            unsafe { *bad_op = op };
            libc::EOPNOTSUPP
        }
    }
}

/// `ibv_poll_cq`: up to `num_entries` completions into `wc`; the number polled, or negative on
/// error.
///
/// # Safety
/// `cq` must be live and `wc` valid for `num_entries` writes.
#[inline]
pub unsafe fn ibv_poll_cq(cq: *mut ibv_cq, num_entries: c_int, wc: *mut ibv_wc) -> c_int {
    // SAFETY: cq is live (caller).
    match unsafe { (*(*cq).context).ops.poll_cq } {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(cq, num_entries, wc) },
        None => -libc::EOPNOTSUPP,
    }
}

/// `ibv_req_notify_cq`: arm the CQ's completion channel.
///
/// # Safety
/// `cq` must be live.
#[inline]
pub unsafe fn ibv_req_notify_cq(cq: *mut ibv_cq, solicited_only: c_int) -> c_int {
    // SAFETY: cq is live (caller).
    match unsafe { (*(*cq).context).ops.req_notify_cq } {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(cq, solicited_only) },
        None => libc::EOPNOTSUPP,
    }
}

/// `ibv_create_cq_ex`; NULL with `errno` `EOPNOTSUPP` when the provider lacks it.
///
/// # Safety
/// `context` must be live and `cq_attr` valid.
pub unsafe fn ibv_create_cq_ex(context: *mut ibv_context, cq_attr: *mut ibv_cq_init_attr_ex) -> *mut ibv_cq_ex {
    match ctx_op!(context, create_cq_ex) {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(context, cq_attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_cq_ex_to_cq`.
pub fn ibv_cq_ex_to_cq(cq: *mut ibv_cq_ex) -> *mut ibv_cq {
    cq.cast()
}

/// `ibv_create_srq_ex`: a basic SRQ with only PD/type in the mask goes through the exported
/// `ibv_create_srq`, anything else through the provider's extended call.
///
/// # Safety
/// `context` must be live and `attr` valid (its `pd` from `context`).
pub unsafe fn ibv_create_srq_ex(
    lib: &IbvLib,
    context: *mut ibv_context,
    attr: *mut ibv_srq_init_attr_ex,
) -> *mut ibv_srq {
    // SAFETY: attr is valid (caller).
    let (mask, srq_type, pd) = unsafe { ((*attr).comp_mask, (*attr).srq_type, (*attr).pd) };
    let basic = IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_TYPE;
    if mask & !basic == 0
        && mask & IBV_SRQ_INIT_ATTR_PD != 0
        && (mask & IBV_SRQ_INIT_ATTR_TYPE == 0 || srq_type == IBV_SRQT_BASIC)
    {
        // SAFETY: ibv_srq_init_attr is the leading part of ibv_srq_init_attr_ex (checked in
        // the layout test), as the C inline relies on.
        return unsafe { lib.ibv_create_srq(pd, attr.cast()) };
    }
    match ctx_op!(context, create_srq_ex) {
        // SAFETY: the provider's function with the caller's arguments.
        Some(f) => unsafe { f(context, attr) },
        None => {
            set_errno(libc::EOPNOTSUPP);
            std::ptr::null_mut()
        }
    }
}

/// `ibv_query_device_ex`, falling back to `ibv_query_device` into `attr.orig_attr` (rest
/// zeroed) when the provider lacks it.
///
/// # Safety
/// `context` must be live; `input` NULL or valid; `attr` valid for a write.
pub unsafe fn ibv_query_device_ex(
    lib: &IbvLib,
    context: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
) -> c_int {
    // SAFETY: input is NULL or valid (caller).
    if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
        return libc::EINVAL;
    }
    if let Some(f) = ctx_op!(context, query_device_ex) {
        // SAFETY: the provider's function; the size tells it how much of attr we know.
        let ret = unsafe { f(context, input, attr, size_of::<ibv_device_attr_ex>()) };
        if ret != libc::EOPNOTSUPP && ret != libc::ENOSYS {
            return ret;
        }
    }
    // SAFETY: attr is valid for a write of its whole size (caller).
    unsafe {
        std::ptr::write_bytes(attr, 0, 1);
        lib.ibv_query_device(context, &mut (*attr).orig_attr)
    }
}

/// `ibv_query_port` with the macro's semantics: the provider's extended call with the size of
/// this build's `ibv_port_attr`, or the exported compat symbol into a zeroed struct, so the
/// newer fields are never left uninitialised.
///
/// # Safety
/// `context` must be live and `port_attr` valid for a write.
pub unsafe fn ibv_query_port(
    lib: &IbvLib,
    context: *mut ibv_context,
    port: u8,
    port_attr: *mut ibv_port_attr,
) -> c_int {
    match ctx_op!(context, query_port) {
        // SAFETY: the provider's function with the caller's arguments and our struct size.
        Some(f) => unsafe { f(context, port, port_attr, size_of::<ibv_port_attr>()) },
        None => {
            // SAFETY: port_attr is valid for a write (caller); the compat struct is its prefix.
            unsafe {
                std::ptr::write_bytes(port_attr, 0, 1);
                lib.ibv_query_port(context, port, port_attr.cast())
            }
        }
    }
}

/// `ibv_query_gid_ex` with this build's entry size.
///
/// # Safety
/// `context` must be live and `entry` valid for a write.
pub unsafe fn ibv_query_gid_ex(
    lib: &IbvLib,
    context: *mut ibv_context,
    port: u32,
    gid_index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
) -> c_int {
    // SAFETY: forwarded with the caller's guarantees.
    unsafe { lib._ibv_query_gid_ex(context, port, gid_index, entry, flags, size_of::<ibv_gid_entry>()) }
}

/// `ibv_reg_mr` as the macro resolves it for a constant access mask: the exported `ibv_reg_mr`
/// unless `IBV_ACCESS_OPTIONAL_RANGE` is asked for, then `ibv_reg_mr_iova2` with the address as
/// the I/O virtual address.
///
/// # Safety
/// `pd` must be live and `[addr, addr + length)` mapped for as long as the region is registered.
pub unsafe fn ibv_reg_mr(
    lib: &IbvLib,
    pd: *mut ibv_pd,
    addr: *mut std::ffi::c_void,
    length: usize,
    access: u32,
) -> *mut ibv_mr {
    if access & IBV_ACCESS_OPTIONAL_RANGE == 0 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { lib.ibv_reg_mr(pd, addr, length, access as c_int) }
    } else {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe { lib.ibv_reg_mr_iova2(pd, addr, length, addr as u64, access) }
    }
}

fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// `IBV_ACCESS_OPTIONAL_RANGE` (a macro over the kernel ABI's enum, which bindgen cannot
/// evaluate): access flags a provider may ignore.
pub const IBV_ACCESS_OPTIONAL_RANGE: u32 = IB_UVERBS_ACCESS_OPTIONAL_RANGE;

/// `__VERBS_ABI_IS_EXTENDED`: the `abi_compat` value of a context with the extended ABI.
pub const __VERBS_ABI_IS_EXTENDED: *mut std::ffi::c_void = usize::MAX as *mut std::ffi::c_void;
