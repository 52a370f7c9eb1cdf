//! No dependency declared for nothing (docs/HOUSE.md, "Dependencies"): the rule cargo-machete
//! applies, checked on every `cargo test --workspace` without installing it.
//!
//! - every dependency a workspace package declares is named in that package's Rust
//!   code (`name::`, `use name`, `extern crate name`, or `name!`; comment lines do not
//!   count), where `name` is the crate's name with `-` as `_` (or its `package =`
//!   rename);
//! - a normal dependency is named outside the package's `tests/` and `benches/` (one
//!   only a test names is a dev-dependency);
//! - every `[workspace.dependencies]` entry is declared by some package.
//!
//! The packages, their dependencies and their targets' source files come from `cargo
//! metadata`; a target's source may sit outside its package's folder (case-kit's
//! `snapshot_review` sits in `evidence/`), so each target's source folder is read too.
//! A dependency declared for a feature only is listed in its package's
//! `[package.metadata.cargo-machete] ignored`, the list cargo-machete reads.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

fn metadata() -> Value {
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
    serde_json::from_slice(&output.stdout).unwrap()
}

/// Rust files under `dir` (not into `target/`, hidden folders or nested packages other
/// than `dir` itself), each with whether it is test code (under `tests/` or `benches/`).
fn rust_files(dir: &Path, top: bool, test: bool, out: &mut Vec<(PathBuf, bool)>) {
    if !top && dir.join("Cargo.toml").exists() {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            if name != "target" && !name.starts_with('.') {
                let test = test || (top && matches!(name.as_str(), "tests" | "benches"));
                rust_files(&path, false, test, out);
            }
        } else if name.ends_with(".rs") {
            out.push((path, test));
        }
    }
}

/// The code of `files` (comment lines left out): (in test code, outside test code).
fn code_of(files: &[(PathBuf, bool)]) -> (String, String) {
    let (mut tests, mut rest) = (String::new(), String::new());
    for (file, test) in files {
        let text = std::fs::read_to_string(file).unwrap();
        let out = if *test { &mut tests } else { &mut rest };
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            out.push_str(line);
            out.push('\n');
        }
    }
    (tests, rest)
}

/// Whether `code` names the crate `ident` the ways cargo-machete looks for.
fn names(code: &str, ident: &str) -> bool {
    let pattern = format!(
        r"(\b{ident}::|\buse {ident}\b|\bextern crate {ident}\b|\b{ident}!)",
        ident = regex::escape(ident)
    );
    regex::Regex::new(&pattern).unwrap().is_match(code)
}

/// One declared dependency: its crate name in code and whether it is a normal one.
struct Declared {
    name: String,
    ident: String,
    normal: bool,
}

/// What is wrong with `declared`, given the package's code (test code, other code) and
/// its ignored list.
fn findings(
    package: &str,
    declared: &[Declared],
    code: &(String, String),
    ignored: &BTreeSet<String>,
) -> Vec<String> {
    let mut found = Vec::new();
    for dep in declared.iter().filter(|d| !ignored.contains(&d.name)) {
        let (in_tests, elsewhere) = (names(&code.0, &dep.ident), names(&code.1, &dep.ident));
        if !in_tests && !elsewhere {
            found.push(format!(
                "{package}: {} is declared and never named",
                dep.name
            ));
        } else if dep.normal && !elsewhere {
            found.push(format!(
                "{package}: {} is named by tests only (a dev-dependency)",
                dep.name
            ));
        }
    }
    found
}

fn package_findings(package: &Value) -> Vec<String> {
    let name = package["name"].as_str().unwrap();
    let manifest = Path::new(package["manifest_path"].as_str().unwrap());
    let mut files = Vec::new();
    rust_files(manifest.parent().unwrap(), true, false, &mut files);
    for target in package["targets"].as_array().unwrap() {
        let source = Path::new(target["src_path"].as_str().unwrap());
        let test = target["kind"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k == "test" || k == "bench");
        if !files.iter().any(|(file, _)| file == source) {
            files.push((source.to_path_buf(), test));
        }
    }
    let declared: Vec<Declared> = package["dependencies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dep| {
            let name = dep["rename"]
                .as_str()
                .unwrap_or(dep["name"].as_str().unwrap());
            Declared {
                name: name.to_string(),
                ident: name.replace('-', "_"),
                normal: dep["kind"].is_null(),
            }
        })
        .collect();
    let ignored: BTreeSet<String> = package["metadata"]["cargo-machete"]["ignored"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect();
    findings(name, &declared, &code_of(&files), &ignored)
}

/// The names under `[workspace.dependencies]` in the workspace's Cargo.toml.
fn workspace_dependencies() -> Vec<String> {
    let text = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let mut inside = false;
    let mut names = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == "[workspace.dependencies]";
        } else if inside
            && !line.starts_with('#')
            && let Some((name, _)) = line.split_once('=')
        {
            names.push(name.trim().to_string());
        }
    }
    names
}

#[test]
fn no_dependency_is_declared_for_nothing() {
    let metadata = metadata();
    let packages = metadata["packages"].as_array().unwrap();
    let mut found: Vec<String> = packages.iter().flat_map(package_findings).collect();
    let declared: BTreeSet<&str> = packages
        .iter()
        .flat_map(|p| p["dependencies"].as_array().unwrap())
        .map(|dep| dep["name"].as_str().unwrap())
        .collect();
    let listed = workspace_dependencies();
    assert!(
        listed.len() > 20,
        "read {listed:?} from [workspace.dependencies]"
    );
    for name in &listed {
        if !declared.contains(name.as_str()) {
            found.push(format!(
                "[workspace.dependencies]: {name} is declared by no package"
            ));
        }
    }
    println!(
        "{} packages, {} workspace dependencies checked",
        packages.len(),
        listed.len()
    );
    assert!(
        found.is_empty(),
        "dependencies declared for nothing:\n{}",
        found.join("\n")
    );
}

/// The negative control: the check reports a dependency no code names (one named
/// only in a comment among them) and a normal one only tests name; it passes one named
/// in code, a dev-dependency tests name, and an ignored one.
#[test]
fn the_check_reports_what_it_should() {
    let dep = |name: &str, normal: bool| Declared {
        name: name.into(),
        ident: name.replace('-', "_"),
        normal,
    };
    let declared = [
        dep("never-named", true),
        dep("tests-only", true),
        dep("used-here", true),
        dep("dev-used", false),
        dep("feature-only", true),
    ];
    let dir = std::env::temp_dir().join(format!("deps-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (test_file, lib_file) = (dir.join("t.rs"), dir.join("lib.rs"));
    std::fs::write(
        &test_file,
        "use tests_only::Thing;\nlet x = dev_used::f();\n",
    )
    .unwrap();
    std::fs::write(
        &lib_file,
        "    // never_named::f() in a comment\n/// never_named::g()\nuse used_here::{A, B};\n",
    )
    .unwrap();
    let code = code_of(&[(test_file, true), (lib_file, false)]);
    std::fs::remove_dir_all(&dir).unwrap();
    let ignored = BTreeSet::from(["feature-only".to_string()]);
    assert_eq!(
        findings("p", &declared, &code, &ignored),
        [
            "p: never-named is declared and never named",
            "p: tests-only is named by tests only (a dev-dependency)",
        ]
    );
    assert!(names("never_named!(x)", "never_named"));
    assert!(!names("not_never_named::f()", "never_named"));
}

/// The workspace's own packages: name → folder relative to the workspace root.
fn members(metadata: &Value) -> BTreeMap<String, String> {
    let root = workspace();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let manifest = Path::new(package["manifest_path"].as_str().unwrap());
            let folder = manifest.parent().unwrap().strip_prefix(&root).unwrap();
            let name = package["name"].as_str().unwrap().to_string();
            (name, folder.to_string_lossy().into_owned())
        })
        .collect()
}

/// What breaks the layers (README "Layout"): a system's normal dependency on a
/// workspace package outside `systems/`, or the case kit's on a system, a case family,
/// `launch` or the harness. `members` maps package names to folders; `normal` lists
/// each package's normal dependencies.
fn layer_findings(
    members: &BTreeMap<String, String>,
    normal: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    let in_folder =
        |name: &str, prefix: &str| members.get(name).is_some_and(|f| f.starts_with(prefix));
    let mut found = Vec::new();
    for (package, deps) in normal {
        for dep in deps.iter().filter(|dep| members.contains_key(*dep)) {
            let system = in_folder(package, "systems/");
            if system && !in_folder(dep, "systems/") {
                found.push(format!(
                    "{package} (a system) depends on {dep}, which is not a system"
                ));
            }
            let kit_breach = ["systems/", "cases/", "launch", "harness"]
                .iter()
                .any(|prefix| in_folder(dep, prefix));
            if package == "case-kit" && kit_breach {
                found.push(format!(
                    "case-kit depends on {dep}: the kit knows no system and no case"
                ));
            }
        }
    }
    found
}

#[test]
fn layers_point_one_way() {
    let metadata = metadata();
    let members = members(&metadata);
    let normal: BTreeMap<String, Vec<String>> = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let deps = package["dependencies"].as_array().unwrap();
            let deps = deps.iter().filter(|dep| dep["kind"].is_null());
            let names = deps
                .map(|dep| dep["name"].as_str().unwrap().to_string())
                .collect();
            (package["name"].as_str().unwrap().to_string(), names)
        })
        .collect();
    assert!(
        members
            .values()
            .filter(|f| f.starts_with("systems/"))
            .count()
            >= 6
    );
    let found = layer_findings(&members, &normal);
    assert!(found.is_empty(), "layers broken:\n{}", found.join("\n"));
    // The check can fail: a system that names the kit, and a kit that names a system.
    let mut planted = normal.clone();
    planted
        .get_mut("points-ledger")
        .unwrap()
        .push("case-kit".into());
    planted
        .get_mut("case-kit")
        .unwrap()
        .push("frozen-balances".into());
    assert_eq!(layer_findings(&members, &planted).len(), 2);
}

#[test]
fn the_readme_layout_names_every_package() {
    let metadata = metadata();
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let missing: Vec<String> = members(&metadata)
        .into_iter()
        .filter(|(name, folder)| !readme.contains(&format!("| `{folder}/` | `{name}` |")))
        .map(|(name, folder)| format!("{folder}/ ({name})"))
        .collect();
    assert!(
        missing.is_empty(),
        "README's layout table has no row `| `FOLDER/` | `CRATE` | … |` for: {}",
        missing.join(", ")
    );
}
