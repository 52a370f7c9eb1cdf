//! C3 (the same key at once), C4 (32 debits at once on one account) and C5 (an answer
//! cut after the target answered): forced at the proxy in front of the target. A race is
//! N requests held at the proxy, counted there (all N held before anything is
//! released), then released together.

use std::collections::BTreeSet;

use launch::proxy::Proxy;

use crate::case::{CaseDef, Needs, Run};
use crate::http::{self, Debit, Reply};
use crate::outcome::CaseOutcome;

/// C3.
pub const C3: CaseDef = CaseDef {
    id: "C3",
    title: "the same key at once executes once",
    claim: "8 debits of 9 under one key, held at the proxy until all 8 are there and released \
            together, are all answered 201 with one txn_id (a 409 or 429 refusing a key still \
            in flight is allowed, and retried), and the balance drops by 9 once",
    fails: "fewer than 8 are seen held; an answer other than 201; two txn_ids; the balance \
            moves by other than 9",
    needs: Needs::Url,
};

/// C4.
pub const C4: CaseDef = CaseDef {
    id: "C4",
    title: "32 debits at once on one account never overdraw",
    claim: "32 debits of ceil(start/20) on one account, held at the proxy and released \
            together, end as k 201s and 32-k 409s with k = floor(start/amount); the \
            balance is start - k*amount, never below 0",
    fails: "fewer than 32 held; an answer other than 201 or 409; another k; a balance other \
            than start - k*amount (a lost update or an overdraft)",
    needs: Needs::Url,
};

/// C5.
pub const C5: CaseDef = CaseDef {
    id: "C5",
    title: "an answer cut after the target answered: the retry replays, once",
    claim: "the target answers a debit of 11 and the proxy closes the client's connection \
            instead of passing the answer on; the retry with the same key is 201 marked \
            as a replay, and the balance dropped by 11 once",
    fails: "the proxy cut nothing; the retry is not 201 or not marked; the balance moved by \
            other than 11",
    needs: Needs::Url,
};

/// Number of same-key requests in C3.
const SAME_KEY_AT_ONCE: u32 = 8;
/// Number of debits in C4.
const AT_ONCE_ON_ONE_ACCOUNT: u32 = 32;

/// Sends `requests` (key, amount) on `account` through `proxy`, all held there until the proxy counts every one,
/// then released together; returns the answers in request order. Checks (in `out`) that
/// all were held.
async fn held_together(
    run: &Run,
    proxy: &Proxy,
    account: &'static str,
    requests: Vec<(String, i64)>,
    out: &mut CaseOutcome,
) -> Vec<Reply> {
    let n = requests.len() as u32;
    proxy.hold_next_requests(n);
    let base = proxy.url("");
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|(key, amount)| {
            let (http, base) = (run.http.clone(), base.clone());
            tokio::spawn(async move {
                http::debit(&http, &base, &Debit::new(account, &key, amount)).await
            })
        })
        .collect();
    crate::wait_until(|| proxy.held() >= u64::from(n)).await;
    let released = proxy.release_held();
    out.equal("requests held at the proxy before the release", n, released);
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(
            task.await
                .unwrap_or_else(|e| Err(format!("request task: {e}"))),
        );
    }
    replies
}

/// A text for an answer or a reason, for a transcript.
fn shown(reply: &Reply) -> String {
    match reply {
        Ok(answer) => answer.short(),
        Err(reason) => reason.clone(),
    }
}

/// C3: see [`C3`].
pub async fn c3(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let account = "acct-0003";
    let start = run.target.ensure_balance(account, 100).await?;
    let key = run.key("c3");
    let proxy = run.proxy().await?;
    let requests = (0..SAME_KEY_AT_ONCE).map(|_| (key.clone(), 9)).collect();
    let mut replies = held_together(run, &proxy, account, requests, out).await;
    let statuses: Vec<String> = replies.iter().map(shown).collect();
    out.note(format!("answers: {}", statuses.join(", ")));
    // The IETF draft lets a service refuse a request whose key is still in flight (409
    // or 429, not INSUFFICIENT); such a request is retried once the race is over.
    let mut in_progress = 0;
    for reply in replies.iter_mut() {
        if reply.as_ref().is_ok_and(is_in_progress) {
            in_progress += 1;
            *reply = crate::kill::resolve(run, run.url(), &Debit::new(account, &key, 9)).await;
        }
    }
    out.note(format!(
        "refused as in progress, then retried: {in_progress}"
    ));
    out.check(
        "every answer is 201 (an in-progress refusal: its retry)",
        replies
            .iter()
            .all(|r| r.as_ref().is_ok_and(|a| a.status == 201)),
        replies.iter().map(shown).collect::<Vec<_>>().join(", "),
    );
    let txns: BTreeSet<String> = replies
        .iter()
        .flatten()
        .filter(|a| a.status == 201)
        .map(|a| a.json()["txn_id"].to_string())
        .collect();
    out.equal("distinct txn_ids among the 201s", 1, txns.len());
    let replayed = replies.iter().flatten().filter(|a| a.replayed).count();
    out.note(format!(
        "answers marked as replays: {replayed} of {SAME_KEY_AT_ONCE}"
    ));
    let after = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance = start - 9 (executed once)", start - 9, after);
    Ok(())
}

/// A refusal because the key's first request is still in flight: 409 or 429 whose
/// outcome is not `INSUFFICIENT`.
fn is_in_progress(answer: &http::Answer) -> bool {
    matches!(answer.status, 409 | 429) && answer.json()["outcome"] != "INSUFFICIENT"
}

/// C4: see [`C4`].
pub async fn c4(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let account = "acct-0004";
    let start = run.target.ensure_balance(account, 100).await?;
    // About 20 of the 32 can pass, whatever the start: both outcomes are forced to occur.
    let amount = (start + 19) / 20;
    let expected_ok = (start / amount).min(i64::from(AT_ONCE_ON_ONE_ACCOUNT));
    out.note(format!("start={start} amount={amount}"));
    let proxy = run.proxy().await?;
    let requests = (0..AT_ONCE_ON_ONE_ACCOUNT)
        .map(|i| (run.key(&format!("c4-{i:02}")), amount))
        .collect();
    let replies = held_together(run, &proxy, account, requests, out).await;
    let ok = replies.iter().flatten().filter(|a| a.status == 201).count() as i64;
    let refused = replies.iter().flatten().filter(|a| a.status == 409).count() as i64;
    let other: Vec<String> = replies
        .iter()
        .filter(|r| !r.as_ref().is_ok_and(|a| a.status == 201 || a.status == 409))
        .map(shown)
        .collect();
    out.check(
        "every answer is 201 or 409",
        other.is_empty(),
        other.join(", "),
    );
    out.equal("201s = floor(start/amount)", expected_ok, ok);
    out.equal(
        "409s = 32 - 201s",
        i64::from(AT_ONCE_ON_ONE_ACCOUNT) - ok,
        refused,
    );
    out.check(
        "at least one of each outcome",
        ok >= 1 && refused >= 1,
        format!("ok={ok} refused={refused}"),
    );
    let after = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance = start - 201s*amount", start - ok * amount, after);
    out.check(
        "balance never below 0",
        after >= 0,
        format!("balance={after}"),
    );
    Ok(())
}

/// C5: see [`C5`].
pub async fn c5(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let account = "acct-0005";
    let start = run.target.ensure_balance(account, 100).await?;
    let key = run.key("c5");
    let proxy = run.proxy().await?;
    proxy.cut_next_responses(1);
    let cut = http::debit(&run.http, &proxy.url(""), &Debit::new(account, &key, 11)).await;
    out.check("the client got no answer", cut.is_err(), shown(&cut));
    out.equal(
        "answers the proxy cut after the target answered",
        1,
        proxy.stats().cut_responses,
    );
    let retry = http::debit(&run.http, &proxy.url(""), &Debit::new(account, &key, 11)).await?;
    out.equal("retry status", 201, retry.status);
    out.check(
        "retry marked Idempotent-Replayed: true",
        retry.replayed,
        format!("replayed={}", retry.replayed),
    );
    let after = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance = start - 11 (executed once)", start - 11, after);
    Ok(())
}
