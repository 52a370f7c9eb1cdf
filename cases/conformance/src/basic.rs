//! C1 (the normal path and its replay), C2 (the same key with another amount) and C7
//! (malformed requests): one request at a time, straight to the target.

use crate::case::{CaseDef, Needs, Run};
use crate::http::{self, Debit};
use crate::outcome::CaseOutcome;

/// C1.
pub const C1: CaseDef = CaseDef {
    id: "C1",
    title: "a debit and its replay",
    claim: "a debit of 7 is 201 with amount 7, a txn_id and the balance after, and the balance \
            read drops by 7; the same key again is 201 with the same body, marked \
            Idempotent-Replayed: true, and the balance does not move",
    fails: "the first answer is not 201 or the balance moves by other than 7; the replay is \
            not 201, not marked, carries another body, or moves the balance",
    needs: Needs::Url,
};

/// C2.
pub const C2: CaseDef = CaseDef {
    id: "C2",
    title: "the same key with another amount is refused",
    claim: "after a debit of 5 under a key, the same key with 6 is 422 with a problem body, \
            and only the 5 left the balance; the key then still replays its first answer",
    fails: "the second request is executed (201, or the balance moves by 6 or 11), is answered \
            other than 422 with a problem body, or the first answer is no longer replayed",
    needs: Needs::Url,
};

/// C7.
pub const C7: CaseDef = CaseDef {
    id: "C7",
    title: "malformed requests are 4xx with a problem body, nothing executed",
    claim: "a debit without Idempotency-Key, without X-Client-Id, with a malformed key, with \
            amount 0, -5, 1e3, 007, abc, none at all, or another Content-Type is answered \
            4xx with an RFC 9457 problem body; the balance does not move; a well-formed \
            debit under a key first refused as malformed then executes (not a replay)",
    fails: "any of them is 2xx or 5xx, has no problem body, moves the balance, or registers \
            its key",
    needs: Needs::Url,
};

/// C1: see [`C1`].
pub async fn c1(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let account = "acct-0001";
    let start = run.target.ensure_balance(account, 100).await?;
    let key = run.key("c1");
    let first = http::debit(&run.http, run.url(), &Debit::new(account, &key, 7)).await?;
    out.equal("first answer status", 201, first.status);
    out.equal(
        "first answer amount",
        "Some(7)",
        format!("{:?}", first.integer("amount")),
    );
    out.check(
        "first answer has a txn_id",
        first.json().get("txn_id").is_some_and(|t| !t.is_null()),
        http::clip(&first.body),
    );
    out.check(
        "first answer not marked as a replay",
        !first.replayed,
        format!("replayed={}", first.replayed),
    );
    let after = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance after the debit = start - 7", start - 7, after);
    out.equal(
        "answer's balance = the balance read",
        format!("{:?}", Some(after)),
        format!("{:?}", first.integer("balance")),
    );
    let replay = http::debit(&run.http, run.url(), &Debit::new(account, &key, 7)).await?;
    out.equal("replay status", 201, replay.status);
    out.check(
        "replay marked Idempotent-Replayed: true",
        replay.replayed,
        format!("replayed={}", replay.replayed),
    );
    out.check(
        "replay body = first body",
        replay.json() == first.json(),
        http::clip(&replay.body),
    );
    let last = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance after the replay unchanged", after, last);
    Ok(())
}

/// C2: see [`C2`].
pub async fn c2(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let account = "acct-0002";
    let start = run.target.ensure_balance(account, 100).await?;
    let key = run.key("c2");
    let first = http::debit(&run.http, run.url(), &Debit::new(account, &key, 5)).await?;
    out.equal("first answer status", 201, first.status);
    let other = http::debit(&run.http, run.url(), &Debit::new(account, &key, 6)).await?;
    out.equal("same key, amount 6: status", 422, other.status);
    out.check(
        "its body is a problem",
        other.is_problem(),
        http::clip(&other.body),
    );
    let after = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance = start - 5 (the 6 not executed)", start - 5, after);
    let replay = http::debit(&run.http, run.url(), &Debit::new(account, &key, 5)).await?;
    out.check(
        "the first amount still replays its first answer",
        replay.status == 201 && replay.replayed && replay.json() == first.json(),
        format!("{} replayed={}", replay.short(), replay.replayed),
    );
    Ok(())
}

/// The malformed requests of C7: a label and the request (built from a key).
fn malformed<'a>(account: &'a str, key: &'a str) -> Vec<(&'static str, Debit<'a>)> {
    let form = Some("application/x-www-form-urlencoded");
    let base = Debit {
        account,
        client: Some(crate::CLIENT_ID),
        key: Some(key),
        content_type: form,
        body: "amount=3".to_owned(),
    };
    let with_body = |body: &str| Debit {
        body: body.to_owned(),
        ..base.clone()
    };
    vec![
        (
            "no Idempotency-Key",
            Debit {
                key: None,
                ..base.clone()
            },
        ),
        (
            "no X-Client-Id",
            Debit {
                client: None,
                ..base.clone()
            },
        ),
        (
            "key with a blank inside",
            Debit {
                key: Some("a b c"),
                ..base.clone()
            },
        ),
        ("amount=0", with_body("amount=0")),
        ("amount=-5", with_body("amount=-5")),
        ("amount=1e3", with_body("amount=1e3")),
        ("amount=007", with_body("amount=007")),
        ("amount=abc", with_body("amount=abc")),
        ("no amount", with_body("")),
        (
            "amount past 64 bits",
            with_body("amount=9223372036854775808"),
        ),
        (
            "Content-Type text/plain",
            Debit {
                content_type: Some("text/plain"),
                ..base.clone()
            },
        ),
    ]
}

/// C7: see [`C7`].
pub async fn c7(run: &Run, out: &mut CaseOutcome) -> Result<(), String> {
    let account = "acct-0007";
    let start = run.target.ensure_balance(account, 100).await?;
    let key = run.key("c7");
    for (label, request) in malformed(account, &key) {
        match http::debit(&run.http, run.url(), &request).await {
            Ok(answer) => {
                out.check(
                    &format!("{label}: 4xx with a problem body"),
                    (400..500).contains(&answer.status) && answer.is_problem(),
                    format!("{} {}", answer.status, http::clip(&answer.body)),
                );
            }
            Err(reason) => {
                out.check(&format!("{label}: 4xx with a problem body"), false, reason);
            }
        }
    }
    let after = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance unchanged by the malformed requests", start, after);
    let good = http::debit(&run.http, run.url(), &Debit::new(account, &key, 3)).await?;
    out.check(
        "the key refused as malformed then executes (201, not a replay)",
        good.status == 201 && !good.replayed,
        format!("{} replayed={}", good.short(), good.replayed),
    );
    let last = http::balance(&run.http, run.url(), account).await?;
    out.equal("balance = start - 3", start - 3, last);
    Ok(())
}
