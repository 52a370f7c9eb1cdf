//! The external network of the withdrawal cases (cases F13–F16, SPEC §8), and the executor that talks
//! to it.
//!
//! - `net-standin` (binary): a stand-in for a blockchain-like network, a separate
//!   process with its own durable store (an SQLite file, `synchronous=FULL`). It accepts
//!   a broadcast by withdrawal id, idempotently (the same id twice is one transfer),
//!   answers a status query by id, lists its transfers (the evidence "one transfer out"
//!   seen from outside our database), and can be told to delay its next answers (until
//!   released), drop them after accepting, or refuse. It also reports incoming deposits
//!   with a number of confirmations, and can drop one (a reorganisation). See [`wire`]
//!   for the routes.
//! - `withdrawal-executor` (binary; its own process, not a task of `ledger-svc`): takes
//!   the outbox events of `frozen_balances::withdraw`, broadcasts with the withdrawal id,
//!   records `BROADCAST`, `FAILED` or `UNKNOWN`, and settles by a status query by id
//!   before anything else ([`executor`]). It also scans the network's deposits.
//! - [`client`]: the HTTP client of the stand-in, for the executor and the cases.

pub mod client;
pub mod executor;
pub mod wire;
