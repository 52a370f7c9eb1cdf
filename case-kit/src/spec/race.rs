//! A race as a spec (`race call:` / `race step:`): N sessions released together, their
//! outcomes counted, the counts compared with `expect:`, then the teardown's rows and
//! the `check:` queries.

use std::sync::Arc;
use std::time::Duration;

use super::model::{Action, Call, Calls, Layout, Race, Spec};
use super::play;
use super::result::{is_error, run_sql};
use crate::ctx::Ctx;
use crate::locks::release_once_queued;

/// Longest wait for the racers to queue behind `race hold:`; it only stops a hang (a
/// loaded machine gets them there later, never not).
pub const QUEUE_WAIT_MS: u64 = 60_000;

/// `action` for racer `index`: `{i}` replaced by the index in SQL and in call arguments.
fn for_racer(action: &Action, index: usize) -> Action {
    let i = index.to_string();
    match action {
        Action::Sql(sql) => Action::Sql(sql.replace("{i}", &i)),
        Action::Call(call) => Action::Call(Call {
            op: call.op.clone(),
            args: call
                .args
                .iter()
                .map(|(k, v)| (k.clone(), v.replace("{i}", &i)))
                .collect(),
        }),
    }
}

/// The kind of one racer's outcome: a call's `outcome=` value lowercased (`ok`,
/// `insufficient`), `ok` for SQL that did not fail, `error` for an error.
fn kind(outcome: &Result<String, String>) -> String {
    match outcome {
        Err(_) => "error".into(),
        Ok(text) => text
            .split_whitespace()
            .find_map(|w| w.strip_prefix("outcome="))
            .unwrap_or("ok")
            .to_ascii_lowercase(),
    }
}

/// The counts as printed: `ok` first, then the other kinds in name order.
fn counts(kinds: &[String]) -> String {
    let mut tally = std::collections::BTreeMap::<&str, usize>::new();
    for kind in kinds {
        *tally.entry(kind).or_default() += 1;
    }
    let ok = tally.remove("ok").map(|n| format!("ok={n}"));
    ok.into_iter()
        .chain(tally.into_iter().map(|(k, n)| format!("{k}={n}")))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs the spec's setup, the race (held back by `race hold:` until every racer waits
/// for a lock), notes the counts and checks them against `expect:`, then the teardown
/// and the `check:` queries.
///
/// Errors: connection failures; a failed setup; a racer that panicked.
pub async fn run(
    ctx: &mut Ctx,
    spec: &Spec,
    race: &Race,
    calls: Arc<dyn Calls>,
) -> anyhow::Result<()> {
    let mut db = ctx.connect().await?;
    let mut lines = Vec::new();
    play::setup(&mut db, spec, calls.as_ref(), &mut lines).await?;
    let outcomes = contend(ctx, &db, race, calls.clone()).await?;
    let kinds: Vec<String> = outcomes.iter().map(kind).collect();
    let seen = counts(&kinds);
    ctx.note(seen.clone());
    if let Some(error) = outcomes.iter().find_map(|o| o.as_ref().err()) {
        ctx.note(format!("first error: {error}"));
    }
    if let Some(expected) = &race.expect {
        let mut words: Vec<String> = expected.split_whitespace().map(String::from).collect();
        let wanted: Vec<String> = words
            .drain(..)
            .flat_map(|w| {
                let (k, n) = w.split_once('=').unwrap_or(("", "0"));
                std::iter::repeat_n(k.to_string(), n.parse().unwrap_or(0))
            })
            .collect();
        ctx.check_eq("outcomes", counts(&wanted), seen.clone());
    }
    play::teardown(&db, spec, &mut lines).await;
    for line in lines {
        ctx.note(line);
    }
    super::expect::run(ctx, &mut db, calls.as_ref(), &spec.expectations, &seen).await;
    Ok(())
}

/// The race itself: the holder's lock taken (when there is one), the racers released
/// together, the holder let go once all of them wait; returns each racer's outcome, in
/// index order.
///
/// Errors: connection failures; a racer that panicked.
async fn contend(
    ctx: &mut Ctx,
    db: &tokio_postgres::Client,
    race: &Race,
    calls: Arc<dyn Calls>,
) -> anyhow::Result<Vec<Result<String, String>>> {
    let count = race.count;
    ctx.note(format!("race: {count} × {}", race.action.display()));
    let mut holder = ctx.connect().await?;
    let hold = match &race.hold {
        None => None,
        Some(sql) => {
            let hold = holder.transaction().await?;
            hold.batch_execute(sql).await?;
            let shown = sql.split_whitespace().collect::<Vec<_>>().join(" ");
            ctx.note(format!("hold: {shown}, until all {count} wait for a lock"));
            Some(hold)
        }
    };
    let action = race.action.clone();
    let racing = ctx.race(count, move |mut racer| {
        let (action, calls) = (for_racer(&action, racer.index), calls.clone());
        async move {
            match &action {
                Action::Call(call) => {
                    calls
                        .run_racing(&mut racer.client, call, &racer.barrier)
                        .await
                }
                Action::Sql(sql) => {
                    let outcome = run_sql(&racer.client, sql, Layout::Ours).await;
                    if is_error(&outcome) {
                        Err(outcome.join(" "))
                    } else {
                        Ok(String::new())
                    }
                }
            }
        }
    });
    let (outcomes, waiting) = match hold {
        None => (racing.await?, None),
        Some(hold) => {
            let limit = Duration::from_millis(QUEUE_WAIT_MS);
            let release = release_once_queued(db, hold, count as i64, limit);
            let (outcomes, waiting) = tokio::join!(racing, release);
            (outcomes?, Some(waiting?))
        }
    };
    if let Some(waiting) = waiting {
        ctx.check_eq(
            format!("all {count} waited for a lock at one moment (pg_stat_activity)"),
            count as i64,
            waiting,
        );
    }
    Ok(outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_ok_first_then_by_name() {
        let kinds: Vec<String> = ["insufficient", "ok", "error", "ok"]
            .map(String::from)
            .into();
        assert_eq!(counts(&kinds), "ok=2 error=1 insufficient=1");
        assert_eq!(
            kind(&Ok("outcome=INSUFFICIENT balance=2".into())),
            "insufficient"
        );
        assert_eq!(kind(&Err("40001".into())), "error");
        let call = Action::Call(Call {
            op: "debit".into(),
            args: vec![("key".into(), "k-{i}".into())],
        });
        assert_eq!(
            for_racer(&call, 7),
            Action::Call(Call {
                op: "debit".into(),
                args: vec![("key".into(), "k-7".into())]
            })
        );
    }
}
