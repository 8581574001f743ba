//! `ucx-perf` as a two-rank job of the launchers users have: MPICH's `mpiexec` (hydra, PMI-1
//! over `PMI_FD`) and Open MPI's `mpirun` (PMIx, `libpmix.so.2` loaded at run time), from
//! Debian's packages `mpich`, `openmpi-bin` and `libpmix2` (`.ci/run` installs them). Where a
//! launcher is not installed the test says so and passes, except under `CI`, where it fails.
//!
//! Checks: both ranks exit cleanly, exactly one final report (rank 1's) with the iterations
//! asked for, a job of the wrong size fails with a message naming it, and a bogus `PMI_FD` is a
//! clear error.

mod common;

use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

/// The jobs busy-poll: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// `program` if it is on the path; under CI its absence is a failure.
fn launcher(program: &str) -> Option<&str> {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !found {
        assert!(std::env::var_os("CI").is_none(), "{program} is not installed (.ci/run installs it)");
        eprintln!("{program} is not installed: skipped (apt-get install mpich openmpi-bin libpmix2)");
        return None;
    }
    Some(program)
}

/// Runs `launcher args... ucx-perf perf_args...` with `UCX_TLS=tls`.
fn job(launcher: &str, launcher_args: &[&str], perf_args: &[&str], tls: &str) -> std::process::Output {
    let mut c = Command::new(launcher);
    c.args(launcher_args)
        .arg(env!("CARGO_BIN_EXE_ucx-perf"))
        .args(perf_args)
        .env("UCX_TLS", tls)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    common::finish(c.spawn().expect("start the launcher"), Duration::from_secs(300))
}

fn check_job(launcher: &str, launcher_args: &[&str], tls: &str) {
    for test in ["tag_lat", "tag_bw"] {
        let out = job(launcher, launcher_args, &["-t", test, "-n", "2000", "-f"], tls);
        let text = String::from_utf8_lossy(&out.stdout);
        let what = format!("{launcher} {test} over {tls}");
        assert!(out.status.success(), "{what}: {}\n{text}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        let finals: Vec<&str> = text.lines().filter(|l| l.split_whitespace().count() == 8).collect();
        assert_eq!(finals.len(), 1, "{what}: one final report, from rank 1:\n{text}");
        let n = common::final_numbers(&out);
        assert_eq!(n.first(), Some(&2000.0), "{what}: iterations\n{text}");
        assert!(n.iter().all(|v| v.is_finite() && *v >= 0.0), "{what}: {n:?}");
        eprintln!("{what}: {n:?}");
    }
}

#[test]
fn mpich_hydra_mpiexec_runs_a_two_rank_job() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = launcher("mpiexec.hydra") else { return };
    check_job(l, &["-n", "2"], "shm");
    check_job(l, &["-n", "2"], "tcp");
    let out = job(l, &["-n", "3"], &["-t", "tag_lat", "-n", "100"], "shm");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("job of 2 ranks; PMI-1 started 3"), "{err}");
}

#[test]
fn open_mpi_mpirun_runs_a_two_rank_job() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(l) = launcher("mpirun.openmpi") else { return };
    // Root in CI: Open MPI wants to be told; two ranks on a machine with two cores.
    check_job(l, &["--allow-run-as-root", "--oversubscribe", "-n", "2"], "shm");
}

#[test]
fn a_bogus_pmi_fd_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ucx-perf"))
        .args(["-t", "tag_lat"])
        .env("PMI_FD", "1000")
        .env("PMI_RANK", "0")
        .env("PMI_SIZE", "2")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("PMI_FD=1000 is not an open socket"), "{err}");
}
