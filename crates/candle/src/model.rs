//! The forward pass, written as an engine author writes one on candle's CPU ops: RMS norms,
//! quantised matmuls, per-head q/k norms, rope, causal softmax attention over a KV cache with
//! grouped-query heads, and either a SwiGLU FFN or a routed MoE (router softmax, top-k
//! renormalised, then per expert a quantised matmul over the tokens routed to it). Every op goes
//! through the instrument (`crate::instrument`), in ggml's op vocabulary and with llama.cpp's
//! node names where they exist, so that the same band rules categorise both engines.

use candle_core::{DType, Device, Module, Tensor, D};

use crate::error::CandleError;
use crate::hparams::{Hparams, RopeStyle};
use crate::instrument::{Observe, Outputs, Src};
use crate::weights::{Ffn, GateUp, Layer, Weights};

use Src::{Act as A, Weight as W};

/// The smallest normaliser of the routing weights (llama.cpp clamps their sum to F16's
/// smallest normal number).
const WEIGHTS_SUM_MIN: f32 = 6.103_515_6e-5;

/// A loaded model: hyperparameters and weights.
pub(crate) struct Model {
    pub hp: Hparams,
    pub w: Weights,
}

/// The inputs of one chunk or decode step (graph leaves), built before the forward pass as
/// llama.cpp sets its graph inputs: token ids, the mask over the cache rows, and the rope tables
/// of the tokens' positions.
pub(crate) struct ChunkInputs {
    pub tokens: Tensor,
    pub n_tokens: usize,
    /// The cache row the first token's key and value are written to (the tokens' rows follow).
    pub kv_row0: usize,
    /// Cache rows the tokens attend over: `0..n_kv`.
    pub n_kv: usize,
    /// `(T, n_kv)`: 0 where token i may attend to cache row j, -inf elsewhere.
    pub mask: Tensor,
    /// `(T, 1, head_dim / 2)`: one rope row per token (the chunk's tokens are the batch of
    /// candle's rope kernels, which parallelise over it).
    pub cos: Tensor,
    pub sin: Tensor,
}

/// The KV cache: per layer, keys and values `(capacity, n_head_kv, head_dim)`, f32.
pub(crate) struct KvCache {
    pub k: Vec<Tensor>,
    pub v: Vec<Tensor>,
    pub capacity: usize,
}

impl KvCache {
    pub fn new(hp: &Hparams, capacity: usize) -> Result<KvCache, CandleError> {
        let shape = (capacity.max(1), hp.n_head_kv, hp.head_dim);
        let mut k = Vec::with_capacity(hp.n_layer);
        let mut v = Vec::with_capacity(hp.n_layer);
        for _ in 0..hp.n_layer {
            k.push(Tensor::zeros(shape, DType::F32, &Device::Cpu)?);
            v.push(Tensor::zeros(shape, DType::F32, &Device::Cpu)?);
        }
        Ok(KvCache { k, v, capacity })
    }
}

/// The routing of one MoE layer: the (token, expert) pairs sorted by expert.
pub(crate) struct Route {
    /// The token of each pair, `(P,)` u32.
    pub tokens: Tensor,
    /// The renormalised routing weight of each pair, `(P, 1)`.
    pub weights: Tensor,
    /// Pairs per expert.
    pub counts: Vec<usize>,
}

impl Outputs for Route {
    fn visit(&self, f: &mut dyn FnMut(&Tensor)) {
        f(&self.tokens);
        f(&self.weights);
    }
}

impl Model {
    /// The inputs for a prefill chunk: `tokens` at positions `pos0..`, written to cache rows
    /// `pos0..` and attending causally over rows `0..pos0 + T`.
    pub fn inputs(&self, tokens: &[u32], pos0: usize) -> Result<ChunkInputs, CandleError> {
        let t = tokens.len();
        let n_kv = pos0 + t;
        let mut mask = vec![0f32; t * n_kv];
        for i in 0..t {
            for j in pos0 + i + 1..n_kv {
                mask[i * n_kv + j] = f32::NEG_INFINITY;
            }
        }
        let positions: Vec<usize> = (pos0..pos0 + t).collect();
        self.inputs_at(tokens, &positions, pos0, n_kv, mask)
    }

    /// The inputs of step `step` of parallel decode as llama.cpp lays out its unified KV cache:
    /// the `prefix` rows filled before decoding are shared by every sequence; step s writes
    /// token j (sequence j, at position `prefix + s`) to row `prefix + s x P + j`; sequence j
    /// attends over the prefix and its own rows of steps 0..=s.
    pub fn decode_inputs(
        &self,
        tokens: &[u32],
        prefix: usize,
        step: usize,
    ) -> Result<ChunkInputs, CandleError> {
        let p = tokens.len();
        let kv_row0 = prefix + step * p;
        let n_kv = kv_row0 + p;
        let mut mask = vec![0f32; p * n_kv];
        for j in 0..p {
            for c in prefix..n_kv {
                if (c - prefix) % p != j {
                    mask[j * n_kv + c] = f32::NEG_INFINITY;
                }
            }
        }
        self.inputs_at(tokens, &vec![prefix + step; p], kv_row0, n_kv, mask)
    }

    fn inputs_at(
        &self,
        tokens: &[u32],
        positions: &[usize],
        kv_row0: usize,
        n_kv: usize,
        mask: Vec<f32>,
    ) -> Result<ChunkInputs, CandleError> {
        let t = tokens.len();
        let (cos, sin) = self.rope_tables(positions);
        let half = self.hp.head_dim / 2;
        let dev = &Device::Cpu;
        Ok(ChunkInputs {
            tokens: Tensor::from_vec(tokens.to_vec(), t, dev)?,
            n_tokens: t,
            kv_row0,
            n_kv,
            mask: Tensor::from_vec(mask, (t, n_kv), dev)?,
            cos: Tensor::from_vec(cos, (t, 1, half), dev)?,
            sin: Tensor::from_vec(sin, (t, 1, half), dev)?,
        })
    }

    /// cos and sin of each position's rotation angles, computed as ggml's rope does: theta
    /// starts at the position and is multiplied by `base^(-2/d)` from pair to pair (f32), then
    /// divided by the pair's frequency factor (Llama 3) and scaled by the linear factor.
    fn rope_tables(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let hp = &self.hp;
        let half = hp.head_dim / 2;
        let theta_scale = hp.rope_base.powf(-2.0 / hp.head_dim as f32);
        let n = positions.len();
        let mut cos = Vec::with_capacity(n * half);
        let mut sin = Vec::with_capacity(n * half);
        for &p in positions {
            let mut theta = p as f32;
            for i in 0..half {
                let ff = self.w.rope_freqs.as_ref().map_or(1.0, |f| f[i]);
                let th = hp.rope_freq_scale * (theta / ff);
                cos.push(th.cos());
                sin.push(th.sin());
                theta *= theta_scale;
            }
        }
        (cos, sin)
    }

    /// Runs the forward pass over `inp`, writing the chunk's keys and values into `cache`, and
    /// returns the logits: of the last token, or of every token with `all_logits`. As in
    /// llama.cpp, the last layer's FFN runs only on the rows whose logits are asked for.
    /// `routing` receives, per MoE layer, the tokens each expert received.
    pub fn forward<O: Observe>(
        &self,
        o: &mut O,
        inp: &ChunkInputs,
        cache: &KvCache,
        all_logits: bool,
        routing: &mut Vec<Vec<usize>>,
    ) -> Result<Tensor, CandleError> {
        let hp = &self.hp;
        let w = &self.w;
        if inp.kv_row0 + inp.n_tokens > cache.capacity || inp.n_kv > cache.capacity {
            return Err(CandleError::Invalid(format!(
                "cache rows up to {} do not fit a cache of {}",
                (inp.kv_row0 + inp.n_tokens).max(inp.n_kv),
                cache.capacity
            )));
        }
        routing.clear();
        o.input(&inp.tokens, "inp_tokens");
        o.input(&inp.mask, "kq_mask");
        o.input(&inp.cos, "rope_cos");
        o.input(&inp.sin, "rope_sin");
        for il in 0..hp.n_layer {
            o.input(&cache.k[il], &format!("cache_k_l{il}"));
            o.input(&cache.v[il], &format!("cache_v_l{il}"));
        }
        let mut x = o.node(
            "GET_ROWS",
            "inp_embd",
            None,
            &[W(&w.token_embd.desc), A(&inp.tokens)],
            || w.token_embd.q.embedding(&inp.tokens),
        )?;
        for (il, layer) in w.layers.iter().enumerate() {
            let l = Some(il);
            let cur = o.node(
                "RMS_NORM",
                "attn_norm",
                l,
                &[A(&x), W(&layer.attn_norm.desc)],
                || candle_nn::ops::rms_norm(&x, &layer.attn_norm.w, hp.rms_eps),
            )?;
            let mut attn = self.attention(o, layer, il, &cur, inp, cache)?;
            let mut inp_sa = x;
            if il + 1 == hp.n_layer && !all_logits && inp.n_tokens > 1 {
                // only the last row goes on (llama.cpp's get_rows with the output ids)
                let last = inp.n_tokens - 1;
                attn = o.node("VIEW", "", l, &[A(&attn)], || attn.narrow(0, last, 1))?;
                inp_sa = o.node("VIEW", "", l, &[A(&inp_sa)], || inp_sa.narrow(0, last, 1))?;
            }
            let ffn_inp = o.node("ADD", "ffn_inp", l, &[A(&attn), A(&inp_sa)], || {
                attn.add(&inp_sa)
            })?;
            let cur = o.node(
                "RMS_NORM",
                "ffn_norm",
                l,
                &[A(&ffn_inp), W(&layer.ffn_norm.desc)],
                || candle_nn::ops::rms_norm(&ffn_inp, &layer.ffn_norm.w, hp.rms_eps),
            )?;
            let ffn_out = match &layer.ffn {
                Ffn::Dense { gate, up, down } => {
                    let g = o.node("MUL_MAT", "ffn_gate", l, &[W(&gate.desc), A(&cur)], || {
                        gate.mm.forward(&cur)
                    })?;
                    let u = o.node("MUL_MAT", "ffn_up", l, &[W(&up.desc), A(&cur)], || {
                        up.mm.forward(&cur)
                    })?;
                    let a = o.node("SILU", "ffn_silu", l, &[A(&g)], || g.silu())?;
                    let h = o.node("MUL", "ffn_swiglu", l, &[A(&a), A(&u)], || a.mul(&u))?;
                    o.node("MUL_MAT", "ffn_out", l, &[W(&down.desc), A(&h)], || {
                        down.mm.forward(&h)
                    })?
                }
                Ffn::Moe { .. } => self.moe(o, layer, il, &cur, routing)?,
            };
            x = o.node("ADD", "l_out", l, &[A(&ffn_out), A(&ffn_inp)], || {
                ffn_out.add(&ffn_inp)
            })?;
        }
        let cur = o.node(
            "RMS_NORM",
            "result_norm",
            None,
            &[A(&x), W(&w.output_norm.desc)],
            || candle_nn::ops::rms_norm(&x, &w.output_norm.w, hp.rms_eps),
        )?;
        o.node(
            "MUL_MAT",
            "result_output",
            None,
            &[W(&w.output.desc), A(&cur)],
            || w.output.mm.forward(&cur),
        )
    }

    /// Q/K/V projections, q/k norms, rope, the cache write, causal softmax attention with
    /// grouped heads (each key/value head serves `n_rep` query heads without copying it), and
    /// the output projection.
    fn attention<O: Observe>(
        &self,
        o: &mut O,
        layer: &Layer,
        il: usize,
        cur: &Tensor,
        inp: &ChunkInputs,
        cache: &KvCache,
    ) -> Result<Tensor, CandleError> {
        let hp = &self.hp;
        let l = Some(il);
        let (t, nh, nkv, hd) = (inp.n_tokens, hp.n_head, hp.n_head_kv, hp.head_dim);
        let n_rep = hp.n_rep();
        let n_kv = inp.n_kv;
        let q = o.node("MUL_MAT", "Qcur", l, &[W(&layer.wq.desc), A(cur)], || {
            layer.wq.mm.forward(cur)
        })?;
        let k = o.node("MUL_MAT", "Kcur", l, &[W(&layer.wk.desc), A(cur)], || {
            layer.wk.mm.forward(cur)
        })?;
        let v = o.node("MUL_MAT", "Vcur", l, &[W(&layer.wv.desc), A(cur)], || {
            layer.wv.mm.forward(cur)
        })?;
        // rope: the tokens are the batch of candle's kernels; (T, 1, heads, hd) for NEOX
        // (`rope_thd`), (T, heads, 1, hd) for the interleaved style (`rope_i`): both the same
        // memory as (T, heads, hd)
        let rope = |o: &mut O,
                    x: &Tensor,
                    heads: usize,
                    norm: Option<&crate::weights::Norm>,
                    normed: &'static str,
                    name: &'static str|
         -> Result<Tensor, CandleError> {
            let shape = match hp.arch.rope_style() {
                RopeStyle::Neox => (t, 1, heads, hd),
                RopeStyle::Normal => (t, heads, 1, hd),
            };
            let x = o.node("RESHAPE", "", l, &[A(x)], || x.reshape(shape))?;
            let x = match norm {
                Some(n) => o.node("RMS_NORM", normed, l, &[A(&x), W(&n.desc)], || {
                    candle_nn::ops::rms_norm(&x, &n.w, hp.rms_eps)
                })?,
                None => x,
            };
            o.node(
                "ROPE",
                name,
                l,
                &[A(&x), A(&inp.cos), A(&inp.sin)],
                || match hp.arch.rope_style() {
                    RopeStyle::Neox => candle_nn::rotary_emb::rope_thd(&x, &inp.cos, &inp.sin),
                    RopeStyle::Normal => candle_nn::rotary_emb::rope_i(&x, &inp.cos, &inp.sin),
                },
            )
        };
        let q = rope(o, &q, nh, layer.q_norm.as_ref(), "Qcur_normed", "Qcur")?;
        let k = rope(o, &k, nkv, layer.k_norm.as_ref(), "Kcur_normed", "Kcur")?;

        // cache writes: rows kv_row0.. of (capacity, n_kv_heads, hd)
        let (kc, vc) = (&cache.k[il], &cache.v[il]);
        let pos0 = inp.kv_row0;
        let k3 = o.node("RESHAPE", "", l, &[A(&k)], || k.reshape((t, nkv, hd)))?;
        o.node("SET_ROWS", "", l, &[A(&k3), A(kc)], || {
            kc.slice_set(&k3, 0, pos0)?;
            kc.narrow(0, pos0, t)
        })?;
        let v3 = o.node("RESHAPE", "", l, &[A(&v)], || v.reshape((t, nkv, hd)))?;
        o.node("SET_ROWS", "", l, &[A(&v3), A(vc)], || {
            vc.slice_set(&v3, 0, pos0)?;
            vc.narrow(0, pos0, t)
        })?;

        // queries grouped by key/value head: (n_kv_heads, n_rep * T, hd)
        let q = o.node("RESHAPE", "", l, &[A(&q)], || q.reshape((t, nh, hd)))?;
        let q = o.node("PERMUTE", "", l, &[A(&q)], || q.transpose(0, 1))?;
        let q = o.node("CONT", "", l, &[A(&q)], || q.contiguous())?;
        let q = o.node("RESHAPE", "", l, &[A(&q)], || {
            q.reshape((nkv, n_rep * t, hd))
        })?;
        // keys and values of every position so far, viewed in the cache
        let kall = o.node("VIEW", "", l, &[A(kc)], || kc.narrow(0, 0, n_kv))?;
        let kall = o.node("PERMUTE", "", l, &[A(&kall)], || kall.transpose(0, 1))?;
        let kt = o.node("TRANSPOSE", "", l, &[A(&kall)], || kall.t())?;
        let vall = o.node("VIEW", "", l, &[A(vc)], || vc.narrow(0, 0, n_kv))?;
        let vall = o.node("PERMUTE", "", l, &[A(&vall)], || vall.transpose(0, 1))?;

        let kq = o.node("MUL_MAT", "kq", l, &[A(&kt), A(&q)], || q.matmul(&kt))?;
        let kq = o.node("RESHAPE", "", l, &[A(&kq)], || {
            kq.reshape((nkv, n_rep, t, n_kv))
        })?;
        let kq = o.node("SCALE", "kq_scaled", l, &[A(&kq)], || {
            kq.affine(hp.kq_scale as f64, 0.0)
        })?;
        let kq = o.node("ADD", "kq_masked", l, &[A(&kq), A(&inp.mask)], || {
            kq.broadcast_add(&inp.mask)
        })?;
        let kq = o.node("SOFT_MAX", "kq_soft_max", l, &[A(&kq)], || {
            candle_nn::ops::softmax_last_dim(&kq)
        })?;
        let kq = o.node("RESHAPE", "", l, &[A(&kq)], || {
            kq.reshape((nkv, n_rep * t, n_kv))
        })?;
        let kqv = o.node("MUL_MAT", "kqv", l, &[A(&vall), A(&kq)], || {
            kq.matmul(&vall)
        })?;
        let kqv = o.node("RESHAPE", "", l, &[A(&kqv)], || kqv.reshape((nh, t, hd)))?;
        let kqv = o.node("PERMUTE", "", l, &[A(&kqv)], || kqv.transpose(0, 1))?;
        let kqv = o.node("CONT", "kqv_out", l, &[A(&kqv)], || kqv.contiguous())?;
        let kqv = o.node("RESHAPE", "", l, &[A(&kqv)], || kqv.reshape((t, nh * hd)))?;
        o.node(
            "MUL_MAT",
            "attn_out",
            l,
            &[W(&layer.wo.desc), A(&kqv)],
            || layer.wo.mm.forward(&kqv),
        )
    }

    /// The routed experts: router softmax, top-k renormalised (llama.cpp's `build_moe_ffn` with
    /// `norm_w`), then the (token, expert) pairs sorted by expert, one gather of their rows,
    /// per expert with tokens a quantised gate/up, SiLU x up and down over its rows, and one
    /// weighted scatter-add back to the tokens.
    fn moe<O: Observe>(
        &self,
        o: &mut O,
        layer: &Layer,
        il: usize,
        cur: &Tensor,
        routing: &mut Vec<Vec<usize>>,
    ) -> Result<Tensor, CandleError> {
        let Ffn::Moe {
            router,
            gate_up,
            down,
        } = &layer.ffn
        else {
            return Err(CandleError::Invalid(format!("layer {il} has no experts")));
        };
        let hp = &self.hp;
        let l = Some(il);
        let k = hp.n_expert_used;
        let n_expert = hp.n_expert;
        let logits = o.node(
            "MUL_MAT",
            "ffn_moe_logits",
            l,
            &[W(&router.desc), A(cur)],
            || router.mm.forward(cur),
        )?;
        let probs = o.node("SOFT_MAX", "ffn_moe_probs", l, &[A(&logits)], || {
            candle_nn::ops::softmax_last_dim(&logits)
        })?;
        let order = o.node("ARGSORT", "ffn_moe_argsort", l, &[A(&probs)], || {
            probs.arg_sort_last_dim(false)
        })?;
        let topk = o.node("VIEW", "", l, &[A(&order)], || order.narrow(1, 0, k))?;
        let topk = o.node("CONT", "ffn_moe_topk", l, &[A(&topk)], || topk.contiguous())?;
        let weights = o.node(
            "GET_ROWS",
            "ffn_moe_weights",
            l,
            &[A(&probs), A(&topk)],
            || probs.gather(&topk, 1),
        )?;
        let sum = o.node("SUM_ROWS", "ffn_moe_weights_sum", l, &[A(&weights)], || {
            weights.sum_keepdim(1)
        })?;
        let sum = o.node(
            "CLAMP",
            "ffn_moe_weights_sum_clamped",
            l,
            &[A(&sum)],
            || sum.clamp(WEIGHTS_SUM_MIN, f32::INFINITY),
        )?;
        let mut weights = o.node(
            "DIV",
            "ffn_moe_weights_norm",
            l,
            &[A(&weights), A(&sum)],
            || weights.broadcast_div(&sum),
        )?;
        let scale = hp.expert_weights_scale;
        if scale != 0.0 && scale != 1.0 {
            weights = o.node("SCALE", "ffn_moe_weights_scaled", l, &[A(&weights)], || {
                weights.affine(scale as f64, 0.0)
            })?;
        }
        let route = o.node(
            "MOE_ROUTE",
            "ffn_moe_route",
            l,
            &[A(&topk), A(&weights)],
            || route(&topk, &weights, n_expert),
        )?;
        routing.push(route.counts.clone());
        let xs = o.node(
            "GET_ROWS",
            "ffn_moe_gather",
            l,
            &[A(cur), A(&route.tokens)],
            || cur.index_select(&route.tokens, 0),
        )?;
        let mut outs = Vec::with_capacity(n_expert);
        let mut start = 0;
        for (e, &n) in route.counts.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let xe = o.node("VIEW", "", l, &[A(&xs)], || xs.narrow(0, start, n))?;
            start += n;
            let (g, u) = match gate_up {
                GateUp::Separate { gate, up } => {
                    let g = o.node(
                        "MUL_MAT",
                        "ffn_moe_gate",
                        l,
                        &[W(&gate.descs[e]), A(&xe)],
                        || gate.mm[e].forward(&xe),
                    )?;
                    let u = o.node(
                        "MUL_MAT",
                        "ffn_moe_up",
                        l,
                        &[W(&up.descs[e]), A(&xe)],
                        || up.mm[e].forward(&xe),
                    )?;
                    (g, u)
                }
                GateUp::Fused(gu) => {
                    let ff = gu.rows / 2;
                    let both = o.node(
                        "MUL_MAT",
                        "ffn_moe_gate_up",
                        l,
                        &[W(&gu.descs[e]), A(&xe)],
                        || gu.mm[e].forward(&xe),
                    )?;
                    let g = o.node("VIEW", "", l, &[A(&both)], || both.narrow(D::Minus1, 0, ff))?;
                    let u = o.node("VIEW", "", l, &[A(&both)], || {
                        both.narrow(D::Minus1, ff, ff)
                    })?;
                    (g, u)
                }
            };
            let a = o.node("SILU", "ffn_moe_silu", l, &[A(&g)], || g.silu())?;
            let h = o.node("MUL", "ffn_moe_swiglu", l, &[A(&a), A(&u)], || a.mul(&u))?;
            let d = o.node(
                "MUL_MAT",
                "ffn_moe_down",
                l,
                &[W(&down.descs[e]), A(&h)],
                || down.mm[e].forward(&h),
            )?;
            outs.push(d);
        }
        let srcs: Vec<Src<'_>> = outs.iter().map(A).collect();
        let all = o.node("CONCAT", "ffn_moe_cat", l, &srcs, || Tensor::cat(&outs, 0))?;
        let weighted = o.node(
            "MUL",
            "ffn_moe_weighted",
            l,
            &[A(&all), A(&route.weights)],
            || all.broadcast_mul(&route.weights),
        )?;
        let n_rows = cur.dim(0)?;
        o.node(
            "INDEX_ADD",
            "ffn_moe_out",
            l,
            &[A(&weighted), A(&route.tokens)],
            || {
                Tensor::zeros((n_rows, hp.n_embd), DType::F32, &Device::Cpu)?.index_add(
                    &route.tokens,
                    &weighted,
                    0,
                )
            },
        )
    }
}

/// Sorts the (token, slot) pairs of `topk` `(T, k)` by expert, keeping token order within an
/// expert, with their routing weights.
fn route(topk: &Tensor, weights: &Tensor, n_expert: usize) -> candle_core::Result<Route> {
    let ids = topk.to_vec2::<u32>()?;
    let ws = weights.to_vec2::<f32>()?;
    let mut counts = vec![0usize; n_expert];
    for row in &ids {
        for &e in row {
            let e = e as usize;
            if e >= n_expert {
                candle_core::bail!("expert id {e} out of {n_expert}");
            }
            counts[e] += 1;
        }
    }
    let mut next = Vec::with_capacity(n_expert);
    let mut acc = 0;
    for &c in &counts {
        next.push(acc);
        acc += c;
    }
    let mut tokens = vec![0u32; acc];
    let mut wsorted = vec![0f32; acc];
    for (t, (row, wrow)) in ids.iter().zip(&ws).enumerate() {
        for (&e, &wt) in row.iter().zip(wrow) {
            let slot = &mut next[e as usize];
            tokens[*slot] = t as u32;
            wsorted[*slot] = wt;
            *slot += 1;
        }
    }
    let dev = &Device::Cpu;
    Ok(Route {
        tokens: Tensor::from_vec(tokens, acc, dev)?,
        weights: Tensor::from_vec(wsorted, (acc, 1), dev)?,
        counts,
    })
}
