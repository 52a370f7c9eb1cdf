//! `Ctx::race` never hangs when some participants cannot connect: none of them starts its
//! body (a body that waits at the shared barrier would wait forever for the missing
//! ones), and the race reports the real cause.

use std::sync::Arc;
use std::time::Duration;

use case_kit::{Ctx, Env, Resource};
use scratch_pg::ClusterOptions;

/// Connections the small cluster accepts (superusers may also use the 3 reserved ones).
const MAX_CONNECTIONS: u32 = 8;
/// More racers than the cluster accepts.
const RACERS: usize = 16;
/// Far longer than a race that fails fast needs; a hang would run into it.
const RACE_DEADLINE_MS: u64 = 30_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_race_with_unconnectable_racers_fails_fast_and_runs_no_body() {
    let options = ClusterOptions {
        max_connections: MAX_CONNECTIONS,
        ..ClusterOptions::default()
    };
    let env = Env::for_tests_with(options, 1, &[&cases_ledger::family()])
        .await
        .expect("small cluster starts");
    let ctx = Ctx::new(
        env.clone(),
        "L",
        "RACE",
        Resource::Database("postgres".to_owned()),
    );

    let bodies_started = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = bodies_started.clone();
    let outcome = tokio::time::timeout(
        Duration::from_millis(RACE_DEADLINE_MS),
        ctx.race(RACERS, move |racer| {
            let counter = counter.clone();
            async move {
                counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                // The naive controls' shape: every participant meets here.
                racer.barrier.wait().await;
            }
        }),
    )
    .await
    .expect("the race ends instead of hanging");
    let error = outcome.expect_err("some racers cannot connect, so the race fails");
    let message = format!("{error:#}");
    assert!(message.contains("could not connect"), "{message}");
    assert!(
        message.contains("too many clients"),
        "the cause is reported: {message}"
    );
    assert_eq!(
        bodies_started.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "no participant started its body"
    );
}
