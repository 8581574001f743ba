//! The UD reliability core allocates nothing per message once warm: sending, receiving,
//! acknowledging, resending after loss and holding reordered packets, measured with a
//! counting global allocator.

use std::collections::VecDeque;

use uct_ib::ud::{DevAddr, PacketKind, PeerAddr, RelConfig, RxOutcome, UdIface};

#[global_allocator]
static GLOBAL: ucs::testing::CountingAlloc = ucs::testing::CountingAlloc;

/// A receive buffer from a fixed pool, as a transport's receive descriptor would be.
#[derive(Debug)]
struct Buf(Vec<u8>);

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        &self.0
    }
}

struct Net {
    ifaces: [UdIface<Buf>; 2],
    eps: [u32; 2],
    pool: Vec<Buf>,
    wire: VecDeque<(usize, Buf)>,
    now: u64,
    sent: [u64; 2],
    received: [u64; 2],
    datagrams: u64,
}

fn addr(node: u8) -> PeerAddr {
    PeerAddr { dev_addr: DevAddr::new(&[node, 1, 2, 3]).unwrap(), qp_num: u32::from(node) + 1 }
}

impl Net {
    fn buf(&mut self, bytes: &[u8]) -> Buf {
        let mut b = self.pool.pop().unwrap_or_else(|| Buf(Vec::with_capacity(4096)));
        b.0.clear();
        b.0.extend_from_slice(bytes);
        b
    }

    fn put(&mut self, node: usize, bytes: &[u8]) {
        let b = self.buf(bytes);
        self.wire.push_back((1 - node, b));
    }

    fn check(&mut self, node: usize, kind: PacketKind, desc: Buf) {
        if kind != PacketKind::Ctl {
            let seq = u64::from_le_bytes(desc.0[8..16].try_into().unwrap());
            assert_eq!(seq, self.received[node], "in order, exactly once");
            self.received[node] += 1;
        }
        self.pool.push(desc);
    }

    /// Runs until `target` messages went each way: every 37th datagram is lost, every 23rd
    /// overtaken by the next one.
    fn run(&mut self, target: u64) {
        while self.received.iter().any(|&r| r < target) {
            for node in 0..2 {
                while self.sent[node] < target && self.ifaces[node].can_send(self.eps[node]) {
                    let seq = self.sent[node].to_le_bytes();
                    let t = self.ifaces[node].send(self.now, self.eps[node], PacketKind::Am(1), &seq).unwrap();
                    let mut tmp = [0u8; 16];
                    tmp.copy_from_slice(t.bytes);
                    self.put(node, &tmp);
                    self.sent[node] += 1;
                }
                while let Some(t) = self.ifaces[node].poll_transmit(self.now) {
                    let mut tmp = [0u8; 64];
                    let n = t.bytes.len();
                    tmp[..n].copy_from_slice(t.bytes);
                    self.put(node, &tmp[..n]);
                }
            }
            if self.wire.is_empty() {
                let t = self.ifaces.iter().filter_map(|i| i.poll_timeout()).min().expect("stuck");
                self.now = self.now.max(t);
                for i in &mut self.ifaces {
                    i.handle_timeout(self.now);
                    while i.poll_event().is_some() {}
                }
                continue;
            }
            self.now += 1_000;
            while let Some((dst, b)) = self.wire.pop_front() {
                self.datagrams += 1;
                if self.datagrams % 37 == 0 {
                    self.pool.push(b);
                    continue;
                }
                if self.datagrams % 23 == 0 {
                    if let Some(next) = self.wire.pop_front() {
                        self.wire.push_front((dst, b));
                        self.wire.push_front(next);
                        continue;
                    }
                }
                match self.ifaces[dst].on_packet(self.now, b) {
                    RxOutcome::Deliver { kind, desc, .. } => self.check(dst, kind, desc),
                    RxOutcome::Release { desc, .. } => self.pool.push(desc),
                    RxOutcome::Held { .. } => {}
                }
                let ep = self.eps[dst];
                while let Some((kind, desc)) = self.ifaces[dst].pull(ep) {
                    self.check(dst, kind, desc);
                }
            }
            for i in &mut self.ifaces {
                i.handle_timeout(self.now);
                while i.poll_event().is_some() {}
            }
        }
    }
}

#[test]
fn warm_path_allocates_nothing() {
    let cfg = RelConfig { max_window: 64, rx_window: 32, ..RelConfig::default() };
    let mut ifaces = [UdIface::new(addr(0), cfg.clone()).unwrap(), UdIface::new(addr(1), cfg).unwrap()];
    let a = ifaces[0].connect_to_iface(0, addr(1), 0).unwrap();
    let b = ifaces[1].connect_to_iface(0, addr(0), 0).unwrap();
    let mut net = Net {
        ifaces,
        eps: [a, b],
        pool: Vec::with_capacity(4096),
        wire: VecDeque::with_capacity(4096),
        now: 0,
        sent: [0; 2],
        received: [0; 2],
        datagrams: 0,
    };
    // Warm up: the window opens to its ceiling, buffers and queues reach their high-water marks.
    net.run(20_000);
    let resent_before: u64 = (0..2).map(|n| net.ifaces[n].ep(net.eps[n]).unwrap().stats().resent).sum();

    let allocs = ucs::testing::count_allocations(|| {
        net.run(40_000);
    });

    let resent: u64 = (0..2).map(|n| net.ifaces[n].ep(net.eps[n]).unwrap().stats().resent).sum();
    assert!(resent > resent_before, "the measured run resent lost packets");
    assert_eq!(net.received, [40_000, 40_000]);
    assert_eq!(allocs, 0, "allocations on the warm path");
}
