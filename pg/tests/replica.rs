//! Streaming replication between scratch clusters, against a real PostgreSQL 16: a
//! synchronous standby keeps an acknowledged row across a kill -9 of the primary and a
//! promotion; the old primary comes back as the new primary's standby.

use scratch_pg::{Cluster, ClusterOptions, DEFAULT_SERVER_USER, Replication, StandbyOptions};

fn standby_options(primary: &Cluster, name: &str, replication: Replication) -> StandbyOptions {
    StandbyOptions {
        dir: primary.dir().with_file_name(format!(
            "{}-{name}",
            primary.dir().file_name().unwrap().to_string_lossy()
        )),
        name: name.into(),
        replication,
        server_user: DEFAULT_SERVER_USER.into(),
    }
}

async fn in_recovery(cluster: &Cluster) -> bool {
    let client = cluster.connect("postgres").await.unwrap();
    client
        .query_one("SELECT pg_is_in_recovery()", &[])
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_standby_keeps_the_row_and_the_old_primary_follows() {
    let mut primary = Cluster::start(ClusterOptions::default()).expect("primary starts");
    primary
        .connect("postgres")
        .await
        .unwrap()
        .batch_execute("CREATE TABLE t(v text)")
        .await
        .unwrap();
    let options = standby_options(&primary, "s1", Replication::Synchronous);
    let standby_dir = options.dir.clone();
    let standby = primary.start_standby(options).await.expect("standby");
    assert!(in_recovery(&standby).await);
    primary
        .connect("postgres")
        .await
        .unwrap()
        .batch_execute("INSERT INTO t VALUES ('acknowledged')")
        .await
        .unwrap();
    primary.kill_server().unwrap();
    assert!(primary.postmaster_pid().is_none());
    standby.promote().await.expect("promotes");
    assert!(!in_recovery(&standby).await);
    let client = standby.connect("postgres").await.unwrap();
    // The first write of the promoted node must not wait on SyncRep.
    client
        .batch_execute("INSERT INTO t VALUES ('after failover')")
        .await
        .unwrap();
    let rows = client
        .query("SELECT v FROM t ORDER BY v", &[])
        .await
        .unwrap();
    let values: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    assert_eq!(values, ["acknowledged", "after failover"]);

    primary.make_standby_of(&standby, "old").unwrap();
    primary
        .start_again()
        .expect("old primary starts as a standby");
    assert!(in_recovery(&primary).await);
    let old = primary.connect("postgres").await.unwrap();
    let refused = old
        .batch_execute("INSERT INTO t VALUES ('split')")
        .await
        .unwrap_err();
    assert_eq!(refused.code().map(|c| c.code()), Some("25006"), "{refused}");
    drop(standby);
    assert!(!standby_dir.exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asynchronous_standby_with_a_stopped_receiver_misses_the_row() {
    let mut primary = Cluster::start(ClusterOptions::default()).expect("primary starts");
    let admin = primary.connect("postgres").await.unwrap();
    admin.batch_execute("CREATE TABLE t(v text)").await.unwrap();
    let mut standby = primary
        .start_standby(standby_options(&primary, "s2", Replication::Asynchronous))
        .await
        .expect("standby");
    let receiver = standby.wal_receiver_pid().await.unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(receiver),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    admin
        .batch_execute("INSERT INTO t VALUES ('acknowledged')")
        .await
        .unwrap();
    primary.kill_server().unwrap();
    standby.kill_server().unwrap();
    standby.start_again().unwrap();
    standby.promote().await.unwrap();
    let client = standby.connect("postgres").await.unwrap();
    let count: i64 = client
        .query_one("SELECT count(*) FROM t", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(count, 0);
}
