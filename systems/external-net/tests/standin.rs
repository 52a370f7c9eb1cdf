//! The stand-in as its own process: broadcasts are idempotent by id, a dropped answer
//! still leaves the transfer stored (a query by id finds it), and a stand-in restarted
//! on the same store still knows every id. The executor binary is built and answers
//! `--help`. (These tests also make `cargo test` build both binaries, which the F
//! withdrawal cases start.)

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use external_net::client::{Answer, NetClient};
use external_net::wire::{Action, Broadcast, ControlRequest, MAX_DELAY_MS};

/// Bound of one request in these tests.
const REQUEST_TIMEOUT_MS: u64 = 5_000;

/// A running `net-standin`, killed on drop.
struct StandIn {
    child: Child,
    client: NetClient,
}

impl StandIn {
    fn start(store: &std::path::Path) -> StandIn {
        let mut child = Command::new(env!("CARGO_BIN_EXE_net-standin"))
            .arg("--store")
            .arg(store)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("net-standin starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("address line");
        let address = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_owned();
        let client = NetClient::new(format!("http://{address}")).expect("client");
        StandIn { child, client }
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn broadcast(id: &str) -> Broadcast {
    Broadcast {
        id: id.into(),
        destination: "addr-test".into(),
        asset: "BTC".into(),
        amount: 1_000,
    }
}

#[tokio::test]
async fn broadcasts_are_idempotent_and_survive_a_lost_answer_and_a_restart() {
    let dir = std::env::temp_dir().join(format!("net-standin-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = dir.join("net.sqlite");
    let timeout = Duration::from_millis(REQUEST_TIMEOUT_MS);
    {
        let net = StandIn::start(&store);
        let first = net.client.broadcast(&broadcast("w-1"), timeout).await;
        assert!(matches!(first, Answer::Accepted { new: true }), "{first:?}");
        let again = net.client.broadcast(&broadcast("w-1"), timeout).await;
        assert!(
            matches!(again, Answer::Accepted { new: false }),
            "{again:?}"
        );

        net.client
            .control(&ControlRequest {
                action: Action::Drop,
                delay_ms: 0,
                count: 1,
            })
            .await
            .unwrap();
        let dropped = net.client.broadcast(&broadcast("w-2"), timeout).await;
        assert!(matches!(dropped, Answer::Lost(_)), "{dropped:?}");
        assert_eq!(net.client.status("w-2").await.unwrap(), "CONFIRMED");
        assert_eq!(net.client.status("w-9").await.unwrap(), "NOT_FOUND");
    }
    let net = StandIn::start(&store);
    assert_eq!(net.client.status("w-1").await.unwrap(), "CONFIRMED");
    let transfers = net.client.transfers().await.unwrap();
    let ids: Vec<&str> = transfers.iter().map(|t| t.id.as_str()).collect();
    assert_eq!(ids, ["w-1", "w-2"], "one transfer per id: {transfers:?}");
    drop(net);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A delay far longer than the test: `release` ends it, and the answer arrives before
/// the client's timeout (half the delay) could run out.
#[tokio::test]
async fn a_release_ends_a_held_answer_at_once() {
    let dir = std::env::temp_dir().join(format!("net-standin-release-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let net = StandIn::start(&dir.join("net.sqlite"));
    net.client
        .control(&ControlRequest {
            action: Action::Delay,
            delay_ms: MAX_DELAY_MS,
            count: 1,
        })
        .await
        .unwrap();
    let client = net.client.clone();
    let held = tokio::spawn(async move {
        client
            .broadcast(&broadcast("w-3"), Duration::from_millis(MAX_DELAY_MS / 2))
            .await
    });
    while net.client.control_state().await.unwrap().holding == 0 {
        assert!(!held.is_finished(), "answered before it was held");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    net.client.release_held().await.unwrap();
    let answer = held.await.unwrap();
    assert!(
        matches!(answer, Answer::Accepted { new: true }),
        "{answer:?}"
    );
    assert_eq!(net.client.control_state().await.unwrap().holding, 0);
    drop(net);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_executor_binary_is_built_and_answers_help() {
    let output = Command::new(env!("CARGO_BIN_EXE_withdrawal-executor"))
        .arg("--help")
        .output()
        .expect("withdrawal-executor runs");
    assert!(output.status.success());
    assert!(String::from_utf8_lossy(&output.stdout).contains("Usage"));
}
