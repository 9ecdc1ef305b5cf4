//! In-graph replay: inside a real run, a node is dispatched k extra times in place, each time as a
//! clone (same op, parameters and sources: the live tensors of the graph) writing into a scratch
//! buffer, so the run's outputs stay bit-identical while its wall time grows by what the node
//! costs in its real surroundings.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::error::LlamaError;
use crate::threadpool::ThreadPool;

/// What a replaying run does at each node: cut the graph there (`cut`), and replay it `k` times
/// (`replay`). Indices are graph positions in ask order.
#[derive(Debug, Clone, Default)]
pub struct ReplayPlan {
    pub cut: Vec<bool>,
    pub replay: Vec<bool>,
    pub k: u32,
    /// Dispatch `k` rounds of one trivial clone instead of `k` clones: what a round's launch
    /// costs beyond the clones' work.
    pub launches_only: bool,
}

/// Clones per round: one graph of at most this many clones is computed per round.
pub const CLONES_PER_ROUND: u32 = 16;

/// The rounds `k` replays of one node take.
pub fn rounds(k: u32) -> u32 {
    k.div_ceil(CLONES_PER_ROUND)
}

impl std::fmt::Debug for Replayer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replayer")
            .field("scratch_bytes", &self.scratch_bytes)
            .field("replayed", &self.replayed)
            .field("skipped", &self.skipped)
            .finish()
    }
}

/// The resources replays need: a CPU backend on the engine's thread pool, a scratch buffer as
/// large as the largest node output, a small context for the clones' metadata.
pub(crate) struct Replayer {
    backend: NonNull<sys::ggml_backend>,
    scratch: NonNull<sys::ggml_backend_buffer>,
    scratch_bytes: usize,
    ctx: NonNull<sys::ggml_context>,
    max_clones: usize,
    /// In the current run: clones computed, nodes not replayed (output larger than the
    /// scratch buffer, or no room for a clone), and clone graphs ggml failed to compute. The
    /// engine resets them before a run and refuses the run's timing unless the last two are 0.
    pub replayed: u32,
    pub skipped: u32,
    pub failed: u32,
}

// SAFETY: the Replayer is used only from the thread that runs llama_decode (inside the eval
// callback), never concurrently.
unsafe impl Send for Replayer {}

impl Replayer {
    pub(crate) fn new(
        pool: &ThreadPool,
        scratch_bytes: usize,
        max_clones: usize,
    ) -> Result<Replayer, LlamaError> {
        let max_clones = max_clones.max(1);
        // SAFETY: ggml returns owned objects or null; sizes come from ggml's own overhead
        // queries; everything is freed in Drop in reverse order.
        unsafe {
            let backend = NonNull::new(sys::ggml_backend_cpu_init())
                .ok_or_else(|| LlamaError::Invalid("ggml_backend_cpu_init failed".into()))?;
            sys::ggml_backend_cpu_set_n_threads(backend.as_ptr(), pool.threads() as i32);
            sys::ggml_backend_cpu_set_threadpool(backend.as_ptr(), pool.as_ptr());
            let buft = sys::ggml_backend_cpu_buffer_type();
            let scratch = sys::ggml_backend_buft_alloc_buffer(buft, scratch_bytes.max(64));
            let Some(scratch) = NonNull::new(scratch) else {
                sys::ggml_backend_free(backend.as_ptr());
                return Err(LlamaError::Invalid(format!(
                    "allocating a {scratch_bytes}-byte replay scratch buffer failed"
                )));
            };
            // touch it once so replays do not pay first-touch page faults
            sys::ggml_backend_buffer_clear(scratch.as_ptr(), 0);
            let params = sys::ggml_init_params {
                mem_size: sys::ggml_tensor_overhead() * (max_clones + 4)
                    + sys::ggml_graph_overhead_custom(max_clones + 4, false),
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            };
            let Some(ctx) = NonNull::new(sys::ggml_init(params)) else {
                sys::ggml_backend_buffer_free(scratch.as_ptr());
                sys::ggml_backend_free(backend.as_ptr());
                return Err(LlamaError::Invalid("ggml_init failed".into()));
            };
            Ok(Replayer {
                backend,
                scratch,
                scratch_bytes: scratch_bytes.max(64),
                ctx,
                max_clones,
                replayed: 0,
                skipped: 0,
                failed: 0,
            })
        }
    }

    /// Dispatches `k` clones of `t` (just computed by the scheduler) into the scratch buffer,
    /// in rounds of at most `max_clones`. Always lets the scheduler go on (answering `false` would
    /// end the split early and silently); what went wrong is counted in `skipped` / `failed`.
    ///
    /// # Safety
    /// `t` must be a node of the graph being computed, whose sources are live and computed, all
    /// in host memory (the engine refuses replay when a GPU device is present).
    pub(crate) unsafe fn replay(&mut self, t: *mut sys::ggml_tensor, k: u32) -> bool {
        // SAFETY: per the contract t is live; the context is ours and reset before each round;
        // every clone's data points into the scratch buffer, which is at least as large as the
        // clone (checked with ggml_nbytes); the clones read only the sources of t.
        unsafe {
            if k == 0 || sys::ggml_nbytes(t) > self.scratch_bytes {
                self.skipped += 1;
                return true;
            }
            let base = sys::ggml_backend_buffer_get_base(self.scratch.as_ptr());
            let mut left = k as usize;
            while left > 0 {
                let n = left.min(self.max_clones);
                left -= n;
                sys::ggml_reset(self.ctx.as_ptr());
                let graph = sys::ggml_new_graph_custom(self.ctx.as_ptr(), n + 4, false);
                for _ in 0..n {
                    let c =
                        sys::ggml_new_tensor(self.ctx.as_ptr(), (*t).type_, 4, (*t).ne.as_ptr());
                    if c.is_null() {
                        self.skipped += 1;
                        return true;
                    }
                    (*c).op = (*t).op;
                    (*c).op_params = (*t).op_params;
                    (*c).src = (*t).src;
                    (*c).nb = (*t).nb;
                    (*c).flags = sys::GGML_TENSOR_FLAG_COMPUTE as i32;
                    if sys::ggml_backend_tensor_alloc(self.scratch.as_ptr(), c, base)
                        != sys::GGML_STATUS_SUCCESS
                    {
                        self.skipped += 1;
                        return true;
                    }
                    sys::ggml_graph_add_node(graph, c);
                }
                if sys::ggml_backend_graph_compute(self.backend.as_ptr(), graph)
                    == sys::GGML_STATUS_SUCCESS
                {
                    self.replayed += n as u32;
                } else {
                    self.failed += 1;
                    return true;
                }
            }
            true
        }
    }

    /// Dispatches `rounds` rounds of one trivial clone (a one-element ADD, which ggml splits
    /// over every thread as it does real nodes) through the same backend, thread pool and call as
    /// [`Replayer::replay`]'s rounds: the launch and synchronisation a round pays beyond its
    /// clones' work. Always lets the scheduler go on, as `replay` does.
    pub(crate) fn launch_rounds(&mut self, rounds: u32) -> bool {
        // SAFETY: the context is ours and reset before each round; both one-element tensors lie
        // in the scratch buffer (at least 64 bytes: offsets 0 and 32, 4 bytes each), which
        // nothing else reads during the round.
        unsafe {
            let base = sys::ggml_backend_buffer_get_base(self.scratch.as_ptr()) as *mut u8;
            for _ in 0..rounds {
                sys::ggml_reset(self.ctx.as_ptr());
                let graph = sys::ggml_new_graph_custom(self.ctx.as_ptr(), 4, false);
                let a = sys::ggml_new_tensor_1d(self.ctx.as_ptr(), sys::GGML_TYPE_F32, 1);
                if a.is_null()
                    || sys::ggml_backend_tensor_alloc(self.scratch.as_ptr(), a, base.cast())
                        != sys::GGML_STATUS_SUCCESS
                {
                    self.skipped += 1;
                    return true;
                }
                let c = sys::ggml_add(self.ctx.as_ptr(), a, a);
                if c.is_null()
                    || sys::ggml_backend_tensor_alloc(self.scratch.as_ptr(), c, base.add(32).cast())
                        != sys::GGML_STATUS_SUCCESS
                {
                    self.skipped += 1;
                    return true;
                }
                (*c).flags |= sys::GGML_TENSOR_FLAG_COMPUTE as i32;
                sys::ggml_graph_add_node(graph, c);
                if sys::ggml_backend_graph_compute(self.backend.as_ptr(), graph)
                    == sys::GGML_STATUS_SUCCESS
                {
                    self.replayed += 1;
                } else {
                    self.failed += 1;
                    return true;
                }
            }
            true
        }
    }

    /// Zeroes the per-run counts.
    pub(crate) fn reset_counts(&mut self) {
        self.replayed = 0;
        self.skipped = 0;
        self.failed = 0;
    }
}

/// Whether a GPU (or integrated GPU) device is registered: llama.cpp may then offload nodes
/// (op_offload is on by default even with no GPU layers), and a CPU clone of an offloaded node
/// would read device memory.
pub(crate) fn gpu_present() -> bool {
    // SAFETY: ggml's device registry is initialised by the backend (loaded before any engine);
    // the queries only read it.
    unsafe {
        (0..sys::ggml_backend_dev_count()).any(|i| {
            let d = sys::ggml_backend_dev_get(i);
            !d.is_null() && sys::ggml_backend_dev_type(d) != sys::GGML_BACKEND_DEVICE_TYPE_CPU
        })
    }
}

impl Drop for Replayer {
    fn drop(&mut self) {
        // SAFETY: each object was created in new() and is freed once; nothing references the
        // clones after the run.
        unsafe {
            sys::ggml_free(self.ctx.as_ptr());
            sys::ggml_backend_buffer_free(self.scratch.as_ptr());
            sys::ggml_backend_free(self.backend.as_ptr());
        }
    }
}
