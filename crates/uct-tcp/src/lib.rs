//! # uct-tcp - the tcp transport
//!
//! Active messages between processes on any hosts an IP network joins, over non-blocking TCP
//! sockets driven by the worker's progress (UCX's `tcp` transport): one interface per network
//! device (`lo` included), each listening on a port of the device's address; an endpoint is a
//! connection to a peer interface. The component's connection manager ([`sockcm`]) connects
//! clients to servers by socket address. See `docs/transports.md` (tcp).
//!
//! Call [`register`] once to make the component visible to `uct` discovery.

mod config;
pub mod ep;
pub mod iface;
pub mod md;
pub mod sockcm;
mod wire;

pub use ep::TcpEp;
pub use iface::TcpIface;
pub use md::{TcpComponent, TcpMd, COMPONENT};
pub use sockcm::TcpSockCm;

/// Registers this crate's component with `uct` (idempotent).
pub fn register() {
    uct::register_component(&md::COMPONENT);
}
