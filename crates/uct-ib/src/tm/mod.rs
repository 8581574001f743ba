//! Hardware tag matching (TM) as the verbs contract defines it (rdma-core's
//! `Documentation/tag_matching.md`, `ibv_post_srq_ops(3)`): the receiving adapter keeps the head
//! of the posted-receive list, matches arriving tagged messages against it, places matched
//! eager data in the posted buffer, completes a matched rendezvous with its own RDMA read and a
//! FIN, and passes everything else to software through the shared receive queue.
//!
//! Here: the wire headers ([`wire`]) and the device model ([`device`]), which `rc_verbs` drives
//! when tag matching is on (`UCX_RC_TM_ENABLE=y`; the driver is the `rc` module's `tm`). Devices
//! without tag matching (Soft-RoCE) thereby offer it **emulated**: the matching runs in the
//! receiver's progress, not in an adapter (`docs/uct-ib/tag-matching.md`).

pub mod device;
pub mod wire;
