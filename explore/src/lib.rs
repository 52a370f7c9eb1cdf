//! `./run.sh explore`: random workloads, a nemesis and an independent history checker
//! (SPEC §10).
//!
//! - [`plan`]: the seeded schedules (each client's operations, the nemesis's faults).
//! - [`client`]: the clients and the [`client::Gateway`] all their HTTP goes through.
//! - [`nemesis`]: kills and restarts the service, crashes PostgreSQL, pauses transfers,
//!   withholds responses, cuts the power (`--power-cut`).
//! - [`power`]: `--power-cut`'s forgetful disk under the data directory.
//! - [`patroni`]: `--topology patroni`'s cluster, its faults and its janitor.
//! - [`history`]: the JSON-lines history.
//! - [`state`] and [`checker`]: the final database read with the checker's own queries,
//!   and the properties checked against the history.
//! - [`report`]: summary table, report, timeline picture.
//! - [`run`]: one exploration run, end to end.

pub mod checker;
pub mod client;
pub mod history;
pub mod nemesis;
pub mod patroni;
pub mod plan;
pub mod power;
pub mod report;
pub mod run;
pub mod state;
