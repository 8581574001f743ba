//! Opening a connected sender/receiver pair for the checks.

use std::rc::Rc;
use std::time::{Duration, Instant};

use ucs::{OpResult, Outcome, Status, UcsResult};

use crate::{
    find_resource, Ep, EpParams, Iface, IfaceFlags, IfaceParams, Md, MemAccess, MemH, ProgressFlags, RemoteKey, Worker,
};

/// The receiver's endpoint of a to-ep connection.
type BackEp = Box<dyn Ep>;

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
}

impl Options {
    /// Options for `resource` with defaults.
    pub fn new(resource: &str) -> Self {
        Options {
            resource: resource.into(),
            config: Vec::new(),
            scarce_config: Vec::new(),
            timeout: Duration::from_secs(20),
        }
    }

    /// Adds a configuration override for every interface.
    pub fn with_config(mut self, name: &str, value: &str) -> Self {
        self.config.push((name.into(), value.into()));
        self
    }

    /// Adds an override used by the pending checks.
    pub fn with_scarce_config(mut self, name: &str, value: &str) -> Self {
        self.scarce_config.push((name.into(), value.into()));
        self
    }
}

/// A worker with a receiving interface and a sending endpoint connected to it. For loopback
/// transports (`self`) the sender is the receiver itself.
pub struct Pair {
    /// Endpoints from the sender to the receiver (one unless more were asked for).
    pub eps: Vec<Rc<dyn Ep>>,
    /// Endpoints from the receiver back to the sender (to-ep transports keep them alive).
    pub back_eps: Vec<Rc<dyn Ep>>,
    /// Receiving interface.
    pub receiver: Box<dyn Iface>,
    /// Sending interface, unless the receiver sends to itself.
    pub sender: Option<Box<dyn Iface>>,
    /// Memory domain of both interfaces.
    pub md: Rc<dyn Md>,
    /// The worker progressing both.
    pub worker: Worker,
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
        let receiver = md.iface_open(&worker, &params)?;
        receiver.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
        let dev = receiver.device_address();
        let addr = receiver.iface_address();
        let sender = if receiver.is_reachable(&dev, Some(&addr)) && tl.dev_type == crate::DeviceType::SelfDev {
            None
        } else {
            let s = md.iface_open(&worker, &params)?;
            s.progress_enable(ProgressFlags::SEND | ProgressFlags::RECV);
            Some(s)
        };
        let mut pair =
            Pair { eps: Vec::new(), back_eps: Vec::new(), receiver, sender, md, worker, timeout: opts.timeout };
        for i in 0..n_eps {
            let (ep, back) = pair.connect(i as u64)?;
            pair.eps.push(ep.into());
            pair.back_eps.extend(back.map(Rc::from));
        }
        Ok(pair)
    }

    /// An endpoint from the receiver to the sender, for replies from handlers.
    pub fn reply_ep(&self) -> UcsResult<Rc<dyn Ep>> {
        if let Some(b) = self.back_eps.first() {
            return Ok(b.clone());
        }
        let s = self.sender();
        let (dev, addr) = (s.device_address(), s.iface_address());
        Ok(self.receiver.ep_create(&EpParams::to_iface(&dev, &addr))?.into())
    }

    /// The interface that sends.
    pub fn sender(&self) -> &dyn Iface {
        self.sender.as_deref().unwrap_or(&*self.receiver)
    }

    /// An endpoint to the receiver, and for to-ep transports the receiver's endpoint back.
    fn connect(&self, user_data: u64) -> UcsResult<(Box<dyn Ep>, Option<BackEp>)> {
        let s = self.sender();
        let flags = s.attr().flags;
        if flags.contains(IfaceFlags::CONNECT_TO_IFACE) {
            let dev = self.receiver.device_address();
            let addr = self.receiver.iface_address();
            assert!(s.is_reachable(&dev, Some(&addr)), "{}: receiver not reachable from sender", "connect");
            Ok((s.ep_create(&EpParams::to_iface(&dev, &addr).with_user_data(user_data))?, None))
        } else if flags.contains(IfaceFlags::CONNECT_TO_EP) {
            let a = s.ep_create(&EpParams::to_ep().with_user_data(user_data))?;
            let b = self.receiver.ep_create(&EpParams::to_ep())?;
            a.connect_to_ep(&self.receiver.device_address(), &b.address()?)?;
            b.connect_to_ep(&s.device_address(), &a.address()?)?;
            Ok((a, Some(b)))
        } else {
            panic!("transport advertises neither CONNECT_TO_IFACE nor CONNECT_TO_EP");
        }
    }

    /// Progresses until `done()` holds; panics (test failure) on timeout.
    pub fn wait(&self, what: &str, mut done: impl FnMut() -> bool) {
        let start = Instant::now();
        let mut spins = 0u64;
        while !done() {
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
        let attr = self.md.attr();
        let (memh, heap) = if attr.flags.contains(crate::MdFlags::ALLOC) {
            (self.md.mem_alloc(len, MemAccess::ALL, "conformance")?, None)
        } else {
            let mut heap = vec![GUARD_WORD; len.div_ceil(8) + 2 * GUARD_WORDS].into_boxed_slice();
            heap[GUARD_WORDS..GUARD_WORDS + len.div_ceil(8)].fill(0);
            // SAFETY: in bounds: the allocation has GUARD_WORDS words on each side.
            let ptr = unsafe { heap.as_mut_ptr().add(GUARD_WORDS) }.cast::<u8>();
            // SAFETY: the boxed slice lives in the returned Target, which drops the MemH first.
            let memh = unsafe { self.md.mem_reg(ptr, len, MemAccess::ALL)? };
            (memh, Some(heap))
        };
        let packed = self.md.mkey_pack(&memh)?;
        let rkey = self.md.component().rkey_unpack(&packed)?;
        Ok(Target { rkey, packed, memh: Some(memh), _heap: heap })
    }
}

const GUARD_WORDS: usize = 8;
const GUARD_WORD: u64 = 0x5afe_9a2d_5afe_9a2d;

/// A region a peer may access, with its packed and unpacked key.
pub struct Target {
    /// The unpacked key.
    pub rkey: RemoteKey,
    /// The packed key bytes.
    pub packed: Vec<u8>,
    memh: Option<MemH>,
    _heap: Option<Box<[u64]>>,
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

    /// Reads the region's current bytes (the region is in this process).
    pub fn read(&self, off: usize, len: usize) -> Vec<u8> {
        assert!(self.memh.is_some() && off + len <= self.len(), "read outside a live region");
        let mut out = vec![0u8; len];
        // SAFETY: in bounds (asserted); the region is live while `self` holds the MemH, and no
        // operation is in flight while the kit inspects it.
        unsafe { std::ptr::copy_nonoverlapping((self.addr() as *const u8).add(off), out.as_mut_ptr(), len) };
        out
    }

    /// True when the guard bytes around a heap-registered region are untouched (always true
    /// for memory-domain allocations, which have no guards).
    pub fn guards_intact(&self) -> bool {
        match &self._heap {
            None => true,
            Some(h) => {
                let n = h.len();
                h[..GUARD_WORDS].iter().chain(&h[n - GUARD_WORDS..]).all(|&w| w == GUARD_WORD)
            }
        }
    }

    /// True when the region is heap memory registered with the domain (not allocated by it).
    pub fn is_registered_heap(&self) -> bool {
        self._heap.is_some()
    }

    /// Deregisters the region now (heap memory stays allocated, so the guards stay readable).
    pub fn deregister(&mut self) {
        self.memh.take();
    }

    /// Writes bytes into the region directly.
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(self.memh.is_some() && off + data.len() <= self.len(), "write outside a live region");
        // SAFETY: as in `read`.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.addr() as *mut u8).add(off), data.len()) };
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        // Deregister before the heap buffer goes away.
        self.memh.take();
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
