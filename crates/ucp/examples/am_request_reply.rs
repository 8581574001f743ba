//! An active-message request/reply server (two workers, as two processes would be, here in
//! one): the server's handler for id 1 answers each request on the reply endpoint the message
//! carries, from inside the handler, with id 2; the client sends requests with a user header
//! (an operation code) and counts the answers.
//!
//! `cargo run -p ucp --example am_request_reply`
//! `UCX_PROTO_INFO=y UCX_TLS=posix cargo run -p ucp --example am_request_reply`

use std::sync::{Arc, Mutex};

use ucp::{AmHandlerFlags, AmMsg, AmSendFlags, Context, ContextParams, Features, Worker, WorkerParams};

/// The replies the client got: operation and data.
type Replies = Arc<Mutex<Vec<(u8, Vec<u8>)>>>;

/// Request id (client to server) and reply id (server to client).
const REQUEST: u16 = 1;
const REPLY: u16 = 2;

fn main() -> Result<(), ucp::Status> {
    uct_shm::register();
    let ctx = Context::new(&ContextParams::new(Features::AM))?;
    let server = Worker::new(&ctx, &WorkerParams::new("server"))?;
    let client = Worker::new(&ctx, &WorkerParams::new("client"))?;

    // The server: header byte 0 is the operation (0: echo, 1: sum of the data's bytes).
    server.set_am_recv_handler(
        REQUEST,
        Some(|m: &mut AmMsg<'_>| {
            let Some(ep) = m.reply_ep() else {
                eprintln!("server: a request without a reply endpoint; dropped");
                return;
            };
            let answer = match m.header().first() {
                Some(0) => m.data().to_vec(),
                Some(1) => m.data().iter().map(|&b| b as u64).sum::<u64>().to_le_bytes().to_vec(),
                _ => b"unknown operation".to_vec(),
            };
            // The reply's data is owned by the send; dropping its future does not stop it.
            drop(ep.am_send(REPLY, m.header(), answer, AmSendFlags::empty()));
        }),
        AmHandlerFlags::WHOLE_MSG,
    )?;

    // The client: replies land in a list.
    let replies: Replies = Arc::default();
    let r = replies.clone();
    client.set_am_recv_handler(
        REPLY,
        Some(move |m: &mut AmMsg<'_>| r.lock().unwrap().push((m.header()[0], m.data().to_vec()))),
        AmHandlerFlags::WHOLE_MSG,
    )?;
    let ep = client.ep_create(server.address())?;
    let big: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    // Sends of owned buffers: each future resolves to the buffer once sent. They are dropped
    // here (the sends go on); in two processes each side would progress its own worker.
    drop(ep.am_send(REQUEST, &[0], b"hello, server".to_vec(), AmSendFlags::REPLY));
    drop(ep.am_send(REQUEST, &[1], big.clone(), AmSendFlags::REPLY));
    drop(ep.am_send(REQUEST, &[0], big.clone(), AmSendFlags::REPLY));
    while replies.lock().unwrap().len() < 3 {
        client.progress();
        server.progress();
    }
    for (op, data) in replies.lock().unwrap().iter() {
        match op {
            1 => println!("sum: {}", u64::from_le_bytes(data[..8].try_into().unwrap())),
            _ => println!(
                "echo: {} bytes{}",
                data.len(),
                if data.len() < 64 { format!(" {:?}", String::from_utf8_lossy(data)) } else { String::new() }
            ),
        }
    }
    let want: u64 = big.iter().map(|&b| b as u64).sum();
    println!("expected sum: {want}");
    Ok(())
}
