//! Owned verbs objects: each wrapper frees its object on drop and keeps alive what it was
//! created from (a QP holds its CQs and PD, which hold the context), so no object outlives its
//! parent whatever order the transport drops them in.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr::NonNull;
use std::rc::Rc;

use rdma_core_sys as sys;
use ucs::{Status, UcsResult};

/// The calling thread's `errno` as an I/O error.
pub(crate) fn last_os_error() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// Maps a verbs failure (`errno` or a returned error number) to a status, logging what failed.
pub(crate) fn verbs_error(what: &str, err: std::io::Error) -> Status {
    let status = match err.raw_os_error() {
        Some(libc::ENOMEM) => Status::NoMemory,
        Some(libc::EINVAL) => Status::InvalidParam,
        Some(libc::EAGAIN) => Status::NoResource,
        Some(libc::ENODEV) | Some(libc::ENXIO) => Status::NoDevice,
        Some(libc::EOPNOTSUPP) | Some(libc::ENOSYS) => Status::Unsupported,
        Some(libc::EPERM) | Some(libc::EACCES) => Status::Unsupported,
        _ => Status::IoError,
    };
    tracing::error!("{what} failed: {err}");
    status
}

/// An open device context (`ibv_context`).
pub struct Context {
    pub(crate) lib: &'static sys::IbvLib,
    ptr: NonNull<sys::ibv_context>,
}

impl Context {
    /// Opens the device called `name`.
    pub fn open(name: &str) -> UcsResult<Rc<Context>> {
        let list = sys::DeviceList::get().map_err(|why| {
            tracing::debug!("no verbs devices: {why}");
            Status::NoDevice
        })?;
        let idx = (0..list.len()).find(|&i| list.name(i).as_deref() == Some(name)).ok_or(Status::NoDevice)?;
        let dev = list.device(idx).ok_or(Status::NoDevice)?;
        // SAFETY: dev is a live entry of the list, which outlives this call.
        let ctx = unsafe { list.lib().ibv_open_device(dev) };
        let ptr = NonNull::new(ctx).ok_or_else(|| verbs_error(&format!("ibv_open_device({name})"), last_os_error()))?;
        Ok(Rc::new(Context { lib: list.lib(), ptr }))
    }

    /// The raw context.
    pub fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ptr.as_ptr()
    }

    /// The context's asynchronous-event descriptor.
    pub fn async_fd(&self) -> i32 {
        // SAFETY: the context is open.
        unsafe { (*self.ptr.as_ptr()).async_fd }
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: opened by ibv_open_device; every child object holds an Rc to this context,
        // so none is left.
        unsafe { self.lib.ibv_close_device(self.ptr.as_ptr()) };
    }
}

/// A protection domain.
pub struct Pd {
    pub(crate) ctx: Rc<Context>,
    ptr: NonNull<sys::ibv_pd>,
}

impl Pd {
    /// Allocates a protection domain on `ctx`.
    pub fn alloc(ctx: &Rc<Context>) -> UcsResult<Rc<Pd>> {
        // SAFETY: the context is open.
        let pd = unsafe { ctx.lib.ibv_alloc_pd(ctx.as_ptr()) };
        let ptr = NonNull::new(pd).ok_or_else(|| verbs_error("ibv_alloc_pd", last_os_error()))?;
        Ok(Rc::new(Pd { ctx: ctx.clone(), ptr }))
    }

    /// The raw protection domain.
    pub fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.ptr.as_ptr()
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        // SAFETY: allocated by ibv_alloc_pd; registrations and QPs hold an Rc to it.
        unsafe { self.ctx.lib.ibv_dealloc_pd(self.ptr.as_ptr()) };
    }
}

/// A memory registration.
pub struct Mr {
    pd: Rc<Pd>,
    ptr: NonNull<sys::ibv_mr>,
}

thread_local! {
    /// The live registrations with remote write access, by (protection domain, rkey): what a
    /// software transport (`ud_verbs` put emulation) checks a peer's write against, as the
    /// adapter does for RDMA writes. A registration holds an `Rc` and is therefore created and
    /// dropped on one thread, so a per-thread table sees all of its registrations.
    static REMOTE_WRITABLE: RefCell<HashMap<(usize, u32), (usize, usize)>> = RefCell::new(HashMap::new());
}

/// True when `[addr, addr + len)` lies inside a live registration of `pd` with remote write
/// access whose remote key is `rkey` (registered on this thread). Empty ranges always pass.
pub(crate) fn remote_write_allowed(pd: &Pd, rkey: u32, addr: u64, len: usize) -> bool {
    if len == 0 {
        return true;
    }
    let Some(end) = addr.checked_add(len as u64) else { return false };
    REMOTE_WRITABLE
        .try_with(|t| {
            t.borrow()
                .get(&(pd.as_ptr() as usize, rkey))
                .is_some_and(|&(base, rlen)| addr >= base as u64 && end <= (base as u64).saturating_add(rlen as u64))
        })
        .unwrap_or(false)
}

impl Mr {
    /// Registers `[addr, addr + len)` with `access` (`IBV_ACCESS_*`).
    ///
    /// # Safety
    /// The memory must stay mapped while the registration lives.
    pub unsafe fn register(pd: &Rc<Pd>, addr: *mut u8, len: usize, access: u32) -> UcsResult<Mr> {
        // SAFETY: the PD is live; the caller keeps the memory mapped.
        let mr = unsafe { sys::ibv_reg_mr(pd.ctx.lib, pd.as_ptr(), addr.cast::<c_void>(), len, access) };
        let ptr = NonNull::new(mr)
            .ok_or_else(|| verbs_error(&format!("ibv_reg_mr({addr:p}, {len}, access {access:#x})"), last_os_error()))?;
        let mr = Mr { pd: pd.clone(), ptr };
        mr.track_remote_writable(addr, len, access);
        Ok(mr)
    }

    /// Lists a registration made with remote write access in [`REMOTE_WRITABLE`] (every
    /// constructor calls this; `Drop` unlists).
    fn track_remote_writable(&self, addr: *mut u8, len: usize, access: u32) {
        if access & sys::IBV_ACCESS_REMOTE_WRITE != 0 {
            let key = (self.pd.as_ptr() as usize, self.rkey());
            let _ = REMOTE_WRITABLE.try_with(|t| t.borrow_mut().insert(key, (addr as usize, len)));
        }
    }

    /// [`Mr::register`] without logging a failure (the caller decides how to report it).
    ///
    /// # Safety
    /// As for [`Mr::register`].
    pub unsafe fn register_quiet(pd: &Rc<Pd>, addr: *mut u8, len: usize, access: u32) -> UcsResult<Mr> {
        // SAFETY: the PD is live; the caller keeps the memory mapped.
        let mr = unsafe { sys::ibv_reg_mr(pd.ctx.lib, pd.as_ptr(), addr.cast::<c_void>(), len, access) };
        match NonNull::new(mr) {
            Some(ptr) => {
                let mr = Mr { pd: pd.clone(), ptr };
                mr.track_remote_writable(addr, len, access);
                Ok(mr)
            }
            None => Err(match last_os_error().raw_os_error() {
                Some(libc::ENOMEM) => Status::NoMemory,
                Some(libc::EINVAL) | Some(libc::EFAULT) => Status::InvalidParam,
                _ => Status::IoError,
            }),
        }
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        // SAFETY: the registration is live.
        unsafe { (*self.ptr.as_ptr()).lkey }
    }

    /// Remote key.
    pub fn rkey(&self) -> u32 {
        // SAFETY: the registration is live.
        unsafe { (*self.ptr.as_ptr()).rkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        // Remote keys are unique among a device's live registrations: an entry under this key
        // can only be this registration's.
        let key = (self.pd.as_ptr() as usize, self.rkey());
        let _ = REMOTE_WRITABLE.try_with(|t| t.borrow_mut().remove(&key));
        // SAFETY: registered by ibv_reg_mr, deregistered once.
        let r = unsafe { self.pd.ctx.lib.ibv_dereg_mr(self.ptr.as_ptr()) };
        if r != 0 {
            tracing::warn!("ibv_dereg_mr failed: {}", std::io::Error::from_raw_os_error(r));
        }
    }
}

/// A completion channel (the file descriptor CQ events arrive on).
pub struct CompChannel {
    ctx: Rc<Context>,
    ptr: NonNull<sys::ibv_comp_channel>,
}

impl CompChannel {
    /// Creates a channel on `ctx`, with a non-blocking descriptor.
    pub fn create(ctx: &Rc<Context>) -> UcsResult<Rc<CompChannel>> {
        // SAFETY: the context is open.
        let ch = unsafe { ctx.lib.ibv_create_comp_channel(ctx.as_ptr()) };
        let ptr = NonNull::new(ch).ok_or_else(|| verbs_error("ibv_create_comp_channel", last_os_error()))?;
        let chan = CompChannel { ctx: ctx.clone(), ptr };
        let fd = chan.fd();
        // SAFETY: fcntl on the channel's own descriptor.
        let ok = unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFL);
            flags >= 0 && libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) == 0
        };
        if !ok {
            return Err(verbs_error("fcntl(O_NONBLOCK) on the completion channel", last_os_error()));
        }
        Ok(Rc::new(chan))
    }

    /// The descriptor.
    pub fn fd(&self) -> i32 {
        // SAFETY: the channel is live.
        unsafe { (*self.ptr.as_ptr()).fd }
    }

    /// Reads and acknowledges every pending CQ event; returns how many there were.
    pub fn drain(&self) -> usize {
        let mut n = 0;
        loop {
            let mut cq = std::ptr::null_mut();
            let mut cq_ctx = std::ptr::null_mut();
            // SAFETY: the channel is live and non-blocking; out-pointers are locals.
            let r = unsafe { self.ctx.lib.ibv_get_cq_event(self.ptr.as_ptr(), &mut cq, &mut cq_ctx) };
            if r != 0 {
                return n;
            }
            // SAFETY: cq is the CQ the event was for, still alive (our CQs outlive the
            // channel's users); one event acknowledged.
            unsafe { self.ctx.lib.ibv_ack_cq_events(cq, 1) };
            n += 1;
        }
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_comp_channel; CQs using it hold an Rc to it.
        unsafe { self.ctx.lib.ibv_destroy_comp_channel(self.ptr.as_ptr()) };
    }
}

/// A completion queue.
pub struct Cq {
    ctx: Rc<Context>,
    _chan: Option<Rc<CompChannel>>,
    ptr: NonNull<sys::ibv_cq>,
}

impl Cq {
    /// Creates a CQ of at least `cqe` entries, reporting events to `chan`.
    pub fn create(ctx: &Rc<Context>, cqe: usize, chan: Option<&Rc<CompChannel>>) -> UcsResult<Rc<Cq>> {
        let ch = chan.map_or(std::ptr::null_mut(), |c| c.ptr.as_ptr());
        let n = i32::try_from(cqe).map_err(|_| Status::InvalidParam)?;
        // SAFETY: the context and channel are live.
        let cq = unsafe { ctx.lib.ibv_create_cq(ctx.as_ptr(), n, std::ptr::null_mut(), ch, 0) };
        let ptr = NonNull::new(cq).ok_or_else(|| verbs_error(&format!("ibv_create_cq({cqe})"), last_os_error()))?;
        Ok(Rc::new(Cq { ctx: ctx.clone(), _chan: chan.cloned(), ptr }))
    }

    /// The raw CQ.
    pub fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.ptr.as_ptr()
    }

    /// Polls up to `wc.len()` completions into `wc`; returns how many.
    #[inline]
    pub fn poll(&self, wc: &mut [sys::ibv_wc]) -> usize {
        // SAFETY: the CQ is live and wc is valid for its length.
        let n = unsafe { sys::ibv_poll_cq(self.ptr.as_ptr(), wc.len() as i32, wc.as_mut_ptr()) };
        if n < 0 {
            tracing::error!("ibv_poll_cq failed: {n}");
            return 0;
        }
        n as usize
    }

    /// Requests an event for the next completion.
    pub fn arm(&self, solicited_only: bool) -> UcsResult<()> {
        // SAFETY: the CQ is live.
        let r = unsafe { sys::ibv_req_notify_cq(self.ptr.as_ptr(), solicited_only as i32) };
        if r != 0 {
            return Err(verbs_error("ibv_req_notify_cq", std::io::Error::from_raw_os_error(r)));
        }
        Ok(())
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_cq; QPs and SRQs using it hold an Rc to it.
        unsafe { self.ctx.lib.ibv_destroy_cq(self.ptr.as_ptr()) };
    }
}

/// A shared receive queue.
pub struct Srq {
    pd: Rc<Pd>,
    ptr: NonNull<sys::ibv_srq>,
}

impl Srq {
    /// Creates a basic SRQ of `max_wr` receives with one scatter entry each.
    pub fn create(pd: &Rc<Pd>, max_wr: u32) -> UcsResult<Rc<Srq>> {
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut attr: sys::ibv_srq_init_attr_ex = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr;
        attr.attr.max_sge = 1;
        attr.comp_mask = sys::IBV_SRQ_INIT_ATTR_PD | sys::IBV_SRQ_INIT_ATTR_TYPE;
        attr.srq_type = sys::IBV_SRQT_BASIC;
        attr.pd = pd.as_ptr();
        // SAFETY: the context and PD are live; attr is filled as the call expects.
        let srq = unsafe { sys::ibv_create_srq_ex(pd.ctx.lib, pd.ctx.as_ptr(), &mut attr) };
        let ptr =
            NonNull::new(srq).ok_or_else(|| verbs_error(&format!("ibv_create_srq({max_wr})"), last_os_error()))?;
        Ok(Rc::new(Srq { pd: pd.clone(), ptr }))
    }

    /// The raw SRQ.
    pub fn as_ptr(&self) -> *mut sys::ibv_srq {
        self.ptr.as_ptr()
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_srq_ex; QPs using it hold an Rc to it.
        unsafe { self.pd.ctx.lib.ibv_destroy_srq(self.ptr.as_ptr()) };
    }
}

/// A queue pair.
pub struct Qp {
    pd: Rc<Pd>,
    _send_cq: Rc<Cq>,
    _recv_cq: Rc<Cq>,
    _srq: Option<Rc<Srq>>,
    ptr: NonNull<sys::ibv_qp>,
    /// Capabilities the provider granted.
    pub cap: sys::ibv_qp_cap,
}

impl Qp {
    /// Creates a QP of `qp_type` with the requested capabilities (the provider may grant more).
    pub fn create(
        pd: &Rc<Pd>,
        qp_type: sys::ibv_qp_type,
        send_cq: &Rc<Cq>,
        recv_cq: &Rc<Cq>,
        srq: Option<&Rc<Srq>>,
        cap: sys::ibv_qp_cap,
    ) -> UcsResult<Qp> {
        // SAFETY: zero is a valid bit pattern for the attribute struct.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.srq = srq.map_or(std::ptr::null_mut(), |s| s.as_ptr());
        attr.cap = cap;
        attr.qp_type = qp_type;
        attr.sq_sig_all = 0;
        // SAFETY: PD, CQs and SRQ are live; on success attr.cap holds the granted capabilities.
        let qp = unsafe { pd.ctx.lib.ibv_create_qp(pd.as_ptr(), &mut attr) };
        let ptr = NonNull::new(qp).ok_or_else(|| {
            verbs_error(
                &format!(
                    "ibv_create_qp(send_wr {}, recv_wr {}, inline {})",
                    cap.max_send_wr, cap.max_recv_wr, cap.max_inline_data
                ),
                last_os_error(),
            )
        })?;
        Ok(Qp {
            pd: pd.clone(),
            _send_cq: send_cq.clone(),
            _recv_cq: recv_cq.clone(),
            _srq: srq.cloned(),
            ptr,
            cap: attr.cap,
        })
    }

    /// The raw QP.
    #[inline]
    pub fn as_ptr(&self) -> *mut sys::ibv_qp {
        self.ptr.as_ptr()
    }

    /// The QP number.
    pub fn qp_num(&self) -> u32 {
        // SAFETY: the QP is live.
        unsafe { (*self.ptr.as_ptr()).qp_num }
    }

    /// Moves the QP to another state (`ibv_modify_qp`).
    pub fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: u32, what: &str) -> UcsResult<()> {
        // SAFETY: the QP is live; attr is a valid attribute struct for the mask.
        let r = unsafe { self.pd.ctx.lib.ibv_modify_qp(self.ptr.as_ptr(), attr, mask as i32) };
        if r != 0 {
            return Err(verbs_error(&format!("ibv_modify_qp({what})"), std::io::Error::from_raw_os_error(r)));
        }
        Ok(())
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_qp, destroyed once.
        let r = unsafe { self.pd.ctx.lib.ibv_destroy_qp(self.ptr.as_ptr()) };
        if r != 0 {
            tracing::warn!("ibv_destroy_qp failed: {}", std::io::Error::from_raw_os_error(r));
        }
    }
}

/// An address handle (UD destinations).
pub struct Ah {
    pd: Rc<Pd>,
    ptr: NonNull<sys::ibv_ah>,
}

impl Ah {
    /// Creates an address handle for `attr`.
    pub fn create(pd: &Rc<Pd>, attr: &mut sys::ibv_ah_attr) -> UcsResult<Ah> {
        // SAFETY: the PD is live and attr valid.
        let ah = unsafe { pd.ctx.lib.ibv_create_ah(pd.as_ptr(), attr) };
        let ptr = NonNull::new(ah).ok_or_else(|| verbs_error("ibv_create_ah", last_os_error()))?;
        Ok(Ah { pd: pd.clone(), ptr })
    }

    /// The raw address handle.
    pub fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.ptr.as_ptr()
    }
}

impl Drop for Ah {
    fn drop(&mut self) {
        // SAFETY: created by ibv_create_ah, destroyed once.
        unsafe { self.pd.ctx.lib.ibv_destroy_ah(self.ptr.as_ptr()) };
    }
}
