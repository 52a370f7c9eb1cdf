//! The connection budget: concurrent cases never declare more connections together than
//! the cluster's `max_connections` (less the runner's headroom) allows. Cases built at
//! run time from closures (a `Case` owns its data) count how many of them are inside
//! their body at once. Where the budget lets two in together, each waits inside its
//! body until the other is seen there too (a count, not a timed overlap), so a loaded
//! machine that starts them apart cannot make them miss each other.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use case_kit::{CONNECTION_HEADROOM, Case, Engine, Env, Family, PgTemplate, run_case};
use futures_util::FutureExt;
use scratch_pg::ClusterOptions;

/// A budget of 8 connections.
const MAX_CONNECTIONS: u32 = CONNECTION_HEADROOM + 8;
/// How long each case stays inside its body once it saw the company it waits for, so
/// that a case the budget should have kept out would be seen.
const HOLD_MS: u64 = 300;
/// Longest wait inside a body for the company it expects: it only stops a hang (the
/// budget lets them in; a loaded machine gets them there later, never not).
const TOGETHER_WAIT_MS: u64 = 30_000;
/// How often a waiting body looks at the count.
const TOGETHER_POLL_MS: u64 = 5;

/// Counts bodies in flight and the most seen at once.
#[derive(Default)]
struct Overlap {
    now: AtomicUsize,
    most: AtomicUsize,
}

fn family(cases: Vec<Case>) -> Family {
    Family {
        prefix: "B",
        title: "budget test family",
        engine: Engine::Postgres(PgTemplate {
            template: "budget_template",
            install: |client| {
                async move {
                    client.batch_execute("CREATE TABLE t (n int)").await?;
                    Ok(())
                }
                .boxed()
            },
        }),
        cases,
        extras: Vec::new(),
        verbs: Vec::new(),
    }
}

/// A case that declares `connections`, enters its body, waits there until `together`
/// bodies have been seen inside at once (at most [`TOGETHER_WAIT_MS`]), then holds
/// [`HOLD_MS`] and leaves.
fn counting_case(id: String, connections: u32, together: usize, overlap: Arc<Overlap>) -> Case {
    Case::new(
        id.clone(),
        format!("holds {connections} connections"),
        move |ctx| {
            let overlap = overlap.clone();
            async move {
                let client = ctx.connect().await?;
                client.batch_execute("INSERT INTO t VALUES (1)").await?;
                let now = overlap.now.fetch_add(1, Ordering::SeqCst) + 1;
                overlap.most.fetch_max(now, Ordering::SeqCst);
                // The wait's limit only stops a hang; the test counts who was inside.
                let together_inside = async {
                    while overlap.most.load(Ordering::SeqCst) < together {
                        tokio::time::sleep(Duration::from_millis(TOGETHER_POLL_MS)).await;
                    }
                };
                let limit = Duration::from_millis(TOGETHER_WAIT_MS);
                let _ = tokio::time::timeout(limit, together_inside).await;
                tokio::time::sleep(Duration::from_millis(HOLD_MS)).await;
                overlap.now.fetch_sub(1, Ordering::SeqCst);
                ctx.check("ran", true, "");
                Ok(())
            }
            .boxed()
        },
    )
    .connections(connections)
}

/// Runs three cases that each declare `connections` at once, each waiting inside for
/// `together` bodies at once; returns the most that were inside their bodies together.
async fn most_at_once(env: &Arc<Env>, connections: u32, together: usize, label: &str) -> usize {
    let overlap = Arc::new(Overlap::default());
    let cases: Vec<Case> = (0..3)
        .map(|n| {
            counting_case(
                format!("B{label}{n}"),
                connections,
                together,
                overlap.clone(),
            )
        })
        .collect();
    let family = family(cases);
    let reports = futures_util::future::join_all(
        family
            .cases
            .iter()
            .map(|case| run_case(env.clone(), &family, case)),
    )
    .await;
    for report in &reports {
        assert_eq!(report.failed, 0, "{}", report.transcript());
    }
    overlap.most.load(Ordering::SeqCst)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_cases_stay_within_the_connection_budget() {
    let options = ClusterOptions {
        max_connections: MAX_CONNECTIONS,
        ..ClusterOptions::default()
    };
    let env = Env::for_tests_with(options, 1, &[&family(Vec::new())])
        .await
        .expect("cluster starts");
    assert_eq!(env.connection_budget(), 8);

    // 6 + 6 > 8: one at a time.
    assert_eq!(most_at_once(&env, 6, 1, "a").await, 1);
    // 4 + 4 = 8: two together (each waits until it sees the other), never three.
    assert_eq!(most_at_once(&env, 4, 2, "b").await, 2);
    // A case that declares more than the whole budget still runs (alone).
    assert_eq!(most_at_once(&env, 50, 1, "c").await, 1);
}
