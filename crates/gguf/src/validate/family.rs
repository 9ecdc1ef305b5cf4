//! The checks of one family of architectures: the values its own `load_arch_hparams`,
//! `load_arch_tensors` and graph (src/models/<arch>.cpp of the linked llama.cpp) assert on or
//! divide by, which the shared loader lets through. Each error names the key and the llama.cpp
//! behaviour it prevents.

use super::generic::Generic;
use super::Keys;
use crate::error::GgufError;

/// The architectures that pass `expert_gating_func` to `build_moe_ffn`, whose switch aborts on
/// a value above 4 (`GGML_ABORT`, src/llama-graph.cpp): those that read the key.
#[rustfmt::skip]
const GATING_READERS: [&str; 24] = [
    "afmoe", "bailingmoe2", "bailingmoe3", "cohere2moe", "deepseek2", "deepseek2-ocr", "deepseek32",
    "dots1", "dots3note", "exaone-moe", "glm-dsa", "glm4moe", "glm5-next", "hy_v3", "hy_v4",
    "kimi-k3", "kimi-linear", "laguna", "lfm2moe", "minimax-m2", "minimax-m3", "mistral4",
    "smallthinker", "step35",
];

/// Of those, the ones that pass 0 (none, the value of a missing key) through unchanged, which
/// the same switch aborts on (the others map 0 to a default gating).
#[rustfmt::skip]
const GATING_REQUIRED: [&str; 13] = [
    "bailingmoe2", "bailingmoe3", "deepseek32", "dots1", "dots3note", "exaone-moe", "hy_v4",
    "kimi-k3", "kimi-linear", "lfm2moe", "minimax-m2", "minimax-m3", "smallthinker",
];

/// Archs whose `load_arch_hparams` requires `attention.layer_norm_rms_epsilon`.
#[rustfmt::skip]
const RMS_EPS_REQUIRED: [&str; 17] = [
    "llama", "qwen2", "qwen2moe", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next", "gemma2",
    "gemma3", "phi3", "deepseek2", "mistral4", "gpt-oss", "olmoe", "granitemoe", "granitehybrid",
];

/// The gated delta-net of qwen3next, qwen35 and qwen35moe, as their `load_arch_hparams` and
/// graphs read it.
#[derive(Debug, Clone)]
pub(super) struct DeltaNet {
    pub conv_kernel: u32,
    pub inner_size: u32,
    pub state_size: u32,
    pub time_step_rank: u32,
    pub group_count: u32,
    /// Which layers are delta-net layers (the others attend).
    pub recurrent: Vec<bool>,
}

/// Every check of `arch`'s family; nothing for an architecture without one.
pub(super) fn check(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");
    if RMS_EPS_REQUIRED.contains(&arch) {
        let key = k("attention.layer_norm_rms_epsilon");
        keys.opt_f32(&key)?.ok_or_else(|| keys.missing(&key, &by))?;
    }
    if GATING_READERS.contains(&arch) {
        check_gating(keys, arch, g)?;
    }
    match arch {
        "qwen2moe" | "qwen3moe" | "olmoe" | "qwen3next" => {
            // "n_expert must be > 0" (load_arch_tensors throws).
            let key = k("expert_count");
            if g.n_expert == 0 {
                return Err(match keys.file.get(&key) {
                    None => keys.missing(&key, &by),
                    Some(_) => keys.bad(&key, format!("is 0; {by} needs experts")),
                });
            }
            if arch != "qwen3next" && g.expert_used[0] == 0 {
                return Err(keys.bad(
                    &k("expert_used_count"),
                    format!("is 0 at layer 0; {by} routes every layer with layer 0's count"),
                ));
            }
            expert_width_divides(keys, arch, g)?;
            if arch == "olmoe" {
                olmoe_heads(keys, g)?;
            }
            if arch == "qwen3next" {
                let net = delta_net(keys, arch, g)?;
                attention_heads(keys, arch, g, &net.recurrent)?;
                rope_fits(keys, arch, g)?;
            }
        }
        "qwen35" | "qwen35moe" => {
            rope_sections(keys, arch)?;
            let net = delta_net(keys, arch, g)?;
            attention_heads(keys, arch, g, &net.recurrent)?;
            rope_fits(keys, arch, g)?;
            if arch == "qwen35moe" {
                // No expert count check in this arch: the width division runs as it is.
                expert_width_divides(keys, arch, g)?;
            }
        }
        "gemma2" | "gemma3" => {
            if arch == "gemma2" {
                window_above_zero(keys, arch, false)?;
            }
            rope_fits(keys, arch, g)?;
        }
        "phi3" | "phimoe" => rope_fits(keys, arch, g)?,
        "deepseek2" | "mistral4" => deepseek2(keys, arch, g)?,
        "gpt-oss" => gpt_oss(keys, arch, g)?,
        "granite" | "granitemoe" => {
            // Required: the logits are divided by it.
            let key = k("logit_scale");
            keys.opt_f32(&key)?.ok_or_else(|| keys.missing(&key, &by))?;
        }
        "nemotron_h" | "nemotron_h_moe" => nemotron_h(keys, arch, g)?,
        "mamba2" | "falcon-h1" => {
            mamba2_rules(keys, arch, true)?;
        }
        "granitehybrid" => {
            let recurrent = g
                .n_head_kv
                .iter()
                .take(g.n_layer as usize)
                .any(|&kv| kv == 0);
            mamba2_rules(keys, arch, recurrent)?;
            inner_is_twice_width(keys, arch, g)?;
        }
        "jamba" => inner_is_twice_width(keys, arch, g)?,
        "rwkv6" | "rwkv7" | "rwkv6qwen2" | "arwkv7" => rwkv(keys, arch, g)?,
        "ernie4_5-moe" => {
            // Required; the graph asserts it above 0 and takes layers modulo it.
            let key = k("interleave_moe_layer_step");
            let step = keys
                .scalar_u32(&key)?
                .ok_or_else(|| keys.missing(&key, &by))?;
            if step == 0 {
                return Err(keys.bad(
                    &key,
                    format!("is 0; {by} graph asserts it above 0 and aborts"),
                ));
            }
        }
        "lfm2" | "lfm2moe" => {
            let key = k("shortconv.l_cache");
            let l_cache = keys
                .scalar_u32(&key)?
                .ok_or_else(|| keys.missing(&key, &by))?;
            // Layers without key heads are convolutions: their graph asserts l_cache > 1.
            let convolves = g
                .n_head_kv
                .iter()
                .take(g.n_layer as usize)
                .any(|&kv| kv == 0);
            if convolves && l_cache <= 1 {
                return Err(keys.bad(
                    &key,
                    format!(
                        "{l_cache}; {by} convolution layers assert it above 1 and abort when a \
                         context is created"
                    ),
                ));
            }
        }
        _ => {}
    }
    Ok(())
}

/// `expert_gating_func`: at most 4 for every reader, and not 0 where it is passed through.
fn check_gating(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let key = format!("{arch}.expert_gating_func");
    let gating = keys.scalar_u32(&key)?.unwrap_or(0);
    if gating > 4 {
        return Err(keys.bad(
            &key,
            format!(
                "{gating} is not a gating llama.cpp knows (1 softmax, 2 sigmoid, 3 softmax on the \
                 weights, 4 sqrt-softplus); its expert router aborts on it (GGML_ABORT in \
                 build_moe_ffn)"
            ),
        ));
    }
    if gating == 0 && g.n_expert > 0 && GATING_REQUIRED.contains(&arch) {
        return Err(keys.bad(
            &key,
            format!(
                "is 0 (or missing); llama.cpp's {arch} passes it to its expert router unchanged, \
                 which aborts on 0 (GGML_ABORT in build_moe_ffn)"
            ),
        ));
    }
    Ok(())
}

/// `n_ff_exp = expert_feed_forward_length ? it : feed_forward_length / expert_used_count`
/// (layer 0's values): a division by zero when both the width and layer 0's count are 0.
fn expert_width_divides(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    if g.n_ff_exp[0] == 0 && g.expert_used[0] == 0 {
        return Err(keys.bad(
            &format!("{arch}.expert_feed_forward_length"),
            format!(
                "is missing (or 0) while expert_used_count is 0 at layer 0; llama.cpp's {arch} \
                 then takes feed_forward_length / expert_used_count as the expert width and \
                 divides by zero"
            ),
        ));
    }
    Ok(())
}

/// olmoe normalises keys with a norm of the full width (`attn_k_norm {n_embd}`): the key
/// projection must be as wide, so every layer has as many key heads as heads.
fn olmoe_heads(keys: &Keys, g: &Generic) -> Result<(), GgufError> {
    for (il, (&h, &kv)) in g.n_head.iter().zip(&g.n_head_kv).enumerate() {
        if kv != h {
            return Err(keys.bad(
                "olmoe.attention.head_count_kv",
                format!(
                    "{kv} at layer {il}, not the head count {h}; llama.cpp's olmoe multiplies \
                     the keys by a norm as wide as all heads, which aborts on a narrower key \
                     (ggml_mul) when a context is created"
                ),
            ));
        }
    }
    Ok(())
}

/// Heads where attention layers are: a head count above 0 in every attention layer of a
/// hybrid.
fn attention_heads(
    keys: &Keys,
    arch: &str,
    g: &Generic,
    recurrent: &[bool],
) -> Result<(), GgufError> {
    let attends = (0..g.n_layer as usize).find(|&il| !recurrent.get(il).copied().unwrap_or(false));
    if let Some(il) = attends {
        if g.n_head[il] == 0 || g.n_head[0] == 0 {
            let key = format!("{arch}.attention.head_count");
            if keys.file.get(&key).is_none() {
                return Err(keys.missing(&key, &format!("llama.cpp's {arch}")));
            }
            return Err(keys.bad(
                &key,
                format!(
                    "is 0 (layer {il} attends); llama.cpp's {arch} takes the head size as \
                     embedding_length / head_count of layer 0 and builds its attention from it"
                ),
            ));
        }
    }
    Ok(())
}

/// The CPU rope kernel asserts `n_dims <= head dim` and `n_dims` even (ggml-cpu/ops.cpp), on
/// the first decode: `rope.dimension_count` (and its sliding-window variant) must fit.
fn rope_fits(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let Some(h) = g.heads else {
        return Ok(());
    };
    for (key, rot, hk) in [
        ("rope.dimension_count", h.n_rot, h.key_length),
        ("rope.dimension_count_swa", h.n_rot_swa, h.key_length_swa),
    ] {
        if rot > hk || rot % 2 != 0 {
            return Err(keys.bad(
                &format!("{arch}.{key}"),
                format!(
                    "{rot} rope dims for heads of {hk}; it must be even and fit (llama.cpp's \
                     rope kernel asserts both and aborts)"
                ),
            ));
        }
    }
    Ok(())
}

/// `attention.sliding_window` above 0 where every layer of the pattern slides by it: with 0,
/// every key is masked and the outputs are NaN. `required`: llama.cpp refuses a file without
/// it.
fn window_above_zero(keys: &Keys, arch: &str, required: bool) -> Result<(), GgufError> {
    let key = format!("{arch}.attention.sliding_window");
    match keys.scalar_u32(&key)? {
        None if required => Err(keys.missing(&key, &format!("llama.cpp's {arch}"))),
        Some(0) => Err(keys.bad(
            &key,
            format!(
                "is 0; llama.cpp's {arch} masks every key outside the window in its sliding \
                 layers, so a window of 0 masks all of them and its outputs are NaN"
            ),
        )),
        _ => Ok(()),
    }
}

/// `rope.dimension_sections` (qwen35, qwen35moe): required, 4 entries, non-negative with a
/// sum above 0 (the CPU's multi-section rope takes each dim modulo their sum).
pub(super) fn rope_sections(keys: &Keys, arch: &str) -> Result<[i32; 4], GgufError> {
    let key = format!("{arch}.rope.dimension_sections");
    let sections = keys
        .opt_int_array(&key)?
        .ok_or_else(|| keys.missing(&key, &format!("llama.cpp's {arch}")))?;
    let sections: [i64; 4] = sections.as_slice().try_into().map_err(|_| {
        keys.bad(
            &key,
            format!("{} entries; llama.cpp reads exactly 4", sections.len()),
        )
    })?;
    let sum: i64 = sections.iter().sum();
    let as_i32 = sections.map(|s| i32::try_from(s).unwrap_or(-1));
    if as_i32.iter().any(|&s| s < 0) || sum <= 0 {
        return Err(keys.bad(
            &key,
            format!("{sections:?}: sections must be non-negative with a sum above 0"),
        ));
    }
    Ok(as_i32)
}

/// The gated delta-net keys and layer pattern of qwen3next, qwen35 and qwen35moe.
pub(super) fn delta_net(keys: &Keys, arch: &str, g: &Generic) -> Result<DeltaNet, GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");
    let conv_kernel = keys.positive_u32(&k("ssm.conv_kernel"), &by)?;
    let inner_size = keys.positive_u32(&k("ssm.inner_size"), &by)?;
    let state_size = keys.positive_u32(&k("ssm.state_size"), &by)?;
    let time_step_rank = keys.positive_u32(&k("ssm.time_step_rank"), &by)?;
    let group_count = keys.positive_u32(&k("ssm.group_count"), &by)?;
    if time_step_rank % group_count != 0 {
        // delta-net-base.cpp: GGML_ASSERT(H_v % H_k == 0).
        return Err(keys.bad(
            &k("ssm.time_step_rank"),
            format!(
                "{time_step_rank} value heads are not a multiple of the {group_count} key \
                 heads (ssm.group_count); llama.cpp's delta-net asserts they are and aborts when \
                 it creates a context"
            ),
        ));
    }
    let state = u64::from(state_size) * u64::from(time_step_rank);
    if u64::from(inner_size) != state {
        // The graph's value head dim is inner_size / time_step_rank; the state is
        // state_size wide: they must agree, or its reshape of the state aborts.
        return Err(keys.bad(
            &k("ssm.inner_size"),
            format!(
                "{inner_size}, not ssm.state_size x ssm.time_step_rank = {state}; llama.cpp's \
                 {arch} reshapes its recurrent state with both and aborts when it creates a \
                 context"
            ),
        ));
    }
    // Recurrent layers: the array if present (its length checked with the shared keys), else
    // full attention every interval layers.
    let layers_key = k("attention.recurrent_layers");
    let recurrent = if let Some(flags) = keys.opt_int_array(&layers_key)? {
        if flags.len() != g.n_layer_all as usize {
            return Err(keys.bad(
                &layers_key,
                format!("{} entries for {} layers", flags.len(), g.n_layer_all),
            ));
        }
        flags.iter().map(|&f| f != 0).collect()
    } else {
        let interval_key = k("full_attention_interval");
        let interval = keys.opt_u32(&interval_key)?.unwrap_or(4);
        if interval == 0 {
            // (i + 1) % 0 in load_arch_hparams: a division by zero.
            return Err(keys.bad(
                &interval_key,
                format!(
                    "is 0; it must be above 0 (llama.cpp's {arch} marks layer i recurrent by \
                     (i + 1) % full_attention_interval: a division by zero while loading)"
                ),
            ));
        }
        (0..g.n_layer_all)
            .map(|il| il < g.n_layer && (u64::from(il) + 1) % u64::from(interval) != 0)
            .collect()
    };
    Ok(DeltaNet {
        conv_kernel,
        inner_size,
        state_size,
        time_step_rank,
        group_count,
        recurrent,
    })
}

/// deepseek2 (and mistral4, which loads as it does): multi-head latent attention.
fn deepseek2(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");
    // The "lite" variants (by layer count and vocabulary) have no query compression.
    let n_vocab = match keys.scalar_u32(&k("vocab_size"))? {
        Some(v) => v,
        None => keys
            .file
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map_or(0, |a| a.len() as u32),
    };
    let lite = matches!(g.n_layer, 26 | 27) || (g.n_layer == 48 && n_vocab == 128_256);
    let q_lora = keys.scalar_u32(&k("attention.q_lora_rank"))?;
    if !lite && q_lora.is_none() {
        return Err(keys.missing(&k("attention.q_lora_rank"), &by));
    }
    for key in ["attention.kv_lora_rank", "expert_shared_count"] {
        keys.scalar_u32(&k(key))?
            .ok_or_else(|| keys.missing(&k(key), &by))?;
    }
    if keys.file.get(&k("expert_feed_forward_length")).is_none() {
        return Err(keys.missing(&k("expert_feed_forward_length"), &by));
    }
    keys.scalar_u32(&k("leading_dense_block_count"))?;
    keys.opt_f32(&k("expert_weights_scale"))?;
    keys.scalar_bool(&k("expert_weights_norm"))?;
    keys.opt_f32(&k("rope.scaling.yarn_log_multiplier"))?;
    let k_mla = keys
        .scalar_u32(&k("attention.key_length_mla"))?
        .unwrap_or(0);
    let v_mla = keys
        .scalar_u32(&k("attention.value_length_mla"))?
        .unwrap_or(0);
    // Key head = its rotated part (rope.dimension_count) + the rest, asserted at least 1
    // before any tensor is made (deepseek2.cpp: GGML_ASSERT(n_embd_head_qk_nope >= 1)).
    let (hk, rot) = g.heads.map_or((0, 0), |h| (h.key_length, h.n_rot));
    let (head_key, head) = if k_mla != 0 && v_mla != 0 {
        ("attention.key_length_mla", k_mla)
    } else {
        ("attention.key_length", hk)
    };
    if i64::from(head) - i64::from(rot) < 1 {
        return Err(keys.bad(
            &k(head_key),
            format!(
                "{head} is not above rope.dimension_count {rot}; {by} splits each key head into \
                 rope.dimension_count rotated dims and a rest it asserts is at least 1, and \
                 aborts while loading"
            ),
        ));
    }
    let temp_scale = keys
        .opt_f32(&k("attention.temperature_scale"))?
        .unwrap_or(0.0);
    let temp_length = keys
        .scalar_u32(&k("attention.temperature_length"))?
        .unwrap_or(0);
    if temp_scale != 0.0 && temp_length == 0 {
        return Err(keys.bad(
            &k("attention.temperature_length"),
            format!(
                "is 0 (or missing) with attention.temperature_scale {temp_scale}; {by} divides \
                 positions by it and asserts it above 0 on the first decode"
            ),
        ));
    }
    let dense = keys
        .scalar_u32(&k("leading_dense_block_count"))?
        .unwrap_or(0);
    if dense < g.n_layer && (g.n_expert == 0 || g.expert_used[0] == 0) {
        let key = if g.n_expert == 0 {
            "expert_count"
        } else {
            "expert_used_count"
        };
        return Err(keys.bad(
            &k(key),
            format!(
                "is 0 while layers {dense} to {} are MoE layers (leading_dense_block_count \
                 {dense}); {by} needs experts there",
                g.n_layer - 1
            ),
        ));
    }
    Ok(())
}

/// gpt-oss: sliding window required; its attention tensors are sized with
/// `rope.dimension_count` while the KV cache uses the key and value lengths, so the three must
/// agree, or the cache write aborts when a context is created (`ggml_set_rows`).
fn gpt_oss(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    window_above_zero(keys, arch, true)?;
    let ff_exp = format!("{arch}.expert_feed_forward_length");
    if keys.file.get(&ff_exp).is_none() {
        return Err(keys.missing(&ff_exp, &by));
    }
    let Some(h) = g.heads else {
        return Ok(());
    };
    // The tensors take layer 0's rope dims (layer 0 slides in gpt-oss's pattern).
    let rot = g.layer0_heads().map_or(h.n_rot, |l| l.2);
    for (key, v) in [
        ("attention.key_length", h.key_length),
        ("attention.value_length", h.value_length),
        ("attention.key_length_swa", h.key_length_swa),
        ("attention.value_length_swa", h.value_length_swa),
    ] {
        if v != rot {
            return Err(keys.bad(
                &format!("{arch}.{key}"),
                format!(
                    "{v}, not rope.dimension_count {rot}; {by} sizes its attention projections \
                     with rope.dimension_count and its KV cache with the key and value lengths, \
                     and the cache write aborts on the difference (ggml_set_rows)"
                ),
            ));
        }
    }
    Ok(())
}

/// nemotron_h / nemotron_h_moe: Mamba-2 layers (no key heads, no FFN), attention layers (key
/// heads, no FFN) and FFN or MoE layers, decided per layer from the per-layer arrays.
fn nemotron_h(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");
    let eps = k("attention.layer_norm_epsilon");
    keys.opt_f32(&eps)?.ok_or_else(|| keys.missing(&eps, &by))?;
    keys.opt_f32(&k("attention.layer_norm_rms_epsilon"))?;
    let n = g.n_layer as usize;
    let recurrent: Vec<bool> = (0..n)
        .map(|il| g.n_head_kv[il] == 0 && g.n_ff[il] == 0)
        .collect();
    mamba2_rules(keys, arch, recurrent.iter().any(|&r| r))?;
    // Attention layers take their head size as embedding_length / head_count of layer 0.
    if (0..n).any(|il| !recurrent[il] && g.n_ff[il] == 0) && g.n_head[0] == 0 {
        let key = k("attention.head_count");
        if keys.file.get(&key).is_none() {
            return Err(keys.missing(&key, &by));
        }
        return Err(keys.bad(
            &key,
            format!(
                "is 0 at layer 0; {by} sizes every attention layer's heads as embedding_length \
                 / head_count of layer 0"
            ),
        ));
    }
    if g.n_expert > 0 {
        for (il, &recurrent) in recurrent.iter().enumerate() {
            let moe = !recurrent && g.n_ff[il] > 0;
            if moe && g.n_ff_exp[il] == 0 && g.expert_used[il] == 0 {
                return Err(keys.bad(
                    &k("expert_used_count"),
                    format!(
                        "is 0 at MoE layer {il}, which has no expert_feed_forward_length; {by} \
                         then divides feed_forward_length by it (a division by zero while \
                         loading)"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// The Mamba-2 layer (src/models/mamba-base.cpp and the loaders): the keys required, group
/// and head counts above 0 (divisors while loading and in the graph), and the inner size
/// divisible by both, the heads by the groups (asserts of the graph and of ggml's scan).
/// `recurrent`: whether the model has a Mamba-2 layer at all (the rules bind only then).
fn mamba2_rules(keys: &Keys, arch: &str, recurrent: bool) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    let k = |name: &str| format!("{arch}.{name}");
    let mut v = [0u32; 5];
    for (slot, key) in v.iter_mut().zip([
        "ssm.conv_kernel",
        "ssm.inner_size",
        "ssm.state_size",
        "ssm.time_step_rank",
        "ssm.group_count",
    ]) {
        *slot = keys
            .scalar_u32(&k(key))?
            .ok_or_else(|| keys.missing(&k(key), &by))?;
    }
    let [_, inner, _, rank, groups] = v;
    if !recurrent {
        return Ok(());
    }
    if groups == 0 {
        return Err(keys.bad(
            &k("ssm.group_count"),
            format!("is 0; {by} divides ssm.inner_size by it while loading (a division by zero)"),
        ));
    }
    if rank == 0 {
        return Err(keys.bad(
            &k("ssm.time_step_rank"),
            format!(
                "is 0; it is the number of Mamba-2 heads and {by} divides ssm.inner_size by it \
                 (a division by zero)"
            ),
        ));
    }
    for (key, d, what) in [
        ("ssm.time_step_rank", rank, "heads (ssm.time_step_rank)"),
        ("ssm.group_count", groups, "groups (ssm.group_count)"),
    ] {
        if inner % d != 0 {
            return Err(keys.bad(
                &k(key),
                format!(
                    "{d} {what} do not divide ssm.inner_size {inner}; the Mamba-2 graph asserts \
                     they do and aborts when a context is created"
                ),
            ));
        }
    }
    if rank % groups != 0 {
        return Err(keys.bad(
            &k("ssm.time_step_rank"),
            format!(
                "{rank} heads are not a multiple of the {groups} groups (ssm.group_count); \
                 ggml's scan asserts they are and aborts on the first decode"
            ),
        ));
    }
    Ok(())
}

/// jamba, granitehybrid: "only an expansion factor of 2 is supported", asserted while loading.
fn inner_is_twice_width(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let key = format!("{arch}.ssm.inner_size");
    let inner = keys
        .scalar_u32(&key)?
        .ok_or_else(|| keys.missing(&key, &format!("llama.cpp's {arch}")))?;
    if u64::from(inner) != 2 * u64::from(g.n_embd) {
        return Err(keys.bad(
            &key,
            format!(
                "{inner}, not 2 x embedding_length = {}; llama.cpp's {arch} asserts the \
                 factor 2 while loading and aborts",
                2 * u64::from(g.n_embd)
            ),
        ));
    }
    Ok(())
}

/// The RWKV family: a head size above 0 and at most the width (divisors while loading and in
/// the graph), and the token shift count its graph asserts.
fn rwkv(keys: &Keys, arch: &str, g: &Generic) -> Result<(), GgufError> {
    let by = format!("llama.cpp's {arch}");
    let key = format!("{arch}.wkv.head_size");
    let head_size = keys
        .scalar_u32(&key)?
        .ok_or_else(|| keys.missing(&key, &by))?;
    if head_size == 0 || head_size > g.n_embd {
        return Err(keys.bad(
            &key,
            format!(
                "{head_size} for a width of {}; {by} divides the width by it and then by the \
                 resulting head count (a division by zero)",
                g.n_embd
            ),
        ));
    }
    let shift_key = format!("{arch}.token_shift_count");
    let shift = keys.scalar_u32(&shift_key)?.unwrap_or(2);
    let wanted = if matches!(arch, "rwkv6qwen2" | "arwkv7") {
        1
    } else {
        2
    };
    if shift != wanted {
        return Err(keys.bad(
            &shift_key,
            format!("{shift}; {by} graph asserts {wanted} and aborts when a context is created"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;
    use crate::llama_archs::tests::vendored_llama_cpp;
    use crate::llama_archs::{llama_support, LlamaSupport};
    use crate::validate::generic::tests::{model_class_by_arch, model_structs};

    /// The text of the file defining `arch`'s `load_arch_hparams` (its class's, else its base
    /// class's: mistral4 loads as deepseek2).
    fn loader_of(root: &std::path::Path, arch: &str) -> String {
        let classes = model_class_by_arch(root);
        let structs = model_structs(root);
        let mut class = classes[arch].clone();
        let dir = root.join("src/models");
        for _ in 0..4 {
            let needle = format!("void {class}::load_arch_hparams(");
            for e in std::fs::read_dir(&dir).unwrap().flatten() {
                let text = std::fs::read_to_string(e.path()).unwrap_or_default();
                if text.contains(&needle) {
                    return text;
                }
            }
            class = structs[&class].0.clone();
        }
        panic!("no load_arch_hparams for {arch}")
    }

    #[test]
    fn gating_and_epsilon_lists_are_the_loaders_that_read_the_keys() {
        let root = vendored_llama_cpp();
        let key = "LLM_KV_EXPERT_GATING_FUNC";
        let readers: BTreeSet<String> = crate::llama_archs::loadable_archs()
            .filter(|a| loader_of(&root, a).contains(key))
            .map(str::to_string)
            .collect();
        // deepseek4 and dflash refuse any gating but 4 with an error of their own.
        let ours: BTreeSet<String> = GATING_READERS
            .iter()
            .chain(&["deepseek4", "dflash"])
            .map(|s| s.to_string())
            .collect();
        assert_eq!(readers, ours);
        for arch in GATING_READERS {
            let text = loader_of(&root, arch);
            let defaults =
                text.contains("expert_gating_func == LLAMA_EXPERT_GATING_FUNC_TYPE_NONE");
            assert_eq!(
                !defaults,
                GATING_REQUIRED.contains(&arch),
                "{arch}: maps 0 to a default: {defaults}"
            );
        }
        let rms = "get_key(LLM_KV_ATTENTION_LAYERNORM_RMS_EPS, hparams.f_norm_rms_eps);";
        for arch in RMS_EPS_REQUIRED {
            let text: String = loader_of(&root, arch)
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            assert!(
                text.contains(rms),
                "{arch} does not require the rms epsilon"
            );
            assert_eq!(llama_support(arch), LlamaSupport::Loads);
        }
    }
}
