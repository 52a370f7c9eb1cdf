//! The case's transfer mode as the ledger spells it: [`case_kit::Ctx::transfer_mode`]
//! (the run's `--transfer-mode`, or `statements` for a case declared
//! [`case_kit::Case::statements_only`]) mapped to [`points_ledger::TransferMode`], for
//! [`points_ledger::transfer_in`], [`points_ledger::debit_in`] and [`points_ledger::grant_in`].

use case_kit::Ctx;
use points_ledger::TransferMode;

/// The ledger's transfer mode for this case.
pub fn mode(ctx: &Ctx) -> TransferMode {
    from_kit(ctx.transfer_mode())
}

/// The kit's name of a mode as the ledger's.
pub fn from_kit(mode: case_kit::TransferMode) -> TransferMode {
    match mode {
        case_kit::TransferMode::Statements => TransferMode::Statements,
        case_kit::TransferMode::OneTrip => TransferMode::OneTrip,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kit's names are the ledger's (the service is started with the kit's name).
    #[test]
    fn the_kit_and_the_ledger_spell_the_modes_alike() {
        for (kit, ledger) in [
            (case_kit::TransferMode::Statements, TransferMode::Statements),
            (case_kit::TransferMode::OneTrip, TransferMode::OneTrip),
        ] {
            assert_eq!(kit.as_str(), ledger.as_str());
        }
    }
}
