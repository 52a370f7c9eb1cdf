//! The case families a run of the harness draws from, one crate each under `cases/`
//! (SPEC §6). Adding a family is one crate and one line in [`families`]; the binary
//! (`src/main.rs`) and the tests read the list from here.

use case_kit::Family;

pub mod cite;

/// Every family, in the order a full run lists them: L (the points ledger), F (frozen
/// balances), S (the SQLite inventory), R (the ledger with a standby and a failover),
/// P (power cuts), I (frozen balances on InnoDB, a scratch MariaDB).
pub fn families() -> Vec<Family> {
    vec![
        cases_ledger::family(),
        cases_frozen::family(),
        cases_inventory::family(),
        cases_topology::family(),
        cases_power::family(),
        cases_innodb::family(),
    ]
}

/// The verbs of `families` (those whose prefix is in `named`; all when it is empty),
/// as `./run.sh --verbs` prints them: per family its verb sets, one usage line per
/// verb and its documentation; a family whose verbs are not declared yet says so.
///
/// Errors: a name that is no family's prefix.
pub fn verb_listing(families: &[Family], named: &[String]) -> Result<String, String> {
    if let Some(unknown) = named
        .iter()
        .find(|name| !families.iter().any(|f| f.prefix == name.as_str()))
    {
        let known: Vec<&str> = families.iter().map(|f| f.prefix).collect();
        return Err(format!(
            "--verbs takes family prefixes ({}); {unknown:?} is none",
            known.join(" ")
        ));
    }
    let mut text = String::new();
    for family in families {
        if !named.is_empty() && !named.iter().any(|name| name == family.prefix) {
            continue;
        }
        if family.verbs.is_empty() {
            text.push_str(&format!(
                "{}: verbs not declared in a table yet (docs/specs.md lists them)\n",
                family.prefix
            ));
            continue;
        }
        text.push_str(&case_kit::spec::verbs::listing(
            family.prefix,
            &family.verbs,
        ));
    }
    Ok(text)
}

/// The verb reference of every family, in Markdown, as `docs/specs.md` holds it
/// between `<!-- verbs: begin -->` and `<!-- verbs: end -->` (checked by
/// `cargo test -p harness --test verbs`).
pub fn verb_reference() -> String {
    let families = families();
    let composed: Vec<(&str, Vec<&case_kit::spec::verbs::Verbs>)> = families
        .iter()
        .map(|family| (family.prefix, family.verbs.clone()))
        .collect();
    case_kit::spec::verbs::reference(&composed)
}

/// The id of the canary case, which checks something false on purpose and must FAIL;
/// if it ever passes, the runner is not reporting failures.
pub const CANARY_ID: &str = cases_ledger::canary::CANARY_ID;

/// The check the canary fails on purpose.
pub const CANARY_CHECK: &str = cases_ledger::canary::DELIBERATELY_FALSE;

/// What each case file's header says (`cases/*/src/*.rs`, read by `build.rs`): id,
/// claim (or the anomaly a control shows), and what counts as failure.
mod headers {
    include!(concat!(env!("OUT_DIR"), "/case_headers.rs"));
}

/// The case files' headers by case id, for a run's `index.html` (a spec case records
/// its own claim and failure condition when it runs).
pub fn case_headers() -> std::collections::BTreeMap<String, evidence_pages::run::Header> {
    headers::CASE_HEADERS
        .iter()
        .map(|(id, claim, fails)| {
            let header = evidence_pages::run::Header {
                claim: (*claim).to_string(),
                fails: (*fails).to_string(),
            };
            ((*id).to_string(), header)
        })
        .collect()
}

/// Renders the run record in `dir` as `dir/index.html` (`evidence_pages::run`).
///
/// Errors: the record has no readable `results.json`; the page cannot be written.
pub fn write_run_page(dir: &std::path::Path) -> anyhow::Result<std::path::PathBuf> {
    let page = evidence_pages::run::render(dir, &case_headers())?;
    let path = dir.join("index.html");
    evidence_pages::write(&path, &page)?;
    Ok(path)
}
