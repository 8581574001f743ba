//! Generic-datatype scenarios across real processes, shared by `ucp_generic` (shared memory)
//! and `ucp_generic_ib` (rc/ud in the VM). The peer is this package's `ucp-peer generic`,
//! which echoes tagged messages, active messages and stream bytes through a generic datatype
//! (`Strided(4, 7)`); this side sends through `Strided(3, 5)` and receives the echo through
//! `Strided(5, 9)`, so every byte is packed and unpacked by callbacks four times.

#![allow(dead_code)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tests::generic::Strided;
use tests::peer::{start_ucp_peer, Peer};
use tests::text::pattern;
use ucp::{
    AmHandlerFlags, AmMsg, AmRndv, AmSendFlags, Context, ContextParams, Endpoint, Features, GenericBuf, RecvData,
    RecvResult, Request, RequestParam, SendData, Status, StreamRecvFlags, Worker, WorkerParams, FULL_MASK,
};

pub const TIMEOUT: Duration = Duration::from_secs(120);

/// Sizes from empty through eager short, bcopy, multi-fragment, to rendezvous.
pub const SIZES: &[usize] = &[0, 1, 8, 100, 3000, 9000, 20_000, 200_000];

/// The configurations: as they come, without eager short, and rendezvous from 4 KiB asking
/// for the fragment, get and put schemes (generic data takes fragments whatever is asked).
pub const CONFIGS: [(&str, &[(&str, &str)]); 5] = [
    ("defaults", &[]),
    ("no short", &[("BCOPY_THRESH", "0")]),
    ("rndv am", &[("RNDV_THRESH", "4096"), ("RNDV_SCHEME", "am")]),
    ("rndv get_zcopy", &[("RNDV_THRESH", "4096"), ("RNDV_SCHEME", "get_zcopy")]),
    ("rndv put_zcopy", &[("RNDV_THRESH", "4096"), ("RNDV_SCHEME", "put_zcopy")]),
];

pub fn worker(tls: &str, cfg: &[(&str, &str)]) -> Worker {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let mut p = ContextParams::new(Features::TAG | Features::AM | Features::STREAM).with_config("TLS", tls);
    for (k, v) in cfg {
        p = p.with_config(k, v);
    }
    Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new("generic-test")).unwrap()
}

/// `got` is `data` except for one run of zeros that holds offset `at` (where a pack
/// callback failed: its piece went as zeros).
pub fn check_zeroed_piece(got: &[u8], data: &[u8], at: usize) -> Result<(), String> {
    if got.len() != data.len() {
        return Err(format!("{} bytes, not {}", got.len(), data.len()));
    }
    if got[at] != 0 {
        return Err(format!("byte {at} (in the failed piece) is {:#x}", got[at]));
    }
    let lo = (0..at).rev().find(|&i| got[i] != 0).map_or(0, |i| i + 1);
    let hi = (at..got.len()).find(|&i| got[i] != 0).unwrap_or(got.len());
    for i in (0..lo).chain(hi..got.len()) {
        if got[i] != data[i] {
            return Err(format!("byte {i} outside the failed piece {lo}..{hi} differs"));
        }
    }
    Ok(())
}

/// Active messages with id 4 (the peer's echoes): length, eager data, or a descriptor.
type Echoes = Arc<Mutex<Vec<(usize, Vec<u8>, Option<AmRndv>)>>>;

/// A `ucp-peer generic` and our endpoint to it.
pub struct GenPeer {
    peer: Peer,
    ep: Endpoint,
    echoes: Echoes,
    /// Our endpoint the peer's stream echoes arrive on.
    stream_ep: Option<Endpoint>,
}

impl GenPeer {
    pub fn spawn(w: &Worker, tls: &str, cfg: &[(&str, &str)]) -> GenPeer {
        let mut peer = start_ucp_peer(env!("CARGO_BIN_EXE_ucp-peer"), "generic", &[], w, tls, cfg);
        let ep = peer.connect(w, TIMEOUT);
        let echoes: Echoes = Arc::default();
        let e = echoes.clone();
        w.set_am_recv_handler(
            4,
            Some(move |m: &mut AmMsg<'_>| {
                let rndv = m.is_rndv().then(|| m.take_rndv().expect("descriptor"));
                let data = if rndv.is_some() { Vec::new() } else { m.data().to_vec() };
                e.lock().unwrap().push((m.length(), data, rndv));
            }),
            AmHandlerFlags::WHOLE_MSG,
        )
        .unwrap();
        GenPeer { peer, ep, echoes, stream_ep: None }
    }

    /// Closes the peer's stdin and waits for it to exit cleanly.
    pub fn finish(mut self, w: &Worker) {
        let st = self.peer.finish(TIMEOUT, || {
            w.progress();
        });
        assert!(st.success(), "the generic peer failed: {st}");
    }
}

/// What drives the operations a scenario waits for: one worker, or (`ucp_generic`) two in
/// one process.
pub trait Progress {
    /// Progresses once.
    fn progress_once(&self);
}

impl Progress for Worker {
    fn progress_once(&self) {
        self.progress();
    }
}

/// Progresses `p` until `done` (at most [`TIMEOUT`]; `what` names the wait if it runs out).
pub fn wait_until(p: &impl Progress, what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        p.progress_once();
        assert!(t.elapsed() < TIMEOUT, "timed out waiting for {what}");
    }
}

/// The outcome of a send or other operation: at once, or its request's once completed.
pub fn outcome(p: &impl Progress, r: Result<Option<Request<'_>>, Status>) -> Status {
    match r {
        Err(e) => e,
        Ok(None) => Status::Ok,
        Ok(Some(r)) => {
            wait_until(p, "a send", || r.is_completed());
            r.status()
        }
    }
}

/// The status and length of a receive: at once, or its request's once completed.
pub fn recv_outcome(p: &impl Progress, r: Result<RecvResult<'_>, Status>) -> (Status, usize) {
    match r {
        Err(e) => (e, 0),
        Ok(RecvResult::Done(i)) => (Status::Ok, i.length),
        Ok(RecvResult::Pending(r)) => {
            wait_until(p, "a receive", || r.is_completed());
            (r.status(), r.recv_info().map_or(0, |i| i.length))
        }
    }
}

/// Sends `data` tagged 1 through `sd` and receives the echo (tag 2) through `rd`: the send's
/// status, the receive's status and length, and the echo's bytes.
fn tag_echo(w: &Worker, p: &GenPeer, data: &[u8], sd: &Strided, rd: &Strided) -> (Status, (Status, usize), Vec<u8>) {
    let n = data.len();
    let (sdt, rdt) = (sd.datatype(), rd.datatype());
    let src = sd.scatter(data);
    let mut dst = vec![0xeeu8; rd.span(n)];
    // SAFETY: `dst` outlives the receive (waited for below).
    let recv = unsafe {
        w.tag_recv_nbx(
            RecvData::Generic(&GenericBuf::recv(&rdt, dst.as_mut_ptr(), n)),
            2,
            FULL_MASK,
            RequestParam::new(),
        )
    };
    // SAFETY: `src` outlives the send (waited for).
    let s = outcome(w, unsafe {
        p.ep.tag_send_nbx(SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)), 1, RequestParam::new())
    });
    let r = recv_outcome(w, recv);
    assert!(rd.gaps_untouched(&dst, n), "a gap of the tagged echo's destination was written");
    (s, r, rd.gather(&dst, n))
}

/// Sends `data` as active message 3 through `sd` and takes the echo (id 4) through `rd` when
/// it comes by rendezvous.
fn am_echo(w: &Worker, p: &GenPeer, data: &[u8], sd: &Strided, rd: &Strided) -> Vec<u8> {
    let n = data.len();
    let (sdt, rdt) = (sd.datatype(), rd.datatype());
    let src = sd.scatter(data);
    // SAFETY: `src` and the header outlive the send (waited for).
    let s = outcome(w, unsafe {
        p.ep.am_send_nbx(
            3,
            b"generic",
            SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)),
            AmSendFlags::REPLY,
            RequestParam::new(),
        )
    });
    assert_eq!(s, Status::Ok, "active message send of {n}");
    wait_until(w, "the active-message echo", || !p.echoes.lock().unwrap().is_empty());
    let (len, bytes, rndv) = p.echoes.lock().unwrap().remove(0);
    assert_eq!(len, n, "active-message echo length");
    match rndv {
        None => bytes,
        Some(d) => {
            let mut dst = vec![0xeeu8; rd.span(n)];
            // SAFETY: `dst` outlives the receive (waited for).
            let r = unsafe {
                w.am_recv_data_nbx(
                    d,
                    RecvData::Generic(&GenericBuf::recv(&rdt, dst.as_mut_ptr(), n)),
                    RequestParam::new(),
                )
            }
            .unwrap();
            wait_until(w, "a rendezvous echo", || r.is_completed());
            assert_eq!(r.status(), Status::Ok, "rendezvous active-message echo of {n}");
            assert!(rd.gaps_untouched(&dst, n));
            rd.gather(&dst, n)
        }
    }
}

/// Sends `data` on the stream through `sd` and receives the echo, all of it, through `rd`.
fn stream_echo(w: &Worker, p: &mut GenPeer, data: &[u8], sd: &Strided, rd: &Strided) -> Vec<u8> {
    let n = data.len();
    let (sdt, rdt) = (sd.datatype(), rd.datatype());
    let src = sd.scatter(data);
    // SAFETY: `src` outlives the send (waited for).
    let s = outcome(w, unsafe {
        p.ep.stream_send_nbx(SendData::Generic(&GenericBuf::send(&sdt, src.as_ptr(), n)), RequestParam::new())
    });
    assert_eq!(s, Status::Ok, "stream send of {n}");
    // The echo comes back on our endpoint to the peer's (the one our bytes left on).
    let ep = p.stream_ep.get_or_insert_with(|| p.ep.clone()).clone();
    let mut dst = vec![0xeeu8; rd.span(n)];
    // SAFETY: `dst` outlives the receive (waited for).
    let r = recv_outcome(w, unsafe {
        ep.stream_recv_nbx(
            RecvData::Generic(&GenericBuf::recv(&rdt, dst.as_mut_ptr(), n)),
            StreamRecvFlags::WAITALL,
            RequestParam::new(),
        )
    });
    assert_eq!(r, (Status::Ok, n), "stream echo of {n}");
    assert!(rd.gaps_untouched(&dst, n));
    rd.gather(&dst, n)
}

/// Every size through every family, both ways through generic datatypes.
pub fn round_trips(w: &Worker, p: &mut GenPeer, what: &str) {
    let (sd, rd) = (Strided::new(3, 5), Strided::new(5, 9));
    for &n in SIZES {
        let data = pattern(n, 11 + n as u64);
        let (s, r, got) = tag_echo(w, p, &data, &sd, &rd);
        assert_eq!((s, r), (Status::Ok, (Status::Ok, n)), "{what}: tagged {n}");
        assert_eq!(got, data, "{what}: tagged echo of {n}");
        assert_eq!(am_echo(w, p, &data, &sd, &rd), data, "{what}: active-message echo of {n}");
        if n > 0 {
            assert_eq!(stream_echo(w, p, &data, &sd, &rd), data, "{what}: stream echo of {n}");
        }
    }
    assert!(sd.in_order() && rd.in_order(), "{what}: pieces out of order");
    let sends = 2 * SIZES.len() + SIZES.iter().filter(|&&n| n > 0).count();
    assert_eq!(sd.finished(), sends, "{what}: every send state finished");
}

/// Callbacks that fail on this side, with the peer between: a pack error fails the send and
/// the echo comes back whole with the failed piece zeroed; an unpack error fails the receive
/// of the echo and the next echo is intact.
pub fn failing_callbacks(w: &Worker, p: &mut GenPeer, what: &str) {
    for n in [3000, 20_000, 200_000] {
        let data = pattern(n, 5);
        let (s, r, got) = tag_echo(w, p, &data, &Strided::new(3, 5).failing_at(n / 2), &Strided::new(5, 9));
        assert_eq!((s, r), (Status::NoMemory, (Status::Ok, n)), "{what}: {n}: the send reports its pack error");
        check_zeroed_piece(&got, &data, n / 2).unwrap_or_else(|e| panic!("{what}: {n}: {e}"));
        let (s, r, _) = tag_echo(w, p, &data, &Strided::new(3, 5), &Strided::new(5, 9).failing_at(n - 1));
        assert_eq!((s, r.0), (Status::Ok, Status::NoMemory), "{what}: {n}: the receive reports its unpack error");
        let (s, r, got) = tag_echo(w, p, &data, &Strided::new(3, 5), &Strided::new(5, 9));
        assert_eq!((s, r, got == data), (Status::Ok, (Status::Ok, n), true), "{what}: {n}: the next echo");
    }
}
