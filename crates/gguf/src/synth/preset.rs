//! The architectures and shape presets of synthetic models, each citing the real config it mirrors.

use serde::{Deserialize, Serialize};

/// An architecture, as llama.cpp names it in `general.architecture`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Arch {
    /// Qwen3.5/3.6 MoE: gated delta-net linear attention with a full-attention layer every
    /// `full_attention_interval` layers, MoE with a shared expert (`src/models/qwen35moe.cpp`).
    #[serde(rename = "qwen35moe")]
    Qwen35Moe,
    /// Qwen3 MoE: full attention with q/k norms, MoE without shared expert
    /// (`src/models/qwen3moe.cpp`).
    #[serde(rename = "qwen3moe")]
    Qwen3Moe,
    /// Qwen3 dense (`src/models/qwen3.cpp`).
    #[serde(rename = "qwen3")]
    Qwen3,
    /// Llama dense (`src/models/llama.cpp`).
    #[serde(rename = "llama")]
    Llama,
}

impl Arch {
    /// The `general.architecture` string, also the prefix of the arch's keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
        }
    }

    /// Whether llama.cpp loads a fused `ffn_gate_up_exps {E, 2ff, nexp}` for this arch:
    /// qwen35moe calls `create_tensor_gate_up_exps`, qwen3moe creates separate gate and up only.
    pub fn supports_fused_gate_up(self) -> bool {
        matches!(self, Arch::Qwen35Moe)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Mixture-of-experts shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MoeShape {
    pub expert_count: u32,
    pub expert_used_count: u32,
    /// Width of one expert (`{arch}.expert_feed_forward_length`).
    pub expert_feed_forward_length: u32,
    /// Width of the shared expert; 0 when the arch has none.
    pub shared_expert_feed_forward_length: u32,
}

/// Gated delta-net (linear attention) shape of qwen35moe, in llama.cpp's key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct LinearAttentionShape {
    /// Layer i is full attention when (i + 1) % interval == 0.
    pub full_attention_interval: u32,
    /// `ssm.conv_kernel`.
    pub conv_kernel: u32,
    /// `ssm.state_size`: the head dim of keys and values.
    pub state_size: u32,
    /// `ssm.group_count`: the key (and query) heads.
    pub group_count: u32,
    /// `ssm.time_step_rank`: the value heads.
    pub time_step_rank: u32,
}

impl LinearAttentionShape {
    /// `ssm.inner_size` = state_size x time_step_rank (the value width). In u64, as llama.cpp
    /// computes it in int64_t: any u32 inputs give the exact product.
    pub fn inner_size(&self) -> u64 {
        u64::from(self.state_size) * u64::from(self.time_step_rank)
    }

    /// Channels of the short convolution: queries, keys and values
    /// (`conv_dim = key_dim * 2 + value_dim` in qwen35moe.cpp); saturates rather than wraps
    /// for hostile widths, so the shape it gives can never be met.
    pub fn conv_dim(&self) -> u64 {
        (2 * u64::from(self.state_size))
            .saturating_mul(u64::from(self.group_count))
            .saturating_add(self.inner_size())
    }
}

/// Llama 3.x rope scaling, stored by llama.cpp as the `rope_freqs.weight` tensor
/// (convert_hf_to_gguf.py computes the factors from these four numbers).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Llama3Rope {
    pub factor: f32,
    pub low_freq_factor: f32,
    pub high_freq_factor: f32,
    pub original_context_length: u32,
}

/// The shape of a real (or tiny test) model: what the synthesiser needs to write every tensor
/// and key llama.cpp expects.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Preset {
    pub name: &'static str,
    pub arch: Arch,
    /// The real config these numbers come from.
    pub source: &'static str,
    /// Numbers that could not be checked against the source, if any.
    pub uncertain: &'static str,
    pub embedding_length: u32,
    pub block_count: u32,
    pub vocab_size: u32,
    pub context_length: u32,
    pub head_count: u32,
    pub head_count_kv: u32,
    pub head_dim: u32,
    pub rope_dimension_count: u32,
    /// `rope.dimension_sections` (qwen35moe's multi-section rope); zeros elsewhere.
    pub rope_dimension_sections: [i32; 4],
    pub rope_freq_base: f32,
    pub rms_eps: f32,
    /// Dense FFN width; 0 for MoE archs.
    pub feed_forward_length: u32,
    pub moe: Option<MoeShape>,
    pub linear_attention: Option<LinearAttentionShape>,
    pub llama3_rope: Option<Llama3Rope>,
}

/// Qwen3.6-35B-A3B (arch qwen35moe): 40 layers = 10 x (3 gated delta-net + 1 gated attention).
///
/// From the model card: hidden 2048, 40 layers, delta-net 16 QK heads and 32 V heads of dim
/// 128, attention 16 Q and 2 KV heads of dim 256 (attn_q carries query and gate: {E, 256*16*2}),
/// rope dim 64 (partial rotary 0.25), 256 experts of width 512 with 8 routed and 1 shared,
/// vocab 248320 (padded), context 262144. llama.cpp's qwen35moe.cpp takes the delta-net head
/// dim of keys and values both from `ssm.state_size` and the head counts from
/// `ssm.group_count` (keys) and `ssm.time_step_rank` (values).
///
/// Uncertain (taken from the Qwen3-Next / Qwen3.5 configs, not checked against the 3.6
/// config.json, which cannot be fetched here): rope theta 1e7, mrope sections [11, 11, 10]
/// (their sum, 32, is rope dim / 2 as ggml_rope_multi expects), rms eps 1e-6, conv kernel 4.
pub const QWEN36_35B_A3B: Preset = Preset {
    name: "qwen3.6-35b-a3b",
    arch: Arch::Qwen35Moe,
    source: "Qwen/Qwen3.6-35B-A3B model card and config.json (same text stack as \
             Qwen3.5-35B-A3B); llama.cpp src/models/qwen35moe.cpp",
    uncertain: "rope theta 1e7, rope sections [11,11,10,0], rms eps 1e-6 and conv kernel 4 come \
                from the Qwen3-Next/Qwen3.5 configs, not checked against Qwen3.6's config.json",
    embedding_length: 2048,
    block_count: 40,
    vocab_size: 248_320,
    context_length: 262_144,
    head_count: 16,
    head_count_kv: 2,
    head_dim: 256,
    rope_dimension_count: 64,
    rope_dimension_sections: [11, 11, 10, 0],
    rope_freq_base: 10_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 256,
        expert_used_count: 8,
        expert_feed_forward_length: 512,
        shared_expert_feed_forward_length: 512,
    }),
    linear_attention: Some(LinearAttentionShape {
        full_attention_interval: 4,
        conv_kernel: 4,
        state_size: 128,
        group_count: 16,
        time_step_rank: 32,
    }),
    llama3_rope: None,
};

/// Qwen3-30B-A3B (arch qwen3moe): Qwen/Qwen3-30B-A3B config.json.
pub const QWEN3_30B_A3B: Preset = Preset {
    name: "qwen3-30b-a3b",
    arch: Arch::Qwen3Moe,
    source: "Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, num_hidden_layers 48, \
             num_attention_heads 32, num_key_value_heads 4, head_dim 128, num_experts 128, \
             num_experts_per_tok 8, moe_intermediate_size 768, vocab_size 151936, \
             rope_theta 1e6, rms_norm_eps 1e-6, max_position_embeddings 40960",
    uncertain: "",
    embedding_length: 2048,
    block_count: 48,
    vocab_size: 151_936,
    context_length: 40_960,
    head_count: 32,
    head_count_kv: 4,
    head_dim: 128,
    // qwen3moe.cpp asserts n_rot == head dim.
    rope_dimension_count: 128,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 1_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 128,
        expert_used_count: 8,
        expert_feed_forward_length: 768,
        shared_expert_feed_forward_length: 0,
    }),
    linear_attention: None,
    llama3_rope: None,
};

/// Qwen3-8B (arch qwen3): Qwen/Qwen3-8B config.json.
pub const QWEN3_8B: Preset = Preset {
    name: "qwen3-8b",
    arch: Arch::Qwen3,
    source: "Qwen/Qwen3-8B config.json: hidden_size 4096, num_hidden_layers 36, \
             num_attention_heads 32, num_key_value_heads 8, head_dim 128, intermediate_size \
             12288, vocab_size 151936, rope_theta 1e6, rms_norm_eps 1e-6, \
             max_position_embeddings 40960, tie_word_embeddings false",
    uncertain: "",
    embedding_length: 4096,
    block_count: 36,
    vocab_size: 151_936,
    context_length: 40_960,
    head_count: 32,
    head_count_kv: 8,
    head_dim: 128,
    rope_dimension_count: 128,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 1_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 12_288,
    moe: None,
    linear_attention: None,
    llama3_rope: None,
};

/// Llama-3.1-8B (arch llama): meta-llama/Llama-3.1-8B config.json, with its llama3 rope
/// scaling written as `rope_freqs.weight` the way convert_hf_to_gguf.py does.
pub const LLAMA_31_8B: Preset = Preset {
    name: "llama-3.1-8b",
    arch: Arch::Llama,
    source: "meta-llama/Llama-3.1-8B config.json: hidden_size 4096, num_hidden_layers 32, \
             num_attention_heads 32, num_key_value_heads 8, intermediate_size 14336, \
             vocab_size 128256, rope_theta 500000, rms_norm_eps 1e-5, \
             max_position_embeddings 131072, rope_scaling llama3 (factor 8, low 1, high 4, \
             original 8192)",
    uncertain: "",
    embedding_length: 4096,
    block_count: 32,
    vocab_size: 128_256,
    context_length: 131_072,
    head_count: 32,
    head_count_kv: 8,
    head_dim: 128,
    // llama.cpp's llama arch requires n_rot == head dim.
    rope_dimension_count: 128,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 500_000.0,
    rms_eps: 1e-5,
    feed_forward_length: 14_336,
    moe: None,
    linear_attention: None,
    llama3_rope: Some(Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context_length: 8192,
    }),
};

/// A few-MB qwen35moe for tests: 4 layers = 3 delta-net + 1 full attention. Keeps the real
/// structure (more value heads than key heads, head dims 128, GQA, a shared expert, partial
/// rope with sections summing to rope dim / 2); every quantised ne[0] is a multiple of 256.
pub const TINY_QWEN35MOE: Preset = Preset {
    name: "tiny-qwen35moe",
    arch: Arch::Qwen35Moe,
    source: "opledger test preset shaped like Qwen3.6-35B-A3B at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 128,
    rope_dimension_count: 32,
    rope_dimension_sections: [6, 5, 5, 0],
    rope_freq_base: 10_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 16,
        expert_used_count: 4,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 256,
    }),
    linear_attention: Some(LinearAttentionShape {
        full_attention_interval: 4,
        conv_kernel: 4,
        state_size: 128,
        group_count: 2,
        time_step_rank: 4,
    }),
    llama3_rope: None,
};

/// A few-MB qwen3moe for tests.
pub const TINY_QWEN3MOE: Preset = Preset {
    name: "tiny-qwen3moe",
    arch: Arch::Qwen3Moe,
    source: "opledger test preset shaped like Qwen3-30B-A3B at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 128,
    rope_dimension_count: 128,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 1_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 16,
        expert_used_count: 4,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 0,
    }),
    linear_attention: None,
    llama3_rope: None,
};

/// A few-MB qwen3 for tests.
pub const TINY_QWEN3: Preset = Preset {
    name: "tiny-qwen3",
    arch: Arch::Qwen3,
    source: "opledger test preset shaped like Qwen3-8B at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 128,
    rope_dimension_count: 128,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 1_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 512,
    moe: None,
    linear_attention: None,
    llama3_rope: None,
};

/// A few-MB llama for tests, with llama3 rope factors like Llama-3.1.
pub const TINY_LLAMA: Preset = Preset {
    name: "tiny-llama",
    arch: Arch::Llama,
    source: "opledger test preset shaped like Llama-3.1-8B at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 64,
    rope_dimension_count: 64,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 500_000.0,
    rms_eps: 1e-5,
    feed_forward_length: 512,
    moe: None,
    linear_attention: None,
    llama3_rope: Some(Llama3Rope {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_context_length: 8192,
    }),
};

static PRESETS: [Preset; 8] = [
    QWEN36_35B_A3B,
    QWEN3_30B_A3B,
    QWEN3_8B,
    LLAMA_31_8B,
    TINY_QWEN35MOE,
    TINY_QWEN3MOE,
    TINY_QWEN3,
    TINY_LLAMA,
];

/// Every preset, real models first, then the tiny test ones.
pub fn presets() -> &'static [Preset] {
    &PRESETS
}

/// The preset named `name` (case-insensitive).
pub fn preset(name: &str) -> Option<&'static Preset> {
    PRESETS
        .iter()
        .find(|p| p.name.eq_ignore_ascii_case(name.trim()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_found() {
        for p in presets() {
            assert_eq!(preset(p.name).map(|q| q.name), Some(p.name));
            assert_eq!(presets().iter().filter(|q| q.name == p.name).count(), 1);
        }
        assert!(preset("QWEN3-8B").is_some());
        assert!(preset("gpt-2").is_none());
    }

    #[test]
    fn shapes_are_consistent_with_llama_cpp() {
        for p in presets() {
            assert!(p.head_count % p.head_count_kv == 0, "{}", p.name);
            match p.arch {
                Arch::Qwen35Moe => {
                    let la = p.linear_attention.expect("qwen35moe has linear attention");
                    // qwen35moe.cpp: num_v_heads % num_k_heads == 0 when they differ.
                    assert!(la.time_step_rank > la.group_count, "{}", p.name);
                    assert_eq!(la.time_step_rank % la.group_count, 0, "{}", p.name);
                    let sections: i32 = p.rope_dimension_sections.iter().sum();
                    assert_eq!(sections as u32 * 2, p.rope_dimension_count, "{}", p.name);
                    assert!(p
                        .moe
                        .is_some_and(|m| m.shared_expert_feed_forward_length > 0));
                }
                Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama => {
                    assert_eq!(p.rope_dimension_count, p.head_dim, "{}", p.name);
                    assert!(p.linear_attention.is_none());
                }
            }
            assert_eq!(p.moe.is_some(), p.feed_forward_length == 0, "{}", p.name);
            if let Some(m) = p.moe {
                assert!(m.expert_used_count <= m.expert_count);
            }
        }
    }

    #[test]
    fn arch_serialises_as_its_llama_cpp_name() {
        for (arch, name) in [
            (Arch::Qwen35Moe, "qwen35moe"),
            (Arch::Qwen3Moe, "qwen3moe"),
            (Arch::Qwen3, "qwen3"),
            (Arch::Llama, "llama"),
        ] {
            assert_eq!(arch.as_str(), name);
            assert_eq!(arch.to_string(), name);
        }
    }
}
