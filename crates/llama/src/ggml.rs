//! Owned ggml handles for the graphs this crate builds itself (a node timed alone in
//! [`crate::optime`], the isolation calibration in [`crate::calibrate`]): one owner per C
//! handle, freed once on drop. Declare them in the order they must be freed in reverse: a
//! context before the buffers and scheduler that allocate its tensors, a backend before the
//! scheduler that uses it.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::error::LlamaError;
use crate::threadpool::ThreadPool;

/// An owned ggml context holding tensor and graph metadata only (`no_alloc`).
pub(crate) struct GgmlContext(pub(crate) NonNull<sys::ggml_context>);

impl GgmlContext {
    /// A metadata-only context of `mem_size` bytes.
    pub(crate) fn metadata(mem_size: usize) -> Result<GgmlContext, LlamaError> {
        let params = sys::ggml_init_params {
            mem_size,
            mem_buffer: std::ptr::null_mut(),
            no_alloc: true,
        };
        // SAFETY: ggml_init with no_alloc makes a context holding metadata only; it returns an
        // owned context or null.
        NonNull::new(unsafe { sys::ggml_init(params) })
            .map(GgmlContext)
            .ok_or_else(|| LlamaError::Invalid("ggml_init failed".into()))
    }
}

impl Drop for GgmlContext {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_init and is freed once, after every buffer and
        // scheduler that allocated its tensors (declared later, dropped first).
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

/// An owned CPU backend computing on a shared thread pool.
pub(crate) struct CpuBackend(pub(crate) NonNull<sys::ggml_backend>);

impl CpuBackend {
    /// A CPU backend with `pool`'s threads, computing on `pool`.
    pub(crate) fn on(pool: &ThreadPool) -> Result<CpuBackend, LlamaError> {
        // SAFETY: ggml_backend_cpu_init returns an owned backend or null.
        let backend = NonNull::new(unsafe { sys::ggml_backend_cpu_init() })
            .map(CpuBackend)
            .ok_or_else(|| LlamaError::Invalid("ggml_backend_cpu_init failed".into()))?;
        // SAFETY: the backend is ours and alive; the pool outlives every graph computed on it
        // (the callers hold it for the backend's whole life).
        unsafe {
            sys::ggml_backend_cpu_set_n_threads(backend.0.as_ptr(), pool.threads() as i32);
            sys::ggml_backend_cpu_set_threadpool(backend.0.as_ptr(), pool.as_ptr());
        }
        Ok(backend)
    }
}

impl Drop for CpuBackend {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_backend_cpu_init and is freed once, after the
        // scheduler using it.
        unsafe { sys::ggml_backend_free(self.0.as_ptr()) }
    }
}

/// An owned backend buffer (tensors of a context allocated in it).
pub(crate) struct Buffer(pub(crate) NonNull<sys::ggml_backend_buffer>);

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: from ggml_backend_alloc_ctx_tensors_from_buft, freed once, before the context
        // whose tensors it holds.
        unsafe { sys::ggml_backend_buffer_free(self.0.as_ptr()) }
    }
}

/// An owned backend scheduler.
pub(crate) struct Sched(pub(crate) NonNull<sys::ggml_backend_sched>);

impl Drop for Sched {
    fn drop(&mut self) {
        // SAFETY: the pointer came from ggml_backend_sched_new and is freed once; it frees the
        // buffers it allocated for the graph.
        unsafe { sys::ggml_backend_sched_free(self.0.as_ptr()) }
    }
}
