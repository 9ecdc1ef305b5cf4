//! The noise gate: CPU time other processes used while a sample was taken. Two figures: the
//! busiest other process's share of ONE CPU (its /proc/<pid>/stat utime + stime, all its
//! threads, over the sample's wall in the same clock ticks), and all others' share of the whole
//! machine (/proc/stat minus this process's own). A sample is rejected and retaken when either
//! exceeds the gate's threshold, and the rejections are counted.
//!
//! Why per process and not per CPU line: /proc/stat's per-CPU lines cannot tell this process's
//! threads from others' (the scheduler moves both), while a process's own counters can. Why the
//! per-CPU figure: a share of the whole machine hides one busy loop on a large machine (one
//! core of 16 is 6 %, under a 10 % gate), and one busy neighbour is what steals a measured
//! thread's core.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Default threshold: the busiest other process may use this share of one CPU, and all others
/// together this share of the machine, during a sample.
pub const DEFAULT_MAX_OTHERS: f64 = 0.10;
/// A process's CPU time moves in clock ticks (10 ms); a process must have used at least this
/// many during a sample to count for the per-CPU figure, as one tick is the counters' rounding.
pub const MIN_PROCESS_TICKS: u64 = 2;
/// Default retakes of one sample before accepting it anyway (and saying so).
pub const DEFAULT_RETRIES: u32 = 3;

/// Busy and total CPU time of the machine, and this process's own CPU time, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuTicks {
    pub busy: u64,
    pub total: u64,
    pub own: u64,
}

/// `/proc/stat`'s first line: `cpu user nice system idle iowait irq softirq steal ...`.
/// Busy = everything but idle and iowait. Steal (time the hypervisor gave to other machines) is
/// counted as busy: it is time this machine did not get.
pub fn parse_proc_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().take(8).sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// `/proc/self/stat` or `/proc/<pid>/stat`: utime and stime (fields 14 and 15, all the
/// process's threads), after the parenthesised command name (which may itself contain spaces or
/// parentheses).
pub fn parse_self_stat(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14 -> index 11, stime 15 -> index 12
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Reads the counters now; `None` where /proc is not there.
pub fn read_ticks() -> Option<CpuTicks> {
    let (busy, total) = parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let own = parse_self_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(CpuTicks { busy, total, own })
}

/// Share of all CPU time between two readings that other processes used (0..1).
pub fn others_share(before: CpuTicks, after: CpuTicks) -> f64 {
    let total = after.total.saturating_sub(before.total);
    if total == 0 {
        return 0.0;
    }
    let busy = after.busy.saturating_sub(before.busy);
    let own = after.own.saturating_sub(before.own);
    busy.saturating_sub(own) as f64 / total as f64
}

/// The CPUs /proc/stat lists (`cpu0`, `cpu1`, ...).
pub fn count_cpus(proc_stat: &str) -> u32 {
    proc_stat
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count() as u32
}

/// The machine's counters and every other process's CPU time at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    pub machine: CpuTicks,
    pub cpus: u32,
    /// (pid, utime + stime of all its threads) of every process but this one.
    pub processes: Vec<(u32, u64)>,
}

/// Processes whose CPU time is this process's own work: the RPC servers on this machine that
/// compute part of the measured graph (`--rpc` to a loopback server). Their ticks count as this
/// process's, not as another process disturbing it.
static PARTNERS: std::sync::Mutex<Vec<u32>> = std::sync::Mutex::new(Vec::new());

/// Counts `pids` as part of this process's work from now on (see [`PARTNERS`]).
pub fn count_as_own(pids: &[u32]) {
    if let Ok(mut p) = PARTNERS.lock() {
        p.extend_from_slice(pids);
        p.sort_unstable();
        p.dedup();
    }
}

/// Reads a snapshot now; `None` where /proc is not there. Processes that vanish while being
/// read are skipped.
pub fn read_snapshot() -> Option<Snapshot> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (busy, total) = parse_proc_stat(&stat)?;
    let mut own = parse_self_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let me = std::process::id();
    let partners = PARTNERS.lock().map(|p| p.clone()).unwrap_or_default();
    let mut processes = Vec::new();
    for (pid, dir) in crate::system::processes() {
        if pid == me {
            continue;
        }
        if let Some(ticks) = std::fs::read_to_string(dir.join("stat"))
            .ok()
            .and_then(|t| parse_self_stat(&t))
        {
            if partners.binary_search(&pid).is_ok() {
                own += ticks;
            } else {
                processes.push((pid, ticks));
            }
        }
    }
    processes.sort_unstable();
    Some(Snapshot {
        machine: CpuTicks { busy, total, own },
        cpus: count_cpus(&stat).max(1),
        processes,
    })
}

/// What other processes used between two snapshots.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Reading {
    /// All other processes' share of the machine's CPU time (0..1).
    pub machine_share: f64,
    /// The busiest other process's CPU time over the elapsed wall, in CPUs (1.0 = one whole
    /// CPU; a process with several busy threads can exceed 1).
    pub busiest_share_of_cpu: f64,
    /// Its pid (0: none counted).
    pub busiest_pid: u32,
}

impl Reading {
    /// Whether a sample taken meanwhile is too noisy for `threshold`.
    pub fn noisy(&self, threshold: f64) -> bool {
        self.busiest_share_of_cpu > threshold || self.machine_share > threshold
    }
}

/// The reading between two snapshots. The elapsed wall in ticks is the machine's total ticks
/// over its CPU count (the same clock ticks as the processes' counters). A process counts when
/// it used at least [`MIN_PROCESS_TICKS`]; one that started during the sample counts all its
/// time.
pub fn reading(before: &Snapshot, after: &Snapshot) -> Reading {
    let elapsed =
        after.machine.total.saturating_sub(before.machine.total) as f64 / after.cpus.max(1) as f64;
    let mut busiest = (0.0, 0u32);
    if elapsed > 0.0 {
        for &(pid, ticks) in &after.processes {
            let earlier = before
                .processes
                .binary_search_by_key(&pid, |p| p.0)
                .map(|i| before.processes[i].1)
                .unwrap_or(0);
            let used = ticks.saturating_sub(earlier);
            if used >= MIN_PROCESS_TICKS && used as f64 / elapsed > busiest.0 {
                busiest = (used as f64 / elapsed, pid);
            }
        }
    }
    Reading {
        machine_share: others_share(before.machine, after.machine),
        busiest_share_of_cpu: busiest.0,
        busiest_pid: busiest.1,
    }
}

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateConfig {
    /// Reject a sample when the busiest other process used more than this share of one CPU, or
    /// all others more than this share of the machine, during it (0..=1).
    pub max_others: f64,
    /// Retakes of a rejected sample before it is kept anyway (flagged).
    pub retries: u32,
    pub enabled: bool,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            max_others: DEFAULT_MAX_OTHERS,
            retries: DEFAULT_RETRIES,
            enabled: true,
        }
    }
}

/// What the gate saw over a measurement.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct GateStats {
    /// Samples kept.
    pub accepted: u32,
    /// Samples thrown away and retaken.
    pub rejected: u32,
    /// Samples kept although the retakes ran out (still noisy).
    pub kept_noisy: u32,
    /// The largest share of the machine all others used during a kept sample.
    pub max_others_kept: f64,
    /// The largest share of one CPU the busiest other process used during a kept sample.
    #[serde(default)]
    pub max_busiest_kept: f64,
}

impl GateStats {
    pub fn rejection_rate(&self) -> f64 {
        let all = self.accepted + self.rejected;
        if all == 0 {
            0.0
        } else {
            self.rejected as f64 / all as f64
        }
    }
}

/// Takes `sample` until the machine was quiet enough during it, at most `1 + retries` times.
/// Samples too short for the kernel's tick (10 ms) to tell are accepted as they come.
pub fn gated<T, E>(
    cfg: &GateConfig,
    stats: &mut GateStats,
    mut sample: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut attempt = 0;
    loop {
        let before = if cfg.enabled { read_snapshot() } else { None };
        let t0 = Instant::now();
        let value = sample()?;
        let elapsed = t0.elapsed();
        let r = match (before, read_snapshot()) {
            (Some(b), Some(a)) if cfg.enabled && elapsed.as_millis() >= 20 => reading(&b, &a),
            _ => Reading {
                machine_share: 0.0,
                busiest_share_of_cpu: 0.0,
                busiest_pid: 0,
            },
        };
        let keep = |stats: &mut GateStats| {
            stats.accepted += 1;
            stats.max_others_kept = stats.max_others_kept.max(r.machine_share);
            stats.max_busiest_kept = stats.max_busiest_kept.max(r.busiest_share_of_cpu);
        };
        if !r.noisy(cfg.max_others) {
            keep(stats);
            return Ok(value);
        }
        if attempt >= cfg.retries {
            keep(stats);
            stats.kept_noisy += 1;
            return Ok(value);
        }
        stats.rejected += 1;
        attempt += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_busy_and_total() {
        let text = "cpu  100 5 50 1000 20 3 2 10 0 0\ncpu0 50 2 25 500 10 1 1 5 0 0\n";
        // total = 100+5+50+1000+20+3+2+10 = 1190; idle+iowait = 1020
        assert_eq!(parse_proc_stat(text), Some((170, 1190)));
        assert_eq!(parse_proc_stat("nonsense"), None);
    }

    #[test]
    fn self_stat_with_a_tricky_name() {
        let text = "1234 (my (odd) prog) R 1 2 3 4 5 6 7 8 9 10 250 30 0 0 20 0 3 0 100";
        assert_eq!(parse_self_stat(text), Some(280));
    }

    #[test]
    fn others_share_subtracts_our_own_time() {
        let b = CpuTicks {
            busy: 100,
            total: 1000,
            own: 40,
        };
        let a = CpuTicks {
            busy: 250,
            total: 1200,
            own: 140,
        };
        // 150 busy ticks, 100 of them ours: others used 50 of 200
        assert!((others_share(b, a) - 0.25).abs() < 1e-12);
    }

    fn snap(total: u64, busy: u64, own: u64, cpus: u32, procs: &[(u32, u64)]) -> Snapshot {
        Snapshot {
            machine: CpuTicks { busy, total, own },
            cpus,
            processes: procs.to_vec(),
        }
    }

    #[test]
    fn one_busy_loop_on_sixteen_cpus_is_caught() {
        // 16 CPUs, 100 ticks of wall (1600 machine ticks). We used 200 ticks (two threads);
        // another process used 100: one whole CPU, but 100 / 1600 = 6.25 % of the machine,
        // which a machine-wide 10 % gate let through
        let before = snap(10_000, 1_000, 500, 16, &[(1, 40), (77, 1_000), (80, 5)]);
        let after = snap(11_600, 1_305, 700, 16, &[(1, 41), (77, 1_100), (80, 9)]);
        let r = reading(&before, &after);
        assert!((r.machine_share - 105.0 / 1600.0).abs() < 1e-12, "{r:?}");
        assert!((r.busiest_share_of_cpu - 1.0).abs() < 1e-12, "{r:?}");
        assert_eq!(r.busiest_pid, 77);
        assert!(r.machine_share < DEFAULT_MAX_OTHERS);
        assert!(r.noisy(DEFAULT_MAX_OTHERS));
        // a process using one tick (the counters' rounding) does not count; a quiet sample
        let quiet_after = snap(11_600, 1_201, 700, 16, &[(1, 41), (77, 1_000), (80, 5)]);
        let q = reading(&before, &quiet_after);
        assert_eq!((q.busiest_share_of_cpu, q.busiest_pid), (0.0, 0));
        assert!(!q.noisy(DEFAULT_MAX_OTHERS));
        // a process that started during the sample counts all its time: 30 ticks of 100
        let born = snap(
            11_600,
            1_230,
            700,
            16,
            &[(1, 40), (77, 1_000), (80, 5), (90, 30)],
        );
        let b = reading(&before, &born);
        assert!((b.busiest_share_of_cpu - 0.3).abs() < 1e-12 && b.busiest_pid == 90);
        // many small neighbours that add up to more than the threshold of the machine
        let crowd: Vec<(u32, u64)> = (100..120).map(|p| (p, 0)).collect();
        let crowd_after: Vec<(u32, u64)> = (100..120).map(|p| (p, 9)).collect();
        let c = reading(
            &snap(10_000, 1_000, 0, 16, &crowd),
            &snap(11_600, 1_180, 0, 16, &crowd_after),
        );
        assert!(c.busiest_share_of_cpu <= DEFAULT_MAX_OTHERS && c.noisy(DEFAULT_MAX_OTHERS));
    }

    #[test]
    fn cpus_are_counted_from_proc_stat() {
        let text = "cpu  1 2 3 4\ncpu0 1 1 1 1\ncpu1 1 1 1 1\ncpufreq 3\nintr 5\n";
        assert_eq!(count_cpus(text), 2);
    }

    #[test]
    fn a_rejected_sample_is_retaken_then_kept_when_retries_run_out() {
        // a sample of < 20 ms cannot be judged: accepted at once
        let cfg = GateConfig::default();
        let mut stats = GateStats::default();
        let v: Result<u32, ()> = gated(&cfg, &mut stats, || Ok(7));
        assert_eq!(v, Ok(7));
        assert_eq!((stats.accepted, stats.rejected), (1, 0));
        let off = GateConfig {
            enabled: false,
            ..cfg
        };
        let mut n = 0;
        let _: Result<(), ()> = gated(&off, &mut stats, || {
            n += 1;
            Ok(())
        });
        assert_eq!(n, 1);
    }
}
