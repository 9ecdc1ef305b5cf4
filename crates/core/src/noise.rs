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
//!
//! /proc only sees other processes of this machine. What slows it without them (a CPU quota,
//! the hypervisor, shared memory bandwidth, the clock) is the canary's to see: a small fixed
//! workload timed right before and after every run ([`canary`]); a run whose canary was slower
//! than its recent best by more than the canary's threshold is retaken under the same rules.

use std::time::Instant;

pub mod canary;

pub use canary::{
    Canary, CanaryReading, CanaryState, ThreadCanary, CANARY_HISTORY, DEFAULT_CANARY_SLOWDOWN,
};

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

/// `/proc/<pid>/stat`: the process's start time (field 22, clock ticks after boot), which with
/// the pid names one process: a later process given the same pid started later.
pub fn parse_start_time(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // rest starts at field 3 (state): starttime is field 22 -> index 19
    rest.split_whitespace().nth(19)?.parse().ok()
}

fn start_time(pid: u32) -> Option<u64> {
    parse_start_time(&std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// A process counted as this process's own work: its pid, its start time (so that a process
/// given the same pid later is not), and the registration ([`OwnGuard`]) that counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Partner {
    pid: u32,
    start: u64,
    registration: u64,
}

/// Processes whose CPU time is this process's own work: a llama.cpp worker measuring the graph,
/// the RPC servers on this machine that compute part of it (`--rpc` to a loopback server).
/// Their ticks count as this process's, not as another process disturbing it, while the
/// [`OwnGuard`] that registered them lives and the process that was registered runs.
static PARTNERS: std::sync::Mutex<Vec<Partner>> = std::sync::Mutex::new(Vec::new());
static NEXT_REGISTRATION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

fn partners() -> std::sync::MutexGuard<'static, Vec<Partner>> {
    // the list stays consistent whatever panicked while holding it (each change is one call)
    PARTNERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether the process `pid` that started at `start` is one of `partners`.
fn is_partner(partners: &[Partner], pid: u32, start: u64) -> bool {
    partners.iter().any(|p| p.pid == pid && p.start == start)
}

/// The registration of processes counted as this process's own work ([`count_as_own`]): they
/// stop counting when it is dropped. Whoever uses the processes (the engine measuring through
/// them) holds it.
#[derive(Debug)]
#[must_use = "the processes count as own only while the guard lives"]
pub struct OwnGuard {
    registration: u64,
    pids: Vec<u32>,
}

impl OwnGuard {
    /// The pids registered: those of `count_as_own`'s that were running.
    pub fn pids(&self) -> &[u32] {
        &self.pids
    }
}

impl Drop for OwnGuard {
    fn drop(&mut self) {
        partners().retain(|p| p.registration != self.registration);
    }
}

/// Counts the running processes `pids` as part of this process's work until the returned guard
/// is dropped or the process ends (see [`PARTNERS`]). Each is known by its pid and start time:
/// a pid that is not running now is not registered, and one reused by a later process does not
/// count.
pub fn count_as_own(pids: &[u32]) -> OwnGuard {
    let registration = NEXT_REGISTRATION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let found: Vec<Partner> = pids
        .iter()
        .filter_map(|&pid| {
            Some(Partner {
                pid,
                start: start_time(pid)?,
                registration,
            })
        })
        .collect();
    let guard = OwnGuard {
        registration,
        pids: found.iter().map(|p| p.pid).collect(),
    };
    partners().extend(found);
    guard
}

/// Whether the process running as `pid` now counts as this process's own work.
pub fn is_counted_as_own(pid: u32) -> bool {
    start_time(pid).is_some_and(|start| is_partner(&partners(), pid, start))
}

/// Reads a snapshot now; `None` where /proc is not there. Processes that vanish while being
/// read are skipped. Registered processes ([`count_as_own`]) that ended are dropped from the
/// registrations.
pub fn read_snapshot() -> Option<Snapshot> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let (busy, total) = parse_proc_stat(&stat)?;
    let mut own = parse_self_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    let me = std::process::id();
    let registered = partners().clone();
    let mut seen = Vec::new();
    let mut processes = Vec::new();
    for (pid, dir) in crate::system::processes() {
        if pid == me {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(dir.join("stat")) else {
            continue;
        };
        if let Some(ticks) = parse_self_stat(&text) {
            let start = parse_start_time(&text);
            if start.is_some_and(|s| is_partner(&registered, pid, s)) {
                own += ticks;
                seen.push((pid, start));
            } else {
                processes.push((pid, ticks));
            }
        }
    }
    // a registered process not running any more (its pid gone or another process's) is done
    let ended: Vec<Partner> = registered
        .into_iter()
        .filter(|p| !seen.contains(&(p.pid, Some(p.start))))
        .collect();
    if !ended.is_empty() {
        partners().retain(|p| !ended.contains(p));
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
    /// The canary's threshold: reject a sample when the canary's timings right before and
    /// right after it were both more than this much slower than the canary's recent best (0.25
    /// = 25 %). `None`: no canary (and in configurations stored before there was one).
    #[serde(default)]
    pub canary: Option<f64>,
}

impl Default for GateConfig {
    fn default() -> Self {
        GateConfig {
            max_others: DEFAULT_MAX_OTHERS,
            retries: DEFAULT_RETRIES,
            enabled: true,
            canary: Some(DEFAULT_CANARY_SLOWDOWN),
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
    /// Samples rejected because the canary was slowed while /proc saw no other process busy
    /// (counted in `rejected` too). The canary's fields are left out of the JSON at 0.
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub rejected_by_canary: u32,
    /// The canary's fastest timing, µs (0: no canary ran).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub canary_best_us: f64,
    /// The largest slowdown of the canary over its recent best around a kept sample (0.3 = 30 %).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub max_canary_slowdown_kept: f64,
}

fn is_zero(v: &f64) -> bool {
    *v == 0.0
}

fn is_zero_u32(v: &u32) -> bool {
    *v == 0
}

/// What the gate saw around one kept sample, stored with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RunNoise {
    /// Samples rejected and retaken before this one was kept.
    #[serde(default)]
    pub retakes: u32,
    /// Kept although still noisy (the retakes ran out).
    #[serde(default)]
    pub noisy: bool,
    /// /proc over the kept sample: the busiest other process's share of one CPU, all others'
    /// share of the machine (0 where the sample was too short to judge).
    #[serde(default)]
    pub busiest_share_of_cpu: f64,
    #[serde(default)]
    pub machine_share: f64,
    /// The canary right before and after the kept sample, and its recent best then, µs (0: no
    /// canary).
    #[serde(default)]
    pub canary_before_us: f64,
    #[serde(default)]
    pub canary_after_us: f64,
    #[serde(default)]
    pub canary_best_us: f64,
    /// The canary's recent best after runs (its own side: a run leaves the caches cold), µs (0:
    /// no canary, or stored before the sides were told apart).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub canary_best_after_us: f64,
}

impl RunNoise {
    /// The canary's slowdown over its best around this sample (0 without a canary).
    pub fn canary_slowdown(&self) -> f64 {
        CanaryReading {
            before_us: self.canary_before_us,
            after_us: self.canary_after_us,
            best_us: self.canary_best_us,
            best_after_us: self.canary_best_after_us,
        }
        .slowdown()
    }
}

impl GateStats {
    /// What the canary saw, in words; `None` where no canary ran.
    pub fn canary_text(&self) -> Option<String> {
        (self.canary_best_us > 0.0).then(|| {
            format!(
                "the canary ({:.0} µs at best) was slowed around {} runs /proc saw quiet (retaken), around kept runs by up to {:+.0} % over its recent best",
                self.canary_best_us,
                self.rejected_by_canary,
                self.max_canary_slowdown_kept * 100.0
            )
        })
    }

    pub fn rejection_rate(&self) -> f64 {
        let all = self.accepted + self.rejected;
        if all == 0 {
            0.0
        } else {
            self.rejected as f64 / all as f64
        }
    }
}

/// The gate over one measurement: its settings, what it saw, and the canary's timings.
pub struct Gate {
    pub cfg: GateConfig,
    pub stats: GateStats,
    canary: Option<CanaryState>,
}

/// One sample and what the gate saw around it, before any decision.
pub struct Observed<T> {
    pub value: T,
    pub proc: Option<Reading>,
    pub canary: Option<CanaryReading>,
}

impl<T> Observed<T> {
    /// Whether /proc saw other processes busy during the sample.
    pub fn proc_noisy(&self, cfg: &GateConfig) -> bool {
        self.proc.is_some_and(|r| r.noisy(cfg.max_others))
    }

    /// Whether the canary was slowed around the sample.
    pub fn canary_slowed(&self, cfg: &GateConfig) -> bool {
        match (cfg.canary, self.canary) {
            (Some(t), Some(c)) => c.slowdown() > t,
            _ => false,
        }
    }

    pub fn noisy(&self, cfg: &GateConfig) -> bool {
        self.proc_noisy(cfg) || self.canary_slowed(cfg)
    }

    fn noise(&self, retakes: u32, noisy: bool) -> RunNoise {
        let r = self.proc.unwrap_or(Reading {
            machine_share: 0.0,
            busiest_share_of_cpu: 0.0,
            busiest_pid: 0,
        });
        let c = self.canary.unwrap_or(CanaryReading {
            before_us: 0.0,
            after_us: 0.0,
            best_us: 0.0,
            best_after_us: 0.0,
        });
        RunNoise {
            retakes,
            noisy,
            busiest_share_of_cpu: r.busiest_share_of_cpu,
            machine_share: r.machine_share,
            canary_before_us: c.before_us,
            canary_after_us: c.after_us,
            canary_best_us: c.best_us,
            canary_best_after_us: c.best_after_us,
        }
    }
}

impl Gate {
    /// The gate of `cfg`, its canary on `threads` threads (the engine's).
    pub fn new(cfg: &GateConfig, threads: u32) -> Gate {
        let canary: Option<Box<dyn Canary>> = match cfg.canary {
            Some(_) if cfg.enabled => Some(Box::new(ThreadCanary::new(threads))),
            _ => None,
        };
        Gate::with_canary(cfg, canary)
    }

    /// The gate of `cfg` with the given canary (tests give scripted timings); `None`: none.
    pub fn with_canary(cfg: &GateConfig, canary: Option<Box<dyn Canary>>) -> Gate {
        Gate {
            cfg: *cfg,
            stats: GateStats::default(),
            canary: canary
                .filter(|_| cfg.enabled && cfg.canary.is_some())
                .map(CanaryState::new),
        }
    }

    /// Takes `sample` once and reads /proc and the canary around it, deciding nothing (a
    /// cumulative pass, which cannot retake, counts what this says). /proc judges samples from
    /// 20 ms (below, the kernel's 10 ms tick cannot tell); the canary judges every sample.
    pub fn observe<T, E>(
        &mut self,
        sample: &mut dyn FnMut() -> Result<T, E>,
    ) -> Result<Observed<T>, E> {
        if !self.cfg.enabled {
            return Ok(Observed {
                value: sample()?,
                proc: None,
                canary: None,
            });
        }
        let canary_before = self.canary.as_mut().map(|c| c.before());
        let before = read_snapshot();
        let t0 = Instant::now();
        let value = sample()?;
        let elapsed = t0.elapsed();
        let after = read_snapshot();
        let canary = match (self.canary.as_mut(), canary_before) {
            (Some(c), Some(b)) => Some(c.after(b)),
            _ => None,
        };
        if let Some(c) = canary {
            if self.stats.canary_best_us == 0.0 || c.best_us < self.stats.canary_best_us {
                self.stats.canary_best_us = c.best_us;
            }
        }
        let proc = match (before, after) {
            (Some(b), Some(a)) if elapsed.as_millis() >= 20 => Some(reading(&b, &a)),
            _ => None,
        };
        Ok(Observed {
            value,
            proc,
            canary,
        })
    }

    /// Takes `sample` until the machine was quiet enough during it (/proc) and around it (the
    /// canary), at most `1 + retries` times; the kept sample and what the gate saw around it.
    pub fn run<T, E>(
        &mut self,
        mut sample: impl FnMut() -> Result<T, E>,
    ) -> Result<(T, RunNoise), E> {
        let mut attempt = 0;
        loop {
            let o = self.observe(&mut sample)?;
            let noisy = o.noisy(&self.cfg);
            if !noisy || attempt >= self.cfg.retries {
                let s = &mut self.stats;
                s.accepted += 1;
                s.kept_noisy += noisy as u32;
                let n = o.noise(attempt, noisy);
                s.max_others_kept = s.max_others_kept.max(n.machine_share);
                s.max_busiest_kept = s.max_busiest_kept.max(n.busiest_share_of_cpu);
                s.max_canary_slowdown_kept = s.max_canary_slowdown_kept.max(n.canary_slowdown());
                return Ok((o.value, n));
            }
            self.stats.rejected += 1;
            if !o.proc_noisy(&self.cfg) {
                self.stats.rejected_by_canary += 1;
            }
            attempt += 1;
        }
    }
}

/// Takes `sample` until /proc saw the machine quiet enough during it, at most `1 + retries`
/// times, without the canary (see [`Gate`] for the gate with it). Samples too short for the
/// kernel's tick (10 ms) to tell are accepted as they come.
pub fn gated<T, E>(
    cfg: &GateConfig,
    stats: &mut GateStats,
    sample: impl FnMut() -> Result<T, E>,
) -> Result<T, E> {
    let mut gate = Gate::with_canary(cfg, None);
    gate.stats = *stats;
    let r = gate.run(sample);
    *stats = gate.stats;
    r.map(|(v, _)| v)
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
        // the start time is field 22, counted after the name as the ticks are
        assert_eq!(parse_start_time(text), Some(100));
        assert_eq!(parse_start_time("1234 (short) R 1 2 3"), None);
    }

    #[test]
    fn a_pid_reused_by_a_later_process_is_not_counted_as_own() {
        let registered = [Partner {
            pid: 4242,
            start: 100,
            registration: 1,
        }];
        assert!(is_partner(&registered, 4242, 100));
        // the same pid, started later: another process
        assert!(!is_partner(&registered, 4242, 101));
        assert!(!is_partner(&registered, 4243, 100));
    }

    #[test]
    fn own_processes_stop_counting_when_their_guard_drops_or_they_end() {
        let mut child = std::process::Command::new("sleep")
            .arg("60")
            .spawn()
            .unwrap();
        let pid = child.id();
        let among_others = |s: &Snapshot| s.processes.iter().any(|&(p, _)| p == pid);
        let guard = count_as_own(&[pid]);
        assert_eq!(guard.pids(), &[pid]);
        assert!(is_counted_as_own(pid));
        assert!(!among_others(&read_snapshot().unwrap()));
        drop(guard);
        assert!(!is_counted_as_own(pid));
        assert!(among_others(&read_snapshot().unwrap()));

        // two registrations of one process: it counts until the last one goes
        let first = count_as_own(&[pid]);
        let second = count_as_own(&[pid]);
        drop(first);
        assert!(is_counted_as_own(pid));
        // the process ends while its guard lives: the next snapshot drops its registration
        child.kill().unwrap();
        child.wait().unwrap();
        read_snapshot().unwrap();
        assert!(
            !partners().iter().any(|p| p.pid == pid),
            "an ended process is still registered"
        );
        drop(second);
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

    /// A canary that returns scripted timings (µs), counting its calls; past the script, the
    /// last timing again.
    struct Scripted {
        timings: Vec<f64>,
        calls: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Canary for Scripted {
        fn time_us(&mut self) -> f64 {
            let i = self.calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            self.timings[i.min(self.timings.len() - 1)]
        }
    }

    fn scripted(
        cfg: &GateConfig,
        timings: &[f64],
    ) -> (Gate, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let c = Scripted {
            timings: timings.to_vec(),
            calls: calls.clone(),
        };
        (Gate::with_canary(cfg, Some(Box::new(c))), calls)
    }

    const PRIMED: [f64; canary::CANARY_PRIMING] = [1000.0; canary::CANARY_PRIMING];

    #[test]
    fn a_run_between_two_slowed_canaries_is_retaken_and_recorded() {
        let cfg = GateConfig::default();
        // learning the best: 6 x 1000 µs; run 1 between 1000 and 1100 (the faster side is at
        // the best: kept); run 2 between 1400 and 1300 (both slowed, the faster by 30 % > 25 %:
        // retaken); its retake between 990 and 1020 (kept, one retake)
        let mut t = PRIMED.to_vec();
        t.extend([1000.0, 1100.0, 1400.0, 1300.0, 990.0, 1020.0]);
        let (mut gate, calls) = scripted(&cfg, &t);
        let mut samples = 0;
        let mut sample = || -> Result<u32, ()> {
            samples += 1;
            Ok(samples)
        };
        let (v1, n1) = gate.run(&mut sample).unwrap();
        assert_eq!((v1, n1.retakes, n1.noisy), (1, 0, false));
        assert_eq!(
            (n1.canary_before_us, n1.canary_after_us, n1.canary_best_us),
            (1000.0, 1100.0, 1000.0)
        );
        assert_eq!(n1.canary_slowdown(), 0.0);
        let (v2, n2) = gate.run(&mut sample).unwrap();
        // the second sample was thrown away, the third kept
        assert_eq!((v2, n2.retakes, n2.noisy), (3, 1, false));
        // the best is now 990 (the retake's own timing)
        assert_eq!(
            (n2.canary_before_us, n2.canary_after_us, n2.canary_best_us),
            (990.0, 1020.0, 990.0)
        );
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), t.len());
        let s = gate.stats;
        assert_eq!(
            (s.accepted, s.rejected, s.rejected_by_canary, s.kept_noisy),
            (2, 1, 1, 0)
        );
        assert_eq!(s.canary_best_us, 990.0);
        // the largest slowdown kept: run 1's 0, run 2's 0 (the faster side at the best)
        assert_eq!(s.max_canary_slowdown_kept, 0.0);
    }

    #[test]
    fn one_slow_canary_alone_does_not_reject() {
        // a canary preempted once before the run, the machine at speed after it
        let mut t = PRIMED.to_vec();
        t.extend([3000.0, 1000.0, 1000.0, 3000.0]);
        let (mut gate, _) = scripted(&GateConfig::default(), &t);
        for _ in 0..2 {
            let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
            assert_eq!((n.retakes, n.noisy), (0, false), "{n:?}");
        }
        assert_eq!(gate.stats.rejected, 0);
    }

    #[test]
    fn a_lasting_slowdown_is_kept_as_noisy_then_becomes_the_new_best() {
        let cfg = GateConfig {
            retries: 2,
            ..GateConfig::default()
        };
        // runs at speed first: before 1000, after 1200 (the run's own footprint on the timing
        // after it), then from the 8th run on every timing 50 % slower: 1500 and 1800
        let mut t = PRIMED.to_vec();
        for _ in 0..7 {
            t.extend([1000.0, 1200.0]);
        }
        t.extend([1500.0, 1800.0]);
        let (mut gate, calls) = scripted(&cfg, &t);
        for _ in 0..7 {
            let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
            assert_eq!((n.retakes, n.noisy), (0, false), "{n:?}");
        }
        // each side 50 % over its own best (1000 before, 1200 after)
        let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
        assert_eq!((n.retakes, n.noisy), (2, true));
        assert_eq!((n.canary_best_us, n.canary_best_after_us), (1000.0, 1200.0));
        assert!((n.canary_slowdown() - 0.5).abs() < 1e-12, "{n:?}");
        let s = gate.stats;
        assert_eq!(
            (s.accepted, s.rejected, s.rejected_by_canary, s.kept_noisy),
            (8, 2, 2, 1)
        );
        assert!((s.max_canary_slowdown_kept - 0.5).abs() < 1e-12);
        // 6 priming + 7 runs x 2 + 3 attempts x 2 timings
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 26);
        // each side's window holds CANARY_HISTORY timings of its own; the script's last timing
        // (1800) repeats from here on both sides
        let mut runs = 0;
        loop {
            runs += 1;
            let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
            if !n.noisy {
                assert_eq!((n.canary_best_us, n.canary_best_after_us), (1500.0, 1800.0));
                break;
            }
            assert!(runs < 20, "the best never adapted");
        }
        // the before window (6 primings + 7 at speed, then 1500, 1800, 1800) fills to 32 after
        // 16 more and has lost its 13 at speed after 29; the after window (7 at speed, 3 slow)
        // fills after 22 more and has lost its 7 at speed after 29 too. At the 29th attempt
        // from here the bests are 1500 and 1800 (1800 / 1500 = +20 %, within 25 %): the loop's
        // runs 1 to 9 are noisy (27 attempts), run 10 passes at its 2nd attempt
        assert_eq!(runs, 10);
    }

    #[test]
    fn the_timing_after_a_run_is_judged_against_its_own_best() {
        // on a machine at speed the timing after a run is 30 % over the best before runs (the
        // run left the canary's buffer out of the caches): not a slowdown once the after side
        // has its own best (more than CANARY_PRIMING = 6 timings after runs); a slowed machine
        // before the run (1300, 30 %) with an after timing at the after side's normal is one
        // slow side alone and kept
        let mut t = PRIMED.to_vec();
        for _ in 0..7 {
            t.extend([1000.0, 1300.0]);
        }
        t.extend([1300.0, 1300.0]);
        // then both sides 30 % over their own best: retaken, then at speed again
        t.extend([1300.0, 1690.0, 1000.0, 1300.0]);
        let (mut gate, _) = scripted(&GateConfig::default(), &t);
        for i in 0..8 {
            let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
            assert_eq!((n.retakes, n.noisy), (0, false), "run {i}: {n:?}");
        }
        let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
        assert_eq!((n.retakes, n.noisy), (1, false), "{n:?}");
        assert_eq!((n.canary_best_us, n.canary_best_after_us), (1000.0, 1300.0));
        assert_eq!(gate.stats.rejected_by_canary, 1);
        // the same timings judged against one best for both sides (as stored readings
        // without an after side's best are): the 1300 after runs alone would not reject, but a
        // slow before (1300) with a normal after (1300) would
        let old = CanaryReading {
            before_us: 1300.0,
            after_us: 1300.0,
            best_us: 1000.0,
            best_after_us: 0.0,
        };
        assert!((old.slowdown() - 0.3).abs() < 1e-12);
    }

    #[test]
    fn no_canary_when_it_or_the_gate_is_off() {
        let t = [5000.0];
        for cfg in [
            GateConfig {
                canary: None,
                ..GateConfig::default()
            },
            GateConfig {
                enabled: false,
                ..GateConfig::default()
            },
        ] {
            let (mut gate, calls) = scripted(&cfg, &t);
            let (_, n) = gate.run(|| Ok::<_, ()>(())).unwrap();
            assert_eq!(n, RunNoise::default());
            assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 0);
            assert_eq!(gate.stats.canary_best_us, 0.0);
        }
    }

    #[test]
    fn the_canary_in_words() {
        assert_eq!(GateStats::default().canary_text(), None);
        let s = GateStats {
            rejected: 3,
            rejected_by_canary: 2,
            canary_best_us: 812.4,
            max_canary_slowdown_kept: 0.314,
            ..GateStats::default()
        };
        assert_eq!(
            s.canary_text().unwrap(),
            "the canary (812 µs at best) was slowed around 2 runs /proc saw quiet (retaken), around kept runs by up to +31 % over its recent best"
        );
        let c = crate::profile::noise_check(
            &s,
            &GateConfig {
                max_others: 0.1,
                ..GateConfig::default()
            },
        );
        assert!(
            c.detail.ends_with(&s.canary_text().unwrap()),
            "{}",
            c.detail
        );
    }

    #[test]
    fn stored_gate_settings_and_stats_without_a_canary_still_read() {
        let cfg: GateConfig =
            serde_json::from_str(r#"{"max_others":0.1,"retries":3,"enabled":true}"#).unwrap();
        assert_eq!(cfg.canary, None);
        let stats: GateStats = serde_json::from_str(
            r#"{"accepted":5,"rejected":1,"kept_noisy":0,"max_others_kept":0.02}"#,
        )
        .unwrap();
        assert_eq!((stats.rejected_by_canary, stats.canary_best_us), (0, 0.0));
    }

    #[test]
    fn the_thread_canary_times_its_work() {
        // the real canary: a positive, finite timing on one and on several threads
        for threads in [1, 3] {
            let mut c = ThreadCanary::new(threads);
            assert_eq!(c.threads(), threads as usize);
            let us = c.time_us();
            assert!(us.is_finite() && us > 0.0, "{us}");
        }
    }
}
