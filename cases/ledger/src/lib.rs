//! Family L: the points ledger on PostgreSQL (SPEC §1–§7), one file per case.
//!
//! Adding a case: copy `l00_template.rs` to `lNN_<what>.rs`, give it its id, title,
//! claim and checks, and add its module name as one line to `register_cases!` below, and
//! its row to `docs/cases.md`.
//! Then `./run.sh --accept LNN` writes its snapshot `evidence/snapshots/L/LNN.snap` for
//! review; commit both. A case that writes the ledger's tables with its own SQL (another
//! locking strategy, say) records each transfer with [`points_ledger::record_transfer`] so
//! that L11 still finds its database clean.

use case_kit::Family;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

pub mod canary;
pub mod http;
mod l00_template;
pub mod modes;
pub mod naive_keyless;
pub mod queries;
pub mod spec_calls;
pub mod spec_crash;
pub mod spec_load;
pub mod spec_locking;
pub mod spec_naive;
pub mod spec_proxy;
pub mod spec_repair;
pub mod spec_service;
pub mod spec_split;
pub mod spec_workers;
pub mod verbs;
pub mod worker;

// One line per case, in id order. The negative controls are public so that a test can
// run them under a plan where their fault cannot happen and see them fail (the controls
// that are spec files, L4-L6, L13, L14, L17, are run from their files:
// `tests/negative_controls.rs`).
case_kit::register_cases! {
    pub l18_stuck_transaction,
    l25_batched_debits,
}

/// The template database every L case database is cloned from.
pub const TEMPLATE_DATABASE: &str = "ledger_template";

/// The family's title.
const TITLE: &str = "points ledger on PostgreSQL (SPEC §1–§7)";

/// The family: its cases, and the off-by-default template `L0` and `CANARY`.
pub fn family() -> Family {
    // The hand-written cases, then the spec files of `specs/` (`L-S1`, …).
    let cases = cases().into_iter().chain(spec_calls::cases()).collect();
    Family {
        extras: vec![l00_template::case(), canary::case()],
        ..Family::on_postgres("L", TITLE, TEMPLATE_DATABASE, install, cases, &verbs::ALL)
    }
}

/// The ledger's schema and seeded accounts (SPEC §2, §6).
fn install(client: &tokio_postgres::Client) -> BoxFuture<'_, anyhow::Result<()>> {
    async move {
        points_ledger::schema::install(client).await?;
        points_ledger::schema::seed(client).await?;
        Ok(())
    }
    .boxed()
}
