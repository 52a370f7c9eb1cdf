//! Verb sets: every operation a case file may call (`call NAME: VERB key=value …`),
//! declared once, in a table, by the system it drives: its name, its arguments with
//! what each takes and what it means when left out, and one line of documentation
//! (what it does and prints). A family composes the sets it offers (the ledger's, the
//! shared fault vocabulary, …); a call is checked against them when its file is read,
//! `./run.sh --verbs [FAMILY]` lists them, and `docs/specs.md`'s verb reference is
//! generated from them ([`reference`]; a test compares the two).

use std::fmt::Write;

/// What an argument's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Any word (an account, a key, a hook point the system itself checks).
    Word,
    /// An integer (`amount=30`, `count=2`).
    Integer,
    /// A decimal number (`qty=0.4`, `price=4900`).
    Decimal,
    /// One of these words.
    OneOf(&'static [&'static str]),
}

impl Kind {
    /// How the argument is written in a usage line: `key=N`, `key=X`, `key=a|b`.
    fn placeholder(self) -> String {
        match self {
            Kind::Word => "X".into(),
            Kind::Integer => "N".into(),
            Kind::Decimal => "D".into(),
            Kind::OneOf(words) => words.join("|"),
        }
    }

    /// Errors: `value` is not what the kind takes, said as `takes …`.
    fn admits(self, value: &str) -> Result<(), String> {
        let fits = match self {
            Kind::Word => !value.is_empty(),
            Kind::Integer => value.parse::<i64>().is_ok(),
            Kind::Decimal => value.parse::<f64>().is_ok_and(f64::is_finite),
            Kind::OneOf(words) => words.contains(&value),
        };
        if fits {
            return Ok(());
        }
        Err(match self {
            Kind::Word => "takes a word".into(),
            Kind::Integer => "takes an integer".into(),
            Kind::Decimal => "takes a number".into(),
            Kind::OneOf(words) => format!("takes one of {}", words.join(", ")),
        })
    }
}

/// The name of an argument that stands for any name not declared (`reconcile-orders
/// ORDER=ACCOUNT:AMOUNT …`): a usage line shows it as `KEY=X …`.
pub const ANY: &str = "*";

/// One argument of a verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arg {
    /// As written before `=`.
    pub name: &'static str,
    /// What its value must be.
    pub kind: Kind,
    /// `None`: it must be given. `Some(meaning)`: it may be left out, and `meaning`
    /// says what the verb does then (`"the default client"`).
    pub absent: Option<&'static str>,
    /// Whether it may be given more than once (`change=E:1:-5 change=F:1:-5`).
    pub repeats: bool,
}

/// A required argument.
pub const fn needs(name: &'static str, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        absent: None,
        repeats: false,
    }
}

/// A required argument that may be given more than once.
pub const fn many(name: &'static str, kind: Kind) -> Arg {
    Arg {
        name,
        kind,
        absent: None,
        repeats: true,
    }
}

/// An optional argument and what the verb does without it.
pub const fn may(name: &'static str, kind: Kind, absent: &'static str) -> Arg {
    Arg {
        name,
        kind,
        absent: Some(absent),
        repeats: false,
    }
}

/// A family's `reconcile`: its reconciliation, taking no argument; `doc` says what it
/// prints. One declaration of the verb's name and arguments for every family that
/// offers one without arguments.
pub const fn reconcile(doc: &'static str) -> Verb {
    Verb {
        name: "reconcile",
        args: &[],
        doc,
    }
}

/// One verb: what a file writes after `call NAME:`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verb {
    /// The operation's name (`debit`).
    pub name: &'static str,
    /// Its arguments, in the order a usage line shows them.
    pub args: &'static [Arg],
    /// One line: what it does and what it prints.
    pub doc: &'static str,
}

impl Verb {
    /// The usage line: `debit account=X amount=N key=X [client=X]`.
    pub fn usage(&self) -> String {
        let mut usage = self.name.to_string();
        for arg in self.args {
            let written = match (arg.name, arg.repeats) {
                (ANY, _) => format!("KEY={} …", arg.kind.placeholder()),
                (name, true) => format!("{name}={} …", arg.kind.placeholder()),
                (name, false) => format!("{name}={}", arg.kind.placeholder()),
            };
            match arg.absent {
                None => _ = write!(usage, " {written}"),
                Some(_) => _ = write!(usage, " [{written}]"),
            }
        }
        usage
    }

    /// Checks `args` (a call's, as written) against the declaration.
    ///
    /// Errors: an argument the verb does not take, one given twice, one whose value is
    /// not of its kind, a required one missing; each naming the verb and its usage.
    pub fn check(&self, args: &[(String, String)]) -> Result<(), String> {
        let usage = || format!("(usage: {})", self.usage());
        for (index, (name, value)) in args.iter().enumerate() {
            let named = self.args.iter().find(|a| a.name == name);
            let Some(arg) = named.or_else(|| self.args.iter().find(|a| a.name == ANY)) else {
                let names: Vec<&str> = self.args.iter().map(|a| a.name).collect();
                let hint = closest(name, &names)
                    .map(|near| format!("; did you mean {near}=?"))
                    .unwrap_or_default();
                return Err(format!("{} takes no {name}={hint} {}", self.name, usage()));
            };
            let once = arg.name != ANY && !arg.repeats;
            if once && args[..index].iter().any(|(earlier, _)| earlier == name) {
                return Err(format!("{} has {name}= twice {}", self.name, usage()));
            }
            arg.kind.admits(value).map_err(|why| {
                format!("{} {name}={value:?}: {name}= {why} {}", self.name, usage())
            })?;
        }
        let given = |arg: &Arg| {
            arg.name == ANY && !args.is_empty() || args.iter().any(|(n, _)| n == arg.name)
        };
        match self.args.iter().find(|a| a.absent.is_none() && !given(a)) {
            Some(missing) => Err(format!("{} needs {}= {}", self.name, missing.name, usage())),
            None => Ok(()),
        }
    }
}

/// A system's verb set, or the shared fault vocabulary: a title and its verbs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Verbs {
    /// What drives them (`the points ledger`, `faults`).
    pub title: &'static str,
    /// The verbs, in the order the reference lists them.
    pub verbs: &'static [Verb],
}

impl Verbs {
    /// Whether the set declares verb `name`: how a family routes a call to the code
    /// that runs it.
    pub fn has(&self, name: &str) -> bool {
        self.verbs.iter().any(|verb| verb.name == name)
    }
}

/// The title of every family's set of fault verbs, so the reference lists the shared
/// vocabulary in one table, each verb with the families that offer it.
pub const FAULTS: &str = "faults (one vocabulary for every family)";

/// `kill-worker`: SIGKILL to the crash-worker child a step started.
pub const KILL_WORKER: Verb = Verb {
    name: "kill-worker",
    args: &[],
    doc: "a real SIGKILL to the worker the case's steps started last, then reaped: `signal=9 shell_status=137`; on PostgreSQL (F) it also waits until the worker's backend has left `pg_stat_activity`: `backend_gone=true`",
};

/// `arm-fault`: a fault armed at a hook point of a service started with
/// `fault-injection=yes` (`ledger-svc`'s `/faults` routes, whichever system it serves).
pub const ARM_FAULT: Verb = Verb {
    name: "arm-fault",
    args: &[
        needs("point", Kind::Word),
        needs("action", Kind::Word),
        may("count", Kind::Integer, "once"),
        may("hold_ms", Kind::Integer, "held until released"),
        may(
            "event",
            Kind::OneOf(&["FILL", "CANCEL", "PLACE", "DEPOSIT"]),
            "every request passing POINT",
        ),
    ],
    doc: "`PUT /faults/POINT` (needs `fault-injection=yes`): `armed at POINT`; with `event=KIND` only that kind of spot event fires it (at a spot point only: the service refuses `event=` at a ledger point; F3)",
};

/// The body of the `PUT /faults/POINT` an [`ARM_FAULT`] call with arguments `args`
/// sends: its `action`, and `count` and `hold_ms` (integers) and `event` (a spot event's
/// kind) when given; the service checks them (`ledger-svc`'s `FaultSpec::validate`).
///
/// Errors: `count=` or `hold_ms=` is not an integer.
pub fn fault_body(args: &[(String, String)]) -> Result<serde_json::Value, String> {
    let arg = |name: &str| {
        args.iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let mut fault = serde_json::json!({ "action": arg("action").unwrap_or_default() });
    for name in ["count", "hold_ms"] {
        if let Some(value) = arg(name) {
            let value: u64 = value.parse().map_err(|_| format!("{name}=N"))?;
            fault[name] = value.into();
        }
    }
    if let Some(event) = arg("event") {
        fault["event"] = event.into();
    }
    Ok(fault)
}

/// `power-cut`: the processes on a forgetful disk killed and its unsynced writes
/// dropped, optionally one relation's last write torn.
pub const POWER_CUT: Verb = Verb {
    name: "power-cut",
    args: &[
        may("tear", Kind::Word, "no write torn"),
        may("tear-bytes", Kind::Integer, "512, a sector"),
    ],
    doc: "SIGKILL of every process on the disk (the worker holding its connection; a cluster's postmaster and backends, and a `debit-load`'s service, its clients stopped: `before the cut: acknowledged_n=[n] unknown_n=[n] refused=0`), then the disk drops what was never synced (`Mounted::cut_power`): `power cut: … dropped files_n=[n] bytes_n=[n] …`; an SQLite disk is unmounted; a cluster starts again with crash recovery (`recovery=ok torn_bytes=512`, or `recovery=failed invalid_page=acct:0`); `tear=TABLE` (a cluster's) keeps the first `tear-bytes` of that relation's last unsynced write and drops the rest",
};

/// `kill node=…`: kill -9 of a node's postmaster and its processes.
pub const KILL_NODE: Verb = Verb {
    name: "kill",
    args: &[needs("node", Kind::OneOf(&["primary", "standby"]))],
    doc: "kill -9 of that node's postmaster and every process it started (`Cluster::kill_server`): `killed primary (kill -9)`",
};

/// `start node=…`: a killed node started again, with crash recovery.
pub const START_NODE: Verb = Verb {
    name: "start",
    args: &[needs("node", Kind::OneOf(&["primary", "standby"]))],
    doc: "the killed node started again on its port, with crash recovery: `started standby again`",
};

/// `promote`: the standby promoted.
pub const PROMOTE: Verb = Verb {
    name: "promote",
    args: &[],
    doc: "the standby promoted (`pg_ctl promote`, waited for): `promoted`; from then on `on node=standby` reaches the new primary and the expectations run there",
};

/// `stop-receiver`: SIGSTOP to the standby's WAL receiver.
pub const STOP_RECEIVER: Verb = Verb {
    name: "stop-receiver",
    args: &[],
    doc: "SIGSTOP to the standby's WAL receiver (its pid from `pg_stat_wal_receiver`): `WAL receiver stopped (SIGSTOP)`; what the primary writes next cannot reach the standby's disk",
};

/// The verb named `name` in `sets`, the first that has it.
pub fn find<'a>(sets: &[&'a Verbs], name: &str) -> Option<&'a Verb> {
    sets.iter()
        .flat_map(|set| set.verbs)
        .find(|verb| verb.name == name)
}

/// Checks a call (`op`, `args`) against the verb sets a family composes.
///
/// Errors: an unknown verb, named with every verb the family offers; what
/// [`Verb::check`] says of its arguments.
pub fn check(sets: &[&Verbs], op: &str, args: &[(String, String)]) -> Result<(), String> {
    match find(sets, op) {
        Some(verb) => verb.check(args),
        None => {
            let known: Vec<&str> = sets.iter().flat_map(|s| s.verbs).map(|v| v.name).collect();
            let hint = closest(op, &known)
                .map(|name| format!("did you mean {name:?}? "))
                .unwrap_or_default();
            Err(format!(
                "unknown verb {op:?}; {hint}this family's verbs: {} (`./run.sh --verbs` documents them)",
                known.join(", ")
            ))
        }
    }
}

/// The name of `known` closest to `name`, the likely typo, as nextest and cargo name
/// one: a name that contains it or that it contains (`withdraw` for `withdraw-points`)
/// first, else the fewest single-character edits (Levenshtein), when at most half of
/// `name`'s characters; `None` when nothing is that close.
pub fn closest<'a>(name: &str, known: &[&'a str]) -> Option<&'a str> {
    let contained = known
        .iter()
        .filter(|k| !k.is_empty() && (name.contains(**k) || k.contains(name)))
        .min_by_key(|k| k.len().abs_diff(name.len()));
    if let Some(found) = contained {
        return Some(found);
    }
    let limit = name.chars().count() / 2;
    known
        .iter()
        .map(|k| (edits(name, k), *k))
        .filter(|(distance, _)| *distance <= limit)
        .min_by_key(|(distance, _)| *distance)
        .map(|(_, k)| k)
}

/// Levenshtein distance of `a` and `b` in characters.
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (diagonal + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(above + 1);
            diagonal = above;
        }
    }
    row[b.len()]
}

/// The verb reference of `families` (each `(family, the sets it composes)`) in
/// Markdown, as `docs/specs.md` holds it between its `verbs` markers: per set title
/// (in the order first met), one table of each verb's usage, the families that offer
/// it and its documentation; a verb declared once appears once, however many families
/// compose it.
pub fn reference(families: &[(&str, Vec<&Verbs>)]) -> String {
    // Per title, each verb and the families that offer it.
    type Offered<'a> = Vec<(&'a Verb, Vec<&'a str>)>;
    let mut titles: Vec<(&str, Offered)> = Vec::new();
    for (family, composed) in families {
        for set in composed {
            let at = match titles.iter().position(|(title, _)| *title == set.title) {
                Some(at) => at,
                None => {
                    titles.push((set.title, Vec::new()));
                    titles.len() - 1
                }
            };
            for verb in set.verbs {
                let rows = &mut titles[at].1;
                match rows.iter_mut().find(|(known, _)| *known == verb) {
                    Some((_, users)) if !users.contains(family) => users.push(family),
                    Some(_) => {}
                    None => rows.push((verb, vec![family])),
                }
            }
        }
    }
    let mut text = String::new();
    for (title, rows) in titles {
        let _ = writeln!(text, "### {title}\n");
        text.push_str("| call | in | does and prints |\n|---|---|---|\n");
        for (verb, users) in rows {
            let usage = verb.usage().replace('|', "\\|");
            let _ = writeln!(
                text,
                "| `{usage}` | {} | {} |",
                users.join(", "),
                verb_doc(verb)
            );
        }
        text.push('\n');
    }
    text
}

/// A verb's documentation with what each optional argument means when left out.
fn verb_doc(verb: &Verb) -> String {
    let mut doc = verb.doc.to_string();
    for arg in verb.args {
        if let Some(absent) = arg.absent {
            let _ = write!(doc, "; without `{}=`: {absent}", arg.name);
        }
    }
    doc.replace('|', "\\|")
}

/// The verbs of `sets` as `./run.sh --verbs` prints them: per set its title, then one
/// usage line per verb, indented, with its documentation.
pub fn listing(family: &str, sets: &[&Verbs]) -> String {
    let mut text = String::new();
    for set in sets {
        let _ = writeln!(text, "{family}: {}", set.title);
        for verb in set.verbs {
            let _ = writeln!(text, "  {}\n      {}", verb.usage(), verb_doc(verb));
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fault_body_carries_the_numbers_and_the_event_given() {
        let args = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let body = fault_body(&args(&[
            ("point", "spot-before-commit"),
            ("action", "pause"),
            ("count", "1"),
            ("hold_ms", "10000"),
            ("event", "FILL"),
        ]));
        let expected = serde_json::json!(
            {"action": "pause", "count": 1, "hold_ms": 10000, "event": "FILL"}
        );
        assert_eq!(body, Ok(expected));
        let plain = fault_body(&args(&[("action", "pause")]));
        assert_eq!(plain, Ok(serde_json::json!({"action": "pause"})));
        let bad = fault_body(&args(&[("action", "pause"), ("count", "x")]));
        assert_eq!(bad, Err("count=N".to_string()));
    }

    const DEBIT: Verb = Verb {
        name: "debit",
        args: &[
            needs("account", Kind::Word),
            needs("amount", Kind::Integer),
            may("client", Kind::Word, "the default client"),
            may("write", Kind::OneOf(&["absolute", "relative"]), "relative"),
        ],
        doc: "a debit",
    };
    const SET: Verbs = Verbs {
        title: "test",
        verbs: &[DEBIT],
    };

    fn args(text: &str) -> Vec<(String, String)> {
        text.split_whitespace()
            .map(|w| w.split_once('=').expect("key=value"))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_call_is_checked_against_its_declaration() {
        assert_eq!(
            DEBIT.usage(),
            "debit account=X amount=N [client=X] [write=absolute|relative]"
        );
        assert_eq!(DEBIT.check(&args("account=a amount=3")), Ok(()));
        assert_eq!(
            DEBIT.check(&args("amount=3 account=a write=absolute")),
            Ok(())
        );
        let refused = [
            ("account=a", "needs amount="),
            ("account=a amount=x", "takes an integer"),
            ("account=a amount=1 colour=red", "takes no colour="),
            ("account=a amount=1 amount=2", "amount= twice"),
            ("account=a amount=1 write=both", "one of absolute, relative"),
        ];
        for (text, said) in refused {
            let error = DEBIT.check(&args(text)).expect_err(text);
            assert!(error.contains(said), "{text}: {error}");
        }
        let unknown = check(&[&SET], "withdraw-points", &[]).expect_err("unknown");
        assert!(
            unknown.contains("\"withdraw-points\"") && unknown.contains("debit"),
            "{unknown}"
        );
    }

    #[test]
    fn the_closest_verb_is_named() {
        let known = ["debit", "grant", "withdraw", "reconcile-orders"];
        assert_eq!(closest("withdraw-points", &known), Some("withdraw"));
        assert_eq!(closest("debt", &known), Some("debit"));
        assert_eq!(closest("grnat", &known), Some("grant"));
        assert_eq!(closest("xyzzy-frobnicate", &known), None);
        assert_eq!(edits("kitten", "sitting"), 3);
    }

    #[test]
    fn any_other_name_when_the_verb_says_so() {
        const ORDERS: Verb = Verb {
            name: "reconcile-orders",
            args: &[needs(ANY, Kind::Word)],
            doc: "orders",
        };
        assert_eq!(ORDERS.usage(), "reconcile-orders KEY=X …");
        assert_eq!(ORDERS.check(&args("o1=a:3 o2=b:4")), Ok(()));
        assert!(ORDERS.check(&[]).is_err());
        const WORKER: Verb = Verb {
            name: "worker",
            args: &[many("change", Kind::Word)],
            doc: "changes",
        };
        assert_eq!(WORKER.usage(), "worker change=X …");
        assert_eq!(WORKER.check(&args("change=a:1:2 change=b:1:2")), Ok(()));
    }

    #[test]
    fn the_reference_lists_each_set_once_with_its_families() {
        let text = reference(&[("L", vec![&SET]), ("R", vec![&SET])]);
        assert_eq!(text.matches("### test").count(), 1, "{text}");
        assert_eq!(text.matches("| L, R |").count(), 1, "{text}");
        assert!(text.contains("`debit account=X amount=N [client=X] [write=absolute\\|relative]`"));
        assert!(
            text.contains("; without `client=`: the default client"),
            "{text}"
        );
    }
}
