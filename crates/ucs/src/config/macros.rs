//! `config_table!` and `config_enum!`: declare a configuration struct or a value enum in a
//! few lines.

/// Declares a configuration struct and its option table.
///
/// Each field is `name: Type = ("VAR_NAME", "default", "doc line")`; `Type` implements
/// [`ConfigValue`](crate::config::ConfigValue). The doc line becomes the field's rustdoc and
/// its `ucx_info -f` text; more rustdoc may follow as `///` comments. The macro derives
/// `Clone`, `Debug` and `PartialEq`, implements [`Config`](crate::config::Config) and
/// `Default` (which panics only if a default string is invalid: a bug in the table).
///
/// ```
/// use ucs::config::{AllowList, Config, MemUnits};
///
/// ucs::config_table! {
///     /// Posix shared-memory iface configuration.
///     pub struct MmIfaceConfig {
///         pub fifo_size: u32 = ("FIFO_SIZE", "64", "Size of the receive FIFO."),
///         pub seg_size: MemUnits = ("SEG_SIZE", "8256", "Size of send/receive segment."),
///         pub alloc: AllowList = ("ALLOC", "md,mmap,heap", "Allocation methods to try."),
///     }
/// }
///
/// let env = std::collections::HashMap::from([("UCX_MM_FIFO_SIZE", "256")]);
/// let config = MmIfaceConfig::read_from(&env, &["POSIX_", "MM_"]).unwrap();
/// assert_eq!(config.fifo_size, 256);
/// assert_eq!(config.seg_size, MemUnits::Value(8256));
/// assert!(config.alloc.allows("mmap"));
/// ```
#[macro_export]
macro_rules! config_table {
    (
        $(#[$struct_meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field_vis:vis $field:ident : $ty:ty = ($var:expr, $default:expr, $doc:expr $(,)?)
            ),* $(,)?
        }
    ) => {
        $(#[$struct_meta])*
        #[derive(Clone, Debug, PartialEq)]
        $vis struct $name {
            $(
                #[doc = $doc]
                $(#[$field_meta])*
                $field_vis $field: $ty,
            )*
        }

        impl $crate::config::Config for $name {
            fn table() -> &'static $crate::config::ConfigTable<Self> {
                static TABLE: $crate::config::ConfigTable<$name> = $crate::config::ConfigTable {
                    name: ::core::stringify!($name),
                    fields: &[$(
                        $crate::config::ConfigField {
                            name: $var,
                            default: $default,
                            doc: $doc,
                            syntax: <$ty as $crate::config::ConfigValue>::syntax,
                            parse: |config: &mut $name, value: &str| {
                                config.$field =
                                    <$ty as $crate::config::ConfigValue>::parse_value(value)?;
                                ::core::result::Result::Ok(())
                            },
                            format: |config: &$name| {
                                <$ty as $crate::config::ConfigValue>::format_value(&config.$field)
                            },
                        },
                    )*],
                };
                &TABLE
            }

            fn try_default() -> ::core::result::Result<Self, $crate::config::ConfigError> {
                ::core::result::Result::Ok(Self {
                    $( $field: $crate::config::parse_default::<$ty>($var, $default)?, )*
                })
            }
        }

        impl ::core::default::Default for $name {
            fn default() -> Self {
                match <Self as $crate::config::Config>::try_default() {
                    ::core::result::Result::Ok(config) => config,
                    ::core::result::Result::Err(e) => ::core::panic!("{}", e),
                }
            }
        }
    };
}

/// Declares an enum whose variants are selected by name in configuration values
/// (`UCS_CONFIG_TYPE_ENUM`), matched case-insensitively and printed as declared.
///
/// Derives `Clone`, `Copy`, `Debug`, `PartialEq`, `Eq`, `Hash`; adds `ALL`, `NAMES`,
/// `name()`, `Display` and a [`ConfigValue`](crate::config::ConfigValue) implementation. Each
/// variant's rustdoc starts with its configuration name.
///
/// ```
/// use ucs::config::ConfigValue;
///
/// ucs::config_enum! {
///     /// Rendezvous protocol.
///     pub enum RndvScheme { Auto = "auto", GetZcopy = "get_zcopy", PutZcopy = "put_zcopy" }
/// }
///
/// assert_eq!(RndvScheme::parse_value("GET_ZCOPY"), Ok(RndvScheme::GetZcopy));
/// assert_eq!(RndvScheme::PutZcopy.format_value(), "put_zcopy");
/// assert_eq!(RndvScheme::syntax(), "[auto|get_zcopy|put_zcopy]");
/// ```
#[macro_export]
macro_rules! config_enum {
    (
        $(#[$enum_meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$variant_meta:meta])* $variant:ident = $text:literal ),+ $(,)?
        }
    ) => {
        $(#[$enum_meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        $vis enum $name {
            $(
                #[doc = ::core::concat!("`", $text, "`")]
                $(#[$variant_meta])*
                $variant,
            )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The configuration names of [`Self::ALL`], in the same order.
            pub const NAMES: &'static [&'static str] = &[$($text),+];

            /// The variant's configuration name.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl ::core::fmt::Display for $name {
            fn fmt(&self, f: &mut ::core::fmt::Formatter<'_>) -> ::core::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl $crate::config::ConfigValue for $name {
            fn parse_value(
                s: &str,
            ) -> ::core::result::Result<Self, ::std::string::String> {
                $crate::config::parse_enum(s, Self::NAMES)
                    .and_then(|index| Self::ALL.get(index).copied())
                    .ok_or_else(<Self as $crate::config::ConfigValue>::syntax)
            }

            fn format_value(&self) -> ::std::string::String {
                ::std::string::ToString::to_string(self.name())
            }

            fn syntax() -> ::std::string::String {
                $crate::config::enum_syntax(Self::NAMES)
            }
        }
    };
}
