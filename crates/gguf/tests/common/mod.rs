//! Micro models for the malformed-file and fuzz-corpus tests: the tiny presets' architectures
//! at widths of a few units, F32 throughout, so a whole valid file takes a few KB.

#![allow(dead_code)]

use std::path::Path;

use opledger_gguf::synth::{plan_for, LinearAttentionShape, Llama3Rope, MoeShape};
use opledger_gguf::{Arch, GgmlType, GgufWriter, Preset, SynthOptions, TensorSpec, Value};

/// qwen35moe, 2 layers: layer 0 gated delta-net, layer 1 full attention (interval 2).
pub const MICRO_QWEN35MOE: Preset = Preset {
    name: "micro-qwen35moe",
    arch: Arch::Qwen35Moe,
    source: "opledger test",
    uncertain: "",
    embedding_length: 8,
    block_count: 2,
    vocab_size: 4,
    context_length: 64,
    head_count: 2,
    head_count_kv: 1,
    head_dim: 4,
    rope_dimension_count: 2,
    rope_dimension_sections: [1, 0, 0, 0],
    rope_freq_base: 10_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 2,
        expert_used_count: 1,
        expert_feed_forward_length: 4,
        shared_expert_feed_forward_length: 4,
    }),
    linear_attention: Some(LinearAttentionShape {
        full_attention_interval: 2,
        conv_kernel: 2,
        state_size: 2,
        group_count: 1,
        time_step_rank: 2,
    }),
    llama3_rope: None,
    extras: opledger_gguf::synth::Extras::NONE,
};

/// qwen3moe, 1 layer.
pub const MICRO_QWEN3MOE: Preset = Preset {
    name: "micro-qwen3moe",
    arch: Arch::Qwen3Moe,
    block_count: 1,
    rope_dimension_count: 4,
    rope_dimension_sections: [0; 4],
    moe: Some(MoeShape {
        expert_count: 2,
        expert_used_count: 1,
        expert_feed_forward_length: 4,
        shared_expert_feed_forward_length: 0,
    }),
    linear_attention: None,
    ..MICRO_QWEN35MOE
};

/// qwen3 (dense), 1 layer.
pub const MICRO_QWEN3: Preset = Preset {
    name: "micro-qwen3",
    arch: Arch::Qwen3,
    feed_forward_length: 8,
    moe: None,
    ..MICRO_QWEN3MOE
};

/// llama with llama3 rope factors, 1 layer.
pub const MICRO_LLAMA: Preset = Preset {
    name: "micro-llama",
    arch: Arch::Llama,
    llama3_rope: Some(Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context_length: 8192,
    }),
    ..MICRO_QWEN3
};

pub const MICRO: [Preset; 4] = [MICRO_QWEN35MOE, MICRO_QWEN3MOE, MICRO_QWEN3, MICRO_LLAMA];

/// The bytes of `preset`'s model, F32 everywhere and zero data, after `edit_meta` and
/// `edit_tensors` changed its metadata and tensor list (the writer still checks both).
pub fn micro_file(
    preset: &Preset,
    edit_meta: impl FnOnce(&mut Vec<(String, Value)>),
    edit_tensors: impl FnOnce(&mut Vec<TensorSpec>),
) -> Vec<u8> {
    let mut opts = SynthOptions::new(preset.name);
    opts.expert_type = GgmlType::F32;
    opts.dense_type = GgmlType::F32;
    let plan = plan_for(preset, &opts).expect("micro presets plan");
    let mut meta = plan.metadata.clone();
    edit_meta(&mut meta);
    let mut specs = plan.specs();
    edit_tensors(&mut specs);
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("micro.gguf");
    write(&path, &meta, &specs);
    std::fs::read(&path).expect("read back")
}

/// The bytes of a file with this metadata and these tensors (zero data), for architectures
/// without a micro preset: their metadata is checked before any tensor.
pub fn meta_file(meta: &[(String, Value)], specs: &[TensorSpec]) -> Vec<u8> {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("meta.gguf");
    write(&path, meta, specs);
    std::fs::read(&path).expect("read back")
}

fn write(path: &Path, meta: &[(String, Value)], specs: &[TensorSpec]) {
    let mut w = GgufWriter::create(path, meta, specs).expect("writer accepts the edit");
    for s in specs {
        let size = usize::try_from(s.size_bytes().expect("size")).expect("fits");
        w.write_tensor(&s.name, &vec![0u8; size]).expect("write");
    }
    w.finish().expect("finish");
}

/// Sets the value of `key` (appended when absent).
pub fn set(meta: &mut Vec<(String, Value)>, key: &str, value: Value) {
    match meta.iter_mut().find(|(k, _)| k == key) {
        Some((_, v)) => *v = value,
        None => meta.push((key.to_string(), value)),
    }
}

/// Removes `key`.
pub fn remove(meta: &mut Vec<(String, Value)>, key: &str) {
    meta.retain(|(k, _)| k != key);
}

/// The offset of the length-prefixed string `s` in `bytes` (its 8-byte length first).
pub fn string_at(bytes: &[u8], s: &str) -> usize {
    let mut needle = (s.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(s.as_bytes());
    bytes
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .unwrap_or_else(|| panic!("'{s}' not in the file"))
}

/// Offsets in a tensor info: (n_dims, first dim, type, data offset).
pub fn tensor_info_at(bytes: &[u8], name: &str) -> (usize, usize, usize, usize) {
    let n_dims_at = string_at(bytes, name) + 8 + name.len();
    let n_dims = u32::from_le_bytes(bytes[n_dims_at..n_dims_at + 4].try_into().unwrap()) as usize;
    let dims_at = n_dims_at + 4;
    let type_at = dims_at + 8 * n_dims;
    (n_dims_at, dims_at, type_at, type_at + 4)
}

/// Offset of the type id of the value of `key`.
pub fn value_type_at(bytes: &[u8], key: &str) -> usize {
    string_at(bytes, key) + 8 + key.len()
}

pub fn put_u32(bytes: &mut [u8], at: usize, v: u32) {
    bytes[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub fn put_u64(bytes: &mut [u8], at: usize, v: u64) {
    bytes[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

pub fn get_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
}
