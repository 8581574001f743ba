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
    assert_eq!(ctx(&[("NO_SUCH_OPTION", "1")]).err(), Some(Status::NoElem));
    uct_shm::register();
    assert_eq!(Context::new(&ContextParams::default()).err(), Some(Status::InvalidParam), "no features");
}
