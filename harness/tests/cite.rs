//! `./run.sh cite` (docs/citing.md): the repository's own texts cite only current output,
//! and in a scratch repository a changed snapshot line, a changed anchored source region
//! and a removed LIMITS.md entry each make `--check` exit 1 naming the text, the
//! citation and the diff, which `--write` fixes where it can.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The enforcement: every citation in README.md, docs/ and evidence/README.md quotes
/// what the committed files hold now, and no harness output is quoted without a marker.
/// A change that alters a cited transcript fails here until `./run.sh cite --write`
/// updates the quote in the same commit.
#[test]
fn the_repositorys_texts_cite_current_output() {
    let root = repository();
    let texts = harness::cite::texts(&root, &[]).expect("the default texts exist");
    let report = harness::cite::check(&root, &texts).expect("the texts read");
    println!("{}", report.render());
    assert!(
        report.all_current(),
        "citations not current (./run.sh cite --write PATH to update the quotes):\n{}",
        report.render()
    );
    assert!(
        report.cited.len() >= 6,
        "too few citations ({}): the check checks nothing",
        report.cited.len()
    );
    assert!(
        report
            .cited
            .iter()
            .any(|c| c.text == Path::new("README.md") && c.selector.starts_with("snapshot L/L3")),
        "the README's L3 example is a citation"
    );
}

/// A throw-away repository: the committed L3 snapshot, a LIMITS.md, a source file with
/// an anchored region, and texts citing them; removed on drop.
struct Scratch {
    root: PathBuf,
}

/// The text the scratch tests cite from; the quotes are left empty for `--write` to
/// fill in.
const TEXT: &str = "# A text\n\
\n\
<!-- cite: snapshot L/L3 from \"CASE L3\" to \"  ok   outcomes\" -->\n\
```text\n\
```\n\
\n\
L3 sees <!-- cite: figure L/L3 /note ok=(\\d+)/ -->?<!-- /cite --> debits succeed.\n\
\n\
<!-- cite: source src/lib.rs#debit -->\n\
```rust\n\
```\n\
\n\
<!-- cite: limit \"Probing is not proof\" -->\n\
> (quoted)\n\
\n\
<!-- cite: none, illustrative -->\n\
```\n\
\x20 FAIL debit transactions (expected=14, actual=13)\n\
```\n";

const LIMITS: &str = "# Limits\n\n## What it does not cover\n\n\
- **Probing is not proof.** A race shows the interleavings\n  that happened in that run.\n\
- **Time.** Keys never expire.\n";

const SOURCE: &str = "fn debit() -> &'static str {\n    // ANCHOR: debit\n    \"UPDATE account SET balance = balance - $2\"\n    // ANCHOR_END: debit\n}\n";

impl Scratch {
    fn new(name: &str) -> Scratch {
        let root =
            std::env::temp_dir().join(format!("ledger-harness-cite-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("evidence/snapshots/L")).unwrap();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::copy(
            repository().join("evidence/snapshots/L/L3.snap"),
            root.join("evidence/snapshots/L/L3.snap"),
        )
        .unwrap();
        let scratch = Scratch { root };
        scratch.put("LIMITS.md", LIMITS);
        scratch.put("src/lib.rs", SOURCE);
        scratch.put("text.md", TEXT);
        scratch
    }

    fn put(&self, file: &str, text: &str) {
        std::fs::write(self.root.join(file), text).unwrap();
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.root.join(file)).unwrap()
    }

    /// Replaces `old` (which must be there) with `new` in `file`.
    fn change(&self, file: &str, old: &str, new: &str) {
        let text = self.read(file);
        assert!(text.contains(old), "{file} holds {old:?}");
        self.put(file, &text.replacen(old, new, 1));
    }

    /// `harness cite ARGS` in the scratch root, with `CI=true` or `CI=false`.
    fn cite(&self, args: &[&str], ci: bool) -> Output {
        Command::new(env!("CARGO_BIN_EXE_harness"))
            .arg("cite")
            .args(args)
            .current_dir(&self.root)
            .env("CI", if ci { "true" } else { "false" })
            .output()
            .expect("harness cite runs")
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn last_line(output: &Output) -> String {
    stdout(output)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

const ALL_CURRENT: &str =
    "CITE cites=4 ok=4 stale=0 missing=0 unverified=0 gone=0 illustrative=1 uncited=0";

/// Fills the scratch text's quotes with `--write` and checks they are then current.
fn written(scratch: &Scratch) {
    let wrote = scratch.cite(&["--write", "text.md"], false);
    assert_eq!(wrote.status.code(), Some(0), "{}", stdout(&wrote));
    let checked = scratch.cite(&["--check", "text.md"], false);
    assert_eq!(checked.status.code(), Some(0), "{}", stdout(&checked));
    assert_eq!(last_line(&checked), ALL_CURRENT);
}

#[test]
fn write_fills_quotes_and_a_changed_snapshot_line_is_stale() {
    let scratch = Scratch::new("snapshot");
    written(&scratch);
    let text = scratch.read("text.md");
    assert!(
        text.contains("```text\nCASE L3 :: real concurrency"),
        "{text}"
    );
    assert!(
        text.contains("  note ok=14 insufficient=18\n  ok   outcomes"),
        "{text}"
    );
    assert!(text.contains("-->14<!-- /cite --> debits"), "{text}");
    assert!(text.contains("> - **Probing is not proof.** A race shows the interleavings\n> that happened in that run.\n"), "{text}");

    scratch.change(
        "evidence/snapshots/L/L3.snap",
        "  note ok=14 insufficient=18",
        "  note ok=15 insufficient=17",
    );
    let checked = scratch.cite(&["--check", "text.md"], false);
    let out = stdout(&checked);
    assert_eq!(checked.status.code(), Some(1), "{out}");
    assert!(
        out.contains("stale text.md:3 snapshot L/L3 from \"CASE L3\" to \"  ok   outcomes\"\n"),
        "{out}"
    );
    assert!(
        out.contains("    --- text.md:3 (quoted)\n    +++ evidence/snapshots/L/L3.snap (now)\n"),
        "{out}"
    );
    assert!(
        out.contains("    -  note ok=14 insufficient=18\n    +  note ok=15 insufficient=17\n"),
        "{out}"
    );
    assert!(
        out.contains("stale text.md:14 figure L/L3 /note ok=(\\d+)/\n"),
        "{out}"
    );
    assert_eq!(
        last_line(&checked),
        "CITE cites=4 ok=2 stale=2 missing=0 unverified=0 gone=0 illustrative=1 uncited=0"
    );

    // Under CI nothing is written.
    let refused = scratch.cite(&["--write", "text.md"], true);
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(scratch.read("text.md"), text);

    written(&scratch);
    let text = scratch.read("text.md");
    assert!(text.contains("  note ok=15 insufficient=17\n"), "{text}");
    assert!(text.contains("-->15<!-- /cite --> debits"), "{text}");
    assert_eq!(stdout(&scratch.cite(&["--list", "text.md"], false)), "L3\n");
}

#[test]
fn a_changed_anchored_region_is_stale_until_written() {
    let scratch = Scratch::new("source");
    written(&scratch);
    assert!(
        scratch
            .read("text.md")
            .contains("```rust\n\"UPDATE account SET balance = balance - $2\"\n```")
    );
    scratch.change("src/lib.rs", "balance - $2", "balance - $3");
    let checked = scratch.cite(&["--check", "text.md"], false);
    let out = stdout(&checked);
    assert_eq!(checked.status.code(), Some(1), "{out}");
    assert!(
        out.contains("stale text.md:16 source src/lib.rs#debit\n"),
        "{out}"
    );
    assert!(out.contains("    +++ src/lib.rs (now)\n"), "{out}");
    assert!(
        out.contains("    +\"UPDATE account SET balance = balance - $3\"\n"),
        "{out}"
    );
    written(&scratch);
    // An anchor that is gone from its file selects nothing.
    scratch.change("src/lib.rs", "// ANCHOR_END: debit", "");
    let checked = scratch.cite(&["--check", "text.md"], false);
    assert_eq!(checked.status.code(), Some(1));
    assert!(
        stdout(&checked).contains("missing text.md:16 source src/lib.rs#debit: src/lib.rs: no ANCHOR_END: debit after its ANCHOR\n"),
        "{}",
        stdout(&checked)
    );
}

#[test]
fn a_removed_limits_entry_is_gone_and_write_cannot_fix_it() {
    let scratch = Scratch::new("limit");
    written(&scratch);
    scratch.change(
        "LIMITS.md",
        "- **Probing is not proof.** A race shows the interleavings\n  that happened in that run.\n",
        "",
    );
    let gone = "gone text.md:21 limit \"Probing is not proof\": no entry of LIMITS.md starts with \"Probing is not proof\"\n";
    for action in ["--check", "--write"] {
        let output = scratch.cite(&[action, "text.md"], false);
        let out = stdout(&output);
        assert_eq!(output.status.code(), Some(1), "{action}: {out}");
        assert!(out.contains(gone), "{action}: {out}");
        assert_eq!(
            last_line(&output),
            "CITE cites=4 ok=3 stale=0 missing=0 unverified=0 gone=1 illustrative=1 uncited=0"
        );
    }
    // The blockquote is compared as prose: an entry wrapped anew is current, a reworded
    // one stale.
    scratch.put(
        "LIMITS.md",
        &LIMITS.replace("that happened in", "that\n  happened in"),
    );
    assert_eq!(
        last_line(&scratch.cite(&["--check", "text.md"], false)),
        ALL_CURRENT
    );
    scratch.put(
        "LIMITS.md",
        &LIMITS.replace("A race shows", "A race case shows"),
    );
    let output = scratch.cite(&["--check", "text.md"], false);
    assert!(
        stdout(&output).contains("stale text.md:21 limit"),
        "{}",
        stdout(&output)
    );
    // A reworded entry is brought up to date by --write.
    written(&scratch);
    assert!(
        scratch
            .read("text.md")
            .contains("> - **Probing is not proof.** A race case shows")
    );
    // A removed one only by changing the text: here, citing the entry that is left.
    scratch.put("LIMITS.md", &LIMITS.replace(
        "- **Probing is not proof.** A race shows the interleavings\n  that happened in that run.\n",
        "",
    ));
    assert_eq!(
        scratch.cite(&["--check", "text.md"], false).status.code(),
        Some(1)
    );
    scratch.change(
        "text.md",
        "limit \"Probing is not proof\"",
        "limit \"Time\"",
    );
    written(&scratch);
    assert!(
        scratch
            .read("text.md")
            .contains("> - **Time.** Keys never expire.\n")
    );
}

#[test]
fn uncited_output_missing_selectors_and_usage_errors() {
    let scratch = Scratch::new("uncited");
    scratch.put(
        "other.md",
        "```\nCASE L3 :: quoted by hand\n```\n\n<!-- cite: snapshot L/L3 from \"CASE L9\" -->\n```\n```\n\n<!-- cite: snapshot L/L99 -->\n```\n```\n",
    );
    let checked = scratch.cite(&["--check", "other.md"], false);
    let out = stdout(&checked);
    assert_eq!(checked.status.code(), Some(1), "{out}");
    assert!(
        out.contains("uncited other.md:1 a code block of harness output"),
        "{out}"
    );
    assert!(
        out.contains(
            "missing other.md:5 snapshot L/L3 from \"CASE L9\": no line starts with \"CASE L9\"\n"
        ),
        "{out}"
    );
    assert!(
        out.contains(
            "gone other.md:9 snapshot L/L99: evidence/snapshots/L/L99.snap does not exist\n"
        ),
        "{out}"
    );
    assert_eq!(
        last_line(&checked),
        "CITE cites=2 ok=0 stale=0 missing=1 unverified=0 gone=1 illustrative=0 uncited=1"
    );
    let usage: [&[&str]; 4] = [
        &[],
        &["--check", "--write"],
        &["--check", "nowhere.md"],
        &["--bogus"],
    ];
    for args in usage {
        let output = scratch.cite(args, false);
        assert_eq!(output.status.code(), Some(2), "{args:?}");
    }
}

/// After `--accept` rewrote L3's snapshot, the run names the default texts' citations
/// that quote the old one (and none for a case no text quotes stale).
#[test]
fn accept_names_the_texts_that_quote_the_old_snapshot() {
    let scratch = Scratch::new("accept");
    std::fs::create_dir_all(scratch.root.join("docs")).unwrap();
    scratch.put("evidence/README.md", "# Evidence\n");
    scratch.put("README.md", TEXT);
    let wrote = scratch.cite(&["--write"], false);
    assert_eq!(wrote.status.code(), Some(0), "{}", stdout(&wrote));
    let accepted = ["L3".to_string()];
    assert!(harness::cite::stale_after_accept(&scratch.root, &accepted).is_empty());
    scratch.change(
        "evidence/snapshots/L/L3.snap",
        "  note ok=14 insufficient=18",
        "  note ok=15 insufficient=17",
    );
    let lines = harness::cite::stale_after_accept(&scratch.root, &accepted);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("cited: README.md:3 snapshot L/L3 from \"CASE L3\" to \"  ok   outcomes\" quotes the snapshot as it was; ./run.sh cite --check fails until ./run.sh cite --write README.md updates it"),
        "{lines:?}"
    );
    assert!(harness::cite::stale_after_accept(&scratch.root, &["L9".to_string()]).is_empty());
}

/// A run that leaves a proposal (`L3.snap.new`, for `cargo insta accept`) names, before
/// it is accepted, the texts that would then quote the snapshot as it was; after
/// `cargo insta accept` (here: the proposal moved over the snapshot), the next run
/// names them as `--accept` does.
#[test]
fn a_proposal_names_the_texts_that_would_quote_the_old_snapshot() {
    let scratch = Scratch::new("proposal");
    std::fs::create_dir_all(scratch.root.join("docs")).unwrap();
    scratch.put("evidence/README.md", "# Evidence\n");
    scratch.put("README.md", TEXT);
    let wrote = scratch.cite(&["--write"], false);
    assert_eq!(wrote.status.code(), Some(0), "{}", stdout(&wrote));
    let proposed = ["L3".to_string()];
    // No proposal on disk: nothing would change.
    assert!(harness::cite::stale_if_accepted(&scratch.root, &proposed).is_empty());
    let snapshot = scratch.read("evidence/snapshots/L/L3.snap");
    scratch.put(
        "evidence/snapshots/L/L3.snap.new",
        &snapshot.replacen(
            "  note ok=14 insufficient=18",
            "  note ok=15 insufficient=17",
            1,
        ),
    );
    let lines = harness::cite::stale_if_accepted(&scratch.root, &proposed);
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(
        lines[0].starts_with("cited: README.md:3 snapshot L/L3 from \"CASE L3\" to \"  ok   outcomes\" quotes L3's snapshot, not its proposal; once that is accepted (cargo insta accept, or ./run.sh --accept L3), ./run.sh cite --check fails until ./run.sh cite --write README.md updates it"),
        "{lines:?}"
    );
    // The committed snapshot is unchanged: the texts still check.
    let checked = scratch.cite(&["--check"], false);
    assert_eq!(checked.status.code(), Some(0), "{}", stdout(&checked));
    // What cargo insta accept does: the proposal replaces the snapshot.
    std::fs::rename(
        scratch.root.join("evidence/snapshots/L/L3.snap.new"),
        scratch.root.join("evidence/snapshots/L/L3.snap"),
    )
    .unwrap();
    assert_eq!(
        harness::cite::stale_after_accept(&scratch.root, &proposed).len(),
        2
    );
    assert_eq!(scratch.cite(&["--check"], false).status.code(), Some(1));
}

/// Runs git in `dir` with a fixed identity; panics if it fails.
fn git(dir: &Path, args: &[&str]) -> String {
    let output = Command::new("git")
        .args(["-c", "user.name=cite", "-c", "user.email=cite@localhost"])
        .args(args)
        .current_dir(dir)
        .output()
        .expect("git runs");
    assert!(output.status.success(), "git {args:?}: {output:?}");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

/// A run record's field (the server version, the total, one family's check counts) is
/// current only when the latest run is of the checked-out commit: otherwise
/// `unverified`; of that commit and different, `stale`.
#[test]
fn a_run_record_field_is_unverified_unless_the_run_is_of_head() {
    let scratch = Scratch::new("record");
    let text = "Server <!-- cite: record environment.json /postgres/facts/server_version -->16.14<!-- /cite -->, \
                <!-- cite: record results.json /passed -->94<!-- /cite --> checks, \
                <!-- cite: record results.json /families/L/passed -->56<!-- /cite --> of them family L's.\n";
    scratch.put("text.md", text);
    let check = || scratch.cite(&["--check", "text.md"], false);
    let no_git = check();
    assert_eq!(no_git.status.code(), Some(1));
    assert!(stdout(&no_git).contains("unverified text.md:1 record environment.json /postgres/facts/server_version: no evidence/latest/environment.json"), "{}", stdout(&no_git));
    git(&scratch.root, &["init", "-q"]);
    git(&scratch.root, &["add", "."]);
    git(&scratch.root, &["commit", "-qm", "scratch"]);
    let head = git(&scratch.root, &["rev-parse", "HEAD"]);
    std::fs::create_dir_all(scratch.root.join("evidence/latest")).unwrap();
    let environment = |commit: &str, version: &str| {
        scratch.put(
            "evidence/latest/environment.json",
            &format!(r#"{{"git_commit": "{commit}", "postgres": {{"facts": {{"server_version": "{version}"}}}}}}"#),
        );
    };
    scratch.put(
        "evidence/latest/results.json",
        r#"{"passed": 94, "failed": 0, "families": {"L": {"cases": 33, "passed": 56, "failed": 0}}}"#,
    );
    environment(&format!("{head}-dirty"), "16.14");
    let dirty = check();
    assert_eq!(dirty.status.code(), Some(1));
    assert!(
        stdout(&dirty).contains(&format!("is a run of {head}-dirty, not of HEAD {head}")),
        "{}",
        stdout(&dirty)
    );
    assert!(
        last_line(&dirty).contains(" unverified=3 "),
        "{}",
        stdout(&dirty)
    );
    environment(&head, "16.14");
    let current = check();
    assert_eq!(current.status.code(), Some(0), "{}", stdout(&current));
    environment(&head, "16.15");
    let stale = check();
    assert_eq!(stale.status.code(), Some(1));
    assert!(
        stdout(&stale)
            .contains("stale text.md:1 record environment.json /postgres/facts/server_version\n"),
        "{}",
        stdout(&stale)
    );
    assert!(
        stdout(&stale).contains("    +16.15\n"),
        "{}",
        stdout(&stale)
    );
    // One family's count from a run of this commit that differs: stale, with its diff.
    environment(&head, "16.14");
    scratch.put(
        "evidence/latest/results.json",
        r#"{"passed": 94, "failed": 0, "families": {"L": {"cases": 33, "passed": 57, "failed": 0}}}"#,
    );
    let family = check();
    assert_eq!(family.status.code(), Some(1));
    assert!(
        stdout(&family).contains("stale text.md:1 record results.json /families/L/passed\n"),
        "{}",
        stdout(&family)
    );
    assert!(
        stdout(&family).contains("    -56\n    +57\n"),
        "{}",
        stdout(&family)
    );
}
