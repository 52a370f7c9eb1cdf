//! What a step answers, in either layout, and the sessions' connections whose notices
//! are kept in the order they arrive.

use std::sync::{Arc, Mutex};

use futures_util::future::poll_fn;
use tokio_postgres::{AsyncMessage, Client, SimpleQueryMessage};

use super::layout::table;
use super::model::Layout;

/// A step's result as printed below its line.
pub type Outcome = Vec<String>;

/// The notices every session received, in the order they arrived: `(session index,
/// "NOTICE:  message")`, as PostgreSQL's tester prints them after the session's name.
pub type NoticeLog = Arc<Mutex<Vec<(usize, String)>>>;

/// An error as printed: ours `ERROR <SQLSTATE>: message`, PostgreSQL's tester's
/// `ERROR:  message` (severity, two blanks, the primary message only: details name pids
/// and xids).
pub fn db_error(layout: Layout, error: &tokio_postgres::Error) -> String {
    match (error.as_db_error(), layout) {
        (Some(db), Layout::Ours) => format!("ERROR {}: {}", db.code().code(), db.message()),
        (Some(db), Layout::Postgres) => format!("{}:  {}", db.severity(), db.message()),
        (None, _) => format!("ERROR (no SQLSTATE): {error}"),
    }
}

/// Runs `sql` (one simple query, one or more statements) and lays out what it returned:
/// ours, each row as `column=value` and `(0 rows)` for a statement that returns rows
/// but found none; PostgreSQL's, each result set as a table ([`table`]).
pub async fn run_sql(client: &Client, sql: &str, layout: Layout) -> Outcome {
    let messages = match client.simple_query(sql).await {
        Err(error) => return vec![db_error(layout, &error)],
        Ok(messages) => messages,
    };
    let mut out = Vec::new();
    let mut columns: Option<Vec<String>> = None;
    let mut rows: Vec<Vec<Option<String>>> = Vec::new();
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(description) => {
                columns = Some(description.iter().map(|c| c.name().to_string()).collect());
                rows.clear();
            }
            SimpleQueryMessage::Row(row) => {
                let cells = (0..row.len()).map(|i| row.get(i).map(String::from));
                rows.push(cells.collect());
            }
            SimpleQueryMessage::CommandComplete(_) => {
                if let Some(names) = columns.take() {
                    out.extend(lay_out(layout, &names, &rows));
                }
                rows.clear();
            }
            _ => {}
        }
    }
    out
}

fn lay_out(layout: Layout, names: &[String], rows: &[Vec<Option<String>>]) -> Outcome {
    match layout {
        Layout::Postgres => table(names, rows),
        Layout::Ours if rows.is_empty() => vec!["(0 rows)".into()],
        Layout::Ours => rows
            .iter()
            .map(|row| {
                let cells: Vec<String> = names
                    .iter()
                    .zip(row)
                    .map(|(name, value)| format!("{name}={}", value.as_deref().unwrap_or("null")))
                    .collect();
                cells.join(" ")
            })
            .collect(),
    }
}

/// Whether `outcome` reports an error (either layout).
pub fn is_error(outcome: &Outcome) -> bool {
    outcome.iter().any(|line| line.starts_with("ERROR"))
}

/// Connects session `index` with `config`; its connection task appends every notice
/// it receives to `log` (with DETAIL and HINT lines when the server sends them), in
/// the order they arrive, before it hands on the results that follow them.
///
/// Errors: connection failures.
pub async fn connect_noticed(
    config: tokio_postgres::Config,
    index: usize,
    log: NoticeLog,
) -> anyhow::Result<Client> {
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        while let Some(Ok(message)) = poll_fn(|cx| connection.poll_message(cx)).await {
            if let AsyncMessage::Notice(notice) = message {
                let mut text = format!("{}:  {}", notice.severity(), notice.message());
                if let Some(detail) = notice.detail() {
                    text.push_str(&format!("\nDETAIL:  {detail}"));
                }
                if let Some(hint) = notice.hint() {
                    text.push_str(&format!("\nHINT:  {hint}"));
                }
                log.lock()
                    .unwrap_or_else(|poisoned| poisoned.into_inner())
                    .push((index, text));
            }
        }
    });
    Ok(client)
}
