//! `UCX_MEM_EVENTS=n`: no hooks, so caches with the default policy do not cache; the unsafe
//! override (`UCX_RCACHE_UNSAFE_NO_EVENTS=y`) caches anyway and still consumes the events
//! reported by hand. Also: lost events invalidate everything.
//!
//! A separate binary: the variable must be set before the first `install` of the process.

mod rcache_support;

use std::collections::HashMap;
use std::sync::{Mutex, Once};

use rcache_support::{Counting, PAGE};
use ucs::config::Config;
use ucs::memhooks::{self, HooksState};
use ucs::rcache::{Rcache, RcacheConfig, RcacheParams, UnmapEvents};

/// Tests that flood the event ring must not run beside tests that expect hits.
static SERIAL: Mutex<()> = Mutex::new(());

fn setup() -> std::sync::MutexGuard<'static, ()> {
    static ENV: Once = Once::new();
    // Set once, before any test of this binary reads the environment.
    ENV.call_once(|| std::env::set_var("UCX_MEM_EVENTS", "n"));
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

#[test]
fn disabled_hooks_disable_the_cache() {
    let _serial = setup();
    assert!(memhooks::install().is_err());
    let st = memhooks::status();
    assert_eq!(st.state, HooksState::Disabled("disabled by UCX_MEM_EVENTS=n".into()));
    assert!(st.functions.is_empty(), "nothing patched");

    let backend = Counting::default();
    let cache = Rcache::new(backend.clone(), RcacheParams { alignment: PAGE, ..Default::default() }).unwrap();
    assert!(!cache.is_caching());
    assert!(cache.disabled_reason().unwrap().contains("UCX_MEM_EVENTS"));
    let a = backend.hold(cache.get(0x10_0000, PAGE, 0).unwrap());
    let b = backend.hold(cache.get(0x10_0000, PAGE, 0).unwrap());
    assert_ne!(a.id(), b.id(), "every get registers");
    let (ida, idb) = (a.id(), b.id());
    drop(a);
    assert_eq!(backend.deregs(), [ida], "every release deregisters");
    drop(b);
    assert_eq!(backend.deregs(), [ida, idb]);
    assert_eq!(cache.num_regions(), 0);
}

fn override_cache() -> (Rcache<Counting>, Counting) {
    let env = HashMap::from([("UCX_RCACHE_UNSAFE_NO_EVENTS", "y"), ("UCX_RCACHE_ADDR_ALIGN", "4096")]);
    let config = RcacheConfig::read_from(&env, &[""]).unwrap();
    let params = RcacheParams::from_config("override", &config);
    assert_eq!(params.events, UnmapEvents::BestEffort);
    let backend = Counting::default();
    let cache = Rcache::new(backend.clone(), params).unwrap();
    (cache, backend)
}

#[test]
fn unsafe_override_caches_and_consumes_reported_events() {
    let _serial = setup();
    let (cache, backend) = override_cache();
    assert!(cache.is_caching());
    assert!(!cache.has_unmap_events());
    let base = 0x6000_0000_0000;
    let id = cache.get(base, 2 * PAGE, 0).unwrap().reg().id;
    assert_eq!(cache.get(base + PAGE, PAGE, 0).unwrap().reg().id, id, "hit");
    memhooks::report_unmap(base + PAGE, PAGE);
    assert_ne!(cache.get(base, PAGE, 0).unwrap().reg().id, id);
    assert_eq!(backend.deregs(), [id]);
}

#[test]
fn lost_events_invalidate_everything() {
    let _serial = setup();
    let (cache, backend) = override_cache();
    let base = 0x6100_0000_0000;
    let ids: Vec<u64> = (0..4).map(|i| cache.get(base + 4 * i * PAGE, PAGE, 0).unwrap().reg().id).collect();
    // More events than the ring holds, none of them about these regions.
    for i in 0..5000 {
        memhooks::report_unmap(0x7000_0000_0000 + i * PAGE, PAGE);
    }
    cache.poll_events();
    assert_eq!(cache.stats().overflows, 1);
    assert_eq!(cache.num_regions(), 0);
    assert_eq!(backend.deregs(), ids);
}
