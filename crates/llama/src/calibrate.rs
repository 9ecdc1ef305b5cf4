//! What isolating one node costs on this machine, measured through the path TIMED mode takes: a
//! calibration graph of trivial nodes computed by a ggml scheduler on a CPU backend with the same
//! thread pool, once with the instrument's own eval callback answering "yes" at every node (each
//! node asked, computed alone, synchronised and observed, timed from ask to observe exactly as a
//! TIMED node is) and once without a callback (the whole graph in one compute, as FUSED runs).
//!
//! What a TIMED node pays depends on what the pool did just before it. A view, and an op ggml
//! does not split (SUM_ROWS, GET_ROWS, SIGMOID, ...), is computed on one thread; ggml's other
//! workers, seeing a graph without work for them, go to sleep on the pool's condition variable,
//! and the next node split over the threads must wake them (10-20 µs on a virtual machine, where
//! a bare graph compute of a trivial node takes 1 µs). So the calibration graph is dispatched as
//! the graph being profiled is, node for node ([`Dispatch`], from ggml's own plan of each
//! captured node): a view for a node without work, a trivial SIGMOID (one thread) or ADD (every
//! thread) for a working one, in the same order. The isolation cost is the TIMED time of the
//! working nodes less their FUSED time, per working node (views do no work and are not
//! corrected).
//!
//! The bare measurement of earlier versions (each working node a graph of its own, computed
//! straight on the backend, no scheduler, no callback, no views between) is kept beside it for
//! comparison.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use crate::error::LlamaError;
use crate::ggml::{CpuBackend, GgmlContext, Sched};
use crate::observer::{eval_trampoline, ObserveMode, Observer};
use crate::threadpool::ThreadPool;

pub use opledger_core::calibration::{isolation_from, CalibrationRound, Dispatch};

/// The calibration's result.
#[derive(Debug, Clone, PartialEq)]
pub struct IsolationCost {
    /// Mean µs of a working node in TIMED mode: asked, computed alone by the scheduler,
    /// synchronised, observed (the instrument's own callback and timing).
    pub timed_us: f64,
    /// µs a working node takes inside the whole graph computed by the same scheduler without a
    /// callback (FUSED), per working node.
    pub fused_us: f64,
    /// The mean of `each_node_us` over the working nodes: what TIMED mode adds to a working
    /// node on average.
    pub per_node_us: f64,
    /// Per node of the calibration graph (the pattern's order): the mean over rounds of its
    /// TIMED time less a working node's FUSED share, at least 0; 0 for a node without work. A
    /// node's isolation depends on what the pool did before it (a node after one computed on
    /// one thread wakes the sleeping workers), so the correction is node by node.
    pub each_node_us: Vec<f64>,
    /// The bare measurement: median µs of a trivial working node computed as a graph of its own
    /// straight on the backend (no scheduler, no callback, nothing before it), and that minus
    /// `fused_us`. For comparison: it misses the scheduler's, the callback's and the pool's
    /// share.
    pub bare_isolated_us: f64,
    pub bare_per_node_us: f64,
    /// Nodes of the calibration graph, and those that work.
    pub nodes: u32,
    pub working: u32,
    /// Nodes the callback observed over the timed rounds (`nodes` x rounds when every node went
    /// through it).
    pub observed: u32,
}

/// Measures the isolation cost on a calibration graph that follows `pattern`, node for node: a
/// view for an idle node, a trivial SIGMOID (one thread) or ADD (every thread) for a working
/// one (an empty pattern, or one without work: 64 ADDs); computed `rounds` times each way.
pub fn isolation_cost(
    pool: &ThreadPool,
    pattern: &[Dispatch],
    rounds: u32,
) -> Result<IsolationCost, LlamaError> {
    let pattern: Vec<Dispatch> = if pattern.iter().any(|&d| d != Dispatch::Idle) {
        pattern.to_vec()
    } else {
        vec![Dispatch::AllThreads; 64]
    };
    let nodes = pattern.len();
    let rounds = rounds.max(1);
    let width: i64 = 256 * pool.threads() as i64;
    // SAFETY: size queries only.
    let mem_size = unsafe {
        sys::ggml_tensor_overhead() * (nodes + 8)
            + sys::ggml_graph_overhead_custom(nodes + 8, false)
            + nodes * sys::ggml_graph_overhead_custom(1, false)
    };
    let ctx = GgmlContext::metadata(mem_size)?;
    let backend = CpuBackend::on(pool)?;
    // The instrument, in TIMED mode; boxed so its address stays fixed while ggml holds it.
    let mut observer = Box::new(Observer::new());
    // SAFETY: the backend is ours and the pool outlives this function. The scheduler gets an
    // array of one CPU backend (ggml requires the last to be the CPU), default buffer types and
    // room for the graph; it allocates the graph's tensors in its own buffers. Tensors and
    // graphs live in ctx (sized above for nodes + 8 tensors, the chain's graph and one graph of
    // one node per node). The callback's user data is the boxed Observer, which nothing else
    // touches while the scheduler computes and which outlives the scheduler (dropped after it).
    // Data handed to ggml_backend_tensor_set is exactly the tensors' byte size.
    unsafe {
        let mut backends = [backend.0.as_ptr()];
        let sched = Sched(
            NonNull::new(sys::ggml_backend_sched_new(
                backends.as_mut_ptr(),
                std::ptr::null_mut(),
                1,
                nodes + 8,
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
        for &d in &pattern {
            y = match d {
                Dispatch::Idle => sys::ggml_reshape_1d(c, y, width),
                Dispatch::OneThread => sys::ggml_sigmoid(c, y),
                Dispatch::AllThreads => sys::ggml_add(c, y, b),
            };
        }
        sys::ggml_set_output(y);
        let graph = sys::ggml_new_graph_custom(c, nodes + 8, false);
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
        // the bare path: each working node of the chain a graph of its own, on the backend
        let mut singles = Vec::with_capacity(nodes);
        for i in 0..sys::ggml_graph_n_nodes(graph) {
            let t = sys::ggml_graph_node(graph, i);
            if (*t).op == sys::GGML_OP_ADD || (*t).op == sys::GGML_OP_UNARY {
                let g = sys::ggml_new_graph_custom(c, 1, false);
                sys::ggml_graph_add_node(g, t);
                singles.push(g);
            }
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
        let mut measured = Vec::with_capacity(rounds as usize);
        let mut bare = Vec::with_capacity(singles.len() * rounds as usize);
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
            if (*obs).timed_ns.len() != nodes {
                return Err(LlamaError::Invalid(format!(
                    "the calibration graph observed {} nodes of {nodes}",
                    (*obs).timed_ns.len()
                )));
            }
            let timed_us: Vec<f64> = (*obs).timed_ns.iter().map(|&ns| ns as f64 / 1e3).collect();
            // FUSED: no callback, the chain in one compute
            set_callback(false, obs);
            let t0 = Instant::now();
            sched_compute("fused")?;
            measured.push(CalibrationRound {
                timed_us,
                fused_us: t0.elapsed().as_secs_f64() * 1e6,
            });
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
        let working: Vec<bool> = pattern.iter().map(|&d| d != Dispatch::Idle).collect();
        let (timed_us, fused_us, each_node_us) = isolation_from(&measured, &working);
        let n_working = singles.len().max(1) as f64;
        let per_node_us = each_node_us.iter().sum::<f64>() / n_working;
        bare.sort_by(f64::total_cmp);
        let bare_isolated_us = bare.get(bare.len() / 2).copied().unwrap_or(0.0);
        Ok(IsolationCost {
            timed_us,
            fused_us,
            per_node_us,
            each_node_us,
            bare_isolated_us,
            bare_per_node_us: (bare_isolated_us - fused_us).max(0.0),
            nodes: nodes as u32,
            working: singles.len() as u32,
            observed,
        })
    }
}
