//! Client and server that find each other by socket address, as UCX's `ucp_client_server`
//! example does: the server listens on an IP address and port, the client connects to it, and
//! they exchange messages (tag, stream or active messages) over whatever lanes both workers
//! share - shared memory on one host, rc where both have RDMA, tcp otherwise.
//!
//! ```text
//! server: cargo run -p ucp --example client_server -- [--listen IP] [--port P] [--comm tag|stream|am]
//! client: cargo run -p ucp --example client_server -- --connect SERVER_IP [--port P] [--comm ...]
//! ```
//!
//! Options: `--iters N` messages (default 10), `--size BYTES` per message (default 64; large
//! sizes go by rendezvous), `--clients N` clients the server serves before it exits (default
//! 1). The server prints `listening on IP:PORT` once it listens (port 0 picks a free one). Both
//! give up after 60 s. `UCX_TLS` and the other `UCX_*` variables apply as usual.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ucp::{
    block_on, AmHandlerFlags, AmSendFlags, ConnRequest, Context, ContextParams, Endpoint, Features, StreamRecvFlags,
    Worker, WorkerParams, FULL_MASK,
};

const DEFAULT_PORT: u16 = 13337;
const TAG: u64 = 99;
const AM_ID: u16 = 7;

#[derive(Clone, Copy, PartialEq)]
enum Comm {
    Tag,
    Stream,
    Am,
}

struct Opts {
    connect: Option<IpAddr>,
    listen: IpAddr,
    port: u16,
    comm: Comm,
    iters: usize,
    size: usize,
    clients: usize,
}

fn usage(why: &str) -> ! {
    eprintln!("client_server: {why}");
    eprintln!(
        "usage: client_server [--connect SERVER_IP | --listen IP] [--port P] [--comm tag|stream|am] \
         [--iters N] [--size BYTES] [--clients N]"
    );
    std::process::exit(2)
}

fn opts() -> Opts {
    let mut o = Opts {
        connect: None,
        listen: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        port: DEFAULT_PORT,
        comm: Comm::Tag,
        iters: 10,
        size: 64,
        clients: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().unwrap_or_else(|| usage(&format!("{a} needs a value")));
        match a.as_str() {
            "--connect" | "-a" => o.connect = Some(val().parse().unwrap_or_else(|_| usage("bad server address"))),
            "--listen" | "-l" => o.listen = val().parse().unwrap_or_else(|_| usage("bad listen address")),
            "--port" | "-p" => o.port = val().parse().unwrap_or_else(|_| usage("bad port")),
            "--iters" | "-i" => o.iters = val().parse().unwrap_or_else(|_| usage("bad count")),
            "--size" | "-s" => o.size = val().parse().unwrap_or_else(|_| usage("bad size")),
            "--clients" => o.clients = val().parse().unwrap_or_else(|_| usage("bad count")),
            "--comm" | "-c" => {
                o.comm = match val().as_str() {
                    "tag" => Comm::Tag,
                    "stream" => Comm::Stream,
                    "am" => Comm::Am,
                    other => usage(&format!("unknown --comm {other}")),
                }
            }
            other => usage(&format!("unknown option {other}")),
        }
    }
    o
}

/// The message of iteration `i`: text, padded to `size` bytes with a pattern.
fn message(i: usize, size: usize) -> Vec<u8> {
    let mut m = format!("UCX data message #{i}").into_bytes();
    m.resize(size.max(m.len()), 0);
    for (k, b) in m.iter_mut().enumerate().skip(24) {
        *b = (k.wrapping_mul(31) ^ i) as u8;
    }
    m
}

/// An active message that arrived: its data, or the descriptor of data to fetch (rendezvous).
enum Arrived {
    Data(Vec<u8>),
    Rndv(ucp::AmRndv),
}

/// Active messages that arrived, for the main loop to take.
type Inbox = Arc<Mutex<Vec<Arrived>>>;

fn am_inbox(w: &Worker) -> Result<Inbox, ucp::Status> {
    let inbox: Inbox = Arc::default();
    let i = inbox.clone();
    let handler = move |m: &mut ucp::AmMsg<'_>| {
        let a = match m.take_rndv() {
            Some(desc) => Arrived::Rndv(desc),
            None => Arrived::Data(m.data().to_vec()),
        };
        i.lock().unwrap().push(a);
    };
    w.set_am_recv_handler(AM_ID, Some(handler), AmHandlerFlags::WHOLE_MSG)?;
    Ok(inbox)
}

fn lanes(ep: &Endpoint) -> Result<String, ucp::Status> {
    let info = ep.query()?;
    Ok(info.lanes.iter().map(|l| format!("{}={}/{}", l.usage, l.transport, l.device)).collect::<Vec<_>>().join(" "))
}

fn send(ep: &Endpoint, comm: Comm, data: Vec<u8>) -> Result<(), ucp::Status> {
    match comm {
        Comm::Tag => block_on(ep.tag_send(data, TAG)).1,
        Comm::Stream => block_on(ep.stream_send(data)).1,
        Comm::Am => block_on(ep.am_send(AM_ID, &[], data, AmSendFlags::empty())).1,
    }
}

fn recv(w: &Worker, ep: &Endpoint, comm: Comm, inbox: &Inbox, len: usize) -> Result<Vec<u8>, ucp::Status> {
    match comm {
        Comm::Tag => {
            let (buf, r) = block_on(w.tag_recv(vec![0u8; len], TAG, FULL_MASK));
            let info = r?;
            Ok(buf[..info.length].to_vec())
        }
        Comm::Stream => {
            let (buf, r) = block_on(ep.stream_recv(vec![0u8; len], StreamRecvFlags::WAITALL));
            let info = r?;
            Ok(buf[..info.length].to_vec())
        }
        Comm::Am => loop {
            let got = inbox.lock().unwrap().pop();
            match got {
                Some(Arrived::Data(m)) => return Ok(m),
                Some(Arrived::Rndv(desc)) => {
                    let (buf, r) = block_on(w.am_recv_data(desc, vec![0u8; len]));
                    let info = r?;
                    return Ok(buf[..info.length].to_vec());
                }
                None => {
                    w.progress();
                }
            }
        },
    }
}

fn main() -> Result<(), ucp::Status> {
    let o = opts();
    uct_shm::register();
    uct_ib::register();
    uct_tcp::register();
    std::thread::spawn(|| {
        std::thread::sleep(Duration::from_secs(60));
        eprintln!("client_server: gave up after 60 s");
        std::process::exit(3);
    });
    let ctx = Context::new(&ContextParams::new(Features::TAG | Features::STREAM | Features::AM))?;
    let name = if o.connect.is_some() { "client" } else { "server" };
    let w = Worker::new(&ctx, &WorkerParams::new(name))?;
    let inbox = am_inbox(&w)?;
    match o.connect {
        Some(ip) => {
            let server = SocketAddr::new(ip, o.port);
            let ep = w.ep_create_sockaddr(server).inspect_err(|e| eprintln!("cannot connect to {server}: {e}"))?;
            for i in 0..o.iters {
                let m = message(i, o.size);
                send(&ep, o.comm, m.clone())?;
                let back = recv(&w, &ep, o.comm, &inbox, m.len())?;
                if back != m {
                    eprintln!("client: message #{i} came back different");
                    return Err(ucp::Status::IoError);
                }
            }
            println!("client: lanes {}", lanes(&ep)?);
            println!("client: {} messages of {} bytes echoed intact", o.iters, o.size);
            ep.close(ucp::CloseMode::Flush)?;
        }
        None => {
            let pending: Arc<Mutex<Vec<ConnRequest>>> = Arc::default();
            let p = pending.clone();
            let listener = w.listener(SocketAddr::new(o.listen, o.port), move |req| {
                println!("server: connection request from {}", req.client_addr());
                p.lock().unwrap().push(req);
            })?;
            println!("listening on {}", listener.query());
            for _ in 0..o.clients {
                let req = loop {
                    if let Some(r) = pending.lock().unwrap().pop() {
                        break r;
                    }
                    w.progress();
                };
                let ep = w.ep_create_conn_request(req)?;
                for i in 0..o.iters {
                    let m = recv(&w, &ep, o.comm, &inbox, message(i, o.size).len())?;
                    if m != message(i, o.size) {
                        eprintln!("server: message #{i} arrived different");
                        return Err(ucp::Status::IoError);
                    }
                    send(&ep, o.comm, m)?;
                }
                println!("server: lanes {}", lanes(&ep)?);
                println!("server: {} messages echoed", o.iters);
                ep.close(ucp::CloseMode::Flush)?;
            }
        }
    }
    Ok(())
}
