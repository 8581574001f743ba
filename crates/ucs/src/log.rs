//! Logging: UCX's `UCX_LOG_LEVEL` mapped onto `tracing`.
//!
//! Libraries log through `tracing` and never install a subscriber. Binaries call `init()`
//! (feature `log-init`), which reads `UCX_LOG_LEVEL` (`fatal`, `error`, `warn`, `diag`, `info`,
//! `debug`, `trace`, ...; default `warn`) and prints to stderr.

use tracing::Level;

/// The `tracing` level for a UCX log level name (case-insensitive), or `None` if unknown.
pub fn level_from_ucx(name: &str) -> Option<Level> {
    Some(match name.to_ascii_lowercase().as_str() {
        "fatal" | "error" => Level::ERROR,
        "warn" | "warning" => Level::WARN,
        "diag" | "info" | "print" => Level::INFO,
        "debug" => Level::DEBUG,
        "trace" | "req" | "data" | "async" | "func" | "poll" => Level::TRACE,
        _ => return None,
    })
}

/// Installs a stderr subscriber at the level `UCX_LOG_LEVEL` names (default `warn`). An
/// invalid value is reported and the default used. Does nothing if a subscriber exists.
#[cfg(feature = "log-init")]
pub fn init() {
    let var = "UCX_LOG_LEVEL";
    crate::config::mark_env_var_used(var);
    let raw = std::env::var(var).ok();
    let level = match raw.as_deref().map(|v| (v, level_from_ucx(v))) {
        None => Level::WARN,
        Some((_, Some(l))) => l,
        Some((v, None)) => {
            eprintln!(
                "invalid value for {var}: {v:?} (expected: fatal, error, warn, diag, info, debug, trace); using warn"
            );
            Level::WARN
        }
    };
    let _ = tracing_subscriber::fmt().with_max_level(level).with_writer(std::io::stderr).with_target(false).try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ucx_names() {
        assert_eq!(level_from_ucx("WARN"), Some(Level::WARN));
        assert_eq!(level_from_ucx("diag"), Some(Level::INFO));
        assert_eq!(level_from_ucx("func"), Some(Level::TRACE));
        assert_eq!(level_from_ucx("loud"), None);
    }
}
