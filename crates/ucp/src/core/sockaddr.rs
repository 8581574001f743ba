//! The driver's side of connecting by socket address (UCX's `ucp_listener` and sockaddr
//! endpoints): listeners and connecting clients of a transport's connection manager
//! (`uct::cm`), progressed every `IDLE_POLL_EVERY` progress calls while any exists, and the
//! endpoints they produce. The private data exchanged is [`crate::wireup::sockaddr`]'s.
//!
//! The connection manager is the first registered component that offers one (the tcp
//! component's `tcp_sockcm`), opened on first use; it is independent of `UCX_TLS`, as in UCX:
//! the endpoints' lanes are chosen afterwards from what both workers have.

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::rc::Rc;

use ucs::idtable::{Id, IdTable};
use ucs::{Status, UcsResult};
use uct::{CmClientState, CmConnRequest};

use super::Core;
use crate::wireup::sockaddr;

/// A connection request as the listener's handler gets it.
pub(crate) struct Incoming {
    pub listener: Id,
    pub req: CmConnRequest,
    pub conn_sn: u32,
    pub remote: Vec<u8>,
}

/// A listener's handler, called from progress outside the engine.
pub(crate) type ConnHandler = Rc<dyn Fn(Incoming)>;

pub(crate) struct Listener {
    cm: Box<dyn uct::CmListener>,
    handler: ConnHandler,
}

struct Client {
    cm: Box<dyn uct::CmClient>,
    sn: u32,
    server: SocketAddr,
}

/// Listeners, connecting clients, and the connection manager.
#[derive(Default)]
pub(crate) struct Sockaddr {
    cm: Option<Box<dyn uct::Cm>>,
    listeners: IdTable<Listener>,
    clients: IdTable<Client>,
    next_sn: u32,
}

impl Sockaddr {
    /// The connection manager, opened on first use.
    fn cm(&mut self) -> UcsResult<&dyn uct::Cm> {
        if self.cm.is_none() {
            let opened = uct::components().into_iter().find_map(|c| c.cm_open());
            match opened {
                Some(Ok(cm)) => self.cm = Some(cm),
                Some(Err(e)) => {
                    tracing::error!("ucp: cannot open a connection manager: {e}");
                    return Err(e);
                }
                None => {
                    tracing::error!(
                        "ucp: no registered component offers a connection manager \
                         (connecting by socket address needs the tcp component)"
                    );
                    return Err(Status::Unsupported);
                }
            }
        }
        Ok(self.cm.as_deref().expect("opened above"))
    }

    fn is_active(&self) -> bool {
        !self.listeners.is_empty() || !self.clients.is_empty()
    }
}

impl Core {
    /// Starts listening on `addr`; the listener's id, bound address and event descriptor.
    pub fn listen(&self, addr: SocketAddr, handler: ConnHandler) -> UcsResult<(Id, SocketAddr, RawFd)> {
        let mut s = self.sockaddr.borrow_mut();
        let cm = s.cm()?.listen(&addr)?;
        let bound = cm.local_addr();
        let fd = cm.event_fd();
        let id = s.listeners.insert(Listener { cm, handler });
        self.sockaddr_active.set(true);
        Ok((id, bound, fd))
    }

    /// Closes listener `id` (requests not answered yet are dropped: their clients see the
    /// connection reset); its event descriptor, which is closed when this returns.
    pub fn listener_destroy(&self, id: Id) -> Option<RawFd> {
        let mut s = self.sockaddr.borrow_mut();
        let l = s.listeners.remove(id);
        let active = s.is_active();
        self.sockaddr_active.set(active);
        drop(s);
        let fd = l.as_ref().map(|l| l.cm.event_fd());
        // The caller takes the descriptor out of the wakeup set before it closes.
        self.closing_listeners.borrow_mut().extend(l);
        fd
    }

    /// Drops listeners [`Core::listener_destroy`] set aside.
    pub fn listener_release(&self) {
        let gone = std::mem::take(&mut *self.closing_listeners.borrow_mut());
        drop(gone);
    }

    /// Accepts a connection request of listener `lid`: builds the endpoint that waits for the
    /// client's wireup request, then answers the client with this worker's address.
    pub fn accept_conn(&self, lid: Id, req_id: u64, remote: &[u8], sn: u32) -> UcsResult<Id> {
        let remote = crate::wireup::address::WorkerAddress::unpack(remote)?;
        let name = remote.name.clone();
        let ep = match self.ep_new(remote, sn, false) {
            Ok(ep) => ep,
            Err(e) => {
                tracing::warn!("ucp listener: cannot create an endpoint for '{name}': {e}; rejected");
                self.reject_conn(lid, req_id);
                return Err(e);
            }
        };
        let reply = sockaddr::pack(sn, &self.packed);
        let r = match self.sockaddr.borrow_mut().listeners.get_mut(lid) {
            Some(l) => l.cm.accept(req_id, &reply),
            None => Err(Status::NoElem),
        };
        if let Err(e) = r {
            tracing::warn!("ucp listener: cannot answer '{name}': {e}");
            self.with_engine(|e| e.ep_destroy(ep));
            return Err(if e == Status::NoElem { Status::ConnectionReset } else { e });
        }
        Ok(ep)
    }

    /// Rejects a connection request of listener `lid`.
    pub fn reject_conn(&self, lid: Id, req_id: u64) {
        if let Some(l) = self.sockaddr.borrow_mut().listeners.get_mut(lid) {
            l.cm.reject(req_id);
        }
    }

    /// Starts connecting to a listener at `addr`; the client's id.
    pub fn connect_sockaddr(&self, addr: SocketAddr) -> UcsResult<Id> {
        let mut s = self.sockaddr.borrow_mut();
        let sn = sockaddr::SN_BIT | (s.next_sn & !sockaddr::SN_BIT);
        s.next_sn = s.next_sn.wrapping_add(1);
        let data = sockaddr::pack(sn, &self.packed);
        let cm = s.cm()?.connect(&addr, &data)?;
        let id = s.clients.insert(Client { cm, sn, server: addr });
        drop(s);
        self.sockaddr_active.set(true);
        Ok(id)
    }

    /// Where client `cid` stands: `None` while connecting; else the endpoint (which sends its
    /// wireup request now) or the error, and the client is gone.
    pub fn connect_poll(&self, cid: Id) -> Option<UcsResult<Id>> {
        let mut s = self.sockaddr.borrow_mut();
        let st = s.clients.get_mut(cid)?.cm.progress();
        if st == CmClientState::Connecting {
            return None;
        }
        let c = s.clients.remove(cid).expect("looked up above");
        let active = s.is_active();
        drop(s);
        self.sockaddr_active.set(active);
        Some(match st {
            CmClientState::Accepted(data) => match sockaddr::unpack(&data) {
                Ok((sn, remote)) if sn == c.sn => self.ep_new(remote, sn, true),
                Ok(_) => {
                    tracing::warn!("ucp: the server at {} answered another connection", c.server);
                    Err(Status::InvalidAddr)
                }
                Err(e) => {
                    tracing::warn!("ucp: the server at {} answered with bad data: {e}", c.server);
                    Err(e)
                }
            },
            CmClientState::Failed(e) => {
                tracing::debug!("ucp: connecting to {} failed: {e}", c.server);
                Err(e)
            }
            CmClientState::Connecting => unreachable!("handled above"),
        })
    }

    /// The descriptor of client `cid`'s connection (to wait on).
    pub fn connect_fd(&self, cid: Id) -> Option<RawFd> {
        self.sockaddr.borrow().clients.get(cid).map(|c| c.cm.event_fd())
    }

    /// Gives up on client `cid`.
    pub fn connect_cancel(&self, cid: Id) {
        let mut s = self.sockaddr.borrow_mut();
        s.clients.remove(cid);
        let active = s.is_active();
        self.sockaddr_active.set(active);
    }

    /// Progresses the listeners: reads requests and gives them to the handlers (outside every
    /// borrow: a handler may accept, reject, create listeners or connect). The number of
    /// events.
    #[cold]
    pub fn progress_sockaddr(&self) -> usize {
        let mut got = Vec::new();
        let mut n = 0;
        {
            let mut s = self.sockaddr.borrow_mut();
            for (lid, l) in s.listeners.iter_mut() {
                let handler = l.handler.clone();
                n += l.cm.progress(&mut |req| got.push((lid, handler.clone(), req)));
            }
        }
        for (lid, handler, req) in got {
            match sockaddr::unpack(&req.priv_data) {
                Ok((sn, _)) => {
                    let remote = req.priv_data[sockaddr::HDR..].to_vec();
                    handler(Incoming { listener: lid, req, conn_sn: sn, remote });
                }
                Err(e) => {
                    tracing::debug!("ucp listener: a request from {} carried bad data ({e}); rejected", req.client);
                    self.reject_conn(lid, req.id);
                }
            }
        }
        n
    }
}
