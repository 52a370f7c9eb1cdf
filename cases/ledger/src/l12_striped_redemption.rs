//! L12 — striped redemption: ledger-svc with `--redeem-stripes 8` credits each debit to
//! `sys-redeem-NN` (chosen from the debited account) instead of the one `sys-redeem` row,
//! the hot row every debit otherwise locks until COMMIT (`./run.sh bench` measures it).
//! Claim: the mode keeps every invariant: no overdraft under concurrent debits, replays
//! unchanged (the stripe is a pure function of the account, so the fingerprint is
//! stable), nothing reaches the plain `sys-redeem` row, the stripes together hold exactly
//! what was debited, and the reconciliation finds nothing.
//! Fails if: any count or sum differs, a replay is not replayed, or reconciliation has
//! findings.

use std::collections::BTreeSet;

use futures_util::FutureExt;
use points_ledger::SYS_REDEEM;
use points_ledger::striping::{redeem_account_for, total_redeemed};
use tokio_postgres::Client;

use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{Reply, Service, ServiceOptions};

use super::http::{LedgerCalls, LedgerReply};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L12",
        "striped redemption: ledger-svc --redeem-stripes 8 keeps every invariant",
        |ctx| run(ctx).boxed(),
    )
    .connections(20)
}

const STRIPES: u32 = 8;
const ACCOUNTS: u32 = 10;
const GRANT: i64 = 100;
const DEBIT: i64 = 30;
/// Concurrent debits per account: floor(100/30) = 3 succeed, 1 is refused.
const DEBITS_PER_ACCOUNT: u32 = 4;
const CLIENT: &str = "app-l12";
/// Debits answered 201: 10 * floor(100/30).
const EXPECTED_OK: usize = (ACCOUNTS * (GRANT / DEBIT) as u32) as usize;

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let db = ctx.connect().await?;
    let accounts: Vec<String> = (1..=ACCOUNTS).map(points_ledger::test_account).collect();
    for account in &accounts {
        service
            .grant("ops", &format!("g-12-{account}"), account, GRANT)
            .await?;
    }

    let replies = debit_all_at_once(&service, &accounts).await;
    let first_ok = check_answers(ctx, &replies);
    check_sums(ctx, &db, &accounts).await?;
    check_retry_replays(ctx, &service, first_ok).await?;

    let mut client = ctx.connect().await?;
    let findings = points_ledger::reconcile(&mut client).await?;
    ctx.check(
        "reconciliation: no findings",
        findings.is_clean(),
        findings.summary(),
    );
    service.stop_checked(ctx).await?;
    Ok(())
}

/// One debit's account, key, and reply (or the transport's error).
type Attempt = (String, String, Result<Reply, reqwest::Error>);

/// Starts ledger-svc with [`STRIPES`] redemption stripes.
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            extra_args: vec!["--redeem-stripes".into(), STRIPES.to_string()],
            pool_size: 16,
            clients: vec![CLIENT.into()],
            ..ServiceOptions::default()
        },
    )
    .await
}

/// 40 debits at once over HTTP: 4 per account, keys `k-12-<account>-<n>`. Returns each
/// one's attempt.
async fn debit_all_at_once(service: &Service, accounts: &[String]) -> Vec<Attempt> {
    let requests = accounts.iter().flat_map(|account| {
        (0..DEBITS_PER_ACCOUNT).map(move |i| (account.clone(), format!("k-12-{account}-{i}")))
    });
    futures_util::future::join_all(requests.map(|(account, key)| async move {
        let reply = service.debit_once(CLIENT, &key, &account, DEBIT).await;
        (account, key, reply)
    }))
    .await
}

/// Counts the answers: checks 30 answered 201 and the rest 409 INSUFFICIENT, nothing
/// else. Returns the first attempt answered 201, if any.
fn check_answers<'a>(ctx: &mut Ctx, replies: &'a [Attempt]) -> Option<&'a Attempt> {
    let ok: Vec<&Attempt> = replies
        .iter()
        .filter(|(_, _, reply)| {
            reply
                .as_ref()
                .is_ok_and(|r| r.status == 201 && r.outcome() == "OK")
        })
        .collect();
    let refused = replies
        .iter()
        .filter(|(_, _, reply)| {
            reply
                .as_ref()
                .is_ok_and(|r| r.status == 409 && r.outcome() == "INSUFFICIENT")
        })
        .count();
    let other = replies.len() - ok.len() - refused;
    ctx.note(format!(
        "{} debits of {DEBIT}: ok={} refused={refused} other={other}",
        replies.len(),
        ok.len()
    ));
    ctx.check_eq(
        "debits answered 201 = 10 * floor(100/30)",
        EXPECTED_OK,
        ok.len(),
    );
    ctx.check_eq(
        "debits answered 409 INSUFFICIENT",
        replies.len() - EXPECTED_OK,
        refused,
    );
    ctx.check_eq("other answers", 0, other);
    ok.first().copied()
}

/// Checks the sums: every account at 10, nothing on the plain sys-redeem row, the stripes
/// holding what was debited, each debit credited to its account's stripe.
async fn check_sums(ctx: &mut Ctx, db: &Client, accounts: &[String]) -> anyhow::Result<()> {
    let mut balances = BTreeSet::new();
    for account in accounts {
        balances.insert(queries::existing_balance(db, account).await?);
    }
    ctx.check(
        "every account ends at 100 - 3*30 = 10",
        balances == BTreeSet::from([GRANT % DEBIT]),
        format!("distinct balances {balances:?}"),
    );
    ctx.check_eq(
        "balance of the plain sys-redeem row (untouched)",
        0,
        queries::existing_balance(db, SYS_REDEEM).await?,
    );
    ctx.check_eq(
        "sys-redeem and its stripes hold what was debited",
        EXPECTED_OK as i64 * DEBIT,
        total_redeemed(db).await?,
    );
    let expected_stripes: BTreeSet<String> = accounts
        .iter()
        .map(|a| redeem_account_for(a, STRIPES))
        .collect();
    let credited: BTreeSet<String> = db
        .query(
            "SELECT DISTINCT account_id FROM ledger_entry WHERE amount > 0 AND account_id LIKE 'sys-redeem-%'",
            &[],
        )
        .await?
        .iter()
        .map(|row| row.get(0))
        .collect();
    ctx.note(format!("stripes credited: {}", credited.len()));
    ctx.check(
        "debits were credited to the stripes their accounts map to",
        credited == expected_stripes && credited.len() > 1,
        format!(
            "credited={} expected={}",
            credited.len(),
            expected_stripes.len()
        ),
    );
    Ok(())
}

/// A same-key retry of a successful striped debit (`first_ok`) is a replay, not a second
/// debit: checks status, outcome, replayed, txn id and balance.
async fn check_retry_replays(
    ctx: &mut Ctx,
    service: &Service,
    first_ok: Option<&Attempt>,
) -> anyhow::Result<()> {
    if let Some((account, key, Ok(first))) = first_ok.map(|entry| (&entry.0, &entry.1, &entry.2)) {
        let retry = service.debit_once(CLIENT, key, account, DEBIT).await?;
        ctx.check_eq(
            "same-key retry: status, outcome, replayed",
            "201 OK true".to_string(),
            format!("{} {} {}", retry.status, retry.outcome(), retry.replayed),
        );
        ctx.check(
            "the retry returns the first attempt's txn id and balance",
            retry.txn_id() == first.txn_id() && retry.balance() == first.balance(),
            format!("same_txn={}", retry.txn_id() == first.txn_id()),
        );
    }
    Ok(())
}
