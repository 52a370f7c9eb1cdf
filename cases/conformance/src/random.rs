//! C8: a randomized run. Explore's seeded workload (`explore::plan::ClientPlan`, its
//! debits: keys, amounts, key reuses with another payload) from 3 clients at once through
//! the proxy, which cuts an answer now and then; with a kill available the target is
//! killed and started again twice during the load. Then every key whose outcome the
//! clients never learned is retried until it resolves, and an answers-only checker (no
//! database: explore's own checker reads the ledger's tables, which a black box cannot)
//! checks the history against the final balances.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use explore::plan::{ClientPlan, Kind};

use crate::case::{CaseDef, Needs, Run};
use crate::http::{self, Debit, Reply};
use crate::outcome::CaseOutcome;

/// C8.
pub const C8: CaseDef = CaseDef {
    id: "C8",
    title: "a randomized run through the proxy, with kills when possible: 0 violations",
    claim: "3 clients send 25 debits each from explore's seeded workload on three accounts, \
            retrying unknown outcomes; answers are cut at the proxy and, given a kill and a \
            start command, the target is killed and restarted twice; after every key is \
            resolved, the answers-only checker finds 0 violations",
    fails: "a key answered 201 with two txn_ids or under two payloads, a key that never \
            resolves, a 201 with a negative balance, or a final balance other than start \
            minus the debits whose key resolved 201",
    needs: Needs::Url,
};

/// Clients at once.
const CLIENTS: u32 = 3;
/// Debits per client.
const OPS_PER_CLIENT: usize = 25;
/// Attempts per operation during the load (then it is left to the resolution).
const ATTEMPTS: u32 = 3;
/// The accounts of C8.
const ACCOUNTS: [&str; 3] = ["acct-0008", "acct-0009", "acct-0010"];
/// Starting balance at least, points (explore debits at most 100).
const START_AT_LEAST: i64 = 1_500;
/// Kills during the load, when the target can be killed and started again.
const KILLS: u64 = 2;

/// One attempt: key, account, amount and what came back.
#[derive(Debug, Clone)]
struct Attempt {
    key: String,
    account: &'static str,
    amount: i64,
    reply: Reply,
}

/// A client's debits: explore's plan for `client`, debits only, accounts mapped onto
/// [`ACCOUNTS`].
fn workload(seed: u64, client: u32, run: &Run) -> Vec<(String, &'static str, i64)> {
    ClientPlan::new(seed, client)
        .filter(|op| op.payload.kind == Kind::Debit)
        .take(OPS_PER_CLIENT)
        .map(|op| {
            let n: usize = op
                .payload
                .account
                .trim_start_matches("acct-")
                .parse()
                .unwrap_or(1);
            let key = run.key(&format!("c8-{}", op.key));
            (
                key,
                ACCOUNTS[(n.max(1) - 1) % ACCOUNTS.len()],
                op.payload.amount,
            )
        })
        .collect()
}

/// C8: see [`C8`].
pub async fn c8(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let mut start = BTreeMap::new();
    for account in ACCOUNTS {
        let balance = run.target.ensure_balance(account, START_AT_LEAST).await?;
        start.insert(account, balance);
    }
    let proxy = Arc::new(run.proxy().await?);
    let history = Arc::new(Mutex::new(Vec::<Attempt>::new()));
    let sent = Arc::new(AtomicU64::new(0));
    let with_kills = run.target.can_kill() && run.target.can_restart();
    out.note(format!(
        "seed={} kills planned: {}",
        run.seed,
        if with_kills { KILLS } else { 0 }
    ));
    let mut clients = Vec::new();
    for client in 0..CLIENTS {
        let ops = workload(run.seed, client, run);
        let (http, base) = (run.http.clone(), proxy.url(""));
        let (history, sent, proxy) = (history.clone(), sent.clone(), proxy.clone());
        clients.push(tokio::spawn(client_loop(
            http, base, ops, history, sent, proxy,
        )));
    }
    let kills = if with_kills {
        nemesis(run, &sent, out).await?
    } else {
        0
    };
    for client in clients {
        client.await.map_err(|e| format!("client task: {e}"))?;
    }
    let cut = proxy.stats().cut_responses;
    out.note(format!("answers cut at the proxy: {cut}"));
    if with_kills {
        out.equal("kills during the load", KILLS, kills);
    }
    let attempts = history.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let resolved = resolve_all(run, &attempts).await;
    let mut finals = BTreeMap::new();
    for account in ACCOUNTS {
        finals.insert(account, http::balance(&run.http, run.url(), account).await?);
    }
    let found = check(&attempts, &resolved, &start, &finals);
    let acknowledged = attempts
        .iter()
        .filter(|a| a.reply.as_ref().is_ok_and(|r| r.status == 201))
        .count();
    out.note(format!(
        "attempts={} acknowledged 201s={acknowledged}",
        attempts.len()
    ));
    out.check(
        "at least one debit acknowledged",
        acknowledged >= 1,
        format!("{acknowledged}"),
    );
    out.equal(
        "violations found by the answers-only checker",
        0,
        found.len(),
    );
    for violation in found.iter().take(10) {
        out.note(format!("violation: {violation}"));
    }
    Ok(())
}

/// One client: its debits one after another through the proxy (cutting the next answer
/// before every seventh request of the run), each retried while its outcome is unknown,
/// at most [`ATTEMPTS`] times; every attempt goes into `history`.
async fn client_loop(
    http: reqwest::Client,
    base: String,
    ops: Vec<(String, &'static str, i64)>,
    history: Arc<Mutex<Vec<Attempt>>>,
    sent: Arc<AtomicU64>,
    proxy: Arc<launch::proxy::Proxy>,
) {
    for (key, account, amount) in ops {
        if sent.fetch_add(1, Ordering::SeqCst) % 7 == 3 {
            proxy.cut_next_responses(1);
        }
        for _ in 0..ATTEMPTS {
            let reply = http::debit(&http, &base, &Debit::new(account, &key, amount)).await;
            let known = reply.as_ref().is_ok_and(|a| a.status < 500);
            let attempt = Attempt {
                key: key.clone(),
                account,
                amount,
                reply,
            };
            history
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(attempt);
            if known {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Kills and restarts the target [`KILLS`] times, each once the clients have sent about a
/// third more of their debits. Returns the kills done.
async fn nemesis(run: &Run, sent: &AtomicU64, out: &mut CaseOutcome) -> Result<u64, String> {
    let total = u64::from(CLIENTS) * OPS_PER_CLIENT as u64;
    let mut kills = 0;
    for round in 1..=KILLS {
        while sent.load(Ordering::SeqCst) < total * round / (KILLS + 1) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let how = run.target.kill().await?;
        out.note(format!("kill {round}: {how}"));
        kills += 1;
        run.target.start().await?;
    }
    Ok(kills)
}

/// For every key whose answers the clients never learned (no answer below 500 to any
/// payload), the payloads sent under it retried in order, straight to the target, until
/// one resolves. Returns the resolving answers as attempts.
async fn resolve_all(run: &Run, attempts: &[Attempt]) -> Vec<Attempt> {
    let mut known: BTreeSet<&str> = BTreeSet::new();
    for a in attempts {
        if a.reply.as_ref().is_ok_and(|r| r.status < 500) {
            known.insert(&a.key);
        }
    }
    let mut resolved = Vec::new();
    let mut done: BTreeSet<&str> = BTreeSet::new();
    for a in attempts {
        if known.contains(a.key.as_str()) || done.contains(a.key.as_str()) {
            continue;
        }
        let reply =
            crate::kill::resolve(run, run.url(), &Debit::new(a.account, &a.key, a.amount)).await;
        if reply.as_ref().is_ok_and(|r| r.status != 422) {
            done.insert(&a.key);
        }
        resolved.push(Attempt { reply, ..a.clone() });
    }
    resolved
}

/// The answers-only checker: every violation, as a sentence.
fn check(
    attempts: &[Attempt],
    resolved: &[Attempt],
    start: &BTreeMap<&str, i64>,
    finals: &BTreeMap<&str, i64>,
) -> Vec<String> {
    let mut found = Vec::new();
    // key -> (account, amount) -> answers below 500 other than 422
    let mut definitive: BTreeMap<&str, BTreeMap<(&str, i64), Vec<&http::Answer>>> = BTreeMap::new();
    let mut keys: BTreeSet<&str> = BTreeSet::new();
    for a in attempts.iter().chain(resolved) {
        keys.insert(&a.key);
        if let Ok(answer) = &a.reply
            && answer.status < 500
            && answer.status != 422
        {
            definitive
                .entry(&a.key)
                .or_default()
                .entry((a.account, a.amount))
                .or_default()
                .push(answer);
        }
    }
    let mut expected: BTreeMap<&str, i64> = start.clone();
    for key in keys {
        let Some(payloads) = definitive.get(key) else {
            found.push(format!("key {key} never resolved"));
            continue;
        };
        if payloads.len() > 1 {
            found.push(format!(
                "key {key} answered under {} payloads",
                payloads.len()
            ));
        }
        for ((account, amount), answers) in payloads {
            let txns: BTreeSet<String> = answers
                .iter()
                .filter(|a| a.status == 201)
                .map(|a| a.json()["txn_id"].to_string())
                .collect();
            if txns.len() > 1 {
                found.push(format!("key {key} executed as {} transactions", txns.len()));
            }
            if answers
                .iter()
                .any(|a| a.integer("balance").is_some_and(|b| b < 0))
            {
                found.push(format!("key {key}: a 201 with a negative balance"));
            }
            if !txns.is_empty() {
                *expected.entry(account).or_default() -= amount;
            }
        }
    }
    for (account, balance) in finals {
        if expected.get(account) != Some(balance) {
            found.push(format!(
                "{account}: balance {balance}, the answers say {}",
                expected.get(account).copied().unwrap_or_default()
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(txn: i64, balance: i64) -> Reply {
        Ok(http::Answer {
            status: 201,
            replayed: false,
            content_type: "application/json".into(),
            body: format!(r#"{{"outcome":"OK","txn_id":{txn},"balance":{balance}}}"#),
        })
    }

    fn attempt(key: &str, amount: i64, reply: Reply) -> Attempt {
        Attempt {
            key: key.into(),
            account: "acct-0008",
            amount,
            reply,
        }
    }

    fn found(attempts: &[Attempt], resolved: &[Attempt], last: i64) -> Vec<String> {
        let start = BTreeMap::from([("acct-0008", 100)]);
        let finals = BTreeMap::from([("acct-0008", last)]);
        check(attempts, resolved, &start, &finals)
    }

    #[test]
    fn a_clean_history_has_no_violation() {
        let history = [
            attempt("a", 10, ok(1, 90)),
            attempt("a", 10, ok(1, 90)),
            attempt("b", 5, Err("cut".into())),
        ];
        let resolved = [attempt("b", 5, ok(2, 85))];
        assert!(found(&history, &resolved, 85).is_empty());
    }

    #[test]
    fn each_violation_is_found() {
        // Two txn_ids under one key.
        let twice = [attempt("a", 10, ok(1, 90)), attempt("a", 10, ok(2, 80))];
        assert!(
            found(&twice, &[], 90)
                .iter()
                .any(|v| v.contains("2 transactions"))
        );
        // Answered under two payloads (the second should have been 422).
        let two = [attempt("a", 10, ok(1, 90)), attempt("a", 11, ok(1, 90))];
        assert!(
            found(&two, &[], 90)
                .iter()
                .any(|v| v.contains("2 payloads"))
        );
        // Never resolved.
        let open = [attempt("a", 10, Err("no answer".into()))];
        assert!(
            found(&open, &[], 100)
                .iter()
                .any(|v| v.contains("never resolved"))
        );
        // A balance the answers do not explain (a debit lost or done twice).
        let one = [attempt("a", 10, ok(1, 90))];
        assert!(found(&one, &[], 80).iter().any(|v| v.contains("acct-0008")));
        // A negative balance in an answer.
        let negative = [attempt("a", 10, ok(1, -5))];
        assert!(
            found(&negative, &[], 90)
                .iter()
                .any(|v| v.contains("negative"))
        );
    }
}
