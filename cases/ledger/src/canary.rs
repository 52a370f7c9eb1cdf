//! CANARY — a case that must FAIL (not in the default run; `./run.sh CANARY`).
//! Claim (false on purpose): debiting 7 from 100 leaves 94. The ledger leaves 93.
//! Fails if: always, on exactly one check — the deliberately false one. If it ever
//! passes, the runner lost a failure (a check not recorded, a count not summed, an exit
//! status not set), and no green run can be trusted. `harness/tests/cases.rs` runs it and
//! asserts that it fails.
//! It also notes [`HOSTILE_NOTE`], markup that must render as text on the run's
//! evidence page (`harness/tests/browser.rs` looks for it in a real browser).

use futures_util::FutureExt;
use points_ledger::{Outcome, debit, grant};

use super::queries;
use case_kit::{Case, Ctx};

/// The canary's id.
pub const CANARY_ID: &str = "CANARY";

/// The name of the check that is false on purpose.
pub const DELIBERATELY_FALSE: &str = "canary: 100 - 7 = 94 (false on purpose; must FAIL)";

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        CANARY_ID,
        "canary: checks something false on purpose and must fail",
        |ctx| run(ctx).boxed(),
    )
}

const ACCOUNT: &str = "acct-0010";

/// A note holding markup: on the evidence page it must read as this text, never run
/// (the script would retitle the page) nor become an element (`#hostile-markup`).
pub const HOSTILE_NOTE: &str = "hostile text for the evidence page: \
    <script>document.title='pwned'</script><img src=x id=hostile-markup> & \"quotes\"";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    ctx.note(HOSTILE_NOTE);
    let mut db = ctx.connect().await?;
    grant(&mut db, "ops", "g-c001", ACCOUNT, 100).await?;
    let debited = debit(&mut db, "app-canary", "k-c001", ACCOUNT, 7).await?;
    // A true check first: the failure below is not the whole case going wrong.
    ctx.check_eq(
        "debit outcome",
        Outcome::Ok.as_str(),
        debited.outcome.as_str(),
    );
    let balance = queries::existing_balance(&db, ACCOUNT).await?;
    ctx.check_eq(DELIBERATELY_FALSE, 94, balance);
    Ok(())
}
