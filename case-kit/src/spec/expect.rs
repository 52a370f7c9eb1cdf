//! What a spec says must hold once its steps have run (our format), checked in the
//! order written, after the teardown:
//!
//! - `check: SQL`: one row whose first column is true;
//! - `rows: SQL` and, on lines indented deeper, `= column=value …` for each expected
//!   row, in order (`= (0 rows)` for none): the rows as the runner prints them;
//! - `count: N SQL`: the query returns exactly N rows;
//! - `reconcile: clean` or `reconcile: kind=N …`: the family's reconciliation of the
//!   case's database ([`EngineSession::reconcile`]) finds nothing, or exactly those figures
//!   (kinds not named are not compared);
//! - `reconcile others: clean`: every other clean database of the family
//!   ([`Ctx::clean_databases`]; a case that says so is `schedule: last`) reconciles
//!   without findings; the run record lists each database and its summary
//!   (`details["reconciled_databases"]`), the transcript only those with findings;
//! - `exposes: ANOMALY` and, on lines indented deeper, SQL returning one row whose
//!   first column says whether the anomaly happened (the rest of the row is printed as
//!   what was seen): a negative control's verdict, `negative control exposes: ANOMALY`
//!   ([`Ctx::exposes`]), which fails when the naive design happened to behave; or,
//!   in a race spec, `outcome KIND >= N` instead of the query: the anomaly happened when
//!   at least N racers ended as KIND (`outcome check_violation >= 1`); or `step NAME
//!   shows WORDS`: the anomaly happened when the step printed those words (a reply
//!   over HTTP that SQL cannot see);
//! - `shows: NAME WORDS`: step NAME printed each of WORDS (whitespace-separated words
//!   of its result, as `status=403`), read from the transcript once the steps ran.

use super::engine::{EngineSession, SpecEngine};
use super::model::{Expect, ParseError, error};
use crate::ctx::Ctx;
use crate::report::Compared;

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Reads the expectation of key `key` (`check`, `rows`, `count`, `reconcile`,
/// `exposes`) from its value; `None` for another key.
///
/// Errors: a `rows:` without SQL, a `count:` without its figure or SQL, a `reconcile:`
/// that is neither `clean` nor `kind=N` words, an `exposes:` without its query.
pub fn parse(line: usize, key: &str, value: &str) -> Option<Result<Expect, ParseError>> {
    let parsed = match key {
        "check" => Ok(Expect::True(value.to_string())),
        "rows" => {
            let (sql, rows): (Vec<&str>, Vec<&str>) =
                value.lines().partition(|l| !l.starts_with('='));
            let rows = rows.iter().map(|r| one_line(&r[1..])).collect();
            let sql = sql.join("\n");
            if sql.trim().is_empty() {
                Err(error(line, "rows: SQL, then `= column=value …` lines"))
            } else {
                Ok(Expect::Rows { sql, rows })
            }
        }
        "count" => match value.split_once(char::is_whitespace) {
            Some((figure, sql)) if figure.parse::<usize>().is_ok() && !sql.trim().is_empty() => {
                Ok(Expect::Count {
                    figure: figure.parse().unwrap_or_default(),
                    sql: sql.trim().to_string(),
                })
            }
            _ => Err(error(line, format!("count: N SQL, not {value:?}"))),
        },
        "reconcile" => {
            let words: Vec<String> = value.split_whitespace().map(String::from).collect();
            let figures = words.iter().all(|w| {
                w.split_once('=')
                    .is_some_and(|(k, n)| !k.is_empty() && n.parse::<i64>().is_ok())
            });
            match words.as_slice() {
                [only] if only == "clean" => Ok(Expect::Reconcile(Vec::new())),
                [_, ..] if figures => Ok(Expect::Reconcile(words)),
                _ => Err(error(line, "reconcile: clean, or kind=N …")),
            }
        }
        "reconcile others" if value.trim() == "clean" => Ok(Expect::ReconcileOthers),
        "reconcile others" => Err(error(line, "reconcile others: clean")),
        "shows" => match value.split_whitespace().collect::<Vec<_>>().as_slice() {
            [step, words @ ..] if !words.is_empty() => Ok(Expect::Shows {
                anomaly: None,
                step: step.to_string(),
                words: words.iter().map(|w| w.to_string()).collect(),
            }),
            _ => Err(error(line, "shows: STEP WORD …")),
        },
        "exposes" => parse_exposes(line, value),
        _ => return None,
    };
    Some(parsed)
}

/// `exposes: ANOMALY` and its rule on the lines below: a query, `outcome KIND >= N`, or
/// `step NAME shows WORD …`.
///
/// Errors: a rule missing or not of those shapes.
fn parse_exposes(line: usize, value: &str) -> Result<Expect, ParseError> {
    match value.split_once('\n') {
        Some((anomaly, rule)) if rule.starts_with("step ") => {
            match rule.split_whitespace().collect::<Vec<_>>().as_slice() {
                ["step", step, "shows", words @ ..] if !words.is_empty() => Ok(Expect::Shows {
                    anomaly: Some(anomaly.trim().to_string()),
                    step: step.to_string(),
                    words: words.iter().map(|w| w.to_string()).collect(),
                }),
                _ => Err(error(line, "exposes: … step NAME shows WORD …")),
            }
        }
        Some((anomaly, rule)) if rule.starts_with("outcome ") => {
            let words: Vec<&str> = rule.split_whitespace().collect();
            match words.as_slice() {
                ["outcome", kind, ">=", n] if n.parse::<usize>().is_ok() => {
                    Ok(Expect::ExposesOutcome {
                        anomaly: anomaly.trim().to_string(),
                        kind: kind.to_string(),
                        at_least: n.parse().unwrap_or_default(),
                    })
                }
                _ => Err(error(line, "exposes: … outcome KIND >= N")),
            }
        }
        Some((anomaly, sql)) if !sql.trim().is_empty() => Ok(Expect::Exposes {
            anomaly: anomaly.trim().to_string(),
            sql: sql.to_string(),
        }),
        _ => Err(error(
            line,
            "exposes: ANOMALY, then its query on lines indented deeper",
        )),
    }
}

/// Checks what step `step` printed ([`step_result`]): each of `words` is one of its
/// words; a negative control's verdict when `anomaly` is given.
pub(super) fn shows(ctx: &mut Ctx, anomaly: &Option<String>, step: &str, words: &[String]) {
    let printed = step_result(&ctx.transcript(), step).join(" ");
    let seen: Vec<&str> = printed.split_whitespace().collect();
    let holds = words.iter().all(|w| seen.contains(&w.as_str()));
    match anomaly {
        Some(anomaly) => {
            ctx.exposes(anomaly, holds, printed);
        }
        None => {
            let name = format!("step {step} shows {}", words.join(" "));
            ctx.check(name, holds, printed);
        }
    }
}

/// Checks every expectation of `expectations` in order on `db` (the case's database,
/// on `engine`); `outcomes` are a race's counts as printed (`ok=14
/// check_violation=18`; empty when the spec has no race).
///
/// Errors: none of its own: a query that fails is a failed check.
pub async fn run(
    ctx: &mut Ctx,
    db: &mut dyn EngineSession,
    engine: &dyn SpecEngine,
    expectations: &[Expect],
    outcomes: &str,
) {
    for expect in expectations {
        match expect {
            Expect::ExposesOutcome {
                anomaly,
                kind,
                at_least,
            } => {
                let seen = outcomes
                    .split_whitespace()
                    .find_map(|w| w.strip_prefix(&format!("{kind}=")))
                    .and_then(|n| n.parse::<usize>().ok())
                    .unwrap_or(0);
                ctx.exposes(anomaly, seen >= *at_least, format!("{kind}={seen}"));
            }
            Expect::True(sql) => {
                let outcome = db.sql(sql).await;
                let passed = outcome.len() == 1 && first_is_true(&outcome[0]);
                let compared = compared_values(db, sql).await;
                ctx.check_compared(one_line(sql), passed, outcome.join(" "), compared);
            }
            Expect::Rows { sql, rows } => {
                let outcome = db.sql(sql).await;
                let compared = Compared {
                    expected_rows: Some(rows.clone()),
                    actual_rows: Some(outcome.clone()),
                    values: Vec::new(),
                };
                let name = format!("rows of {}", one_line(sql));
                ctx.check_compared(name, &outcome == rows, "", compared);
                for row in &outcome {
                    ctx.note(format!("  {row}"));
                }
            }
            Expect::Count { figure, sql } => count(ctx, db, *figure, sql).await,
            Expect::Shows {
                anomaly,
                step,
                words,
            } => shows(ctx, anomaly, step, words),
            Expect::Reconcile(words) => reconcile(ctx, db, words).await,
            Expect::ReconcileOthers => reconcile_others(ctx, engine).await,
            Expect::Exposes { anomaly, sql } => {
                let outcome = db.sql(sql).await;
                let first = outcome.first().cloned().unwrap_or_default();
                let happened = outcome.len() == 1 && first_is_true(&first);
                let compared = compared_values(db, sql).await;
                let name = format!("negative control exposes: {anomaly}");
                ctx.check_compared(name, happened, first, compared);
            }
        }
    }
}

/// The values the query `sql` compared ([`super::compared`]), read by a second query
/// on `db` after it: for the run record and page only, never the transcript.
async fn compared_values(db: &mut dyn EngineSession, sql: &str) -> Compared {
    let values = match super::compared::value_query(sql) {
        Some((query, names)) => super::compared::values(&names, &db.sql(&query).await),
        None => Vec::new(),
    };
    Compared {
        values,
        ..Compared::default()
    }
}

/// Whether a printed row's first cell is true as any engine says it: `t`, `true` or
/// `1` (SQLite and MariaDB have no boolean type: a comparison is 1 or 0).
fn first_is_true(row: &str) -> bool {
    let first = row.split_whitespace().next().unwrap_or("");
    ["=t", "=true", "=1"].iter().any(|end| first.ends_with(end))
}

/// `count: N SQL`: the query returns exactly N rows.
async fn count(ctx: &mut Ctx, db: &mut dyn EngineSession, figure: usize, sql: &str) {
    let outcome = db.sql(sql).await;
    let seen = match outcome.as_slice() {
        [only] if only == "(0 rows)" => Ok(0),
        [only] if only.starts_with("ERROR") => Err(only.clone()),
        rows => Ok(rows.len()),
    };
    let shown = seen.clone().map_or_else(|e| e, |n| format!("rows={n}"));
    let name = format!("count {figure}: {}", one_line(sql));
    ctx.check(name, seen == Ok(figure), shown);
}

/// What step `name` printed in `transcript` (a case's, as rendered): the lines
/// indented under its `step NAME: …` lines (the one that sent it and, for a step that
/// waited, the one that completed it), trimmed.
fn step_result(transcript: &str, name: &str) -> Vec<String> {
    let header = format!("step {name}:");
    let mut under: Option<usize> = None;
    let mut printed = Vec::new();
    for line in transcript.lines() {
        let Some(text) = line.trim_start().strip_prefix("note ") else {
            under = None;
            continue;
        };
        let indent = text.len() - text.trim_start().len();
        let text = text.trim();
        if text.starts_with(&header) {
            under = Some(indent);
        } else if under.is_some_and(|header| indent > header) {
            printed.push(text.to_string());
        } else {
            under = None;
        }
    }
    printed
}

/// `reconcile:`: the family's reconciliation, clean or with the figures named.
async fn reconcile(ctx: &mut Ctx, db: &mut dyn EngineSession, words: &[String]) {
    match db.reconcile().await {
        Err(error) => {
            ctx.check("reconciliation ran", false, error);
        }
        Ok((clean, summary)) if words.is_empty() => {
            ctx.check("reconciliation: no findings", clean, summary);
        }
        Ok((_, summary)) => {
            let seen: Vec<&str> = summary.split_whitespace().collect();
            let passed = words.iter().all(|w| seen.contains(&w.as_str()));
            ctx.check(
                format!("reconciliation finds {}", words.join(" ")),
                passed,
                summary,
            );
        }
    }
}

/// `reconcile others: clean`: the family's reconciliation of every other clean
/// database ([`SpecEngine::reconcile_others`]); a database that cannot be reached
/// counts as one with findings.
async fn reconcile_others(ctx: &mut Ctx, engine: &dyn SpecEngine) {
    match engine.reconcile_others(ctx).await {
        Ok(reconciled) => check_others(ctx, reconciled),
        Err(error) => _ = ctx.check("reconciliation of the others ran", false, error),
    }
}

/// The verdict of `reconcile others: clean` on any engine, from each other database's
/// name and its reconciliation (`(clean, summary)`, or why it could not run, which counts
/// as findings): every summary in the run record (`details["reconciled_databases"]`),
/// the transcript naming only those with findings.
fn check_others(ctx: &mut Ctx, reconciled: Vec<(String, super::model::Reconciled)>) {
    let mut covered = serde_json::Map::new();
    let mut with_findings = Vec::new();
    for (name, outcome) in reconciled {
        let (clean, summary) = outcome.unwrap_or_else(|error| (false, error));
        covered.insert(name.clone(), summary.clone().into());
        if !clean {
            with_findings.push(format!("{name}: {summary}"));
        }
    }
    ctx.record("reconciled_databases", serde_json::Value::Object(covered));
    ctx.check(
        "every other clean database of the family: no findings",
        with_findings.is_empty(),
        with_findings.join("; "),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_first_cell_is_true_as_any_engine_says_it() {
        assert!(first_is_true("ok=1 units=120"));
        assert!(first_is_true("?column?=t"));
        assert!(!first_is_true("ok=0 units=120"));
        assert!(!first_is_true("ok=10"));
        assert!(!first_is_true("(0 rows)"));
    }

    #[test]
    fn reads_each_kind_and_refuses_what_is_incomplete() {
        let rows = parse(1, "rows", "SELECT a FROM t\n= a=1\n=  a=2").unwrap();
        assert_eq!(
            rows,
            Ok(Expect::Rows {
                sql: "SELECT a FROM t".into(),
                rows: vec!["a=1".into(), "a=2".into()]
            })
        );
        let count = parse(1, "count", "2 SELECT 1").unwrap();
        assert_eq!(
            count,
            Ok(Expect::Count {
                figure: 2,
                sql: "SELECT 1".into()
            })
        );
        assert_eq!(
            parse(1, "reconcile", "clean").unwrap(),
            Ok(Expect::Reconcile(Vec::new()))
        );
        assert!(parse(1, "reconcile", "dirty").unwrap().is_err());
        assert!(parse(1, "count", "SELECT 1").unwrap().is_err());
        assert!(parse(1, "exposes", "overdraft").unwrap().is_err());
        assert!(parse(1, "rows", "= a=1").unwrap().is_err());
        assert!(parse(1, "title", "x").is_none());
        assert!(parse(1, "shows", "b1").unwrap().is_err());
        let shown = "  note   step b1: post-debit k=1\n  note     status=403 txn=none\n  \
                     note   step b2: x\n  note     status=201\n  ok   b1\n";
        assert_eq!(step_result(shown, "b1"), ["status=403 txn=none"]);
    }
}
