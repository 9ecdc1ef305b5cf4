//! The noise gate: CPU time other processes used while a sample was taken, from /proc/stat minus
//! this process's own (/proc/self/stat, all threads). A sample taken while others used more than
//! a set share of the machine's CPUs is rejected and retaken, and the rejections are counted.

use std::time::Instant;

use serde::{Deserialize, Serialize};

/// Default share of the machine's CPU time others may use during a sample.
pub const DEFAULT_MAX_OTHERS: f64 = 0.10;
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

/// `/proc/self/stat`: utime and stime (fields 14 and 15), after the parenthesised command name
/// (which may itself contain spaces or parentheses).
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

/// The gate's settings.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct GateConfig {
    /// Reject a sample when others used more than this share of all CPU time during it.
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
    /// The largest share of CPU others used during a kept sample.
    pub max_others_kept: f64,
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
        let before = if cfg.enabled { read_ticks() } else { None };
        let t0 = Instant::now();
        let value = sample()?;
        let elapsed = t0.elapsed();
        let share = match (before, read_ticks()) {
            (Some(b), Some(a)) if cfg.enabled && elapsed.as_millis() >= 20 => others_share(b, a),
            _ => 0.0,
        };
        if share <= cfg.max_others {
            stats.accepted += 1;
            stats.max_others_kept = stats.max_others_kept.max(share);
            return Ok(value);
        }
        if attempt >= cfg.retries {
            stats.accepted += 1;
            stats.kept_noisy += 1;
            stats.max_others_kept = stats.max_others_kept.max(share);
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
