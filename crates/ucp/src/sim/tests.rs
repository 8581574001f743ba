//! Two engines against each other on virtual time: every tag protocol, expected and
//! unexpected, plain and synchronous; rendezvous in every scheme; wireup races; a full lane,
//! jitter that reorders the lanes, a re-entrant (loop-back) network, and a link cut in the
//! middle of transfers.

use ucs::idtable::Id;
use ucs::Status;

use super::*;
use crate::config::RndvScheme;
use crate::proto::RndvCaps;

/// Data of message `seed`: `len` bytes derived from it.
fn pattern(seed: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8).collect()
}

/// short below 33, one copied fragment up to 256 bytes, zero-copy from 400 (up to 1024 bytes a
/// fragment), rendezvous from 4096 over a lane that gets and puts.
fn cfg() -> SimConfig {
    SimConfig {
        latency: US,
        rndv_latency: 3 * US,
        jitter: 2 * US,
        capacity: 8,
        ep_cfg: EpConfig {
            short_lim: 33,
            bcopy_max: 256,
            rndv_thresh: 4096,
            zcopy_thresh: 400,
            zcopy_max: 1024,
            scheme: RndvScheme::Auto,
            rndv: Some(RndvCaps { get: true, put: true, max_zcopy: 1 << 20 }),
            uct_lanes: 2,
            tag: None,
        },
        p2p: false,
        immediate: false,
        keepalive: 0,
        tm: 0,
        tm_offload: crate::tag::offload::OffloadCfg { thresh: 0, max_bb: 0, force_thresh: usize::MAX },
        tm_refuse_len: None,
    }
}

/// Sizes that take every protocol: empty and 8 (short), 100 (one fragment), 300 (fragments),
/// 500 (zero-copy, one fragment), 3000 (zero-copy fragments), 10000 and 70000 (rendezvous).
const SIZES: [usize; 8] = [0, 8, 100, 300, 500, 3000, 10_000, 70_000];

/// Node 0 connects to node 1; node 1 claims the endpoint node 0's request made. Both ids.
fn pair(sim: &mut Sim) -> (Id, Id) {
    let a = sim.connect(0, 1);
    let b = sim.connect(1, 0);
    (a, b)
}

/// Checks that nothing is left in either engine: no request, no unexpected message, no queued
/// transmission.
fn assert_idle(sim: &Sim) {
    for (i, n) in sim.nodes.iter().enumerate() {
        let e = &n.engine;
        assert_eq!(e.sh.reqs.tab.len(), 0, "node {i}: requests left");
        assert_eq!(e.tag.unexp.len(), 0, "node {i}: unexpected messages left");
        assert!(e.tag.frags.is_empty(), "node {i}: fragments in progress");
        for (id, ep) in e.sh.eps.iter() {
            assert!(
                ep.queue.is_empty() && ep.wireup_q.is_empty() && ep.reply_q.is_empty(),
                "node {i}: endpoint {id:?} has queued work"
            );
        }
    }
}

/// Sends `msgs` (length, synchronous) from node 0 to node 1 with one tag, receives them in
/// order into buffers of `recv_len(len)` bytes, the receives posted before the sends
/// (`expected`) or after everything arrived. Checks data, lengths, statuses, the order, and
/// that a synchronous send completes only after its receive was posted.
fn exchange(mut c: SimConfig, seed: u64, msgs: &[(usize, bool)], expected: bool) -> Sim {
    let recv_len = |len: usize| len;
    c.jitter = c.jitter.max(1);
    let mut sim = Sim::new(2, c, seed);
    let (a, _b) = pair(&mut sim);
    let tag = 0x7a9;
    let sends: Vec<Vec<u8>> = msgs.iter().enumerate().map(|(i, &(len, _))| pattern(i, len)).collect();
    let mut recvs: Vec<Vec<u8>> = msgs.iter().map(|&(len, _)| vec![0u8; recv_len(len)]).collect();
    let post_recvs = |sim: &mut Sim, recvs: &mut Vec<Vec<u8>>| {
        for (i, r) in recvs.iter_mut().enumerate() {
            sim.recv(1, r, tag, u64::MAX, 1000 + i).unwrap();
        }
        sim.now
    };
    let mut posted_at = 0;
    if expected {
        posted_at = post_recvs(&mut sim, &mut recvs);
    }
    for (i, (&(_, sync), data)) in msgs.iter().zip(&sends).enumerate() {
        sim.send(0, a, data, tag, sync, i).unwrap();
    }
    if !expected {
        // Everything that can arrive arrives; synchronous sends must still wait.
        sim.run_until(|_| false);
        for (i, &(_, sync)) in msgs.iter().enumerate() {
            if sync {
                assert!(Sim::completed(i).is_none(), "sync send {i} completed before its receive was posted");
            }
        }
        posted_at = post_recvs(&mut sim, &mut recvs);
    }
    let n = msgs.len();
    let all = sim.run_until(|_| (0..n).all(|i| Sim::completed(i).is_some() && Sim::completed(1000 + i).is_some()));
    assert!(all, "not every operation completed: {:?}", Sim::log());
    for (i, &(len, sync)) in msgs.iter().enumerate() {
        let (st, info, at) = Sim::completed(1000 + i).unwrap();
        assert_eq!(st, Status::Ok, "receive {i}");
        assert_eq!((info.length, info.sender_tag), (len, tag), "receive {i}");
        assert!(recvs[i] == sends[i], "receive {i} ({len} bytes) got other data");
        let (st, _, sent_at) = Sim::completed(i).unwrap();
        assert_eq!(st, Status::Ok, "send {i}");
        if sync {
            assert!(sent_at >= posted_at, "sync send {i} completed at {sent_at}, its receive posted at {posted_at}");
        }
        let _ = at;
    }
    assert_idle(&sim);
    sim
}

#[test]
fn every_size_expected_and_unexpected() {
    for expected in [true, false] {
        for sync in [false, true] {
            for seed in 1..4 {
                let msgs: Vec<(usize, bool)> = SIZES.iter().map(|&l| (l, sync)).collect();
                let sim = exchange(cfg(), seed, &msgs, expected);
                let c = sim.nodes[0].engine.sh.counts;
                assert!(c.eager_bcopy + c.eager_sync > 0 && c.eager_multi > 0 && c.eager_zcopy > 0, "{c:?}");
                assert!(sync || c.eager_short > 0, "{c:?}");
                if sync {
                    // The receiver's acks go out at once.
                    assert!(sim.stats.direct_ctrl > 0, "{:?}", sim.stats);
                }
            }
        }
    }
}

#[test]
fn messages_of_one_sender_are_not_overtaken() {
    // Mixed sizes and protocols under one tag, the lanes reordered by jitter: the receives get
    // them in send order.
    let mut c = cfg();
    c.jitter = 20 * US;
    let msgs: Vec<(usize, bool)> = (0..40).map(|i| (SIZES[(i * 7 + 3) % SIZES.len()], i % 5 == 0)).collect();
    for seed in 1..6 {
        exchange(c.clone(), seed, &msgs, seed % 2 == 0);
    }
}

#[test]
fn rendezvous_in_every_scheme() {
    use RndvScheme::{Am, Auto, GetZcopy, PutZcopy};
    for (scheme, get, put, want) in [
        (GetZcopy, true, true, "get"),
        (PutZcopy, true, true, "put"),
        (Am, true, true, "am"),
        (Auto, true, false, "get"),
        (Auto, false, true, "put"),
        (Auto, false, false, "am"),
    ] {
        let mut c = cfg();
        c.ep_cfg.scheme = scheme;
        c.ep_cfg.rndv = Some(RndvCaps { get, put, max_zcopy: 1 << 20 });
        for expected in [true, false] {
            let sim = exchange(c.clone(), 7, &[(10_000, false), (70_000, true), (5000, false)], expected);
            let r = sim.nodes[1].engine.sh.counts;
            let got = [(r.rndv_get, "get"), (r.rndv_put, "put"), (r.rndv_am, "am")];
            assert!(got.iter().all(|&(n, s)| (n > 0) == (s == want)), "{scheme:?} get={get} put={put}: {r:?}");
        }
    }
}

#[test]
fn a_full_lane_parks_and_replays_in_order() {
    // One message in flight per channel: almost every transmission is refused first.
    let mut c = cfg();
    c.capacity = 1;
    c.jitter = 5 * US;
    let msgs: Vec<(usize, bool)> = (0..30).map(|i| (SIZES[i % SIZES.len()], i % 4 == 1)).collect();
    let sim = exchange(c, 3, &msgs, true);
    assert!(sim.stats.refused > 0);
    assert!(sim.stats.replayed > 0, "the queued eager messages replay without a Tx");
    assert!(sim.nodes[0].engine.sh.counts.parked > 0);
}

#[test]
fn a_loop_back_network_reenters_the_engine() {
    // Delivery inside the transmission, as over `self`: the answers (sync ack, RTR, ATS) come
    // while the engine's transmission is still with the driver.
    let mut c = cfg();
    c.immediate = true;
    for expected in [true, false] {
        for scheme in [RndvScheme::GetZcopy, RndvScheme::PutZcopy, RndvScheme::Am] {
            c.ep_cfg.scheme = scheme;
            let msgs: Vec<(usize, bool)> = SIZES.iter().flat_map(|&l| [(l, false), (l, true)]).collect();
            exchange(c.clone(), 1, &msgs, expected);
        }
    }
}

#[test]
fn an_endpoint_to_self() {
    let mut c = cfg();
    c.immediate = true;
    let mut sim = Sim::new(1, c, 1);
    let ep = sim.connect(0, 0);
    sim.run_until(|s| s.nodes[0].engine.sh.eps.get(ep).is_some_and(|e| e.status == crate::engine::EpStatus::Connected));
    for (i, &len) in SIZES.iter().enumerate() {
        let data = pattern(i, len);
        let mut back = vec![0u8; len];
        sim.recv(0, &mut back, i as u64, u64::MAX, 100 + i).unwrap();
        sim.send(0, ep, &data, i as u64, i % 2 == 0, i).unwrap();
        assert!(sim.run_until(|_| Sim::completed(i).is_some() && Sim::completed(100 + i).is_some()));
        assert!(back == data, "{len} bytes");
    }
    // The sync sends of whole eager messages went out at once, their acks arriving inside.
    assert!(sim.stats.sent_at_once > 0, "{:?}", sim.stats);
    assert_idle(&sim);
}

#[test]
fn wireup_races() {
    // Both sides connect at once and send before wireup completed, with and without
    // endpoint-to-endpoint lanes (request, reply and ack), under jitter.
    for p2p in [false, true] {
        for seed in 1..8 {
            let mut c = cfg();
            c.p2p = p2p;
            c.jitter = 10 * US;
            let mut sim = Sim::new(2, c, seed);
            let a = sim.connect(0, 1);
            let b = sim.connect(1, 0);
            let (d0, d1) = (pattern(1, 3000), pattern(2, 10_000));
            let (mut r0, mut r1) = (vec![0u8; 10_000], vec![0u8; 3000]);
            sim.send(0, a, &d0, 5, true, 0).unwrap();
            sim.send(1, b, &d1, 6, false, 1).unwrap();
            sim.recv(1, &mut r1, 5, u64::MAX, 10).unwrap();
            sim.recv(0, &mut r0, 6, u64::MAX, 11).unwrap();
            let all = sim.run_until(|_| [0, 1, 10, 11].iter().all(|&u| Sim::completed(u).is_some()));
            assert!(all, "p2p={p2p} seed={seed}: {:?}", Sim::log());
            assert!(r1 == d0 && r0 == d1);
            // One endpoint each way, matched by connection number, both connected.
            for n in 0..2 {
                let e = &sim.nodes[n].engine;
                assert_eq!(e.sh.eps.len(), 1, "p2p={p2p} seed={seed} node {n}");
                assert!(e.sh.eps.iter().all(|(_, ep)| ep.status == crate::engine::EpStatus::Connected));
            }
            assert_idle(&sim);
        }
    }
}

#[test]
fn a_peer_that_sends_first_gets_an_endpoint_created_for_it() {
    // Node 1 never connects: the endpoint node 0's request created is enough for replies.
    let mut sim = Sim::new(2, cfg(), 2);
    let a = sim.connect(0, 1);
    let data = pattern(9, 10_000);
    let mut back = vec![0u8; 10_000];
    sim.send(0, a, &data, 1, true, 0).unwrap();
    sim.recv(1, &mut back, 1, u64::MAX, 1).unwrap();
    assert!(sim.run_until(|_| Sim::completed(0).is_some() && Sim::completed(1).is_some()));
    assert!(back == data);
    assert_eq!(sim.nodes[1].engine.sh.eps.len(), 1);
}

#[test]
fn a_cut_link_fails_what_waits_for_the_peer() {
    // Unexpected rendezvous and a partly arrived message from node 0, then the link is cut:
    // node 1's receives fail (the get, or the missing fragments), node 0's sends fail once
    // keepalive finds the peer gone. Nothing hangs, nothing is left.
    for scheme in [RndvScheme::GetZcopy, RndvScheme::PutZcopy, RndvScheme::Am] {
        let mut c = cfg();
        c.keepalive = 100 * US;
        c.ep_cfg.scheme = scheme;
        c.capacity = 2;
        let mut sim = Sim::new(2, c, 5);
        let (a, _) = pair(&mut sim);
        sim.run_until(|s| {
            s.nodes[0].engine.sh.eps.get(a).is_some_and(|e| e.status == crate::engine::EpStatus::Connected)
        });
        let big = pattern(1, 70_000);
        let frags = pattern(2, 3000);
        sim.send(0, a, &big, 1, false, 0).unwrap();
        sim.send(0, a, &frags, 2, false, 1).unwrap();
        // Let the RTS and a fragment or two arrive.
        while sim.nodes[1].engine.tag.unexp.len() < 2 {
            assert!(sim.step());
        }
        sim.cut(0, 1);
        let (mut r0, mut r1) = (vec![0u8; 70_000], vec![0u8; 3000]);
        sim.recv(1, &mut r0, 1, u64::MAX, 10).unwrap();
        sim.recv(1, &mut r1, 2, u64::MAX, 11).unwrap();
        let all = sim.run_until(|_| [0, 1, 10, 11].iter().all(|&u| Sim::completed(u).is_some()));
        assert!(all, "{scheme:?}: {:?}", Sim::log());
        for u in [0, 1, 10] {
            let (st, _, _) = Sim::completed(u).unwrap();
            assert!(st.is_err(), "{scheme:?}: operation {u} completed with {st}");
        }
        assert!(sim.stats.lost > 0);
        for n in &sim.nodes {
            assert_eq!(n.engine.sh.reqs.tab.len(), 0, "{scheme:?}");
        }
    }
}

#[test]
fn truncation_probe_and_cancel() {
    let mut sim = Sim::new(2, cfg(), 4);
    let (a, _) = pair(&mut sim);
    // Longer than the receive buffer: truncated, in every protocol; the sender completes Ok.
    let data: Vec<Vec<u8>> = SIZES[1..].iter().enumerate().map(|(i, &l)| pattern(i, l)).collect();
    let mut small: Vec<Vec<u8>> = SIZES[1..].iter().map(|&l| vec![0u8; l / 2]).collect();
    for (i, d) in data.iter().enumerate() {
        sim.recv(1, &mut small[i], 40 + i as u64, u64::MAX, 100 + i).unwrap();
        sim.send(0, a, d, 40 + i as u64, i % 2 == 1, i).unwrap();
    }
    let n = data.len();
    assert!(sim.run_until(|_| (0..n).all(|i| Sim::completed(i).is_some() && Sim::completed(100 + i).is_some())));
    for i in 0..n {
        assert_eq!(Sim::completed(100 + i).unwrap().0, Status::MessageTruncated, "receive {i}");
        assert_eq!(Sim::completed(i).unwrap().0, Status::Ok, "send {i}");
    }
    // Probe, take out, receive; a wildcard receive; a cancelled one.
    let d = pattern(7, 3000);
    sim.send(0, a, &d, 0xabc, false, 200).unwrap();
    assert!(sim.run_until(|s| s.nodes[1].engine.tag.unexp.len() == 1 && Sim::completed(200).is_some()));
    let (info, msg) = sim.nodes[1].engine.tag.probe(0xa00, 0xf00, true).unwrap();
    assert_eq!((info.length, info.sender_tag), (3000, 0xabc));
    let mut r = vec![0u8; 3000];
    // SAFETY: `r` outlives the receive, which completes at once (the message is here).
    let buf = unsafe { UserBuf::contig(r.as_mut_ptr(), r.len()) };
    let e = &mut sim.nodes[1].engine;
    let out = e.tag.msg_recv(&mut e.sh, buf, msg.unwrap(), param(201)).unwrap();
    assert!(matches!(out, crate::tag::recv::RecvOut::Done(i) if i.length == 3000));
    assert!(r == d);
    let mut never = vec![0u8; 8];
    sim.recv(1, &mut never, 0xdead, u64::MAX, 202).unwrap();
    let posted = sim.nodes[1].engine.sh.reqs.tab.iter().map(|(id, _)| id).last().unwrap();
    sim.nodes[1].engine.sh.cancel(posted);
    sim.drain(1);
    assert_eq!(Sim::completed(202).unwrap().0, Status::Canceled);
    assert_idle(&sim);
}

/// A message as a peer would send it: little-endian words, then a payload.
fn words(ws: &[u64], payload: &[u8]) -> Vec<u8> {
    let mut m: Vec<u8> = ws.iter().flat_map(|w| w.to_le_bytes()).collect();
    m.extend_from_slice(payload);
    m
}

#[test]
fn unexpected_fragments_reuse_their_buffer() {
    let mut sim = Sim::new(1, cfg(), 1);
    let e = &mut sim.nodes[0].engine;
    // A first fragment announcing 1 TiB: queued, with a buffer for what arrived only.
    e.on_am(wire::AM_EAGER_FIRST, AmRecv::borrowed(&words(&[5, 1, 100, 1 << 40], &[1; 10])));
    assert_eq!(e.tag.probe(5, u64::MAX, false).map(|(i, _)| i.length), Some(1 << 40));
    // Two-fragment messages, each received after it arrived: the second one reassembles in
    // the buffer the first one gave back.
    let data: Vec<u8> = (0..3000u32).map(|i| (i * 13 % 251) as u8).collect();
    let mut kept = None;
    for (tag, msg_id) in [(6u64, 200u64), (7, 201)] {
        e.on_am(wire::AM_EAGER_FIRST, AmRecv::borrowed(&words(&[tag, 1, msg_id, 3000], &data[..2000])));
        e.on_am(wire::AM_EAGER_MIDDLE, AmRecv::borrowed(&words(&[1, msg_id, 2000], &data[2000..])));
        assert!(e.tag.frag_bufs.is_empty(), "the buffer is in use");
        let mut out = vec![0u8; 3000];
        // SAFETY: `out` outlives the call, which completes at once (the message is here).
        let buf = unsafe { UserBuf::contig(out.as_mut_ptr(), out.len()) };
        let r = e.tag.tag_recv(&mut e.sh, buf, tag, u64::MAX, RequestParam::new()).unwrap();
        assert!(matches!(r, crate::tag::recv::RecvOut::Done(i) if i.length == 3000), "{r:?}");
        assert!(out == data);
        assert_eq!(e.tag.frag_bufs.len(), 1);
        assert_eq!(*kept.get_or_insert(e.tag.frag_bufs[0].as_ptr()), e.tag.frag_bufs[0].as_ptr(), "a new buffer");
    }
}

/// An RTS as a peer would send it, with a key of `klen` bytes.
fn rts(tag: u64, klen: usize) -> Vec<u8> {
    let mut m = words(&[tag, 1, 2, 65536, 0x1000], &[]);
    m.push(wire::RTS_FLAG_CONTIG);
    m.extend_from_slice(&(klen as u16).to_le_bytes());
    m.extend(std::iter::repeat_n(0xab, klen));
    m
}

#[test]
fn malformed_protocol_messages_are_dropped() {
    let mut sim = Sim::new(1, cfg(), 1);
    let e = &mut sim.nodes[0].engine;
    // A well-formed RTS waits as an unexpected message; one whose key is longer than any
    // transport packs, or that is cut short, is dropped.
    e.on_am(wire::AM_RNDV_RTS, AmRecv::borrowed(&rts(7, 24)));
    assert_eq!(e.tag.probe(7, u64::MAX, false).map(|(i, _)| i.length), Some(65536));
    e.on_am(wire::AM_RNDV_RTS, AmRecv::borrowed(&rts(8, uct::PackedKey::MAX + 1)));
    assert!(e.tag.probe(8, u64::MAX, false).is_none());
    let short = rts(9, 24);
    e.on_am(wire::AM_RNDV_RTS, AmRecv::borrowed(&short[..short.len() - 1]));
    assert!(e.tag.probe(9, u64::MAX, false).is_none());
    // Truncated or garbage headers of every protocol message, and ids UCP does not use:
    // dropped or taken as data, never a panic.
    let noise: Vec<u8> = (0..96u32).map(|i| (i.wrapping_mul(151) >> 2) as u8).collect();
    for id in 0..=16 {
        for len in 0..noise.len() {
            e.on_am(id, AmRecv::borrowed(&noise[..len]));
        }
    }
    sim.drain(0);
}

/// `cfg()` with a modelled transport's tag matching (a list of 8) and a tag lane: eager through
/// it up to 1000 bytes (short up to 40), rendezvous as software requests beyond.
fn tm_cfg() -> SimConfig {
    let mut c = cfg();
    c.tm = 8;
    c.ep_cfg.tag = Some(crate::proto::config::TagLaneCaps { short_max: Some(40), bcopy_max: 1000, hw_rndv_max: 0 });
    c
}

/// Sends a first message from node `from` over `ep` to node `to` and receives it there: it
/// arrives unexpected through the transport's handlers, which activates offload on `to`.
fn activate(sim: &mut Sim, from: usize, ep: Id, to: usize) {
    let w = pattern(99, 10);
    sim.send(from, ep, &w, 5, false, 900).unwrap();
    // Everything delivered: it waits unexpected.
    sim.run_until(|_| false);
    let mut got = vec![0u8; 10];
    sim.recv(to, &mut got, 5, u64::MAX, 901).unwrap();
    assert!(Sim::completed(901).is_some() && got == w, "the first message");
}

#[test]
fn tag_offload_in_memory_matches_in_the_transport_in_posting_order() {
    for seed in [1, 2, 3] {
        let mut sim = Sim::new(2, tm_cfg(), seed);
        let (a, _b) = pair(&mut sim);
        activate(&mut sim, 0, a, 1);
        // Twelve receives for one tag: the first eight go to the transport's list (its size),
        // the other four stay in software; the messages of every protocol through the tag lane
        // then match them in posting order, in the transport and then in software.
        let sizes = [8, 100, 1000, 2000, 8, 10_000, 40, 500, 8, 3000, 100, 70_000];
        let sends: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(i, n)).collect();
        let mut recvs: Vec<Vec<u8>> = sizes.iter().map(|&n| vec![0u8; n]).collect();
        for (i, r) in recvs.iter_mut().enumerate() {
            sim.recv(1, r, 7, u64::MAX, 1000 + i).unwrap();
        }
        let posted = sim.nodes[1].engine.sh.counts.offload_posted;
        assert_eq!(posted, 8, "the list takes eight");
        for (i, d) in sends.iter().enumerate() {
            sim.send(0, a, d, 7, i % 3 == 0, i).unwrap();
        }
        let n = sizes.len();
        assert!(sim.run_until(|_| (0..n).all(|i| Sim::completed(i).is_some() && Sim::completed(1000 + i).is_some())));
        for i in 0..n {
            let (st, info, _) = Sim::completed(1000 + i).unwrap();
            assert_eq!((st, info.length, info.sender_tag), (Status::Ok, sizes[i], 7), "receive {i}");
            assert!(recvs[i] == sends[i], "receive {i} got other data (seed {seed})");
            assert_eq!(Sim::completed(i).unwrap().0, Status::Ok, "send {i}");
        }
        let c = sim.nodes[1].engine.sh.counts;
        assert_eq!(c.offload_matched, 8, "{c:?}");
        assert_eq!(c.offload_sw_matched, 0, "{c:?}");
        assert!(sim.nodes[1].tm.is_empty());
        assert_idle(&sim);
    }
}

#[test]
fn tag_offload_in_memory_a_software_match_takes_the_receive_back() {
    let mut sim = Sim::new(3, tm_cfg(), 5);
    // Node 0 sends through a tag lane, node 1 (no tag lane) as active messages.
    let a = sim.connect(0, 2);
    let _ = sim.connect(2, 0);
    let plain = cfg().ep_cfg;
    let b = sim.connect_cfg(1, 2, plain);
    let _ = sim.connect_cfg(2, 1, plain);
    activate(&mut sim, 0, a, 2);
    let mut r = vec![0u8; 100];
    sim.recv(2, &mut r, 6, u64::MAX, 1000).unwrap();
    assert_eq!(sim.nodes[2].tm.len(), 1, "posted to the transport");
    // The message comes the other way: software matches the offloaded receive, cancels it in
    // the transport, and delivers.
    let d = pattern(6, 100);
    sim.send(1, b, &d, 6, false, 1).unwrap();
    assert!(sim.run_until(|_| Sim::completed(1000).is_some() && Sim::completed(1).is_some()));
    assert_eq!(Sim::completed(1000).unwrap().0, Status::Ok);
    assert!(r == d);
    assert!(sim.nodes[2].tm.is_empty(), "still listed in the transport");
    let c = sim.nodes[2].engine.sh.counts;
    assert_eq!((c.offload_posted, c.offload_matched, c.offload_sw_matched), (1, 0, 1), "{c:?}");
    // A later message of node 0 for that tag finds nothing listed: unexpected, as it should.
    sim.send(0, a, &d, 6, false, 2).unwrap();
    sim.run_until(|_| false);
    assert!(Sim::completed(2).is_some());
    assert_eq!(sim.nodes[2].engine.tag.unexp.len(), 1);
}

/// `UCX_TM_FORCE_THRESH` with a receive of the batch refused by the transport: the receives
/// queued after it stay in software too, so none of them matches in the transport ahead of it;
/// the messages reach the receives in posting order.
#[test]
fn tag_offload_in_memory_a_refused_receive_keeps_the_rest_of_a_forced_batch_in_software() {
    let mut c = tm_cfg();
    c.tm_offload = crate::tag::offload::OffloadCfg { thresh: 1000, max_bb: 0, force_thresh: 10_000 };
    c.tm_refuse_len = Some(200);
    let mut sim = Sim::new(2, c, 9);
    let (a, _b) = pair(&mut sim);
    activate(&mut sim, 0, a, 1);
    // Three small receives (software only), the second one the transport refuses; then a large
    // one, which pushes the three to the transport before itself.
    let caps = [100, 200, 300, 20_000];
    let mut recvs: Vec<Vec<u8>> = caps.iter().map(|&n| vec![0u8; n]).collect();
    for (i, r) in recvs.iter_mut().enumerate() {
        sim.recv(1, r, 7, u64::MAX, 1000 + i).unwrap();
    }
    let k = sim.nodes[1].engine.sh.counts;
    assert_eq!((k.offload_forced, k.offload_refused), (3, 3), "{k:?}");
    assert_eq!(k.offload_posted, 1, "{k:?}");
    assert_eq!(sim.nodes[1].tm.len(), 1, "only the receive before the refused one is in the transport");
    let sizes = [50, 60, 70, 80];
    let sends: Vec<Vec<u8>> = sizes.iter().enumerate().map(|(i, &n)| pattern(i + 1, n)).collect();
    for (i, d) in sends.iter().enumerate() {
        sim.send(0, a, d, 7, false, i).unwrap();
    }
    assert!(sim.run_until(|_| (0..4).all(|i| Sim::completed(1000 + i).is_some())));
    for i in 0..4 {
        let (st, info, _) = Sim::completed(1000 + i).unwrap();
        assert_eq!((st, info.length), (Status::Ok, sizes[i]), "receive {i}");
        assert!(recvs[i][..sizes[i]] == sends[i][..], "receive {i} got another message");
    }
    let k = sim.nodes[1].engine.sh.counts;
    assert_eq!(k.offload_matched, 1, "{k:?}");
    assert!(sim.nodes[1].tm.is_empty());
    assert_idle(&sim);
}
