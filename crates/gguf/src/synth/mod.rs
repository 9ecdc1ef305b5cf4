//! Synthetic GGUF models: real architectures' shapes, seeded random but valid weights, no tokenizer.
//!
//! No model can be downloaded where opledger runs, and op timing does not depend on weight
//! values, so the tool writes its own models: [`plan`] describes one (metadata, every tensor's
//! name, shape and type, the file size) without writing, [`synthesize`] streams it to disk
//! tensor by tensor.

mod fill;
mod plan;
mod preset;

use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::GgufError;
use crate::types::GgmlType;
use crate::writer::GgufWriter;

pub use fill::{block_scales, fill_chunk, tensor_rng, FLOAT_WEIGHT_RANGE};
pub use plan::{layer_shape, FfnShape, LayerShape, MixerShape};
pub use plan::{plan, plan_for, Fill, ModelPlan, PlannedTensor, Role, GENERATED_TYPES};
pub use preset::{
    preset, presets, Arch, Extras, LinearAttentionShape, Llama3Rope, Mamba2Shape, Mla, MoeShape,
    Preset, SlidingWindow, LLAMA_31_8B, QWEN36_35B_A3B, QWEN3_30B_A3B, QWEN3_8B, TINY_DEEPSEEK2,
    TINY_GEMMA2, TINY_GEMMA3, TINY_GPT_OSS, TINY_LLAMA, TINY_MIXTRAL, TINY_NEMOTRON_H, TINY_OLMOE,
    TINY_PHI3, TINY_QWEN2, TINY_QWEN2MOE, TINY_QWEN3, TINY_QWEN35, TINY_QWEN35MOE, TINY_QWEN3MOE,
    TINY_QWEN3NEXT,
};

/// Bytes generated and written at a time.
const CHUNK_BYTES: u64 = 8 << 20;

/// What to synthesise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SynthOptions {
    /// A preset name from [`presets`].
    pub preset: String,
    /// Fewer (or more) layers than the preset, keeping its layer pattern.
    pub layers: Option<u32>,
    /// Another expert count (MoE presets only).
    pub experts: Option<u32>,
    /// Another count of experts used per token; at most `experts`.
    pub experts_used: Option<u32>,
    /// Type of the routed-expert weights.
    pub expert_type: GgmlType,
    /// Type of the other 2-D weights.
    pub dense_type: GgmlType,
    pub seed: u64,
    /// One `ffn_gate_up_exps {E, 2ff, nexp}` instead of separate gate and up (qwen35moe only).
    pub fused_gate_up: bool,
    /// Another `{arch}.context_length`.
    pub context_length: Option<u32>,
}

impl SynthOptions {
    /// The defaults for `preset`: its own layers and experts, Q4_K experts, Q8_0 dense
    /// weights, seed 0, separate gate and up.
    pub fn new(preset: impl Into<String>) -> SynthOptions {
        SynthOptions {
            preset: preset.into(),
            layers: None,
            experts: None,
            experts_used: None,
            expert_type: GgmlType::Q4_K,
            dense_type: GgmlType::Q8_0,
            seed: 0,
            fused_gate_up: false,
            context_length: None,
        }
    }
}

/// What [`synthesize`] wrote.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SynthReport {
    pub path: PathBuf,
    pub preset: String,
    pub arch: Arch,
    pub size_bytes: u64,
    pub n_tensors: usize,
    pub layers: u32,
    pub full_attention_layers: Vec<u32>,
    pub linear_attention_layers: Vec<u32>,
    pub experts: Option<u32>,
    pub experts_used: Option<u32>,
    pub expert_type: GgmlType,
    pub dense_type: GgmlType,
    pub fused_gate_up: bool,
    pub seed: u64,
    pub write_ms: f64,
}

/// Why a model could not be planned or written.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    #[error("unknown preset '{name}' (known: {known})")]
    UnknownPreset { name: String, known: String },

    #[error(
        "tensor '{tensor}' has ne[0] = {ne0}, not a multiple of the {ggml_type} block size \
         {block_size}; choose another type for it"
    )]
    TypeDoesNotFit {
        tensor: String,
        ggml_type: GgmlType,
        ne0: u64,
        block_size: u32,
    },

    #[error("cannot generate {ggml_type} data for the {role} weights (supported: {supported})")]
    UnsupportedType {
        ggml_type: GgmlType,
        role: &'static str,
        supported: String,
    },

    #[error("llama.cpp's {arch} does not load a fused ffn_gate_up_exps; drop the fused option")]
    FusedNotSupported { arch: Arch },

    #[error("{0}")]
    BadOption(String),

    #[error(transparent)]
    Gguf(#[from] GgufError),
}

/// Writes the model `opts` describes to `path`, calling `progress(bytes_done, bytes_total)`
/// after each chunk. The file appears at `path` only once complete.
pub fn synthesize(
    opts: &SynthOptions,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    write_plan(&plan(opts)?, opts, path, progress)
}

/// Writes a model of any preset, built-in or not (`opts.preset` is ignored): for tests that
/// vary a preset's widths to show what depends on them.
pub fn synthesize_preset(
    preset: &Preset,
    opts: &SynthOptions,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    write_plan(&plan_for(preset, opts)?, opts, path, progress)
}

fn write_plan(
    plan: &ModelPlan,
    opts: &SynthOptions,
    path: &Path,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<SynthReport, SynthError> {
    let started = Instant::now();
    let mut writer = GgufWriter::create(path, &plan.metadata, &plan.specs())?;
    let total = writer.total_size_bytes();
    progress(writer.bytes_written(), total);

    let mut buf: Vec<u8> = Vec::new();
    for t in &plan.tensors {
        let mut rng = fill::tensor_rng(opts.seed, &t.name);
        let chunk = fill::chunk_bytes(t.ggml_type, CHUNK_BYTES);
        let elements_per_block = u64::from(t.ggml_type.block_size());
        let bytes_per_block = u64::from(t.ggml_type.type_size());
        let mut done: u64 = 0;
        while done < t.size_bytes {
            let n = chunk.min(t.size_bytes - done);
            buf.resize(usize::try_from(n).unwrap_or(usize::MAX), 0);
            let first_element = done / bytes_per_block * elements_per_block;
            fill::fill_chunk(&mut rng, t.fill, t.ggml_type, first_element, &mut buf);
            writer.write_tensor_chunk(&t.name, &buf)?;
            done += n;
            progress(writer.bytes_written(), total);
        }
    }
    let size_bytes = writer.finish()?;
    progress(size_bytes, total);

    Ok(SynthReport {
        path: path.to_path_buf(),
        preset: plan.preset.clone(),
        arch: plan.arch,
        size_bytes,
        n_tensors: plan.tensors.len(),
        layers: plan.layers,
        full_attention_layers: plan.full_attention_layers.clone(),
        linear_attention_layers: plan.linear_attention_layers.clone(),
        experts: plan.experts,
        experts_used: plan.experts_used,
        expert_type: opts.expert_type,
        dense_type: opts.dense_type,
        fused_gate_up: plan.fused_gate_up,
        seed: opts.seed,
        write_ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::GgufFile;
    use crate::value::{Array, Value};
    use std::hash::{Hash, Hasher};

    const TINY: [&str; 4] = [
        "tiny-qwen35moe",
        "tiny-qwen3moe",
        "tiny-qwen3",
        "tiny-llama",
    ];

    fn opts(preset: &str) -> SynthOptions {
        SynthOptions::new(preset)
    }

    fn write(o: &SynthOptions, dir: &Path, file: &str) -> (SynthReport, PathBuf) {
        let path = dir.join(file);
        let mut last = (0, 0);
        let report = synthesize(o, &path, &mut |done, total| {
            assert!(done <= total && done >= last.0);
            last = (done, total);
        })
        .unwrap();
        assert_eq!(last, (report.size_bytes, report.size_bytes));
        (report, path)
    }

    fn file_hash(path: &Path) -> u64 {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        std::fs::read(path).unwrap().hash(&mut h);
        h.finish()
    }

    /// Bytes per tensor from the shape and (block size, bytes per block), computed here
    /// independently of `GgmlType::tensor_bytes`.
    fn expected_size(dims: &[u64], t: GgmlType) -> u64 {
        let (block, size) = match t {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::BF16 => (1, 2),
            GgmlType::Q8_0 => (32, 34),
            GgmlType::Q4_0 => (32, 18),
            GgmlType::Q4_K => (256, 144),
            GgmlType::Q5_K => (256, 176),
            GgmlType::Q6_K => (256, 210),
            other => panic!("no size for {other} in this test"),
        };
        dims.iter().product::<u64>() / block * size
    }

    #[test]
    fn every_tiny_preset_writes_a_valid_file() {
        let dir = tempfile::tempdir().unwrap();
        for name in TINY {
            let o = opts(name);
            let plan = plan(&o).unwrap();
            let (report, path) = write(&o, dir.path(), &format!("{name}.gguf"));
            assert!(
                report.size_bytes < 16 << 20,
                "{name}: {} bytes",
                report.size_bytes
            );
            let f = GgufFile::open(&path).unwrap();
            f.check_packed().unwrap();
            assert_eq!(f.arch(), Some(plan.arch.as_str()));
            assert_eq!(f.metadata, plan.metadata);
            assert_eq!(f.file_size_bytes, plan.file_size_bytes());
            assert_eq!(f.tensors.len(), report.n_tensors);
            assert_eq!(f.get_bool("opledger.synthetic"), Some(true));
            assert_eq!(f.get_str("tokenizer.ggml.model"), Some("none"));
            assert_eq!(
                f.get_str("general.name"),
                Some(format!("{name} (synthetic)").as_str())
            );
            let mut file = std::fs::File::open(&path).unwrap();
            for (info, planned) in f.tensors.iter().zip(&plan.tensors) {
                assert_eq!(info.name, planned.name);
                assert_eq!(info.dims, planned.dims);
                assert_eq!(info.ggml_type, planned.ggml_type);
                let data = f.read_tensor_data(&mut file, &info.name).unwrap();
                check_data(info.ggml_type, planned.fill, &info.name, &data);
            }
        }
    }

    /// Every quantised block's scales decode to finite values; F32 data is finite and within
    /// what its fill promises.
    fn check_data(t: GgmlType, fill: Fill, name: &str, data: &[u8]) {
        if t.is_quantized() {
            let fields = block_scales(t);
            assert!(!fields.is_empty(), "{t}");
            for block in data.chunks_exact(t.type_size() as usize) {
                for &(offset, expected) in fields {
                    let v = half::f16::from_le_bytes([block[offset], block[offset + 1]]).to_f32();
                    assert!(v.is_finite(), "{name}");
                    assert_eq!(v, half::f16::from_f32(expected).to_f32(), "{name}");
                }
            }
            return;
        }
        assert_eq!(t, GgmlType::F32, "{name}");
        let values: Vec<f32> = data
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        assert!(values.iter().all(|v| v.is_finite()), "{name}");
        match fill {
            Fill::Constant(c) => assert!(values.iter().all(|&v| v == c), "{name}"),
            Fill::Uniform { low, high } => {
                assert!(values.iter().all(|v| (low..high).contains(v)), "{name}")
            }
            Fill::Weights => assert!(
                values.iter().all(|v| v.abs() <= FLOAT_WEIGHT_RANGE),
                "{name}"
            ),
            Fill::Llama3RopeFactors { rope, .. } => {
                assert!(
                    values.iter().all(|&v| (1.0..=rope.factor).contains(&v)),
                    "{name}"
                )
            }
        }
        if name.ends_with("ssm_a") {
            assert!(values.iter().all(|&v| v < 0.0), "{name}");
        }
        if name.ends_with("_norm.weight") {
            assert!(values.iter().all(|&v| v == 1.0), "{name}");
        }
    }

    #[test]
    fn same_seed_same_bytes_other_seed_other_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts("tiny-qwen35moe");
        o.seed = 42;
        let (_, a) = write(&o, dir.path(), "a.gguf");
        let (_, b) = write(&o, dir.path(), "b.gguf");
        assert_eq!(file_hash(&a), file_hash(&b));
        o.seed = 43;
        let (_, c) = write(&o, dir.path(), "c.gguf");
        assert_ne!(file_hash(&a), file_hash(&c));
        // Only the seed key and the data differ.
        let (fa, fc) = (GgufFile::open(&a).unwrap(), GgufFile::open(&c).unwrap());
        assert_eq!(fa.tensors, fc.tensors);
        assert_eq!(fc.get_u64("opledger.seed"), Some(43));
    }

    fn count(plan: &ModelPlan, suffix: &str) -> usize {
        plan.tensors
            .iter()
            .filter(|t| t.name.ends_with(suffix))
            .count()
    }

    #[test]
    fn tensor_counts_follow_the_arch() {
        for p in presets() {
            for layers in [p.block_count, 4, 8] {
                let mut o = opts(p.name);
                o.layers = Some(layers);
                let plan = plan(&o).unwrap();
                let l = layers as usize;
                let full = plan.full_attention_layers.len();
                let linear = plan.linear_attention_layers.len();
                // per family, what its load_arch_tensors creates (src/models/<arch>.cpp),
                // counted by hand: globals + per layer
                let expected = match p.arch {
                    Arch::Qwen35Moe | Arch::Qwen35 | Arch::Qwen3Next => {
                        assert_eq!(full + linear, l);
                        assert_eq!(count(&plan, "attn_qkv.weight"), linear);
                        assert_eq!(count(&plan, "ssm_conv1d.weight"), linear);
                        assert_eq!(count(&plan, "ssm_a"), linear);
                        assert_eq!(count(&plan, "attn_q.weight"), full);
                        assert_eq!(count(&plan, "attn_output.weight"), full);
                        // attn_norm + post_attention_norm; the FFN: MoE router, 3 experts and
                        // 4 shared-expert tensors, or dense gate/up/down
                        let ffn = if p.arch == Arch::Qwen35 { 3 } else { 8 };
                        // delta-net: qkv, gate, conv, dt, a, beta + alpha (qwen3next: one ba),
                        // norm, out; attention: q, k, v, o and the q/k norms
                        let delta = if p.arch == Arch::Qwen3Next { 8 } else { 9 };
                        3 + l * (2 + ffn) + linear * delta + full * 6
                    }
                    Arch::Qwen3Moe => 3 + l * 12,
                    Arch::Qwen3 => 3 + l * 11,
                    Arch::Llama if p.moe.is_some() => 3 + l * 10,
                    Arch::Llama => 4 + l * 9,
                    // norm, q/k/v and their biases, o, ffn norm, gate/up/down
                    Arch::Qwen2 => 3 + l * 12,
                    // ... with a router, 3 experts and 4 shared-expert tensors for the FFN
                    Arch::Qwen2Moe => 3 + l * 17,
                    // tied head; norm, q/k/v/o, post-attention norm, ffn norm, gate/up/down,
                    // post-FFN norm (gemma3: and the q/k norms)
                    Arch::Gemma2 => 2 + l * 11,
                    Arch::Gemma3 => 2 + l * 13,
                    // norm, fused qkv, o, ffn norm, down, fused gate+up
                    Arch::Phi3 => 3 + l * 6,
                    Arch::Deepseek2 => {
                        let dense = p.extras.leading_dense_layers as usize;
                        // norm, q_a norm, kv_a norm, q_a, q_b, kv_a_mqa, k_b, v_b, o, ffn norm;
                        // dense: gate/up/down; MoE: router, 3 experts, 3 shared
                        3 + l * 10 + dense.min(l) * 3 + l.saturating_sub(dense) * 7
                    }
                    // norm, q/k/v, their biases, o, pre-FFN norm, sinks, o bias; router + bias,
                    // 3 experts, 3 expert biases
                    Arch::GptOss => 3 + l * 19,
                    // norm, q/k/v/o, q/k norms, ffn norm, router, 3 experts
                    Arch::Olmoe => 3 + l * 12,
                    Arch::NemotronH => {
                        let kinds: Vec<u8> = (0..l)
                            .map(|il| {
                                let pat = p.extras.layer_pattern.unwrap().as_bytes();
                                pat[il % pat.len()]
                            })
                            .collect();
                        let n = |c: u8| kinds.iter().filter(|&&k| k == c).count();
                        assert_eq!(linear, n(b'M'));
                        assert_eq!(full, n(b'*'));
                        // norm; Mamba-2: in, conv + bias, dt, a, d, norm, out; attention:
                        // q/k/v/o; FFN: up, down
                        3 + l + n(b'M') * 8 + n(b'*') * 4 + n(b'-') * 2
                    }
                };
                assert_eq!(plan.tensors.len(), expected, "{} x{layers}", p.name);
                assert_eq!(count(&plan, "attn_norm.weight"), l);
                assert_eq!(
                    plan.tensor("output.weight").is_some(),
                    !p.extras.tied_output,
                    "{}",
                    p.name
                );
                assert!(plan.tensor("token_embd.weight").is_some());
            }
        }
    }

    #[test]
    fn layer_pattern_keeps_every_fourth_layer_full() {
        let mut o = opts("qwen3.6-35b-a3b");
        let p = plan(&o).unwrap();
        assert_eq!(
            p.full_attention_layers,
            (0..10).map(|i| i * 4 + 3).collect::<Vec<_>>()
        );
        assert_eq!(p.linear_attention_layers.len(), 30);
        o.layers = Some(4);
        let p = plan(&o).unwrap();
        assert_eq!(p.full_attention_layers, vec![3]);
        assert_eq!(p.linear_attention_layers, vec![0, 1, 2]);
        o.layers = Some(8);
        let p = plan(&o).unwrap();
        assert_eq!(p.full_attention_layers, vec![3, 7]);
        assert_eq!(p.linear_attention_layers.len(), 6);
        let interval = p
            .metadata
            .iter()
            .find(|(k, _)| k == "qwen35moe.full_attention_interval");
        assert_eq!(interval.map(|(_, v)| v.clone()), Some(Value::U32(4)));
        assert_eq!(
            p.metadata
                .iter()
                .find(|(k, _)| k == "qwen35moe.block_count")
                .map(|(_, v)| v.clone()),
            Some(Value::U32(8))
        );
    }

    #[test]
    fn sizes_equal_the_sum_over_shapes() {
        for p in presets() {
            for (expert_type, dense_type) in [
                (GgmlType::Q4_K, GgmlType::Q8_0),
                (GgmlType::Q8_0, GgmlType::F16),
                (GgmlType::Q6_K, GgmlType::Q4_0),
            ] {
                let mut o = opts(p.name);
                o.expert_type = expert_type;
                o.dense_type = dense_type;
                let plan = plan(&o).unwrap();
                let mut sum = 0;
                let mut padded = 0;
                for t in &plan.tensors {
                    let size = expected_size(&t.dims, t.ggml_type);
                    assert_eq!(t.size_bytes, size, "{}", t.name);
                    assert_eq!(t.offset_bytes, padded, "{}", t.name);
                    sum += size;
                    padded += size.div_ceil(32) * 32;
                }
                assert_eq!(plan.tensor_data_size_bytes(), sum);
                assert_eq!(
                    plan.file_size_bytes(),
                    plan.layout.data_offset_bytes + padded
                );
            }
        }
    }

    #[test]
    fn real_shapes_match_llama_cpp() {
        let p = plan(&opts("qwen3.6-35b-a3b")).unwrap();
        let dims = |n: &str| p.tensor(n).map(|t| t.dims.clone()).unwrap();
        assert_eq!(dims("token_embd.weight"), [2048, 248_320]);
        assert_eq!(dims("output.weight"), [2048, 248_320]);
        // Full attention: query and gate in one projection.
        assert_eq!(dims("blk.3.attn_q.weight"), [2048, 256 * 16 * 2]);
        assert_eq!(dims("blk.3.attn_k.weight"), [2048, 512]);
        assert_eq!(dims("blk.3.attn_output.weight"), [4096, 2048]);
        assert_eq!(dims("blk.3.attn_q_norm.weight"), [256]);
        // Delta-net: 16 key heads and 32 value heads of dim 128.
        assert_eq!(
            dims("blk.0.attn_qkv.weight"),
            [2048, 2 * 128 * 16 + 128 * 32]
        );
        assert_eq!(dims("blk.0.attn_gate.weight"), [2048, 4096]);
        assert_eq!(dims("blk.0.ssm_conv1d.weight"), [4, 8192]);
        assert_eq!(dims("blk.0.ssm_a"), [32]);
        assert_eq!(dims("blk.0.ssm_dt.bias"), [32]);
        assert_eq!(dims("blk.0.ssm_beta.weight"), [2048, 32]);
        assert_eq!(dims("blk.0.ssm_norm.weight"), [128]);
        assert_eq!(dims("blk.0.ssm_out.weight"), [4096, 2048]);
        // MoE with a shared expert.
        assert_eq!(dims("blk.0.ffn_gate_inp.weight"), [2048, 256]);
        assert_eq!(dims("blk.0.ffn_gate_exps.weight"), [2048, 512, 256]);
        assert_eq!(dims("blk.0.ffn_down_exps.weight"), [512, 2048, 256]);
        assert_eq!(dims("blk.0.ffn_gate_inp_shexp.weight"), [2048]);
        assert_eq!(dims("blk.0.ffn_down_shexp.weight"), [512, 2048]);
        assert_eq!(
            p.tensor("blk.0.ffn_gate_inp.weight").unwrap().ggml_type,
            GgmlType::F32
        );
        assert_eq!(
            p.tensor("blk.0.ssm_conv1d.weight").unwrap().ggml_type,
            GgmlType::F32
        );
        assert_eq!(
            p.tensor("blk.0.ffn_up_exps.weight").unwrap().ggml_type,
            GgmlType::Q4_K
        );
        assert_eq!(
            p.tensor("blk.0.attn_qkv.weight").unwrap().ggml_type,
            GgmlType::Q8_0
        );

        let p = plan(&opts("qwen3-30b-a3b")).unwrap();
        let dims = |n: &str| p.tensor(n).map(|t| t.dims.clone()).unwrap();
        assert_eq!(dims("blk.0.attn_q.weight"), [2048, 4096]);
        assert_eq!(dims("blk.0.attn_k.weight"), [2048, 512]);
        assert_eq!(dims("blk.0.attn_output.weight"), [4096, 2048]);
        assert_eq!(dims("blk.0.ffn_up_exps.weight"), [2048, 768, 128]);
        assert_eq!(dims("blk.47.ffn_down_exps.weight"), [768, 2048, 128]);

        let p = plan(&opts("llama-3.1-8b")).unwrap();
        assert_eq!(p.tensor("rope_freqs.weight").unwrap().dims, [64]);
        assert_eq!(
            p.tensor("blk.0.ffn_gate.weight").unwrap().dims,
            [4096, 14_336]
        );
        assert_eq!(p.tensor("blk.0.attn_v.weight").unwrap().dims, [4096, 1024]);
    }

    fn meta<'a>(plan: &'a ModelPlan, key: &str) -> Option<&'a Value> {
        plan.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    #[test]
    fn required_keys_are_present_with_llama_cpp_types() {
        let p = plan(&opts("tiny-qwen35moe")).unwrap();
        let a = "qwen35moe";
        for key in [
            "context_length",
            "embedding_length",
            "block_count",
            "ssm.conv_kernel",
            "ssm.state_size",
            "ssm.group_count",
            "ssm.time_step_rank",
            "ssm.inner_size",
            "vocab_size",
            "attention.head_count",
            "attention.head_count_kv",
            "attention.key_length",
            "attention.value_length",
            "rope.dimension_count",
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
            "expert_shared_feed_forward_length",
            "full_attention_interval",
        ] {
            // llama-model-loader.cpp requires the exact type: u32 for these.
            assert!(
                matches!(meta(&p, &format!("{a}.{key}")), Some(Value::U32(_))),
                "{key}"
            );
        }
        assert!(matches!(
            meta(&p, "qwen35moe.attention.layer_norm_rms_epsilon"),
            Some(Value::F32(_))
        ));
        assert!(matches!(
            meta(&p, "qwen35moe.rope.freq_base"),
            Some(Value::F32(_))
        ));
        assert_eq!(
            meta(&p, "qwen35moe.rope.dimension_sections"),
            Some(&Value::Array(Array::I32(vec![6, 5, 5, 0])))
        );
        assert_eq!(
            meta(&p, "qwen35moe.ssm.inner_size"),
            Some(&Value::U32(128 * 4))
        );
        assert_eq!(meta(&p, "general.alignment"), Some(&Value::U32(32)));

        for name in ["qwen3-30b-a3b", "tiny-qwen3moe"] {
            let p = plan(&opts(name)).unwrap();
            assert_eq!(
                meta(&p, "qwen3moe.rope.dimension_count"),
                meta(&p, "qwen3moe.attention.key_length")
            );
            assert!(meta(&p, "qwen3moe.ssm.state_size").is_none());
        }
        let p = plan(&opts("qwen3-8b")).unwrap();
        assert_eq!(
            meta(&p, "qwen3.feed_forward_length"),
            Some(&Value::U32(12_288))
        );
        assert!(meta(&p, "qwen3.expert_count").is_none());
    }

    #[test]
    fn options_change_experts_and_context() {
        let mut o = opts("tiny-qwen35moe");
        o.experts = Some(8);
        o.context_length = Some(1024);
        let p = plan(&o).unwrap();
        assert_eq!(
            p.tensor("blk.0.ffn_gate_exps.weight").unwrap().dims,
            [256, 256, 8]
        );
        assert_eq!(p.experts_used, Some(4));
        assert_eq!(
            meta(&p, "qwen35moe.context_length"),
            Some(&Value::U32(1024))
        );
        o.experts = Some(2);
        assert_eq!(plan(&o).unwrap().experts_used, Some(2));
        o.experts_used = Some(3);
        assert!(matches!(plan(&o), Err(SynthError::BadOption(_))));

        let mut o = opts("tiny-qwen35moe");
        o.fused_gate_up = true;
        let p = plan(&o).unwrap();
        assert_eq!(
            p.tensor("blk.0.ffn_gate_up_exps.weight").unwrap().dims,
            [256, 512, 16]
        );
        assert!(p.tensor("blk.0.ffn_gate_exps.weight").is_none());
        assert!(p.tensor("blk.0.ffn_up_exps.weight").is_none());
    }

    #[test]
    fn unsupported_requests_are_clear_errors() {
        let mut o = opts("tiny-qwen3moe");
        o.fused_gate_up = true;
        let e = plan(&o).unwrap_err();
        assert!(
            matches!(
                e,
                SynthError::FusedNotSupported {
                    arch: Arch::Qwen3Moe
                }
            ),
            "{e}"
        );

        let mut o = opts("tiny-qwen3");
        o.experts = Some(4);
        assert!(matches!(plan(&o), Err(SynthError::BadOption(_))));

        let mut o = opts("tiny-llama");
        o.layers = Some(0);
        assert!(matches!(plan(&o), Err(SynthError::BadOption(_))));

        let mut o = opts("tiny-llama");
        o.dense_type = GgmlType::IQ2_XXS;
        let e = plan(&o).unwrap_err();
        assert!(matches!(e, SynthError::UnsupportedType { .. }), "{e}");
        assert!(e.to_string().contains("IQ2_XXS"));

        let e = plan(&opts("gpt-5")).unwrap_err();
        assert!(e.to_string().contains("tiny-qwen35moe"), "{e}");
    }

    #[test]
    fn a_type_that_does_not_fit_a_width_names_the_tensor() {
        // Widths of 384 fit Q8_0 (32) but not Q4_K (256).
        let custom = Preset {
            name: "odd-width",
            embedding_length: 384,
            ..TINY_QWEN3
        };
        let mut o = opts("odd-width");
        o.dense_type = GgmlType::Q8_0;
        plan_for(&custom, &o).unwrap();
        o.dense_type = GgmlType::Q4_K;
        let e = plan_for(&custom, &o).unwrap_err();
        assert!(
            matches!(e, SynthError::TypeDoesNotFit { ref tensor, ne0: 384, block_size: 256, .. }
                if tensor == "token_embd.weight"),
            "{e}"
        );
        assert!(e.to_string().contains("token_embd.weight"), "{e}");
    }

    #[test]
    fn failed_synthesis_leaves_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts("tiny-qwen3moe");
        o.fused_gate_up = true;
        let path = dir.path().join("x.gguf");
        assert!(synthesize(&o, &path, &mut |_, _| {}).is_err());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// Real widths, 4 layers: about 3 GB. Run with
    /// `cargo test --release -p opledger-gguf -- --ignored real_width --nocapture`.
    #[test]
    #[ignore = "writes about 3 GB"]
    fn real_width_qwen36_four_layers_is_fast() {
        let dir = tempfile::tempdir_in(
            std::env::var("OPLEDGER_SYNTH_DIR").unwrap_or_else(|_| ".".into()),
        )
        .unwrap();
        let mut o = opts("qwen3.6-35b-a3b");
        o.layers = Some(4);
        let (report, path) = write(&o, dir.path(), "real.gguf");
        eprintln!(
            "{} bytes, {} tensors in {:.0} ms ({:.2} GB/s)",
            report.size_bytes,
            report.n_tensors,
            report.write_ms,
            report.size_bytes as f64 / report.write_ms / 1e6
        );
        GgufFile::open(&path).unwrap().check_packed().unwrap();
    }
}
