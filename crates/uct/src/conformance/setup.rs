//! Opening a connected sender/receiver pair for the checks.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::{OpResult, Outcome, Status, UcsResult};

use super::peer::{kit_tag_handlers, AgentCommand, LocalPeer, Peer, RemotePeer, TagSink};
use crate::{find_resource, Ep, EpParams, Iface, IfaceFlags, IfaceParams, Md, ProgressFlags, RemoteKey, Worker};

/// What to test and how.
#[derive(Clone, Debug)]
pub struct Options {
    /// Resource name, `tl/dev`.
    pub resource: String,
    /// Configuration overrides for every interface the kit opens.
    pub config: Vec<(String, String)>,
    /// Extra overrides that make send resources scarce, for the pending checks (e.g. a small
    /// FIFO, or a limit on buffers handlers may keep).
    pub scarce_config: Vec<(String, String)>,
    /// Bound on every wait.
    pub timeout: Duration,
    /// Run the receiving side in another process started with this command (see
    /// [`serve_agent`](super::serve_agent)); `None` keeps it in this process.
    pub agent: Option<AgentCommand>,
    /// Open every interface with tag-offload handlers ([`IfaceParams::tag_handlers`]): needed
    /// for [`tag_matching`](super::tag_matching), and for transports whose active messages
    /// change with tag matching on (the other checks then run with it on). The handlers
    /// record what arrives for the tag check.
    pub tag_handlers: bool,
}

impl Options {
    /// Options for `resource` with defaults.
    pub fn new(resource: &str) -> Self {
        Options {
            resource: resource.into(),
            config: Vec::new(),
            scarce_config: Vec::new(),
            timeout: Duration::from_secs(20),
            agent: None,
            tag_handlers: false,
        }
    }

    /// Adds a configuration override for every interface.
    pub fn with_config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.into(), value.into()));
        self
    }

    /// Runs the receiving side in another process, started with `cmd`.
    pub fn across_processes(mut self, cmd: AgentCommand) -> Self {
        self.agent = Some(cmd);
        self
    }

    /// Opens every interface with tag-offload handlers (see [`Options::tag_handlers`]).
    pub fn with_tag_handlers(mut self) -> Self {
        self.tag_handlers = true;
        self
    }

    /// Adds an override used by the pending checks.
    pub fn with_scarce_config(mut self, name: &str, value: &str) -> Self {
        self.scarce_config.push((name.into(), value.into()));
        self
    }
}

/// A worker with a sending interface and endpoints connected to a receiver: in this process,
/// or in an agent process when [`Options::agent`] is set. For loopback transports (`self`) the
/// sender is the receiver itself.
pub struct Pair {
    /// Endpoints from the sender to the receiver (one unless more were asked for).
    pub eps: Vec<Rc<dyn Ep>>,
    /// The sending interface.
    pub sender: Rc<dyn Iface>,
    /// Memory domain of the sender.
    pub md: Rc<dyn Md>,
    /// The worker progressing the sender (and a receiver in this process).
    pub worker: Worker,
    /// Endpoint failures reported to the sender's error handler: (endpoint user data, status).
    pub failures: Rc<RefCell<Vec<(u64, Status)>>>,
    pub(crate) rx: Rc<dyn Peer>,
    timeout: Duration,
}

impl Pair {
    /// Opens the pair with `n_eps` endpoints from sender to receiver.
    pub fn open(opts: &Options, scarce: bool, n_eps: usize) -> UcsResult<Pair> {
        let (md, tl) = find_resource(&opts.resource)?;
        let worker = Worker::default();
        let mut params = IfaceParams::new(&tl.tl_name, &tl.dev_name);
        params.config = opts.config.clone();
        if scarce {
            params.config.extend(opts.scarce_config.iter().cloned());
        }
        let failures: Rc<RefCell<Vec<(u64, Status)>>> = Rc::default();
        let f2 = failures.clone();
        params.err_handler = Some(Rc::new(move |ud, st| f2.borrow_mut().push((ud, st))));
        let sink = TagSink::default();
        if opts.tag_handlers {
            params.tag_handlers = Some(kit_tag_handlers(&sink));
        }
        let open = |params: &IfaceParams| -> UcsResult<Rc<dyn Iface>> {
            let i: Rc<dyn Iface> = md.iface_open(&worker, params)?.into();
            i.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
            Ok(i)
        };
        let (rx, sender): (Rc<dyn Peer>, Rc<dyn Iface>) = match &opts.agent {
            Some(cmd) => {
                let remote = RemotePeer::spawn(cmd, &opts.resource, &params.config, opts.tag_handlers, opts.timeout)?;
                let sender = open(&params)?;
                if sender.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE)
                    && !sender.is_reachable(&remote.device_address(), Some(&remote.iface_address()))
                {
                    panic!("{}: an interface in the agent process is not reachable from here", opts.resource);
                }
                (Rc::new(remote), sender)
            }
            None => {
                let receiver = open(&params)?;
                let dev = receiver.device_address();
                let addr = receiver.iface_address();
                let sender = if receiver.is_reachable(&dev, Some(&addr)) && tl.dev_type == crate::DeviceType::SelfDev {
                    receiver.clone()
                } else {
                    open(&params)?
                };
                (Rc::new(LocalPeer::new(receiver, md.clone(), sink)), sender)
            }
        };
        let mut pair = Pair { eps: Vec::new(), sender, md, worker, failures, rx, timeout: opts.timeout };
        for i in 0..n_eps {
            let ep = pair.connect(i as u64)?;
            pair.eps.push(ep.into());
        }
        Ok(pair)
    }

    /// True when the receiver runs in another process.
    pub fn is_remote(&self) -> bool {
        self.rx.is_remote()
    }

    /// Makes the receiver collect the active messages of `id`.
    pub fn listen(&self, id: u8) -> UcsResult<()> {
        self.rx.listen(id, super::peer::Listen::default())
    }

    /// Progresses until the receiver collected `n` messages of `id` (see [`Pair::listen`]) and
    /// returns them in arrival order; panics if more arrive.
    pub fn collect(&self, id: u8, n: usize) -> Vec<Vec<u8>> {
        self.collect_as(&format!("{n} messages on id {id}"), id, n)
    }

    /// [`Pair::collect`], naming the wait `what` in failures.
    pub(crate) fn collect_as(&self, what: &str, id: u8, n: usize) -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        self.wait(what, || {
            got.extend(self.rx.take(id));
            got.len() >= n
        });
        for _ in 0..16 {
            self.worker.progress();
        }
        got.extend(self.rx.take(id));
        assert_eq!(got.len(), n, "{what}: more messages on id {id} arrived than were sent");
        got
    }

    /// Makes the receiver's reply handlers send back to the sender's interface.
    pub(crate) fn enable_replies(&self) -> UcsResult<()> {
        let s = &self.sender;
        if s.attr().flags.contains(IfaceFlags::CONNECT_TO_IFACE) {
            self.rx.reply_to(&s.device_address(), &s.iface_address())
        } else {
            // To-ep transports reply on the receiver's first connected endpoint.
            Ok(())
        }
    }

    /// The interface that sends.
    pub fn sender(&self) -> &dyn Iface {
        &*self.sender
    }

    /// An endpoint to the receiver; for to-ep transports the receiver connects one back.
    fn connect(&self, user_data: u64) -> UcsResult<Box<dyn Ep>> {
        let s = self.sender();
        let flags = s.attr().flags;
        if flags.contains(IfaceFlags::CONNECT_TO_IFACE) {
            let dev = self.rx.device_address();
            let addr = self.rx.iface_address();
            assert!(s.is_reachable(&dev, Some(&addr)), "connect: receiver not reachable from sender");
            s.ep_create(&EpParams::to_iface(&dev, &addr).with_user_data(user_data))
        } else if flags.contains(IfaceFlags::CONNECT_TO_EP) {
            let a = s.ep_create(&EpParams::to_ep().with_user_data(user_data))?;
            let (idx, b_addr) = self.rx.ep_create()?;
            a.connect_to_ep(&self.rx.device_address(), &b_addr)?;
            self.rx.ep_connect(idx, &s.device_address(), &a.address()?)?;
            Ok(a)
        } else {
            panic!("transport advertises neither CONNECT_TO_IFACE nor CONNECT_TO_EP");
        }
    }

    /// Progresses until `done()` holds; panics (test failure) on timeout.
    pub fn wait(&self, what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        let mut spins = 0u64;
        // A condition on a remote receiver is a round trip; test it less often.
        let every = if self.is_remote() { 64 } else { 1 };
        loop {
            if spins % every == 0 && done() {
                return;
            }
            self.worker.progress();
            spins += 1;
            if spins % 1024 == 0 && start.elapsed() > self.timeout {
                panic!("timed out after {:?} waiting for {what}", self.timeout);
            }
        }
    }

    /// Retries `op` while it returns `NoResource`, progressing in between.
    pub fn retry<T>(&self, what: &str, mut op: impl FnMut() -> OpResult<T>) -> Result<Outcome<T>, Status> {
        let start = Instant::now();
        loop {
            match op()? {
                Outcome::NoResource => {
                    self.worker.progress();
                    if start.elapsed() > self.timeout {
                        panic!("{what}: NoResource for {:?}", self.timeout);
                    }
                }
                other => return Ok(other),
            }
        }
    }

    /// A remote-accessible region of `len` bytes on the receiver's side with its unpacked key.
    /// Allocated by the memory domain when it can allocate, else registered from the heap with
    /// guard bytes on both sides ([`Target::guards_intact`]).
    pub fn target_region(&self, len: usize) -> UcsResult<Target> {
        let info = self.rx.region(len)?;
        let rkey = match self.md.component().rkey_unpack(&info.packed) {
            Ok(k) => k,
            Err(e) => {
                self.rx.free(info.id);
                return Err(e);
            }
        };
        Ok(Target {
            rkey,
            packed: info.packed,
            id: info.id,
            registered_heap: info.registered_heap,
            peer: self.rx.clone(),
        })
    }
}

/// A region a peer may access, with its packed and unpacked key.
pub struct Target {
    /// The unpacked key.
    pub rkey: RemoteKey,
    /// The packed key bytes.
    pub packed: Vec<u8>,
    id: u32,
    registered_heap: bool,
    peer: Rc<dyn Peer>,
}

impl Target {
    /// Remote address of the region start.
    pub fn addr(&self) -> u64 {
        self.rkey.base()
    }

    /// Region length.
    pub fn len(&self) -> usize {
        self.rkey.length() as usize
    }

    /// True for an empty region.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads the region's current bytes (no operation may be in flight).
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        self.peer.read(self.id, off, len)
    }

    /// True when the guard bytes around a heap-registered region are untouched (always true
    /// for memory-domain allocations, which have no guards).
    pub fn guards_intact(&self) -> bool {
        self.peer.guards_intact(self.id)
    }

    /// The region's number on the receiving side.
    pub(crate) fn id(&self) -> u32 {
        self.id
    }

    /// True when the region is heap memory registered with the domain (not allocated by it).
    pub fn is_registered_heap(&self) -> bool {
        self.registered_heap
    }

    /// Deregisters the region now (heap memory stays allocated, so the guards stay readable).
    pub fn deregister(&mut self) {
        self.peer.deregister(self.id);
    }

    /// Writes bytes into the region directly.
    pub fn write(&self, off: usize, data: &[u8]) {
        self.peer.write(self.id, off, data);
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        self.peer.free(self.id);
    }
}

/// Deterministic pattern bytes for message `seed`.
pub(crate) fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
