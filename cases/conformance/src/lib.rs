//! Family **C**: `./run.sh conformance`, a black-box suite for any service that speaks
//! the debit contract of docs/http.md (§6.2 the balance read, §6.3 the debit with
//! `X-Client-Id`, `Idempotency-Key` and an amount; its 201 / replay / 409 / 422 / 503
//! rules). The suite knows the target only by its URL and, optionally, the commands that
//! start, kill and set it up (or ledger-svc's admin URL): no database access, no hook
//! points. Races are forced at a TCP proxy in front of the target (`launch::proxy`: N
//! requests held and counted, then released together); lost answers are cut there after
//! the target answered. docs/conformance.md says how to point it at a service, what each
//! case proves and what a black box cannot show.
//!
//! - [`http`]: the suite's HTTP client; every request bounded.
//! - [`target`]: the target as given (URL, commands), its process when the suite starts it.
//! - [`outcome`]: a case's checks and the run's evidence (transcript, `results.json`,
//!   `junit.xml`, `index.html`).
//! - [`basic`] (C1, C2, C7), [`races`] (C3–C5), [`kill`] (C6), [`random`] (C8): the cases.
//! - [`case`]: what a case works with, and its entry in the catalogue.
//! - [`suite`]: the catalogue and one run against one target.
//! - [`selfcheck`]: `--self-check`, both bundled targets, the defect table.

pub mod basic;
pub mod case;
pub mod http;
pub mod kill;
pub mod outcome;
pub mod races;
pub mod random;
pub mod selfcheck;
pub mod suite;
pub mod target;

/// Longest wait for one HTTP answer from the target (or the proxy in front of it),
/// milliseconds; then the request's outcome is unknown and the check that needed it fails
/// with that reason.
pub const REQUEST_TIMEOUT_MS: u64 = 5_000;
/// Longest run of one case (C8 gets [`RANDOM_CASE_TIMEOUT_MS`]), milliseconds; a case
/// still running then ends with a failed check naming the bound.
pub const CASE_TIMEOUT_MS: u64 = 60_000;
/// Longest run of C8, the randomized run, milliseconds.
pub const RANDOM_CASE_TIMEOUT_MS: u64 = 180_000;
/// Longest wait for a target the suite started (or restarted) to answer a balance read
/// with any status below 500, milliseconds.
pub const READY_TIMEOUT_MS: u64 = 30_000;
/// Longest wait for N requests to be seen held at the proxy before a release,
/// milliseconds.
pub const HOLD_WAIT_MS: u64 = 10_000;

/// Waits until `seen()` holds, looking every 5 ms, for at most [`HOLD_WAIT_MS`]: a hang
/// bound only; the caller checks the count it waited for afterwards, so a bound that
/// passes fails that check by name rather than deciding anything.
pub(crate) async fn wait_until(mut seen: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(HOLD_WAIT_MS);
    while !seen() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}
/// Longest wait, after a kill, for the target to stop accepting connections,
/// milliseconds.
pub const KILL_WAIT_MS: u64 = 10_000;
/// How a reason starts when a case cannot go on because the target was not given what it
/// needs (a way to add points): the case is then listed as not run, not failed.
pub const NOT_GIVEN: &str = "not given: ";
/// `X-Client-Id` of every request the cases send.
pub const CLIENT_ID: &str = "conformance";
