//! Memory pools of registered buffers (send and receive descriptors): every chunk the pool grows
//! by is mapped and registered with the device, and the local key of any buffer is found from
//! its address.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::rc::Rc;

use ucs::mpool::{ChunkAlloc, MemPool, MpoolParams, PoolBuf};
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

/// Receive buffers posted to a receive queue (an SRQ, or a QP's own): one slot per posted
/// receive, the slot index being the work request id, refilled in batches from a pool of
/// registered buffers. The work requests and scatter entries of a batch are preallocated.
pub(crate) struct RecvSlots {
    /// The buffer posted in each slot (taken while a completion is handled, or kept by a user).
    pub slots: Vec<Option<PoolBuf>>,
    /// Slots whose receive completed and must be posted again.
    pub refill: Vec<u32>,
    wrs: Vec<rdma_core_sys::ibv_recv_wr>,
    sges: Vec<rdma_core_sys::ibv_sge>,
}

impl RecvSlots {
    /// `n` empty slots, all waiting to be posted, in batches of `batch`.
    pub fn new(n: usize, batch: usize) -> Self {
        RecvSlots {
            slots: (0..n).map(|_| None).collect(),
            refill: (0..n as u32).rev().collect(),
            // SAFETY: zero is a valid bit pattern for these plain structs.
            wrs: vec![unsafe { std::mem::zeroed() }; batch.max(1)],
            // SAFETY: as above.
            sges: vec![unsafe { std::mem::zeroed() }; batch.max(1)],
        }
    }

    /// Posts a receive of `buf_len` bytes for every slot in `refill`, taking fresh buffers from
    /// `pool` for slots whose buffer was kept, one chain of up to a batch per `post` call
    /// (`post` returns the verbs error number). Stops when the pool is exhausted or a post
    /// fails (logged with `what`); returns how many receives were posted.
    pub fn refill(
        &mut self,
        pool: &Rc<MemPool>,
        chunks: &RegChunks,
        buf_len: usize,
        what: &str,
        mut post: impl FnMut(*mut rdma_core_sys::ibv_recv_wr) -> i32,
    ) -> usize {
        let mut posted = 0;
        while !self.refill.is_empty() {
            let batch = self.refill.len().min(self.wrs.len());
            let mut n = 0;
            for k in 0..batch {
                let idx = self.refill[self.refill.len() - 1 - k] as usize;
                if self.slots[idx].is_none() {
                    match pool.get_buf() {
                        Some(b) => self.slots[idx] = Some(b),
                        None => break,
                    }
                }
                let ptr = self.slots[idx].as_ref().map_or(std::ptr::null_mut(), |b| b.as_ptr());
                let Some(lkey) = chunks.lkey(ptr) else { break };
                self.sges[n] = rdma_core_sys::ibv_sge { addr: ptr as u64, length: buf_len as u32, lkey };
                n += 1;
            }
            if n == 0 {
                break;
            }
            for k in 0..n {
                let idx = self.refill[self.refill.len() - 1 - k];
                let next = if k + 1 < n { &mut self.wrs[k + 1] as *mut _ } else { std::ptr::null_mut() };
                let sge = &mut self.sges[k] as *mut rdma_core_sys::ibv_sge;
                self.wrs[k] = rdma_core_sys::ibv_recv_wr { wr_id: idx as u64, next, sg_list: sge, num_sge: 1 };
            }
            let r = post(self.wrs.as_mut_ptr());
            if r != 0 {
                tracing::error!("{what} failed: {}", std::io::Error::from_raw_os_error(r));
                break;
            }
            let keep = self.refill.len() - n;
            self.refill.truncate(keep);
            posted += n;
        }
        posted
    }
}
