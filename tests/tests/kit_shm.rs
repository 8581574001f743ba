//! The uct conformance kit against `posix`, `sysv` and `cma` across two processes: the
//! receiving side (interface, handlers, kept descriptors, target memory) lives in this
//! package's `kit-agent` program. The one-process runs are in `uct-shm`'s own tests. Every
//! test here busy-polls, so they take turns.

use uct::conformance::{self as kit, AgentCommand, Options, Verdict};

fn agent() -> AgentCommand {
    AgentCommand::program(env!("CARGO_BIN_EXE_kit-agent"))
}

fn opts(tl: &str) -> Options {
    uct_shm::register();
    Options::new(&format!("{tl}/memory")).with_scarce_config("FIFO_SIZE", "8").across_processes(agent())
}

fn run(opts: Options) {
    kit::run_checked(&opts, |name, _why, remote| name == "am_zcopy_iov" || (name == "peer_failure" && !remote));
}

#[test]
fn posix_conformance_across_processes() {
    run(opts("posix"));
}

#[test]
fn sysv_conformance_across_processes() {
    run(opts("sysv"));
}

/// More messages in flight than the FIFO holds, to a receiver in another process: the FIFO
/// wraps around many times, every message arrives once and in order.
fn wrap_around(tl: &str) {
    use uct::{Outcome, SendFlags};
    let _turn = kit::take_turn();
    let pair = kit::Pair::open(&opts(tl), true, 1).unwrap();
    const N: u64 = 5000;
    pair.listen(3).unwrap();
    let ep = &pair.eps[0];
    for seq in 0..N {
        let r = if seq % 3 == 0 {
            pair.retry("am_bcopy", || {
                ep.am_bcopy(
                    3,
                    &mut |b: &mut [u8]| {
                        b[..8].copy_from_slice(&seq.to_ne_bytes());
                        b[8..300].fill(seq as u8);
                        300
                    },
                    SendFlags::empty(),
                )
            })
            .map(|o| o.map(|_| ()))
        } else {
            pair.retry("am_short", || ep.am_short(3, seq, &[seq as u8; 16]))
        };
        assert_eq!(r, Ok(Outcome::Done(())), "{tl}: send {seq}");
    }
    let got = pair.collect(3, N as usize);
    for (i, m) in got.iter().enumerate() {
        let seq = u64::from_ne_bytes(m[..8].try_into().unwrap());
        assert_eq!(seq, i as u64, "{tl}: message {i} out of order");
        let (len, fill) = if seq % 3 == 0 { (300, 292) } else { (24, 16) };
        assert_eq!(m.len(), len, "{tl}: message {i} length");
        assert!(m[8..8 + fill].iter().all(|&b| b == seq as u8), "{tl}: message {i} payload");
    }
}

#[test]
fn posix_fifo_wrap_across_processes() {
    wrap_around("posix");
}

#[test]
fn sysv_fifo_wrap_across_processes() {
    wrap_around("sysv");
}

/// `cma` (zero-copy put/get only) with the target memory in the agent: the checks it can run
/// pass, and a killed agent is noticed.
#[test]
fn cma_conformance_across_processes() {
    uct_shm::register();
    if let Some((_, why)) = uct::unavailable_components().into_iter().find(|(n, _)| *n == "cma") {
        eprintln!("cma unavailable here: {why}");
        return;
    }
    let results =
        kit::run_checked(&Options::new("cma/memory").across_processes(agent()), |_, why, _| why.starts_with("no "));
    let passed: Vec<_> = results.iter().filter(|(_, v)| *v == Verdict::Passed).map(|(n, _)| *n).collect();
    for m in ["put_get", "flush", "ep_check", "rkey_unpack_garbage", "peer_failure"] {
        assert!(passed.contains(&m), "cma: {m} must run and pass (passed: {passed:?})");
    }
}
