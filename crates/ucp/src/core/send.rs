//! What the API asks of the driver: the direct paths of the tag API (an eager short or
//! single-fragment send straight to the transport, with no request), and the calls that
//! enter the engine on the user's behalf (receives, probes, endpoints, requests).

use std::rc::Rc;

use ucs::idtable::Id;
use ucs::{Outcome, Status, UcsResult};

use super::exec::pack_data;
use super::lanes::EpLanes;
use super::Core;
use crate::dt::UserBuf;
use crate::engine::{EpState, Lane, TxOp};
use crate::proto::eager::{short_op, whole_hdr};
use crate::proto::{select, Op, OpKind, Proto};
use crate::request::{RecvInfo, ReqKind, ReqState, RequestFlags, RequestParam, SendMsg};
use crate::tag::recv::RecvOut;
use crate::tag::Tag;
use crate::wire::{self, WireupMsg};
use crate::wire::{DataHdr, Header};
use crate::wireup::address::WorkerAddress;
use crate::wireup::conn::Connect;

/// The kind of a tag send, for protocol selection.
#[inline(always)]
fn tag_kind(sync: bool) -> OpKind {
    if sync {
        OpKind::TagSendSync
    } else {
        OpKind::TagSend
    }
}

/// Sends a whole eager message straight to the AM lane (`proto` is eager short or bcopy); `rep`
/// is the receiver's endpoint to this side (an active message's reply endpoint).
#[inline(always)]
fn direct(io: &EpLanes, proto: Proto, buf: &UserBuf, msg: SendMsg, rep: u64) -> ucs::OpResult {
    if proto == Proto::EagerShort {
        let (id, hdr) = match msg {
            SendMsg::Tag(tag) => (wire::AM_EAGER_ONLY, tag),
            SendMsg::Am(a) => (wire::AM_AM_ONLY, a.word().word()),
            SendMsg::Stream => (wire::AM_STREAM_DATA, rep),
        };
        return io.am().am_short(id, hdr, buf.contig_bytes().unwrap_or(&[]));
    }
    let hdr = whole_hdr(msg, false, rep, 0);
    let len = buf.len();
    io.am()
        .am_bcopy(hdr.am_id(), &mut |dst| pack_data(dst, &hdr, buf, 0, len), uct::SendFlags::empty())
        .map(|o| o.map(|_| ()))
}

/// Sends bytes `[offset, offset + len)` of `buf` in one active message on the AM lane:
/// `short` (a whole eager short message), `am_short` with the fixed header of `hdr` as its
/// header; else `am_bcopy` of `hdr` and the data.
#[inline]
pub(super) fn data(
    io: &EpLanes,
    short: bool,
    hdr: &DataHdr,
    buf: &UserBuf,
    offset: usize,
    len: usize,
) -> ucs::OpResult {
    if short {
        if let Some(TxOp::Short { id, hdr, data }) = short_op(hdr, *buf) {
            return io.am().am_short(id, hdr, data.contig_bytes().unwrap_or(&[]));
        }
    }
    io.am()
        .am_bcopy(hdr.am_id(), &mut |dst| pack_data(dst, hdr, buf, offset, len), uct::SendFlags::empty())
        .map(|o| o.map(|_| ()))
}

#[cold]
#[inline(never)]
fn no_endpoint<T>(ep_id: Id) -> UcsResult<T> {
    tracing::error!("tag send: endpoint {ep_id:?} does not exist (closed?)");
    Err(Status::InvalidParam)
}

impl Core {
    /// Starts a tagged send (`ucp_tag_send_nbx`); `Ok(None)`: completed at once.
    ///
    /// The common case is direct: a ready endpoint (connected, nothing queued), a message the
    /// protocol selection sends whole in one eager short or bcopy message, and a caller who
    /// lets it complete at once. Everything else gets a request from the engine.
    #[inline(always)]
    pub fn tag_send(
        &self,
        ep_id: Id,
        buf: UserBuf,
        tag: Tag,
        sync: bool,
        param: RequestParam,
    ) -> UcsResult<Option<Id>> {
        self.send_msg(ep_id, buf, SendMsg::Tag(tag), tag_kind(sync), sync, param)
    }

    /// Starts a send of message `msg` (a tagged send or an active message, of kind `kind`) with
    /// data `buf`; `Ok(None)`: completed at once. As [`Core::tag_send`] says.
    #[inline(always)]
    pub(crate) fn send_msg(
        &self,
        ep_id: Id,
        buf: UserBuf,
        msg: SendMsg,
        kind: OpKind,
        sync: bool,
        param: RequestParam,
    ) -> UcsResult<Option<Id>> {
        let (io, proto, rep) = {
            let mut guard = self.engine.borrow_mut();
            let e = &mut *guard;
            let Some(ep) = e.sh.eps.get(ep_id) else { return no_endpoint(ep_id) };
            let proto = select(&ep.cfg, Op { kind, len: buf.len(), contig: buf.contig_seg().is_some() });
            // (Sends through a tag lane take the queued path: see docs/ucp/tag-offload.md.)
            let direct_ok = matches!(proto, Proto::EagerShort | Proto::EagerBcopy)
                && !sync
                && ep.ready()
                && !param.flags.contains(RequestFlags::NO_IMM_CMPL)
                && crate::proto::eager::tag_lane(&ep.cfg, msg) == Lane::Am;
            if !direct_ok {
                drop(guard);
                return self.send_slow(ep_id, buf, msg, sync, param, proto);
            }
            // Counted now, under this borrow; uncounted if the lane refuses.
            *counter(&mut e.sh.counts, proto) += 1;
            (ep.io.clone(), proto, ep.remote_id)
        };
        match direct(&io, proto, &buf, msg, rep) {
            Ok(Outcome::Done(())) => Ok(None),
            r => self.direct_not_done(ep_id, &io, buf, msg, param, proto, r),
        }
    }

    /// A direct send that did not complete: a full lane queues the send (without trying again
    /// at once) and parks the endpoint; an error fails it.
    #[inline(never)]
    #[allow(clippy::too_many_arguments)]
    fn direct_not_done(
        &self,
        ep_id: Id,
        io: &Rc<EpLanes>,
        buf: UserBuf,
        msg: SendMsg,
        param: RequestParam,
        proto: Proto,
        r: ucs::OpResult,
    ) -> UcsResult<Option<Id>> {
        *counter(&mut self.engine.borrow_mut().sh.counts, proto) -= 1;
        match r {
            Ok(Outcome::NoResource) => {
                let rid = self
                    .with_engine(|e| crate::proto::send::send_req_blocked(&mut e.sh, ep_id, buf, msg, param, proto))?;
                self.park_after_refusal(ep_id, io);
                Ok(Some(rid))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Parks an endpoint whose AM lane refused a direct send.
    fn park_after_refusal(&self, ep_id: Id, io: &EpLanes) {
        if io.park(Lane::Am, &self.weak) {
            self.engine.borrow_mut().sh.parked(ep_id);
        }
    }

    /// A send off the direct path: a failed or closed endpoint, one not yet connected or with
    /// queued transmissions (replayed first, so the new send need not queue behind ones that
    /// fit by now), a synchronous or large message, or one that must not complete at once.
    #[inline(never)]
    fn send_slow(
        &self,
        ep_id: Id,
        buf: UserBuf,
        msg: SendMsg,
        sync: bool,
        param: RequestParam,
        proto: Proto,
    ) -> UcsResult<Option<Id>> {
        let (error, replay) = {
            let e = self.engine.borrow();
            let Some(ep) = e.sh.eps.get(ep_id) else { return no_endpoint(ep_id) };
            let replay = ep.status == crate::engine::EpStatus::Connected
                && ep.park == crate::engine::Park::No
                && !ep.busy
                && !ep.queue.is_empty();
            (ep.error(), replay)
        };
        if let Some(e) = error {
            return Err(e);
        }
        let direct_ok = matches!(proto, Proto::EagerShort | Proto::EagerBcopy)
            && !sync
            && !param.flags.contains(RequestFlags::NO_IMM_CMPL);
        if replay {
            self.flush(ep_id);
            if direct_ok {
                let ready = {
                    let mut e = self.engine.borrow_mut();
                    let io = e.sh.eps.get(ep_id).filter(|ep| ep.ready()).map(|ep| (ep.io.clone(), ep.remote_id));
                    if io.is_some() {
                        *counter(&mut e.sh.counts, proto) += 1;
                    }
                    io
                };
                if let Some((io, rep)) = ready {
                    return match direct(&io, proto, &buf, msg, rep) {
                        Ok(Outcome::Done(())) => Ok(None),
                        r => self.direct_not_done(ep_id, &io, buf, msg, param, proto, r),
                    };
                }
            }
        }
        let (rid, front, more) = {
            let mut guard = self.engine.borrow_mut();
            let e = &mut *guard;
            let (rid, front) = crate::proto::send::send_req(&mut e.sh, ep_id, buf, msg, sync, param, proto)?;
            (rid, front, e.sh.has_actions())
        };
        if let Some(f) = front {
            self.send_front_now(ep_id, f);
        }
        if more {
            self.drain();
        }
        Ok(Some(rid))
    }

    /// Posts a tagged receive.
    #[inline(always)]
    pub fn tag_recv(&self, buf: UserBuf, tag: Tag, mask: Tag, param: RequestParam) -> UcsResult<RecvOut> {
        // An explicit borrow rather than `with_engine`: the closure's captures (buffer and
        // parameters) were moved through memory on every receive.
        let (r, more) = {
            let mut guard = self.engine.borrow_mut();
            let e = &mut *guard;
            let r = e.tag.tag_recv(&mut e.sh, buf, tag, mask, param);
            (r, e.sh.has_actions())
        };
        if more {
            self.drain();
        }
        r
    }

    /// Looks at the unexpected queue (`ucp_tag_probe_nb`).
    pub fn probe(&self, tag: Tag, mask: Tag, remove: bool) -> Option<(RecvInfo, Option<Id>)> {
        self.with_engine(|e| e.tag.probe(tag, mask, remove))
    }

    /// Receives a probed message (`ucp_tag_msg_recv_nbx`).
    pub fn msg_recv(&self, buf: UserBuf, msg: Id, param: RequestParam) -> UcsResult<RecvOut> {
        self.with_engine(|e| e.tag.msg_recv(&mut e.sh, buf, msg, param))
    }

    /// Creates an endpoint to the worker with packed address `addr`.
    pub fn ep_create(&self, addr: &[u8]) -> UcsResult<Id> {
        let remote = WorkerAddress::unpack(addr)?;
        let begun = {
            let mut e = self.engine.borrow_mut();
            let e = &mut *e;
            e.conn.connect_begin(&e.sh, remote.uuid)
        };
        let sn = match begun {
            Connect::Claimed(id) => return Ok(id),
            Connect::New(sn) => sn,
        };
        self.ep_new(remote, sn, true)
    }

    /// Builds an endpoint to `remote` with connection number `sn`: with `request`, it sends
    /// the wireup request; without, it waits for the peer's (a server's endpoint for a client
    /// that connected by socket address).
    pub(crate) fn ep_new(&self, remote: WorkerAddress, sn: u32, request: bool) -> UcsResult<Id> {
        let id = self.engine.borrow().sh.eps.next_id();
        let b = self.build_lanes(&remote, id)?;
        // The request must fit the wireup lane in one message (no addresses: one count byte).
        let need = WireupMsg::FIXED + 4 + self.packed.len() + b.p2p_addrs.len().max(1);
        let wl = &self.ifaces[b.lanes.uct_eps[b.lanes.wireup_idx].pair.local];
        if need > wl.attr.am.max_bcopy {
            tracing::error!(
                "ucp: the wireup request to '{}' ({need} bytes: worker address and endpoint addresses) does not fit \
                 one message of the wireup lane {} ({} bytes); use fewer transports in UCX_TLS",
                remote.name,
                wl.name(),
                wl.attr.am.max_bcopy
            );
            return Err(Status::ExceedsLimit);
        }
        let st = EpState::new(Rc::new(b.lanes), remote, sn, b.cfg, b.selection, b.p2p_addrs);
        let got =
            self.with_engine(|e| if request { e.conn.connect(&mut e.sh, st) } else { e.conn.expect(&mut e.sh, st) });
        debug_assert_eq!(got, id, "the endpoint took another id than its lanes were given");
        Ok(got)
    }

    /// Starts closing endpoint `id`; the close request.
    pub fn ep_close(&self, id: Id, force: bool) -> Id {
        self.with_engine(|e| {
            let rid = e.sh.reqs.tab.insert(ReqState::new(
                ReqKind::Close(crate::request::CloseReq { ep: id }),
                None,
                None,
                false,
            ));
            e.ep_close(id, force, rid);
            rid
        })
    }

    /// Status and receive info of a request.
    #[inline]
    pub fn req_status(&self, id: Id) -> (Status, RecvInfo) {
        self.engine.borrow().sh.reqs.status(id)
    }

    /// The user dropped a request handle.
    #[inline]
    pub fn req_release(&self, id: Id) {
        self.with_engine(|e| e.sh.release(id));
    }

    /// Cancels a posted receive that has not matched, or a stream receive still waiting for
    /// bytes (what it had goes back to its stream).
    pub fn req_cancel(&self, id: Id) {
        self.with_engine(|e| {
            // (An offloaded receive is cancelled through its transport, which reports.)
            if !e.stream.cancel(&mut e.sh, id) && !e.tag.offload_cancel(&mut e.sh, id) {
                e.sh.cancel(id);
            }
        });
    }
}

/// The counter of a direct protocol.
#[inline(always)]
fn counter(c: &mut crate::engine::ProtoCounts, proto: Proto) -> &mut u64 {
    if proto == Proto::EagerShort {
        &mut c.eager_short
    } else {
        &mut c.eager_bcopy
    }
}
