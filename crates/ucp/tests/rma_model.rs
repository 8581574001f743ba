//! Property test: random sequences of puts, gets and atomics (contiguous and iov buffers,
//! every size class, every atomic at both sizes) against a model of the remote memory, over
//! `self`, `posix`+`cma` and `posix` alone (emulation), on memory the target allocated and on
//! its own. Each operation is waited for, and a flush follows every write, so the model is
//! exact: every get and every fetched value must equal it.

use proptest::prelude::*;
use ucp::{
    AtomicOp, Context, ContextParams, Endpoint, Features, IoVec, MemHandle, Operand, RecvData, RemoteKey, Request,
    RequestParam, SendData, Status, Worker, WorkerParams,
};

const REGION: usize = 32 * 1024;

#[derive(Clone, Debug)]
enum Op {
    Put { off: usize, len: usize, seed: u8, split: Option<usize> },
    Get { off: usize, len: usize, split: Option<usize> },
    Amo { op: AtomicOp, word: usize, wide: bool, value: u64, compare_hit: bool },
    Fence,
}

fn op() -> impl Strategy<Value = Op> {
    let len = prop_oneof![0usize..16, 16usize..300, 300usize..9000, 9000usize..REGION];
    let xfer = (len, any::<u16>(), any::<u8>(), proptest::option::of(any::<u16>()));
    prop_oneof![
        3 => xfer.clone().prop_map(|(len, off, seed, split)| {
            let off = off as usize % (REGION - len + 1);
            Op::Put { off, len, seed, split: split.map(|s| s as usize % (len + 1)) }
        }),
        3 => xfer.prop_map(|(len, off, _, split)| {
            let off = off as usize % (REGION - len + 1);
            Op::Get { off, len, split: split.map(|s| s as usize % (len + 1)) }
        }),
        3 => (0usize..10, 0usize..64, any::<bool>(), any::<u64>(), any::<bool>()).prop_map(|(o, word, wide, value, compare_hit)| {
            Op::Amo { op: AtomicOp::ALL[o], word, wide, value, compare_hit }
        }),
        1 => Just(Op::Fence),
    ]
}

struct Pair {
    a: Worker,
    b: Worker,
    ep: Endpoint,
    region: MemHandle,
    _own: Vec<u8>,
    key: Option<RemoteKey>,
}

impl Pair {
    fn new(tls: &str, alloc: bool) -> Pair {
        uct_shm::register();
        let p = ContextParams::new(Features::RMA | Features::AMO32 | Features::AMO64).with_config("TLS", tls);
        let ctx = Context::new(&p).unwrap();
        let a = Worker::new(&ctx, &WorkerParams::new("a")).unwrap();
        let b = if tls == "self" { a.clone() } else { Worker::new(&ctx, &WorkerParams::new("b")).unwrap() };
        let ep = a.ep_create(b.address()).unwrap();
        let mut own = Vec::new();
        let region = if alloc {
            b.mem_map_alloc(REGION).unwrap()
        } else {
            own = vec![0u8; REGION];
            // SAFETY: `own` lives in the pair, after the unmap in `Drop`.
            unsafe { b.mem_map(own.as_mut_ptr(), REGION) }.unwrap()
        };
        // SAFETY: the region is mapped and nothing targets it yet.
        unsafe { std::ptr::write_bytes(region.address as *mut u8, 0, REGION) };
        let key = Some(ep.rkey_unpack(&b.rkey_pack(&region).unwrap()).unwrap());
        Pair { a, b, ep, region, _own: own, key }
    }

    fn wait(&self, r: Result<Option<Request<'_>>, Status>) -> Status {
        match r {
            Err(e) => e,
            Ok(None) => Status::Ok,
            Ok(Some(r)) => {
                let t = std::time::Instant::now();
                while !r.is_completed() {
                    self.a.progress();
                    self.b.progress();
                    assert!(t.elapsed().as_secs() < 30, "an operation did not complete");
                }
                r.status()
            }
        }
    }

    fn flush(&self) {
        assert_eq!(self.wait(self.ep.flush_nbx(RequestParam::new())), Status::Ok);
    }

    fn key(&self) -> &RemoteKey {
        self.key.as_ref().unwrap()
    }

    /// Runs `ops`, checking every result against the model.
    fn run(&self, ops: &[Op]) -> Result<(), TestCaseError> {
        let base = self.region.address as u64;
        let mut model = vec![0u8; REGION];
        for op in ops {
            match *op {
                Op::Put { off, len, seed, split } => {
                    let mut data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed)).collect();
                    let st = match split {
                        Some(s) if len > 0 => {
                            let (x, y) = data.split_at_mut(s);
                            let iov = [
                                IoVec { buffer: x.as_mut_ptr(), length: x.len() },
                                IoVec { buffer: y.as_mut_ptr(), length: y.len() },
                            ];
                            // SAFETY: the buffers and the list outlive the request (waited for).
                            self.wait(unsafe {
                                self.ep.put_nbx(SendData::Iov(&iov), base + off as u64, self.key(), RequestParam::new())
                            })
                        }
                        // SAFETY: as above.
                        _ => self.wait(unsafe {
                            self.ep.put_nbx(SendData::Contig(&data), base + off as u64, self.key(), RequestParam::new())
                        }),
                    };
                    prop_assert_eq!(st, Status::Ok, "{:?}", op);
                    self.flush();
                    model[off..off + len].copy_from_slice(&data);
                }
                Op::Get { off, len, split } => {
                    let mut back = vec![0xeeu8; len];
                    let st = match split {
                        Some(s) if len > 0 => {
                            let (x, y) = back.split_at_mut(s);
                            let iov = [
                                IoVec { buffer: x.as_mut_ptr(), length: x.len() },
                                IoVec { buffer: y.as_mut_ptr(), length: y.len() },
                            ];
                            // SAFETY: the buffers and the list outlive the request (waited for).
                            self.wait(unsafe {
                                self.ep.get_nbx(RecvData::Iov(&iov), base + off as u64, self.key(), RequestParam::new())
                            })
                        }
                        // SAFETY: as above.
                        _ => self.wait(unsafe {
                            self.ep.get_nbx(
                                RecvData::Contig(&mut back),
                                base + off as u64,
                                self.key(),
                                RequestParam::new(),
                            )
                        }),
                    };
                    prop_assert_eq!(st, Status::Ok, "{:?}", op);
                    prop_assert!(back == model[off..off + len], "{:?}: the data differs from the model", op);
                }
                Op::Amo { op: aop, word, wide, value, compare_hit } => {
                    let size = if wide { 8 } else { 4 };
                    let off = word * 8;
                    let mut old = [0u8; 8];
                    old[..size].copy_from_slice(&model[off..off + size]);
                    let old = u64::from_le_bytes(old);
                    let compare = if compare_hit { old } else { !old };
                    let bits = if wide { 64 } else { 32 };
                    let operand = if wide { Operand::U64(value) } else { Operand::U32(value as u32) };
                    let mut reply = [compare; 1];
                    let reply_ptr = aop.fetches().then_some(reply.as_mut_ptr().cast::<u8>());
                    // SAFETY: `reply` outlives the request (waited for); 8-byte aligned.
                    let r = unsafe {
                        self.ep.atomic_op_nbx(
                            aop,
                            operand,
                            base + off as u64,
                            self.key(),
                            reply_ptr,
                            RequestParam::new(),
                        )
                    };
                    prop_assert_eq!(self.wait(r), Status::Ok, "{:?}", op);
                    self.flush();
                    if aop.fetches() {
                        let mask = if wide { u64::MAX } else { u32::MAX as u64 };
                        prop_assert_eq!(reply[0] & mask, old, "{:?}: fetched", op);
                    }
                    let new = aop.apply(old, value, compare, bits);
                    model[off..off + size].copy_from_slice(&new.to_le_bytes()[..size]);
                    // SAFETY: mapped, and nothing targets it between operations.
                    let now = unsafe { std::slice::from_raw_parts((base as usize + off) as *const u8, size) };
                    prop_assert!(now == &model[off..off + size], "{:?}: the target's word differs from the model", op);
                }
                Op::Fence => self.a.fence().unwrap(),
            }
        }
        // The whole region agrees at the end.
        // SAFETY: mapped, and nothing targets it now.
        let all = unsafe { std::slice::from_raw_parts(base as *const u8, REGION) };
        prop_assert!(all == &model[..], "the region differs from the model");
        Ok(())
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        self.key.take();
        let _ = self.b.mem_unmap(self.region);
    }
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn operations_agree_with_a_model_of_the_remote_memory(ops in proptest::collection::vec(op(), 1..40)) {
        let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        for (tls, alloc) in [("self", true), ("self", false), ("posix,cma", true), ("posix,cma", false), ("posix", false)] {
            let p = Pair::new(tls, alloc);
            p.run(&ops).map_err(|e| TestCaseError::fail(format!("{tls} alloc={alloc}: {e}")))?;
        }
    }
}
