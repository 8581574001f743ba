//! Installing the hooks while other threads keep calling the hooked functions, and another
//! keeps forking children that call them: patching must not crash the threads (the patched
//! instruction is replaced whole, behind a short spin) nor leave a child with a half-patched
//! libc (fork waits for a patch in progress), and their calls are reported once the hooks
//! are in.
//!
//! A separate binary: the hooks must not be installed before the test starts.

#![cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]

use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use ucs::memhooks::{self, EventCursor, HooksState};

const PAGE: usize = 4096;

/// One round of every hooked call, on a private mapping.
fn churn() {
    // SAFETY: every call is on the mapping made here.
    unsafe {
        let p = libc::mmap(
            ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        *(p as *mut u8) = 1;
        assert_eq!(libc::madvise(p, PAGE, libc::MADV_DONTNEED), 0);
        let q = libc::mremap(p, 2 * PAGE, 4 * PAGE, libc::MREMAP_MAYMOVE);
        assert_ne!(q, libc::MAP_FAILED);
        let r = libc::mmap(q, PAGE, libc::PROT_READ, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED, -1, 0);
        assert_eq!(r, q);
        assert_eq!(libc::munmap(q, 4 * PAGE), 0);
        assert_eq!(libc::brk(libc::sbrk(0)), 0);
    }
}

/// Forks a child that calls the hooked functions once; true when it exits cleanly.
fn fork_and_churn() -> bool {
    // SAFETY: the child only makes system calls through libc (async-signal-safe) and leaves
    // with `_exit`.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let p = libc::mmap(
                ptr::null_mut(),
                PAGE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            let ok =
                p != libc::MAP_FAILED && libc::madvise(p, PAGE, libc::MADV_DONTNEED) == 0 && libc::munmap(p, PAGE) == 0;
            libc::_exit(if ok { 0 } else { 1 });
        }
        let mut status = 0;
        pid > 0
            && libc::waitpid(pid, &mut status, 0) == pid
            && libc::WIFEXITED(status)
            && libc::WEXITSTATUS(status) == 0
    }
}

#[test]
fn install_while_other_threads_call_the_hooked_functions() {
    assert_eq!(memhooks::status().state, HooksState::NotInstalled);
    let stop = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let (stop, rounds) = (stop.clone(), rounds.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    churn();
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    let forker = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut children = 0u64;
            while !stop.load(Ordering::Relaxed) {
                assert!(fork_and_churn(), "a child failed");
                children += 1;
            }
            children
        })
    };
    let wait_rounds = |n: u64| {
        let target = rounds.load(Ordering::Relaxed) + n;
        while rounds.load(Ordering::Relaxed) < target {
            std::thread::yield_now();
        }
    };
    wait_rounds(2000);
    let before = memhooks::generation();
    memhooks::install().unwrap_or_else(|_| panic!("{}", memhooks::status()));
    let mut cursor = EventCursor::new();
    wait_rounds(2000);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a churning thread failed");
    }
    assert!(forker.join().expect("a child failed") > 0);
    assert!(memhooks::generation() > before + 2000 * 3, "each round reports munmap, madvise, mremap, mmap(FIXED)");
    let mut seen = 0;
    cursor.poll(|_| seen += 1);
    assert!(seen > 0);
}
