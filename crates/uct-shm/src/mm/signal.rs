//! Wakeup signals between processes: a datagram socket in the abstract unix namespace per
//! receiving interface. A sender that finds the receiver armed sends one empty datagram; the
//! receiver's socket is its event fd.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use ucs::{Status, UcsResult};

/// A bound, non-blocking datagram socket.
pub struct SignalSocket {
    fd: OwnedFd,
}

/// The address of a receiving interface's socket, computed once per endpoint so a signal
/// costs one system call and nothing else.
pub struct SignalAddr {
    addr: libc::sockaddr_un,
    len: libc::socklen_t,
}

impl SignalAddr {
    /// The socket of interface `id` of process `pid`.
    pub fn new(pid: u32, id: u64) -> Self {
        let (addr, len) = addr_for(pid, id);
        SignalAddr { addr, len }
    }
}

fn addr_for(pid: u32, id: u64) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: sockaddr_un is plain data; all-zero is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let name = format!("ucx-rs-mm-{pid}-{id:016x}");
    // Abstract namespace: a leading NUL, no file, gone when the socket closes.
    for (dst, src) in a.sun_path[1..].iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + 1 + name.len();
    (a, len as libc::socklen_t)
}

fn socket() -> UcsResult<OwnedFd> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(Status::from(std::io::Error::last_os_error()));
    }
    // SAFETY: `fd` was just returned to us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl SignalSocket {
    /// Binds the receiving socket of interface `id` of this process.
    pub fn bind(id: u64) -> UcsResult<Self> {
        let fd = socket()?;
        let (a, len) = addr_for(std::process::id(), id);
        // SAFETY: `a` is a valid sockaddr_un of `len` bytes.
        if unsafe { libc::bind(fd.as_raw_fd(), (&a as *const libc::sockaddr_un).cast(), len) } != 0 {
            let e = std::io::Error::last_os_error();
            tracing::error!("cannot bind the wakeup socket: {e}");
            return Err(Status::from(e));
        }
        Ok(SignalSocket { fd })
    }

    /// An unbound socket for sending.
    pub fn sender() -> UcsResult<Self> {
        Ok(SignalSocket { fd: socket()? })
    }

    /// Signals the interface at `to`. A full queue means a signal is pending already; a
    /// vanished receiver is not an error here (peer checks report it).
    pub fn signal(&self, to: &SignalAddr) {
        // SAFETY: valid socket, empty buffer, a valid address of `to.len` bytes.
        unsafe {
            libc::sendto(
                self.fd.as_raw_fd(),
                std::ptr::null(),
                0,
                libc::MSG_DONTWAIT,
                (&to.addr as *const libc::sockaddr_un).cast(),
                to.len,
            )
        };
    }

    /// Consumes one pending signal, if there is one.
    pub fn take_one(&self) -> bool {
        let mut b = [0u8; 8];
        // SAFETY: valid socket and buffer; non-blocking.
        unsafe { libc::recv(self.fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) >= 0 }
    }

    /// The descriptor (readable when a signal arrived).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
