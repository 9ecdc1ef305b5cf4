//! The architectures and shape presets of synthetic models, each citing the real config it mirrors.

use serde::{Deserialize, Serialize};

/// An architecture, as llama.cpp names it in `general.architecture`: the families the
/// synthesiser writes (each one `src/models/<file>.cpp` of the vendored llama.cpp).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Arch {
    /// Qwen3.5/3.6 MoE: gated delta-net linear attention with a full-attention layer every
    /// `full_attention_interval` layers, MoE with a shared expert (`qwen35moe.cpp`).
    #[serde(rename = "qwen35moe")]
    Qwen35Moe,
    /// Qwen3.5 dense: qwen35moe's mixers with a dense FFN (`qwen35.cpp`).
    #[serde(rename = "qwen35")]
    Qwen35,
    /// Qwen3-Next: qwen35moe's layout with NEOX rope and a fused beta/alpha projection
    /// (`qwen3next.cpp`).
    #[serde(rename = "qwen3next")]
    Qwen3Next,
    /// Qwen3 MoE: full attention with q/k norms, MoE without shared expert (`qwen3moe.cpp`).
    #[serde(rename = "qwen3moe")]
    Qwen3Moe,
    /// Qwen3 dense (`qwen3.cpp`).
    #[serde(rename = "qwen3")]
    Qwen3,
    /// Qwen2 dense, with Q/K/V biases (`qwen2.cpp`).
    #[serde(rename = "qwen2")]
    Qwen2,
    /// Qwen2 MoE: routed experts and a sigmoid-gated shared expert (`qwen2moe.cpp`).
    #[serde(rename = "qwen2moe")]
    Qwen2Moe,
    /// Llama dense, or Mixtral-style MoE when it has experts (`llama.cpp`).
    #[serde(rename = "llama")]
    Llama,
    /// Gemma 2: sliding window on every other layer, sandwich norms, soft-capping (`gemma2.cpp`).
    #[serde(rename = "gemma2")]
    Gemma2,
    /// Gemma 3: sliding window on five layers of six, sandwich norms, q/k norms (`gemma3.cpp`).
    #[serde(rename = "gemma3")]
    Gemma3,
    /// Phi-3: fused QKV, gate and up in one `ffn_up` (`phi3.cpp`).
    #[serde(rename = "phi3")]
    Phi3,
    /// DeepSeek-V2/V3: multi-head latent attention, leading dense layers, routed and shared
    /// experts (`deepseek2.cpp`).
    #[serde(rename = "deepseek2")]
    Deepseek2,
    /// gpt-oss: sliding window on every other layer, attention sinks, biased MoE
    /// (`openai-moe.cpp`).
    #[serde(rename = "gpt-oss")]
    GptOss,
    /// OLMoE: MoE without shared expert, q/k norms over the whole row (`olmoe.cpp`).
    #[serde(rename = "olmoe")]
    Olmoe,
    /// Nemotron-H: a hybrid of Mamba-2, attention and FFN-only layers (`nemotron-h.cpp`).
    #[serde(rename = "nemotron_h")]
    NemotronH,
}

impl Arch {
    /// Every family, in display order.
    pub const ALL: [Arch; 15] = [
        Arch::Llama,
        Arch::Qwen2,
        Arch::Qwen2Moe,
        Arch::Qwen3,
        Arch::Qwen3Moe,
        Arch::Qwen35,
        Arch::Qwen35Moe,
        Arch::Qwen3Next,
        Arch::Gemma2,
        Arch::Gemma3,
        Arch::Phi3,
        Arch::Deepseek2,
        Arch::GptOss,
        Arch::Olmoe,
        Arch::NemotronH,
    ];

    /// The `general.architecture` string, also the prefix of the arch's keys.
    pub fn as_str(self) -> &'static str {
        match self {
            Arch::Qwen35Moe => "qwen35moe",
            Arch::Qwen35 => "qwen35",
            Arch::Qwen3Next => "qwen3next",
            Arch::Qwen3Moe => "qwen3moe",
            Arch::Qwen3 => "qwen3",
            Arch::Qwen2 => "qwen2",
            Arch::Qwen2Moe => "qwen2moe",
            Arch::Llama => "llama",
            Arch::Gemma2 => "gemma2",
            Arch::Gemma3 => "gemma3",
            Arch::Phi3 => "phi3",
            Arch::Deepseek2 => "deepseek2",
            Arch::GptOss => "gpt-oss",
            Arch::Olmoe => "olmoe",
            Arch::NemotronH => "nemotron_h",
        }
    }

    /// The family named `general.architecture = name`.
    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.as_str() == name)
    }

    /// Whether llama.cpp loads a fused `ffn_gate_up_exps {E, 2ff, nexp}` for this arch (it calls
    /// `create_tensor_gate_up_exps`); the others create separate gate and up only.
    pub fn supports_fused_gate_up(self) -> bool {
        matches!(self, Arch::Qwen35Moe | Arch::Qwen3Next | Arch::Deepseek2)
    }

    /// The qwen3.5 family: gated delta-net layers beside gated full-attention layers.
    pub fn has_delta_net(self) -> bool {
        matches!(self, Arch::Qwen35Moe | Arch::Qwen35 | Arch::Qwen3Next)
    }
}

impl std::fmt::Display for Arch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Sliding-window attention: the window, and the pattern period (`None`: the architecture's
/// default, 2 for Gemma 2 and gpt-oss, 6 for Gemma 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct SlidingWindow {
    pub window: u32,
    pub pattern: Option<u32>,
}

/// Multi-head latent attention (DeepSeek-V2/V3), in llama.cpp's key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mla {
    /// `attention.q_lora_rank` (0: a plain `attn_q`).
    pub q_lora_rank: u32,
    /// `attention.kv_lora_rank`: the compressed KV width.
    pub kv_lora_rank: u32,
    /// The per-head dims of the part of Q and K without rope and with it.
    pub qk_nope_head_dim: u32,
    pub qk_rope_head_dim: u32,
    pub v_head_dim: u32,
}

/// Mamba-2 mixer shape (Nemotron-H), in llama.cpp's key names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Mamba2Shape {
    /// `ssm.conv_kernel`.
    pub conv_kernel: u32,
    /// `ssm.inner_size`: d_inner.
    pub inner_size: u32,
    /// `ssm.state_size`: d_state.
    pub state_size: u32,
    /// `ssm.group_count`.
    pub group_count: u32,
    /// `ssm.time_step_rank`: the SSM heads.
    pub head_count: u32,
}

impl Mamba2Shape {
    /// Channels of the conv: x, B and C (`conv_dim` in nemotron-h.cpp).
    pub fn conv_dim(&self) -> u64 {
        u64::from(self.inner_size) + 2 * u64::from(self.group_count) * u64::from(self.state_size)
    }

    /// Rows of `ssm_in`: z, x, B, C and dt (`d_in_proj`).
    pub fn in_proj(&self) -> u64 {
        2 * u64::from(self.inner_size)
            + 2 * u64::from(self.group_count) * u64::from(self.state_size)
            + u64::from(self.head_count)
    }
}

/// What some families have and the others do not.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Extras {
    pub sliding_window: Option<SlidingWindow>,
    /// Gemma 2's attention and final logit soft-caps.
    pub softcap: Option<(f32, f32)>,
    /// Biases on the Q, K and V projections (Qwen2, gpt-oss).
    pub qkv_bias: bool,
    /// One `attn_qkv` instead of `attn_q`, `attn_k`, `attn_v` (Phi-3).
    pub fused_qkv: bool,
    /// No `output.weight`: the LM head reuses `token_embd` (Gemma).
    pub tied_output: bool,
    pub mla: Option<Mla>,
    /// Layers before the first MoE layer that have a dense FFN (`leading_dense_block_count`).
    pub leading_dense_layers: u32,
    /// Shared experts per MoE layer (`expert_shared_count`, DeepSeek).
    pub expert_shared_count: u32,
    pub mamba2: Option<Mamba2Shape>,
    /// Nemotron-H's layers, repeated to the block count: `M` Mamba-2, `*` attention, `-` FFN.
    pub layer_pattern: Option<&'static str>,
}

impl Extras {
    pub const NONE: Extras = Extras {
        sliding_window: None,
        softcap: None,
        qkv_bias: false,
        fused_qkv: false,
        tied_output: false,
        mla: None,
        leading_dense_layers: 0,
        expert_shared_count: 0,
        mamba2: None,
        layer_pattern: None,
    };
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
    pub extras: Extras,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
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
    extras: Extras::NONE,
};

/// A Mixtral-style MoE under arch `llama` (routed experts of width `feed_forward_length`, the
/// router's weights renormalised, no shared expert: `llama.cpp` with `expert_count > 0`).
pub const TINY_MIXTRAL: Preset = Preset {
    name: "tiny-mixtral",
    source:
        "opledger test preset shaped like Mixtral-8x7B (arch llama with experts) at small widths",
    feed_forward_length: 256,
    moe: Some(MoeShape {
        expert_count: 8,
        expert_used_count: 2,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 0,
    }),
    llama3_rope: None,
    ..TINY_LLAMA
};

/// A few-MB qwen2 (dense, Q/K/V biases; llama.cpp's qwen2 needs head_dim x heads = embedding).
pub const TINY_QWEN2: Preset = Preset {
    name: "tiny-qwen2",
    arch: Arch::Qwen2,
    source: "opledger test preset shaped like Qwen2.5-7B (biased Q/K/V, GQA) at small widths",
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
    rope_freq_base: 1_000_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 512,
    moe: None,
    linear_attention: None,
    llama3_rope: None,
    extras: Extras {
        qkv_bias: true,
        ..Extras::NONE
    },
};

/// A few-MB qwen2moe: routed experts plus a shared expert behind a sigmoid gate.
pub const TINY_QWEN2MOE: Preset = Preset {
    name: "tiny-qwen2moe",
    arch: Arch::Qwen2Moe,
    source: "opledger test preset shaped like Qwen1.5-MoE-A2.7B at small widths",
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 16,
        expert_used_count: 4,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 256,
    }),
    ..TINY_QWEN2
};

/// A few-MB qwen35 (dense): qwen35moe's gated delta-net and gated attention, dense FFN.
pub const TINY_QWEN35: Preset = Preset {
    name: "tiny-qwen35",
    arch: Arch::Qwen35,
    source: "opledger test preset shaped like Qwen3.5 (dense) at small widths",
    feed_forward_length: 512,
    moe: None,
    ..TINY_QWEN35MOE
};

/// A few-MB qwen3next: qwen35moe's layout with NEOX rope (no sections) and one fused
/// beta/alpha projection (`ssm_ba`).
pub const TINY_QWEN3NEXT: Preset = Preset {
    name: "tiny-qwen3next",
    arch: Arch::Qwen3Next,
    source: "opledger test preset shaped like Qwen3-Next-80B-A3B at small widths",
    rope_dimension_sections: [0; 4],
    ..TINY_QWEN35MOE
};

/// A few-MB gemma2: even layers slide over 128 tokens, sandwich norms, soft-caps, tied head.
pub const TINY_GEMMA2: Preset = Preset {
    name: "tiny-gemma2",
    arch: Arch::Gemma2,
    source: "opledger test preset shaped like Gemma-2-2B at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 8192,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 64,
    rope_dimension_count: 64,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 10_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 512,
    moe: None,
    linear_attention: None,
    llama3_rope: None,
    extras: Extras {
        sliding_window: Some(SlidingWindow {
            window: 128,
            pattern: None,
        }),
        softcap: Some((50.0, 30.0)),
        tied_output: true,
        ..Extras::NONE
    },
};

/// A few-MB gemma3: five layers of six slide over 256 tokens, q/k norms, sandwich norms, tied
/// head (Gemma 3 270M's layout at smaller widths).
pub const TINY_GEMMA3: Preset = Preset {
    name: "tiny-gemma3",
    arch: Arch::Gemma3,
    source: "opledger test preset shaped like Gemma-3-270M (window 512, 18 layers) at small widths",
    block_count: 6,
    head_count_kv: 1,
    extras: Extras {
        sliding_window: Some(SlidingWindow {
            window: 256,
            pattern: None,
        }),
        softcap: None,
        tied_output: true,
        ..Extras::NONE
    },
    ..TINY_GEMMA2
};

/// A few-MB phi3: one fused `attn_qkv`, gate and up in one `ffn_up` of twice the FFN width.
pub const TINY_PHI3: Preset = Preset {
    name: "tiny-phi3",
    arch: Arch::Phi3,
    source: "opledger test preset shaped like Phi-3-mini at small widths",
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
    rope_freq_base: 10_000.0,
    rms_eps: 1e-5,
    feed_forward_length: 512,
    moe: None,
    linear_attention: None,
    llama3_rope: None,
    extras: Extras {
        fused_qkv: true,
        ..Extras::NONE
    },
};

/// A few-MB deepseek2: multi-head latent attention, one leading dense layer, then routed experts
/// with a shared expert (DeepSeek-V2-Lite's structure at small widths).
pub const TINY_DEEPSEEK2: Preset = Preset {
    name: "tiny-deepseek2",
    arch: Arch::Deepseek2,
    source: "opledger test preset shaped like DeepSeek-V2-Lite / V3 (MLA, leading dense layer, \
             shared expert) at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    // MLA as convert_hf_to_gguf writes it: one KV head over the compressed KV
    head_count_kv: 1,
    head_dim: 64,
    rope_dimension_count: 32,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 10_000.0,
    rms_eps: 1e-6,
    feed_forward_length: 512,
    moe: Some(MoeShape {
        expert_count: 16,
        expert_used_count: 4,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 256,
    }),
    linear_attention: None,
    llama3_rope: None,
    extras: Extras {
        mla: Some(Mla {
            q_lora_rank: 64,
            kv_lora_rank: 64,
            qk_nope_head_dim: 32,
            qk_rope_head_dim: 32,
            v_head_dim: 32,
        }),
        leading_dense_layers: 1,
        expert_shared_count: 1,
        ..Extras::NONE
    },
};

/// A few-MB gpt-oss: every other layer slides over 128 tokens, attention sinks, biased
/// attention output, biased experts behind a softmax over the chosen ones.
pub const TINY_GPT_OSS: Preset = Preset {
    name: "tiny-gpt-oss",
    arch: Arch::GptOss,
    source: "opledger test preset shaped like gpt-oss-20b (sliding window 128, sinks, 32 experts \
             top-4) at small widths",
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
    rope_freq_base: 150_000.0,
    rms_eps: 1e-5,
    feed_forward_length: 0,
    moe: Some(MoeShape {
        expert_count: 8,
        expert_used_count: 2,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 0,
    }),
    linear_attention: None,
    llama3_rope: None,
    extras: Extras {
        sliding_window: Some(SlidingWindow {
            window: 128,
            pattern: None,
        }),
        qkv_bias: true,
        ..Extras::NONE
    },
};

/// A few-MB olmoe: routed experts of width `feed_forward_length`, no shared expert, q/k norms
/// over the whole projected row (so as many KV heads as heads).
pub const TINY_OLMOE: Preset = Preset {
    name: "tiny-olmoe",
    arch: Arch::Olmoe,
    source: "opledger test preset shaped like OLMoE-1B-7B at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 4,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    head_count_kv: 4,
    head_dim: 64,
    rope_dimension_count: 64,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 10_000.0,
    rms_eps: 1e-5,
    feed_forward_length: 256,
    moe: Some(MoeShape {
        expert_count: 16,
        expert_used_count: 4,
        expert_feed_forward_length: 256,
        shared_expert_feed_forward_length: 0,
    }),
    linear_attention: None,
    llama3_rope: None,
    extras: Extras::NONE,
};

/// A few-MB nemotron_h: Mamba-2, FFN-only and attention layers (`M-M*M-`), the state-space
/// hybrid whose layer kinds come from per-layer head and FFN counts.
pub const TINY_NEMOTRON_H: Preset = Preset {
    name: "tiny-nemotron-h",
    arch: Arch::NemotronH,
    source: "opledger test preset shaped like Nemotron-H-8B (mostly Mamba-2 and FFN layers, a few \
             attention layers) at small widths",
    uncertain: "",
    embedding_length: 256,
    block_count: 6,
    vocab_size: 2048,
    context_length: 4096,
    head_count: 4,
    head_count_kv: 2,
    head_dim: 64,
    rope_dimension_count: 64,
    rope_dimension_sections: [0; 4],
    rope_freq_base: 10_000.0,
    rms_eps: 1e-5,
    feed_forward_length: 512,
    moe: None,
    linear_attention: None,
    llama3_rope: None,
    extras: Extras {
        mamba2: Some(Mamba2Shape {
            conv_kernel: 4,
            inner_size: 512,
            state_size: 32,
            group_count: 2,
            head_count: 8,
        }),
        layer_pattern: Some("M-M*M-"),
        ..Extras::NONE
    },
};

static PRESETS: [Preset; 20] = [
    QWEN36_35B_A3B,
    QWEN3_30B_A3B,
    QWEN3_8B,
    LLAMA_31_8B,
    TINY_QWEN35MOE,
    TINY_QWEN3MOE,
    TINY_QWEN3,
    TINY_LLAMA,
    TINY_MIXTRAL,
    TINY_QWEN2,
    TINY_QWEN2MOE,
    TINY_QWEN35,
    TINY_QWEN3NEXT,
    TINY_GEMMA2,
    TINY_GEMMA3,
    TINY_PHI3,
    TINY_DEEPSEEK2,
    TINY_GPT_OSS,
    TINY_OLMOE,
    TINY_NEMOTRON_H,
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
            let n = p.name;
            assert!(p.head_count % p.head_count_kv == 0, "{n}");
            if let Some(m) = p.moe {
                assert!(m.expert_used_count <= m.expert_count, "{n}");
            }
            match p.arch {
                Arch::Qwen35Moe | Arch::Qwen35 | Arch::Qwen3Next => {
                    let la = p.linear_attention.expect("qwen3.5 has linear attention");
                    // qwen35moe.cpp: num_v_heads % num_k_heads == 0 when they differ.
                    assert!(la.time_step_rank > la.group_count, "{n}");
                    assert_eq!(la.time_step_rank % la.group_count, 0, "{n}");
                    if p.arch == Arch::Qwen3Next {
                        // qwen3next.cpp reads no sections (plain NEOX rope)
                        assert_eq!(p.rope_dimension_sections, [0; 4], "{n}");
                    } else {
                        let sections: i32 = p.rope_dimension_sections.iter().sum();
                        assert_eq!(sections as u32 * 2, p.rope_dimension_count, "{n}");
                    }
                    assert_eq!(
                        p.moe
                            .is_some_and(|m| m.shared_expert_feed_forward_length > 0),
                        p.arch != Arch::Qwen35,
                        "{n}"
                    );
                }
                Arch::Qwen3Moe | Arch::Qwen3 | Arch::Llama => {
                    assert_eq!(p.rope_dimension_count, p.head_dim, "{n}");
                }
                // these project Q to n_embd and attn_output from it
                Arch::Qwen2 | Arch::Qwen2Moe | Arch::Phi3 => {
                    assert_eq!(p.head_dim * p.head_count, p.embedding_length, "{n}");
                }
                Arch::Olmoe => {
                    assert_eq!(p.head_dim * p.head_count, p.embedding_length, "{n}");
                    // olmoe.cpp:29: attn_k_norm is n_embd wide, so K must be too
                    assert_eq!(p.head_count_kv, p.head_count, "{n}");
                }
                Arch::Gemma2 | Arch::Gemma3 => {
                    assert!(p.extras.sliding_window.is_some(), "{n}");
                    // gemma2.cpp never creates output.weight: a file with one is refused
                    assert!(p.arch != Arch::Gemma2 || p.extras.tied_output, "{n}");
                }
                Arch::GptOss => {
                    // openai-moe.cpp: the head dim is rope.dimension_count
                    assert_eq!(p.rope_dimension_count, p.head_dim, "{n}");
                    assert!(p.extras.sliding_window.is_some(), "{n}");
                }
                Arch::Deepseek2 => {
                    let mla = p.extras.mla.expect("deepseek2 has MLA");
                    // deepseek2.cpp:77: GGML_ASSERT(k_mla - n_rot >= 1)
                    assert!(mla.qk_nope_head_dim >= 1, "{n}");
                    assert_eq!(p.head_count_kv, 1, "{n}");
                    assert!(p.extras.leading_dense_layers < p.block_count, "{n}");
                    assert!(![26, 27, 47, 48].contains(&p.block_count), "{n}");
                }
                Arch::NemotronH => {
                    let m = p.extras.mamba2.expect("nemotron_h has Mamba-2 layers");
                    assert_eq!(m.inner_size % m.head_count, 0, "{n}");
                    assert_eq!(m.inner_size % m.group_count, 0, "{n}");
                    assert_eq!(m.head_count % m.group_count, 0, "{n}");
                    assert!(p.extras.layer_pattern.is_some(), "{n}");
                }
            }
            if p.arch.has_delta_net() {
                continue;
            }
            assert!(p.linear_attention.is_none(), "{n}");
        }
    }

    #[test]
    fn arch_serialises_as_its_llama_cpp_name() {
        for (arch, name) in [
            (Arch::Qwen35Moe, "qwen35moe"),
            (Arch::Qwen3Moe, "qwen3moe"),
            (Arch::Qwen3, "qwen3"),
            (Arch::Llama, "llama"),
            (Arch::GptOss, "gpt-oss"),
            (Arch::NemotronH, "nemotron_h"),
        ] {
            assert_eq!(arch.as_str(), name);
            assert_eq!(arch.to_string(), name);
            assert_eq!(Arch::from_name(name), Some(arch));
        }
        // every family has a tiny preset the tests profile
        for a in Arch::ALL {
            assert!(
                presets()
                    .iter()
                    .any(|p| p.arch == a && p.name.starts_with("tiny-")),
                "{a}"
            );
        }
    }
}
