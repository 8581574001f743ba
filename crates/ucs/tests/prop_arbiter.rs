//! `Arbiter` against a naive model (groups in a `Vec`, schedule as a `Vec` of indices), plus
//! scenario tests of fairness and of the external stepping API.

use std::collections::VecDeque;

use proptest::prelude::*;
use ucs::arbiter::{ArbResult, Arbiter, GroupId};

#[derive(Clone, Debug)]
enum Op {
    AddGroup,
    RemoveGroup(usize),
    Push(usize),
    PushHead(usize),
    Schedule(usize),
    Deschedule(usize),
    Purge(usize),
    Dispatch(Vec<ArbResult>),
    PopNext,
    /// Resolves the most recent outstanding `PopNext`, or resolves group `.1` with no element.
    Resolve(ArbResult, usize),
}

fn arb_result() -> impl Strategy<Value = ArbResult> {
    prop_oneof![
        4 => Just(ArbResult::RemoveElem),
        2 => Just(ArbResult::NextGroup),
        1 => Just(ArbResult::DeschedGroup),
        1 => Just(ArbResult::Stop),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let g = 0usize..64;
    prop_oneof![
        2 => Just(Op::AddGroup),
        1 => g.clone().prop_map(Op::RemoveGroup),
        8 => g.clone().prop_map(Op::Push),
        2 => g.clone().prop_map(Op::PushHead),
        2 => g.clone().prop_map(Op::Schedule),
        2 => g.clone().prop_map(Op::Deschedule),
        1 => g.clone().prop_map(Op::Purge),
        3 => prop::collection::vec(arb_result(), 1..6).prop_map(Op::Dispatch),
        3 => Just(Op::PopNext),
        3 => (arb_result(), g).prop_map(|(r, g)| Op::Resolve(r, g)),
    ]
}

#[derive(Default)]
struct Model {
    /// `None` once removed.
    groups: Vec<Option<VecDeque<u32>>>,
    sched: Vec<usize>,
    step: Option<usize>,
}

impl Model {
    fn unsched(&mut self, i: usize) {
        self.sched.retain(|&s| s != i);
    }

    fn push(&mut self, i: usize, v: u32, head: bool) -> bool {
        let Some(Some(q)) = self.groups.get_mut(i) else { return false };
        if head {
            q.push_front(v);
        } else {
            q.push_back(v);
        }
        if !self.sched.contains(&i) {
            self.sched.push(i);
        }
        true
    }

    fn dispatch(&mut self, script: &[ArbResult], visits: &mut Vec<(usize, u32)>) -> Vec<(usize, u32)> {
        let mut removed = Vec::new();
        if self.step.is_some() {
            return removed;
        }
        let (mut budget, mut idle, mut k) = (self.sched.len(), 0, 0);
        while idle < budget && !self.sched.is_empty() {
            let i = self.sched.remove(0);
            let q = self.groups[i].as_mut().unwrap();
            visits.push((i, q[0]));
            let r = script[k % script.len()];
            k += 1;
            match r {
                ArbResult::RemoveElem => {
                    removed.push((i, q.pop_front().unwrap()));
                    if !q.is_empty() {
                        self.sched.push(i);
                    }
                    idle = 0;
                    budget = self.sched.len();
                }
                ArbResult::NextGroup => {
                    self.sched.push(i);
                    idle += 1;
                }
                ArbResult::DeschedGroup => idle += 1,
                ArbResult::Stop => {
                    self.sched.insert(0, i);
                    break;
                }
            }
        }
        removed
    }

    fn resolve(&mut self, i: usize, elem: Option<u32>, r: ArbResult) -> Option<u32> {
        if self.step == Some(i) {
            self.step = None;
        }
        let Some(q) = self.groups[i].as_mut() else { return elem };
        if let Some(e) = elem {
            q.push_front(e);
        }
        let nonempty = !q.is_empty();
        self.unsched(i);
        match r {
            ArbResult::RemoveElem | ArbResult::NextGroup if nonempty => self.sched.push(i),
            ArbResult::Stop if nonempty => self.sched.insert(0, i),
            _ => {}
        }
        None
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn arbiter_matches_model(ops in prop::collection::vec(op(), 0..150)) {
        let mut arb: Arbiter<u32> = Arbiter::new();
        let mut m = Model::default();
        let mut ids: Vec<GroupId> = Vec::new();
        let mut held: Vec<(usize, u32)> = Vec::new();
        let mut next_val = 0u32;
        for op in ops {
            let pick = |s: usize| if ids.is_empty() { None } else { Some(s % ids.len()) };
            match op {
                Op::AddGroup => {
                    ids.push(arb.add_group());
                    m.groups.push(Some(VecDeque::new()));
                }
                Op::RemoveGroup(s) => if let Some(i) = pick(s) {
                    let mut got = Vec::new();
                    let live = arb.remove_group(ids[i], |e| got.push(e));
                    prop_assert_eq!(live, m.groups[i].is_some());
                    let want: Vec<u32> = m.groups[i].take().map(Vec::from).unwrap_or_default();
                    prop_assert_eq!(got, want);
                    m.unsched(i);
                    if m.step == Some(i) {
                        m.step = None;
                    }
                },
                Op::Push(s) | Op::PushHead(s) => if let Some(i) = pick(s) {
                    next_val += 1;
                    let head = matches!(op, Op::PushHead(_));
                    let back = if head { arb.push_head(ids[i], next_val) } else { arb.push(ids[i], next_val) };
                    let ok = m.push(i, next_val, head);
                    prop_assert_eq!(back, if ok { None } else { Some(next_val) });
                },
                Op::Schedule(s) => if let Some(i) = pick(s) {
                    arb.schedule(ids[i]);
                    if m.groups[i].as_ref().is_some_and(|q| !q.is_empty()) && !m.sched.contains(&i) {
                        m.sched.push(i);
                    }
                },
                Op::Deschedule(s) => if let Some(i) = pick(s) {
                    arb.deschedule(ids[i]);
                    m.unsched(i);
                },
                Op::Purge(s) => if let Some(i) = pick(s) {
                    let mut got = Vec::new();
                    arb.purge(ids[i], |e| got.push(e));
                    let want: Vec<u32> = m.groups[i].as_mut().map(|q| q.drain(..).collect()).unwrap_or_default();
                    prop_assert_eq!(got, want);
                    m.unsched(i);
                },
                Op::Dispatch(script) => {
                    let (mut visits, mut removed, mut k) = (Vec::new(), Vec::new(), 0);
                    let n = arb.dispatch_remove(
                        |g, e| {
                            visits.push((g, *e));
                            k += 1;
                            script[(k - 1) % script.len()]
                        },
                        |g, e| removed.push((g, e)),
                    );
                    let mut want_visits = Vec::new();
                    let want_removed = m.dispatch(&script, &mut want_visits);
                    let as_ids = |v: Vec<(usize, u32)>| v.into_iter().map(|(i, e)| (ids[i], e)).collect::<Vec<_>>();
                    prop_assert_eq!(n, want_removed.len());
                    prop_assert_eq!(visits, as_ids(want_visits));
                    prop_assert_eq!(removed, as_ids(want_removed));
                }
                Op::PopNext => {
                    let want = match (m.step, m.sched.first()) {
                        (None, Some(&i)) => {
                            let e = m.groups[i].as_mut().unwrap().pop_front().unwrap();
                            m.step = Some(i);
                            Some((i, e))
                        }
                        _ => None,
                    };
                    let got = arb.pop_next();
                    prop_assert_eq!(got, want.map(|(i, e)| (ids[i], e)));
                    held.extend(want);
                }
                Op::Resolve(r, s) => {
                    let (i, elem) = match held.pop() {
                        Some((i, e)) => (i, (r != ArbResult::RemoveElem).then_some(e)),
                        None => match pick(s) { Some(i) => (i, None), None => continue },
                    };
                    prop_assert_eq!(arb.resolve(ids[i], elem, r), m.resolve(i, elem, r));
                }
            }
            // Full state comparison.
            let sched: Vec<GroupId> = m.sched.iter().map(|&i| ids[i]).collect();
            prop_assert_eq!(arb.scheduled_groups().collect::<Vec<_>>(), sched);
            prop_assert_eq!(arb.num_scheduled(), m.sched.len());
            prop_assert_eq!(arb.step_group(), m.step.map(|i| ids[i]));
            let mut total = 0;
            for (i, q) in m.groups.iter().enumerate() {
                let g = ids[i];
                prop_assert_eq!(arb.contains_group(g), q.is_some());
                prop_assert_eq!(arb.is_scheduled(g), m.sched.contains(&i));
                let want: Vec<u32> = q.iter().flatten().copied().collect();
                prop_assert_eq!(arb.group_len(g), want.len());
                prop_assert_eq!(arb.group_is_empty(g), want.is_empty());
                prop_assert_eq!(arb.group_iter(g).copied().collect::<Vec<_>>(), want.clone());
                total += want.len();
            }
            prop_assert_eq!(arb.len(), total);
            prop_assert_eq!(arb.is_empty(), total == 0);
            prop_assert_eq!(arb.num_groups(), m.groups.iter().flatten().count());
        }
    }
}

fn filled(groups: usize, per_group: u32) -> (Arbiter<u32>, Vec<GroupId>) {
    let mut arb = Arbiter::new();
    let ids: Vec<GroupId> = (0..groups).map(|_| arb.add_group()).collect();
    for (n, &g) in ids.iter().enumerate() {
        for k in 0..per_group {
            arb.push(g, n as u32 * 100 + k);
        }
    }
    (arb, ids)
}

#[test]
fn remove_elem_interleaves_groups() {
    let (mut arb, ids) = filled(3, 50);
    let mut order = Vec::new();
    assert_eq!(arb.dispatch_remove(|_, _| ArbResult::RemoveElem, |g, _| order.push(g)), 150);
    assert!(order.chunks(3).all(|c| c == ids.as_slice()), "A,B,C,A,B,C,...");
}

#[test]
fn results_place_groups() {
    let (mut arb, ids) = filled(3, 1);
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    let n = arb.dispatch(|g, _| match g {
        g if g == a => ArbResult::NextGroup,
        g if g == b => ArbResult::DeschedGroup,
        _ => ArbResult::Stop,
    });
    assert_eq!(n, 0);
    assert_eq!(arb.scheduled_groups().collect::<Vec<_>>(), [c, a]);
    assert!(!arb.is_scheduled(b) && arb.group_len(b) == 1);
    arb.schedule(b);
    assert_eq!(arb.scheduled_groups().collect::<Vec<_>>(), [c, a, b]);
    // A full pass without removal ends dispatch although nothing said Stop.
    assert_eq!(arb.dispatch(|_, _| ArbResult::NextGroup), 0);
    assert_eq!(arb.num_scheduled(), 3);
}

/// The bounded external loop from `Arbiter::begin_pass`, with a callback that pushes to its own
/// group and to other groups while its element is out.
#[test]
fn external_stepping_with_reentrant_pushes() {
    let (mut arb, ids) = filled(3, 2);
    let (a, b, c) = (ids[0], ids[1], ids[2]);
    let mut done = Vec::new();
    let mut steps = 0;
    let mut budget = arb.begin_pass();
    let mut idle = 0;
    while idle < budget {
        let Some((g, elem)) = arb.pop_next() else { break };
        steps += 1;
        assert!(arb.pop_next().is_none(), "one step at a time");
        let r = match elem {
            // Group a's first element splits: a follow-up at the head of its own group, one at
            // its tail, and one for group c.
            0 => {
                assert_eq!(arb.push_head(a, 1000), None);
                assert_eq!(arb.push(a, 1001), None);
                assert_eq!(arb.push(c, 1002), None);
                ArbResult::RemoveElem
            }
            // Group b cannot proceed until rescheduled.
            100 => ArbResult::DeschedGroup,
            _ => ArbResult::RemoveElem,
        };
        if r == ArbResult::RemoveElem {
            arb.resolve(g, None, r);
            done.push(elem);
            idle = 0;
            budget = arb.begin_pass();
        } else {
            assert_eq!(arb.resolve(g, Some(elem), r), None);
            idle += 1;
        }
    }
    assert_eq!(done, [0, 200, 1000, 201, 1, 1002, 1001]);
    assert_eq!(steps, 8);
    assert_eq!(arb.group_iter(b).copied().collect::<Vec<_>>(), [100, 101]);
    assert!(!arb.is_scheduled(b) && arb.num_scheduled() == 0);
    arb.schedule(b);
    assert_eq!(arb.dispatch(|_, _| ArbResult::RemoveElem), 2);
    assert!(arb.is_empty());
}

#[test]
fn step_survives_group_changes() {
    let (mut arb, ids) = filled(2, 2);
    let (a, b) = (ids[0], ids[1]);
    let (g, e) = arb.pop_next().unwrap();
    assert_eq!((g, e), (a, 0));
    assert_eq!(arb.dispatch(|_, _| ArbResult::RemoveElem), 0, "blocked during a step");
    arb.push(a, 2);
    arb.push_head(a, 3);
    arb.push(b, 102);
    assert_eq!(arb.resolve(a, Some(e), ArbResult::Stop), None);
    assert_eq!(arb.group_iter(a).copied().collect::<Vec<_>>(), [0, 3, 1, 2]);
    assert_eq!(arb.scheduled_groups().collect::<Vec<_>>(), [a, b]);

    let (g, e) = arb.pop_next().unwrap();
    arb.purge(g, drop);
    arb.resolve(g, Some(e), ArbResult::DeschedGroup);
    assert_eq!(arb.group_iter(a).copied().collect::<Vec<_>>(), [0]);
    assert_eq!(arb.scheduled_groups().collect::<Vec<_>>(), [b]);

    let (g, _) = arb.pop_next().unwrap();
    assert!(arb.remove_group(g, drop));
    assert_eq!(arb.resolve(g, Some(7), ArbResult::NextGroup), Some(7), "group gone: element back");
    assert_eq!(arb.step_group(), None);
    assert_eq!(arb.len(), 1);
}
