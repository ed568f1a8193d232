//! `named_enum!`: declares an enum whose variants have one CLI/TOML/JSON name each, with
//! `ALL`, `name()`, `Display`, `FromStr` (one error naming the flag and the accepted names) and
//! serde in both directions through those names.
//!
//! Not for: values with parameters (see `Checkpoint`).

/// Declares a named enum (see the module header).
macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident, $flag:literal, { $($(#[$vm:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name { $($(#[$vm])* $variant),+ }

        impl $name {
            /// Every value, in the order the CLI lists them.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];
            /// The flag a bad value is reported against.
            pub const FLAG: &'static str = $flag;
            /// The name the CLI, the TOML and the JSON use.
            pub const fn name(self) -> &'static str {
                match self { $($name::$variant => $text),+ }
            }
            /// The accepted names, comma-separated.
            pub fn accepted() -> String {
                $name::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ")
            }
        }
        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }
        impl std::str::FromStr for $name {
            type Err = $crate::StrategyError;
            fn from_str(s: &str) -> Result<Self, $crate::StrategyError> {
                $name::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    $crate::StrategyError::Value {
                        flag: $flag,
                        value: s.to_string(),
                        accepted: $name::accepted(),
                    }
                })
            }
        }
        $crate::named::serde_by_name!($name);
    };
}

/// Serde through `Display` and `FromStr`, so files and JSON use the CLI's names and a bad
/// value in a file gets the same message as on the command line.
macro_rules! serde_by_name {
    ($name:ident) => {
        impl serde::Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }
        impl<'de> serde::Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let text = String::deserialize(d)?;
                text.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub(crate) use named_enum;
pub(crate) use serde_by_name;
