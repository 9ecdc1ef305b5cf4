//! The noise gate against a real competing process: a busy loop started on the other core makes
//! it reject samples; without it, it rejects (almost) none.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use opledger_core::noise::{gated, GateConfig, GateStats};

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
fn a_busy_neighbour_is_rejected_and_a_quiet_machine_is_not() {
    let (quiet, _) = rate(10);
    let busy = Busy(
        Command::new("sh")
            .args(["-c", "while :; do :; done"])
            .spawn()
            .expect("starting a busy loop"),
    );
    std::thread::sleep(Duration::from_millis(200));
    let (noisy, stats) = rate(10);
    drop(busy);
    eprintln!("rejection rate quiet {quiet:.2}, with a busy loop {noisy:.2} ({stats:?})");
    assert!(
        noisy >= 0.8,
        "the gate let a busy neighbour through: {noisy:.2}"
    );
    assert!(
        quiet <= 0.2,
        "the gate rejected a quiet machine's samples: {quiet:.2}"
    );
}
