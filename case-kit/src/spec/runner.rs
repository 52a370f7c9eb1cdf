//! The one runner: every case file of every family, on the family's engine
//! ([`SpecEngine`]: PostgreSQL, an SQLite file, MariaDB, a replicated pair, a
//! forgetful disk). It finds the files, refuses what the engine cannot run when they
//! are read, plays every permutation, then checks the expectations; the module
//! documentation of [`super`] describes the format and how a permutation is played.

use std::path::Path;
use std::sync::Arc;

use futures_util::FutureExt;

use super::engine::{Opening, SpecEngine};
use super::model::{Action, Entry, Expect, Layout, Spec};
use super::play;
use super::{load, same_meaning};
use crate::case::Case;
use crate::ctx::Ctx;

/// The case id of file `name` in family `prefix`, one rule for every family: a case
/// converted from Rust keeps its id, `<prefix>NN_<what>.spec` (the prefix in lower
/// case) is `<prefix>NN` (leading zeros dropped), tried first; otherwise
/// `sN_<what>.spec` is `<prefix>-SN` (`L-S1`; no leading zero). Hand-written case ids
/// are `<prefix>N` and never contain `-`, so the two forms cannot meet. In family S the
/// first form always wins: its files are all `sNN_<what>.spec` = `SNN`.
pub fn spec_id(prefix: &str, name: &str) -> Option<String> {
    let stem = name.strip_suffix(".spec")?;
    let digits = |rest: &str| {
        let number = rest.split('_').next()?.to_string();
        (!number.is_empty() && number.chars().all(|c| c.is_ascii_digit())).then_some(number)
    };
    let converted = stem
        .strip_prefix(&prefix.to_ascii_lowercase())
        .and_then(digits)
        .and_then(|digits| digits.parse::<u32>().ok());
    if let Some(number) = converted {
        return Some(format!("{prefix}{number}"));
    }
    let number = stem.strip_prefix('s').and_then(digits)?;
    (!number.starts_with('0')).then(|| format!("{prefix}-S{number}"))
}

/// The case files of family `prefix` found in `dir` (`*.spec`, read now; no
/// registration anywhere), run on `engine`: the `sN_` files first, by number, then
/// the converted cases, by number. A file that cannot be read, parsed or run on this
/// engine, or whose name follows neither form of [`spec_id`], still becomes a case,
/// one that fails with the reason, so a broken file is never silently skipped.
/// `shown_dir` is `dir` as printed (relative to the workspace).
pub fn cases_in(
    prefix: &str,
    dir: &Path,
    shown_dir: &str,
    engine: Arc<dyn SpecEngine>,
) -> Vec<Case> {
    cases_on(prefix, dir, shown_dir, &[engine])
}

/// A family's case files in its crate's `specs/` folder, written once: defines
/// `pub const SPEC_DIR` (that folder, absolute) and `pub fn cases()` (the files read now,
/// [`cases_on`] the engines given, in order).
///
/// ```ignore
/// case_kit::spec_files!("S", "cases/inventory/specs", [Arc::new(SqliteEngine)]);
/// ```
///
/// `$shown` is the folder as printed (relative to the workspace).
#[macro_export]
macro_rules! spec_files {
    ($prefix:expr, $shown:expr, [$($engine:expr),+ $(,)?]) => {
        /// Where the family's case files are.
        pub const SPEC_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/specs");

        /// The family's case files, read now (no registration, no rebuild), each on the
        /// engine its `system:` names; from the folder `LEDGER_SPEC_DIR_<prefix>` names
        /// instead, when set ([`$crate::spec::spec_dir`]).
        pub fn cases() -> Vec<$crate::Case> {
            let engines: &[std::sync::Arc<dyn $crate::spec::SpecEngine>] = &[$($engine),+];
            let (dir, shown) = $crate::spec::spec_dir($prefix, SPEC_DIR, $shown);
            $crate::spec::cases_on($prefix, &dir, &shown, engines)
        }
    };
}

/// The environment variable that points family `prefix` at another folder of case
/// files: `LEDGER_SPEC_DIR_<prefix>` (`LEDGER_SPEC_DIR_L`).
pub fn spec_dir_variable(prefix: &str) -> String {
    format!("LEDGER_SPEC_DIR_{prefix}")
}

/// Where family `prefix` reads its case files, and that folder as printed: the folder
/// [`spec_dir_variable`] names when it is set (a draft folder, or a test's folder of
/// broken files: `harness/tests/cli.rs`), else the crate's `specs/` (`compiled`, shown
/// as `shown`).
pub fn spec_dir(prefix: &str, compiled: &str, shown: &str) -> (std::path::PathBuf, String) {
    match std::env::var_os(spec_dir_variable(prefix)) {
        Some(dir) if !dir.is_empty() => {
            let dir = std::path::PathBuf::from(dir);
            let shown = dir.display().to_string();
            (dir, shown)
        }
        _ => (std::path::PathBuf::from(compiled), shown.to_string()),
    }
}

/// As [`cases_in`] for a family with several engines (P: an SQLite file and a
/// PostgreSQL cluster, each on a forgetful disk): each file runs on the engine whose
/// [`SpecEngine::system`] its `system:` names; a file that names none is a case that
/// fails, saying so (as on the first engine).
pub fn cases_on(
    prefix: &str,
    dir: &Path,
    shown_dir: &str,
    engines: &[Arc<dyn SpecEngine>],
) -> Vec<Case> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".spec"))
        .collect();
    let number = |name: &str| {
        let id = spec_id(prefix, name).unwrap_or_default();
        let digits: String = id.chars().filter(char::is_ascii_digit).collect();
        (!id.contains('-'), digits.parse::<u32>().unwrap_or(u32::MAX))
    };
    files.sort_by_key(|name| (number(name), name.clone()));
    files
        .into_iter()
        .map(|name| {
            let shown = format!("{shown_dir}/{name}");
            let loaded = load(dir, &name, &shown).and_then(|spec| {
                let named = engines.iter().find(|e| e.system() == spec.system);
                let engine = named.unwrap_or(&engines[0]).clone();
                runnable(&spec, engine.as_ref())
                    .map(|()| (spec, engine))
                    .map_err(|error| format!("{shown}: {error}"))
            });
            match (spec_id(prefix, &name), loaded) {
                (Some(id), Ok((spec, engine))) => spec_case(id, shown, Arc::new(spec), engine),
                (id, outcome) => {
                    let id = id.unwrap_or_else(|| format!("{prefix}-S-{name}"));
                    let reason = match outcome {
                        Err(reason) => reason,
                        Ok(_) => format!(
                            "{shown}: a case file is named sN_<what>.spec (N without a leading zero) \
                             or {}NN_<what>.spec",
                            prefix.to_ascii_lowercase()
                        ),
                    };
                    broken_case(id, reason)
                }
            }
        })
        .collect()
}

/// Every action of `spec`: setup, steps, after the restart, the race's (as its first
/// racer runs it, its `{i…}` filled in) and the call beside it.
fn actions(spec: &Spec) -> Vec<Action> {
    let steps = spec
        .sessions
        .iter()
        .flat_map(|s| &s.steps)
        .map(|s| &s.action);
    let written = spec.setup.iter().chain(steps).chain(&spec.after_restart);
    let racer = (spec.race.iter()).map(|race| super::race::for_racer(&race.action, 0));
    let alongside = spec
        .race
        .iter()
        .filter_map(|race| race.alongside.clone().map(Action::Call));
    written.cloned().chain(racer).chain(alongside).collect()
}

/// Whether `spec` can run on `engine`: its `system:`, its calls (the engine's verb
/// set), and a race, a restart or PostgreSQL's layout only where the engine offers
/// them ([`SpecEngine::postgres`]).
fn runnable(spec: &Spec, engine: &dyn SpecEngine) -> Result<(), String> {
    if spec.system != engine.system() {
        return Err(format!(
            "system: {} is not this family's {}",
            spec.system,
            engine.system()
        ));
    }
    let needs = if spec.race.is_some() {
        Some("a race")
    } else if spec.restart.is_some() {
        Some("`restart immediate:`")
    } else if spec.layout == Layout::Postgres {
        Some("PostgreSQL's format")
    } else if (spec.expectations.iter()).any(|e| matches!(e, Expect::ExposesOutcome { .. })) {
        Some("`exposes:` decided by a race's outcomes")
    } else {
        None
    };
    if let (Some(what), None) = (needs, engine.postgres()) {
        return Err(format!("{what} runs on PostgreSQL only"));
    }
    for action in actions(spec) {
        if let Action::Call(call) = action {
            engine.check(&call).map_err(|e| {
                let shown = as_written(spec, &call);
                match call.line {
                    0 => format!("call {shown}: {e}"),
                    line => format!("line {line}: call {shown}: {e}"),
                }
            })?;
        }
    }
    Ok(())
}

/// `call` as the file wrote it: a race's call with its `{i…}` (checked as its first racer
/// runs it, [`actions`]), any other call as it is.
fn as_written(spec: &Spec, call: &super::model::Call) -> String {
    match spec.race.as_ref().map(|race| &race.action) {
        Some(Action::Call(raced)) if raced.line == call.line && raced.op == call.op => {
            raced.display()
        }
        _ => call.display(),
    }
}

fn broken_case(id: String, reason: String) -> Case {
    let problem = reason.clone();
    Case::new(id, "spec file that cannot be run", move |_ctx: &mut Ctx| {
        let reason = reason.clone();
        async move { Err(anyhow::anyhow!(reason)) }.boxed()
    })
    .not_clean()
    .broken(problem)
}

/// A case that runs `spec` on `engine`: one connection per session, a monitor and the
/// setup's (a racer each, a holder and the race's own for a race), and what its calls
/// hold besides ([`SpecEngine::connections`]).
pub fn spec_case(id: String, shown: String, spec: Arc<Spec>, engine: Arc<dyn SpecEngine>) -> Case {
    let connections =
        spec.sessions.len() as u32 + 2 + spec.race.as_ref().map_or(0, |r| r.count as u32 + 4);
    let calls: u32 = actions(&spec)
        .iter()
        .map(|action| match action {
            Action::Call(call) => engine.connections(call),
            Action::Sql(_) => 0,
        })
        .sum();
    let (clean, schedule, restart) = (spec.clean, spec.schedule, spec.restart.clone());
    let case = Case::new(id, spec.title.clone(), move |ctx: &mut Ctx| {
        let (spec, engine, shown) = (spec.clone(), engine.clone(), shown.clone());
        async move { run(ctx, &shown, &spec, engine).await }.boxed()
    })
    .connections(connections + calls);
    let case = match schedule {
        Some(schedule) => case.schedule(schedule),
        None => case,
    };
    let case = match restart {
        Some(reason) => case.restarts_server(reason),
        None => case,
    };
    if clean { case } else { case.not_clean() }
}

/// Runs every permutation of `spec` on `engine` and writes the transcript: in our
/// layout, a summary and each permutation's lines under its label; in PostgreSQL's
/// layout, the lines its tester prints. A spec with an expected output then checks
/// that the transcript means the same ([`same_meaning`]); then the crash, then the
/// expectations.
///
/// Errors: connection failures; a database of a permutation that cannot be made.
pub async fn run(
    ctx: &mut Ctx,
    shown: &str,
    spec: &Spec,
    engine: Arc<dyn SpecEngine>,
) -> anyhow::Result<()> {
    let engine = engine.for_case(ctx).unwrap_or(engine);
    // Ends what the operations started, also when the case is cancelled midway.
    let _ended = Ended(engine.clone());
    engine.describe(ctx);
    let orders = spec.orders();
    summary(ctx, shown, spec, orders.len());
    if let (Some(race), Some(calls)) = (&spec.race, engine.postgres()) {
        return super::race::run(ctx, spec, race, engine.as_ref(), calls).await;
    }
    let printed = permutations(ctx, spec, engine.as_ref(), &orders).await?;
    after_permutations(ctx, spec, engine.as_ref(), &printed).await
}

/// Plays every order of `orders`, each on the database of its permutation, notes its
/// lines and checks that it ran every step and left none waiting; returns the
/// transcript as printed (for a comparison with PostgreSQL's expected output).
///
/// Errors: a database of a permutation that cannot be made.
async fn permutations(
    ctx: &mut Ctx,
    spec: &Spec,
    engine: &dyn SpecEngine,
    orders: &[Vec<Entry>],
) -> anyhow::Result<String> {
    let postgres = spec.layout == Layout::Postgres;
    let mut printed = String::new();
    if postgres {
        printed = format!("Parsed test spec with {} sessions\n", spec.sessions.len());
        ctx.note(printed.trim_end().to_string());
    }
    for (number, order) in orders.iter().enumerate() {
        let label = format!("permutation {} of {}", number + 1, orders.len());
        let names: Vec<&str> = order.iter().map(|e| e.name.as_str()).collect();
        let mut lines = Vec::new();
        if postgres {
            lines.push(String::new());
            lines.push(format!("starting permutation: {}", names.join(" ")));
        } else {
            ctx.note(format!("{label}: {}", names.join(" ")));
        }
        engine.begin(ctx, number + 1).await?;
        let outcome = play_one(ctx, engine, number + 1, spec, order, &mut lines).await;
        for line in &lines {
            printed.push_str(line);
            printed.push('\n');
            if !line.trim().is_empty() {
                let indent = if postgres { "" } else { "  " };
                ctx.note(format!("{indent}{}", line.trim_end()));
            }
        }
        let seen = outcome.err().map(|e| format!("{e:#}")).unwrap_or_default();
        let name = format!("{label} ran every step, none left waiting");
        ctx.check(name, seen.is_empty(), seen);
    }
    Ok(printed)
}

/// What follows the permutations: the comparison with an expected output, the crash
/// (`restart immediate:`), then the expectations.
///
/// Errors: the restart fails; no connection for the expectations.
async fn after_permutations(
    ctx: &mut Ctx,
    spec: &Spec,
    engine: &dyn SpecEngine,
    printed: &str,
) -> anyhow::Result<()> {
    if let Some((file, expected)) = &spec.expected {
        let verdict = same_meaning(printed, expected);
        let seen = verdict.clone().err().unwrap_or_default();
        let name = format!("the transcript means what {file} says");
        ctx.check(name, verdict.is_ok(), seen);
    }
    if spec.restart.is_some() {
        super::restart::run(ctx, spec, engine).await?;
    }
    if !spec.expectations.is_empty() {
        let mut db = engine.expectations(ctx).await?;
        super::expect::run(ctx, db.as_mut(), engine, &spec.expectations, "").await;
    }
    Ok(())
}

/// Calls [`SpecEngine::end`] when dropped.
struct Ended(Arc<dyn SpecEngine>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// Notes what `spec` is: its sessions, steps and permutations, and where an upstream
/// spec comes from.
fn summary(ctx: &mut Ctx, shown: &str, spec: &Spec, orders: usize) {
    record_shape(ctx, spec);
    let steps: usize = spec.sessions.iter().map(|s| s.steps.len()).sum();
    if let Some(race) = &spec.race {
        let then = match steps {
            0 => String::new(),
            1 => ", then 1 step".to_string(),
            n => format!(", then {n} steps"),
        };
        ctx.note(format!(
            "spec {shown}: a race of {} sessions{then}",
            race.count
        ));
        return;
    }
    let how = if spec.permutations.is_empty() {
        "every order"
    } else {
        "as listed"
    };
    let plural = |n: usize, word: &str| format!("{n} {word}{}", if n == 1 { "" } else { "s" });
    ctx.note(format!(
        "spec {shown}: {}, {}, {} ({how})",
        plural(spec.sessions.len(), "session"),
        plural(steps, "step"),
        plural(orders, "permutation")
    ));
    if !spec.upstream.is_empty() {
        let upstream = spec.upstream.split_whitespace().collect::<Vec<_>>();
        ctx.note(format!("upstream: {}", upstream.join(" ")));
    }
}

/// Records for the evidence page the spec's claim, its failure condition and which
/// session each step belongs to (`details["claim"]`, `["fails"]`, `["spec_sessions"]`:
/// session name → its step names).
fn record_shape(ctx: &mut Ctx, spec: &Spec) {
    ctx.record("claim", serde_json::Value::String(spec.claim.clone()));
    ctx.record("fails", serde_json::Value::String(spec.fails.clone()));
    let sessions: serde_json::Map<String, serde_json::Value> = spec
        .sessions
        .iter()
        .map(|session| {
            let steps = session.steps.iter().map(|step| step.name.clone().into());
            (
                session.name.clone(),
                serde_json::Value::Array(steps.collect()),
            )
        })
        .collect();
    ctx.record("spec_sessions", serde_json::Value::Object(sessions));
}

/// Plays `order` on the database of `permutation`: the spec's setup on a connection
/// of its own, closed before the sessions open (so a step that closes its own
/// connection leaves an SQLite file with none open), the steps, then the spec's
/// teardown on another connection (its rows printed).
///
/// Errors: a setup that fails; a step that cannot be sent or finished (the sessions
/// are cancelled and torn down first).
async fn play_one(
    ctx: &Ctx,
    engine: &dyn SpecEngine,
    permutation: usize,
    spec: &Spec,
    order: &[Entry],
    lines: &mut Vec<String>,
) -> anyhow::Result<()> {
    let opening = Opening::plain(permutation, spec.layout);
    let mut setup = engine.connect(ctx, opening.clone()).await?;
    play::setup(setup.as_mut(), spec, lines).await?;
    drop(setup);
    let result = play::play_steps(ctx, engine, permutation, spec, order, lines).await;
    let mut teardown = engine.connect(ctx, opening).await?;
    play::teardown(teardown.as_mut(), spec, lines).await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::verbs::{Kind, Verb, Verbs, needs};
    use crate::spec::{Calls, NoCalls};

    /// An engine over PostgreSQL whose one verb takes an integer `amount=`.
    struct Debits;

    const DEBITS: Verbs = Verbs {
        title: "test",
        verbs: &[Verb {
            name: "debit",
            args: &[needs("amount", Kind::Integer), needs("key", Kind::Word)],
            doc: "a debit",
        }],
    };

    impl SpecEngine for Debits {
        fn system(&self) -> &str {
            "t"
        }
        fn verbs(&self) -> Vec<&'static Verbs> {
            vec![&DEBITS]
        }
        fn postgres(&self) -> Option<Arc<dyn Calls>> {
            Some(Arc::new(NoCalls))
        }
        fn connect<'a>(
            &'a self,
            _: &'a Ctx,
            _: Opening,
        ) -> futures_util::future::BoxFuture<'a, anyhow::Result<Box<dyn super::super::EngineSession>>>
        {
            async { anyhow::bail!("not connected in a unit test") }.boxed()
        }
    }

    #[test]
    fn a_races_action_is_checked_as_its_racers_run_it() {
        let race = |amount: &str| {
            let text = format!(
                "title: t\nclaim: c\nfails: f\nsystem: t\nclean: no\n\
                 race call: 3 debit amount={amount} key=k-{{i}}\nexpect: ok=3\n"
            );
            crate::spec::parse(&text).expect("parses")
        };
        assert_eq!(runnable(&race("{i%3+5}"), &Debits), Ok(()));
        let refused = runnable(&race("x{i}"), &Debits).expect_err("not an integer");
        assert!(refused.contains("takes an integer"), "{refused}");
    }

    #[test]
    fn one_id_rule_for_every_family() {
        assert_eq!(spec_id("L", "s1_x.spec").as_deref(), Some("L-S1"));
        assert_eq!(spec_id("L", "s01_x.spec"), None);
        assert_eq!(spec_id("L", "l03_x.spec").as_deref(), Some("L3"));
        assert_eq!(spec_id("S", "s01_x.spec").as_deref(), Some("S1"));
        assert_eq!(spec_id("S", "s10_x.spec").as_deref(), Some("S10"));
        assert_eq!(spec_id("I", "i03_x.spec").as_deref(), Some("I3"));
        assert_eq!(spec_id("I", "s2_x.spec").as_deref(), Some("I-S2"));
        assert_eq!(spec_id("I", "x.spec"), None);
        assert_eq!(spec_id("L", "s1_x.txt"), None);
    }
}
