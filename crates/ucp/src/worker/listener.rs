//! Connecting by socket address: UCX's client/server flow (`ucp_listener_create`,
//! `ucp_conn_request_h`, `ucp_ep_create` with `UCP_EP_PARAM_FIELD_SOCK_ADDR` or
//! `UCP_EP_PARAM_FIELD_CONN_REQUEST`).
//!
//! A server creates a [`Listener`] on an IP address and port with a handler; each client that
//! connects reaches the handler as a [`ConnRequest`] (its address can be queried), which the
//! server accepts with [`Worker::ep_create_conn_request`] or rejects
//! ([`ConnRequest::reject`], or by dropping it). A client calls
//! [`Worker::ep_create_sockaddr`] (or awaits [`Worker::ep_connect`]) with the server's
//! address. The two workers trade their addresses through the connection and then wire up as
//! endpoints created by worker address do: the lanes are the best both share (shared memory
//! on one host, rc where both have RDMA, tcp otherwise), and every family runs over them.
//!
//! Errors a client sees: `Unreachable` (no listener at the address, or no route to it),
//! `Rejected` (the server rejected the request), `ConnectionReset` (the server went before
//! answering), `TimedOut` (no answer within the caller's time), `Unsupported` (no component
//! with a connection manager is registered: the tcp component provides one).
//!
//! Listeners are polled by the worker's progress (every few calls) and wake a sleeping
//! worker ([`Worker::wait`]). A client's connection moves while the connecting call or future
//! runs.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Weak;
use std::task::{Context as TaskContext, Poll};
use std::time::{Duration, Instant};

use ucs::idtable::Id;
use ucs::{Status, UcsResult};

use super::{Endpoint, Shared, Worker};
use crate::core::sockaddr::Incoming;

/// A listener (`ucp_listener_h`): accepts connections on a socket address until dropped.
pub struct Listener {
    worker: Worker,
    id: Id,
    addr: SocketAddr,
    fd: std::os::fd::RawFd,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener").field("addr", &self.addr).finish()
    }
}

impl Listener {
    /// The address it listens on, with the port the system picked when port 0 was asked
    /// (`ucp_listener_query`).
    pub fn query(&self) -> SocketAddr {
        self.addr
    }

    /// Rejects a request (`ucp_listener_reject`); the same as [`ConnRequest::reject`].
    pub fn reject(&self, req: ConnRequest) {
        req.reject();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let Ok(e) = self.worker.enter() else { return };
        if e.core.listener_destroy(self.id).is_some() {
            if let Some(w) = &self.worker.shared.wakeup {
                let _ = w.remove_fd(self.fd);
            }
        }
        e.core.listener_release();
    }
}

/// A client's connection request (`ucp_conn_request_h`), as a listener's handler gets it.
/// Accept it with [`Worker::ep_create_conn_request`]; dropping it unanswered rejects it.
pub struct ConnRequest {
    worker: Weak<Shared>,
    listener: Id,
    id: u64,
    client: SocketAddr,
    remote: Vec<u8>,
    conn_sn: u32,
    answered: bool,
}

impl std::fmt::Debug for ConnRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnRequest").field("client", &self.client).finish()
    }
}

impl ConnRequest {
    /// The client's socket address (`ucp_conn_request_query`'s `client_address`).
    pub fn client_addr(&self) -> SocketAddr {
        self.client
    }

    /// Rejects the request: the client's connect fails with `Rejected`.
    pub fn reject(mut self) {
        self.answer_reject();
    }

    fn answer_reject(&mut self) {
        if std::mem::replace(&mut self.answered, true) {
            return;
        }
        if let Some(shared) = self.worker.upgrade() {
            let w = Worker { shared };
            if let Ok(e) = w.enter() {
                e.core.reject_conn(self.listener, self.id);
            };
        }
    }
}

impl Drop for ConnRequest {
    fn drop(&mut self) {
        self.answer_reject();
    }
}

/// How long [`Worker::ep_create_sockaddr`] waits for the server's answer.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

impl Worker {
    /// Listens on `addr` (port 0: the system picks one, see [`Listener::query`]); `handler`
    /// gets each client's [`ConnRequest`] from inside [`progress`](Self::progress), and may
    /// accept it there or keep it and answer later.
    pub fn listener<F>(&self, addr: SocketAddr, handler: F) -> UcsResult<Listener>
    where
        F: Fn(ConnRequest) + Send + 'static,
    {
        let e = self.enter()?;
        let weak = std::sync::Arc::downgrade(&self.shared);
        let cb = move |inc: Incoming| {
            handler(ConnRequest {
                worker: weak.clone(),
                listener: inc.listener,
                id: inc.req.id,
                client: inc.req.client,
                remote: inc.remote,
                conn_sn: inc.conn_sn,
                answered: false,
            })
        };
        let (id, bound, fd) = e.core.listen(addr, std::rc::Rc::new(cb))?;
        if let Some(w) = &self.shared.wakeup {
            if let Err(err) = w.add_fd(fd) {
                tracing::warn!("ucp listener on {bound}: not in the wakeup set ({err}); poll the worker instead");
            }
        }
        Ok(Listener { worker: self.clone(), id, addr: bound, fd })
    }

    /// Accepts a connection request (`ucp_ep_create` with `conn_request`): the endpoint to
    /// the client. Sends may start at once; they go once the client's wireup arrives.
    /// `ConnectionReset` when the client left meanwhile.
    pub fn ep_create_conn_request(&self, mut req: ConnRequest) -> UcsResult<Endpoint> {
        req.answered = true;
        if !std::ptr::eq(req.worker.as_ptr(), std::sync::Arc::as_ptr(&self.shared)) {
            tracing::error!("ucp: a connection request accepted on a worker other than its listener's");
            req.answered = false;
            return Err(Status::InvalidParam);
        }
        let e = self.enter()?;
        let id = e.core.accept_conn(req.listener, req.id, &req.remote, req.conn_sn)?;
        Ok(Endpoint { worker: self.clone(), id })
    }

    /// Connects to a listener at `addr` (`ucp_ep_create` with a socket address), progressing
    /// this worker while it waits, for at most [`CONNECT_TIMEOUT`]; see the module's
    /// documentation for the errors.
    pub fn ep_create_sockaddr(&self, addr: SocketAddr) -> UcsResult<Endpoint> {
        self.ep_create_sockaddr_timeout(addr, CONNECT_TIMEOUT)
    }

    /// [`ep_create_sockaddr`](Self::ep_create_sockaddr) waiting at most `timeout`.
    pub fn ep_create_sockaddr_timeout(&self, addr: SocketAddr, timeout: Duration) -> UcsResult<Endpoint> {
        let cid = self.enter()?.core.connect_sockaddr(addr)?;
        let mut c = Connecting { worker: self.clone(), cid: Some(cid) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(r) = c.poll_once() {
                return r;
            }
            if Instant::now() >= deadline {
                tracing::debug!("ucp: no answer from {addr} in {timeout:?}");
                return Err(Status::TimedOut);
            }
            self.progress();
            c.wait_io(Duration::from_millis(1));
        }
    }

    /// Connects to a listener at `addr` as a future; dropping it gives up. While pending it
    /// progresses the worker (unless a [`ProgressDriver`](super::ProgressDriver) does) and
    /// asks to be polled again at once, like the other futures of this crate.
    pub fn ep_connect(&self, addr: SocketAddr) -> ConnectFuture {
        let r = self.enter().and_then(|e| e.core.connect_sockaddr(addr));
        match r {
            Ok(cid) => ConnectFuture { c: Connecting { worker: self.clone(), cid: Some(cid) }, err: None },
            Err(e) => ConnectFuture { c: Connecting { worker: self.clone(), cid: None }, err: Some(e) },
        }
    }
}

/// A client's connection being made.
struct Connecting {
    worker: Worker,
    cid: Option<Id>,
}

impl Connecting {
    /// The endpoint or the error once the server answered.
    fn poll_once(&mut self) -> Option<UcsResult<Endpoint>> {
        let cid = self.cid?;
        let r = match self.worker.enter() {
            Ok(e) => e.core.connect_poll(cid)?,
            Err(err) => Err(err),
        };
        self.cid = None;
        Some(r.map(|id| Endpoint { worker: self.worker.clone(), id }))
    }

    /// Sleeps until the connection's socket has something, for at most `t`.
    fn wait_io(&self, t: Duration) {
        let Some(cid) = self.cid else { return };
        let Some(fd) = self.worker.enter().ok().and_then(|e| e.core.connect_fd(cid)) else { return };
        let mut p = libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 };
        // SAFETY: one valid pollfd, a bounded wait.
        unsafe { libc::poll(&mut p, 1, t.as_millis() as i32) };
    }
}

impl Drop for Connecting {
    fn drop(&mut self) {
        if let Some(cid) = self.cid.take() {
            if let Ok(e) = self.worker.enter() {
                e.core.connect_cancel(cid);
            }
        }
    }
}

/// The future of [`Worker::ep_connect`]: resolves to the endpoint or the error.
pub struct ConnectFuture {
    c: Connecting,
    err: Option<Status>,
}

impl Future for ConnectFuture {
    type Output = UcsResult<Endpoint>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Self::Output> {
        if let Some(e) = self.err.take() {
            return Poll::Ready(Err(e));
        }
        if let Some(r) = self.c.poll_once() {
            return Poll::Ready(r);
        }
        if self.c.cid.is_none() {
            return Poll::Ready(Err(Status::Canceled));
        }
        if !self.c.worker.driven() {
            self.c.worker.progress();
        }
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}
