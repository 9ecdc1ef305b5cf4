//! The noise gate against a real competing process: a busy loop started beside the sampler makes
//! it reject samples, on a machine of any size (the busy loop is one whole CPU, whatever share of
//! the machine that is). No test asserts that the machine is otherwise quiet: it need not be.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use opledger_core::noise::{gated, GateConfig, GateStats, DEFAULT_MAX_OTHERS};

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
