//! Tag matching (MPI semantics), UCX's `src/ucp/tag`: the API family that sends a message
//! with a 64-bit tag and receives the earliest one matching a tag and mask.
//!
//! * [`matcher`]: the queues of posted receives and unexpected messages (sans IO, no
//!   protocol);
//! * sends that need a request are the shared machinery's (`proto::send`; the direct eager
//!   sends are the driver's);
//! * `recv`: posting a receive, and what arrives - eager messages whole or in fragments,
//!   synchronous ones (acknowledged at the match), rendezvous requests - matched against the
//!   posted receives or kept as unexpected;
//! * `probe`: looking at (and taking out) unexpected messages.
//!
//! Messages from one endpoint go through its AM lane in order, and matching happens when the
//! first piece (the only fragment, the first fragment or the RTS) arrives, so messages never
//! overtake each other.

use std::collections::HashMap;

use ucs::idtable::{Id, IdTable};

use crate::request::Rts;

pub mod matcher;
pub(crate) mod offload;
mod probe;
pub(crate) mod recv;

pub use matcher::{
    bucket_index, tag_matches, Arrived, ExpEntry, ExpQueues, ExpStore, Posted, RecvHandle, Tag, TagMatcher,
    UnexpHandle, UnexpQueue, FULL_MASK,
};

/// Reassembly buffers kept for reuse by a worker.
const FRAG_BUFS_KEPT: usize = 16;
/// Largest capacity of a kept reassembly buffer (messages up to the rendezvous threshold fit).
const FRAG_BUF_KEPT_MAX: usize = 256 * 1024;

/// An unexpected message.
pub(crate) enum Unexp {
    /// A whole eager message kept in its transport buffer (`offset` skips the header); a
    /// synchronous one names the endpoint and request to acknowledge.
    Eager { desc: uct::AmDesc, offset: usize, sync: Option<(u64, u64)> },
    /// A multi-fragment eager message, possibly still arriving.
    Frag { key: (u64, u64), total: usize, data: Vec<u8>, sync: Option<(u64, u64)> },
    /// A rendezvous request.
    Rts(Rts),
}

impl Unexp {
    /// Length the sender sent.
    pub fn length(&self) -> usize {
        match self {
            Unexp::Eager { desc, offset, .. } => desc.len() - offset,
            Unexp::Frag { total, .. } => *total,
            Unexp::Rts(r) => r.size,
        }
    }
}

/// Where the later fragments of a multi-fragment message go.
#[derive(Clone, Copy, Debug)]
pub(crate) enum FragTarget {
    Unexp(UnexpHandle),
    Probed(Id),
    Req(Id),
}

/// Tag matching's state besides the posted receives (which live with their requests).
#[derive(Default)]
pub(crate) struct TagState {
    /// Unexpected messages.
    pub unexp: UnexpQueue<Unexp>,
    /// Multi-fragment messages in progress, by (endpoint, message id).
    pub frags: HashMap<(u64, u64), FragTarget>,
    /// Reassembly buffers of unexpected multi-fragment messages, kept for reuse.
    pub frag_bufs: Vec<Vec<u8>>,
    /// Messages taken out by a probe, waiting for `msg_recv`.
    pub probed: IdTable<(Tag, Unexp)>,
    /// Receives posted to a transport's tag matching.
    pub offload: offload::Offload,
}

impl TagState {
    /// Takes every multi-fragment message in progress from endpoint `ep` (raw id) off the
    /// table; where their fragments were going.
    pub fn take_frags_of(&mut self, ep: u64) -> Vec<FragTarget> {
        let keys: Vec<(u64, u64)> = self.frags.keys().filter(|k| k.0 == ep).copied().collect();
        keys.iter().filter_map(|k| self.frags.remove(k)).collect()
    }

    /// Endpoint `ep` (raw id) failed: its partly arrived unexpected and probed messages are
    /// dropped; the receives still waiting for its fragments are returned, to fail.
    pub fn ep_failed(&mut self, ep: u64, name: &str, status: ucs::Status) -> Vec<Id> {
        let mut waiting = Vec::new();
        for target in self.take_frags_of(ep) {
            match target {
                FragTarget::Req(rid) => waiting.push(rid),
                FragTarget::Unexp(h) => {
                    tracing::warn!("ucp: dropping a partly arrived message from {name} ({status})");
                    drop(self.unexp.take(h));
                }
                FragTarget::Probed(pid) => {
                    tracing::warn!("ucp: dropping a partly arrived probed message from {name} ({status})");
                    drop(self.probed.remove(pid));
                }
            }
        }
        waiting
    }

    /// A buffer for reassembling an unexpected multi-fragment message that starts with
    /// `first`: a kept one when there is one (its capacity from an earlier message, so the
    /// steady state allocates nothing), else a new one. It grows with the data that arrives,
    /// never with the length the peer announced.
    pub fn frag_buf(&mut self, first: &[u8]) -> Vec<u8> {
        let mut v = self.frag_bufs.pop().unwrap_or_default();
        v.extend_from_slice(first);
        v
    }

    /// Gives a reassembly buffer back for reuse: up to [`FRAG_BUFS_KEPT`] of them, each of up to
    /// [`FRAG_BUF_KEPT_MAX`] bytes of capacity (a larger one is freed).
    pub fn recycle_frag_buf(&mut self, mut v: Vec<u8>) {
        if self.frag_bufs.len() < FRAG_BUFS_KEPT && v.capacity() <= FRAG_BUF_KEPT_MAX {
            v.clear();
            self.frag_bufs.push(v);
        }
    }
}
