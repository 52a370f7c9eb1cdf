//! `withdrawal-executor`: the executor of `frozen_balances::withdraw`, its own process
//! (not a task of `ledger-svc`), so a case can SIGKILL it at a hook point and start a
//! new one. Logic in `external_net::executor`.
//!
//! ```sh
//! withdrawal-executor run --database-url URL --network-url http://127.0.0.1:PORT \
//!     [--answer-timeout-ms 5000] [--stop-at after-unknown|after-broadcast] [--pause-limit-ms 30000] \
//!     [--retry-under-new-id]
//! withdrawal-executor scan-deposits --database-url URL --network-url URL --required-confirmations N
//! ```
//!
//! `run` works until no outbox event is left, printing one line per step, and exits 0.
//! At `--stop-at` it prints `PAUSED_IN_TX point=<point> withdrawal=<id>
//! in_transaction=false` (the crash-worker's marker, so the kit's handle waits for it;
//! no transaction is open there) and waits to be killed, at most `--pause-limit-ms`,
//! then exits with status 3. Errors exit with status 1.

use std::io::Write as _;
use std::time::Duration;

use clap::{Parser, Subcommand};
use external_net::client::NetClient;
use external_net::executor::{self, DEFAULT_ANSWER_TIMEOUT_MS, Ended, Options, StopPoint};

/// Exit status after a pause that was not ended by a kill (as the crash-worker's).
const EXIT_PAUSE_LIMIT: i32 = 3;
/// Default longest pause at the stop point, milliseconds.
const DEFAULT_PAUSE_LIMIT_MS: u64 = 30_000;

#[derive(Parser, Debug)]
#[command(
    about = "Withdrawal executor: outbox → broadcast by id → BROADCAST/UNKNOWN → query by id → settle"
)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Debug)]
struct Common {
    /// The frozen-balances database.
    #[arg(long)]
    database_url: String,
    /// The network stand-in, `http://127.0.0.1:PORT`.
    #[arg(long)]
    network_url: String,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Move every pending withdrawal on until none is left.
    Run {
        #[command(flatten)]
        common: Common,
        /// How long a broadcast waits for its answer, milliseconds.
        #[arg(long, default_value_t = DEFAULT_ANSWER_TIMEOUT_MS)]
        answer_timeout_ms: u64,
        /// Stop here and wait to be killed (`after-unknown`, `after-broadcast`).
        #[arg(long)]
        stop_at: Option<StopPoint>,
        /// Longest wait at the stop point, milliseconds.
        #[arg(long, default_value_t = DEFAULT_PAUSE_LIMIT_MS)]
        pause_limit_ms: u64,
        /// The naive executor (negative control): retry a lost broadcast under a new id.
        #[arg(long)]
        retry_under_new_id: bool,
    },
    /// Apply the network's deposit reports once.
    ScanDeposits {
        #[command(flatten)]
        common: Common,
        /// Confirmations at which a deposit is credited.
        #[arg(long)]
        required_confirmations: u32,
    },
}

/// A session that ends at the server's first WARNING (`pg_session`): a COMMIT whose wait
/// for the synchronous standby was cancelled fails here as a closed connection, so the
/// executor never calls the network on a record a failover may take away.
async fn connect(url: &str) -> anyhow::Result<tokio_postgres::Client> {
    let config: tokio_postgres::Config = url.parse()?;
    let (client, _driver) = pg_session::connect(&config, "withdrawal-executor", false).await?;
    Ok(client)
}

fn emit(line: String) {
    println!("{line}");
    let _ = std::io::stdout().flush();
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let code = match real_main().await {
        Ok(code) => code,
        Err(error) => {
            eprintln!("withdrawal-executor: {error:#}");
            1
        }
    };
    std::process::exit(code);
}

async fn real_main() -> anyhow::Result<i32> {
    match Args::parse().command {
        Command::Run {
            common,
            answer_timeout_ms,
            stop_at,
            pause_limit_ms,
            retry_under_new_id,
        } => {
            let mut db = connect(&common.database_url).await?;
            let net = NetClient::new(common.network_url)?;
            let options = Options {
                answer_timeout: Duration::from_millis(answer_timeout_ms),
                stop_at,
                retry_under_new_id,
            };
            match executor::run(&mut db, &net, &options, &mut emit).await? {
                Ended::Idle => {
                    emit("IDLE".into());
                    Ok(0)
                }
                Ended::Stopped(withdrawal) => {
                    emit(format!(
                        "PAUSED_IN_TX point={} withdrawal={withdrawal} in_transaction=false",
                        stop_at.map_or("none", executor::StopPoint::name)
                    ));
                    tokio::time::sleep(Duration::from_millis(pause_limit_ms)).await;
                    Ok(EXIT_PAUSE_LIMIT)
                }
            }
        }
        Command::ScanDeposits {
            common,
            required_confirmations,
        } => {
            let mut db = connect(&common.database_url).await?;
            let net = NetClient::new(common.network_url)?;
            executor::scan_deposits(&mut db, &net, required_confirmations, &mut emit).await?;
            Ok(0)
        }
    }
}
