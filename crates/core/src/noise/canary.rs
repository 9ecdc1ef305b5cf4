//! The canary: a small fixed workload (arithmetic and a pass over a buffer larger than a core's
//! own caches, on as many threads as the engine uses) timed right before and right after every
//! measured run. What slows a guest without another process of it using the CPUs (a CPU quota,
//! the hypervisor, shared memory bandwidth, a lower clock, the process being stopped) is
//! invisible to /proc, but slows the canary as it slows the run; a run whose canary was slower
//! than the canary's recent best by more than the gate's threshold is retaken.
//!
//! The canary only sees what lasts into its own millisecond: a slowdown that starts and ends
//! inside a run, between the two canaries, escapes it (the run's wall still shows it, in the
//! spread over cycles).

use std::collections::VecDeque;
use std::hint::black_box;
use std::time::Instant;

/// Default threshold: both canaries of a run more than this much slower than the canary's recent
/// best (0.25 = 25 %) mark the run between them as measured on a slowed machine (see
/// ARCHITECTURE.md, "The canary", for the canary's own spread).
pub const DEFAULT_CANARY_SLOWDOWN: f64 = 0.25;
/// The canary's recent best is the fastest of its last this many timings: a lasting change of
/// the machine's speed becomes the new normal after this many, a passing one is retaken.
pub const CANARY_HISTORY: usize = 32;
/// Timings taken to learn the canary's best before the first judged run.
pub const CANARY_PRIMING: usize = 6;

/// Bytes each thread of the canary reads per timing: past a core's own L2, so that shared
/// memory bandwidth shows.
const BYTES_PER_THREAD: usize = 2 << 20;
/// Dependent floating-point multiply-adds each thread does per timing, about 0.7 ms (a chain the compiler
/// cannot shorten: floating-point arithmetic is not reassociated).
const SPINS: u32 = 500_000;

/// One timing of a workload, in microseconds: what the gate calls around every run. The real
/// one is [`ThreadCanary`]; tests give scripted timings.
pub trait Canary: Send {
    fn time_us(&mut self) -> f64;
}

/// The canary on `threads` threads (scoped: the calling thread takes one share, the others are
/// spawned for the timing and joined in it, as an engine's thread pool wakes for a graph).
pub struct ThreadCanary {
    threads: usize,
    buffer: Vec<u64>,
}

impl ThreadCanary {
    pub fn new(threads: u32) -> ThreadCanary {
        let threads = threads.max(1) as usize;
        let words = threads * BYTES_PER_THREAD / 8;
        // written, not only allocated: the pages are there before the first timing
        let buffer = (0..words as u64)
            .map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15))
            .collect();
        ThreadCanary { threads, buffer }
    }

    pub fn threads(&self) -> usize {
        self.threads
    }
}

/// One thread's share: a chain of dependent multiply-adds (the core's clock), then a pass over
/// its part of the buffer, one word per cache line (memory bandwidth).
fn share(part: &[u64]) -> u64 {
    let mut x = (part.first().copied().unwrap_or(1) % 1000) as f64;
    for _ in 0..SPINS {
        x = x * 0.999_999_9 + 1e-7;
    }
    let mut sum = 0u64;
    for w in part.iter().step_by(8) {
        sum = sum.wrapping_add(*w);
    }
    x.to_bits() ^ sum
}

impl Canary for ThreadCanary {
    fn time_us(&mut self) -> f64 {
        let chunk = self.buffer.len().div_ceil(self.threads).max(1);
        let t0 = Instant::now();
        std::thread::scope(|s| {
            let mut parts = self.buffer.chunks(chunk);
            let mine = parts.next().unwrap_or(&[]);
            let others: Vec<_> = parts
                .map(|p| s.spawn(move || black_box(share(black_box(p)))))
                .collect();
            black_box(share(black_box(mine)));
            for h in others {
                // a canary thread cannot panic; a join error would only mean no timing
                let _ = h.join();
            }
        });
        t0.elapsed().as_secs_f64() * 1e6
    }
}

/// The canary's timings so far, and the verdict on a run between two of them.
///
/// A timing right after a run is slower than one before it on a machine at speed: the run has
/// just evicted the canary's buffer from the caches and the engine's threads may still be
/// spinning (on the 2-core development VM the timings after runs were at least 16 % over the
/// best timing before a run in nine cases of ten, the median 26 %, against 12 % before). Each
/// side is therefore judged against its own recent best; until enough timings after runs were
/// taken, against the best of all timings.
pub struct CanaryState {
    canary: Box<dyn Canary>,
    recent: VecDeque<f64>,
    recent_after: VecDeque<f64>,
}

/// What the canary saw around one run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CanaryReading {
    pub before_us: f64,
    pub after_us: f64,
    /// The fastest of the recent timings before runs (and of the priming), these two included.
    pub best_us: f64,
    /// The fastest of the recent timings after runs, this one included, once more than
    /// [`CANARY_PRIMING`] were taken; before that, `best_us`. 0 (readings stored before the
    /// sides were told apart): `best_us`.
    pub best_after_us: f64,
}

impl CanaryReading {
    /// How much slower than its side's best the less slowed of the two timings was (0.3 = 30
    /// %): a slowdown on both sides of the run, which therefore lasted through it. One slow
    /// timing alone (the canary's thread preempted once, a slowdown that ended before the run
    /// began or began after it ended) does not count.
    pub fn slowdown(&self) -> f64 {
        if self.best_us > 0.0 {
            let best_after = if self.best_after_us > 0.0 {
                self.best_after_us
            } else {
                self.best_us
            };
            (self.before_us / self.best_us).min(self.after_us / best_after) - 1.0
        } else {
            0.0
        }
    }
}

fn push(recent: &mut VecDeque<f64>, us: f64) {
    if us.is_finite() && us > 0.0 {
        if recent.len() == CANARY_HISTORY {
            recent.pop_front();
        }
        recent.push_back(us);
    }
}

fn best(recent: &VecDeque<f64>) -> f64 {
    let b = recent.iter().copied().fold(f64::INFINITY, f64::min);
    if b.is_finite() {
        b
    } else {
        0.0
    }
}

impl CanaryState {
    pub fn new(canary: Box<dyn Canary>) -> CanaryState {
        CanaryState {
            canary,
            recent: VecDeque::with_capacity(CANARY_HISTORY),
            recent_after: VecDeque::with_capacity(CANARY_HISTORY),
        }
    }

    /// The timing before a run (learning the canary's best first, on the first call).
    pub fn before(&mut self) -> f64 {
        if self.recent.is_empty() {
            for _ in 0..CANARY_PRIMING {
                let us = self.canary.time_us();
                push(&mut self.recent, us);
            }
        }
        self.canary.time_us()
    }

    /// The timing after a run, and the reading of the run between `before_us` and it.
    pub fn after(&mut self, before_us: f64) -> CanaryReading {
        let after_us = self.canary.time_us();
        push(&mut self.recent, before_us);
        push(&mut self.recent_after, after_us);
        let best_us = best(&self.recent);
        let best_after_us = if self.recent_after.len() > CANARY_PRIMING {
            best(&self.recent_after)
        } else {
            // too few timings after runs to know their own best: the best of all of them
            best_us.min(best(&self.recent_after))
        };
        CanaryReading {
            before_us,
            after_us,
            best_us,
            best_after_us,
        }
    }
}
