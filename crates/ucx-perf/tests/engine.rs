//! The measurement engine over `posix`: every UCT test in loopback, and the main ones between
//! two sides (threads with their own workers, exchanging addresses over channels).

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;

use ucx_perf::meter::Measured;
use ucx_perf::uct_tests::{run, Cmd, Exchange, Layout, UctTestSpec};

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

fn spec(cmd: Cmd, pingpong: bool, layout: Layout, size: usize) -> UctTestSpec {
    UctTestSpec {
        cmd,
        pingpong,
        layout,
        msg_sizes: vec![size],
        iters: 20_000,
        warmup: 1000,
        fc_window: 127,
        percentile: 50.0,
        no_responder_progress: false,
        resource: "posix/memory".into(),
        loopback: true,
        index: 0,
        max_outstanding: 1,
    }
}

fn check(name: &str, finals: &[Measured], iters: u64) {
    assert_eq!(finals.len(), 1, "{name}: one final report");
    let m = finals[0];
    assert_eq!(m.iters, iters, "{name}: iterations");
    assert!(m.lat_overall_us > 0.0 && m.msgrate_overall > 0.0 && m.bw_overall_mbs > 0.0, "{name}: {m:?}");
}

const ALL: &[(&str, Cmd, bool, Layout, usize)] = &[
    ("am_lat", Cmd::Am, true, Layout::Short, 8),
    ("am_lat bcopy", Cmd::Am, true, Layout::Bcopy, 1024),
    ("am_lat shortiov", Cmd::Am, true, Layout::ShortIov, 64),
    ("put_lat", Cmd::Put, true, Layout::Short, 8),
    ("add_lat", Cmd::Add, true, Layout::Short, 8),
    ("get", Cmd::Get, false, Layout::Bcopy, 64),
    ("fadd", Cmd::Fadd, false, Layout::Short, 8),
    ("swap", Cmd::Swap, false, Layout::Short, 8),
    ("cswap", Cmd::Cswap, false, Layout::Short, 4),
    ("am_bw", Cmd::Am, false, Layout::Short, 8),
    ("am_bw bcopy", Cmd::Am, false, Layout::Bcopy, 8192),
    ("put_bw", Cmd::Put, false, Layout::Bcopy, 4096),
    ("add_mr", Cmd::Add, false, Layout::Short, 8),
];

#[test]
fn cma_zero_copy() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    uct_shm::register();
    if uct::unavailable_components().iter().any(|(n, _)| *n == "cma") {
        return;
    }
    for (name, cmd) in [("put_bw zcopy", Cmd::Put), ("get zcopy", Cmd::Get)] {
        let mut s0 = spec(cmd, false, Layout::Zcopy, 1 << 20);
        s0.resource = "cma/memory".into();
        s0.iters = 200;
        s0.warmup = 10;
        let mut finals = Vec::new();
        run(&s0, &mut Loopback, &mut |m, fin| {
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
        let mut s1 = s0.clone();
        s1.index = 1;
        let server = std::thread::spawn(move || {
            uct_shm::register();
            run(&s0, &mut Chan(a_tx, a_rx), &mut |_, _| {})
        });
        let mut finals = Vec::new();
        let r = run(&s1, &mut Chan(b_tx, b_rx), &mut |m, fin| {
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
    for (cmd, layout, size, what) in
        [(Cmd::Am, Layout::Bcopy, 9000, "AM bcopy"), (Cmd::Am, Layout::Short, 1000, "AM short")]
    {
        let err = run(&spec(cmd, true, layout, size), &mut Loopback, &mut |_, _| {}).unwrap_err();
        assert!(err.contains(what) && err.contains(&size.to_string()), "{err}");
    }
}

#[test]
fn every_uct_test_in_loopback() {
    let _s = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    uct_shm::register();
    for &(name, cmd, pp, layout, size) in ALL {
        let mut finals = Vec::new();
        run(&spec(cmd, pp, layout, size), &mut Loopback, &mut |m, fin| {
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
    for &(name, cmd, pp, layout, size) in ALL {
        let (a_tx, b_rx) = channel();
        let (b_tx, a_rx) = channel();
        let mut s0 = spec(cmd, pp, layout, size);
        s0.loopback = false;
        let mut s1 = s0.clone();
        s1.index = 1;
        let server = std::thread::spawn(move || {
            uct_shm::register();
            let mut finals = Vec::new();
            run(&s0, &mut Chan(a_tx, a_rx), &mut |m, fin| {
                if fin {
                    finals.push(*m)
                }
            })
            .map(|_| finals)
        });
        let mut finals = Vec::new();
        let r = run(&s1, &mut Chan(b_tx, b_rx), &mut |m, fin| {
            if fin {
                finals.push(*m)
            }
        });
        let server = server.join().unwrap();
        r.unwrap_or_else(|e| panic!("{name} client: {e}"));
        let sf = server.unwrap_or_else(|e| panic!("{name} server: {e}"));
        check(name, &finals, 20_000);
        if pp || cmd == Cmd::Am {
            check(&format!("{name} (server)"), &sf, 20_000);
        }
    }
}
