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
//!   with waits read from PostgreSQL (`pg_isolation_test_session_is_blocked`), in our format
//!   or PostgreSQL's own.
//! - [`locks`]: how many sessions wait for a lock at one moment, so a case proves a race
//!   by the queue it forced behind a lock it holds, not by a clock.
//! - [`options`]: the run's choices for a system (the ledger's transfer mode), carried
//!   as their own types without the kit knowing them.
//! - [`process`]: child processes tied to the harness's life, and finding binaries.
//!
//! The kit knows no case and no system under test: the families live in the crates under
//! `cases/`, the systems under `systems/`, and the launching of the systems' processes
//! (ledger-svc, crash-worker, the fault proxy) in `launch/`.

mod case;
mod ctx;
mod engine;
mod env;
pub mod locks;
pub mod options;
mod per_case;
pub mod process;
pub mod progress;
mod race;
pub mod redact;
mod report;
mod resource;
mod rng;
mod runner;
mod schedule;
pub mod server;
mod setup;
pub mod snapshot;
pub mod spec;

pub use case::{Case, CaseBody, DEFAULT_CONNECTIONS, Family, in_id_order};
pub use ctx::{Ctx, ServerRestart};
pub use engine::{Engine, InstallFn, PgTemplate};
pub use env::{CONNECTION_HEADROOM, Env, EnvOptions};
pub use options::Choices;
pub use per_case::PerCase;
pub use race::{AbortOnDrop, Racer, connect_with, drop_if_free, race};
pub use rand_chacha::ChaCha8Rng;
pub use report::{CaseReport, Check, Compared, Line};
pub use resource::Resource;
pub use rng::seeded_rng;
pub use runner::{CASE_TIMEOUT_MS, run_case};
pub use schedule::Schedule;
