//! Context creation: transport selection by UCX_TLS (with aliases and deny lists) and the device
//! lists, over the transports this machine really has (self, posix, sysv, cma).

use ucp::{Context, ContextParams, Features, Status};

fn tls(ctx: &Context) -> Vec<String> {
    let mut v: Vec<String> = ctx.resources().iter().map(|r| r.desc.tl.tl_name.clone()).collect();
    v.sort();
    v.dedup();
    v
}

fn ctx(cfg: &[(&str, &str)]) -> Result<Context, Status> {
    uct_shm::register();
    let mut p = ContextParams::new(Features::TAG);
    for (k, v) in cfg {
        p = p.with_config(k, v);
    }
    Context::new(&p)
}

fn cma_here() -> bool {
    uct_shm::register();
    !uct::unavailable_components().iter().any(|(n, _)| *n == "cma")
}

#[test]
fn all_by_default() {
    let c = ctx(&[("TLS", "all")]).unwrap();
    let t = tls(&c);
    for tl in ["posix", "self", "sysv"] {
        assert!(t.contains(&tl.to_string()), "{tl} missing from {t:?}");
    }
    assert!(c.not_available().is_empty());
}

#[test]
fn aliases_and_names() {
    let mut shm = vec!["posix", "self", "sysv"];
    if cma_here() {
        shm.insert(0, "cma");
    }
    assert_eq!(tls(&ctx(&[("TLS", "shm")]).unwrap()), shm);
    assert_eq!(tls(&ctx(&[("TLS", "sm")]).unwrap()), shm);
    assert_eq!(tls(&ctx(&[("TLS", "mm")]).unwrap()), ["posix", "self", "sysv"]);
    assert_eq!(tls(&ctx(&[("TLS", "posix")]).unwrap()), ["posix", "self"], "self stays for loopback");
    assert_eq!(tls(&ctx(&[("TLS", "^sysv,cma")]).unwrap()), ["posix", "self"]);
    assert_eq!(tls(&ctx(&[("TLS", "\\posix")]).unwrap()), ["posix", "self"]);
}

#[test]
fn unavailable_transports_are_reported_not_fatal() {
    let c = ctx(&[("TLS", "posix,rc_v,nosuch")]).unwrap();
    assert_eq!(tls(&c), ["posix", "self"]);
    let names: Vec<&str> = c.not_available().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["rc_v", "nosuch"]);
}

#[test]
fn device_lists_filter() {
    assert_eq!(tls(&ctx(&[("SHM_DEVICES", "nosuchdev")]).unwrap()), ["self"]);
    assert_eq!(ctx(&[("SHM_DEVICES", "nosuchdev"), ("SELF_DEVICES", "nosuchdev")]).err(), Some(Status::NoDevice));
    assert!(tls(&ctx(&[("TLS", "shm"), ("SELF_DEVICES", "memory0")]).unwrap()).contains(&"self".into()));
}

#[test]
fn bad_config_is_an_error_naming_it() {
    assert_eq!(ctx(&[("RNDV_THRESH", "lots")]).err(), Some(Status::InvalidParam));
    // As UCX: a name neither UCP nor a transport in use has is reported (a warning), not fatal.
    assert!(ctx(&[("NO_SUCH_OPTION", "1")]).is_ok());
    uct_shm::register();
    assert_eq!(Context::new(&ContextParams::default()).err(), Some(Status::InvalidParam), "no features");
}

/// Transport settings given to the context (`ucp_config_modify`) reach the transport whose
/// prefix they carry: `SELF_SEG_SIZE` shrinks self's messages, so a 2000-byte send goes in
/// fragments; a bad value fails that transport's interface, with an error naming it.
#[test]
fn transport_settings_pass_through() {
    use ucp::{Worker, WorkerParams};
    let eager_multi = |seg: Option<&str>| {
        let mut cfg = vec![("TLS", "self")];
        if let Some(s) = seg {
            cfg.push(("SELF_SEG_SIZE", s));
        }
        let w = Worker::new(&ctx(&cfg).unwrap(), &WorkerParams::new("w"))?;
        let ep = w.ep_create(w.address()).unwrap();
        let data = vec![5u8; 2000];
        let mut buf = vec![0u8; 2000];
        // SAFETY: `buf` outlives the request, waited for below.
        let r = unsafe { w.tag_recv_nbx(ucp::RecvData::Contig(&mut buf), 1, ucp::FULL_MASK, ucp::RequestParam::new()) };
        ep.tag_send_blocking(&data, 1).unwrap();
        r.unwrap().wait().unwrap();
        assert!(buf == data);
        Ok::<u64, Status>(w.proto_counts().eager_multi)
    };
    assert_eq!(eager_multi(None), Ok(0));
    assert!(eager_multi(Some("1k")).unwrap() > 0, "SELF_SEG_SIZE=1k was not applied");
    assert_eq!(eager_multi(Some("lots")).err(), Some(Status::NoDevice), "self cannot open with a bad segment size");
}
