//! The command line against the reference's behaviour.

use super::*;

fn args(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_string).collect()
}

fn run(s: &str) -> PerfParams {
    match parse(&args(s)) {
        Ok(Parsed::Run(p)) => p,
        other => panic!("{s}: {other:?}"),
    }
}

fn err(s: &str) -> String {
    match parse(&args(s)) {
        Err(e) => e,
        other => panic!("{s}: expected an error, got {other:?}"),
    }
}

#[test]
fn defaults_match_the_reference() {
    let p = run("");
    assert!(p.is_server() && !p.has_test);
    assert_eq!(p.msg_sizes, vec![8]);
    assert_eq!((p.iters, p.warmup, p.port, p.fc_window, p.am_hdr_size), (1_000_000, 10_000, 13337, 127, 8));
    assert_eq!(p.percentile, 50.0);
    assert_eq!(p.layout, DataLayout::Short);
    assert_eq!((p.threads, p.thread_mode), (1, ThreadMode::Single));
    assert_eq!(p.max_outstanding, 0, "unresolved without a test");
}

#[test]
fn table_is_in_declaration_order() {
    for (i, k) in TestKind::ALL.iter().enumerate() {
        assert_eq!(*k as usize, i);
        assert_eq!(TestKind::from_name(k.name()), Some(*k));
    }
    assert_eq!(TestKind::AmLat.description(), "UCT active message latency");
    assert_eq!(TestKind::UcpAmBw.description(), "UCP am bandwidth / message rate");
    assert_eq!(TestKind::AmBw.latency_label(), "overhead");
    assert_eq!(TestKind::Get.latency_label(), "latency");
    assert_eq!(TestKind::Fadd.pattern(), Pattern::StreamUni);
    assert_eq!(TestKind::PutLat.command(), Command::Put);
    assert!(TestKind::AddMr.is_uct() && !TestKind::TagLat.is_uct());
}

#[test]
fn loopback_client_and_server() {
    let p = run("-l -t am_lat -x posix -d memory -n 100000");
    assert!(p.loopback && !p.is_server() && p.server.is_none());
    assert_eq!((p.test, p.iters, p.max_outstanding), (TestKind::AmLat, 100_000, 1));
    assert_eq!((p.tl.as_deref(), p.dev.as_deref()), (Some("posix"), Some("memory")));

    // Host name first or last, as getopt permutes.
    let c = run("127.0.0.1 -t am_bw -x posix -d memory -p 23456");
    assert_eq!(c.server.as_deref(), Some("127.0.0.1"));
    assert_eq!(c.port, 23456);
    let c2 = run("-t am_bw -x posix -d memory -p 23456 127.0.0.1");
    assert_eq!(c, c2);

    // A server needs no test: it takes the client's.
    let s = run("-p 23456 -6 -f");
    assert!(s.is_server() && s.ipv6 && s.final_only);
}

#[test]
fn getopt_forms() {
    let p = run("-l -tam_lat -xposix -dmemory -n100 -fvN -s 16,48,8192");
    assert_eq!(p.iters, 100);
    assert!(p.final_only && p.csv && p.numeric);
    assert_eq!(p.msg_sizes, vec![16, 48, 8192]);
    assert_eq!(p.message_size(), 16 + 48 + 8192);
    // The word after an option taking an argument is its argument, even if it looks
    // like an option.
    assert_eq!(err("-l -x posix -d memory -t -n"), format!("invalid test name: '-n' (valid: {})", valid_tests()));
    // `--` ends the options.
    let q = run("-t am_lat -x posix -d memory -- host");
    assert_eq!(q.server.as_deref(), Some("host"));
}

#[test]
fn window_resolution() {
    assert_eq!(run("-l -t tag_bw").max_outstanding, 32);
    assert_eq!(run("-l -t ucp_am_bw").max_outstanding, 32);
    assert_eq!(run("-l -t tag_lat").max_outstanding, 1);
    assert_eq!(run("-l -t tag_bw -O 4").max_outstanding, 4);
    assert_eq!(run("-l -t am_bw -x posix -d memory").max_outstanding, 1);
}

#[test]
fn dash_i_means_extra_info_on_the_command_line() {
    let p = run("-l -t am_lat -x posix -d memory -I");
    assert!(p.extra_info && !p.wakeup);
}

#[test]
fn one_line_errors() {
    let e = err("-t foo");
    assert!(e.starts_with("invalid test name: 'foo' (valid: am_lat, put_lat, add_lat, get,"), "{e}");
    assert!(e.ends_with("ucp_am_lat, ucp_am_bw)"), "{e}");
    assert!(err("-t am_lat -D x").starts_with("invalid data layout 'x' (valid: short, shortiov, bcopy, zcopy"));
    assert_eq!(err("-k"), "invalid option -k (run with -h for help)");
    assert_eq!(err("-t"), "option -t requires an argument (run with -h for help)");
    assert_eq!(err("-n abc"), "invalid value for -n: 'abc' (expected a non-negative integer)");
    assert_eq!(err("-n -5"), "invalid value for -n: '-5' (expected a non-negative integer)");
    assert_eq!(err("-p 70000"), "invalid value for -p: '70000' (expected 0..65535)");
    assert_eq!(err("-R 200"), "invalid percentile rank for -R: '200' (valid: 0.0 to 100.0)");
    assert_eq!(err("-R nan"), "invalid percentile rank for -R: 'nan' (valid: 0.0 to 100.0)");
    assert_eq!(err("-M x"), "invalid thread mode for -M: 'x' (valid: single, serialized, multi)");
    assert!(err("-s 8,x").starts_with("invalid message size list for -s: '8,x'"));
    assert!(err("-s 8,").starts_with("invalid message size list"));
    assert_eq!(err("-m cuda"), "unsupported memory type for -m: 'cuda' (valid: host)");
    assert!(err("-c 1,x").starts_with("invalid cpu list for -c: '1,x'"));
    assert_eq!(
        err("-l -t am_lat localhost"),
        "conflicting arguments: server hostname argument is not allowed in loopback (-l) mode"
    );
    assert!(err("a b").starts_with("unexpected argument 'b'"));
    assert!(err("-l").starts_with("missing test name: use -t <test> (valid: am_lat,"));
    for e in [err("-l"), err("-t foo"), err("-l -t get -x posix -d memory")] {
        assert!(!e.contains('\n'), "one line: {e}");
    }
}

#[test]
fn combinations_the_reference_rejects() {
    // Without -d the caller picks the transport's device.
    assert_eq!(run("-l -t am_lat -x posix").dev, None);
    assert_eq!(
        err("-l -t am_lat -d memory"),
        "a transport must be specified with -x for UCT test 'am_lat' (e.g. -x posix)"
    );
    let base = "-l -x posix -d memory";
    assert!(err(&format!("{base} -t get")).starts_with("data layout 'short' cannot be used for test 'get'"));
    assert!(err(&format!("{base} -t put_lat -D shortiov")).starts_with("data layout 'shortiov' is only for"));
    assert_eq!(err(&format!("{base} -t am_lat -H 4")), "short AM header size must be 8 bytes (-H 4)");
    assert_eq!(err(&format!("{base} -t am_lat -D bcopy -H 16")), "AM header size (16) is larger than message size (8)");
    assert!(err(&format!("{base} -t am_bw -W 128")).starts_with("AM flow-control window (128) too large"));
    assert!(err(&format!("{base} -t am_lat -s 0")).starts_with("message size too small"));
    assert_eq!(err(&format!("{base} -t fadd -s 16")), "invalid message size 16 for atomic test 'fadd' (valid: 4, 8)");
    assert!(err(&format!("{base} -t am_lat -T 2")).starts_with("UCT tests do not support multi-thread"));
    assert_eq!(err(&format!("{base} -t put_bw -s 8,8 -i 4")), "buffer size 8 bigger than stride 4 (-s, -i)");
    // Accepted as the reference accepts them.
    run(&format!("{base} -t get -D bcopy"));
    run(&format!("{base} -t fadd -D bcopy -s 4"));
    run(&format!("{base} -t am_lat -D bcopy -H 0"));
    run(&format!("{base} -t put_bw -W 500"));
    run("-l -t tag_lat -s 0");
    // A server's own test options are not checked: the client's are used.
    run("-t get");
}

#[test]
fn ucp_layouts_and_modes() {
    let p = run("-l -t tag_lat -D iov,contig -M multi -T 2 -A signal -E sleep -r recv_data -C -U -e -z -B -q");
    assert_eq!((p.ucp_send_datatype, p.ucp_recv_datatype), (UcpDatatype::Iov, UcpDatatype::Contig));
    assert_eq!(p.layout, DataLayout::Short, "UCT layout untouched");
    assert_eq!((p.thread_mode, p.threads, p.async_mode), (ThreadMode::Multi, 2, AsyncMode::Signal));
    assert_eq!(p.wait_mode, Some(WaitMode::Sleep));
    assert!(p.stream_recv_data && p.wildcard && p.force_unexpected && p.err_handling);
    assert!(p.prereg && p.map_nonblock && p.quiet);
    assert_eq!(run("-l -t tag_lat -D iov").ucp_recv_datatype, UcpDatatype::Contig);
    let g = run("-l -t stream_bw -D generic,iov");
    assert_eq!((g.ucp_send_datatype, g.ucp_recv_datatype), (UcpDatatype::Generic, UcpDatatype::Iov));
    assert!(err("-l -t tag_lat -D iov,x").starts_with("invalid data layout 'iov,x'"));
    let w = run("-l -t tag_lat -d memory -x posix").warnings();
    assert_eq!(w.len(), 2);
    assert!(w[0].starts_with("-d 'memory' ignored for UCP test"));
}

#[test]
fn help() {
    let Ok(Parsed::Help(h)) = parse(&args("-t am_lat -h")) else { panic!() };
    assert!(h.starts_with("  Usage: ucx-perf [ server-hostname ] [ options ]\n\n  Common options:\n"));
    assert!(h.contains("\n           am_lat - UCT active message latency\n"));
    assert!(h.contains("\n     tag_sync_lat - UCP tag sync match latency\n"));
    assert!(h.contains("     -R <rank>      percentile rank of the percentile data in latency tests (50.0)\n"));
    assert!(h.contains("     -W <count>     flow control window size, for active messages (127)\n"));
    assert!(h.contains("     -H <size>      active message header size (0), not included in message size\n"));
    assert!(h.ends_with("UCX_TLS and UCX_[SELF|SHM|NET]_DEVICES.\n\n"));
    assert!(matches!(parse(&args("--help")), Ok(Parsed::Help(_))));
}

#[test]
fn unknown_resource() {
    let valid = vec!["posix/memory".to_string(), "sysv/memory".to_string()];
    assert_eq!(unknown_resource_error("foo", "bar", &valid), "cannot use foo/bar (valid: posix/memory, sysv/memory)");
    assert_eq!(unknown_resource_error("foo", "bar", &[]), "cannot use foo/bar: no transports are available");
    let devs = vec!["mlx5_0:1".to_string(), "mlx5_1:1".to_string()];
    assert_eq!(
        missing_device_error("rc_verbs", &devs),
        "a device must be specified with -d for transport 'rc_verbs' (valid: mlx5_0:1, mlx5_1:1)"
    );
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> TempDir {
        let d = std::env::temp_dir().join(format!("ucx-perf-opts-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        TempDir(d)
    }
    fn file(&self, name: &str, text: &str) -> String {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn batch_files_merge_over_the_command_line() {
    let d = TempDir::new("merge");
    let f = d.file("b1.txt", "# comment\nlat1 -t am_lat -n 1000\n\n  lat2\t-t put_lat -n 2000 -s 16\r\nbw -t tag_bw\n");
    let p = run(&format!("-l -x posix -d memory -w 5 -b {f}"));
    assert!(!p.has_test);
    let tests = expand_batch(&p).unwrap();
    assert_eq!(tests.len(), 3);
    assert_eq!((tests[0].test, tests[0].iters, tests[0].warmup), (TestKind::AmLat, 1000, 5));
    assert_eq!(tests[0].batch_names, vec!["lat1"]);
    assert_eq!((tests[1].test, tests[1].iters, tests[1].msg_sizes.clone()), (TestKind::PutLat, 2000, vec![16]));
    assert_eq!(tests[2].max_outstanding, 32, "window resolved per line");
    assert_eq!(tests[2].iters, 1_000_000, "lines do not leak into each other");
}

#[test]
fn nested_batch_files() {
    let d = TempDir::new("nested");
    let a = d.file("a.txt", "A1 -t am_lat\nA2 -t put_lat\n");
    let b = d.file("b.txt", "B1 -s 16\nB2 -s 32 -I\n");
    let p = run(&format!("-l -x posix -d memory -b {a} -b {b}"));
    let tests = expand_batch(&p).unwrap();
    let names: Vec<String> = tests.iter().map(|t| t.batch_names.join("/")).collect();
    assert_eq!(names, ["A1/B1", "A1/B2", "A2/B1", "A2/B2"]);
    assert_eq!(tests[3].test, TestKind::PutLat);
    assert_eq!(tests[3].msg_sizes, vec![32]);
    assert!(tests[1].wakeup && !tests[1].extra_info, "-I in a batch file is wakeup");
}

#[test]
fn batch_errors_name_file_and_line() {
    let d = TempDir::new("errors");
    let f = d.file("bad.txt", "ok -t am_lat\nbad -t nope\n");
    let e = expand_batch(&run(&format!("-l -x posix -d memory -b {f}"))).unwrap_err();
    assert!(e.starts_with(&format!("in batch file '{f}' line 2: invalid test name: 'nope'")), "{e}");
    let g = d.file("nt.txt", "x -n 5\n");
    let e = expand_batch(&run(&format!("-l -x posix -d memory -b {g}"))).unwrap_err();
    assert!(e.starts_with(&format!("in batch file '{g}' line 1: missing test name")), "{e}");
    let h = d.file("v.txt", "g -t get\n");
    let e = expand_batch(&run(&format!("-l -x posix -d memory -b {h}"))).unwrap_err();
    assert!(e.starts_with("in batch test 'g': data layout 'short' cannot be used"), "{e}");
    let i = d.file("f.txt", "g -t am_lat -f\n");
    let e = expand_batch(&run(&format!("-l -x posix -d memory -b {i}"))).unwrap_err();
    assert!(e.ends_with("line 1: invalid option -f (run with -h for help)"), "{e}");
    let e = expand_batch(&run("-l -b /nonexistent/ucx-perf-batch")).unwrap_err();
    assert!(e.starts_with("failed to open batch file '/nonexistent/ucx-perf-batch': "), "{e}");
}

#[test]
fn no_batch_expands_to_the_command_line() {
    let p = run("-l -t am_lat -x posix -d memory");
    assert_eq!(expand_batch(&p).unwrap(), vec![p]);
}
