//! A stream echo server (two workers, as two processes would be, here in one): the client
//! writes lines on its endpoint's stream in pieces of any size; the server, which learns of the
//! client's endpoint from `stream_poll`, reads whatever bytes are there and writes them back;
//! the client reads until it has every byte back.
//!
//! `cargo run -p ucp --example stream_echo`

use std::future::Future;
use std::pin::pin;
use std::task::{Context as TaskContext, Poll};

use ucp::{Context, ContextParams, Endpoint, Features, StreamRecvFlags, Worker, WorkerParams};

/// A waker that does nothing: the loops below poll again after progressing the workers.
fn noop_waker() -> std::task::Waker {
    use std::task::{RawWaker, RawWakerVTable};
    fn clone(_: *const ()) -> RawWaker {
        RawWaker::new(std::ptr::null(), &VTABLE)
    }
    fn noop(_: *const ()) {}
    static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, noop, noop, noop);
    // SAFETY: the vtable's functions ignore the data pointer and do nothing.
    unsafe { std::task::Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

/// Echoes what arrived on `ep`'s stream back on it (the server's turn).
fn serve(server: &Worker, ep: &Endpoint) {
    while let Some(piece) = ep.stream_recv_data_nb().expect("stream_recv_data_nb") {
        // The bytes are the worker's until `piece` is dropped; the send takes its own copy.
        drop(ep.stream_send(piece.to_vec()));
    }
    server.progress();
}

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::STREAM))?;
    let server = Worker::new(&ctx, &WorkerParams::new("server"))?;
    let client = Worker::new(&ctx, &WorkerParams::new("client"))?;
    let ep = client.ep_create(server.address())?;

    let text = "the quick brown fox\njumps over\nthe lazy dog\n".repeat(200);
    // Written in pieces of 1, 2, 3, ... bytes: the stream keeps no boundaries.
    let mut at = 0;
    let mut size = 1;
    while at < text.len() {
        let end = (at + size).min(text.len());
        drop(ep.stream_send(text.as_bytes()[at..end].to_vec()));
        at = end;
        size = size % 97 + 1;
    }

    // The server finds the client's endpoint when its bytes arrive.
    let server_ep = loop {
        client.progress();
        server.progress();
        if let Some(e) = server.stream_poll(1)?.into_iter().next() {
            break e;
        }
    };

    // The client reads the echo back, a buffer of 1,000 bytes at a time (WAITALL except at
    // the end).
    let waker = noop_waker();
    let mut cx = TaskContext::from_waker(&waker);
    let mut echoed = Vec::new();
    while echoed.len() < text.len() {
        let n = (text.len() - echoed.len()).min(1000);
        let mut f = pin!(ep.stream_recv(vec![0u8; n], StreamRecvFlags::WAITALL));
        let (buf, r) = loop {
            if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
                break v;
            }
            serve(&server, &server_ep);
            client.progress();
        };
        echoed.extend_from_slice(&buf[..r?.length]);
    }
    assert_eq!(echoed, text.as_bytes());
    println!("{} bytes echoed in order; the first line: {:?}", echoed.len(), text.lines().next().unwrap_or(""));
    Ok(())
}
