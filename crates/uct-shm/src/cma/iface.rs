//! The `cma` interface (an ordered queue of zero-copy operations) and endpoint.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::{Rc, Weak};

use ucs::config::{Config, MemUnits};
use ucs::{OpResult, Outcome, Status, UcsResult};
use uct::{
    iov_total_len, AmHandler, BandwidthModel, BaseIface, Completion, Ep, EpConnect, EpParams, EventFlags, FlushFlags,
    Iface, IfaceAttr, IfaceFlags, IfaceParams, Iov, LinearFunc, OpCaps, ProgressFlags, RemoteKey, Worker,
};

use super::NAME;
use crate::mm::machine_id;

/// Prefixes of the `UCX_*` settings of cma.
pub(crate) const CONFIG_PREFIXES: &[&str] = &["CMA_", "SCOPY_"];

ucs::config_table! {
    /// `UCX_CMA_*` (with `UCX_SCOPY_*` as the family prefix, as in UCX).
    pub struct CmaConfigTable {
        pub seg_size: MemUnits = ("SEG_SIZE", "512k",
            "Segment size used to perform data transfer when doing progress of GET/PUT zcopy operations."),
        pub max_iov: usize = ("MAX_IOV", "16", "Maximum IOV count of a single GET/PUT zcopy operation."),
        pub tx_quota: u32 = ("TX_QUOTA", "1", "How many TX segments can be dispatched during iface progress."),
    }
}

/// Largest iov count (bounds the inline iov storage of a queued operation).
const IOV_CAP: usize = 16;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Dir {
    Put,
    Get,
}

/// The local side of an operation: (address, length) pieces.
enum Local {
    /// One piece, the common case: stored inline, so a queued operation stays small.
    One((usize, usize)),
    /// Several pieces.
    Many(Box<[(usize, usize)]>),
}

impl Local {
    fn pieces(&self) -> &[(usize, usize)] {
        match self {
            Local::One(p) => std::slice::from_ref(p),
            Local::Many(v) => v,
        }
    }
}

/// A queued operation: local iov entries, the remote address, and progress so far.
struct Op {
    dir: Dir,
    pid: libc::pid_t,
    ep: Weak<EpState>,
    local: Local,
    remote: u64,
    total: usize,
    done: usize,
    comp: Option<Rc<Completion>>,
    /// A flush marker: completes when every operation before it has.
    flush: bool,
}

struct EpState {
    pid: u32,
    user_data: u64,
    failed: Cell<Option<Status>>,
}

struct Inner {
    /// Attributes, AM handlers, pending queue, progress registration, failure handler.
    base: BaseIface,
    seg_size: usize,
    tx_quota: u32,
    queue: RefCell<VecDeque<Op>>,
    /// The user enabled progress.
    progress_wanted: Cell<bool>,
}

fn fail_ep(inner: &Inner, ep: &EpState, status: Status) {
    if ep.failed.replace(Some(status)).is_none() {
        tracing::debug!(pid = ep.pid, "cma: peer not accessible any more: {status}");
        inner.base.report_failure(ep.user_data, status);
    }
}

impl Inner {
    /// Moves the head operation forward by up to one segment; true when it finished.
    fn step(&self, op: &mut Op) -> Result<bool, Status> {
        if op.flush || op.total == op.done {
            return Ok(true);
        }
        if let Some(s) = op.ep.upgrade().and_then(|e| e.failed.get()) {
            return Err(s);
        }
        let want = (op.total - op.done).min(self.seg_size);
        // Local iovecs covering [done, done + want) of the operation.
        let mut local = [libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 }; IOV_CAP];
        let (mut n, mut skip, mut left) = (0, op.done, want);
        for &(base, len) in op.local.pieces() {
            if left == 0 {
                break;
            }
            if skip >= len {
                skip -= len;
                continue;
            }
            let take = (len - skip).min(left);
            local[n] = libc::iovec { iov_base: (base + skip) as *mut libc::c_void, iov_len: take };
            n += 1;
            left -= take;
            skip = 0;
        }
        let remote = libc::iovec { iov_base: (op.remote as usize + op.done) as *mut libc::c_void, iov_len: want };
        // SAFETY: the local iovecs describe memory the caller of the zero-copy operation
        // promised to keep valid until completion; the remote side is checked by the kernel
        // against the peer's address space.
        let r = unsafe {
            match op.dir {
                Dir::Put => libc::process_vm_writev(op.pid, local.as_ptr(), n as u64, &remote, 1, 0),
                Dir::Get => libc::process_vm_readv(op.pid, local.as_ptr(), n as u64, &remote, 1, 0),
            }
        };
        if r < 0 {
            let e = std::io::Error::last_os_error();
            return Err(match e.raw_os_error() {
                Some(libc::EPERM) | Some(libc::ESRCH) => Status::ConnectionReset,
                Some(libc::EFAULT) => Status::InvalidAddr,
                _ => Status::IoError,
            });
        }
        if r == 0 {
            return Err(Status::IoError);
        }
        op.done += r as usize;
        Ok(op.done == op.total)
    }

    fn progress(&self) -> usize {
        let mut events = 0;
        for _ in 0..self.tx_quota.max(1) {
            let Some(mut op) = self.queue.borrow_mut().pop_front() else { break };
            let r = self.step(&mut op);
            match r {
                Ok(false) => {
                    self.queue.borrow_mut().push_front(op);
                    continue;
                }
                Ok(true) => {
                    if let Some(c) = op.comp.take() {
                        c.complete(Status::Ok);
                    }
                }
                Err(status) => {
                    if status == Status::ConnectionReset {
                        if let Some(ep) = op.ep.upgrade() {
                            fail_ep(self, &ep, status);
                        }
                    }
                    if let Some(c) = op.comp.take() {
                        c.complete(status);
                    }
                }
            }
            events += 1;
        }
        if self.queue.borrow().is_empty() {
            // Nothing left: the worker's progress skips this interface until the next enqueue.
            self.base.progress.pause();
        }
        events
    }

    fn enqueue(self: &Rc<Self>, op: Op) -> OpResult {
        self.queue.borrow_mut().push_back(op);
        self.base.progress.resume();
        if self.progress_wanted.get() && !self.base.progress.is_enabled() {
            self.base.progress.enable_for(self, Inner::progress);
        }
        Ok(Outcome::InProgress)
    }
}

/// The `cma` interface.
pub struct CmaIface {
    inner: Rc<Inner>,
}

impl CmaIface {
    pub(crate) fn open(worker: &Worker, params: &IfaceParams) -> UcsResult<Self> {
        let report = |e: ucs::config::ConfigError| {
            tracing::error!("{e}");
            Status::from(e)
        };
        let mut t = CmaConfigTable::read(CONFIG_PREFIXES).map_err(report)?;
        for (n, v) in &params.config {
            t.set(n, v).map_err(report)?;
        }
        let seg_size = match t.seg_size {
            MemUnits::Value(v) if v > 0 => v,
            MemUnits::Auto => 512 * 1024,
            other => {
                tracing::error!("invalid value for UCX_CMA_SEG_SIZE: {other:?} (expected a positive size)");
                return Err(Status::InvalidParam);
            }
        };
        if !(1..=IOV_CAP).contains(&t.max_iov) {
            tracing::error!("invalid value for UCX_CMA_MAX_IOV: {} (expected 1..={IOV_CAP})", t.max_iov);
            return Err(Status::InvalidParam);
        }
        let zc = OpCaps {
            max_zcopy: usize::MAX,
            opt_zcopy_align: 1,
            align_mtu: 1,
            max_iov: t.max_iov,
            ..Default::default()
        };
        let attr = IfaceAttr {
            flags: IfaceFlags::PUT_ZCOPY | IfaceFlags::GET_ZCOPY | IfaceFlags::CONNECT_TO_IFACE | IfaceFlags::EP_CHECK,
            // Completions come from progress, not from a file descriptor: arming only reports
            // whether operations are still queued.
            event_flags: EventFlags::SEND_COMP,
            put: zc,
            get: zc,
            device_addr_len: 8,
            iface_addr_len: 4,
            max_num_eps: usize::MAX,
            overhead: 2e-6,
            bandwidth: BandwidthModel { dedicated: 11145.0 * 1024.0 * 1024.0, shared: 0.0 },
            latency: LinearFunc { c: 80e-9, m: 0.0 },
            ..Default::default()
        };
        Ok(CmaIface {
            inner: Rc::new(Inner {
                base: BaseIface::new(worker, params, attr),
                seg_size,
                tx_quota: t.tx_quota,
                queue: RefCell::new(VecDeque::with_capacity(64)),
                progress_wanted: Cell::new(false),
            }),
        })
    }
}

impl Drop for CmaIface {
    fn drop(&mut self) {
        // Endpoints may outlive the interface: their operations must not register it again.
        self.inner.progress_wanted.set(false);
        self.inner.base.close();
        // Operations never started complete as canceled.
        let ops: Vec<Op> = self.inner.queue.borrow_mut().drain(..).collect();
        for op in ops {
            if let Some(c) = op.comp {
                c.complete(Status::Canceled);
            }
        }
    }
}

impl Iface for CmaIface {
    fn base(&self) -> &BaseIface {
        &self.inner.base
    }

    fn progress(&self) -> usize {
        self.inner.progress()
    }

    fn progress_enable(&self, _flags: ProgressFlags) {
        self.inner.progress_wanted.set(true);
        if !self.inner.queue.borrow().is_empty() {
            self.inner.base.progress.enable_for(&self.inner, Inner::progress);
        }
    }

    fn progress_disable(&self, _flags: ProgressFlags) {
        self.inner.progress_wanted.set(false);
        self.inner.base.progress.disable();
    }

    fn set_am_handler(&self, id: u8, _handler: Option<AmHandler>) -> UcsResult<()> {
        uct::check_am_id(id)?;
        Err(Status::Unsupported)
    }

    fn device_address(&self) -> Vec<u8> {
        machine_id().to_le_bytes().to_vec()
    }

    fn iface_address(&self) -> Vec<u8> {
        std::process::id().to_le_bytes().to_vec()
    }

    fn is_reachable(&self, dev_addr: &[u8], iface_addr: Option<&[u8]>) -> bool {
        dev_addr == machine_id().to_le_bytes() && iface_addr.is_some_and(|a| a.len() == 4 && a != [0; 4])
    }

    fn ep_create(&self, params: &EpParams<'_>) -> UcsResult<Box<dyn Ep>> {
        match params.connect {
            EpConnect::ToIface { dev_addr, iface_addr } => {
                if !self.is_reachable(dev_addr, Some(iface_addr)) {
                    return Err(if dev_addr.len() != 8 || iface_addr.len() != 4 {
                        Status::InvalidAddr
                    } else {
                        Status::Unreachable
                    });
                }
                let pid = u32::from_le_bytes([iface_addr[0], iface_addr[1], iface_addr[2], iface_addr[3]]);
                let state = Rc::new(EpState { pid, user_data: params.user_data, failed: Cell::new(None) });
                Ok(Box::new(CmaEp { iface: self.inner.clone(), state }))
            }
            EpConnect::ToEp => Err(Status::Unsupported),
        }
    }

    fn flush(&self, _flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        flush_queue(&self.inner, comp)
    }

    fn event_arm(&self, events: EventFlags) -> UcsResult<()> {
        if events.contains(EventFlags::SEND_COMP) && !self.inner.queue.borrow().is_empty() {
            // Queued copies advance only in progress: sleeping now would stall them.
            return Err(Status::Busy);
        }
        Ok(())
    }
}

/// Done when nothing is queued; otherwise a marker completes `comp` after everything before it.
fn flush_queue(inner: &Rc<Inner>, comp: Option<&Rc<Completion>>) -> OpResult {
    if inner.queue.borrow().is_empty() {
        return Ok(Outcome::Done(()));
    }
    if comp.is_none() {
        // Nothing to signal: the caller polls flush until it returns Done.
        return Ok(Outcome::InProgress);
    }
    inner.enqueue(Op {
        dir: Dir::Put,
        pid: 0,
        ep: Weak::new(),
        local: Local::One((0, 0)),
        remote: 0,
        total: 0,
        done: 0,
        comp: comp.cloned(),
        flush: true,
    })
}

/// A `cma` endpoint (to a peer process).
pub struct CmaEp {
    iface: Rc<Inner>,
    state: Rc<EpState>,
}

impl CmaEp {
    fn zcopy(
        &self,
        dir: Dir,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        if let Some(s) = self.state.failed.get() {
            return Err(s);
        }
        let cap = match dir {
            Dir::Put => self.iface.base.attr.put.max_iov,
            Dir::Get => self.iface.base.attr.get.max_iov,
        };
        if iov.len() > cap || iov.iter().any(|e| e.count > 1 && e.stride != e.length && e.stride != 0) {
            return Err(Status::InvalidParam);
        }
        let total = iov_total_len(iov);
        rkey.check(NAME, remote_addr, total)?;
        if rkey.rkey() != self.state.pid as u64 {
            tracing::debug!(key_pid = rkey.rkey(), ep_pid = self.state.pid, "cma: remote key of another process");
            return Err(Status::InvalidParam);
        }
        if total == 0 {
            return Ok(Outcome::Done(()));
        }
        let piece = |e: &Iov<'_>| (e.buffer as usize, e.total_len());
        let local = match iov {
            [one] => Local::One(piece(one)),
            _ => Local::Many(iov.iter().map(piece).collect()),
        };
        self.iface.enqueue(Op {
            dir,
            pid: self.state.pid as libc::pid_t,
            ep: Rc::downgrade(&self.state),
            local,
            remote: remote_addr,
            total,
            done: 0,
            comp: comp.cloned(),
            flush: false,
        })
    }
}

impl Ep for CmaEp {
    unsafe fn put_zcopy(
        &self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        self.zcopy(Dir::Put, iov, remote_addr, rkey, comp)
    }

    unsafe fn get_zcopy(
        &self,
        iov: &[Iov<'_>],
        remote_addr: u64,
        rkey: &RemoteKey,
        comp: Option<&Rc<Completion>>,
    ) -> OpResult {
        self.zcopy(Dir::Get, iov, remote_addr, rkey, comp)
    }

    fn flush(&self, _flags: FlushFlags, comp: Option<&Rc<Completion>>) -> OpResult {
        if let Some(s) = self.state.failed.get() {
            return Err(s);
        }
        flush_queue(&self.iface, comp)
    }

    fn check(&self, _comp: Option<&Rc<Completion>>) -> OpResult {
        if let Some(s) = self.state.failed.get() {
            return Err(s);
        }
        // SAFETY: signal 0 only checks that the process exists.
        let r = unsafe { libc::kill(self.state.pid as libc::pid_t, 0) };
        if r != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
            fail_ep(&self.iface, &self.state, Status::ConnectionReset);
            return Err(Status::ConnectionReset);
        }
        Ok(Outcome::Done(()))
    }
}
