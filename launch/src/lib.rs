//! Launching the processes of our systems for a case, each tied to the harness's life
//! (killed with it, even by `kill -9`, see `case_kit::process`):
//!
//! - [`service`]: `ledger-svc` on the case's database, with its callers; under `--auth`
//!   the service gets kit-made bearer tokens and [`service::Service`] attaches the right
//!   one to each request.
//! - [`worker`]: the `crash-worker`, stopped at a named hook point and killed there.
//! - [`lock_waits`]: whether the requests steps sent to the service all wait (held at a
//!   fault point, or its backend waiting for a lock).
//! - [`lost`]: a lost response forced by events: the client gives up once the service is
//!   seen holding the committed answer at a fault point.
//! - [`network`]: the external network's stand-in (`net-standin`) and the
//!   `withdrawal-executor` of F13–F16.
//! - [`power`]: a disk that forgets what was never synced, a cluster on it, and the
//!   power cut (SIGKILL of every postgres process, the drop, crash recovery).
//! - [`proxy`]: an HTTP/1.1 TCP proxy in front of a service that cuts answers and retries
//!   on its own.
//!
//! The kit (`case-kit`) knows none of these; the case families use them.

pub mod lock_waits;
pub mod lost;
pub mod network;
pub mod power;
pub mod proxy;
pub mod service;
pub mod worker;
