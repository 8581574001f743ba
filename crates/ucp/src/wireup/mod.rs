//! Wireup (UCX's `src/ucp/wireup`): how two endpoints find each other.
//!
//! * [`address`]: the packed worker address a peer connects to;
//! * [`lanes`]: which transport pair carries which traffic (sans IO, symmetric);
//! * `conn`: the state of connections being made; `handshake`: the connection protocol, as
//!   events of the engine.
//!
//! Creating an endpoint sends a `REQUEST` carrying this worker's address, its endpoint id, a
//! connection number and the addresses of its endpoint-to-endpoint lanes (rc) on the wireup
//! lane (the AM lane when it connects to the remote interface, else a transport that does: ud
//! or shared memory). The peer finds the endpoint it created towards us with the same number
//! (simultaneous connect, or an endpoint to self) or has the driver build one, connects its
//! endpoint-to-endpoint lanes to ours, and answers with a `REPLY` carrying its endpoint id and
//! lane addresses. The requester connects its lanes in turn and, when there are such lanes,
//! sends an `ACK`: the replier uses its lanes only after it, when both ends are connected.
//! Until then sends are queued on the endpoint and replayed in order; wireup messages have
//! their own queue, so they never wait behind data.
//!
//! A client that knows its server only by socket address first trades worker addresses with
//! it through a connection manager ([`sockaddr`]), then wires up as above.

pub mod address;
pub(crate) mod conn;
mod handshake;
pub mod lanes;
pub mod sockaddr;
