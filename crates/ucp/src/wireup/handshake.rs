//! The connection protocol, as events of the engine: a user's connect, the request, the
//! reply, the acknowledgement, and the driver's report that endpoint-to-endpoint lanes are
//! connected.

use ucs::idtable::Id;

use super::address::WorkerAddress;
use super::conn::{AcceptReq, ConnMatch, Connect};
use crate::engine::ep::WireupStage;
use crate::engine::{Action, EpState, EpStatus, Shared};
use crate::wire::{wireup as kind, Ctrl, WireupMsg, WireupOut};

impl ConnMatch {
    /// The user connects to worker `uuid`: the endpoint that worker's request created already,
    /// if any, else the connection number for a new one.
    pub fn connect_begin<L: Clone>(&mut self, sh: &Shared<L>, uuid: u64) -> Connect {
        let sn = self.next_sn.entry(uuid).or_insert(0);
        let v = *sn;
        *sn = sn.wrapping_add(1);
        match self.unexpected.remove(&(uuid, v)) {
            Some(id) if sh.eps.contains(id) => Connect::Claimed(id),
            _ => Connect::New(v),
        }
    }

    /// A new endpoint the driver built for the user: inserted, and its request queued.
    pub fn connect<L: Clone>(&mut self, sh: &mut Shared<L>, st: EpState<L>) -> Id {
        let key = (st.remote.uuid, st.conn_sn);
        let (conn_sn, ep_addrs) = (st.conn_sn, st.p2p_addrs.clone());
        let id = sh.insert_ep(st);
        self.expected.insert(key, id);
        let request = WireupOut {
            kind: kind::REQUEST,
            conn_sn,
            src_uuid: sh.local.uuid,
            src_ep: id.raw(),
            dst_ep: 0,
            with_address: Some(sh.local.packed.clone()),
            ep_addrs,
        };
        sh.enqueue_wireup(id, Ctrl::Wireup(request));
        id
    }

    /// A new endpoint the driver built for a client that connected by socket address: inserted
    /// to wait for that client's request (its worker and connection number are in `st`); no
    /// request goes from here.
    pub fn expect<L: Clone>(&mut self, sh: &mut Shared<L>, st: EpState<L>) -> Id {
        let key = (st.remote.uuid, st.conn_sn);
        let id = sh.insert_ep(st);
        self.expected.insert(key, id);
        id
    }

    /// A wireup message arrived.
    pub(crate) fn on_wireup<L: Clone>(&mut self, sh: &mut Shared<L>, m: &WireupMsg<'_>) {
        if m.kind == kind::REQUEST {
            return self.on_wireup_request(sh, m);
        }
        let what = if m.kind == kind::REPLY { "wireup reply" } else { "wireup ack" };
        let Some(id) = sh.ep_from_wire(m.dst_ep, what) else { return };
        let Some(ep) = sh.eps.get_mut(id) else { return };
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
            sh.push(Action::ConnectP2p { ep: id, addrs: m.ep_addrs.to_vec() });
            return;
        }
        self.ep_connected(sh, id);
    }

    fn on_wireup_request<L: Clone>(&mut self, sh: &mut Shared<L>, m: &WireupMsg<'_>) {
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
        let found = self.expected.remove(&key).or_else(|| self.unexpected.get(&key).copied());
        match found.filter(|&id| sh.eps.contains(id)) {
            Some(id) => self.accept_on(sh, id, m.src_ep, m.ep_addrs),
            None => sh.push(Action::Accept(Box::new(AcceptReq {
                remote,
                conn_sn: m.conn_sn,
                src_ep: m.src_ep,
                ep_addrs: m.ep_addrs.to_vec(),
            }))),
        }
    }

    /// The endpoint the driver built for a peer's request: inserted, and the request answered.
    pub fn accept<L: Clone>(&mut self, sh: &mut Shared<L>, req: AcceptReq, st: EpState<L>) -> Id {
        let key = (req.remote.uuid, req.conn_sn);
        let id = sh.insert_ep(st);
        self.unexpected.insert(key, id);
        self.accept_on(sh, id, req.src_ep, &req.ep_addrs);
        id
    }

    /// Answers a request on endpoint `id`: with endpoint-to-endpoint lanes, connect them to the
    /// requester's first.
    fn accept_on<L: Clone>(&mut self, sh: &mut Shared<L>, id: Id, src_ep: u64, ep_addrs: &[u8]) {
        let Some(ep) = sh.eps.get_mut(id) else { return };
        if ep.error().is_some() {
            return;
        }
        ep.remote_id = src_ep;
        if ep.p2p {
            ep.stage = WireupStage::ConnectingLanes { then: kind::REPLY };
            sh.push(Action::ConnectP2p { ep: id, addrs: ep_addrs.to_vec() });
            return;
        }
        self.send_wireup(sh, id, kind::REPLY);
        self.ep_connected(sh, id);
    }

    /// The driver connected the endpoint-to-endpoint lanes of `id` (a failure fails the
    /// endpoint instead: [`crate::engine::Engine::on_ep_error`]).
    pub fn p2p_connected<L: Clone>(&mut self, sh: &mut Shared<L>, id: Id) {
        let Some(ep) = sh.eps.get_mut(id) else { return };
        let WireupStage::ConnectingLanes { then } = ep.stage else { return };
        if then == kind::REPLY {
            // The requester's lanes are connected only when its ack says so.
            ep.stage = WireupStage::Replied;
            self.send_wireup(sh, id, kind::REPLY);
        } else {
            self.send_wireup(sh, id, kind::ACK);
            self.ep_connected(sh, id);
        }
    }

    /// Queues a wireup reply or ack on endpoint `id`.
    fn send_wireup<L: Clone>(&mut self, sh: &mut Shared<L>, id: Id, k: u8) {
        let Some(ep) = sh.eps.get(id) else { return };
        let msg = WireupOut {
            kind: k,
            conn_sn: ep.conn_sn,
            src_uuid: sh.local.uuid,
            src_ep: id.raw(),
            dst_ep: ep.remote_id,
            with_address: None,
            ep_addrs: if k == kind::REPLY { ep.p2p_addrs.clone() } else { Vec::new() },
        };
        sh.enqueue_wireup(id, Ctrl::Wireup(msg));
    }

    /// Wireup completed: what was queued goes out.
    fn ep_connected<L: Clone>(&mut self, sh: &mut Shared<L>, id: Id) {
        let Some(ep) = sh.eps.get_mut(id) else { return };
        if ep.status != EpStatus::Connecting {
            return;
        }
        ep.status = EpStatus::Connected;
        sh.kick(id);
    }
}
