//! `net-standin`: the external network of the withdrawal cases, as its own process with
//! its own durable store (routes in `external_net::wire`).
//!
//! ```sh
//! net-standin --store /tmp/net.sqlite [--listen 127.0.0.1:0]
//! # prints: listening on 127.0.0.1:PORT
//! ```
//!
//! The store is an SQLite file (WAL, `synchronous=FULL`): a transfer is stored before
//! any answer is sent, so a dropped or delayed answer never loses it, and a restarted
//! stand-in on the same file knows every id it accepted. The control queue (delay, drop,
//! refuse) is in memory; `release` ends the delays under way at once. It stops on SIGTERM or SIGKILL; the cases start it tied to the
//! harness (parent-death signal), so it never outlives a run.

use std::collections::VecDeque;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use external_net::wire::{
    Action, Broadcast, BroadcastAnswer, CONFIRMED, ControlRequest, ControlState, DepositState,
    MAX_DELAY_MS, NOT_FOUND, QueryRecord, REJECTED, StatusAnswer, TransferRecord,
};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// Largest request body accepted, bytes.
const MAX_BODY_BYTES: usize = 16 * 1024;
/// SQLite busy timeout of the store, milliseconds (one connection; only a safety net).
const STORE_BUSY_TIMEOUT_MS: u64 = 5_000;

#[derive(Parser, Debug)]
#[command(
    about = "External network stand-in: idempotent broadcasts by id, status queries, deposits with confirmations"
)]
struct Args {
    /// The durable store (an SQLite file; created if missing).
    #[arg(long)]
    store: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: SocketAddr,
}

const STORE_SQL: &str = "
CREATE TABLE IF NOT EXISTS transfer (
    seq         INTEGER PRIMARY KEY AUTOINCREMENT,
    id          TEXT    NOT NULL UNIQUE,
    destination TEXT    NOT NULL,
    asset       TEXT    NOT NULL,
    amount      INTEGER NOT NULL,
    status      TEXT    NOT NULL,
    broadcasts  INTEGER NOT NULL DEFAULT 1
);
CREATE TABLE IF NOT EXISTS status_query (
    seq    INTEGER PRIMARY KEY AUTOINCREMENT,
    id     TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS deposit (
    tx_id         TEXT PRIMARY KEY,
    body          TEXT NOT NULL
);";

struct State {
    store: Mutex<Connection>,
    queue: Mutex<VecDeque<ControlRequest>>,
    holding: AtomicU32,
    /// Wakes every answer held by a `delay` (the `release` control).
    release: Notify,
}

/// The error that makes hyper close the connection without an answer (`drop`).
#[derive(Debug)]
struct DroppedAnswer;

impl std::fmt::Display for DroppedAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("answer dropped on purpose")
    }
}

impl std::error::Error for DroppedAnswer {}

type Reply = Result<Response<Full<Bytes>>, DroppedAnswer>;

fn json_reply(status: StatusCode, body: impl Serialize) -> Reply {
    let text = serde_json::to_vec(&body).unwrap_or_default();
    Ok(Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(text)))
        .expect("a valid response"))
}

fn problem(status: StatusCode, detail: impl Into<String>) -> Reply {
    json_reply(status, json!({"status": "ERROR", "detail": detail.into()}))
}

async fn read_json<T: serde::de::DeserializeOwned>(
    request: Request<Incoming>,
) -> Result<T, String> {
    let body = Limited::new(request.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|error| format!("body: {error}"))?
        .to_bytes();
    serde_json::from_slice(&body).map_err(|error| format!("body: {error}"))
}

/// Takes the action for the next broadcast off the queue, if any.
fn next_action(state: &State) -> Option<(Action, u64)> {
    let mut queue = state.queue.lock().unwrap_or_else(|p| p.into_inner());
    let front = queue.front_mut()?;
    let taken = (front.action, front.delay_ms);
    front.count -= 1;
    if front.count == 0 {
        queue.pop_front();
    }
    Some(taken)
}

/// Stores the broadcast (new, or one more broadcast of a known id). Returns the stored
/// status and whether it is new; `Err` when the id is known with another payload.
fn store_broadcast(
    state: &State,
    broadcast: &Broadcast,
    refuse: bool,
) -> rusqlite::Result<Result<(String, bool), String>> {
    let mut store = state.store.lock().unwrap_or_else(|p| p.into_inner());
    let tx = store.transaction()?;
    let known: Option<(String, String, i64, String)> = tx
        .query_row(
            "SELECT destination, asset, amount, status FROM transfer WHERE id = ?1",
            params![broadcast.id],
            |row| Ok((row.get(0)?, row.get(1)?, row.get(2)?, row.get(3)?)),
        )
        .optional()?;
    let outcome = match known {
        Some((destination, asset, amount, status)) => {
            if (destination.as_str(), asset.as_str(), amount)
                != (
                    broadcast.destination.as_str(),
                    broadcast.asset.as_str(),
                    broadcast.amount,
                )
            {
                Err(format!("id {} is known with another payload", broadcast.id))
            } else {
                tx.execute(
                    "UPDATE transfer SET broadcasts = broadcasts + 1 WHERE id = ?1",
                    params![broadcast.id],
                )?;
                Ok((status, false))
            }
        }
        None => {
            let status = if refuse { REJECTED } else { CONFIRMED };
            tx.execute(
                "INSERT INTO transfer (id, destination, asset, amount, status) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![
                    broadcast.id,
                    broadcast.destination,
                    broadcast.asset,
                    broadcast.amount,
                    status
                ],
            )?;
            Ok((status.to_owned(), true))
        }
    };
    tx.commit()?;
    Ok(outcome)
}

async fn broadcast(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let broadcast: Broadcast = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return problem(StatusCode::BAD_REQUEST, error),
    };
    if broadcast.id.is_empty() || broadcast.amount <= 0 {
        return problem(
            StatusCode::BAD_REQUEST,
            "id and a positive amount are required",
        );
    }
    let action = next_action(&state);
    let refuse = matches!(action, Some((Action::Refuse, _)));
    let (status, new) = match store_broadcast(&state, &broadcast, refuse) {
        Ok(Ok(stored)) => stored,
        Ok(Err(conflict)) => return problem(StatusCode::CONFLICT, conflict),
        Err(error) => return problem(StatusCode::INTERNAL_SERVER_ERROR, error.to_string()),
    };
    match action {
        Some((Action::Delay, delay_ms)) => {
            // Registered before the hold is counted: a `release` that sees this answer
            // held always ends it.
            let released = state.release.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            state.holding.fetch_add(1, Ordering::SeqCst);
            tokio::select! {
                () = tokio::time::sleep(Duration::from_millis(delay_ms)) => {}
                () = released => {}
            }
            state.holding.fetch_sub(1, Ordering::SeqCst);
        }
        Some((Action::Drop, _)) => return Err(DroppedAnswer),
        _ => {}
    }
    let code = if status == REJECTED {
        StatusCode::UNPROCESSABLE_ENTITY
    } else {
        StatusCode::OK
    };
    json_reply(
        code,
        BroadcastAnswer {
            id: broadcast.id,
            status,
            new,
        },
    )
}

fn status_query(state: &State, id: &str) -> rusqlite::Result<String> {
    let store = state.store.lock().unwrap_or_else(|p| p.into_inner());
    let status: Option<String> = store
        .query_row(
            "SELECT status FROM transfer WHERE id = ?1",
            params![id],
            |row| row.get(0),
        )
        .optional()?;
    let status = status.unwrap_or_else(|| NOT_FOUND.to_owned());
    store.execute(
        "INSERT INTO status_query (id, status) VALUES (?1, ?2)",
        params![id, status],
    )?;
    Ok(status)
}

fn list<T>(
    state: &State,
    sql: &str,
    map: impl FnMut(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
) -> rusqlite::Result<Vec<T>> {
    let store = state.store.lock().unwrap_or_else(|p| p.into_inner());
    let mut statement = store.prepare(sql)?;
    statement.query_map([], map)?.collect()
}

/// Routes one request: the transfers (broadcast, list, status query), the status
/// queries, the control queue, the deposits, and `healthz`; 404 for anything else.
async fn handle(state: Arc<State>, request: Request<Incoming>) -> Reply {
    let path = request.uri().path().to_owned();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let method = request.method().clone();
    match (method, segments.as_slice()) {
        (Method::POST, ["transfers"]) => broadcast(state, request).await,
        (Method::GET, ["transfers"]) => list_transfers(&state),
        (Method::GET, ["transfers", id]) => answer_status_query(&state, id),
        (Method::GET, ["queries"]) => list_queries(&state),
        (Method::PUT, ["control"]) => put_control(&state, request).await,
        (Method::GET, ["control"]) => control_state(&state),
        (Method::PUT, ["deposits", tx_id]) => put_deposit(&state, tx_id, request).await,
        (Method::GET, ["deposits"]) => list_deposits(&state),
        (Method::GET, ["healthz"]) => json_reply(StatusCode::OK, json!({"status": "OK"})),
        _ => problem(StatusCode::NOT_FOUND, format!("no route {path}")),
    }
}

/// A store error as a 500 answer.
fn internal(error: rusqlite::Error) -> Reply {
    problem(StatusCode::INTERNAL_SERVER_ERROR, error.to_string())
}

/// `GET /transfers`: every stored transfer, in the order first broadcast.
fn list_transfers(state: &State) -> Reply {
    match list(
        state,
        "SELECT seq, id, destination, asset, amount, status, broadcasts FROM transfer ORDER BY seq",
        |row| {
            Ok(TransferRecord {
                seq: row.get(0)?,
                id: row.get(1)?,
                destination: row.get(2)?,
                asset: row.get(3)?,
                amount: row.get(4)?,
                status: row.get(5)?,
                broadcasts: row.get(6)?,
            })
        },
    ) {
        Ok(transfers) => json_reply(StatusCode::OK, json!({ "transfers": transfers })),
        Err(error) => internal(error),
    }
}

/// `GET /transfers/{id}`: the transfer's status (recorded as a status query); 404 with
/// status `NOT_FOUND` when the id was never broadcast.
fn answer_status_query(state: &State, id: &str) -> Reply {
    match status_query(state, id) {
        Ok(status) => {
            let code = if status == NOT_FOUND {
                StatusCode::NOT_FOUND
            } else {
                StatusCode::OK
            };
            json_reply(
                code,
                StatusAnswer {
                    id: id.to_owned(),
                    status,
                },
            )
        }
        Err(error) => internal(error),
    }
}

/// `GET /queries`: every status query answered, in order.
fn list_queries(state: &State) -> Reply {
    match list(
        state,
        "SELECT seq, id, status FROM status_query ORDER BY seq",
        |row| {
            Ok(QueryRecord {
                seq: row.get(0)?,
                id: row.get(1)?,
                status: row.get(2)?,
            })
        },
    ) {
        Ok(queries) => json_reply(StatusCode::OK, json!({ "queries": queries })),
        Err(error) => internal(error),
    }
}

/// `PUT /control`: `release` ends the delays under way (answers how many); any other
/// action is queued for the next broadcasts. 400 for a count of 0 or a delay above
/// [`MAX_DELAY_MS`].
async fn put_control(state: &State, request: Request<Incoming>) -> Reply {
    let control: ControlRequest = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return problem(StatusCode::BAD_REQUEST, error),
    };
    if control.count == 0 || control.delay_ms > MAX_DELAY_MS {
        return problem(
            StatusCode::BAD_REQUEST,
            format!("count must be at least 1 and delay_ms at most {MAX_DELAY_MS}"),
        );
    }
    if control.action == Action::Release {
        let released = state.holding.load(Ordering::SeqCst);
        state.release.notify_waiters();
        return json_reply(StatusCode::OK, json!({ "released": released }));
    }
    state
        .queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push_back(control);
    json_reply(StatusCode::OK, json!({"queued": true}))
}

/// `GET /control`: the answers held now and the broadcasts still queued for an action.
fn control_state(state: &State) -> Reply {
    let queued = state
        .queue
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|c| c.count)
        .sum();
    json_reply(
        StatusCode::OK,
        ControlState {
            holding: state.holding.load(Ordering::SeqCst),
            queued,
        },
    )
}

/// `PUT /deposits/{tx_id}`: stores (or replaces) the deposit's state; 400 when the body
/// names another `tx_id`.
async fn put_deposit(state: &State, tx_id: &str, request: Request<Incoming>) -> Reply {
    let deposit: DepositState = match read_json(request).await {
        Ok(body) => body,
        Err(error) => return problem(StatusCode::BAD_REQUEST, error),
    };
    if deposit.tx_id != tx_id {
        return problem(StatusCode::BAD_REQUEST, "tx_id differs from the path");
    }
    let store = state.store.lock().unwrap_or_else(|p| p.into_inner());
    let text = serde_json::to_string(&deposit).unwrap_or_default();
    match store.execute(
        "INSERT INTO deposit (tx_id, body) VALUES (?1, ?2) \
         ON CONFLICT (tx_id) DO UPDATE SET body = excluded.body",
        params![deposit.tx_id, text],
    ) {
        Ok(_) => json_reply(StatusCode::OK, json!({"stored": true})),
        Err(error) => internal(error),
    }
}

/// `GET /deposits`: every stored deposit state, by `tx_id`.
fn list_deposits(state: &State) -> Reply {
    match list(state, "SELECT body FROM deposit ORDER BY tx_id", |row| {
        row.get::<_, String>(0)
    }) {
        Ok(bodies) => {
            let deposits: Vec<DepositState> = bodies
                .iter()
                .filter_map(|body| serde_json::from_str(body).ok())
                .collect();
            json_reply(StatusCode::OK, json!({ "deposits": deposits }))
        }
        Err(error) => internal(error),
    }
}

fn open_store(path: &PathBuf) -> rusqlite::Result<Connection> {
    let store = Connection::open(path)?;
    store.busy_timeout(Duration::from_millis(STORE_BUSY_TIMEOUT_MS))?;
    store.pragma_update(None, "journal_mode", "WAL")?;
    store.pragma_update(None, "synchronous", "FULL")?;
    store.execute_batch(STORE_SQL)?;
    Ok(store)
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let state = Arc::new(State {
        store: Mutex::new(open_store(&args.store)?),
        queue: Mutex::new(VecDeque::new()),
        holding: AtomicU32::new(0),
        release: Notify::new(),
    });
    let listener = TcpListener::bind(args.listen).await?;
    println!("listening on {}", listener.local_addr()?);
    use std::io::Write as _;
    std::io::stdout().flush()?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let state = state.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| handle(state.clone(), request));
            // An error is a dropped answer (on purpose) or a client that went away.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}
