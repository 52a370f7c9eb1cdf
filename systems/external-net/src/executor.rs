//! The withdrawal executor: moves each withdrawal with an unprocessed outbox event on,
//! one step at a time, and never holds a database lock while it calls the network
//! (every database call below is its own short transaction, made before or after the
//! call, never around it).
//!
//! For each withdrawal ([`frozen_balances::withdraw::pending`], oldest event first):
//!
//! - `REQUESTED`: broadcast under the withdrawal id. Accepted → `BROADCAST`, then the
//!   query below. Refused → settle `FAILED` (released). No answer (timeout, connection
//!   closed, anything else) → `UNKNOWN`, then the query below: **a timeout does not mean
//!   the transfer did not go out**.
//! - `BROADCAST` or `UNKNOWN`: query the network by the withdrawal id before anything
//!   else. `CONFIRMED` → settle `CONFIRMED` (consumed); `REJECTED` → settle `REJECTED`
//!   (released); `NOT_FOUND` after `UNKNOWN` → back to `REQUESTED`, so the next round
//!   broadcasts again **under the same id** (the network makes that idempotent); a
//!   failed query leaves it for the next round.
//!
//! A settlement is registered once (`<id>#settle`), so a second executor, or a restart
//! after a crash between the query and the settlement, replays it and moves nothing.
//! The one deliberately wrong mode, [`Options::retry_under_new_id`], is the negative
//! control of F14: after a lost answer it broadcasts again under a new id.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use frozen_balances::NoHooks;
use frozen_balances::withdraw::{self, DepositReport, Status, Withdrawal};
use tokio_postgres::Client;

use crate::client::{Answer, NetClient};
use crate::wire::{Broadcast, CONFIRMED, NOT_FOUND, REJECTED};

/// How long a broadcast waits for its answer by default, milliseconds; past it the
/// withdrawal is `UNKNOWN`.
pub const DEFAULT_ANSWER_TIMEOUT_MS: u64 = 5_000;
/// Rounds over the pending withdrawals before the executor gives up on a run.
pub const MAX_ROUNDS: u32 = 50;
/// Pause after a round that settled nothing, milliseconds.
pub const ROUND_PAUSE_MS: u64 = 50;

/// Where the executor stops on purpose (to be SIGKILLed there by a case).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopPoint {
    /// Right after `UNKNOWN` is committed, before the query by id.
    AfterUnknown,
    /// Right after the network's answer to a broadcast arrived (accepted), before
    /// `BROADCAST` is recorded: P8 cuts the power here.
    AfterBroadcast,
}

impl StopPoint {
    /// Its name on the command line (`after-unknown`, `after-broadcast`).
    pub fn name(self) -> &'static str {
        match self {
            StopPoint::AfterUnknown => "after-unknown",
            StopPoint::AfterBroadcast => "after-broadcast",
        }
    }
}

impl std::str::FromStr for StopPoint {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "after-unknown" => Ok(StopPoint::AfterUnknown),
            "after-broadcast" => Ok(StopPoint::AfterBroadcast),
            other => Err(format!(
                "unknown stop point {other:?} (known: after-unknown, after-broadcast)"
            )),
        }
    }
}

/// How one run behaves.
#[derive(Debug, Clone)]
pub struct Options {
    /// How long a broadcast waits for its answer.
    pub answer_timeout: Duration,
    /// Stop on purpose at this point (the run returns [`Ended::Stopped`]).
    pub stop_at: Option<StopPoint>,
    /// The naive executor of F14's negative control: after a lost answer, broadcast
    /// again under a new id instead of querying.
    pub retry_under_new_id: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            answer_timeout: Duration::from_millis(DEFAULT_ANSWER_TIMEOUT_MS),
            stop_at: None,
            retry_under_new_id: false,
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// No outbox event is left unprocessed.
    Idle,
    /// Stopped at the stop point, for this withdrawal.
    Stopped(String),
}

struct Executor<'a> {
    db: &'a mut Client,
    net: &'a NetClient,
    options: &'a Options,
    emit: &'a mut dyn FnMut(String),
    /// The naive mode's ids on the network, by withdrawal id.
    aliases: HashMap<String, String>,
}

/// Runs rounds over the pending withdrawals until none is left (or the stop point).
/// Every step is reported through `emit` as one line: `BROADCAST id=…`,
/// `ANSWER id=… …`, `QUERY id=… answer=…`, `STEP <id> <from> -> <to> (<detail>)`.
///
/// Errors: database or network errors that are not an answer; still pending after
/// [`MAX_ROUNDS`] rounds.
pub async fn run(
    db: &mut Client,
    net: &NetClient,
    options: &Options,
    emit: &mut dyn FnMut(String),
) -> anyhow::Result<Ended> {
    let mut executor = Executor {
        db,
        net,
        options,
        emit,
        aliases: HashMap::new(),
    };
    for _ in 0..MAX_ROUNDS {
        let pending = withdraw::pending(executor.db).await?;
        if pending.is_empty() {
            return Ok(Ended::Idle);
        }
        let mut settled = false;
        for w in pending {
            match executor.step(&w).await? {
                Progress::Stopped => return Ok(Ended::Stopped(w.withdrawal_id)),
                Progress::Settled => settled = true,
                Progress::Waiting => {}
            }
        }
        if !settled {
            tokio::time::sleep(Duration::from_millis(ROUND_PAUSE_MS)).await;
        }
    }
    anyhow::bail!("withdrawals still pending after {MAX_ROUNDS} rounds")
}

enum Progress {
    Settled,
    Waiting,
    Stopped,
}

impl Executor<'_> {
    fn net_id(&self, w: &Withdrawal) -> String {
        self.aliases
            .get(&w.withdrawal_id)
            .cloned()
            .unwrap_or_else(|| w.withdrawal_id.clone())
    }

    async fn mark(
        &mut self,
        w: &Withdrawal,
        from: Status,
        to: Status,
        detail: &str,
    ) -> anyhow::Result<bool> {
        let moved =
            withdraw::mark(self.db, &w.tenant_id, &w.withdrawal_id, &[from], to, detail).await?;
        if moved {
            (self.emit)(format!(
                "STEP {} {from} -> {to} ({detail})",
                w.withdrawal_id
            ));
        }
        Ok(moved)
    }

    async fn settle(
        &mut self,
        w: &Withdrawal,
        from: Status,
        to: Status,
        detail: &str,
    ) -> anyhow::Result<()> {
        let result = withdraw::settle(
            self.db,
            &w.tenant_id,
            &w.withdrawal_id,
            to,
            detail,
            &NoHooks,
        )
        .await
        .with_context(|| format!("settling {} as {to}", w.withdrawal_id))?;
        (self.emit)(format!(
            "STEP {} {from} -> {to} ({detail}; consumed={} released={} replayed={})",
            w.withdrawal_id, result.consumed, result.released, result.replayed
        ));
        Ok(())
    }

    async fn broadcast(&mut self, w: &Withdrawal, id: &str) -> Answer {
        (self.emit)(format!("BROADCAST id={id}"));
        let answer = self
            .net
            .broadcast(
                &Broadcast {
                    id: id.to_owned(),
                    destination: w.destination.clone(),
                    asset: w.asset.as_str().to_owned(),
                    amount: w.amount,
                },
                self.options.answer_timeout,
            )
            .await;
        let text = match &answer {
            Answer::Accepted { new } => format!("accepted new={new}"),
            Answer::Refused => "refused".into(),
            Answer::Lost(reason) => format!("lost ({reason})"),
        };
        (self.emit)(format!("ANSWER id={id} {text}"));
        answer
    }

    async fn step(&mut self, w: &Withdrawal) -> anyhow::Result<Progress> {
        match w.status {
            Status::Requested => {
                let id = self.net_id(w);
                match self.broadcast(w, &id).await {
                    Answer::Accepted { .. }
                        if self.options.stop_at == Some(StopPoint::AfterBroadcast) =>
                    {
                        Ok(Progress::Stopped)
                    }
                    Answer::Accepted { .. } => {
                        self.mark(
                            w,
                            Status::Requested,
                            Status::Broadcast,
                            &format!("network accepted id={id}"),
                        )
                        .await?;
                        self.query(w, Status::Broadcast).await
                    }
                    Answer::Refused => {
                        self.settle(
                            w,
                            Status::Requested,
                            Status::Failed,
                            "network refused the broadcast",
                        )
                        .await?;
                        Ok(Progress::Settled)
                    }
                    Answer::Lost(reason) => {
                        self.mark(
                            w,
                            Status::Requested,
                            Status::Unknown,
                            &format!("answer lost: {reason}"),
                        )
                        .await?;
                        if self.options.stop_at == Some(StopPoint::AfterUnknown) {
                            return Ok(Progress::Stopped);
                        }
                        if self.options.retry_under_new_id {
                            return self.naive_retry(w).await;
                        }
                        self.query(w, Status::Unknown).await
                    }
                }
            }
            Status::Broadcast | Status::Unknown => self.query(w, w.status).await,
            Status::Confirmed | Status::Failed | Status::Rejected => Ok(Progress::Waiting),
        }
    }

    /// The negative control: a new id, so the network sees a second transfer.
    async fn naive_retry(&mut self, w: &Withdrawal) -> anyhow::Result<Progress> {
        let new_id = format!("{}-retry-1", w.withdrawal_id);
        self.aliases.insert(w.withdrawal_id.clone(), new_id.clone());
        match self.broadcast(w, &new_id).await {
            Answer::Accepted { .. } => {
                self.mark(
                    w,
                    Status::Unknown,
                    Status::Broadcast,
                    &format!("network accepted id={new_id}"),
                )
                .await?;
                self.query(w, Status::Broadcast).await
            }
            _ => Ok(Progress::Waiting),
        }
    }

    async fn query(&mut self, w: &Withdrawal, now: Status) -> anyhow::Result<Progress> {
        let id = self.net_id(w);
        let answer = match self.net.status(&id).await {
            Ok(answer) => answer,
            Err(error) => {
                (self.emit)(format!("QUERY id={id} failed ({error:#})"));
                return Ok(Progress::Waiting);
            }
        };
        (self.emit)(format!("QUERY id={id} answer={answer}"));
        match answer.as_str() {
            CONFIRMED => {
                self.settle(
                    w,
                    now,
                    Status::Confirmed,
                    &format!("query by id {id}: CONFIRMED"),
                )
                .await?;
                Ok(Progress::Settled)
            }
            REJECTED => {
                self.settle(
                    w,
                    now,
                    Status::Rejected,
                    &format!("query by id {id}: REJECTED"),
                )
                .await?;
                Ok(Progress::Settled)
            }
            NOT_FOUND if now == Status::Unknown => {
                self.mark(
                    w,
                    Status::Unknown,
                    Status::Requested,
                    &format!("query by id {id}: NOT_FOUND; broadcast again under the same id"),
                )
                .await?;
                Ok(Progress::Waiting)
            }
            other => anyhow::bail!(
                "withdrawal {} is {now} but the network says {other} for {id}",
                w.withdrawal_id
            ),
        }
    }
}

/// Reads the network's deposits once and applies each report
/// ([`frozen_balances::withdraw::report_deposit`], credited at `required`
/// confirmations). Emits `DEPOSIT tx=… confirmations=… dropped=… effect=…` per report.
///
/// Errors: the network's or the database's; a report with an unknown asset.
pub async fn scan_deposits(
    db: &mut Client,
    net: &NetClient,
    required: u32,
    emit: &mut dyn FnMut(String),
) -> anyhow::Result<()> {
    for deposit in net.deposits().await? {
        let report = DepositReport {
            tenant_id: deposit.tenant_id.clone(),
            tx_id: deposit.tx_id.clone(),
            account_id: deposit.account_id.clone(),
            asset: deposit
                .asset
                .parse()
                .map_err(|_| anyhow::anyhow!("unknown asset {}", deposit.asset))?,
            amount: deposit.amount,
            confirmations: deposit.confirmations,
            dropped: deposit.dropped,
        };
        let effect = withdraw::report_deposit(db, &report, required).await?;
        emit(format!(
            "DEPOSIT tx={} confirmations={} dropped={} effect={}",
            deposit.tx_id,
            deposit.confirmations,
            deposit.dropped,
            serde_json::to_value(effect)?.as_str().unwrap_or("?")
        ));
    }
    Ok(())
}
