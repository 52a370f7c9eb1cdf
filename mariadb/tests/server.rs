//! A scratch server starts, keeps a committed row across SIGKILL and a restart (InnoDB
//! crash recovery), stops with `mariadb -e shutdown`, and leaves no process or folder.

use mysql_async::prelude::Queryable;
use scratch_mariadb::{Server, ServerOptions};

#[tokio::test]
async fn start_kill_restart_stop_leaves_nothing() {
    let parent = tempfile::Builder::new()
        .prefix("mariadb-test")
        .tempdir()
        .unwrap();
    std::fs::set_permissions(
        parent.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let dir = parent.path().join("server");
    let mut server = Server::start(ServerOptions::new(dir.clone())).unwrap();
    server.create_database("t").await.unwrap();
    let mut conn = mysql_async::Conn::new(server.opts(Some("t")))
        .await
        .unwrap();
    let engine: Option<String> = conn
        .query_first("SELECT @@default_storage_engine")
        .await
        .unwrap();
    assert_eq!(engine.as_deref(), Some("InnoDB"));
    conn.query_drop("CREATE TABLE k (id INT PRIMARY KEY)")
        .await
        .unwrap();
    conn.query_drop("INSERT INTO k VALUES (7)").await.unwrap();
    drop(conn);
    let first = server.pid().unwrap();
    server.kill_and_restart().unwrap();
    assert_ne!(server.pid().unwrap(), first);
    assert!(!std::path::Path::new(&format!("/proc/{first}")).exists());
    let mut conn = mysql_async::Conn::new(server.opts(Some("t")))
        .await
        .unwrap();
    let count: Option<i64> = conn.query_first("SELECT COUNT(*) FROM k").await.unwrap();
    assert_eq!(count, Some(1), "the committed row survives SIGKILL");
    conn.disconnect().await.unwrap();
    let pid = server.pid().unwrap();
    drop(server);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "mariadbd gone"
    );
    assert!(!dir.exists(), "server folder removed");
}
