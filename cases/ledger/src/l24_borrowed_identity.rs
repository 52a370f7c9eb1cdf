//! L24 — a borrowed identity: keys scoped by who the caller is, not by what it claims.
//! Claim: with `--auth-tokens`, the client id that scopes an idempotency key comes from
//! the caller's bearer token, so another caller cannot replay (and so read) a client's
//! stored response: B's token with A's `X-Client-Id` and key is 403 and shows nothing of
//! A's; B's token with the same key under its own id is an independent debit; no token,
//! or one the service does not know, is 401 with a Bearer challenge; none of B's
//! attempts is recorded under A, and the refused ones record nothing at all.
//! Negative control: the same attack on a service without `--auth-tokens`, where
//! `X-Client-Id` is trusted as declared: B sends A's id and key and receives A's stored
//! response, replayed, with A's txn id and balance.
//! Fails if: the control's B does not receive A's response (the control proved nothing),
//! or, with tokens, B's borrowed id is not 403, the 403 carries A's txn id or balance, a
//! missing or unknown token is not 401 with `WWW-Authenticate: Bearer`, B's own request
//! is not a fresh 201 with its own txn, or anything of B's is recorded under A.

use futures_util::FutureExt;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, WWW_AUTHENTICATE};
use tokio_postgres::Client;

use super::http::{LedgerCalls, LedgerReply};
use super::queries;
use case_kit::{Case, Ctx};
use launch::service::{Auth, Reply, Service, ServiceOptions};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "L24",
        "a borrowed identity: B cannot replay A's key under A's id once callers authenticate",
        |ctx| run(ctx).boxed(),
    )
    // The service's pool and the case's own connection.
    .connections(POOL_SIZE as u32 + 1)
}

/// What the negative control exposes.
pub const ANOMALY: &str =
    "B, declaring A's client id, receives A's stored response (txn id and balance)";

/// The victim.
const CLIENT_A: &str = "app-a";
/// The caller that borrows A's id.
const CLIENT_B: &str = "app-b";
/// Pooled connections of each service.
const POOL_SIZE: usize = 2;
/// The control's account and key (a service without authentication).
const CONTROL_ACCOUNT: &str = "acct-0004";
const CONTROL_KEY: &str = "k-2401";
/// The authenticated part's account and key.
const ACCOUNT: &str = "acct-0005";
const KEY: &str = "k-2402";
const START_BALANCE: i64 = 100;
const DEBIT: i64 = 10;
/// A well-formed bearer token that is in no token file.
const UNKNOWN_TOKEN: &str = "not-a-listed-token-0000000000000000";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    run_control(ctx, Auth::Off).await?;
    run_authenticated(ctx).await
}

/// The negative control: A debits with a key, then B sends A's client id and key (with
/// B's own token if the service has one). `auth`: [`Auth::Off`] in the case (the leak);
/// a test runs it with [`Auth::On`], where the leak cannot happen and the control must
/// FAIL.
///
/// Errors: the service does not start, transport or database errors.
pub async fn run_control(ctx: &mut Ctx, auth: Auth) -> anyhow::Result<()> {
    let service = start(ctx, auth).await?;
    service
        .grant("ops", "g-2401", CONTROL_ACCOUNT, START_BALANCE)
        .await?;
    let a = service
        .debit_once(CLIENT_A, CONTROL_KEY, CONTROL_ACCOUNT, DEBIT)
        .await?;
    ctx.note(format!(
        "{}: A ({CLIENT_A}) debits {DEBIT} with key {CONTROL_KEY}: {}",
        mode(&service),
        a.summary()
    ));
    ctx.check_eq(
        "control: A's debit",
        "201 OK".to_string(),
        a.status_outcome(),
    );
    let b_token = service.token(CLIENT_B).map(str::to_owned);
    let b = attempt(
        &service,
        b_token.as_deref(),
        Some(CLIENT_A),
        CONTROL_KEY,
        CONTROL_ACCOUNT,
    )
    .await?;
    ctx.note(format!(
        "{}: B sends X-Client-Id {CLIENT_A} and key {CONTROL_KEY}{}: {}",
        mode(&service),
        if b_token.is_some() {
            " with its own token"
        } else {
            ""
        },
        b.reply.summary()
    ));
    let same_txn = b.reply.txn_id().is_some() && b.reply.txn_id() == a.txn_id();
    ctx.exposes(
        ANOMALY,
        b.reply.status == 201 && b.reply.replayed && same_txn && b.reply.balance() == a.balance(),
        format!(
            "B: {}, {} txn id",
            b.reply.summary(),
            if same_txn { "A's" } else { "not A's" }
        ),
    );
    service.stop_checked(ctx).await
}

/// The fix: the same attack and its variants on a service with `--auth-tokens`.
async fn run_authenticated(ctx: &mut Ctx) -> anyhow::Result<()> {
    let service = start(ctx, Auth::On).await?;
    let db = ctx.connect().await?;
    service
        .grant("ops", "g-2402", ACCOUNT, START_BALANCE)
        .await?;
    let a = service.debit_once(CLIENT_A, KEY, ACCOUNT, DEBIT).await?;
    ctx.note(format!(
        "{}: A ({CLIENT_A}, its token) debits {DEBIT} with key {KEY}: {}",
        mode(&service),
        a.summary()
    ));
    ctx.check_eq("A's debit", "201 OK".to_string(), a.status_outcome());
    let under_a = queries::requests_of(&db, CLIENT_A).await?;
    let recorded = queries::recorded(&db).await?;
    let b_token = service
        .token(CLIENT_B)
        .map(str::to_owned)
        .ok_or_else(|| anyhow::anyhow!("no token for {CLIENT_B}"))?;

    check_borrowed_id(ctx, &service, &b_token).await?;
    check_missing_tokens(ctx, &service).await?;
    let after_refusals = queries::recorded(&db).await?;
    ctx.check(
        "the refused attempts recorded nothing (requests, transactions, entries)",
        after_refusals == recorded,
        format!("before={recorded:?} after={after_refusals:?}"),
    );

    check_own_id(ctx, &service, &db, &b_token, &a, &under_a).await?;
    service.stop_checked(ctx).await
}

/// B's token, A's id and key: checks it is refused (403) and shows nothing of A's.
async fn check_borrowed_id(ctx: &mut Ctx, service: &Service, b_token: &str) -> anyhow::Result<()> {
    let borrowed = attempt(service, Some(b_token), Some(CLIENT_A), KEY, ACCOUNT).await?;
    ctx.note(format!(
        "B's token, X-Client-Id {CLIENT_A}, key {KEY}: {}",
        borrowed.reply.summary()
    ));
    ctx.check_eq(
        "B's token with A's id: status and outcome",
        "403 FORBIDDEN".to_string(),
        borrowed.reply.status_outcome(),
    );
    ctx.check(
        "the 403 shows neither A's txn id nor a balance, and is no replay",
        borrowed.reply.txn_id().is_none()
            && borrowed.reply.balance().is_none()
            && !borrowed.reply.replayed,
        borrowed.reply.summary(),
    );
    Ok(())
}

/// No token, and a token the service does not know: checks each is 401 with a Bearer
/// challenge and shows nothing of A's.
async fn check_missing_tokens(ctx: &mut Ctx, service: &Service) -> anyhow::Result<()> {
    for (label, token) in [
        ("no token", None),
        ("an unknown token", Some(UNKNOWN_TOKEN)),
    ] {
        let refused = attempt(service, token, Some(CLIENT_A), KEY, ACCOUNT).await?;
        ctx.note(format!(
            "{label}, X-Client-Id {CLIENT_A}, key {KEY}: {} challenge={}",
            refused.reply.summary(),
            refused.challenge.as_deref().unwrap_or("none")
        ));
        ctx.check_eq(
            format!("{label}: status and outcome"),
            "401 UNAUTHENTICATED".to_string(),
            refused.reply.status_outcome(),
        );
        ctx.check(
            format!("{label}: WWW-Authenticate: Bearer, and nothing of A's shown"),
            refused
                .challenge
                .as_deref()
                .is_some_and(|c| c.starts_with("Bearer "))
                && refused.reply.txn_id().is_none()
                && refused.reply.balance().is_none(),
            refused.challenge.as_deref().unwrap_or("no challenge"),
        );
    }
    Ok(())
}

/// B's token, the same key under its own id: checks it is an independent debit (a fresh
/// 201 with its own transaction, not A's `a`), and that A's requests are still
/// `under_a`.
async fn check_own_id(
    ctx: &mut Ctx,
    service: &Service,
    db: &Client,
    b_token: &str,
    a: &Reply,
    under_a: &[(String, String, Option<i64>)],
) -> anyhow::Result<()> {
    let own = attempt(service, Some(b_token), Some(CLIENT_B), KEY, ACCOUNT).await?;
    ctx.note(format!(
        "B's token, X-Client-Id {CLIENT_B}, key {KEY}: {}",
        own.reply.summary()
    ));
    ctx.check_eq(
        "B's own id, same key: status and outcome",
        "201 OK".to_string(),
        own.reply.status_outcome(),
    );
    ctx.check(
        "B's own request is no replay and has its own transaction",
        !own.reply.replayed && own.reply.txn_id().is_some() && own.reply.txn_id() != a.txn_id(),
        if own.reply.txn_id() == a.txn_id() {
            "A's txn"
        } else {
            "own txn"
        },
    );
    ctx.check_eq(
        "balance after A's and B's debits",
        START_BALANCE - 2 * DEBIT,
        queries::existing_balance(db, ACCOUNT).await?,
    );
    ctx.check_eq(
        "B's key recorded under B's own id",
        1,
        queries::txns_for_key(db, CLIENT_B, KEY).await?,
    );
    let under_a_after = queries::requests_of(db, CLIENT_A).await?;
    ctx.check(
        "nothing of B's attempts recorded under A (A's keys, outcomes and txn ids unchanged)",
        under_a_after == under_a,
        format!(
            "A's requests before={} after={}",
            under_a.len(),
            under_a_after.len()
        ),
    );
    Ok(())
}

/// A service for the case's callers, with or without tokens.
async fn start(ctx: &Ctx, auth: Auth) -> anyhow::Result<Service> {
    Service::start(
        ctx,
        ServiceOptions {
            pool_size: POOL_SIZE,
            auth,
            ..ServiceOptions::default()
        }
        .with_clients(&[CLIENT_A, CLIENT_B]),
    )
    .await
}

fn mode(service: &Service) -> &'static str {
    if service.authenticated() {
        "with tokens"
    } else {
        "without authentication"
    }
}

/// What another caller's request got: the reply and its `WWW-Authenticate`.
struct Attempt {
    reply: Reply,
    challenge: Option<String>,
}

/// A debit of [`DEBIT`] sent exactly as given: `Authorization: Bearer <token>` only when
/// `token` is given (the kit adds none), `X-Client-Id` only when `client_id` is.
async fn attempt(
    service: &Service,
    token: Option<&str>,
    client_id: Option<&str>,
    key: &str,
    account: &str,
) -> anyhow::Result<Attempt> {
    let mut request = service
        .http()
        .post(service.public_url(&format!("/accounts/{account}/debits")))
        .header("idempotency-key", key)
        .header(CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(format!("amount={DEBIT}"));
    if let Some(token) = token {
        request = request.header(AUTHORIZATION, format!("Bearer {token}"));
    }
    if let Some(client_id) = client_id {
        request = request.header("x-client-id", client_id);
    }
    let response = request.send().await?;
    let status = response.status().as_u16();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|value| value == "true");
    let challenge = response
        .headers()
        .get(WWW_AUTHENTICATE)
        .and_then(|value| value.to_str().ok())
        .map(str::to_owned);
    let bytes = response.bytes().await?;
    Ok(Attempt {
        reply: Reply {
            status,
            replayed,
            body: serde_json::from_slice(&bytes).unwrap_or_default(),
        },
        challenge,
    })
}
