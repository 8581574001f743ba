//! Wireup (UCX's `src/ucp/wireup`): how two endpoints find each other.
//!
//! * [`address`]: the packed worker address a peer connects to;
//! * [`lanes`]: which transport pair carries which traffic (sans IO, symmetric);
//! * here: the connection protocol, as engine state and events.
//!
//! Creating an endpoint sends a `REQUEST` carrying this worker's address, its endpoint id, a
//! connection number and the addresses of its endpoint-to-endpoint lanes (rc) on the wireup
//! lane (the AM lane when it connects to the remote interface, else a transport that does: ud
//! or shared memory). The peer finds the endpoint it created towards us with the same number
//! (simultaneous connect, or an endpoint to self) or has the driver build one, connects its
//! endpoint-to-endpoint lanes to ours, and answers with a `REPLY` carrying its endpoint id and
//! lane addresses. The requester connects its lanes in turn and, when there are such lanes,
//! sends an `ACK`: the replier uses its lanes only after it, when both ends are connected.
//! Until then sends are queued on the endpoint and replayed in order; wireup messages have
//! their own queue, so they never wait behind data.

use std::collections::HashMap;

use ucs::idtable::Id;
use ucs::UcsResult;

use crate::engine::ep::WireupStage;
use crate::engine::{Action, Engine, EpState, EpStatus};
use crate::proto::ctrl::{Ctrl, WireupOut};
use crate::wire::{wireup as kind, WireupMsg};

pub mod address;
pub mod lanes;

use address::WorkerAddress;

/// Matching of endpoints created towards each other (by remote uuid and connection number).
#[derive(Default)]
pub(crate) struct ConnMatch {
    /// Next connection number per remote worker.
    next_sn: HashMap<u64, u32>,
    /// Endpoints the user created, waiting for the peer's request.
    expected: HashMap<(u64, u32), Id>,
    /// Endpoints a peer's request created, not yet claimed by a local create.
    unexpected: HashMap<(u64, u32), Id>,
}

impl ConnMatch {
    /// Forgets endpoint `id` (it went).
    pub fn forget(&mut self, id: Id) {
        self.expected.retain(|_, v| *v != id);
        self.unexpected.retain(|_, v| *v != id);
    }
}

/// A peer's wireup request that names no endpoint here: the driver builds one for it.
#[derive(Debug)]
pub(crate) struct AcceptReq {
    /// The peer's address (from the request).
    pub remote: WorkerAddress,
    /// The connection number.
    pub conn_sn: u32,
    /// The peer's endpoint id.
    pub src_ep: u64,
    /// The peer's encoded endpoint addresses.
    pub ep_addrs: Vec<u8>,
}

/// How [`Engine::connect_begin`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connect {
    /// An endpoint a peer's request created already: it is the user's now.
    Claimed(Id),
    /// A new endpoint is needed, with this connection number.
    New(u32),
}

impl<L: Clone> Engine<L> {
    /// The user connects to worker `uuid`: the endpoint that worker's request created already,
    /// if any, else the connection number for a new one.
    pub fn connect_begin(&mut self, uuid: u64) -> Connect {
        let sn = self.conn.next_sn.entry(uuid).or_insert(0);
        let v = *sn;
        *sn = sn.wrapping_add(1);
        match self.conn.unexpected.remove(&(uuid, v)) {
            Some(id) if self.eps.contains(id) => Connect::Claimed(id),
            _ => Connect::New(v),
        }
    }

    /// A new endpoint the driver built for the user: inserted, and its request queued.
    pub fn connect(&mut self, st: EpState<L>) -> Id {
        let key = (st.remote.uuid, st.conn_sn);
        let (conn_sn, ep_addrs) = (st.conn_sn, st.p2p_addrs.clone());
        let id = self.insert_ep(st);
        self.conn.expected.insert(key, id);
        let request = WireupOut {
            kind: kind::REQUEST,
            conn_sn,
            src_uuid: self.local.uuid,
            src_ep: id.raw(),
            dst_ep: 0,
            with_address: Some(self.local.packed.clone()),
            ep_addrs,
        };
        self.enqueue_wireup(id, Ctrl::Wireup(request));
        id
    }

    /// A wireup message arrived.
    pub(crate) fn on_wireup(&mut self, m: &WireupMsg<'_>) {
        if m.kind == kind::REQUEST {
            return self.on_wireup_request(m);
        }
        let what = if m.kind == kind::REPLY { "wireup reply" } else { "wireup ack" };
        let Some(id) = self.ep_from_wire(m.dst_ep, what) else { return };
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.remote.uuid != m.src_uuid || ep.conn_sn != m.conn_sn {
            tracing::warn!("{what}: from an unexpected worker; dropped");
            return;
        }
        if ep.error().is_some() {
            return;
        }
        ep.remote_id = m.src_ep;
        if m.kind == kind::REPLY && ep.p2p {
            ep.stage = WireupStage::ConnectingLanes { then: kind::ACK };
            self.push(Action::ConnectP2p { ep: id, addrs: m.ep_addrs.to_vec() });
            return;
        }
        self.ep_connected(id);
    }

    fn on_wireup_request(&mut self, m: &WireupMsg<'_>) {
        let remote = match WorkerAddress::unpack(m.address) {
            Ok(a) if a.uuid == m.src_uuid => a,
            Ok(_) => {
                tracing::warn!("wireup: request's address does not match its sender; dropped");
                return;
            }
            Err(e) => {
                tracing::warn!("wireup: request with a bad address ({e}); dropped");
                return;
            }
        };
        let key = (m.src_uuid, m.conn_sn);
        let found = self.conn.expected.remove(&key).or_else(|| self.conn.unexpected.get(&key).copied());
        match found.filter(|&id| self.eps.contains(id)) {
            Some(id) => self.accept_on(id, m.src_ep, m.ep_addrs),
            None => self.push(Action::Accept(Box::new(AcceptReq {
                remote,
                conn_sn: m.conn_sn,
                src_ep: m.src_ep,
                ep_addrs: m.ep_addrs.to_vec(),
            }))),
        }
    }

    /// The endpoint the driver built for a peer's request: inserted, and the request answered.
    pub fn accept(&mut self, req: AcceptReq, st: EpState<L>) -> Id {
        let key = (req.remote.uuid, req.conn_sn);
        let id = self.insert_ep(st);
        self.conn.unexpected.insert(key, id);
        self.accept_on(id, req.src_ep, &req.ep_addrs);
        id
    }

    /// Answers a request on endpoint `id`: with endpoint-to-endpoint lanes, connect them to the
    /// requester's first.
    fn accept_on(&mut self, id: Id, src_ep: u64, ep_addrs: &[u8]) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.error().is_some() {
            return;
        }
        ep.remote_id = src_ep;
        if ep.p2p {
            ep.stage = WireupStage::ConnectingLanes { then: kind::REPLY };
            self.push(Action::ConnectP2p { ep: id, addrs: ep_addrs.to_vec() });
            return;
        }
        self.send_wireup(id, kind::REPLY);
        self.ep_connected(id);
    }

    /// The driver connected (or failed to connect) the endpoint-to-endpoint lanes of `id`.
    pub fn p2p_connected(&mut self, id: Id, result: UcsResult<()>) {
        if let Err(e) = result {
            return self.on_ep_error(id, e);
        }
        let Some(ep) = self.eps.get_mut(id) else { return };
        let WireupStage::ConnectingLanes { then } = ep.stage else { return };
        if then == kind::REPLY {
            // The requester's lanes are connected only when its ack says so.
            ep.stage = WireupStage::Replied;
            self.send_wireup(id, kind::REPLY);
        } else {
            self.send_wireup(id, kind::ACK);
            self.ep_connected(id);
        }
    }

    /// Queues a wireup reply or ack on endpoint `id`.
    fn send_wireup(&mut self, id: Id, k: u8) {
        let Some(ep) = self.eps.get(id) else { return };
        let msg = WireupOut {
            kind: k,
            conn_sn: ep.conn_sn,
            src_uuid: self.local.uuid,
            src_ep: id.raw(),
            dst_ep: ep.remote_id,
            with_address: None,
            ep_addrs: if k == kind::REPLY { ep.p2p_addrs.clone() } else { Vec::new() },
        };
        self.enqueue_wireup(id, Ctrl::Wireup(msg));
    }

    /// Wireup completed: what was queued goes out.
    fn ep_connected(&mut self, id: Id) {
        let Some(ep) = self.eps.get_mut(id) else { return };
        if ep.status != EpStatus::Connecting {
            return;
        }
        ep.status = EpStatus::Connected;
        self.kick(id);
    }
}
