//! insta's review flow on the evidence snapshots, checked without cargo-insta.
//!
//! This file is case-kit's test target `snapshot_review`, and it lives in `evidence/` on
//! purpose: cargo-insta (`cargo insta pending-snapshots`, `review`, `accept`, `reject`)
//! looks for pending snapshots (`*.snap.new`) by walking, for every workspace package in
//! `cargo metadata`, the package's folder and the source folder of each of its targets
//! (cargo-insta's `find_snapshot_roots`). This target's source folder is `evidence/`, so
//! `evidence/snapshots/**` is walked; no crate has to live there.
//!
//! - the folders cargo-insta walks, computed from `cargo metadata` by its rule, reach
//!   `evidence/snapshots` (no nested crate, hidden folder, `target` folder or ignored
//!   folder stops the walk on the way);
//! - a committed transcript left unchanged matches and leaves nothing; changed, it
//!   leaves `<family>/<id>.snap.new` beside `<id>.snap` in the store, the pair
//!   cargo-insta shows and accepts, and insta reads the proposal back as it was meant;
//! - what `cargo insta accept` writes (insta's own serializer) is byte for byte the
//!   proposal the harness wrote; every committed snapshot reads as insta reads it and
//!   insta writes its body back unchanged.

use std::path::{Path, PathBuf};
use std::process::Command;

use case_kit::snapshot::{Mode, Snapshots, Verdict};
use case_kit::{CaseReport, Check, Line, Schedule};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("case-kit sits in the workspace")
        .to_path_buf()
}

fn snapshots_root() -> PathBuf {
    workspace().join("evidence/snapshots")
}

/// A fresh folder under the system's temporary folder, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch folder");
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The folders cargo-insta walks for pending snapshots, by its rule: each workspace
/// package's folder and each of its targets' source folders (build scripts aside).
fn cargo_insta_roots() -> Vec<PathBuf> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(workspace())
        .output()
        .expect("cargo metadata runs");
    assert!(
        output.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let mut roots = Vec::new();
    for package in metadata["packages"].as_array().unwrap() {
        let manifest = Path::new(package["manifest_path"].as_str().unwrap());
        roots.push(manifest.parent().unwrap().to_path_buf());
        for target in package["targets"].as_array().unwrap() {
            let kinds = target["kind"].as_array().unwrap();
            if kinds.iter().any(|kind| kind == "custom-build") {
                continue;
            }
            let source = Path::new(target["src_path"].as_str().unwrap());
            roots.push(source.parent().unwrap().to_path_buf());
        }
    }
    // cargo-insta compares canonical paths (the target's `../evidence` included).
    let mut roots: Vec<PathBuf> = roots
        .into_iter()
        .map(|root| root.canonicalize().unwrap_or(root))
        .collect();
    roots.sort();
    roots.dedup();
    roots
}

/// Whether git ignores `path` (cargo-insta's walk skips ignored folders).
fn git_ignores(path: &Path) -> bool {
    let status = Command::new("git")
        .args(["check-ignore", "-q", "--no-index"])
        .arg(path)
        .current_dir(workspace())
        .status()
        .expect("git runs");
    match status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!("git check-ignore on {}: {other:?}", path.display()),
    }
}

#[test]
fn cargo_insta_walks_the_evidence_snapshots() {
    let snapshots = snapshots_root().canonicalize().unwrap();
    let roots = cargo_insta_roots();
    let root = roots
        .iter()
        .find(|root| snapshots.starts_with(root))
        .unwrap_or_else(|| panic!("no folder cargo-insta walks holds {snapshots:?}: {roots:?}"));
    let mut folder = snapshots.clone();
    while folder != *root {
        let name = folder.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            !name.starts_with('.'),
            "hidden folder {folder:?} on the way"
        );
        assert_ne!(name, "target", "cargo-insta never walks into target/");
        assert!(
            !folder.join("Cargo.toml").exists(),
            "{folder:?} is a nested crate, which cargo-insta's walk skips"
        );
        assert!(!git_ignores(&folder), "{folder:?} is ignored by git");
        folder = folder.parent().unwrap().to_path_buf();
    }
    // The proposals themselves are ignored (never committed); cargo-insta still finds
    // them, since its own patterns (`*.snap.new`) override the ignore files.
    assert!(git_ignores(&snapshots.join("L/L3.snap.new")));
    assert!(
        root.join("snapshot_review.rs").exists(),
        "the walk from {root:?} is not this target's"
    );
}

/// The committed snapshot's body as a report whose transcript renders to it exactly:
/// the `CASE` line gives id and title, `  note ` lines are notes, `  ok   ` and
/// `  FAIL ` lines checks named by the rest of the line.
fn report_of(family: &str, id: &str, body: &str) -> CaseReport {
    let mut lines = body.lines();
    let head = lines.next().expect("a CASE line");
    let title = head
        .strip_prefix(&format!("CASE {id} :: "))
        .unwrap_or_else(|| panic!("{head:?} is not case {id}'s CASE line"));
    let mut report = CaseReport {
        id: id.into(),
        title: title.into(),
        family: family.into(),
        schedule: Schedule::Concurrent,
        resource: "none".into(),
        passed: 0,
        failed: 0,
        duration_ms: 0,
        lines: Vec::new(),
        details: Default::default(),
    };
    for line in lines {
        let (passed, name) = if let Some(text) = line.strip_prefix("  note ") {
            report.push(Line::Note { text: text.into() });
            continue;
        } else if let Some(name) = line.strip_prefix("  ok   ") {
            (true, name)
        } else if let Some(name) = line.strip_prefix("  FAIL ") {
            (false, name)
        } else {
            panic!("not a transcript line: {line:?}");
        };
        report.push(Line::Check(Check {
            name: name.into(),
            passed,
            expected: None,
            actual: None,
            compared: Default::default(),
        }));
    }
    report
}

fn body_of(file: &Path) -> String {
    let snapshot = insta::Snapshot::from_file(file).unwrap();
    snapshot.contents().as_text().unwrap().to_string()
}

#[test]
fn a_changed_transcript_leaves_its_pending_snapshot_for_cargo_insta() {
    let scratch = Scratch::new("snapshot-review");
    let committed = snapshots_root().join("L/L3.snap");
    std::fs::create_dir_all(scratch.0.join("L")).unwrap();
    std::fs::copy(&committed, scratch.0.join("L/L3.snap")).unwrap();
    let store = Snapshots::new(scratch.0.clone(), "snaps".into(), Mode::Review, Some(16));
    let pending = scratch.0.join("L/L3.snap.new");

    let mut report = report_of("L", "L3", &body_of(&committed));
    let verdict = store.compare(&report, true).unwrap();
    assert!(matches!(verdict, Verdict::Matched), "{verdict:?}");
    assert!(
        !pending.exists(),
        "an unchanged transcript proposes nothing"
    );

    report.push(Line::Note {
        text: "a line this run added".into(),
    });
    let verdict = store.compare(&report, true).unwrap();
    let Verdict::Differs {
        pending: Some(written),
        diff,
        ..
    } = verdict
    else {
        panic!("a changed transcript is proposed: {verdict:?}");
    };
    assert_eq!(written, pending);
    assert!(diff.contains("+  note a line this run added"), "{diff}");
    // In the real store that is evidence/snapshots/L/L3.snap.new: the pair cargo-insta
    // shows (its target is the pending path without `.new`).
    assert_eq!(
        pending.strip_prefix(&scratch.0).unwrap(),
        Path::new("L/L3.snap.new")
    );
    let target = pending.to_str().unwrap().strip_suffix(".new").unwrap();
    assert!(
        Path::new(target).exists(),
        "{target} is the snapshot it replaces"
    );
    assert_eq!(
        body_of(&pending),
        report.transcript().trim_end(),
        "insta reads the proposal as the run's transcript"
    );
    assert_eq!(
        std::fs::read(&pending).unwrap(),
        saved_by_insta(&pending, &scratch.0.join("accepted.snap")),
        "cargo insta accept would rewrite the proposal's bytes"
    );

    // Unchanged again: the proposal goes.
    report.lines.pop();
    let verdict = store.compare(&report, true).unwrap();
    assert!(matches!(verdict, Verdict::Matched), "{verdict:?}");
    assert!(!pending.exists());
}

/// The bytes insta's own serializer writes for the snapshot at `file` (what `cargo insta
/// accept` writes over the target), by way of `scratch`.
fn saved_by_insta(file: &Path, scratch: &Path) -> Vec<u8> {
    insta::Snapshot::from_file(file)
        .unwrap()
        .save(scratch)
        .unwrap();
    std::fs::read(scratch).unwrap()
}

/// Every committed snapshot reads as insta reads it (header and body), and what insta
/// writes back holds the same body byte for byte and the same header values. (A header
/// written before the harness followed insta's quoting may quote a title insta leaves
/// plain: the same YAML value, and only the body is ever compared.)
#[test]
fn every_committed_snapshot_reads_and_writes_back_as_insta() {
    let scratch = Scratch::new("snapshot-bytes");
    let out = scratch.0.join("out.snap");
    let mut seen = 0;
    for family in std::fs::read_dir(snapshots_root()).unwrap().flatten() {
        for file in std::fs::read_dir(family.path()).unwrap().flatten() {
            let path = file.path();
            if path.extension().is_none_or(|ext| ext != "snap") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let written = String::from_utf8(saved_by_insta(&path, &out)).unwrap();
            let body = |text: &str| text.splitn(3, "---\n").nth(2).map(str::to_owned);
            assert_eq!(
                body(&written),
                body(&text),
                "{path:?}: body as insta writes it"
            );
            assert!(
                body(&text).is_some_and(|body| body.starts_with("CASE ")),
                "{path:?}"
            );
            let (ours, insta) = (
                insta::Snapshot::from_file(&path).unwrap(),
                insta::Snapshot::from_file(&out).unwrap(),
            );
            assert_eq!(ours.metadata(), insta.metadata(), "{path:?}: header values");
            let info = ours.metadata().private_info().expect("an info member");
            let id = path.file_stem().unwrap().to_string_lossy().into_owned();
            assert!(
                format!("{info:?}").contains(&format!("{id:?}")),
                "{path:?}: {info:?}"
            );
            seen += 1;
        }
    }
    assert!(seen >= 40, "only {seen} snapshots found");
}
