//! The InfiniBand transports across two processes: the uct conformance kit against `rc_verbs`
//! and `ud_verbs` with the receiving side in this package's `kit-agent` program (the options and
//! the one-process runs are `uct-ib`'s), and `ud_verbs`' exactly-once in-order delivery to
//! another process at 10% injected loss. Needs an RDMA device: run with `tools/rdma-vm/test`.
//! Without one the tests say so and pass, unless `UCX_RS_REQUIRE_RDMA=1`.

#[path = "../../crates/uct-ib/tests/common/kit.rs"]
mod kit_common;
#[path = "../../crates/uct-ib/tests/ud_common/mod.rs"]
mod ud_common;

use std::time::{Duration, Instant};

use uct::conformance::{AgentCommand, Options, Pair};
use ud_common::*;

fn agent() -> AgentCommand {
    AgentCommand::program(env!("CARGO_BIN_EXE_kit-agent"))
}

#[test]
fn rc_verbs_conformance_across_processes() {
    uct_ib::register();
    if let Some(r) = kit_common::resource("rc_verbs") {
        kit_common::run(kit_common::rc_verbs_options(&r).across_processes(agent()), |name, remote| {
            name == "peer_failure" && !remote
        });
    }
}

#[test]
fn rc_verbs_conformance_with_tag_matching_across_processes() {
    uct_ib::register();
    if let Some(r) = kit_common::resource("rc_verbs") {
        let opts = kit_common::rc_verbs_options(&r)
            .with_config("TM_ENABLE", "y")
            .with_config("RX_QUEUE_LEN", "256")
            .with_tag_handlers()
            .across_processes(agent());
        kit_common::run(opts, |name, remote| name == "peer_failure" && !remote);
    }
}

#[test]
fn ud_verbs_conformance_across_processes() {
    uct_ib::register();
    if let Some(r) = kit_common::resource("ud_verbs") {
        kit_common::run(kit_common::ud_verbs_options(&r).across_processes(agent()), |name, remote| {
            name == "atomics" || (name == "peer_failure" && !remote)
        });
    }
}

/// 3000 messages to an interface in another process, both dropping 10% of what they receive.
#[test]
fn ten_percent_loss_across_processes() {
    const AM: u8 = 3;
    uct_ib::register();
    let Some((md, port)) = device() else { return };
    let _turn = uct::conformance::take_turn();
    let res = format!("ud_verbs/{}:{port}", md.dev.name);
    let opts = Options::new(&res)
        .with_config("LOSS", "drop=10%,seed=5")
        .with_config("RX_QUEUE_LEN", "1024")
        .across_processes(agent());
    let pair = Pair::open(&opts, false, 1).expect("open a pair across processes");
    pair.listen(AM).unwrap();
    let ep = &pair.eps[0];
    let attr = pair.sender().attr().clone();
    let n = 3000u64;
    let mut got = Vec::new();
    let start = Instant::now();
    let mut next = 0;
    // Send in chunks, collecting each chunk (all of it: nothing else is in flight then).
    while next < n {
        let end = (next + 500).min(n);
        while next < end {
            if !send(&**ep, AM, next, attr.am.max_short, attr.am.max_bcopy).expect("send") {
                pair.worker.progress();
                assert!(start.elapsed() < Duration::from_secs(300), "{next} of {n} sent");
                continue;
            }
            next += 1;
        }
        got.extend(pair.collect(AM, (next as usize) - got.len()));
    }
    for (i, m) in got.iter().enumerate() {
        let seq = u64::from_ne_bytes(m[..8].try_into().unwrap());
        assert_eq!(seq, i as u64, "message {i} out of order");
        assert!(m[8..].iter().enumerate().all(|(k, &x)| x == filler(seq, k)), "message {i} corrupted");
    }
    assert!(pair.failures.borrow().is_empty());
    eprintln!("3000 messages across processes at 10% loss in {:?}", start.elapsed());
}
