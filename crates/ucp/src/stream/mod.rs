//! The stream family (UCX's `src/ucp/stream`), the engine's half: every endpoint carries a
//! byte stream. Sends are eager messages through the shared machinery whose every piece is
//! stream data (`wire::StreamHdr`, no message boundaries); bytes arrive in order on the
//! endpoint's AM lane. Arriving bytes fill the endpoint's waiting receives in order, and what
//! none takes waits in the endpoint's queue, for the next receive, for
//! `ucp_stream_recv_data_nb` (the piece itself, without a copy) and for
//! `ucp_stream_worker_poll` (the endpoints with bytes).
//!
//! A receive completes with at least one byte, or, with `WAITALL`, when its buffer is full.
//! Every byte goes to exactly one receive: a waiting receive that is cancelled (its future
//! dropped) gives the bytes it had back to the front of the queue.

use std::collections::{HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use crate::dt::UserBuf;
use crate::engine::Shared;
use crate::request::complete::Done;
use crate::request::{RecvInfo, RecvReq, ReqKind, ReqState, RequestFlags, RequestParam};
use crate::wire;

/// Bytes that arrived and no receive took yet: a transport message kept from `off` on, or a
/// buffer of the worker's.
pub(crate) struct Chunk {
    pub bytes: ChunkBytes,
    pub off: usize,
}

/// Where a chunk's bytes are.
pub(crate) enum ChunkBytes {
    /// A kept transport message (its header before `off`).
    Desc(uct::AmDesc),
    /// Bytes given back by a cancelled receive.
    Heap(Vec<u8>),
}

impl Chunk {
    /// The bytes not taken yet.
    pub fn rest(&self) -> &[u8] {
        let all: &[u8] = match &self.bytes {
            ChunkBytes::Desc(d) => d,
            ChunkBytes::Heap(v) => v,
        };
        all.get(self.off..).unwrap_or(&[])
    }
}

/// One endpoint's stream.
#[derive(Default)]
struct EpStream {
    /// Bytes no receive took yet, oldest first (empty while receives wait).
    data: VecDeque<Chunk>,
    /// How many bytes `data` holds.
    queued: usize,
    /// Receives waiting for bytes, oldest first, and whether each waits for a full buffer.
    recvs: VecDeque<(Id, bool)>,
    /// Bytes came since the last poll reported the endpoint (UCX's ready list).
    ready: bool,
}

/// How a stream receive went at once.
pub(crate) enum StreamRecvOut {
    /// Completed with this many bytes.
    Done(usize),
    /// Waits for bytes: the request.
    Req(Id),
}

/// Hashes this worker's endpoint ids (which only exist once the endpoint does: no peer picks
/// them) with one multiplication, instead of SipHash: two lookups per 8-byte message cost more
/// than the rest of the receive path.
#[derive(Default)]
struct EpIdHasher(u64);

impl Hasher for EpIdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ b as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        }
    }

    #[inline]
    fn write_u64(&mut self, v: u64) {
        // Fibonacci hashing: the high bits (the table's tags) and the low bits (its buckets)
        // both depend on the index part of the id.
        self.0 = (v ^ v >> 32).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

/// The stream family's state: every endpoint's stream, by raw endpoint id.
#[derive(Default)]
pub(crate) struct StreamState {
    eps: HashMap<u64, EpStream, BuildHasherDefault<EpIdHasher>>,
}

impl StreamState {
    /// Stream bytes arrived (AM id [`wire::AM_STREAM_DATA`]). The plain callback of the first
    /// receive the bytes completed, if it was freed at once, is returned for the driver to run
    /// (before the engine's other actions, which come later), as the tag family's eager path
    /// does.
    pub fn on_data<L: Clone>(&mut self, sh: &mut Shared<L>, m: uct::AmRecv<'_>) -> Option<Done> {
        let (h, payload) = match wire::StreamHdr::decode(m.data()) {
            Ok(x) => x,
            Err(e) => {
                crate::engine::am::malformed(e);
                return None;
            }
        };
        match sh.eps.get(Id::from_raw(h.ep)) {
            Some(ep) if ep.error().is_none() => {}
            Some(_) => {
                tracing::warn!("stream data: from a failed or closed endpoint; dropped");
                return None;
            }
            None => {
                tracing::warn!("stream data: names endpoint {:#x}, which this worker does not have; dropped", h.ep);
                return None;
            }
        }
        let es = self.eps.entry(h.ep).or_default();
        let (taken, first) = fill(sh, es, payload);
        if taken == payload.len() {
            return first;
        }
        let off = wire::len::STREAM + taken;
        es.queued += payload.len() - taken;
        es.data.push_back(Chunk { bytes: ChunkBytes::Desc(m.keep_in(&sh.kept_msgs)), off });
        es.ready = true;
        first
    }

    /// Receives into `buf` from endpoint `ep`'s stream (`ucp_stream_recv_nbx`): at once when
    /// bytes are there (all of `buf` with `waitall`), else a request that the next bytes fill.
    pub fn recv<L: Clone>(
        &mut self,
        sh: &mut Shared<L>,
        ep: Id,
        buf: UserBuf,
        waitall: bool,
        param: RequestParam,
    ) -> UcsResult<StreamRecvOut> {
        match sh.eps.get(ep) {
            Some(e) => {
                if let Some(err) = e.error() {
                    return Err(err);
                }
            }
            None => {
                tracing::error!("stream_recv: endpoint {ep:?} does not exist (closed?)");
                return Err(Status::InvalidParam);
            }
        }
        let es = self.eps.entry(ep.raw()).or_default();
        let want = buf.len();
        if want == 0 {
            return Ok(StreamRecvOut::Done(0));
        }
        let queued = if es.recvs.is_empty() { es.queued } else { 0 };
        let at_once = queued >= want || (queued > 0 && !waitall);
        if !at_once && param.flags.contains(RequestFlags::FORCE_IMM_CMPL) {
            return Err(Status::NoResource);
        }
        // Take what is queued (everything, or up to `want`).
        let mut got = 0;
        while got < want {
            let Some(c) = es.data.front_mut() else { break };
            let rest = c.rest();
            let n = rest.len().min(want - got);
            // (Within `buf`: `got + n <= want`.)
            buf.copy_in(got, &rest[..n]).map_err(|_| Status::InvalidParam)?;
            got += n;
            c.off += n;
            es.queued -= n;
            if c.rest().is_empty() {
                es.data.pop_front();
            }
        }
        if es.data.is_empty() {
            es.ready = false;
        }
        if at_once && !param.flags.contains(RequestFlags::NO_IMM_CMPL) {
            return Ok(StreamRecvOut::Done(got));
        }
        let hint = param.hint();
        let mut rr = RecvReq::new(buf, hint);
        rr.received = got;
        rr.total = want;
        let mut st = ReqState::new(ReqKind::Recv(rr), param.callback, param.callback_fn, param.detached);
        st.info = RecvInfo { length: got, sender_tag: 0 };
        let rid = sh.reqs.tab.insert(st);
        if at_once {
            sh.finish(rid, Status::Ok);
        } else {
            es.recvs.push_back((rid, waitall));
        }
        Ok(StreamRecvOut::Req(rid))
    }

    /// The oldest queued piece of endpoint `ep`'s stream, taken whole
    /// (`ucp_stream_recv_data_nb`); `None` when there is none, or receives wait.
    pub fn recv_data(&mut self, ep: Id) -> Option<Chunk> {
        let es = self.eps.get_mut(&ep.raw())?;
        if !es.recvs.is_empty() {
            return None;
        }
        let c = es.data.pop_front();
        if let Some(c) = &c {
            es.queued -= c.rest().len();
        }
        if es.data.is_empty() {
            es.ready = false;
        }
        c
    }

    /// The endpoints with queued bytes that no poll reported since bytes came
    /// (`ucp_stream_worker_poll`), up to `max`.
    pub fn poll(&mut self, max: usize) -> Vec<Id> {
        let mut out = Vec::new();
        for (raw, es) in self.eps.iter_mut() {
            if out.len() >= max {
                break;
            }
            if es.ready && !es.data.is_empty() {
                es.ready = false;
                out.push(Id::from_raw(*raw));
            }
        }
        out
    }

    /// Cancels waiting stream receive `rid`, if it is one: the bytes it had go back to the
    /// front of its stream. True if it was.
    pub fn cancel<L: Clone>(&mut self, sh: &mut Shared<L>, rid: Id) -> bool {
        for (raw, es) in self.eps.iter_mut() {
            let Some(i) = es.recvs.iter().position(|&(r, _)| r == rid) else { continue };
            es.recvs.remove(i);
            if let Some(ReqState { kind: ReqKind::Recv(rr), .. }) = sh.reqs.tab.get_mut(rid) {
                // A generic datatype's receive cannot give back what it unpacked: those bytes
                // stay delivered (the cancelled request's length says how many).
                if rr.received > 0 && !rr.buf.is_generic() {
                    let mut back = vec![0u8; rr.received];
                    if rr.buf.copy_out(0, &mut back).is_ok() {
                        es.queued += back.len();
                        es.data.push_front(Chunk { bytes: ChunkBytes::Heap(back), off: 0 });
                        es.ready = true;
                    } else {
                        tracing::error!("stream: bytes of a cancelled receive on {raw:#x} could not be read back");
                    }
                    rr.received = 0;
                }
            }
            sh.finish(rid, Status::Canceled);
            return true;
        }
        false
    }

    /// Endpoint `ep` (raw id) failed or went: its queued bytes are dropped and its waiting
    /// receives returned, to fail.
    pub fn ep_gone(&mut self, ep: u64) -> Vec<Id> {
        self.eps.remove(&ep).map(|es| es.recvs.into_iter().map(|(r, _)| r).collect()).unwrap_or_default()
    }
}

/// Fills `es`'s waiting receives with `payload`, in order; the bytes taken, and the plain
/// callback of the first receive completed if it was freed at once (the others' completions
/// go to the engine's actions, after it).
fn fill<L: Clone>(sh: &mut Shared<L>, es: &mut EpStream, payload: &[u8]) -> (usize, Option<Done>) {
    let mut off = 0;
    let mut first = None;
    while off < payload.len() {
        let Some(&(rid, waitall)) = es.recvs.front() else { break };
        let Some(ReqState { kind: ReqKind::Recv(rr), info, .. }) = sh.reqs.tab.get_mut(rid) else {
            es.recvs.pop_front();
            continue;
        };
        let n = (rr.total - rr.received).min(payload.len() - off);
        if rr.buf.copy_in(rr.received, &payload[off..off + n]).is_err() {
            // Cannot happen (within the buffer); fail the receive rather than lose track.
            es.recvs.pop_front();
            sh.finish(rid, Status::InvalidParam);
            continue;
        }
        rr.received += n;
        off += n;
        info.length = rr.received;
        if rr.received == rr.total || !waitall {
            es.recvs.pop_front();
            let r = sh.reqs.finish(rid, Status::Ok);
            match r {
                // (Runs before the queued actions: only when none is queued before it.)
                Ok(Some(d)) if first.is_none() && !sh.has_actions() => first = Some(d),
                r => sh.completed(rid, r),
            }
        }
    }
    (off, first)
}
