//! Property test: the tag matcher against a naive model (linear lists, posting and arrival
//! order kept explicitly).

use proptest::prelude::*;
use ucp::tag::{bucket_index, tag_matches, Arrived, Posted, RecvHandle, TagMatcher, FULL_MASK};

#[derive(Clone, Debug)]
enum Op {
    Post { tag: u64, mask: u64 },
    Arrive { tag: u64 },
    Cancel { which: usize },
    Probe { tag: u64, mask: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    // Few distinct tags so that matches, collisions and wildcards are frequent; some tags differ
    // only in high bits, and two share tag 1's hash bucket.
    let mut same = (4u64..).filter(|&t| bucket_index(t) == bucket_index(1));
    let (c1, c2) = (same.next().unwrap(), same.next().unwrap());
    let tag = prop_oneof![0u64..4, Just(1u64 << 40), Just(c1), Just(c2), Just(u64::MAX)];
    let mask = prop_oneof![Just(FULL_MASK), Just(0u64), Just(1u64), Just(!1u64), Just(0xffff_ffffu64)];
    prop_oneof![
        3 => (tag.clone(), mask.clone()).prop_map(|(tag, mask)| Op::Post { tag, mask }),
        3 => tag.clone().prop_map(|tag| Op::Arrive { tag }),
        1 => (0usize..64).prop_map(|which| Op::Cancel { which }),
        1 => (tag, mask).prop_map(|(tag, mask)| Op::Probe { tag, mask }),
    ]
}

/// The model: receives in posting order, messages in arrival order.
#[derive(Default)]
struct Model {
    expected: Vec<(u64, u64, u32)>, // tag, mask, receive id
    unexpected: Vec<(u64, u32)>,    // tag, message id
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    #[test]
    fn matcher_agrees_with_the_model(ops in proptest::collection::vec(op(), 1..200)) {
        let mut m: TagMatcher<u32, u32> = TagMatcher::new();
        let mut model = Model::default();
        let mut handles: Vec<(RecvHandle, u32)> = Vec::new();
        let (mut next_recv, mut next_msg) = (0u32, 0u32);
        for op in ops {
            match op {
                Op::Post { tag, mask } => {
                    let id = next_recv;
                    next_recv += 1;
                    let want = model.unexpected.iter().position(|&(t, _)| tag_matches(t, tag, mask));
                    match (m.post(tag, mask, id), want) {
                        (Posted::Matched { recv, tag: t, msg }, Some(p)) => {
                            let (mt, mmsg) = model.unexpected.remove(p);
                            prop_assert_eq!((recv, t, msg), (id, mt, mmsg));
                        }
                        (Posted::Waiting(h), None) => {
                            model.expected.push((tag, mask, id));
                            handles.push((h, id));
                        }
                        (got, want) => prop_assert!(false, "post: got {:?}, model {:?}", got, want),
                    }
                }
                Op::Arrive { tag } => {
                    let id = next_msg;
                    next_msg += 1;
                    let want = model.expected.iter().position(|&(t, mk, _)| tag_matches(tag, t, mk));
                    match (m.arrive(tag, || id), want) {
                        (Arrived::Matched(r), Some(p)) => {
                            let (_, _, rid) = model.expected.remove(p);
                            prop_assert_eq!(r, rid);
                        }
                        (Arrived::Unexpected(_), None) => model.unexpected.push((tag, id)),
                        (got, want) => prop_assert!(false, "arrive: got {:?}, model {:?}", got, want),
                    }
                }
                Op::Cancel { which } => {
                    if handles.is_empty() {
                        continue;
                    }
                    let (h, id) = handles[which % handles.len()];
                    let want = model.expected.iter().position(|&(_, _, r)| r == id);
                    match (m.cancel(h), want) {
                        (Some(r), Some(p)) => {
                            prop_assert_eq!(r, id);
                            model.expected.remove(p);
                        }
                        (None, None) => {}
                        (got, want) => prop_assert!(false, "cancel: got {:?}, model {:?}", got, want),
                    }
                }
                Op::Probe { tag, mask } => {
                    let want = model.unexpected.iter().find(|&&(t, _)| tag_matches(t, tag, mask)).copied();
                    let got = m.probe(tag, mask).map(|(_, t, v)| (t, *v));
                    prop_assert_eq!(got, want);
                }
            }
            prop_assert_eq!(m.expected_len(), model.expected.len());
            prop_assert_eq!(m.unexpected_len(), model.unexpected.len());
        }
        // Draining gives posting and arrival order.
        let exp: Vec<u32> = m.drain_expected();
        prop_assert_eq!(exp, model.expected.iter().map(|e| e.2).collect::<Vec<_>>());
        let unexp: Vec<(u64, u32)> = m.drain_unexpected();
        prop_assert_eq!(unexp, model.unexpected);
    }
}
