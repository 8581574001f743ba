//! The echo that the socket-address tests run between a client (`ucp-peer sockaddr`) and a
//! server (the test): for each family (tag, stream, active messages) and each size of
//! [`SIZES`] (eager and rendezvous), the client sends `pattern(len, seed)`, the server
//! receives it and sends it back, and the client checks what came back.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ucp::{
    block_on, AmHandlerFlags, AmMsg, AmRndv, AmSendFlags, ConnRequest, Context, ContextParams, Endpoint, Features,
    StreamRecvFlags, Worker, WorkerParams, FULL_MASK,
};

use crate::peer::Peer;
use crate::text::pattern;

/// Message sizes: eager short, eager multi-fragment, rendezvous.
pub const SIZES: [usize; 3] = [8, 5000, 300_000];
/// The tag of the echo's tagged messages.
pub const TAG: u64 = 0x5a;
/// The active-message id of the echo.
pub const AM_ID: u16 = 5;
/// How long one message may take.
pub const LIMIT: Duration = Duration::from_secs(30);

/// How long a flood waits for its endpoint to fail before it gives up.
pub const FLOOD_LIMIT: Duration = Duration::from_secs(120);

/// The families the echo runs.
pub const FAMILIES: [&str; 3] = ["tag", "stream", "am"];

enum Arrived {
    Data(Vec<u8>),
    Rndv(AmRndv),
}

/// Active messages of [`AM_ID`] that arrived on a worker.
#[derive(Clone, Default)]
pub struct Inbox(Arc<Mutex<Vec<Arrived>>>);

impl Inbox {
    /// Installs the handler of [`AM_ID`] on `w`.
    pub fn install(w: &Worker) -> Inbox {
        let inbox = Inbox::default();
        let i = inbox.0.clone();
        let handler = move |m: &mut AmMsg<'_>| {
            let a = match m.take_rndv() {
                Some(d) => Arrived::Rndv(d),
                None => Arrived::Data(m.data().to_vec()),
            };
            i.lock().unwrap().push(a);
        };
        w.set_am_recv_handler(AM_ID, Some(handler), AmHandlerFlags::WHOLE_MSG).expect("an AM handler");
        inbox
    }
}

fn send(ep: &Endpoint, family: &str, data: Vec<u8>) -> Result<(), String> {
    let r = match family {
        "tag" => block_on(ep.tag_send(data, TAG)).1,
        "stream" => block_on(ep.stream_send(data)).1,
        _ => block_on(ep.am_send(AM_ID, &[], data, AmSendFlags::empty())).1,
    };
    r.map_err(|e| format!("{family} send failed: {e}"))
}

fn recv(w: &Worker, ep: &Endpoint, family: &str, inbox: &Inbox, len: usize) -> Result<Vec<u8>, String> {
    let r = match family {
        "tag" => {
            let (b, r) = block_on(w.tag_recv(vec![0u8; len], TAG, FULL_MASK));
            r.map(|i| b[..i.length].to_vec())
        }
        "stream" => {
            let (b, r) = block_on(ep.stream_recv(vec![0u8; len], StreamRecvFlags::WAITALL));
            r.map(|i| b[..i.length].to_vec())
        }
        _ => {
            let t = Instant::now();
            let a = loop {
                if let Some(a) = inbox.0.lock().unwrap().pop() {
                    break a;
                }
                if t.elapsed() > LIMIT {
                    return Err("no active message in time".into());
                }
                w.progress();
            };
            match a {
                Arrived::Data(d) => Ok(d),
                Arrived::Rndv(desc) => {
                    let (b, r) = block_on(w.am_recv_data(desc, vec![0u8; len]));
                    r.map(|i| b[..i.length].to_vec())
                }
            }
        }
    };
    r.map_err(|e| format!("{family} receive of {len} bytes failed: {e}"))
}

/// The client's side: sends each message and checks its echo.
pub fn client(w: &Worker, ep: &Endpoint, inbox: &Inbox) -> Result<(), String> {
    for family in FAMILIES {
        for (k, &len) in SIZES.iter().enumerate() {
            let m = pattern(len, k as u64 + 1);
            send(ep, family, m.clone())?;
            let back = recv(w, ep, family, inbox, len)?;
            if back != m {
                return Err(format!("{family}: {len} bytes came back different ({} bytes)", back.len()));
            }
        }
    }
    Ok(())
}

/// The server's side: receives each message and sends it back.
pub fn server(w: &Worker, ep: &Endpoint, inbox: &Inbox) -> Result<(), String> {
    for family in FAMILIES {
        for (k, &len) in SIZES.iter().enumerate() {
            let m = recv(w, ep, family, inbox, len)?;
            if m != pattern(len, k as u64 + 1) {
                return Err(format!("{family}: {len} bytes arrived different ({} bytes)", m.len()));
            }
            send(ep, family, m)?;
        }
    }
    Ok(())
}

/// The endpoint's lanes as `usage=transport/device ...`.
pub fn lanes(ep: &Endpoint) -> String {
    match ep.query() {
        Ok(i) => {
            i.lanes.iter().map(|l| format!("{}={}/{}", l.usage, l.transport, l.device)).collect::<Vec<_>>().join(" ")
        }
        Err(e) => format!("(query failed: {e})"),
    }
}

/// A worker with the tag, stream and AM features over `tls` with the `UCX_*` settings `cfg`
/// (every transport crate registered).
pub fn worker(tls: &str, cfg: &[(&str, &str)], name: &str) -> Worker {
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    let mut p = ContextParams::new(Features::TAG | Features::STREAM | Features::AM).with_config("TLS", tls);
    for (k, v) in cfg {
        p = p.with_config(k, v);
    }
    Worker::new(&Context::new(&p).unwrap(), &WorkerParams::new(name)).unwrap()
}

/// Progresses `w` until `f` gives something, for at most `limit`.
pub fn wait_for<T>(w: &Worker, limit: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let t = Instant::now();
    loop {
        if let Some(x) = f() {
            return x;
        }
        assert!(t.elapsed() < limit, "no {what} in {limit:?}");
        w.progress();
    }
}

/// A test serves one client process (`peer_exe sockaddr IP:PORT`, the tests' `ucp-peer`) by
/// socket address on the loopback device, over `tls` with the `UCX_*` settings `cfg`; both
/// run the echo. The server's lanes.
pub fn serve_a_client_process(peer_exe: &str, tls: &str, cfg: &[(&str, &str)]) -> String {
    let w = worker(tls, cfg, "sockaddr-server");
    let inbox = Inbox::install(&w);
    let reqs: Arc<Mutex<Vec<ConnRequest>>> = Arc::default();
    let r = reqs.clone();
    let l = w.listener(SocketAddr::new(Ipv4Addr::LOCALHOST.into(), 0), move |req| r.lock().unwrap().push(req)).unwrap();
    let addr = l.query();
    assert_ne!(addr.port(), 0, "the bound port is reported");
    let mut cmd = Command::new(peer_exe);
    cmd.args(["sockaddr", &addr.to_string()]).env("UCX_TLS", tls);
    for (k, v) in cfg {
        cmd.env(format!("UCX_{k}"), v);
    }
    let mut peer = Peer::start(cmd, &format!("ucp-peer sockaddr over {tls}"));
    let req = wait_for(&w, LIMIT, "connection request", || reqs.lock().unwrap().pop());
    assert_eq!(req.client_addr().ip(), addr.ip(), "the client's address");
    let ep = w.ep_create_conn_request(req).unwrap();
    server(&w, &ep, &inbox).unwrap_or_else(|e| panic!("{tls}: server side: {e}"));
    let client_lanes = peer.expect("lanes", LIMIT, || {
        w.progress();
    });
    assert_eq!(
        peer.line(LIMIT, || {
            w.progress();
        }),
        "echo ok"
    );
    let server_lanes = lanes(&ep);
    eprintln!("{tls}: server lanes {server_lanes}; client lanes {client_lanes}");
    assert!(peer
        .finish(LIMIT, || {
            w.progress();
        })
        .success());
    server_lanes
}
