//! L17 — a real network fault and a retrying proxy: a TCP proxy (the kit's
//! `launch::proxy`) between the client and the service.
//! Claim, in two parts, each through the service and through a naive keyless endpoint:
//! 1. The proxy retries on its own: the upstream connection drops after the commit (the
//!    service's `after-commit` `close` fault), the proxy sends the same request again,
//!    as load balancers do. Through the service the retry carries the same
//!    `Idempotency-Key`: it is replayed, one debit. Through the keyless endpoint it is a
//!    new debit: two.
//! 2. The proxy cuts the answer: the service has answered in full, the proxy closes the
//!    client's connection instead of passing it on; the client retries. With the same
//!    key: replayed, one debit. Keyless: two.
//!
//! Fails if: a keyed debit happens more or less than once; the keyless endpoint does not
//! debit twice (the negative controls).

use serde_json::json;

use futures_util::FutureExt;
use points_ledger::{HookPoint, grant, reconcile};
use reqwest::header::CONTENT_TYPE;

use super::naive_keyless::KeylessEndpoint;
use super::queries;
use case_kit::{Case, Ctx};
use launch::proxy::{Proxy, ProxyOptions};
use launch::service::{Reply, Service, ServiceOptions};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L17",
        "network fault and a retrying proxy: same key debits once, keyless debits twice",
        |ctx| run(ctx).boxed(),
    )
    .connections(20)
}

/// What the negative controls' checks name.
pub const PROXY_RETRY_ANOMALY: &str = "the proxy's own retry of a keyless debit debits twice";
/// See [`PROXY_RETRY_ANOMALY`].
pub const CLIENT_RETRY_ANOMALY: &str =
    "a client's retry of a keyless debit after a cut answer debits twice";

const CLIENT: &str = "app-l17";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 30;
/// The proxy's extra upstream attempts after a dropped connection or a 502.
pub const PROXY_UPSTREAM_RETRIES: u32 = 1;
/// How long the service holds the connection after the commit before closing it,
/// milliseconds.
const SERVER_HOLD_MS: u64 = 50;
/// Part 1's and part 2's accounts: through the service, through the keyless endpoint.
const RETRY_ACCOUNT: &str = "acct-0001";
const RETRY_NAIVE_ACCOUNT: &str = "acct-0002";
const CUT_ACCOUNT: &str = "acct-0003";
const CUT_NAIVE_ACCOUNT: &str = "acct-0004";

/// Whether the faults happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkPlan {
    /// Upstream connections drop after the commit, answers are cut (the case).
    Faults,
    /// Nothing drops and nothing is cut: the negative controls must report failure.
    NoFaults,
}

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_with(ctx, NetworkPlan::Faults).await
}

/// The case under `plan`.
///
/// Errors: the service, the proxy or the database could not be used.
pub async fn run_with(ctx: &mut Ctx, plan: NetworkPlan) -> anyhow::Result<()> {
    let service = start_service(ctx).await?;
    let mut db = ctx.connect().await?;
    grant_accounts(&mut db).await?;
    let keyless = KeylessEndpoint::start(ctx.connect().await?).await?;
    let (to_service, to_keyless) = start_proxies(&service, &keyless).await?;
    let faults = plan == NetworkPlan::Faults;
    ctx.note(format!(
        "proxy: upstream_retries={PROXY_UPSTREAM_RETRIES} on a dropped connection or 502; server_hold_ms={SERVER_HOLD_MS}"
    ));

    proxy_retries(
        ctx,
        &service,
        &keyless,
        &to_service,
        &to_keyless,
        &db,
        faults,
    )
    .await?;
    client_retries(ctx, &service, &to_service, &to_keyless, &db, faults).await?;

    let findings = reconcile(&mut db).await?;
    ctx.check(
        "reconciliation finds nothing wrong (a keyless double debit balances)",
        findings.is_clean(),
        findings.summary(),
    );
    drop((to_service, to_keyless, keyless));
    service.stop_checked(ctx).await?;
    Ok(())
}

/// Starts ledger-svc with fault injection, for [`CLIENT`].
async fn start_service(ctx: &Ctx) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            fault_injection: true,
            clients: vec![CLIENT.into()],
            ..ServiceOptions::default()
        },
    )
    .await
}

/// Grants [`START_BALANCE`] to each of the four accounts (keys `g-17-0`…`g-17-3`).
async fn grant_accounts(db: &mut tokio_postgres::Client) -> anyhow::Result<()> {
    for (n, account) in [
        RETRY_ACCOUNT,
        RETRY_NAIVE_ACCOUNT,
        CUT_ACCOUNT,
        CUT_NAIVE_ACCOUNT,
    ]
    .into_iter()
    .enumerate()
    {
        grant(db, "ops", &format!("g-17-{n}"), account, START_BALANCE).await?;
    }
    Ok(())
}

/// A proxy in front of the service and one in front of the keyless endpoint, each
/// retrying upstream [`PROXY_UPSTREAM_RETRIES`] times.
async fn start_proxies(
    service: &Service,
    keyless: &KeylessEndpoint,
) -> anyhow::Result<(Proxy, Proxy)> {
    let to_service = Proxy::start(ProxyOptions {
        upstream: service.public_addr(),
        upstream_retries: PROXY_UPSTREAM_RETRIES,
    })
    .await?;
    let to_keyless = Proxy::start(ProxyOptions {
        upstream: keyless.address(),
        upstream_retries: PROXY_UPSTREAM_RETRIES,
    })
    .await?;
    Ok((to_service, to_keyless))
}

/// Part 1: the upstream connection drops after the commit (if `faults`); the proxy
/// retries. Checks the keyed debit is replayed and happens once; the negative control
/// sees whether the keyless one debits twice.
async fn proxy_retries(
    ctx: &mut Ctx,
    service: &Service,
    keyless: &KeylessEndpoint,
    to_service: &Proxy,
    to_keyless: &Proxy,
    db: &tokio_postgres::Client,
    faults: bool,
) -> anyhow::Result<()> {
    if faults {
        service
            .arm_fault(
                HookPoint::AfterCommit,
                json!({"action": "close", "hold_ms": SERVER_HOLD_MS, "count": 1}),
            )
            .await?;
        keyless.drop_next_answers(1);
    }
    let keyed = debit_via(service, to_service, RETRY_ACCOUNT, Some("k-1701")).await;
    ctx.note(format!(
        "proxy retry, same key: client got {}; proxy retries={}",
        describe(&keyed),
        to_service.stats().retries
    ));
    ctx.check_eq(
        "proxy retry, same key: the client gets the replayed 201",
        "201 OK replayed=true".to_string(),
        describe(&keyed),
    );
    check_once(ctx, db, "proxy retry, same key", RETRY_ACCOUNT, "k-1701").await?;
    let naive = debit_via(service, to_keyless, RETRY_NAIVE_ACCOUNT, None).await;
    let (balance, debits) = debited(db, RETRY_NAIVE_ACCOUNT).await?;
    ctx.note(format!(
        "proxy retry, keyless: client got {}; balance={balance} debit_txns={debits}",
        describe(&naive)
    ));
    ctx.exposes(
        PROXY_RETRY_ANOMALY,
        balance == START_BALANCE - 2 * DEBIT && debits == 2,
        format!("balance={balance} debit_txns={debits}"),
    );
    Ok(())
}

/// Part 2: the proxy withholds the service's complete answer (if `faults`); the client
/// retries. Checks the keyed retry is replayed and the debit happens once; the negative
/// control sees whether the keyless one debits twice.
async fn client_retries(
    ctx: &mut Ctx,
    service: &Service,
    to_service: &Proxy,
    to_keyless: &Proxy,
    db: &tokio_postgres::Client,
    faults: bool,
) -> anyhow::Result<()> {
    let keyed = cut_then_retry(
        ctx,
        service,
        to_service,
        CUT_ACCOUNT,
        Some("k-1702"),
        faults,
    )
    .await;
    ctx.check_eq(
        "cut answer, same key: the client's retry is replayed",
        "201 OK replayed=true".to_string(),
        describe(&keyed),
    );
    check_once(ctx, db, "cut answer, same key", CUT_ACCOUNT, "k-1702").await?;
    let last = cut_then_retry(ctx, service, to_keyless, CUT_NAIVE_ACCOUNT, None, faults).await;
    ctx.check_eq(
        "cut answer, keyless: the client's last attempt got 201",
        "201 OK replayed=false".to_string(),
        describe(&last),
    );
    let (balance, debits) = debited(db, CUT_NAIVE_ACCOUNT).await?;
    ctx.note(format!(
        "cut answer, keyless: balance={balance} debit_txns={debits}"
    ));
    ctx.exposes(
        CLIENT_RETRY_ANOMALY,
        balance == START_BALANCE - 2 * DEBIT && debits == 2,
        format!("balance={balance} debit_txns={debits}"),
    );
    Ok(())
}

/// The proxy cuts its next answer (if `faults`); the client's first attempt, then, if it
/// got no answer, its retry (with the same key, or again without one).
async fn cut_then_retry(
    ctx: &mut Ctx,
    service: &Service,
    proxy: &Proxy,
    account: &str,
    key: Option<&str>,
    faults: bool,
) -> Result<Reply, String> {
    if faults {
        proxy.cut_next_responses(1);
    }
    let label = if key.is_some() { "same key" } else { "keyless" };
    let first = debit_via(service, proxy, account, key).await;
    ctx.note(format!(
        "cut answer, {label}: first attempt: {}",
        describe(&first)
    ));
    if first.is_ok() {
        return first;
    }
    let retry = debit_via(service, proxy, account, key).await;
    ctx.note(format!("cut answer, {label}: retry: {}", describe(&retry)));
    retry
}

/// `POST /accounts/{account}/debits` with `amount=30` through `proxy`, with an
/// `Idempotency-Key` when `key` is given. A transport error is `Err` with its kind.
async fn debit_via(
    service: &Service,
    proxy: &Proxy,
    account: &str,
    key: Option<&str>,
) -> Result<Reply, String> {
    let mut request = service
        .http()
        .post(proxy.url(&format!("/accounts/{account}/debits")))
        .header("x-client-id", CLIENT)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("amount={DEBIT}"));
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    service.send(request).await.map_err(|error| {
        if error.is_timeout() {
            "timeout".to_string()
        } else {
            "connection closed without an answer".to_string()
        }
    })
}

fn describe(reply: &Result<Reply, String>) -> String {
    match reply {
        Ok(reply) => format!(
            "{} {} replayed={}",
            reply.status,
            reply.outcome(),
            reply.replayed
        ),
        Err(error) => error.clone(),
    }
}

async fn check_once(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    label: &str,
    account: &str,
    key: &str,
) -> anyhow::Result<()> {
    ctx.check_eq(
        format!("{label}: transactions for the key"),
        1,
        queries::txns_for_key(db, CLIENT, key).await?,
    );
    ctx.check_eq(
        format!("{label}: balance = 100 - 30"),
        START_BALANCE - DEBIT,
        queries::existing_balance(db, account).await?,
    );
    Ok(())
}

async fn debited(db: &tokio_postgres::Client, account: &str) -> anyhow::Result<(i64, i64)> {
    Ok((
        queries::existing_balance(db, account).await?,
        queries::count_txns(db, account, "DEBIT").await?,
    ))
}
