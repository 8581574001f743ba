//! Declarative tables: [`ConfigField`] binds a variable name, default and doc line to one
//! field of a struct; [`Config`] reads, changes and prints a whole struct through its table.
//! The [`config_table!`](crate::config_table) macro generates both for a struct.

use super::env::{self, ConfigSource, ProcessEnv, DEFAULT_ENV_PREFIX};
use super::{print, ConfigError, ConfigValue};

/// One configuration option of struct `T`.
pub struct ConfigField<T> {
    /// Variable name without any prefix, e.g. `FIFO_SIZE`.
    pub name: &'static str,
    /// Default value in UCX syntax.
    pub default: &'static str,
    /// Documentation shown by [`Config::print`]; may span several lines.
    pub doc: &'static str,
    /// Accepted syntax of the field's type ([`ConfigValue::syntax`]).
    pub syntax: fn() -> String,
    /// Parses a value and stores it into the field; on failure returns the accepted forms.
    pub parse: fn(&mut T, &str) -> Result<(), String>,
    /// Formats the field's current value.
    pub format: fn(&T) -> String,
}

impl<T> std::fmt::Debug for ConfigField<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConfigField").field("name", &self.name).field("default", &self.default).finish_non_exhaustive()
    }
}

/// The options of one configuration struct.
#[derive(Debug)]
pub struct ConfigTable<T: 'static> {
    /// The struct's name, used in print headers and errors.
    pub name: &'static str,
    /// Every option, in declaration order.
    pub fields: &'static [ConfigField<T>],
}

impl<T> ConfigTable<T> {
    /// The field called `name` (exact, case-sensitive).
    pub fn field(&self, name: &str) -> Option<&'static ConfigField<T>> {
        self.fields.iter().find(|f| f.name == name)
    }
}

/// Parses the default value of a field; used by code that [`config_table!`](crate::config_table)
/// generates.
pub fn parse_default<V: ConfigValue>(name: &str, default: &str) -> Result<V, ConfigError> {
    V::parse_value(default).map_err(|expected| ConfigError::InvalidValue {
        var: format!("{name} (default)"),
        value: default.to_string(),
        expected,
    })
}

/// A configuration struct backed by a [`ConfigTable`]; implemented by
/// [`config_table!`](crate::config_table).
///
/// Reads look up `<env prefix><table prefix><NAME>` for each table prefix, most specific
/// first, and fall back to the field's default: `MmIfaceConfig::read(&["POSIX_", "MM_"])`
/// takes `UCX_POSIX_FIFO_SIZE`, else `UCX_MM_FIFO_SIZE`, else the default. An empty prefix
/// list means `&[""]` (plain `UCX_<NAME>`). With a composite env prefix such as
/// `MYAPP_UCX_`, its last component (`UCX_`) is searched too, after the full one.
pub trait Config: Sized + Clone + 'static {
    /// The struct's option table.
    fn table() -> &'static ConfigTable<Self>;

    /// The struct with every field at its default; fails only if a default string in the
    /// table does not parse (a bug in the table, caught by any test that builds it).
    fn try_default() -> Result<Self, ConfigError>;

    /// Reads from the process environment under the `UCX_` prefix.
    fn read(prefixes: &[&str]) -> Result<Self, ConfigError> {
        Self::read_with(&ProcessEnv, DEFAULT_ENV_PREFIX, prefixes)
    }

    /// Reads from `source` instead of the process environment, under the `UCX_` prefix.
    fn read_from(source: &dyn ConfigSource, prefixes: &[&str]) -> Result<Self, ConfigError> {
        Self::read_with(source, DEFAULT_ENV_PREFIX, prefixes)
    }

    /// Reads from `source` with a custom env prefix (UCX's `env_prefix`, e.g. `MYAPP_UCX_`).
    ///
    /// The most specific variable that is set decides; less specific ones are not parsed.
    /// Every candidate name is recorded as consulted for [`warn_unused_env_vars`](super::warn_unused_env_vars),
    /// and the table is registered for [`print_all`](super::print_all).
    fn read_with(source: &dyn ConfigSource, env_prefix: &str, prefixes: &[&str]) -> Result<Self, ConfigError> {
        let mut config = Self::try_default()?;
        env::mark_env_prefix_used(env_prefix);
        print::register::<Self>(env_prefix, prefixes);
        for field in Self::table().fields {
            let mut found = None;
            for var in env::candidate_names(env_prefix, prefixes, field.name) {
                env::mark_env_var_used(&var);
                if found.is_none() {
                    found = source.get(&var).map(|value| (var, value));
                }
            }
            if let Some((var, value)) = found {
                (field.parse)(&mut config, &value).map_err(|expected| ConfigError::InvalidValue {
                    var,
                    value,
                    expected,
                })?;
            }
        }
        Ok(config)
    }

    /// Changes one field by name (without prefix), like `ucs_config_parser_set_value`;
    /// used for programmatic overrides of a read configuration. On error the field keeps
    /// its previous value.
    fn set(&mut self, name: &str, value: &str) -> Result<(), ConfigError> {
        let field = Self::table()
            .field(name)
            .ok_or_else(|| ConfigError::UnknownField { table: Self::table().name, name: name.to_string() })?;
        (field.parse)(self, value).map_err(|expected| ConfigError::InvalidValue {
            var: name.to_string(),
            value: value.to_string(),
            expected,
        })
    }

    /// The current value of one field by name, in UCX syntax (`ucs_config_parser_get_value`).
    fn get(&self, name: &str) -> Result<String, ConfigError> {
        Self::table()
            .field(name)
            .map(|field| (field.format)(self))
            .ok_or_else(|| ConfigError::UnknownField { table: Self::table().name, name: name.to_string() })
    }

    /// Every option as `UCX_<prefix><NAME>=<value>` lines, like `ucx_info -c`; with
    /// `with_docs`, each preceded by its doc lines and syntax as `#` comments (`ucx_info -f`).
    fn print(&self, prefix: &str, with_docs: bool) -> String {
        self.print_with(DEFAULT_ENV_PREFIX, &[prefix], with_docs)
    }

    /// Like [`print`](Config::print) with a custom env prefix; names use the first table
    /// prefix, and the documentation lists the others under `inherits:`.
    fn print_with(&self, env_prefix: &str, prefixes: &[&str], with_docs: bool) -> String {
        print::print_table(self, env_prefix, prefixes, with_docs)
    }
}
