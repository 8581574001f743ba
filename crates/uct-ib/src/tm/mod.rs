//! Hardware tag matching (TM) as the verbs contract defines it (rdma-core's
//! `Documentation/tag_matching.md`, `ibv_post_srq_ops(3)`): the receiving adapter keeps the head
//! of the posted-receive list, matches arriving tagged messages against it, places matched
//! eager data in the posted buffer, completes a matched rendezvous with its own RDMA read and a
//! FIN, and passes everything else to software through the shared receive queue.
//!
//! Work in progress (see `docs/notes/tm-offload-brief.md`): so far the wire headers
//! ([`wire`]) and the receive side of the device model ([`device`], eager messages). No
//! transport offers tag matching yet.

pub mod device;
pub mod wire;
