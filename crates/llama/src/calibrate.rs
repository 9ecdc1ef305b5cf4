//! What isolating one node costs on this machine, measured through the path TIMED mode takes: a
//! calibration graph of trivial nodes computed by a ggml scheduler on a CPU backend with the same
//! thread pool, once with the instrument's own eval callback answering "yes" at every node (each
//! node asked, computed alone, synchronised and observed, timed from ask to observe exactly as a
//! TIMED node is) and once without a callback (the whole graph in one compute, as FUSED runs).
//! The difference per node is what TIMED mode adds, which decode profiles subtract. The bare
//! measurement of earlier versions (each node a graph of its own, computed straight on the
//! backend, no scheduler, no callback) is kept beside it for comparison.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use crate::context::ThreadPool;
use crate::error::LlamaError;
use crate::observer::{eval_trampoline, ObserveMode, Observer};

/// The calibration's result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct IsolationCost {
    /// Median µs of a trivial node in TIMED mode: asked, computed alone by the scheduler,
    /// synchronised, observed (the instrument's own callback and timing).
    pub timed_us: f64,
    /// µs a trivial node takes inside one graph of many computed by the same scheduler without
    /// a callback (FUSED).
    pub fused_us: f64,
    /// `timed_us - fused_us` (at least 0): what TIMED mode adds to every node.
    pub per_node_us: f64,
    /// The bare measurement: median µs of a trivial node computed as a graph of its own straight
    /// on the backend (no scheduler, no callback), and that minus `fused_us`. For comparison:
    /// it misses the scheduler's and the callback's share of the isolation.
    pub bare_isolated_us: f64,
    pub bare_per_node_us: f64,
    /// Nodes of the calibration graph.
    pub nodes: u32,
    /// Nodes the callback observed over the timed rounds (`nodes` x rounds when every node went
    /// through it).
    pub observed: u32,
}

/// The isolation cost from the calibration's raw timings (pure): the median TIMED node, the
/// median per-node share of the FUSED graph, and their difference (never below 0).
pub fn isolation_from(timed_us: &[f64], fused_graph_us: &[f64], nodes: u32) -> (f64, f64, f64) {
    let median = |v: &[f64]| -> f64 {
        if v.is_empty() {
            return 0.0;
        }
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        }
    };
    let timed = median(timed_us);
    let fused = median(fused_graph_us) / nodes.max(1) as f64;
    (timed, fused, (timed - fused).max(0.0))
}

/// An owned ggml context (tensor metadata only).
struct GgmlContext(NonNull<sys::ggml_context>);

impl Drop for GgmlContext {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_init and is freed once, after the scheduler that
        // allocated its tensors (dropped first: declared later).
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

/// An owned CPU backend.
struct CpuBackend(NonNull<sys::ggml_backend>);

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_backend_cpu_init and is freed once, after the
        // scheduler using it.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// An owned scheduler.
struct Sched(NonNull<sys::ggml_backend_sched>);

impl Drop for Sched {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_backend_sched_new and is freed once; it frees the
        // buffers it allocated for the graph.
        unsafe { sys::ggml_backend_sched_free(self.0.as_ptr()) }
    }
}

/// Measures the isolation cost with a chain of `nodes` trivial element-wise additions (each
/// split over all threads, as real nodes are), computed `rounds` times each way; medians.
pub fn isolation_cost(
    pool: &ThreadPool,
    nodes: u32,
    rounds: u32,
) -> Result<IsolationCost, LlamaError> {
    let nodes = nodes.max(2);
    let rounds = rounds.max(1);
    let width: i64 = 256 * pool.threads() as i64;
    // SAFETY: size queries only.
    let mem_size = unsafe {
        sys::ggml_tensor_overhead() * (nodes as usize + 8)
            + sys::ggml_graph_overhead_custom(nodes as usize + 8, false)
            + nodes as usize * sys::ggml_graph_overhead_custom(1, false)
    };
    let params = sys::ggml_init_params {
        mem_size,
        mem_buffer: std::ptr::null_mut(),
        no_alloc: true,
    };
    // SAFETY: ggml_init with no_alloc makes a context holding metadata only; owned or null.
    let ctx = GgmlContext(
        NonNull::new(unsafe { sys::ggml_init(params) })
            .ok_or_else(|| LlamaError::Invalid("ggml_init failed".into()))?,
    );
    // SAFETY: ggml_backend_cpu_init returns an owned backend or null.
    let backend = CpuBackend(
        NonNull::new(unsafe { sys::ggml_backend_cpu_init() })
            .ok_or_else(|| LlamaError::Invalid("ggml_backend_cpu_init failed".into()))?,
    );
    // The instrument, in TIMED mode; boxed so its address stays fixed while ggml holds it.
    let mut observer = Box::new(Observer::new());
    // SAFETY: the backend is ours and the pool outlives this function. The scheduler gets an
    // array of one CPU backend (ggml requires the last to be the CPU), default buffer types and
    // room for the graph; it allocates the graph's tensors in its own buffers. Tensors and
    // graphs live in ctx (sized above for nodes + 8 tensors, the chain's graph and one graph of
    // one node per node). The callback's user
    // data is the boxed Observer, which nothing else touches while the scheduler computes and
    // which outlives the scheduler (dropped after it). Data handed to ggml_backend_tensor_set
    // is exactly the tensors' byte size.
    unsafe {
        sys::ggml_backend_cpu_set_n_threads(backend.0.as_ptr(), pool.threads() as i32);
        sys::ggml_backend_cpu_set_threadpool(backend.0.as_ptr(), pool.as_ptr());
        let mut backends = [backend.0.as_ptr()];
        let sched = Sched(
            NonNull::new(sys::ggml_backend_sched_new(
                backends.as_mut_ptr(),
                std::ptr::null_mut(),
                1,
                nodes as usize + 8,
                false,
                false,
            ))
            .ok_or_else(|| LlamaError::Invalid("ggml_backend_sched_new failed".into()))?,
        );
        let c = ctx.0.as_ptr();
        let a = sys::ggml_new_tensor_1d(c, sys::GGML_TYPE_F32, width);
        let b = sys::ggml_new_tensor_1d(c, sys::GGML_TYPE_F32, width);
        sys::ggml_set_input(a);
        sys::ggml_set_input(b);
        // a chain, as a real graph is: every node reads the one before
        let mut y = a;
        for _ in 0..nodes {
            y = sys::ggml_add(c, y, b);
        }
        sys::ggml_set_output(y);
        let graph = sys::ggml_new_graph_custom(c, nodes as usize + 8, false);
        sys::ggml_build_forward_expand(graph, y);
        if !sys::ggml_backend_sched_alloc_graph(sched.0.as_ptr(), graph) {
            return Err(LlamaError::Invalid(
                "allocating the calibration graph failed".into(),
            ));
        }
        let zeros = vec![0f32; width as usize];
        for t in [a, b] {
            sys::ggml_backend_tensor_set(t, zeros.as_ptr().cast(), 0, zeros.len() * 4);
        }
        let sched_compute = |what: &str| -> Result<(), LlamaError> {
            let status = sys::ggml_backend_sched_graph_compute(sched.0.as_ptr(), graph);
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(LlamaError::Invalid(format!(
                    "calibration graph ({what}) failed ({status})"
                )));
            }
            Ok(())
        };
        let set_callback = |on: bool, obs: *mut Observer| {
            if on {
                sys::ggml_backend_sched_set_eval_callback(
                    sched.0.as_ptr(),
                    Some(eval_trampoline),
                    obs.cast::<c_void>(),
                );
            } else {
                sys::ggml_backend_sched_set_eval_callback(
                    sched.0.as_ptr(),
                    None,
                    std::ptr::null_mut(),
                );
            }
        };
        // the bare path: each node of the chain a graph of its own, straight on the backend
        let mut singles = Vec::with_capacity(nodes as usize);
        for i in 0..sys::ggml_graph_n_nodes(graph) {
            let g = sys::ggml_new_graph_custom(c, 1, false);
            sys::ggml_graph_add_node(g, sys::ggml_graph_node(graph, i));
            singles.push(g);
        }
        let bare_compute = |g: *mut sys::ggml_cgraph| -> Result<(), LlamaError> {
            let status = sys::ggml_backend_graph_compute(backend.0.as_ptr(), g);
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(LlamaError::Invalid(format!(
                    "calibration node failed ({status})"
                )));
            }
            sys::ggml_backend_synchronize(backend.0.as_ptr());
            Ok(())
        };
        let obs: *mut Observer = &mut *observer;
        // warm the pool and the buffers up, both ways
        set_callback(false, obs);
        sched_compute("fused")?;
        (*obs).reset(ObserveMode::Timed);
        set_callback(true, obs);
        sched_compute("timed")?;
        let mut timed = Vec::with_capacity((nodes * rounds) as usize);
        let mut fused = Vec::with_capacity(rounds as usize);
        let mut bare = Vec::with_capacity((nodes * rounds) as usize);
        let mut observed = 0u32;
        for _ in 0..rounds {
            // TIMED: the instrument answers "yes" to every ask
            (*obs).reset(ObserveMode::Timed);
            set_callback(true, obs);
            sched_compute("timed")?;
            if let Some(msg) = (*obs).panic.take() {
                return Err(LlamaError::CallbackPanicked(msg));
            }
            observed += (*obs).timed_ns.len() as u32;
            timed.extend((*obs).timed_ns.iter().map(|&ns| ns as f64 / 1e3));
            // FUSED: no callback, the chain in one compute
            set_callback(false, obs);
            let t0 = Instant::now();
            sched_compute("fused")?;
            fused.push(t0.elapsed().as_secs_f64() * 1e6);
            // the bare path of earlier versions
            for &g in &singles {
                let t0 = Instant::now();
                bare_compute(g)?;
                bare.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        set_callback(false, obs);
        drop(sched);
        pool.pause();
        let (timed_us, fused_us, per_node_us) = isolation_from(&timed, &fused, nodes);
        let (bare_isolated_us, _, bare_per_node_us) = isolation_from(&bare, &fused, nodes);
        Ok(IsolationCost {
            timed_us,
            fused_us,
            per_node_us,
            bare_isolated_us,
            bare_per_node_us,
            nodes,
            observed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_isolation_cost_is_the_timed_node_less_its_share_of_the_fused_graph() {
        // 4 nodes: TIMED nodes of 9, 10, 11, 30 µs (median 10.5); FUSED graphs of 8, 12, 9 µs
        // (median 9, so 2.25 µs a node)
        let (timed, fused, per) = isolation_from(&[9.0, 30.0, 10.0, 11.0], &[8.0, 12.0, 9.0], 4);
        assert_eq!((timed, fused, per), (10.5, 2.25, 8.25));
        // a TIMED node cheaper than its fused share costs nothing to isolate, never less
        assert_eq!(isolation_from(&[1.0], &[40.0], 4).2, 0.0);
    }
}
