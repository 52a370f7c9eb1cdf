//! The stored spelling of a closed set of names, for every system: an enum with
//! `fn as_str(self) -> &'static str` (the spelling stored in the database and written
//! on the wire) and `const ALL` (every value) gets its `Display` and its `FromStr` from
//! [`name_traits!`], and a refused spelling is one [`UnknownName`].
//!
//! ```
//! #[derive(Debug, Clone, Copy, PartialEq, Eq)]
//! enum Side { Buy, Sell }
//! impl Side {
//!     const ALL: [Side; 2] = [Side::Buy, Side::Sell];
//!     fn as_str(self) -> &'static str {
//!         match self { Side::Buy => "BUY", Side::Sell => "SELL" }
//!     }
//! }
//! enum_names::name_traits!(Side, "side");
//!
//! assert_eq!("SELL".parse::<Side>(), Ok(Side::Sell));
//! assert_eq!(Side::Buy.to_string(), "BUY");
//! let refused = "buy".parse::<Side>().unwrap_err();
//! assert_eq!(refused.to_string(), "unknown side: \"buy\"");
//! ```

/// A spelling that names no value: `what` was being parsed (`"asset"`, `"hook point"`),
/// `input` is the refused text. Displays as `unknown {what}: {input:?}`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what}: {input:?}")]
pub struct UnknownName {
    /// What was being parsed, e.g. `"hook point"`.
    pub what: &'static str,
    /// The refused text.
    pub input: String,
}

/// `Display` for `$ty`: its `as_str()`.
#[macro_export]
macro_rules! display_name {
    ($ty:ident) => {
        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

/// `Display` (its `as_str()`) and `FromStr` for `$ty`: `from_str` accepts exactly the
/// spelling `as_str` gives one of `$ty::ALL` (case-sensitive), else
/// [`UnknownName`] with `what` = `$what`.
#[macro_export]
macro_rules! name_traits {
    ($ty:ident, $what:literal) => {
        $crate::display_name!($ty);

        impl ::std::str::FromStr for $ty {
            type Err = $crate::UnknownName;

            /// The exact spelling of `as_str` (case-sensitive).
            fn from_str(s: &str) -> ::std::result::Result<Self, Self::Err> {
                $ty::ALL
                    .into_iter()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| $crate::UnknownName {
                        what: $what,
                        input: s.to_owned(),
                    })
            }
        }
    };
}
