//! `FragList` against a naive reorder model, on streams that cross the 65535 -> 0 wrap.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use proptest::prelude::*;
use ucs::fraglist::{FragInsert, FragList, Sn16};

const WINDOW: u16 = 32;

/// The obvious receiver: positions as unbounded integers, held elements in a map.
struct Model {
    head: i64,
    held: BTreeMap<i64, u32>,
}

impl Model {
    fn insert(&mut self, pos: i64, value: u32, out: &mut Vec<u32>) -> &'static str {
        let d = pos - self.head;
        if d <= 0 || self.held.contains_key(&pos) {
            return "dup";
        }
        if d > 1 && d > i64::from(WINDOW) {
            return "window";
        }
        if d > 1 {
            self.held.insert(pos, value);
            return "held";
        }
        self.head = pos;
        out.push(value);
        while let Some(v) = self.held.remove(&(self.head + 1)) {
            self.head += 1;
            out.push(v);
        }
        "delivered"
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Each packet arrives one to three times, some only after a long delay (a loss repaired by
    /// retransmission), arrivals are shuffled locally (up to 11 places late), and out-of-window
    /// packets are sent again later, so every outcome occurs and everything is delivered.
    #[test]
    fn delivers_like_model(
        start in 65400u16..=65535,
        n in 1usize..300,
        copies in prop::collection::vec(prop_oneof![1 => Just(0u8), 30 => Just(1u8), 6 => 2u8..4], 300),
        jitter in prop::collection::vec(0u32..12, 900),
    ) {
        let mut arrivals = BinaryHeap::new();
        for (i, &c) in copies.iter().enumerate().take(n) {
            // 0 copies: lost, then retransmitted 40 places late (possibly beyond the window).
            let (count, delay) = if c == 0 { (1, 40) } else { (c, 0) };
            for k in 0..count {
                let slot = arrivals.len();
                let late = jitter[slot % jitter.len()] + delay;
                arrivals.push(Reverse(((i as u32 + late) * 8 + u32::from(k), i as i64 + 1)));
            }
        }

        let mut fl = FragList::new(Sn16(start), WINDOW);
        let mut model = Model { head: 0, held: BTreeMap::new() };
        let (mut got, mut want) = (Vec::new(), Vec::new());
        while let Some(Reverse((at, pos))) = arrivals.pop() {
            let sn = Sn16(start).add(pos as u16);
            let value = pos as u32;
            let expect = model.insert(pos, value, &mut want);
            match fl.insert(sn, value) {
                FragInsert::InOrder(v) => {
                    prop_assert_eq!(expect, "delivered");
                    got.push(v);
                    prop_assert_eq!(fl.pull(), None);
                }
                FragInsert::Ready(v) => {
                    prop_assert_eq!(expect, "delivered");
                    got.push(v);
                    let before = got.len();
                    while let Some(v) = fl.pull() {
                        got.push(v);
                    }
                    prop_assert!(got.len() > before, "Ready promises a pull");
                }
                FragInsert::Held => prop_assert_eq!(expect, "held"),
                FragInsert::Duplicate(v) => {
                    prop_assert_eq!(expect, "dup");
                    prop_assert_eq!(v, value);
                }
                FragInsert::OutOfWindow(v) => {
                    prop_assert_eq!(expect, "window");
                    prop_assert_eq!(v, value);
                    // The sender retransmits what the receiver could not take.
                    arrivals.push(Reverse((at + 8 * 16, pos)));
                }
            }
            prop_assert_eq!(&got, &want);
            prop_assert_eq!(fl.head_sn(), Sn16(start).add(model.head as u16));
            prop_assert_eq!(fl.num_held(), model.held.len());
        }
        // Every packet exactly once and in order.
        prop_assert!(got.iter().copied().eq(1..=n as u32));
        let mut rest = Vec::new();
        fl.purge_with_sn(|sn, v| rest.push((sn, v)));
        let model_rest: Vec<(Sn16, u32)> =
            model.held.iter().map(|(&p, &v)| (Sn16(start).add(p as u16), v)).collect();
        prop_assert_eq!(rest, model_rest);
    }

    #[test]
    fn serial_order_matches_signed_distance(a: u16, b: u16) {
        let (x, y) = (Sn16(a), Sn16(b));
        let d = x.distance(y);
        prop_assert!((-32768..=32767).contains(&d));
        prop_assert_eq!(y.add(d as u16), x);
        prop_assert_eq!(x.lt(y), d < 0);
        prop_assert_eq!(x.gt(y), d > 0);
        prop_assert_eq!(x.le(y), !x.gt(y));
        prop_assert_eq!(x.ge(y), !x.lt(y));
        if d != -32768 {
            prop_assert_eq!(y.distance(x), -d);
        }
    }
}
