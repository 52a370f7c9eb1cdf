//! The house rules, checked over every Rust file of the workspace (docs/HOUSE.md):
//!
//! - no import circle between the files of a crate (a file's imports are the `crate::`,
//!   `super::` and `self::` paths it names, resolved to the module file they land in; a
//!   module naming its own submodules — declaring and re-exporting them — is the module
//!   tree, not an import, so those edges are left out);
//! - no function over 100 lines outside tests, and none over 70 without a comment line
//!   `// Long: <reason of three words or more>` in the comment block just above it or
//!   first in its body;
//! - every `SPEC §N` citation (and `§N.M`, and each number of `§N–§M` or `§N, §M`) names
//!   a section of `docs/SPEC.md`, and no text points outside the repository (an issue
//!   tracker, the team's shared folder, a path on one machine);
//! - every case of every family (`harness::families()`, extras aside) has its row in the
//!   case catalogue, `docs/cases.md`.
//!
//! A function's length runs from its `fn` keyword to its closing brace. Test code is
//! what lives under a crate's `tests/`, in a `#[cfg(test)]` module, or carries a
//! `#[test]`-like attribute. `cargo test -p harness --test house -- --nocapture` prints
//! the counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

/// The longest a function may be outside tests, in lines.
const HARD_LIMIT: usize = 100;
/// Past this many lines a function names its reason in a `// Long:` comment.
const REASON_LIMIT: usize = 70;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file under `dir` whose name ends with `ext`, skipping build output, git and
/// symbolic links (`evidence/latest` points into the git-ignored `evidence/runs`).
fn files(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|kind| kind.is_symlink()) {
            continue;
        }
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | ".git" | "node_modules" | "runs") {
                files(&path, ext, out);
            }
        } else if name.ends_with(ext) {
            out.push(path);
        }
    }
}

/// The crate roots of the workspace: each `src/lib.rs`, `src/main.rs` and `src/bin/*.rs`.
fn crate_roots() -> Vec<PathBuf> {
    let mut all = Vec::new();
    files(&root(), ".rs", &mut all);
    all.into_iter()
        .filter(|p| {
            let s = p.to_string_lossy();
            s.ends_with("/src/lib.rs") || s.ends_with("/src/main.rs") || s.contains("/src/bin/")
        })
        .collect()
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap();
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn is_test_attr(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        let path = a.path();
        let last = path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        if last == "test" {
            return true;
        }
        if path.is_ident("cfg") {
            let tokens = a
                .meta
                .require_list()
                .map(|l| l.tokens.to_string())
                .unwrap_or_default();
            // `cfg(test)` or `cfg(all(test, …))`; not `cfg(not(test))` or
            // `cfg(any(test, …))`, which also hold outside tests.
            let tokens: String = tokens.chars().filter(|c| !c.is_whitespace()).collect();
            return tokens == "test" || tokens.starts_with("all(test,");
        }
        false
    })
}

// ----- modules: which file holds which module path -----

/// A crate's module tree: module path (`["http", "routes"]`) to the file holding it.
fn module_files(root_file: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    walk_modules(root_file, &[], true, &mut out);
    out
}

fn walk_modules(
    file: &Path,
    path: &[String],
    owns_dir: bool,
    out: &mut BTreeMap<Vec<String>, PathBuf>,
) {
    out.insert(path.to_vec(), file.to_path_buf());
    let dir = if owns_dir {
        file.parent().unwrap().to_path_buf()
    } else {
        file.with_extension("")
    };
    let ast = parse(file);
    for item in &ast.items {
        let syn::Item::Mod(m) = item else { continue };
        if m.content.is_some() || is_test_attr(&m.attrs) {
            continue;
        }
        let name = m.ident.to_string();
        let mut child = path.to_vec();
        child.push(name.clone());
        let flat = dir.join(format!("{name}.rs"));
        if flat.exists() {
            walk_modules(&flat, &child, false, out);
        } else {
            walk_modules(&dir.join(&name).join("mod.rs"), &child, true, out);
        }
    }
}

/// Collects the module paths a file names through `crate::`, `super::` and `self::`.
struct Imports<'a> {
    here: &'a [String],
    /// Whether the file is a `mod.rs`/root, so that `self::` stays in its folder.
    found: BTreeSet<Vec<String>>,
}

impl Imports<'_> {
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let (first, rest) = segments.split_first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.to_vec(),
            "super" => {
                let mut b = self.here.to_vec();
                b.pop();
                let mut rest = rest;
                while rest.first().map(String::as_str) == Some("super") {
                    b.pop();
                    rest = &rest[1..];
                }
                b.extend(rest.iter().cloned());
                return Some(b);
            }
            _ => return None,
        };
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.record(prefix);
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.record(prefix),
            syn::UseTree::Group(g) => g.items.iter().for_each(|t| self.use_tree(prefix, t)),
        }
    }

    fn record(&mut self, segments: &[String]) {
        if let Some(abs) = self.absolute(segments) {
            self.found.insert(abs);
        }
    }
}

impl<'ast> Visit<'ast> for Imports<'_> {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }
    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.record(&segments);
        syn::visit::visit_path(self, p);
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        // An inline module (tests, say) is part of this file but its `super` is the file.
        if m.content.is_none() || is_test_attr(&m.attrs) {
            return;
        }
        syn::visit::visit_item_mod(self, m);
    }
}

/// The import graph of one crate: file to the files it imports from.
fn import_graph(root_file: &Path) -> BTreeMap<PathBuf, BTreeSet<PathBuf>> {
    let modules = module_files(root_file);
    let mut graph = BTreeMap::new();
    for (path, file) in &modules {
        let mut imports = Imports {
            here: path,
            found: BTreeSet::new(),
        };
        imports.visit_file(&parse(file));
        let mut targets = BTreeSet::new();
        for named in imports.found {
            // The longest prefix of the named path that is a module file.
            let target = (0..=named.len())
                .rev()
                .find_map(|n| modules.get(&named[..n]).cloned());
            if let Some(t) = target
                && &t != file
                // A parent naming its own child module (`mod x; use x::y`) is no import back.
                && !(named.len() > path.len() && named.starts_with(path))
            {
                targets.insert(t);
            }
        }
        graph.insert(file.clone(), targets);
    }
    graph
}

/// Strongly connected components with more than one file (Tarjan's algorithm).
fn circles(graph: &BTreeMap<PathBuf, BTreeSet<PathBuf>>) -> Vec<Vec<PathBuf>> {
    struct State<'g> {
        graph: &'g BTreeMap<PathBuf, BTreeSet<PathBuf>>,
        index: BTreeMap<&'g PathBuf, usize>,
        low: BTreeMap<&'g PathBuf, usize>,
        stack: Vec<&'g PathBuf>,
        on_stack: BTreeSet<&'g PathBuf>,
        out: Vec<Vec<PathBuf>>,
    }
    fn connect<'g>(s: &mut State<'g>, v: &'g PathBuf) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.graph.get(v).into_iter().flatten() {
            if !s.graph.contains_key(w) {
                continue;
            }
            if !s.index.contains_key(w) {
                connect(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v) {
            connect(&mut s, v);
        }
    }
    s.out
}

fn relative(p: &Path) -> String {
    p.strip_prefix(root()).unwrap_or(p).display().to_string()
}

#[test]
fn no_import_circle_between_files() {
    let mut found = Vec::new();
    for root_file in crate_roots() {
        for circle in circles(&import_graph(&root_file)) {
            found.push(
                circle
                    .iter()
                    .map(|p| relative(p))
                    .collect::<Vec<_>>()
                    .join(" ↔ "),
            );
        }
    }
    found.sort();
    found.dedup();
    println!("import circles: {}", found.len());
    for c in &found {
        println!("  {c}");
    }
    assert!(
        found.is_empty(),
        "import circles between files:\n{}",
        found.join("\n")
    );
}

// ----- function lengths -----

/// One function outside tests: where, how long, and whether a `// Long:` reason is given.
struct Length {
    at: String,
    lines: usize,
    reasoned: bool,
}

struct Functions<'a> {
    file: &'a Path,
    source: Vec<&'a str>,
    out: Vec<Length>,
}

impl Functions<'_> {
    fn record(
        &mut self,
        attrs: &[syn::Attribute],
        item_start: usize,
        sig: &syn::Signature,
        body: &syn::Block,
    ) {
        if is_test_attr(attrs) {
            return;
        }
        let start = sig.fn_token.span().start().line;
        let end = body.brace_token.span.close().end().line;
        let lines = end + 1 - start;
        let body_first = body.brace_token.span.open().start().line;
        // `// Long:` in the block of comments, doc lines and attributes just above the
        // `fn` (or its attributes), or first in the body.
        let is_long = |line: &str| {
            let reason = line.trim_start().strip_prefix("// Long:").unwrap_or("");
            reason.split_whitespace().count() >= 3
        };
        let mut above = item_start.min(start).saturating_sub(1);
        let mut reasoned = false;
        while above >= 1 {
            let line = self.source[above - 1].trim_start();
            if !(line.starts_with("//") || line.starts_with("#[")) {
                break;
            }
            reasoned |= is_long(line);
            above -= 1;
        }
        reasoned |=
            (item_start..=start).any(|l| self.source.get(l - 1).is_some_and(|s| is_long(s)));
        reasoned |= self.source.get(body_first).is_some_and(|s| is_long(s));
        self.out.push(Length {
            at: format!("{}:{start} {}", relative(self.file), sig.ident),
            lines,
            reasoned,
        });
    }
}

impl<'ast> Visit<'ast> for Functions<'_> {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        self.record(&f.attrs, f.span().start().line, &f.sig, &f.block);
        syn::visit::visit_item_fn(self, f);
    }
    fn visit_impl_item_fn(&mut self, f: &'ast syn::ImplItemFn) {
        self.record(&f.attrs, f.span().start().line, &f.sig, &f.block);
        syn::visit::visit_impl_item_fn(self, f);
    }
    fn visit_trait_item_fn(&mut self, f: &'ast syn::TraitItemFn) {
        if let Some(body) = &f.default {
            self.record(&f.attrs, f.span().start().line, &f.sig, body);
        }
        syn::visit::visit_trait_item_fn(self, f);
    }
    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        if !is_test_attr(&m.attrs) {
            syn::visit::visit_item_mod(self, m);
        }
    }
}

/// Every Rust file of the workspace that is not test code by its place.
fn non_test_files() -> Vec<PathBuf> {
    let mut all = Vec::new();
    files(&root(), ".rs", &mut all);
    all.retain(|p| {
        let s = relative(p);
        !s.contains("/tests/") && !s.contains("/benches/") && !s.starts_with("tests/")
    });
    all.sort();
    all
}

#[test]
fn functions_a_reader_can_hold() {
    let mut lengths = Vec::new();
    for file in non_test_files() {
        let text = std::fs::read_to_string(&file).unwrap();
        let ast = syn::parse_file(&text).unwrap();
        let mut visitor = Functions {
            file: &file,
            source: text.lines().collect(),
            out: Vec::new(),
        };
        visitor.visit_file(&ast);
        lengths.extend(visitor.out);
    }
    lengths.sort_by_key(|l| std::cmp::Reverse(l.lines));
    let over_hard: Vec<&Length> = lengths.iter().filter(|l| l.lines > HARD_LIMIT).collect();
    let over_reason: Vec<&Length> = lengths.iter().filter(|l| l.lines > REASON_LIMIT).collect();
    let unreasoned: Vec<&Length> = over_reason
        .iter()
        .copied()
        .filter(|l| !l.reasoned)
        .collect();
    println!(
        "functions outside tests: {}; over {REASON_LIMIT} lines: {}; over {HARD_LIMIT}: {}; over {REASON_LIMIT} without a reason: {}",
        lengths.len(),
        over_reason.len(),
        over_hard.len(),
        unreasoned.len()
    );
    for l in &over_reason {
        println!(
            "  {:4} {}{}",
            l.lines,
            l.at,
            if l.reasoned { " (reason given)" } else { "" }
        );
    }
    let show = |ls: &[&Length]| {
        ls.iter()
            .map(|l| format!("{} {}", l.lines, l.at))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert!(
        over_hard.is_empty(),
        "functions over {HARD_LIMIT} lines:\n{}",
        show(&over_hard)
    );
    assert!(
        unreasoned.is_empty(),
        "functions over {REASON_LIMIT} lines without a `// Long:` reason:\n{}",
        show(&unreasoned)
    );
}

// ----- citations -----

/// Every text file of the repository a reader follows citations in: sources, docs,
/// manifests, spec files and scripts (not the evidence of past runs).
fn text_files() -> Vec<PathBuf> {
    let mut all = Vec::new();
    for ext in [".rs", ".md", ".toml", ".sh", ".spec", ".json", ".snap"] {
        files(&root(), ext, &mut all);
    }
    let ci = root().join(".ci");
    files(&ci, "", &mut all);
    all.sort();
    all.dedup();
    all
}

#[test]
fn every_citation_points_inside_the_repository() {
    let spec = std::fs::read_to_string(root().join("docs/SPEC.md")).expect("docs/SPEC.md");
    // `## 3. The transfer` is §3, `### 3.3 Statement order` is §3.3.
    let sections: BTreeSet<String> = spec
        .lines()
        .filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### ")))
        .filter_map(|l| {
            l.split_once(' ')
                .map(|(n, _)| n.trim_end_matches('.').to_string())
        })
        .collect();
    // `SPEC §3`, `SPEC §1–§7`, `SPEC §3, §4`, `SPEC §3.3`: every number after `SPEC`.
    let cited =
        regex::Regex::new(r"SPEC (§[0-9.]*[0-9](?:(?:[–-]|, | and )§[0-9.]*[0-9])*)").unwrap();
    let one_section = regex::Regex::new(r"§([0-9.]*[0-9])").unwrap();
    let outside = regex::Regex::new(concat!(
        r"(?i)\bissues? #?\d+|github\.com/[^ )]*/(issues|pull)/|\.\./shared|shared/seeds",
        r"|seeds/0\d\d_|/home/\w|/work/\w|/root/\w",
    ))
    .unwrap();
    let mut wrong = Vec::new();
    let mut count = 0;
    for file in text_files() {
        // This file names the patterns it looks for.
        if file.ends_with("harness/tests/house.rs") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&file) else {
            continue;
        };
        for (number, line) in text.lines().enumerate() {
            let at = format!("{}:{}", relative(&file), number + 1);
            for found in cited.captures_iter(line) {
                count += 1;
                for section in one_section.captures_iter(&found[1]) {
                    if !sections.contains(&section[1]) {
                        wrong.push(format!(
                            "{at}: SPEC §{} has no section in docs/SPEC.md",
                            &section[1]
                        ));
                    }
                }
            }
            if let Some(found) = outside.find(line) {
                wrong.push(format!(
                    "{at}: points outside the repository: {:?}",
                    found.as_str()
                ));
            }
        }
    }
    println!(
        "SPEC § citations: {count}; sections in docs/SPEC.md: {}",
        sections.len()
    );
    assert!(count > 0, "no SPEC citation found: the search is broken");
    assert!(
        wrong.is_empty(),
        "citations that do not resolve:\n{}",
        wrong.join("\n")
    );
}

// ----- the case catalogue -----

#[test]
fn every_case_is_in_the_catalogue() {
    let catalogue = std::fs::read_to_string(root().join("docs/cases.md")).expect("docs/cases.md");
    // A row names its id in its first cell: `| L3 | …` or `| \`L3\` | …`.
    let rows: BTreeSet<String> = catalogue
        .lines()
        .filter_map(|l| l.strip_prefix('|'))
        .filter_map(|l| l.split('|').next())
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect();
    let mut missing = Vec::new();
    for family in harness::families() {
        for case in &family.cases {
            if !rows.contains(&case.id) {
                missing.push(case.id.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "cases without a row in docs/cases.md (add one: id, title, claim, control, what it forces, snapshot): {missing:?}"
    );
}
