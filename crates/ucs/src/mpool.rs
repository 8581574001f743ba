//! Fixed-size object pool with chunked growth (UCX `ucs_mpool`).
//!
//! Send descriptors, receive buffers and requests are taken and returned millions of times per
//! second; the pool makes that a pointer pop and push. Memory comes in chunks from a
//! [`ChunkAlloc`] (plain heap, or registered / shared memory supplied by a transport), is carved
//! into `alignment`-aligned slots, and the free slots form an intrusive LIFO list (the link lives
//! in the first word of the free slot). Once enough chunks exist, nothing allocates.
//!
//! Three layers:
//! - [`MemPool`]: raw slots as `NonNull<u8>`, `get` / unsafe `put`.
//! - [`PoolBuf`]: an owned byte slot that returns itself on drop (`Rc<MemPool>` keeps the pool
//!   alive).
//! - [`ObjPool`] / [`PoolBox`]: typed slots, like a `Box<T>` whose memory comes from the pool.
//!
//! All are single-thread (`!Send`, `!Sync`): they use `Cell` state and `Rc`.

use std::alloc::{self, Layout};
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::mem::{self, ManuallyDrop};
use std::ops::{Deref, DerefMut};
use std::ptr::{self, NonNull};
use std::rc::Rc;

use crate::{Status, UcsResult};

/// Source of the memory chunks a [`MemPool`] carves into slots.
///
/// # Safety
/// `alloc` must return memory that is valid for reads and writes of the returned size (which is
/// at least `min_size`), zero-filled, and not used by anyone else until it is passed back to
/// `release` with that same size. Any address alignment is fine: the pool aligns slots itself.
pub unsafe trait ChunkAlloc {
    /// Allocates at least `min_size` bytes; returns the memory and its real size.
    fn alloc(&self, min_size: usize) -> UcsResult<(NonNull<u8>, usize)>;

    /// Gives back a chunk.
    ///
    /// # Safety
    /// `ptr` and `size` must be exactly what one earlier `alloc` of `self` returned, and the
    /// memory must not be used afterwards.
    unsafe fn release(&self, ptr: NonNull<u8>, size: usize);
}

/// [`ChunkAlloc`] on the global heap: zeroed, 64-byte aligned (page aligned from one page up).
#[derive(Clone, Copy, Debug, Default)]
pub struct HeapChunkAlloc;

const PAGE: usize = 4096;

impl HeapChunkAlloc {
    /// The layout for a request of `size` bytes. Alignment is chosen from the padded size, so
    /// the layout computed again from the padded size (in `release`) is the same.
    fn layout(size: usize) -> UcsResult<Layout> {
        let padded = size.checked_next_multiple_of(64).ok_or(Status::NoMemory)?;
        let align = if padded >= PAGE { PAGE } else { 64 };
        Layout::from_size_align(size, align).map(|l| l.pad_to_align()).map_err(|_| Status::NoMemory)
    }
}

// SAFETY: memory comes from alloc_zeroed with the layout recomputed identically in release, is
// at least 64-byte aligned, and is exclusively owned by the caller until release.
unsafe impl ChunkAlloc for HeapChunkAlloc {
    fn alloc(&self, min_size: usize) -> UcsResult<(NonNull<u8>, usize)> {
        if min_size == 0 {
            return Err(Status::InvalidParam);
        }
        let layout = Self::layout(min_size)?;
        // SAFETY: layout has a non-zero size (min_size > 0).
        let ptr = unsafe { alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(Status::NoMemory)?;
        Ok((ptr, layout.size()))
    }

    unsafe fn release(&self, ptr: NonNull<u8>, size: usize) {
        // `size` is a padded size returned by alloc, so the same layout comes back.
        if let Ok(layout) = Self::layout(size) {
            // SAFETY: the caller passes back a pointer from alloc with its returned size, whose
            // layout is the one computed here.
            unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
        }
    }
}

/// Shape and limits of a [`MemPool`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MpoolParams {
    /// Usable bytes per slot (> 0).
    pub elem_size: usize,
    /// Slot alignment, a power of two (raised to pointer alignment if smaller).
    pub alignment: usize,
    /// Slots added when `get` finds the pool empty (> 0).
    pub elems_per_chunk: usize,
    /// Cap on the total number of slots; `usize::MAX` for none.
    pub max_elems: usize,
    /// Name for logs and `Debug`.
    pub name: &'static str,
}

impl MpoolParams {
    /// Parameters for `elem_size`-byte slots: 8-byte aligned, 128 per chunk, unlimited.
    pub const fn new(elem_size: usize) -> Self {
        MpoolParams { elem_size, alignment: 8, elems_per_chunk: 128, max_elems: usize::MAX, name: "mpool" }
    }
}

/// Pool of fixed-size, aligned memory slots.
///
/// A slot never used before reads as zeros; a recycled one holds what its last user left,
/// except that the first pointer-sized word is zero.
pub struct MemPool {
    elem_size: usize,
    stride: usize,
    align: usize,
    elems_per_chunk: usize,
    max_elems: usize,
    name: &'static str,
    chunk_alloc: Box<dyn ChunkAlloc>,
    /// Head of the free list; each free slot's first word holds the next free slot or null.
    free: Cell<*mut u8>,
    num_free: Cell<usize>,
    num_elems: Cell<usize>,
    /// Chunks to release on drop; only touched when growing.
    chunks: RefCell<Vec<(NonNull<u8>, usize)>>,
}

impl MemPool {
    /// Creates an empty pool; memory is allocated on the first `get` or `grow`.
    ///
    /// Fails with [`Status::InvalidParam`] if `elem_size` or `elems_per_chunk` is 0, if
    /// `alignment` is not a power of two, or if one chunk's size would overflow.
    pub fn new(params: MpoolParams, chunk_alloc: Box<dyn ChunkAlloc>) -> UcsResult<MemPool> {
        let MpoolParams { elem_size, alignment, elems_per_chunk, max_elems, name } = params;
        if elem_size == 0 || elems_per_chunk == 0 || !alignment.is_power_of_two() {
            return Err(Status::InvalidParam);
        }
        let align = alignment.max(mem::align_of::<*mut u8>());
        let stride =
            elem_size.max(mem::size_of::<*mut u8>()).checked_next_multiple_of(align).ok_or(Status::InvalidParam)?;
        Self::chunk_bytes(stride, align, elems_per_chunk).ok_or(Status::InvalidParam)?;
        Ok(MemPool {
            elem_size,
            stride,
            align,
            elems_per_chunk,
            max_elems,
            name,
            chunk_alloc,
            free: Cell::new(ptr::null_mut()),
            num_free: Cell::new(0),
            num_elems: Cell::new(0),
            chunks: RefCell::new(Vec::new()),
        })
    }

    /// Bytes needed for `n` slots when the chunk start may be misaligned by up to `align - 1`.
    fn chunk_bytes(stride: usize, align: usize, n: usize) -> Option<usize> {
        let bytes = stride.checked_mul(n)?.checked_add(align - 1)?;
        (bytes <= isize::MAX as usize).then_some(bytes)
    }

    /// Takes a free slot, growing by one chunk if none is free. `None` when `max_elems` slots
    /// exist and all are in use, or the chunk allocator fails.
    #[inline]
    pub fn get(&self) -> Option<NonNull<u8>> {
        let mut head = self.free.get();
        if head.is_null() {
            self.grow(self.elems_per_chunk).ok()?;
            head = self.free.get();
        }
        let head = NonNull::new(head)?;
        let link = head.as_ptr().cast::<*mut u8>();
        // SAFETY: `head` is a free slot of this pool: inside a live chunk, pointer-aligned
        // (align >= align_of pointer) and at least pointer-sized (stride >= size_of pointer);
        // its first word holds the link written by `put` or `grow`.
        let next = unsafe { link.read() };
        // SAFETY: as above; the slot becomes the caller's, and clearing the link keeps a fresh
        // slot all-zero and keeps pointer bytes out of the caller's view.
        unsafe { link.write(ptr::null_mut()) };
        self.free.set(next);
        self.num_free.set(self.num_free.get() - 1);
        Some(head)
    }

    /// Returns a slot to the pool.
    ///
    /// # Safety
    /// `ptr` must come from `get` on this pool, and must not be used by anyone after this call
    /// (in particular it must not be put twice). Its first `elem_size` bytes must be initialised
    /// (a [`PoolBuf`] may later show them as `&[u8]`): they are when handed out, but storing a
    /// value with padding or uninitialised bytes in the slot breaks that.
    #[inline]
    pub unsafe fn put(&self, ptr: NonNull<u8>) {
        debug_assert_eq!(ptr.as_ptr() as usize % self.align, 0, "foreign pointer");
        // SAFETY: the caller guarantees `ptr` is a slot of this pool it no longer uses, so it is
        // writable, pointer-aligned and pointer-sized.
        unsafe { ptr.as_ptr().cast::<*mut u8>().write(self.free.get()) };
        self.free.set(ptr.as_ptr());
        self.num_free.set(self.num_free.get() + 1);
    }

    /// Adds one chunk of `n_elems` slots (fewer if `max_elems` caps it; more if the chunk
    /// allocator returned extra room), returning how many were added.
    ///
    /// Errors: [`Status::ExceedsLimit`] if `max_elems` slots already exist, [`Status::NoMemory`]
    /// if the size overflows, or the chunk allocator's error.
    pub fn grow(&self, n_elems: usize) -> UcsResult<usize> {
        let room = self.max_elems.saturating_sub(self.num_elems.get());
        let want = n_elems.min(room);
        if want == 0 {
            return if n_elems == 0 { Ok(0) } else { Err(Status::ExceedsLimit) };
        }
        let bytes = Self::chunk_bytes(self.stride, self.align, want).ok_or(Status::NoMemory)?;
        let (chunk, size) = self.chunk_alloc.alloc(bytes)?;
        let mut chunks = self.chunks.borrow_mut();
        if chunks.try_reserve(1).is_err() {
            // SAFETY: the chunk was just returned by this allocator with this size, unused.
            unsafe { self.chunk_alloc.release(chunk, size) };
            return Err(Status::NoMemory);
        }
        chunks.push((chunk, size));
        let addr = chunk.as_ptr() as usize;
        let pad = (self.align - addr % self.align) % self.align;
        // The allocator may return more than asked; use it, still within the cap.
        let count = (size.saturating_sub(pad) / self.stride).min(room);
        // Link the slots back to front so `get` hands them out in address order.
        let mut next = self.free.get();
        for k in (0..count).rev() {
            // SAFETY: pad + (k + 1) * stride <= pad + count * stride <= size, so the slot lies
            // inside the chunk.
            let slot = unsafe { chunk.as_ptr().add(pad + k * self.stride) };
            // SAFETY: the slot is inside the chunk we own, aligned to `align` (pad aligns the
            // first slot, stride is a multiple of align) and at least pointer-sized.
            unsafe { slot.cast::<*mut u8>().write(next) };
            next = slot;
        }
        self.free.set(next);
        self.num_free.set(self.num_free.get() + count);
        self.num_elems.set(self.num_elems.get() + count);
        tracing::trace!(pool = self.name, count, "mpool grew");
        Ok(count)
    }

    /// Takes a slot as an owned buffer that returns itself on drop.
    #[inline]
    pub fn get_buf(self: &Rc<Self>) -> Option<PoolBuf> {
        let ptr = self.get()?;
        Some(PoolBuf { pool: Rc::clone(self), ptr })
    }

    /// Usable bytes per slot, as requested.
    #[inline]
    pub fn elem_size(&self) -> usize {
        self.elem_size
    }

    /// Distance between consecutive slots (elem_size rounded up to alignment and pointer size).
    #[inline]
    pub fn stride(&self) -> usize {
        self.stride
    }

    /// Slot alignment.
    #[inline]
    pub fn alignment(&self) -> usize {
        self.align
    }

    /// Slots currently free.
    #[inline]
    pub fn num_free(&self) -> usize {
        self.num_free.get()
    }

    /// Slots allocated so far (free or in use).
    #[inline]
    pub fn num_elems(&self) -> usize {
        self.num_elems.get()
    }

    /// The name given in the parameters.
    #[inline]
    pub fn name(&self) -> &'static str {
        self.name
    }
}

impl Drop for MemPool {
    fn drop(&mut self) {
        let in_use = self.num_elems.get() - self.num_free.get();
        if in_use != 0 {
            tracing::warn!(pool = self.name, in_use, "mpool dropped with slots in use");
        }
        for (chunk, size) in self.chunks.get_mut().drain(..) {
            // SAFETY: each entry is a chunk this allocator returned with that size, released once.
            unsafe { self.chunk_alloc.release(chunk, size) };
        }
    }
}

impl fmt::Debug for MemPool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemPool")
            .field("name", &self.name)
            .field("elem_size", &self.elem_size)
            .field("stride", &self.stride)
            .field("num_elems", &self.num_elems.get())
            .field("num_free", &self.num_free.get())
            .finish()
    }
}

/// An owned slot of a [`MemPool`], `elem_size` bytes long; returns to the pool on drop.
#[derive(Debug)]
pub struct PoolBuf {
    pool: Rc<MemPool>,
    ptr: NonNull<u8>,
}

impl PoolBuf {
    /// Start of the slot.
    #[inline]
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The slot's bytes.
    #[inline]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the slot is owned by this PoolBuf alone, lies in a live chunk (the Rc keeps the
        // pool alive), is elem_size <= stride bytes long and initialised (zeroed at chunk
        // allocation, later written only with plain bytes or a null link).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.pool.elem_size) }
    }

    /// The slot's bytes, mutably.
    #[inline]
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in as_slice; `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.pool.elem_size) }
    }

    /// The pool the slot belongs to.
    #[inline]
    pub fn pool(&self) -> &Rc<MemPool> {
        &self.pool
    }
}

impl Deref for PoolBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for PoolBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl Drop for PoolBuf {
    fn drop(&mut self) {
        // SAFETY: ptr came from this pool's get and this PoolBuf was its only user.
        unsafe { self.pool.put(self.ptr) };
    }
}

/// Typed pool: slots sized and aligned for `T`.
pub struct ObjPool<T> {
    pool: MemPool,
    _marker: PhantomData<T>,
}

impl<T> ObjPool<T> {
    /// A heap-backed pool growing `elems_per_chunk` objects at a time, up to `max_elems`
    /// (`usize::MAX` for no cap).
    pub fn new(elems_per_chunk: usize, max_elems: usize) -> UcsResult<Rc<Self>> {
        Self::with_alloc(elems_per_chunk, max_elems, Box::new(HeapChunkAlloc))
    }

    /// As [`new`](Self::new), with memory from `chunk_alloc`.
    pub fn with_alloc(
        elems_per_chunk: usize,
        max_elems: usize,
        chunk_alloc: Box<dyn ChunkAlloc>,
    ) -> UcsResult<Rc<Self>> {
        let params = MpoolParams {
            elem_size: mem::size_of::<T>().max(1),
            alignment: mem::align_of::<T>(),
            elems_per_chunk,
            max_elems,
            name: std::any::type_name::<T>(),
        };
        Ok(Rc::new(ObjPool { pool: MemPool::new(params, chunk_alloc)?, _marker: PhantomData }))
    }

    /// Moves `value` into a slot; gives it back when the pool is at `max_elems` or cannot grow.
    #[inline]
    pub fn get(self: &Rc<Self>, value: T) -> Result<PoolBox<T>, T> {
        let Some(slot) = self.pool.get() else {
            return Err(value);
        };
        let ptr = slot.cast::<T>();
        // SAFETY: the slot is ours, aligned to align_of::<T>() and at least size_of::<T>()
        // bytes (the pool was built with those), so writing a T there is in bounds.
        unsafe { ptr.as_ptr().write(value) };
        Ok(PoolBox { pool: Rc::clone(self), ptr })
    }

    /// Pre-allocates one chunk of `n` slots; see [`MemPool::grow`].
    pub fn grow(&self, n: usize) -> UcsResult<usize> {
        self.pool.grow(n)
    }

    /// Slots currently free.
    pub fn num_free(&self) -> usize {
        self.pool.num_free()
    }

    /// Slots allocated so far.
    pub fn num_elems(&self) -> usize {
        self.pool.num_elems()
    }
}

impl<T> fmt::Debug for ObjPool<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.pool.fmt(f)
    }
}

/// A `T` living in an [`ObjPool`] slot; drops the `T` and returns the slot on drop.
pub struct PoolBox<T> {
    pool: Rc<ObjPool<T>>,
    ptr: NonNull<T>,
}

impl<T> PoolBox<T> {
    /// Moves the value out and returns the slot to the pool.
    pub fn into_inner(this: PoolBox<T>) -> T {
        let this = ManuallyDrop::new(this);
        // SAFETY: the slot holds a live T owned by this box; reading it moves it out, and the
        // box is never dropped (ManuallyDrop), so the T is not dropped twice.
        let value = unsafe { this.ptr.as_ptr().read() };
        // SAFETY: the slot came from this pool and is no longer used.
        unsafe { this.pool.pool.put(this.ptr.cast()) };
        // SAFETY: the Rc is read out exactly once and the original is never dropped.
        drop(unsafe { ptr::read(&this.pool) });
        value
    }
}

impl<T> Deref for PoolBox<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: the slot holds a T written in ObjPool::get and owned by this box alone.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T> DerefMut for PoolBox<T> {
    fn deref_mut(&mut self) -> &mut T {
        // SAFETY: as in deref; `&mut self` makes the access exclusive.
        unsafe { self.ptr.as_mut() }
    }
}

impl<T> Drop for PoolBox<T> {
    fn drop(&mut self) {
        /// Returns the slot even if `T::drop` panics.
        struct PutBack<'a>(&'a MemPool, NonNull<u8>);
        impl Drop for PutBack<'_> {
            fn drop(&mut self) {
                // SAFETY: the slot came from this pool's get, and its T has been dropped.
                unsafe { self.0.put(self.1) };
            }
        }
        let _put_back = PutBack(&self.pool.pool, self.ptr.cast());
        // SAFETY: the slot holds a live T owned by this box; it is dropped exactly once here.
        unsafe { ptr::drop_in_place(self.ptr.as_ptr()) };
    }
}

impl<T: fmt::Debug> fmt::Debug for PoolBox<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_are_validated() {
        let heap = || Box::new(HeapChunkAlloc);
        let bad = [
            MpoolParams::new(0),
            MpoolParams { alignment: 3, ..MpoolParams::new(8) },
            MpoolParams { alignment: 0, ..MpoolParams::new(8) },
            MpoolParams { elems_per_chunk: 0, ..MpoolParams::new(8) },
            MpoolParams { elems_per_chunk: usize::MAX / 2, ..MpoolParams::new(8) },
        ];
        for p in bad {
            assert_eq!(MemPool::new(p, heap()).err(), Some(Status::InvalidParam), "{p:?}");
        }
    }

    #[test]
    fn heap_layout_round_trips() {
        for size in (1..3 * PAGE).chain([PAGE * 64 - 1, PAGE * 64, PAGE * 64 + 1]) {
            let l = HeapChunkAlloc::layout(size).unwrap();
            assert!(l.size() >= size);
            assert_eq!(HeapChunkAlloc::layout(l.size()).unwrap(), l, "size {size}");
        }
        assert!(HeapChunkAlloc.alloc(0).is_err());
        assert!(HeapChunkAlloc.alloc(usize::MAX).is_err());
    }

    #[test]
    fn slots_aligned_distinct_and_capped() {
        let params = MpoolParams { alignment: 256, elems_per_chunk: 3, max_elems: 5, ..MpoolParams::new(10) };
        let pool = MemPool::new(params, Box::new(HeapChunkAlloc)).unwrap();
        assert_eq!((pool.stride(), pool.alignment(), pool.elem_size()), (256, 256, 10));
        let got: Vec<NonNull<u8>> = std::iter::from_fn(|| pool.get()).collect();
        assert_eq!(got.len(), 5);
        assert_eq!((pool.num_elems(), pool.num_free()), (5, 0));
        for (k, p) in got.iter().enumerate() {
            assert_eq!(p.as_ptr() as usize % 256, 0);
            assert!(got[..k].iter().all(|q| q != p));
        }
        assert_eq!(pool.grow(1), Err(Status::ExceedsLimit));
        for p in got {
            // SAFETY: each slot came from this pool's get and is put once.
            unsafe { pool.put(p) };
        }
        assert_eq!(pool.num_free(), 5);
    }

    #[test]
    fn buf_and_box_round_trip() {
        let pool = Rc::new(MemPool::new(MpoolParams::new(24), Box::new(HeapChunkAlloc)).unwrap());
        let mut buf = pool.get_buf().unwrap();
        assert_eq!(buf.len(), 24);
        assert!(buf.iter().all(|&b| b == 0), "fresh slot is zeroed");
        buf.as_mut_slice().fill(0xab);
        let addr = buf.as_ptr();
        drop(buf);
        let buf = pool.get_buf().unwrap();
        assert_eq!(buf.as_ptr(), addr, "LIFO reuse");
        assert_eq!(&buf[..8], &[0; 8], "link word cleared");
        assert_eq!(buf[8], 0xab);

        let objs = ObjPool::<String>::new(2, 2).unwrap();
        let a = objs.get("a".to_string()).unwrap();
        let mut b = objs.get("b".to_string()).unwrap();
        b.push('!');
        assert_eq!(objs.get("c".to_string()).err().as_deref(), Some("c"));
        assert_eq!(PoolBox::into_inner(b), "b!");
        assert_eq!(objs.num_free(), 1);
        drop(a);
        assert_eq!((objs.num_free(), objs.num_elems()), (2, 2));
    }
}
