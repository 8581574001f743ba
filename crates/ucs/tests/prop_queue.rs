//! `Queue` against a `Vec` model under random operation sequences.

use proptest::prelude::*;
use ucs::queue::Queue;

#[derive(Clone, Debug)]
enum Op {
    Push(u8),
    PushFront(u8),
    Pop,
    PeekMutAdd(u8),
    /// Remove elements divisible by the divisor, bumping the others.
    ExtractIf(u8),
    Retain(u8),
    RemoveFirst(u8),
    Clear,
    Extend(Vec<u8>),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => any::<u8>().prop_map(Op::Push),
        2 => any::<u8>().prop_map(Op::PushFront),
        3 => Just(Op::Pop),
        1 => any::<u8>().prop_map(Op::PeekMutAdd),
        1 => (1u8..6).prop_map(Op::ExtractIf),
        1 => (1u8..6).prop_map(Op::Retain),
        1 => any::<u8>().prop_map(Op::RemoveFirst),
        1 => prop::collection::vec(any::<u8>(), 0..5).prop_map(Op::Extend),
        1 => Just(Op::Clear),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn queue_matches_vec_model(ops in prop::collection::vec(op(), 0..200)) {
        let mut q: Queue<u8> = Queue::new();
        let mut model: Vec<u8> = Vec::new();
        for op in ops {
            match op {
                Op::Push(v) => {
                    q.push(v);
                    model.push(v);
                }
                Op::PushFront(v) => {
                    q.push_front(v);
                    model.insert(0, v);
                }
                Op::Pop => {
                    let want = if model.is_empty() { None } else { Some(model.remove(0)) };
                    prop_assert_eq!(q.pop(), want);
                }
                Op::PeekMutAdd(d) => {
                    if let Some(h) = q.peek_mut() {
                        *h = h.wrapping_add(d);
                    }
                    if let Some(h) = model.first_mut() {
                        *h = h.wrapping_add(d);
                    }
                }
                Op::ExtractIf(div) => {
                    let mut got = Vec::new();
                    let mut visited = Vec::new();
                    q.extract_if(
                        |e| {
                            visited.push(*e);
                            let take = *e % div == 0;
                            if !take {
                                *e = e.wrapping_add(1);
                            }
                            take
                        },
                        |e| got.push(e),
                    );
                    prop_assert_eq!(&visited, &model, "visited in order, once each");
                    let want: Vec<u8> = model.iter().copied().filter(|e| e % div == 0).collect();
                    model = model.iter().filter(|e| *e % div != 0).map(|e| e.wrapping_add(1)).collect();
                    prop_assert_eq!(got, want);
                }
                Op::Retain(div) => {
                    q.retain(|e| *e % div != 0);
                    model.retain(|e| e % div != 0);
                }
                Op::RemoveFirst(v) => {
                    let want = model.iter().position(|&e| e >= v).map(|i| model.remove(i));
                    prop_assert_eq!(q.remove_first(|e| *e >= v), want);
                }
                Op::Clear => {
                    q.clear();
                    model.clear();
                }
                Op::Extend(vs) => {
                    q.extend(vs.iter().copied());
                    model.extend(vs);
                }
            }
            prop_assert_eq!(q.len(), model.len());
            prop_assert_eq!(q.is_empty(), model.is_empty());
            prop_assert_eq!(q.peek(), model.first());
            prop_assert!(q.iter().eq(model.iter()));
        }
        prop_assert_eq!(q.into_iter().collect::<Vec<_>>(), model);
    }
}
