//! R5 — the old primary returns: split brain as a negative control, one history under
//! the product's rule.
//! Claim: after a failover (kill -9 of the primary once the standby has replayed all it
//! flushed, promotion, a debit on the new primary), an old primary restarted *as it
//! was*, with the host list naming it first, accepts a debit: two nodes take writes on
//! two timelines, a debit on each, neither has the other's — the split brain. Under the
//! product's rule (a demoted primary comes back only as a standby of the new one, or not
//! at all: fencing, the failover manager's job) the returned node is in recovery,
//! refuses writes (SQLSTATE 25006 `read_only_sql_transaction`), the host list's
//! `target_session_attrs=read-write` takes the debit to the new primary, and every debit
//! the returned node holds is one the new primary holds: one history.
//!
//! Fails if: the restarted old primary does not take a debit (shown in a test: returned
//! as a standby, it cannot), or under the rule the two nodes' ledgers differ or the
//! returned node accepts a write.
//!
//! Rust, not a file: the old primary is rebuilt as a standby of the new timeline (or
//! restarted as it was) and the service's writes are split between the two nodes; no
//! verb of the pair's engine rebuilds a node as another's standby.

use futures_util::FutureExt;
use points_ledger::{Outcome, debit_in, grant_in};
use scratch_pg::{Cluster, Replication};

use crate::pair::{self, LEDGER_DATABASE};
use crate::wal;
use case_kit::{Case, Ctx};

/// The case's registration.
pub fn case() -> Case {
    Case::new(
        "R5",
        "the old primary returns: split brain as a negative control; returned only as a standby, one history",
        |ctx| run(ctx).boxed(),
    )
    .not_clean()
}

/// The anomaly named by this control's `negative control exposes:` check.
pub const ANOMALY: &str = "split brain (two primaries, two histories)";

/// How the old primary comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Return {
    /// Started again as it was: a primary.
    AsItWas,
    /// Turned into a standby of the new primary first (the product's rule).
    AsStandby,
}

const ACCOUNT: &str = "acct-0005";
const CLIENT: &str = "app-r5";

async fn run(ctx: &mut Ctx) -> anyhow::Result<()> {
    control(ctx, Return::AsItWas).await?;
    product_rule(ctx).await
}

/// The two nodes after the old primary returned `how`, a debit made on the new primary
/// before it returned (`k-r5-new`) and one through the host list naming the old node
/// first after (`k-r5-returned`).
struct Returned {
    old: Cluster,
    new: Cluster,
    /// Whether the second debit landed on the old node.
    landed_on_old: bool,
}

async fn fail_over_and_return(ctx: &Ctx, how: Return) -> anyhow::Result<Returned> {
    let mode = cases_ledger::modes::mode(ctx);
    // Asynchronous: a returned primary that still named a synchronous standby would
    // hold its commits waiting on SyncRep for one that never comes.
    let pair = pair::start_pair(ctx, Replication::Asynchronous).await?;
    {
        let mut primary = pair.primary.connect(LEDGER_DATABASE).await?;
        grant_in(mode, &mut primary, "ops", "g-r5", ACCOUNT, 100).await?;
    }
    wal::wait_replayed(&pair.primary, &pair.standby).await?;
    let mut old = pair::kill_node(pair.primary).await?;
    let new = pair.standby;
    new.promote().await?;
    let mut on_new = new.connect(LEDGER_DATABASE).await?;
    debit_in(mode, &mut on_new, CLIENT, "k-r5-new", ACCOUNT, 10).await?;
    if how == Return::AsStandby {
        old.make_standby_of(&new, "old_primary")?;
    }
    let old = pair::start_again(old).await?;
    let mut config: tokio_postgres::Config = pair::multi_host_url(&[&old, &new]).parse()?;
    let (mut through_list, connection) = config
        .connect_timeout(std::time::Duration::from_millis(wal::CATCH_UP_TIMEOUT_MS))
        .connect(tokio_postgres::NoTls)
        .await?;
    tokio::spawn(connection);
    let result = debit_in(
        mode,
        &mut through_list,
        CLIENT,
        "k-r5-returned",
        ACCOUNT,
        10,
    )
    .await?;
    anyhow::ensure!(result.outcome == Outcome::Ok, "second debit: {result:?}");
    let port: i32 = through_list
        .query_one("SELECT inet_server_port()", &[])
        .await?
        .get(0);
    Ok(Returned {
        landed_on_old: port == i32::from(old.port()),
        old,
        new,
    })
}

/// The keys of the client's debits on `node`, sorted, space-separated.
async fn keys_on(node: &Cluster) -> anyhow::Result<String> {
    let client = node.connect(LEDGER_DATABASE).await?;
    let rows = client
        .query(
            "SELECT idem_key FROM ledger_txn WHERE client_id = $1 ORDER BY idem_key",
            &[&CLIENT],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|row| row.get::<_, String>(0))
        .collect::<Vec<_>>()
        .join(" "))
}

/// The negative control: the old primary returns `how` ([`Return::AsItWas`] in a run)
/// and the split brain is looked for.
///
/// Errors: a node did not start or promote; SQL errors.
pub async fn control(ctx: &mut Ctx, how: Return) -> anyhow::Result<()> {
    let returned = fail_over_and_return(ctx, how).await?;
    let old_primary = !pair::in_recovery(&returned.old).await?;
    let old_timeline = if old_primary {
        wal::timeline(&returned.old).await?
    } else {
        "standby".into()
    };
    let new_timeline = wal::timeline(&returned.new).await?;
    let (old_keys, new_keys) = (keys_on(&returned.old).await?, keys_on(&returned.new).await?);
    ctx.note(format!(
        "returned {how:?}: old node timeline {old_timeline} debits [{old_keys}], new primary timeline {new_timeline} debits [{new_keys}]"
    ));
    ctx.exposes(
        ANOMALY,
        old_primary
            && returned.landed_on_old
            && old_timeline != new_timeline
            && old_keys != new_keys,
        format!(
            "second debit landed on the old node: {}",
            returned.landed_on_old
        ),
    );
    Ok(())
}

/// The product's rule: the old primary returns only as the new primary's standby.
async fn product_rule(ctx: &mut Ctx) -> anyhow::Result<()> {
    let returned = fail_over_and_return(ctx, Return::AsStandby).await?;
    ctx.check(
        "rule: the returned node is a standby (pg_is_in_recovery)",
        pair::in_recovery(&returned.old).await?,
        "",
    );
    let refused = returned
        .old
        .connect(LEDGER_DATABASE)
        .await?
        .batch_execute("UPDATE account SET balance = balance WHERE account_id = 'acct-0005'")
        .await
        .err()
        .and_then(|error| error.code().map(|code| code.code().to_string()));
    ctx.check_eq(
        "rule: a write on the returned node is refused",
        "25006".to_string(),
        refused.unwrap_or_else(|| "accepted".into()),
    );
    ctx.check(
        "rule: the host list took the debit to the new primary",
        !returned.landed_on_old,
        "",
    );
    // Whether the returned node can follow the new timeline depends on whether its own
    // WAL went past the fork point before the kill (then it needs pg_rewind or a new
    // base backup, LIMITS.md); recorded, not checked. What the rule guarantees is
    // checked: every debit the returned node holds is one the new primary holds.
    let (old_keys, new_keys) = (keys_on(&returned.old).await?, keys_on(&returned.new).await?);
    let foreign: Vec<&str> = old_keys
        .split_whitespace()
        .filter(|key| !new_keys.split_whitespace().any(|new| new == *key))
        .collect();
    ctx.record("r5_returned_node_debits", old_keys.clone().into());
    ctx.check(
        "rule: one history (every debit on the returned node is on the new primary)",
        foreign.is_empty(),
        format!(
            "new primary [{new_keys}], only on the returned node [{}]",
            foreign.join(" ")
        ),
    );
    ctx.check_eq(
        "rule: the new primary's timeline",
        "00000002".to_string(),
        wal::timeline(&returned.new).await?,
    );
    Ok(())
}
