//! The worker's spot mode (`crash-worker spot …`, SPEC §8, case F12): the same protocol
//! as the ledger mode, for one order placement (`frozen_balances::place`) on a
//! PostgreSQL database with the spot tables.
//!
//! `crash-worker spot --database-url U --tenant T --business-id B --account A --market M
//! --side S --quantity Q --price P [--stop-at P] [--pause-limit-ms N]` places the order
//! and, at the stop point (`registered`, `balances-updated`, `before-commit`,
//! `after-commit`; default `before-commit`), prints `PAUSED_IN_TX backend_pid=<pid>` and
//! waits to be killed, bounded by `--pause-limit-ms` (then it gives up: rolled back
//! unless the point is `after-commit`, exit status 3). A placement that does not pass
//! the point (a replay, or a refusal at `balances-updated`) completes and prints
//! `RESULT outcome=<outcome> replayed=<bool> order_id=<id or ->`.
//!
//! Everything is bounded by the pause limit plus [`crate::WORK_LIMIT_MS`].

use std::ffi::OsString;
use std::time::Duration;

use anyhow::Context as _;
use clap::Parser;
use frozen_balances::amount::{parse_price, parse_quantity};
use frozen_balances::{
    DEFAULT_TENANT, FrozenError, HookAbort, HookContext, HookPoint, Hooks, Market, PlaceRequest,
    Side,
};

use crate::{BoxFuture, EXIT_FAILED, EXIT_PAUSE_LIMIT, EXIT_WORK_LIMIT, PAUSE_LIMIT_MS};

/// One placement, stopped at a hook point until killed.
#[derive(Debug, Parser)]
#[command(name = "crash-worker spot", bin_name = "crash-worker spot", version)]
struct SpotArgs {
    /// Connection URL of a database with the spot tables.
    #[arg(long)]
    database_url: String,
    /// Tenant.
    #[arg(long, default_value = DEFAULT_TENANT)]
    tenant: String,
    /// The placement's business id.
    #[arg(long)]
    business_id: String,
    /// The trader's account.
    #[arg(long)]
    account: String,
    /// BTC-USDT or ETH-USDT.
    #[arg(long, default_value = "BTC-USDT")]
    market: Market,
    /// BUY or SELL.
    #[arg(long)]
    side: Side,
    /// Quantity, decimal text in the base asset.
    #[arg(long)]
    quantity: String,
    /// Limit price, decimal text in the quote asset per whole base coin.
    #[arg(long)]
    price: String,
    /// Hook point to stop at.
    #[arg(long, default_value = "before-commit")]
    stop_at: HookPoint,
    /// How long to wait at the stop point before giving up, in milliseconds.
    #[arg(long, default_value_t = PAUSE_LIMIT_MS)]
    pause_limit_ms: u64,
}

/// Entry point of `crash-worker spot …`; `argv` includes the program name and `spot`.
/// Returns the exit status.
pub(crate) fn main(argv: Vec<OsString>) -> i32 {
    let mut argv = argv;
    argv.remove(1);
    let args = match SpotArgs::try_parse_from(argv) {
        Ok(args) => args,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() { 2 } else { 0 };
        }
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let limit_ms = args.pause_limit_ms.saturating_add(crate::WORK_LIMIT_MS);
    runtime.block_on(async {
        match tokio::time::timeout(Duration::from_millis(limit_ms), work(&args)).await {
            Ok(Ok(code)) => code,
            Ok(Err(error)) => {
                eprintln!("crash-worker spot: {error:#}");
                EXIT_FAILED
            }
            Err(_) => {
                eprintln!("crash-worker spot: gave up after limit_ms={limit_ms}");
                EXIT_WORK_LIMIT
            }
        }
    })
}

async fn work(args: &SpotArgs) -> anyhow::Result<i32> {
    let (mut client, backend_pid) = crate::connect(&args.database_url).await?;
    let request = PlaceRequest {
        tenant_id: args.tenant.clone(),
        business_id: args.business_id.clone(),
        account_id: args.account.clone(),
        market: args.market,
        side: args.side,
        quantity: parse_quantity(args.market, &args.quantity).context("--quantity")?,
        limit_price: parse_price(args.market, &args.price).context("--price")?,
    };
    let hooks = StopAt {
        point: args.stop_at,
        stop: crate::Stop::new(backend_pid, args.pause_limit_ms),
    };
    match frozen_balances::place(&mut client, &request, &hooks).await {
        Ok(result) => {
            println!(
                "RESULT outcome={} replayed={} order_id={}",
                result.outcome.as_str(),
                result.replayed,
                result
                    .order_id
                    .map_or_else(|| "-".to_string(), |id| id.to_string())
            );
            Ok(0)
        }
        Err(FrozenError::HookAborted(point)) if hooks.stop.waited_out() => {
            let state = if point == HookPoint::AfterCommit {
                "the placement stays committed"
            } else {
                "the transaction was rolled back"
            };
            eprintln!(
                "crash-worker spot: not killed within pause_limit_ms={} at {point}; {state}",
                args.pause_limit_ms
            );
            Ok(EXIT_PAUSE_LIMIT)
        }
        Err(error) => Err(error).context("placement"),
    }
}

/// Stops at one point of the placement (the ledger mode's [`crate::Stop`]).
struct StopAt {
    point: HookPoint,
    stop: crate::Stop,
}

impl Hooks for StopAt {
    fn at<'a>(&'a self, ctx: HookContext<'a>) -> BoxFuture<'a, Result<(), HookAbort>> {
        Box::pin(async move {
            if ctx.point != self.point {
                return Ok(());
            }
            self.stop.pause().await.map_err(HookAbort::new)
        })
    }
}
