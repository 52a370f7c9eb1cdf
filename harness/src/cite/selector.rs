//! What a citation quotes, named by content: lines or one figure of a case's committed
//! snapshot (or a figure of a committed file), a region of a source file between
//! `ANCHOR:` and `ANCHOR_END:` comments, a row of a committed table, a LIMITS.md entry, a
//! field of the latest run record. [`Selector::parse`] reads a marker's text, [`Selector::resolve`]
//! finds the text it selects now.

use std::path::{Path, PathBuf};

/// Where the committed snapshots are, under the repository's root.
const SNAPSHOTS: &str = "evidence/snapshots";
/// The file of limits a `limit` selector names entries of.
const LIMITS: &str = "LIMITS.md";
/// The newest completed run's record, under the repository's root.
const LATEST_RUN: &str = "evidence/latest";

/// What a citation selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selector {
    /// Lines of the body of `evidence/snapshots/<family>/<id>.snap`.
    Snapshot { case: CaseRef, lines: Lines },
    /// The first group of the first match of a pattern in a snapshot's body or a file.
    Figure { from: FigureFrom, pattern: String },
    /// The first table row of a Markdown file whose first cell starts with `cell`.
    Row { path: String, cell: String },
    /// The lines between `ANCHOR: <anchor>` and `ANCHOR_END: <anchor>` in a file.
    Source { path: String, anchor: String },
    /// The LIMITS.md entry (bold list item, heading or table row) starting with words.
    Limit { words: String },
    /// A field of the latest run's record (`evidence/latest/<file>`, a JSON pointer),
    /// current only when that run was of the checked-out commit with a clean tree.
    Record { file: String, pointer: String },
}

/// What a figure is read from: a snapshot's body (`L/L3`), or a committed file (a path
/// with a dot in it: `evidence/matrix.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FigureFrom {
    /// The body of a case's snapshot.
    Snapshot(CaseRef),
    /// A file, relative to the repository's root.
    File(String),
}

/// A case's snapshot: `L/L3` is `evidence/snapshots/L/L3.snap`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaseRef {
    /// The family's folder under `evidence/snapshots/` (`L`).
    pub family: String,
    /// The case id (`L3`).
    pub id: String,
}

/// Which lines of a snapshot's body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lines {
    /// The whole body.
    All,
    /// From the first line starting with `from` to the first line at or after it starting
    /// with `to` (the end of the body without one); leading spaces are ignored on both.
    Range { from: String, to: Option<String> },
    /// Every line the pattern matches.
    Matching { pattern: String },
}

/// Why a selector selects nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unresolved {
    /// The file is there but nothing in it matches (or the marker cannot be read).
    Missing(String),
    /// The cited file or LIMITS.md entry is no longer there.
    Gone(String),
    /// A run record's field, but the latest run is not of the checked-out commit (or
    /// there is none): nothing to compare with.
    Unverified(String),
}

impl Selector {
    /// Reads a marker's text: `snapshot L/L3 [from "A" [to "B"] | lines /re/]`,
    /// `figure L/L3 /re/` (or `figure path.md /re/`), `source path#anchor`,
    /// `row path "first cell"`, `limit "first words"`.
    ///
    /// Errors: the text is none of these.
    pub fn parse(text: &str) -> Result<Selector, String> {
        let (kind, rest) = text.trim().split_once(' ').unwrap_or((text.trim(), ""));
        let rest = rest.trim();
        match kind {
            "snapshot" => {
                let (case, rest) = case_ref(rest)?;
                Ok(Selector::Snapshot {
                    case,
                    lines: lines(rest)?,
                })
            }
            "figure" => {
                let (from, rest) = figure_from(rest)?;
                Ok(Selector::Figure {
                    from,
                    pattern: pattern(rest)?,
                })
            }
            "row" => {
                let (path, rest) = rest
                    .split_once(' ')
                    .ok_or("a row selector is path \"cell\"")?;
                safe_path(path)?;
                let (cell, rest) = quoted(rest)?;
                expect_end(rest)?;
                Ok(Selector::Row {
                    path: path.to_string(),
                    cell,
                })
            }
            "source" => {
                let (path, anchor) = rest
                    .split_once('#')
                    .ok_or("a source selector is path#anchor")?;
                safe_path(path)?;
                Ok(Selector::Source {
                    path: path.to_string(),
                    anchor: anchor.trim().to_string(),
                })
            }
            "record" => {
                let (file, pointer) = rest
                    .split_once(' ')
                    .ok_or("a record selector is file /pointer")?;
                let plain = !file.contains('/') && safe_path(file).is_ok();
                if !plain || !pointer.starts_with('/') {
                    return Err(format!(
                        "{rest:?} is not <file of evidence/latest> /<JSON pointer>"
                    ));
                }
                Ok(Selector::Record {
                    file: file.to_string(),
                    pointer: pointer.trim().to_string(),
                })
            }
            "limit" => {
                let (words, rest) = quoted(rest)?;
                expect_end(rest)?;
                Ok(Selector::Limit { words })
            }
            _ => Err(format!(
                "{kind:?} is not a selector (snapshot, figure, source, row, limit, record, or none, illustrative)"
            )),
        }
    }

    /// The case whose snapshot this selects from, if any.
    pub fn case(&self) -> Option<&CaseRef> {
        match self {
            Selector::Snapshot { case, .. }
            | Selector::Figure {
                from: FigureFrom::Snapshot(case),
                ..
            } => Some(case),
            _ => None,
        }
    }

    /// The text this selects in the repository at `root` now.
    ///
    /// Errors: [`Unresolved::Gone`] when the file (or LIMITS.md entry) is not there,
    /// [`Unresolved::Missing`] when nothing in it matches.
    pub fn resolve(&self, root: &Path) -> Result<String, Unresolved> {
        self.resolve_proposed(root, &[])
    }

    /// As [`Selector::resolve`], but the snapshot of each case in `proposed` (ids) is
    /// read from its pending proposal `<id>.snap.new` when there is one: the text this
    /// would select once the proposal is accepted (`cargo insta accept`).
    ///
    /// Errors: as [`Selector::resolve`].
    pub fn resolve_proposed(&self, root: &Path, proposed: &[String]) -> Result<String, Unresolved> {
        let body = |case: &CaseRef| {
            let pending = root.join(case.file()).with_extension("snap.new");
            if proposed.contains(&case.id) && pending.is_file() {
                body_of(&pending, &pending.display().to_string())
            } else {
                body(root, case)
            }
        };
        match self {
            Selector::Snapshot { case, lines } => select_lines(&body(case)?, lines),
            Selector::Figure { from, pattern } => {
                let text = match from {
                    FigureFrom::Snapshot(case) => body(case)?,
                    FigureFrom::File(path) => read(&root.join(path), path)?,
                };
                figure(&text, pattern)
            }
            Selector::Row { path, cell } => {
                let text = read(&root.join(path), path)?;
                table_row(&text, cell).ok_or_else(|| {
                    Unresolved::Missing(format!("no table row of {path} starts with {cell:?}"))
                })
            }
            Selector::Source { path, anchor } => {
                let text = read(&root.join(path), path)?;
                anchored(&text, anchor).map_err(|why| Unresolved::Missing(format!("{path}: {why}")))
            }
            Selector::Record { file, pointer } => record_field(root, file, pointer),
            Selector::Limit { words } => {
                let text = read(&root.join(LIMITS), LIMITS)?;
                limit_entry(&text, words).ok_or_else(|| {
                    Unresolved::Gone(format!("no entry of {LIMITS} starts with {words:?}"))
                })
            }
        }
    }

    /// The file this selects from, relative to the repository's root.
    pub fn file(&self) -> PathBuf {
        match self {
            Selector::Snapshot { case, .. } => case.file(),
            Selector::Figure { from, .. } => match from {
                FigureFrom::Snapshot(case) => case.file(),
                FigureFrom::File(path) => PathBuf::from(path),
            },
            Selector::Source { path, .. } | Selector::Row { path, .. } => PathBuf::from(path),
            Selector::Limit { .. } => PathBuf::from(LIMITS),
            Selector::Record { file, .. } => Path::new(LATEST_RUN).join(file),
        }
    }
}

impl CaseRef {
    /// The snapshot file, relative to the repository's root.
    pub fn file(&self) -> PathBuf {
        Path::new(SNAPSHOTS)
            .join(&self.family)
            .join(format!("{}.snap", self.id))
    }
}

/// `L/L3` and what follows it.
fn case_ref(text: &str) -> Result<(CaseRef, &str), String> {
    let (word, rest) = text.split_once(' ').unwrap_or((text, ""));
    let (family, id) = word
        .split_once('/')
        .ok_or_else(|| format!("{word:?} is not <family>/<id> (as in L/L3)"))?;
    let plain = |part: &str| {
        !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
    };
    if !plain(family) || !plain(id) {
        return Err(format!("{word:?} is not <family>/<id> (as in L/L3)"));
    }
    let case = CaseRef {
        family: family.to_string(),
        id: id.to_string(),
    };
    Ok((case, rest.trim()))
}

/// A figure's source, `L/L3` or a path with a dot, and what follows it.
fn figure_from(text: &str) -> Result<(FigureFrom, &str), String> {
    let (word, rest) = text.split_once(' ').unwrap_or((text, ""));
    if word.contains('.') {
        safe_path(word)?;
        return Ok((FigureFrom::File(word.to_string()), rest.trim()));
    }
    let (case, rest) = case_ref(text)?;
    Ok((FigureFrom::Snapshot(case), rest))
}

/// `from "A" [to "B"]`, `lines /re/` or nothing.
fn lines(text: &str) -> Result<Lines, String> {
    if text.is_empty() {
        return Ok(Lines::All);
    }
    if let Some(rest) = text.strip_prefix("lines ") {
        return Ok(Lines::Matching {
            pattern: pattern(rest)?,
        });
    }
    let rest = text
        .strip_prefix("from ")
        .ok_or_else(|| format!("expected from \"…\" or lines /…/, found {text:?}"))?;
    let (from, rest) = quoted(rest)?;
    let to = match rest.strip_prefix("to ") {
        Some(rest) => {
            let (to, rest) = quoted(rest)?;
            expect_end(rest)?;
            Some(to)
        }
        None => {
            expect_end(rest)?;
            None
        }
    };
    Ok(Lines::Range { from, to })
}

/// A double-quoted string (`\"` and `\\` escaped) and what follows it.
fn quoted(text: &str) -> Result<(String, &str), String> {
    let text = text.trim_start();
    let body = text
        .strip_prefix('"')
        .ok_or_else(|| format!("expected a double-quoted string, found {text:?}"))?;
    let mut out = String::new();
    let mut chars = body.char_indices();
    while let Some((at, c)) = chars.next() {
        match c {
            '"' => return Ok((out, body[at + 1..].trim_start())),
            '\\' => out.extend(chars.next().map(|(_, c)| c)),
            c => out.push(c),
        }
    }
    Err(format!("unterminated string in {text:?}"))
}

/// A pattern between slashes, the rest of the marker; checked to compile.
fn pattern(text: &str) -> Result<String, String> {
    let inner = text
        .strip_prefix('/')
        .and_then(|t| t.strip_suffix('/'))
        .filter(|t| !t.is_empty())
        .ok_or_else(|| format!("expected a pattern between slashes, found {text:?}"))?;
    regex::Regex::new(inner).map_err(|error| format!("pattern /{inner}/: {error}"))?;
    Ok(inner.to_string())
}

fn expect_end(rest: &str) -> Result<(), String> {
    if rest.is_empty() {
        Ok(())
    } else {
        Err(format!("unexpected {rest:?} at the end of the marker"))
    }
}

/// A path inside the repository: relative, no `..`.
fn safe_path(path: &str) -> Result<(), String> {
    let inside = !path.is_empty()
        && Path::new(path)
            .components()
            .all(|c| matches!(c, std::path::Component::Normal(_)));
    if inside {
        Ok(())
    } else {
        Err(format!("{path:?} is not a path inside the repository"))
    }
}

fn read(file: &Path, shown: &str) -> Result<String, Unresolved> {
    std::fs::read_to_string(file).map_err(|error| match error.kind() {
        std::io::ErrorKind::NotFound => Unresolved::Gone(format!("{shown} does not exist")),
        _ => Unresolved::Missing(format!("{shown}: {error}")),
    })
}

/// The snapshot's body as insta reads it.
fn body(root: &Path, case: &CaseRef) -> Result<String, Unresolved> {
    body_of(&root.join(case.file()), &case.file().display().to_string())
}

/// The body of the snapshot file `file` (shown as `shown`) as insta reads it.
fn body_of(file: &Path, shown: &str) -> Result<String, Unresolved> {
    match case_kit::snapshot::read_body(file) {
        Ok(Some(body)) => Ok(body),
        Ok(None) => Err(Unresolved::Gone(format!("{shown} does not exist"))),
        Err(error) => Err(Unresolved::Missing(format!("{error:#}"))),
    }
}

/// Whether `line` starts with `prefix`, leading spaces ignored on both.
fn starts(line: &str, prefix: &str) -> bool {
    line.trim_start().starts_with(prefix.trim_start())
}

fn select_lines(body: &str, selected: &Lines) -> Result<String, Unresolved> {
    let lines: Vec<&str> = body.lines().collect();
    let missing = Unresolved::Missing;
    let picked: Vec<&str> = match selected {
        Lines::All => lines,
        Lines::Range { from, to } => {
            let start = lines
                .iter()
                .position(|l| starts(l, from))
                .ok_or_else(|| missing(format!("no line starts with {from:?}")))?;
            let end = match to {
                Some(to) => (start..lines.len())
                    .find(|&i| starts(lines[i], to))
                    .ok_or_else(|| {
                        missing(format!("no line from {from:?} on starts with {to:?}"))
                    })?,
                None => lines.len() - 1,
            };
            lines[start..=end].to_vec()
        }
        Lines::Matching { pattern } => {
            let pattern = regex::Regex::new(pattern).map_err(|e| missing(e.to_string()))?;
            let picked: Vec<&str> = lines.into_iter().filter(|l| pattern.is_match(l)).collect();
            if picked.is_empty() {
                return Err(missing(format!("no line matches /{pattern}/")));
            }
            picked
        }
    };
    Ok(picked.join("\n"))
}

fn figure(body: &str, pattern: &str) -> Result<String, Unresolved> {
    let compiled = regex::Regex::new(pattern).map_err(|e| Unresolved::Missing(e.to_string()))?;
    let captures = compiled
        .captures(body)
        .ok_or_else(|| Unresolved::Missing(format!("/{pattern}/ matches nothing")))?;
    captures
        .get(1)
        .map(|group| group.as_str().to_string())
        .ok_or_else(|| Unresolved::Missing(format!("/{pattern}/ has no group to quote")))
}

/// The anchor line's name: `// ANCHOR: name …`, `-- ANCHOR: name`, `# ANCHOR: name`.
fn anchor_name<'l>(line: &'l str, keyword: &str) -> Option<&'l str> {
    let text = line.trim_start();
    let text = ["//", "--", "#"]
        .iter()
        .find_map(|leader| text.strip_prefix(*leader))?
        .trim_start();
    text.strip_prefix(keyword)?.split_whitespace().next()
}

/// The lines between `ANCHOR: name` and `ANCHOR_END: name`, other anchor lines left
/// out, with the indentation they share removed.
fn anchored(text: &str, anchor: &str) -> Result<String, String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| anchor_name(l, "ANCHOR:") == Some(anchor))
        .ok_or_else(|| format!("no ANCHOR: {anchor}"))?;
    let end = (start + 1..lines.len())
        .find(|&i| anchor_name(lines[i], "ANCHOR_END:") == Some(anchor))
        .ok_or_else(|| format!("no ANCHOR_END: {anchor} after its ANCHOR"))?;
    let region: Vec<&str> = lines[start + 1..end]
        .iter()
        .copied()
        .filter(|l| anchor_name(l, "ANCHOR:").is_none() && anchor_name(l, "ANCHOR_END:").is_none())
        .collect();
    let shared = region
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let dedented: Vec<&str> = region
        .iter()
        .map(|l| l.get(shared..).unwrap_or("").trim_end())
        .collect();
    Ok(dedented.join("\n"))
}

/// A LIMITS.md entry's lead: a bold list item's bold words, a heading's title, a table
/// row's first cell; with backticks and asterisks left out.
fn lead(line: &str) -> Option<String> {
    let plain = |text: &str| text.replace(['`', '*'], "").trim().to_string();
    if let Some(item) = line.strip_prefix("- **") {
        return item.split_once("**").map(|(bold, _)| plain(bold));
    }
    if line.starts_with('#') {
        return Some(plain(line.trim_start_matches('#')));
    }
    let row = line.strip_prefix('|')?;
    row.split('|').next().map(plain)
}

/// A field of the latest run's record, when that run was of the commit checked out at
/// `root` with a clean tree (its `environment.json` says which: `git_commit`).
fn record_field(root: &Path, file: &str, pointer: &str) -> Result<String, Unresolved> {
    let latest = root.join(LATEST_RUN);
    let json = |name: &str| -> Result<serde_json::Value, Unresolved> {
        let shown = format!("{LATEST_RUN}/{name}");
        let text = read(&latest.join(name), &shown).map_err(|_| {
            Unresolved::Unverified(format!("no {shown}: run ./run.sh on this commit first"))
        })?;
        serde_json::from_str(&text).map_err(|e| Unresolved::Missing(format!("{shown}: {e}")))
    };
    let ran = json("environment.json")?["git_commit"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let head = git_head(root).ok_or_else(|| {
        Unresolved::Unverified("not a git checkout: no commit to compare the run with".into())
    })?;
    if ran != head {
        return Err(Unresolved::Unverified(format!(
            "{LATEST_RUN} is a run of {ran}, not of HEAD {head} with a clean tree"
        )));
    }
    match json(file)?.pointer(pointer) {
        Some(serde_json::Value::String(text)) => Ok(text.clone()),
        Some(value) => Ok(value.to_string()),
        None => Err(Unresolved::Missing(format!(
            "no {pointer} in {LATEST_RUN}/{file}"
        ))),
    }
}

/// The commit checked out at `root` (`git rev-parse HEAD`); `None` outside a git checkout.
fn git_head(root: &Path) -> Option<String> {
    let output = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(root)
        .output()
        .ok()?;
    let head = String::from_utf8(output.stdout).ok()?.trim().to_string();
    (output.status.success() && !head.is_empty()).then_some(head)
}

/// The first table row (`| … |`, separator rows aside) whose first cell starts with
/// `cell`, trimmed.
fn table_row(text: &str, cell: &str) -> Option<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with('|') && !l.starts_with("|-") && !l.starts_with("| -"))
        .find(|l| lead(l).is_some_and(|lead| lead.starts_with(cell)))
        .map(ToString::to_string)
}

/// The text of the first LIMITS.md entry whose lead starts with `words`: a bold list
/// item with its continuation lines, a heading's line, or a table row; each line trimmed.
fn limit_entry(text: &str, words: &str) -> Option<String> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| lead(l).is_some_and(|lead| lead.starts_with(words)))?;
    let mut entry = vec![lines[start].trim()];
    if lines[start].starts_with("- **") {
        entry.extend(
            lines[start + 1..]
                .iter()
                .take_while(|l| {
                    let t = l.trim_start();
                    !t.is_empty()
                        && !l.starts_with("- ")
                        && !t.starts_with('#')
                        && !t.starts_with('|')
                })
                .map(|l| l.trim()),
        );
    }
    Some(entry.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_selector() {
        assert_eq!(
            Selector::parse(r#"snapshot R/R2 from "CASE R2" to "ok   new primary""#),
            Ok(Selector::Snapshot {
                case: CaseRef {
                    family: "R".into(),
                    id: "R2".into()
                },
                lines: Lines::Range {
                    from: "CASE R2".into(),
                    to: Some("ok   new primary".into())
                },
            })
        );
        assert!(matches!(
            Selector::parse(r"figure L/L3 /ok=(\d+)/"),
            Ok(Selector::Figure { from: FigureFrom::Snapshot(_), pattern }) if pattern == r"ok=(\d+)"
        ));
        assert!(matches!(
            Selector::parse(r"figure evidence/matrix.md /passed=(\d+)/"),
            Ok(Selector::Figure { from: FigureFrom::File(path), .. }) if path == "evidence/matrix.md"
        ));
        assert_eq!(
            Selector::parse("record environment.json /postgres/facts/server_version"),
            Ok(Selector::Record {
                file: "environment.json".into(),
                pointer: "/postgres/facts/server_version".into()
            })
        );
        assert_eq!(
            Selector::parse(r#"row evidence/matrix.md "server_version""#),
            Ok(Selector::Row {
                path: "evidence/matrix.md".into(),
                cell: "server_version".into()
            })
        );
        assert!(matches!(
            Selector::parse("source a/b.rs#debit"),
            Ok(Selector::Source { path, anchor }) if path == "a/b.rs" && anchor == "debit"
        ));
        assert_eq!(
            Selector::parse(r#"limit "Probing is \"not\" proof""#),
            Ok(Selector::Limit {
                words: "Probing is \"not\" proof".into()
            })
        );
        for wrong in [
            "snapshot L3",
            "snapshot ../L3",
            "figure L/L3 /(/",
            "figure ../x.md /(a)/",
            "row evidence/matrix.md server_version",
            "record runs/x.json /a",
            "record environment.json seed",
            "source ../x#a",
            "limit Probing",
            "snapshot L/L3 from \"a\" extra",
            "table matrix",
        ] {
            assert!(Selector::parse(wrong).is_err(), "{wrong}");
        }
    }

    #[test]
    fn selects_lines_figures_regions_and_entries() {
        let body = "CASE L3 :: x\n  note ok=14 insufficient=18\n  ok   a\n  ok   b";
        let range = Lines::Range {
            from: "note ok=".into(),
            to: Some("ok   a".into()),
        };
        assert_eq!(
            select_lines(body, &range).unwrap(),
            "  note ok=14 insufficient=18\n  ok   a"
        );
        let matching = Lines::Matching {
            pattern: "^  ok".into(),
        };
        assert_eq!(select_lines(body, &matching).unwrap(), "  ok   a\n  ok   b");
        assert_eq!(figure(body, r"insufficient=(\d+)").unwrap(), "18");
        assert!(matches!(
            figure(body, r"gone=(\d+)"),
            Err(Unresolved::Missing(_))
        ));
        let source = "fn f() {\n    // ANCHOR: body\n    let a = 1;\n    // ANCHOR: inner\n    a\n    // ANCHOR_END: body\n}\n";
        assert_eq!(anchored(source, "body").unwrap(), "let a = 1;\na");
        assert!(anchored(source, "inner").is_err());
        let limits = "# Limits\n\n- **Probing is not proof.** A race\n  shows what happened.\n- **Time.** Never.\n| `KEEP_RUNS` | 20 | kept |\n";
        assert_eq!(
            limit_entry(limits, "Probing is not").unwrap(),
            "- **Probing is not proof.** A race\nshows what happened."
        );
        assert_eq!(
            limit_entry(limits, "KEEP_RUNS").unwrap(),
            "| `KEEP_RUNS` | 20 | kept |"
        );
        assert_eq!(limit_entry(limits, "Limits").unwrap(), "# Limits");
        assert_eq!(limit_entry(limits, "Space"), None);
        let table = "| | 15 | 16 |\n|---|---|---|\n| server_version | 15.18 | 16.14 |\n";
        assert_eq!(
            table_row(table, "server").unwrap(),
            "| server_version | 15.18 | 16.14 |"
        );
        assert_eq!(table_row(table, "-"), None);
    }
}
