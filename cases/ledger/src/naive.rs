//! The naive debit that the negative controls L4, L5 and L6 run on purpose (SPEC §6).
//!
//! **Never use this for anything but a negative control.** It is the design the real
//! transfer in `ledger-svc` exists to avoid: it reads the balance with a plain `SELECT`
//! (no row lock, no conditional `UPDATE`), decides in the application, and only then
//! writes; and it registers no idempotency key. Under READ COMMITTED two such transactions
//! that read before either writes both act on the same stale balance (PostgreSQL docs,
//! 13.2.1 "Read Committed Isolation Level": a plain `SELECT` sees a snapshot taken at its
//! start and takes no lock).
//!
//! The race is forced rather than hoped for: every participant reads, then all meet at a
//! barrier, then each writes. The [`RacePlan`] names the participant count and whether the
//! barrier is there at all, so a test can run a control where the race cannot happen
//! ([`RacePlan::serial`], or one participant) and see the control's check fail.

use std::sync::Arc;

use tokio::sync::Barrier;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, IsolationLevel, Transaction};

use case_kit::Ctx;

/// Participants of a forced race in L4, L5 and L6: 32 threads on 32 connections.
pub const RACE_PARTICIPANTS: usize = 32;

/// How the participants of a naive race are scheduled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Interleaving {
    /// All participants start together (each on its own OS thread and connection), read
    /// the balance, meet at the barrier, and only then write: every read precedes every
    /// write, so each write acts on the balance as it was before anyone wrote.
    ReadsMeetAtBarrier,
    /// One participant at a time, no barrier: each transaction has committed or rolled
    /// back before the next one starts, so no read can be stale and no race can happen.
    Serial,
}

/// The parameters of a naive race: how many participants and how they interleave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RacePlan {
    /// Number of naive debits (one per participant).
    pub participants: usize,
    /// Whether the participants overlap (barrier between read and write) or run serially.
    pub interleaving: Interleaving,
}

impl RacePlan {
    /// The plan of the negative controls: [`RACE_PARTICIPANTS`] participants whose reads
    /// all happen before the barrier and whose writes all happen after it.
    pub const FORCED: RacePlan = RacePlan::forced(RACE_PARTICIPANTS);

    /// `participants` racers that meet at the barrier between read and write.
    pub const fn forced(participants: usize) -> RacePlan {
        RacePlan {
            participants,
            interleaving: Interleaving::ReadsMeetAtBarrier,
        }
    }

    /// `participants` naive debits one after another, without a barrier: the race cannot
    /// happen, and a negative control run this way must report failure.
    pub const fn serial(participants: usize) -> RacePlan {
        RacePlan {
            participants,
            interleaving: Interleaving::Serial,
        }
    }
}

/// How the naive debit writes the balance after its application-side check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BalanceWrite {
    /// `SET balance = <read> - amount`: the absolute value computed from the read, which
    /// overwrites whatever committed in between (the lost update of L4).
    AbsoluteFromRead,
    /// `SET balance = balance - amount`: relative to the newest row version, so no debit
    /// is lost, but the check made on the stale read no longer holds (L5, L6).
    Relative,
}

/// One naive debit: `amount` points from `account` to `sys-redeem`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NaiveDebit {
    /// Written to `ledger_txn.client_id`; no `idem_request` row is made.
    pub client_id: String,
    /// Written to `ledger_txn.idem_key`; must be unique per debit (the table's UNIQUE key).
    pub idem_key: String,
    /// Account debited.
    pub account: String,
    /// Points, > 0.
    pub amount: i64,
    /// How the debited account's balance is written.
    pub write: BalanceWrite,
}

/// What one naive debit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NaiveOutcome {
    /// Committed: the naive code reports success to its caller.
    Committed,
    /// The application-side check refused: the balance read was below the amount.
    /// Nothing was written.
    RefusedByApplication,
    /// PostgreSQL refused a statement or the commit; the transaction was rolled back.
    /// `sqlstate` is the server's SQLSTATE (e.g. `"23514"` check_violation), `None` when
    /// the error did not come from the server.
    DatabaseError {
        /// SQLSTATE, five characters.
        sqlstate: Option<String>,
    },
}

impl NaiveOutcome {
    /// Whether this is a [`NaiveOutcome::DatabaseError`] with SQLSTATE 23514
    /// (check_violation), decided by the code, never by message text.
    pub fn is_check_violation(&self) -> bool {
        matches!(self, NaiveOutcome::DatabaseError { sqlstate: Some(code) }
            if code == SqlState::CHECK_VIOLATION.code())
    }
}

/// One participant's report: the balance it read (points; `None` if the read failed) and
/// its outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NaiveReport {
    /// The balance the naive `SELECT` returned.
    pub balance_read: Option<i64>,
    /// What happened after the read.
    pub outcome: NaiveOutcome,
}

impl NaiveReport {
    /// Whether the debit committed.
    pub fn committed(&self) -> bool {
        self.outcome == NaiveOutcome::Committed
    }
}

const READ_BALANCE_SQL: &str = "SELECT balance FROM account WHERE account_id = $1";
const WRITE_ABSOLUTE_SQL: &str = "UPDATE account SET balance = $2 WHERE account_id = $1";
const WRITE_RELATIVE_SQL: &str = "UPDATE account SET balance = balance - $2 WHERE account_id = $1";
const CREDIT_REDEEM_SQL: &str = "UPDATE account SET balance = balance + $2 WHERE account_id = $1";
const INSERT_TXN_SQL: &str =
    "INSERT INTO ledger_txn (client_id, idem_key, kind) VALUES ($1, $2, 'DEBIT') RETURNING txn_id";
const INSERT_ENTRIES_SQL: &str = "\
INSERT INTO ledger_entry (txn_id, account_id, amount)
VALUES ($1, $2, -$4::bigint), ($1, $3, $4::bigint)";

/// Runs one naive debit on `client`, in one READ COMMITTED transaction:
///
/// 1. `SELECT balance` (no lock);
/// 2. application-side check `read >= amount`;
/// 3. waits at `barrier` if given — always, whether the check passed or the read failed,
///    so that no other participant is left waiting;
/// 4. if the check passed: writes the balance as `req.write` says, credits `sys-redeem`
///    relatively, inserts the `ledger_txn` row and its two entries, and commits.
///
/// No `idem_request` row is written. Errors are outcomes here, not `Err`: a refused
/// statement is reported as [`NaiveOutcome::DatabaseError`] with its SQLSTATE.
pub async fn naive_debit(
    client: &mut Client,
    req: &NaiveDebit,
    barrier: Option<&Barrier>,
) -> NaiveReport {
    let started = client
        .build_transaction()
        .isolation_level(IsolationLevel::ReadCommitted)
        .start()
        .await;
    let transaction = match started {
        Ok(transaction) => transaction,
        Err(error) => {
            meet(barrier).await;
            return NaiveReport {
                balance_read: None,
                outcome: database_error(Some(&error)),
            };
        }
    };
    let read = transaction
        .query_opt(READ_BALANCE_SQL, &[&req.account])
        .await
        .map(|row| row.map(|row| row.get::<_, i64>(0)));
    meet(barrier).await;
    let balance_read = match read {
        Ok(balance_read) => balance_read,
        Err(error) => {
            return NaiveReport {
                balance_read: None,
                outcome: database_error(Some(&error)),
            };
        }
    };
    // A missing account reads as "not enough": the naive design has nothing better.
    if balance_read.is_none_or(|balance| balance < req.amount) {
        // Dropping the transaction rolls it back.
        drop(transaction);
        return NaiveReport {
            balance_read,
            outcome: NaiveOutcome::RefusedByApplication,
        };
    }
    let read_value = balance_read.unwrap_or_default();
    let written = write_debit(transaction, req, read_value).await;
    NaiveReport {
        balance_read,
        outcome: match written {
            Ok(()) => NaiveOutcome::Committed,
            Err(error) => database_error(Some(&error)),
        },
    }
}

/// Step 4 of [`naive_debit`], once its check passed on `read_value`: writes the balance as
/// `req.write` says, credits `sys-redeem` relatively, inserts the `ledger_txn` row and its
/// two entries, and commits `transaction`.
///
/// Errors: the first statement (or the commit) PostgreSQL refused; the transaction is then
/// rolled back as it is dropped.
async fn write_debit(
    transaction: Transaction<'_>,
    req: &NaiveDebit,
    read_value: i64,
) -> Result<(), tokio_postgres::Error> {
    match req.write {
        BalanceWrite::AbsoluteFromRead => {
            let new_balance = read_value - req.amount;
            transaction
                .execute(WRITE_ABSOLUTE_SQL, &[&req.account, &new_balance])
                .await?
        }
        BalanceWrite::Relative => {
            transaction
                .execute(WRITE_RELATIVE_SQL, &[&req.account, &req.amount])
                .await?
        }
    };
    transaction
        .execute(
            CREDIT_REDEEM_SQL,
            &[&points_ledger::SYS_REDEEM, &req.amount],
        )
        .await?;
    let txn_id: i64 = transaction
        .query_one(INSERT_TXN_SQL, &[&req.client_id, &req.idem_key])
        .await?
        .get(0);
    transaction
        .execute(
            INSERT_ENTRIES_SQL,
            &[
                &txn_id,
                &req.account,
                &points_ledger::SYS_REDEEM,
                &req.amount,
            ],
        )
        .await?;
    transaction.commit().await
}

async fn meet(barrier: Option<&Barrier>) {
    if let Some(barrier) = barrier {
        barrier.wait().await;
    }
}

fn database_error(error: Option<&tokio_postgres::Error>) -> NaiveOutcome {
    NaiveOutcome::DatabaseError {
        sqlstate: error.and_then(|e| e.code()).map(|c| c.code().to_owned()),
    }
}

/// Runs `plan.participants` naive debits in `ctx`'s database, `debit_for(index)` giving
/// participant `index`'s request. With [`Interleaving::ReadsMeetAtBarrier`] they run as
/// one [`Ctx::race`] and meet at its barrier between read and write; with
/// [`Interleaving::Serial`] each runs alone (its own thread and connection, as in a race
/// of one) after the previous one finished, without a barrier. Reports in index order.
///
/// Errors: a participant could not connect or panicked.
pub async fn run_race<F>(
    ctx: &Ctx,
    plan: RacePlan,
    debit_for: F,
) -> anyhow::Result<Vec<NaiveReport>>
where
    F: Fn(usize) -> NaiveDebit + Send + Sync + 'static,
{
    let debit_for = Arc::new(debit_for);
    match plan.interleaving {
        Interleaving::ReadsMeetAtBarrier => {
            ctx.race(plan.participants, move |mut racer| {
                let req = debit_for(racer.index);
                async move { naive_debit(&mut racer.client, &req, Some(&racer.barrier)).await }
            })
            .await
        }
        Interleaving::Serial => {
            let mut reports = Vec::with_capacity(plan.participants);
            for index in 0..plan.participants {
                let debit_for = debit_for.clone();
                let mut one = ctx
                    .race(1, move |mut racer| {
                        let req = debit_for(index);
                        async move { naive_debit(&mut racer.client, &req, None).await }
                    })
                    .await?;
                reports.append(&mut one);
            }
            Ok(reports)
        }
    }
}

/// Counts of a naive race's reports, for notes and checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Tally {
    /// Participants whose read returned the start balance given to [`Tally::of`]: they
    /// all acted on the same, soon stale, value.
    pub read_start_balance: usize,
    /// Committed debits (reported as successes).
    pub committed: usize,
    /// Refused by the application-side check.
    pub refused_by_application: usize,
    /// Rolled back with SQLSTATE 23514 (check_violation).
    pub check_violations: usize,
    /// Any other database error (or one without a SQLSTATE).
    pub other_errors: usize,
}

impl Tally {
    /// Counts `reports`; `start_balance` is the balance (points) before the race.
    pub fn of(reports: &[NaiveReport], start_balance: i64) -> Tally {
        let mut tally = Tally::default();
        for report in reports {
            if report.balance_read == Some(start_balance) {
                tally.read_start_balance += 1;
            }
            match &report.outcome {
                NaiveOutcome::Committed => tally.committed += 1,
                NaiveOutcome::RefusedByApplication => tally.refused_by_application += 1,
                outcome if outcome.is_check_violation() => tally.check_violations += 1,
                NaiveOutcome::DatabaseError { .. } => tally.other_errors += 1,
            }
        }
        tally
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(read: i64, outcome: NaiveOutcome) -> NaiveReport {
        NaiveReport {
            balance_read: Some(read),
            outcome,
        }
    }

    #[test]
    fn tally_counts_by_sqlstate() {
        let reports = vec![
            report(100, NaiveOutcome::Committed),
            report(
                100,
                NaiveOutcome::DatabaseError {
                    sqlstate: Some("23514".into()),
                },
            ),
            report(
                93,
                NaiveOutcome::DatabaseError {
                    sqlstate: Some("40P01".into()),
                },
            ),
            report(2, NaiveOutcome::RefusedByApplication),
            NaiveReport {
                balance_read: None,
                outcome: NaiveOutcome::DatabaseError { sqlstate: None },
            },
        ];
        let tally = Tally::of(&reports, 100);
        assert_eq!(
            tally,
            Tally {
                read_start_balance: 2,
                committed: 1,
                refused_by_application: 1,
                check_violations: 1,
                other_errors: 2,
            }
        );
    }

    #[test]
    fn plans() {
        assert_eq!(RacePlan::FORCED.participants, RACE_PARTICIPANTS);
        assert_eq!(
            RacePlan::FORCED.interleaving,
            Interleaving::ReadsMeetAtBarrier
        );
        assert_eq!(RacePlan::serial(3).interleaving, Interleaving::Serial);
    }
}
