//! Memory pools of registered buffers (send and receive descriptors): every chunk the pool grows
//! by is mapped and registered with the device, and the local key of any buffer is found from
//! its address.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use ucs::mpool::{ChunkAlloc, MemPool, MpoolParams};
use ucs::{Status, UcsResult};

use crate::verbs::{last_os_error, Mr, Pd};

struct Chunk {
    base: usize,
    len: usize,
    mr: Mr,
}

/// The registered chunks of one pool.
#[derive(Default)]
pub struct RegChunks {
    chunks: RefCell<Vec<Chunk>>,
}

impl RegChunks {
    /// The local key of the chunk holding `addr`.
    #[inline]
    pub fn lkey(&self, addr: *const u8) -> Option<u32> {
        let a = addr as usize;
        self.chunks.borrow().iter().find(|c| a >= c.base && a < c.base + c.len).map(|c| c.mr.lkey())
    }
}

/// Maps `len` bytes of private anonymous memory (zero-filled); `NoMemory` with a log naming
/// `what` when the kernel refuses.
pub(crate) fn map_anon(len: usize, what: &str) -> UcsResult<NonNull<u8>> {
    // SAFETY: an anonymous private mapping at an address the kernel chooses; checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        tracing::error!("ib: mmap of {len} bytes for {what} failed: {}", last_os_error());
        return Err(Status::NoMemory);
    }
    NonNull::new(p.cast()).ok_or(Status::NoMemory)
}

struct RegAlloc {
    pd: Rc<Pd>,
    chunks: Rc<RegChunks>,
}

// SAFETY: chunks are fresh anonymous mappings (zero-filled, private to this pool) of at least
// the requested size, unmapped only in `release` with the size `alloc` returned.
unsafe impl ChunkAlloc for RegAlloc {
    fn alloc(&self, min_size: usize) -> UcsResult<(NonNull<u8>, usize)> {
        let len = min_size.div_ceil(4096).max(1) * 4096;
        let p = map_anon(len, "descriptor chunk")?.as_ptr().cast::<libc::c_void>();
        let access = rdma_core_sys::IBV_ACCESS_LOCAL_WRITE;
        // SAFETY: the mapping stays until `release`, which deregisters first.
        let mr = match unsafe { Mr::register(&self.pd, p.cast(), len, access) } {
            Ok(mr) => mr,
            Err(e) => {
                // SAFETY: our own fresh mapping.
                unsafe { libc::munmap(p, len) };
                return Err(e);
            }
        };
        self.chunks.chunks.borrow_mut().push(Chunk { base: p as usize, len, mr });
        // SAFETY: mmap never returns NULL on success.
        Ok((unsafe { NonNull::new_unchecked(p.cast()) }, len))
    }

    unsafe fn release(&self, ptr: NonNull<u8>, size: usize) {
        let mut chunks = self.chunks.chunks.borrow_mut();
        if let Some(i) = chunks.iter().position(|c| c.base == ptr.as_ptr() as usize) {
            drop(chunks.swap_remove(i));
        }
        drop(chunks);
        // SAFETY: ptr/size are what `alloc` returned (caller), now deregistered.
        unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
    }
}

/// A pool of `elem_size`-byte registered buffers, `per_chunk` per registration, at most
/// `max_elems` in all.
pub fn reg_pool(
    pd: &Rc<Pd>,
    elem_size: usize,
    per_chunk: usize,
    max_elems: usize,
    name: &'static str,
) -> UcsResult<(Rc<MemPool>, Rc<RegChunks>)> {
    let chunks = Rc::new(RegChunks::default());
    let params = MpoolParams { elem_size, alignment: 64, elems_per_chunk: per_chunk, max_elems, name };
    let pool = MemPool::new(params, Box::new(RegAlloc { pd: pd.clone(), chunks: chunks.clone() }))?;
    Ok((Rc::new(pool), chunks))
}
