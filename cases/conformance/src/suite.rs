//! The catalogue of family C and one run of it against one target: each case in order,
//! alone, bounded by [`crate::CASE_TIMEOUT_MS`]; a case whose needs the target was not
//! given is listed as not run with the reason.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::case::{CaseDef, Needs, Run};
use crate::outcome::CaseOutcome;
use crate::target::Target;

/// Every case, in order (docs/conformance.md has the same table).
pub const CASES: &[CaseDef] = &[
    crate::basic::C1,
    crate::basic::C2,
    crate::races::C3,
    crate::races::C4,
    crate::races::C5,
    crate::kill::C6,
    crate::basic::C7,
    crate::random::C8,
];

/// Runs case `def` into `out`; an `Err` is a reason the case could not go on.
async fn dispatch(def: &CaseDef, run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    match def.id {
        "C1" => crate::basic::c1(run, out).await,
        "C2" => crate::basic::c2(run, out).await,
        "C3" => crate::races::c3(run, out).await,
        "C4" => crate::races::c4(run, out).await,
        "C5" => crate::races::c5(run, out).await,
        "C6" => crate::kill::c6(run, out).await,
        "C7" => crate::basic::c7(run, out).await,
        "C8" => crate::random::c8(run, out).await,
        other => Err(format!("no case {other}")),
    }
}

/// Runs the cases named in `selected` (all when empty) against `run`'s target, one after
/// another, and returns their outcomes in catalogue order.
pub async fn run_cases(run: &Run, selected: &[String]) -> Vec<CaseOutcome> {
    let mut outcomes = Vec::new();
    for def in CASES {
        if !selected.is_empty() && !selected.iter().any(|s| s == def.id) {
            continue;
        }
        let mut out = CaseOutcome::new(def.id, def.title, def.claim, def.fails);
        let started = Instant::now();
        if let Some(reason) = missing(def, &run.target) {
            out.not_run = Some(reason);
        } else {
            run_one(def, run, &mut out).await;
        }
        out.duration_ms = started.elapsed().as_millis();
        eprintln!(
            "conformance: {} {} passed={} failed={}{}",
            run.target.spec.label,
            def.id,
            out.passed(),
            out.failed(),
            if out.not_run.is_some() {
                " (not run)"
            } else {
                ""
            }
        );
        outcomes.push(out);
    }
    outcomes
}

/// Runs one case within its bound; an early end or the bound is a failed check.
async fn run_one(def: &CaseDef, run: &Run, out: &mut CaseOutcome) {
    let bound = if def.id == "C8" {
        crate::RANDOM_CASE_TIMEOUT_MS
    } else {
        crate::CASE_TIMEOUT_MS
    };
    let mut inner = out.clone();
    let result =
        tokio::time::timeout(Duration::from_millis(bound), dispatch(def, run, &mut inner)).await;
    match result {
        Ok(Ok(())) => *out = inner,
        Ok(Err(reason)) => {
            let checked = inner.passed() + inner.failed() > 0;
            *out = inner;
            match reason.strip_prefix(crate::NOT_GIVEN) {
                Some(need) if !checked => out.not_run = Some(need.to_owned()),
                _ => {
                    out.check("the case ran to its end", false, reason);
                }
            }
        }
        Err(_) => {
            out.check(
                "the case ran to its end",
                false,
                format!("still running after {bound} ms (CASE_TIMEOUT_MS); stopped"),
            );
        }
    }
    let checked = out.passed() + out.failed() > 0;
    if out.not_run.is_none() && !checked {
        out.check("the case checked something", false, "no check was made");
    }
}

/// Why `def` cannot run against `target`, if it cannot.
fn missing(def: &CaseDef, target: &Target) -> Option<String> {
    match def.needs {
        Needs::Url => None,
        Needs::KillAndRestart if !target.can_kill() => Some(
            "needs a way to kill the target: --kill-command, --kill-pid or --start-command"
                .to_owned(),
        ),
        Needs::KillAndRestart if !target.can_restart() => {
            Some("needs --start-command to start the target again after the kill".to_owned())
        }
        Needs::KillAndRestart => None,
    }
}

/// Opens the target of `spec` (starting it when it has a start command), runs the cases
/// named in `selected` (all when empty) and writes the evidence into `dir`. A target that
/// cannot be opened fails every selected case with the reason. Returns the outcomes.
///
/// Errors: the evidence cannot be written.
pub async fn run_against(
    spec: crate::target::TargetSpec,
    selected: &[String],
    seed: u64,
    dir: &std::path::Path,
) -> anyhow::Result<Vec<CaseOutcome>> {
    std::fs::create_dir_all(dir)?;
    let started = Instant::now();
    let run_id = format!(
        "{:x}{:x}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    );
    let outcomes = match Target::open(spec.clone(), dir.join("target.log"), &run_id).await {
        Ok(target) => {
            let run = Run {
                target: Arc::new(target),
                http: crate::http::client()?,
                run_id,
                seed,
            };
            let outcomes = run_cases(&run, selected).await;
            run.target.stop();
            outcomes
        }
        Err(reason) => CASES
            .iter()
            .filter(|def| selected.is_empty() || selected.iter().any(|s| s == def.id))
            .map(|def| {
                let mut out = CaseOutcome::new(def.id, def.title, def.claim, def.fails);
                out.check("the target could be reached", false, reason.clone());
                out
            })
            .collect(),
    };
    let record = crate::outcome::RunRecord {
        target: &spec,
        cases: &outcomes,
        seed,
        wall_ms: started.elapsed().as_millis(),
        command: std::env::args().collect(),
    };
    record.write(dir)?;
    Ok(outcomes)
}
