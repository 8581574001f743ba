//! Active messages: ids, handlers, received messages and kept descriptors.
//!
//! A handler receives an [`AmRecv`] by value. It reads the data and returns (the transport then
//! reuses the buffer), or calls [`AmRecv::keep`] to take an [`AmDesc`] that owns the buffer until
//! dropped - UCX's "return `UCS_INPROGRESS` and call `uct_iface_release_desc` later", with the
//! release done by `Drop`. When the transport cannot lend its buffer (no `UCT_CB_PARAM_FLAG_DESC`),
//! `keep` copies the data instead, so handlers never need two code paths.

use std::cell::RefCell;
use std::fmt;
use std::ops::Deref;
use std::rc::Rc;

use ucs::mpool::{MemPool, PoolBuf};
use ucs::{Status, UcsResult};

/// Number of active message ids (`UCT_AM_ID_MAX`): valid ids are `0..AM_ID_MAX`.
pub const AM_ID_MAX: u8 = 32;

/// Returns `InvalidParam` for an id outside `0..AM_ID_MAX` (`UCT_CHECK_AM_ID`).
#[inline]
pub fn check_am_id(id: u8) -> UcsResult<()> {
    if id < AM_ID_MAX {
        Ok(())
    } else {
        bad_am_id(id)
    }
}

/// [`check_am_id`]'s error, out of the senders' fast paths.
#[cold]
#[inline(never)]
fn bad_am_id(id: u8) -> UcsResult<()> {
    tracing::debug!(id, "invalid active message id (valid range: 0..{})", AM_ID_MAX - 1);
    Err(Status::InvalidParam)
}

/// Returns `InvalidParam` when `len` exceeds `max` (`UCT_CHECK_LENGTH`).
#[inline]
pub fn check_length(len: usize, max: usize, what: &'static str) -> UcsResult<()> {
    if len <= max {
        Ok(())
    } else {
        bad_length(len, max, what)
    }
}

/// [`check_length`]'s error, out of the senders' fast paths.
#[cold]
#[inline(never)]
fn bad_length(len: usize, max: usize, what: &'static str) -> UcsResult<()> {
    tracing::debug!(len, max, "invalid {what} length");
    Err(Status::InvalidParam)
}

/// An active message handler: called with each message of its id.
///
/// Handlers may call communication functions (sends on any endpoint) but not progress.
pub type AmHandler = Rc<dyn Fn(AmRecv<'_>)>;

enum Storage<'a> {
    Borrowed(&'a [u8]),
    Desc { slot: &'a mut Option<PoolBuf>, offset: usize, len: usize },
}

/// A received active message, valid for the duration of the handler call.
pub struct AmRecv<'a> {
    storage: Storage<'a>,
}

impl<'a> AmRecv<'a> {
    /// A message in memory the transport cannot lend: [`AmRecv::keep`] copies it.
    pub fn borrowed(data: &'a [u8]) -> Self {
        AmRecv { storage: Storage::Borrowed(data) }
    }

    /// A message at `offset..offset + len` of the pool buffer in `slot`. If the handler keeps it,
    /// `slot` is left empty and the transport must take a fresh buffer.
    pub fn from_desc(slot: &'a mut Option<PoolBuf>, offset: usize, len: usize) -> Self {
        let ok = slot.as_ref().is_some_and(|b| offset.checked_add(len).is_some_and(|e| e <= b.as_slice().len()));
        if ok {
            AmRecv { storage: Storage::Desc { slot, offset, len } }
        } else {
            // A transport bug, not peer input: deliver nothing rather than read out of bounds.
            tracing::error!(offset, len, "AM descriptor out of bounds; delivering an empty message");
            AmRecv { storage: Storage::Borrowed(&[]) }
        }
    }

    /// The message: for `am_short`, the 8-byte header followed by the payload.
    pub fn data(&self) -> &[u8] {
        match &self.storage {
            Storage::Borrowed(d) => d,
            Storage::Desc { slot, offset, len } => match slot.as_ref() {
                Some(b) => &b.as_slice()[*offset..*offset + *len],
                None => &[],
            },
        }
    }

    /// Length of the message.
    pub fn len(&self) -> usize {
        self.data().len()
    }

    /// True for a zero-length message.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True when keeping the message lends the transport's buffer instead of copying
    /// (`UCT_CB_PARAM_FLAG_DESC`).
    pub fn is_desc(&self) -> bool {
        matches!(self.storage, Storage::Desc { .. })
    }

    /// [`keep`](Self::keep), copying a borrowed message too long for the descriptor itself
    /// into a buffer of `pool` when it fits one, instead of the heap: a caller keeping many
    /// such messages allocates only when the pool grows. The buffer goes back to `pool` when
    /// the descriptor is dropped.
    pub fn keep_in(self, pool: &Rc<MemPool>) -> AmDesc {
        if let Storage::Borrowed(d) = self.storage {
            if d.len() > AmDesc::INLINE && d.len() <= pool.elem_size() {
                if let Some(mut buf) = pool.get_buf() {
                    buf.as_mut_slice()[..d.len()].copy_from_slice(d);
                    return AmDesc { repr: DescRepr::Pool { buf, offset: 0, len: d.len() } };
                }
            }
        }
        self.keep()
    }

    /// Keeps the message beyond the handler call; dropping the returned descriptor releases it.
    /// A borrowed message (inline in the transport's receive buffer) is copied: into the
    /// descriptor itself when it takes at most [`AmDesc::INLINE`] bytes, to the heap otherwise.
    pub fn keep(self) -> AmDesc {
        match self.storage {
            Storage::Borrowed(d) if d.len() <= AmDesc::INLINE => {
                let mut data = [0u8; AmDesc::INLINE];
                data[..d.len()].copy_from_slice(d);
                AmDesc { repr: DescRepr::Inline { len: d.len() as u8, data } }
            }
            Storage::Borrowed(d) => AmDesc { repr: DescRepr::Owned(d.into()) },
            Storage::Desc { slot, offset, len } => match slot.take() {
                Some(buf) => AmDesc { repr: DescRepr::Pool { buf, offset, len } },
                None => AmDesc { repr: DescRepr::Owned(Box::new([])) },
            },
        }
    }
}

impl fmt::Debug for AmRecv<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmRecv").field("len", &self.len()).field("desc", &self.is_desc()).finish()
    }
}

enum DescRepr {
    Pool {
        buf: PoolBuf,
        offset: usize,
        len: usize,
    },
    /// A short copied message (`len <= AmDesc::INLINE`): kept without allocating.
    Inline {
        len: u8,
        data: [u8; AmDesc::INLINE],
    },
    Owned(Box<[u8]>),
}

/// A kept active message. Derefs to its bytes; dropping it gives the buffer back to the
/// transport (`uct_iface_release_desc`).
pub struct AmDesc {
    repr: DescRepr,
}

impl Deref for AmDesc {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.repr {
            DescRepr::Pool { buf, offset, len } => &buf.as_slice()[*offset..*offset + *len],
            DescRepr::Inline { len, data } => &data[..*len as usize],
            DescRepr::Owned(b) => b,
        }
    }
}

impl AmDesc {
    /// Largest copied message kept inside the descriptor, without a heap allocation. The
    /// descriptor then takes 48 bytes (32 without the inline case). Eager messages of up to 38
    /// payload bytes, kept by UCP with their 8-byte tag, fit.
    pub const INLINE: usize = 46;

    /// True when this descriptor holds a pool buffer: the transport's, or for a copy made by
    /// [`AmRecv::keep_in`], the caller's.
    pub fn is_transport_buffer(&self) -> bool {
        matches!(self.repr, DescRepr::Pool { .. })
    }
}

impl fmt::Debug for AmDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AmDesc").field("len", &self.len()).finish()
    }
}

/// The per-interface table of handlers, shared by transport implementations.
///
/// Handlers are reference counted and cloned out before the call, so a handler may send on an
/// endpoint of the same interface (which, for `self`, calls a handler again) without a borrow
/// conflict.
#[derive(Default)]
pub struct AmTable {
    handlers: RefCell<[Option<AmHandler>; AM_ID_MAX as usize]>,
}

impl AmTable {
    /// An empty table: every id drops its messages with a warning.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets or clears the handler of `id`.
    pub fn set(&self, id: u8, handler: Option<AmHandler>) -> UcsResult<()> {
        check_am_id(id)?;
        // Drop the old handler after the table is released: its captures may use the table.
        let old = std::mem::replace(&mut self.handlers.borrow_mut()[id as usize], handler);
        drop(old);
        Ok(())
    }

    /// Clears every handler (an interface does this when it closes, to break reference cycles
    /// through handlers that capture its endpoints).
    pub fn clear(&self) {
        let old = std::mem::take(&mut *self.handlers.borrow_mut());
        drop(old);
    }

    /// The handler of `id`, if any.
    #[inline(always)]
    pub fn get(&self, id: u8) -> Option<AmHandler> {
        self.handlers.borrow().get(id as usize).and_then(|h| h.clone())
    }

    /// Delivers a message to the handler of `id`. A message for an id without a handler, or an
    /// invalid id from a peer, is dropped with a warning (UCX's stub handler) and reported as
    /// `Err(NoElem)` so transports can count it.
    #[inline(always)]
    pub fn invoke(&self, id: u8, msg: AmRecv<'_>) -> UcsResult<()> {
        match self.get(id) {
            Some(h) => {
                h(msg);
                Ok(())
            }
            None => Self::unhandled(id, msg.len()),
        }
    }

    /// A message for an id without a handler: dropped with a warning.
    #[cold]
    #[inline(never)]
    fn unhandled(id: u8, len: usize) -> UcsResult<()> {
        tracing::warn!(id, len, "active message without a handler dropped");
        Err(Status::NoElem)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_borrowed_copies() {
        let h: AmHandler = Rc::new(|m: AmRecv<'_>| assert!(!m.is_desc()));
        let t = AmTable::new();
        t.set(3, Some(h)).unwrap();
        assert!(t.invoke(3, AmRecv::borrowed(b"abc")).is_ok());
        assert_eq!(t.invoke(4, AmRecv::borrowed(b"abc")), Err(Status::NoElem));
        assert_eq!(t.set(32, None), Err(Status::InvalidParam));
        let d = AmRecv::borrowed(b"xyz").keep();
        assert!(!d.is_transport_buffer());
        assert_eq!(&*d, b"xyz");
    }

    #[test]
    fn kept_copies_inline_up_to_the_limit_then_on_the_heap() {
        for n in [0, 1, 8, AmDesc::INLINE - 1, AmDesc::INLINE, AmDesc::INLINE + 1, 300] {
            let msg: Vec<u8> = (0..n).map(|i| (i * 7 + 1) as u8).collect();
            let d = AmRecv::borrowed(&msg).keep();
            assert_eq!(&*d, &msg[..], "{n} bytes");
            assert_eq!(matches!(d.repr, DescRepr::Inline { .. }), n <= AmDesc::INLINE, "{n} bytes");
        }
        // Between the inline limit and the pool's element size, a pool buffer that goes back
        // to the pool with the descriptor; beyond it, the heap.
        let pool =
            Rc::new(MemPool::new(ucs::mpool::MpoolParams::new(128), Box::new(ucs::mpool::HeapChunkAlloc)).unwrap());
        for n in [0, AmDesc::INLINE, AmDesc::INLINE + 1, 128, 129] {
            let msg: Vec<u8> = (0..n).map(|i| (i * 3 + 5) as u8).collect();
            let d = AmRecv::borrowed(&msg).keep_in(&pool);
            assert_eq!(&*d, &msg[..], "{n} bytes");
            let pooled = matches!(d.repr, DescRepr::Pool { .. });
            assert_eq!(pooled, n > AmDesc::INLINE && n <= 128, "{n} bytes");
            assert_eq!(pool.num_elems() - pool.num_free(), pooled as usize, "{n} bytes");
            drop(d);
            assert_eq!(pool.num_elems(), pool.num_free(), "{n} bytes: the buffer went back");
        }
        // The descriptor stays small.
        assert!(std::mem::size_of::<AmDesc>() <= 48, "{}", std::mem::size_of::<AmDesc>());
    }
}
