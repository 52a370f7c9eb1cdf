//! Races of the frozen balances' events on PostgreSQL as spec steps (F3):
//!
//! - an event with `hold=POINT` (`call NAME: fill … hold=before-commit`) runs on a
//!   connection of its own with a [`Gate`] at that hook point and returns once it is
//!   paused there: `held at before-commit`. Its backend counts with the spec's sessions
//!   (`Calls::backends`), so a step that meets its locks shows `<waiting ...>`, as a
//!   step blocked by another session does; one held event per session;
//! - `release` lets the session's held event go on and prints what it ends with (its
//!   answer, or `ERROR …`), as family I's `release` does on InnoDB;
//! - `fill-cancel-rounds rounds=N [from=K]` runs N rounds with nothing held, each a fill
//!   and a cancel of one order sent at once on two connections of their own, and prints
//!   how many went each way (`fill_first_n=`, `cancel_first_n=`: counts that vary from
//!   run to run, redacted in the snapshot) and how many were neither history.
//!
//! A held event still paused when the case ends is dropped with its connection (the
//! transaction rolls back).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use case_kit::AbortOnDrop;
use case_kit::spec::Call;
use frozen_balances::amount::format_units;
use frozen_balances::{
    Asset, CancelResult, FillResult, FrozenError, Market, NoHooks, Outcome, Side,
};
use tokio_postgres::Client;

use super::fixtures::{Gate, T, cancel, deposit, fill, fill_request, order, placed};
use super::spec_events;
use super::spot::balance_line;

/// An event paused at a hook point on a connection of its own, until released.
struct Held {
    gate: Arc<Gate>,
    task: AbortOnDrop<Result<String, String>>,
}

/// The held events of one spec case, by the backend of the session that holds each, and
/// the backends they run on.
pub struct Races {
    database_url: String,
    held: tokio::sync::Mutex<HashMap<i32, Held>>,
    backends: Mutex<Vec<i32>>,
}

/// A new connection to `url` and its backend's pid.
///
/// Errors: the connection or the query failed.
async fn connect(url: &str) -> Result<(Client, i32), String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let pid = backend(&client).await?;
    Ok((client, pid))
}

/// The backend pid of `client`'s connection.
///
/// Errors: the query failed.
async fn backend(client: &Client) -> Result<i32, String> {
    let row = client.query_one("SELECT pg_backend_pid()", &[]).await;
    Ok(row.map_err(|e| e.to_string())?.get(0))
}

impl Races {
    /// Nothing held yet, for the case's database at `database_url`.
    pub fn new(database_url: String) -> Races {
        Races {
            database_url,
            held: tokio::sync::Mutex::new(HashMap::new()),
            backends: Mutex::new(Vec::new()),
        }
    }

    /// The backends the held events ran on, so far.
    pub fn backends(&self) -> Vec<i32> {
        self.backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Drops every held event now (its connection closes, its transaction rolls back).
    pub fn end(&self) {
        case_kit::drop_if_free(&self.held);
    }

    /// Runs `release`, `fill-cancel-rounds` or an event with `hold=` on the session
    /// `client` (see the module documentation).
    ///
    /// Errors: nothing held on the session, or an event held already; no such hook point;
    /// an event that ended before its point; a round that could not run.
    pub async fn run(&self, client: &mut Client, call: &Call) -> Result<String, String> {
        match call.op.as_str() {
            "release" => self.release(client).await,
            "fill-cancel-rounds" => rounds(&self.database_url, client, call).await,
            _ => self.hold(client, call).await,
        }
    }

    /// An event with `hold=POINT`: run on a connection of its own with a [`Gate`] at
    /// that point; returns once the event is paused there (`held at before-commit`), or
    /// with its error if it ended before reaching it.
    async fn hold(&self, client: &Client, call: &Call) -> Result<String, String> {
        let session = backend(client).await?;
        let holding = self.held.lock().await.contains_key(&session);
        let (kind, point) = spec_events::to_hold(call, holding)?;
        let gate = Arc::new(Gate::new(kind, point));
        let (mut conn, pid) = connect(&self.database_url).await?;
        self.backends
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(pid);
        let (held, call) = (gate.clone(), call.clone());
        let mut task =
            AbortOnDrop::spawn(
                async move { spec_events::event(&mut conn, &call, held.as_ref()).await },
            );
        tokio::select! {
            () = gate.reached() => {}
            ended = &mut task => {
                let ended = ended.map_err(|e| e.to_string())?;
                return Err(format!("ended before {point}: {}", ended.unwrap_or_else(|e| e)));
            }
        }
        self.held.lock().await.insert(session, Held { gate, task });
        Ok(format!("held at {point}"))
    }

    /// `release`: lets the session's held event go on and prints what it ends with.
    async fn release(&self, client: &Client) -> Result<String, String> {
        let session = backend(client).await?;
        let held = self.held.lock().await.remove(&session);
        let held = held.ok_or("no event held on this session")?;
        held.gate.release();
        held.task.await.map_err(|e| e.to_string())?
    }
}

/// Which event of a round went first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum History {
    FillFirst,
    CancelFirst,
}

/// `fill-cancel-rounds rounds=N [from=K]`: rounds `rK`, … on fresh accounts, set up on
/// the session `db`, each fill and cancel on a connection of its own, sent at once;
/// prints `rounds=N fill_first_n=… cancel_first_n=… neither=…`, then `| first neither:
/// rNN: …` for the first round that was neither history.
///
/// Errors: bad numbers; a connection or a round's setup failed.
async fn rounds(url: &str, db: &mut Client, call: &Call) -> Result<String, String> {
    let number = |name: &str, absent: &str| -> Result<usize, String> {
        let text = call.arg(name).unwrap_or(absent);
        text.parse().map_err(|_| format!("{name}=N"))
    };
    let (count, from) = (number("rounds", "")?, number("from", "0")?);
    let ((mut a, _), (mut b, _)) = (connect(url).await?, connect(url).await?);
    let (mut fill_first, mut cancel_first, mut neither) = (0, 0, Vec::new());
    for i in from..from + count {
        let tag = format!("r{i:02}");
        let (history, seen) = round(db, &mut a, &mut b, &tag)
            .await
            .map_err(|e| format!("{tag}: {e:#}"))?;
        match history {
            Some(History::FillFirst) => fill_first += 1,
            Some(History::CancelFirst) => cancel_first += 1,
            None => neither.push(format!("{tag}: {seen}")),
        }
    }
    let mut text = format!(
        "rounds={count} fill_first_n={fill_first} cancel_first_n={cancel_first} neither={}",
        neither.len()
    );
    if let Some(first) = neither.first() {
        text.push_str(&format!(" | first neither: {first}"));
    }
    Ok(text)
}

/// One free round on fresh accounts `b3-<tag>` and `s3-<tag>`: the fill of 0.4 @ 5000
/// on `a` and the cancel of the BUY on `b`, sent at once, nothing held. Returns the
/// history (`None`: neither) and a line of what was seen.
///
/// Errors: the setup failed.
async fn round(
    db: &mut Client,
    a: &mut Client,
    b: &mut Client,
    tag: &str,
) -> anyhow::Result<(Option<History>, String)> {
    let (buyer, buy, sell) = fresh_pair(db, tag).await?;
    let req = fill_request(&format!("fill-{tag}"), buy, sell, "0.4", "5000")?;
    let cancel_id = format!("cancel-{tag}");
    let (filled, cancelled) = tokio::join!(
        fill(a, &req, &NoHooks),
        cancel(b, &cancel_id, &buyer, buy, &NoHooks)
    );
    let usdt = balance_line(db, T, &buyer, Asset::Usdt).await?;
    Ok(judge(&filled, &cancelled, &usdt))
}

/// Which history a round's results show, with the buyer's USDT line `usdt`: the fill
/// first (fill OK, 3003 released, 7998 available) or the cancel first (fill
/// ORDER_CLOSED, 5005 released, 10 000 available), else `None`. Returns it with a line
/// of what was seen.
fn judge(
    filled: &Result<FillResult, FrozenError>,
    cancelled: &Result<CancelResult, FrozenError>,
    usdt: &str,
) -> (Option<History>, String) {
    let seen = format!(
        "fill {} cancel {} buyer USDT {usdt}",
        filled
            .as_ref()
            .map_or_else(|e| e.to_string(), |r| r.outcome.as_str().to_string()),
        cancelled.as_ref().map_or_else(
            |e| e.to_string(),
            |r| format!(
                "{} released={}",
                r.outcome.as_str(),
                format_units(Asset::Usdt, r.released)
            )
        ),
    );
    let history = match (filled, cancelled) {
        (Ok(f), Ok(c))
            if f.outcome == Outcome::Ok
                && c.outcome == Outcome::Ok
                && c.released == 3_003_000_000
                && usdt == "available=7998.000000 frozen=0.000000" =>
        {
            Some(History::FillFirst)
        }
        (Ok(f), Ok(c))
            if f.outcome == Outcome::OrderClosed
                && c.outcome == Outcome::Ok
                && c.released == 5_005_000_000
                && usdt == "available=10000.000000 frozen=0.000000" =>
        {
            Some(History::CancelFirst)
        }
        _ => None,
    };
    (history, seen)
}

/// Fresh accounts `b3-<tag>` (10 000 USDT) and `s3-<tag>` (1 BTC), with the buyer's
/// BUY 1.0 @ 5000 and the seller's SELL 1.0 @ 5000 placed. Returns `(buyer, buy order
/// id, sell order id)`.
///
/// Errors: the library's; a placement refused.
async fn fresh_pair(db: &mut Client, tag: &str) -> anyhow::Result<(String, i64, i64)> {
    let (buyer, seller) = (format!("b3-{tag}"), format!("s3-{tag}"));
    deposit(db, &format!("dep-{buyer}"), &buyer, Asset::Usdt, 10_000).await?;
    deposit(db, &format!("dep-{seller}"), &seller, Asset::Btc, 1).await?;
    let m = Market::BtcUsdt;
    let buy = order(&format!("p-{buyer}"), &buyer, m, Side::Buy, "1.0", "5000")?;
    let sell = order(
        &format!("p-{seller}"),
        &seller,
        m,
        Side::Sell,
        "1.0",
        "5000",
    )?;
    Ok((buyer, placed(db, &buy).await?, placed(db, &sell).await?))
}
