//! One node of a real graph rebuilt and timed alone: a one-op ggml graph on a CPU backend that
//! shares the engine's thread pool, sources re-created with the node's shapes, strides and types
//! (weights in the CPU backend's repacking buffer when the model's were), filled with valid data,
//! several copies rotated so weights are not all cache-warm, and optionally the cache flushed
//! before every repetition so that weights come from memory.

use std::ptr::NonNull;
use std::time::Instant;

use llama_cpp_sys_2 as sys;
use opledger_core::node::{NodeInfo, TensorDesc};
use opledger_core::ops::int_source_values;
use opledger_gguf::synth::{fill_chunk, tensor_rng, Fill};
use opledger_gguf::GgmlType;

use crate::error::LlamaError;
use crate::ggml::{Buffer, CpuBackend, GgmlContext};
use crate::threadpool::ThreadPool;

/// The timing of one op alone (the type every op timer returns).
pub use opledger_core::engine::OpTime;

/// How to time.
#[derive(Debug, Clone)]
pub struct OpTimeConfig {
    /// Put weight sources in the CPU backend's repacking buffer (as llama.cpp does by default).
    pub repack: bool,
    /// Copies of the inputs to rotate over, up to this many bytes in all.
    pub rotate_bytes: u64,
    /// Timed repetitions (after one warm-up).
    pub reps: u32,
    /// Bytes of a buffer written before every repetition, untimed (0: none): larger than the
    /// last-level cache, it evicts the op's weights, which then come from memory as they do in a
    /// decode step of a model larger than the cache.
    pub flush_bytes: u64,
}

/// Writes one byte in every 64-byte line of `buf`, evicting what the cache held before.
fn flush(buf: &mut [u8]) {
    for b in buf.iter_mut().step_by(64) {
        *b = b.wrapping_add(1);
    }
    std::hint::black_box(&buf);
}

fn ggml_type_of(name: &str) -> Result<(GgmlType, sys::ggml_type), LlamaError> {
    let t: GgmlType = name
        .parse()
        .map_err(|_| LlamaError::Invalid(format!("unknown tensor type {name}")))?;
    Ok((t, t.id() as sys::ggml_type))
}

fn new_ctx(tensors: usize) -> Result<GgmlContext, LlamaError> {
    // SAFETY: ggml_tensor_overhead and ggml_graph_overhead are pure size queries.
    let size = unsafe { sys::ggml_tensor_overhead() * (tensors + 8) + sys::ggml_graph_overhead() };
    GgmlContext::metadata(size)
}

/// The repacking ("extra") buffer type of the CPU backend, if it has one.
fn cpu_extra_buffer_type() -> Option<sys::ggml_backend_buffer_type_t> {
    // SAFETY: the device and registry are static objects of ggml; the proc address, when
    // present, has the documented signature returning a null-terminated array of buffer types.
    unsafe {
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);
        if dev.is_null() {
            return None;
        }
        let reg = sys::ggml_backend_dev_backend_reg(dev);
        let name = c"ggml_backend_dev_get_extra_bufts";
        let f = sys::ggml_backend_reg_get_proc_address(reg, name.as_ptr());
        if f.is_null() {
            return None;
        }
        let get: unsafe extern "C" fn(
            sys::ggml_backend_dev_t,
        ) -> *mut sys::ggml_backend_buffer_type_t = std::mem::transmute(f);
        let list = get(dev);
        if list.is_null() || (*list).is_null() {
            return None;
        }
        Some(*list)
    }
}

/// Is the tensor laid out contiguously (its strides those of a packed tensor)?
fn contiguous(t: &TensorDesc, type_size: u64, block: u64) -> bool {
    if t.nb == [0; 4] {
        return true;
    }
    let mut expect = [0u64; 4];
    expect[0] = type_size;
    expect[1] = type_size * (t.ne[0] as u64 / block.max(1));
    expect[2] = expect[1] * t.ne[1] as u64;
    expect[3] = expect[2] * t.ne[2] as u64;
    t.nb == expect
}

/// Times `node` alone `cfg.reps` times. For an expert matmul, `routing` gives the expert ids
/// (`[n_used, n_tokens]`); without it, ids cycle over the experts.
pub fn time_node(
    pool: &ThreadPool,
    node: &NodeInfo,
    routing: Option<&[i32]>,
    cfg: &OpTimeConfig,
) -> Result<OpTime, LlamaError> {
    if node.out.ne.contains(&0) {
        // an op over no elements (a state copy of zero sequences, say) does nothing
        return Ok(OpTime {
            median_us: 0.0,
            min_us: 0.0,
            max_us: 0.0,
            reps: 0,
            rotation: 0,
            weight_buffer: String::new(),
        });
    }
    let op_code = node.op_code.ok_or_else(|| {
        LlamaError::Invalid(format!("node {} has no op code to rebuild", node.index))
    })?;
    let (_, out_type) = ggml_type_of(&node.out.ggml_type)?;
    let src_types: Vec<Option<(GgmlType, sys::ggml_type)>> = node
        .srcs
        .iter()
        .map(|s| s.as_ref().map(|t| ggml_type_of(&t.ggml_type)).transpose())
        .collect::<Result<_, _>>()?;
    let input_bytes: u64 = node
        .srcs
        .iter()
        .flatten()
        .map(|s| s.size_bytes)
        .sum::<u64>()
        .max(1);
    let rotation = (cfg.rotate_bytes / input_bytes).clamp(1, 8) as u32;
    let extra = if cfg.repack {
        cpu_extra_buffer_type()
    } else {
        None
    };

    // SAFETY: every pointer below comes from ggml (contexts, tensors, buffers, backend) and
    // lives until the end of this function: the GgmlContext/Buffer/CpuBackend guards free them in reverse
    // order of creation (buffers before their contexts). Tensor fields are written only on
    // tensors we created, before any computation, mirroring the node's own fields; sizes handed
    // to ggml_backend_tensor_set are the tensors' own ggml_nbytes.
    unsafe {
        let backend = CpuBackend::on(pool)?;
        let cpu_buft = sys::ggml_backend_cpu_buffer_type();
        let dev = sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU);

        let mut keep_ctx: Vec<GgmlContext> = Vec::new();
        let mut keep_buf: Vec<Buffer> = Vec::new();
        let mut graphs = Vec::with_capacity(rotation as usize);
        let mut weight_buffer = "CPU".to_string();
        for copy in 0..rotation {
            let wctx = new_ctx(node.srcs.len())?;
            let actx = new_ctx(2 * node.srcs.len() + 2)?;
            // sources: weights in wctx, the rest in actx (views on contiguous bases)
            let mut srcs: Vec<*mut sys::ggml_tensor> = Vec::new();
            let mut bases: Vec<(*mut sys::ggml_tensor, Option<usize>)> = Vec::new();
            for (slot, s) in node.srcs.iter().enumerate() {
                let Some(t) = s else {
                    srcs.push(std::ptr::null_mut());
                    continue;
                };
                let (gt, ty) = src_types[slot].expect("typed above");
                let block = gt.block_size() as u64;
                let tsize = gt.type_size() as u64;
                let ne = t.ne;
                let tensor = if contiguous(t, tsize, block) {
                    let ctx = if t.is_weight { &wctx } else { &actx };
                    let x = sys::ggml_new_tensor(ctx.0.as_ptr(), ty, 4, ne.as_ptr());
                    bases.push((x, Some(slot)));
                    x
                } else {
                    // a strided view: a flat base covering the furthest element, then a view
                    let extent = (0..4)
                        .map(|d| (t.ne[d].max(1) as u64 - 1) * t.nb[d])
                        .sum::<u64>()
                        + tsize;
                    let elems = extent.div_ceil(tsize) * block;
                    let ctx = if t.is_weight { &wctx } else { &actx };
                    let base = sys::ggml_new_tensor_1d(ctx.0.as_ptr(), ty, elems as i64);
                    bases.push((base, Some(slot)));
                    sys::ggml_view_4d(
                        ctx.0.as_ptr(),
                        base,
                        ne[0],
                        ne[1],
                        ne[2],
                        ne[3],
                        t.nb[1] as usize,
                        t.nb[2] as usize,
                        t.nb[3] as usize,
                        0,
                    )
                };
                srcs.push(tensor);
            }
            let out = sys::ggml_new_tensor(actx.0.as_ptr(), out_type, 4, node.out.ne.as_ptr());
            (*out).op = op_code;
            for (i, p) in node
                .op_params
                .iter()
                .enumerate()
                .take((*out).op_params.len())
            {
                (*out).op_params[i] = *p;
            }
            for (i, s) in srcs.iter().enumerate().take((*out).src.len()) {
                (*out).src[i] = *s;
            }
            (*out).flags |= sys::GGML_TENSOR_FLAG_COMPUTE as i32;

            // weights: the repacking buffer where the op supports it, else plain CPU memory
            let has_weights = node.srcs.iter().flatten().any(|s| s.is_weight);
            if has_weights {
                // as llama.cpp's loader does: ask the device whether the op runs with its
                // weights in the repacking buffer, through a zero-size buffer of that type,
                // before allocating anything there
                let weights: Vec<*mut sys::ggml_tensor> = bases
                    .iter()
                    .filter(|(_, slot)| {
                        slot.is_some_and(|i| node.srcs[i].as_ref().is_some_and(|t| t.is_weight))
                    })
                    .map(|(b, _)| *b)
                    .collect();
                let mut buft = cpu_buft;
                if let Some(x) = extra {
                    let probe = sys::ggml_backend_buft_alloc_buffer(x, 0);
                    if !probe.is_null() {
                        for &w in &weights {
                            (*w).buffer = probe;
                        }
                        let supported = sys::ggml_backend_dev_supports_op(dev, out);
                        for &w in &weights {
                            (*w).buffer = std::ptr::null_mut();
                        }
                        sys::ggml_backend_buffer_free(probe);
                        if supported {
                            buft = x;
                        }
                    }
                }
                let b = sys::ggml_backend_alloc_ctx_tensors_from_buft(wctx.0.as_ptr(), buft);
                keep_buf.push(Buffer(NonNull::new(b).ok_or_else(|| {
                    LlamaError::Invalid("allocating weight buffers failed".into())
                })?));
                let n = sys::ggml_backend_buft_name(buft);
                if !n.is_null() {
                    weight_buffer = std::ffi::CStr::from_ptr(n).to_string_lossy().into_owned();
                }
            }
            let b = sys::ggml_backend_alloc_ctx_tensors_from_buft(actx.0.as_ptr(), cpu_buft);
            keep_buf.push(Buffer(NonNull::new(b).ok_or_else(|| {
                LlamaError::Invalid("allocating buffers failed".into())
            })?));

            // data: valid quantised blocks / small floats / in-range indices
            for &(base, slot) in &bases {
                let Some(slot) = slot else { continue };
                let bytes = sys::ggml_nbytes(base);
                let ty = (*base).type_;
                let mut buf = vec![0u8; bytes];
                if ty == sys::GGML_TYPE_I32 || ty == sys::GGML_TYPE_I64 {
                    let width = if ty == sys::GGML_TYPE_I32 { 4 } else { 8 };
                    let vals = int_source_values(node, slot, bytes / width, routing);
                    for (i, v) in vals.iter().enumerate() {
                        if width == 4 {
                            buf[i * 4..i * 4 + 4].copy_from_slice(&(*v as i32).to_le_bytes());
                        } else {
                            buf[i * 8..i * 8 + 8].copy_from_slice(&v.to_le_bytes());
                        }
                    }
                } else if let Some((gt, _)) = src_types[slot] {
                    let mut rng = tensor_rng(copy as u64, &format!("src{slot}"));
                    let whole = bytes - bytes % gt.type_size() as usize;
                    fill_chunk(&mut rng, Fill::Weights, gt, 0, &mut buf[..whole]);
                }
                sys::ggml_backend_tensor_set(base, buf.as_ptr().cast(), 0, bytes);
            }
            let graph = sys::ggml_new_graph(actx.0.as_ptr());
            sys::ggml_build_forward_expand(graph, out);
            graphs.push(graph);
            keep_ctx.push(wctx);
            keep_ctx.push(actx);
        }

        let mut flush_buf = vec![0u8; cfg.flush_bytes as usize];
        // a one-element op computed on the pool after each flush, untimed: the flush takes long
        // enough for the pool's workers to go to sleep, and waking them is no part of the op
        let wake = if flush_buf.is_empty() {
            None
        } else {
            let wctx = new_ctx(2)?;
            let a = sys::ggml_new_tensor_1d(wctx.0.as_ptr(), sys::GGML_TYPE_F32, 1);
            let c = sys::ggml_add(wctx.0.as_ptr(), a, a);
            let b = sys::ggml_backend_alloc_ctx_tensors_from_buft(wctx.0.as_ptr(), cpu_buft);
            keep_buf.push(Buffer(NonNull::new(b).ok_or_else(|| {
                LlamaError::Invalid("allocating buffers failed".into())
            })?));
            sys::ggml_backend_tensor_set(a, [0f32].as_ptr().cast(), 0, 4);
            let g = sys::ggml_new_graph(wctx.0.as_ptr());
            sys::ggml_build_forward_expand(g, c);
            keep_ctx.push(wctx);
            Some(g)
        };
        let mut compute = |g: *mut sys::ggml_cgraph| -> Result<f64, LlamaError> {
            if !flush_buf.is_empty() {
                flush(&mut flush_buf);
            }
            if let Some(w) = wake {
                sys::ggml_backend_graph_compute(backend.0.as_ptr(), w);
                sys::ggml_backend_synchronize(backend.0.as_ptr());
            }
            let t0 = Instant::now();
            let status = sys::ggml_backend_graph_compute(backend.0.as_ptr(), g);
            sys::ggml_backend_synchronize(backend.0.as_ptr());
            if status != sys::GGML_STATUS_SUCCESS {
                return Err(LlamaError::Invalid(format!(
                    "computing {} alone failed (status {status})",
                    node.op
                )));
            }
            Ok(t0.elapsed().as_secs_f64() * 1e6)
        };
        for &g in &graphs {
            compute(g)?;
        }
        let mut times = Vec::with_capacity(cfg.reps as usize);
        for r in 0..cfg.reps.max(1) {
            times.push(compute(graphs[r as usize % graphs.len()])?);
        }
        let result = OpTime::of_reps(&times, rotation, &weight_buffer).ok_or_else(|| {
            LlamaError::Invalid(format!("timing {} alone gave no finite time", node.op))
        })?;
        drop(graphs);
        drop(keep_buf);
        drop(keep_ctx);
        drop(backend);
        Ok(result)
    }
}
