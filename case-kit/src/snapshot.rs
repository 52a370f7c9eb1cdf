//! Snapshot assertions (SPEC §7): each default case's transcript, passed through the one
//! redaction layer ([`crate::redact`]), is compared with its committed snapshot
//! `evidence/snapshots/<family>/<id>.snap`. A mismatch is a failed check with a unified
//! diff.
//!
//! The files are insta's: insta reads each snapshot ([`insta::Snapshot::from_file`]) and
//! insta's own text comparison decides whether the transcript matches (the one insta's
//! `assert_snapshot!` applies to a file snapshot: line endings unified, trailing
//! whitespace trimmed). A proposal is written as insta's pending file `<id>.snap.new`
//! beside the snapshot, where `cargo insta pending-snapshots`, `review`, `accept` and
//! `reject` find it (cargo-insta scans the source folder of every target in `cargo
//! metadata`; case-kit's test target `snapshot_review` has its source in `evidence/`
//! so that `evidence/snapshots` is scanned, and checks that it is). The header is
//! written here, in the bytes insta's own serializer gives (that test compares them),
//! because insta writes a snapshot only from its assertion macro, which panics on a
//! mismatch and reads `INSTA_UPDATE` once per process, while a run must decide per case
//! (a case with a failed check is never proposed or accepted). What may be written
//! follows insta's `INSTA_UPDATE` convention:
//! - default (`INSTA_UPDATE` unset, `auto` or `new`): a mismatch of a case whose own
//!   checks all passed leaves the proposed transcript as `<id>.snap.new` beside the
//!   snapshot; a case with a failed check gets none (an older one is removed);
//! - `--accept` (or `INSTA_UPDATE=always`): the new transcript replaces the snapshot
//!   (review it with `git diff -- evidence/snapshots`); a case with a failed check is
//!   never accepted;
//! - `CI=true` (insta's own CI test) or `INSTA_UPDATE=no`: nothing is written.

use std::path::{Path, PathBuf};

use insta::internals::{SnapshotContents, TextSnapshotContents};
use insta::{Snapshot, TextSnapshotKind};
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
        let new = SnapshotContents::from(TextSnapshotContents::new(
            crate::redact::redact(&report.transcript()),
            TextSnapshotKind::File,
        ));
        let old = read_snapshot(&file)?;
        if old.as_ref().is_some_and(|old| old.contents() == &new) {
            remove_if_present(&pending)?;
            return Ok(Verdict::Matched);
        }
        // As insta writes and shows them: normalized.
        let new = text_of(&new);
        let old = old.as_ref().map(|old| text_of(old.contents()));
        let diff = unified_diff(
            old.as_deref().unwrap_or(""),
            &new,
            &self.shown_path(&report.family, &report.id),
        );
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
                compared: Default::default(),
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

/// A YAML scalar as insta's serializer writes one (insta's vendored YAML emitter, whose
/// rule this follows), so that `cargo insta accept` rewrites a proposal byte for byte:
/// plain unless the text is empty, has a space at either end, starts with one of
/// `&*?|-<>=!%@.` or `0x`, holds one of `:{}[],#`"'\` or a control character, or reads
/// as a YAML boolean, null or number; then double-quoted with escapes.
fn scalar(text: &str) -> String {
    const WORDS: [&str; 22] = [
        "yes", "Yes", "YES", "no", "No", "NO", "True", "TRUE", "true", "False", "FALSE", "false",
        "on", "On", "ON", "off", "Off", "OFF", "null", "Null", "NULL", "~",
    ];
    let quoted = text.is_empty()
        || text.starts_with(' ')
        || text.ends_with(' ')
        || text.starts_with(['&', '*', '?', '|', '-', '<', '>', '=', '!', '%', '@', '.'])
        || text.starts_with("0x")
        || text.contains(|c: char| {
            matches!(
                c,
                ':' | '{' | '}' | '[' | ']' | ',' | '#' | '`' | '"' | '\'' | '\\'
            ) || (c.is_ascii_control()
                && !matches!(c, '\x07' | '\x08' | '\x0b' | '\x0c' | '\x1b' | '\x7f'))
        })
        || WORDS.contains(&text)
        || text.parse::<i64>().is_ok()
        || text.parse::<f64>().is_ok();
    if !quoted {
        return text.to_string();
    }
    let mut out = String::from("\"");
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\x08' => out.push_str("\\b"),
            '\t' => out.push_str("\\t"),
            '\n' => out.push_str("\\n"),
            '\x0c' => out.push_str("\\f"),
            '\r' => out.push_str("\\r"),
            c if c.is_ascii_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
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

/// A snapshot's text as insta writes, compares and shows it (normalized: line endings
/// unified, trailing whitespace trimmed); empty for a binary snapshot, which a case never
/// has.
fn text_of(contents: &SnapshotContents) -> String {
    contents
        .as_text()
        .map(ToString::to_string)
        .unwrap_or_default()
}

/// The snapshot at `file` as insta reads it; `None` when there is none.
///
/// Errors: the file cannot be read, or insta cannot parse it.
fn read_snapshot(file: &Path) -> anyhow::Result<Option<Snapshot>> {
    if !file.exists() {
        return Ok(None);
    }
    Snapshot::from_file(file)
        .map(Some)
        .map_err(|error| anyhow::anyhow!("reading {}: {error}", file.display()))
}

/// The body of the snapshot at `file` (its transcript, after the header) as insta reads
/// and compares it (line endings unified, trailing whitespace trimmed); `None` when there
/// is no such file. The citations of the texts (`./run.sh cite`) quote this.
///
/// Errors: the file cannot be read, or insta cannot parse it.
pub fn read_body(file: &Path) -> anyhow::Result<Option<String>> {
    Ok(read_snapshot(file)?.map(|snapshot| text_of(snapshot.contents())))
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
    text_diff(&old, &new, (shown, "this run (redacted)"), 3)
}

/// A unified diff of two texts, line by line (`similar`'s, the diff insta shows too):
/// `headers` name the old and the new text, `context` is the number of unchanged lines
/// shown around each change. Empty when the texts are equal.
pub fn text_diff(old: &str, new: &str, headers: (&str, &str), context: usize) -> String {
    similar::TextDiff::from_lines(old, new)
        .unified_diff()
        .context_radius(context)
        .header(headers.0, headers.1)
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
    fn insta_normalizes_trailing_whitespace_only() {
        let text = |body: &str| {
            text_of(&SnapshotContents::from(TextSnapshotContents::new(
                body.into(),
                TextSnapshotKind::File,
            )))
        };
        assert_eq!(text("a\r\nb\n\n"), "a\nb");
        assert_ne!(text("a\nb"), text("a\nc"));
        assert_ne!(text("  a"), text("a"));
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
        let read = read_snapshot(&file).unwrap().expect("just written");
        assert_eq!(
            text_of(read.contents()),
            "CASE X1 :: a title: with a colon\n  note n=1"
        );
        assert_eq!(
            read.metadata().description(),
            Some("X1 :: a title: with a colon")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn headers_are_written_as_insta_writes_them() {
        let dir = std::env::temp_dir().join(format!("case-kit-yaml-{}", std::process::id()));
        let (file, resaved) = (dir.join("X/X1.snap"), dir.join("X/resaved.snap"));
        let titles = [
            "plain words; a semicolon",
            "a colon: here",
            "-leading dash",
            ".leading dot",
            "yes",
            "123",
            "1.5",
            "0x1f",
            "with \"quotes\" and \\",
            "tab\there",
            " spaces ",
            "bell\x07 and escape\x1b",
            "",
            "unicode → ok",
        ];
        for title in titles {
            let header = Header {
                case: "X1",
                title,
                command: "./run.sh X1".into(),
                postgres_major: None,
            };
            write_snapshot(&file, &header, "CASE X1 :: t").unwrap();
            let ours = std::fs::read_to_string(&file).unwrap();
            Snapshot::from_file(&file).unwrap().save(&resaved).unwrap();
            let insta = std::fs::read_to_string(&resaved).unwrap();
            assert_eq!(ours, insta, "title {title:?}");
        }
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
            compared: Default::default(),
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
        let snapshot = read_snapshot(&root).unwrap().expect("L1.snap is committed");
        let body = text_of(snapshot.contents());
        assert!(body.starts_with("CASE L1 :: "), "{body}");
    }
}
