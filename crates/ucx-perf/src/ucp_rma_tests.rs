//! The UCP remote-memory-access and atomic tests (`ucp_put_lat`, `ucp_put_bw`, `ucp_get`,
//! `ucp_add`, `ucp_fadd`, `ucp_swap`, `ucp_cswap`) with the algorithms of `ucx_perftest`:
//!
//! * both sides allocate their buffers with `mem_map_alloc` (the reference maps them with
//!   `UCP_MEM_MAP_ALLOCATE`: over shared memory, segments the peer stores into directly) and
//!   exchange the receive buffer's address and packed key;
//! * ping-pong (`ucp_put_lat`): side 0 writes sequence number `sn` into the last byte of its
//!   message, puts it into the peer's receive buffer and waits for the peer's put to bring `sn`
//!   back into its own; side 1 does the opposite; latency is half the round trip;
//! * unidirectional stream (the others): side 1 issues the operation as fast as the window
//!   (`-O`) lets it - puts of the message, gets into its send buffer, 4- or 8-byte atomics
//!   (`-s 4|8`) on the first word of the peer's receive buffer - then fences and puts a
//!   sentinel past the message, which side 0, progressing meanwhile (emulated operations need
//!   the target's progress), waits for.
//!
//! Loopback (`-l`): one worker with an endpoint to itself, targeting its own receive buffer.

use ucp::{
    AtomicOp, Context, ContextParams, Endpoint, Features, MemHandle, Operand, RecvData, RemoteKey, RequestParam,
    SendData, Status, Worker, WorkerParams,
};

use crate::meter::{Measured, Meter};
use crate::params::{Command, WaitMode};
use crate::ucp_tests::{completed, Outstanding, UcpTestSpec};
use crate::uct_tests::{for_each_run, Exchange};

/// The sentinel that ends a stream, put at [`SENTINEL_AT`] bytes past the message.
const SENTINEL: u8 = 0xa5;
const SENTINEL_AT: usize = 8;
/// Bytes the buffers have past the message (the sentinel's room).
const TAIL: usize = 64;

struct Setup {
    worker: Worker,
    ep: Endpoint,
    send: MemHandle,
    recv: MemHandle,
    len: usize,
    /// The peer's receive buffer.
    remote: u64,
    key: RemoteKey,
}

impl Setup {
    fn new(spec: &UcpTestSpec<'_>, oob: &mut dyn Exchange, len: usize) -> Result<Setup, String> {
        let mut features = Features::RMA | Features::AMO32 | Features::AMO64;
        if spec.params.wait_mode == Some(WaitMode::Sleep) {
            features |= Features::WAKEUP;
        }
        let ctx =
            Context::new(&ContextParams::new(features)).map_err(|e| format!("cannot create a UCP context: {e}"))?;
        let worker = Worker::new(&ctx, &WorkerParams::new("ucx-perf").thread_mode(spec.params.thread_mode))
            .map_err(|e| format!("cannot create a UCP worker: {e}"))?;
        let peer = if spec.params.loopback { worker.address().to_vec() } else { oob.exchange(worker.address())? };
        let ep = worker.ep_create(&peer).map_err(|e| format!("cannot connect to the peer: {e}"))?;
        let map = |what| worker.mem_map_alloc(len + TAIL).map_err(|e| format!("cannot map the {what} buffer: {e}"));
        let (send, recv) = (map("send")?, map("receive")?);
        let mut blob = (recv.address as u64).to_le_bytes().to_vec();
        blob.extend(worker.rkey_pack(&recv).map_err(|e| format!("rkey_pack: {e}"))?);
        let theirs = if spec.params.loopback { blob } else { oob.exchange(&blob)? };
        let (addr, packed) = theirs.split_at_checked(8).ok_or("the peer sent no remote key")?;
        let remote = u64::from_le_bytes(addr.try_into().map_err(|_| "bad remote address")?);
        let key = ep.rkey_unpack(packed).map_err(|e| format!("cannot unpack the peer's remote key: {e}"))?;
        Ok(Setup { worker, ep, send, recv, len, remote, key })
    }

    fn byte(h: &MemHandle, at: usize) -> *mut u8 {
        (h.address + at) as *mut u8
    }

    /// Reads a byte of our receive buffer, which the peer writes.
    #[inline(always)]
    fn recv_byte(&self, at: usize) -> u8 {
        // SAFETY: `at < len + TAIL`, within the mapped buffer; the peer's stores to it are
        // seen by a volatile read.
        unsafe { Self::byte(&self.recv, at).read_volatile() }
    }

    fn zero(&self) {
        for h in [&self.send, &self.recv] {
            // SAFETY: the whole mapped buffer; no operation targets it between runs.
            unsafe { std::ptr::write_bytes(h.address as *mut u8, 0, h.length) }
        }
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = self.worker.mem_unmap(self.send);
        let _ = self.worker.mem_unmap(self.recv);
    }
}

struct Engine<'a> {
    s: &'a Setup,
    cmd: Command,
    max: usize,
    sleep: bool,
    ops: Box<Outstanding>,
    /// The operand of atomics.
    operand: Operand,
}

impl Engine<'_> {
    /// One progress call; with `-E sleep`, one that found nothing sleeps until an event or
    /// for at most a millisecond: a peer's put or atomic on our memory raises no event, so the
    /// responder waiting for the sentinel also looks at its memory between sleeps.
    #[inline]
    fn progress(&self) {
        if self.s.worker.progress() == 0 && self.sleep {
            let _ = self.s.worker.wait_timeout(Some(std::time::Duration::from_millis(1)));
        }
    }

    fn param(&self) -> RequestParam {
        RequestParam::new().callback_fn(completed, &*self.ops as *const Outstanding as usize)
    }

    fn check(&self) -> Result<(), String> {
        match self.ops.error.get() {
            Some(e) => Err(format!("{} failed: {e}", self.cmd_name())),
            None => Ok(()),
        }
    }

    fn cmd_name(&self) -> &'static str {
        match self.cmd {
            Command::Put => "put",
            Command::Get => "get",
            _ => "atomic",
        }
    }

    #[inline]
    fn wait_below(&self, limit: usize) -> Result<(), String> {
        if self.ops.count.get() >= limit {
            while self.ops.count.get() >= limit {
                self.progress();
            }
            self.check()?;
        }
        Ok(())
    }

    /// One operation of the test's kind.
    #[inline]
    fn op(&self) -> Result<(), String> {
        self.op_as(self.cmd)
    }

    /// One operation of kind `cmd` (a constant where the stream loop is specialized).
    #[inline(always)]
    fn op_as(&self, cmd: Command) -> Result<(), String> {
        self.wait_below(self.max)?;
        let s = self.s;
        let (remote, key) = (s.remote, &s.key);
        // SAFETY: the buffers are mapped for the whole test and every operation is waited for
        // (`drain`) before they go; the send buffer is the source of puts and the destination of
        // gets and replies, which nothing else touches during a run.
        let r = unsafe {
            match cmd {
                Command::Put => s.ep.put_nbx(
                    SendData::Contig(std::slice::from_raw_parts(s.send.address as *const u8, s.len)),
                    remote,
                    key,
                    self.param(),
                ),
                Command::Get => s.ep.get_nbx(
                    RecvData::Contig(std::slice::from_raw_parts_mut(s.send.address as *mut u8, s.len)),
                    remote,
                    key,
                    self.param(),
                ),
                cmd => {
                    let op = match cmd {
                        Command::Add => AtomicOp::Add,
                        Command::Fadd => AtomicOp::Fadd,
                        Command::Swap => AtomicOp::Swap,
                        _ => AtomicOp::Cswap,
                    };
                    let reply = op.fetches().then_some(s.send.address as *mut u8);
                    s.ep.atomic_op_nbx(op, self.operand, remote, key, reply, self.param())
                }
            }
        };
        match r {
            Ok(None) => Ok(()),
            Ok(Some(req)) => {
                // Counted until the callback reports it; the handle goes now (the callback
                // still runs), as the reference frees its requests.
                self.ops.count.set(self.ops.count.get().wrapping_add(1));
                drop(req);
                Ok(())
            }
            Err(e) => Err(format!("{} failed: {e}", self.cmd_name())),
        }
    }

    fn drain(&self) -> Result<(), String> {
        self.wait_below(1)?;
        self.check()
    }

    /// The sender's end of a stream: after a fence, the sentinel into the peer's buffer.
    fn send_sentinel(&self) -> Result<(), String> {
        let s = self.s;
        s.worker.fence().map_err(|e| format!("fence: {e}"))?;
        let byte = [SENTINEL];
        // SAFETY: `byte` outlives the request (drained below).
        let r = unsafe {
            s.ep.put_nbx(SendData::Contig(&byte), s.remote + (s.len + SENTINEL_AT) as u64, &s.key, self.param())
        };
        match r {
            Ok(None) => {}
            Ok(Some(req)) => {
                self.ops.count.set(self.ops.count.get().wrapping_add(1));
                drop(req);
            }
            Err(e) => return Err(format!("put of the sentinel failed: {e}")),
        }
        self.drain()
    }

    fn flush(&self) -> Result<(), String> {
        let r = self.s.worker.flush_nbx(RequestParam::new()).map_err(|e| format!("flush: {e}"))?;
        if let Some(r) = r {
            while !r.is_completed() {
                self.progress();
            }
            if r.status() != Status::Ok {
                return Err(format!("flush: {}", r.status()));
            }
        }
        Ok(())
    }

    fn pingpong(&self, meter: &mut Meter, side0: bool, rep: &mut dyn FnMut(&Measured)) -> Result<(), String> {
        let s = self.s;
        let last = s.len - 1;
        let mut sn: u8 = 1;
        let put = |sn: u8| -> Result<(), String> {
            // SAFETY: the last byte of our send buffer, which only we write.
            unsafe { Setup::byte(&s.send, last).write_volatile(sn) };
            self.op()
        };
        let wait = |sn: u8| {
            let mut polls = 0u32;
            while s.recv_byte(last) != sn {
                polls = polls.wrapping_add(1);
                if polls % 2 == 0 {
                    self.progress();
                } else {
                    std::hint::spin_loop();
                }
            }
        };
        let len = s.len as u64;
        while !meter.done() {
            if side0 {
                put(sn)?;
                wait(sn);
            } else {
                wait(sn);
                put(sn)?;
            }
            if meter.update(1, len) {
                rep(&meter.measure(true));
            }
            sn = if sn == 255 { 1 } else { sn + 1 };
        }
        self.drain()
    }

    /// The sender's operations of a stream, all of kind `cmd`.
    #[inline(always)]
    fn send_all(&self, meter: &mut Meter, rep: &mut dyn FnMut(&Measured), cmd: Command) -> Result<(), String> {
        let len = self.s.len as u64;
        while !meter.done() {
            self.op_as(cmd)?;
            if meter.update(1, len) {
                rep(&meter.measure(true));
            }
        }
        Ok(())
    }

    fn stream(
        &self,
        meter: &mut Meter,
        sender: bool,
        loopback: bool,
        rep: &mut dyn FnMut(&Measured),
    ) -> Result<(), String> {
        let s = self.s;
        if sender {
            // One loop per kind of operation, so that none decides its kind per operation.
            match self.cmd {
                Command::Put => self.send_all(meter, rep, Command::Put)?,
                Command::Get => self.send_all(meter, rep, Command::Get)?,
                Command::Add => self.send_all(meter, rep, Command::Add)?,
                Command::Fadd => self.send_all(meter, rep, Command::Fadd)?,
                Command::Swap => self.send_all(meter, rep, Command::Swap)?,
                _ => self.send_all(meter, rep, Command::Cswap)?,
            }
            self.send_sentinel()?;
            if !loopback {
                return Ok(());
            }
        }
        // The responder (or a loopback run, after its operations): progress until the
        // sentinel is there, looking every 16th call (a read pulls the line the sender's
        // operations target away from it).
        let mut spins = 0u32;
        loop {
            self.progress();
            spins = spins.wrapping_add(1);
            if spins % 16 == 0 && s.recv_byte(s.len + SENTINEL_AT) == SENTINEL {
                break;
            }
        }
        // SAFETY: our own buffer, which the sender no longer writes in this run.
        unsafe { Setup::byte(&s.recv, s.len + SENTINEL_AT).write_volatile(0) };
        Ok(())
    }
}

/// The message length of a test, checked: 4 or 8 bytes for atomics, at least 1 for put
/// ping-pong (its last byte carries the sequence number).
fn length(spec: &UcpTestSpec<'_>) -> Result<(usize, Operand), String> {
    let len: usize = spec.params.msg_sizes.iter().sum();
    let cmd = spec.params.test.command();
    if matches!(cmd, Command::Add | Command::Fadd | Command::Swap | Command::Cswap) {
        return match len {
            4 => Ok((4, Operand::U32(1))),
            8 => Ok((8, Operand::U64(1))),
            _ => Err(format!("atomic tests take -s 4 or -s 8, not {len}")),
        };
    }
    if len == 0 {
        return Err("message size must be at least 1 byte".into());
    }
    Ok((len, Operand::U64(1)))
}

/// Runs a test: warm-up, then the measured run; `report(m, final)` gets progress rows and the
/// final figures.
pub fn run(
    spec: &UcpTestSpec<'_>,
    oob: &mut dyn Exchange,
    report: &mut dyn FnMut(&Measured, bool),
) -> Result<(), String> {
    let (len, operand) = length(spec)?;
    let p = spec.params;
    let s = Setup::new(spec, oob, len)?;
    let sync = |oob: &mut dyn Exchange, s: &Setup| {
        oob.barrier(&mut || {
            s.worker.progress();
        })
    };
    let pingpong = p.is_pingpong();
    for_each_run(p.warmup, p.iters_limit(), oob, &mut |oob, iters, measured| {
        s.zero();
        sync(oob, &s)?;
        let e = Engine {
            s: &s,
            cmd: p.test.command(),
            max: p.max_outstanding.max(1) as usize,
            sleep: p.wait_mode == Some(WaitMode::Sleep),
            ops: Box::default(),
            operand,
        };
        let mut meter = Meter::new(iters, p.percentile, pingpong);
        meter.start();
        let mut rep = |m: &Measured| {
            if measured {
                report(m, false)
            }
        };
        if pingpong {
            e.pingpong(&mut meter, p.loopback || spec.index == 0, &mut rep)?;
        } else {
            e.stream(&mut meter, p.loopback || spec.index == 1, p.loopback, &mut rep)?;
        }
        meter.stop();
        e.flush()?;
        let m = meter.measure(true);
        sync(oob, &s)?;
        if measured {
            report(&m, true);
        }
        Ok(())
    })?;
    sync(oob, &s)?;
    Ok(())
}
