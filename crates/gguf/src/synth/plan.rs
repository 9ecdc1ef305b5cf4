//! The plan of a synthetic model: its metadata and every tensor with shape, type and fill, before any byte is written.
//!
//! Tensor names and shapes follow what the vendored llama.cpp loads for each arch
//! (`src/models/<arch>.cpp`, `load_arch_tensors`); keys follow `load_hparams` in
//! `src/llama-model.cpp` and each arch's `load_arch_hparams`. llama.cpp refuses a file with a
//! tensor it does not load ("wrong number of tensors"), so the plan writes exactly those.

use std::path::Path;

use serde::Serialize;

use super::preset::{Arch, Llama3Rope, Mla, MoeShape, Preset};
use super::{SynthError, SynthOptions};
use crate::types::GgmlType;
use crate::value::{Array, Value};
use crate::writer::{Layout, TensorSpec};

/// llama.cpp's `LLAMA_MAX_LAYERS`.
const MAX_LAYERS: u32 = 512;
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
const MAX_EXPERTS: u32 = 1024;

/// What a tensor holds; the generator turns this into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub enum Fill {
    /// A matmul weight: random quantised blocks with sane scales, or uniform floats in
    /// about +-0.035 for float types.
    Weights,
    /// Every element equal (norm weights: 1.0).
    Constant(f32),
    /// F32 uniform in [low, high).
    Uniform { low: f32, high: f32 },
    /// Llama 3 rope frequency factors (`rope_freqs.weight`) for `dims` rope dims.
    Llama3RopeFactors {
        rope: Llama3Rope,
        dims: u32,
        base: f32,
    },
}

/// What part of the model a tensor belongs to, which decides its type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Role {
    /// Routed-expert weights: `expert_type`.
    Expert,
    /// 2-D matmul weights (attention, linear attention, shared expert, dense FFN, embeddings,
    /// output): `dense_type`.
    Dense,
    /// Always F32: norms, biases, ssm_a, ssm_conv1d, routers, rope factors.
    F32,
}

/// One tensor of the plan.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedTensor {
    pub name: String,
    /// ne[0] first.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    pub role: Role,
    pub fill: Fill,
    /// Offset in the data section.
    pub offset_bytes: u64,
    pub size_bytes: u64,
}

impl PlannedTensor {
    pub fn spec(&self) -> TensorSpec {
        TensorSpec::new(self.name.clone(), &self.dims, self.ggml_type)
    }
}

/// A synthetic model, fully described, with nothing written.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelPlan {
    pub preset: String,
    pub arch: Arch,
    pub layers: u32,
    /// Layers with softmax attention (all of them outside qwen35moe).
    pub full_attention_layers: Vec<u32>,
    /// qwen35moe's gated delta-net layers.
    pub linear_attention_layers: Vec<u32>,
    pub experts: Option<u32>,
    pub experts_used: Option<u32>,
    pub fused_gate_up: bool,
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<PlannedTensor>,
    pub layout: Layout,
}

impl ModelPlan {
    /// Bytes of the file the plan writes.
    pub fn file_size_bytes(&self) -> u64 {
        self.layout.file_size_bytes
    }

    /// Sum of the tensors' sizes, without padding.
    pub fn tensor_data_size_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size_bytes).sum()
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&PlannedTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The writer's specs, in file order.
    pub fn specs(&self) -> Vec<TensorSpec> {
        self.tensors.iter().map(PlannedTensor::spec).collect()
    }
}

/// Types the generator can fill with valid data.
pub const GENERATED_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Plans the model of `opts.preset`.
pub fn plan(opts: &SynthOptions) -> Result<ModelPlan, SynthError> {
    let preset = super::preset::preset(&opts.preset).ok_or_else(|| SynthError::UnknownPreset {
        name: opts.preset.clone(),
        known: super::preset::presets()
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", "),
    })?;
    plan_for(preset, opts)
}

/// Plans a model of any preset, built-in or not; `opts.preset` is ignored.
pub fn plan_for(preset: &Preset, opts: &SynthOptions) -> Result<ModelPlan, SynthError> {
    for (role, t) in [("expert", opts.expert_type), ("dense", opts.dense_type)] {
        if !GENERATED_TYPES.contains(&t) {
            return Err(SynthError::UnsupportedType {
                ggml_type: t,
                role,
                supported: GENERATED_TYPES.map(GgmlType::name).join(", "),
            });
        }
    }
    let layers = opts.layers.unwrap_or(preset.block_count);
    if layers == 0 || layers > MAX_LAYERS {
        return Err(SynthError::BadOption(format!(
            "layers must be 1 to {MAX_LAYERS}, got {layers}"
        )));
    }
    let context_length = opts.context_length.unwrap_or(preset.context_length);
    if context_length == 0 {
        return Err(SynthError::BadOption(
            "context length must be above 0".into(),
        ));
    }
    let moe = match preset.moe {
        Some(m) => {
            let experts = opts.experts.unwrap_or(m.expert_count);
            if experts == 0 || experts > MAX_EXPERTS {
                return Err(SynthError::BadOption(format!(
                    "experts must be 1 to {MAX_EXPERTS}, got {experts}"
                )));
            }
            let used = opts
                .experts_used
                .unwrap_or_else(|| m.expert_used_count.min(experts));
            if used == 0 || used > experts {
                return Err(SynthError::BadOption(format!(
                    "experts used must be 1 to the expert count ({experts}), got {used}"
                )));
            }
            Some((experts, used, m))
        }
        None => {
            if opts.experts.is_some() || opts.experts_used.is_some() {
                return Err(SynthError::BadOption(format!(
                    "preset {} ({}) is dense: it has no experts to set",
                    preset.name, preset.arch
                )));
            }
            None
        }
    };
    if opts.fused_gate_up && !(preset.arch.supports_fused_gate_up() && moe.is_some()) {
        return Err(SynthError::FusedNotSupported { arch: preset.arch });
    }

    if let Some(la) = preset.linear_attention {
        if u32::try_from(la.inner_size()).is_err() {
            return Err(SynthError::BadOption(format!(
                "ssm inner size {} (state size x time-step rank) does not fit a u32",
                la.inner_size()
            )));
        }
    }
    if preset.extras.leading_dense_layers > 0 && preset.feed_forward_length == 0 {
        return Err(SynthError::BadOption(format!(
            "preset {} has leading dense layers but no feed_forward_length",
            preset.name
        )));
    }

    let shapes: Vec<LayerShape> = (0..layers).map(|il| layer_shape(preset, il)).collect();
    let full_attention_layers: Vec<u32> = (0..layers)
        .filter(|&il| shapes[il as usize].mixer == MixerShape::Attention)
        .collect();
    let linear_attention_layers: Vec<u32> = (0..layers)
        .filter(|&il| {
            matches!(
                shapes[il as usize].mixer,
                MixerShape::DeltaNet | MixerShape::Mamba2
            )
        })
        .collect();

    let metadata = metadata(
        preset,
        opts,
        layers,
        &shapes,
        context_length,
        moe.map(|(e, u, _)| (e, u)),
    );

    let mut b = Builder {
        opts,
        tensors: Vec::new(),
    };
    let e = u64::from(preset.embedding_length);
    let v = u64::from(preset.vocab_size);

    b.add("token_embd.weight", &[e, v], Role::Dense, Fill::Weights);
    if let Some(rope) = preset.llama3_rope {
        // llama.cpp (models/llama.cpp): rope_freqs {n_rot/2}, loaded once, shared by all layers.
        let dims = preset.rope_dimension_count;
        let fill = Fill::Llama3RopeFactors {
            rope,
            dims,
            base: preset.rope_freq_base,
        };
        b.add("rope_freqs.weight", &[u64::from(dims / 2)], Role::F32, fill);
    }
    for (il, shape) in shapes.iter().enumerate() {
        layer_tensors(preset, opts, moe, il as u32, *shape, &mut b);
    }
    b.add("output_norm.weight", &[e], Role::F32, Fill::Constant(1.0));
    if !preset.extras.tied_output {
        // Written, not tied: llama.cpp would otherwise reuse token_embd for the head.
        b.add("output.weight", &[e, v], Role::Dense, Fill::Weights);
    }

    let mut tensors = b.finish()?;
    let specs: Vec<TensorSpec> = tensors.iter().map(PlannedTensor::spec).collect();
    let name = format!("{}.gguf", preset.name);
    let layout = Layout::compute(Path::new(&name), &metadata, &specs)?;
    for (t, info) in tensors.iter_mut().zip(&layout.tensors) {
        t.offset_bytes = info.offset_bytes;
        t.size_bytes = info.size_bytes;
    }
    Ok(ModelPlan {
        preset: preset.name.to_string(),
        arch: preset.arch,
        layers,
        full_attention_layers,
        linear_attention_layers,
        experts: moe.map(|(e, _, _)| e),
        experts_used: moe.map(|(_, u, _)| u),
        fused_gate_up: opts.fused_gate_up,
        metadata,
        tensors,
        layout,
    })
}

/// A layer's token mixer, as the planner writes its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MixerShape {
    /// Softmax attention (sliding or not: the tensors are the same).
    Attention,
    /// qwen3.5's gated delta-net.
    DeltaNet,
    /// Nemotron-H's Mamba-2.
    Mamba2,
    /// No mixer (an FFN-only layer of Nemotron-H).
    None,
}

/// A layer's FFN, as the planner writes its tensors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FfnShape {
    Dense,
    Moe,
    None,
}

/// What layer `il` of a model of `preset` holds: its mixer and its FFN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerShape {
    pub mixer: MixerShape,
    pub ffn: FfnShape,
}

/// The structure of layer `il` as llama.cpp's loader for the architecture decides it.
pub fn layer_shape(preset: &Preset, il: u32) -> LayerShape {
    let moe_ffn = if preset.moe.is_some() && il >= preset.extras.leading_dense_layers {
        FfnShape::Moe
    } else {
        FfnShape::Dense
    };
    if let Some(pattern) = preset.extras.layer_pattern {
        // nemotron-h.cpp: Mamba-2 where head_count_kv[il] == 0 and feed_forward_length[il]
        // == 0, attention where head_count_kv[il] > 0, an FFN-only layer where
        // feed_forward_length[il] > 0
        let c = pattern.as_bytes()[il as usize % pattern.len().max(1)];
        return match c {
            b'M' => LayerShape {
                mixer: MixerShape::Mamba2,
                ffn: FfnShape::None,
            },
            b'*' => LayerShape {
                mixer: MixerShape::Attention,
                ffn: FfnShape::None,
            },
            _ => LayerShape {
                mixer: MixerShape::None,
                ffn: moe_ffn,
            },
        };
    }
    let mixer = match preset.linear_attention {
        // qwen35moe.cpp / qwen35.cpp / qwen3next.cpp: full attention where (il + 1) %
        // full_attention_interval == 0
        Some(la) if !(il + 1).is_multiple_of(la.full_attention_interval.max(1)) => {
            MixerShape::DeltaNet
        }
        _ => MixerShape::Attention,
    };
    LayerShape {
        mixer,
        ffn: moe_ffn,
    }
}

/// Every tensor of layer `il`, in the order llama.cpp's `load_arch_tensors` creates them.
fn layer_tensors(
    preset: &Preset,
    opts: &SynthOptions,
    moe: Option<(u32, u32, MoeShape)>,
    il: u32,
    shape: LayerShape,
    b: &mut Builder,
) {
    let blk = |t: &str| format!("blk.{il}.{t}");
    let e = u64::from(preset.embedding_length);
    let hd = u64::from(preset.head_dim);
    let nh = u64::from(preset.head_count);
    let nkv = u64::from(preset.head_count_kv);
    let ones = Fill::Constant(1.0);
    let arch = preset.arch;
    let w =
        |b: &mut Builder, t: &str, dims: &[u64]| b.add(&blk(t), dims, Role::Dense, Fill::Weights);
    let norm =
        |b: &mut Builder, t: &str, n: u64| b.add(&blk(t), &[n], Role::F32, Fill::Constant(1.0));
    let bias = |b: &mut Builder, t: &str, dims: &[u64]| {
        b.add(
            &blk(t),
            dims,
            Role::F32,
            Fill::Uniform {
                low: -0.02,
                high: 0.02,
            },
        )
    };

    norm(b, "attn_norm.weight", e);
    match shape.mixer {
        MixerShape::Attention => match arch {
            Arch::Deepseek2 => {
                let mla = preset.extras.mla.unwrap_or(Mla {
                    q_lora_rank: 0,
                    kv_lora_rank: 0,
                    qk_nope_head_dim: 0,
                    qk_rope_head_dim: 0,
                    v_head_dim: 0,
                });
                let qr = u64::from(mla.q_lora_rank);
                let kvr = u64::from(mla.kv_lora_rank);
                let nope = u64::from(mla.qk_nope_head_dim);
                let rope = u64::from(mla.qk_rope_head_dim);
                let k_mla = nope + rope;
                let v_mla = u64::from(mla.v_head_dim);
                // deepseek2.cpp:98-122: q through a low-rank pair, the compressed KV with its
                // rope part, and K/V decompression split per head (absorbed MLA)
                if qr > 0 {
                    norm(b, "attn_q_a_norm.weight", qr);
                }
                norm(b, "attn_kv_a_norm.weight", kvr);
                if qr > 0 {
                    w(b, "attn_q_a.weight", &[e, qr]);
                    w(b, "attn_q_b.weight", &[qr, nh.saturating_mul(k_mla)]);
                } else {
                    w(b, "attn_q.weight", &[e, nh.saturating_mul(k_mla)]);
                }
                w(b, "attn_kv_a_mqa.weight", &[e, kvr + rope]);
                w(b, "attn_k_b.weight", &[nope, kvr, nh]);
                w(b, "attn_v_b.weight", &[kvr, v_mla, nh]);
                w(b, "attn_output.weight", &[nh.saturating_mul(v_mla), e]);
            }
            _ => {
                // qwen2, qwen2moe, olmoe, phi3 project Q to n_embd (they require head_dim x
                // heads = n_embd); the qwen3.5 family's Q also carries the output gate
                let q = match arch {
                    Arch::Qwen35Moe | Arch::Qwen35 | Arch::Qwen3Next => (hd * nh).saturating_mul(2),
                    _ => hd * nh,
                };
                let kv = hd * nkv;
                if preset.extras.fused_qkv {
                    w(b, "attn_qkv.weight", &[e, q + 2 * kv]);
                } else {
                    w(b, "attn_q.weight", &[e, q]);
                    w(b, "attn_k.weight", &[e, kv]);
                    w(b, "attn_v.weight", &[e, kv]);
                }
                if preset.extras.qkv_bias {
                    bias(b, "attn_q.bias", &[q]);
                    bias(b, "attn_k.bias", &[kv]);
                    bias(b, "attn_v.bias", &[kv]);
                }
                w(b, "attn_output.weight", &[hd * nh, e]);
                match arch {
                    Arch::Qwen35Moe
                    | Arch::Qwen35
                    | Arch::Qwen3Next
                    | Arch::Qwen3Moe
                    | Arch::Qwen3 => {
                        norm(b, "attn_q_norm.weight", hd);
                        norm(b, "attn_k_norm.weight", hd);
                    }
                    Arch::Olmoe => {
                        // olmoe.cpp:28-29: the norms span the whole projected row
                        norm(b, "attn_q_norm.weight", e);
                        norm(b, "attn_k_norm.weight", e);
                    }
                    Arch::Gemma2 => norm(b, "post_attention_norm.weight", e),
                    Arch::Gemma3 => {
                        norm(b, "post_attention_norm.weight", e);
                        norm(b, "attn_k_norm.weight", hd);
                        norm(b, "attn_q_norm.weight", hd);
                    }
                    Arch::GptOss => {
                        // openai-moe.cpp:37-49: the pre-FFN norm, sinks (F32) and the output bias
                        norm(b, "post_attention_norm.weight", e);
                        b.add(
                            &blk("attn_sinks.weight"),
                            &[nh],
                            Role::F32,
                            Fill::Uniform {
                                low: -0.5,
                                high: 0.5,
                            },
                        );
                        bias(b, "attn_output.bias", &[e]);
                    }
                    _ => {}
                }
            }
        },
        MixerShape::DeltaNet => {
            let la = preset
                .linear_attention
                .expect("a delta-net layer has a linear-attention shape");
            let dk = u64::from(la.state_size);
            let gk = u64::from(la.group_count);
            let hv = u64::from(la.time_step_rank);
            let value_dim = dk * hv;
            let conv_dim = la.conv_dim();
            w(
                b,
                "attn_qkv.weight",
                &[e, (2 * dk).saturating_mul(gk).saturating_add(value_dim)],
            );
            w(b, "attn_gate.weight", &[e, value_dim]);
            b.add(
                &blk("ssm_conv1d.weight"),
                &[u64::from(la.conv_kernel), conv_dim],
                Role::F32,
                Fill::Uniform {
                    low: -0.3,
                    high: 0.3,
                },
            );
            b.add(
                &blk("ssm_dt.bias"),
                &[hv],
                Role::F32,
                Fill::Uniform {
                    low: -0.1,
                    high: 0.1,
                },
            );
            // ssm_a = -exp(A_log): negative.
            b.add(
                &blk("ssm_a"),
                &[hv],
                Role::F32,
                Fill::Uniform {
                    low: -4.0,
                    high: -0.5,
                },
            );
            if arch == Arch::Qwen3Next {
                // qwen3next.cpp:92: beta and alpha in one projection
                w(b, "ssm_ba.weight", &[e, 2 * hv]);
            } else {
                w(b, "ssm_beta.weight", &[e, hv]);
                w(b, "ssm_alpha.weight", &[e, hv]);
            }
            norm(b, "ssm_norm.weight", dk);
            w(b, "ssm_out.weight", &[value_dim, e]);
        }
        MixerShape::Mamba2 => {
            let m = preset.extras.mamba2.expect("a Mamba-2 layer has its shape");
            let heads = u64::from(m.head_count);
            let inner = u64::from(m.inner_size);
            let groups = u64::from(m.group_count.max(1));
            // nemotron-h.cpp:85-101
            w(b, "ssm_in.weight", &[e, m.in_proj()]);
            b.add(
                &blk("ssm_conv1d.weight"),
                &[u64::from(m.conv_kernel), m.conv_dim()],
                Role::F32,
                Fill::Uniform {
                    low: -0.3,
                    high: 0.3,
                },
            );
            bias(b, "ssm_conv1d.bias", &[m.conv_dim()]);
            b.add(
                &blk("ssm_dt.bias"),
                &[heads],
                Role::F32,
                Fill::Uniform {
                    low: -0.1,
                    high: 0.1,
                },
            );
            b.add(
                &blk("ssm_a"),
                &[1, heads],
                Role::F32,
                Fill::Uniform {
                    low: -4.0,
                    high: -0.5,
                },
            );
            b.add(&blk("ssm_d"), &[1, heads], Role::F32, ones);
            b.add(
                &blk("ssm_norm.weight"),
                &[inner / groups, groups],
                Role::F32,
                ones,
            );
            w(b, "ssm_out.weight", &[inner, e]);
        }
        MixerShape::None => {}
    }

    // the norm in front of the FFN: qwen3.5's "post_attention_norm", ffn_norm elsewhere
    match (arch, shape.ffn) {
        (_, FfnShape::None) | (Arch::NemotronH, _) | (Arch::GptOss, _) => {}
        (Arch::Qwen35Moe | Arch::Qwen35 | Arch::Qwen3Next, _) => {
            norm(b, "post_attention_norm.weight", e)
        }
        _ => norm(b, "ffn_norm.weight", e),
    }
    match shape.ffn {
        FfnShape::None => {}
        FfnShape::Dense => {
            let ff = u64::from(preset.feed_forward_length);
            match arch {
                Arch::Phi3 => {
                    // phi3.cpp:51-52: gate and up in one ffn_up of twice the width
                    w(b, "ffn_down.weight", &[ff, e]);
                    w(b, "ffn_up.weight", &[e, 2 * ff]);
                }
                Arch::NemotronH => {
                    // nemotron-h.cpp:132-138: up and down (squared ReLU), no gate
                    w(b, "ffn_up.weight", &[e, ff]);
                    w(b, "ffn_down.weight", &[ff, e]);
                }
                _ => {
                    w(b, "ffn_gate.weight", &[e, ff]);
                    w(b, "ffn_up.weight", &[e, ff]);
                    w(b, "ffn_down.weight", &[ff, e]);
                }
            }
        }
        FfnShape::Moe => {
            let (experts, _, m) = moe.expect("a MoE layer has experts");
            let nexp = u64::from(experts);
            let ff = u64::from(m.expert_feed_forward_length);
            // The router stays F32, as llama-quant.cpp leaves "ffn_gate_inp.weight".
            b.add(
                &blk("ffn_gate_inp.weight"),
                &[e, nexp],
                Role::F32,
                Fill::Weights,
            );
            if arch == Arch::GptOss {
                bias(b, "ffn_gate_inp.bias", &[nexp]);
            }
            let expert = |b: &mut Builder, t: &str, dims: &[u64]| {
                b.add(&blk(t), dims, Role::Expert, Fill::Weights)
            };
            if opts.fused_gate_up {
                expert(b, "ffn_gate_up_exps.weight", &[e, 2 * ff, nexp]);
            } else {
                expert(b, "ffn_gate_exps.weight", &[e, ff, nexp]);
                expert(b, "ffn_up_exps.weight", &[e, ff, nexp]);
            }
            expert(b, "ffn_down_exps.weight", &[ff, e, nexp]);
            if arch == Arch::GptOss {
                // openai-moe.cpp:52-54: every expert matmul has a bias
                bias(b, "ffn_gate_exps.bias", &[ff, nexp]);
                bias(b, "ffn_down_exps.bias", &[e, nexp]);
                bias(b, "ffn_up_exps.bias", &[ff, nexp]);
            }
            let ffs = match arch {
                // deepseek2.cpp:146-148: the shared experts' width is n_ff_exp x their count
                Arch::Deepseek2 => ff * u64::from(preset.extras.expert_shared_count.max(1)),
                _ => u64::from(m.shared_expert_feed_forward_length),
            };
            if ffs > 0 {
                if matches!(arch, Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Qwen2Moe) {
                    // 1-D: llama-quant.cpp never quantises tensors under 2 dims.
                    b.add(
                        &blk("ffn_gate_inp_shexp.weight"),
                        &[e],
                        Role::F32,
                        Fill::Weights,
                    );
                }
                w(b, "ffn_gate_shexp.weight", &[e, ffs]);
                w(b, "ffn_up_shexp.weight", &[e, ffs]);
                w(b, "ffn_down_shexp.weight", &[ffs, e]);
            }
        }
    }
    match arch {
        Arch::Gemma2 | Arch::Gemma3 if shape.ffn != FfnShape::None => {
            norm(b, "post_ffw_norm.weight", e)
        }
        _ => {}
    }
}

struct Builder<'a> {
    opts: &'a SynthOptions,
    tensors: Vec<PlannedTensor>,
}

impl Builder<'_> {
    fn add(&mut self, name: &str, dims: &[u64], role: Role, fill: Fill) {
        let ggml_type = match role {
            Role::Expert => self.opts.expert_type,
            Role::Dense => self.opts.dense_type,
            Role::F32 => GgmlType::F32,
        };
        self.tensors.push(PlannedTensor {
            name: name.to_string(),
            dims: dims.to_vec(),
            ggml_type,
            role,
            fill,
            offset_bytes: 0,
            size_bytes: 0,
        });
    }

    /// Checks that every tensor's ne[0] fits its type's block size.
    fn finish(self) -> Result<Vec<PlannedTensor>, SynthError> {
        for t in &self.tensors {
            let ne0 = t.dims.first().copied().unwrap_or(0);
            let block_size = t.ggml_type.block_size();
            if ne0 % u64::from(block_size) != 0 {
                return Err(SynthError::TypeDoesNotFit {
                    tensor: t.name.clone(),
                    ggml_type: t.ggml_type,
                    ne0,
                    block_size,
                });
            }
        }
        Ok(self.tensors)
    }
}

fn metadata(
    preset: &Preset,
    opts: &SynthOptions,
    layers: u32,
    shapes: &[LayerShape],
    context_length: u32,
    moe: Option<(u32, u32)>,
) -> Vec<(String, Value)> {
    let arch = preset.arch;
    let a = arch.as_str();
    let mut m: Vec<(String, Value)> = Vec::new();
    let mut put = |key: String, value: Value| m.push((key, value));
    let s = |v: &str| Value::String(v.to_string());
    put("general.architecture".into(), s(a));
    put(
        "general.name".into(),
        s(&format!("{} (synthetic)", preset.name)),
    );
    put("general.alignment".into(), Value::U32(32));
    put("opledger.synthetic".into(), Value::Bool(true));
    put("opledger.preset".into(), s(preset.name));
    put("opledger.seed".into(), Value::U64(opts.seed));
    put("opledger.expert_type".into(), s(opts.expert_type.name()));
    put("opledger.dense_type".into(), s(opts.dense_type.name()));
    put("opledger.source".into(), s(preset.source));
    // llama-vocab.cpp: model "none" gives a vocab of `{arch}.vocab_size` dummy tokens.
    put("tokenizer.ggml.model".into(), s("none"));
    put(format!("{a}.vocab_size"), Value::U32(preset.vocab_size));
    put(format!("{a}.context_length"), Value::U32(context_length));
    put(
        format!("{a}.embedding_length"),
        Value::U32(preset.embedding_length),
    );
    put(format!("{a}.block_count"), Value::U32(layers));
    let per_layer = |f: &dyn Fn(&LayerShape) -> u32| -> Value {
        Value::Array(Array::U32(shapes.iter().map(f).collect()))
    };
    if arch == Arch::NemotronH {
        // nemotron-h.cpp:14-16 reads the layer kinds from these two arrays
        let ff = preset.feed_forward_length;
        put(
            format!("{a}.feed_forward_length"),
            per_layer(&|l| if l.mixer == MixerShape::None { ff } else { 0 }),
        );
    } else if preset.feed_forward_length > 0 {
        put(
            format!("{a}.feed_forward_length"),
            Value::U32(preset.feed_forward_length),
        );
    }
    put(
        format!("{a}.attention.head_count"),
        Value::U32(preset.head_count),
    );
    let nkv = preset.head_count_kv;
    if arch == Arch::NemotronH {
        put(
            format!("{a}.attention.head_count_kv"),
            per_layer(&|l| {
                if l.mixer == MixerShape::Attention {
                    nkv
                } else {
                    0
                }
            }),
        );
    } else {
        put(format!("{a}.attention.head_count_kv"), Value::U32(nkv));
    }
    let (key_length, value_length, rope_dims) = match preset.extras.mla {
        // the MLA convention of convert_hf_to_gguf.py: the cache holds the compressed KV and the
        // rope part, one head
        Some(mla) => (
            mla.kv_lora_rank + mla.qk_rope_head_dim,
            mla.kv_lora_rank,
            mla.qk_rope_head_dim,
        ),
        None => (
            preset.head_dim,
            preset.head_dim,
            preset.rope_dimension_count,
        ),
    };
    put(format!("{a}.attention.key_length"), Value::U32(key_length));
    put(
        format!("{a}.attention.value_length"),
        Value::U32(value_length),
    );
    put(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(preset.rms_eps),
    );
    if arch == Arch::NemotronH {
        // nemotron-h.cpp:18: required, used by the MTP head's layer norm
        put(
            format!("{a}.attention.layer_norm_epsilon"),
            Value::F32(preset.rms_eps),
        );
    } else {
        put(format!("{a}.rope.dimension_count"), Value::U32(rope_dims));
        put(
            format!("{a}.rope.freq_base"),
            Value::F32(preset.rope_freq_base),
        );
    }
    if let Some((experts, used)) = moe {
        put(format!("{a}.expert_count"), Value::U32(experts));
        put(format!("{a}.expert_used_count"), Value::U32(used));
        if let Some(m) = preset.moe {
            // llama, olmoe read the expert width from feed_forward_length
            if !matches!(arch, Arch::Llama | Arch::Olmoe) {
                put(
                    format!("{a}.expert_feed_forward_length"),
                    Value::U32(m.expert_feed_forward_length),
                );
            }
            if m.shared_expert_feed_forward_length > 0 && arch != Arch::Deepseek2 {
                put(
                    format!("{a}.expert_shared_feed_forward_length"),
                    Value::U32(m.shared_expert_feed_forward_length),
                );
            }
        }
    }
    if let Some(la) = preset.linear_attention {
        if arch != Arch::Qwen3Next {
            // qwen35moe.cpp load_arch_hparams: sections are read as an array of exactly 4.
            put(
                format!("{a}.rope.dimension_sections"),
                Value::Array(Array::I32(preset.rope_dimension_sections.to_vec())),
            );
        }
        put(
            format!("{a}.full_attention_interval"),
            Value::U32(la.full_attention_interval),
        );
        put(format!("{a}.ssm.conv_kernel"), Value::U32(la.conv_kernel));
        put(format!("{a}.ssm.state_size"), Value::U32(la.state_size));
        put(format!("{a}.ssm.group_count"), Value::U32(la.group_count));
        put(
            format!("{a}.ssm.time_step_rank"),
            Value::U32(la.time_step_rank),
        );
        // plan_for refuses an inner size above u32::MAX before this is called.
        let inner = u32::try_from(la.inner_size()).unwrap_or(u32::MAX);
        put(format!("{a}.ssm.inner_size"), Value::U32(inner));
    }
    if let Some(mb) = preset.extras.mamba2 {
        put(format!("{a}.ssm.conv_kernel"), Value::U32(mb.conv_kernel));
        put(format!("{a}.ssm.inner_size"), Value::U32(mb.inner_size));
        put(format!("{a}.ssm.state_size"), Value::U32(mb.state_size));
        put(format!("{a}.ssm.time_step_rank"), Value::U32(mb.head_count));
        put(format!("{a}.ssm.group_count"), Value::U32(mb.group_count));
    }
    if let Some(sw) = preset.extras.sliding_window {
        put(
            format!("{a}.attention.sliding_window"),
            Value::U32(sw.window),
        );
        if let Some(p) = sw.pattern {
            put(
                format!("{a}.attention.sliding_window_pattern"),
                Value::U32(p),
            );
        }
    }
    if let Some((attn, last)) = preset.extras.softcap {
        put(format!("{a}.attn_logit_softcapping"), Value::F32(attn));
        put(format!("{a}.final_logit_softcapping"), Value::F32(last));
    }
    if let Some(mla) = preset.extras.mla {
        put(
            format!("{a}.leading_dense_block_count"),
            Value::U32(preset.extras.leading_dense_layers),
        );
        put(
            format!("{a}.attention.q_lora_rank"),
            Value::U32(mla.q_lora_rank),
        );
        put(
            format!("{a}.attention.kv_lora_rank"),
            Value::U32(mla.kv_lora_rank),
        );
        put(
            format!("{a}.attention.key_length_mla"),
            Value::U32(mla.qk_nope_head_dim + mla.qk_rope_head_dim),
        );
        put(
            format!("{a}.attention.value_length_mla"),
            Value::U32(mla.v_head_dim),
        );
        put(
            format!("{a}.expert_shared_count"),
            Value::U32(preset.extras.expert_shared_count),
        );
        // 1: softmax over the experts (llama-hparams.h:16-22), as DeepSeek-V2
        put(format!("{a}.expert_gating_func"), Value::U32(1));
        put(format!("{a}.expert_weights_norm"), Value::Bool(false));
    }
    m
}
