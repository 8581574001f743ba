//! The measurement engine over `posix`: every UCT test in loopback, and the main ones between
//! two sides (threads with their own workers, exchanging addresses over channels).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

use ucx_perf::meter::Measured;
use ucx_perf::params::{Command, DataLayout, PerfParams, TestKind};
use ucx_perf::uct_tests::{Exchange, UctTestSpec};

static SERIAL: Mutex<()> = Mutex::new(());

struct Loopback;

impl Exchange for Loopback {
    fn exchange(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        Ok(mine.to_vec())
    }
}

struct Chan(Sender<Vec<u8>>, Receiver<Vec<u8>>);

impl Exchange for Chan {
    fn exchange(&mut self, mine: &[u8]) -> Result<Vec<u8>, String> {
        self.0.send(mine.to_vec()).map_err(|e| e.to_string())?;
        self.1.recv_timeout(std::time::Duration::from_secs(60)).map_err(|e| e.to_string())
    }
}

/// The parameters of `test` as `ucx-perf -l -t <test> -D <layout> -s <size> -n 20000 -w 1000`
/// would set them.
fn params(test: TestKind, layout: DataLayout, size: usize) -> PerfParams {
    PerfParams {
        test,
        has_test: true,
        layout,
        msg_sizes: vec![size],
        iters: 20_000,
        warmup: 1000,
        loopback: true,
        max_outstanding: 1,
        ..PerfParams::default()
    }
}

/// Runs the test of `p` over `resource` as side `index`.
fn run(
    p: &PerfParams,
    resource: &str,
    index: u8,
    oob: &mut dyn Exchange,
    report: &mut dyn FnMut(&Measured, bool),
) -> Result<(), String> {
    ucx_perf::uct_tests::run(&UctTestSpec { params: p, resource, index }, oob, report)
}

fn check(name: &str, finals: &[Measured], iters: u64) {
    assert_eq!(finals.len(), 1, "{name}: one final report");
    let m = finals[0];
    assert_eq!(m.iters, iters, "{name}: iterations");
    assert!(m.lat_overall_us > 0.0 && m.msgrate_overall > 0.0 && m.bw_overall_mbs > 0.0, "{name}: {m:?}");
}

const ALL: &[(&str, TestKind, DataLayout, usize)] = &[
    ("am_lat", TestKind::AmLat, DataLayout::Short, 8),
    ("am_lat bcopy", TestKind::AmLat, DataLayout::Bcopy, 1024),
    ("am_lat shortiov", TestKind::AmLat, DataLayout::ShortIov, 64),
    ("put_lat", TestKind::PutLat, DataLayout::Short, 8),
    ("add_lat", TestKind::AddLat, DataLayout::Short, 8),
    ("get", TestKind::Get, DataLayout::Bcopy, 64),
    ("fadd", TestKind::Fadd, DataLayout::Short, 8),
    ("swap", TestKind::Swap, DataLayout::Short, 8),
    ("cswap", TestKind::Cswap, DataLayout::Short, 4),
    ("am_bw", TestKind::AmBw, DataLayout::Short, 8),
    ("am_bw bcopy", TestKind::AmBw, DataLayout::Bcopy, 8192),
    ("put_bw", TestKind::PutBw, DataLayout::Bcopy, 4096),
    ("add_mr", TestKind::AddMr, DataLayout::Short, 8),
];

#[test]
fn cma_zero_copy() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    uct_shm::register();
    if uct::unavailable_components().iter().any(|(n, _)| *n == "cma") {
        return;
    }
    for (name, test) in [("put_bw zcopy", TestKind::PutBw), ("get zcopy", TestKind::Get)] {
        let mut s0 = params(test, DataLayout::Zcopy, 1 << 20);
        s0.iters = 200;
        s0.warmup = 10;
        let mut finals = Vec::new();
        run(&s0, "cma/memory", 0, &mut Loopback, &mut |m, fin| {
            if fin {
                finals.push(*m)
            }
        })
        .unwrap_or_else(|e| panic!("{name} loopback: {e}"));
        check(name, &finals, 200);
        // Two sides.
        let (a_tx, b_rx) = channel();
        let (b_tx, a_rx) = channel();
        s0.loopback = false;
        let s1 = s0.clone();
        let server = std::thread::spawn(move || {
            uct_shm::register();
            run(&s0, "cma/memory", 0, &mut Chan(a_tx, a_rx), &mut |_, _| {})
        });
        let mut finals = Vec::new();
        let r = run(&s1, "cma/memory", 1, &mut Chan(b_tx, b_rx), &mut |m, fin| {
            if fin {
                finals.push(*m)
            }
        });
        server.join().unwrap().unwrap_or_else(|e| panic!("{name} server: {e}"));
        r.unwrap_or_else(|e| panic!("{name} client: {e}"));
        check(name, &finals, 200);
    }
}

#[test]
fn messages_over_the_transport_limit_are_an_error() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    uct_shm::register();
    // posix: AM bcopy up to UCX_MM_SEG_SIZE (8256), AM short up to the FIFO element (120).
    for (layout, size, what) in [(DataLayout::Bcopy, 9000, "AM bcopy"), (DataLayout::Short, 1000, "AM short")] {
        let p = params(TestKind::AmLat, layout, size);
        let err = run(&p, "posix/memory", 0, &mut Loopback, &mut |_, _| {}).unwrap_err();
        assert!(err.contains(what) && err.contains(&size.to_string()), "{err}");
    }
}

#[test]
fn every_uct_test_in_loopback() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    uct_shm::register();
    for &(name, test, layout, size) in ALL {
        let mut finals = Vec::new();
        run(&params(test, layout, size), "posix/memory", 0, &mut Loopback, &mut |m, fin| {
            if fin {
                finals.push(*m)
            }
        })
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        check(name, &finals, 20_000);
    }
}

#[test]
fn two_sides() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    uct_shm::register();
    for &(name, test, layout, size) in ALL {
        let (a_tx, b_rx) = channel();
        let (b_tx, a_rx) = channel();
        let mut s0 = params(test, layout, size);
        s0.loopback = false;
        let s1 = s0.clone();
        let server = std::thread::spawn(move || {
            uct_shm::register();
            let mut finals = Vec::new();
            run(&s0, "posix/memory", 0, &mut Chan(a_tx, a_rx), &mut |m, fin| {
                if fin {
                    finals.push(*m)
                }
            })
            .map(|_| finals)
        });
        let mut finals = Vec::new();
        let r = run(&s1, "posix/memory", 1, &mut Chan(b_tx, b_rx), &mut |m, fin| {
            if fin {
                finals.push(*m)
            }
        });
        let server = server.join().unwrap();
        r.unwrap_or_else(|e| panic!("{name} client: {e}"));
        let sf = server.unwrap_or_else(|e| panic!("{name} server: {e}"));
        check(name, &finals, 20_000);
        if s1.is_pingpong() || test.command() == Command::Am {
            check(&format!("{name} (server)"), &sf, 20_000);
        }
    }
}
