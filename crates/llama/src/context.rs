//! A llama.cpp context (one safe owner of `llama_context *`), its ggml thread pool, token
//! batches, and the state save/restore that lets every measured run start from the same place.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use llama_cpp_sys_2 as sys;

use crate::backend::log_tail;
use crate::error::LlamaError;
use crate::model::Model;
use crate::observer::{eval_trampoline, ObserveMode, Observer};
pub use crate::threadpool::ThreadPool;

/// Flash attention setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashAttn {
    Auto,
    On,
    Off,
}

/// How to create a context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContextParams {
    pub n_ctx: u32,
    pub n_batch: u32,
    pub n_ubatch: u32,
    pub flash_attn: FlashAttn,
    /// Install the eval-callback instrument. Without it the scheduler computes each split in one
    /// call (the true native path); with it, the instrument decides per node.
    pub instrumented: bool,
    /// The model is split across devices (RPC): the instrument records each node's device and
    /// waits for remote nodes in TIMED mode.
    pub split: bool,
    /// Sequences the context holds (parallel decode), at least 1.
    pub n_seq_max: u32,
    /// One KV buffer shared by all sequences (a shared prefix is stored once), as
    /// llama-batched-bench's `-kvu`.
    pub kv_unified: bool,
    /// KV cache types (`None`: llama.cpp's default, F16).
    pub type_k: Option<KvType>,
    pub type_v: Option<KvType>,
}

/// A KV cache element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
    Q8_0,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
}

impl KvType {
    /// Parses `f16`, `q8_0`, ... (case-insensitive).
    pub fn parse(s: &str) -> Option<KvType> {
        Some(match s.to_ascii_lowercase().as_str() {
            "f32" => KvType::F32,
            "f16" => KvType::F16,
            "bf16" => KvType::Bf16,
            "q8_0" => KvType::Q8_0,
            "q4_0" => KvType::Q4_0,
            "q4_1" => KvType::Q4_1,
            "q5_0" => KvType::Q5_0,
            "q5_1" => KvType::Q5_1,
            _ => return None,
        })
    }

    fn ggml(self) -> sys::ggml_type {
        match self {
            KvType::F32 => sys::GGML_TYPE_F32,
            KvType::F16 => sys::GGML_TYPE_F16,
            KvType::Bf16 => sys::GGML_TYPE_BF16,
            KvType::Q8_0 => sys::GGML_TYPE_Q8_0,
            KvType::Q4_0 => sys::GGML_TYPE_Q4_0,
            KvType::Q4_1 => sys::GGML_TYPE_Q4_1,
            KvType::Q5_0 => sys::GGML_TYPE_Q5_0,
            KvType::Q5_1 => sys::GGML_TYPE_Q5_1,
        }
    }
}

/// A llama.cpp context over a model, with its own KV cache and recurrent state.
pub struct Context {
    ptr: NonNull<sys::llama_context>,
    // Freed in Drop after ptr: declared for ownership only.
    observer: Option<NonNull<Observer>>,
    /// When set, the CPU backend stops the graph after the node it is computing (llama.cpp's
    /// abort callback, checked after every node). Boxed: llama.cpp holds its address.
    abort: Box<AtomicBool>,
    pool: Arc<ThreadPool>,
    model: Arc<Model>,
    n_ctx: u32,
    n_batch: u32,
    /// When the last `llama_decode` returned (its outputs read back), for the time a split
    /// graph's outputs take to come back from a remote device.
    pub(crate) decoded_at: Option<std::time::Instant>,
    /// The model is split across devices: calls that reach remote devices are watched.
    split: bool,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("n_ctx", &self.n_ctx)
            .field("instrumented", &self.observer.is_some())
            .finish()
    }
}

impl Context {
    pub fn new(
        model: Arc<Model>,
        pool: Arc<ThreadPool>,
        params: &ContextParams,
    ) -> Result<Context, LlamaError> {
        // SAFETY: llama_context_default_params has no preconditions and returns a plain struct.
        let mut p = unsafe { sys::llama_context_default_params() };
        p.n_ctx = params.n_ctx;
        p.n_batch = params.n_batch;
        p.n_ubatch = params.n_ubatch;
        p.n_seq_max = params.n_seq_max.max(1);
        p.kv_unified = params.kv_unified;
        // Sliding-window layers keep a cache of the window plus one batch, as llama.cpp's own
        // tools do (common.h: swa_full = false); the C API's default (true) would give them a
        // full-size cache and attention work that keeps growing with depth.
        p.swa_full = false;
        if let Some(t) = params.type_k {
            p.type_k = t.ggml();
        }
        if let Some(t) = params.type_v {
            p.type_v = t.ggml();
        }
        p.n_threads = pool.threads() as i32;
        p.n_threads_batch = pool.threads() as i32;
        p.no_perf = true;
        p.flash_attn_type = match params.flash_attn {
            FlashAttn::Auto => sys::LLAMA_FLASH_ATTN_TYPE_AUTO,
            FlashAttn::On => sys::LLAMA_FLASH_ATTN_TYPE_ENABLED,
            FlashAttn::Off => sys::LLAMA_FLASH_ATTN_TYPE_DISABLED,
        };
        let observer = if params.instrumented {
            let mut obs = Observer::new();
            obs.devices = params.split;
            let raw = Box::into_raw(Box::new(obs));
            p.cb_eval = Some(eval_trampoline);
            p.cb_eval_user_data = raw.cast();
            // SAFETY: Box::into_raw never returns null.
            Some(unsafe { NonNull::new_unchecked(raw) })
        } else {
            None
        };
        // SAFETY: the model pointer is valid for the life of the Arc we keep; p is a valid params
        // struct; cb_eval_user_data points to a boxed Observer we free only after llama_free.
        let raw = unsafe { sys::llama_init_from_model(model.as_ptr(), p) };
        let Some(ptr) = NonNull::new(raw) else {
            if let Some(obs) = observer {
                // SAFETY: llama.cpp failed to create the context, so nothing holds the pointer;
                // it came from Box::into_raw above.
                drop(unsafe { Box::from_raw(obs.as_ptr()) });
            }
            return Err(LlamaError::Context(log_tail(3)));
        };
        // SAFETY: ptr is the context just created; the pool outlives it (we hold the Arc and
        // detach in Drop before releasing it).
        unsafe {
            sys::llama_attach_threadpool(ptr.as_ptr(), pool.as_ptr(), pool.as_ptr());
        }
        let abort = Box::new(AtomicBool::new(false));
        // SAFETY: ptr is a valid context; the AtomicBool lives in a Box owned by the Context,
        // which outlives every decode, and abort_trampoline only reads it.
        unsafe {
            sys::llama_set_abort_callback(
                ptr.as_ptr(),
                Some(abort_trampoline),
                &*abort as *const AtomicBool as *mut c_void,
            );
        }
        // SAFETY: ptr is a valid context.
        let n_ctx = unsafe { sys::llama_n_ctx(ptr.as_ptr()) };
        Ok(Context {
            ptr,
            observer,
            abort,
            pool,
            model,
            n_ctx,
            n_batch: params.n_batch,
            decoded_at: None,
            split: params.split,
        })
    }

    pub fn model(&self) -> &Arc<Model> {
        &self.model
    }

    pub fn n_ctx(&self) -> u32 {
        self.n_ctx
    }

    /// Sets what the instrument does during the next decodes and clears its records.
    /// Fails on a context created without the instrument.
    pub fn set_observe_mode(&mut self, mode: ObserveMode) -> Result<(), LlamaError> {
        let obs = self.observer_mut()?;
        obs.reset(mode);
        Ok(())
    }

    pub(crate) fn observer_mut(&mut self) -> Result<&mut Observer, LlamaError> {
        let obs = self
            .observer
            .ok_or_else(|| LlamaError::Invalid("this context has no instrument".into()))?;
        // SAFETY: the Observer is owned by self and llama.cpp touches it only inside
        // llama_decode, which needs &mut self, so this is the only reference.
        Ok(unsafe { &mut *obs.as_ptr() })
    }

    /// Makes the next decodes stop after the first node computed (CPU backend only). With the
    /// instrument in Capture mode this describes the whole graph of a split at the cost of one
    /// node; the decode then fails with llama.cpp's "aborted" code 2.
    pub fn set_abort(&mut self, abort: bool) {
        self.abort.store(abort, Ordering::Relaxed);
    }

    /// Empties the KV cache and the recurrent state.
    pub fn clear_memory(&mut self) {
        // SAFETY: ptr is a valid context; the memory handle belongs to it.
        unsafe { sys::llama_memory_clear(sys::llama_get_memory(self.ptr.as_ptr()), true) }
    }

    /// Decodes `tokens` at positions `pos0..`, sequence 0, in batches of `n_batch`; requests
    /// logits for the last token, or for all of them.
    pub fn decode(
        &mut self,
        tokens: &[i32],
        pos0: u32,
        all_logits: bool,
    ) -> Result<(), LlamaError> {
        for (i, part) in tokens.chunks(self.n_batch.max(1) as usize).enumerate() {
            let start = pos0 as usize + i * self.n_batch as usize;
            let last_part = start + part.len() == pos0 as usize + tokens.len();
            self.decode_batch(part, start as i32, |j| {
                all_logits || (last_part && j + 1 == part.len())
            })?;
        }
        Ok(())
    }

    fn decode_batch(
        &mut self,
        tokens: &[i32],
        pos0: i32,
        wants_logits: impl Fn(usize) -> bool,
    ) -> Result<(), LlamaError> {
        let entries: Vec<BatchEntry> = tokens
            .iter()
            .enumerate()
            .map(|(i, &token)| BatchEntry {
                token,
                pos: pos0 + i as i32,
                seq: 0,
                logits: wants_logits(i),
            })
            .collect();
        self.decode_entries(&entries)
    }

    /// Decodes one step of parallel decode: token `tokens[s]` of sequence `s` at position `pos`,
    /// logits requested for every sequence.
    pub fn decode_step(&mut self, tokens: &[i32], pos: u32) -> Result<(), LlamaError> {
        self.decode_step_from(tokens, pos, 0)
    }

    /// [`Context::decode_step`] for sequences `first_seq`, `first_seq + 1`, ...
    pub fn decode_step_from(
        &mut self,
        tokens: &[i32],
        pos: u32,
        first_seq: i32,
    ) -> Result<(), LlamaError> {
        let entries: Vec<BatchEntry> = tokens
            .iter()
            .enumerate()
            .map(|(s, &token)| BatchEntry {
                token,
                pos: pos as i32,
                seq: first_seq + s as i32,
                logits: true,
            })
            .collect();
        self.decode_entries(&entries)
    }

    fn decode_entries(&mut self, entries: &[BatchEntry]) -> Result<(), LlamaError> {
        let batch = Batch::new(entries)?;
        // a decode over remote devices is watched (rpc.rs): one that stops moving ends the run
        let watched = crate::rpc::Watched::new(self.split);
        // SAFETY: ptr is a valid context; batch's arrays hold batch.raw.n_tokens entries and
        // stay alive until after the call; llama_decode does not keep them.
        let code = unsafe { sys::llama_decode(self.ptr.as_ptr(), batch.raw) };
        // SAFETY: ptr is a valid context.
        unsafe { sys::llama_synchronize(self.ptr.as_ptr()) };
        self.decoded_at = Some(std::time::Instant::now());
        drop(watched);
        if let Some(obs) = self.observer {
            // SAFETY: decode returned; we hold &mut self, so no one else touches the Observer.
            if let Some(msg) = unsafe { (*obs.as_ptr()).panic.take() } {
                return Err(LlamaError::CallbackPanicked(msg));
            }
        }
        if code != 0 {
            return Err(LlamaError::Decode {
                code,
                why: log_tail(2),
            });
        }
        Ok(())
    }

    /// The logits of output row `i` of the last decode (`-1`: the last row).
    pub fn logits(&self, i: i32) -> Result<Vec<f32>, LlamaError> {
        let n_vocab = self.model.n_vocab() as usize;
        // SAFETY: ptr is a valid context; llama_get_logits_ith returns null for a row that was
        // not requested, else a pointer to n_vocab floats owned by the context, copied here
        // before any other call can change them.
        unsafe {
            let p = sys::llama_get_logits_ith(self.ptr.as_ptr(), i);
            if p.is_null() {
                return Err(LlamaError::Invalid(format!("no logits for output row {i}")));
            }
            Ok(std::slice::from_raw_parts(p, n_vocab).to_vec())
        }
    }

    /// Copies sequence `src`'s cells (KV cache and recurrent state) to sequence `dst`.
    pub fn copy_sequence(&mut self, src: i32, dst: i32) {
        // SAFETY: ptr is a valid context; the memory handle belongs to it; -1, -1 means every
        // position.
        unsafe {
            sys::llama_memory_seq_cp(sys::llama_get_memory(self.ptr.as_ptr()), src, dst, -1, -1)
        }
    }

    /// Removes every cell of sequence `seq` (KV cache and recurrent state).
    pub fn remove_sequence(&mut self, seq: i32) -> Result<(), LlamaError> {
        // SAFETY: ptr is a valid context; the memory handle belongs to it; -1, -1 means every
        // position.
        let ok = unsafe {
            sys::llama_memory_seq_rm(sys::llama_get_memory(self.ptr.as_ptr()), seq, -1, -1)
        };
        if ok {
            Ok(())
        } else {
            Err(LlamaError::State(format!(
                "llama.cpp could not remove sequence {seq}"
            )))
        }
    }

    /// The whole context state (every sequence) as bytes.
    pub fn save_full_state(&mut self) -> Result<Vec<u8>, LlamaError> {
        let _watched = crate::rpc::Watched::new(self.split);
        // SAFETY: ptr is a valid context; the buffer has exactly the size llama.cpp asked for.
        unsafe {
            let size = sys::llama_state_get_size(self.ptr.as_ptr());
            let mut buf = vec![0u8; size];
            let written = sys::llama_state_get_data(self.ptr.as_ptr(), buf.as_mut_ptr(), size);
            if written != size {
                return Err(LlamaError::State(format!(
                    "wrote {written} of {size} bytes of state"
                )));
            }
            Ok(buf)
        }
    }

    /// Replaces the whole context state by one saved with [`Context::save_full_state`] from a
    /// context of the same model and parameters.
    pub fn restore_full_state(&mut self, state: &[u8]) -> Result<(), LlamaError> {
        let _watched = crate::rpc::Watched::new(self.split);
        self.clear_memory();
        if state.is_empty() {
            return Ok(());
        }
        // SAFETY: ptr is a valid context; state is a readable slice of state.len() bytes.
        let read =
            unsafe { sys::llama_state_set_data(self.ptr.as_ptr(), state.as_ptr(), state.len()) };
        if read == 0 {
            return Err(LlamaError::State(log_tail(2)));
        }
        Ok(())
    }

    /// The state of sequence 0 (KV cache and recurrent state) as bytes.
    pub fn save_state(&mut self) -> Result<Vec<u8>, LlamaError> {
        let _watched = crate::rpc::Watched::new(self.split);
        // SAFETY: ptr is a valid context; the buffer has exactly the size llama.cpp asked for.
        unsafe {
            let size = sys::llama_state_seq_get_size(self.ptr.as_ptr(), 0);
            let mut buf = vec![0u8; size];
            let written =
                sys::llama_state_seq_get_data(self.ptr.as_ptr(), buf.as_mut_ptr(), size, 0);
            if written != size {
                return Err(LlamaError::State(format!(
                    "wrote {written} of {size} bytes of sequence state"
                )));
            }
            Ok(buf)
        }
    }

    /// Replaces sequence 0's state by one saved with [`Context::save_state`] (from this context
    /// or another one of the same model and size).
    pub fn restore_state(&mut self, state: &[u8]) -> Result<(), LlamaError> {
        let _watched = crate::rpc::Watched::new(self.split);
        self.clear_memory();
        if state.is_empty() {
            return Ok(());
        }
        // SAFETY: ptr is a valid context; state is a readable slice of state.len() bytes.
        let read = unsafe {
            sys::llama_state_seq_set_data(self.ptr.as_ptr(), state.as_ptr(), state.len(), 0)
        };
        if read == 0 {
            return Err(LlamaError::State(log_tail(2)));
        }
        Ok(())
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        // SAFETY: ptr came from llama_init_from_model and is freed once, detaching the pool
        // first; the Observer box is freed after llama_free, when nothing can call back.
        unsafe {
            sys::llama_detach_threadpool(self.ptr.as_ptr());
            sys::llama_free(self.ptr.as_ptr());
            if let Some(obs) = self.observer.take() {
                drop(Box::from_raw(obs.as_ptr()));
            }
        }
        let _ = &self.pool;
    }
}

/// llama.cpp's abort callback: true stops the computation.
///
/// # Safety
/// `data` must point to a live AtomicBool.
unsafe extern "C" fn abort_trampoline(data: *mut c_void) -> bool {
    if data.is_null() {
        return false;
    }
    // SAFETY: the context registered the address of its boxed AtomicBool, which lives as long as
    // the context; loading an atomic cannot panic.
    unsafe { &*(data as *const AtomicBool) }.load(Ordering::Relaxed)
}

/// One token of a batch.
#[derive(Debug, Clone, Copy)]
struct BatchEntry {
    token: i32,
    pos: i32,
    seq: i32,
    logits: bool,
}

/// A token batch owning its arrays (no llama_batch_init/free pair to keep balanced).
struct Batch {
    raw: sys::llama_batch,
    _tokens: Vec<i32>,
    _pos: Vec<i32>,
    _n_seq: Vec<i32>,
    _seq_ids: Vec<i32>,
    _seq_ptrs: Vec<*mut i32>,
    _logits: Vec<i8>,
}

impl Batch {
    fn new(entries: &[BatchEntry]) -> Result<Batch, LlamaError> {
        if entries.is_empty() {
            return Err(LlamaError::Invalid("an empty batch".into()));
        }
        let n = entries.len();
        let mut tokens: Vec<i32> = entries.iter().map(|e| e.token).collect();
        let mut pos: Vec<i32> = entries.iter().map(|e| e.pos).collect();
        let mut n_seq = vec![1i32; n];
        let mut seq_ids: Vec<i32> = entries.iter().map(|e| e.seq).collect();
        let mut seq_ptrs: Vec<*mut i32> = seq_ids.iter_mut().map(|s| s as *mut i32).collect();
        let mut logits: Vec<i8> = entries.iter().map(|e| e.logits as i8).collect();
        let raw = sys::llama_batch {
            n_tokens: n as i32,
            token: tokens.as_mut_ptr(),
            embd: std::ptr::null_mut(),
            pos: pos.as_mut_ptr(),
            n_seq_id: n_seq.as_mut_ptr(),
            seq_id: seq_ptrs.as_mut_ptr(),
            logits: logits.as_mut_ptr(),
        };
        Ok(Batch {
            raw,
            _tokens: tokens,
            _pos: pos,
            _n_seq: n_seq,
            _seq_ids: seq_ids,
            _seq_ptrs: seq_ptrs,
            _logits: logits,
        })
    }
}
