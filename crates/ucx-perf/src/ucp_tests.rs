//! The UCP tag and active-message tests (`tag_lat`, `tag_bw`, `tag_sync_lat`, `tag_sync_bw`,
//! `ucp_am_lat`, `ucp_am_bw`) with the algorithms of `ucx_perftest`:
//!
//! * ping-pong: side 0 sends then receives, side 1 receives then sends, one message each way
//!   per iteration; latency is half the round trip.
//! * unidirectional stream: side 1 sends, side 0 receives; at most `-O` (default 32) sends and
//!   receives outstanding on each side.
//! * `-C` receives with a zero mask (wildcard); `-U` probes until the message is there before
//!   posting the receive (the unexpected path); `-D contig|iov|generic` (the `-s` list gives
//!   the iov entries; `generic`, an extension, passes the buffer through a generic datatype
//!   whose callbacks copy it at an offset: [`BytesDatatype`]); `-M` the worker's thread mode;
//!   `-z` passes registered memory handles.
//!
//! Active messages (`ucp_am_*`): the sender sends with a `-H`-byte user header (default 0) to
//! id 1; the receiver's handler counts arrivals, and a "receive" waits for the next one (as
//! the reference's handler and `recv_started` do).
//!
//! Stream (`stream_lat`, `stream_bw`): the sender sends its buffer on the endpoint's stream;
//! the receiver receives until it has the iteration's bytes, into its buffer (`-r recv`, the
//! default) or as pieces it releases at once (`-r recv_data`), as the reference does.
//!
//! Loopback (`-l`): one worker with an endpoint to itself.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::cell::Cell;

use ucp::{
    AmHandlerFlags, AmMsg, AmSendFlags, Context, ContextParams, Datatype, Endpoint, Features, GenericBuf,
    GenericDatatype, IoVec, MemHandle, PackState, RecvData, RequestParam, SendData, Status, StreamRecvFlags,
    UnpackState, Worker, WorkerParams, FULL_MASK,
};

use crate::meter::{Measured, Meter};
use crate::params::{Command, PerfParams, UcpDatatype, WaitMode};
use crate::uct_tests::{for_each_run, Exchange, PageAligned};

/// A UCP test as it runs: the parameters as the command line gave them, and this process's
/// side (0: server, 1: client).
#[derive(Clone, Copy, Debug)]
pub struct UcpTestSpec<'a> {
    /// The run's parameters.
    pub params: &'a PerfParams,
    /// Side: 0 (server) or 1 (client).
    pub index: u8,
}

impl UcpTestSpec<'_> {
    /// Refuses what is not implemented yet: multi-threaded runs.
    pub fn check(&self) -> Result<(), String> {
        let p = self.params;
        let rma = matches!(
            p.test.command(),
            Command::Put | Command::Get | Command::Add | Command::Fadd | Command::Swap | Command::Cswap
        );
        if !matches!(p.test.command(), Command::Tag | Command::TagSync | Command::Am | Command::Stream) && !rma {
            return Err(format!("UCP test {} is not implemented yet", p.test.name()));
        }
        if p.threads > 1 {
            return Err(format!("multi-threaded runs (-T {}) are not implemented yet", p.threads));
        }
        if rma && (p.ucp_send_datatype == UcpDatatype::Generic || p.ucp_recv_datatype == UcpDatatype::Generic) {
            return Err("remote memory access tests do not take -D generic (as UCP: contig or iov)".into());
        }
        Ok(())
    }

    fn pingpong(&self) -> bool {
        self.params.is_pingpong()
    }

    fn send_iov(&self) -> bool {
        self.params.ucp_send_datatype == UcpDatatype::Iov
    }

    fn recv_iov(&self) -> bool {
        self.params.ucp_recv_datatype == UcpDatatype::Iov
    }

    fn send_generic(&self) -> bool {
        self.params.ucp_send_datatype == UcpDatatype::Generic
    }

    fn recv_generic(&self) -> bool {
        self.params.ucp_recv_datatype == UcpDatatype::Generic
    }

    fn sleep(&self) -> bool {
        self.params.wait_mode == Some(WaitMode::Sleep)
    }
}

/// `-D generic`: a buffer as a generic datatype whose callbacks copy its bytes at an offset
/// (`start_*(buffer, count)`: `count` bytes at `buffer`). What a derived datatype of one block
/// costs over a contiguous buffer: a state per operation and a callback per piece.
pub struct BytesDatatype;

/// One operation's state of [`BytesDatatype`].
struct BytesState {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the state only touches the test's buffer, which outlives every operation.
unsafe impl Send for BytesState {}

impl BytesState {
    /// The run `[offset, offset + n)`, checked against the buffer.
    fn run(&self, offset: usize, n: usize) -> Result<*mut u8, Status> {
        match offset.checked_add(n) {
            Some(end) if end <= self.len => Ok(self.ptr.wrapping_add(offset)),
            _ => Err(Status::OutOfRange),
        }
    }
}

impl PackState for BytesState {
    fn packed_size(&self) -> usize {
        self.len
    }

    fn pack(&mut self, offset: usize, dest: &mut [u8]) -> Result<(), Status> {
        let p = self.run(offset, dest.len())?;
        // SAFETY: within the test's buffer (checked), which outlives the send.
        unsafe { std::ptr::copy_nonoverlapping(p, dest.as_mut_ptr(), dest.len()) };
        Ok(())
    }
}

impl UnpackState for BytesState {
    fn packed_size(&self) -> usize {
        self.len
    }

    fn unpack(&mut self, offset: usize, src: &[u8]) -> Result<(), Status> {
        let p = self.run(offset, src.len())?;
        // SAFETY: within the test's receive buffer (checked), which outlives the receive and
        // which nothing else writes meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), p, src.len()) };
        Ok(())
    }
}

impl GenericDatatype for BytesDatatype {
    fn start_pack(&self, buffer: *const u8, count: usize) -> Result<Box<dyn PackState>, Status> {
        Ok(Box::new(BytesState { ptr: buffer.cast_mut(), len: count }))
    }

    fn start_unpack(&self, buffer: *mut u8, count: usize) -> Result<Box<dyn UnpackState>, Status> {
        Ok(Box::new(BytesState { ptr: buffer, len: count }))
    }
}

const TAG: u64 = 0x1337_a880_0000_0000;
/// The active-message id of the AM tests (the reference's).
const AM_ID: u16 = 1;

struct Setup {
    worker: Worker,
    ep: Endpoint,
    send: PageAligned,
    recv: PageAligned,
    len: usize,
    send_iov: Vec<IoVec>,
    recv_iov: Vec<IoVec>,
    send_memh: Option<MemHandle>,
    recv_memh: Option<MemHandle>,
    /// Active messages that arrived (counted by the handler of the AM tests).
    am_arrived: Arc<AtomicUsize>,
    /// The user header of the AM tests (`-H` bytes).
    am_hdr: Vec<u8>,
    /// The datatype of `-D generic`.
    dt: Datatype,
}

impl Setup {
    fn new(spec: &UcpTestSpec<'_>, oob: &mut dyn Exchange) -> Result<Setup, String> {
        let am = spec.params.test.command() == Command::Am;
        let mut features = match spec.params.test.command() {
            Command::Am => Features::AM,
            Command::Stream => Features::STREAM,
            _ => Features::TAG,
        };
        if spec.sleep() {
            features |= Features::WAKEUP;
        }
        let ctx =
            Context::new(&ContextParams::new(features)).map_err(|e| format!("cannot create a UCP context: {e}"))?;
        let worker = Worker::new(&ctx, &WorkerParams::new("ucx-perf").thread_mode(spec.params.thread_mode))
            .map_err(|e| format!("cannot create a UCP worker: {e}"))?;
        let peer = if spec.params.loopback { worker.address().to_vec() } else { oob.exchange(worker.address())? };
        let ep = worker.ep_create(&peer).map_err(|e| format!("cannot connect to the peer: {e}"))?;
        let len: usize = spec.params.msg_sizes.iter().sum();
        let send = PageAligned::new(len.max(64))?;
        let recv = PageAligned::new(len.max(64))?;
        let iov = |base: *mut u8| {
            let mut off = 0;
            spec.params
                .msg_sizes
                .iter()
                .map(|&n| {
                    // SAFETY: offsets stay within the `len`-byte buffer.
                    let v = IoVec { buffer: unsafe { base.add(off) }, length: n };
                    off += n;
                    v
                })
                .collect::<Vec<_>>()
        };
        let (send_iov, recv_iov) = (iov(send.as_ptr()), iov(recv.as_ptr()));
        let (send_memh, recv_memh) = if spec.params.prereg {
            // SAFETY: both buffers live in `Setup` and are unmapped in its Drop before they go.
            unsafe {
                (
                    Some(worker.mem_map(send.as_ptr(), len.max(64)).map_err(|e| format!("mem_map: {e}"))?),
                    Some(worker.mem_map(recv.as_ptr(), len.max(64)).map_err(|e| format!("mem_map: {e}"))?),
                )
            }
        } else {
            (None, None)
        };
        let am_arrived = Arc::new(AtomicUsize::new(0));
        let am_hdr = vec![0u8; if am { spec.params.ucp_am_hdr_size } else { 0 }];
        if am {
            if am_hdr.len() > worker.am_max_header() {
                return Err(format!(
                    "AM header size ({}) is larger than the largest one ({})",
                    am_hdr.len(),
                    worker.am_max_header()
                ));
            }
            let n = am_arrived.clone();
            // A rendezvous message's data goes into the receive buffer, and counts once it is
            // there (the reference's `am_rndv_recv` and `am_data_recv_cb`).
            let (rbuf, rlen) = (recv.as_ptr() as usize, len);
            let generic = spec.recv_generic().then(|| Datatype::generic(BytesDatatype));
            let handler = move |m: &mut AmMsg<'_>| {
                if m.is_rndv() {
                    let (Some(w), Some(d)) = (m.worker(), m.take_rndv()) else { return };
                    // SAFETY: the receive buffer is `rlen` bytes and lives in `Setup` with the
                    // worker; receives complete before the test ends (`drain` waits for the
                    // count), and nothing else writes it meanwhile.
                    let buf = unsafe { std::slice::from_raw_parts_mut(rbuf as *mut u8, rlen) };
                    let data = match &generic {
                        Some(dt) => RecvData::Generic(&GenericBuf::recv(dt, buf.as_mut_ptr(), rlen)),
                        None => RecvData::Contig(buf),
                    };
                    let p = RequestParam::new().callback_fn(am_rndv_done, Arc::as_ptr(&n) as usize);
                    // SAFETY: as above.
                    if let Err(e) = unsafe { w.am_recv_data_nbx(d, data, p) } {
                        eprintln!("ucx-perf: am_recv_data_nbx failed: {e}");
                    }
                    return;
                }
                // Single-threaded: a plain increment (no locked instruction), as the reference's.
                n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
            };
            worker
                .set_am_recv_handler(AM_ID, Some(handler), AmHandlerFlags::WHOLE_MSG)
                .map_err(|e| format!("cannot set the AM handler: {e}"))?;
        }
        let dt = Datatype::generic(BytesDatatype);
        Ok(Setup { worker, ep, send, recv, len, send_iov, recv_iov, send_memh, recv_memh, am_arrived, am_hdr, dt })
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        for h in [self.send_memh.take(), self.recv_memh.take()].into_iter().flatten() {
            let _ = self.worker.mem_unmap(h);
        }
    }
}

/// The completion of a rendezvous active message's data: one more arrived (`user_data` is the
/// address of the setup's arrival counter, which outlives every receive).
fn am_rndv_done(status: Status, _info: ucp::RecvInfo, user_data: usize) {
    if status.is_err() {
        eprintln!("ucx-perf: a rendezvous active message failed: {status}");
    }
    // SAFETY: `user_data` is `Arc::as_ptr` of the counter `Setup` holds until the end.
    let n = unsafe { &*(user_data as *const AtomicUsize) };
    n.store(n.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// Outstanding operations of one kind, counted down by the completion callback (as the
/// reference does), and the first error seen.
#[derive(Default)]
pub(crate) struct Outstanding {
    pub(crate) count: Cell<usize>,
    pub(crate) error: Cell<Option<Status>>,
    /// Bytes the stream receives counted by [`stream_received`] delivered.
    pub(crate) bytes: Cell<usize>,
}

/// The completion callback: `user_data` is the address of an [`Outstanding`].
pub(crate) fn completed(status: Status, _info: ucp::RecvInfo, user_data: usize) {
    // SAFETY: `user_data` is the address of an `Outstanding` inside a test's engine (tag or
    // RMA), which outlives every request it posted (its `drain` waits for all of them), and
    // callbacks run on this (the only) thread from `progress`.
    let o = unsafe { &*(user_data as *const Outstanding) };
    // Wrapping: a callback that ran inside the call comes before the caller's count of the
    // operation (`started`), which brings the count back at once.
    o.count.set(o.count.get().wrapping_sub(1));
    if status.is_err() && o.error.get().is_none() {
        o.error.set(Some(status));
    }
}

/// The completion callback of a detached stream receive: [`completed`], and the bytes it
/// received added to the [`Outstanding`]'s `bytes`.
pub(crate) fn stream_received(status: Status, info: ucp::RecvInfo, user_data: usize) {
    // SAFETY: as in `completed`.
    let o = unsafe { &*(user_data as *const Outstanding) };
    o.bytes.set(o.bytes.get() + info.length);
    completed(status, info, user_data);
}

/// What the per-message code of a test reads, from the parameters once.
#[derive(Clone, Copy)]
struct Hot {
    sync: bool,
    am: bool,
    stream: bool,
    /// `-r recv_data`.
    stream_data: bool,
    send_iov: bool,
    recv_iov: bool,
    send_generic: bool,
    recv_generic: bool,
    sleep: bool,
    force_unexpected: bool,
    loopback: bool,
    index: u8,
    /// `-O`, resolved.
    max: usize,
}

impl Hot {
    fn of(spec: &UcpTestSpec<'_>) -> Hot {
        let p = spec.params;
        Hot {
            sync: p.test.command() == Command::TagSync,
            am: p.test.command() == Command::Am,
            stream: p.test.command() == Command::Stream,
            stream_data: p.stream_recv_data,
            send_iov: spec.send_iov(),
            recv_iov: spec.recv_iov(),
            send_generic: spec.send_generic(),
            recv_generic: spec.recv_generic(),
            sleep: spec.sleep(),
            force_unexpected: p.force_unexpected,
            loopback: p.loopback,
            index: spec.index,
            max: p.max_outstanding.max(1) as usize,
        }
    }
}

/// One side's engine.
struct Engine<'a> {
    s: &'a Setup,
    h: Hot,
    sends: Box<Outstanding>,
    recvs: Box<Outstanding>,
    mask: u64,
    /// The first failure of a wait on the worker's events (`-E sleep`).
    wait_error: Cell<Option<Status>>,
    /// Active messages received so far (waited for) in the AM tests.
    am_expected: usize,
}

impl<'a> Engine<'a> {
    fn param(&self, memh: Option<MemHandle>, o: &Outstanding) -> RequestParam {
        let p = RequestParam::new().callback_fn(completed, o as *const Outstanding as usize);
        match memh {
            Some(m) => p.memh(m),
            None => p,
        }
    }

    fn check(&self) -> Result<(), String> {
        if let Some(e) = self.sends.error.get() {
            return Err(format!("send failed: {e}"));
        }
        if let Some(e) = self.recvs.error.get() {
            return Err(format!("receive failed: {e}"));
        }
        if let Some(e) = self.wait_error.get() {
            return Err(format!("waiting for worker events failed: {e}"));
        }
        Ok(())
    }

    /// One progress call; with `-E sleep`, one that found nothing sleeps until an event.
    #[inline]
    fn progress(&self) {
        if self.s.worker.progress() == 0 && self.h.sleep {
            if let Err(e) = self.s.worker.wait() {
                self.wait_error.set(self.wait_error.get().or(Some(e)));
            }
        }
    }

    /// Waits until fewer than `limit` operations of `o` (sends or receives) are outstanding.
    #[inline]
    fn wait_below(&self, o: &Outstanding, limit: usize) -> Result<(), String> {
        if o.count.get() >= limit {
            self.wait(o, limit)?;
        }
        Ok(())
    }

    /// Progresses until fewer than `limit` operations of `o` are outstanding, then reports the
    /// first error seen. Errors are checked only after a wait, off the path of an operation
    /// that completed at once; one reported by a callback that ran inside a send or receive
    /// call is caught by the next wait or by [`Self::drain`].
    #[inline(never)]
    fn wait(&self, o: &Outstanding, limit: usize) -> Result<(), String> {
        while o.count.get() >= limit {
            self.progress();
        }
        self.check()
    }

    /// An operation did not complete at once: count it until its callback reports it (as the
    /// reference does, which frees the request in the callback; ours have no handle at all).
    #[inline]
    fn started(o: &Outstanding) {
        o.count.set(o.count.get().wrapping_add(1));
    }

    #[inline]
    fn send(&mut self) -> Result<(), String> {
        let max = self.h.max;
        self.wait_below(&self.sends, max)?;
        let data = if self.h.send_iov {
            SendData::Iov(&self.s.send_iov)
        } else if self.h.send_generic {
            SendData::Generic(&GenericBuf::send(&self.s.dt, self.s.send.as_ptr(), self.s.len))
        } else {
            // SAFETY: the buffer is `len` bytes and lives in `Setup`.
            SendData::Contig(unsafe { std::slice::from_raw_parts(self.s.send.as_ptr(), self.s.len) })
        };
        let param = self.param(self.s.send_memh, &self.sends);
        // SAFETY: the send buffer and the header live in `Setup`, beyond every request (all
        // are waited for before `Setup` goes).
        let done = unsafe {
            if self.h.am {
                self.s.ep.am_send_nbx_detached(AM_ID, &self.s.am_hdr, data, AmSendFlags::empty(), param)
            } else if self.h.stream {
                self.s.ep.stream_send_nbx_detached(data, param)
            } else if self.h.sync {
                self.s.ep.tag_send_sync_nbx_detached(data, TAG, param)
            } else {
                self.s.ep.tag_send_nbx_detached(data, TAG, param)
            }
        }
        .map_err(|e| format!("send failed: {e}"))?;
        if !done {
            Self::started(&self.sends);
        }
        Ok(())
    }

    /// Active messages that arrived and were not yet waited for.
    #[inline]
    fn am_pending(&self) -> usize {
        self.am_expected.wrapping_sub(self.s.am_arrived.load(Ordering::Relaxed))
    }

    /// An active-message "receive": waits until fewer than `limit` expected messages are yet
    /// to arrive (`recv_started` and the handler's `recv_completed` in the reference).
    #[inline]
    fn am_wait(&self, limit: usize) -> Result<(), String> {
        while (self.am_pending() as isize) >= limit as isize {
            self.progress();
        }
        self.check()
    }

    /// A stream "receive": the iteration's bytes, into the receive buffer or as pieces
    /// released at once (`-r recv_data`), as the reference's `recv_stream`/`recv_stream_data`.
    #[inline(never)]
    fn stream_recv(&mut self) -> Result<(), String> {
        let len = self.s.len;
        let mut total = 0;
        if self.h.stream_data {
            // Bytes past this iteration's count toward it, as the reference counts them.
            while total < len {
                self.progress();
                if let Some(d) = self.s.ep.stream_recv_data_nb().map_err(|e| format!("receive failed: {e}"))? {
                    total += d.len();
                }
            }
            return Ok(());
        }
        while total < len {
            // SAFETY: the buffer is `len` bytes, lives in `Setup`, and only the worker writes
            // it while the receive is outstanding (waited for below).
            let buf = unsafe { std::slice::from_raw_parts_mut(self.s.recv.as_ptr().add(total), len - total) };
            let data = if self.h.recv_generic {
                RecvData::Generic(&GenericBuf::recv(&self.s.dt, buf.as_mut_ptr(), buf.len()))
            } else {
                RecvData::Contig(buf)
            };
            // Detached, as the tag tests' receives (the reference polls a request it then
            // frees; here the callback reports the completion and its length).
            let o: &Outstanding = &self.recvs;
            o.bytes.set(0);
            let param = RequestParam::new().callback_fn(stream_received, o as *const Outstanding as usize);
            // SAFETY: as above; the receive completes before the next one is posted, and
            // `recvs` (boxed in the engine) outlives it.
            let r = unsafe { self.s.ep.stream_recv_nbx_detached(data, StreamRecvFlags::empty(), param) }
                .map_err(|e| format!("receive failed: {e}"))?;
            total += match r {
                Some(i) => i.length,
                None => {
                    Self::started(o);
                    self.wait(o, 1)?;
                    o.bytes.get()
                }
            };
        }
        self.check()
    }

    #[inline]
    fn recv(&mut self) -> Result<(), String> {
        let max = self.h.max;
        if self.h.stream {
            return self.stream_recv();
        }
        if self.h.am {
            self.am_wait(max)?;
            self.am_expected += 1;
            return Ok(());
        }
        self.wait_below(&self.recvs, max)?;
        if self.h.force_unexpected {
            while self.s.worker.tag_probe(TAG, self.mask, false).is_none() {
                self.progress();
            }
        }
        let data = if self.h.recv_iov {
            RecvData::Iov(&self.s.recv_iov)
        } else if self.h.recv_generic {
            RecvData::Generic(&GenericBuf::recv(&self.s.dt, self.s.recv.as_ptr(), self.s.len))
        } else {
            // SAFETY: the buffer is `len` bytes, lives in `Setup`, and only the worker writes
            // it while receives are outstanding.
            RecvData::Contig(unsafe { std::slice::from_raw_parts_mut(self.s.recv.as_ptr(), self.s.len) })
        };
        let param = self.param(self.s.recv_memh, &self.recvs);
        // SAFETY: as above; every receive is waited for before `Setup` goes.
        let done = unsafe { self.s.worker.tag_recv_nbx_detached(data, TAG, self.mask, param) }
            .map_err(|e| format!("receive failed: {e}"))?;
        if done.is_none() {
            Self::started(&self.recvs);
        }
        Ok(())
    }

    /// Waits for every operation, then reports the first error any had (one that completed
    /// inside a send or receive call has not been checked yet).
    fn drain(&mut self) -> Result<(), String> {
        self.wait_below(&self.sends, 1)?;
        self.wait_below(&self.recvs, 1)?;
        if self.h.am {
            self.am_wait(1)?;
        }
        self.check()
    }

    /// Waits for the receive of this iteration (ping-pong).
    #[inline]
    fn recv_wait(&self) -> Result<(), String> {
        if self.h.am {
            return self.am_wait(1);
        }
        self.wait_below(&self.recvs, 1)
    }

    fn pingpong(&mut self, meter: &mut Meter, rep: &mut dyn FnMut(&Measured)) -> Result<(), String> {
        let len = self.s.len as u64;
        if self.h.loopback || self.h.index == 0 {
            while !meter.done() {
                self.send()?;
                self.recv()?;
                self.recv_wait()?;
                if meter.update(1, len) {
                    rep(&meter.measure(true));
                }
            }
        } else {
            while !meter.done() {
                self.recv()?;
                self.recv_wait()?;
                self.send()?;
                if meter.update(1, len) {
                    rep(&meter.measure(true));
                }
            }
        }
        self.drain()
    }

    fn stream(&mut self, meter: &mut Meter, rep: &mut dyn FnMut(&Measured)) -> Result<(), String> {
        let len = self.s.len as u64;
        if self.h.loopback {
            while !meter.done() {
                self.send()?;
                self.recv()?;
                if meter.update(1, len) {
                    rep(&meter.measure(true));
                }
            }
        } else if self.h.index == 0 {
            while !meter.done() {
                self.recv()?;
                if meter.update(1, len) {
                    rep(&meter.measure(true));
                }
            }
        } else {
            while !meter.done() {
                self.send()?;
                if meter.update(1, len) {
                    rep(&meter.measure(true));
                }
            }
        }
        self.drain()
    }
}

/// Runs a test: warm-up, then the measured run; `report(m, final)` gets progress rows and the
/// final figures.
pub fn run(
    spec: &UcpTestSpec<'_>,
    oob: &mut dyn Exchange,
    report: &mut dyn FnMut(&Measured, bool),
) -> Result<(), String> {
    if !matches!(spec.params.test.command(), Command::Tag | Command::TagSync | Command::Am | Command::Stream) {
        return crate::ucp_rma_tests::run(spec, oob, report);
    }
    let s = Setup::new(spec, oob)?;
    let sync = |oob: &mut dyn Exchange, s: &Setup| {
        oob.barrier(&mut || {
            s.worker.progress();
        })
    };
    let mask = if spec.params.wildcard { 0 } else { FULL_MASK };
    for_each_run(spec.params.warmup, spec.params.iters_limit(), oob, &mut |oob, iters, measured| {
        sync(oob, &s)?;
        let mut e = Engine {
            s: &s,
            h: Hot::of(spec),
            sends: Box::default(),
            recvs: Box::default(),
            mask,
            wait_error: Cell::new(None),
            am_expected: s.am_arrived.load(Ordering::Relaxed),
        };
        let mut meter = Meter::new(iters, spec.params.percentile, spec.pingpong());
        meter.start();
        let mut rep = |m: &Measured| {
            if measured {
                report(m, false)
            }
        };
        if spec.pingpong() {
            e.pingpong(&mut meter, &mut rep)?;
        } else {
            e.stream(&mut meter, &mut rep)?;
        }
        meter.stop();
        drop(e);
        let m = meter.measure(true);
        sync(oob, &s)?;
        if measured {
            report(&m, true);
        }
        Ok(())
    })?;
    // Let the peer finish its last sends before the endpoint goes.
    sync(oob, &s)?;
    print_offload(&s.worker.proto_counts());
    Ok(())
}

/// Prints what went through a transport's tag matching (tag offload), if anything did: on
/// `stderr`, after the report, so the report's lines stay what the reference prints.
fn print_offload(c: &ucp::ProtoCounts) {
    let sent = c.offload_eager + c.offload_sw_rndv + c.offload_hw_rndv;
    let arrived = c.offload_rx_eager + c.offload_rx_sw_rndv + c.offload_rx_hw_rndv;
    if sent + arrived + c.offload_posted == 0 {
        return;
    }
    eprintln!(
        "# tag offload: sent through the tag lane {sent} (eager {}, rendezvous offloaded {}, software requests {}); \
         receives posted to the transport {} (with a bounce buffer {}, pushed by a larger one {}), \
         matched there {}, taken back by software {}, refused {}; arrived unmatched through it {arrived}",
        c.offload_eager,
        c.offload_hw_rndv,
        c.offload_sw_rndv,
        c.offload_posted,
        c.offload_bounce,
        c.offload_forced,
        c.offload_matched,
        c.offload_sw_matched,
        c.offload_refused
    );
}
