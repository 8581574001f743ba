//! Where values come from ([`ConfigSource`]), which variable names a read consults, and the
//! once-per-process warning about `UCX_*` variables that nothing consulted (usually typos).

use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{BuildHasher, Hash};
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;

/// The prefix of every UCX environment variable unless the application chooses another.
pub const DEFAULT_ENV_PREFIX: &str = "UCX_";

/// Variable (after its env prefix) that turns the unused-variable warning off, as in UCX.
const WARN_UNUSED_VAR: &str = "WARN_UNUSED_ENV_VARS";

/// Variables (after the env prefix) that UCX reads outside of any configuration table, so
/// no table ever consults them; warning about them would be a false positive.
const IGNORED_VARS: &[&str] = &["CONFIG_DIR", WARN_UNUSED_VAR];

/// Fuzzy-match radius for "maybe you meant" suggestions, the same as UCX's.
const MAX_SUGGESTION_DISTANCE: usize = 3;

/// A lookup from variable name to value: the process environment ([`ProcessEnv`]), a map,
/// or any `Fn(&str) -> Option<String>`.
pub trait ConfigSource {
    /// The value of variable `name`, if set.
    fn get(&self, name: &str) -> Option<String>;
}

/// The process environment. Values that are not UTF-8 are converted lossily, so they reach
/// the parser (and its error message) instead of looking unset.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProcessEnv;

impl ConfigSource for ProcessEnv {
    fn get(&self, name: &str) -> Option<String> {
        std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
    }
}

impl<F: Fn(&str) -> Option<String>> ConfigSource for F {
    fn get(&self, name: &str) -> Option<String> {
        self(name)
    }
}

impl<K, V, S> ConfigSource for HashMap<K, V, S>
where
    K: Borrow<str> + Hash + Eq,
    V: AsRef<str>,
    S: BuildHasher,
{
    fn get(&self, name: &str) -> Option<String> {
        HashMap::get(self, name).map(|v| v.as_ref().to_string())
    }
}

impl<K: Borrow<str> + Ord, V: AsRef<str>> ConfigSource for BTreeMap<K, V> {
    fn get(&self, name: &str) -> Option<String> {
        BTreeMap::get(self, name).map(|v| v.as_ref().to_string())
    }
}

/// The last component of a composite env prefix (`MYAPP_UCX_` -> `UCX_`), which UCX also
/// searches, with lower precedence, when an application sets its own prefix.
pub(crate) fn sub_prefix(env_prefix: &str) -> Option<&str> {
    let body = env_prefix.strip_suffix('_')?;
    let pos = body.rfind('_')?;
    Some(&env_prefix[pos + 1..])
}

/// Every variable name consulted for field `name`, from highest to lowest precedence:
/// the application's env prefix before its sub-prefix, then the table prefixes in order.
pub(crate) fn candidate_names(env_prefix: &str, prefixes: &[&str], name: &str) -> Vec<String> {
    let mut env_prefixes = vec![env_prefix];
    env_prefixes.extend(sub_prefix(env_prefix));
    let table_prefixes: &[&str] = if prefixes.is_empty() { &[""] } else { prefixes };
    env_prefixes.iter().flat_map(|e| table_prefixes.iter().map(move |p| format!("{e}{p}{name}"))).collect()
}

struct Registry {
    used: BTreeSet<String>,
    env_prefixes: BTreeSet<String>,
}

static REGISTRY: Mutex<Registry> = Mutex::new(Registry { used: BTreeSet::new(), env_prefixes: BTreeSet::new() });

static WARNED: AtomicBool = AtomicBool::new(false);

/// Records that `name` was consulted, so [`warn_unused_env_vars`] does not report it.
/// Table reads do this themselves; call it for variables read directly (`UCX_LOG_LEVEL`).
pub fn mark_env_var_used(name: &str) {
    let mut reg = REGISTRY.lock();
    if !reg.used.contains(name) {
        reg.used.insert(name.to_string());
    }
}

pub(crate) fn mark_env_prefix_used(env_prefix: &str) {
    let mut reg = REGISTRY.lock();
    if !reg.env_prefixes.contains(env_prefix) {
        reg.env_prefixes.insert(env_prefix.to_string());
    }
}

/// Every variable name consulted so far in this process, sorted.
pub fn used_env_vars() -> Vec<String> {
    REGISTRY.lock().used.iter().cloned().collect()
}

/// A set variable that no configuration table consulted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnusedVar {
    /// The variable name, e.g. `UCX_TLSS`.
    pub name: String,
    /// Consulted names within a small edit distance, closest first ("did you mean").
    pub suggestions: Vec<String>,
}

/// The variables in `env_names` that start with one of `env_prefixes` but are not in `known`,
/// sorted by name, each with close `known` names as suggestions. Pure: the core of
/// [`warn_unused_env_vars`].
pub fn find_unused_env_vars<'a>(
    env_names: impl IntoIterator<Item = &'a str>,
    env_prefixes: &[&str],
    known: &[&str],
) -> Vec<UnusedVar> {
    let known_set: BTreeSet<&str> = known.iter().copied().collect();
    let unused: BTreeSet<&str> = env_names
        .into_iter()
        .filter(|name| {
            env_prefixes
                .iter()
                .any(|prefix| name.strip_prefix(prefix).is_some_and(|rest| !IGNORED_VARS.contains(&rest)))
        })
        .filter(|name| !known_set.contains(name))
        .collect();
    unused
        .into_iter()
        .map(|name| {
            let mut close: Vec<(usize, &str)> = known_set
                .iter()
                .map(|k| (edit_distance(name, k), *k))
                .filter(|&(d, _)| d <= MAX_SUGGESTION_DISTANCE)
                .collect();
            close.sort();
            UnusedVar { name: name.to_string(), suggestions: close.into_iter().map(|(_, k)| k.to_string()).collect() }
        })
        .collect()
}

/// The warning text for `unused`, in UCX's wording.
pub fn format_unused_warning(unused: &[UnusedVar]) -> String {
    let items: Vec<String> = unused
        .iter()
        .map(|u| {
            if u.suggestions.is_empty() {
                u.name.clone()
            } else {
                format!("{} (maybe: {}?)", u.name, u.suggestions.join(", "))
            }
        })
        .collect();
    format!(
        "unused environment variable{}: {}\n(set {DEFAULT_ENV_PREFIX}{WARN_UNUSED_VAR}=n to \
         suppress this warning)",
        if unused.len() > 1 { "s" } else { "" },
        items.join("; ")
    )
}

/// Emits one `tracing` warning listing the `UCX_*` variables (and those of any other env
/// prefix a table was read with) set in the process environment that no table consulted,
/// and returns them. Only the first call in a process does anything; later calls return an
/// empty list. `UCX_WARN_UNUSED_ENV_VARS=n` suppresses the check.
pub fn warn_unused_env_vars() -> Vec<UnusedVar> {
    if WARNED.swap(true, Ordering::AcqRel) {
        return Vec::new();
    }
    let switch = format!("{DEFAULT_ENV_PREFIX}{WARN_UNUSED_VAR}");
    mark_env_var_used(&switch);
    if ProcessEnv.get(&switch).and_then(|v| super::types::parse_bool(&v)) == Some(false) {
        return Vec::new();
    }
    let env_names: Vec<String> = std::env::vars_os().map(|(k, _)| k.to_string_lossy().into_owned()).collect();
    let unused = {
        let reg = REGISTRY.lock();
        let mut prefixes: BTreeSet<&str> = reg.env_prefixes.iter().map(String::as_str).collect();
        prefixes.insert(DEFAULT_ENV_PREFIX);
        let all: Vec<&str> = prefixes.iter().flat_map(|p| std::iter::once(*p).chain(sub_prefix(p))).collect();
        let known: Vec<&str> = reg.used.iter().map(String::as_str).collect();
        find_unused_env_vars(env_names.iter().map(String::as_str), &all, &known)
    };
    if !unused.is_empty() {
        tracing::warn!("{}", format_unused_warning(&unused));
    }
    unused
}

/// Levenshtein distance over characters.
pub(crate) fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let substitute = diagonal + usize::from(ca != cb);
            diagonal = row[j + 1];
            row[j + 1] = substitute.min(row[j] + 1).min(diagonal + 1);
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(sub_prefix("UCX_"), None);
        assert_eq!(sub_prefix("MYAPP_UCX_"), Some("UCX_"));
        assert_eq!(sub_prefix("UCX"), None);
        assert_eq!(
            candidate_names("A_UCX_", &["POSIX_", "MM_"], "X"),
            ["A_UCX_POSIX_X", "A_UCX_MM_X", "UCX_POSIX_X", "UCX_MM_X"]
        );
        assert_eq!(candidate_names("UCX_", &[], "X"), ["UCX_X"]);
    }

    #[test]
    fn distance() {
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
        assert_eq!(edit_distance("UCX_TLS", "UCX_TLS"), 0);
    }
}
