//! Datatypes (`ucp_datatype_t`): the user memory an operation reads or writes.
//!
//! The raw API takes user memory the caller promises to keep valid until the operation
//! completes, as UCX's C API does. That promise is made once, at the API boundary, by the
//! `unsafe` constructors of [`UserBuf`]; from then on the protocols copy in and out through
//! safe, bounds-checked methods and never touch a raw pointer themselves.
//!
//! Three layouts: contiguous, an iov list (`ucp_dt_iov_t`) read in place, and generic
//! (`ucp_dt_create_generic`: the user's pack and unpack callbacks, in `generic`).

use std::ptr::NonNull;

use ucs::{Status, UcsResult};

mod generic;

pub(crate) use generic::{fold_status, GenState};
pub use generic::{Datatype, GenericBuf, GenericDatatype, PackState, UnpackState};

/// One buffer of an iov datatype (`ucp_dt_iov_t`).
#[derive(Clone, Copy, Debug)]
#[repr(C)]
pub struct IoVec {
    /// Start.
    pub buffer: *mut u8,
    /// Length in bytes.
    pub length: usize,
}

/// A contiguous piece of user memory; laid out as [`IoVec`], so a caller's iov list is read in
/// place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub(crate) struct Seg {
    pub ptr: *mut u8,
    pub len: usize,
}

const _: () = {
    assert!(std::mem::size_of::<Seg>() == std::mem::size_of::<IoVec>());
    assert!(std::mem::align_of::<Seg>() == std::mem::align_of::<IoVec>());
    assert!(std::mem::offset_of!(Seg, ptr) == std::mem::offset_of!(IoVec, buffer));
    assert!(std::mem::offset_of!(Seg, len) == std::mem::offset_of!(IoVec, length));
};

impl Seg {
    /// The piece `[offset, offset + n)` of this segment, if it lies within it.
    #[inline]
    pub fn sub(self, offset: usize, n: usize) -> Option<Seg> {
        let end = offset.checked_add(n)?;
        (end <= self.len).then(|| Seg { ptr: self.ptr.wrapping_add(offset), len: n })
    }
}

#[derive(Clone, Copy, Debug)]
enum Layout {
    Contig(Seg),
    /// The caller's iov list of two or more pieces, read in place: as for `ucp_dt_iov_t` in
    /// UCX, the caller keeps the list valid and unchanged until the operation completes.
    /// Nothing is copied or allocated, whatever the list's length.
    Iov {
        list: *const Seg,
        n: usize,
    },
    /// A generic datatype's state for this operation (pack or unpack), kept alive by the
    /// operation's owner (the API call, then the request: [`GenState`]).
    Generic(NonNull<GenState>),
}

/// User memory of one operation: valid for the accesses the operation makes until it
/// completes (the promise of its `unsafe` constructor). Copies of it are handles on the same
/// memory; the protocols use them only while the operation is in progress.
#[derive(Clone, Copy, Debug)]
pub(crate) struct UserBuf {
    layout: Layout,
}

impl UserBuf {
    /// A contiguous buffer of `len` bytes at `ptr`.
    ///
    /// # Safety
    /// Until the operation it is given to completes, the `len` bytes at `ptr` must stay valid
    /// for reads (a send) or for writes without other access (a receive).
    #[inline(always)]
    pub unsafe fn contig(ptr: *mut u8, len: usize) -> UserBuf {
        UserBuf { layout: Layout::Contig(Seg { ptr, len }) }
    }

    /// A buffer over the caller's iov list; `None` (after logging why) for a null piece with a
    /// length or lengths that overflow: the caller reports `InvalidParam`. A list of one piece
    /// is a contiguous buffer.
    ///
    /// `Option`, not a `Result` with the status: a `Result<UserBuf, Status>` keeps the status
    /// in the first byte of the buffer's pointer, and the send and receive paths then copied
    /// the buffer out of it as one byte and fifteen, through a store-forwarding stall (a
    /// quarter of `tag_bw`'s message rate when sends queue).
    ///
    /// # Safety
    /// As [`UserBuf::contig`] for every piece, and the list itself must stay valid and
    /// unchanged until the operation completes (it is read in place).
    pub unsafe fn iov(list: &[IoVec]) -> Option<UserBuf> {
        let mut total = 0usize;
        for x in list {
            if x.buffer.is_null() && x.length != 0 {
                tracing::error!("iov entry with a null buffer and length {}", x.length);
                return None;
            }
            let Some(t) = total.checked_add(x.length) else {
                tracing::error!("iov lengths overflow");
                return None;
            };
            total = t;
        }
        Some(match list {
            // SAFETY: forwarded from the caller.
            [x] => unsafe { UserBuf::contig(x.buffer, x.length) },
            _ => UserBuf { layout: Layout::Iov { list: list.as_ptr().cast::<Seg>(), n: list.len() } },
        })
    }

    /// A generic datatype's buffer: `st`'s packed size, packed or unpacked by its callbacks.
    /// The buffer holds `st`'s reference until [`UserBuf::end_call`].
    ///
    /// # Safety
    /// [`UserBuf::end_call`] must be called once on this buffer (or a copy) when the call
    /// that made it is done, and no copy used after the operation completed: the call holds
    /// the state alive until then, and a request made for the operation takes its own
    /// reference ([`UserBuf::generic_ref`]) until it completes.
    #[inline]
    pub unsafe fn generic(st: std::rc::Rc<GenState>) -> UserBuf {
        let p = std::rc::Rc::into_raw(st).cast_mut();
        // SAFETY: `Rc::into_raw` never gives null.
        UserBuf { layout: Layout::Generic(unsafe { NonNull::new_unchecked(p) }) }
    }

    /// Ends the call that made this buffer: a generic datatype's call reference goes (its
    /// state lives on in a request made for the operation, else the user's `finish` runs now)
    /// and the first error its callbacks returned is answered. Nothing for other layouts.
    ///
    /// # Safety
    /// Once per buffer made by [`UserBuf::generic`], outside the engine, after the call.
    #[inline(always)]
    pub unsafe fn end_call(self) -> Option<Status> {
        match self.layout {
            // SAFETY: forwarded from the caller.
            Layout::Generic(p) => unsafe { end_generic(p) },
            _ => None,
        }
    }

    /// The generic datatype's state of this buffer, if it is one.
    #[inline(always)]
    fn gen(&self) -> Option<&GenState> {
        match self.layout {
            // SAFETY: alive while the operation lasts (the contract of `UserBuf::generic`),
            // and this handle is used only then.
            Layout::Generic(p) => Some(unsafe { p.as_ref() }),
            _ => None,
        }
    }

    /// Another reference to a generic datatype's state, for a request made for the
    /// operation: it keeps the state (and the user's callbacks' state) until the request
    /// completes.
    #[inline]
    pub fn generic_ref(&self) -> Option<std::rc::Rc<GenState>> {
        match self.layout {
            Layout::Generic(p) => {
                // SAFETY: `p` came from a live `Rc<GenState>` (`UserBuf::generic`), alive
                // while the operation lasts: one more strong reference to it is sound.
                Some(unsafe {
                    std::rc::Rc::increment_strong_count(p.as_ptr().cast_const());
                    std::rc::Rc::from_raw(p.as_ptr().cast_const())
                })
            }
            _ => None,
        }
    }

    /// `status` with the first error of a generic datatype's callbacks folded in
    /// ([`fold_status`]): the status an operation on this buffer completes with.
    #[inline(always)]
    pub fn fold_status(&self, status: Status) -> Status {
        match self.layout {
            Layout::Generic(_) => fold_status(status, self.gen()),
            _ => status,
        }
    }

    /// Whether this is a generic datatype's buffer.
    #[inline(always)]
    pub fn is_generic(&self) -> bool {
        matches!(self.layout, Layout::Generic(_))
    }

    /// The pieces (none for a generic datatype, whose bytes only its callbacks reach).
    #[inline]
    fn segs(&self) -> &[Seg] {
        match &self.layout {
            Layout::Contig(s) => std::slice::from_ref(s),
            // SAFETY: the caller's list, valid while the operation lasts (`UserBuf::iov`), of
            // `IoVec`s, which have `Seg`'s layout (asserted above).
            Layout::Iov { list, n } => unsafe { std::slice::from_raw_parts(*list, *n) },
            Layout::Generic(_) => &[],
        }
    }

    /// Length in bytes (of an iov list: the sum of its pieces, which `UserBuf::iov` checked
    /// does not overflow; of a generic datatype: its packed size).
    #[inline(always)]
    pub fn len(&self) -> usize {
        match self.layout {
            Layout::Contig(s) => s.len,
            Layout::Iov { .. } => self.segs().iter().map(|s| s.len).sum(),
            Layout::Generic(_) => self.gen().map_or(0, GenState::len),
        }
    }

    /// The one segment of a contiguous buffer.
    #[inline(always)]
    pub fn contig_seg(&self) -> Option<Seg> {
        match self.layout {
            Layout::Contig(s) => Some(s),
            Layout::Iov { .. } | Layout::Generic(_) => None,
        }
    }

    /// The bytes of a contiguous buffer (a send's data, for `am_short`).
    #[inline(always)]
    pub fn contig_bytes(&self) -> Option<&[u8]> {
        let s = self.contig_seg()?;
        if s.len == 0 {
            return Some(&[]);
        }
        // SAFETY: readable for `len` bytes while the operation lasts (the constructor's
        // contract); the slice lives no longer than this handle's borrow.
        Some(unsafe { std::slice::from_raw_parts(s.ptr, s.len) })
    }

    /// Calls `f(segment_pointer, position, n)` for the pieces of `[offset, offset + len)`:
    /// `n` bytes at `segment_pointer` are bytes `position..position + n` of that range.
    #[inline]
    fn pieces(&self, offset: usize, len: usize, mut f: impl FnMut(*mut u8, usize, usize)) {
        let mut skip = offset;
        let mut done = 0;
        for s in self.segs() {
            if done == len {
                break;
            }
            if skip >= s.len {
                skip -= s.len;
                continue;
            }
            let n = (s.len - skip).min(len - done);
            // `skip + n <= s.len`: the pointer stays within the segment.
            f(s.ptr.wrapping_add(skip), done, n);
            done += n;
            skip = 0;
        }
    }

    /// Whether `[offset, offset + n)` lies within the buffer.
    #[inline(always)]
    fn holds(&self, offset: usize, n: usize) -> bool {
        offset <= self.len() && n <= self.len() - offset
    }

    /// Copies bytes `offset..offset + dst.len()` of the buffer into `dst`; `MessageTruncated`
    /// (nothing copied) when the range is not within the buffer. A generic datatype packs
    /// them; a pack callback's error leaves zeros and is kept for the operation's completion
    /// ([`UserBuf::fold_status`]); an unpack state cannot pack (`Unsupported`).
    #[inline]
    pub fn copy_out(&self, offset: usize, dst: &mut [u8]) -> UcsResult<()> {
        if !self.holds(offset, dst.len()) {
            return Err(Status::MessageTruncated);
        }
        if let Some(g) = self.gen() {
            return g.pack(offset, dst);
        }
        let d = dst.as_mut_ptr();
        self.pieces(offset, dst.len(), |p, at, n| {
            // SAFETY: the segment is readable (the constructor's contract) and `pieces` keeps
            // `n` bytes within it; `at + n <= dst.len()`.
            unsafe { ucs::memory::copy(p, d.add(at), n) }
        });
        Ok(())
    }

    /// Copies `src` into the buffer at `offset`; `MessageTruncated` (nothing copied) when it
    /// does not fit.
    #[inline(always)]
    pub fn copy_in(&self, offset: usize, src: &[u8]) -> UcsResult<()> {
        if let Layout::Contig(s) = self.layout {
            if offset <= s.len && src.len() <= s.len - offset {
                // SAFETY: writable without other access (the constructor's contract), and
                // `offset + src.len() <= s.len` (checked).
                unsafe { ucs::memory::copy(src.as_ptr(), s.ptr.add(offset), src.len()) };
                return Ok(());
            }
            return Err(Status::MessageTruncated);
        }
        self.copy_in_pieces(offset, src)
    }

    /// [`UserBuf::copy_in`] for an iov list or a generic datatype, out of line so that the contiguous case stays
    /// small enough to inline into the receive paths.
    ///
    /// A generic datatype unpacks; an unpack callback's error drops the bytes and is kept for
    /// the operation's completion ([`UserBuf::fold_status`]): `Ok`, as the bytes were
    /// taken. A pack state cannot unpack (`Unsupported`).
    #[inline(never)]
    fn copy_in_pieces(&self, offset: usize, src: &[u8]) -> UcsResult<()> {
        if !self.holds(offset, src.len()) {
            return Err(Status::MessageTruncated);
        }
        if let Some(g) = self.gen() {
            return g.unpack(offset, src);
        }
        self.pieces(offset, src.len(), |p, at, n| {
            // SAFETY: as in `copy_out`, with the roles swapped.
            unsafe { ucs::memory::copy(src.as_ptr().add(at), p, n) }
        });
        Ok(())
    }

    /// The contiguous run of the buffer that starts at `offset`: to the end of the piece of an
    /// iov list it falls in (a transport writes one run per operation). `None` past the end.
    pub fn run_at(&self, offset: usize) -> Option<Seg> {
        let mut skip = offset;
        for s in self.segs() {
            if skip < s.len {
                return s.sub(skip, s.len - skip);
            }
            skip -= s.len;
        }
        None
    }

    /// The address of a contiguous buffer (what a rendezvous exposes), or 0.
    pub fn addr(&self) -> u64 {
        self.contig_seg().map_or(0, |s| s.ptr as u64)
    }
}

/// [`UserBuf::end_call`] of a generic datatype's buffer.
///
/// # Safety
/// As [`UserBuf::end_call`].
#[cold]
#[inline(never)]
unsafe fn end_generic(p: NonNull<GenState>) -> Option<Status> {
    // SAFETY: the reference `UserBuf::generic` took, given back once (the caller's promise).
    let st = unsafe { std::rc::Rc::from_raw(p.as_ptr().cast_const()) };
    st.error()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iov_buffers_read_the_callers_list_in_place() {
        let mut bytes = [0u8; 64];
        let p = bytes.as_mut_ptr();
        // Longer than any fixed-size copy would hold: still read in place, nothing allocated.
        let list: Vec<IoVec> = (0..20).map(|i| IoVec { buffer: p.wrapping_add(i * 3), length: 2 }).collect();
        // SAFETY: `list` and `bytes` outlive `buf`, unchanged.
        let buf = unsafe { UserBuf::iov(&list) }.unwrap();
        assert!(std::ptr::eq(buf.segs().as_ptr().cast::<IoVec>(), list.as_ptr()));
        assert_eq!((buf.len(), buf.contig_seg().is_none()), (40, true));
        let data: Vec<u8> = (1..=40).collect();
        buf.copy_in(0, &data).unwrap();
        assert_eq!(&bytes[..6], &[1, 2, 0, 3, 4, 0]);
        assert_eq!(&bytes[57..60], &[39, 40, 0]);
    }

    #[test]
    fn iov_copies_span_segments() {
        let mut a = [0u8; 3];
        let mut b = [0u8; 0];
        let mut c = [0u8; 5];
        let list: Vec<IoVec> = [a.as_mut_ptr(), b.as_mut_ptr(), c.as_mut_ptr()]
            .into_iter()
            .zip([3, 0, 5])
            .map(|(buffer, length)| IoVec { buffer, length })
            .collect();
        // SAFETY: `list` and the arrays outlive `buf`, unchanged.
        let buf = unsafe { UserBuf::iov(&list) }.unwrap();
        assert_eq!(buf.len(), 8);
        buf.copy_in(0, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        buf.copy_in(2, &[9, 9]).unwrap();
        let mut out = [0u8; 5];
        buf.copy_out(1, &mut out).unwrap();
        assert_eq!(out, [2, 9, 9, 5, 6]);
        assert_eq!((a, c), ([1, 2, 9], [9, 5, 6, 7, 8]));
    }

    #[test]
    fn copies_outside_the_buffer_are_refused() {
        let mut a = [0u8; 4];
        // SAFETY: `a` outlives `buf`.
        let buf = unsafe { UserBuf::contig(a.as_mut_ptr(), a.len()) };
        assert_eq!(buf.copy_in(3, &[1, 2]), Err(Status::MessageTruncated));
        assert_eq!(buf.copy_in(usize::MAX, &[1]), Err(Status::MessageTruncated));
        assert_eq!(buf.copy_out(1, &mut [0; 4]), Err(Status::MessageTruncated));
        assert_eq!(buf.copy_in(2, &[7, 8]), Ok(()));
        let list = [IoVec { buffer: std::ptr::null_mut(), length: 1 }, IoVec { buffer: a.as_mut_ptr(), length: 1 }];
        // SAFETY: refused before any use.
        assert!(unsafe { UserBuf::iov(&list) }.is_none());
        assert_eq!(a, [0, 0, 7, 8]);
    }
}
