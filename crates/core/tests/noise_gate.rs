//! The noise gate against a real competing process: a busy loop started beside the sampler makes
//! it reject samples, on a machine of any size (the busy loop is one whole CPU, whatever share of
//! the machine that is). No test asserts that the machine is otherwise quiet: it need not be.
//! The other half, that a quiet machine is not rejected (no false rejections: this process's own
//! threads, the counters' rounding), is tested on the gate's judgement of snapshots whose
//! counters are set by hand, from a real snapshot of this machine (its CPUs and processes).

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use opledger_core::noise::{
    gated, read_snapshot, reading, GateConfig, GateStats, Snapshot, DEFAULT_MAX_OTHERS,
    MIN_PROCESS_TICKS,
};

/// Spins this thread for `ms`: a sample that uses one core.
fn spin(ms: u64) -> Result<u64, ()> {
    let t0 = Instant::now();
    let mut x = 0u64;
    while t0.elapsed() < Duration::from_millis(ms) {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
    }
    Ok(x)
}

fn rate(samples: u32) -> (f64, GateStats) {
    let cfg = GateConfig {
        retries: 0,
        ..GateConfig::default()
    };
    let mut stats = GateStats::default();
    let mut rejected_first = 0;
    for _ in 0..samples {
        let before = stats.rejected + stats.kept_noisy;
        gated(&cfg, &mut stats, || spin(120)).unwrap();
        if stats.rejected + stats.kept_noisy > before {
            rejected_first += 1;
        }
    }
    (rejected_first as f64 / samples as f64, stats)
}

struct Busy(Child);

impl Drop for Busy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_busy_neighbour_is_rejected_on_a_machine_of_any_size() {
    let busy = Busy(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("starting a busy loop"),
    );
    std::thread::sleep(Duration::from_millis(200));
    let (noisy, stats) = rate(10);
    drop(busy);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!("{cpus} CPUs: rejection rate with a busy loop {noisy:.2} ({stats:?})");
    assert!(
        noisy >= 0.8,
        "the gate let a busy neighbour through on {cpus} CPUs: {noisy:.2}"
    );
    // the busy loop (or something busier) showed as a share of one CPU, not of the machine
    assert!(
        stats.max_busiest_kept > DEFAULT_MAX_OTHERS,
        "busiest other process {:.2} of a CPU",
        stats.max_busiest_kept
    );
}

/// `before` as it would read after a sample of `ticks` clock ticks of wall on every CPU in which
/// this process used `own` ticks (over all its threads) and nothing else ran.
fn quiet_after(before: &Snapshot, ticks: u64, own: u64) -> Snapshot {
    let mut after = before.clone();
    after.machine.total += ticks * before.cpus as u64;
    after.machine.busy += own;
    after.machine.own += own;
    after
}

#[test]
fn a_quiet_machine_is_not_rejected_and_one_busy_neighbour_is() {
    let mut before = read_snapshot().expect("/proc is readable");
    if before.processes.is_empty() {
        // a machine where this process is alone: one idle neighbour to move by hand
        before.processes.push((u32::MAX - 1, 100));
    }
    let cpus = before.cpus as u64;
    let quiet = |r: opledger_core::noise::Reading| !r.noisy(DEFAULT_MAX_OTHERS);
    // a 120 ms sample (12 ticks) of this process alone on one CPU
    let alone = quiet_after(&before, 12, 12);
    let r = reading(&before, &alone);
    assert!(quiet(r), "{r:?}");
    assert_eq!((r.machine_share, r.busiest_share_of_cpu), (0.0, 0.0));
    // this process's threads on every CPU: its own work, however wide, is no neighbour
    let wide = quiet_after(&before, 12, 12 * cpus);
    let r = reading(&before, &wide);
    assert!(quiet(r) && r.machine_share == 0.0, "{r:?}");
    // another process moving by one tick is the counters' rounding, not a neighbour's work
    let mut rounding = quiet_after(&before, 12, 12);
    rounding.machine.busy += 1;
    let last = rounding.processes.len() - 1;
    rounding.processes[last].1 += MIN_PROCESS_TICKS - 1;
    let r = reading(&before, &rounding);
    assert_eq!(r.busiest_share_of_cpu, 0.0, "{r:?}");
    if 12 * cpus >= 10 {
        // one tick of the machine's 12 x CPUs is within the machine-wide threshold
        assert!(quiet(r), "{r:?}");
    }
    // a process that started during the sample and used 1 tick counts all of it, still rounding
    let mut newcomer = quiet_after(&before, 12, 12);
    newcomer.processes.push((u32::MAX, 1));
    assert_eq!(reading(&before, &newcomer).busiest_share_of_cpu, 0.0);
    // the rejecting half, controlled: a neighbour using 2 of the 12 ticks (a sixth of one CPU)
    let mut neighbour = quiet_after(&before, 12, 12);
    neighbour.machine.busy += 2;
    neighbour.processes[last].1 += 2;
    let r = reading(&before, &neighbour);
    assert!((r.busiest_share_of_cpu - 2.0 / 12.0).abs() < 1e-12, "{r:?}");
    assert_eq!(r.busiest_pid, before.processes[last].0);
    assert!(!quiet(r), "{r:?}");
}
