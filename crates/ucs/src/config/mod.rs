//! Declarative configuration read from `UCX_*` environment variables, with UCX's value syntax.
//!
//! A configuration struct is declared with [`config_table!`](crate::config_table): each field
//! names its variable (without prefix), its default in UCX syntax and a doc line. The generated
//! [`Config`] implementation reads the struct from the environment with prefix inheritance
//! (`read(&["POSIX_", "MM_"])`: `UCX_POSIX_X` overrides `UCX_MM_X` overrides the default),
//! from any [`ConfigSource`] instead of the process environment, or with a custom env prefix;
//! changes fields by name ([`Config::set`]); and prints them like `ucx_info -c`/`-f`.
//!
//! Value types implement [`ConfigValue`] (parse, format back, describe the syntax):
//!
//! | Rust type | UCX type | syntax |
//! |---|---|---|
//! | `bool` | `BOOL` | `y/n`, `yes/no`, `on/off`, `1/0` (any case) |
//! | `u8`..`u64`, `usize` | `UINT`/`ULONG` | decimal or `0x` hex; `inf` = the type's maximum |
//! | `i8`..`i64`, `isize` | `INT` | decimal or `0x` hex |
//! | `f64` | `DOUBLE` | floating point number |
//! | `String`, `Vec<T>` | `STRING`, `ARRAY` | text; comma-separated list of `T` |
//! | [`Duration`](std::time::Duration), [`TimeValue`] | `TIME`, `TIME_UNITS` | `<number>[m\|s\|ms\|us\|ns]`; `TimeValue` adds `inf`, `auto` |
//! | [`MemUnits`] | `MEMUNITS` | `<number>[b\|k\|m\|g\|t][b]`, `inf`, `auto` |
//! | [`UlUnits`] | `ULUNITS` | `<number>`, `inf`, `auto` |
//! | [`Bandwidth`] | `BW` | `<number>[T\|G\|M\|K]<B\|b><ps\|/s\|s>`, `auto` |
//! | [`Ternary`], [`TernaryAuto`], [`OnOffAuto`] | `TERNARY[_AUTO]`, `ON_OFF_AUTO` | booleans plus `try`/`maybe`/`auto` |
//! | [`AllowList`] | `ALLOW_LIST` | `all`, `a,b`, `^a,b` (patterns as `fnmatch`) |
//! | [`RangeSpec`], [`AutoOr<T>`] | `RANGE_SPEC`, "auto" variants | `<n>-<m>`; `T` or `auto` |
//! | enums from [`config_enum!`](crate::config_enum) | `ENUM` | one of the declared names (any case) |
//!
//! Every variable name a read consults is recorded; [`warn_unused_env_vars`] reports, once per
//! process, the `UCX_*` variables that nothing consulted (usually typos), with suggestions.
//! Parsing never panics on any input string.

mod env;
mod error;
mod list;
mod macros;
mod print;
mod switch;
mod table;
mod types;
mod units;

pub use env::{
    find_unused_env_vars, format_unused_warning, mark_env_var_used, used_env_vars, warn_unused_env_vars, ConfigSource,
    ProcessEnv, UnusedVar, DEFAULT_ENV_PREFIX,
};
pub use error::ConfigError;
pub use list::{glob_match, AllowList};
pub use print::print_all;
pub use switch::{AutoOr, OnOffAuto, RangeSpec, Ternary, TernaryAuto};
pub use table::{parse_default, Config, ConfigField, ConfigTable};
pub use types::ConfigValue;
pub use units::{Bandwidth, MemUnits, TimeValue, UlUnits};

/// Index of the entry of `names` equal to `s` ignoring ASCII case; used by
/// [`config_enum!`](crate::config_enum).
pub fn parse_enum(s: &str, names: &[&str]) -> Option<usize> {
    names.iter().position(|n| n.eq_ignore_ascii_case(s))
}

/// The syntax of an enum with these names, as UCX prints it: `[a|b|c]`.
pub fn enum_syntax(names: &[&str]) -> String {
    format!("[{}]", names.join("|"))
}
