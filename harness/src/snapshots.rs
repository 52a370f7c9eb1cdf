//! Snapshot assertions (SPEC §7): each registered case's transcript, passed through the
//! one redaction layer (`cases::redact`), is compared with its committed insta snapshot
//! `evidence/snapshots/<id>.snap`. A mismatch is a failed check and prints a unified diff.
//!
//! Writing follows insta's `INSTA_UPDATE` convention, set once by [`configure`]:
//! - default: a mismatch writes `<id>.snap.new` beside the snapshot, for `cargo insta
//!   review` or `./run.sh --accept <id>`;
//! - `--accept` (or `INSTA_UPDATE=always`): the new transcript replaces the snapshot
//!   (review it with `git diff -- evidence/snapshots`); a case with a failed check is
//!   never accepted;
//! - `CI=true` (or `INSTA_UPDATE=no`): nothing is written.
//!
//! insta writes the files (its `.snap` format with a header: case, title, command,
//! PostgreSQL major version); this module decides the verdict from the files themselves,
//! so what it reports is what is on disk.

use std::path::{Path, PathBuf};

use cases::{CaseReport, Check, Line};
use insta::internals::TextSnapshotContents;
use serde::Serialize;

/// Folder of the committed snapshots, under the evidence folder.
pub const SNAPSHOT_DIR: &str = "snapshots";
/// How the snapshot's check begins: `transcript matches evidence/snapshots/<id>.snap`.
pub const MATCH_CHECK_PREFIX: &str = "transcript matches ";

/// What a run may write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    /// Compare; on a mismatch write `<id>.snap.new` for review.
    Review,
    /// Compare; write the new transcript over the snapshot (cases without failed checks).
    Accept,
    /// Compare only; write nothing (CI).
    ReadOnly,
}

/// Whether insta would see this environment as CI (`CI` set and not `false`/`0`/empty,
/// or `TF_BUILD` set): the same test insta applies.
pub fn is_ci() -> bool {
    match std::env::var("CI").ok().as_deref() {
        Some("false") | Some("0") | Some("") => false,
        Some(_) => true,
        None => std::env::var_os("TF_BUILD").is_some(),
    }
}

/// Chooses the mode and sets insta's environment accordingly. insta reads its settings
/// from the environment; they are set here, before any other thread exists.
///
/// Errors: `--accept` under CI (nothing may be written there).
pub fn configure(accept: bool, workspace_root: &Path) -> Result<Mode, String> {
    let requested = std::env::var("INSTA_UPDATE").unwrap_or_default();
    let mode = if is_ci() {
        if accept {
            return Err("--accept writes snapshots; refused under CI=true".into());
        }
        Mode::ReadOnly
    } else if accept || matches!(requested.as_str(), "always" | "1" | "force") {
        Mode::Accept
    } else if requested == "no" {
        Mode::ReadOnly
    } else {
        Mode::Review
    };
    let update = match mode {
        Mode::Review => "new",
        Mode::Accept => "always",
        Mode::ReadOnly => "no",
    };
    // SAFETY: called from `main` before the tokio runtime or any other thread starts, so
    // no other thread can be reading the environment.
    unsafe {
        std::env::set_var("INSTA_UPDATE", update);
        // The verdict and the diff are ours (insta would print "stopped on the first
        // failure" and panic; the run goes on and counts the failed check instead).
        std::env::set_var("INSTA_FORCE_PASS", "1");
        std::env::set_var("INSTA_OUTPUT", "none");
        std::env::set_var("INSTA_WORKSPACE_ROOT", workspace_root);
        std::env::remove_var("INSTA_PENDING_DIR");
        std::env::remove_var("INSTA_FORCE_UPDATE");
        std::env::remove_var("INSTA_FORCE_UPDATE_SNAPSHOTS");
    }
    Ok(mode)
}

/// The header insta writes into each snapshot (its `info` field).
#[derive(Debug, Serialize)]
struct Info<'a> {
    case: &'a str,
    title: &'a str,
    command: String,
    postgres_major: u32,
}

/// The outcome of one comparison.
#[derive(Debug)]
pub enum Verdict {
    /// The redacted transcript equals the snapshot.
    Matched,
    /// The snapshot was written (accept mode); `created` when there was none before.
    Written {
        /// Whether the snapshot file did not exist before.
        created: bool,
        /// Old snapshot → new transcript, unified.
        diff: String,
    },
    /// The transcript differs (or there is no snapshot) and the snapshot stays as it is.
    Differs {
        /// Whether a snapshot file exists at all.
        exists: bool,
        /// Old snapshot → new transcript, unified.
        diff: String,
        /// The `.snap.new` written for review, if any.
        pending: Option<PathBuf>,
        /// Why nothing was accepted, when accept mode declined.
        declined: Option<&'static str>,
    },
}

/// The snapshot store of a run.
pub struct Snapshots {
    dir: PathBuf,
    /// As shown in transcripts: relative to the workspace, e.g. `evidence/snapshots`.
    shown_dir: String,
    mode: Mode,
    postgres_major: u32,
}

impl Snapshots {
    /// A store in `dir` (absolute), shown as `shown_dir` in transcripts.
    pub fn new(dir: PathBuf, shown_dir: String, mode: Mode, postgres_major: u32) -> Snapshots {
        Snapshots {
            dir,
            shown_dir,
            mode,
            postgres_major,
        }
    }

    /// The snapshot file of a case, as shown in transcripts.
    pub fn shown_path(&self, case_id: &str) -> String {
        format!("{}/{case_id}.snap", self.shown_dir)
    }

    /// Compares `report`'s redacted transcript with its snapshot, lets insta write what
    /// the mode allows, and returns what happened. Call before adding the snapshot's own
    /// check line to the report.
    ///
    /// Errors: the snapshot could not be read or written.
    pub fn compare(&self, report: &CaseReport) -> anyhow::Result<Verdict> {
        let file = self.dir.join(format!("{}.snap", report.id));
        let body = cases::redact::redact(&report.transcript());
        let new = normalized(&body);
        let old = read_body(&file)?;
        let diff = unified_diff(
            old.as_deref().unwrap_or(""),
            &new,
            &self.shown_path(&report.id),
        );
        if old.as_deref() == Some(new.as_str()) {
            // insta also removes a stale `<id>.snap.new` when the snapshot matches.
            self.assert_with_insta(report, &body)?;
            return Ok(Verdict::Matched);
        }
        if self.mode == Mode::Accept && report.failed > 0 {
            return Ok(Verdict::Differs {
                exists: old.is_some(),
                diff,
                pending: None,
                declined: Some("not accepted: the case has failed checks"),
            });
        }
        self.assert_with_insta(report, &body)?;
        let pending = file.with_extension("snap.new");
        if read_body(&file)?.as_deref() == Some(new.as_str()) {
            // A `.snap.new` from an earlier run is settled now.
            let _ = std::fs::remove_file(&pending);
            return Ok(Verdict::Written {
                created: old.is_none(),
                diff,
            });
        }
        Ok(Verdict::Differs {
            exists: old.is_some(),
            diff,
            pending: (self.mode == Mode::Review && pending.exists()).then_some(pending),
            declined: None,
        })
    }

    fn assert_with_insta(&self, report: &CaseReport, body: &str) -> anyhow::Result<()> {
        let mut settings = insta::Settings::clone_current();
        settings.set_snapshot_path(&self.dir);
        settings.set_prepend_module_to_snapshot(false);
        settings.set_omit_expression(true);
        settings.set_description(format!("{} :: {}", report.id, report.title));
        settings.set_info(&Info {
            case: &report.id,
            title: &report.title,
            command: format!("./run.sh {}", report.id),
            postgres_major: self.postgres_major,
        });
        let name = report.id.clone();
        // insta unwraps its own I/O errors; turn such a panic into a harness error.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            settings.bind(|| insta::assert_snapshot!(name, body));
        }))
        .map_err(|_| {
            anyhow::anyhow!(
                "insta could not read or write {}",
                self.shown_path(&report.id)
            )
        })
    }

    /// Adds the snapshot's check (or a note when it is not compared) to `report` and
    /// returns the text to print below the transcript (a diff), if any.
    pub fn record(&self, report: &mut CaseReport, verdict: &Verdict) -> Option<String> {
        let shown = self.shown_path(&report.id);
        let check = |passed: bool, name: String, seen: String| {
            Line::Check(Check {
                name,
                passed,
                expected: None,
                actual: (!seen.is_empty()).then_some(seen),
            })
        };
        match verdict {
            Verdict::Matched => {
                report.push(check(
                    true,
                    format!("{MATCH_CHECK_PREFIX}{shown}"),
                    String::new(),
                ));
                None
            }
            Verdict::Written { created, diff } => {
                let what = if *created { "new" } else { "changed" };
                report.push(check(
                    true,
                    format!("transcript accepted into {shown}"),
                    format!("{what}; review with git diff before committing"),
                ));
                Some(diff.clone())
            }
            Verdict::Differs {
                exists,
                diff,
                pending,
                declined,
            } => {
                let mut seen = vec![if *exists {
                    "differs; diff below".to_string()
                } else {
                    "no snapshot yet; proposed transcript below".to_string()
                }];
                match (pending, declined) {
                    (_, Some(reason)) => seen.push(reason.to_string()),
                    (Some(pending), None) => seen.push(format!(
                        "new version in {}",
                        display_relative(pending, &self.dir, &self.shown_dir)
                    )),
                    (None, None) => seen.push("nothing written".to_string()),
                }
                report.push(check(
                    false,
                    format!("{MATCH_CHECK_PREFIX}{shown}"),
                    seen.join("; "),
                ));
                Some(diff.clone())
            }
        }
    }

    /// Adds a note that this case's transcript was not compared, and why.
    pub fn skip(&self, report: &mut CaseReport, why: &str) {
        report.push(Line::Note {
            text: format!(
                "transcript not compared with {}: {why}",
                self.shown_path(&report.id)
            ),
        });
    }

    /// Snapshot files in the store whose case is not in `registered` (left over after a
    /// case was renamed or removed).
    pub fn orphans(&self, registered: &[&str]) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut orphans: Vec<String> = entries
            .filter_map(|entry| entry.ok())
            .filter_map(|entry| entry.file_name().into_string().ok())
            .filter_map(|name| name.strip_suffix(".snap").map(str::to_string))
            .filter(|id| !registered.contains(&id.as_str()))
            .map(|id| self.shown_path(&id))
            .collect();
        orphans.sort();
        orphans
    }
}

/// The text as insta compares it (trailing whitespace trimmed, line endings unified).
fn normalized(text: &str) -> String {
    TextSnapshotContents::new(text.to_string(), insta::TextSnapshotKind::File).to_string()
}

/// The body of the snapshot at `file`, as insta reads it; `None` when there is none.
fn read_body(file: &Path) -> anyhow::Result<Option<String>> {
    if !file.exists() {
        return Ok(None);
    }
    let snapshot = insta::Snapshot::from_file(file)
        .map_err(|error| anyhow::anyhow!("reading {}: {error}", file.display()))?;
    Ok(snapshot.as_text().map(|text| text.to_string()))
}

fn unified_diff(old: &str, new: &str, shown: &str) -> String {
    let with_newline = |text: &str| {
        if text.is_empty() {
            String::new()
        } else {
            format!("{text}\n")
        }
    };
    let (old, new) = (with_newline(old), with_newline(new));
    similar::TextDiff::from_lines(&old, &new)
        .unified_diff()
        .context_radius(3)
        .header(shown, "this run (redacted)")
        .to_string()
}

fn display_relative(path: &Path, dir: &Path, shown_dir: &str) -> String {
    match path.strip_prefix(dir) {
        Ok(rest) => format!("{shown_dir}/{}", rest.display()),
        Err(_) => path.display().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_names_the_snapshot_and_shows_changed_lines() {
        let diff = unified_diff(
            "CASE L3 :: x\n  ok   a (expected=1, actual=1)",
            "CASE L3 :: x\n  FAIL a (expected=1, actual=2)",
            "evidence/snapshots/L3.snap",
        );
        assert!(diff.contains("--- evidence/snapshots/L3.snap"), "{diff}");
        assert!(diff.contains("-  ok   a (expected=1, actual=1)"), "{diff}");
        assert!(diff.contains("+  FAIL a (expected=1, actual=2)"), "{diff}");
    }

    #[test]
    fn normalization_ignores_trailing_newlines_only() {
        assert_eq!(normalized("a\nb\n\n"), "a\nb");
        assert_ne!(normalized("a\nb"), normalized("a\nc"));
    }
}
