//! Where a point's CPU goes: user + system time of the load (this process), of the
//! service (the ledger-svc child, service variant only) and of PostgreSQL (the postmaster
//! and every process it started), read before and after the measured seconds, so the
//! table can say how many CPU microseconds each debit cost in each. On a machine where
//! all three share a few cores this is what decides the ratios (see LIMITS.md).
//!
//! Linux only: for the children, the scheduler's own run time of each of their threads
//! (`/proc/<pid>/task/<tid>/schedstat`, first field, nanoseconds; proc(5)), else
//! `/proc/<pid>/stat` fields 14–15 (`utime` + `stime` in clock ticks, which undercount a
//! process that runs in bursts shorter than a tick, like a backend waiting on its commit's
//! flush); `getrusage(RUSAGE_SELF)` (through nix) for this process. Elsewhere every
//! figure reads `None`. PostgreSQL's time is summed per process: what each process present
//! at both readings spent in between, plus all of any process started in the window. A process that exits inside the window takes its time in it along (every
//! variant keeps its own connections open for the whole window; the connections that
//! exit then are the previous point's, idle).

use std::collections::HashMap;
use std::time::Duration;

/// CPU time consumed so far, per part.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    load: Option<Duration>,
    service: Option<Duration>,
    /// Per PostgreSQL process: pid → its time so far.
    postgres: Option<HashMap<u32, Duration>>,
}

/// CPU microseconds per committed debit (or ceiling commit) over a window, per part.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct PerDebit {
    /// The load generator (this process: its clients, and the sampler's few queries).
    pub load_us: Option<f64>,
    /// ledger-svc (service variant only).
    pub service_us: Option<f64>,
    /// PostgreSQL: the postmaster and all its children (backends, WAL writer, …).
    pub postgres_us: Option<f64>,
}

impl Sample {
    /// Reads the counters now; `service` is the ledger-svc pid, `postmaster` the cluster's.
    pub fn take(service: Option<u32>, postmaster: Option<u32>) -> Sample {
        Sample {
            load: own_cpu(),
            service: service.and_then(process_cpu),
            postgres: postmaster.and_then(tree_cpu),
        }
    }

    /// What PostgreSQL's processes spent from `self` to `later` (a pid whose time went
    /// down is a new process under a reused pid: all of its time counts).
    fn postgres_spent(&self, later: &Sample) -> Option<Duration> {
        let (before, after) = (self.postgres.as_ref()?, later.postgres.as_ref()?);
        Some(
            after
                .iter()
                .map(|(pid, spent)| match before.get(pid) {
                    Some(earlier) if earlier <= spent => *spent - *earlier,
                    _ => *spent,
                })
                .sum(),
        )
    }

    /// What each part spent between `self` and `later`, per one of `debits`.
    pub fn per_debit(&self, later: &Sample, debits: u64) -> PerDebit {
        let per_debit = |spent: Option<Duration>| {
            spent
                .filter(|_| debits > 0)
                .map(|spent| spent.as_secs_f64() * 1e6 / debits as f64)
        };
        let between = |before: Option<Duration>, after: Option<Duration>| match (before, after) {
            (Some(before), Some(after)) if after >= before => Some(after - before),
            _ => None,
        };
        PerDebit {
            load_us: per_debit(between(self.load, later.load)),
            service_us: per_debit(between(self.service, later.service)),
            postgres_us: per_debit(self.postgres_spent(later)),
        }
    }
}

/// This process's user + system time.
fn own_cpu() -> Option<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let time =
        |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    Some(time(usage.user_time()) + time(usage.system_time()))
}

/// `(ppid, utime + stime)` of `pid` from `/proc/<pid>/stat`.
fn stat(pid: u32) -> Option<(u32, Duration)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold spaces: split after it.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): ppid is field 4, utime 14, stime 15.
    let ppid = fields.get(1)?.parse().ok()?;
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok()??;
    let ticks = u64::try_from(ticks).ok().filter(|&ticks| ticks > 0)?;
    let total = utime + stime;
    Some((
        ppid,
        Duration::from_secs(total / ticks)
            + Duration::from_nanos(total % ticks * 1_000_000_000 / ticks),
    ))
}

/// The run time of `pid`: the sum over its threads' `schedstat`, else its `stat` times.
fn process_cpu(pid: u32) -> Option<Duration> {
    scheduled(pid).or_else(|| stat(pid).map(|(_, cpu)| cpu))
}

/// Sum of the first `schedstat` field (time on a CPU, nanoseconds) of `pid`'s threads.
fn scheduled(pid: u32) -> Option<Duration> {
    let mut total = Duration::ZERO;
    let mut threads = 0;
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let Ok(text) = std::fs::read_to_string(entry.path().join("schedstat")) else {
            continue;
        };
        let Some(ns) = text.split_whitespace().next().and_then(|f| f.parse().ok()) else {
            continue;
        };
        total += Duration::from_nanos(ns);
        threads += 1;
    }
    (threads > 0).then_some(total)
}

/// The time of `root` and of each of its direct children (PostgreSQL's processes are all
/// children of the postmaster), by pid.
fn tree_cpu(root: u32) -> Option<HashMap<u32, Duration>> {
    let mut times = HashMap::from([(root, process_cpu(root)?)]);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, cpu)) = stat(pid)
            && ppid == root
        {
            times.insert(pid, scheduled(pid).unwrap_or(cpu));
        }
    }
    Some(times)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_time_grows_with_work() {
        let before = Sample::take(Some(std::process::id()), Some(std::process::id()));
        // Busy until this process has spent 60 ms more on a CPU (however long that takes
        // on a loaded machine).
        let start = own_cpu().unwrap();
        let mut x = 0u64;
        while own_cpu().unwrap() - start < Duration::from_millis(60) {
            for _ in 0..10_000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
            }
        }
        std::hint::black_box(x);
        let after = Sample::take(Some(std::process::id()), Some(std::process::id()));
        let per = before.per_debit(&after, 1);
        // getrusage and schedstat count it to the microsecond.
        assert!(per.load_us.unwrap() >= 50_000.0, "{per:?}");
        assert!(per.service_us.unwrap() >= 50_000.0, "{per:?}");
        assert!(per.postgres_us.unwrap() >= 50_000.0, "{per:?}");
        assert!(before.per_debit(&after, 0).load_us.is_none());
        // A process gone by the second reading is not subtracted; one that appeared counts
        // in full; a pid whose time went down is a new process.
        let at = |entries: &[(u32, u64)]| Sample {
            postgres: Some(
                entries
                    .iter()
                    .map(|(pid, ms)| (*pid, Duration::from_millis(*ms)))
                    .collect(),
            ),
            ..Sample::default()
        };
        let spent = at(&[(1, 100), (2, 500), (3, 900)])
            .per_debit(&at(&[(1, 150), (2, 40), (4, 10)]), 1)
            .postgres_us;
        assert_eq!(spent, Some(100_000.0));
    }
}
