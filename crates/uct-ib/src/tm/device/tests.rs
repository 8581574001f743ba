use super::*;
use crate::tm::wire::{Rvh, Tmh, TmhOp};
use proptest::prelude::*;

const ALL: u64 = u64::MAX;

fn eager(tag: u64, app_ctx: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = Tmh { op: TmhOp::Eager, app_ctx, tag }.to_bytes().to_vec();
    m.extend_from_slice(payload);
    m
}

fn add(wr_id: u64, recv_wr_id: u64, tag: u64, mask: u64, len: usize, cnt: u16) -> ListOp {
    ListOp::Add { wr_id, recv_wr_id, tag, mask, len, signaled: true, unexpected_cnt: Some(cnt) }
}

fn dev() -> TmDevice {
    TmDevice::new(TmCaps { max_num_tags: 4, max_ops: 8 })
}

fn run(d: &mut TmDevice) {
    while d.step() {}
}

#[test]
fn a_matched_eager_message_is_placed_and_completes_once_with_match_and_data() {
    let mut d = dev();
    let h = d.post(&[add(1, 100, 7, ALL, 16, 0)]).unwrap();
    assert_eq!(h, [Some(0)]);
    run(&mut d);
    let c = d.poll().unwrap();
    assert_eq!((c.kind, c.status, c.wr_id, c.sync_req), (CqeKind::Add, CqeStatus::Success, 1, false));
    let act = d.arrive(&eager(7, 9, b"hello"), 500, 0);
    assert_eq!(act, Some(TmAction::Place { recv_wr_id: 100, from: 16, len: 5 }));
    let c = d.poll().unwrap();
    assert_eq!((c.kind, c.wr_id, c.matched, c.data_valid, c.byte_len), (CqeKind::Recv, 100, true, true, 5));
    assert_eq!((c.tag, c.app_ctx), (7, 9));
    assert!(d.poll().is_none());
    // The buffer is gone: the same tag again is unexpected.
    assert_eq!(d.arrive(&eager(7, 0, b"x"), 501, 0), None);
    let c = d.poll().unwrap();
    assert_eq!((c.kind, c.wr_id, c.matched, c.data_valid, c.byte_len), (CqeKind::Recv, 501, false, false, 17));
    assert_eq!(d.unexpected(), 1);
}

#[test]
fn matching_takes_the_earliest_added_buffer_under_its_mask() {
    let mut d = dev();
    d.post(&[add(1, 100, 0x10, 0xf0, 8, 0), add(2, 101, 0x13, ALL, 8, 0), add(3, 102, 0, 0, 8, 0)]).unwrap();
    run(&mut d);
    while d.poll().is_some() {}
    // 0x13 matches 100 (0x13 & 0xf0 == 0x10), the earliest; then 101; then the wildcard 102.
    for want in [100, 101, 102] {
        assert_eq!(d.arrive(&eager(0x13, 0, b""), 0, 0), Some(TmAction::Place { recv_wr_id: want, from: 16, len: 0 }));
        assert_eq!(d.poll().unwrap().wr_id, want);
    }
}

#[test]
fn untagged_and_unclassified_messages_go_to_software_uncounted() {
    let mut d = dev();
    d.post(&[add(1, 100, 0, 0, 8, 0)]).unwrap();
    run(&mut d);
    d.poll();
    let no_tag = Tmh { op: TmhOp::NoTag, app_ctx: 0, tag: 0 }.to_bytes();
    for (m, id) in [(&no_tag[..], 1u64), (&[9u8; 3][..], 2), (&[7u8; 20][..], 3)] {
        assert_eq!(d.arrive(m, id, 0), None);
        let c = d.poll().unwrap();
        assert_eq!((c.kind, c.wr_id, c.byte_len), (CqeKind::NoTag, id, m.len()));
    }
    assert_eq!(d.unexpected(), 0);
    // The wildcard buffer is still there.
    assert!(d.arrive(&eager(5, 0, b""), 4, 0).is_some());
}

#[test]
fn an_add_at_a_stale_phase_is_disabled_until_the_counts_agree() {
    let mut d = dev();
    // The message arrives unexpected before software's ADD runs; the ADD carries the old count.
    d.arrive(&eager(3, 0, b""), 50, 0);
    d.post(&[add(1, 100, 3, ALL, 8, 0)]).unwrap();
    run(&mut d);
    let unexp = d.poll().unwrap();
    assert_eq!((unexp.kind, unexp.matched), (CqeKind::Recv, false));
    let c = d.poll().unwrap();
    assert_eq!((c.kind, c.sync_req), (CqeKind::Add, true));
    // A later message with the tag is not matched by the disabled buffer (software must match
    // it against the unexpected one first; MPI ordering).
    assert_eq!(d.arrive(&eager(3, 0, b""), 51, 0), None);
    assert_eq!(d.unexpected(), 2);
    // An operation reporting a count still behind leaves it disabled.
    d.post(&[ListOp::Sync { wr_id: 8, signaled: true, unexpected_cnt: Some(1) }]).unwrap();
    run(&mut d);
    d.poll();
    assert_eq!(d.poll().map(|s| (s.kind, s.sync_req)), Some((CqeKind::Sync, true)));
    assert_eq!(d.arrive(&eager(3, 0, b""), 52, 0), None);
    // Software catches up and posts another buffer for the tag: the counts agree, so the first
    // buffer is enabled again and, added earlier, takes the next message; the second the one
    // after (a later receive never overtakes an earlier one).
    d.post(&[ListOp::Sync { wr_id: 9, signaled: true, unexpected_cnt: Some(3) }, add(2, 101, 3, ALL, 8, 3)]).unwrap();
    run(&mut d);
    d.poll();
    let s = d.poll().unwrap();
    assert_eq!((s.kind, s.sync_req), (CqeKind::Sync, false));
    let a = d.poll().unwrap();
    assert_eq!((a.kind, a.sync_req), (CqeKind::Add, false));
    assert_eq!(d.arrive(&eager(3, 0, b""), 53, 0), Some(TmAction::Place { recv_wr_id: 100, from: 16, len: 0 }));
    assert_eq!(d.arrive(&eager(3, 0, b""), 54, 0), Some(TmAction::Place { recv_wr_id: 101, from: 16, len: 0 }));
}

#[test]
fn a_del_reporting_the_count_removes_a_disabled_buffer_before_it_is_enabled() {
    let mut d = dev();
    d.arrive(&eager(3, 0, b""), 50, 0);
    let h = d.post(&[add(1, 100, 3, ALL, 8, 0)]).unwrap()[0].unwrap();
    run(&mut d);
    while d.poll().is_some() {}
    // Software matched the unexpected message to the receive itself and takes the buffer back;
    // the DEL carries the count that agrees with the device's.
    d.post(&[ListOp::Del { wr_id: 2, handle: h, signaled: true, unexpected_cnt: Some(1) }]).unwrap();
    run(&mut d);
    let c = d.poll().unwrap();
    assert_eq!((c.kind, c.status, c.sync_req), (CqeKind::Del, CqeStatus::Success, false));
    assert_eq!(d.arrive(&eager(3, 0, b""), 51, 0), None);
    assert_eq!(d.free_slots(), d.caps().max_num_tags as usize);
}

#[test]
fn del_succeeds_on_a_listed_buffer_and_fails_on_a_consumed_one() {
    let mut d = dev();
    let h = d.post(&[add(1, 100, 1, ALL, 8, 0), add(2, 101, 2, ALL, 8, 0)]).unwrap();
    run(&mut d);
    d.arrive(&eager(2, 0, b""), 0, 0);
    let del = |wr_id, handle| ListOp::Del { wr_id, handle, signaled: true, unexpected_cnt: Some(0) };
    d.post(&[del(3, h[0].unwrap()), del(4, h[1].unwrap())]).unwrap();
    run(&mut d);
    let got: Vec<_> = std::iter::from_fn(|| d.poll()).map(|c| (c.kind, c.status, c.wr_id)).collect();
    assert_eq!(
        got,
        [
            (CqeKind::Add, CqeStatus::Success, 1),
            (CqeKind::Add, CqeStatus::Success, 2),
            (CqeKind::Recv, CqeStatus::Success, 101),
            (CqeKind::Del, CqeStatus::Success, 3),
            (CqeKind::Del, CqeStatus::TmErr, 4),
        ]
    );
    // The deleted buffer never matches.
    assert_eq!(d.arrive(&eager(1, 0, b""), 0, 0), None);
    assert_eq!(d.free_slots(), 4);
}

#[test]
fn limits_refuse_whole_posts() {
    let mut d = TmDevice::new(TmCaps { max_num_tags: 2, max_ops: 3 });
    assert_eq!(d.post(&[add(1, 1, 0, 0, 0, 0); 3]), Err(PostError::Full), "three tags");
    assert_eq!(d.ops_outstanding(), 0, "all or nothing");
    d.post(&[add(1, 1, 0, 0, 0, 0); 2]).unwrap();
    let sync = ListOp::Sync { wr_id: 0, signaled: false, unexpected_cnt: None };
    assert_eq!(d.post(&[sync, sync]), Err(PostError::Full), "four operations");
    d.post(&[sync]).unwrap();
    assert_eq!(
        d.post(&[ListOp::Del { wr_id: 0, handle: 7, signaled: false, unexpected_cnt: None }]),
        Err(PostError::Full)
    );
    run(&mut d);
    assert_eq!(
        d.post(&[ListOp::Del { wr_id: 0, handle: 7, signaled: false, unexpected_cnt: None }]),
        Err(PostError::BadHandle(7))
    );
    assert_eq!(PostError::BadHandle(7).to_string(), "tag-list handle 7 names no added buffer");
}

#[test]
fn an_over_long_eager_message_is_cut_to_the_buffer_with_a_length_error() {
    let mut d = dev();
    d.post(&[add(1, 100, 1, ALL, 4, 0)]).unwrap();
    run(&mut d);
    d.poll();
    assert_eq!(d.arrive(&eager(1, 0, b"toolong"), 0, 0), Some(TmAction::Place { recv_wr_id: 100, from: 16, len: 4 }));
    let c = d.poll().unwrap();
    assert_eq!((c.status, c.byte_len, c.matched), (CqeStatus::LocLenErr, 4, true));
}

#[test]
fn a_slot_is_reused_only_after_its_completions_were_polled() {
    let mut d = TmDevice::new(TmCaps { max_num_tags: 1, max_ops: 4 });
    d.post(&[add(1, 100, 1, ALL, 8, 0)]).unwrap();
    run(&mut d);
    d.arrive(&eager(1, 0, b""), 0, 0);
    // The ADD and the message completions still name the slot.
    assert_eq!(d.post(&[add(2, 101, 1, ALL, 8, 0)]), Err(PostError::Full));
    d.poll();
    assert_eq!(d.post(&[add(2, 101, 1, ALL, 8, 0)]), Err(PostError::Full));
    d.poll();
    assert_eq!(d.post(&[add(2, 101, 1, ALL, 8, 0)]), Ok(vec![Some(0)]));
}

#[test]
fn the_device_asks_for_a_sync_when_far_ahead_of_software() {
    let mut d = dev();
    for i in 0..0x3fff {
        d.arrive(&eager(1, 0, b""), i, 0);
        assert!(!d.poll().unwrap().sync_req);
    }
    d.arrive(&eager(1, 0, b""), 0, 0);
    assert!(d.poll().unwrap().sync_req, "0x4000 unexpected messages not reported");
}

fn rndv(tag: u64, app_ctx: u32, rvh: Rvh, meta: &[u8]) -> Vec<u8> {
    let mut m = Tmh { op: TmhOp::Rndv, app_ctx, tag }.to_bytes().to_vec();
    m.extend_from_slice(&rvh.to_bytes());
    m.extend_from_slice(meta);
    m
}

#[test]
fn a_matched_rendezvous_reads_the_data_sends_the_fin_and_completes_twice() {
    let mut d = dev();
    d.post(&[add(1, 100, 4, ALL, 4096, 0)]).unwrap();
    run(&mut d);
    d.poll();
    let rvh = Rvh { va: 0x1000, rkey: 77, len: 3000 };
    let act = d.arrive(&rndv(4, 12, rvh, b"hdr"), 9, 5).unwrap();
    let TmAction::Read { read, qp, recv_wr_id, rvh: r } = act else { panic!("{act:?}") };
    assert_eq!((qp, recv_wr_id, r), (5, 100, rvh));
    let m = d.poll().unwrap();
    assert_eq!((m.kind, m.wr_id, m.matched, m.data_valid, m.tag, m.app_ctx), (CqeKind::Recv, 100, true, false, 4, 12));
    assert!(d.poll().is_none(), "no data completion before the read");
    assert_eq!(d.read_done(read + 1, true), None, "an unknown read");
    let fin = d.read_done(read, true).unwrap();
    assert_eq!(fin, TmAction::Fin { qp: 5, tmh: Tmh { op: TmhOp::Fin, app_ctx: 12, tag: 4 }, rvh });
    let c = d.poll().unwrap();
    assert_eq!((c.wr_id, c.matched, c.data_valid, c.byte_len, c.status), (100, false, true, 3000, CqeStatus::Success));
    assert_eq!(d.reads_in_progress(), 0);
    assert_eq!(d.free_slots(), 4, "both completions polled: the slot is free");
}

#[test]
fn a_rendezvous_larger_than_the_buffer_is_left_to_software_and_a_failed_read_says_so() {
    let mut d = dev();
    d.post(&[add(1, 100, 4, ALL, 64, 0), add(2, 101, 4, ALL, 64, 0)]).unwrap();
    run(&mut d);
    d.poll();
    d.poll();
    let big = rndv(4, 0, Rvh { va: 0, rkey: 1, len: 65 }, b"m");
    assert_eq!(d.arrive(&big, 0, 0), Some(TmAction::Place { recv_wr_id: 100, from: 0, len: 33 }));
    let c = d.poll().unwrap();
    assert_eq!((c.status, c.byte_len), (CqeStatus::RndvIncomplete, 33));
    let act = d.arrive(&rndv(4, 0, Rvh { va: 0, rkey: 1, len: 64 }, b""), 0, 0).unwrap();
    let TmAction::Read { read, .. } = act else { panic!("{act:?}") };
    d.poll();
    assert_eq!(d.read_done(read, false), None, "no FIN for a failed read");
    assert_eq!(d.poll().unwrap().status, CqeStatus::ReadErr);
}

#[test]
fn an_unexpected_rendezvous_request_counts_and_stays_whole() {
    let mut d = dev();
    let m = rndv(4, 0, Rvh { va: 0, rkey: 1, len: 10 }, b"meta");
    assert_eq!(d.arrive(&m, 33, 0), None);
    let c = d.poll().unwrap();
    assert_eq!((c.kind, c.wr_id, c.matched, c.byte_len), (CqeKind::Recv, 33, false, m.len()));
    assert_eq!(d.unexpected(), 1);
}

/// A step of the property test.
#[derive(Clone, Debug)]
enum Ev {
    Add { tag: u64, mask: u64 },
    Del(usize),
    Arrive(u64),
    Step,
    Poll,
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        3 => (0u64..4, prop_oneof![Just(ALL), Just(1u64), Just(0u64)]).prop_map(|(tag, mask)| Ev::Add { tag, mask }),
        1 => (0usize..8).prop_map(Ev::Del),
        3 => (0u64..4).prop_map(Ev::Arrive),
        3 => Just(Ev::Step),
        3 => Just(Ev::Poll),
    ]
}

proptest! {
    /// Random list operations and arrivals, with software reporting the unexpected completions
    /// it has polled on every operation, against a reference list: every match names the
    /// buffer the reference picks (the earliest added, enabled one under its mask; entries
    /// added at a stale phase are enabled by the first operation whose count agrees), no buffer
    /// receives twice or after its DEL succeeded, the counts agree, and an ADD's handle is
    /// never one still in use.
    #[test]
    fn matches_the_reference_list(evs in proptest::collection::vec(ev(), 1..200)) {
        let mut d = TmDevice::new(TmCaps { max_num_tags: 4, max_ops: 6 });
        // Reference: queued operations; the list of (recv_wr_id, tag, mask, enabled) in order.
        #[derive(Clone, Copy)]
        enum Q { Add(u64, u64, u64, u16), Del(u64, u16) }
        let mut queue: VecDeque<Q> = VecDeque::new();
        let mut list: Vec<(u64, u64, u64, bool)> = Vec::new();
        let mut ref_unexp: u16 = 0;
        let mut sw_polled_unexp: u16 = 0;
        let mut next_id = 1000u64;
        // recv_wr_id -> handle, for buffers added and not yet received or deleted.
        let mut live: Vec<(u64, u32)> = Vec::new();
        let mut done: std::collections::HashSet<u64> = Default::default();
        let mut expected_matches: VecDeque<u64> = VecDeque::new();
        for e in evs {
            match e {
                Ev::Add { tag, mask } => {
                    next_id += 1;
                    let op = ListOp::Add {
                        wr_id: next_id, recv_wr_id: next_id, tag, mask, len: 8, signaled: true,
                        unexpected_cnt: Some(sw_polled_unexp),
                    };
                    if let Ok(h) = d.post(&[op]) {
                        let h = h[0].unwrap();
                        prop_assert!(live.iter().all(|&(_, x)| x != h), "handle {} reused while in use", h);
                        live.push((next_id, h));
                        queue.push_back(Q::Add(next_id, tag & mask, mask, sw_polled_unexp));
                    }
                }
                Ev::Del(k) => {
                    if let Some(&(id, h)) = live.get(k) {
                        let op = ListOp::Del { wr_id: 1, handle: h, signaled: true, unexpected_cnt: Some(sw_polled_unexp) };
                        if d.post(&[op]).is_ok() {
                            queue.push_back(Q::Del(id, sw_polled_unexp));
                        }
                    }
                }
                Ev::Step => {
                    let ran = d.step();
                    prop_assert_eq!(ran, !queue.is_empty());
                    // An operation whose count agrees with the device's enables every entry.
                    if let Some(Q::Add(.., phase) | Q::Del(_, phase)) = queue.front() {
                        if *phase == ref_unexp {
                            list.iter_mut().for_each(|x| x.3 = true);
                        }
                    }
                    match queue.pop_front() {
                        Some(Q::Add(id, tag, mask, phase)) => list.push((id, tag, mask, phase == ref_unexp)),
                        Some(Q::Del(id, _)) => {
                            if let Some(p) = list.iter().position(|x| x.0 == id) {
                                list.remove(p);
                                live.retain(|x| x.0 != id);
                                done.insert(id);
                            }
                        }
                        None => {}
                    }
                }
                Ev::Arrive(tag) => {
                    let got = d.arrive(&eager(tag, 0, b""), 0, 0);
                    let want = list.iter().position(|&(_, t, m, en)| en && tag & m == t);
                    match want {
                        Some(p) => {
                            let (id, ..) = list.remove(p);
                            prop_assert_eq!(got, Some(TmAction::Place { recv_wr_id: id, from: 16, len: 0 }));
                            prop_assert!(done.insert(id), "buffer {} received twice", id);
                            expected_matches.push_back(id);
                        }
                        None => {
                            prop_assert_eq!(got, None);
                            ref_unexp = ref_unexp.wrapping_add(1);
                        }
                    }
                    prop_assert_eq!(d.unexpected(), ref_unexp);
                }
                Ev::Poll => {
                    if let Some(c) = d.poll() {
                        if c.kind == CqeKind::Recv {
                            if c.matched {
                                prop_assert_eq!(Some(c.wr_id), expected_matches.pop_front());
                                live.retain(|x| x.0 != c.wr_id);
                            } else {
                                sw_polled_unexp = sw_polled_unexp.wrapping_add(1);
                            }
                        }
                    }
                }
            }
        }
    }
}
