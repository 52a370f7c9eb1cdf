//! Cases as data: interleaving specs. A spec file holds a setup, named sessions with
//! short steps and permutation lines; the runner plays each permutation on its own
//! sessions and writes every step, its rows, SQLSTATE or outcome, and every lock wait to
//! the transcript. The idea is PostgreSQL's isolation tester (`src/test/isolation`); the
//! runner here is our own, and it reads two formats: ours (below), and PostgreSQL's own
//! (`setup { … }`, `session s1`, `step "x" { … }`, `permutation s1a(*) s2b(s1a)`; see
//! [`parse_upstream`]), so a spec copied from PostgreSQL runs unchanged.
//!
//! # The format
//!
//! ```text
//! # a comment (a line whose first non-blank character is #)
//! title: one line, the case's title
//! claim: what the interleaving shows (continues on lines indented deeper)
//! fails: what counts as failure
//! system: ledger_template          (the family's template database; checked)
//! clean: no                        (yes: every permutation leaves the family's
//!                                   invariants intact, so its reconciliation covers
//!                                   the case's own database, the first permutation's)
//! setup: UPDATE account SET balance = 100 WHERE account_id = 'acct-0001'
//! setup call: grant account=acct-0002 amount=100 key=g-1
//! teardown: SELECT balance FROM account WHERE account_id = 'acct-0001'
//! session a
//!   setup: BEGIN
//!   step a1: UPDATE account SET balance = balance - 80 WHERE account_id = 'acct-0001'
//!   call a2: debit account=acct-0001 amount=30 key=k-1
//!   teardown: ROLLBACK
//! permutation: a1 b1 a2 b2
//! ```
//!
//! - `setup` (SQL) and `setup call` (a library operation) run in order on a fresh
//!   connection before each permutation; `teardown` SQL runs after it, and its rows are
//!   printed (the usual place for the final balances). Both may repeat.
//! - `session NAME` opens a session: its own connection, its optional `setup` SQL (often
//!   `BEGIN ISOLATION LEVEL …`) and `teardown` SQL, and its steps in order: `step NAME:
//!   SQL` (one or more statements, simple query protocol) or `call NAME: OP key=value …`,
//!   an operation of the family's verb set ([`Calls`] on PostgreSQL) run on the session's
//!   connection.
//!   Step names are unique across sessions.
//! - `permutation: NAMES` runs those steps in that order; with no permutation line, every
//!   order that keeps each session's steps in their order runs ([`all_orders`]).
//! - A value continues on the following lines indented deeper than its key.
//! - `check: SQL` (may repeat) runs at the end and must return true; so do the other
//!   expectations, in the order written: `rows:`, `count:`, `reconcile:`,
//!   `reconcile others:`, `exposes:` (see the `expect` module).
//! - `schedule: last|exclusive|concurrent`: when the case runs among the others.
//! - `restart immediate: REASON`, then `after restart: SQL` / `after restart call: OP …`:
//!   a database crash once the permutations have run (see the `restart` module).
//! - Instead of sessions, a race: `race call: N OP key=value …` or `race step: N SQL`
//!   (`{i}` is each session's index), `race hold: SQL` (held until all N wait for a
//!   lock), `race alongside: OP …` (a call beside the racers) and `expect: kind=N …`
//!   (the outcome counts); see the `race` module. Sessions after a race run their
//!   steps once the race is over.
//!
//! # PostgreSQL's format
//!
//! A file `sN_<name>.spec` whose first word is `setup`, `teardown`, `session` or
//! `permutation` (no colon) is read as PostgreSQL's format ([`parse_upstream`]). What
//! PostgreSQL's format does not say, the case's description, comes from
//! `sN_<name>.about` beside it: `title:`, `claim:`, `fails:`, `system:`, `clean:` as
//! above and `upstream:` (where it was copied from, with the commit). When
//! `sN_<name>.out` is there too (PostgreSQL's `expected/<name>.out`, unchanged), a
//! check compares the transcript, printed in PostgreSQL's expected-output layout
//! ([`Layout::Postgres`]), with that file in meaning ([`same_meaning`]).
//!
//! Markers work as in PostgreSQL's tester (14 and later): `step(*)` is reported
//! `<waiting ...>` when sent, even if it completes at once; `step(other)` is reported
//! waiting while `other` is in flight; `step(other notices N)` until the session of
//! `other` has received N notices. Notices are kept per session in the order they
//! arrive and printed as `s1: NOTICE:  message` before the next step line.
//!
//! # Running a permutation
//!
//! One runner ([`cases_in`], [`run`]) plays every family's files on the family's engine
//! ([`SpecEngine`]; PostgreSQL is [`PgEngine`], the others are in their case crates):
//! what follows is how it plays them on PostgreSQL, and the `engine` module says what
//! another engine offers and what it does not.
//!
//! The first permutation runs in the case's own database, each later one in a fresh
//! clone of the family's template (`<case db>_p2`, …), so every
//! permutation starts from the same state; the family's reconciliation sees the case's
//! own database, the first permutation's. A step is sent on its session's connection; the runner then
//! polls until every step in flight has either completed or is blocked, which it learns
//! from PostgreSQL itself: `pg_isolation_test_session_is_blocked(pid, <the spec's
//! session pids>)` on a separate monitor connection, the function PostgreSQL's own tester
//! asks, which covers both `pg_blocking_pids` and `pg_safe_snapshot_blocking_pids` (a
//! `SERIALIZABLE READ ONLY DEFERRABLE` transaction waiting for a safe snapshot;
//! PostgreSQL docs §9.27, "System Information Functions"),
//! never from how long a step took; a completed step counts once its backend is no
//! longer `active` (after an error PostgreSQL answers before it releases the locks). A
//! blocked step is printed as `<waiting ...>`; when it completes, `<... completed>` and
//! its result follow. A step of a session that is
//! still waiting first waits for that session (at most [`STEP_WAIT_MS`]), as when its
//! waiting step ends in a deadlock error. Results: each row as `column=value`, `(0 rows)`
//! for a statement that returns rows but found none, `ERROR <SQLSTATE>: <message>` (the
//! primary message only: details name pids and xids), or the operation's outcome. The
//! rows of a setup that returns rows are printed too (`setup: SQL` and its rows).
//!
//! Each permutation ends with a check that it ran every step and left none waiting; the
//! transcript itself is compared with the case's snapshot, so a lock wait that no longer
//! happens changes the transcript and fails the case.

use std::path::Path;

mod compared;
mod engine;
mod expect;
mod layout;
mod model;
mod play;
mod postgres;
mod race;
mod restart;
pub use restart::{RECONNECT_LIMIT_MS, reconnect};
mod result;
mod runner;
mod upstream;
pub mod verbs;

pub use engine::{EngineSession, Opening, Reconciled, ReconciledOthers, SessionFuture, SpecEngine};
pub use layout::{meaningful, same_meaning, table};
use model::error;
pub use model::{
    Action, Blocker, Call, CallFuture, Calls, Entry, Expect, Layout, NoCalls, ParseError, Race,
    Session, Spec, Step,
};
pub use play::{POLL_INTERVAL_MS, STEP_WAIT_MS};
pub use postgres::PgEngine;
pub use race::with_index;
pub use result::run_sql;
pub use runner::{cases_in, cases_on, run, spec_case, spec_dir, spec_dir_variable, spec_id};
pub use upstream::{MAX_UPSTREAM_SPEC_LINES, is_upstream, parse_upstream};

/// Longest a spec file may be: a spec is a short interleaving, not a program.
pub const MAX_SPEC_LINES: usize = 200;

fn parse_call(line: usize, text: &str) -> Result<Call, ParseError> {
    let mut words = text.split_whitespace();
    let op = words
        .next()
        .ok_or_else(|| error(line, "a call names an operation"))?
        .to_string();
    let mut args = Vec::new();
    for word in words {
        let (key, value) = word
            .split_once('=')
            .ok_or_else(|| error(line, format!("argument {word:?} is not key=value")))?;
        args.push((key.to_string(), value.to_string()));
    }
    Ok(Call { op, args, line })
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn is_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Parses a spec file (see the module documentation for the format).
///
/// Errors: the first problem found, with its line: an unknown key, a missing `title`,
/// `claim`, `fails`, `system` or `clean`, a step outside a session, a duplicate step
/// name, a permutation or a `shows:` naming an unknown step, more than
/// [`MAX_SPEC_LINES`] lines.
pub fn parse(text: &str) -> Result<Spec, ParseError> {
    let items = meaningful_lines(text)?;
    let mut spec = Spec::default();
    let mut seen = std::collections::BTreeSet::new();
    let mut clean = None;
    let mut in_session = false;
    // The line of each `permutation:`, in order, for an error naming an unknown step.
    let mut permutation_lines = Vec::new();
    for (line, indent, item) in items {
        if let Some(name) = item.strip_prefix("session ") {
            if indent != 0 {
                return Err(error(line, "`session` starts at the beginning of a line"));
            }
            let name = name.trim();
            if !is_name(name) {
                return Err(error(line, format!("bad session name {name:?}")));
            }
            spec.sessions.push(Session {
                name: name.to_string(),
                ..Session::default()
            });
            in_session = true;
            continue;
        }
        let (key, value) = item
            .split_once(':')
            .ok_or_else(|| error(line, format!("expected `key: value`, found {item:?}")))?;
        let key = key.trim();
        let value = value.trim().to_string();
        if indent == 0 {
            in_session = false;
        }
        if in_session {
            let session = spec.sessions.last_mut().expect("a session is open");
            session_item(session, &mut seen, line, key, value)?;
        } else {
            if key == "permutation" {
                permutation_lines.push(line);
            }
            top_item(&mut spec, &mut clean, line, key, value)?;
        }
    }
    finish(spec, clean, &seen, &permutation_lines)
}

/// The meaningful lines of a spec as `(line number, indent, text)`: blank lines and `#`
/// comments left out, continuation lines (indented deeper than their key) joined to it.
///
/// Errors: more than [`MAX_SPEC_LINES`] lines; a tab in an indent.
fn meaningful_lines(text: &str) -> Result<Vec<(usize, usize, String)>, ParseError> {
    let mut items: Vec<(usize, usize, String)> = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() > MAX_SPEC_LINES {
        return Err(error(
            0,
            format!("{} lines; a spec has at most {MAX_SPEC_LINES}", lines.len()),
        ));
    }
    for (index, raw) in lines.iter().enumerate() {
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        if raw.contains('\t') {
            return Err(error(index + 1, "indent with spaces, not tabs"));
        }
        let indent = raw.len() - raw.trim_start().len();
        match items.last_mut() {
            Some((_, key_indent, value))
                if indent > *key_indent && !value.starts_with("session ") =>
            {
                value.push('\n');
                value.push_str(trimmed);
            }
            _ => items.push((index + 1, indent, trimmed.to_string())),
        }
    }
    Ok(items)
}

/// One `key: value` inside a session: `setup:`, `teardown:`, `step NAME:` or
/// `call NAME:`; step names are unique across the spec (`seen`).
///
/// Errors: any other key; a step name used twice; a call that does not parse.
fn session_item(
    session: &mut Session,
    seen: &mut std::collections::BTreeSet<String>,
    line: usize,
    key: &str,
    value: String,
) -> Result<(), ParseError> {
    let (kind, name) = key.split_once(' ').unwrap_or((key, ""));
    let name = name.trim();
    match (kind, name) {
        ("setup", "") => session.setup.push(value),
        ("teardown", "") => session.teardown.push(value),
        ("step" | "call", name) if is_name(name) => {
            if !seen.insert(name.to_string()) {
                return Err(error(line, format!("step {name:?} is defined twice")));
            }
            let action = if kind == "step" {
                Action::Sql(value)
            } else {
                Action::Call(parse_call(line, &value)?)
            };
            session.steps.push(Step {
                name: name.to_string(),
                action,
            });
        }
        _ => {
            return Err(error(
                line,
                format!(
                    "in a session: `setup:`, `teardown:`, `step NAME:` or `call NAME:`, not {key:?}"
                ),
            ));
        }
    }
    Ok(())
}

/// One `key: value` outside sessions: the spec's title, claim, expected failure, system,
/// cleanliness, setup, teardown and permutations.
///
/// Errors: an unknown key; a step outside a session; a bad `clean:`; an empty
/// permutation; a call that does not parse.
fn top_item(
    spec: &mut Spec,
    clean: &mut Option<bool>,
    line: usize,
    key: &str,
    value: String,
) -> Result<(), ParseError> {
    match key {
        "title" => spec.title = value,
        "claim" => spec.claim = value,
        "fails" => spec.fails = value,
        "system" => spec.system = value,
        "clean" => {
            *clean = Some(match value.as_str() {
                "yes" => true,
                "no" => false,
                other => {
                    return Err(error(line, format!("clean: yes or no, not {other:?}")));
                }
            })
        }
        "setup" => spec.setup.push(Action::Sql(value)),
        "setup call" => spec.setup.push(Action::Call(parse_call(line, &value)?)),
        "setup calls" => {
            let (count, rest) = counted(line, &value)?;
            let call = Action::Call(parse_call(line, rest)?);
            spec.setup
                .extend((0..count).map(|index| race::for_racer(&call, index)));
        }
        "teardown" => spec.teardown.push(value),
        "restart immediate" if !value.is_empty() => spec.restart = Some(one_line(&value)),
        "restart immediate" => return Err(error(line, "restart immediate: REASON")),
        "after restart" => spec.after_restart.push(Action::Sql(value)),
        "after restart call" => spec
            .after_restart
            .push(Action::Call(parse_call(line, &value)?)),
        "schedule" => {
            spec.schedule = Some(match value.as_str() {
                "last" => crate::schedule::Schedule::Last,
                "exclusive" => crate::schedule::Schedule::Exclusive,
                "concurrent" => crate::schedule::Schedule::Concurrent,
                other => {
                    return Err(error(
                        line,
                        format!("schedule: last, exclusive or concurrent, not {other:?}"),
                    ));
                }
            })
        }
        "check" | "rows" | "count" | "reconcile" | "reconcile others" | "exposes" | "shows" => {
            let expect = expect::parse(line, key, &value).expect("an expectation's key");
            spec.expectations.push(expect?);
        }
        "race call" | "race step" | "race hold" | "race alongside" | "expect" => {
            race_item(spec, line, key, value)?
        }
        "permutation" => {
            let names: Vec<Entry> = value.split_whitespace().map(Entry::plain).collect();
            if names.is_empty() {
                return Err(error(line, "a permutation names at least one step"));
            }
            spec.permutations.push(names);
        }
        "step" | "call" => return Err(error(line, "a step belongs to a session")),
        other => return Err(error(line, format!("unknown key {other:?}"))),
    }
    Ok(())
}

/// One key of a race: `race call: N OP args`, `race step: N SQL`, `race hold: SQL`,
/// `expect: kind=N …`.
///
/// Errors: a count that is not a positive number; a call that does not parse; a hold or
/// expectation before the race; an expectation that is not `kind=N` words.
fn race_item(spec: &mut Spec, line: usize, key: &str, value: String) -> Result<(), ParseError> {
    if let Some(kind) = key
        .strip_prefix("race ")
        .filter(|k| *k == "call" || *k == "step")
    {
        let (count, rest) = counted(line, &value)?;
        let action = if kind == "call" {
            Action::Call(parse_call(line, rest)?)
        } else {
            Action::Sql(rest.to_string())
        };
        spec.race = Some(Race {
            count,
            action,
            hold: None,
            expect: None,
            alongside: None,
        });
        return Ok(());
    }
    let race = spec.race.as_mut().ok_or_else(|| {
        error(
            line,
            format!("`{key}:` follows a `race call:` or `race step:`"),
        )
    })?;
    if key == "race hold" {
        race.hold = Some(value);
    } else if key == "race alongside" {
        race.alongside = Some(parse_call(line, &value)?);
    } else {
        let words: Vec<&str> = value.split_whitespace().collect();
        let well_formed = !words.is_empty()
            && words.iter().all(|w| {
                w.split_once('=')
                    .is_some_and(|(k, n)| !k.is_empty() && n.parse::<usize>().is_ok())
            });
        if !well_formed {
            return Err(error(line, format!("expect: kind=N …, not {value:?}")));
        }
        race.expect = Some(words.join(" "));
    }
    Ok(())
}

/// A value that starts with a positive count (`32 debit …`): the count and the rest.
///
/// Errors: the first word is not a positive number.
fn counted(line: usize, value: &str) -> Result<(usize, &str), ParseError> {
    let (count, rest) = value.split_once(char::is_whitespace).unwrap_or((value, ""));
    let count: usize = count
        .parse()
        .ok()
        .filter(|&n| n > 0)
        .ok_or_else(|| error(line, format!("a count comes first, not {count:?}")))?;
    Ok((count, rest.trim()))
}

/// The whole-spec checks once every line is read: the required keys, a step in every
/// session, `shows:` and permutations naming known steps (`permutation_lines`: the line
/// of each permutation, in order, named by the error; 0 where unknown).
///
/// Errors: the first of those that fails.
fn finish(
    mut spec: Spec,
    clean: Option<bool>,
    seen: &std::collections::BTreeSet<String>,
    permutation_lines: &[usize],
) -> Result<Spec, ParseError> {
    for (key, value) in [
        ("title", &spec.title),
        ("claim", &spec.claim),
        ("fails", &spec.fails),
        ("system", &spec.system),
    ] {
        if value.is_empty() {
            return Err(error(0, format!("`{key}:` is missing")));
        }
    }
    spec.clean = clean.ok_or_else(|| error(0, "`clean: yes|no` is missing"))?;
    if !spec.after_restart.is_empty() && spec.restart.is_none() {
        return Err(error(0, "`after restart:` needs a `restart immediate:`"));
    }
    if spec.race.is_some() && spec.restart.is_some() {
        return Err(error(0, "a race spec does not restart the server"));
    }
    if spec.race.is_some() {
        // Steps after a race: one order of them, in the race's database.
        let orders = spec.orders().len();
        if orders > 1 || spec.sessions.iter().any(|s| s.steps.is_empty()) {
            return Err(error(
                0,
                "the steps after a race run in one order (a `permutation:` line), each session with a step",
            ));
        }
    } else if spec.sessions.is_empty() || spec.sessions.iter().any(|s| s.steps.is_empty()) {
        return Err(error(
            0,
            "every spec has a session (or a race), every session a step",
        ));
    }
    for expect in &spec.expectations {
        if let Expect::Shows { step, .. } = expect
            && !seen.contains(step)
        {
            return Err(error(0, format!("`shows:` names unknown step {step:?}")));
        }
    }
    for (index, permutation) in spec.permutations.iter().enumerate() {
        for entry in permutation {
            if !seen.contains(&entry.name) {
                let name = &entry.name;
                let line = permutation_lines.get(index).copied().unwrap_or(0);
                return Err(error(
                    line,
                    format!("permutation names unknown step {name:?}"),
                ));
            }
        }
    }
    Ok(spec)
}

/// Every order of the steps that keeps each session's steps in their own order, as
/// `(session, step)` indexes, sessions tried in spec order (so the first order runs the
/// first session's steps first). `steps_per_session = [2, 1]` gives 3 orders; in
/// general the multinomial coefficient `(Σn)! / Π(n!)`.
pub fn all_orders(steps_per_session: &[usize]) -> Vec<Vec<(usize, usize)>> {
    fn recurse(
        counts: &[usize],
        taken: &mut Vec<usize>,
        order: &mut Vec<(usize, usize)>,
        out: &mut Vec<Vec<(usize, usize)>>,
    ) {
        let mut any = false;
        for session in 0..counts.len() {
            if taken[session] < counts[session] {
                any = true;
                order.push((session, taken[session]));
                taken[session] += 1;
                recurse(counts, taken, order, out);
                taken[session] -= 1;
                order.pop();
            }
        }
        if !any {
            out.push(order.clone());
        }
    }
    let mut out = Vec::new();
    recurse(
        steps_per_session,
        &mut vec![0; steps_per_session.len()],
        &mut Vec::new(),
        &mut out,
    );
    out
}

impl Spec {
    /// The permutations to run: the permutation lines, else every order
    /// ([`all_orders`]).
    pub fn orders(&self) -> Vec<Vec<Entry>> {
        if !self.permutations.is_empty() {
            return self.permutations.clone();
        }
        let counts: Vec<usize> = self.sessions.iter().map(|s| s.steps.len()).collect();
        all_orders(&counts)
            .into_iter()
            .map(|order| {
                order
                    .into_iter()
                    .map(|(session, step)| Entry::plain(&self.sessions[session].steps[step].name))
                    .collect()
            })
            .collect()
    }

    fn find(&self, name: &str) -> Option<(usize, &Step)> {
        self.sessions
            .iter()
            .enumerate()
            .find_map(|(index, session)| {
                session
                    .steps
                    .iter()
                    .find(|step| step.name == name)
                    .map(|step| (index, step))
            })
    }
}

/// Reads spec file `name` of `dir`: ours, or PostgreSQL's format ([`is_upstream`])
/// with its description in `<stem>.about` beside it ([`parse_about`]) and, when there
/// is one, PostgreSQL's expected output in `<stem>.out`.
///
/// Errors: a file that cannot be read or parsed, as `<shown>: <reason>`.
pub fn load(dir: &Path, name: &str, shown: &str) -> Result<Spec, String> {
    let read = |file: &str| {
        std::fs::read_to_string(dir.join(file)).map_err(|e| format!("cannot read {file}: {e}"))
    };
    let text = read(name).map_err(|e| format!("{shown}: {e}"))?;
    if !is_upstream(&text) {
        return parse(&text).map_err(|error| format!("{shown}: {error}"));
    }
    let stem = name.trim_end_matches(".spec");
    let spec = parse_upstream(&text).map_err(|error| format!("{shown}: {error}"))?;
    let about = format!("{stem}.about");
    let mut spec = read(&about)
        .and_then(|text| parse_about(&text, spec).map_err(|e| format!("{about}: {e}")))
        .map_err(|e| format!("{shown}: {e}"))?;
    let expected = format!("{stem}.out");
    if dir.join(&expected).exists() {
        let text = read(&expected).map_err(|e| format!("{shown}: {e}"))?;
        let shown_expected = shown.trim_end_matches(name).to_string() + &expected;
        spec.expected = Some((shown_expected, text));
    }
    Ok(spec)
}

/// Reads case file `name` of `dir` with each `(from, to)` of `edits` replaced, in order,
/// and parses it: how a negative control runs a committed file with its fault taken out
/// (its `exposes:` must then fail). Every `from` must occur in the text it is applied to,
/// so a control whose edit no longer matches the file fails rather than running the file
/// unchanged.
///
/// Errors: the file unreadable, a `from` absent, or the edited text not parsing, as
/// `<name>: <reason>`.
pub fn load_edited(dir: &Path, name: &str, edits: &[(&str, &str)]) -> Result<Spec, String> {
    let mut text = std::fs::read_to_string(dir.join(name))
        .map_err(|e| format!("{name}: cannot read it: {e}"))?;
    for (from, to) in edits {
        if !text.contains(from) {
            return Err(format!("{name}: has no {from:?} to replace"));
        }
        text = text.replace(from, to);
    }
    parse(&text).map_err(|error| format!("{name}: {error}"))
}

/// Reads the description of a spec in PostgreSQL's format into `spec`: the keys of our
/// format's header (`title:`, `claim:`, `fails:`, `system:`, `clean:`) and
/// `upstream:` (where the spec comes from: path and commit).
///
/// Errors: an unknown key; a missing one.
pub fn parse_about(text: &str, mut spec: Spec) -> Result<Spec, ParseError> {
    let mut clean = None;
    for (line, _, item) in meaningful_lines(text)? {
        let (key, value) = item
            .split_once(':')
            .ok_or_else(|| error(line, format!("expected `key: value`, found {item:?}")))?;
        let value = value.trim().to_string();
        match key.trim() {
            "upstream" => spec.upstream = value,
            key @ ("title" | "claim" | "fails" | "system" | "clean") => {
                top_item(&mut spec, &mut clean, line, key, value)?
            }
            other => return Err(error(line, format!("unknown key {other:?}"))),
        }
    }
    if spec.upstream.is_empty() {
        return Err(error(0, "`upstream:` is missing"));
    }
    let seen = spec
        .sessions
        .iter()
        .flat_map(|s| &s.steps)
        .map(|s| s.name.clone())
        .collect();
    finish(spec, clean, &seen, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = "\
# comment
title: two debits
claim: the second waits
  and re-reads
fails: it does not wait
system: t
clean: no
setup: UPDATE account
  SET balance = 100
session a
  setup: BEGIN
  step a1: UPDATE x
  step a2: COMMIT
session b
  call b1: debit account=acct-0001 amount=30
permutation: a1 b1 a2
";

    #[test]
    fn load_edited_replaces_or_says_what_it_did_not_find() {
        let dir = std::env::temp_dir().join(format!("case-kit-load-edited-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("s01_x.spec"), SPEC).unwrap();
        let edited = load_edited(&dir, "s01_x.spec", &[("amount=30", "amount=40")]);
        let as_committed = load_edited(&dir, "s01_x.spec", &[]);
        let missing = load_edited(&dir, "s01_x.spec", &[("amount=99", "amount=40")]);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_ne!(
            format!("{:?}", edited.unwrap()),
            format!("{:?}", as_committed.unwrap())
        );
        assert_eq!(
            missing.unwrap_err(),
            "s01_x.spec: has no \"amount=99\" to replace"
        );
    }

    #[test]
    fn parses_keys_sessions_steps_and_continuations() {
        let spec = parse(SPEC).expect("parses");
        assert_eq!(spec.claim, "the second waits\nand re-reads");
        assert_eq!(
            spec.setup,
            vec![Action::Sql("UPDATE account\nSET balance = 100".into())]
        );
        assert_eq!(spec.sessions.len(), 2);
        assert_eq!(spec.sessions[0].setup, vec!["BEGIN".to_string()]);
        assert_eq!(spec.sessions[0].steps[1].name, "a2");
        let Action::Call(call) = &spec.sessions[1].steps[0].action else {
            panic!("a call")
        };
        assert_eq!(call.op, "debit");
        assert_eq!(call.arg("amount"), Some("30"));
        assert_eq!(
            spec.orders(),
            vec![vec![
                Entry::plain("a1"),
                Entry::plain("b1"),
                Entry::plain("a2")
            ]]
        );
    }

    #[test]
    fn refuses_what_it_cannot_run() {
        let bad = [
            (
                SPEC.replace("permutation: a1 b1 a2", "permutation: a1 zz"),
                "unknown step",
            ),
            (SPEC.replace("step a2", "step a1"), "defined twice"),
            (
                SPEC.replace("clean: no\n", "clean: no\nshows: zz balance=1\n"),
                "`shows:` names unknown step",
            ),
            (SPEC.replace("clean: no\n", ""), "clean"),
            (SPEC.replace("title: two debits\n", ""), "title"),
            (SPEC.replace("system: t", "sytem: t"), "unknown key"),
            (SPEC.replace("  step a1", "  stop a1"), "in a session"),
            (
                SPEC.replace("clean: no\n", "clean: no\nafter restart: SELECT 1\n"),
                "needs a `restart immediate:`",
            ),
            (
                SPEC.replace("clean: no\n", "clean: no\nrows: = a=1\n"),
                "rows: SQL",
            ),
            (
                SPEC.replace("clean: no\n", "clean: no\nschedule: first\n"),
                "schedule",
            ),
        ];
        for (text, expected) in bad {
            let error = parse(&text).expect_err(expected);
            assert!(
                error.message.contains(expected),
                "{error} lacks {expected:?}"
            );
        }
        // A permutation naming an unknown step is named by its own line.
        let text = SPEC.replace("permutation: a1 b1 a2", "permutation: a1 zz");
        let line = 1 + text
            .lines()
            .position(|l| l.starts_with("permutation: a1 zz"))
            .unwrap();
        assert_eq!(parse(&text).expect_err("unknown step").line, line);
    }

    #[test]
    fn every_order_keeps_each_sessions_order() {
        assert_eq!(
            all_orders(&[2, 1]),
            vec![
                vec![(0, 0), (0, 1), (1, 0)],
                vec![(0, 0), (1, 0), (0, 1)],
                vec![(1, 0), (0, 0), (0, 1)],
            ]
        );
        assert_eq!(all_orders(&[3, 3]).len(), 20);
        assert_eq!(all_orders(&[2, 2, 1]).len(), 30);
    }

    #[test]
    fn spec_ids_cannot_meet_hand_written_ids() {
        assert_eq!(spec_id("L", "s1_debit.spec").as_deref(), Some("L-S1"));
        assert_eq!(spec_id("L", "s12_x.spec").as_deref(), Some("L-S12"));
        assert_eq!(spec_id("L", "s01_x.spec"), None);
        assert_eq!(spec_id("L", "debit.spec"), None);
        assert_eq!(spec_id("L", "s1_x.txt"), None);
        assert_eq!(spec_id("L", "l03_real.spec").as_deref(), Some("L3"));
        assert_eq!(spec_id("L", "l12_x.spec").as_deref(), Some("L12"));
        assert_eq!(spec_id("L", "lx_x.spec"), None);
    }
}
