//! The frozen balances' verbs, declared once: what the case files of families F
//! (PostgreSQL) and I (InnoDB) may call, with their arguments and one line each of what
//! they do and print. Both families compose [`EVENTS`], the events themselves, read and
//! printed by one piece of code over either engine ([`super::spec_events`]); F adds its
//! own sets ([`ALL`]: withdrawals, the naive designs, crash-workers, the external
//! network, the spot routes, the free rounds) and I its own (`cases_innodb::verbs`). The operations are in
//! `spec_calls.rs` and the modules it names; `docs/specs.md`'s verb reference is made
//! from these tables (`cargo test -p harness --test verbs`).

use case_kit::spec::Call;
use case_kit::spec::verbs::{self, Arg, Kind, Verb, Verbs, may, needs};
use launch::service::FAULT_INJECTION;

const WORD: Kind = Kind::Word;
const INT: Kind = Kind::Integer;
/// An amount, quantity or price as decimal text in whole coins, parsed by the library's
/// rules (`frozen_balances::amount`), which say why one is refused.
const COINS: Kind = Kind::Decimal;
const SIDE: Kind = Kind::OneOf(&["BUY", "SELL"]);
const ASSET: Kind = Kind::OneOf(&["USDT", "BTC", "ETH"]);
const MARKET: Arg = may("market", Kind::OneOf(&["BTC-USDT", "ETH-USDT"]), "BTC-USDT");
/// The arguments most verbs share: whose, which business id, and the figures of a
/// placement or a transfer.
const ACCOUNT: Arg = needs("account", WORD);
const KEY: Arg = needs("key", WORD);
const SIDE_OF: Arg = needs("side", SIDE);
const QTY: Arg = needs("qty", COINS);
const PRICE: Arg = needs("price", COINS);
const ASSET_OF: Arg = needs("asset", ASSET);
const AMOUNT: Arg = needs("amount", COINS);
const TENANT: Arg = may("tenant", WORD, "the default tenant (`default`)");
/// I's abort at a hook point, on every event.
const FAIL: Arg = may(
    "fail",
    WORD,
    "not aborted (InnoDB, family I: the event aborted at that hook point, `FailAt`)",
);
/// A hold at a hook point, on every event and either engine.
const HOLD: Arg = may(
    "hold",
    WORD,
    "run to its end (with a hook point: started on a connection of its own and returned once paused there, `held at POINT`; `release` lets it go on; F3, I3)",
);

/// `place`'s figure of the product's answer, on either engine.
const SHOW: Arg = may(
    "show",
    Kind::OneOf(&["reported"]),
    "no `reported_available=` (the available the product's answer carries, I5)",
);
/// F's abort of a placement at a hook point.
const FAIL_AT: Arg = may(
    "fail-at",
    WORD,
    "not aborted (PostgreSQL, family F: the placement aborted at that hook point, `ERROR event aborted by hook at balances-updated`, F6)",
);
/// F's meeting of racing fills at a hook point (F9).
const MEET: Arg = may(
    "meet",
    Kind::OneOf(&["registered"]),
    "no meeting (PostgreSQL, family F, in a `race call:` only: each fill's first attempt waits at that hook point until every racer's fill is there, a retry passes, and its attempts are counted for `fill-attempts`, F9)",
);
/// `naive-place`'s failure between its balance update and its records.
const FAIL_AFTER_UPDATE: Arg = may(
    "fail",
    Kind::OneOf(&["after-update"]),
    "every statement runs",
);

/// The arguments of [`EVENTS`] that only PostgreSQL's events take (family F).
pub const POSTGRES_ONLY: [&str; 2] = ["fail-at", "meet"];
/// The arguments of [`EVENTS`] that only InnoDB's events take (family I).
pub const INNODB_ONLY: [&str; 1] = ["fail"];

/// What a declaration cannot say of an event: that an argument is the other engine's.
///
/// Errors: `call` is one of [`EVENTS`] and gives an argument of `others` (the other
/// engine's, [`POSTGRES_ONLY`] or [`INNODB_ONLY`]); `here` names this engine.
pub fn refuse_the_others(call: &Call, others: &[&str], here: &str) -> Result<(), String> {
    if !EVENTS.has(&call.op) {
        return Ok(());
    }
    match call
        .args
        .iter()
        .find(|(name, _)| others.contains(&name.as_str()))
    {
        Some((name, _)) => Err(format!(
            "{} takes no {name}= on {here}: the other engine's events take it",
            call.op
        )),
        None => Ok(()),
    }
}

/// The events, on either engine: `frozen_balances`' on PostgreSQL (F),
/// `frozen_balances_innodb`'s on InnoDB (I).
pub const EVENTS: Verbs = Verbs {
    title: "the frozen balances' events (`systems/frozen-balances`, `systems/frozen-balances-innodb`)",
    verbs: &[
        Verb {
            name: "deposit",
            args: &[ACCOUNT, ASSET_OF, AMOUNT, KEY, TENANT, FAIL, HOLD],
            doc: "the event on the session's connection, then the balance it changed: `outcome=OK available=10000.000000 frozen=0.000000`; a replay adds `replayed=true`, an InnoDB event that met duplicate keys or deadlocks `duplicates=N` / `deadlocks=N`",
        },
        Verb {
            name: "place",
            args: &[
                ACCOUNT, SIDE_OF, QTY, PRICE, KEY, MARKET, TENANT, SHOW, FAIL_AT, FAIL, HOLD,
            ],
            doc: "`outcome=OK order=1 freeze=5005.000000 fee_reserve=5.000000 available=4995.000000 frozen=5005.000000` (`freeze`: what the order froze or would have; then the balance of that asset), printed as `deposit` is",
        },
        Verb {
            name: "fill",
            args: &[
                needs("buy", WORD),
                needs("sell", WORD),
                QTY,
                PRICE,
                KEY,
                MARKET,
                TENANT,
                MEET,
                FAIL,
                HOLD,
            ],
            doc: "the orders named by business id (`buy=place-0201`) or number (`#3`): `outcome=OK notional=… buyer_fee=… seller_fee=… buyer_frozen_taken=… buyer_returned=… seller_received=… buy_status=OPEN sell_status=FILLED`, or `outcome=ORDER_CLOSED closed=1 status=CANCELLED`",
        },
        Verb {
            name: "cancel",
            args: &[ACCOUNT, needs("order", WORD), KEY, TENANT, FAIL, HOLD],
            doc: "`outcome=OK released=3003.000000 status=CANCELLED available=… frozen=…`",
        },
        Verb {
            name: "release",
            args: &[],
            doc: "lets the session's held event (`hold=POINT`) go on and prints what it ends with: its answer, or its error (InnoDB: `ERROR MariaDB client: connection lost` when its connection died meanwhile, I8)",
        },
        Verb {
            name: "balance",
            args: &[ACCOUNT, ASSET_OF, TENANT],
            doc: "`available=… frozen=…` of that row, in whole coins",
        },
        Verb {
            name: "reconcile",
            args: &[TENANT],
            doc: "the engine's reconciliation: `clean=true BTC=0.00000000 USDT=0.000000` (the tenant's per-asset sums), or `clean=false`, the sums, the findings' counts and each finding (`| row default/bob BTC: stored …` on PostgreSQL, `; row default/alice USDT: …` on InnoDB)",
        },
    ],
};

/// Withdrawals to the external network (F13–F16; PostgreSQL only).
pub const WITHDRAWALS: Verbs = Verbs {
    title: "the frozen balances' withdrawals (`frozen_balances::withdraw`)",
    verbs: &[
        Verb {
            name: "withdraw",
            args: &[ACCOUNT, ASSET_OF, AMOUNT, needs("to", WORD), KEY, TENANT],
            doc: "the request only (freeze, record and outbox event; SPEC §8): `outcome=OK available=… frozen=…`",
        },
        Verb {
            name: "settle",
            args: &[
                KEY,
                needs("status", WORD),
                may("detail", WORD, "`settled by the spec`"),
                TENANT,
            ],
            doc: "withdrawal `key`'s settlement, as the executor does it: `outcome=OK status=CONFIRMED consumed=… released=…` (minor units), `replayed=true` for a replay",
        },
    ],
};

/// The naive designs F's controls refute (`spec_naive.rs`).
pub const NAIVE: Verbs = Verbs {
    title: "the frozen balances' naive designs (`cases/frozen/src/spec_naive.rs`)",
    verbs: &[
        Verb {
            name: "naive-place",
            args: &[ACCOUNT, SIDE_OF, QTY, PRICE, KEY, FAIL_AFTER_UPDATE, TENANT],
            doc: "the placement with each statement in its own transaction (autocommit): `outcome=OK available=… frozen=…` (USDT), `outcome=FOUND` when its operation exists; with `fail=after-update` the injected error after the balance update (F6's control)",
        },
        Verb {
            name: "unchecked-place",
            args: &[
                ACCOUNT,
                SIDE_OF,
                QTY,
                PRICE,
                KEY,
                may(
                    "batch",
                    Kind::OneOf(&["yes"]),
                    "the statements one by one in a transaction, the UPDATE's count dropped",
                ),
                TENANT,
            ],
            doc: "the placement in one transaction that never reads its conditional freeze's affected-row count, then records operation OK, movement and order; with `batch=yes` the four statements as one simple-query batch: `outcome=OK available=… frozen=…` (USDT) even when the freeze matched no row (F22's control)",
        },
        Verb {
            name: "naive-cancel",
            args: &[needs("order", WORD), KEY, needs("current", COINS), TENANT],
            doc: "a cancel that releases the remainder at `current`'s price and its fee reserve, recomputed, instead of the freeze's remainder: `outcome=OK released=4904.900000 status=CANCELLED …` (F18's control)",
        },
    ],
};

/// Crash-workers placing an order (`spec_workers.rs`, F12).
pub const WORKERS: Verbs = Verbs {
    title: "the frozen balances' crash-worker (`crash-worker spot`)",
    verbs: &[Verb {
        name: "worker",
        args: &[ACCOUNT, SIDE_OF, QTY, PRICE, KEY, needs("stop", WORD)],
        doc: "a `crash-worker spot` child running that placement up to hook point `stop` (`before-commit`, …), returned once paused there: `paused at before-commit`; its backend counts with the spec's sessions",
    }],
};

/// F9's deadlocks: naive settlements and the product's bounded retry (`spec_settle.rs`).
pub const DEADLOCKS: Verbs = Verbs {
    title: "the frozen balances' deadlocks (`cases/frozen/src/spec_settle.rs`)",
    verbs: &[
        Verb {
            name: "naive-settle",
            args: &[
                needs("order", Kind::OneOf(&["request", "sorted"])),
                may("pairs", INT, "1"),
                may(
                    "at-once",
                    Kind::OneOf(&["yes"]),
                    "one settlement of a pair after the other (no deadlock can form)",
                ),
            ],
            doc: "pairs of opposite settlements (alice buys from bob, bob from alice) on two connections of its own, each locking both USDT rows (buyer's first in request order, account order when sorted; `deadlock_timeout` 10 ms) and bumping their `version`; with `at-once=yes` a pair meets at a barrier, between the two locks in request order (a certain cycle), before them when sorted: `pairs=4 deadlocks_n=4 committed_n=4 settled=8 deadlocked=yes` (request order, the detector's split redacted), `pairs=4 deadlocks=0 committed=8 settled=8 deadlocked=no` (sorted)",
        },
        Verb {
            name: "fill-attempts",
            args: &[],
            doc: "the attempts of the case's fills that met in a race (`fill … meet=`): `fills=8 retries_n=0 within_bound=true max_attempts=5` (retries redacted; within the library's `MAX_DEADLOCK_ATTEMPTS`)",
        },
    ],
};

/// F8's lock outside the database and the naive placement under it (`spec_locks.rs`).
pub const LOCKS: Verbs = Verbs {
    title: "the frozen balances under a lock outside the database (`cases/frozen/src/spec_locks.rs`)",
    verbs: &[
        Verb {
            name: "locked-place",
            args: &[
                ACCOUNT,
                SIDE_OF,
                QTY,
                PRICE,
                KEY,
                needs("release", Kind::OneOf(&["before-commit", "after-commit"])),
                may("lease-ms", INT, "held until let go"),
                may(
                    "pause",
                    Kind::OneOf(&["after-read", "before-commit"]),
                    "no pause",
                ),
                may("count", INT, "one placement, on the session's connection"),
            ],
            doc: "takes the account's in-process lock (a lock service's stand-in: a token, an optional lease lost when it runs out), then in one transaction the naive placement: a plain read of `available` and `frozen`, the values it computed written, operation, movement and order recorded; the lock let go before or after COMMIT; with `pause=` stopped there until `resume-place` (shown `<waiting ...>`): `outcome=OK read_available=6000.000000 available=995.000000 frozen=5005.000000`; with `count=N` N at once on connections of their own, released by a barrier (`{i}` in `key`): `placements=32 ok=1 insufficient=31` (F8)",
        },
        Verb {
            name: "resume-place",
            args: &[KEY],
            doc: "lets the `locked-place` paused under `key` go on: `resumed=1` (`resumed=0`: none paused)",
        },
    ],
};

/// The faults of the shared vocabulary F's files use (its `kill-worker` kills a
/// [`WORKERS`] child).
pub const FAULTS: Verbs = Verbs {
    title: verbs::FAULTS,
    verbs: &[verbs::KILL_WORKER],
};

/// The external network of F13–F16 (`spec_network.rs`), F15's naive withdrawal with it.
pub const NETWORK: Verbs = Verbs {
    title: "the external network (`net-standin`, `withdrawal-executor`)",
    verbs: &[
        Verb {
            name: "network",
            args: &[],
            doc: "starts the case's `net-standin` (its store and log beside the run's logs): `ready`; killed when the case ends",
        },
        Verb {
            name: "network-deposit",
            args: &[
                needs("tx", WORD),
                ACCOUNT,
                ASSET_OF,
                AMOUNT,
                needs("confirmations", INT),
                may("dropped", Kind::OneOf(&["yes"]), "not dropped"),
                TENANT,
            ],
            doc: "what the network reports of an incoming transfer: `reported` (F16)",
        },
        Verb {
            name: "network-refuse",
            args: &[may("count", INT, "1")],
            doc: "the next N broadcasts refused (422, `REJECTED`): `refusing the next N broadcast(s)`",
        },
        Verb {
            name: "network-drop",
            args: &[may("count", INT, "1")],
            doc: "the next N broadcasts stored and their answers lost: `dropping the answers to the next N broadcast(s)`",
        },
        Verb {
            name: "network-hold",
            args: &[may("count", INT, "1")],
            doc: "the answers to the next N broadcasts stored and held until `network-release` (at most the stand-in's `MAX_DELAY_MS`, a hang bound only): `holding the answers to the next N broadcast(s) until released`; a step waiting for a held answer shows `<waiting ...>` (F15)",
        },
        Verb {
            name: "network-release",
            args: &[],
            doc: "ends every answer held now: `released=N`, the answers held at that moment (`GET /control`)",
        },
        Verb {
            name: "naive-withdraw",
            args: &[ACCOUNT, ASSET_OF, AMOUNT, needs("to", WORD), KEY, TENANT],
            doc: "F15's naive design on the session's connection: the conditional freeze in a transaction (its backend's `application_name` is `naive-withdraw` meanwhile), the broadcast under `key` with the transaction open, then a rollback: `answer=accepted new=true rolled_back=true`",
        },
        Verb {
            name: "executor",
            args: &[
                needs("command", Kind::OneOf(&["run", "scan-deposits"])),
                may(
                    "confirmations",
                    INT,
                    "the executor's own (`scan-deposits` needs it)",
                ),
                may("stop", WORD, "run to its end"),
                may("answer-timeout-ms", INT, "the executor's own (5000)"),
                may(
                    "retry-under-new-id",
                    Kind::OneOf(&["yes"]),
                    "the product's executor (with `yes`: the naive one F14's control refutes)",
                ),
            ],
            doc: "`withdrawal-executor` on the case's database and network, run to its end: `exited with status 0 | LINE | …` (its stdout lines); with `stop=HOOK` returned once paused there (`paused: PAUSED_IN_TX point=after-unknown …`); in flight while the network holds its broadcast's answer, it shows `<waiting ...>` (F15)",
        },
        Verb {
            name: "kill-executor",
            args: &[],
            doc: "a real SIGKILL to the paused executor: `signal=9 shell_status=137` (F14)",
        },
        Verb {
            name: "network-log",
            args: &[],
            doc: "the network's own records (`transfers=N | #1 id=… status=… broadcasts_received=… | query #1 … | deposit …`), also kept in the case's database as `network_transfer` and `network_query` for `rows:` and `exposes:`",
        },
    ],
};

/// `ledger-svc`'s spot routes (`spec_spot.rs`, F3, F4, F7, F11): amounts sent as typed.
pub const SPOT: Verbs = Verbs {
    title: "the frozen balances' HTTP routes (`ledger-svc`'s spot routes)",
    verbs: &[
        Verb {
            name: "spot-service",
            args: &[FAULT_INJECTION, may("pool", INT, "2")],
            doc: "starts `ledger-svc` on the case's database with the spot clients and a pool of `pool` connections: `ready`; killed when the case ends if no step stopped it. A request of the steps in flight counts as waiting (`<waiting ...>`) while every one in flight is held at a fault point or has a backend of the service waiting for a lock (F3)",
        },
        Verb {
            name: "post-place",
            args: &[
                ACCOUNT,
                needs("side", WORD),
                needs("qty", WORD),
                needs("price", WORD),
                KEY,
                TENANT,
                may(
                    "market",
                    WORD,
                    "`BTC-USDT` (with `market=`, sent as typed: F23's ETH-USDT)",
                ),
                may("give-up-when-held", WORD, "the client waits for the answer"),
                may("together", INT, "one request"),
            ],
            doc: "the placement on the public listener, the text sent as typed: `status=201 outcome=OK replayed=false order_id=1 frozen=… fee_reserve=…`, or `status=400 outcome=BAD_REQUEST replayed=false detail=…`; with `give-up-when-held=POINT` a lost response, given up the moment the service holds it there: `gave up: holding=1 fired=1` (F7); with `together=N` N identical requests, each built beforehand and sent from a task of its own, released together by a barrier: `created=16 executed=1 replayed=15 distinct_bodies=1 | ` and the first fresh answer (F4)",
        },
        Verb {
            name: "post-deposit",
            args: &[
                ACCOUNT,
                needs("asset", WORD),
                needs("amount", WORD),
                KEY,
                TENANT,
            ],
            doc: "the deposit on the admin listener, printed as `post-place` is",
        },
        Verb {
            name: "post-fill",
            args: &[
                needs("buy", WORD),
                needs("sell", WORD),
                needs("qty", WORD),
                needs("price", WORD),
                KEY,
            ],
            doc: "the fill on the admin listener (orders by number or business id), printed as `post-place` is",
        },
        Verb {
            name: "post-cancel",
            args: &[ACCOUNT, needs("order", WORD), KEY],
            doc: "the cancel on the public listener (the order by number or business id): `status=201 outcome=OK replayed=false order_id=1 released=3003.000000`, or `status=409 outcome=ORDER_CLOSED …` (F3)",
        },
        verbs::ARM_FAULT,
        Verb {
            name: "release-fault",
            args: &[needs("point", WORD)],
            doc: "releases what is held at POINT, then waits until nothing is held there any more: `released=N`",
        },
        Verb {
            name: "stop-service",
            args: &[],
            doc: "SIGTERM: `exit=0` when it ended with status 0",
        },
    ],
};

/// A fill and a cancel of one order raced without a hold, many times (`spec_races.rs`,
/// F3).
pub const RACES: Verbs = Verbs {
    title: "the frozen balances' free rounds (`cases/frozen/src/spec_races.rs`)",
    verbs: &[Verb {
        name: "fill-cancel-rounds",
        args: &[needs("rounds", INT), may("from", INT, "0")],
        doc: "`rounds` rounds numbered from `from`, each on fresh accounts `b3-rNN` (10 000 USDT, BUY 1.0 @ 5000) and `s3-rNN` (1 BTC, SELL 1.0 @ 5000): a fill of 0.4 @ 5000 and a cancel of the BUY sent at once on two connections of their own, nothing held, each round judged fill first (fill OK, 3003 released, buyer 7998 available, nothing frozen) or cancel first (fill ORDER_CLOSED, 5005 released, 10 000 available): `rounds=50 fill_first_n=[n] cancel_first_n=[n] neither=0`, then what the first round that is neither saw (F3)",
    }],
};

/// The rounding rule's version (F24; `frozen_balances::rules`).
pub const RULES: Verbs = Verbs {
    title: "the frozen balances' rounding rule (`frozen_balances::rules`)",
    verbs: &[Verb {
        name: "reconcile-rules",
        args: &[may(
            "assume",
            Kind::OneOf(&["current"]),
            "each fill with the version its movements record",
        )],
        doc: "every OK fill's fees recomputed with the rule version its movements record (with `assume=current`: with the rule in force now, as a design that records no version must): `fills=2 rule_mismatches=0`, then each mismatch (`| fill default/fill-2402 recorded v1: fees moved 1002 units, v1 computes 1000`) (F24)",
    }],
};

/// Every set family F composes, in the order the reference lists them.
pub const ALL: [&Verbs; 11] = [
    &EVENTS,
    &WITHDRAWALS,
    &RULES,
    &NAIVE,
    &WORKERS,
    &NETWORK,
    &SPOT,
    &DEADLOCKS,
    &LOCKS,
    &RACES,
    &FAULTS,
];
