//! The one redaction layer: volatile values in a transcript become named placeholders,
//! so that a transcript can be compared with its committed snapshot
//! (`evidence/snapshots/<family>/<id>.snap`, SPEC §7) from one run to the next.
//!
//! Transcripts print volatile values only as `name=value` (see the helpers' brief) or in
//! a few forms PostgreSQL itself uses in error texts. The rules, applied in this order:
//!
//! | what | example | becomes |
//! |---|---|---|
//! | timestamps (ISO 8601 / RFC 3339, PostgreSQL's log form, the run-folder stamp) | `2026-11-30T03:09:46Z` | `[time]` |
//! | UUIDs | `0f8fad5b-d9cb-469f-a165-70867728950e` | `[uuid]` |
//! | loopback address with port | `127.0.0.1:54321` | `127.0.0.1:[port]` |
//! | absolute paths (after a space, `=`, `(`, `[`, `{`, `,`, a quote, or at line start) | `/tmp/ledger-harness-42/pg` | `[path]` |
//! | `txn_id=`, `*_txn_id=` | `txn_id=8812` | `txn_id=[txn]` |
//! | `pid=`, `*_pid=` (e.g. `backend_pid=`) | `backend_pid=4711` | `backend_pid=[pid]` |
//! | `port=`, `*_port=` | `port=54321` | `port=[port]` |
//! | `xid=`, `*_xid=` | `xid=771` | `xid=[xid]` |
//! | `entry_id=`, `*_entry_id=` | `entry_id=90` | `entry_id=[entry]` |
//! | durations: names ending in `_ms`, `_us`, `_ns`, `_s` | `waited_ms=512` | `waited_ms=[duration]` |
//! | `seed=` | `seed=1732934986` | `seed=[seed]` |
//! | counts that vary by design: `retries=`, `*_retries=` | `serializable_retries=316` | `serializable_retries=[count]` |
//! | PostgreSQL lock and deadlock texts: `process N`, `PID N`, `transaction N`, `relation N`, `database N`, `tuple (b,o)` | `blocked by process 4711` | `blocked by process [pid]` |
//!
//! What it does not touch: counts, balances, amounts, idempotency keys, SQLSTATE codes,
//! constants such as `1500 ms` in a title — the values a reviewer compares.

use std::sync::LazyLock;

use regex::Regex;

struct Rule {
    pattern: Regex,
    replacement: &'static str,
}

fn rule(pattern: &str, replacement: &'static str) -> Rule {
    Rule {
        pattern: Regex::new(pattern).expect("redaction pattern compiles"),
        replacement,
    }
}

static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    vec![
        // Timestamps first: they contain `:` and digits other rules would split.
        rule(
            r"\b\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?(?:Z|[+-]\d{2}(?::?\d{2})?|\s?UTC)?",
            "[time]",
        ),
        rule(r"\b\d{4}-\d{2}-\d{2}T\d{6}Z", "[time]"),
        rule(
            r"\b[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}\b",
            "[uuid]",
        ),
        rule(
            r"\b(127\.0\.0\.1|localhost|0\.0\.0\.0|\[::1\]):\d+",
            "${1}:[port]",
        ),
        // An absolute path starts after a separator; `floor(100/7)` is no path, nor is
        // the `//` of a URL (`:` is not a separator here, and a path does not start with `//`).
        rule(
            r#"(^|[\s=(\[{,'"`])/[^\s/,;:)\]}'"`][^\s,;:)\]}'"`]*"#,
            "${1}[path]",
        ),
        rule(r"\b((?:\w+_)?txn_id)=\d+", "${1}=[txn]"),
        rule(r"\b((?:\w+_)?pid)=\d+", "${1}=[pid]"),
        rule(r"\b((?:\w+_)?port)=\d+", "${1}=[port]"),
        rule(r"\b((?:\w+_)?xid)=\d+", "${1}=[xid]"),
        rule(r"\b((?:\w+_)?entry_id)=\d+", "${1}=[entry]"),
        rule(r"\b(\w+_(?:ms|us|ns|s))=\d+(?:\.\d+)?", "${1}=[duration]"),
        rule(r"\bseed=\d+", "seed=[seed]"),
        rule(r"\b((?:\w+_)?retries)=\d+", "${1}=[count]"),
        // PostgreSQL's own texts (deadlock details, lock waits in the server log).
        rule(r"\b([Pp]rocess|PID) \d+", "${1} [pid]"),
        rule(r"\btransaction \d+", "transaction [xid]"),
        rule(r"\b(relation|database) \d+", "${1} [oid]"),
        rule(r"\btuple \(\d+,\d+\)", "tuple [ctid]"),
    ]
});

/// `text` with every volatile value replaced by its named placeholder (see the module
/// documentation for the rules). Idempotent: redacting twice changes nothing more.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    for rule in RULES.iter() {
        if rule.pattern.is_match(&out) {
            out = rule
                .pattern
                .replace_all(&out, rule.replacement)
                .into_owned();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn named_values_become_placeholders() {
        assert_eq!(
            redact("  note txn_id=8812 first_txn_id=7 backend_pid=4711 pid=9 port=54321"),
            "  note txn_id=[txn] first_txn_id=[txn] backend_pid=[pid] pid=[pid] port=[port]"
        );
        assert_eq!(
            redact("  note waited_ms=512 took_s=1.25 hold_us=3"),
            "  note waited_ms=[duration] took_s=[duration] hold_us=[duration]"
        );
        assert_eq!(
            redact("seed=17 xid=99 entry_id=4"),
            "seed=[seed] xid=[xid] entry_id=[entry]"
        );
        assert_eq!(
            redact("serializable_retries=316 retries=2 attempts=3"),
            "serializable_retries=[count] retries=[count] attempts=3"
        );
    }

    #[test]
    fn paths_times_addresses() {
        assert_eq!(
            redact("  note log at /tmp/ledger-harness-42/pg/server.log (kept)"),
            "  note log at [path] (kept)"
        );
        assert_eq!(redact("dir=/var/cache/x,next"), "dir=[path],next");
        assert_eq!(
            redact("postgresql://postgres@127.0.0.1:54321/case_l3"),
            "postgresql://postgres@127.0.0.1:[port]/case_l3"
        );
        assert_eq!(
            redact(
                "at 2026-11-30T03:09:46Z and 2026-11-30 03:09:46.123 UTC, run 2026-11-30T030946Z"
            ),
            "at [time] and [time], run [time]"
        );
        assert_eq!(
            redact("id 0f8fad5b-d9cb-469f-a165-70867728950e"),
            "id [uuid]"
        );
    }

    #[test]
    fn postgres_lock_texts() {
        assert_eq!(
            redact("Process 4711 waits for ShareLock on transaction 812; blocked by process 4712."),
            "Process [pid] waits for ShareLock on transaction [xid]; blocked by process [pid]."
        );
        assert_eq!(
            redact("while locking tuple (0,5) in relation 16386 of database 16384"),
            "while locking tuple [ctid] in relation [oid] of database [oid]"
        );
    }

    #[test]
    fn deterministic_figures_stay() {
        let lines = [
            "CASE L3 :: real concurrency: 32 threads debit 7 from 100",
            "  ok   successes = floor(100/7) (expected=14, actual=14)",
            "  ok   balance = 100 - 14*7 (expected=2, actual=2)",
            "  note ok=14 insufficient=18 balance=2 key=k-0701 sqlstate=23514",
            "CASE L7 :: response lost after commit: 400 ms timeout, 1500 ms hold",
            "  ok   ratio 3 / 4 and a/b",
        ];
        for line in lines {
            assert_eq!(redact(line), line);
        }
    }

    #[test]
    fn idempotent() {
        let text = "txn_id=1 pid=2 /tmp/x 2026-01-01T00:00:00Z waited_ms=3 process 5";
        let once = redact(text);
        assert_eq!(redact(&once), once);
    }
}
