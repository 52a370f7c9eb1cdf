//! The case kit: what every case of ledger-harness uses, whatever system it verifies.
//!
//! - [`Case`] and [`Family`]: a case owns its id, title and body; a family names its id
//!   prefix, its [`Engine`] (a PostgreSQL database per case cloned from the family's
//!   template, an SQLite file per case, or nothing), its cases and where its snapshots
//!   live (`evidence/snapshots/<prefix>/`).
//! - [`Ctx`]: the case's own database or file, connections, [`Ctx::race`] (N threads
//!   released by one barrier), checks and notes for the transcript (SPEC §7), the seeded
//!   rng, facts for the run record.
//! - [`server`]: the run's PostgreSQL, its scratch cluster or an existing server
//!   (databases under a unique prefix, dropped at the end).
//! - [`run_case`] and [`Env`]: one case on a fresh resource, with its share of the
//!   connection budget and a timeout; shared by the harness and the tests.
//! - [`redact`] and [`snapshot`]: the one redaction layer and the snapshot files.
//! - [`spec`]: cases as data, interleaving specs of sessions, steps and permutations,
//!   with lock waits read from PostgreSQL (`pg_blocking_pids`).
//! - [`locks`]: how many sessions wait for a lock at one moment, so a case proves a race
//!   by the queue it forced behind a lock it holds, not by a clock.
//! - [`lost`]: a lost response forced by events: the client gives up once the service is
//!   seen holding the committed answer at a fault point.
//! - [`proxy`]: an HTTP/1.1 TCP proxy that cuts answers and retries on its own.
//! - [`service`] and [`worker`]: the `ledger-svc` and `crash-worker` child processes,
//!   tied to the harness's life; under `--auth` the service gets kit-made bearer tokens
//!   and [`service::Service`] attaches the right one to each request.
//!
//! The kit knows no case and no system under test: the families live in the `cases`
//! crate, the systems in their own crates.

mod case;
mod ctx;
mod env;
pub mod locks;
pub mod lost;
mod mode;
pub mod process;
pub mod progress;
pub mod proxy;
mod race;
pub mod redact;
mod report;
mod rng;
mod runner;
pub mod server;
pub mod service;
pub mod snapshot;
pub mod spec;
pub mod worker;

pub use case::{
    Case, CaseBody, DEFAULT_CONNECTIONS, Engine, Family, InstallFn, PgTemplate, Schedule,
};
pub use ctx::{Ctx, Resource};
pub use env::{CONNECTION_HEADROOM, Env, EnvOptions};
pub use mode::{TRANSFER_MODE_ENV, TransferMode};
pub use race::{AbortOnDrop, Racer, connect_with, race};
pub use rand_chacha::ChaCha8Rng;
pub use report::{CaseReport, Check, Line};
pub use rng::seeded_rng;
pub use runner::{CASE_TIMEOUT_MS, run_case};
