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
