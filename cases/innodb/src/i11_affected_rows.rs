//! I11 — affected rows: changed rows unless the client asks for found rows.
//! Claim: MySQL's protocol reports an UPDATE's affected rows as the rows it *changed*;
//! with the `CLIENT_FOUND_ROWS` capability it reports the rows it *matched*, as
//! PostgreSQL's command tag does (MySQL reference manual, `mysql_affected_rows()`). The
//! product's connections set it, so its "exactly one row" checks hold for an UPDATE that
//! matched its row and left it unchanged. Every statement of the product changes the row
//! it matches (amounts are positive, statuses move forward), so with the default the
//! product would still work; a design that reads "0 rows" as "no such row" would not.
//! Setup: alice deposits 10 000 USDT. An UPDATE that sets alice's USDT row to what it
//! already holds runs on a product connection and on a connection with the client's
//! default options.
//! Checks: the product connection reports 1 row.
//! Negative control: the default connection reports 0 rows for a row that exists, so a
//! check "exactly one row, else missing" calls alice's row missing. Under
//! [`Plan::Harmless`] the UPDATE changes the row (adds 1 unit, then takes it back), both
//! connections report 1, and the control's check must fail.
//! Fails if: the product connection reports 0, or the default connection reports 1 for an
//! unchanged row.

use case_kit::{Case, Ctx};
use frozen_balances::Asset;
use futures_util::FutureExt;
use mysql_async::prelude::Queryable;

use crate::fixtures::{Db, Plan, T, deposit, invariant, line};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "I11",
        "affected rows count changed rows unless CLIENT_FOUND_ROWS: the product asks for matched rows",
        |ctx| run(ctx, Plan::Forced).boxed(),
    )
    .connections(3)
}

/// The case body; under [`Plan::Harmless`] the UPDATE changes the row, so the control
/// must not see 0 rows.
///
/// Errors: SQL errors.
pub async fn run(ctx: &mut Ctx, plan: Plan) -> anyhow::Result<()> {
    let db = Db::open_named(&format!("i_i11_{plan:?}").to_lowercase()).await?;
    let mut product = db.connect().await?;
    let mut plain = db.connect_plain().await?;
    deposit(&mut product, "dep-i1101", "alice", Asset::Usdt, 10_000).await?;
    let step = if plan == Plan::Forced { 0 } else { 1 };
    let sql = "UPDATE balance SET available = available + ? \
               WHERE tenant_id = ? AND account_id = 'alice' AND asset = 'USDT'";
    product.exec_drop(sql, (step, T)).await?;
    let product_rows = product.affected_rows();
    plain.exec_drop(sql, (-step, T)).await?;
    let plain_rows = plain.affected_rows();
    ctx.check_eq(
        "the product's connection (CLIENT_FOUND_ROWS) reports the matched row",
        1,
        product_rows,
    );
    ctx.note(format!(
        "the client's default options report affected_rows={plain_rows} for the same UPDATE"
    ));
    ctx.exposes(
        "without CLIENT_FOUND_ROWS an existing, unchanged row counts 0: \"exactly one row\" calls it missing",
        plain_rows == 0,
        format!("affected_rows={plain_rows}"),
    );
    ctx.check_eq(
        "alice USDT unchanged",
        "available=10000.000000 frozen=0.000000".to_string(),
        line(&mut product, "alice", Asset::Usdt).await?,
    );
    invariant(ctx, &mut product).await?;
    Ok(())
}
