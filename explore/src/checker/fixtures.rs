//! Hand-made histories and final databases for the checkers' tests: one client `c`
//! working on `acct-0001`, which starts at 0 points.

use std::collections::HashMap;

use serde_json::{Value, json};

use super::Checker;
use super::facts::Facts;
use super::finding::Finding;
use super::recorded::Recorded;
use crate::history::{Completion, Event};
use crate::plan::{Kind, Payload};
use crate::state::{AccountRow, FinalState, RequestRow, TxnRow};

/// The user account every fixture works on.
pub const ACCOUNT: &str = "acct-0001";
/// The client id every fixture sends.
pub const CLIENT: &str = "c";

/// A grant of `amount` points to [`ACCOUNT`].
pub fn grant(amount: i64) -> Payload {
    Payload {
        kind: Kind::Grant,
        account: ACCOUNT.into(),
        amount,
    }
}

/// A debit of `amount` points from [`ACCOUNT`].
pub fn debit(amount: i64) -> Payload {
    Payload {
        kind: Kind::Debit,
        account: ACCOUNT.into(),
        amount,
    }
}

/// A history written line by line (line `n` at `n` ms); line 1 is the setup.
pub struct Script {
    events: Vec<(usize, Event)>,
    /// Per operation: its latest attempt number and its payload.
    sent: HashMap<u64, (u32, Payload)>,
}

impl Script {
    /// A history holding only the setup line ([`ACCOUNT`] at 0).
    pub fn new() -> Script {
        Script::starting(&[(ACCOUNT, 0)])
    }

    /// A history holding only the setup line, with `balances` before the load.
    pub fn starting(balances: &[(&str, i64)]) -> Script {
        let setup = Event::Setup {
            t_us: 1_000,
            seed: 1,
            clients: 1,
            duration_ms: 1,
            planted_bug: None,
            topology: None,
            balances: balances
                .iter()
                .map(|(a, b)| ((*a).to_owned(), *b))
                .collect(),
        };
        Script {
            events: vec![(1, setup)],
            sent: HashMap::new(),
        }
    }

    fn next(&self) -> (usize, u64) {
        let line = self.events.len() + 1;
        (line, line as u64 * 1_000)
    }

    /// An attempt of operation `op` under `key` asking for `payload` (a retry when `op`
    /// was sent before).
    pub fn invoke(mut self, op: u64, key: &str, payload: &Payload) -> Script {
        let (line, t_us) = self.next();
        let attempt = self.sent.get(&op).map_or(1, |(attempt, _)| attempt + 1);
        self.sent.insert(op, (attempt, payload.clone()));
        let event = Event::Invoke {
            t_us,
            client: 0,
            op,
            attempt,
            client_id: CLIENT.into(),
            key: key.into(),
            payload: payload.clone(),
            reuse_of: None,
        };
        self.events.push((line, event));
        self
    }

    /// The latest attempt of `op` ends: `ok` for 201, `info` for a 5xx or no answer,
    /// `fail` for another status or a connection that could not be made (`connect`).
    pub fn answer(
        mut self,
        op: u64,
        status: Option<u16>,
        replayed: bool,
        body: Value,
        error: Option<&str>,
    ) -> Script {
        let (line, t_us) = self.next();
        let completion = Completion {
            t_us,
            client: 0,
            op,
            attempt: self.sent[&op].0,
            status,
            replayed,
            body,
            error: error.map(str::to_owned),
        };
        let event = match status {
            Some(201) => Event::Ok(completion),
            Some(500..=599) => Event::Info(completion),
            None if error != Some("connect") => Event::Info(completion),
            _ => Event::Fail(completion),
        };
        self.events.push((line, event));
        self
    }

    /// A 201 for `op` naming its payload, `txn` and `balance`.
    pub fn ok(self, op: u64, txn: i64, balance: i64, replayed: bool) -> Script {
        let body = self.body(op, "OK", txn, balance);
        self.answer(op, Some(201), replayed, body, None)
    }

    /// A 409 `INSUFFICIENT` for `op`.
    pub fn insufficient(self, op: u64) -> Script {
        let body = json!({"outcome": "INSUFFICIENT", "balance": 0});
        self.answer(op, Some(409), false, body, None)
    }

    /// No answer for `op` within the timeout.
    pub fn timeout(self, op: u64) -> Script {
        self.answer(op, None, false, Value::Null, Some("timeout"))
    }

    /// The body of an answer for `op` naming its payload.
    pub fn body(&self, op: u64, outcome: &str, txn: i64, balance: i64) -> Value {
        let payload = &self.sent[&op].1;
        json!({"outcome": outcome, "kind": payload.kind.as_str(),
               "account_id": payload.account, "amount": payload.amount,
               "txn_id": txn, "balance": balance})
    }

    /// A connection for `op` that could not be made (nothing sent).
    pub fn unsent(self, op: u64) -> Script {
        self.answer(op, None, false, Value::Null, Some("connect"))
    }

    /// The history's lines.
    pub fn events(&self) -> &[(usize, Event)] {
        &self.events
    }
}

/// A consistent final database holding `txns` (key, txn id, payload), each recorded OK:
/// [`ACCOUNT`] (no negative balance), `sys-issuer` and `sys-redeem` at the sums of
/// their entries.
pub fn ledger(txns: &[(&str, i64, &Payload)]) -> FinalState {
    let mut balances: Vec<(&str, i64, bool)> = vec![
        (ACCOUNT, 0, false),
        ("sys-issuer", 0, true),
        ("sys-redeem", 0, true),
    ];
    let mut state = FinalState::default();
    for (key, txn_id, payload) in txns {
        let entries = match payload.kind {
            Kind::Grant => vec![("sys-issuer", -payload.amount), (ACCOUNT, payload.amount)],
            Kind::Debit => vec![(ACCOUNT, -payload.amount), ("sys-redeem", payload.amount)],
        };
        for (account, amount) in &entries {
            balances
                .iter_mut()
                .find(|b| b.0 == *account)
                .expect("known")
                .1 += amount;
        }
        state.txns.push(TxnRow {
            txn_id: *txn_id,
            client_id: CLIENT.into(),
            idem_key: (*key).into(),
            kind: payload.kind.as_str().into(),
            entries: entries.iter().map(|(a, n)| ((*a).to_owned(), *n)).collect(),
        });
        state.requests.push(RequestRow {
            client_id: CLIENT.into(),
            idem_key: (*key).into(),
            outcome: "OK".into(),
            txn_id: Some(*txn_id),
        });
    }
    state.requests.sort_by(|a, b| a.idem_key.cmp(&b.idem_key));
    state.accounts = balances
        .into_iter()
        .map(|(account, balance, allow_negative)| AccountRow {
            account_id: account.into(),
            balance,
            allow_negative,
        })
        .collect();
    state
}

/// What `checker` finds in `script`'s history against `state`.
pub fn run(checker: Checker, script: &Script, state: &FinalState) -> Vec<Finding> {
    let recorded = Recorded::read(script.events());
    let facts = Facts::new(&recorded.initial, &recorded.ops, state);
    checker(&facts)
}

/// The kinds of `found`, in order.
pub fn kinds(found: &[Finding]) -> Vec<&'static str> {
    found.iter().map(|f| f.kind).collect()
}
