//! Connection managers (`uct_cm_h`): how a client reaches a server it knows only by socket
//! address, before either has the other's transport addresses.
//!
//! A server listens on an IP address and port ([`Cm::listen`]); a client connects to it with a
//! block of private data ([`Cm::connect`]). The server sees a [`CmConnRequest`] (the client's
//! address and private data) and answers it: [`CmListener::accept`] with private data of its
//! own, which the client receives ([`CmClientState::Accepted`]), or [`CmListener::reject`]
//! ([`CmClientState::Failed`] with `Rejected`). What the private data carries is the caller's
//! business: UCP puts worker addresses in it and wires up its lanes afterwards.
//!
//! Everything is driven by explicit progress calls, without blocking; a listener and a client
//! each offer a descriptor that becomes readable when progress has work (for wakeup).
//! Components that provide one return it from [`Component::cm_open`](crate::Component::cm_open).
//!
//! Private data and everything else a peer sends are validated: a client that sends garbage,
//! too much, or nothing at all is dropped (with a debug log) and the listener keeps serving.

use std::net::SocketAddr;
use std::os::fd::RawFd;

use ucs::{Status, UcsResult};

/// A connection manager of one component.
pub trait Cm {
    /// The component's name (e.g. `tcp`).
    fn name(&self) -> &str;

    /// The largest private data a connect or an accept can carry.
    fn priv_data_max(&self) -> usize;

    /// Listens on `addr` (port 0: the system picks one; see [`CmListener::local_addr`]).
    fn listen(&self, addr: &SocketAddr) -> UcsResult<Box<dyn CmListener>>;

    /// Starts connecting to a listener at `addr`, sending `priv_data` once connected. Fails at
    /// once only on a local error (private data too large, no socket); a refused or
    /// unreachable server is reported by [`CmClient::progress`].
    fn connect(&self, addr: &SocketAddr, priv_data: &[u8]) -> UcsResult<Box<dyn CmClient>>;
}

/// A client's connection request, as the server sees it.
#[derive(Clone, Debug)]
pub struct CmConnRequest {
    /// The listener's id for the request (for [`CmListener::accept`] / [`CmListener::reject`]).
    pub id: u64,
    /// The client's address.
    pub client: SocketAddr,
    /// The client's private data.
    pub priv_data: Vec<u8>,
}

/// A listening server.
pub trait CmListener {
    /// The address it listens on (with the port the system picked, when 0 was asked).
    fn local_addr(&self) -> SocketAddr;

    /// A descriptor that becomes readable when [`CmListener::progress`] has work.
    fn event_fd(&self) -> RawFd;

    /// Accepts connections, reads their requests and sends answers; calls `on_request` for each
    /// request read whole. The number of events handled.
    fn progress(&mut self, on_request: &mut dyn FnMut(CmConnRequest)) -> usize;

    /// Accepts request `id`, answering with `priv_data`. `NoElem` when the request is gone
    /// (the client left), `ExceedsLimit` when the data is too large.
    fn accept(&mut self, id: u64, priv_data: &[u8]) -> UcsResult<()>;

    /// Rejects request `id`: the client is told so. Unknown ids are ignored.
    fn reject(&mut self, id: u64);
}

/// Where a client's connection stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CmClientState {
    /// Connecting, or waiting for the server's answer.
    Connecting,
    /// The server accepted, with this private data.
    Accepted(Vec<u8>),
    /// Failed: `Rejected` (the server said no), `Unreachable` (no listener at the address, or
    /// no route to it), `ConnectionReset` (the server went before answering), `InvalidAddr`
    /// (the answer was not one of this protocol's).
    Failed(Status),
}

/// A client connecting to a listener.
pub trait CmClient {
    /// A descriptor that becomes readable (or writable, while connecting) when
    /// [`CmClient::progress`] has work.
    fn event_fd(&self) -> RawFd;

    /// Moves the connection on; its state.
    fn progress(&mut self) -> CmClientState;
}
