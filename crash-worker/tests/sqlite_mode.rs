//! The crash-worker's SQLite mode on real files: it stops at each hook point and dies by
//! SIGKILL there, leaving a sound file; it gives up after its pause limit; and four writer
//! processes of eight connections each, released by one start file, give 14/18/2.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Child, ChildStdout, Command, Stdio};

use inventory_store::{ChangeOutcome, ChangePoint, Store};

/// The binary cargo built for these tests.
const WORKER: &str = env!("CARGO_BIN_EXE_crash-worker");
const ITEM: i64 = 1;

/// A child that is killed and reaped when dropped.
struct Worker {
    child: Child,
    lines: std::io::Lines<BufReader<ChildStdout>>,
}

impl Worker {
    fn start(args: &[&str]) -> Worker {
        let mut child = Command::new(WORKER)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the worker");
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Worker { child, lines }
    }

    fn next_line(&mut self) -> Option<String> {
        self.lines.next().map(|line| line.expect("read a line"))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn seeded_file(dir: &Path, units: i64) -> std::path::PathBuf {
    let path = dir.join("inventory.sqlite");
    Store::open(&path).unwrap().add_item(ITEM, units).unwrap();
    path
}

#[test]
fn killed_at_each_hook_point_the_file_stays_sound() {
    for point in ChangePoint::ALL {
        let dir = tempfile::tempdir().unwrap();
        let path = seeded_file(dir.path(), 100);
        let mut worker = Worker::start(&[
            "sqlite",
            "apply",
            "--file",
            path.to_str().unwrap(),
            "--change",
            r#"{"event_id":"ship-2","item":1,"delta":-30}"#,
            "--stop-at",
            point.as_str(),
        ]);
        let line = worker.next_line().expect("a line");
        assert!(line.starts_with("PAUSED_IN_TX "), "{line}");
        assert!(line.contains(&format!("point={point}")), "{line}");
        worker.child.kill().unwrap();
        let status = worker.child.wait().unwrap();
        assert_eq!(status.signal(), Some(9));

        let store = Store::open(&path).unwrap();
        assert_eq!(store.integrity_check().unwrap(), "ok");
        let committed = point.is_committed();
        assert_eq!(
            store.units(ITEM).unwrap(),
            Some(if committed { 70 } else { 100 })
        );
        assert_eq!(store.change_count().unwrap(), i64::from(committed));
        let retry = store.apply_change("ship-2", ITEM, -30).unwrap();
        let expected = if committed {
            ChangeOutcome::Replayed
        } else {
            ChangeOutcome::Applied
        };
        assert_eq!(retry, expected, "{point}");
        assert_eq!(store.units(ITEM).unwrap(), Some(70));
    }
}

#[test]
fn not_killed_it_gives_up_after_its_pause_limit_and_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = seeded_file(dir.path(), 100);
    let mut worker = Worker::start(&[
        "sqlite",
        "apply",
        "--file",
        path.to_str().unwrap(),
        "--change",
        r#"{"event_id":"ship-2","item":1,"delta":-30}"#,
        "--stop-at",
        "before-commit",
        "--pause-limit-ms",
        "200",
    ]);
    assert!(worker.next_line().unwrap().starts_with("PAUSED_IN_TX"));
    let status = worker.child.wait().unwrap();
    assert_eq!(status.code(), Some(launch::worker::EXIT_PAUSE_LIMIT));
    let store = Store::open(&path).unwrap();
    assert_eq!(store.units(ITEM).unwrap(), Some(100));
    assert_eq!(store.change_count().unwrap(), 0);
}

#[test]
fn replays_in_a_new_process() {
    let dir = tempfile::tempdir().unwrap();
    let path = seeded_file(dir.path(), 100);
    {
        let store = Store::open(&path).unwrap();
        store.apply_change("receive-1", ITEM, 5).unwrap();
    }
    let mut worker = Worker::start(&[
        "sqlite",
        "apply",
        "--file",
        path.to_str().unwrap(),
        "--change",
        r#"{"event_id":"receive-1","item":1,"delta":5}"#,
        "--change",
        r#"{"event_id":"receive-1","item":1,"delta":6}"#,
    ]);
    assert_eq!(
        worker.next_line().unwrap(),
        "RESULT index=0 event_id=receive-1 outcome=replayed units=105"
    );
    assert_eq!(
        worker.next_line().unwrap(),
        "RESULT index=1 event_id=receive-1 outcome=mismatch units=105"
    );
    assert!(worker.child.wait().unwrap().success());
}

#[test]
fn four_writer_processes_of_eight_connections_give_14_18_2() {
    let dir = tempfile::tempdir().unwrap();
    let path = seeded_file(dir.path(), 100);
    let start = dir.path().join("start");
    let mut workers: Vec<Worker> = (0..4)
        .map(|process| {
            Worker::start(&[
                "sqlite",
                "writers",
                "--file",
                path.to_str().unwrap(),
                "--connections",
                "8",
                "--event-prefix",
                &format!("ship-p{process}-"),
                "--item",
                "1",
                "--delta",
                "-7",
                "--start-file",
                start.to_str().unwrap(),
            ])
        })
        .collect();
    for worker in &mut workers {
        assert_eq!(worker.next_line().unwrap(), "READY connections=8");
    }
    std::fs::write(&start, b"go").unwrap();
    let (mut applied, mut insufficient) = (0, 0);
    for worker in &mut workers {
        let mut outcomes = 0;
        while let Some(line) = worker.next_line() {
            if line.starts_with("OUTCOME ") {
                outcomes += 1;
                applied += usize::from(line.contains("outcome=applied "));
                insufficient += usize::from(line.contains("outcome=insufficient "));
            }
        }
        assert_eq!(outcomes, 8);
        assert!(worker.child.wait().unwrap().success());
    }
    assert_eq!((applied, insufficient), (14, 18));
    let store = Store::open(&path).unwrap();
    assert_eq!(store.units(ITEM).unwrap(), Some(2));
}
