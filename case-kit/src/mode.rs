//! How the run's ledger transfers reach the database (`./run.sh --transfer-mode`): the
//! SPEC §3 transaction of separate statements, or the same work in one server-side
//! statement (`points_ledger::transfer_onetrip`). A run has one mode; a case that needs an
//! open transaction at a hook point declares [`crate::Case::statements_only`] and keeps
//! the statement mode whatever the run's. The mode never shows in a transcript, so the
//! snapshots of both modes are the same files.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;

/// Environment variable that sets the mode of `cargo test` runs ([`Env::for_tests`]) and
/// the default of the harness's `--transfer-mode`.
///
/// [`Env::for_tests`]: crate::Env::for_tests
pub const TRANSFER_MODE_ENV: &str = "LEDGER_TRANSFER_MODE";

/// The transfer mode of a run (mirrors `points_ledger::TransferMode`, whose names it uses;
/// the kit does not depend on the ledger).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum TransferMode {
    /// One transaction of separate statements, every hook point (`statements`).
    #[default]
    Statements,
    /// One statement per transfer; only the `after-commit` hook point (`onetrip`).
    OneTrip,
}

impl TransferMode {
    /// The spelling of `--transfer-mode` and of `ledger-svc --transfer-mode`.
    pub fn as_str(self) -> &'static str {
        match self {
            TransferMode::Statements => "statements",
            TransferMode::OneTrip => "onetrip",
        }
    }

    /// The mode named by [`TRANSFER_MODE_ENV`], or the default when it is unset.
    ///
    /// Errors: the variable names no mode.
    pub fn from_env() -> anyhow::Result<TransferMode> {
        match std::env::var(TRANSFER_MODE_ENV) {
            Ok(text) => text.parse(),
            Err(_) => Ok(TransferMode::default()),
        }
    }
}

impl fmt::Display for TransferMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TransferMode {
    type Err = anyhow::Error;

    fn from_str(text: &str) -> anyhow::Result<TransferMode> {
        [TransferMode::Statements, TransferMode::OneTrip]
            .into_iter()
            .find(|mode| mode.as_str() == text)
            .ok_or_else(|| {
                anyhow::anyhow!("unknown transfer mode {text:?} (statements or onetrip)")
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for mode in [TransferMode::Statements, TransferMode::OneTrip] {
            assert_eq!(mode.as_str().parse::<TransferMode>().unwrap(), mode);
        }
        assert!("one-trip".parse::<TransferMode>().is_err());
    }
}
