//! A generic datatype for the tests (`ucp_dt_create_generic`): a strided view of a buffer,
//! the shape of an MPI vector type. Byte `k` of the packed form is byte `k % blk` of block
//! `k / blk`, and block `b` starts at `b * stride` in the buffer (`stride >= blk`): packing
//! gathers the blocks, unpacking scatters them, leaving the gaps alone.
//!
//! The operations count `finish`es (states dropped), can be told to fail at a packed offset,
//! and check that pieces come in order of offset, each once.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use ucp::{Datatype, GenericDatatype, PackState, Status, UnpackState};

/// The operations: `start_*(buffer, count)` reads `count` as the packed size in bytes.
#[derive(Clone)]
pub struct Strided {
    /// Bytes per block.
    pub blk: usize,
    /// Distance between the starts of blocks.
    pub stride: usize,
    /// A pack or unpack of a piece holding this packed offset fails with `NoMemory`.
    pub fail_at: Option<usize>,
    /// `start_pack` / `start_unpack` fail with `Rejected`.
    pub fail_start: bool,
    /// States dropped (`finish`).
    pub finished: Arc<AtomicUsize>,
    /// A piece came out of order or twice.
    pub disorder: Arc<AtomicBool>,
}

impl Strided {
    /// Blocks of `blk` bytes every `stride` bytes.
    pub fn new(blk: usize, stride: usize) -> Strided {
        assert!(blk > 0 && stride >= blk);
        Strided {
            blk,
            stride,
            fail_at: None,
            fail_start: false,
            finished: Arc::new(AtomicUsize::new(0)),
            disorder: Arc::new(AtomicBool::new(false)),
        }
    }

    /// The same, failing at packed offset `at`.
    pub fn failing_at(mut self, at: usize) -> Strided {
        self.fail_at = Some(at);
        self
    }

    /// The datatype handle.
    pub fn datatype(&self) -> Datatype {
        Datatype::generic(self.clone())
    }

    /// The buffer length a packed size of `n` bytes spans.
    pub fn span(&self, n: usize) -> usize {
        n.div_ceil(self.blk) * self.stride
    }

    /// Where packed byte `k` lives in the buffer.
    pub fn at(&self, k: usize) -> usize {
        (k / self.blk) * self.stride + k % self.blk
    }

    /// A buffer whose strided view is `data` (the gaps hold 0xee).
    pub fn scatter(&self, data: &[u8]) -> Vec<u8> {
        let mut buf = vec![0xee; self.span(data.len())];
        for (k, b) in data.iter().enumerate() {
            buf[self.at(k)] = *b;
        }
        buf
    }

    /// The strided view of `buf`'s first `n` packed bytes.
    pub fn gather(&self, buf: &[u8], n: usize) -> Vec<u8> {
        (0..n).map(|k| buf[self.at(k)]).collect()
    }

    /// Whether the gaps of `buf` (for `n` packed bytes) still hold 0xee.
    pub fn gaps_untouched(&self, buf: &[u8], n: usize) -> bool {
        let mut inside = vec![false; buf.len()];
        for k in 0..n {
            inside[self.at(k)] = true;
        }
        buf.iter().zip(inside).all(|(b, i)| i || *b == 0xee)
    }

    /// `finish`es so far.
    pub fn finished(&self) -> usize {
        self.finished.load(Ordering::SeqCst)
    }

    /// Whether every piece came in order, once.
    pub fn in_order(&self) -> bool {
        !self.disorder.load(Ordering::SeqCst)
    }
}

struct State {
    ops: Strided,
    base: *mut u8,
    n: usize,
    /// The next offset expected.
    next: usize,
}

// SAFETY: the state only touches the buffer its operation was given, which the test keeps
// valid and untouched until the operation completes (the promise of the raw API).
unsafe impl Send for State {}

impl State {
    fn piece(&mut self, offset: usize, len: usize) -> Result<(), Status> {
        if offset != self.next || offset + len > self.n {
            self.ops.disorder.store(true, Ordering::SeqCst);
        }
        self.next = offset + len;
        match self.ops.fail_at {
            Some(f) if (offset..offset + len).contains(&f) => Err(Status::NoMemory),
            _ => Ok(()),
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        self.ops.finished.fetch_add(1, Ordering::SeqCst);
    }
}

impl PackState for State {
    fn packed_size(&self) -> usize {
        self.n
    }

    fn pack(&mut self, offset: usize, dest: &mut [u8]) -> Result<(), Status> {
        self.piece(offset, dest.len())?;
        for (i, d) in dest.iter_mut().enumerate() {
            // SAFETY: within the span of `n` packed bytes, which the buffer holds (the test
            // gave a buffer of `span(n)` bytes).
            *d = unsafe { *self.base.add(self.ops.at(offset + i)) };
        }
        Ok(())
    }
}

impl UnpackState for State {
    fn packed_size(&self) -> usize {
        self.n
    }

    fn unpack(&mut self, offset: usize, src: &[u8]) -> Result<(), Status> {
        self.piece(offset, src.len())?;
        for (i, s) in src.iter().enumerate() {
            // SAFETY: as in `pack`; the receive's buffer is the test's, untouched meanwhile.
            unsafe { *self.base.add(self.ops.at(offset + i)) = *s };
        }
        Ok(())
    }
}

impl GenericDatatype for Strided {
    fn start_pack(&self, buffer: *const u8, count: usize) -> Result<Box<dyn PackState>, Status> {
        if self.fail_start {
            return Err(Status::Rejected);
        }
        Ok(Box::new(State { ops: self.clone(), base: buffer.cast_mut(), n: count, next: 0 }))
    }

    fn start_unpack(&self, buffer: *mut u8, count: usize) -> Result<Box<dyn UnpackState>, Status> {
        if self.fail_start {
            return Err(Status::Rejected);
        }
        Ok(Box::new(State { ops: self.clone(), base: buffer, n: count, next: 0 }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scatter_and_gather_are_inverse() {
        let s = Strided::new(3, 5);
        let data: Vec<u8> = (0..10).collect();
        let buf = s.scatter(&data);
        assert_eq!(buf.len(), 20);
        assert_eq!(&buf[..8], &[0, 1, 2, 0xee, 0xee, 3, 4, 5]);
        assert_eq!(s.gather(&buf, 10), data);
        assert!(s.gaps_untouched(&buf, 10));
    }
}
