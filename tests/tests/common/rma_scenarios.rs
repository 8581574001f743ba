//! The RMA and atomics scenarios across processes, run by `ucp_rma` (shared memory) and
//! `ucp_rma_ib` (InfiniBand in the Soft-RoCE VM). This process's worker is the target (and
//! sometimes the origin), `ucp-peer rma` the other side.

#![allow(dead_code)]

use std::time::Duration;

use tests::peer::{start_ucp_peer, Peer};
use tests::text::{hex, pattern, unhex};
use ucp::{
    Context, ContextParams, Features, MemHandle, RecvData, RequestParam, SendData, Status, Worker, WorkerParams,
};

/// Busy-polling tests run one at a time.
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

const LIMIT: Duration = Duration::from_secs(120);

pub fn worker(tls: &str) -> Worker {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let p = ContextParams::new(Features::RMA | Features::AMO32 | Features::AMO64).with_config("TLS", tls);
    Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new("target")).unwrap()
}

fn peer(w: &Worker, tls: &str) -> Peer {
    start_ucp_peer(env!("CARGO_BIN_EXE_ucp-peer"), "rma", &[], w, tls, &[])
}

/// This process's region: allocated by the worker or its own buffer, with its packed key.
struct Region {
    h: MemHandle,
    _keep: Vec<u8>,
    packed: String,
}

impl Region {
    fn new(w: &Worker, len: usize, alloc: bool) -> Region {
        let (h, keep) = if alloc {
            (w.mem_map_alloc(len).unwrap(), Vec::new())
        } else {
            let mut v = vec![0u8; len];
            // SAFETY: `v` lives in the region until it is dropped, after the unmap.
            (unsafe { w.mem_map(v.as_mut_ptr(), len) }.unwrap(), v)
        };
        let packed = hex(&w.rkey_pack(&h).unwrap());
        Region { h, _keep: keep, packed }
    }

    fn addr(&self) -> u64 {
        self.h.address as u64
    }

    /// The bytes at `off` (read while no peer writes them, or racing in the fence test).
    fn bytes(&self, off: usize, len: usize) -> &[u8] {
        assert!(off + len <= self.h.length);
        // SAFETY: within the mapped region; the peer's writes race only where the test polls.
        unsafe { std::slice::from_raw_parts((self.h.address + off) as *const u8, len) }
    }

    fn write(&self, off: usize, data: &[u8]) {
        assert!(off + data.len() <= self.h.length);
        // SAFETY: within the mapped region, and no peer operation targets it now.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), (self.h.address + off) as *mut u8, data.len()) }
    }

    fn unmap(self, w: &Worker) {
        w.mem_unmap(self.h).unwrap();
    }
}

pub const SIZES: [usize; 10] = [0, 1, 8, 100, 8192, 8257, 65536, 100_000, 1 << 20, 4 << 20];

/// Puts and gets of 0 B .. 4 MiB both ways, both kinds of memory, over each of `tls`.
pub fn put_and_get_both_ways(tls_list: &[&str]) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for &tls in tls_list {
        let w = worker(tls);
        let mut p = peer(&w, tls);
        let prog = || {
            w.progress();
        };
        for alloc in [true, false] {
            let what = format!("{tls}, {}", if alloc { "allocated" } else { "user memory" });
            // The peer puts into and gets from this process's memory.
            let r = Region::new(&w, (4 << 20) + 16, alloc);
            assert_eq!(p.ask(&format!("unpack {}", r.packed), LIMIT, prog), "unpacked");
            for (i, &n) in SIZES.iter().enumerate() {
                let seed = i as u64 + 10;
                let ans = p.ask(&format!("put {} {n} {seed}", r.addr() + 3), LIMIT, prog);
                assert_eq!(ans, "done Ok", "{what}: put {n}");
                // Flushed by the origin: here now, without progressing first.
                assert_eq!(r.bytes(3, n), &pattern(n, seed)[..], "{what}: put {n}");
                r.write(5, &pattern(n, seed + 100));
                let ans = p.ask(&format!("get {} {n} {}", r.addr() + 5, seed + 100), LIMIT, prog);
                assert_eq!(ans, "ok", "{what}: get {n}");
            }
            // This process puts into and gets from the peer's memory.
            let len = (4 << 20) + 16;
            let ans = p.ask(&format!("map {len} {} 77", if alloc { "alloc" } else { "user" }), LIMIT, prog);
            let (k, a) = ans.strip_prefix("key ").and_then(|s| s.split_once(' ')).expect("key HEX ADDR");
            let base: u64 = a.parse().unwrap();
            let ep = w.ep_create(&peer_address(&w, &mut p)).unwrap();
            let key = ep.rkey_unpack(&unhex(k).unwrap()).unwrap();
            let wait = |r: Result<Option<ucp::Request<'_>>, Status>| match r {
                Err(e) => e,
                Ok(None) => Status::Ok,
                Ok(Some(r)) => {
                    let t = std::time::Instant::now();
                    while !r.is_completed() {
                        w.progress();
                        assert!(t.elapsed() < LIMIT);
                    }
                    r.status()
                }
            };
            let mut back = vec![0u8; 4 << 20];
            // SAFETY: `back` outlives the request.
            let st = wait(unsafe { ep.get_nbx(RecvData::Contig(&mut back), base, &key, RequestParam::new()) });
            assert_eq!(st, Status::Ok);
            assert_eq!(back, pattern(len, 77)[..4 << 20], "{what}: get from the peer");
            for (i, &n) in SIZES.iter().enumerate() {
                let data = pattern(n, i as u64 + 50);
                // SAFETY: `data` outlives the request.
                let put = unsafe { ep.put_nbx(SendData::Contig(&data), base + 9, &key, RequestParam::new()) };
                assert_eq!(wait(put), Status::Ok);
                assert_eq!(wait(ep.flush_nbx(RequestParam::new())), Status::Ok);
                let ans = p.ask(&format!("check {} {n} {}", base + 9, i as u64 + 50), LIMIT, prog);
                assert_eq!(ans, "ok", "{what}: put {n} into the peer");
            }
            drop(key);
            r.unmap(&w);
        }
        p.finish(LIMIT, || {
            w.progress();
        });
    }
}

/// The peer's worker address: a second peer connection is not needed, the endpoint the peer
/// made to us is found by wireup; we create our own to it from the address it reports.
fn peer_address(w: &Worker, p: &mut Peer) -> Vec<u8> {
    let _ = w;
    let ans = p.ask("address", LIMIT, || {
        w.progress();
    });
    unhex(ans.strip_prefix("address ").expect("address HEX")).expect("hex")
}

/// A peer's data, fence, flag: seen in that order here.
pub fn fence_orders_the_flag_after_the_data(tls_list: &[&str]) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for &tls in tls_list {
        for alloc in [true, false] {
            let w = worker(tls);
            let mut p = peer(&w, tls);
            let len = 256 * 1024;
            let r = Region::new(&w, len + 8, alloc);
            assert_eq!(
                p.ask(&format!("unpack {}", r.packed), LIMIT, || {
                    w.progress();
                }),
                "unpacked"
            );
            let rounds = 30;
            p.tell(&format!("fence {} {} {len} {rounds}", r.addr() + 8, r.addr()));
            let mut seen = 0u8;
            let t = std::time::Instant::now();
            loop {
                w.progress();
                let flag = r.bytes(0, 1)[0];
                if flag != seen {
                    // Whenever the flag of round `flag` is seen, the data of that round (or a
                    // later one) is all there.
                    let data = r.bytes(8, len);
                    assert!(data.iter().all(|&b| b >= flag), "{tls} alloc={alloc}: flag {flag} before its data");
                    seen = flag;
                }
                if let Some(l) = p.try_line() {
                    assert_eq!(l, "done");
                    break;
                }
                assert!(t.elapsed() < LIMIT);
            }
            assert_eq!(r.bytes(0, 1)[0], rounds as u8);
            p.finish(LIMIT, || {
                w.progress();
            });
            r.unmap(&w);
        }
    }
}

/// Two peers doing `n` fetch-and-adds each on one counter of this process, over `tls`, on
/// both kinds of memory: the exact sum, every value fetched once.
pub fn two_processes_fetch_and_add(tls: &str, n: u64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for alloc in [true, false] {
        let w = worker(tls);
        let r = Region::new(&w, 64, alloc);
        let mut peers = [peer(&w, tls), peer(&w, tls)];
        let dir = std::env::temp_dir();
        let files: Vec<_> = (0..2).map(|i| dir.join(format!("ucx-rs-fadd-{}-{i}", std::process::id()))).collect();
        for p in peers.iter_mut() {
            assert_eq!(
                p.ask(&format!("unpack {}", r.packed), LIMIT, || {
                    w.progress();
                }),
                "unpacked"
            );
        }
        for (p, f) in peers.iter_mut().zip(&files) {
            p.tell(&format!("fadd {} {n} {}", r.addr() + 8, f.display()));
        }
        for p in peers.iter_mut() {
            assert_eq!(
                p.line(LIMIT, || {
                    w.progress();
                }),
                "done"
            );
        }
        let total = u64::from_le_bytes(r.bytes(8, 8).try_into().unwrap());
        assert_eq!(total, 2 * n, "{tls} alloc={alloc}");
        let mut all: Vec<u64> = Vec::new();
        for f in &files {
            let b = std::fs::read(f).unwrap();
            let _ = std::fs::remove_file(f);
            all.extend(b.chunks_exact(8).map(|c| u64::from_le_bytes(c.try_into().unwrap())));
        }
        all.sort_unstable();
        assert_eq!(all.len() as u64, 2 * n);
        assert!(all.iter().enumerate().all(|(i, &v)| v == i as u64), "alloc={alloc}: a value fetched twice or skipped");
        for mut p in peers {
            p.finish(LIMIT, || {
                w.progress();
            });
        }
        r.unmap(&w);
    }
}

/// Both sides put into the other's memory and flush at the same time, `rounds` times, with
/// every operation emulated over active messages (user memory that no lane of `tls` reaches):
/// each flush ends with a flush message the other side answers while its own flush waits -
/// the answer must not queue behind that flush. Data checked on both sides every round.
pub fn flushes_at_once(tls: &str, rounds: u64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let w = worker(tls);
    let mut p = peer(&w, tls);
    let prog = || {
        w.progress();
    };
    let len = 4096;
    let r = Region::new(&w, len, false);
    assert_eq!(p.ask(&format!("unpack {}", r.packed), LIMIT, prog), "unpacked");
    let ans = p.ask(&format!("map {len} user 5"), LIMIT, prog);
    let (k, a) = ans.strip_prefix("key ").and_then(|s| s.split_once(' ')).expect("key HEX ADDR");
    let base: u64 = a.parse().unwrap();
    let ep = w.ep_create(&peer_address(&w, &mut p)).unwrap();
    let key = ep.rkey_unpack(&unhex(k).unwrap()).unwrap();
    for round in 0..rounds {
        let n = 1 + (round as usize * 37) % 200;
        let (mine, theirs) = (1000 + round, 2000 + round);
        // The peer puts into this process's memory and flushes ...
        p.tell(&format!("put {} {n} {theirs}", r.addr()));
        // ... while this process does the same into the peer's.
        let data = pattern(n, mine);
        // SAFETY: `data` outlives the request (waited for below).
        let put = unsafe { ep.put_nbx(SendData::Contig(&data), base, &key, RequestParam::new()) };
        let t = std::time::Instant::now();
        let wait = |r: Result<Option<ucp::Request<'_>>, Status>| match r {
            Err(e) => e,
            Ok(None) => Status::Ok,
            Ok(Some(r)) => {
                while !r.is_completed() {
                    w.progress();
                    assert!(t.elapsed() < LIMIT, "{tls}: round {round}: no completion in {LIMIT:?}");
                }
                r.status()
            }
        };
        assert_eq!(wait(put), Status::Ok);
        assert_eq!(wait(ep.flush_nbx(RequestParam::new())), Status::Ok, "{tls}: round {round}: flush");
        assert_eq!(p.line(LIMIT, prog), "done Ok", "{tls}: round {round}: the peer's put and flush");
        assert_eq!(r.bytes(0, n), &pattern(n, theirs)[..], "{tls}: round {round}: the peer's put");
        let ans = p.ask(&format!("check {base} {n} {mine}"), LIMIT, prog);
        assert_eq!(ans, "ok", "{tls}: round {round}: the put into the peer");
    }
    drop(key);
    r.unmap(&w);
    p.finish(LIMIT, prog);
}

/// Two peers taking a compare-and-swap lock `n` times each around a get/increment/put of a
/// counter of this process: no update lost; `(tls, allocated memory)` each.
pub fn compare_and_swap_lock(cases: &[(&str, bool)], n: u64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for &(tls, alloc) in cases {
        let w = worker(tls);
        let r = Region::new(&w, 64, alloc);
        let mut peers = [peer(&w, tls), peer(&w, tls)];
        for p in peers.iter_mut() {
            assert_eq!(
                p.ask(&format!("unpack {}", r.packed), LIMIT, || {
                    w.progress();
                }),
                "unpacked"
            );
        }
        for p in peers.iter_mut() {
            p.tell(&format!("lock {} {} {n}", r.addr(), r.addr() + 8));
        }
        for p in peers.iter_mut() {
            assert_eq!(
                p.line(LIMIT, || {
                    w.progress();
                }),
                "done"
            );
        }
        let count = u64::from_le_bytes(r.bytes(8, 8).try_into().unwrap());
        assert_eq!(count, 2 * n, "{tls} alloc={alloc}: an update was lost: the lock did not exclude");
        assert_eq!(r.bytes(0, 8), &[0u8; 8], "released");
        for mut p in peers {
            p.finish(LIMIT, || {
                w.progress();
            });
        }
        r.unmap(&w);
    }
}
