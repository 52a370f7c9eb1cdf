//! The transfer mode of a run that chose none: `cargo test` runs read it from the
//! environment, as the harness's `--transfer-mode` does for its default.

use crate::onetrip::TransferMode;

/// Environment variable naming the transfer mode (`statements` or `onetrip`) of a run
/// that chose none, and the default of the harness's `--transfer-mode`.
pub const TRANSFER_MODE_ENV: &str = "LEDGER_TRANSFER_MODE";

impl TransferMode {
    /// The name under which a run records its transfer mode per case (`results.json`).
    pub const RECORD_NAME: &'static str = "transfer_mode";

    /// The mode named by [`TRANSFER_MODE_ENV`], or the default when it is unset.
    ///
    /// Panics: the variable names no mode (a misconfigured test run; the message names
    /// the variable and the value).
    pub fn from_env() -> TransferMode {
        match std::env::var(TRANSFER_MODE_ENV) {
            Ok(text) => text
                .parse()
                .unwrap_or_else(|error| panic!("{TRANSFER_MODE_ENV}={text:?}: {error}")),
            Err(_) => TransferMode::default(),
        }
    }
}
