//! Snapshot assertions (SPEC §7): each default case's transcript, passed through the one
//! redaction layer ([`crate::redact`]), is compared with its committed snapshot
//! `evidence/snapshots/<family>/<id>.snap`. A mismatch is a failed check with a unified
//! diff.
//!
//! The files keep insta's `.snap` layout (a header between `---` lines, then the body),
//! so they read the same as before and any insta tooling can open them; this module
//! reads and writes them itself rather than driving insta's assertion macro from
//! outside a test. What may be written follows insta's `INSTA_UPDATE` convention:
//! - default (`INSTA_UPDATE` unset, `auto` or `new`): a mismatch of a case whose own
//!   checks all passed leaves the proposed transcript as `<id>.snap.new` beside the
//!   snapshot; a case with a failed check gets none (an older one is removed);
//! - `--accept` (or `INSTA_UPDATE=always`): the new transcript replaces the snapshot
//!   (review it with `git diff -- evidence/snapshots`); a case with a failed check is
//!   never accepted;
//! - `CI=true` (insta's own CI test) or `INSTA_UPDATE=no`: nothing is written.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::report::{CaseReport, Check, Line};

/// How the snapshot's check begins: `transcript matches evidence/snapshots/L/L3.snap`.
pub const MATCH_CHECK_PREFIX: &str = "transcript matches ";
/// The `source:` field written into new snapshot headers.
const SOURCE: &str = "case-kit/src/snapshot.rs";

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

/// The mode for a run: `--accept`, else `INSTA_UPDATE`, and never a write under CI.
///
/// Errors: `--accept` under CI (nothing may be written there).
pub fn mode(accept: bool) -> Result<Mode, String> {
    let requested = std::env::var("INSTA_UPDATE").unwrap_or_default();
    if is_ci() {
        if accept {
            return Err(
                "--accept writes snapshots, which CI must not do; run it without CI=true".into(),
            );
        }
        return Ok(Mode::ReadOnly);
    }
    Ok(
        if accept || matches!(requested.as_str(), "always" | "1" | "force") {
            Mode::Accept
        } else if requested == "no" {
            Mode::ReadOnly
        } else {
            Mode::Review
        },
    )
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

/// The snapshot store of a run: `<root>/<family>/<id>.snap`.
pub struct Snapshots {
    root: PathBuf,
    /// As shown in transcripts: relative to the workspace, e.g. `evidence/snapshots`.
    shown_root: String,
    mode: Mode,
    postgres_major: Option<u32>,
}

impl Snapshots {
    /// A store under `root` (absolute), shown as `shown_root` in transcripts; headers of
    /// snapshots written from PostgreSQL families name `postgres_major`.
    pub fn new(
        root: PathBuf,
        shown_root: String,
        mode: Mode,
        postgres_major: Option<u32>,
    ) -> Snapshots {
        Snapshots {
            root,
            shown_root,
            mode,
            postgres_major,
        }
    }

    fn file(&self, family: &str, case_id: &str) -> PathBuf {
        self.root.join(family).join(format!("{case_id}.snap"))
    }

    /// The snapshot file of a case, as shown in transcripts.
    pub fn shown_path(&self, family: &str, case_id: &str) -> String {
        format!("{}/{family}/{case_id}.snap", self.shown_root)
    }

    /// Compares `report`'s redacted transcript with its snapshot, writes what the mode
    /// allows, and returns what happened. `uses_postgres` says whether the header names
    /// the PostgreSQL major version. Call before adding the snapshot's own check line.
    ///
    /// Errors: the snapshot could not be read or written.
    pub fn compare(&self, report: &CaseReport, uses_postgres: bool) -> anyhow::Result<Verdict> {
        let file = self.file(&report.family, &report.id);
        let pending = file.with_extension("snap.new");
        let new = normalized(&crate::redact::redact(&report.transcript()));
        let old = read_body(&file)?;
        let diff = unified_diff(
            old.as_deref().unwrap_or(""),
            &new,
            &self.shown_path(&report.family, &report.id),
        );
        if old.as_deref() == Some(new.as_str()) {
            remove_if_present(&pending)?;
            return Ok(Verdict::Matched);
        }
        let header = Header {
            case: &report.id,
            title: &report.title,
            command: format!("./run.sh {}", report.id),
            postgres_major: self.postgres_major.filter(|_| uses_postgres),
        };
        match self.mode {
            Mode::Accept if report.failed > 0 => Ok(Verdict::Differs {
                exists: old.is_some(),
                diff,
                pending: None,
                declined: Some("not accepted: the case has failed checks"),
            }),
            Mode::Accept => {
                write_snapshot(&file, &header, &new)?;
                remove_if_present(&pending)?;
                Ok(Verdict::Written {
                    created: old.is_none(),
                    diff,
                })
            }
            // A case whose own checks failed gets no `.snap.new` (like `--accept`, review
            // mode never proposes a failing transcript); an older one is removed.
            Mode::Review if report.failed > 0 => {
                remove_if_present(&pending)?;
                Ok(Verdict::Differs {
                    exists: old.is_some(),
                    diff,
                    pending: None,
                    declined: Some("no .snap.new: the case has failed checks"),
                })
            }
            Mode::Review => {
                write_snapshot(&pending, &header, &new)?;
                Ok(Verdict::Differs {
                    exists: old.is_some(),
                    diff,
                    pending: Some(pending),
                    declined: None,
                })
            }
            Mode::ReadOnly => Ok(Verdict::Differs {
                exists: old.is_some(),
                diff,
                pending: None,
                declined: None,
            }),
        }
    }

    /// Adds the snapshot's check to `report` and returns the text to print below the
    /// transcript (a diff), if any.
    pub fn record(&self, report: &mut CaseReport, verdict: &Verdict) -> Option<String> {
        let shown = self.shown_path(&report.family, &report.id);
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
                    (Some(pending), None) => {
                        seen.push(format!("new version in {}", self.display_relative(pending)))
                    }
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
                self.shown_path(&report.family, &report.id)
            ),
        });
    }

    /// Snapshot files whose case is not registered: `registered` lists (family, case
    /// ids); files directly under the root or in unknown family folders count too.
    pub fn orphans(&self, registered: &[(&str, Vec<&str>)]) -> Vec<String> {
        let mut orphans = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return orphans;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name().to_string_lossy().into_owned();
            let path = entry.path();
            if path.is_dir() {
                let ids = registered
                    .iter()
                    .find(|(family, _)| *family == name)
                    .map(|(_, ids)| ids.as_slice())
                    .unwrap_or(&[]);
                for file in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                    let file = file.file_name().to_string_lossy().into_owned();
                    if let Some(id) = file.strip_suffix(".snap")
                        && !ids.contains(&id)
                    {
                        orphans.push(self.shown_path(&name, id));
                    }
                }
            } else if name.ends_with(".snap") {
                orphans.push(format!("{}/{name}", self.shown_root));
            }
        }
        orphans.sort();
        orphans
    }

    fn display_relative(&self, path: &Path) -> String {
        match path.strip_prefix(&self.root) {
            Ok(rest) => format!("{}/{}", self.shown_root, rest.display()),
            Err(_) => path.display().to_string(),
        }
    }
}

/// The header's `info` member.
struct Header<'a> {
    case: &'a str,
    title: &'a str,
    command: String,
    postgres_major: Option<u32>,
}

/// A YAML scalar as insta writes one: plain when it is a simple word or path, else a
/// double-quoted string (JSON's escaping is valid YAML).
fn scalar(text: &str) -> String {
    let plain = !text.is_empty()
        && !text.starts_with(['.', '-'])
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '/' | '.' | '-'));
    if plain {
        text.to_string()
    } else {
        serde_json::to_string(text).unwrap_or_default()
    }
}

fn write_snapshot(file: &Path, header: &Header<'_>, body: &str) -> anyhow::Result<()> {
    let mut text = format!(
        "---\nsource: {}\ndescription: {}\ninfo:\n  case: {}\n  title: {}\n  command: {}\n",
        scalar(SOURCE),
        scalar(&format!("{} :: {}", header.case, header.title)),
        scalar(header.case),
        scalar(header.title),
        scalar(&header.command),
    );
    if let Some(major) = header.postgres_major {
        text.push_str(&format!("  postgres_major: {major}\n"));
    }
    text.push_str("---\n");
    text.push_str(body);
    text.push('\n');
    if let Some(folder) = file.parent() {
        std::fs::create_dir_all(folder)?;
    }
    std::fs::write(file, text)
        .map_err(|error| anyhow::anyhow!("writing {}: {error}", file.display()))
}

fn remove_if_present(file: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(file) {
        Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
            Err(anyhow::anyhow!("removing {}: {error}", file.display()))
        }
        _ => Ok(()),
    }
}

/// The text as insta compares it: line endings unified, trailing newlines trimmed.
fn normalized(text: &str) -> String {
    text.replace("\r\n", "\n")
        .trim_end_matches('\n')
        .to_string()
}

/// The body of the snapshot at `file` (after the header's closing `---` line);
/// `None` when there is none.
///
/// Errors: the file cannot be read, or has no header.
fn read_body(file: &Path) -> anyhow::Result<Option<String>> {
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => anyhow::bail!("reading {}: {error}", file.display()),
    };
    let text = text.replace("\r\n", "\n");
    let body = text
        .strip_prefix("---\n")
        .and_then(|rest| rest.split_once("\n---\n"))
        .map(|(_, body)| body)
        .ok_or_else(|| anyhow::anyhow!("{} has no snapshot header", file.display()))?;
    Ok(Some(normalized(body)))
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_names_the_snapshot_and_shows_changed_lines() {
        let diff = unified_diff(
            "CASE L3 :: x\n  ok   a (expected=1, actual=1)",
            "CASE L3 :: x\n  FAIL a (expected=1, actual=2)",
            "evidence/snapshots/L/L3.snap",
        );
        assert!(diff.contains("--- evidence/snapshots/L/L3.snap"), "{diff}");
        assert!(diff.contains("-  ok   a (expected=1, actual=1)"), "{diff}");
        assert!(diff.contains("+  FAIL a (expected=1, actual=2)"), "{diff}");
    }

    #[test]
    fn normalization_ignores_trailing_newlines_only() {
        assert_eq!(normalized("a\nb\n\n"), "a\nb");
        assert_ne!(normalized("a\nb"), normalized("a\nc"));
    }

    #[test]
    fn written_snapshots_read_back_and_quote_like_insta() {
        let dir = std::env::temp_dir().join(format!("case-kit-snap-{}", std::process::id()));
        let file = dir.join("X/X1.snap");
        let header = Header {
            case: "X1",
            title: "a title: with a colon",
            command: "./run.sh X1".into(),
            postgres_major: Some(16),
        };
        write_snapshot(
            &file,
            &header,
            "CASE X1 :: a title: with a colon\n  note n=1",
        )
        .unwrap();
        let text = std::fs::read_to_string(&file).unwrap();
        assert!(text.contains("\n  case: X1\n"), "{text}");
        assert!(
            text.contains("\n  title: \"a title: with a colon\"\n"),
            "{text}"
        );
        assert!(text.contains("\n  command: \"./run.sh X1\"\n"), "{text}");
        assert!(text.contains("\n  postgres_major: 16\n---\n"), "{text}");
        assert_eq!(
            read_body(&file).unwrap().as_deref(),
            Some("CASE X1 :: a title: with a colon\n  note n=1")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn report(id: &str, passed: bool) -> CaseReport {
        let mut report = CaseReport {
            id: id.into(),
            title: "t".into(),
            family: "X".into(),
            schedule: crate::Schedule::Concurrent,
            resource: "none".into(),
            passed: 0,
            failed: 0,
            duration_ms: 0,
            lines: Vec::new(),
            details: Default::default(),
        };
        report.push(Line::Check(Check {
            name: "a".into(),
            passed,
            expected: None,
            actual: None,
        }));
        report
    }

    #[test]
    fn review_mode_writes_snap_new_only_for_a_case_without_failed_checks() {
        let dir = std::env::temp_dir().join(format!("case-kit-review-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let store = Snapshots::new(dir.clone(), "snaps".into(), Mode::Review, None);
        let pending = dir.join("X/X1.snap.new");

        let verdict = store.compare(&report("X1", true), false).unwrap();
        assert!(matches!(
            verdict,
            Verdict::Differs {
                pending: Some(_),
                ..
            }
        ));
        assert!(pending.exists());

        // The same case failing: no proposal, and the older one goes.
        let verdict = store.compare(&report("X1", false), false).unwrap();
        assert!(matches!(
            verdict,
            Verdict::Differs {
                pending: None,
                declined: Some(_),
                ..
            }
        ));
        assert!(!pending.exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn committed_snapshots_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../evidence/snapshots/L/L1.snap");
        let body = read_body(&root).unwrap().expect("L1.snap is committed");
        assert!(body.starts_with("CASE L1 :: "), "{body}");
    }
}
