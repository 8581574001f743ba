//! Unused-variable detection as a pure function over (variable names, consulted names).

use ucs::config::{find_unused_env_vars, format_unused_warning, UnusedVar};

const KNOWN: &[&str] = &["UCX_TLS", "UCX_NET_DEVICES", "UCX_MM_FIFO_SIZE", "UCX_POSIX_FIFO_SIZE"];

#[test]
fn reports_only_unconsulted_prefixed_names() {
    let env = ["PATH", "HOME", "UCX_TLS", "UCX_TLSS", "UCX_MM_FIFO_SIZE", "XUCX_TLS", "ucx_tls"];
    let unused = find_unused_env_vars(env, &["UCX_"], KNOWN);
    let names: Vec<&str> = unused.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["UCX_TLSS"]);
    assert_eq!(unused[0].suggestions.first().map(String::as_str), Some("UCX_TLS"));
}

#[test]
fn suggestions_are_close_names_closest_first() {
    let unused = find_unused_env_vars(["UCX_MM_FIFO_SIZ", "UCX_COMPLETELY_DIFFERENT"], &["UCX_"], KNOWN);
    assert_eq!(unused.len(), 2);
    assert_eq!(unused[0].name, "UCX_COMPLETELY_DIFFERENT");
    assert!(unused[0].suggestions.is_empty());
    assert_eq!(unused[1].name, "UCX_MM_FIFO_SIZ");
    assert_eq!(unused[1].suggestions, ["UCX_MM_FIFO_SIZE"]);
}

#[test]
fn ignores_variables_read_outside_tables() {
    let unused = find_unused_env_vars(["UCX_CONFIG_DIR", "UCX_WARN_UNUSED_ENV_VARS"], &["UCX_"], &[]);
    assert!(unused.is_empty(), "{unused:?}");
}

#[test]
fn several_prefixes_and_duplicates() {
    let env = ["MYAPP_UCX_FOO", "UCX_BAR", "UCX_BAR", "OTHER_BAZ"];
    let unused = find_unused_env_vars(env, &["MYAPP_UCX_", "UCX_"], &[]);
    let names: Vec<&str> = unused.iter().map(|u| u.name.as_str()).collect();
    assert_eq!(names, ["MYAPP_UCX_FOO", "UCX_BAR"]);
}

#[test]
fn warning_text() {
    let one = [UnusedVar { name: "UCX_TLSS".into(), suggestions: vec!["UCX_TLS".into()] }];
    assert_eq!(
        format_unused_warning(&one),
        "unused environment variable: UCX_TLSS (maybe: UCX_TLS?)\n\
         (set UCX_WARN_UNUSED_ENV_VARS=n to suppress this warning)"
    );
    let two = [
        UnusedVar { name: "UCX_A".into(), suggestions: vec![] },
        UnusedVar { name: "UCX_B".into(), suggestions: vec![] },
    ];
    assert!(format_unused_warning(&two).starts_with("unused environment variables: UCX_A; UCX_B\n"));
}
