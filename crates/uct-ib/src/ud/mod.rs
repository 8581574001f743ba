//! # `ud_verbs`: reliable transport over unreliable datagrams
//!
//! UD queue pairs deliver datagrams that may be lost, duplicated or reordered. The `ud_verbs`
//! transport adds reliability in software, as UCX's `uct_ud` does. It has two layers:
//!
//! * the verbs wiring ([`UdVerbsIface`], [`UdVerbsEp`], [`UdVerbsConfig`]): one UD QP per
//!   interface, receive buffers, address handles, the uct traits, pending requests, timers
//!   and the event descriptor (design: `docs/uct-ib/ud_verbs.md`);
//! * the reliability core below, kept free of verbs, clocks and sockets so it can be tested
//!   anywhere:
//!
//! | module | what it holds |
//! |---|---|
//! | [`wire`] | the 8-byte network header and the CREQ / CREP control packets, encoded by hand |
//! | [`rel`] | [`RelEp`]: per-endpoint sequence numbers, acks, NAKs, resends, AIMD window, peer timeout |
//! | [`conn`] | [`UdIface`]: an interface's endpoints, connection matching and the CREQ/CREP handshake |
//! | [`config`] | [`RelConfig`]: `UCX_UD_TIMEOUT`, `UCX_UD_TIMER_TICK`, `UCX_UD_TIMER_BACKOFF`, `UCX_UD_MAX_WINDOW` |
//! | [`loss`] | [`LossHook`]: seeded drop / duplicate / reorder injection |
//!
//! Data flow: the transport posts the bytes [`UdIface::send`] returns; hands every received
//! datagram to [`UdIface::on_packet`] (and drains [`UdIface::pull`]); after events drains
//! [`UdIface::poll_transmit`] and [`UdIface::poll_event`]; and calls
//! [`UdIface::handle_timeout`] when [`UdIface::poll_timeout`] says. Time is a `u64` in
//! nanoseconds supplied by the caller. Receive descriptors are a type parameter `R` the core
//! holds while a packet waits out of order and always hands back.
//!
//! The design, and how the tests simulate a lossy network, is described in
//! `docs/uct-ib/ud-reliability.md`.

pub mod config;
pub mod conn;
pub mod loss;
pub mod rel;
mod txwin;
mod verbs_config;
mod verbs_ep;
mod verbs_iface;
mod wakeup;
pub mod wire;

#[cfg(test)]
mod sim;

pub use config::{RelConfig, UdRelConfigTable};
pub use conn::{IfaceEvent, IfaceStats, ReleaseReason, RxOutcome, Transmit, UdIface};
pub use loss::{Fate, LossConfig, LossHook, XorShift64};
pub use rel::{RecvVerdict, RelEp, RelStats, RelTransmit, TxKind};
pub use verbs_config::{UdVerbsConfig, UdVerbsConfigTable};
pub use verbs_ep::UdVerbsEp;
pub use verbs_iface::{UdVerbsIface, UdVerbsStats, GRH_LEN, IFACE_ADDR_LEN, PUT_HDR_LEN, QKEY};
pub use wire::{Crep, Creq, CtlPacket, DevAddr, EpAddr, Neth, Packet, PacketKind, PeerAddr, WireError};

/// Transport name.
pub const NAME: &str = "ud_verbs";

/// Prefixes of ud_verbs' `UCX_*` settings, most specific first.
pub const CONFIG_PREFIXES: &[&str] = &["UD_VERBS_", "UD_", "IB_"];
