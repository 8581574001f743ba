//! The process-wide unused-variable warning. One test per binary, because it changes the
//! process environment and the warning fires only once per process.

use ucs::config::{warn_unused_env_vars, Config};

ucs::config_table! {
    /// A table whose variables this test sets.
    struct WarnProbe {
        depth: u32 = ("WARN_PROBE_DEPTH", "1", "Depth"),
    }
}

#[test]
fn warns_once_about_unconsulted_variables() {
    std::env::set_var("UCX_MM_WARN_PROBE_DEPTH", "5");
    std::env::set_var("UCX_MM_WARN_PROBE_DEPT", "5");
    std::env::set_var("UCX_CONFIG_DIR", "/nonexistent");
    let config = WarnProbe::read(&["MM_"]).unwrap();
    assert_eq!(config.depth, 5);

    let unused = warn_unused_env_vars();
    let typo = unused.iter().find(|u| u.name == "UCX_MM_WARN_PROBE_DEPT").expect("the misspelled variable is reported");
    assert_eq!(typo.suggestions.first().map(String::as_str), Some("UCX_MM_WARN_PROBE_DEPTH"));
    assert!(unused.iter().all(|u| u.name != "UCX_MM_WARN_PROBE_DEPTH"));
    assert!(unused.iter().all(|u| u.name != "UCX_CONFIG_DIR"));

    assert!(warn_unused_env_vars().is_empty(), "only the first call reports");
}
