//! The seeded schedules: each client's operations and the nemesis's faults. Both are
//! pure functions of the seed (and, for the faults, the duration), so the same seed
//! replays the same schedule; which prefix of a client's operations a run reaches, and
//! each attempt's outcome, depend on timing (see docs/explore.md).

use case_kit::{ChaCha8Rng, seeded_rng};
use rand::RngExt;
use serde::{Deserialize, Serialize};

/// User accounts the clients pick from (the seeded `acct-0001` … `acct-0010`).
pub const ACCOUNTS: u32 = points_ledger::TEST_ACCOUNT_COUNT;
/// Share of operations that are grants (the rest are debits), percent.
pub const GRANT_PERCENT: u32 = 35;
/// Debit amounts are drawn from 1 to this, points.
pub const DEBIT_MAX_POINTS: i64 = 100;
/// Grant amounts are drawn from 1 to this, points.
pub const GRANT_MAX_POINTS: i64 = 150;
/// Share of operations that reuse an earlier key of the same client with another
/// payload, percent.
pub const KEY_REUSE_PERCENT: u32 = 4;
/// A reused key is one of the client's last this many keys.
pub const KEY_REUSE_WINDOW: u64 = 20;
/// Share of operations that give up after their first unknown outcome (one attempt),
/// percent; the others retry with the same key up to [`MAX_ATTEMPTS`] attempts.
pub const GIVE_UP_PERCENT: u32 = 10;
/// Most attempts of one operation (the first and its same-key retries).
pub const MAX_ATTEMPTS: u32 = 5;
/// Pause before a retry, drawn per operation from this range, milliseconds.
pub const RETRY_BACKOFF_MS: std::ops::RangeInclusive<u64> = 20..=250;

/// First fault's planned start after the load starts, milliseconds.
pub const FIRST_FAULT_MS: u64 = 1_000;
/// Planned time between two faults' starts, milliseconds (plus [`FAULT_JITTER_MS`]).
pub const FAULT_INTERVAL_MS: u64 = 2_000;
/// Random extra time before each fault, drawn from 0 to this, milliseconds.
pub const FAULT_JITTER_MS: u64 = 500;
/// No fault is planned to start later than this before the load ends, milliseconds.
pub const FAULT_TAIL_MS: u64 = 1_500;
/// How long the service stays down after a SIGKILL, drawn from this range, milliseconds.
pub const SERVICE_DOWN_MS: std::ops::RangeInclusive<u64> = 200..=800;
/// How long PostgreSQL stays down after an immediate stop, drawn from this range,
/// milliseconds.
pub const POSTGRES_DOWN_MS: std::ops::RangeInclusive<u64> = 100..=600;
/// How long a pause at a hook point holds its transfer, drawn from this range,
/// milliseconds (the clients' timeout, [`crate::client::CLIENT_TIMEOUT_MS`], is inside it).
pub const PAUSE_HOLD_MS: std::ops::RangeInclusive<u64> = 400..=1_600;
/// How long a response is withheld after commit before the connection is closed,
/// milliseconds (longer than the clients' timeout, so the client gives up first).
pub const WITHHOLD_MS: u64 = 1_500;

/// DEBIT or GRANT, as the service names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Kind {
    /// `POST /accounts/{id}/debits` on the public listener.
    Debit,
    /// `POST /accounts/{id}/grants` on the admin listener.
    Grant,
}

impl Kind {
    /// `DEBIT` or `GRANT`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Debit => "DEBIT",
            Kind::Grant => "GRANT",
        }
    }
}

/// What an operation asks for: the key's payload (the service fingerprints it).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Payload {
    /// Debit or grant.
    pub kind: Kind,
    /// The user account debited or credited.
    pub account: String,
    /// Points, > 0.
    pub amount: i64,
}

impl Payload {
    /// The change this payload makes to its account's balance when it takes effect.
    pub fn delta(&self) -> i64 {
        match self.kind {
            Kind::Debit => -self.amount,
            Kind::Grant => self.amount,
        }
    }
}

/// One logical client operation: a key and a payload, and how hard to try.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedOp {
    /// The client (0-based).
    pub client: u32,
    /// The operation's index in its client's schedule (0-based).
    pub index: u64,
    /// `X-Client-Id`.
    pub client_id: String,
    /// `Idempotency-Key`: new for a fresh operation, an earlier one's for a reuse.
    pub key: String,
    /// What it asks for.
    pub payload: Payload,
    /// For a key reuse: the index of the earlier operation whose key it takes (its
    /// payload differs).
    pub reuse_of: Option<u64>,
    /// Attempts before giving up (1 = give up after the first unknown outcome).
    pub max_attempts: u32,
    /// Pause before each retry, milliseconds.
    pub backoff_ms: u64,
}

/// `X-Client-Id` of client `client`.
pub fn client_id(client: u32) -> String {
    format!("explore-c{client}")
}

/// One client's endless, seeded schedule of operations.
pub struct ClientPlan {
    client: u32,
    rng: ChaCha8Rng,
    /// Each issued operation's key.
    issued: Vec<String>,
    /// Every payload sent under each key so far.
    payloads: std::collections::HashMap<String, Vec<Payload>>,
}

impl ClientPlan {
    /// Client `client`'s schedule for `seed` (its own random stream).
    pub fn new(seed: u64, client: u32) -> ClientPlan {
        ClientPlan {
            client,
            rng: seeded_rng(seed, &format!("explore-client-{client}")),
            issued: Vec::new(),
            payloads: std::collections::HashMap::new(),
        }
    }

    fn payload(&mut self) -> Payload {
        let account = points_ledger::test_account(self.rng.random_range(1..=ACCOUNTS));
        if self.rng.random_range(0..100) < GRANT_PERCENT {
            Payload {
                kind: Kind::Grant,
                account,
                amount: self.rng.random_range(1..=GRANT_MAX_POINTS),
            }
        } else {
            Payload {
                kind: Kind::Debit,
                account,
                amount: self.rng.random_range(1..=DEBIT_MAX_POINTS),
            }
        }
    }
}

impl Iterator for ClientPlan {
    type Item = PlannedOp;

    fn next(&mut self) -> Option<PlannedOp> {
        let index = self.issued.len() as u64;
        let reuse = index > 0 && self.rng.random_range(0..100) < KEY_REUSE_PERCENT;
        let mut payload = self.payload();
        let (key, reuse_of) = if reuse {
            let window = index.min(KEY_REUSE_WINDOW);
            let earlier = index - 1 - self.rng.random_range(0..window);
            let key = self.issued[earlier as usize].clone();
            // Another payload than every one sent under this key, by construction.
            while self.payloads[&key].contains(&payload) {
                payload.amount += 1;
            }
            (key, Some(earlier))
        } else {
            (format!("c{}-{index:05}", self.client), None)
        };
        let max_attempts = if self.rng.random_range(0..100) < GIVE_UP_PERCENT {
            1
        } else {
            self.rng.random_range(2..=MAX_ATTEMPTS)
        };
        let backoff_ms = self.rng.random_range(RETRY_BACKOFF_MS);
        self.issued.push(key.clone());
        self.payloads
            .entry(key.clone())
            .or_default()
            .push(payload.clone());
        Some(PlannedOp {
            client: self.client,
            index,
            client_id: client_id(self.client),
            key,
            payload,
            reuse_of,
            max_attempts,
            backoff_ms,
        })
    }
}

/// The nemesis's kinds of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGKILL the service, wait, start a new one (new ports; same database).
    KillService,
    /// Stop PostgreSQL in immediate mode (no checkpoint), wait, start it (WAL recovery).
    CrashPostgres,
    /// Pause the next transfer at a hook point inside its transaction for a while.
    Pause,
    /// Commit the next transfer, then withhold its response until the client has
    /// timed out, and close the connection.
    Withhold,
    /// Cut the power (only with `--power-cut`, the data directory on a forgetful
    /// disk): SIGKILL the service and every postgres process, drop what the disk never
    /// got, wait, start PostgreSQL (crash recovery) and a new service.
    PowerCut,
    /// `--topology patroni` only: kill -9 of the leader's Patroni and postmaster, wait
    /// for Patroni to promote the synchronous standby, start the killed node's Patroni
    /// again (it rejoins as the standby).
    KillLeader,
    /// `--topology patroni` only: SIGSTOP of the leader's Patroni and postmaster until
    /// another node holds the leader lease (past the TTL), then SIGCONT (Patroni
    /// demotes it; it rejoins as the standby).
    PauseLeader,
    /// `--topology patroni` only: SIGSTOP of the synchronous standby's WAL receiver
    /// until a COMMIT is seen waiting for it (`SyncRep`), for longer than the
    /// service's request bound, then SIGCONT.
    StopStandby,
    /// `--topology patroni` only: `patronictl switchover` to the standby.
    Switchover,
}

impl FaultKind {
    /// Every kind, in report order.
    pub const ALL: [FaultKind; 9] = [
        FaultKind::KillService,
        FaultKind::CrashPostgres,
        FaultKind::Pause,
        FaultKind::Withhold,
        FaultKind::PowerCut,
        FaultKind::KillLeader,
        FaultKind::PauseLeader,
        FaultKind::StopStandby,
        FaultKind::Switchover,
    ];

    /// The four faults a single server's run always has.
    pub const BASIC: [FaultKind; 4] = [
        FaultKind::KillService,
        FaultKind::CrashPostgres,
        FaultKind::Pause,
        FaultKind::Withhold,
    ];

    /// The kinds of a `--topology patroni` run's mix: the service's faults
    /// (`kill-service`, `pause`, `withhold`) and the cluster's (`kill-leader`,
    /// `pause-leader`, `stop-standby`, `switchover`). No `crash-postgres`: Patroni
    /// restarts a crashed postmaster itself, and `kill-leader` is the crash there.
    pub const PATRONI: [FaultKind; 7] = [
        FaultKind::KillService,
        FaultKind::Pause,
        FaultKind::Withhold,
        FaultKind::KillLeader,
        FaultKind::PauseLeader,
        FaultKind::StopStandby,
        FaultKind::Switchover,
    ];

    /// The kinds of a run's mix: the four process-level faults, and `power-cut` when
    /// `power_cut` (the run's data directory is on a forgetful disk).
    pub fn mix(power_cut: bool) -> Vec<FaultKind> {
        let mut kinds = FaultKind::BASIC.to_vec();
        if power_cut {
            kinds.push(FaultKind::PowerCut);
        }
        kinds
    }

    /// Whether the kind acts on a Patroni cluster (`--topology patroni` only).
    pub fn is_patroni(self) -> bool {
        matches!(
            self,
            FaultKind::KillLeader
                | FaultKind::PauseLeader
                | FaultKind::StopStandby
                | FaultKind::Switchover
        )
    }

    /// The kebab-case name used in the history and the reports.
    pub fn as_str(self) -> &'static str {
        match self {
            FaultKind::KillService => "kill-service",
            FaultKind::CrashPostgres => "crash-postgres",
            FaultKind::Pause => "pause",
            FaultKind::Withhold => "withhold",
            FaultKind::PowerCut => "power-cut",
            FaultKind::KillLeader => "kill-leader",
            FaultKind::PauseLeader => "pause-leader",
            FaultKind::StopStandby => "stop-standby",
            FaultKind::Switchover => "switchover",
        }
    }
}

/// The hook points a pause may hold a transfer at (inside its transaction).
pub const PAUSE_POINTS: [&str; 3] = ["registered", "entries-written", "before-commit"];

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedFault {
    /// Its number in the schedule (0-based).
    pub index: u32,
    /// Planned start after the load starts, milliseconds (it starts later when the
    /// previous fault is still running).
    pub at_ms: u64,
    /// What it does.
    pub kind: FaultKind,
    /// For a pause: the hook point; for a withhold: `after-commit`.
    pub point: Option<String>,
    /// How long the process stays down (kill, crash) or the transfer is held (pause,
    /// withhold), milliseconds.
    pub hold_ms: u64,
}

/// The fault schedule of a `duration_ms` load for `seed`: faults every
/// [`FAULT_INTERVAL_MS`] (plus jitter), their kinds in rounds of all four in a seeded
/// order, so every kind comes once per round.
pub fn fault_plan(seed: u64, duration_ms: u64) -> Vec<PlannedFault> {
    fault_plan_of(seed, duration_ms, &FaultKind::mix(false))
}

/// The fault schedule of [`fault_plan`] over the kinds `kinds` (rounds of all of them).
pub fn fault_plan_of(seed: u64, duration_ms: u64, kinds: &[FaultKind]) -> Vec<PlannedFault> {
    let mut rng = seeded_rng(seed, "explore-nemesis");
    let mut faults = Vec::new();
    let mut round: Vec<FaultKind> = Vec::new();
    let mut at_ms = FIRST_FAULT_MS;
    while at_ms + FAULT_TAIL_MS <= duration_ms {
        if round.is_empty() {
            round = kinds.to_vec();
            // Fisher–Yates with our own draws (portable across rand versions).
            for i in (1..round.len()).rev() {
                let j = rng.random_range(0..=i);
                round.swap(i, j);
            }
        }
        let kind = round.pop().expect("refilled above");
        let (point, hold_ms) = match kind {
            FaultKind::KillService => (None, rng.random_range(SERVICE_DOWN_MS)),
            FaultKind::CrashPostgres | FaultKind::PowerCut => {
                (None, rng.random_range(POSTGRES_DOWN_MS))
            }
            FaultKind::Pause => (
                Some(PAUSE_POINTS[rng.random_range(0..PAUSE_POINTS.len())].to_owned()),
                rng.random_range(PAUSE_HOLD_MS),
            ),
            FaultKind::Withhold => (Some("after-commit".to_owned()), WITHHOLD_MS),
            // The cluster's faults last until Patroni has acted (observed, not timed).
            FaultKind::KillLeader
            | FaultKind::PauseLeader
            | FaultKind::StopStandby
            | FaultKind::Switchover => (None, 0),
        };
        faults.push(PlannedFault {
            index: faults.len() as u32,
            at_ms,
            kind,
            point,
            hold_ms,
        });
        at_ms += FAULT_INTERVAL_MS + rng.random_range(0..=FAULT_JITTER_MS);
    }
    faults
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_schedules() {
        let ops = |seed| -> Vec<PlannedOp> { ClientPlan::new(seed, 3).take(500).collect() };
        assert_eq!(ops(7), ops(7));
        assert_ne!(ops(7), ops(8));
        assert_eq!(fault_plan(7, 60_000), fault_plan(7, 60_000));
        assert_ne!(fault_plan(7, 60_000), fault_plan(8, 60_000));
    }

    #[test]
    fn reuses_change_the_payload_and_faults_come_in_rounds() {
        let ops: Vec<PlannedOp> = ClientPlan::new(1, 0).take(2_000).collect();
        let reuses: Vec<&PlannedOp> = ops.iter().filter(|op| op.reuse_of.is_some()).collect();
        assert!(!reuses.is_empty());
        for op in reuses {
            let first = &ops[op.reuse_of.unwrap() as usize];
            assert_eq!(op.key, first.key);
            let same_key = ops[..op.index as usize].iter().filter(|o| o.key == op.key);
            for earlier in same_key {
                assert_ne!(op.payload, earlier.payload);
            }
        }
        let faults = fault_plan(1, 60_000);
        for kind in FaultKind::mix(false) {
            let count = faults.iter().filter(|f| f.kind == kind).count();
            assert!(count >= 5, "{kind:?}: {count}");
        }
        assert!(faults.iter().all(|f| f.kind != FaultKind::PowerCut));
        let with_cuts = fault_plan_of(1, 60_000, &FaultKind::mix(true));
        for kind in FaultKind::mix(true) {
            let count = with_cuts.iter().filter(|f| f.kind == kind).count();
            assert!(count >= 4, "{kind:?}: {count}");
        }
        // A Patroni run's kinds come in rounds of seven: the first seven faults are
        // one of each.
        let patroni = fault_plan_of(1, 60_000, &FaultKind::PATRONI);
        let first: std::collections::BTreeSet<FaultKind> =
            patroni.iter().take(7).map(|f| f.kind).collect();
        assert_eq!(first.len(), 7);
        assert!(patroni.iter().all(|f| f.kind != FaultKind::CrashPostgres));
    }
}
