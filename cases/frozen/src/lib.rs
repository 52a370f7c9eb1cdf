//! Family F: frozen balances for exchange orders on PostgreSQL (SPEC §8), one file per
//! case. The system is the `frozen-balances` crate, served over HTTP by `ledger-svc`'s
//! spot routes: cases place and cancel orders through the service, as a client would,
//! and reach the database through the library where the case is about the database.
//!
//! Adding a case: a spec file `cases/frozen/specs/fNN_<what>.spec` (the events as `call`
//! steps, [`spec_calls`], their verbs declared in [`verbs`]; found at start-up, no rebuild), or a new file `fNN_<what>.rs`
//! with `pub fn case() -> Case` and one line in `register_cases!` below; then
//! `./run.sh --accept FNN` writes `evidence/snapshots/F/FNN.snap` for review.

use case_kit::Family;
use futures_util::FutureExt;
use futures_util::future::BoxFuture;

pub mod fixtures;
pub mod network;
pub mod spec_calls;
pub mod spec_events;
pub mod spec_locks;
pub mod spec_naive;
pub mod spec_network;
pub mod spec_races;
pub mod spec_settle;
pub mod spec_spot;
pub mod spec_workers;
pub mod spot;
pub mod verbs;

// One line per case, in id order.
case_kit::register_cases! {
    pub f20_borrowed_tenant,
}

/// The template database every F case database is cloned from.
pub const TEMPLATE_DATABASE: &str = "frozen_template";

/// The family's title.
const TITLE: &str = "frozen balances for exchange orders (SPEC §8)";

/// The family.
pub fn family() -> Family {
    // The hand-written cases, then the spec files of `specs/` (`F5`, …).
    let cases = cases().into_iter().chain(spec_calls::cases()).collect();
    Family::on_postgres("F", TITLE, TEMPLATE_DATABASE, install, cases, &verbs::ALL)
}

/// The spot tables and the seeded tenant (sys-deposit, sys-fee, alice, bob).
fn install(client: &tokio_postgres::Client) -> BoxFuture<'_, anyhow::Result<()>> {
    async move {
        frozen_balances::schema::install_and_seed(client).await?;
        Ok(())
    }
    .boxed()
}
