//! Completion objects (`uct_completion_t`): a counter, a callback and the first error.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::rc::{Rc, Weak};

use ucs::Status;

type CompletionFn = Box<dyn FnMut(Status)>;

/// Signals local completion of operations that returned `InProgress`.
///
/// The counter is decremented once per completed operation; when it reaches zero the callback
/// runs with [`Status::Ok`] or the first error any of the operations reported. One completion
/// may be passed to many operations (set the count accordingly), and re-armed from its own
/// callback with [`Completion::set_count`].
pub struct Completion {
    count: Cell<i32>,
    status: Cell<Status>,
    func: RefCell<Option<CompletionFn>>,
}

impl Completion {
    /// A completion expecting `count` operations, calling `func` when they are all done.
    pub fn new(count: i32, func: impl FnMut(Status) + 'static) -> Rc<Self> {
        Rc::new(Completion {
            count: Cell::new(count),
            status: Cell::new(Status::Ok),
            func: RefCell::new(Some(Box::new(func))),
        })
    }

    /// [`Completion::new`] with a callback made from a weak handle to the completion itself,
    /// for callbacks that hand their completion on (to a free list, for reuse) once it fired.
    pub fn new_cyclic<F: FnMut(Status) + 'static>(count: i32, make: impl FnOnce(Weak<Self>) -> F) -> Rc<Self> {
        Rc::new_cyclic(|me| Completion {
            count: Cell::new(count),
            status: Cell::new(Status::Ok),
            func: RefCell::new(Some(Box::new(make(me.clone())))),
        })
    }

    /// A completion with no callback: poll [`Completion::count`] and [`Completion::status`].
    pub fn counter(count: i32) -> Rc<Self> {
        Rc::new(Completion { count: Cell::new(count), status: Cell::new(Status::Ok), func: RefCell::new(None) })
    }

    /// Operations still outstanding.
    pub fn count(&self) -> i32 {
        self.count.get()
    }

    /// [`Status::Ok`], or the first error reported so far.
    pub fn status(&self) -> Status {
        self.status.get()
    }

    /// Re-arms the completion for `count` more operations and clears the status.
    pub fn set_count(&self, count: i32) {
        self.count.set(count);
        self.status.set(Status::Ok);
    }

    /// Adds `n` to the expected number of operations.
    pub fn add_count(&self, n: i32) {
        self.count.set(self.count.get() + n);
    }

    /// Reports one operation finished with `status` (`uct_invoke_completion`). Transports call
    /// this; the callback runs when the counter reaches zero.
    pub fn complete(&self, status: Status) {
        if status.is_err() && self.status.get() == Status::Ok {
            self.status.set(status);
        }
        let left = self.count.get() - 1;
        self.count.set(left);
        if left == 0 {
            // Take the callback out while it runs so it may re-arm or complete this object.
            let f = self.func.borrow_mut().take();
            if let Some(mut f) = f {
                f(self.status.get());
                let mut slot = self.func.borrow_mut();
                if slot.is_none() {
                    *slot = Some(f);
                }
            }
        }
    }
}

impl fmt::Debug for Completion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion").field("count", &self.count()).field("status", &self.status()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_error_and_callback_once() {
        let fired = Rc::new(Cell::new(0));
        let last = Rc::new(Cell::new(Status::Ok));
        let (f2, l2) = (fired.clone(), last.clone());
        let c = Completion::new(3, move |s| {
            f2.set(f2.get() + 1);
            l2.set(s);
        });
        c.complete(Status::Ok);
        c.complete(Status::IoError);
        assert_eq!(fired.get(), 0);
        c.complete(Status::Canceled);
        assert_eq!(fired.get(), 1);
        assert_eq!(last.get(), Status::IoError);
        c.set_count(1);
        c.complete(Status::Ok);
        assert_eq!(fired.get(), 2);
        assert_eq!(last.get(), Status::Ok);
    }

    #[test]
    fn cyclic_callback_sees_its_own_completion() {
        let seen = Rc::new(Cell::new(false));
        let s = seen.clone();
        let c = Completion::new_cyclic(1, move |me| move |_| s.set(me.upgrade().is_some_and(|m| m.count() == 0)));
        c.complete(Status::Ok);
        assert!(seen.get());
        // The weak handle does not keep it alive.
        let w = Rc::downgrade(&c);
        drop(c);
        assert!(w.upgrade().is_none());
    }
}
