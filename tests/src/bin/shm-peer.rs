//! A uct shared-memory peer for `tests/shm_two_process.rs`: `shm-peer ROLE TL` opens an
//! interface of `TL` (`posix`, `sysv`, `cma`) and plays `ROLE`:
//!
//! | role | what it does |
//! |---|---|
//! | `sender` | reads `addr DEV IFACE`, sends [`COUNT`] messages (short and bcopy alternating), says `sent N` |
//! | `receiver` | says `addr DEV IFACE`, receives 1000 messages, says `received N`, then stops progressing until its input closes |
//! | `cma-target` | registers 64 KiB, says `addr DEV IFACE KEY`, waits for its input to close |
//! | `rma-target` | allocates 4 KiB (a known value at 2048), says `key KEY`; on `check` says `verdict ok` if the test's writes are there (else `verdict bad`); waits for `bye` |
//! | `endless-sender` | reads `addr DEV IFACE`, streams 32-byte messages until killed (or 60 s) |
//!
//! Byte strings are in hex. Lines for the test start with `PEER< `.

use std::cell::Cell;
use std::io::BufRead;
use std::rc::Rc;
use std::time::{Duration, Instant};

use tests::peer::say;
use tests::text::{hex, unhex};
use uct::{AmRecv, EpParams, Iface, IfaceParams, Outcome, SendFlags, Worker};

/// Messages the `sender` sends.
const COUNT: u64 = 100_000;
const TIMEOUT: Duration = Duration::from_secs(60);

fn open(tl: &str, worker: &Worker) -> Box<dyn Iface> {
    let (_md, iface) = uct::iface_open_by_name(worker, &format!("{tl}/memory"), IfaceParams::default())
        .unwrap_or_else(|e| panic!("open {tl}/memory: {e}"));
    iface.progress_enable(uct::ProgressFlags::SEND | uct::ProgressFlags::RECV);
    iface
}

/// The next line of input that starts with `word`, without it; `None` once the input closed.
fn read(word: &str) -> Option<String> {
    let mut line = String::new();
    loop {
        line.clear();
        if std::io::stdin().lock().read_line(&mut line).ok()? == 0 {
            return None;
        }
        if let Some(rest) = line.trim_end().strip_prefix(word) {
            return Some(rest.trim_start().to_string());
        }
    }
}

/// An endpoint to the address in the `addr DEV IFACE` line of the input.
fn connect(iface: &dyn Iface) -> Box<dyn uct::Ep> {
    let addr = read("addr").expect("an address line");
    let (dev, ifa) = addr.split_once(' ').expect("addr DEV IFACE");
    let (dev, ifa) = (unhex(dev).expect("hex"), unhex(ifa).expect("hex"));
    iface.ep_create(&EpParams::to_iface(&dev, &ifa)).expect("endpoint to the test")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [role, tl] = &args[..] else { panic!("usage: shm-peer ROLE TL") };
    uct_shm::register();
    let worker = Worker::default();
    let iface = open(tl, &worker);
    match role.as_str() {
        "sender" => {
            let ep = connect(&*iface);
            for seq in 0..COUNT {
                loop {
                    let r = if seq % 2 == 0 {
                        ep.am_short(1, seq, &seq.to_le_bytes())
                    } else {
                        ep.am_bcopy(
                            1,
                            &mut |b: &mut [u8]| {
                                b[..8].copy_from_slice(&seq.to_ne_bytes());
                                b[8..200].fill(seq as u8);
                                200
                            },
                            SendFlags::empty(),
                        )
                        .map(|o| o.map(|_| ()))
                    };
                    match r {
                        Ok(Outcome::Done(())) => break,
                        Ok(Outcome::NoResource) => {
                            worker.progress();
                        }
                        other => panic!("send {seq}: {other:?}"),
                    }
                }
            }
            say(&format!("sent {COUNT}"));
        }
        "receiver" => {
            let got = Rc::new(Cell::new(0u64));
            let g2 = got.clone();
            iface.set_am_handler(1, Some(Rc::new(move |_m: AmRecv<'_>| g2.set(g2.get() + 1)))).unwrap();
            say(&format!("addr {} {}", hex(&iface.device_address()), hex(&iface.iface_address())));
            let start = Instant::now();
            // Receive a little, then stop progressing: the sender's FIFO fills up.
            while got.get() < 1000 && start.elapsed() < TIMEOUT {
                worker.progress();
            }
            say(&format!("received {}", got.get()));
            read("never"); // until killed, or the input closes
        }
        "cma-target" => {
            let (md, _) = uct::find_resource("cma/memory").expect("cma");
            let mut buf = vec![0u8; 1 << 16];
            // SAFETY: `buf` outlives the registration, dropped first below.
            let memh = unsafe { md.mem_reg(buf.as_mut_ptr(), buf.len(), uct::MemAccess::ALL) }.unwrap();
            let key = md.mkey_pack(&memh).unwrap();
            say(&format!("addr {} {} {}", hex(&iface.device_address()), hex(&iface.iface_address()), hex(&key)));
            read("never");
            drop(memh);
            drop(buf);
        }
        "rma-target" => {
            let (md, _) = uct::find_resource(&format!("{tl}/memory")).unwrap();
            let memh = md.mem_alloc(4096, uct::MemAccess::ALL, "rma-target").unwrap();
            // SAFETY: 4096 bytes of our own allocation; the test writes only while we wait.
            let region = unsafe { std::slice::from_raw_parts_mut(memh.address(), 4096) };
            region[2048..2056].copy_from_slice(&0x1122_3344_5566_7788u64.to_ne_bytes());
            say(&format!("key {}", hex(&md.mkey_pack(&memh).unwrap())));
            if read("check").is_none() {
                return;
            }
            // SAFETY: as above; the test is done writing (it said `check`).
            let region = unsafe { std::slice::from_raw_parts(memh.address(), 4096) };
            let ok = region[..100].iter().enumerate().all(|(i, &b)| b == i as u8)
                && u64::from_ne_bytes(region[1024..1032].try_into().unwrap()) == 1000 + 5
                && u32::from_ne_bytes(region[1040..1044].try_into().unwrap()) == 0xffff_0000 ^ 0x0f0f;
            say(&format!("verdict {}", if ok { "ok" } else { "bad" }));
            read("bye");
        }
        "endless-sender" => {
            let ep = connect(&*iface);
            let start = Instant::now();
            let mut seq = 0u64;
            while start.elapsed() < TIMEOUT {
                if ep.am_short(1, seq, &[0u8; 32]) == Ok(Outcome::Done(())) {
                    seq += 1;
                } else {
                    worker.progress();
                }
            }
        }
        other => panic!("unknown role {other}"),
    }
}
