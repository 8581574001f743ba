//! [`ConfigError`]: why a configuration could not be read or changed.

use std::fmt;

use crate::Status;

/// A configuration value was rejected, or a field name is unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// A value does not parse as the field's type.
    InvalidValue {
        /// Where the value came from, as the user wrote it: the environment variable
        /// (`UCX_POSIX_FIFO_SIZE`), the field name given to `set`, or `"<FIELD> (default)"`.
        var: String,
        /// The rejected value.
        value: String,
        /// The accepted forms, e.g. `unsigned integer`.
        expected: String,
    },
    /// `set`/`get` named a field the table does not have (UCX: `UCS_ERR_NO_ELEM`).
    UnknownField {
        /// The configuration table (struct) name.
        table: &'static str,
        /// The name that was looked up.
        name: String,
    },
}

impl ConfigError {
    /// The UCX status this error maps to: `InvalidParam` for a bad value, `NoElem` for an
    /// unknown field, as `ucs_config_parser_set_value` reports them.
    pub fn status(&self) -> Status {
        match self {
            ConfigError::InvalidValue { .. } => Status::InvalidParam,
            ConfigError::UnknownField { .. } => Status::NoElem,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::InvalidValue { var, value, expected } => {
                write!(f, "invalid value for {var}: {value:?} (expected: {expected})")
            }
            ConfigError::UnknownField { table, name } => {
                write!(f, "no configuration field {name:?} in {table}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl From<ConfigError> for Status {
    fn from(e: ConfigError) -> Status {
        e.status()
    }
}
