//! The scratch cluster's lifecycle against a real PostgreSQL 16.

use scratch_pg::{Cluster, ClusterOptions, StopMode};

fn process_alive(pid: u32) -> bool {
    // A reaped process has no /proc entry; a zombie would show state Z.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.contains(") Z "),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_restart_keeps_committed_and_drops_uncommitted() {
    let mut cluster = Cluster::start(ClusterOptions::default()).expect("cluster starts");
    let facts = cluster.server_facts().await.unwrap();
    assert!(facts.server_version.starts_with("16."), "{facts:?}");
    assert_eq!(
        (
            facts.fsync.as_str(),
            facts.synchronous_commit.as_str(),
            facts.full_page_writes.as_str()
        ),
        ("on", "on", "on")
    );

    cluster.create_database("life", None).await.unwrap();
    let committed = cluster.connect("life").await.unwrap();
    committed
        .batch_execute("CREATE TABLE t(v text); INSERT INTO t VALUES ('committed')")
        .await
        .unwrap();
    let uncommitted = cluster.connect("life").await.unwrap();
    uncommitted
        .batch_execute("BEGIN; INSERT INTO t VALUES ('uncommitted')")
        .await
        .unwrap();

    let port_before = cluster.port();
    cluster
        .restart_immediate()
        .expect("restart with WAL recovery");
    assert_eq!(cluster.port(), port_before, "clients keep their address");
    assert!(
        cluster
            .log_tail()
            .contains("database system was interrupted")
            || cluster.log_tail().contains("redo"),
        "the log shows recovery:\n{}",
        cluster.log_tail()
    );
    assert!(uncommitted.is_closed() || uncommitted.simple_query("SELECT 1").await.is_err());

    let client = cluster.connect("life").await.unwrap();
    let rows: Vec<String> = client
        .query("SELECT v FROM t ORDER BY v", &[])
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    assert_eq!(rows, vec!["committed".to_string()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_leaves_no_process_and_drop_no_folder() {
    let mut cluster = Cluster::start(ClusterOptions::default()).expect("cluster starts");
    let pid = cluster.postmaster_pid().unwrap();
    let dir = cluster.dir().to_path_buf();
    let client = cluster.connect("postgres").await.unwrap();
    let backend: i32 = client
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    assert!(process_alive(pid) && process_alive(backend as u32));

    cluster.stop(StopMode::Fast).unwrap();
    assert!(!process_alive(pid), "postmaster {pid} gone");
    assert!(!process_alive(backend as u32), "backend {backend} gone");
    assert!(dir.exists(), "folder stays while the Cluster value lives");
    cluster.start_again().unwrap();
    let new_pid = cluster.postmaster_pid().unwrap();
    drop(cluster);
    assert!(!process_alive(new_pid));
    assert!(!dir.exists(), "folder {} removed", dir.display());
}

#[test]
fn wrong_major_is_refused() {
    let options = ClusterOptions {
        required_major: Some(15),
        ..ClusterOptions::default()
    };
    let error = Cluster::start(options).expect_err("16 is not 15");
    assert!(error.to_string().contains("PostgreSQL 16 found"), "{error}");
}
