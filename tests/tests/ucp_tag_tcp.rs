//! UCP tag matching over the tcp transport alone (`UCX_TLS=tcp`), across processes on the
//! loopback device: the scenarios of `ucp_tag` under every forced protocol configuration (no
//! zero-copy and no remote memory access over tcp: rendezvous moves the data in active
//! messages).

#[path = "common/tag_scenarios.rs"]
mod scenarios;

use scenarios::*;
use ucp::{Worker, WorkerParams};

#[test]
fn over_tcp() {
    let tls = "tcp";
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for (name, cfg) in CONFIGS {
        let mut all: Vec<(&str, &str)> = vec![("NET_DEVICES", "lo")];
        all.extend_from_slice(cfg);
        let w: &'static Worker =
            Box::leak(Box::new(Worker::new(&context(tls, &all), &WorkerParams::new("receiver")).unwrap()));
        let mut s = RemoteSender::spawn(w, tls, &all);
        let lanes = s.lanes(w);
        eprintln!("{tls}, {name}: peer's lanes: {lanes}");
        assert!(lanes.starts_with("connected "), "{lanes}");
        assert!(lanes.split(' ').any(|l| l == "am=tcp"), "expected an am lane on tcp, got {lanes}");
        all_scenarios(w, &mut s, &format!("{tls}, {name}"));
        let mut s2 = RemoteSender::spawn(w, tls, &all);
        flood(w, &mut [&mut s, &mut s2], 200);
        let c = w.proto_counts();
        eprintln!("{tls}, {name}: {c:?}");
        if name.starts_with("rndv") {
            assert!(c.rndv_am > 0, "rendezvous over tcp goes in active messages: {c:?}");
        }
    }
}
