//! The kind of an outcome, with one colour per kind on every page (Jepsen's timeline
//! convention: ok, fail, info): `ok` (it took effect, or the query answered), `refused`
//! (a definite no: the service or the database refused it, nothing was applied),
//! `unknown` (no answer to rely on: it may or may not have taken effect) and `error`
//! (the call itself failed, a panic or a call that could not be made: no outcome to
//! read). Read from the outcome's own words, in this order: an `outcome=`
//! word (`OK` is ok, `UNKNOWN` unknown, any other refused); a status (`status=503` or a
//! leading `503`: 2xx ok, 5xx unknown, other refused); a text starting with `UNKNOWN`
//! or `timed out` (unknown; the word further on, as in a process's log of its state
//! changes, `STEP w-1401 UNKNOWN -> CONFIRMED`, says nothing of this outcome); an error
//! or failed call saying the connection went away (`connection lost`, `… closed`,
//! `… reset`, `terminating connection`: unknown, it may have been applied); a text
//! starting with `ERROR` (refused: the engine's error for a statement it did not
//! apply); a failed call otherwise (error); else ok.

use maud::{Markup, html};

/// One outcome kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    /// It took effect, or the query answered.
    Ok,
    /// A definite no: refused by the service or the database, nothing applied.
    Refused,
    /// No answer to rely on: it may or may not have taken effect.
    Unknown,
    /// The call itself failed (a panic, a call that could not be made): no outcome.
    Error,
}

/// Every kind, in the legend's order.
pub const ALL: [Kind; 4] = [Kind::Ok, Kind::Refused, Kind::Unknown, Kind::Error];

impl Kind {
    /// The kind's name as the page and its classes say it (`kind-ok`, …).
    pub fn name(self) -> &'static str {
        match self {
            Kind::Ok => "ok",
            Kind::Refused => "refused",
            Kind::Unknown => "unknown",
            Kind::Error => "error",
        }
    }

    /// The kind's colour, the same on every page.
    pub fn colour(self) -> &'static str {
        match self {
            Kind::Ok => "#3d8b2f",
            Kind::Refused => "#c0392b",
            Kind::Unknown => "#d68910",
            Kind::Error => "#6c3483",
        }
    }

    /// A light tint of the colour, for a box that carries text.
    pub fn tint(self) -> &'static str {
        match self {
            Kind::Ok => "#dff0d8",
            Kind::Refused => "#f9dedc",
            Kind::Unknown => "#fdebd0",
            Kind::Error => "#e8daef",
        }
    }

    /// What the kind means, for the legend.
    pub fn meaning(self) -> &'static str {
        match self {
            Kind::Ok => "took effect or answered",
            Kind::Refused => "a definite no: not applied",
            Kind::Unknown => "no answer to rely on: may or may not have taken effect",
            Kind::Error => "the call itself failed: no outcome to read",
        }
    }
}

/// A racer's recorded result (`Ok("outcome=OK balance=72")`, Rust's debug text, as
/// `case_kit::Ctx::race` records it) as the outcome's own words and whether the call
/// failed (`Err(…)`): `("outcome=OK balance=72", false)`. A result cut short by the
/// recorder ends in `…`. Text of another shape is returned as it is.
pub fn words(recorded: &str) -> (String, bool) {
    let (inner, failed) = if let Some(rest) = recorded.strip_prefix("Ok(") {
        (rest, false)
    } else if let Some(rest) = recorded.strip_prefix("Err(") {
        (rest, true)
    } else {
        return (recorded.to_string(), false);
    };
    let whole = inner.ends_with(')');
    let inner = inner.strip_suffix(')').unwrap_or(inner);
    let text = match inner.strip_prefix('"') {
        Some(quoted) if whole && quoted.ends_with('"') => unescape(&quoted[..quoted.len() - 1]),
        Some(quoted) => format!("{}…", unescape(quoted)),
        None if whole => inner.to_string(),
        None => format!("{inner}…"),
    };
    (text, failed)
}

/// Rust's debug escapes undone (`\"`, `\\`, `\n`, `\t`).
fn unescape(text: &str) -> String {
    let mut out = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match (c, c == '\\') {
            (_, true) => match chars.next() {
                Some('n') => out.push(' '),
                Some('t') => out.push(' '),
                Some(other) => out.push(other),
                None => {}
            },
            (c, false) => out.push(c),
        }
    }
    out
}

/// The kind of an outcome from its words and whether the call failed (see the module's
/// doc for the rules).
pub fn classify(words: &str, failed_call: bool) -> Kind {
    let upper = words.to_ascii_uppercase();
    let tokens: Vec<&str> = upper.split_whitespace().collect();
    if let Some(outcome) = tokens.iter().find_map(|t| t.strip_prefix("OUTCOME=")) {
        return match outcome {
            "OK" => Kind::Ok,
            "UNKNOWN" => Kind::Unknown,
            _ => Kind::Refused,
        };
    }
    let status = tokens
        .iter()
        .find_map(|t| t.strip_prefix("STATUS="))
        .or_else(|| tokens.first().copied())
        .filter(|s| s.len() == 3 && s.chars().all(|c| c.is_ascii_digit()));
    if let Some(status) = status {
        return match &status[..1] {
            "2" => Kind::Ok,
            "5" => Kind::Unknown,
            _ => Kind::Refused,
        };
    }
    let error = upper.starts_with("ERROR");
    let gone = (error || failed_call) && CONNECTION_GONE.iter().any(|w| upper.contains(w));
    if tokens.first() == Some(&"UNKNOWN") || upper.starts_with("TIMED OUT") || gone {
        Kind::Unknown
    } else if error {
        Kind::Refused
    } else if failed_call {
        Kind::Error
    } else {
        Kind::Ok
    }
}

/// An error's words that say the connection went away before an answer: the statement
/// may or may not have been applied (a server killed mid-commit).
const CONNECTION_GONE: [&str; 5] = [
    "CONNECTION LOST",
    "CONNECTION CLOSED",
    "CONNECTION RESET",
    "TERMINATING CONNECTION",
    "SERVER CLOSED THE CONNECTION",
];

/// The legend of a picture: each kind's swatch, name and meaning (with how many of the
/// picture's items are of it when `counts` is given), and `extra` items after them.
pub fn legend(counts: Option<&[(Kind, usize)]>, extra: Markup) -> Markup {
    html! {
        div.legend {
            b { "Legend: " }
            @for kind in ALL {
                @let n = counts.map(|c| c.iter().filter(|(k, _)| *k == kind).map(|(_, n)| n).sum::<usize>());
                span.key data-kind=(kind.name()) {
                    span.swatch style={ "background:" (kind.colour()) } {}
                    b { (kind.name()) } " — " (kind.meaning())
                    @if let Some(n) = n { " (" (n) ")" }
                }
            }
            (extra)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_and_kinds_of_recorded_results() {
        assert_eq!(
            words(r#"Ok("outcome=OK balance=72")"#),
            ("outcome=OK balance=72".into(), false)
        );
        assert_eq!(
            words(r#"Err("ERROR 23514: \"x\"")"#),
            ("ERROR 23514: \"x\"".into(), true)
        );
        assert_eq!(
            words(r#"Ok("outcome=OK notional=5"#),
            ("outcome=OK notional=5…".into(), false)
        );
        assert_eq!(words("Ok(Insufficient)"), ("Insufficient".into(), false));
        let kind = |s: &str, failed| classify(s, failed);
        assert_eq!(kind("outcome=OK balance=72", false), Kind::Ok);
        assert_eq!(kind("outcome=INSUFFICIENT balance=2", false), Kind::Refused);
        assert_eq!(
            kind(
                "status=409 type=urn:ledger:problem:insufficient outcome=INSUFFICIENT",
                false
            ),
            Kind::Refused
        );
        assert_eq!(kind("503 UNKNOWN", false), Kind::Unknown);
        assert_eq!(kind("status=201 txn=5", false), Kind::Ok);
        assert_eq!(kind("status=503", false), Kind::Unknown);
        assert_eq!(
            kind("ERROR SQLITE_BUSY_SNAPSHOT: database is locked", false),
            Kind::Refused
        );
        assert_eq!(kind("ERROR 23514: check", true), Kind::Refused);
        assert_eq!(kind("connection reset by peer", true), Kind::Unknown);
        assert_eq!(
            kind("ERROR MariaDB client: connection lost", false),
            Kind::Unknown
        );
        assert_eq!(kind("racer panicked", true), Kind::Error);
        assert_eq!(kind("balance=20", false), Kind::Ok);
        assert_eq!(kind("UNKNOWN answer lost", false), Kind::Unknown);
        assert_eq!(
            kind(
                "exited with status 0 | STEP w-1401 UNKNOWN -> CONFIRMED | IDLE",
                false
            ),
            Kind::Ok
        );
        assert_eq!(kind("", false), Kind::Ok);
    }
}
