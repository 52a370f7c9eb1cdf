//! `./run.sh cite`: citations in the texts that quote the evidence, checked against the
//! committed files (docs/citing.md). A citation is a marker before a fenced block, a
//! blockquote or an inline figure, naming what it quotes by content ([`selector`]); the
//! check reads the texts and the files they cite (snapshots, sources, committed tables,
//! LIMITS.md; the latest run record only for a `record` citation), no database, and says
//! which quotes are current.
//!
//! Exit status: 0 when every citation is current and no harness output is quoted
//! without one, 1 otherwise, 2 for a usage error (as the harness's).

pub mod markdown;
pub mod selector;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use markdown::{Found, Quote};
use selector::{Selector, Unresolved};

/// The texts checked when no path is given: the README, every `*.md` under `docs/` (its
/// `articles/` among them), and the evidence folder's README.
pub const DEFAULT_PATHS: [&str; 3] = ["README.md", "docs", "evidence/README.md"];
/// Exit status when a citation is not current.
const EXIT_NOT_CURRENT: i32 = 1;
/// Exit status for a usage error.
const EXIT_USAGE: i32 = 2;

/// `./run.sh cite`: check, rewrite or list the citations of Markdown texts.
#[derive(Debug, clap::Parser)]
#[command(name = "cite", bin_name = "./run.sh cite")]
#[command(group(clap::ArgGroup::new("action").required(true)))]
pub struct CiteArgs {
    /// Check every citation against the committed files; print each one that is not
    /// current, then `CITE cites=N ok=N …`.
    #[arg(long, group = "action")]
    pub check: bool,
    /// Rewrite the quoted text of each stale citation to what it cites now. Refused
    /// under CI=true.
    #[arg(long, group = "action")]
    pub write: bool,
    /// Print the case ids the texts cite, one a line (to re-run only those).
    #[arg(long, group = "action")]
    pub list: bool,
    /// Markdown files or folders (every `*.md` under one) [default: README.md, docs/,
    /// evidence/README.md].
    pub paths: Vec<PathBuf>,
}

/// How one citation stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Status {
    /// The quote is what the selector selects now.
    Ok,
    /// The quote differs: a unified diff of quoted (`-`) and current (`+`) text.
    Stale { diff: String, current: String },
    /// The selector matches nothing (or the marker cannot be read).
    Missing(String),
    /// The cited file or LIMITS.md entry is gone.
    Gone(String),
    /// A run record's field with no run of the checked-out commit to compare with.
    Unverified(String),
}

/// One citation of a text and how it stands.
#[derive(Debug, Clone)]
pub struct Cited {
    /// The text, as given (relative to the root).
    pub text: PathBuf,
    /// The marker's line, counted from 1.
    pub line: usize,
    /// The marker's selector as written.
    pub selector: String,
    /// Whether the quote is current, and if not, why.
    pub status: Status,
    /// The case whose snapshot it quotes, if it quotes one.
    pub case: Option<String>,
    /// Where the quote sits, for `--write` (`None` for a marker that quotes nothing).
    quote: Option<Quote>,
}

/// Everything the check found in a set of texts.
#[derive(Debug, Default)]
pub struct Report {
    pub cited: Vec<Cited>,
    /// Quotes marked `none, illustrative`: text and line.
    pub illustrative: Vec<(PathBuf, usize)>,
    /// Code blocks (fenced or indented) of harness output without a marker: text and line.
    pub uncited: Vec<(PathBuf, usize)>,
    /// The case ids the texts' snapshot and figure selectors name.
    pub cases: BTreeSet<String>,
}

impl Report {
    /// Whether every citation is current and nothing is quoted uncited.
    pub fn all_current(&self) -> bool {
        self.uncited.is_empty() && self.cited.iter().all(|c| c.status == Status::Ok)
    }

    /// `CITE cites=N ok=N stale=N missing=N unverified=N gone=N illustrative=N uncited=N`.
    pub fn summary(&self) -> String {
        let count = |f: fn(&Status) -> bool| self.cited.iter().filter(|c| f(&c.status)).count();
        format!(
            "CITE cites={} ok={} stale={} missing={} unverified={} gone={} illustrative={} uncited={}",
            self.cited.len(),
            count(|s| *s == Status::Ok),
            count(|s| matches!(s, Status::Stale { .. })),
            count(|s| matches!(s, Status::Missing(_))),
            count(|s| matches!(s, Status::Unverified(_))),
            count(|s| matches!(s, Status::Gone(_))),
            self.illustrative.len(),
            self.uncited.len(),
        )
    }

    /// One line per citation that is not current (a stale one followed by its diff,
    /// indented), one per uncited block, then the summary line.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for cited in &self.cited {
            let at = format!("{}:{}", cited.text.display(), cited.line);
            match &cited.status {
                Status::Ok => {}
                Status::Stale { diff, .. } => {
                    out.push_str(&format!("stale {at} {}\n", cited.selector));
                    for line in diff.lines() {
                        out.push_str(&format!("    {line}\n"));
                    }
                }
                Status::Missing(why) => {
                    out.push_str(&format!("missing {at} {}: {why}\n", cited.selector))
                }
                Status::Gone(why) => {
                    out.push_str(&format!("gone {at} {}: {why}\n", cited.selector))
                }
                Status::Unverified(why) => {
                    out.push_str(&format!("unverified {at} {}: {why}\n", cited.selector))
                }
            }
        }
        for (text, line) in &self.uncited {
            out.push_str(&format!(
                "uncited {}:{line} a code block of harness output without a cite marker \
                 (cite what it quotes, or mark it <!-- cite: {} -->)\n",
                text.display(),
                markdown::ILLUSTRATIVE
            ));
        }
        out.push_str(&self.summary());
        out.push('\n');
        out
    }
}

/// Runs `./run.sh cite` with `args` (its own name first) in the current folder, the
/// repository's root; returns the exit status.
pub fn main(args: impl IntoIterator<Item = std::ffi::OsString>) -> i32 {
    let args = <CiteArgs as clap::Parser>::try_parse_from(args).unwrap_or_else(|e| e.exit());
    let root = Path::new(".");
    if args.write && case_kit::snapshot::is_ci() {
        eprintln!("cite: --write rewrites texts, which CI must not do; run it without CI=true");
        return EXIT_USAGE;
    }
    let texts = match texts(root, &args.paths) {
        Ok(texts) => texts,
        Err(message) => {
            eprintln!("cite: {message}");
            return EXIT_USAGE;
        }
    };
    let result = if args.write {
        write(root, &texts).map(|(report, written)| {
            for cited in &written {
                println!(
                    "wrote {}:{} {}",
                    cited.text.display(),
                    cited.line,
                    cited.selector
                );
            }
            report
        })
    } else {
        check(root, &texts)
    };
    let report = match result {
        Ok(report) => report,
        Err(error) => {
            eprintln!("cite: {error:#}");
            return EXIT_USAGE;
        }
    };
    if args.list {
        report.cases.iter().for_each(|case| println!("{case}"));
        return 0;
    }
    print!("{}", report.render());
    if report.all_current() {
        0
    } else {
        EXIT_NOT_CURRENT
    }
}

/// The Markdown texts `paths` name under `root` (each file, and every `*.md` under each
/// folder, sorted); [`DEFAULT_PATHS`] when none is given.
///
/// Errors: a path that does not exist.
pub fn texts(root: &Path, paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let given: Vec<PathBuf> = if paths.is_empty() {
        DEFAULT_PATHS.iter().map(PathBuf::from).collect()
    } else {
        paths.to_vec()
    };
    let mut out = Vec::new();
    for path in given {
        let full = root.join(&path);
        if full.is_dir() {
            markdown_under(root, &path, &mut out);
        } else if full.is_file() {
            out.push(path);
        } else {
            return Err(format!("{} does not exist", path.display()));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// Every `*.md` under `dir` (relative to `root`), symbolic links and `target`, `runs`
/// and hidden folders left out.
fn markdown_under(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = dir.join(&name);
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() && !name.starts_with('.') && name != "target" && name != "runs" {
            markdown_under(root, &path, out);
        } else if kind.is_file() && name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// Checks every citation of `texts` (relative to `root`) against the files under `root`.
///
/// Errors: a text cannot be read.
pub fn check(root: &Path, texts: &[PathBuf]) -> anyhow::Result<Report> {
    check_proposed(root, texts, &[])
}

/// As [`check`], with the snapshots of the cases in `proposed` read from their pending
/// proposals (`<id>.snap.new`) where there are some: the check as it would stand once
/// they are accepted.
///
/// Errors: a text cannot be read.
fn check_proposed(root: &Path, texts: &[PathBuf], proposed: &[String]) -> anyhow::Result<Report> {
    let mut report = Report::default();
    for text in texts {
        let content = std::fs::read_to_string(root.join(text))
            .map_err(|e| anyhow::anyhow!("reading {}: {e}", text.display()))?;
        check_text((root, proposed), text, &content, &mut report);
    }
    Ok(report)
}

/// Adds what one text cites (and quotes uncited) to `report`; `from` is the root and
/// the cases whose proposals are read instead of their snapshots.
fn check_text(from: (&Path, &[String]), text: &Path, content: &str, report: &mut Report) {
    let lines = markdown::lines(content);
    for found in markdown::scan(content) {
        let (line, selector, quote) = match found {
            Found::Illustrative { line } => {
                report.illustrative.push((text.to_path_buf(), line + 1));
                continue;
            }
            Found::Uncited { line } => {
                report.uncited.push((text.to_path_buf(), line + 1));
                continue;
            }
            Found::Unquoted { line, selector } => (line, selector, None),
            Found::Citation {
                line,
                selector,
                quote,
            } => (line, selector, Some(quote)),
        };
        let mut case = None;
        let status = match (Selector::parse(&selector), &quote) {
            (Err(why), _) => Status::Missing(format!("cannot read the marker: {why}")),
            (Ok(_), None) => {
                Status::Missing("no fenced block or blockquote follows the marker".into())
            }
            (Ok(parsed), Some(quote)) => {
                case = parsed.case().map(|case| case.id.clone());
                report.cases.extend(case.clone());
                let at = (text, line + 1);
                status(
                    from,
                    &parsed,
                    &markdown::quoted_text(&lines, quote),
                    quote,
                    at,
                )
            }
        };
        report.cited.push(Cited {
            text: text.to_path_buf(),
            line: line + 1,
            selector,
            status,
            case,
            quote,
        });
    }
}

/// How a quote stands against what its selector selects now; `at` is the text and the
/// marker's line, for the diff's header.
fn status(
    (root, proposed): (&Path, &[String]),
    parsed: &Selector,
    quoted: &str,
    quote: &Quote,
    at: (&Path, usize),
) -> Status {
    let current = match parsed.resolve_proposed(root, proposed) {
        Ok(current) => trimmed_lines(&current),
        Err(Unresolved::Missing(why)) => return Status::Missing(why),
        Err(Unresolved::Gone(why)) => return Status::Gone(why),
        Err(Unresolved::Unverified(why)) => return Status::Unverified(why),
    };
    let same = match quote {
        // A blockquote is prose: its line breaks and spacing are the text's own.
        Quote::Blockquote { .. } => collapse(quoted) == collapse(&current),
        _ => quoted == current,
    };
    if same {
        return Status::Ok;
    }
    let quoted_header = format!("{}:{} (quoted)", at.0.display(), at.1);
    let current_header = format!("{} (now)", parsed.file().display());
    let diff = case_kit::snapshot::text_diff(
        &format!("{quoted}\n"),
        &format!("{current}\n"),
        (quoted_header.as_str(), current_header.as_str()),
        1,
    );
    Status::Stale { diff, current }
}

/// Whitespace runs as one space, none at the ends.
fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Each line without trailing whitespace, as insta compares and a text keeps them.
fn trimmed_lines(text: &str) -> String {
    text.lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rewrites the quoted text of every stale citation of `texts` to what it cites now,
/// then checks again. Returns the check after writing and the citations rewritten.
///
/// Errors: a text cannot be read or written.
pub fn write(root: &Path, texts: &[PathBuf]) -> anyhow::Result<(Report, Vec<Cited>)> {
    let before = check(root, texts)?;
    let mut written = Vec::new();
    for text in texts {
        let stale: Vec<&Cited> = before
            .cited
            .iter()
            .filter(|c| &c.text == text && matches!(c.status, Status::Stale { .. }))
            .collect();
        if stale.is_empty() {
            continue;
        }
        let path = root.join(text);
        let content = std::fs::read_to_string(&path)?;
        std::fs::write(&path, rewritten(&content, &stale))
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", text.display()))?;
        written.extend(stale.into_iter().cloned());
    }
    Ok((check(root, texts)?, written))
}

/// `content` with each stale citation's quote replaced by its current text; the
/// citations are in the text's order, so they are replaced from the last one back.
fn rewritten(content: &str, stale: &[&Cited]) -> String {
    let original = markdown::lines(content);
    let mut lines: Vec<String> = original.iter().map(ToString::to_string).collect();
    for cited in stale.iter().rev() {
        let (Some(quote), Status::Stale { current, .. }) = (&cited.quote, &cited.status) else {
            continue;
        };
        let now: Vec<&str> = lines.iter().map(String::as_str).collect();
        let new = markdown::replacement(&now, quote, current);
        lines.splice(markdown::replaced_lines(quote), new);
    }
    lines.join("\n")
}

/// After a run of the cases `ran` (ids), whose snapshots `--accept` may have rewritten
/// (or `cargo insta accept` before the run): one line for each citation in the default
/// texts under `root` that quotes one of them and is now stale, saying that `./run.sh
/// cite --check` fails until it is updated. Empty when none is, or when `root` has no
/// such texts.
pub fn stale_after_accept(root: &Path, ran: &[String]) -> Vec<String> {
    stale_citations(root, ran, &[], |c| {
        format!(
            "cited: {}:{} {} quotes the snapshot as it was; ./run.sh cite --check fails until ./run.sh cite --write {} updates it",
            c.text.display(),
            c.line,
            c.selector,
            c.text.display()
        )
    })
}

/// After a run left pending proposals (`<id>.snap.new`) for the cases `proposed`: one
/// line for each citation in the default texts under `root` that quotes one of those
/// snapshots and would be stale once the proposal is accepted (`cargo insta accept`),
/// saying so before it is. Empty when none would be.
pub fn stale_if_accepted(root: &Path, proposed: &[String]) -> Vec<String> {
    stale_citations(root, proposed, proposed, |c| {
        let case = c.case.as_deref().unwrap_or_default();
        format!(
            "cited: {}:{} {} quotes {case}'s snapshot, not its proposal; once that is accepted (cargo insta accept, or ./run.sh --accept {case}), ./run.sh cite --check fails until ./run.sh cite --write {} updates it",
            c.text.display(),
            c.line,
            c.selector,
            c.text.display()
        )
    })
}

/// The stale citations of the default texts under `root` that quote a snapshot of one
/// of `cases`, checked with the proposals of `proposed` read, each as `line` says.
fn stale_citations(
    root: &Path,
    cases: &[String],
    proposed: &[String],
    line: impl Fn(&Cited) -> String,
) -> Vec<String> {
    let Ok(report) = texts(root, &[])
        .map_err(anyhow::Error::msg)
        .and_then(|t| check_proposed(root, &t, proposed))
    else {
        return Vec::new();
    };
    report
        .cited
        .iter()
        .filter(|c| matches!(c.status, Status::Stale { .. }))
        .filter(|c| c.case.as_ref().is_some_and(|id| cases.contains(id)))
        .map(line)
        .collect()
}
