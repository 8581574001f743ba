//! The stream scenario across processes, shared by `ucp_stream` and `ucp_stream_ib`.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use tests::peer::start_ucp_peer;
use ucp::{Context, ContextParams, Features, Worker, WorkerParams};

/// Busy-polling tests run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

const LIMIT: Duration = Duration::from_secs(600);

/// `count` random sends (up to `max` bytes; 99 in 100 up to 64) from the peer to the test, then
/// `count / 4` the other way, received with random sizes (up to `4 * max`) and checked byte for
/// byte.
pub fn both_ways(tls: &str, cfg: &[(&str, &str)], count: u64, max: u64) {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let mut p = ContextParams::new(Features::STREAM).with_config("TLS", tls);
    for (k, v) in cfg {
        p = p.with_config(k, v);
    }
    let w = Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new("stream-test")).unwrap();
    let mut peer = start_ucp_peer(env!("CARGO_BIN_EXE_ucp-peer"), "stream", &[], &w, tls, cfg);
    let progress = |w: &Worker| {
        w.progress();
    };
    // The peer sends first: its endpoint reaches us, and poll names ours.
    peer.tell(&format!("send {count} 7 {max}"));
    let t = Instant::now();
    let ep = loop {
        w.progress();
        if let Some(e) = w.stream_poll(4).unwrap().into_iter().next() {
            break e;
        }
        assert!(t.elapsed() < LIMIT, "{tls}: no stream data arrived");
    };
    // Its bytes queue here until we receive them; the total is known once its sends completed.
    let l = peer.line(LIMIT, || progress(&w));
    let end: u64 = l.strip_prefix("sent ").and_then(|x| x.parse().ok()).unwrap_or_else(|| panic!("{tls}: '{l}'"));
    tests::stream::recv_checked(&w, &ep, 0, end, 13, 4 * max, LIMIT).unwrap_or_else(|e| panic!("{tls}: {e}"));
    eprintln!("{tls}: {count} sends, {end} bytes from the peer, checked");
    // The other way: we send, the peer receives and checks.
    let n = count / 4;
    let mine = tests::stream::send_pieces(&w, &ep, 0, n, 19, max, LIMIT);
    peer.tell(&format!("recv {mine} 23 {}", 4 * max));
    let a = peer.line(LIMIT, || progress(&w));
    assert_eq!(a, "ok", "{tls}: the peer's check of our {mine} bytes");
    eprintln!("{tls}: {n} sends, {mine} bytes to the peer, checked");
}
