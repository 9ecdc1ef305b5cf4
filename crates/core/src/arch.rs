//! What the model's metadata and tensors say about its architecture: every layer's kind (full
//! attention, sliding-window attention and its window, a recurrent mixer, none), its FFN (dense,
//! MoE, shared expert, none), experts, heads. Built from GGUF keys by the caller (core reads no
//! files), for any architecture llama.cpp runs; used by the categoriser's layer rules, the audit,
//! the census, the sweep's per-kind fits and memory estimates.

use serde::{Deserialize, Serialize};

/// The kind of a layer's token mixer, as the band rules and the audit see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Softmax attention over the whole context (with a KV cache).
    FullAttention,
    /// Softmax attention over the last `window` tokens only (its own, bounded KV cache):
    /// Gemma 2/3, gpt-oss, Cohere 2 and others; llama.cpp's chunked attention (Llama 4) too.
    SlidingWindow,
    /// A recurrent mixer with a fixed-size state (gated delta-net, Mamba / SSM scan, RWKV,
    /// short convolution).
    LinearAttention,
    /// No token mixer at all: the layer is an FFN alone (Nemotron-H's MLP layers).
    FeedForward,
}

impl LayerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerKind::FullAttention => "full_attention",
            LayerKind::SlidingWindow => "sliding_window",
            LayerKind::LinearAttention => "linear_attention",
            LayerKind::FeedForward => "feed_forward",
        }
    }

    /// Every kind, in display order.
    pub const ALL: [LayerKind; 4] = [
        LayerKind::FullAttention,
        LayerKind::SlidingWindow,
        LayerKind::LinearAttention,
        LayerKind::FeedForward,
    ];

    /// Whether the layer runs softmax attention (full or sliding).
    pub fn is_attention(self) -> bool {
        matches!(self, LayerKind::FullAttention | LayerKind::SlidingWindow)
    }

    /// The kinds whose layer rules apply to this kind, most specific first: a sliding-window
    /// layer is an attention layer, so rules written for full attention hold for it unless a
    /// `sliding_window` rule says otherwise.
    pub fn rule_kinds(self) -> &'static [LayerKind] {
        match self {
            LayerKind::SlidingWindow => &[LayerKind::SlidingWindow, LayerKind::FullAttention],
            LayerKind::FullAttention => &[LayerKind::FullAttention],
            LayerKind::LinearAttention => &[LayerKind::LinearAttention],
            LayerKind::FeedForward => &[LayerKind::FeedForward],
        }
    }
}

/// The token mixer of a layer, finer than [`LayerKind`]: what kind of attention or recurrence.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mixer {
    /// Multi-head (grouped-query) softmax attention with Q, K, V projections.
    Attention,
    /// Multi-head latent attention (DeepSeek-V2/V3): low-rank Q and compressed KV.
    Mla,
    /// Gated delta-net (Qwen3-Next, Qwen3.5/3.6).
    DeltaNet,
    /// Mamba (selective scan).
    Mamba,
    /// Mamba-2 (state-space duality scan, grouped).
    Mamba2,
    /// RWKV time mixing.
    Rwkv,
    /// LFM2's short convolution.
    ShortConv,
    /// A recurrent mixer of another kind (its tensors are `ssm_*` or the like).
    Recurrent,
    /// No mixer.
    None,
}

impl Mixer {
    pub fn as_str(self) -> &'static str {
        match self {
            Mixer::Attention => "attention",
            Mixer::Mla => "mla",
            Mixer::DeltaNet => "delta-net",
            Mixer::Mamba => "mamba",
            Mixer::Mamba2 => "mamba2",
            Mixer::Rwkv => "rwkv",
            Mixer::ShortConv => "short-conv",
            Mixer::Recurrent => "recurrent",
            Mixer::None => "none",
        }
    }
}

/// The FFN of a layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FfnKind {
    /// A dense FFN (gate/up/down, or RWKV's channel mix).
    Dense,
    /// Routed experts (a router `ffn_gate_inp`), with or without a shared expert.
    Moe,
    /// No FFN (a Mamba or attention layer of a hybrid whose FFNs are layers of their own).
    None,
}

impl FfnKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FfnKind::Dense => "dense",
            FfnKind::Moe => "moe",
            FfnKind::None => "none",
        }
    }
}

/// One layer as the file describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerInfo {
    pub kind: LayerKind,
    pub mixer: Mixer,
    /// Tokens a sliding-window layer attends to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<u32>,
    pub ffn: FfnKind,
    /// A shared expert runs beside the routed ones.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_expert: bool,
    /// The matmul weights the layer holds, counted by role (the census predicts one matmul
    /// per weight from these).
    #[serde(default)]
    pub weights: LayerWeights,
}

/// A layer's matmul weights by role, counted from the tensors the file holds for it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerWeights {
    /// The token mixer's projections: Q/K/V/O (`attn_q`, `attn_k`, `attn_v`, `attn_qkv`,
    /// `attn_output`) for attention, the recurrent mixer's own (`attn_qkv`, `attn_gate`,
    /// `ssm_alpha`, `ssm_beta`, `ssm_ba`, `ssm_out` for a delta-net; `ssm_in`, `ssm_x`, `ssm_dt`,
    /// `ssm_out` for Mamba). `None` for mixers whose use of their weights opledger does not
    /// predict (MLA, RWKV, short conv, other recurrences).
    #[serde(default)]
    pub mixer: Option<u32>,
    /// A dense FFN's gate, up and down (`ffn_gate`, `ffn_up`, `ffn_down`; RWKV's channel mix
    /// `channel_mix_key`, `_value`, `_receptance`).
    #[serde(default)]
    pub dense_ffn: u32,
    /// Routed-expert tensors (`ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`,
    /// `ffn_gate_up_exps`): one MUL_MAT_ID each.
    #[serde(default)]
    pub experts: u32,
    /// The router and the shared expert's matmuls (`ffn_gate_inp`, `ffn_gate_inp_shexp`,
    /// `ffn_gate_shexp`, `ffn_up_shexp`, `ffn_down_shexp`).
    #[serde(default)]
    pub router_shared: u32,
}

impl LayerInfo {
    /// `sliding_window(512)/attention + moe(shared)`, for listings.
    pub fn label(&self) -> String {
        let kind = match (self.kind, self.window) {
            (LayerKind::SlidingWindow, Some(w)) => format!("sliding_window({w})"),
            (k, _) => k.as_str().to_string(),
        };
        let mixer = match self.mixer {
            Mixer::None | Mixer::Attention => String::new(),
            m => format!("/{}", m.as_str()),
        };
        let ffn = match (self.ffn, self.shared_expert) {
            (FfnKind::Moe, true) => "moe+shared".to_string(),
            (f, _) => f.as_str().to_string(),
        };
        format!("{kind}{mixer} + {ffn}")
    }
}

/// The architecture facts opledger needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchInfo {
    /// `general.architecture` (`qwen35moe`, `gemma3`, `llama`, ...).
    pub arch: String,
    /// Every layer, in order.
    pub layers: Vec<LayerInfo>,
    /// Routed experts per MoE layer (0 without MoE layers).
    pub n_experts: u32,
    /// Experts each token is routed to.
    pub n_experts_used: u32,
    /// A shared expert runs beside the routed ones (in the first MoE layer).
    pub shared_expert: bool,
    /// Expert gate and up projections are one fused tensor (`ffn_gate_up_exps`).
    pub fused_gate_up: bool,
    pub n_embd: u32,
    pub n_head: u32,
    pub n_head_kv: u32,
    pub n_vocab: u32,
    /// Dimension of one key head and one value head (`attention.key_length`, `value_length`).
    #[serde(default)]
    pub key_length: u32,
    #[serde(default)]
    pub value_length: u32,
    /// Recurrent (linear-attention) state shape, for memory estimates: conv kernel, state size,
    /// key-head groups, value heads (`ssm.*`); all 0 without recurrent layers.
    #[serde(default)]
    pub ssm_conv_kernel: u32,
    #[serde(default)]
    pub ssm_state_size: u32,
    #[serde(default)]
    pub ssm_group_count: u32,
    #[serde(default)]
    pub ssm_time_step_rank: u32,
    /// `ssm.inner_size` (Mamba's d_inner); 0 where absent.
    #[serde(default)]
    pub ssm_inner_size: u32,
    /// Width of one expert's FFN (MoE) or of the dense FFN.
    #[serde(default)]
    pub ffn_length: u32,
    /// How the layer kinds were decided, and anything that could not be (an architecture whose
    /// sliding-window rule opledger does not know, say).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArchError {
    #[error("missing metadata key {0}")]
    MissingKey(String),
    #[error("metadata key {key}: {why}")]
    BadKey { key: String, why: String },
}

/// Read access to a model's metadata, implemented by whoever holds the file.
pub trait Metadata {
    fn get_u64(&self, key: &str) -> Option<u64>;
    /// An integer or bool array (bools as 0/1).
    fn get_i64_array(&self, key: &str) -> Option<Vec<i64>>;
    fn get_string(&self, key: &str) -> Option<String>;
    fn has_tensor(&self, name: &str) -> bool;
}

/// How an architecture picks its sliding-window layers, as its `load_arch_hparams` in the
/// vendored llama.cpp (`src/models/<arch>.cpp`) does: `load_swa_pattern(ml, pattern,
/// dense_first)` takes the per-layer array `attention.sliding_window_pattern` if the file has
/// one, else that key as a period, else `pattern`; `set_swa_pattern` then makes layer `il`
/// slide when `il % p < p - 1` (or, dense first, when `il % p != 0`).
#[derive(Debug, Clone, Copy)]
struct SwaRule {
    arch: &'static str,
    when: SwaWhen,
    /// The window when the key is absent (`None`: the key is required or SWA is off without it).
    default_window: Option<u32>,
    /// A window llama.cpp forces whatever the key says.
    forced_window: Option<u32>,
    pattern: u32,
    dense_first: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum SwaWhen {
    /// Always sliding-window.
    Always,
    /// Only when `attention.sliding_window` is present and above 0.
    WindowPositive,
    /// Llama 4: chunked attention unless the key is present and 0.
    UnlessWindowZero,
    /// Only for models of this many layers (exaone4's 32B).
    Layers(u32),
    /// Every attention layer slides when the window is above 0 (lfm2).
    AllAttentionWhenWindowPositive,
    /// The per-layer array is required (granite_swa).
    ArrayRequired,
}

/// Every architecture of the vendored llama.cpp (llama-cpp-sys-2 0.1.161) that reads a
/// sliding-window pattern through `load_swa_pattern` / `set_swa_pattern` / the pattern array
/// (file:line of each in the comment).
const SWA_RULES: [SwaRule; 19] = [
    swa("afmoe", SwaWhen::WindowPositive, None, 4, false), // afmoe.cpp:11-17
    swa("cohere2", SwaWhen::Always, None, 4, false),       // cohere2.cpp:4-11
    swa("cohere2moe", SwaWhen::Always, None, 4, true),     // cohere2moe.cpp:13-28
    SwaRule {
        // exaone-moe.cpp:4-11: n_swa = 128, then the key (required)
        default_window: Some(128),
        ..swa("exaone-moe", SwaWhen::Always, None, 4, false)
    },
    SwaRule {
        // exaone4.cpp:4-14: only the 64-layer (32B) model slides, n_swa = 4096 unless the key
        default_window: Some(4096),
        ..swa("exaone4", SwaWhen::Layers(64), None, 4, false)
    },
    SwaRule {
        // gemma2.cpp:4-12: n_swa = 4096 unless the key says otherwise
        default_window: Some(4096),
        ..swa("gemma2", SwaWhen::Always, None, 2, false)
    },
    swa("gemma3", SwaWhen::WindowPositive, None, 6, false), // gemma3.cpp:4-11
    swa("gemma3n", SwaWhen::Always, None, 5, false),        // gemma3n.cpp:4-11
    swa("gemma-embedding", SwaWhen::Always, None, 6, false), // gemma-embedding.cpp:4-10 (symmetric)
    // llama4.cpp:8-19: chunked attention of 8192 tokens, 3 chunked layers then 1 full
    swa("llama4", SwaWhen::UnlessWindowZero, Some(8192), 4, false),
    swa("mellum", SwaWhen::WindowPositive, None, 4, false), // mellum.cpp:6-11
    swa("olmo2", SwaWhen::WindowPositive, None, 4, false),  // olmo2.cpp:6-9
    swa("gpt-oss", SwaWhen::Always, None, 2, false),        // openai-moe.cpp:6-9
    swa("plamo3", SwaWhen::WindowPositive, None, 8, false), // plamo3.cpp:5-9
    swa("smallthinker", SwaWhen::WindowPositive, Some(4096), 4, true), // smallthinker.cpp:4-9
    swa("laguna", SwaWhen::WindowPositive, None, 4, true),  // laguna.cpp:34-39
    swa("muse-glimmer", SwaWhen::Always, None, 4, false),   // muse-glimmer.cpp:5-13
    swa("granite_swa", SwaWhen::ArrayRequired, None, 0, false), // granite-swa.cpp:17-19
    swa(
        "lfm2",
        SwaWhen::AllAttentionWhenWindowPositive,
        None,
        0,
        false,
    ), // lfm2.cpp:26-29
];

const fn swa(
    arch: &'static str,
    when: SwaWhen,
    forced_window: Option<u32>,
    pattern: u32,
    dense_first: bool,
) -> SwaRule {
    SwaRule {
        arch,
        when,
        default_window: None,
        forced_window,
        pattern,
        dense_first,
    }
}

/// Architectures whose sliding-window layers llama.cpp decides by rules of their own that
/// opledger does not reproduce (their layer kinds are reported as full attention, with a note).
const SWA_UNREAD: [&str; 11] = [
    "deepseek4",
    "dflash",
    "dots3note",
    "gemma4",
    "gemma4-assistant",
    "lfm2moe",
    "maple",
    "mimo2",
    "nanbeige",
    "spark2_5",
    "step35",
];

impl ArchInfo {
    /// Reads the architecture from metadata and tensor names by the rules the vendored
    /// llama.cpp applies. Layer kinds come from the tensors each layer holds (every
    /// architecture names them from one vocabulary, `src/llama-arch.cpp`): a recurrent mixer's
    /// tensors (`ssm_*`, `time_mix_*`, `shortconv.*`), attention's (`attn_q`, `attn_qkv`, MLA's
    /// `attn_q_a` / `attn_kv_a_mqa`), or neither; sliding windows from the metadata, by the
    /// architecture's pattern rule ([`SWA_RULES`]); the FFN from the router (`ffn_gate_inp`:
    /// MoE), a dense FFN's tensors, or neither.
    pub fn from_metadata(md: &dyn Metadata) -> Result<ArchInfo, ArchError> {
        let arch = md
            .get_string("general.architecture")
            .ok_or_else(|| ArchError::MissingKey("general.architecture".into()))?;
        let key = |k: &str| format!("{arch}.{k}");
        let req = |k: &str| -> Result<u64, ArchError> {
            md.get_u64(&key(k))
                .ok_or_else(|| ArchError::MissingKey(key(k)))
        };
        let n_layer = req("block_count")?;
        if n_layer == 0 || n_layer > 4096 {
            return Err(ArchError::BadKey {
                key: key("block_count"),
                why: format!("{n_layer} layers"),
            });
        }
        let n_layer = n_layer as usize;
        let mut notes = Vec::new();
        let mut layers: Vec<LayerInfo> = (0..n_layer).map(|il| layer_of(md, il)).collect();
        apply_sliding_windows(&arch, md, &mut layers, &mut notes)?;
        let kinds_seen: Vec<String> = LayerKind::ALL
            .iter()
            .filter_map(|k| {
                let n = layers.iter().filter(|l| l.kind == *k).count();
                (n > 0).then(|| format!("{n} {}", k.as_str()))
            })
            .collect();
        notes.insert(
            0,
            format!(
                "layer kinds from the tensors each layer holds{}: {}",
                if layers.iter().any(|l| l.kind == LayerKind::SlidingWindow) {
                    " and llama.cpp's sliding-window rule"
                } else {
                    ""
                },
                kinds_seen.join(", ")
            ),
        );
        let n_experts = md.get_u64(&key("expert_count")).unwrap_or(0) as u32;
        let n_experts_used = md
            .get_u64(&key("expert_used_count"))
            .or_else(|| {
                md.get_i64_array(&key("expert_used_count"))
                    .and_then(|a| a.into_iter().max())
                    .map(|v| v.max(0) as u64)
            })
            .unwrap_or(0) as u32;
        let n_vocab = md
            .get_u64(&key("vocab_size"))
            .or_else(|| md.get_u64("tokenizer.ggml.vocab_size"))
            .unwrap_or(0) as u32;
        let n_head = scalar_or_max(md, &key("attention.head_count")).unwrap_or(0) as u32;
        let n_embd = req("embedding_length")? as u32;
        let head_dim = n_embd.checked_div(n_head).unwrap_or(0);
        let opt = |k: &str| md.get_u64(&key(k)).unwrap_or(0) as u32;
        let first_moe = layers.iter().position(|l| l.ffn == FfnKind::Moe);
        let ffn_length = md
            .get_u64(&key("expert_feed_forward_length"))
            .or_else(|| scalar_or_max(md, &key("feed_forward_length")))
            .unwrap_or(0) as u32;
        Ok(ArchInfo {
            n_experts,
            n_experts_used,
            shared_expert: first_moe.is_some_and(|il| layers[il].shared_expert),
            fused_gate_up: first_moe
                .is_some_and(|il| md.has_tensor(&format!("blk.{il}.ffn_gate_up_exps.weight"))),
            n_embd,
            n_head,
            key_length: md
                .get_u64(&key("attention.key_length"))
                .map(|v| v as u32)
                .unwrap_or(head_dim),
            value_length: md
                .get_u64(&key("attention.value_length"))
                .map(|v| v as u32)
                .unwrap_or(head_dim),
            ssm_conv_kernel: opt("ssm.conv_kernel"),
            ssm_state_size: opt("ssm.state_size"),
            ssm_group_count: opt("ssm.group_count"),
            ssm_time_step_rank: opt("ssm.time_step_rank"),
            ssm_inner_size: opt("ssm.inner_size"),
            ffn_length,
            n_head_kv: md
                .get_u64(&key("attention.head_count_kv"))
                .or_else(|| {
                    // hybrids give one count per layer, 0 on recurrent layers
                    md.get_i64_array(&key("attention.head_count_kv"))
                        .and_then(|a| a.into_iter().find(|&v| v > 0))
                        .map(|v| v as u64)
                })
                .unwrap_or(n_head as u64) as u32,
            n_vocab,
            layers,
            notes,
            arch,
        })
    }

    pub fn n_layers(&self) -> u32 {
        self.layers.len() as u32
    }

    pub fn layers_of(&self, kind: LayerKind) -> u32 {
        self.layers.iter().filter(|l| l.kind == kind).count() as u32
    }

    /// Layers that run softmax attention (full or sliding).
    pub fn attention_layers(&self) -> u32 {
        self.layers.iter().filter(|l| l.kind.is_attention()).count() as u32
    }

    pub fn kind_of(&self, layer: u32) -> Option<LayerKind> {
        self.layers.get(layer as usize).map(|l| l.kind)
    }

    pub fn layer(&self, layer: u32) -> Option<&LayerInfo> {
        self.layers.get(layer as usize)
    }

    pub fn layer_kinds(&self) -> Vec<LayerKind> {
        self.layers.iter().map(|l| l.kind).collect()
    }

    /// Layers with routed experts.
    pub fn moe_layers(&self) -> u32 {
        self.layers.iter().filter(|l| l.ffn == FfnKind::Moe).count() as u32
    }

    pub fn dense_ffn_layers(&self) -> u32 {
        self.layers
            .iter()
            .filter(|l| l.ffn == FfnKind::Dense)
            .count() as u32
    }

    pub fn is_moe(&self) -> bool {
        self.n_experts > 0 && self.moe_layers() > 0
    }

    /// The sliding window, where some layer slides (all sliding layers share it).
    pub fn sliding_window(&self) -> Option<u32> {
        self.layers.iter().find_map(|l| l.window)
    }

    /// The layers, compressed for one line: `0-4 sliding_window(512) + dense, 5 full_attention
    /// + dense, ...`.
    pub fn layer_summary(&self) -> String {
        let mut runs: Vec<(usize, usize, String)> = Vec::new();
        for (i, l) in self.layers.iter().enumerate() {
            let label = l.label();
            match runs.last_mut() {
                Some((_, end, last)) if *last == label && *end + 1 == i => *end = i,
                _ => runs.push((i, i, label)),
            }
        }
        runs.iter()
            .map(|(a, b, l)| {
                if a == b {
                    format!("{a} {l}")
                } else {
                    format!("{a}-{b} {l}")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// A key llama.cpp reads with `get_key_or_arr`: a scalar, or the largest entry of a per-layer
/// array.
fn scalar_or_max(md: &dyn Metadata, key: &str) -> Option<u64> {
    md.get_u64(key).or_else(|| {
        md.get_i64_array(key)
            .and_then(|a| a.into_iter().max())
            .map(|v| v.max(0) as u64)
    })
}

/// Layer `il` from the tensors it holds. llama.cpp's loader refuses a file whose tensors are
/// not exactly those its architecture creates for each layer (`done_getting_tensors`), so a
/// file that loads holds a recurrent mixer's tensors exactly where the architecture's rule
/// (a recurrent-layers array, an interval, per-layer head counts) puts recurrent layers.
fn layer_of(md: &dyn Metadata, il: usize) -> LayerInfo {
    let has = |token: &str| {
        md.has_tensor(&format!("blk.{il}.{token}.weight"))
            || md.has_tensor(&format!("blk.{il}.{token}"))
    };
    let mixer = if has("ssm_beta") || has("ssm_ba") || has("ssm_alpha") {
        Mixer::DeltaNet
    } else if has("ssm_in") && has("ssm_x") {
        Mixer::Mamba
    } else if has("ssm_in") {
        Mixer::Mamba2
    } else if has("time_mix_key") || has("time_mix_w1") || has("time_mix_lerp_fused") {
        Mixer::Rwkv
    } else if has("shortconv.conv") || has("shortconv.in_proj") {
        Mixer::ShortConv
    } else if has("ssm_a") || has("ssm_conv1d") || has("ssm_out") {
        Mixer::Recurrent
    } else if has("attn_q_a") || has("attn_kv_a_mqa") {
        Mixer::Mla
    } else if has("attn_q") || has("attn_qkv") || has("attn_k") {
        Mixer::Attention
    } else {
        Mixer::None
    };
    let kind = match mixer {
        Mixer::Attention | Mixer::Mla => LayerKind::FullAttention,
        Mixer::None => LayerKind::FeedForward,
        _ => LayerKind::LinearAttention,
    };
    let count = |tokens: &[&str]| tokens.iter().filter(|t| has(t)).count() as u32;
    let mixer_weights = match mixer {
        Mixer::Attention => Some(count(&[
            "attn_q",
            "attn_k",
            "attn_v",
            "attn_qkv",
            "attn_output",
        ])),
        // deepseek2.cpp:98-122 (absorbed MLA): each of these is one matmul, k_b and v_b batched
        // over the heads
        Mixer::Mla => Some(count(&[
            "attn_q_a",
            "attn_q_b",
            "attn_q",
            "attn_kv_a_mqa",
            "attn_k_b",
            "attn_v_b",
            "attn_kv_b",
            "attn_output",
        ])),
        Mixer::DeltaNet => Some(count(&[
            "attn_qkv",
            "attn_gate",
            "ssm_alpha",
            "ssm_beta",
            "ssm_ba",
            "ssm_out",
        ])),
        Mixer::Mamba => Some(count(&["ssm_in", "ssm_x", "ssm_dt", "ssm_out"])),
        Mixer::Mamba2 => Some(count(&["ssm_in", "ssm_out"])),
        Mixer::None => Some(0),
        _ => None,
    };
    let ffn = if has("ffn_gate_inp") {
        FfnKind::Moe
    } else if has("ffn_down") || has("ffn_up") || has("channel_mix_key") {
        FfnKind::Dense
    } else {
        FfnKind::None
    };
    LayerInfo {
        kind,
        mixer,
        window: None,
        ffn,
        shared_expert: ffn == FfnKind::Moe
            && (has("ffn_down_shexp") || has("ffn_up_shexp") || has("ffn_gate_shexp")),
        weights: LayerWeights {
            mixer: mixer_weights,
            dense_ffn: count(&[
                "ffn_gate",
                "ffn_up",
                "ffn_down",
                "channel_mix_key",
                "channel_mix_value",
                "channel_mix_receptance",
            ]),
            experts: count(&[
                "ffn_gate_exps",
                "ffn_up_exps",
                "ffn_down_exps",
                "ffn_gate_up_exps",
            ]),
            router_shared: count(&[
                "ffn_gate_inp",
                "ffn_gate_inp_shexp",
                "ffn_gate_shexp",
                "ffn_up_shexp",
                "ffn_down_shexp",
            ]),
        },
    }
}

/// Marks the sliding-window layers as llama.cpp's `load_arch_hparams` of `arch` does.
fn apply_sliding_windows(
    arch: &str,
    md: &dyn Metadata,
    layers: &mut [LayerInfo],
    notes: &mut Vec<String>,
) -> Result<(), ArchError> {
    let window_key = format!("{arch}.attention.sliding_window");
    let pattern_key = format!("{arch}.attention.sliding_window_pattern");
    let window = md.get_u64(&window_key);
    let Some(rule) = SWA_RULES.iter().find(|r| r.arch == arch) else {
        if SWA_UNREAD.contains(&arch) && window.is_some_and(|w| w > 0) {
            notes.push(format!(
                "llama.cpp's {arch} decides its sliding-window layers by rules opledger does not \
                 read: every attention layer is reported as full attention"
            ));
        }
        return Ok(());
    };
    let n = layers.len();
    let on = match rule.when {
        SwaWhen::Always | SwaWhen::ArrayRequired => true,
        SwaWhen::WindowPositive | SwaWhen::AllAttentionWhenWindowPositive => {
            window.is_some_and(|w| w > 0)
        }
        SwaWhen::UnlessWindowZero => window != Some(0),
        SwaWhen::Layers(l) => n == l as usize,
    };
    if !on {
        return Ok(());
    }
    let window = match (rule.forced_window, window, rule.default_window) {
        (Some(f), _, _) => f,
        (None, Some(w), _) => w as u32,
        (None, None, Some(d)) => d,
        (None, None, None) => {
            return Err(ArchError::MissingKey(window_key));
        }
    };
    let slides: Vec<bool> = if rule.when == SwaWhen::AllAttentionWhenWindowPositive {
        layers.iter().map(|l| l.kind.is_attention()).collect()
    } else if let Some(flags) = md.get_i64_array(&pattern_key) {
        if flags.len() != n {
            return Err(ArchError::BadKey {
                key: pattern_key,
                why: format!("{} entries for {n} layers", flags.len()),
            });
        }
        flags.iter().map(|&f| f != 0).collect()
    } else if rule.when == SwaWhen::ArrayRequired {
        return Err(ArchError::MissingKey(pattern_key));
    } else {
        let p = md.get_u64(&pattern_key).unwrap_or(rule.pattern as u64);
        (0..n as u64)
            .map(|il| {
                if rule.dense_first {
                    p == 0 || il % p != 0
                } else {
                    p == 0 || il % p < p - 1
                }
            })
            .collect()
    };
    for (l, s) in layers.iter_mut().zip(slides) {
        if s && l.kind.is_attention() {
            l.kind = LayerKind::SlidingWindow;
            l.window = Some(window);
        }
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// Metadata from literal maps, for tests.
    #[derive(Default)]
    pub struct MapMetadata {
        pub u: BTreeMap<String, u64>,
        pub s: BTreeMap<String, String>,
        pub a: BTreeMap<String, Vec<i64>>,
        pub tensors: Vec<String>,
    }

    impl Metadata for MapMetadata {
        fn get_u64(&self, key: &str) -> Option<u64> {
            self.u.get(key).copied()
        }
        fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
            self.a.get(key).cloned()
        }
        fn get_string(&self, key: &str) -> Option<String> {
            self.s.get(key).cloned()
        }
        fn has_tensor(&self, name: &str) -> bool {
            self.tensors.iter().any(|t| t == name)
        }
    }

    impl MapMetadata {
        /// Adds `blk.{il}.{token}.weight` for each token.
        pub fn layer_tensors(&mut self, il: usize, tokens: &[&str]) {
            for t in tokens {
                self.tensors.push(format!("blk.{il}.{t}.weight"));
            }
        }
    }

    pub const ATTENTION: [&str; 4] = ["attn_q", "attn_k", "attn_v", "attn_output"];
    pub const DELTA_NET: [&str; 5] = ["attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"];
    pub const MOE_SHARED: [&str; 8] = [
        "ffn_gate_inp",
        "ffn_gate_exps",
        "ffn_up_exps",
        "ffn_down_exps",
        "ffn_gate_inp_shexp",
        "ffn_gate_shexp",
        "ffn_up_shexp",
        "ffn_down_shexp",
    ];
    pub const DENSE: [&str; 3] = ["ffn_gate", "ffn_up", "ffn_down"];

    /// A qwen35moe of `layers` layers, every fourth full attention (as llama.cpp's default
    /// interval puts them), with the tensors such a file holds.
    pub fn qwen35moe_md(layers: u64) -> MapMetadata {
        let full: Vec<bool> = (0..layers).map(|il| (il + 1) % 4 == 0).collect();
        qwen35moe_md_with(&full)
    }

    /// A qwen35moe whose layer `il` is full attention where `full[il]`, delta-net elsewhere.
    pub fn qwen35moe_md_with(full: &[bool]) -> MapMetadata {
        let layers = full.len() as u64;
        let mut md = MapMetadata::default();
        md.s.insert("general.architecture".into(), "qwen35moe".into());
        for (k, v) in [
            ("block_count", layers),
            ("expert_count", 256),
            ("expert_used_count", 8),
            ("embedding_length", 2048),
            ("attention.head_count", 16),
            ("attention.head_count_kv", 2),
            ("vocab_size", 248_320),
        ] {
            md.u.insert(format!("qwen35moe.{k}"), v);
        }
        for (il, &f) in full.iter().enumerate() {
            if f {
                md.layer_tensors(il, &ATTENTION);
            } else {
                md.layer_tensors(il, &DELTA_NET);
            }
            md.layer_tensors(il, &MOE_SHARED);
        }
        md
    }

    /// A dense model of `arch` with `layers` attention layers.
    pub fn dense_md(arch: &str, layers: u64) -> MapMetadata {
        let mut md = MapMetadata::default();
        md.s.insert("general.architecture".into(), arch.into());
        for (k, v) in [
            ("block_count", layers),
            ("embedding_length", 640),
            ("attention.head_count", 4),
            ("attention.head_count_kv", 1),
            ("vocab_size", 262_144),
        ] {
            md.u.insert(format!("{arch}.{k}"), v);
        }
        for il in 0..layers as usize {
            md.layer_tensors(il, &ATTENTION);
            md.layer_tensors(il, &DENSE);
        }
        md
    }

    #[test]
    fn qwen35moe_every_fourth_layer_is_full_attention() {
        let info = ArchInfo::from_metadata(&qwen35moe_md(40)).unwrap();
        assert_eq!(info.layers_of(LayerKind::FullAttention), 10);
        assert_eq!(info.layers_of(LayerKind::LinearAttention), 30);
        assert_eq!(info.kind_of(3), Some(LayerKind::FullAttention));
        assert_eq!(info.kind_of(0), Some(LayerKind::LinearAttention));
        assert_eq!(info.layer(0).unwrap().mixer, Mixer::DeltaNet);
        assert!(info.shared_expert && !info.fused_gate_up);
        assert_eq!(info.moe_layers(), 40);
        assert_eq!(
            info.layer_summary().split(", ").next(),
            Some("0-2 linear_attention/delta-net + moe+shared")
        );
    }

    #[test]
    fn gemma3_slides_five_layers_of_six_by_default() {
        // gemma3.cpp: load_swa_pattern(ml, 6) when sliding_window > 0; set_swa_pattern makes
        // layer il slide when il % 6 < 5, so of 18 layers 5, 11 and 17 attend to everything.
        let mut md = dense_md("gemma3", 18);
        md.u.insert("gemma3.attention.sliding_window".into(), 512);
        let info = ArchInfo::from_metadata(&md).unwrap();
        let full: Vec<u32> = (0..18)
            .filter(|&il| info.kind_of(il) == Some(LayerKind::FullAttention))
            .collect();
        assert_eq!(full, vec![5, 11, 17]);
        assert_eq!(info.layers_of(LayerKind::SlidingWindow), 15);
        assert_eq!(info.layer(0).unwrap().window, Some(512));
        assert_eq!(info.layer(5).unwrap().window, None);
        assert_eq!(info.sliding_window(), Some(512));
        assert_eq!(info.attention_layers(), 18);
        // without the key gemma3 does not slide at all
        md.u.remove("gemma3.attention.sliding_window");
        let info = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(info.layers_of(LayerKind::SlidingWindow), 0);
    }

    #[test]
    fn a_pattern_array_wins_and_is_checked() {
        let mut md = dense_md("gemma3", 4);
        md.u.insert("gemma3.attention.sliding_window".into(), 1024);
        md.a.insert(
            "gemma3.attention.sliding_window_pattern".into(),
            vec![0, 1, 1, 0],
        );
        let info = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(
            info.layer_kinds(),
            vec![
                LayerKind::FullAttention,
                LayerKind::SlidingWindow,
                LayerKind::SlidingWindow,
                LayerKind::FullAttention
            ]
        );
        md.a.insert("gemma3.attention.sliding_window_pattern".into(), vec![1]);
        let err = ArchInfo::from_metadata(&md).unwrap_err();
        assert!(err.to_string().contains("1 entries for 4 layers"), "{err}");
    }

    #[test]
    fn gemma2_and_gpt_oss_slide_every_other_layer_and_dense_first_rules_hold() {
        // gemma2: pattern 2, window 4096 when the key is absent
        let info = ArchInfo::from_metadata(&dense_md("gemma2", 4)).unwrap();
        assert_eq!(
            info.layer_kinds(),
            vec![
                LayerKind::SlidingWindow,
                LayerKind::FullAttention,
                LayerKind::SlidingWindow,
                LayerKind::FullAttention
            ]
        );
        assert_eq!(info.sliding_window(), Some(4096));
        // gpt-oss requires the key
        let err = ArchInfo::from_metadata(&dense_md("gpt-oss", 4)).unwrap_err();
        assert_eq!(
            err,
            ArchError::MissingKey("gpt-oss.attention.sliding_window".into())
        );
        // cohere2moe: pattern 4, dense first: layer il slides when il % 4 != 0
        let mut md = dense_md("cohere2moe", 5);
        md.u.insert("cohere2moe.attention.sliding_window".into(), 4096);
        let info = ArchInfo::from_metadata(&md).unwrap();
        let sliding: Vec<u32> = (0..5)
            .filter(|&il| info.kind_of(il) == Some(LayerKind::SlidingWindow))
            .collect();
        assert_eq!(sliding, vec![1, 2, 3]);
        // llama4: chunked attention of 8192 tokens whatever the key says, unless it is 0
        let mut md = dense_md("llama4", 4);
        md.u.insert("llama4.attention.sliding_window".into(), 100);
        let info = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(info.sliding_window(), Some(8192));
        md.u.insert("llama4.attention.sliding_window".into(), 0);
        assert_eq!(ArchInfo::from_metadata(&md).unwrap().sliding_window(), None);
    }

    #[test]
    fn hybrid_layers_follow_their_tensors() {
        // a Nemotron-H-like stack: mamba2, attention, FFN-only layers
        let mut md = MapMetadata::default();
        md.s.insert("general.architecture".into(), "nemotron_h".into());
        md.u.insert("nemotron_h.block_count".into(), 3);
        md.u.insert("nemotron_h.embedding_length".into(), 256);
        md.layer_tensors(0, &["ssm_in", "ssm_out"]);
        md.tensors.push("blk.0.ssm_a".into());
        md.layer_tensors(1, &ATTENTION);
        md.layer_tensors(2, &["ffn_up", "ffn_down"]);
        let info = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(
            info.layers
                .iter()
                .map(|l| (l.kind, l.mixer, l.ffn))
                .collect::<Vec<_>>(),
            vec![
                (LayerKind::LinearAttention, Mixer::Mamba2, FfnKind::None),
                (LayerKind::FullAttention, Mixer::Attention, FfnKind::None),
                (LayerKind::FeedForward, Mixer::None, FfnKind::Dense),
            ]
        );
    }

    #[test]
    fn leading_dense_layers_and_mla_are_seen() {
        let mut md = MapMetadata::default();
        md.s.insert("general.architecture".into(), "deepseek2".into());
        md.u.insert("deepseek2.block_count".into(), 3);
        md.u.insert("deepseek2.embedding_length".into(), 256);
        md.u.insert("deepseek2.expert_count".into(), 8);
        for il in 0..3 {
            md.layer_tensors(il, &["attn_q_a", "attn_kv_a_mqa", "attn_output"]);
        }
        md.layer_tensors(0, &DENSE);
        md.layer_tensors(1, &MOE_SHARED);
        md.layer_tensors(2, &MOE_SHARED);
        let info = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(info.layer(0).unwrap().ffn, FfnKind::Dense);
        assert_eq!(info.moe_layers(), 2);
        assert!(info.layers.iter().all(|l| l.mixer == Mixer::Mla));
        assert!(info.shared_expert);
        assert_eq!(
            info.layer_summary(),
            "0 full_attention/mla + dense, 1-2 full_attention/mla + moe+shared"
        );
    }

    #[test]
    fn missing_key_is_named() {
        let mut md = qwen35moe_md(4);
        md.u.remove("qwen35moe.block_count");
        assert_eq!(
            ArchInfo::from_metadata(&md).unwrap_err(),
            ArchError::MissingKey("qwen35moe.block_count".into())
        );
    }
}
