//! The ggml CPU thread pool that a llama.cpp context, the op timer and the isolation calibration
//! share.

use std::ptr::NonNull;

use llama_cpp_sys_2 as sys;

use crate::error::LlamaError;

/// A ggml CPU thread pool. Attaching one to a context makes a graph cut cost under a
/// microsecond instead of a thread spawn and join (about 76 µs), which TIMED mode pays per node.
#[derive(Debug)]
pub struct ThreadPool {
    ptr: NonNull<sys::ggml_threadpool>,
    threads: u32,
}

// SAFETY: the thread pool is only handed to llama.cpp, which uses it from the thread that calls
// llama_decode; contexts sharing it never decode concurrently (each needs &mut).
unsafe impl Send for ThreadPool {}
// SAFETY: see above; the one operation &ThreadPool exposes (pause) takes the pool's mutex.
unsafe impl Sync for ThreadPool {}

impl ThreadPool {
    pub fn new(threads: u32) -> Result<ThreadPool, LlamaError> {
        // ggml takes an int: a count of 0 or above i32::MAX is refused, never cast
        let n_threads = i32::try_from(threads)
            .ok()
            .filter(|&t| t >= 1)
            .ok_or_else(|| {
                LlamaError::Invalid(format!(
                    "{threads} threads: a ggml thread pool takes 1 to {} threads",
                    i32::MAX
                ))
            })?;
        // SAFETY: ggml_threadpool_params_default fills a plain struct; ggml_threadpool_new reads
        // it during the call only and returns an owned pool or null.
        let raw = unsafe {
            let mut params = sys::ggml_threadpool_params_default(n_threads);
            sys::ggml_threadpool_new(&mut params)
        };
        let ptr = NonNull::new(raw).ok_or(LlamaError::ThreadPool { threads })?;
        Ok(ThreadPool { ptr, threads })
    }

    pub fn threads(&self) -> u32 {
        self.threads
    }

    /// Puts the workers to sleep until the next graph computed on the pool wakes them (ggml's
    /// kickoff resumes a paused pool). Without it, a pool's workers poll for new work for a
    /// while after each graph: harmless alone, but on a machine with as many cores as threads
    /// they steal the CPU from the next run of another engine in the same process (an A/B, a
    /// ledger), which made A/B runs of 60 ms take up to 280 ms.
    pub fn pause(&self) {
        // SAFETY: the pool is alive (owned here); ggml_threadpool_pause takes the pool's own
        // mutex and only sets a flag the workers read; no graph is computing on it now, since
        // every decode on a context holding this pool has returned (decodes need &mut Context).
        unsafe { sys::ggml_threadpool_pause(self.ptr.as_ptr()) }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ggml_threadpool {
        self.ptr.as_ptr()
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        // SAFETY: ptr came from ggml_threadpool_new and is freed once; every Context using it
        // holds an Arc<ThreadPool> and detaches on drop before this runs.
        unsafe { sys::ggml_threadpool_free(self.ptr.as_ptr()) }
    }
}
