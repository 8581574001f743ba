//! The receive FIFO of the memory-mapped transports, laid out in a shared segment.
//!
//! ```text
//! offset 0    FifoCtl, cache line 0: head (claimed count; bit 63 = receiver armed for events),
//!                                    owner pid
//! offset 64   FifoCtl, cache line 1: tail (released count)
//! offset 128  element 0: ElemHeader (8 bytes) + inline data
//!             element 1 ...               (fifo_size elements of elem_size bytes)
//! ```
//!
//! Producers (any number, in any process that mapped the segment) claim a slot by
//! compare-and-swap on `head`, having checked against a cached copy of `tail` that the slot
//! was released; they write the element, then publish it by storing its flags with the owner
//! bit (release). The owner bit a valid element carries is `head & fifo_size`: it flips every
//! lap, so the consumer tells a fresh element from last lap's without clearing anything. The
//! single consumer polls the element at its read index (acquire), handles it, and stores
//! `tail` only every `release_batch` elements, so producers rarely touch its cache line.
//!
//! Every header field is read once into a local copy ([`RxElem`]) and validated by the caller
//! before use: the segment is writable by peers.

use std::mem::{offset_of, size_of};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use ucs::{Status, UcsResult};

/// Element flag: the owner bit, which flips every lap.
pub const ELEM_FLAG_OWNER: u8 = 1 << 0;
/// Element flag: the data is inline in the element (otherwise in a receive descriptor).
pub const ELEM_FLAG_INLINE: u8 = 1 << 1;
/// Bit of `head` the receiver sets to ask the next producer for a wakeup signal.
pub const HEAD_EVENT_ARMED: u64 = 1 << 63;

/// The FIFO control block: head and tail on separate cache lines.
#[repr(C, align(64))]
pub struct FifoCtl {
    /// Claimed count (producers), with [`HEAD_EVENT_ARMED`].
    pub head: AtomicU64,
    /// Process id of the receiver.
    pub owner_pid: AtomicU32,
    _pad0: [u8; 52],
    /// Released count (consumer).
    pub tail: AtomicU64,
    _pad1: [u8; 56],
}

const _: () = assert!(size_of::<FifoCtl>() == 128);
const _: () = assert!(offset_of!(FifoCtl, tail) == 64);

/// Header of a FIFO element; inline data follows it.
#[repr(C)]
pub struct ElemHeader {
    /// [`ELEM_FLAG_OWNER`] | [`ELEM_FLAG_INLINE`]; stored last (release) to publish.
    pub flags: AtomicU8,
    /// Active message id.
    pub am_id: u8,
    /// Bytes of data (inline or in the descriptor).
    pub length: u16,
    /// Offset in the receiver's segment of this element's receive descriptor (bcopy data).
    pub desc_offset: u32,
}

const _: () = assert!(size_of::<ElemHeader>() == 8);

/// Size of the control block that precedes the elements.
pub const CTL_SIZE: usize = size_of::<FifoCtl>();
/// Size of an element header.
pub const ELEM_HEADER_SIZE: usize = size_of::<ElemHeader>();

/// Geometry of a FIFO.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FifoLayout {
    /// Number of elements, a power of two.
    pub fifo_size: u32,
    /// Bytes per element (header + inline data), a multiple of 8.
    pub elem_size: u32,
}

impl FifoLayout {
    /// Validates a geometry: `fifo_size` a power of two in 2..=2^20, `elem_size` a multiple of 8
    /// in 16..=65536 (the 16-bit length field bounds inline data).
    pub fn new(fifo_size: u32, elem_size: u32) -> UcsResult<Self> {
        if !fifo_size.is_power_of_two() || !(2..=1 << 20).contains(&fifo_size) {
            tracing::error!(fifo_size, "FIFO size must be a power of two between 2 and 1048576");
            return Err(Status::InvalidParam);
        }
        if elem_size % 8 != 0 || !(16..=65536).contains(&elem_size) {
            tracing::error!(elem_size, "FIFO element size must be a multiple of 8 between 16 and 65536");
            return Err(Status::InvalidParam);
        }
        Ok(FifoLayout { fifo_size, elem_size })
    }

    /// Bytes the control block and elements take.
    pub fn total_len(&self) -> usize {
        CTL_SIZE + self.fifo_size as usize * self.elem_size as usize
    }

    /// Largest inline payload.
    pub fn max_inline(&self) -> usize {
        self.elem_size as usize - ELEM_HEADER_SIZE
    }
}

/// A FIFO at a mapped address.
pub struct Fifo {
    base: NonNull<u8>,
    layout: FifoLayout,
}

impl Fifo {
    /// Views `len` bytes at `base` as a FIFO of `layout`.
    ///
    /// # Safety
    /// `base` must be valid for reads and writes of `len` bytes for the life of the `Fifo`,
    /// and accessed by others only through this protocol (atomics and published elements).
    pub unsafe fn from_raw(base: NonNull<u8>, len: usize, layout: FifoLayout) -> UcsResult<Fifo> {
        if len < layout.total_len() || base.as_ptr() as usize % 64 != 0 {
            tracing::error!(len, need = layout.total_len(), "FIFO region too small or misaligned");
            return Err(Status::InvalidParam);
        }
        Ok(Fifo { base, layout })
    }

    /// Geometry.
    pub fn layout(&self) -> FifoLayout {
        self.layout
    }

    /// The control block.
    #[inline]
    pub fn ctl(&self) -> &FifoCtl {
        // SAFETY: the region starts with a 64-byte aligned FifoCtl (checked in `from_raw`),
        // whose fields other processes touch only atomically.
        unsafe { self.base.cast::<FifoCtl>().as_ref() }
    }

    /// The element for claim index `index`.
    #[inline]
    fn elem(&self, index: u64) -> NonNull<ElemHeader> {
        let slot = (index & (self.layout.fifo_size as u64 - 1)) as usize;
        // SAFETY: slot < fifo_size, so the element lies within total_len (checked).
        unsafe { self.base.add(CTL_SIZE + slot * self.layout.elem_size as usize).cast() }
    }

    /// The owner bit a valid element carries for claim index `index`.
    #[inline]
    fn owner_bit(&self, index: u64) -> u8 {
        if index & self.layout.fifo_size as u64 != 0 {
            ELEM_FLAG_OWNER
        } else {
            0
        }
    }

    /// Initialises an empty FIFO (receiver, before publishing the segment). Element `i` gets
    /// descriptor offset `desc_offset(i)`.
    pub fn init(&self, pid: u32, mut desc_offset: impl FnMut(u32) -> u32) {
        let ctl = self.ctl();
        ctl.head.store(0, Ordering::Relaxed);
        ctl.tail.store(0, Ordering::Relaxed);
        ctl.owner_pid.store(pid, Ordering::Relaxed);
        for i in 0..self.layout.fifo_size {
            let e = self.elem(i as u64).as_ptr();
            // SAFETY: `e` is an element of the region; nobody else uses the FIFO yet.
            unsafe {
                (*e).am_id = 0;
                (*e).length = 0;
                (*e).desc_offset = desc_offset(i);
                // The lap-0 owner bit is 0, so 1 marks "not written yet".
                (*e).flags.store(ELEM_FLAG_OWNER, Ordering::Release);
            }
        }
    }
}

/// A claimed, unpublished element.
#[derive(Debug)]
pub struct Claim {
    index: u64,
    elem: NonNull<ElemHeader>,
    /// The receiver had armed events: signal it after publishing.
    pub armed: bool,
}

impl Claim {
    /// The receive descriptor offset the receiver assigned to this element (peer data: the
    /// caller validates it before writing there).
    #[inline]
    pub fn desc_offset(&self) -> u32 {
        // SAFETY: the element is valid (claimed in a live FIFO); the receiver wrote this field
        // before releasing the slot (ordered by the acquire load of `tail`).
        unsafe { std::ptr::addr_of!((*self.elem.as_ptr()).desc_offset).read_volatile() }
    }

    /// Where inline data goes.
    #[inline]
    pub fn inline_ptr(&self) -> *mut u8 {
        // SAFETY: inline data starts right after the header, within the element.
        unsafe { self.elem.as_ptr().cast::<u8>().add(ELEM_HEADER_SIZE) }
    }
}

/// The sending side of one remote FIFO.
pub struct Producer {
    fifo: Fifo,
    cached_tail: std::cell::Cell<u64>,
    /// The end of the last element (bounds the prefetch after a publish).
    end: *const u8,
}

impl Producer {
    /// A producer on `fifo`.
    pub fn new(fifo: Fifo) -> Self {
        let end = fifo.base.as_ptr().cast_const().wrapping_add(fifo.layout.total_len());
        Producer { fifo, cached_tail: std::cell::Cell::new(0), end }
    }

    /// The FIFO.
    pub fn fifo(&self) -> &Fifo {
        &self.fifo
    }

    /// True when a slot is free now (refreshing the cached tail if needed).
    #[inline]
    pub fn has_room(&self) -> bool {
        let head = self.fifo.ctl().head.load(Ordering::Relaxed) & !HEAD_EVENT_ARMED;
        let size = self.fifo.layout.fifo_size as u64;
        if head.wrapping_sub(self.cached_tail.get()) < size {
            return true;
        }
        self.cached_tail.set(self.fifo.ctl().tail.load(Ordering::Acquire));
        head.wrapping_sub(self.cached_tail.get()) < size
    }

    /// Claims the next slot, or `None` when the FIFO is full.
    #[inline]
    pub fn claim(&self) -> Option<Claim> {
        let ctl = self.fifo.ctl();
        let size = self.fifo.layout.fifo_size as u64;
        let mut head = ctl.head.load(Ordering::Relaxed);
        loop {
            let h = head & !HEAD_EVENT_ARMED;
            if h.wrapping_sub(self.cached_tail.get()) >= size {
                self.cached_tail.set(ctl.tail.load(Ordering::Acquire));
                if h.wrapping_sub(self.cached_tail.get()) >= size {
                    return None;
                }
            }
            // Claiming also clears the armed bit: exactly one producer signals per arm.
            match ctl.head.compare_exchange_weak(head, h + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(Claim { index: h, elem: self.fifo.elem(h), armed: head & HEAD_EVENT_ARMED != 0 }),
                Err(now) => head = now,
            }
        }
    }

    /// Publishes a claimed element with `len` bytes of data for AM `am_id`.
    #[inline]
    pub fn publish(&self, claim: Claim, am_id: u8, len: u16, inline: bool) {
        let e = claim.elem.as_ptr();
        let flags = self.fifo.owner_bit(claim.index) | if inline { ELEM_FLAG_INLINE } else { 0 };
        // SAFETY: the claimed element is ours until published; the release store orders the
        // data and header writes before the flags the consumer polls.
        unsafe {
            std::ptr::addr_of_mut!((*e).am_id).write_volatile(am_id);
            std::ptr::addr_of_mut!((*e).length).write_volatile(len);
            (*e).flags.store(flags, Ordering::Release);
        }
        // Ask for the cache line of an element this producer is about to write in exclusive
        // state now, so that write does not wait for the line to come over from the consumer's
        // core. Not the next element: an idle consumer polls that one's flags, and taking its
        // line away would only make it come back (measured: slower ping-pong).
        // Two elements on, by address: for the last two slots that is past the ring and nothing
        // is fetched, which is cheaper than computing the wrapped slot on every publish.
        let ahead = claim.elem.as_ptr().cast::<u8>().wrapping_add(2 * self.fifo.layout.elem_size as usize);
        if ahead.cast_const() < self.end {
            prefetch(ahead, true);
        }
    }
}

/// Hints the CPU to fetch the cache line at `p`, for writing (`prefetchw`) or for reading
/// (`prefetcht0`). Never faults, whatever the address.
#[inline(always)]
fn prefetch(p: *const u8, write: bool) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: both instructions only hint the cache: they do not access memory
    // architecturally and cannot fault; CPUs without PREFETCHW decode it as a no-op (0F 0D is a
    // reserved-NOP opcode).
    unsafe {
        if write {
            std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
        } else {
            std::arch::asm!("prefetcht0 [{0}]", in(reg) p, options(nostack, preserves_flags, readonly));
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, write);
}

/// A received element, copied out of shared memory (validate before use).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxElem {
    /// Active message id as the peer wrote it.
    pub am_id: u8,
    /// Length as the peer wrote it.
    pub length: u16,
    /// Data is inline.
    pub inline: bool,
    /// Descriptor offset of this element.
    pub desc_offset: u32,
}

/// The receiving side of the local FIFO.
pub struct Consumer {
    fifo: Fifo,
    read_index: u64,
    release_mask: u64,
    /// The element of `read_index`, moved along with it (no slot arithmetic per access).
    cur: NonNull<ElemHeader>,
    /// The element after `cur` (the first one after the last).
    next: NonNull<ElemHeader>,
    /// The owner bit a published element at `read_index` carries (flips every lap).
    owner: u8,
}

impl Consumer {
    /// A consumer releasing slots to producers every `release_batch` elements (a power of two,
    /// at most the FIFO size).
    pub fn new(fifo: Fifo, release_batch: u32) -> UcsResult<Self> {
        if !release_batch.is_power_of_two() || release_batch > fifo.layout.fifo_size {
            tracing::error!(release_batch, "FIFO release batch must be a power of two <= FIFO size");
            return Err(Status::InvalidParam);
        }
        let (cur, next) = (fifo.elem(0), fifo.elem(1));
        let owner = fifo.owner_bit(0);
        Ok(Consumer { fifo, read_index: 0, release_mask: release_batch as u64 - 1, cur, next, owner })
    }

    /// The FIFO.
    pub fn fifo(&self) -> &Fifo {
        &self.fifo
    }

    /// The element at the read index, if published.
    #[inline]
    pub fn peek(&self) -> Option<RxElem> {
        let e = self.cur.as_ptr();
        // SAFETY: `e` is an element of the live FIFO. The acquire load pairs with the
        // producer's release store, so the header fields read next are the published ones.
        unsafe {
            let flags = (*e).flags.load(Ordering::Acquire);
            if flags & ELEM_FLAG_OWNER != self.owner {
                return None;
            }
            Some(RxElem {
                am_id: std::ptr::addr_of!((*e).am_id).read_volatile(),
                length: std::ptr::addr_of!((*e).length).read_volatile(),
                inline: flags & ELEM_FLAG_INLINE != 0,
                desc_offset: std::ptr::addr_of!((*e).desc_offset).read_volatile(),
            })
        }
    }

    /// True when the element at the read index is published: [`peek`](Self::peek) without
    /// reading the header, for the idle poll.
    #[inline]
    pub fn ready(&self) -> bool {
        let e = self.cur.as_ptr();
        // SAFETY: `e` is an element of the live FIFO; only its atomic flags are read.
        let flags = unsafe { (*e).flags.load(Ordering::Acquire) };
        flags & ELEM_FLAG_OWNER == self.owner
    }

    /// Starts fetching the element after the read index (while the current one is handled).
    /// Worth it when messages stream in; when they come one at a time the next element is not
    /// written yet, and fetching it early only takes its line from the producer.
    #[inline]
    pub fn prefetch_next(&self) {
        prefetch(self.next.as_ptr().cast(), false);
    }

    /// The slot (element index) of the read index.
    #[inline]
    pub fn index_slot(&self) -> usize {
        (self.read_index & (self.fifo.layout.fifo_size as u64 - 1)) as usize
    }

    /// Inline data of the element at the read index (`max_inline` bytes available).
    #[inline]
    pub fn inline_ptr(&self) -> *const u8 {
        // SAFETY: inline data follows the header within the element.
        unsafe { self.cur.as_ptr().cast::<u8>().add(ELEM_HEADER_SIZE) }
    }

    /// Gives the element at the read index a new receive descriptor (after its handler kept
    /// the old one); producers see it once the slot is released.
    #[inline]
    pub fn set_desc_offset(&self, offset: u32) {
        let e = self.cur.as_ptr();
        // SAFETY: the element is owned by the consumer until released.
        unsafe { std::ptr::addr_of_mut!((*e).desc_offset).write_volatile(offset) };
    }

    /// Moves past the element at the read index, releasing a batch of slots when complete.
    #[inline]
    pub fn advance(&mut self) {
        self.cur = self.next;
        self.read_index += 1;
        let slot = self.index_slot();
        if slot == 0 {
            self.owner ^= ELEM_FLAG_OWNER;
        }
        self.next = if slot + 1 == self.fifo.layout.fifo_size as usize {
            self.fifo.elem(0)
        } else {
            // SAFETY: not the last slot, so the next element lies within the FIFO.
            unsafe { self.cur.cast::<u8>().add(self.fifo.layout.elem_size as usize).cast() }
        };
        if self.read_index & self.release_mask == 0 {
            self.fifo.ctl().tail.store(self.read_index, Ordering::Release);
        }
    }

    /// Releases every consumed slot now (e.g. before sleeping).
    pub fn release_all(&self) {
        self.fifo.ctl().tail.store(self.read_index, Ordering::Release);
    }

    /// Asks the next producer to signal: sets the armed bit unless elements are already waiting
    /// (`Err(Busy)`: poll first).
    pub fn arm(&self) -> UcsResult<()> {
        self.release_all();
        let ctl = self.fifo.ctl();
        let mut head = ctl.head.load(Ordering::Acquire);
        loop {
            if head & !HEAD_EVENT_ARMED != self.read_index || self.peek().is_some() {
                return Err(Status::Busy);
            }
            match ctl.head.compare_exchange(head, head | HEAD_EVENT_ARMED, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(()),
                Err(now) => head = now,
            }
        }
    }
}

#[cfg(test)]
mod tests;
