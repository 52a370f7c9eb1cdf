//! A race as a spec (`race call:` / `race step:`): N sessions released together, their
//! outcomes counted, the counts compared with `expect:`, then the teardown's rows and
//! the `check:` queries.

use std::sync::Arc;
use std::time::Duration;

use super::engine::{Opening, SpecEngine};
use super::model::{Action, Call, Calls, Layout, Race, Spec};
use super::play;
use super::result::{is_error, run_sql};
use crate::ctx::Ctx;
use crate::locks::release_once_queued;

/// Longest wait for the racers to queue behind `race hold:`; it only stops a hang (a
/// loaded machine gets them there later, never not).
pub const QUEUE_WAIT_MS: u64 = 60_000;

/// `action` for racer `index`: every `{i…}` in SQL and in call arguments replaced as
/// [`with_index`] says.
pub fn for_racer(action: &Action, index: usize) -> Action {
    match action {
        Action::Sql(sql) => Action::Sql(with_index(sql, index)),
        Action::Call(call) => Action::Call(Call {
            op: call.op.clone(),
            args: call
                .args
                .iter()
                .map(|(k, v)| (k.clone(), with_index(v, index)))
                .collect(),
            line: call.line,
        }),
    }
}

/// `text` with each index expression replaced for session `index` (0-based): `{i}`, or
/// `i` followed by operations applied left to right, each `/N` (integer division), `%N`
/// (remainder) or `+N`, then optionally `:0W` (zero-padded to W digits). So for index 5,
/// `{i}` is `5`, `{i/4+1:04}` is `0002` and `{i%4}` is `1`. Braces that hold anything
/// else are left as written.
pub fn with_index(text: &str, index: usize) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let value = after
            .find('}')
            .and_then(|close| Some((close, index_value(&after[..close], index)?)));
        match value {
            Some((close, value)) => {
                out.push_str(&value);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// One index expression without its braces (`i/4+1:04`), or `None` if it is not one.
fn index_value(expression: &str, index: usize) -> Option<String> {
    let (expression, width) = match expression.split_once(':') {
        Some((e, w)) if w.starts_with('0') => (e, Some(w.parse::<usize>().ok()?)),
        Some(_) => return None,
        None => (expression, None),
    };
    let mut ops = expression.strip_prefix('i')?;
    let mut value = index;
    while !ops.is_empty() {
        let op = ops.chars().next()?;
        let digits = ops[1..].chars().take_while(char::is_ascii_digit).count();
        let n: usize = ops[1..1 + digits].parse().ok()?;
        value = match op {
            '/' if n > 0 => value / n,
            '%' if n > 0 => value % n,
            '+' => value + n,
            _ => return None,
        };
        ops = &ops[1 + digits..];
    }
    Some(match width {
        Some(width) => format!("{value:0width$}"),
        None => value.to_string(),
    })
}

/// The kind of one racer's outcome: `replayed` for a call that printed
/// `replayed=true` (an answer read back under its key, whatever its outcome), else a
/// call's `outcome=` value lowercased (`ok`, `insufficient`), `ok` for SQL that did not
/// fail, `error` for an error.
fn kind(outcome: &Result<String, String>) -> String {
    match outcome {
        Err(_) => "error".into(),
        Ok(text) if text.split_whitespace().any(|w| w == "replayed=true") => "replayed".into(),
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
    engine: &dyn SpecEngine,
    calls: Arc<dyn Calls>,
) -> anyhow::Result<()> {
    let mut db = engine.connect(ctx, Opening::plain(1, Layout::Ours)).await?;
    let mut lines = Vec::new();
    play::setup(db.as_mut(), spec, &mut lines).await?;
    let outcomes = contend(ctx, race, calls.clone()).await?;
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
    if !spec.sessions.is_empty() {
        steps_after(ctx, spec, engine).await;
    }
    play::teardown(db.as_mut(), spec, &mut lines).await;
    for line in lines {
        ctx.note(line);
    }
    super::expect::run(ctx, db.as_mut(), engine, &spec.expectations, &seen).await;
    Ok(())
}

/// The steps that follow a race (the spec's one order of them), in the race's database,
/// noted as a permutation's are; a check says they all ran and none was left waiting.
async fn steps_after(ctx: &mut Ctx, spec: &Spec, engine: &dyn SpecEngine) {
    let order = spec.orders().into_iter().next().unwrap_or_default();
    let names: Vec<&str> = order.iter().map(|e| e.name.as_str()).collect();
    ctx.note(format!("then: {}", names.join(" ")));
    let mut lines = Vec::new();
    let outcome = play::play_steps(ctx, engine, 1, spec, &order, &mut lines).await;
    for line in lines.iter().filter(|l| !l.trim().is_empty()) {
        ctx.note(format!("  {}", line.trim_end()));
    }
    let seen = outcome.err().map(|e| format!("{e:#}")).unwrap_or_default();
    ctx.check(
        "the steps after the race ran, none left waiting",
        seen.is_empty(),
        seen,
    );
}

/// Notes the `race alongside:` call and what it printed (or its error).
fn note_alongside(ctx: &mut Ctx, race: &Race, outcome: Option<Result<String, String>>) {
    if let (Some(outcome), Some(call)) = (outcome, &race.alongside) {
        ctx.note(format!("alongside: {}", call.display()));
        match outcome {
            Ok(text) => ctx.note(format!("  {text}")),
            Err(error) => ctx.note(format!("  ERROR {error}")),
        }
    }
}

/// The race itself: the holder's lock taken (when there is one), the racers released
/// together, the holder let go once all of them wait; returns each racer's outcome, in
/// index order.
///
/// Errors: connection failures; a racer that panicked.
// Long: the holder, the racers and the call beside them are set up and joined in one place.
async fn contend(
    ctx: &mut Ctx,
    race: &Race,
    calls: Arc<dyn Calls>,
) -> anyhow::Result<Vec<Result<String, String>>> {
    let count = race.count;
    ctx.note(format!("race: {count} × {}", race.action.display()));
    let db = ctx.connect().await?;
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
    let mut beside = match &race.alongside {
        Some(call) => Some((ctx.connect().await?, call)),
        None => None,
    };
    // Beside the racers, from their release.
    let alongside = async {
        match beside.as_mut() {
            Some((client, call)) => Some(calls.run(client, call).await),
            None => None,
        }
    };
    let action = race.action.clone();
    let calls_for_racers = calls.clone();
    let racing = ctx.race(count, move |mut racer| {
        let (action, calls) = (for_racer(&action, racer.index), calls_for_racers.clone());
        async move {
            match &action {
                Action::Call(call) => calls.run_racing(&mut racer, call).await,
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
    let contended = async {
        match hold {
            None => Ok((racing.await?, None)),
            Some(hold) => {
                let limit = Duration::from_millis(QUEUE_WAIT_MS);
                let release = release_once_queued(&db, hold, count as i64, limit);
                let (outcomes, waiting) = tokio::join!(racing, release);
                anyhow::Ok((outcomes?, Some(waiting?)))
            }
        }
    };
    let (contended, beside) = tokio::join!(contended, alongside);
    let (outcomes, waiting) = contended?;
    note_alongside(ctx, race, beside);
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
            line: 0,
        });
        assert_eq!(with_index("acct-{i/4+1:04}-{i%4}", 5), "acct-0002-1");
        assert_eq!(with_index("{i+1}{x}{i/0}{", 2), "3{x}{i/0}{");
        assert_eq!(
            for_racer(&call, 7),
            Action::Call(Call {
                op: "debit".into(),
                args: vec![("key".into(), "k-7".into())],
                line: 0,
            })
        );
    }
}
