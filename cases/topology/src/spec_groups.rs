//! R2's clients as calls of the pair engine ([`crate::spec_engine`]): `ledger-svc`s on
//! the pair's multi-host URL, each named, with its own bounds; groups of 8 debits
//! ([`crate::debit_groups`]: one per account, keys `k-r2-<group>-<n>`, client `app-r2`)
//! sent through one of them at once and answered later, so that later steps can see
//! their COMMITs wait for the standby (`SyncRep`), cancel, kill or fail over under
//! them; their same-key retries; and the clients' book of every transaction id a 201
//! named, written to the session's node for SQL to compare with what is there.
//!
//! Everything here belongs to the case's pair ([`crate::spec_engine::Nodes`]): a
//! `new-pair` step ends it (services killed, groups in flight aborted, book emptied),
//! and so does the pair's end. The verbs are declared in [`crate::verbs::GROUPS`].

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::Arc;

use launch::service::{Service, ServiceOptions};
use points_ledger::striping::redeem_account_for;
use points_ledger::{TransferMode, grant_in};
use scratch_pg::Cluster;
use tokio::task::JoinHandle;
use tokio_postgres::Client;

use case_kit::spec::Call;

use crate::debit_groups::{self, Answer, CLIENT, GROUP_SIZE, tally};
use crate::syncrep;

/// Pooled connections of each service: one debit of a group each.
const POOL_SIZE: usize = GROUP_SIZE;
/// Redemption stripes of every service: the group's eight accounts credit eight
/// different stripes (checked at launch), so no debit's COMMIT waits on a row lock
/// another COMMIT holds while it waits for the standby, and all eight wait in `SyncRep`
/// at once. Every service stripes alike, so a retry through another one carries the
/// same fingerprint. (In the batch mode one drainer takes every lane: the group is one
/// batch.)
const REDEEM_STRIPES: u32 = 64;
/// A service's bound left out of its `pair-service` call, milliseconds: a hang bound
/// only, far above anything a case waits for but a stopped standby.
const DEFAULT_BOUND_MS: u64 = 60_000;
/// Client id of a `grant-group`'s grants.
const GRANT_CLIENT: &str = "ops";

/// A group of debits sent and not yet answered (or answered: `answers` is `None`).
struct Sent {
    keys: Vec<String>,
    /// The mode of the service it went through: in the batch mode one session commits
    /// the whole group.
    mode: TransferMode,
    /// The service it went through.
    service: String,
    answers: Option<JoinHandle<Vec<Answer>>>,
}

/// The clients of one pair: its services, its groups, and the book of what they were
/// told.
#[derive(Default)]
pub struct Groups {
    /// Each service by name, with the mode it runs.
    services: BTreeMap<String, (Arc<Service>, TransferMode)>,
    /// The service started last: the one `arm-fault` arms.
    last: Option<String>,
    sent: BTreeMap<String, Sent>,
    /// Per key, every transaction id a 201 named for it (one, unless an acknowledged
    /// debit was lost and its retry executed again).
    book: BTreeMap<String, BTreeSet<Option<i64>>>,
}

impl Drop for Groups {
    fn drop(&mut self) {
        for sent in self.sent.values() {
            if let Some(answers) = &sent.answers {
                answers.abort();
            }
        }
    }
}

/// What the calls need of the case besides the session: the nodes' URL, the primary,
/// where service logs go, the run's transfer mode.
pub struct Reach<'a> {
    /// The pair's multi-host URL (`target_session_attrs=read-write`).
    pub url: String,
    /// The node that took writes when the pair started (killed after a failover: the
    /// calls that look at it are then errors).
    pub primary: Option<&'a Cluster>,
    /// The folder of the run's logs; a service's is `<case>-ledger-svc-<name>.log`.
    pub logs: &'a PathBuf,
    /// The case's id, for the log's name.
    pub case_id: &'a str,
    /// The run's transfer mode (a service's without `mode=batch`).
    pub mode: TransferMode,
}

impl Reach<'_> {
    fn primary(&self) -> Result<&Cluster, String> {
        self.primary.ok_or_else(|| "no primary node".to_string())
    }
}

fn text(error: impl std::fmt::Display) -> String {
    format!("{error:#}")
}

impl Groups {
    /// Runs one of the verbs of [`crate::verbs::GROUPS`] (and `arm-fault`); `client`
    /// is the session's connection (`grant-group`, `book`).
    ///
    /// Errors: as printed after `ERROR`: a service that did not start, an unknown group
    /// or service, SQL errors, a state not seen within the hang bound.
    pub async fn run(
        &mut self,
        reach: &Reach<'_>,
        client: &mut Client,
        call: &Call,
    ) -> Result<String, String> {
        let arg = |name: &str| call.arg(name).unwrap_or_default();
        match call.op.as_str() {
            "grant-group" => grant_group(client, reach.mode, arg("amount")).await,
            "pair-service" => self.launch(reach, call).await,
            "arm-fault" => self.arm(call).await,
            "send-group" => self.send(arg("group"), arg("service")).await,
            "syncrep-waits" => {
                let sent = self.sent(arg("group"))?;
                let per_session = if sent.mode == TransferMode::Batch {
                    GROUP_SIZE
                } else {
                    1
                };
                let want = GROUP_SIZE / per_session;
                let seen = syncrep::waiting_on_standby(reach.primary()?, want).await;
                Ok(format!(
                    "waiting_debits={}",
                    seen.map_err(text)? * per_session
                ))
            }
            "answers" => self.answers(arg("group")).await,
            "committed" => {
                let keys = &self.sent(arg("group"))?.keys;
                let seen = syncrep::committed_within(reach.primary()?, CLIENT, keys).await;
                Ok(format!("committed={}", seen.map_err(text)?))
            }
            "wait-held" => {
                self.wait_held(reach.primary()?, arg("group"), arg("point"))
                    .await
            }
            "sigkill-service" => {
                let (service, _) = self
                    .services
                    .remove(arg("service"))
                    .ok_or("no such service")?;
                service.sigkill_now().map_err(text)?;
                Ok("signal=9 sent".into())
            }
            "retry" => self.retry(arg("service"), arg("groups")).await,
            "book" => self.write_book(client).await,
            other => Err(format!("no operation {other:?}")),
        }
    }

    fn sent(&self, group: &str) -> Result<&Sent, String> {
        self.sent
            .get(group)
            .ok_or_else(|| format!("no group {group:?} was sent (send-group)"))
    }

    fn service(&self, name: &str) -> Result<(Arc<Service>, TransferMode), String> {
        let found = self.services.get(name).cloned();
        found.ok_or_else(|| format!("no service {name:?} running (pair-service)"))
    }

    /// `pair-service`: `ledger-svc` on the pair's URL with [`POOL_SIZE`] connections,
    /// fault injection, [`REDEEM_STRIPES`] stripes (the group's accounts on eight of
    /// them, checked), its bounds, and the planted bug when named; in the batch mode
    /// with one drainer. Prints `ready` and the bounds, `request=4000ms …`.
    ///
    /// Errors: a bound is not a number; the stripes are shared; it did not start.
    async fn launch(&mut self, reach: &Reach<'_>, call: &Call) -> Result<String, String> {
        let name = call.arg("name").unwrap_or_default();
        let mode = match call.arg("mode") {
            Some("batch") => TransferMode::Batch,
            _ => reach.mode,
        };
        let mut args = vec!["--transfer-mode".to_owned(), mode.as_str().to_owned()];
        let mut shown = vec!["ready".to_owned()];
        for bound in ["request", "statement", "lock"] {
            let arg = format!("{bound}-ms");
            let ms = match call.arg(&arg) {
                Some(ms) => ms.parse::<u64>().map_err(|_| format!("{arg}=N"))?,
                None => DEFAULT_BOUND_MS,
            };
            args.extend([format!("--{bound}-timeout-ms"), ms.to_string()]);
            // Not `…_ms=N`, which the transcript's redaction hides as a measured time.
            shown.push(format!("{bound}={ms}ms"));
        }
        if let Some(bug) = call.arg("planted") {
            args.extend(["--planted-bug".to_owned(), bug.to_owned()]);
            shown.push(format!("planted={bug}"));
        }
        let stripes: BTreeSet<String> = (0..GROUP_SIZE)
            .map(|n| redeem_account_for(&debit_groups::account_of(n), REDEEM_STRIPES))
            .collect();
        if stripes.len() != GROUP_SIZE {
            return Err(format!("the group's accounts share stripes: {stripes:?}"));
        }
        args.extend(["--redeem-stripes".to_owned(), REDEEM_STRIPES.to_string()]);
        if mode == TransferMode::Batch {
            args.extend(["--batch-drainers".to_owned(), "1".to_owned()]);
        }
        let mut options = ServiceOptions::default().with_clients(&[CLIENT]);
        options.pool_size = POOL_SIZE;
        options.fault_injection = true;
        options.extra_args = args;
        let log = reach
            .logs
            .join(format!("{}-ledger-svc-{name}.log", reach.case_id));
        let service = Service::launch(&reach.url, log, options)
            .await
            .map_err(text)?;
        self.services
            .insert(name.to_owned(), (Arc::new(service), mode));
        self.last = Some(name.to_owned());
        Ok(shown.join(" "))
    }

    /// `arm-fault` on the service started last.
    ///
    /// Errors: no service; a count that is not a number; the service refused it.
    async fn arm(&self, call: &Call) -> Result<String, String> {
        let last = self
            .last
            .as_deref()
            .ok_or("no service running (pair-service)")?;
        let (service, _) = self.service(last)?;
        let point = call.arg("point").unwrap_or_default();
        let mut fault = serde_json::json!({ "action": call.arg("action").unwrap_or_default() });
        for name in ["count", "hold_ms"] {
            if let Some(value) = call.arg(name) {
                let value: u64 = value.parse().map_err(|_| format!("{name}=N"))?;
                fault[name] = value.into();
            }
        }
        service.arm_fault(point, fault).await.map_err(text)?;
        Ok(format!("armed at {point} of {last}"))
    }

    /// `send-group`: the group's debits sent through the service at once, in flight
    /// ([`debit_groups::send`]: in the batch mode held in the queue until all are seen
    /// queued, then released as one batch). Prints `sent=8`.
    ///
    /// Errors: no such service; the queue not held or the debits not seen queued.
    async fn send(&mut self, group: &str, name: &str) -> Result<String, String> {
        let (service, mode) = self.service(name)?;
        let keys = debit_groups::keys(group);
        let answers = debit_groups::send(&service, mode, &keys)
            .await
            .map_err(text)?;
        let sent = Sent {
            keys,
            mode,
            service: name.to_owned(),
            answers: Some(answers),
        };
        if let Some(earlier) = self.sent.insert(group.to_owned(), sent) {
            earlier.answers.iter().for_each(JoinHandle::abort);
        }
        Ok(format!("sent={GROUP_SIZE}"))
    }

    /// `answers`: waits for the group's answers, enters every 201 in the book, prints
    /// their counts ([`tally`]: `503 UNKNOWN=8`).
    ///
    /// Errors: no such group, or its answers were already taken.
    async fn answers(&mut self, group: &str) -> Result<String, String> {
        let sent = self
            .sent
            .get_mut(group)
            .ok_or(format!("no group {group:?}"))?;
        let handle = sent
            .answers
            .take()
            .ok_or("its answers were already taken")?;
        let keys = sent.keys.clone();
        let answers = handle.await.map_err(text)?;
        self.acknowledge(&keys, &answers);
        Ok(tally(&answers))
    }

    fn acknowledge(&mut self, keys: &[String], answers: &[Answer]) {
        for (key, answer) in keys.iter().zip(answers) {
            if answer.acknowledged() {
                let ids = self.book.entry(key.clone()).or_default();
                ids.insert(answer.txn_id);
            }
        }
    }

    /// `wait-held`: looks until the whole group is committed on the primary and its
    /// service holds every debit at `point` (a hang bound only); prints what it saw
    /// then, `committed=8 held=8`.
    ///
    /// Errors: no such group or service; SQL errors; the fault state unreadable.
    async fn wait_held(
        &self,
        primary: &Cluster,
        group: &str,
        point: &str,
    ) -> Result<String, String> {
        let sent = self.sent(group)?;
        let (service, _) = self.service(&sent.service)?;
        let (keys, service) = (&sent.keys, &service);
        let look = move || async move {
            let committed = syncrep::committed_on(primary, CLIENT, keys).await?;
            Ok((committed, service.fault_state(point).await?.holding))
        };
        let all = |&(committed, held): &(usize, u32)| {
            committed == GROUP_SIZE && held == GROUP_SIZE as u32
        };
        let seen = syncrep::seen_within(syncrep::OBSERVE_LIMIT_MS, look, all).await;
        let ((committed, held), _) = seen.map_err(text)?;
        Ok(format!("committed={committed} held={held}"))
    }

    /// `retry`: every key of each group (comma-separated), in order, retried through the
    /// service until answered 201 ([`debit_groups::retry_until_acknowledged`]); the
    /// 201s entered in the book; prints their counts (`201 OK=40`).
    ///
    /// Errors: no such service; a key not acknowledged within the hang bound, or
    /// answered other than 201, 503 or not at all.
    async fn retry(&mut self, name: &str, groups: &str) -> Result<String, String> {
        let (service, _) = self.service(name)?;
        let mut all = Vec::new();
        for group in groups.split(',') {
            let keys = debit_groups::keys(group);
            let answers = debit_groups::retry_until_acknowledged(&service, &keys).await;
            let answers = answers.map_err(text)?;
            self.acknowledge(&keys, &answers);
            all.extend(answers);
        }
        Ok(tally(&all))
    }

    /// `book`: the book as the table `client_book (idem_key, txn_id)` on the session's
    /// node, a row per transaction id a 201 named for a key; prints the keys
    /// acknowledged, `acknowledged=56`.
    ///
    /// Errors: SQL errors (the table exists already).
    async fn write_book(&self, client: &mut Client) -> Result<String, String> {
        let rows: Vec<(&String, Option<i64>)> = (self.book.iter())
            .flat_map(|(key, ids)| ids.iter().map(move |id| (key, *id)))
            .collect();
        let (keys, ids): (Vec<&String>, Vec<Option<i64>>) = rows.into_iter().unzip();
        let sql = "CREATE TABLE client_book (idem_key text NOT NULL, txn_id bigint);
            INSERT INTO client_book SELECT * FROM unnest($1::text[], $2::bigint[])";
        let (create, insert) = sql.split_once(';').expect("two statements");
        client.batch_execute(create).await.map_err(text)?;
        client.execute(insert, &[&keys, &ids]).await.map_err(text)?;
        Ok(format!("acknowledged={}", self.book.len()))
    }
}

/// `grant-group`: each account of a group (`acct-0001` … `acct-0008`) granted `amount`
/// on the session's node (client `ops`, keys `g-r2-1` … `g-r2-8`): `granted=8`.
///
/// Errors: `amount` is not a number; the ledger's errors.
async fn grant_group(
    client: &mut Client,
    mode: TransferMode,
    amount: &str,
) -> Result<String, String> {
    let amount: i64 = amount.parse().map_err(|_| "amount=N")?;
    for n in 0..GROUP_SIZE {
        let (key, account) = (format!("g-r2-{}", n + 1), debit_groups::account_of(n));
        grant_in(mode, client, GRANT_CLIENT, &key, &account, amount)
            .await
            .map_err(text)?;
    }
    Ok(format!("granted={GROUP_SIZE}"))
}
