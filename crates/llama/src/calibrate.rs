//! What isolating one node costs on this machine, measured on a calibration graph of trivial
//! nodes with the same thread pool and thread count: each node computed as its own graph (as
//! TIMED mode does) against all of them in one graph (as FUSED does). The difference per node is
//! what TIMED mode adds, which decode profiles subtract.

use std::ptr::NonNull;
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use crate::context::ThreadPool;
use crate::error::LlamaError;

/// The calibration's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsolationCost {
    /// Median µs of a trivial node computed alone (graph of one node, then synchronised).
    pub isolated_us: f64,
    /// µs a trivial node takes inside one graph of many.
    pub fused_us: f64,
    /// `isolated_us - fused_us` (at least 0): what TIMED mode adds to every node.
    pub per_node_us: f64,
    pub nodes: u32,
}

/// An owned ggml context (host memory).
struct GgmlContext(NonNull<sys::ggml_context>);

impl Drop for GgmlContext {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_init and is freed once.
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

/// An owned CPU backend.
struct CpuBackend(NonNull<sys::ggml_backend>);

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_backend_cpu_init and is freed once.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// Measures the isolation cost with `nodes` trivial element-wise additions (each split over all
/// threads, as real nodes are), repeated `rounds` times; medians.
pub fn isolation_cost(
    pool: &ThreadPool,
    nodes: u32,
    rounds: u32,
) -> Result<IsolationCost, LlamaError> {
    let nodes = nodes.max(2);
    let width: i64 = 256;
    let params = sys::ggml_init_params {
        mem_size: 1 << 24,
        mem_buffer: std::ptr::null_mut(),
        no_alloc: false,
    };
    // SAFETY: ggml_init allocates its own buffer (mem_buffer is null) and returns an owned
    // context or null.
    let ctx = GgmlContext(
        NonNull::new(unsafe { sys::ggml_init(params) })
            .ok_or_else(|| LlamaError::Invalid("ggml_init failed".into()))?,
    );
    // SAFETY: ggml_backend_cpu_init returns an owned backend or null.
    let backend = CpuBackend(
        NonNull::new(unsafe { sys::ggml_backend_cpu_init() })
            .ok_or_else(|| LlamaError::Invalid("ggml_backend_cpu_init failed".into()))?,
    );
    // SAFETY: every tensor and graph lives in ctx (16 MiB is ample for a few hundred 1 KiB
    // tensors and two graphs); the backend computes host tensors of ctx with the thread pool,
    // which outlives this function; pointers handed to ggml come from ggml itself.
    unsafe {
        sys::ggml_backend_cpu_set_n_threads(backend.0.as_ptr(), pool.threads() as i32);
        sys::ggml_backend_cpu_set_threadpool(backend.0.as_ptr(), pool.as_ptr());
        let a = sys::ggml_new_tensor_1d(
            ctx.0.as_ptr(),
            sys::GGML_TYPE_F32,
            width * pool.threads() as i64,
        );
        let b = sys::ggml_new_tensor_1d(
            ctx.0.as_ptr(),
            sys::GGML_TYPE_F32,
            width * pool.threads() as i64,
        );
        sys::ggml_set_zero(a);
        sys::ggml_set_zero(b);
        let all = sys::ggml_new_graph(ctx.0.as_ptr());
        let mut singles = Vec::with_capacity(nodes as usize);
        for _ in 0..nodes {
            let y = sys::ggml_add(ctx.0.as_ptr(), a, b);
            sys::ggml_build_forward_expand(all, y);
            let g = sys::ggml_new_graph(ctx.0.as_ptr());
            sys::ggml_build_forward_expand(g, y);
            singles.push(g);
        }
        let compute = |g: *mut sys::ggml_cgraph| -> Result<(), LlamaError> {
            let status = sys::ggml_backend_graph_compute(backend.0.as_ptr(), g);
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(LlamaError::Invalid(format!(
                    "calibration graph failed ({status})"
                )));
            }
            sys::ggml_backend_synchronize(backend.0.as_ptr());
            Ok(())
        };
        // warm the pool up
        compute(all)?;
        let mut isolated = Vec::with_capacity((nodes * rounds.max(1)) as usize);
        let mut fused = Vec::with_capacity(rounds.max(1) as usize);
        for _ in 0..rounds.max(1) {
            for &g in &singles {
                let t0 = Instant::now();
                compute(g)?;
                isolated.push(t0.elapsed().as_secs_f64() * 1e6);
            }
            let t0 = Instant::now();
            compute(all)?;
            fused.push(t0.elapsed().as_secs_f64() * 1e6 / nodes as f64);
        }
        let median = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let isolated_us = median(&mut isolated);
        let fused_us = median(&mut fused);
        Ok(IsolationCost {
            isolated_us,
            fused_us,
            per_node_us: (isolated_us - fused_us).max(0.0),
            nodes,
        })
    }
}
