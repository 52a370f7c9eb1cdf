//! C6: the target killed with requests in flight and started again. Three debits are
//! acknowledged first; four more are held at the proxy until all four are there, released
//! together, and the target is killed at once (their answers may or may not come). After
//! the restart every key is retried until it resolves.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::case::{CaseDef, Needs, Run};
use crate::http::{self, Answer, Debit};
use crate::outcome::CaseOutcome;

/// C6.
pub const C6: CaseDef = CaseDef {
    id: "C6",
    title: "killed with requests in flight and started again: each key resolves once",
    claim: "after 3 acknowledged debits of 6 and 4 more released at the proxy as the target \
            is killed, the restarted target's balance holds every acknowledged debit; each \
            of the 7 keys retried resolves to 201 or 409, an acknowledged one as a replay \
            of its answer (same txn_id), and the balance is start - 6 per key that resolved \
            201; a second retry of each is a replay and moves nothing",
    fails: "an acknowledged debit missing from the balance after the restart; a retry that \
            never resolves within RESOLVE_ATTEMPTS; an acknowledged key executed again \
            (not a replay, another txn_id); a balance other than start - 6 per 201 key",
    needs: Needs::KillAndRestart,
};

/// Debit amount in C6.
const AMOUNT: i64 = 6;
/// Attempts to resolve one key after the restart (answers 5xx or none are retried).
pub const RESOLVE_ATTEMPTS: u32 = 20;
/// Pause between two attempts to resolve a key, milliseconds.
pub const RESOLVE_PAUSE_MS: u64 = 250;

/// Retries `key` until the target answers it with anything but a 5xx (or the attempts
/// run out: then `Err` with the last reason).
pub async fn resolve(run: &Run, base: &str, request: &Debit<'_>) -> Result<Answer, String> {
    let mut last = String::new();
    for _ in 0..RESOLVE_ATTEMPTS {
        match http::debit(&run.http, base, request).await {
            Ok(answer) if answer.status < 500 => return Ok(answer),
            Ok(answer) => last = answer.short(),
            Err(reason) => last = reason,
        }
        tokio::time::sleep(Duration::from_millis(RESOLVE_PAUSE_MS)).await;
    }
    Err(format!(
        "unresolved after {RESOLVE_ATTEMPTS} attempts ({last})"
    ))
}

/// C6's account.
const ACCOUNT: &str = "acct-0006";

/// C6: see [`C6`].
pub async fn c6(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let start = run.target.ensure_balance(ACCOUNT, 100).await?;
    let proxy = run.proxy().await?;
    let keys: Vec<String> = (0..7).map(|i| run.key(&format!("c6-{i}"))).collect();
    let mut first: BTreeMap<usize, Answer> = BTreeMap::new();
    for (i, key) in keys.iter().enumerate().take(3) {
        let answer =
            http::debit(&run.http, &proxy.url(""), &Debit::new(ACCOUNT, key, AMOUNT)).await?;
        out.equal(
            &format!("debit {i} acknowledged before the kill"),
            201,
            answer.status,
        );
        first.insert(i, answer);
    }
    kill_in_flight(run, &proxy, &keys[3..], &mut first, out).await;
    let acknowledged = first.len() as i64;
    out.note(format!(
        "acknowledged before the restart: {acknowledged} of 7"
    ));
    run.target.start().await?;
    let restarted = http::balance(&run.http, run.url(), ACCOUNT).await?;
    out.check(
        "after the restart every acknowledged debit is in the balance",
        restarted <= start - AMOUNT * acknowledged,
        format!(
            "balance={restarted}, start - 6*acknowledged = {}",
            start - AMOUNT * acknowledged
        ),
    );
    out.check(
        "nothing beyond the 7 sent was executed",
        restarted >= start - AMOUNT * 7,
        format!("balance={restarted}"),
    );
    let executed = retry_each(run, &keys, &first, out).await;
    let after = http::balance(&run.http, run.url(), ACCOUNT).await?;
    out.equal(
        "balance = start - 6 per key resolved 201",
        start - AMOUNT * executed,
        after,
    );
    let mut replays = 0;
    for key in &keys {
        let again = resolve(run, run.url(), &Debit::new(ACCOUNT, key, AMOUNT)).await;
        replays += usize::from(again.is_ok_and(|a| a.replayed));
    }
    out.equal("second retries answered as replays", keys.len(), replays);
    let last = http::balance(&run.http, run.url(), ACCOUNT).await?;
    out.equal("balance unchanged by the second retries", after, last);
    Ok(())
}

/// Holds the debits of `keys` at the proxy until all are there, releases them, waits
/// until the proxy has written each to the target, and kills the target. The ones
/// answered 201 anyway join `first` (by index, after the 3 acknowledged before).
async fn kill_in_flight(
    run: &Run,
    proxy: &launch::proxy::Proxy,
    keys: &[String],
    first: &mut BTreeMap<usize, Answer>,
    out: &mut CaseOutcome,
) {
    let n = keys.len() as u64;
    proxy.hold_next_requests(n as u32);
    let tasks: Vec<_> = keys
        .iter()
        .map(|key| {
            let (http, base, key) = (run.http.clone(), proxy.url(""), key.clone());
            tokio::spawn(async move {
                http::debit(&http, &base, &Debit::new(ACCOUNT, &key, AMOUNT)).await
            })
        })
        .collect();
    crate::wait_until(|| proxy.held() >= n).await;
    out.equal(
        "requests held at the proxy, then released",
        n,
        proxy.release_held(),
    );
    // In flight: written in full to the target's socket (bounded wait).
    let before = first.len() as u64;
    crate::wait_until(|| proxy.stats().forwarded >= before + n).await;
    out.equal(
        "requests forwarded to the target when the kill is sent",
        before + n,
        proxy.stats().forwarded,
    );
    let killed = run.target.kill().await;
    out.check(
        "the target was killed and stopped accepting",
        killed.is_ok(),
        killed.clone().unwrap_or_else(|e| e),
    );
    for (i, task) in tasks.into_iter().enumerate() {
        let index = before as usize + i;
        match task.await.map_err(|e| e.to_string()).and_then(|r| r) {
            Ok(answer) if answer.status == 201 => {
                first.insert(index, answer);
            }
            Ok(answer) => out.note(format!(
                "in-flight debit {index} answered {}",
                answer.short()
            )),
            Err(reason) => out.note(format!("in-flight debit {index}: {}", http::clip(&reason))),
        }
    }
}

/// Retries each key until it resolves; checks each resolves to 201 or 409 and that an
/// acknowledged one replays its txn_id. Returns how many resolved 201.
async fn retry_each(
    run: &Run,
    keys: &[String],
    first: &BTreeMap<usize, Answer>,
    out: &mut CaseOutcome,
) -> i64 {
    let mut executed = 0;
    for (i, key) in keys.iter().enumerate() {
        let answer = match resolve(run, run.url(), &Debit::new(ACCOUNT, key, AMOUNT)).await {
            Ok(answer) => answer,
            Err(reason) => {
                out.check(
                    &format!("key {i} resolves after the restart"),
                    false,
                    reason,
                );
                continue;
            }
        };
        out.check(
            &format!("key {i} resolves (201 or 409)"),
            answer.status == 201 || answer.status == 409,
            answer.short(),
        );
        executed += i64::from(answer.status == 201);
        if let Some(ack) = first.get(&i) {
            out.check(
                &format!("acknowledged key {i}: its retry replays the same txn_id"),
                answer.replayed && answer.json()["txn_id"] == ack.json()["txn_id"],
                format!(
                    "{} replayed={} txn_id {} vs {}",
                    answer.short(),
                    answer.replayed,
                    answer.json()["txn_id"],
                    ack.json()["txn_id"]
                ),
            );
        }
    }
    executed
}
