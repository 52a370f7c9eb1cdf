//! What the I cases share: a case's own database on the run's MariaDB, the product's
//! events with short names, the lock-wait observer, and the invariant checked after
//! every clean case. The hooks (`Gate`, `FailAt`), the order helper and the control
//! plans are the F family's (`cases_frozen::fixtures`), shared rather than copied.

use std::time::{Duration, Instant};

use case_kit::Ctx;
use frozen_balances::{
    Asset, CancelResult, DepositRequest, FillRequest, FillResult, Market, NoHooks, PlaceRequest,
    PlaceResult, Side,
};
use frozen_balances_innodb::{InnoError, Tally};
use mysql_async::prelude::Queryable;

use cases_frozen::fixtures::cancel_request;
pub use cases_frozen::fixtures::{FailAt, Gate, Plan, T, deposit_request, fill_request, order};

/// How long [`Db::wait_for_lock_waiters`] looks before it gives up (a hang bound),
/// milliseconds.
pub const LOCK_WAIT_MAX_MS: u64 = 10_000;
/// The least time between two reads of `INNODB_TRX`, milliseconds. InnoDB fills
/// `INNODB_TRX`, `INNODB_LOCKS` and `INNODB_LOCK_WAITS` from one cache that it refreshes
/// only when the previous read of it is more than 0.1 s old (`can_cache_be_updated` in
/// `trx0i_s.cc`; MySQL reference manual, "Persistence and Consistency of InnoDB
/// Transaction and Locking Information"): reads closer together than that, from any case
/// of the run, would see the same stale picture forever. All reads of the process go
/// through one pacer.
const TRX_CACHE_IDLE_MS: u64 = 120;

/// When the last read of `INNODB_TRX` in this process ended.
static LAST_TRX_READ: tokio::sync::Mutex<Option<Instant>> = tokio::sync::Mutex::const_new(None);

/// A session of the process list for a failure message: id, state, transaction state,
/// the start of its statement.
type Session = (u64, Option<String>, Option<String>, Option<String>);

/// A case's own database on the run's scratch MariaDB, with the product's tables.
pub struct Db {
    /// The database's name, `i_<case id>[_<suffix>]`.
    pub name: String,
}

impl Db {
    /// Creates the case's database afresh (`i_<case id in lower case>`) and installs the
    /// tables in it.
    ///
    /// Errors: no server installed; SQL errors.
    pub async fn open(ctx: &Ctx) -> anyhow::Result<Db> {
        Db::open_named(&format!("i_{}", ctx.case_id().to_lowercase())).await
    }

    /// [`Db::open`] under an explicit name (tests run one case under several plans).
    ///
    /// Errors: as [`Db::open`].
    pub async fn open_named(name: &str) -> anyhow::Result<Db> {
        let mut admin = mysql_async::Conn::new(crate::server::opts(None)?).await?;
        admin
            .query_drop(format!("DROP DATABASE IF EXISTS `{name}`"))
            .await?;
        admin
            .query_drop(format!("CREATE DATABASE `{name}`"))
            .await?;
        admin.disconnect().await?;
        let db = Db { name: name.into() };
        let mut conn = db.connect().await?;
        frozen_balances_innodb::schema::install(&mut conn).await?;
        Ok(db)
    }

    /// A product connection (`CLIENT_FOUND_ROWS` on).
    ///
    /// Errors: the client's.
    pub async fn connect(&self) -> anyhow::Result<mysql_async::Conn> {
        let base = crate::server::opts(Some(&self.name))?;
        Ok(frozen_balances_innodb::conn::connect(base).await?)
    }

    /// A connection with the client's default options (no `CLIENT_FOUND_ROWS`).
    ///
    /// Errors: the client's.
    pub async fn connect_plain(&self) -> anyhow::Result<mysql_async::Conn> {
        Ok(mysql_async::Conn::new(crate::server::opts(Some(&self.name))?).await?)
    }

    /// Sessions of this database waiting for an InnoDB lock now
    /// (`information_schema.INNODB_TRX.trx_state = 'LOCK WAIT'`, joined to the process
    /// list by thread id for the database's name). Reads are paced
    /// [`TRX_CACHE_IDLE_MS`] apart so that InnoDB refreshes the table between them.
    ///
    /// Errors: SQL errors.
    pub async fn lock_waiters(&self, observer: &mut mysql_async::Conn) -> anyhow::Result<i64> {
        let mut last = paced().await;
        let n: Result<Option<i64>, _> = observer
            .exec_first(
                "SELECT COUNT(*) FROM information_schema.INNODB_TRX t \
                 JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id \
                 WHERE t.trx_state = 'LOCK WAIT' AND p.DB = ?",
                (&self.name,),
            )
            .await;
        *last = Some(Instant::now());
        Ok(n?.unwrap_or_default())
    }

    /// Waits until at least `n` sessions of this database wait for a lock: the moment a
    /// race is known to be forced. Looks at most [`LOCK_WAIT_MAX_MS`] (a hang bound).
    ///
    /// Errors: SQL errors; fewer than `n` waiters within the bound.
    pub async fn wait_for_lock_waiters(
        &self,
        observer: &mut mysql_async::Conn,
        n: i64,
    ) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_millis(LOCK_WAIT_MAX_MS);
        let mut most = 0;
        while Instant::now() < deadline {
            most = most.max(self.lock_waiters(observer).await?);
            if most >= n {
                return Ok(());
            }
        }
        let sessions: Vec<Session> = observer
            .exec(
                "SELECT p.ID, p.STATE, t.trx_state, LEFT(p.INFO, 60) FROM information_schema.PROCESSLIST p \
                 LEFT JOIN information_schema.INNODB_TRX t ON p.ID = t.trx_mysql_thread_id \
                 WHERE p.DB = ?",
                (&self.name,),
            )
            .await?;
        anyhow::bail!(
            "fewer than {n} sessions waited for a lock within {LOCK_WAIT_MAX_MS} ms (at most {most}); sessions: {sessions:?}"
        )
    }
}

/// The pacer of `INNODB_TRX` reads, held for one read: returns once the last read of
/// the process ended at least [`TRX_CACHE_IDLE_MS`] ago; the caller sets the time its
/// read ended.
async fn paced() -> tokio::sync::MutexGuard<'static, Option<Instant>> {
    let last = LAST_TRX_READ.lock().await;
    if let Some(at) = *last {
        let since = at.elapsed();
        let idle = Duration::from_millis(TRX_CACHE_IDLE_MS);
        if since < idle {
            tokio::time::sleep(idle - since).await;
        }
    }
    last
}

/// Which of the connections `ids` (`CONNECTION_ID()`) wait for a lock now: an InnoDB
/// row or table lock (`INNODB_TRX.trx_state = 'LOCK WAIT'`, read through the same pacer
/// as [`Db::lock_waiters`]), or a lock of the server above the engine, which InnoDB
/// does not see: a metadata lock (an `ALTER TABLE` behind an open transaction that read
/// the table), a table-level lock, the backup or global read lock, a `GET_LOCK` user
/// lock. Those show in the connection's `PROCESSLIST.STATE` (`Waiting for … lock`,
/// `User lock`; MariaDB's thread states, "General Thread States"), read live.
///
/// Errors: SQL errors.
pub async fn lock_waiting(
    observer: &mut mysql_async::Conn,
    ids: &[u64],
) -> Result<Vec<u64>, mysql_async::Error> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list: Vec<String> = ids.iter().map(u64::to_string).collect();
    let mut last = paced().await;
    let waiting = observer
        .query(format!(
            "SELECT trx_mysql_thread_id FROM information_schema.INNODB_TRX \
             WHERE trx_state = 'LOCK WAIT' AND trx_mysql_thread_id IN ({ids}) \
             UNION SELECT ID FROM information_schema.PROCESSLIST \
             WHERE ID IN ({ids}) AND (STATE LIKE 'Waiting for %lock' OR STATE = 'User lock')",
            ids = list.join(", ")
        ))
        .await;
    *last = Some(Instant::now());
    waiting
}

/// Deposits what `req` says ([`deposit_request`]: whole coins from `sys-deposit`)
/// without hooks.
///
/// Errors: the product's.
pub async fn deposit(conn: &mut mysql_async::Conn, req: &DepositRequest) -> anyhow::Result<()> {
    frozen_balances_innodb::deposit(conn, req, &NoHooks, &Tally::default()).await?;
    Ok(())
}

/// Places `req` without hooks.
///
/// Errors: the product's.
pub async fn place(
    conn: &mut mysql_async::Conn,
    req: &PlaceRequest,
) -> Result<PlaceResult, InnoError> {
    frozen_balances_innodb::place(conn, req, &NoHooks, &Tally::default()).await
}

/// The id of an order that must have been placed.
///
/// Errors: the placement failed or was refused.
pub async fn placed(conn: &mut mysql_async::Conn, req: &PlaceRequest) -> anyhow::Result<i64> {
    let result = place(conn, req).await?;
    result
        .order_id
        .ok_or_else(|| anyhow::anyhow!("{} refused: {}", req.business_id, result.outcome.as_str()))
}

/// alice's BUY of 1.0 BTC @ 5000 on BTC-USDT under `business_id`: a freeze of 5005 USDT
/// (5000 and the fee reserve), the placement most I cases make.
///
/// Errors: none for these figures (the type is [`order`]'s).
pub fn alice_buy(business_id: &str) -> anyhow::Result<PlaceRequest> {
    order(
        business_id,
        "alice",
        Market::BtcUsdt,
        Side::Buy,
        "1.0",
        "5000",
    )
}

/// The book most I cases start from, under business ids `dep-<case>01`/`02` and
/// `place-<case>01`/`02` (`case` such as `i1`): alice deposits 10 000 USDT and bob 1 BTC;
/// alice places a BUY of 1.0 BTC @ 5000 and bob a SELL of `sell_quantity` @ 4900 on
/// BTC-USDT. Returns `(buy_id, sell_id)`.
///
/// Errors: the product's; either placement refused.
pub async fn two_orders(
    conn: &mut mysql_async::Conn,
    case: &str,
    sell_quantity: &str,
) -> anyhow::Result<(i64, i64)> {
    let alice = deposit_request(&format!("dep-{case}01"), "alice", Asset::Usdt, 10_000);
    deposit(conn, &alice).await?;
    deposit(
        conn,
        &deposit_request(&format!("dep-{case}02"), "bob", Asset::Btc, 1),
    )
    .await?;
    let buy = alice_buy(&format!("place-{case}01"))?;
    let sell = order(
        &format!("place-{case}02"),
        "bob",
        Market::BtcUsdt,
        Side::Sell,
        sell_quantity,
        "4900",
    )?;
    Ok((placed(conn, &buy).await?, placed(conn, &sell).await?))
}

/// Fills without hooks.
///
/// Errors: the product's.
pub async fn fill(
    conn: &mut mysql_async::Conn,
    req: &FillRequest,
) -> Result<FillResult, InnoError> {
    frozen_balances_innodb::fill(conn, req, &NoHooks, &Tally::default()).await
}

/// Cancels `order_id` of `account` under `business_id` without hooks.
///
/// Errors: the product's.
pub async fn cancel(
    conn: &mut mysql_async::Conn,
    business_id: &str,
    account: &str,
    order_id: i64,
) -> Result<CancelResult, InnoError> {
    let req = cancel_request(business_id, account, order_id);
    frozen_balances_innodb::cancel(conn, &req, &NoHooks, &Tally::default()).await
}

/// One balance row as `available=… frozen=…`.
///
/// Errors: SQL errors.
pub async fn line(
    conn: &mut mysql_async::Conn,
    account: &str,
    asset: Asset,
) -> anyhow::Result<String> {
    Ok(frozen_balances_innodb::query::balance_line(conn, T, account, asset).await?)
}

/// Name of the invariant check.
pub const INVARIANT: &str = cases_frozen::fixtures::INVARIANT;

/// Checks [`INVARIANT`] and that the reconciliation is clean. Returns whether both held.
///
/// Errors: SQL errors.
pub async fn invariant(ctx: &mut Ctx, conn: &mut mysql_async::Conn) -> anyhow::Result<bool> {
    let findings = frozen_balances_innodb::reconcile(conn).await?;
    Ok(cases_frozen::fixtures::check_findings(ctx, &findings))
}

/// The outcome of a call as text: `OK`, `INSUFFICIENT`, … or the error.
pub fn outcome<R>(result: &Result<R, InnoError>, outcome: impl Fn(&R) -> &'static str) -> String {
    match result {
        Ok(r) => outcome(r).to_string(),
        Err(e) => e.to_string(),
    }
}
