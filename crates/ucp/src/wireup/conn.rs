//! Wireup's state: endpoints created towards each other, matched by remote worker and
//! connection number; requests that name no endpoint yet.

use std::collections::HashMap;

use ucs::idtable::Id;

use super::address::WorkerAddress;

/// Matching of endpoints created towards each other (by remote uuid and connection number).
#[derive(Default)]
pub(crate) struct ConnMatch {
    /// Next connection number per remote worker.
    pub(crate) next_sn: HashMap<u64, u32>,
    /// Endpoints the user created, waiting for the peer's request.
    pub(crate) expected: HashMap<(u64, u32), Id>,
    /// Endpoints a peer's request created, not yet claimed by a local create.
    pub(crate) unexpected: HashMap<(u64, u32), Id>,
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

/// How [`ConnMatch::connect_begin`] answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Connect {
    /// An endpoint a peer's request created already: it is the user's now.
    Claimed(Id),
    /// A new endpoint is needed, with this connection number.
    New(u32),
}
