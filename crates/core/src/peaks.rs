//! This machine's practical peaks, measured: copy bandwidth (read + write counted) with one
//! thread per CPU, for the roofline of a ledger. The matmul peak comes from the engine (a GEMM
//! of its own kernels).

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::node::{NodeInfo, TensorDesc};

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

/// The GEMM probe's shape: F32 weights `[K, N]` times activations `[K, M]`.
pub const GEMM_PROBE_KNM: (i64, i64, i64) = (4096, 4096, 512);

/// Timed repetitions of the GEMM probe (after its warm-up).
pub const GEMM_PROBE_REPS: u32 = 5;

/// The GEMM probe as a node every engine's op timer rebuilds and times alone: a MUL_MAT of F32
/// weights `[4096, 4096]` by F32 activations `[4096, 512]`, packed. `op_code` is the engine's
/// number for MUL_MAT where it needs one (the worker finds the op by its name).
pub fn gemm_probe(op_code: Option<u32>) -> NodeInfo {
    let (k, n, m) = GEMM_PROBE_KNM;
    let desc = |name: &str, ne: [i64; 4], weight: bool| TensorDesc {
        name: name.into(),
        ne,
        ggml_type: "f32".into(),
        size_bytes: (ne[0] * ne[1] * 4) as u64,
        is_weight: weight,
        producer: None,
        nb: [
            4,
            4 * ne[0] as u64,
            4 * (ne[0] * ne[1]) as u64,
            4 * (ne[0] * ne[1]) as u64,
        ],
    };
    NodeInfo {
        index: 0,
        op: "MUL_MAT".into(),
        name: "gemm_probe".into(),
        layer: None,
        out: desc("out", [n, m, 1, 1], false),
        srcs: vec![
            Some(desc("w", [k, n, 1, 1], true)),
            Some(desc("x", [k, m, 1, 1], false)),
        ],
        is_view: false,
        inplace: false,
        skipped: false,
        op_code,
        op_params: Vec::new(),
        device: None,
    }
}

/// The GEMM peak from the probe's median time: (GFLOP/s, the shape it computed). `None` for a
/// time that is not a positive finite figure.
pub fn gemm_peak_of(median_us: f64) -> Option<(f64, String)> {
    if !(median_us.is_finite() && median_us > 0.0) {
        return None;
    }
    let (k, n, m) = GEMM_PROBE_KNM;
    let flops = 2.0 * (k * n * m) as f64;
    Some((
        flops / (median_us / 1e6) / 1e9,
        format!("F32 {k}x{n} x {k}x{m}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gemm_probe_is_one_packed_f32_matmul_and_its_peak_counts_two_flops_per_multiply_add() {
        let p = gemm_probe(Some(29));
        assert_eq!((p.op.as_str(), p.op_code), ("MUL_MAT", Some(29)));
        let (w, x) = (p.src(0).unwrap(), p.src(1).unwrap());
        assert!(w.is_weight && !x.is_weight);
        assert_eq!(
            (w.ne, x.ne, p.out.ne),
            ([4096, 4096, 1, 1], [4096, 512, 1, 1], [4096, 512, 1, 1])
        );
        assert_eq!(w.nb, [4, 16384, 4096 * 16384, 4096 * 16384]);
        assert_eq!(w.size_bytes, 64 << 20);
        // 2 x 4096 x 4096 x 512 = 17.18 GFLOP in 1 s
        let (gflops, shape) = gemm_peak_of(1e6).unwrap();
        assert!((gflops - 17.179_869_184).abs() < 1e-9, "{gflops}");
        assert_eq!(shape, "F32 4096x4096 x 4096x512");
        assert_eq!(gemm_peak_of(0.0), None);
        assert_eq!(gemm_peak_of(f64::NAN), None);
    }

    #[test]
    fn copy_bandwidth_is_a_positive_finite_rate() {
        // 8 MiB is enough to exercise the code path; the figure itself is for benchmarks
        let r = super::copy_bandwidth_gb_per_s(8 << 20, 2, 2);
        assert!(r.is_finite() && r > 0.0);
    }
}
