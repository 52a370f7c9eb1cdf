//! The nemesis: runs the seeded fault schedule ([`crate::plan::fault_plan`]) one fault
//! at a time, each logged in the history with its start and end:
//!
//! - `kill-service`: SIGKILL ledger-svc (`launch::service`'s [`Service::kill`]), wait, start a
//!   new one on the same database (new ports; the gateway follows);
//! - `crash-postgres`: immediate stop of the scratch cluster (no checkpoint), wait,
//!   start it again, which runs WAL recovery (scratch-pg's `stop(Immediate)` and
//!   `start_again`);
//! - `pause`: the next transfer to pass a hook point inside its transaction waits there
//!   (`PUT /faults/{point}` `pause`), then is released;
//! - `withhold`: the next transfer commits, then its response is withheld past the
//!   client's timeout and the connection closed (`after-commit` `close`);
//! - `power-cut` (`--power-cut` only): SIGKILL of the service and of every postgres
//!   process, the forgetful disk's unsynced data dropped, wait, crash recovery, a new
//!   service;
//! - `kill-leader`, `pause-leader`, `stop-standby`, `switchover` (`--topology patroni`
//!   only): the Patroni cluster's faults, each until the cluster is healthy again
//!   ([`crate::patroni`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use launch::power::PowerDisk;
use launch::service::{Service, ServiceOptions};
use scratch_pg::patroni::PatroniCluster;
use scratch_pg::{Cluster, StopMode};
use serde_json::json;

use crate::client::Gateway;
use crate::history::{Event, HistoryWriter, Phase};
use crate::plan::{FaultKind, PlannedFault};

/// Extra time a pause may hold beyond its planned hold, should the release be late,
/// milliseconds.
const PAUSE_SAFETY_MS: u64 = 1_000;
/// Time after a withheld response's hold before the fault is cleared, milliseconds.
const WITHHOLD_SETTLE_MS: u64 = 200;
/// Attempts to start the service again after a kill before the run fails.
const RESTART_ATTEMPTS: u32 = 3;

/// How to start the service (again).
#[derive(Clone)]
pub struct Launch {
    /// The database URL.
    pub database_url: String,
    /// The log file every service of the run appends to.
    pub log_path: PathBuf,
    /// Options (fault injection on; the planted bug, if any).
    pub options: ServiceOptions,
}

impl Launch {
    /// Starts a service and waits until it is ready.
    ///
    /// Errors: it did not start after [`RESTART_ATTEMPTS`] tries.
    pub async fn start(&self) -> anyhow::Result<Service> {
        let mut last = None;
        for _ in 0..RESTART_ATTEMPTS {
            match Service::launch(
                &self.database_url,
                self.log_path.clone(),
                self.options.clone(),
            )
            .await
            {
                Ok(service) => return Ok(service),
                Err(error) => last = Some(error),
            }
        }
        Err(last.expect("at least one attempt")).context("starting ledger-svc")
    }
}

/// The nemesis and what it controls.
pub struct Nemesis {
    /// The scratch cluster (locked only inside blocking tasks); `None` on a Patroni
    /// cluster.
    pub cluster: Option<Arc<Mutex<Cluster>>>,
    /// The Patroni cluster (`--topology patroni`), else `None`.
    pub patroni: Option<Arc<Mutex<PatroniCluster>>>,
    /// The run's database (where `stop-standby` looks for COMMITs waiting).
    pub database: String,
    /// How to restart the service.
    pub launch: Launch,
    /// The running service (`None` only inside a kill).
    pub service: Option<Service>,
    /// Where the clients send.
    pub gateway: Arc<Gateway>,
    /// The history.
    pub history: Arc<HistoryWriter>,
    /// The forgetful disk under the data directory (`--power-cut`), else `None`.
    pub disk: Option<PowerDisk>,
}

impl Nemesis {
    /// Runs `plan` from `started` until `deadline`: each fault at its planned time, or
    /// at once when the previous one ran late; none starts after the deadline.
    ///
    /// Errors: the service or PostgreSQL could not be brought back.
    pub async fn run(
        &mut self,
        plan: &[PlannedFault],
        started: Instant,
        deadline: Instant,
    ) -> anyhow::Result<()> {
        for fault in plan {
            let at = started + Duration::from_millis(fault.at_ms);
            tokio::time::sleep_until(at.into()).await;
            if Instant::now() >= deadline {
                break;
            }
            self.inject(fault).await?;
        }
        Ok(())
    }

    fn record(
        &self,
        fault: &PlannedFault,
        phase: Phase,
        detail: Option<String>,
        effective: Option<bool>,
    ) {
        self.history.record(|t_us| Event::Nemesis {
            t_us,
            fault: fault.index,
            kind: fault.kind,
            phase,
            point: fault.point.clone(),
            hold_ms: fault.hold_ms,
            detail,
            effective,
        });
    }

    async fn inject(&mut self, fault: &PlannedFault) -> anyhow::Result<()> {
        self.record(fault, Phase::Start, None, None);
        let hold = Duration::from_millis(fault.hold_ms);
        let (detail, effective) = match fault.kind {
            FaultKind::KillService => {
                self.gateway.set(None);
                let status = match self.service.take() {
                    Some(service) => service.kill()?.to_string(),
                    None => "no service".to_owned(),
                };
                tokio::time::sleep(hold).await;
                let service = self.launch.start().await?;
                self.gateway.set(Some(&service));
                self.service = Some(service);
                (format!("killed: {status}; restarted"), true)
            }
            FaultKind::CrashPostgres => {
                let cluster = self.single()?;
                tokio::task::spawn_blocking(move || {
                    cluster
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .stop(StopMode::Immediate)
                })
                .await?
                .context("immediate stop of PostgreSQL")?;
                tokio::time::sleep(hold).await;
                let cluster = self.single()?;
                let recovery = Instant::now();
                tokio::task::spawn_blocking(move || {
                    cluster
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .start_again()
                })
                .await?
                .context("starting PostgreSQL after an immediate stop")?;
                (
                    format!(
                        "immediate stop; started again (WAL recovery) recovery_ms={}",
                        recovery.elapsed().as_millis()
                    ),
                    true,
                )
            }
            FaultKind::PowerCut => (self.power_cut(hold).await?, true),
            FaultKind::Pause | FaultKind::Withhold => self.hook_fault(fault, hold).await,
            FaultKind::KillLeader
            | FaultKind::PauseLeader
            | FaultKind::StopStandby
            | FaultKind::Switchover => self.cluster_fault(fault.kind).await?,
        };
        self.record(fault, Phase::End, Some(detail), Some(effective));
        Ok(())
    }

    /// The power cut: SIGKILL of the service, then of the postmaster and every backend,
    /// the disk's unsynced data dropped, `hold` down, PostgreSQL started (crash
    /// recovery) and a new service. Returns the detail for the history.
    ///
    /// Errors: no disk (the run was not started with `--power-cut`), or PostgreSQL or
    /// the service could not be started again.
    async fn power_cut(&mut self, hold: Duration) -> anyhow::Result<String> {
        let Some(disk) = &self.disk else {
            anyhow::bail!("power-cut planned without a forgetful disk");
        };
        self.gateway.set(None);
        let status = match self.service.take() {
            Some(service) => service.kill()?.to_string(),
            None => "no service".to_owned(),
        };
        let cluster = self.single()?;
        let killed = tokio::task::spawn_blocking(move || {
            cluster.lock().unwrap_or_else(|p| p.into_inner()).kill_all()
        })
        .await?;
        let dropped = disk.cut(None);
        tokio::time::sleep(hold).await;
        let cluster = self.single()?;
        tokio::task::spawn_blocking(move || {
            cluster
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .start_after_crash()
        })
        .await?
        .context("starting PostgreSQL after a power cut (crash recovery)")?;
        let service = self.launch.start().await?;
        self.gateway.set(Some(&service));
        self.service = Some(service);
        Ok(format!(
            "killed service ({status}) and {killed} postgres processes; {dropped}; started again (crash recovery)"
        ))
    }

    /// A pause or a withhold: arm, hold, release, read whether it fired, clear. A
    /// service that does not answer (it should; the faults run one at a time) makes
    /// the fault one without effect.
    async fn hook_fault(&self, fault: &PlannedFault, hold: Duration) -> (String, bool) {
        let Some(service) = &self.service else {
            return ("no service".to_owned(), false);
        };
        let point = fault.point.clone().unwrap_or_default();
        let spec = match fault.kind {
            FaultKind::Pause => {
                json!({"action": "pause", "hold_ms": fault.hold_ms + PAUSE_SAFETY_MS, "count": 1})
            }
            _ => json!({"action": "close", "hold_ms": fault.hold_ms, "count": 1}),
        };
        if let Err(error) = service.arm_fault(&point, spec).await {
            return (format!("not armed: {error:#}"), false);
        }
        match fault.kind {
            FaultKind::Pause => {
                tokio::time::sleep(hold).await;
                let _ = service.release_fault(&point).await;
            }
            _ => tokio::time::sleep(hold + Duration::from_millis(WITHHOLD_SETTLE_MS)).await,
        }
        let fired = service
            .fault_state(&point)
            .await
            .map(|state| state.fired)
            .unwrap_or(0);
        let _ = service
            .send(
                service
                    .http()
                    .delete(service.admin_url(&format!("/faults/{point}"))),
            )
            .await;
        (format!("fired={fired}"), fired > 0)
    }

    /// The single server, or an error on a Patroni cluster (its faults are not planned
    /// there).
    fn single(&self) -> anyhow::Result<Arc<Mutex<Cluster>>> {
        self.cluster
            .clone()
            .context("a single server's fault planned on a Patroni cluster")
    }

    /// A Patroni cluster's fault ([`crate::patroni`]), run until the cluster is healthy
    /// again: the history's detail and whether it took effect (all but a `stop-standby`
    /// that saw no COMMIT waiting do).
    ///
    /// Errors: no Patroni cluster, or the fault's own (no leader, not healthy again
    /// within the hang bound).
    async fn cluster_fault(&self, kind: FaultKind) -> anyhow::Result<(String, bool)> {
        let cluster =
            (self.patroni.clone()).context("a Patroni fault without a Patroni cluster")?;
        let run = |work: fn(&mut PatroniCluster) -> anyhow::Result<String>| {
            crate::patroni::blocking(&cluster, work)
        };
        Ok(match kind {
            FaultKind::KillLeader => (run(crate::patroni::kill_leader).await?, true),
            FaultKind::PauseLeader => (run(crate::patroni::pause_leader).await?, true),
            FaultKind::Switchover => (run(crate::patroni::switchover).await?, true),
            _ => crate::patroni::stop_standby(&cluster, &self.database).await?,
        })
    }

    /// After the load: PostgreSQL running (a single server started again; a Patroni
    /// cluster healthy) and a service up (both are, between faults).
    ///
    /// Errors: either could not be had.
    pub async fn restore(&mut self) -> anyhow::Result<()> {
        if let Some(cluster) = self.cluster.clone() {
            tokio::task::spawn_blocking(move || {
                cluster
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .start_again()
            })
            .await??;
        }
        if let Some(cluster) = &self.patroni {
            crate::patroni::blocking(cluster, |c| crate::patroni::wait_healthy(c)).await?;
        }
        if self.service.is_none() {
            let service = self.launch.start().await?;
            self.gateway.set(Some(&service));
            self.service = Some(service);
        }
        Ok(())
    }
}
