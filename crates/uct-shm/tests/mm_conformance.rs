//! The uct conformance kit against `posix` and `sysv`, in one process.

use uct::conformance::{self as kit, Options, Verdict};

fn opts(tl: &str) -> Options {
    uct_shm::register();
    Options::new(&format!("{tl}/memory")).with_scarce_config("FIFO_SIZE", "8")
}

fn run(tl: &str) {
    let results = kit::run_all(&opts(tl));
    for (name, v) in &results {
        match v {
            Verdict::Passed => {}
            Verdict::Skipped(why) => assert_eq!(*name, "am_zcopy_iov", "{tl}: {name} skipped: {why}"),
        }
    }
}

#[test]
fn posix_conformance() {
    run("posix");
}

#[test]
fn sysv_conformance() {
    run("sysv");
}
