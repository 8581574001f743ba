//! The receiving side of a check: in this process ([`LocalPeer`]) or in another process
//! ([`RemotePeer`]) that runs [`serve_agent`] and obeys a line protocol on its stdin/stdout.
//!
//! The checks talk to the receiver only through the [`Peer`] trait, so every check runs both
//! ways. The agent is a [`LocalPeer`] driven by commands: one request line, one answer line.
//! Between commands the agent progresses its worker; before answering it progresses until idle,
//! so an answer reflects every message that arrived before the command was sent.

use std::cell::{Cell, RefCell};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use ucs::{Outcome, Status, UcsResult};

use crate::{
    find_resource, AmDesc, AmRecv, Ep, EpParams, Iface, IfaceParams, Iov, MdFlags, MemAccess, MemH, ProgressFlags,
    TagHandlers, TagRecvContext, Worker, AM_ID_MAX,
};

/// Prefix of the agent's answer lines (other output on stdout, e.g. the test harness's, is
/// skipped).
const ANSWER: &str = "KIT< ";

/// How the agent (or a test harness) is started: a program with arguments and environment.
#[derive(Clone, Debug)]
pub struct AgentCommand {
    /// Executable.
    pub program: std::path::PathBuf,
    /// Arguments.
    pub args: Vec<String>,
    /// Extra environment.
    pub env: Vec<(String, String)>,
}

impl AgentCommand {
    /// Runs `program` (normally a test package's agent binary, found through Cargo's
    /// `CARGO_BIN_EXE_<name>`), which registers its transports and calls [`serve_agent`].
    pub fn program(program: impl Into<std::path::PathBuf>) -> Self {
        AgentCommand { program: program.into(), args: Vec::new(), env: Vec::new() }
    }

    /// Adds an argument.
    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }

    /// Adds an environment variable.
    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }
}

/// What a handler does with the messages of one active message id.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Listen {
    /// Keep the descriptors of the first this many messages.
    pub keep_first: usize,
    /// Reply to each message with an `am_short` on this id (header: the message's first 8
    /// bytes + 1000, payload `reply`) through the reply endpoint.
    pub reply: Option<u8>,
}

/// A remote-accessible region on the receiving side.
#[derive(Clone, Debug)]
pub(crate) struct RegionInfo {
    pub id: u32,
    pub packed: Vec<u8>,
    pub registered_heap: bool,
}

/// What a receive posted to tag matching reported through its context's callbacks.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct TagReport {
    /// `tag_consumed` ran.
    pub consumed: bool,
    /// Callbacks run in all (`tag_consumed` included).
    pub calls: usize,
    /// `tag_consumed` ran before `completed` or `rndv` (or neither has run).
    pub consumed_first: bool,
    /// `completed`: sender tag, immediate value, length, status.
    pub completed: Option<(u64, u64, usize, Status)>,
    /// `rndv`: sender tag and the request's header.
    pub rndv: Option<(u64, Vec<u8>)>,
}

/// A tagged message the receiver's unexpected handlers got.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TagUnexp {
    Eager { stag: u64, imm: u64, data: Vec<u8> },
    Rndv { stag: u64, header: Vec<u8>, remote_addr: u64, length: usize, rkey: Vec<u8> },
}

/// Where the kit's tag handlers put what they get.
pub(crate) type TagSink = Rc<RefCell<Vec<TagUnexp>>>;

/// Tag-offload handlers that record every unexpected message into `sink`.
pub(crate) fn kit_tag_handlers(sink: &TagSink) -> TagHandlers {
    let (e, r) = (sink.clone(), sink.clone());
    TagHandlers {
        eager: Rc::new(move |m| {
            e.borrow_mut().push(TagUnexp::Eager { stag: m.stag, imm: m.imm, data: m.msg.data().to_vec() })
        }),
        rndv: Rc::new(move |m| {
            r.borrow_mut().push(TagUnexp::Rndv {
                stag: m.stag,
                header: m.header.to_vec(),
                remote_addr: m.remote_addr,
                length: m.length,
                rkey: m.rkey_buf.to_vec(),
            })
        }),
    }
}

/// The receiving side of a pair.
pub(crate) trait Peer {
    fn is_remote(&self) -> bool;
    fn device_address(&self) -> Vec<u8>;
    fn iface_address(&self) -> Vec<u8>;
    /// Installs a collecting handler on `id` (errors as `set_am_handler`).
    fn listen(&self, id: u8, how: Listen) -> UcsResult<()>;
    /// Removes the handler of `id`.
    fn unlisten(&self, id: u8) -> UcsResult<()>;
    /// Messages received on `id` since `listen`.
    fn count(&self, id: u8) -> usize;
    /// Drains the messages collected on `id`.
    fn take(&self, id: u8) -> Vec<Vec<u8>>;
    /// Replies that found no resources.
    fn reply_failures(&self) -> usize;
    /// Contents of the kept descriptors, oldest first.
    fn kept(&self) -> Vec<Vec<u8>>;
    /// Releases kept descriptors beyond the first `keep`.
    fn release_kept(&self, keep: usize);
    /// While on, every message's descriptor is kept (remote: and the agent stops progressing,
    /// so its receive resources fill up). Off releases them all.
    fn hold(&self, on: bool);
    /// Where replies go: an interface address (to-iface transports).
    fn reply_to(&self, dev: &[u8], iface: &[u8]) -> UcsResult<()>;
    /// Creates a to-ep endpoint; returns its index and address.
    fn ep_create(&self) -> UcsResult<(usize, Vec<u8>)>;
    /// Connects the to-ep endpoint `idx` to a peer endpoint.
    fn ep_connect(&self, idx: usize, dev: &[u8], ep: &[u8]) -> UcsResult<()>;
    fn region(&self, len: usize) -> UcsResult<RegionInfo>;
    fn read(&self, id: u32, off: usize, len: usize) -> Vec<u8>;
    fn write(&self, id: u32, off: usize, data: &[u8]);
    fn guards_intact(&self, id: u32) -> bool;
    fn deregister(&self, id: u32);
    fn free(&self, id: u32);
    /// Closes the interface (kept descriptors stay).
    fn close(&self);
    /// Kills the peer process (remote only).
    fn kill(&self);
    /// Posts a receive for `tag`/`mask` to tag matching into `len` bytes at `off` of region
    /// `region` (`tag_recv_zcopy`); returns the receive's number.
    fn tag_post(&self, tag: u64, mask: u64, region: u32, off: usize, len: usize) -> UcsResult<u32>;
    /// `tag_recv_cancel` of receive `recv`.
    fn tag_cancel(&self, recv: u32, force: bool) -> UcsResult<()>;
    /// What receive `recv` reported so far.
    fn tag_report(&self, recv: u32) -> TagReport;
    /// Drains the unexpected tagged messages received so far.
    fn tag_unexpected(&self) -> Vec<TagUnexp>;
}

/// A receive the kit posted to tag matching: its context and what it reported.
struct TagPosted {
    ctx: Rc<TagRecvContext>,
    report: Rc<RefCell<TagReport>>,
}

const GUARD_WORDS: usize = 8;
const GUARD_WORD: u64 = 0x5afe_9a2d_5afe_9a2d;

/// A region on the receiving side, allocated by the domain or registered from the heap with
/// guard words on both sides.
struct Region {
    memh: Option<MemH>,
    addr: *mut u8,
    len: usize,
    heap: Option<Box<[u64]>>,
}

impl Region {
    fn guards_intact(&self) -> bool {
        match &self.heap {
            None => true,
            Some(h) => {
                let n = h.len();
                h[..GUARD_WORDS].iter().chain(&h[n - GUARD_WORDS..]).all(|&w| w == GUARD_WORD)
            }
        }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        // Deregister before the heap buffer goes away.
        self.memh.take();
    }
}

#[derive(Default)]
struct State {
    inbox: Vec<Vec<Vec<u8>>>,
    counts: Vec<usize>,
    keep_first: Vec<usize>,
    kept: Vec<AmDesc>,
    hold: bool,
    reply_failures: usize,
    reply_ep: Option<Rc<dyn Ep>>,
}

/// The receiver in this process.
pub(crate) struct LocalPeer {
    iface: RefCell<Option<Rc<dyn Iface>>>,
    md: Rc<dyn crate::Md>,
    state: Rc<RefCell<State>>,
    eps: RefCell<Vec<Rc<dyn Ep>>>,
    regions: RefCell<Vec<Option<Region>>>,
    tag_sink: TagSink,
    tag_recvs: RefCell<Vec<TagPosted>>,
}

impl LocalPeer {
    /// The receiver around `iface`, whose tag handlers (if any) record into `tag_sink`.
    pub(crate) fn new(iface: Rc<dyn Iface>, md: Rc<dyn crate::Md>, tag_sink: TagSink) -> Self {
        let n = AM_ID_MAX as usize;
        let state =
            State { inbox: vec![Vec::new(); n], counts: vec![0; n], keep_first: vec![0; n], ..State::default() };
        LocalPeer {
            iface: RefCell::new(Some(iface)),
            md,
            state: Rc::new(RefCell::new(state)),
            eps: RefCell::default(),
            regions: RefCell::default(),
            tag_sink,
            tag_recvs: RefCell::default(),
        }
    }

    fn iface(&self) -> Rc<dyn Iface> {
        self.iface.borrow().clone().expect("the receiving interface was closed")
    }

    /// True while [`Peer::hold`] is on.
    fn held(&self) -> bool {
        self.state.borrow().hold
    }

    fn with_region<T>(&self, id: u32, f: impl FnOnce(&Region) -> T) -> T {
        let regions = self.regions.borrow();
        let r = regions.get(id as usize).and_then(|r| r.as_ref()).expect("no such region");
        f(r)
    }
}

impl Peer for LocalPeer {
    fn is_remote(&self) -> bool {
        false
    }

    fn device_address(&self) -> Vec<u8> {
        self.iface().device_address()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.iface().iface_address()
    }

    fn listen(&self, id: u8, how: Listen) -> UcsResult<()> {
        let state = self.state.clone();
        if let Some(s) = state.borrow_mut().keep_first.get_mut(id as usize) {
            *s = how.keep_first;
        }
        self.iface().set_am_handler(
            id,
            Some(Rc::new(move |m: AmRecv<'_>| {
                let i = id as usize;
                let reply = {
                    let mut s = state.borrow_mut();
                    s.counts[i] += 1;
                    s.inbox[i].push(m.data().to_vec());
                    let header = m.data().get(..8).map(|h| u64::from_ne_bytes(h.try_into().unwrap_or_default()));
                    if s.keep_first[i] > 0 || s.hold {
                        s.keep_first[i] = s.keep_first[i].saturating_sub(1);
                        s.kept.push(m.keep());
                    }
                    how.reply.map(|rid| (rid, header.unwrap_or(0), s.reply_ep.clone()))
                };
                // Send outside the borrow: a loopback transport delivers the reply right away.
                if let Some((rid, header, ep)) = reply {
                    // Handlers may not progress, so a reply that finds no resources is counted.
                    let ok = ep.map(|ep| ep.am_short(rid, header + 1000, b"reply") == Ok(Outcome::Done(())));
                    if ok != Some(true) {
                        state.borrow_mut().reply_failures += 1;
                    }
                }
            })),
        )
    }

    fn unlisten(&self, id: u8) -> UcsResult<()> {
        self.iface().set_am_handler(id, None)
    }

    fn count(&self, id: u8) -> usize {
        self.state.borrow().counts.get(id as usize).copied().unwrap_or(0)
    }

    fn take(&self, id: u8) -> Vec<Vec<u8>> {
        self.state.borrow_mut().inbox.get_mut(id as usize).map(std::mem::take).unwrap_or_default()
    }

    fn reply_failures(&self) -> usize {
        self.state.borrow().reply_failures
    }

    fn kept(&self) -> Vec<Vec<u8>> {
        self.state.borrow().kept.iter().map(|d| d.to_vec()).collect()
    }

    fn release_kept(&self, keep: usize) {
        let released: Vec<AmDesc> = {
            let mut s = self.state.borrow_mut();
            let at = keep.min(s.kept.len());
            s.kept.split_off(at)
        };
        drop(released);
    }

    fn hold(&self, on: bool) {
        self.state.borrow_mut().hold = on;
        if !on {
            self.release_kept(0);
        }
    }

    fn reply_to(&self, dev: &[u8], iface: &[u8]) -> UcsResult<()> {
        let ep: Rc<dyn Ep> = self.iface().ep_create(&EpParams::to_iface(dev, iface))?.into();
        self.state.borrow_mut().reply_ep = Some(ep);
        Ok(())
    }

    fn ep_create(&self) -> UcsResult<(usize, Vec<u8>)> {
        let ep: Rc<dyn Ep> = self.iface().ep_create(&EpParams::to_ep())?.into();
        let addr = ep.address()?;
        let mut eps = self.eps.borrow_mut();
        eps.push(ep.clone());
        let mut s = self.state.borrow_mut();
        if s.reply_ep.is_none() {
            s.reply_ep = Some(ep);
        }
        Ok((eps.len() - 1, addr))
    }

    fn ep_connect(&self, idx: usize, dev: &[u8], ep: &[u8]) -> UcsResult<()> {
        let e = self.eps.borrow().get(idx).cloned().ok_or(Status::InvalidParam)?;
        e.connect_to_ep(dev, ep)
    }

    fn region(&self, len: usize) -> UcsResult<RegionInfo> {
        let attr = self.md.attr();
        let region = if attr.flags.contains(MdFlags::ALLOC) {
            let memh = self.md.mem_alloc(len, MemAccess::ALL, "conformance")?;
            Region { addr: memh.address(), memh: Some(memh), len, heap: None }
        } else {
            let mut heap = vec![GUARD_WORD; len.div_ceil(8) + 2 * GUARD_WORDS].into_boxed_slice();
            heap[GUARD_WORDS..GUARD_WORDS + len.div_ceil(8)].fill(0);
            // SAFETY: in bounds: the allocation has GUARD_WORDS words on each side.
            let ptr = unsafe { heap.as_mut_ptr().add(GUARD_WORDS) }.cast::<u8>();
            // SAFETY: the boxed slice lives in the Region, which drops the MemH first.
            let memh = unsafe { self.md.mem_reg(ptr, len, MemAccess::ALL)? };
            Region { memh: Some(memh), addr: ptr, len, heap: Some(heap) }
        };
        let packed = self.md.mkey_pack(region.memh.as_ref().expect("just registered"))?;
        let registered_heap = region.heap.is_some();
        let mut regions = self.regions.borrow_mut();
        regions.push(Some(region));
        Ok(RegionInfo { id: (regions.len() - 1) as u32, packed: packed.to_vec(), registered_heap })
    }

    fn read(&self, id: u32, off: usize, len: usize) -> Vec<u8> {
        self.with_region(id, |r| {
            assert!(r.memh.is_some() && off + len <= r.len, "read outside a live region");
            let mut out = vec![0u8; len];
            // SAFETY: in bounds (asserted); the region is live while it holds its MemH, and
            // no operation is in flight while the kit inspects it.
            unsafe { std::ptr::copy_nonoverlapping(r.addr.add(off), out.as_mut_ptr(), len) };
            out
        })
    }

    fn write(&self, id: u32, off: usize, data: &[u8]) {
        self.with_region(id, |r| {
            assert!(r.memh.is_some() && off + data.len() <= r.len, "write outside a live region");
            // SAFETY: as in `read`.
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), r.addr.add(off), data.len()) };
        })
    }

    fn guards_intact(&self, id: u32) -> bool {
        self.with_region(id, Region::guards_intact)
    }

    fn deregister(&self, id: u32) {
        let memh = self.regions.borrow_mut().get_mut(id as usize).and_then(|r| r.as_mut()).and_then(|r| r.memh.take());
        drop(memh);
    }

    fn free(&self, id: u32) {
        let r = self.regions.borrow_mut().get_mut(id as usize).and_then(Option::take);
        drop(r);
    }

    fn close(&self) {
        let eps = std::mem::take(&mut *self.eps.borrow_mut());
        let reply = self.state.borrow_mut().reply_ep.take();
        drop((eps, reply));
        let iface = self.iface.borrow_mut().take();
        drop(iface);
    }

    fn kill(&self) {
        panic!("kill: the receiver is in this process");
    }

    fn tag_post(&self, tag: u64, mask: u64, region: u32, off: usize, len: usize) -> UcsResult<u32> {
        let report: Rc<RefCell<TagReport>> = Rc::default();
        let (r1, r2, r3) = (report.clone(), report.clone(), report.clone());
        let ctx = Rc::new(TagRecvContext {
            tag_consumed: Box::new(move || {
                let mut r = r1.borrow_mut();
                r.consumed = true;
                r.calls += 1;
                r.consumed_first = r.completed.is_none() && r.rndv.is_none();
            }),
            completed: Box::new(move |tag, imm, len, status| {
                let mut r = r2.borrow_mut();
                r.calls += 1;
                r.completed = Some((tag, imm, len, status));
            }),
            rndv: Box::new(move |tag, header, _status| {
                let mut r = r3.borrow_mut();
                r.calls += 1;
                r.rndv = Some((tag, header.to_vec()));
            }),
        });
        let iface = self.iface();
        self.with_region(region, |r| {
            assert!(r.memh.is_some() && off + len <= r.len, "a tagged receive outside a live region");
            // SAFETY: in bounds (asserted).
            let iov = [Iov::new(unsafe { r.addr.add(off) }, len, r.memh.as_ref())];
            // SAFETY: the region stays allocated and registered until the kit frees it, which
            // it does only after the receive completed or was cancelled (or with the interface
            // gone).
            unsafe { iface.tag_recv_zcopy(tag, mask, &iov, ctx.clone()) }
        })?;
        let mut recvs = self.tag_recvs.borrow_mut();
        recvs.push(TagPosted { ctx, report });
        Ok((recvs.len() - 1) as u32)
    }

    fn tag_cancel(&self, recv: u32, force: bool) -> UcsResult<()> {
        let ctx = self.tag_recvs.borrow().get(recv as usize).expect("no such tagged receive").ctx.clone();
        self.iface().tag_recv_cancel(&ctx, force)
    }

    fn tag_report(&self, recv: u32) -> TagReport {
        self.tag_recvs.borrow().get(recv as usize).expect("no such tagged receive").report.borrow().clone()
    }

    fn tag_unexpected(&self) -> Vec<TagUnexp> {
        std::mem::take(&mut *self.tag_sink.borrow_mut())
    }
}

// ---------------------------------------------------------------------------------------------
// The remote side: requests over the agent's stdin, answers on its stdout.

fn hex(b: &[u8]) -> String {
    if b.is_empty() {
        return "-".into();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if s == "-" {
        return Ok(Vec::new());
    }
    if s.len() % 2 != 0 {
        return Err(format!("odd-length hex {s:?}"));
    }
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).map_err(|e| format!("bad hex {s:?}: {e}")))
        .collect()
}

/// The receiver in an agent process.
pub(crate) struct RemotePeer {
    child: RefCell<Child>,
    stdin: RefCell<Option<ChildStdin>>,
    answers: mpsc::Receiver<String>,
    timeout: Duration,
    dev: Vec<u8>,
    iface: Vec<u8>,
    dead: Cell<bool>,
}

impl RemotePeer {
    /// Starts the agent and opens `resource` there with the configuration `config`.
    pub(crate) fn spawn(
        cmd: &AgentCommand,
        resource: &str,
        config: &[(String, String)],
        tag_handlers: bool,
        timeout: Duration,
    ) -> UcsResult<RemotePeer> {
        let mut c = Command::new(&cmd.program);
        c.args(&cmd.args).stdin(Stdio::piped()).stdout(Stdio::piped());
        for (k, v) in &cmd.env {
            c.env(k, v);
        }
        let mut child = c.spawn().unwrap_or_else(|e| panic!("cannot start the agent {:?}: {e}", cmd.program));
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, answers) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // The test harness may print its own text before ours on the same line.
                if let Some(at) = line.find(ANSWER) {
                    if tx.send(line[at + ANSWER.len()..].trim().to_string()).is_err() {
                        break;
                    }
                }
            }
        });
        let mut peer = RemotePeer {
            child: RefCell::new(child),
            stdin: RefCell::new(stdin),
            answers,
            timeout,
            dev: Vec::new(),
            iface: Vec::new(),
            dead: Cell::new(false),
        };
        let cfg: Vec<String> =
            config.iter().map(|(k, v)| format!("{}={}", hex(k.as_bytes()), hex(v.as_bytes()))).collect();
        let tag = if tag_handlers { " TAG" } else { "" };
        let a = peer.call(&format!("OPEN {}{tag} {}", hex(resource.as_bytes()), cfg.join(" ")))?;
        peer.dev = peer.bytes(&a, 0);
        peer.iface = peer.bytes(&a, 1);
        Ok(peer)
    }

    /// Sends one request; returns the answer's fields after `OK`, or the error status.
    fn call(&self, req: &str) -> UcsResult<Vec<String>> {
        assert!(!self.dead.get(), "request {req:?} to an agent that was killed");
        let verb = req.split(' ').next().unwrap_or_default();
        {
            let mut stdin = self.stdin.borrow_mut();
            let s = stdin.as_mut().expect("agent stdin");
            if let Err(e) = writeln!(s, "{req}").and_then(|()| s.flush()) {
                panic!("agent: cannot send {verb}: {e} ({})", self.exit_status());
            }
        }
        let line = match self.answers.recv_timeout(self.timeout) {
            Ok(l) => l,
            Err(mpsc::RecvTimeoutError::Timeout) => panic!("agent: no answer to {verb} within {:?}", self.timeout),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                panic!("agent: exited before answering {verb} ({})", self.exit_status())
            }
        };
        let mut fields = line.split(' ').map(str::to_string);
        match fields.next().as_deref() {
            Some("OK") => Ok(fields.collect()),
            Some("ERR") => {
                let code = fields.next().and_then(|c| c.parse::<i8>().ok());
                Err(code.and_then(Status::from_code).unwrap_or_else(|| panic!("agent: bad error answer {line:?}")))
            }
            _ => panic!("agent: malformed answer to {verb}: {line:?}"),
        }
    }

    fn ok(&self, req: &str) -> Vec<String> {
        self.call(req).unwrap_or_else(|e| panic!("agent: {req}: {e}"))
    }

    fn bytes(&self, a: &[String], i: usize) -> Vec<u8> {
        let s = a.get(i).unwrap_or_else(|| panic!("agent: answer {a:?} has no field {i}"));
        unhex(s).unwrap_or_else(|e| panic!("agent: {e}"))
    }

    fn number(&self, a: &[String], i: usize) -> usize {
        let s = a.get(i).unwrap_or_else(|| panic!("agent: answer {a:?} has no field {i}"));
        s.parse().unwrap_or_else(|e| panic!("agent: bad number {s:?}: {e}"))
    }

    fn exit_status(&self) -> String {
        match self.child.borrow_mut().try_wait() {
            Ok(Some(st)) => format!("agent exited: {st}"),
            Ok(None) => "agent still running".into(),
            Err(e) => format!("agent status unknown: {e}"),
        }
    }
}

impl Drop for RemotePeer {
    fn drop(&mut self) {
        if !self.dead.get() {
            if let Some(mut s) = self.stdin.borrow_mut().take() {
                let _ = writeln!(s, "BYE");
            }
        }
        let mut child = self.child.borrow_mut();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Peer for RemotePeer {
    fn is_remote(&self) -> bool {
        true
    }

    fn device_address(&self) -> Vec<u8> {
        self.dev.clone()
    }

    fn iface_address(&self) -> Vec<u8> {
        self.iface.clone()
    }

    fn listen(&self, id: u8, how: Listen) -> UcsResult<()> {
        let reply = how.reply.map(i32::from).unwrap_or(-1);
        self.call(&format!("LISTEN {id} {} {reply}", how.keep_first)).map(drop)
    }

    fn unlisten(&self, id: u8) -> UcsResult<()> {
        self.call(&format!("UNLISTEN {id}")).map(drop)
    }

    fn count(&self, id: u8) -> usize {
        let a = self.ok(&format!("COUNT {id}"));
        self.number(&a, 0)
    }

    fn take(&self, id: u8) -> Vec<Vec<u8>> {
        let a = self.ok(&format!("TAKE {id}"));
        (0..a.len()).map(|i| self.bytes(&a, i)).collect()
    }

    fn reply_failures(&self) -> usize {
        let a = self.ok("FAILS");
        self.number(&a, 0)
    }

    fn kept(&self) -> Vec<Vec<u8>> {
        let a = self.ok("KEPT");
        (0..a.len()).map(|i| self.bytes(&a, i)).collect()
    }

    fn release_kept(&self, keep: usize) {
        self.ok(&format!("RELEASE {keep}"));
    }

    fn hold(&self, on: bool) {
        self.ok(&format!("HOLD {}", u8::from(on)));
    }

    fn reply_to(&self, dev: &[u8], iface: &[u8]) -> UcsResult<()> {
        self.call(&format!("REPLYTO {} {}", hex(dev), hex(iface))).map(drop)
    }

    fn ep_create(&self) -> UcsResult<(usize, Vec<u8>)> {
        let a = self.call("EP")?;
        Ok((self.number(&a, 0), self.bytes(&a, 1)))
    }

    fn ep_connect(&self, idx: usize, dev: &[u8], ep: &[u8]) -> UcsResult<()> {
        self.call(&format!("CONNECT {idx} {} {}", hex(dev), hex(ep))).map(drop)
    }

    fn region(&self, len: usize) -> UcsResult<RegionInfo> {
        let a = self.call(&format!("REGION {len}"))?;
        Ok(RegionInfo {
            id: self.number(&a, 0) as u32,
            packed: self.bytes(&a, 1),
            registered_heap: self.number(&a, 2) == 1,
        })
    }

    fn read(&self, id: u32, off: usize, len: usize) -> Vec<u8> {
        let a = self.ok(&format!("READ {id} {off} {len}"));
        self.bytes(&a, 0)
    }

    fn write(&self, id: u32, off: usize, data: &[u8]) {
        self.ok(&format!("WRITE {id} {off} {}", hex(data)));
    }

    fn guards_intact(&self, id: u32) -> bool {
        let a = self.ok(&format!("GUARDS {id}"));
        self.number(&a, 0) == 1
    }

    fn deregister(&self, id: u32) {
        self.ok(&format!("DEREG {id}"));
    }

    fn free(&self, id: u32) {
        if !self.dead.get() {
            self.ok(&format!("FREE {id}"));
        }
    }

    fn close(&self) {
        self.ok("CLOSE");
    }

    fn kill(&self) {
        let mut child = self.child.borrow_mut();
        let _ = child.kill();
        let _ = child.wait();
        self.dead.set(true);
    }

    fn tag_post(&self, tag: u64, mask: u64, region: u32, off: usize, len: usize) -> UcsResult<u32> {
        let a = self.call(&format!("TPOST {tag} {mask} {region} {off} {len}"))?;
        Ok(self.number(&a, 0) as u32)
    }

    fn tag_cancel(&self, recv: u32, force: bool) -> UcsResult<()> {
        self.call(&format!("TCANCEL {recv} {}", u8::from(force))).map(drop)
    }

    fn tag_report(&self, recv: u32) -> TagReport {
        let a = self.ok(&format!("TREPORT {recv}"));
        let bad = || -> ! { panic!("agent: bad TREPORT answer {a:?}") };
        let n = |s: &str| s.parse::<u64>().unwrap_or_else(|_| bad());
        let completed = match a.get(3).map(String::as_str) {
            Some("-") => None,
            Some(s) => {
                let f: Vec<&str> = s.split(',').collect();
                let [t, imm, len, st] = f[..] else { bad() };
                let st = st.parse::<i8>().ok().and_then(Status::from_code).unwrap_or_else(|| bad());
                Some((n(t), n(imm), n(len) as usize, st))
            }
            None => bad(),
        };
        let rndv = match a.get(4).map(String::as_str) {
            Some("-") => None,
            Some(s) => {
                let (t, h) = s.split_once(',').unwrap_or_else(|| bad());
                Some((n(t), unhex(h).unwrap_or_else(|_| bad())))
            }
            None => bad(),
        };
        TagReport {
            consumed: self.number(&a, 0) == 1,
            calls: self.number(&a, 1),
            consumed_first: self.number(&a, 2) == 1,
            completed,
            rndv,
        }
    }

    fn tag_unexpected(&self) -> Vec<TagUnexp> {
        let a = self.ok("TUNEXP");
        a.iter()
            .map(|s| {
                let bad = || -> ! { panic!("agent: bad TUNEXP entry {s:?}") };
                let f: Vec<&str> = s.split(',').collect();
                let n = |s: &str| s.parse::<u64>().unwrap_or_else(|_| bad());
                let h = |s: &str| unhex(s).unwrap_or_else(|_| bad());
                match f[..] {
                    ["E", stag, imm, data] => TagUnexp::Eager { stag: n(stag), imm: n(imm), data: h(data) },
                    ["R", stag, header, addr, len, rkey] => TagUnexp::Rndv {
                        stag: n(stag),
                        header: h(header),
                        remote_addr: n(addr),
                        length: n(len) as usize,
                        rkey: h(rkey),
                    },
                    _ => bad(),
                }
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// The agent.

/// Serves as the kit's agent on stdin/stdout until told `BYE` or stdin closes; call it from the
/// agent program's `main` after registering the transports. Between requests
/// it progresses its worker; it exits on its own after five idle minutes.
pub fn serve_agent() {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::stdin().lock().lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let worker = Worker::default();
    let mut peer: Option<LocalPeer> = None;
    let mut last = Instant::now();
    loop {
        let held = peer.as_ref().is_some_and(LocalPeer::held);
        let line = match rx.try_recv() {
            Ok(l) => l,
            Err(mpsc::TryRecvError::Empty) => {
                if !held {
                    worker.progress();
                }
                if last.elapsed() > Duration::from_secs(300) {
                    return;
                }
                continue;
            }
            Err(mpsc::TryRecvError::Disconnected) => return,
        };
        last = Instant::now();
        if !held {
            // Everything sent before the request is in: progress until idle (bounded).
            for _ in 0..100_000 {
                if worker.progress() == 0 {
                    break;
                }
            }
        }
        if line.trim() == "BYE" {
            return;
        }
        let answer = match serve_one(&worker, &mut peer, &line) {
            Ok(fields) => format!("OK {}", fields.join(" ")),
            Err(AgentError::Status(s)) => format!("ERR {}", s.code()),
            Err(AgentError::Bad(why)) => panic!("agent: bad request {line:?}: {why}"),
        };
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "{ANSWER}{answer}");
        let _ = out.flush();
    }
}

enum AgentError {
    Status(Status),
    Bad(String),
}

impl From<Status> for AgentError {
    fn from(s: Status) -> Self {
        AgentError::Status(s)
    }
}

impl From<String> for AgentError {
    fn from(s: String) -> Self {
        AgentError::Bad(s)
    }
}

impl From<&str> for AgentError {
    fn from(s: &str) -> Self {
        AgentError::Bad(s.into())
    }
}

fn serve_one(worker: &Worker, peer: &mut Option<LocalPeer>, line: &str) -> Result<Vec<String>, AgentError> {
    let f: Vec<&str> = line.split_whitespace().collect();
    let arg = |i: usize| f.get(i).copied().ok_or_else(|| format!("missing argument {i}"));
    let num = |i: usize| -> Result<usize, String> { arg(i)?.parse().map_err(|e| format!("argument {i}: {e}")) };
    let string = |s: &str| -> Result<String, String> { String::from_utf8(unhex(s)?).map_err(|e| e.to_string()) };
    if f.first() == Some(&"OPEN") {
        let resource = string(arg(1)?)?;
        // `TAG`: with tag-offload handlers.
        let tag = f.get(2) == Some(&"TAG");
        let mut config = Vec::new();
        for kv in &f[2 + tag as usize..] {
            let (k, v) = kv.split_once('=').ok_or("config entry without =")?;
            config.push((string(k)?, string(v)?));
        }
        let (md, tl) = find_resource(&resource)?;
        let mut params = IfaceParams::new(&tl.tl_name, &tl.dev_name);
        params.config = config;
        let sink = TagSink::default();
        if tag {
            params.tag_handlers = Some(kit_tag_handlers(&sink));
        }
        let iface: Rc<dyn Iface> = md.iface_open(worker, &params)?.into();
        iface.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
        let out = vec![hex(&iface.device_address()), hex(&iface.iface_address())];
        *peer = Some(LocalPeer::new(iface, md, sink));
        return Ok(out);
    }
    let p = peer.as_ref().ok_or("no OPEN yet")?;
    let id = |i: usize| -> Result<u8, String> {
        let v: i64 = arg(i)?.parse().map_err(|e| format!("argument {i}: {e}"))?;
        u8::try_from(v).map_err(|_| format!("id {v} out of range"))
    };
    let out = match f[0] {
        "LISTEN" => {
            let reply: i64 = arg(3)?.parse().map_err(|e| format!("reply id: {e}"))?;
            let reply = if reply < 0 { None } else { Some(u8::try_from(reply).map_err(|_| "reply id")?) };
            p.listen(id(1)?, Listen { keep_first: num(2)?, reply })?;
            vec![]
        }
        "UNLISTEN" => {
            p.unlisten(id(1)?)?;
            vec![]
        }
        "COUNT" => vec![p.count(id(1)?).to_string()],
        "TAKE" => p.take(id(1)?).iter().map(|m| hex(m)).collect(),
        "FAILS" => vec![p.reply_failures().to_string()],
        "KEPT" => p.kept().iter().map(|m| hex(m)).collect(),
        "RELEASE" => {
            p.release_kept(num(1)?);
            vec![]
        }
        "HOLD" => {
            p.hold(num(1)? == 1);
            vec![]
        }
        "REPLYTO" => {
            p.reply_to(&unhex(arg(1)?)?, &unhex(arg(2)?)?)?;
            vec![]
        }
        "EP" => {
            let (i, addr) = p.ep_create()?;
            vec![i.to_string(), hex(&addr)]
        }
        "CONNECT" => {
            p.ep_connect(num(1)?, &unhex(arg(2)?)?, &unhex(arg(3)?)?)?;
            vec![]
        }
        "REGION" => {
            let r = p.region(num(1)?)?;
            vec![r.id.to_string(), hex(&r.packed), u8::from(r.registered_heap).to_string()]
        }
        "READ" => vec![hex(&p.read(num(1)? as u32, num(2)?, num(3)?))],
        "WRITE" => {
            p.write(num(1)? as u32, num(2)?, &unhex(arg(3)?)?);
            vec![]
        }
        "GUARDS" => vec![u8::from(p.guards_intact(num(1)? as u32)).to_string()],
        "DEREG" => {
            p.deregister(num(1)? as u32);
            vec![]
        }
        "FREE" => {
            p.free(num(1)? as u32);
            vec![]
        }
        "CLOSE" => {
            p.close();
            vec![]
        }
        "TPOST" => {
            let n = |i: usize| -> Result<u64, String> { arg(i)?.parse().map_err(|e| format!("argument {i}: {e}")) };
            vec![p.tag_post(n(1)?, n(2)?, num(3)? as u32, num(4)?, num(5)?)?.to_string()]
        }
        "TCANCEL" => {
            p.tag_cancel(num(1)? as u32, num(2)? == 1)?;
            vec![]
        }
        "TREPORT" => {
            let r = p.tag_report(num(1)? as u32);
            let completed = match r.completed {
                Some((t, imm, len, st)) => format!("{t},{imm},{len},{}", st.code()),
                None => "-".into(),
            };
            let rndv = match &r.rndv {
                Some((t, h)) => format!("{t},{}", hex(h)),
                None => "-".into(),
            };
            vec![
                u8::from(r.consumed).to_string(),
                r.calls.to_string(),
                u8::from(r.consumed_first).to_string(),
                completed,
                rndv,
            ]
        }
        "TUNEXP" => p
            .tag_unexpected()
            .iter()
            .map(|u| match u {
                TagUnexp::Eager { stag, imm, data } => format!("E,{stag},{imm},{}", hex(data)),
                TagUnexp::Rndv { stag, header, remote_addr, length, rkey } => {
                    format!("R,{stag},{},{remote_addr},{length},{}", hex(header), hex(rkey))
                }
            })
            .collect(),
        other => return Err(format!("unknown request {other}").into()),
    };
    Ok(out)
}
