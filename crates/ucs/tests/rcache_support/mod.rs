//! A registration backend for the rcache tests: records every call, touches no memory, and
//! checks the backend contract itself (each registration deregistered once, never while the
//! test still holds a handle to it).

#![allow(dead_code)] // each test binary uses part of it

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use ucs::rcache::{RcacheHandle, RegBackend, RegRequest};
use ucs::Status;

/// A registration: its id in the log.
#[derive(Debug, PartialEq, Eq)]
pub struct TestReg {
    pub id: u64,
}

/// Everything the backend saw.
#[derive(Debug, Default)]
pub struct Log {
    next_id: u64,
    /// Live registrations by id.
    pub live: BTreeMap<u64, RegRequest>,
    /// Every successful registration, in order.
    pub registered: Vec<(u64, RegRequest)>,
    /// Every deregistered id, in order.
    pub deregistered: Vec<u64>,
    /// Handles the test holds, by registration id (kept up to date by [`Held`]).
    pub held: BTreeMap<u64, usize>,
    /// Fail every registration with this status.
    pub fail: Option<Status>,
}

/// The backend; clones share the log.
#[derive(Clone, Debug, Default)]
pub struct Counting(pub Rc<RefCell<Log>>);

impl RegBackend for Counting {
    type Reg = TestReg;

    fn register(&self, req: &RegRequest) -> Result<TestReg, Status> {
        let mut log = self.0.borrow_mut();
        if let Some(status) = log.fail {
            return Err(status);
        }
        log.next_id += 1;
        let id = log.next_id;
        log.live.insert(id, *req);
        log.registered.push((id, *req));
        Ok(TestReg { id })
    }

    fn deregister(&self, reg: TestReg) {
        let mut log = self.0.borrow_mut();
        assert!(log.live.remove(&reg.id).is_some(), "registration {} deregistered twice", reg.id);
        assert_eq!(log.held.get(&reg.id).copied().unwrap_or(0), 0, "registration {} deregistered while in use", reg.id);
        log.deregistered.push(reg.id);
    }
}

impl Counting {
    /// Number of successful registrations.
    pub fn regs(&self) -> usize {
        self.0.borrow().registered.len()
    }

    /// Deregistered ids, in order.
    pub fn deregs(&self) -> Vec<u64> {
        self.0.borrow().deregistered.clone()
    }

    /// True while `id` is registered.
    pub fn is_live(&self, id: u64) -> bool {
        self.0.borrow().live.contains_key(&id)
    }

    /// Wraps a handle so the log knows the test holds it.
    pub fn hold(&self, h: RcacheHandle<Counting>) -> Held {
        *self.0.borrow_mut().held.entry(h.reg().id).or_default() += 1;
        Held { log: self.0.clone(), handle: Some(h) }
    }
}

/// A handle the test holds; dropping it tells the log first.
pub struct Held {
    log: Rc<RefCell<Log>>,
    handle: Option<RcacheHandle<Counting>>,
}

impl Held {
    /// The handle.
    pub fn h(&self) -> &RcacheHandle<Counting> {
        self.handle.as_ref().expect("held")
    }

    /// Registration id.
    pub fn id(&self) -> u64 {
        self.h().reg().id
    }
}

impl Clone for Held {
    fn clone(&self) -> Self {
        let h = self.h().clone();
        *self.log.borrow_mut().held.entry(h.reg().id).or_default() += 1;
        Held { log: self.log.clone(), handle: Some(h) }
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            if let Some(n) = self.log.borrow_mut().held.get_mut(&h.reg().id) {
                *n -= 1;
            }
            drop(h);
        }
    }
}

/// Page size of the tests.
pub const PAGE: usize = 4096;
