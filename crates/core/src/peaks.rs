//! This machine's practical peaks, measured: copy bandwidth (read + write counted) with one
//! thread per CPU, for the roofline of a ledger. The matmul peak comes from the engine (a GEMM
//! of its own kernels).

use std::time::Instant;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Peaks {
    /// Copy bandwidth, bytes read plus written per second, in GB/s.
    pub copy_gb_per_s: f64,
    /// Matmul throughput of the engine's own kernel, GFLOP/s, where measured.
    pub gemm_gflop_per_s: Option<f64>,
    /// What the GEMM probe computed.
    pub gemm_shape: Option<String>,
}

/// Copies `bytes` (split over `threads` threads) `reps` times; the median GB/s, counting the
/// bytes read and the bytes written.
pub fn copy_bandwidth_gb_per_s(bytes: usize, threads: usize, reps: u32) -> f64 {
    let threads = threads.max(1);
    let per = (bytes / threads).max(1);
    let mut src: Vec<Vec<u8>> = (0..threads).map(|t| vec![t as u8 + 1; per]).collect();
    let mut dst: Vec<Vec<u8>> = (0..threads).map(|_| vec![0u8; per]).collect();
    let mut rates = Vec::new();
    for _ in 0..reps.max(1) {
        let t0 = Instant::now();
        std::thread::scope(|s| {
            for (d, src) in dst.iter_mut().zip(&src) {
                s.spawn(move || d.copy_from_slice(src));
            }
        });
        let secs = t0.elapsed().as_secs_f64();
        rates.push(2.0 * (per * threads) as f64 / secs / 1e9);
        // keep the source live and changing so nothing is optimised away
        src[0][0] = src[0][0].wrapping_add(dst[0][0]);
    }
    rates.sort_by(f64::total_cmp);
    rates[rates.len() / 2]
}

#[cfg(test)]
mod tests {
    #[test]
    fn copy_bandwidth_is_a_positive_finite_rate() {
        // 8 MiB is enough to exercise the code path; the figure itself is for benchmarks
        let r = super::copy_bandwidth_gb_per_s(8 << 20, 2, 2);
        assert!(r.is_finite() && r > 0.0);
    }
}
