//! Generic datatypes (`ucp_dt_create_generic`): the user's callbacks produce a send's bytes
//! and take a receive's, at offsets, so a derived datatype (an MPI vector, a struct of
//! scattered fields) goes out without first being copied into one buffer.
//!
//! UCX's `ucp_generic_dt_ops_t` in Rust form: [`GenericDatatype`] starts an operation
//! (`start_pack` / `start_unpack`), the state it returns answers `packed_size` and packs or
//! unpacks at an offset ([`PackState`], [`UnpackState`]), and dropping the state is `finish`.
//! A [`Datatype`] (`ucp_datatype_t`) is a shared handle on the operations; dropping the last
//! handle is `ucp_dt_destroy`.
//!
//! Inside the library an operation's state is a [`GenState`]: the user's state with its packed
//! size (asked once, at the start, as UCX does) and the first error a callback returned. The
//! API call holds one reference while it runs, and a request made for the operation another
//! until it completes; the state is dropped - `finish` runs - when both are gone, outside the
//! protocol engine.

use std::cell::{Cell, RefCell};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::Arc;

use ucs::{Status, UcsResult};

/// The operations of a generic datatype: how to start packing a send's buffer and unpacking
/// into a receive's (`start_pack`, `start_unpack` of `ucp_generic_dt_ops_t`).
///
/// `buffer` and `count` are what the operation was given, passed through untouched: the
/// datatype decides what they mean (as in UCX, typically the start of the user's data and
/// the number of elements). The callbacks run inside worker calls (the send or receive call,
/// or progress), on the thread that makes them; they must not call the worker themselves.
/// A panic inside a callback is caught and fails the operation (`IoError`).
pub trait GenericDatatype: Send + Sync + 'static {
    /// Starts packing `count` elements at `buffer` for one send (`start_pack`). An error
    /// fails the send at once, before anything goes out.
    fn start_pack(&self, buffer: *const u8, count: usize) -> UcsResult<Box<dyn PackState>>;

    /// Starts unpacking into `count` elements at `buffer` for one receive (`start_unpack`).
    /// An error fails the receive at once.
    fn start_unpack(&self, buffer: *mut u8, count: usize) -> UcsResult<Box<dyn UnpackState>>;
}

/// One send's packing state. Dropping it is `finish`: it happens once the send completed.
pub trait PackState: Send {
    /// The length of the packed form in bytes (`packed_size`); asked once, at the start.
    fn packed_size(&self) -> usize;

    /// Writes bytes `offset..offset + dest.len()` of the packed form into `dest`, all of them
    /// (`pack`). Pieces are asked for in order of offset, each once (a message in fragments,
    /// a rendezvous pulled piece by piece).
    ///
    /// An error fails the send with it: the message still goes out whole, with zeros for the
    /// piece that failed (the receiver is never left waiting for bytes that will not come).
    fn pack(&mut self, offset: usize, dest: &mut [u8]) -> UcsResult<()>;
}

/// One receive's unpacking state. Dropping it is `finish`: it happens once the receive
/// completed.
pub trait UnpackState: Send {
    /// The most bytes the receive takes (`packed_size`); a longer message is truncated
    /// (`MessageTruncated`, nothing unpacked). Asked once, at the start.
    fn packed_size(&self) -> usize;

    /// Takes bytes `offset..offset + src.len()` of the message (`unpack`), in order of
    /// offset. An error fails the receive with it; later pieces are still offered (the
    /// message is consumed whole) and the first error is what the receive reports.
    fn unpack(&mut self, offset: usize, src: &[u8]) -> UcsResult<()>;
}

/// A datatype (`ucp_datatype_t`) made from generic operations (`ucp_dt_create_generic`).
/// Clones are handles on the same operations.
#[derive(Clone)]
pub struct Datatype(Arc<dyn GenericDatatype>);

impl std::fmt::Debug for Datatype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Datatype(generic)")
    }
}

impl Datatype {
    /// A generic datatype with the operations `ops` (`ucp_dt_create_generic`).
    pub fn generic(ops: impl GenericDatatype) -> Datatype {
        Datatype(Arc::new(ops))
    }

    /// The state of one send of `count` elements at `buffer`.
    pub(crate) fn start_pack(&self, buffer: *const u8, count: usize) -> UcsResult<Rc<GenState>> {
        let st = guarded("start_pack", || self.0.start_pack(buffer, count))?;
        let len = guarded("packed_size", || Ok(st.packed_size()))?;
        Ok(Rc::new(GenState { len, error: Cell::new(None), ops: RefCell::new(Ops::Pack(st)) }))
    }

    /// The state of one receive into `count` elements at `buffer`.
    pub(crate) fn start_unpack(&self, buffer: *mut u8, count: usize) -> UcsResult<Rc<GenState>> {
        let st = guarded("start_unpack", || self.0.start_unpack(buffer, count))?;
        let len = guarded("packed_size", || Ok(st.packed_size()))?;
        Ok(Rc::new(GenState { len, error: Cell::new(None), ops: RefCell::new(Ops::Unpack(st)) }))
    }
}

/// The data of one operation through a generic datatype: the datatype, and the `buffer` and
/// `count` its `start_pack` / `start_unpack` get (untouched). Passed by reference in
/// `SendData::Generic` / `RecvData::Generic`, which keeps those as small as a slice.
#[derive(Clone, Copy, Debug)]
pub struct GenericBuf<'a> {
    /// The datatype.
    pub dt: &'a Datatype,
    /// Given to `start_pack` (as `*const u8`) or `start_unpack`.
    pub buffer: *mut u8,
    /// Given to `start_pack` or `start_unpack`.
    pub count: usize,
}

impl<'a> GenericBuf<'a> {
    /// The data of a send: `start_pack(buffer, count)`.
    pub fn send(dt: &'a Datatype, buffer: *const u8, count: usize) -> Self {
        GenericBuf { dt, buffer: buffer.cast_mut(), count }
    }

    /// The data of a receive: `start_unpack(buffer, count)`.
    pub fn recv(dt: &'a Datatype, buffer: *mut u8, count: usize) -> Self {
        GenericBuf { dt, buffer, count }
    }
}

/// Runs a user callback, turning a panic into `IoError` (logged).
fn guarded<T>(what: &str, f: impl FnOnce() -> UcsResult<T>) -> UcsResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            tracing::error!("generic datatype: the {what} callback panicked; the operation fails");
            Err(Status::IoError)
        }
    }
}

enum Ops {
    Pack(Box<dyn PackState>),
    Unpack(Box<dyn UnpackState>),
}

/// One operation's generic datatype state (see the module's documentation).
pub(crate) struct GenState {
    len: usize,
    error: Cell<Option<Status>>,
    ops: RefCell<Ops>,
}

impl std::fmt::Debug for GenState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenState").field("len", &self.len).field("error", &self.error.get()).finish()
    }
}

impl GenState {
    /// The packed size, as asked at the start.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// The first error a callback returned.
    #[inline]
    pub fn error(&self) -> Option<Status> {
        self.error.get()
    }

    fn fail(&self, e: Status) {
        if self.error.get().is_none() {
            tracing::debug!("generic datatype: a callback failed: {e}");
            self.error.set(Some(e));
        }
    }

    /// Packs `dst.len()` bytes at `offset` (within the packed size: the caller checked); a
    /// failure leaves zeros and is kept. `Unsupported` for an unpack state.
    pub fn pack(&self, offset: usize, dst: &mut [u8]) -> UcsResult<()> {
        let Ok(mut ops) = self.ops.try_borrow_mut() else {
            return Err(reentered());
        };
        let Ops::Pack(p) = &mut *ops else { return Err(Status::Unsupported) };
        if let Err(e) = guarded("pack", || p.pack(offset, dst)) {
            dst.fill(0);
            self.fail(e);
        }
        Ok(())
    }

    /// Unpacks `src` at `offset` (within the packed size: the caller checked); a failure is
    /// kept and the bytes count as taken. `Unsupported` for a pack state.
    pub fn unpack(&self, offset: usize, src: &[u8]) -> UcsResult<()> {
        let Ok(mut ops) = self.ops.try_borrow_mut() else {
            return Err(reentered());
        };
        let Ops::Unpack(u) = &mut *ops else { return Err(Status::Unsupported) };
        if let Err(e) = guarded("unpack", || u.unpack(offset, src)) {
            self.fail(e);
        }
        Ok(())
    }
}

#[cold]
fn reentered() -> Status {
    tracing::error!("generic datatype: a callback called back into the worker with the same operation");
    Status::InvalidParam
}

/// Folds the first callback error of an operation's generic datatype into the status it
/// completes with: a callback's error wins over success and truncation, not over a failure
/// of the operation itself (cancelled, endpoint failed).
#[inline]
pub(crate) fn fold_status(status: Status, dt: Option<&GenState>) -> Status {
    match (status, dt.and_then(GenState::error)) {
        (Status::Ok | Status::MessageTruncated, Some(e)) => e,
        _ => status,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Packs `0, 1, 2, ...` (mod 251); fails at `fail_at` if set.
    struct Seq {
        n: usize,
        fail_at: Option<usize>,
    }

    impl PackState for Seq {
        fn packed_size(&self) -> usize {
            self.n
        }
        fn pack(&mut self, offset: usize, dest: &mut [u8]) -> UcsResult<()> {
            if self.fail_at.is_some_and(|f| (offset..offset + dest.len()).contains(&f)) {
                return Err(Status::NoMemory);
            }
            for (i, b) in dest.iter_mut().enumerate() {
                *b = ((offset + i) % 251) as u8;
            }
            Ok(())
        }
    }

    struct Ops2(Option<usize>);
    impl GenericDatatype for Ops2 {
        fn start_pack(&self, _: *const u8, count: usize) -> UcsResult<Box<dyn PackState>> {
            Ok(Box::new(Seq { n: count, fail_at: self.0 }))
        }
        fn start_unpack(&self, _: *mut u8, _: usize) -> UcsResult<Box<dyn UnpackState>> {
            Err(Status::Unsupported)
        }
    }

    #[test]
    fn pack_errors_leave_zeros_and_are_kept() {
        let st = Datatype::generic(Ops2(Some(5))).start_pack(std::ptr::null(), 8).unwrap();
        assert_eq!(st.len(), 8);
        let mut a = [9u8; 4];
        st.pack(0, &mut a).unwrap();
        assert_eq!(a, [0, 1, 2, 3]);
        let mut b = [9u8; 4];
        st.pack(4, &mut b).unwrap();
        assert_eq!((b, st.error()), ([0; 4], Some(Status::NoMemory)));
        assert_eq!(st.unpack(0, &[1]), Err(Status::Unsupported));
        assert_eq!(fold_status(Status::Ok, Some(&st)), Status::NoMemory);
        assert_eq!(fold_status(Status::Canceled, Some(&st)), Status::Canceled);
        assert!(Datatype::generic(Ops2(None)).start_unpack(std::ptr::null_mut(), 1).is_err());
    }

    struct Panics;
    impl PackState for Panics {
        fn packed_size(&self) -> usize {
            4
        }
        fn pack(&mut self, _: usize, _: &mut [u8]) -> UcsResult<()> {
            panic!("user bug")
        }
    }
    struct PanicOps;
    impl GenericDatatype for PanicOps {
        fn start_pack(&self, _: *const u8, _: usize) -> UcsResult<Box<dyn PackState>> {
            Ok(Box::new(Panics))
        }
        fn start_unpack(&self, _: *mut u8, _: usize) -> UcsResult<Box<dyn UnpackState>> {
            panic!("user bug")
        }
    }

    #[test]
    fn panicking_callbacks_fail_the_operation() {
        let dt = Datatype::generic(PanicOps);
        let st = dt.start_pack(std::ptr::null(), 0).unwrap();
        let mut a = [7u8; 4];
        st.pack(0, &mut a).unwrap();
        assert_eq!((a, st.error()), ([0; 4], Some(Status::IoError)));
        assert_eq!(dt.start_unpack(std::ptr::null_mut(), 0).err(), Some(Status::IoError));
    }
}
