//! The Patroni cluster as a scratch part, against Debian's PostgreSQL 15 (as root; not
//! root and not cached, it says so and passes): it elects the first node, streams
//! synchronously to the second, HAProxy reaches the leader, a kill -9 of the leader's
//! Patroni and postmaster makes Patroni promote the synchronous standby, and dropping
//! the cluster leaves no process and no folder.

use std::path::Path;

use scratch_pg::patroni::{PatroniCluster, PatroniOptions};

/// The pids of processes whose command line names `dir`.
fn processes_naming(dir: &Path) -> Vec<String> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            name.parse::<u32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            cmdline
                .contains(&needle)
                .then(|| format!("{name}: {cmdline}"))
        })
        .collect()
}

#[test]
fn elects_streams_fails_over_and_leaves_nothing() {
    let dir = std::env::temp_dir().join(format!("patroni-test-{}", std::process::id()));
    let options = PatroniOptions {
        dir: dir.clone(),
        scope: "test".into(),
        nodes: 2,
        synchronous_mode: true,
        maximum_lag_on_failover: None,
        max_connections: 40,
        server_user: scratch_pg::DEFAULT_SERVER_USER.into(),
    };
    let mut cluster = match PatroniCluster::start(options) {
        Err(scratch_pg::ClusterError::Binaries(why)) if !nix::unistd::geteuid().is_root() => {
            eprintln!("not run: {why}");
            return;
        }
        started => started.expect("the cluster starts"),
    };
    assert_eq!(cluster.leader(), Some(0));
    assert_eq!(cluster.role(1).as_deref(), Some("replica"));
    let through = std::net::TcpStream::connect(("127.0.0.1", cluster.haproxy_port()));
    assert!(through.is_ok(), "HAProxy listens");
    cluster.kill_node(0);
    let (leader, took_ms) = cluster.wait_leader(Some(0), 60_000).expect("a new leader");
    eprintln!("n2 leads {took_ms} ms after the kill");
    assert_eq!(leader, 1);
    drop(cluster);
    assert!(!dir.exists(), "the cluster's folder is gone");
    assert_eq!(processes_naming(&dir), Vec::<String>::new());
}
