//! The hyperparameter checks every architecture gets: what llama.cpp's shared `load_hparams`
//! (src/llama-model.cpp), its loader's typed getters (src/llama-model-loader.cpp), the vocabulary
//! loader (src/llama-vocab.cpp), the sliding-window memory and the graphs' head asserts require,
//! so that a file llama.cpp would abort on is refused here with the key and the reason.

use std::collections::HashSet;

use super::Keys;
use crate::error::GgufError;
use crate::llama_archs::{HYBRID_ARCHS, RECURRENT_ARCHS};
use crate::value::{Array, Value};

/// llama.cpp's `LLAMA_MAX_LAYERS`.
const MAX_LAYERS: u32 = 512;
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
const MAX_EXPERTS: u32 = 1024;
/// The values `llama_rope_scaling_type_from_string` knows; any other aborts in `load_hparams`.
const ROPE_SCALING_TYPES: [&str; 4] = ["none", "linear", "yarn", "longrope"];
/// The `tokenizer.ggml.model` names `llama_vocab::impl::load` knows; any other throws.
#[rustfmt::skip]
const TOKENIZER_MODELS: [&str; 12] = [
    "none", "no_vocab", "llama", "bert", "gpt2", "hybriddna", "whitespace", "t5", "rwkv", "plamo2",
    "gemma4", "test",
];

/// Graphs with `GGML_ASSERT(n_embd_head == hparams.n_embd_head_k())` where `n_embd_head` is
/// the value head size (or the reverse): `attention.value_length` must equal
/// `attention.key_length`, or llama.cpp aborts when it creates a context. From the graph
/// builders in src/models/*.cpp (e.g. llama.cpp:102, qwen2.cpp:56, phi3.cpp:71,
/// nemotron-h.cpp:191, qwen3next.cpp:242), by architecture name.
#[rustfmt::skip]
const VALUE_EQUALS_KEY: [&str; 112] = [
    "afmoe", "apertus", "arcee", "arctic", "baichuan", "bailingmoe2", "bert", "bitnet", "bloom",
    "chameleon", "chatglm", "clef", "codeshell", "cogvlm", "cohere2", "cohere2moe", "command-r",
    "dbrx", "deci", "deepseek", "dots1", "dream", "eagle3", "ernie4_5", "ernie4_5-moe", "eurobert",
    "exaone", "exaone-moe", "exaone4", "falcon", "glm4", "glm4moe", "gpt2", "gptneox", "granite",
    "granite_swa", "granitehybrid", "granitemoe", "graniteswitch", "grok", "grovemoe",
    "hunyuan-dense", "hunyuan-moe", "hunyuan_vl", "hy_v3", "internlm2", "jais", "jais2",
    "jina-bert-v2", "jina-bert-v3", "laguna", "llada", "llada-moe", "llama", "llama-embed",
    "llama4", "maincoder", "maple", "mellum", "minicpm", "minimax-01", "minimax-m2", "minimax-m3",
    "mistral3", "modern-bert", "mpt", "muse-glimmer", "nanbeige", "nemotron", "nemotron_h",
    "nemotron_h_moe", "neo-bert", "nomic-bert", "nomic-bert-moe", "olmo", "olmo2", "olmoe",
    "openelm", "orion", "paddleocr", "pangu-embedded", "phi2", "phi3", "phimoe", "plamo",
    "pockettts", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen35", "qwen35moe", "qwen3moe",
    "qwen3next", "qwen3tts", "qwen3vl", "qwen3vlmoe", "qwen4exp", "refact", "rnd1", "seed_oss",
    "smallthinker", "smollm3", "spark2_5", "stablelm", "starcoder", "starcoder2", "t5", "t5encoder",
    "talkie", "xverse",
];

/// Graphs that also assert `GGML_ASSERT(n_embd_head == n_rot)`: `rope.dimension_count` must
/// equal the head size (e.g. llama.cpp:103, qwen2.cpp:57, qwen3moe.cpp:66, olmoe.cpp:57).
#[rustfmt::skip]
const ROPE_EQUALS_HEAD: [&str; 63] = [
    "apertus", "arcee", "arctic", "baichuan", "chameleon", "codeshell", "cogvlm", "cohere2moe",
    "dbrx", "deci", "deepseek", "dots1", "dream", "ernie4_5", "ernie4_5-moe", "exaone",
    "exaone-moe", "exaone4", "falcon", "granite", "granite_swa", "granitemoe", "graniteswitch",
    "grok", "grovemoe", "hunyuan-dense", "hunyuan-moe", "hunyuan_vl", "hy_v3", "internlm2", "jais2",
    "llada", "llada-moe", "llama", "llama-embed", "llama4", "maincoder", "mellum", "minicpm",
    "mistral3", "olmo", "olmo2", "olmoe", "orion", "paddleocr", "pangu-embedded", "plamo",
    "pockettts", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3tts", "qwen3vl",
    "qwen3vlmoe", "rnd1", "seed_oss", "smallthinker", "smollm3", "starcoder2", "talkie", "xverse",
];

/// `load_hparams` throws "invalid n_rot" unless `rope.dimension_count` equals the key length.
const ROPE_CHECKED_AT_LOAD: [&str; 4] = ["llama", "deci", "falcon", "llama-embed"];

/// When an architecture's layers slide (`swa_type` set in its `load_arch_hparams`).
#[derive(Clone, Copy)]
enum SwaWhen {
    Always,
    /// `attention.sliding_window` present and above 0.
    WindowAboveZero,
    /// llama4: unless `attention.sliding_window` is present and 0.
    UnlessWindowZero,
    /// exaone4: with 64 layers only.
    With64Layers,
}

/// The architectures whose sliding-window pattern comes from `load_swa_pattern(ml, n_pattern,
/// dense_first)` and whose memory is a plain KV cache: without a sliding layer they abort at
/// `GGML_ASSERT(hparams.is_swa_any())` (src/llama-model.cpp:2823) when a context is created.
/// (arch, default pattern, dense first, when), from src/models/<arch>.cpp.
const SWA_ARCHS: [(&str, u32, bool, SwaWhen); 16] = [
    ("gemma2", 2, false, SwaWhen::Always),
    ("gemma3", 6, false, SwaWhen::WindowAboveZero),
    ("gemma3n", 5, false, SwaWhen::Always),
    ("gpt-oss", 2, false, SwaWhen::Always),
    ("cohere2", 4, false, SwaWhen::Always),
    ("cohere2moe", 4, true, SwaWhen::Always),
    ("exaone-moe", 4, false, SwaWhen::Always),
    ("exaone4", 4, false, SwaWhen::With64Layers),
    ("muse-glimmer", 4, false, SwaWhen::Always),
    ("afmoe", 4, false, SwaWhen::WindowAboveZero),
    ("laguna", 4, true, SwaWhen::WindowAboveZero),
    ("mellum", 4, false, SwaWhen::WindowAboveZero),
    ("olmo2", 4, false, SwaWhen::WindowAboveZero),
    ("plamo3", 8, false, SwaWhen::WindowAboveZero),
    ("smallthinker", 4, true, SwaWhen::WindowAboveZero),
    ("llama4", 4, false, SwaWhen::UnlessWindowZero),
];

/// Head sizes as `load_hparams` sets them (read only when layer 0 has heads).
#[derive(Debug, Clone, Copy)]
pub(super) struct Heads {
    pub key_length: u32,
    pub value_length: u32,
    pub n_rot: u32,
    pub key_length_swa: u32,
    pub value_length_swa: u32,
    pub n_rot_swa: u32,
}

/// The shared hyperparameters, as llama.cpp reads them, for the per-architecture checks.
#[derive(Debug, Clone)]
pub(super) struct Generic {
    /// `block_count`.
    pub n_layer_all: u32,
    /// `block_count - nextn_predict_layers`: the layers of the model proper.
    pub n_layer: u32,
    pub n_embd: u32,
    pub n_expert: u32,
    /// Per layer (all `block_count` of them).
    pub expert_used: Vec<u32>,
    pub n_ff: Vec<u32>,
    pub n_head: Vec<u32>,
    pub n_head_kv: Vec<u32>,
    /// `expert_feed_forward_length` per layer, 0 where absent.
    pub n_ff_exp: Vec<u32>,
    /// `None` when layer 0 has no heads (llama.cpp then reads no head size).
    pub heads: Option<Heads>,
    /// Which layers slide, for the architectures of [`SWA_ARCHS`] and those with a pattern array.
    pub swa: Option<Vec<bool>>,
}

impl Generic {
    /// Layer 0's (key, value, rope) sizes: the sliding-window ones when layer 0 slides, as
    /// `n_embd_head_k()`, `n_embd_head_v()` and `n_rot()` give them to the graphs.
    pub fn layer0_heads(&self) -> Option<(u32, u32, u32, bool)> {
        let h = self.heads?;
        let slides = self
            .swa
            .as_ref()
            .and_then(|s| s.first().copied())
            .unwrap_or(false);
        Some(if slides {
            (h.key_length_swa, h.value_length_swa, h.n_rot_swa, true)
        } else {
            (h.key_length, h.value_length, h.n_rot, false)
        })
    }
}

/// Every check of this module, in llama.cpp's order where an order shows (hyperparameters,
/// then vocabulary); the first failure is the error.
pub(super) fn check(keys: &Keys, arch: &str) -> Result<Generic, GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");

    // The loader: general.file_type (u32), split.count (u16).
    keys.scalar_u32("general.file_type")?;
    match keys.file.get("split.count") {
        None | Some(Value::U16(_)) => {}
        Some(other) => return Err(keys.wrong_type("split.count", "u16", other)),
    }
    keys.opt_string("general.name")?;
    // llama_vocab::impl::load: the tokenizer model is required (read after the
    // hyperparameters; checked first because nothing runs without it).
    let tokenizer = keys.string("tokenizer.ggml.model", "llama.cpp's vocabulary loader")?;

    keys.scalar_u32(&k("context_length"))?
        .ok_or_else(|| keys.missing(&k("context_length"), &by))?;
    let n_embd = keys
        .scalar_u32(&k("embedding_length"))?
        .ok_or_else(|| keys.missing(&k("embedding_length"), &by))?;
    if n_embd == 0 {
        return Err(keys.bad(
            &k("embedding_length"),
            "is 0; a model of width 0 has nothing to compute (llama.cpp would divide the \
             width by the head count and build empty tensors)"
                .into(),
        ));
    }
    keys.scalar_u32(&k("embedding_length_out"))?;
    keys.scalar_bool(&k("attention.causal"))?;
    keys.scalar_u32(&k("pooling_type"))?;
    keys.scalar_u32(&k("classifier.pooling_type"))?;

    let n_layer_all = keys
        .scalar_u32(&k("block_count"))?
        .ok_or_else(|| keys.missing(&k("block_count"), &by))?;
    if n_layer_all == 0 || n_layer_all > MAX_LAYERS {
        return Err(keys.bad(
            &k("block_count"),
            format!(
                "{n_layer_all} layers; llama.cpp takes 1 to {MAX_LAYERS} and aborts otherwise \
                 (GGML_ASSERT in load_hparams)"
            ),
        ));
    }
    let nextn = keys.scalar_u32(&k("nextn_predict_layers"))?.unwrap_or(0);
    if nextn > n_layer_all {
        return Err(keys.bad(
            &k("nextn_predict_layers"),
            format!(
                "{nextn} prediction layers in a model of {n_layer_all} layers (block_count); \
                 llama.cpp asserts at most block_count and aborts"
            ),
        ));
    }
    let n_layer = n_layer_all - nextn;

    let (n_expert, expert_used) = check_experts_and_groups(keys, arch, n_layer_all)?;
    if arch == "wavtokenizer-dec" {
        check_wavtokenizer(keys, arch, n_layer_all)?;
    }
    let n = n_layer_all as usize;
    let n_ff = keys
        .per_layer(&k("feed_forward_length"), n_layer_all)?
        .unwrap_or_else(|| vec![0; n]);
    let n_head = keys
        .per_layer(&k("attention.head_count"), n_layer_all)?
        .unwrap_or_else(|| vec![0; n]);
    // head_count_kv defaults to head_count.
    let n_head_kv = keys
        .per_layer(&k("attention.head_count_kv"), n_layer_all)?
        .unwrap_or_else(|| n_head.clone());
    check_rope(keys, arch)?;
    let heads = read_heads(keys, arch, n_embd, n_head[0])?;
    // Classifier labels: an array of strings when present as an array.
    let labels = k("classifier.output_labels");
    if let Some(v @ Value::Array(a)) = keys.file.get(&labels) {
        if !matches!(a, Array::String(_)) {
            return Err(keys.wrong_type(&labels, "array of str", v));
        }
    }
    // Per-layer arrays the architectures read with get_key_or_arr.
    let n_ff_exp = keys
        .per_layer(&k("expert_feed_forward_length"), n_layer_all)?
        .unwrap_or_else(|| vec![0; n]);
    keys.per_layer(&k("attention.recurrent_layers"), n_layer_all)?;
    let mut g = Generic {
        n_layer_all,
        n_layer,
        n_embd,
        n_expert,
        expert_used,
        n_ff,
        n_head,
        n_head_kv,
        n_ff_exp,
        heads,
        swa: None,
    };
    check_attention(keys, arch, &g)?;
    g.swa = swa_layers(keys, arch, &g)?;
    check_head_sizes(keys, arch, &g)?;
    check_vocab(keys, arch, tokenizer)?;
    Ok(g)
}

/// Experts and expert groups: the GGML_ASSERTs of `load_hparams` (src/llama-model.cpp:1363-1376).
/// Returns the expert count and the experts used per layer.
fn check_experts_and_groups(
    keys: &Keys,
    arch: &str,
    n_layer_all: u32,
) -> Result<(u32, Vec<u32>), GgufError> {
    let k = |name: &str| format!("{arch}.{name}");
    let mut n_expert = keys.scalar_u32(&k("expert_count"))?.unwrap_or(0);
    let mut used = keys
        .per_layer(&k("expert_used_count"), n_layer_all)?
        .unwrap_or_else(|| vec![0; n_layer_all as usize]);
    let groups = keys.scalar_u32(&k("expert_group_count"))?.unwrap_or(0);
    let group_used = keys.scalar_u32(&k("expert_group_used_count"))?.unwrap_or(0);
    if (arch == "hunyuan_vl" || arch == "hunyuan-dense") && n_expert <= 1 {
        // load_hparams: these treat one expert as none.
        n_expert = 0;
        used.fill(0);
    }
    let used_max = used.iter().copied().max().unwrap_or(0);
    let abort = " (llama.cpp asserts it in load_hparams and aborts)";
    if n_expert > MAX_EXPERTS {
        return Err(keys.bad(
            &k("expert_count"),
            format!("{n_expert} experts; llama.cpp takes at most {MAX_EXPERTS}{abort}"),
        ));
    }
    if used_max > n_expert {
        return Err(keys.bad(
            &k("expert_used_count"),
            format!("{used_max} is more than the expert count {n_expert}{abort}"),
        ));
    }
    if n_expert > 0 {
        if used_max == 0 {
            return Err(keys.bad(
                &k("expert_used_count"),
                format!(
                    "is 0 (or missing) with {n_expert} experts; llama.cpp needs it above \
                     0{abort}"
                ),
            ));
        }
        if groups >= n_expert {
            return Err(keys.bad(
                &k("expert_group_count"),
                format!("{groups} groups for {n_expert} experts; it must be fewer{abort}"),
            ));
        }
        if groups > 1 {
            if n_expert % groups != 0 {
                return Err(keys.bad(
                    &k("expert_group_count"),
                    format!("{groups} groups do not divide the {n_expert} experts{abort}"),
                ));
            }
            if group_used == 0 || group_used >= groups {
                return Err(keys.bad(
                    &k("expert_group_used_count"),
                    format!(
                        "{group_used} with {groups} groups; it must be 1 to {}{abort}",
                        groups - 1
                    ),
                ));
            }
        }
    } else if groups != 0 {
        return Err(keys.bad(
            &k("expert_group_count"),
            format!("{groups} expert groups in a model without experts{abort}"),
        ));
    }
    Ok((n_expert, used))
}

/// wavtokenizer-dec's extra keys in `load_hparams` and their asserts.
fn check_wavtokenizer(keys: &Keys, arch: &str, n_layer_all: u32) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");
    for key in [
        "features_length",
        "posnet.embedding_length",
        "convnext.embedding_length",
    ] {
        keys.scalar_u32(&k(key))?
            .ok_or_else(|| keys.missing(&k(key), &by))?;
    }
    for key in ["posnet.block_count", "convnext.block_count"] {
        let v = keys
            .scalar_u32(&k(key))?
            .ok_or_else(|| keys.missing(&k(key), &by))?;
        if v > n_layer_all {
            return Err(keys.bad(
                &k(key),
                format!(
                    "{v} is more than block_count {n_layer_all}; llama.cpp asserts it is not and \
                     aborts"
                ),
            ));
        }
    }
    Ok(())
}

/// The rope keys of `load_hparams`: types, and a scaling type llama.cpp knows.
fn check_rope(keys: &Keys, arch: &str) -> Result<(), GgufError> {
    let k = |name: &str| format!("{arch}.{name}");
    keys.scalar_bool(&k("rope.scaling.finetuned"))?;
    keys.scalar_u32(&k("rope.scaling.original_context_length"))?;
    keys.opt_f32(&k("rope.freq_base"))?;
    if let Some(scaling) = keys.opt_string(&k("rope.scaling.type"))? {
        if !ROPE_SCALING_TYPES.contains(&scaling) {
            return Err(keys.bad(
                &k("rope.scaling.type"),
                format!(
                    "'{scaling}' is not a rope scaling llama.cpp knows ({}); it asserts a known \
                     one in load_hparams and aborts",
                    ROPE_SCALING_TYPES.join(", ")
                ),
            ));
        }
    }
    if keys.opt_f32(&k("rope.scaling.factor"))?.is_none() {
        keys.opt_f32(&k("rope.scale_linear"))?;
    }
    keys.opt_f32(&k("rope.scaling.attn_factor"))?;
    keys.opt_f32(&k("rope.scaling.alpha"))?;
    Ok(())
}

/// Head sizes, read as `load_hparams` reads them: only when layer 0 has heads, defaults
/// `embedding_length / head_count[0]`.
fn read_heads(
    keys: &Keys,
    arch: &str,
    n_embd: u32,
    n_head0: u32,
) -> Result<Option<Heads>, GgufError> {
    let k = |name: &str| format!("{arch}.{name}");
    let swa = |key: &str, full: u32| -> Result<u32, GgufError> {
        Ok(keys.scalar_u32(&k(key))?.unwrap_or(full))
    };
    if n_head0 == 0 {
        // Not read by llama.cpp, but typed when present all the same (get_key for the
        // sliding-window ones runs either way).
        for key in [
            "attention.key_length_swa",
            "attention.value_length_swa",
            "rope.dimension_count_swa",
        ] {
            keys.scalar_u32(&k(key))?;
        }
        return Ok(None);
    }
    let default = n_embd / n_head0;
    let key_length = swa("attention.key_length", default)?;
    let value_length = swa("attention.value_length", default)?;
    let n_rot = swa("rope.dimension_count", key_length)?;
    if ROPE_CHECKED_AT_LOAD.contains(&arch) && n_rot != key_length {
        return Err(keys.bad(
            &k("rope.dimension_count"),
            format!(
                "{n_rot}; llama.cpp's {arch} needs it equal to the head dim {key_length} (it \
                 refuses the file: 'invalid n_rot')"
            ),
        ));
    }
    Ok(Some(Heads {
        key_length,
        value_length,
        n_rot,
        key_length_swa: swa("attention.key_length_swa", key_length)?,
        value_length_swa: swa("attention.value_length_swa", value_length)?,
        n_rot_swa: swa("rope.dimension_count_swa", n_rot)?,
    }))
}

/// Heads where attention needs them: layer 0's head count above 0 (llama.cpp divides the width
/// by it; with 0 it reads no head size and builds empty attention), and the key heads dividing
/// the query heads in every layer.
fn check_attention(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let k = |name: &str| format!("{arch}.{name}");
    let attention_free_allowed = RECURRENT_ARCHS.contains(&arch)
        || HYBRID_ARCHS.contains(&arch)
        || arch == "wavtokenizer-dec";
    if !attention_free_allowed && g.n_head[0] == 0 {
        let key = k("attention.head_count");
        if keys.file.get(&key).is_none() {
            return Err(keys.missing(
                &key,
                &format!(
                    "llama.cpp's {arch} (an attention model: without heads its head size is 0)"
                ),
            ));
        }
        return Err(keys.bad(
            &key,
            format!(
                "is 0 at layer 0; llama.cpp's {arch} attends, and without heads it takes a head \
                 size of 0 (gemma2 and gemma3 at their 27B depths, olmo2 and phimoe divide by the \
                 head count: a crash while loading)"
            ),
        ));
    }
    let scalar =
        g.n_head.windows(2).all(|w| w[0] == w[1]) && g.n_head_kv.windows(2).all(|w| w[0] == w[1]);
    for (il, (&h, &kv)) in g.n_head.iter().zip(&g.n_head_kv).enumerate() {
        if kv > 0 && h % kv != 0 {
            let at = if scalar {
                String::new()
            } else {
                format!(" at layer {il}")
            };
            return Err(keys.bad(
                &k("attention.head_count_kv"),
                format!(
                    "{kv} does not divide the head count {h}{at}; llama.cpp shares each key \
                     head among a whole number of query heads and aborts otherwise (ggml_mul_mat)"
                ),
            ));
        }
    }
    Ok(())
}

/// Which layers slide, for the architectures of [`SWA_ARCHS`] (an error when none does) and
/// for any other with a `sliding_window_pattern` array.
fn swa_layers(keys: &Keys, arch: &str, g: &Generic) -> Result<Option<Vec<bool>>, GgufError> {
    let k = |name: &str| format!("{arch}.{name}");
    let pattern_key = k("attention.sliding_window_pattern");
    let n_all = g.n_layer_all as usize;
    let array = match keys.file.get(&pattern_key) {
        Some(Value::Array(a)) => {
            let flags: Vec<bool> = match a {
                Array::Bool(v) => v.clone(),
                Array::U32(v) => v.iter().map(|&x| x != 0).collect(),
                Array::I32(v) => v.iter().map(|&x| x != 0).collect(),
                other => {
                    return Err(keys.wrong_type(
                        &pattern_key,
                        "array of i32, u32 or bool",
                        &Value::Array(other.clone()),
                    ))
                }
            };
            if flags.len() > MAX_LAYERS as usize {
                return Err(keys.bad(
                    &pattern_key,
                    format!(
                        "{} entries; llama.cpp reads at most {MAX_LAYERS}",
                        flags.len()
                    ),
                ));
            }
            // get_arr copies the array over a zero-filled one of LLAMA_MAX_LAYERS entries.
            let mut layers = vec![false; n_all];
            for (l, f) in layers.iter_mut().zip(flags) {
                *l = f;
            }
            Some(layers)
        }
        _ => None,
    };
    let Some(&(_, n_pattern, dense_first, when)) = SWA_ARCHS.iter().find(|r| r.0 == arch) else {
        return Ok(array);
    };
    let window = keys.scalar_u32(&k("attention.sliding_window"))?;
    let slides = match when {
        SwaWhen::Always => true,
        SwaWhen::WindowAboveZero => window.unwrap_or(0) > 0,
        SwaWhen::UnlessWindowZero => window != Some(0),
        SwaWhen::With64Layers => g.n_layer == 64,
    };
    if !slides {
        return Ok(None);
    }
    let (layers, described) = match array {
        Some(layers) => (layers, "the array".to_string()),
        None => {
            let p = match keys.scalar_u32(&pattern_key)? {
                Some(p) => p,
                None => n_pattern,
            };
            // llama_hparams::set_swa_pattern over the model's layers (not the nextn ones).
            let layers: Vec<bool> = (0..g.n_layer_all)
                .map(|il| {
                    il < g.n_layer
                        && (p == 0
                            || if dense_first {
                                il % p != 0
                            } else {
                                il % p < p - 1
                            })
                })
                .collect();
            let source = if keys.file.get(&pattern_key).is_some() {
                format!("{p}")
            } else {
                format!("{p} (llama.cpp's default for {arch}, the key being absent)")
            };
            (layers, source)
        }
    };
    if !layers.iter().any(|&s| s) {
        return Err(keys.bad(
            &pattern_key,
            format!(
                "{described} leaves none of the {} layers with a sliding window; llama.cpp's \
                 {arch} uses sliding-window attention and aborts when it creates a context \
                 (GGML_ASSERT(hparams.is_swa_any()), src/llama-model.cpp)",
                g.n_layer
            ),
        ));
    }
    Ok(Some(layers))
}

/// The graphs' head asserts: value length equal to key length, rope dims equal to the head
/// size, for the architectures whose graph asserts them (layer 0's sizes, as the graphs read).
fn check_head_sizes(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let Some((hk, hv, rot, slides)) = g.layer0_heads() else {
        return Ok(());
    };
    let k = |name: &str| {
        let swa = if slides && keys.file.get(&format!("{arch}.{name}_swa")).is_some() {
            "_swa"
        } else {
            ""
        };
        format!("{arch}.{name}{swa}")
    };
    if VALUE_EQUALS_KEY.contains(&arch) && hv != hk {
        return Err(keys.bad(
            &k("attention.value_length"),
            format!(
                "{hv} differs from the key length {hk}; llama.cpp's {arch} graph asserts they \
                 are equal and aborts when it creates a context"
            ),
        ));
    }
    if ROPE_EQUALS_HEAD.contains(&arch) && rot != hk {
        return Err(keys.bad(
            &k("rope.dimension_count"),
            format!(
                "{rot}; llama.cpp's {arch} needs it equal to the head dim {hk} (its graph \
                 asserts it and aborts when it creates a context)"
            ),
        ));
    }
    Ok(())
}

/// `llama_vocab::impl::load`: a tokenizer it knows, and its arrays of the types and lengths
/// it requires; duplicate tokens abort it (`GGML_ASSERT(id_to_token.size() ==
/// token_to_id.size())`).
fn check_vocab(keys: &Keys, arch: &str, tokenizer: &str) -> Result<(), GgufError> {
    let model_key = "tokenizer.ggml.model";
    if !TOKENIZER_MODELS.contains(&tokenizer) {
        return Err(keys.bad(
            model_key,
            format!(
                "'{tokenizer}' is not a tokenizer llama.cpp knows ({}); it refuses the file",
                TOKENIZER_MODELS.join(", ")
            ),
        ));
    }
    keys.scalar_u32("tokenizer.ggml.token_type_count")?;
    let pre = keys.opt_string("tokenizer.ggml.pre")?;
    if tokenizer == "none" || tokenizer == "no_vocab" {
        // Only the vocabulary size is read: dummy tokens, as many as token_embd has rows.
        let key = format!("{arch}.vocab_size");
        let n = keys.scalar_u32(&key)?.ok_or_else(|| {
            keys.missing(
                &key,
                "a model without tokenizer (tokenizer.ggml.model = none)",
            )
        })?;
        if n == 0 {
            return Err(keys.bad(&key, "is 0; it must be above 0".into()));
        }
        return Ok(());
    }
    if matches!(tokenizer, "gpt2" | "hybriddna" | "whitespace" | "gemma4") {
        let merges = "tokenizer.ggml.merges";
        match keys.file.get(merges) {
            None if tokenizer != "gemma4" && pre == Some("kimi-k2") => {}
            None => {
                return Err(keys.missing(merges, &format!("llama.cpp's '{tokenizer}' tokenizer")))
            }
            Some(Value::Array(Array::String(_))) => {}
            Some(other) => return Err(keys.wrong_type(merges, "array of str", other)),
        }
    }
    let list = "tokenizer.ggml.tokens";
    let tokens = match keys.file.get(list) {
        None => return Err(keys.missing(list, "llama.cpp's vocabulary loader")),
        Some(Value::Array(Array::String(tokens))) => tokens,
        Some(other) => return Err(keys.wrong_type(list, "array of str", other)),
    };
    if tokens.is_empty() {
        return Err(keys.bad(list, "is empty".into()));
    }
    let n = tokens.len();
    let shorter = |key: &str, len: usize| {
        keys.bad(
            key,
            format!(
                "{len} entries for {n} tokens; llama.cpp reads one per token and refuses the file"
            ),
        )
    };
    let scores = "tokenizer.ggml.scores";
    match keys.file.get(scores) {
        None => {}
        Some(Value::Array(a @ (Array::I32(_) | Array::F32(_)))) if a.len() < n => {
            return Err(shorter(scores, a.len()));
        }
        Some(Value::Array(Array::I32(_) | Array::F32(_))) => {}
        Some(other) => return Err(keys.wrong_type(scores, "array of i32 or f32", other)),
    }
    let types = "tokenizer.ggml.token_type";
    match keys.file.get(types) {
        None => {}
        Some(Value::Array(Array::I32(v))) if v.len() < n => {
            return Err(shorter(types, v.len()));
        }
        Some(Value::Array(Array::I32(_))) => {}
        Some(other) => return Err(keys.wrong_type(types, "array of i32", other)),
    }
    let mut seen: HashSet<std::borrow::Cow<str>> = HashSet::with_capacity(n);
    for (i, t) in tokens.iter().enumerate() {
        // llama.cpp renames an empty token to "[EMPTY_<id>]" before indexing it.
        let word: std::borrow::Cow<str> = if t.is_empty() {
            format!("[EMPTY_{i}]").into()
        } else {
            t.as_str().into()
        };
        if !seen.insert(word.clone()) {
            return Err(keys.bad(
                list,
                format!(
                    "token {i} ('{}') appears twice; llama.cpp maps each token text to one id and \
                     aborts on a duplicate (GGML_ASSERT in its vocabulary loader)",
                    word.escape_debug()
                ),
            ));
        }
    }
    for id in [
        "bos",
        "eos",
        "eot",
        "eom",
        "unknown",
        "seperator",
        "padding",
        "mask",
        "fim_pre",
        "fim_suf",
        "fim_mid",
        "fim_pad",
        "fim_rep",
        "fim_sep",
        "prefix",
        "suffix",
        "middle",
    ] {
        keys.scalar_u32(&format!("tokenizer.ggml.{id}_token_id"))?;
    }
    for flag in [
        "add_bos_token",
        "add_eos_token",
        "add_sep_token",
        "add_space_prefix",
        "remove_extra_whitespaces",
    ] {
        keys.scalar_bool(&format!("tokenizer.ggml.{flag}"))?;
    }
    Ok(())
}

#[cfg(test)]
pub(super) mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::*;
    use crate::llama_archs::tests::{arch_table, block, read, vendored_llama_cpp};
    use crate::llama_archs::{llama_support, LlamaSupport};

    /// The file and body of each graph constructor `<class>::graph[<..>]::graph(`, by class.
    pub(crate) fn graph_bodies(root: &std::path::Path) -> BTreeMap<String, String> {
        let dir = root.join("src/models");
        let mut out = BTreeMap::new();
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "cpp"))
            .collect();
        files.sort();
        for path in files {
            let text = std::fs::read_to_string(&path).unwrap();
            for line in text.lines() {
                let Some(class) = line.strip_prefix("llama_model_") else {
                    continue;
                };
                let Some((class, rest)) = class.split_once("::graph") else {
                    continue;
                };
                let rest = rest.split_once('>').map_or(rest, |(_, r)| r);
                if rest.starts_with("::graph(") {
                    let body = block(&text, line, "}");
                    out.entry(format!("llama_model_{class}"))
                        .or_insert_with(|| body.to_string());
                }
            }
        }
        out
    }

    /// Architecture name -> the class `llama_model_mapping` creates for it (its `case` /
    /// `return new` pairs).
    pub(crate) fn model_class_by_arch(root: &std::path::Path) -> BTreeMap<String, String> {
        let table: BTreeMap<String, String> = arch_table(&read(root, "src/llama-arch.cpp"))
            .into_iter()
            .collect();
        let model_cpp = read(root, "src/llama-model.cpp");
        let mapping = block(&model_cpp, "static llama_model * llama_model_mapping(", "}");
        let mut class_of = BTreeMap::new();
        let mut pending = Vec::new();
        for line in mapping.lines().map(str::trim) {
            if let Some(e) = line.strip_prefix("case LLM_ARCH_") {
                pending.push(e.trim_end_matches(':').to_string());
            } else if let Some(c) = line.strip_prefix("return new ") {
                let class: String = c
                    .chars()
                    .take_while(|ch| ch.is_ascii_alphanumeric() || *ch == '_')
                    .collect();
                for e in pending.drain(..) {
                    class_of.insert(table[&e].clone(), class.clone());
                }
            }
        }
        class_of
    }

    /// models.h's model classes: class -> (base class, the class whose graph it uses by
    /// `using graph = X::graph`, whether it declares a graph of its own).
    pub(crate) fn model_structs(
        root: &std::path::Path,
    ) -> BTreeMap<String, (String, Option<String>, bool)> {
        let header = read(root, "src/models/models.h");
        let mut structs = BTreeMap::new();
        for (i, _) in header.match_indices("\nstruct llama_model_") {
            let decl = &header[i + 1..];
            let end = decl.find("\n};").unwrap_or(decl.len());
            let body = &decl[..end];
            let first = body.lines().next().unwrap();
            let name = first["struct ".len()..]
                .split([' ', ':'])
                .next()
                .unwrap()
                .to_string();
            let base = first
                .split("public ")
                .nth(1)
                .map(|b| b.trim_end_matches('{').trim().to_string())
                .unwrap_or_default();
            let alias = body
                .split("using graph = ")
                .nth(1)
                .map(|a| a.split("::graph").next().unwrap().trim().to_string());
            let own = body.contains("struct graph ") || body.contains("struct graph:");
            structs.insert(name, (base, alias, own));
        }
        structs
    }

    /// Architecture name -> the class whose graph it builds: its class, then models.h's
    /// `using graph = X::graph` aliases and base classes without a graph of their own.
    fn graph_class_by_arch(root: &std::path::Path) -> BTreeMap<String, String> {
        let structs = model_structs(root);
        let resolve = |mut c: String| {
            for _ in 0..8 {
                match structs.get(&c) {
                    Some((_, Some(alias), _)) => c = alias.clone(),
                    Some((base, None, false)) if base != "llama_model_base" => c = base.clone(),
                    _ => break,
                }
            }
            c
        };
        model_class_by_arch(root)
            .into_iter()
            .map(|(arch, class)| (arch, resolve(class)))
            .collect()
    }

    /// Whether `body` asserts the value head size equal to the key head size (in either
    /// order), and the head size equal to the rope dims.
    fn head_asserts(body: &str) -> (bool, bool) {
        // Lines with their runs of spaces collapsed.
        let lines: Vec<String> = body
            .lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect();
        let def = lines
            .iter()
            .find_map(|l| l.strip_prefix("const int64_t n_embd_head = hparams."))
            .map(|d| d.trim_end_matches(';').to_string());
        let mut value_key = false;
        let mut rope = false;
        for l in &lines {
            let Some(a) = l.strip_prefix("GGML_ASSERT(n_embd_head == ") else {
                continue;
            };
            let a = a.trim_end_matches(';').trim_end_matches(')');
            match (def.as_deref(), a) {
                (Some("n_embd_head_v()"), "hparams.n_embd_head_k(")
                | (Some("n_embd_head_k()"), "hparams.n_embd_head_v(") => value_key = true,
                (_, "n_rot" | "hparams.n_rot(") => rope = true,
                _ => {}
            }
        }
        (value_key, rope)
    }

    #[test]
    fn head_assert_lists_are_the_graphs_asserts() {
        let root = vendored_llama_cpp();
        let bodies = graph_bodies(&root);
        let class_of = graph_class_by_arch(&root);
        let (mut value_key, mut rope) = (BTreeSet::new(), BTreeSet::new());
        for (arch, class) in &class_of {
            let Some(body) = bodies.get(class) else {
                continue;
            };
            let (v, r) = head_asserts(body);
            if v {
                value_key.insert(arch.as_str());
            }
            if r {
                rope.insert(arch.as_str());
            }
        }
        // Asserted outside the constructor: in qwen3next's build_layer_attn
        // (src/models/qwen3next.cpp:242), qwen4exp's graph as
        // `hparams.n_embd_head_v() == hparams.n_embd_head_k()` (qwen4exp.cpp:404), and
        // eagle3's graph<false> specialisation (eagle3.cpp:155).
        for arch in ["qwen3next", "qwen4exp", "eagle3"] {
            value_key.insert(arch);
        }
        assert_eq!(value_key, VALUE_EQUALS_KEY.into_iter().collect());
        assert_eq!(rope, ROPE_EQUALS_HEAD.into_iter().collect());
    }

    #[test]
    fn sliding_window_archs_are_those_that_load_a_pattern() {
        let root = vendored_llama_cpp();
        let class_of = graph_class_by_arch(&root);
        for (arch, n_pattern, dense_first, _) in SWA_ARCHS {
            let file = class_of[arch]
                .trim_start_matches("llama_model_")
                .replace('_', "-");
            let file = match arch {
                "gpt-oss" => "openai-moe".to_string(),
                _ => file,
            };
            let text = read(&root, &format!("src/models/{file}.cpp"));
            let call = if dense_first {
                format!("load_swa_pattern(ml, {n_pattern}, ")
            } else {
                format!("load_swa_pattern(ml, {n_pattern});")
            };
            assert!(text.contains(&call), "{arch}: no '{call}' in {file}.cpp");
        }
    }

    #[test]
    fn every_listed_name_is_an_architecture_llama_cpp_loads() {
        let lists: [&[&str]; 4] = [
            &VALUE_EQUALS_KEY,
            &ROPE_EQUALS_HEAD,
            &ROPE_CHECKED_AT_LOAD,
            &SWA_ARCHS.map(|s| s.0),
        ];
        for name in lists.into_iter().flatten() {
            assert_eq!(llama_support(name), LlamaSupport::Loads, "{name}");
        }
    }
}
