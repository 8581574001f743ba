//! The UCT tests, with the algorithms of `ucx_perftest`:
//!
//! * ping-pong (`am_lat`, `put_lat`, `add_lat`): side 0 sends sequence number `sn` and waits
//!   for the peer to send it back; side 1 does the opposite. For AM the handler records the
//!   last sequence number; for put it is the last byte of the message; for add, the low byte
//!   of the remote counter.
//! * unidirectional stream (`am_bw`, `put_bw`, `add_mr`, `get`, `fadd`, `swap`, `cswap`): side 1
//!   sends as fast as it can, side 0 receives. Active messages use a flow-control window
//!   (`-W`): the receiver acknowledges every half window with an AM carrying the last sequence
//!   number. RMA and atomics end with a sentinel value 2 the receiver polls for.
//!
//! Loopback (`-l`) runs side 0 of ping-pong and the sending side of streams in one process.

use std::cell::Cell;
use std::rc::Rc;

use uct::{
    AmRecv, AtomicOp, Ep, EpParams, FlushFlags, Iface, IfaceParams, Iov, Md, MdFlags, MemAccess, MemH, Outcome,
    ProgressFlags, RemoteKey, SendFlags, Status, Worker,
};

use crate::meter::{Measured, Meter};
use crate::params::{Command, DataLayout, PerfParams, MAX_FC_WINDOW};

/// A UCT test as it runs: the parameters as the command line gave them, the transport and
/// device (`tl/dev`) they resolved to, and this process's side (0: server, 1: client).
#[derive(Clone, Copy, Debug)]
pub struct UctTestSpec<'a> {
    /// The run's parameters.
    pub params: &'a PerfParams,
    /// Transport and device, `tl/dev`.
    pub resource: &'a str,
    /// Side: 0 (server) or 1 (client).
    pub index: u8,
}

impl UctTestSpec<'_> {
    fn cmd(&self) -> Command {
        self.params.test.command()
    }

    fn pingpong(&self) -> bool {
        self.params.is_pingpong()
    }

    fn layout(&self) -> DataLayout {
        self.params.layout
    }

    fn fc_window(&self) -> u8 {
        self.params.fc_window.min(MAX_FC_WINDOW) as u8
    }
}

const AM_ID: u8 = 1;
/// Warm-up ends early once both sides have spent this long in it.
const WARMUP_TIME: std::time::Duration = std::time::Duration::from_millis(100);
const PROGRESS_EVERY: u32 = 16;

/// A test's operation and data layout. The message loops take it as an argument, and `run`
/// calls them through [`with_const_op!`] with a constant for each supported pair, so that each
/// pair gets a loop of its own without a match per message (`ucx_perftest`'s template for each
/// command and layout).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Op {
    cmd: Command,
    layout: DataLayout,
}

/// `with_const_op!(op, |o| body)`: `body` with `o` bound to `op` as a constant `Op` (one copy
/// of `body` for each operation and layout `send` distinguishes; other pairs run with `op`
/// itself, and fail at the first send). The loops `body` calls are `#[inline(always)]`.
macro_rules! with_const_op {
    ($op:expr, |$o:ident| $body:expr) => {{
        use Command as C;
        use DataLayout as L;
        let op: Op = $op;
        macro_rules! arm {
            ($c:expr, $l:expr) => {{
                let $o = Op { cmd: $c, layout: $l };
                $body
            }};
        }
        match (op.cmd, op.layout) {
            (C::Am, L::Short) => arm!(C::Am, L::Short),
            (C::Am, L::ShortIov) => arm!(C::Am, L::ShortIov),
            (C::Am, L::Bcopy) => arm!(C::Am, L::Bcopy),
            (C::Put, L::Short) => arm!(C::Put, L::Short),
            (C::Put, L::Bcopy) => arm!(C::Put, L::Bcopy),
            (C::Put, L::Zcopy) => arm!(C::Put, L::Zcopy),
            (C::Get, L::Bcopy) => arm!(C::Get, L::Bcopy),
            (C::Get, L::Zcopy) => arm!(C::Get, L::Zcopy),
            // The atomics ignore the layout.
            (C::Add, l) => arm!(C::Add, l),
            (C::Fadd, l) => arm!(C::Fadd, l),
            (C::Swap, l) => arm!(C::Swap, l),
            (C::Cswap, l) => arm!(C::Cswap, l),
            _ => {
                let $o = op;
                $body
            }
        }
    }};
}

/// Out-of-band exchange with the peer (the TCP bootstrap, or loopback).
pub trait Exchange {
    /// Sends our blob, returns the peer's.
    fn exchange(&mut self, mine: &[u8]) -> Result<Vec<u8>, String>;

    /// Waits until the peer reaches the same point, calling `progress` while waiting.
    fn barrier(&mut self, progress: &mut dyn FnMut()) -> Result<(), String> {
        let _ = progress;
        self.exchange(b"barrier").map(|_| ())
    }
}

struct Buffer {
    memh: Option<MemH>,
    _heap: Option<PageAligned>,
    ptr: *mut u8,
    len: usize,
}

/// Zeroed heap memory starting on a page boundary (as ucx_perftest's mmap fallback gives):
/// a kernel copy (cma) of a buffer that starts mid-page touches one more page per chunk.
pub struct PageAligned {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
}

impl PageAligned {
    /// `len` zeroed bytes (at least one) on a page boundary.
    pub fn new(len: usize) -> Result<Self, String> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).map_err(|e| e.to_string())?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = std::ptr::NonNull::new(ptr).ok_or_else(|| format!("cannot allocate {len} bytes"))?;
        Ok(PageAligned { ptr, layout })
    }
}

impl PageAligned {
    /// The start.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for PageAligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// A test buffer: allocated by the memory domain when it can (as ucx_perftest does for both
/// buffers), else heap memory registered with it.
fn buffer(md: &Rc<dyn Md>, len: usize) -> Result<Buffer, String> {
    let len = len.max(64);
    if md.attr().flags.contains(MdFlags::ALLOC) {
        let memh = md.mem_alloc(len, MemAccess::ALL, "perftest").map_err(|e| format!("cannot allocate memory: {e}"))?;
        return Ok(Buffer { ptr: memh.address(), len, memh: Some(memh), _heap: None });
    }
    let heap = PageAligned::new(len)?;
    let ptr = heap.ptr.as_ptr();
    let memh = if md.attr().flags.contains(MdFlags::REG) {
        // SAFETY: the heap allocation lives in the Buffer next to the registration, which
        // Buffer's field order drops first.
        unsafe { md.mem_reg(ptr, len, MemAccess::ALL) }.ok()
    } else {
        None
    };
    Ok(Buffer { memh, _heap: Some(heap), ptr, len })
}

fn push_blob(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

fn take_blob<'a>(b: &mut &'a [u8]) -> Result<&'a [u8], String> {
    let bad = || "malformed address from the peer".to_string();
    if b.len() < 4 {
        return Err(bad());
    }
    let n = u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize;
    if b.len() < 4 + n {
        return Err(bad());
    }
    let (blob, rest) = b[4..].split_at(n);
    *b = rest;
    Ok(blob)
}

/// Fails, as `ucx_perftest` does, when the message is larger than the transport allows for the
/// test's operation and data layout.
fn check_size_limit(spec: &UctTestSpec<'_>, attr: &uct::IfaceAttr, length: usize) -> Result<(), String> {
    use uct::IfaceFlags as F;
    let (what, flag, max) = match (spec.cmd(), spec.layout()) {
        (Command::Am, DataLayout::Short | DataLayout::ShortIov) => ("AM short", F::AM_SHORT, attr.am.max_short),
        (Command::Am, DataLayout::Bcopy) => ("AM bcopy", F::AM_BCOPY, attr.am.max_bcopy),
        (Command::Am, DataLayout::Zcopy) => ("AM zcopy", F::AM_ZCOPY, attr.am.max_zcopy),
        (Command::Put, DataLayout::Short) => ("put short", F::PUT_SHORT, attr.put.max_short),
        (Command::Put, DataLayout::Bcopy) => ("put bcopy", F::PUT_BCOPY, attr.put.max_bcopy),
        (Command::Put, DataLayout::Zcopy) => ("put zcopy", F::PUT_ZCOPY, attr.put.max_zcopy),
        (Command::Get, DataLayout::Bcopy) => ("get bcopy", F::GET_BCOPY, attr.get.max_bcopy),
        (Command::Get, DataLayout::Zcopy) => ("get zcopy", F::GET_ZCOPY, attr.get.max_zcopy),
        _ => return Ok(()),
    };
    if !attr.flags.contains(flag) {
        return Err(format!("{} does not support {what}", spec.resource));
    }
    if length > max {
        return Err(format!("{what} size ({length}) is larger than max supported by {} ({max})", spec.resource));
    }
    Ok(())
}

/// The connected state of a test.
struct Ctx<'a> {
    spec: UctTestSpec<'a>,
    worker: Worker,
    ep: Box<dyn Ep>,
    iface: Box<dyn Iface>,
    send: Buffer,
    recv: Buffer,
    remote_addr: u64,
    rkey: Option<RemoteKey>,
    am_sn: Rc<Cell<u8>>,
    length: usize,
    sends: Cell<u32>,
    /// Counts operations in flight: +1 for each `InProgress`, -1 as the transport completes.
    inflight: Rc<uct::Completion>,
    _md: Rc<dyn Md>,
}

impl<'a> Ctx<'a> {
    fn setup(spec: &UctTestSpec<'a>, oob: &mut dyn Exchange) -> Result<Ctx<'a>, String> {
        let worker = Worker::default();
        let (md, iface) = uct::iface_open_by_name(&worker, spec.resource, IfaceParams::default())
            .map_err(|e| format!("cannot open {}: {e}", spec.resource))?;
        iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
        let length: usize = spec.params.msg_sizes.iter().sum();
        check_size_limit(spec, iface.attr(), length)?;
        let send = buffer(&md, length)?;
        let recv = buffer(&md, length)?;
        let am_sn = Rc::new(Cell::new(0u8));
        let s2 = am_sn.clone();
        if spec.cmd() == Command::Am {
            iface
                .set_am_handler(
                    AM_ID,
                    Some(Rc::new(move |m: AmRecv<'_>| s2.set(m.data().first().copied().unwrap_or(0)))),
                )
                .map_err(|e| format!("cannot set the AM handler: {e}"))?;
        }
        // To-ep transports (rc_verbs): create the endpoint first and send its address along.
        let to_ep = iface.attr().flags.contains(uct::IfaceFlags::CONNECT_TO_EP)
            && !iface.attr().flags.contains(uct::IfaceFlags::CONNECT_TO_IFACE);
        let early_ep = if to_ep {
            Some(iface.ep_create(&EpParams::to_ep()).map_err(|e| format!("cannot create an endpoint: {e}"))?)
        } else {
            None
        };
        let mut mine = Vec::new();
        push_blob(&mut mine, &iface.device_address());
        match &early_ep {
            Some(ep) => push_blob(&mut mine, &ep.address().map_err(|e| format!("endpoint address: {e}"))?),
            None => push_blob(&mut mine, &iface.iface_address()),
        }
        let rkey_bytes = match &recv.memh {
            Some(m) => md.mkey_pack(m).unwrap_or_default(),
            None => uct::PackedKey::new(),
        };
        push_blob(&mut mine, &rkey_bytes);
        push_blob(&mut mine, &(recv.ptr as u64).to_le_bytes());
        let theirs = oob.exchange(&mine)?;
        let mut t = &theirs[..];
        let (dev, addr, rk, raddr) = (take_blob(&mut t)?, take_blob(&mut t)?, take_blob(&mut t)?, take_blob(&mut t)?);
        let remote_addr = u64::from_le_bytes(raddr.try_into().map_err(|_| "malformed remote address".to_string())?);
        let rkey = if rk.is_empty() { None } else { md.component().rkey_unpack(rk).ok() };
        let ep = match early_ep {
            Some(ep) => {
                ep.connect_to_ep(dev, addr)
                    .map_err(|e| format!("cannot connect to the peer over {}: {e}", spec.resource))?;
                ep
            }
            None => iface
                .ep_create(&EpParams::to_iface(dev, addr))
                .map_err(|e| format!("cannot connect to the peer over {}: {e}", spec.resource))?,
        };
        Ok(Ctx {
            spec: *spec,
            worker,
            ep,
            iface,
            send,
            recv,
            remote_addr,
            rkey,
            am_sn,
            length,
            sends: Cell::new(0),
            inflight: uct::Completion::counter(0),
            _md: md,
        })
    }

    #[inline]
    fn progress_responder(&self) {
        if !self.spec.params.no_responder_progress {
            self.worker.progress();
        }
    }

    #[inline]
    fn rkey(&self) -> Result<&RemoteKey, Status> {
        self.rkey.as_ref().ok_or(Status::InvalidParam)
    }

    /// The sequence number as the receiving side sees it.
    #[inline]
    fn recv_sn(&self, op: Op, pingpong: bool) -> u8 {
        let at = match op.cmd {
            Command::Am => return self.am_sn.get(),
            Command::Put if pingpong => self.length - 1,
            _ => 0,
        };
        // SAFETY: `at` lies within the receive buffer, which peers write only through the
        // transport; a volatile read sees their latest store.
        unsafe { self.recv.ptr.add(at).read_volatile() }
    }

    #[inline]
    fn set_send_sn(&self, at: usize, sn: u8) {
        // SAFETY: `at` lies within the send buffer (length >= 1).
        unsafe { self.send.ptr.add(at).write_volatile(sn) };
    }

    /// One operation carrying `sn` (`prev` is the previous sequence number, for adds).
    #[inline(always)]
    fn send(&self, op: Op, sn: u8, prev: u8, pingpong: bool) -> Result<Outcome<()>, Status> {
        let len = self.length;
        // SAFETY: `len` bytes of the send buffer are valid for the whole test.
        let buf = unsafe { std::slice::from_raw_parts(self.send.ptr, len) };
        let raddr = self.remote_addr;
        let done = |o: Outcome<usize>| o.map(|_| ());
        match (op.cmd, op.layout) {
            (Command::Am, DataLayout::Short) => self.ep.am_short(AM_ID, sn as u64, &buf[8..]),
            (Command::Am, DataLayout::ShortIov) => {
                self.set_send_sn(0, sn);
                self.ep.am_short_iov(AM_ID, &[buf])
            }
            (Command::Am, DataLayout::Bcopy) => {
                self.set_send_sn(0, sn);
                self.ep
                    .am_bcopy(
                        AM_ID,
                        &mut |d: &mut [u8]| {
                            // Too long for the buffer: report the length; the transport rejects it.
                            if let Some(dst) = d.get_mut(..len) {
                                // SAFETY: `dst` and `buf` are `len` bytes, distinct buffers.
                                unsafe { ucs::memory::copy(buf.as_ptr(), dst.as_mut_ptr(), len) };
                            }
                            len
                        },
                        SendFlags::empty(),
                    )
                    .map(done)
            }
            (Command::Put, layout) => {
                if pingpong {
                    self.set_send_sn(len - 1, sn);
                }
                let rkey = self.rkey()?;
                match layout {
                    DataLayout::Short => self.ep.put_short(buf, raddr, rkey),
                    DataLayout::Bcopy => self
                        .ep
                        .put_bcopy(
                            &mut |d: &mut [u8]| {
                                if let Some(dst) = d.get_mut(..len) {
                                    // SAFETY: `dst` and `buf` are `len` bytes, distinct buffers.
                                    unsafe { ucs::memory::copy(buf.as_ptr(), dst.as_mut_ptr(), len) };
                                }
                                len
                            },
                            raddr,
                            rkey,
                        )
                        .map(done),
                    DataLayout::Zcopy => {
                        let iov = [Iov::new(self.send.ptr, len, self.send.memh.as_ref())];
                        // SAFETY: the send buffer outlives the test and the final flush.
                        unsafe { self.ep.put_zcopy(&iov, raddr, rkey, Some(&self.inflight)) }
                    }
                    DataLayout::ShortIov => Err(Status::Unsupported),
                }
            }
            (Command::Get, DataLayout::Bcopy) => {
                // SAFETY: the send buffer is ours, `len` bytes, valid until the final flush.
                unsafe { self.ep.get_bcopy(self.send.ptr, len, raddr, self.rkey()?, Some(&self.inflight)) }
            }
            (Command::Get, DataLayout::Zcopy) => {
                let iov = [Iov::new(self.send.ptr, len, self.send.memh.as_ref())];
                // SAFETY: as above.
                unsafe { self.ep.get_zcopy(&iov, raddr, self.rkey()?, Some(&self.inflight)) }
            }
            (Command::Add, _) => match len {
                4 => self.ep.atomic32_post(AtomicOp::Add, sn.wrapping_sub(prev) as u32, raddr, self.rkey()?),
                8 => self.ep.atomic64_post(AtomicOp::Add, sn.wrapping_sub(prev) as u64, raddr, self.rkey()?),
                _ => Err(Status::InvalidParam),
            },
            (Command::Fadd | Command::Swap | Command::Cswap, _) => {
                let rkey = self.rkey()?;
                let (op, val) = match op.cmd {
                    Command::Fadd => (AtomicOp::Add, sn.wrapping_sub(prev) as u64),
                    Command::Swap => (AtomicOp::Swap, sn as u64),
                    _ => (AtomicOp::Cswap, sn as u64),
                };
                // SAFETY: results go to the send buffer (>= 8 bytes), valid until the flush.
                unsafe {
                    match (len, op) {
                        (4, AtomicOp::Cswap) => self.ep.atomic_cswap32(
                            prev as u32,
                            val as u32,
                            raddr,
                            rkey,
                            self.send.ptr.cast(),
                            Some(&self.inflight),
                        ),
                        (8, AtomicOp::Cswap) => self.ep.atomic_cswap64(
                            prev as u64,
                            val,
                            raddr,
                            rkey,
                            self.send.ptr.cast(),
                            Some(&self.inflight),
                        ),
                        (4, _) => self.ep.atomic32_fetch(
                            op,
                            val as u32,
                            self.send.ptr.cast(),
                            raddr,
                            rkey,
                            Some(&self.inflight),
                        ),
                        (8, _) => {
                            self.ep.atomic64_fetch(op, val, self.send.ptr.cast(), raddr, rkey, Some(&self.inflight))
                        }
                        _ => Err(Status::InvalidParam),
                    }
                }
            }
            _ => Err(Status::Unsupported),
        }
    }

    /// Sends until the transport takes the operation, progressing on `NoResource`.
    #[inline(always)]
    fn send_b(&self, op: Op, sn: u8, prev: u8, pingpong: bool) -> Result<(), String> {
        self.wait_for_window();
        loop {
            match self.send(op, sn, prev, pingpong) {
                Ok(Outcome::Done(())) => {
                    let n = self.sends.get().wrapping_add(1);
                    self.sends.set(n);
                    if n % PROGRESS_EVERY == 0 {
                        self.worker.progress();
                    }
                    return Ok(());
                }
                Ok(Outcome::InProgress) => {
                    self.inflight.add_count(1);
                    self.worker.progress();
                    return Ok(());
                }
                Ok(Outcome::NoResource) => {
                    self.worker.progress();
                }
                Err(e) => return Err(format!("failed to send: {e}")),
            }
        }
    }

    /// Waits until fewer than `max_outstanding` operations are in flight (`wait_for_window`).
    #[inline(always)]
    fn wait_for_window(&self) {
        while self.inflight.count() >= self.spec.params.max_outstanding.max(1) as i32 {
            self.worker.progress();
        }
    }

    fn flush(&self) -> Result<(), String> {
        let start = std::time::Instant::now();
        while self.inflight.count() > 0 {
            self.worker.progress();
            if start.elapsed().as_secs() > 30 {
                return Err("operations did not complete".into());
            }
        }
        if self.inflight.status() != Status::Ok {
            return Err(format!("an operation failed: {}", self.inflight.status()));
        }
        loop {
            match self.ep.flush(FlushFlags::LOCAL, None) {
                Ok(Outcome::Done(())) => return Ok(()),
                Ok(_) => {
                    self.worker.progress();
                    if start.elapsed().as_secs() > 30 {
                        return Err("flush did not complete".into());
                    }
                }
                Err(e) => return Err(format!("flush failed: {e}")),
            }
        }
    }

    /// Waits until the peer's message `sn` is visible. When that means polling a memory word the
    /// peer's put or atomic targets (not an AM, which progress delivers), the reads alternate
    /// with a `PAUSE` and a progress call: back-to-back reads pull the line away from the
    /// writer's store, and two progress calls between reads see the store late (put_lat
    /// medians of 11 runs: 0.043 us this way, 0.058 us with two progress calls, 0.063 us with
    /// progress + `PAUSE`, C 0.053 us).
    #[inline(always)]
    fn wait_sn(&self, op: Op, sn: u8) {
        if op.cmd == Command::Am {
            // Progress is what receives active messages: call it on every poll.
            while self.recv_sn(op, true) != sn {
                self.progress_responder();
            }
            return;
        }
        // Polling memory the peer writes: read it often, but not back to back (a reader that
        // hammers the line delays the writer's store), and progress on every other poll.
        let mut polls = 0u32;
        while self.recv_sn(op, true) != sn {
            polls = polls.wrapping_add(1);
            if polls % 2 == 0 {
                self.progress_responder();
            } else {
                std::hint::spin_loop();
            }
        }
    }

    #[inline(always)]
    fn pingpong(&self, op: Op, meter: &mut Meter, report: &mut dyn FnMut(&Measured)) -> Result<(), String> {
        let len = self.length as u64;
        let mut sn: u8 = 0;
        if self.spec.params.loopback || self.spec.index == 0 {
            while !meter.done() {
                self.send_b(op, sn, sn.wrapping_sub(1), true)?;
                if meter.update(1, len) {
                    report(&meter.measure(true));
                }
                self.wait_sn(op, sn);
                sn = sn.wrapping_add(1);
            }
        } else {
            while !meter.done() {
                self.wait_sn(op, sn);
                self.send_b(op, sn, sn.wrapping_sub(1), true)?;
                if meter.update(1, len) {
                    report(&meter.measure(true));
                }
                sn = sn.wrapping_add(1);
            }
        }
        self.flush()
    }

    #[inline(always)]
    fn stream(&self, op: Op, meter: &mut Meter, report: &mut dyn FnMut(&Measured)) -> Result<(), String> {
        let len = self.length as u64;
        let fc = op.cmd == Command::Am;
        let to_responder = op.cmd != Command::Get;
        let window = self.spec.fc_window();
        if self.spec.params.loopback || self.spec.index == 1 {
            let mut send_sn: u8 = if fc { 1 } else { 0 };
            self.set_send_sn(0, send_sn);
            while !meter.done() {
                if fc {
                    // Wait for the receiver's acknowledgements to open the window (the
                    // reference's circular `send_sn > sn + fc_window`: at most `window`
                    // messages beyond the last acknowledged one).
                    while (send_sn.wrapping_sub(self.am_sn.get().wrapping_add(window)) as i8) > 0 {
                        self.progress_responder();
                    }
                    self.send_b(op, send_sn, send_sn.wrapping_sub(1), false)?;
                    send_sn = send_sn.wrapping_add(1);
                } else {
                    self.send_b(op, send_sn, send_sn, false)?;
                }
                if meter.update(1, len) {
                    report(&meter.measure(true));
                }
            }
            if fc {
                let last = send_sn.wrapping_sub(1);
                while (last.wrapping_sub(self.am_sn.get()) as i8) > 0 && !self.spec.params.loopback {
                    self.progress_responder();
                }
            } else if to_responder {
                self.set_send_sn(0, 2);
                self.send_b(op, 2, send_sn, false)?;
            } else {
                // SAFETY: byte 0 of our receive buffer, read by the peer's gets.
                unsafe { self.recv.ptr.write_volatile(2) };
            }
        } else if fc {
            // Receiver: acknowledge every half window; count iterations from sequence numbers.
            let mut acked: u8 = u8::MAX;
            let mut last: u8 = 0;
            while !meter.done() {
                self.progress_responder();
                let sn = self.am_sn.get();
                if (sn.wrapping_sub(acked) as i8) > (window / 2) as i8 {
                    self.send_b(op, sn, acked, false)?;
                    acked = sn;
                }
                let d = sn.wrapping_sub(last) as u64;
                if d > 0 {
                    last = sn;
                    meter.set_iters(meter.iters() + d, len);
                }
            }
            let sn = self.am_sn.get();
            if sn != acked {
                self.send_b(op, sn, acked, false)?;
            }
        } else {
            // Receiver of RMA/atomics: wait for the sentinel. For get, the data flows to the
            // requester, so poll its memory with our own gets every millisecond.
            let mut poll = std::time::Instant::now();
            let mut spins = 0u32;
            loop {
                self.progress_responder();
                spins = spins.wrapping_add(1);
                // The sentinel only ends the test, so look for it every 16th progress call: each
                // read pulls the line the sender's operations target away from the sender.
                if spins % 16 != 0 {
                    continue;
                }
                let sn = if to_responder {
                    self.recv_sn(op, false)
                } else {
                    // SAFETY: byte 0 of our send buffer, written by our gets.
                    unsafe { self.send.ptr.read_volatile() }
                };
                if sn == 2 {
                    break;
                }
                if !to_responder && poll.elapsed().as_millis() >= 1 {
                    self.send_b(op, 0, 0, false)?;
                    poll = std::time::Instant::now();
                }
            }
        }
        self.flush()
    }
}

/// Runs a test: warm-up, then the measured run; `report(m, final)` gets progress rows and the
/// final figures.
pub fn run(
    spec: &UctTestSpec<'_>,
    oob: &mut dyn Exchange,
    report: &mut dyn FnMut(&Measured, bool),
) -> Result<(), String> {
    let length: usize = spec.params.msg_sizes.iter().sum();
    if length < 1 || (spec.cmd() == Command::Am && spec.layout() == DataLayout::Short && length < 8) {
        return Err(format!("message size {length} is too small for this test"));
    }
    let ctx = Ctx::setup(spec, oob)?;
    let attr = ctx.iface.attr().clone();
    if spec.cmd() == Command::Am && spec.layout() == DataLayout::Short && length > attr.am.max_short {
        return Err(format!("message size {length} exceeds the transport's am_short limit ({})", attr.am.max_short));
    }
    let sync = |oob: &mut dyn Exchange, ctx: &Ctx<'_>| {
        oob.barrier(&mut || {
            ctx.worker.progress();
        })
    };
    for_each_run(spec.params.warmup, spec.params.iters_limit(), oob, &mut |oob, iters, measured| {
        // Every run starts from zeroed buffers and sequence numbers on both sides.
        // SAFETY: both buffers are ours and at least `len` bytes.
        unsafe {
            std::ptr::write_bytes(ctx.send.ptr, 0, ctx.send.len);
            std::ptr::write_bytes(ctx.recv.ptr, 0, ctx.recv.len);
        }
        ctx.am_sn.set(0);
        if spec.pingpong() {
            ctx.am_sn.set(u8::MAX);
            if spec.cmd() == Command::Put {
                // SAFETY: last byte of the message within the receive buffer.
                unsafe { ctx.recv.ptr.add(length - 1).write_volatile(u8::MAX) };
            } else if spec.cmd() == Command::Add {
                // SAFETY: first byte of the receive buffer.
                unsafe { ctx.recv.ptr.write_volatile(u8::MAX) };
            }
        }
        sync(oob, &ctx)?;
        let mut meter = Meter::new(iters, spec.params.percentile, spec.pingpong());
        meter.start();
        let mut rep = |m: &Measured| {
            if measured {
                report(m, false)
            }
        };
        let op = Op { cmd: spec.cmd(), layout: spec.layout() };
        if spec.pingpong() {
            with_const_op!(op, |op| ctx.pingpong(op, &mut meter, &mut rep))?;
        } else {
            with_const_op!(op, |op| ctx.stream(op, &mut meter, &mut rep))?;
        }
        meter.stop();
        let m = meter.measure(true);
        sync(oob, &ctx)?;
        if measured {
            report(&m, true);
        }
        Ok(())
    })?;
    drop(ctx);
    Ok(())
}

/// One run of a test: `(oob, iterations, measured)`.
pub type RunBody<'a> = dyn FnMut(&mut dyn Exchange, u64, bool) -> Result<(), String> + 'a;

/// Runs `body(oob, iterations, measured)` as the reference schedules a test: warm-up rounds
/// of 1, 2, 4, ... iterations until `warmup` are done, ending early once both sides have spent
/// `WARMUP_TIME` in it (they agree over `oob`), then the measured run of `iters`.
pub fn for_each_run(warmup: u64, iters: u64, oob: &mut dyn Exchange, body: &mut RunBody<'_>) -> Result<(), String> {
    let mut runs: Vec<(u64, bool)> = Vec::new();
    let mut planned = 0u64;
    let mut round = 1u64;
    while planned < warmup {
        let n = round.min(warmup - planned);
        runs.push((n, false));
        planned += n;
        round = round.saturating_mul(2);
    }
    runs.push((iters, true));
    let warm_start = std::time::Instant::now();
    for (iters, measured) in runs {
        if iters == 0 {
            continue;
        }
        if !measured && warm_start.elapsed() >= WARMUP_TIME {
            // Both sides must agree to skip the rest of the warm-up.
            let theirs = oob.exchange(&[1])?;
            if theirs.first() == Some(&1) {
                continue;
            }
        } else if !measured {
            oob.exchange(&[0])?;
        }
        body(oob, iters, measured)?;
    }
    Ok(())
}
