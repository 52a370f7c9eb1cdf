//! `explore` (`./run.sh explore`): see the crate documentation and docs/explore.md.
//!
//! Exit status: 0 when the checker found no violation, 1 when it found one, 2 on a
//! harness or usage error, 130/143/129 when interrupted (every process of the run is
//! stopped and the scratch cluster removed first).

use clap::Parser;
use explore::run::{Args, EXIT_ERROR, run};

fn main() {
    let args = Args::parse();
    if let Some(work) = &args.janitor_for {
        explore::patroni::janitor(work);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = runtime.block_on(async {
        tokio::select! {
            result = run(args) => match result {
                Ok(code) => code,
                Err(error) => {
                    eprintln!("explore error: {error:#}");
                    EXIT_ERROR
                }
            },
            code = interrupted() => code,
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_millis(500));
    std::process::exit(code);
}

/// Waits for SIGINT, SIGTERM or SIGHUP, stops the cluster and removes its folder, and
/// returns 128 + the signal. The service is a tied child (parent-death signal SIGKILL):
/// it dies with this process.
async fn interrupted() -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let mut interrupt = signal(SignalKind::interrupt()).expect("SIGINT handler");
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM handler");
    let mut hangup = signal(SignalKind::hangup()).expect("SIGHUP handler");
    let (name, code) = tokio::select! {
        _ = interrupt.recv() => ("SIGINT", 130),
        _ = terminate.recv() => ("SIGTERM", 143),
        _ = hangup.recv() => ("SIGHUP", 129),
    };
    eprintln!(
        "explore: {name} received; stopping ledger-svc and postgres (or the Patroni cluster)"
    );
    scratch_pg::cleanup_all_clusters();
    scratch_pg::patroni::cleanup_all();
    explore::patroni::cleanup();
    explore::power::cleanup();
    code
}
