//! The plan of a synthetic model: its metadata and every tensor with shape, type and fill, before any byte is written.
//!
//! Tensor names and shapes follow what the vendored llama.cpp loads for each arch
//! (`src/models/<arch>.cpp`, `load_arch_tensors`); keys follow `load_hparams` in
//! `src/llama-model.cpp` and each arch's `load_arch_hparams`. llama.cpp refuses a file with a
//! tensor it does not load ("wrong number of tensors"), so the plan writes exactly those.

use std::path::Path;

use serde::Serialize;

use super::preset::{Arch, Llama3Rope, Preset};
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

    let is_full = |il: u32| match preset.linear_attention {
        Some(la) => (il + 1).is_multiple_of(la.full_attention_interval.max(1)),
        None => true,
    };
    let full_attention_layers: Vec<u32> = (0..layers).filter(|&il| is_full(il)).collect();
    let linear_attention_layers: Vec<u32> = (0..layers).filter(|&il| !is_full(il)).collect();

    let metadata = metadata(
        preset,
        opts,
        layers,
        context_length,
        moe.map(|(e, u, _)| (e, u)),
    );

    let mut b = Builder {
        opts,
        tensors: Vec::new(),
    };
    let e = u64::from(preset.embedding_length);
    let v = u64::from(preset.vocab_size);
    let hd = u64::from(preset.head_dim);
    let nh = u64::from(preset.head_count);
    let nkv = u64::from(preset.head_count_kv);

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

    for il in 0..layers {
        let blk = |t: &str| format!("blk.{il}.{t}");
        let ones = Fill::Constant(1.0);
        b.add(&blk("attn_norm.weight"), &[e], Role::F32, ones);
        match preset.arch {
            Arch::Qwen35Moe => {
                if is_full(il) {
                    // qwen35moe.cpp: create_tensor_qkv(..., n_embd_head_k * n_head * 2, ...):
                    // the query projection also carries the output gate.
                    b.add(
                        &blk("attn_q.weight"),
                        &[e, (hd * nh).saturating_mul(2)],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("attn_k.weight"),
                        &[e, hd * nkv],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("attn_v.weight"),
                        &[e, hd * nkv],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("attn_output.weight"),
                        &[hd * nh, e],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(&blk("attn_q_norm.weight"), &[hd], Role::F32, ones);
                    b.add(&blk("attn_k_norm.weight"), &[hd], Role::F32, ones);
                } else if let Some(la) = preset.linear_attention {
                    let dk = u64::from(la.state_size);
                    let gk = u64::from(la.group_count);
                    let hv = u64::from(la.time_step_rank);
                    let value_dim = dk * hv;
                    let conv_dim = la.conv_dim();
                    b.add(
                        &blk("attn_qkv.weight"),
                        &[e, (2 * dk).saturating_mul(gk).saturating_add(value_dim)],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("attn_gate.weight"),
                        &[e, value_dim],
                        Role::Dense,
                        Fill::Weights,
                    );
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
                    b.add(
                        &blk("ssm_beta.weight"),
                        &[e, hv],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("ssm_alpha.weight"),
                        &[e, hv],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(&blk("ssm_norm.weight"), &[dk], Role::F32, ones);
                    b.add(
                        &blk("ssm_out.weight"),
                        &[value_dim, e],
                        Role::Dense,
                        Fill::Weights,
                    );
                }
                b.add(&blk("post_attention_norm.weight"), &[e], Role::F32, ones);
            }
            Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama => {
                b.add(
                    &blk("attn_q.weight"),
                    &[e, hd * nh],
                    Role::Dense,
                    Fill::Weights,
                );
                b.add(
                    &blk("attn_k.weight"),
                    &[e, hd * nkv],
                    Role::Dense,
                    Fill::Weights,
                );
                b.add(
                    &blk("attn_v.weight"),
                    &[e, hd * nkv],
                    Role::Dense,
                    Fill::Weights,
                );
                b.add(
                    &blk("attn_output.weight"),
                    &[hd * nh, e],
                    Role::Dense,
                    Fill::Weights,
                );
                if preset.arch != Arch::Llama {
                    b.add(&blk("attn_q_norm.weight"), &[hd], Role::F32, ones);
                    b.add(&blk("attn_k_norm.weight"), &[hd], Role::F32, ones);
                }
                b.add(&blk("ffn_norm.weight"), &[e], Role::F32, ones);
            }
        }
        match moe {
            Some((experts, _, m)) => {
                let nexp = u64::from(experts);
                let ff = u64::from(m.expert_feed_forward_length);
                // The router stays F32, as llama-quant.cpp leaves "ffn_gate_inp.weight".
                b.add(
                    &blk("ffn_gate_inp.weight"),
                    &[e, nexp],
                    Role::F32,
                    Fill::Weights,
                );
                if opts.fused_gate_up {
                    b.add(
                        &blk("ffn_gate_up_exps.weight"),
                        &[e, 2 * ff, nexp],
                        Role::Expert,
                        Fill::Weights,
                    );
                } else {
                    b.add(
                        &blk("ffn_gate_exps.weight"),
                        &[e, ff, nexp],
                        Role::Expert,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("ffn_up_exps.weight"),
                        &[e, ff, nexp],
                        Role::Expert,
                        Fill::Weights,
                    );
                }
                b.add(
                    &blk("ffn_down_exps.weight"),
                    &[ff, e, nexp],
                    Role::Expert,
                    Fill::Weights,
                );
                let ffs = u64::from(m.shared_expert_feed_forward_length);
                if ffs > 0 {
                    // 1-D: llama-quant.cpp never quantises tensors under 2 dims.
                    b.add(
                        &blk("ffn_gate_inp_shexp.weight"),
                        &[e],
                        Role::F32,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("ffn_gate_shexp.weight"),
                        &[e, ffs],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("ffn_up_shexp.weight"),
                        &[e, ffs],
                        Role::Dense,
                        Fill::Weights,
                    );
                    b.add(
                        &blk("ffn_down_shexp.weight"),
                        &[ffs, e],
                        Role::Dense,
                        Fill::Weights,
                    );
                }
            }
            None => {
                let ff = u64::from(preset.feed_forward_length);
                b.add(
                    &blk("ffn_gate.weight"),
                    &[e, ff],
                    Role::Dense,
                    Fill::Weights,
                );
                b.add(&blk("ffn_up.weight"), &[e, ff], Role::Dense, Fill::Weights);
                b.add(
                    &blk("ffn_down.weight"),
                    &[ff, e],
                    Role::Dense,
                    Fill::Weights,
                );
            }
        }
    }

    b.add("output_norm.weight", &[e], Role::F32, Fill::Constant(1.0));
    // Written, not tied: llama.cpp would otherwise reuse token_embd for the head.
    b.add("output.weight", &[e, v], Role::Dense, Fill::Weights);

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
    context_length: u32,
    moe: Option<(u32, u32)>,
) -> Vec<(String, Value)> {
    let a = preset.arch.as_str();
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
    if preset.feed_forward_length > 0 {
        put(
            format!("{a}.feed_forward_length"),
            Value::U32(preset.feed_forward_length),
        );
    }
    put(
        format!("{a}.attention.head_count"),
        Value::U32(preset.head_count),
    );
    put(
        format!("{a}.attention.head_count_kv"),
        Value::U32(preset.head_count_kv),
    );
    put(
        format!("{a}.attention.key_length"),
        Value::U32(preset.head_dim),
    );
    put(
        format!("{a}.attention.value_length"),
        Value::U32(preset.head_dim),
    );
    put(
        format!("{a}.attention.layer_norm_rms_epsilon"),
        Value::F32(preset.rms_eps),
    );
    put(
        format!("{a}.rope.dimension_count"),
        Value::U32(preset.rope_dimension_count),
    );
    put(
        format!("{a}.rope.freq_base"),
        Value::F32(preset.rope_freq_base),
    );
    if let Some((experts, used)) = moe {
        put(format!("{a}.expert_count"), Value::U32(experts));
        put(format!("{a}.expert_used_count"), Value::U32(used));
        if let Some(m) = preset.moe {
            put(
                format!("{a}.expert_feed_forward_length"),
                Value::U32(m.expert_feed_forward_length),
            );
            if m.shared_expert_feed_forward_length > 0 {
                put(
                    format!("{a}.expert_shared_feed_forward_length"),
                    Value::U32(m.shared_expert_feed_forward_length),
                );
            }
        }
    }
    if let Some(la) = preset.linear_attention {
        // qwen35moe.cpp load_arch_hparams: sections are read as an array of exactly 4.
        put(
            format!("{a}.rope.dimension_sections"),
            Value::Array(Array::I32(preset.rope_dimension_sections.to_vec())),
        );
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
    m
}
