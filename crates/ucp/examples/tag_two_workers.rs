//! Two workers (as two processes would be, here in one): endpoint wireup, lanes, the protocol
//! each size takes (`UCX_PROTO_INFO=y`), a rendezvous message, probe, and a sync send.
//!
//! `UCX_PROTO_INFO=y cargo run -p ucp --example tag_two_workers`
//! `UCX_RNDV_SCHEME=put_zcopy UCX_RNDV_THRESH=4k cargo run -p ucp --example tag_two_workers`

use ucp::{Context, ContextParams, Features, RecvData, RequestParam, SendData, Worker, WorkerParams, FULL_MASK};

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::TAG).with_config("TLS", "posix,cma"))?;
    let a = Worker::new(&ctx, &WorkerParams::new("a"))?;
    let b = Worker::new(&ctx, &WorkerParams::new("b"))?;
    // In two processes the address would travel out of band (a socket, a file, MPI...).
    let ep = a.ep_create(b.address())?;
    let q = ep.query()?;
    println!("a -> b: {:?}; rendezvous from {} bytes", q.lanes, q.rndv_thresh);

    // A large message: rendezvous. The send may start before wireup completes; it is queued.
    let big: Vec<u8> = (0..4 << 20).map(|i| i as u8).collect();
    // SAFETY: `big` stays alive and unmodified until the request completed (below).
    let send = unsafe { ep.tag_send_nbx(SendData::Contig(&big), 42, RequestParam::new())? };
    // Probe on b until the message (its RTS) is there, then receive it by handle.
    let (info, msg) = loop {
        a.progress();
        b.progress();
        if let Some(x) = b.tag_probe(42, FULL_MASK, true) {
            break x;
        }
    };
    println!("probe: {} bytes waiting, tag {}", info.length, info.sender_tag);
    let mut into = vec![0u8; info.length];
    // SAFETY: `into` is untouched until the request completed.
    let recv = unsafe { b.tag_msg_recv_nbx(RecvData::Contig(&mut into), msg.unwrap(), RequestParam::new())? };
    let got = match recv {
        ucp::RecvResult::Done(info) => info,
        ucp::RecvResult::Pending(r) => {
            // Waiting on b; a must progress too (it answers the rendezvous).
            while !r.is_completed() {
                a.progress();
                b.progress();
            }
            r.recv_info().unwrap()
        }
    };
    while send.as_ref().is_some_and(|r| !r.is_completed()) {
        a.progress();
    }
    println!("received {} bytes", got.length);
    assert!(into == big);

    // A sync send completes only once b has matched it.
    // SAFETY: the literal is static.
    let s = unsafe { ep.tag_send_sync_nbx(SendData::Contig(b"sync"), 43, RequestParam::new())? }.unwrap();
    for _ in 0..1000 {
        a.progress();
        b.progress();
    }
    println!("sync send before any receive: {}", s.status());
    let mut small = [0u8; 8];
    // SAFETY: `small` is untouched until the request completed.
    let r = unsafe { b.tag_recv_nbx(RecvData::Contig(&mut small), 43, FULL_MASK, RequestParam::new())? };
    r.wait()?;
    while !s.is_completed() {
        a.progress();
        b.progress();
    }
    println!("sync send after the match: {}; counts on b: {:?}", s.status(), b.proto_counts());
    Ok(())
}
