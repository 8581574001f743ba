//! Shared memory segments for the memory-mapped transports.
//!
//! * `posix`: an anonymous memory file (`memfd_create`, falling back to `shm_open` with an
//!   immediate `shm_unlink`), mode 0600. Peers attach through `/proc/<pid>/fd/<fd>`, so no name
//!   ever remains in `/dev/shm`: a crashed process leaves nothing behind.
//! * `sysv`: `shmget(IPC_PRIVATE, 0600)`, attached by the creator and marked `IPC_RMID` at
//!   once; Linux lets peers attach a segment marked for removal, and the kernel frees it when
//!   the last process detaches.
//!
//! A peer's segment is mapped only after its real size was checked against the size the peer
//! announced, so touching any announced byte never raises SIGBUS, even after the peer died.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, Ordering};

use ucs::{Status, UcsResult};

/// Which kind of segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegKind {
    /// Memory file shared through `/proc/<pid>/fd`.
    Posix,
    /// System V shared memory.
    Sysv,
}

/// How a peer finds a segment: what goes into addresses and keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegId {
    /// Kind.
    pub kind: SegKind,
    /// Creator's process id (posix).
    pub pid: u32,
    /// File descriptor in the creator (posix) or shmid (sysv).
    pub id: u32,
    /// Length in bytes.
    pub len: u64,
}

impl SegId {
    /// Packed size.
    pub const PACKED_LEN: usize = 17;

    /// Packs into bytes.
    pub fn pack(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    /// The packed form, as [`pack`](Self::pack) appends it.
    pub fn to_bytes(&self) -> [u8; Self::PACKED_LEN] {
        let mut b = [0u8; Self::PACKED_LEN];
        b[0] = match self.kind {
            SegKind::Posix => 1,
            SegKind::Sysv => 2,
        };
        b[1..5].copy_from_slice(&self.pid.to_le_bytes());
        b[5..9].copy_from_slice(&self.id.to_le_bytes());
        b[9..17].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Unpacks from exactly [`SegId::PACKED_LEN`] bytes; malformed input is `InvalidAddr`.
    pub fn unpack(b: &[u8]) -> UcsResult<SegId> {
        let b: &[u8; Self::PACKED_LEN] = b.try_into().map_err(|_| Status::InvalidAddr)?;
        let kind = match b[0] {
            1 => SegKind::Posix,
            2 => SegKind::Sysv,
            _ => return Err(Status::InvalidAddr),
        };
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut len = [0u8; 8];
        len.copy_from_slice(&b[9..17]);
        let len = u64::from_le_bytes(len);
        if len == 0 || len > isize::MAX as u64 {
            return Err(Status::InvalidAddr);
        }
        Ok(SegId { kind, pid: u32_at(1), id: u32_at(5), len })
    }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// A mapped segment: created here, or a peer's attached here. Unmapped on drop.
pub struct Segment {
    base: NonNull<u8>,
    id: SegId,
    /// The memory file (posix, creator side): peers open it through /proc while it stays open.
    fd: Option<std::os::fd::OwnedFd>,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment").field("id", &self.id).field("base", &self.base).finish()
    }
}

fn map_fd(fd: i32, len: usize) -> UcsResult<NonNull<u8>> {
    // SAFETY: mapping a file descriptor we hold; the kernel picks the address.
    let p =
        unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0) };
    if p == libc::MAP_FAILED {
        let e = errno();
        tracing::error!(len, "mmap of shared segment failed: {}", std::io::Error::from_raw_os_error(e));
        return Err(Status::from_errno(e));
    }
    NonNull::new(p.cast()).ok_or(Status::NoMemory)
}

fn posix_fd() -> UcsResult<std::os::fd::OwnedFd> {
    use std::os::fd::FromRawFd;
    let name = CString::new("ucx-rs-mm").unwrap_or_default();
    // SAFETY: valid NUL-terminated name; flags are plain bits.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd >= 0 {
        // SAFETY: `fd` was just returned to us and is owned by nobody else.
        return Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) });
    }
    // No memfd (old kernel, seccomp): a unique shm_open name, unlinked at once.
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let name = format!("/ucx-rs-{}-{}", std::process::id(), COUNTER.fetch_add(1, Ordering::Relaxed));
    let cname = CString::new(name).map_err(|_| Status::InvalidParam)?;
    // SAFETY: valid name; O_EXCL never reuses a stale object.
    let fd =
        unsafe { libc::shm_open(cname.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR | libc::O_CLOEXEC, 0o600) };
    if fd < 0 {
        let e = errno();
        tracing::error!("shm_open failed: {}", std::io::Error::from_raw_os_error(e));
        return Err(Status::from_errno(e));
    }
    // SAFETY: valid name; the object stays alive through `fd`.
    unsafe { libc::shm_unlink(cname.as_ptr()) };
    // SAFETY: `fd` was just returned to us.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) })
}

impl Segment {
    /// Creates and maps a zeroed segment of `len` bytes.
    pub fn create(kind: SegKind, len: usize) -> UcsResult<Segment> {
        use std::os::fd::AsRawFd;
        if len == 0 {
            return Err(Status::InvalidParam);
        }
        match kind {
            SegKind::Posix => {
                let fd = posix_fd()?;
                // SAFETY: `fd` is a memory file we own.
                if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
                    let e = errno();
                    tracing::error!(
                        len,
                        "ftruncate of shared segment failed: {}",
                        std::io::Error::from_raw_os_error(e)
                    );
                    return Err(Status::from_errno(e));
                }
                let base = map_fd(fd.as_raw_fd(), len)?;
                let id = SegId { kind, pid: std::process::id(), id: fd.as_raw_fd() as u32, len: len as u64 };
                Ok(Segment { base, id, fd: Some(fd) })
            }
            SegKind::Sysv => {
                // SAFETY: plain syscall with a private key.
                let shmid = unsafe { libc::shmget(libc::IPC_PRIVATE, len, libc::IPC_CREAT | 0o600) };
                if shmid < 0 {
                    let e = errno();
                    tracing::error!(len, "shmget failed: {}", std::io::Error::from_raw_os_error(e));
                    return Err(Status::from_errno(e));
                }
                let attached = Self::shmat(shmid);
                // Mark for removal right away: the kernel frees it after the last detach, so a
                // crash can never leave it behind.
                // SAFETY: `shmid` is ours; a null buffer is allowed for IPC_RMID.
                unsafe { libc::shmctl(shmid, libc::IPC_RMID, std::ptr::null_mut()) };
                let base = attached?;
                Ok(Segment {
                    base,
                    id: SegId { kind, pid: std::process::id(), id: shmid as u32, len: len as u64 },
                    fd: None,
                })
            }
        }
    }

    fn shmat(shmid: i32) -> UcsResult<NonNull<u8>> {
        // SAFETY: attaching at a kernel-chosen address.
        let p = unsafe { libc::shmat(shmid, std::ptr::null(), 0) };
        if p as isize == -1 {
            let e = errno();
            tracing::debug!(shmid, "shmat failed: {}", std::io::Error::from_raw_os_error(e));
            return Err(Status::from_errno(e));
        }
        NonNull::new(p.cast()).ok_or(Status::NoMemory)
    }

    /// Maps a peer's segment after checking its real size is at least the announced one.
    /// A peer that died or lied gives `Unreachable`/`InvalidAddr`, not a crash.
    pub fn attach(id: SegId) -> UcsResult<Segment> {
        use std::os::fd::{AsRawFd, FromRawFd};
        let len = usize::try_from(id.len).map_err(|_| Status::InvalidAddr)?;
        match id.kind {
            SegKind::Posix => {
                let path = CString::new(format!("/proc/{}/fd/{}", id.pid, id.id)).map_err(|_| Status::InvalidAddr)?;
                // SAFETY: valid path; plain open.
                let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
                if fd < 0 {
                    let e = errno();
                    tracing::debug!(
                        pid = id.pid,
                        fd = id.id,
                        "cannot open peer segment: {}",
                        std::io::Error::from_raw_os_error(e)
                    );
                    return Err(if e == libc::ENOENT { Status::Unreachable } else { Status::from_errno(e) });
                }
                // SAFETY: `fd` was just returned to us.
                let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
                // SAFETY: `st` is plain data filled by fstat.
                let mut st: libc::stat = unsafe { std::mem::zeroed() };
                // SAFETY: valid fd and out pointer.
                if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || (st.st_size as u64) < id.len {
                    tracing::debug!(announced = id.len, actual = st.st_size, "peer segment smaller than announced");
                    return Err(Status::InvalidAddr);
                }
                let base = map_fd(fd.as_raw_fd(), len)?;
                Ok(Segment { base, id, fd: None })
            }
            SegKind::Sysv => {
                let shmid = i32::try_from(id.id).map_err(|_| Status::InvalidAddr)?;
                // SAFETY: `ds` is plain data filled by shmctl.
                let mut ds: libc::shmid_ds = unsafe { std::mem::zeroed() };
                // SAFETY: valid out pointer.
                if unsafe { libc::shmctl(shmid, libc::IPC_STAT, &mut ds) } != 0 {
                    return Err(Status::Unreachable);
                }
                if (ds.shm_segsz as u64) < id.len {
                    return Err(Status::InvalidAddr);
                }
                Ok(Segment { base: Self::shmat(shmid)?, id, fd: None })
            }
        }
    }

    /// Start of the mapping.
    pub fn base(&self) -> NonNull<u8> {
        self.base
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.id.len as usize
    }

    /// True for an empty segment (never: creation rejects it).
    pub fn is_empty(&self) -> bool {
        self.id.len == 0
    }

    /// How peers find it.
    pub fn id(&self) -> SegId {
        self.id
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        match self.id.kind {
            // SAFETY: unmapping exactly what `create`/`attach` mapped; nothing refers to it any
            // more (owners of views hold the Segment).
            SegKind::Posix => unsafe {
                libc::munmap(self.base.as_ptr().cast(), self.id.len as usize);
            },
            // SAFETY: detaching what shmat attached.
            SegKind::Sysv => unsafe {
                libc::shmdt(self.base.as_ptr().cast());
            },
        }
        drop(self.fd.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(kind: SegKind) {
        let a = Segment::create(kind, 8192).unwrap();
        // SAFETY: in bounds of the fresh mapping.
        unsafe { a.base().as_ptr().add(100).write(42) };
        let b = Segment::attach(a.id()).unwrap();
        assert_ne!(a.base(), b.base(), "a second, independent mapping");
        // SAFETY: in bounds of the attached mapping.
        assert_eq!(unsafe { b.base().as_ptr().add(100).read() }, 42);
        let mut bad = a.id();
        bad.len = 1 << 40;
        assert!(Segment::attach(bad).is_err(), "announced size larger than the segment");
        let mut packed = Vec::new();
        a.id().pack(&mut packed);
        assert_eq!(SegId::unpack(&packed), Ok(a.id()));
        assert_eq!(SegId::unpack(&packed[1..]), Err(Status::InvalidAddr));
    }

    #[test]
    fn posix_create_attach() {
        round_trip(SegKind::Posix);
    }

    #[test]
    fn sysv_create_attach() {
        round_trip(SegKind::Sysv);
    }

    #[test]
    fn garbage_ids_never_panic() {
        for b in 0..=255u8 {
            let bytes = [b; SegId::PACKED_LEN];
            if let Ok(id) = SegId::unpack(&bytes) {
                let _ = Segment::attach(id);
            }
        }
        let dead = SegId { kind: SegKind::Posix, pid: u32::MAX - 7, id: 3, len: 4096 };
        assert_eq!(Segment::attach(dead).err(), Some(Status::Unreachable));
    }
}
