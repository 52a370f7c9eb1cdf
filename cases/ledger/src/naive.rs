//! The forced race in which the negative controls L4, L5 and L6 run the naive debit
//! (`points_ledger::naive::debit`, beside the transfer it refutes; SPEC §6).
//!
//! The race is forced rather than hoped for: every participant reads, then all meet at a
//! barrier, then each writes. The [`RacePlan`] names the participant count and whether the
//! barrier is there at all, so a test can run a control where the race cannot happen
//! ([`RacePlan::serial`], or one participant) and see the control's check fail.

use std::sync::Arc;

pub use points_ledger::naive::debit::{
    BalanceWrite, NaiveDebit, NaiveOutcome, NaiveReport, naive_debit,
};

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
