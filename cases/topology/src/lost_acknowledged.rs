//! R2's negative controls: the schedule R2 forces, with one design the product does not
//! have, loses acknowledged debits at the failover.
//!
//! - [`Fault::TrustedCancelledCommit`]: the service's earlier rule (`--planted-bug
//!   trust-cancelled-commit`: a COMMIT that succeeds after the server's warning is
//!   trusted). The group's COMMITs are seen waiting for the stopped standby, a DBA
//!   cancels the waits (`pg_cancel_backend`), each COMMIT returns success with
//!   `WARNING: canceling wait for synchronous replication due to user request`, and the
//!   service answers 201 for commits that exist only on the primary.
//! - [`Fault::AsynchronousStandby`]: the same group against an asynchronous standby:
//!   no COMMIT waits for it, every debit is answered 201 at once.
//!
//! Either way the promoted standby holds none of the group: every acknowledged debit is
//! lost, and the check names them. Without its fault (the service as built; a
//! synchronous standby) the same schedule acknowledges none of them and loses nothing,
//! so the control's `exposes` check fails (`tests/controls.rs`).

use std::sync::Arc;

use case_kit::Ctx;
use points_ledger::TransferMode;
use scratch_pg::Replication;

use crate::debit_groups::{self, GROUP_SIZE};
use crate::pair;
use crate::r2_sync_failover::{Bounds, grant_all, launch_service};
use crate::syncrep;

/// The design a control runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The service trusts a COMMIT's success after the server's warning.
    TrustedCancelledCommit,
    /// The standby is asynchronous.
    AsynchronousStandby,
}

impl Fault {
    fn label(self) -> &'static str {
        match self {
            Fault::TrustedCancelledCommit => "trusted cancelled commit",
            Fault::AsynchronousStandby => "asynchronous standby",
        }
    }

    /// The name of its group of debits (`k-r2-<group>-<n>`).
    fn group(self) -> &'static str {
        match self {
            Fault::TrustedCancelledCommit => "trusted",
            Fault::AsynchronousStandby => "async",
        }
    }

    /// The anomaly its control exposes: `acknowledged debits lost at failover (<label>)`.
    pub fn anomaly(self) -> String {
        format!("acknowledged debits lost at failover ({})", self.label())
    }
}

/// Runs one control on a pair of its own: `fault`'s design (or, with `with_fault` false,
/// the product as built: the controls test), the standby's receiver stopped, a group of
/// debits (their waits cancelled where they wait), the failover, and the acknowledged
/// debits missing on the promoted node, named.
///
/// Errors: a node or the service did not start; SQL errors; a state not seen in time.
pub async fn run(
    ctx: &mut Ctx,
    fault: Fault,
    with_fault: bool,
    mode: TransferMode,
) -> anyhow::Result<()> {
    let replication = match fault {
        Fault::AsynchronousStandby if with_fault => Replication::Asynchronous,
        _ => Replication::Synchronous,
    };
    let pair = pair::start_pair(ctx, replication).await?;
    grant_all(mode, &pair.primary).await?;
    let url = pair::multi_host_url(&[&pair.primary, &pair.standby]);
    let planted = with_fault && fault == Fault::TrustedCancelledCommit;
    let name = format!("ledger-svc-{}", fault.group());
    let service = Arc::new(launch_service(ctx, &url, &name, mode, Bounds::LONG, planted).await?);
    syncrep::stop_receiver(&pair.standby).await?;
    let keys = debit_groups::keys(fault.group());
    let sending = debit_groups::send(&service, mode, &keys).await?;
    if replication == Replication::Synchronous {
        let sessions = if mode == TransferMode::Batch {
            1
        } else {
            GROUP_SIZE
        };
        syncrep::waiting_on_standby(&pair.primary, sessions).await?;
        syncrep::cancel_waiting(&pair.primary).await?;
    }
    let answers = sending.await?;
    let acknowledged: Vec<String> = keys
        .iter()
        .zip(&answers)
        .filter(|(_, answer)| answer.acknowledged())
        .map(|(key, _)| key.clone())
        .collect();
    let promoted = syncrep::fail_over(pair).await?;
    let lost = syncrep::missing_on(&promoted, debit_groups::CLIENT, &acknowledged).await?;
    ctx.note(format!(
        "control {}: answers {}",
        fault.label(),
        debit_groups::tally(&answers)
    ));
    ctx.exposes(
        fault.anomaly(),
        lost.len() == GROUP_SIZE,
        format!(
            "{}: lost={} keys={}",
            fault.label(),
            lost.len(),
            lost.join(",")
        ),
    );
    Ok(())
}
