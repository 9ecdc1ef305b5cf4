//! The gate for every family of the synthetic presets (llama and its Mixtral-style MoE, qwen2,
//! qwen2moe, qwen3, qwen3moe, qwen35moe, qwen35, qwen3next, gemma2, gemma3, phi3, deepseek2,
//! gpt-oss, olmoe, nemotron_h, nemotron_h_moe): a well-formed file of each passes, and a file
//! whose hyperparameters would make the linked llama.cpp abort (GGML_ASSERT, GGML_ABORT or a
//! division by zero) gets the exact error, naming the file and the key. Families without a
//! micro preset are written by hand: their metadata is checked before any tensor.

mod common;

use std::io::Cursor;

use common::*;
use opledger_gguf::{
    validate_for_llama, validate_for_llama_build, ArchCheck, Array, GgmlType, GgufError, GgufFile,
    LlamaBuild, TensorSpec, Value,
};

fn gate(name: &str, bytes: &[u8]) -> Result<ArchCheck, GgufError> {
    let f = GgufFile::read_from(Cursor::new(bytes.to_vec()), format!("{name}.gguf"))?;
    validate_for_llama(&f)
}

fn u32s(v: &[u32]) -> Value {
    Value::Array(Array::U32(v.to_vec()))
}

/// The metadata of a small, well-formed model of `arch` (width 8, 2 layers of 2 heads of 4,
/// no tokenizer, 4 tokens), with the keys its family adds.
fn family_meta(arch: &str) -> Vec<(String, Value)> {
    let mut m: Vec<(String, Value)> =
        vec![("general.architecture".into(), Value::String(arch.into()))];
    let mut put = |k: &str, v: Value| {
        let key = if k.starts_with("tokenizer.") {
            k.to_string()
        } else {
            format!("{arch}.{k}")
        };
        m.push((key, v));
    };
    put("context_length", Value::U32(64));
    put("embedding_length", Value::U32(8));
    put("block_count", Value::U32(2));
    put("feed_forward_length", Value::U32(8));
    put("attention.head_count", Value::U32(2));
    put("attention.head_count_kv", Value::U32(1));
    put("attention.layer_norm_rms_epsilon", Value::F32(1e-6));
    put("vocab_size", Value::U32(4));
    put("tokenizer.ggml.model", Value::String("none".into()));
    let moe = |put: &mut dyn FnMut(&str, Value)| {
        put("expert_count", Value::U32(4));
        put("expert_used_count", Value::U32(2));
        put("expert_feed_forward_length", Value::U32(4));
    };
    let delta_net = |put: &mut dyn FnMut(&str, Value)| {
        put("rope.dimension_count", Value::U32(2));
        put("ssm.conv_kernel", Value::U32(2));
        put("ssm.inner_size", Value::U32(4));
        put("ssm.state_size", Value::U32(2));
        put("ssm.time_step_rank", Value::U32(2));
        put("ssm.group_count", Value::U32(1));
        put("full_attention_interval", Value::U32(2));
    };
    match arch {
        "qwen2" | "phi3" => {}
        "qwen2moe" => moe(&mut put),
        "qwen35" => {
            delta_net(&mut put);
            put(
                "rope.dimension_sections",
                Value::Array(Array::I32(vec![1, 1, 0, 0])),
            );
        }
        "qwen3next" => {
            delta_net(&mut put);
            moe(&mut put);
        }
        "gemma2" | "gemma3" => put("attention.sliding_window", Value::U32(16)),
        "deepseek2" => {
            moe(&mut put);
            put("attention.head_count_kv", Value::U32(2));
            put("attention.q_lora_rank", Value::U32(4));
            put("attention.kv_lora_rank", Value::U32(4));
            put("attention.key_length_mla", Value::U32(6));
            put("attention.value_length_mla", Value::U32(4));
            put("rope.dimension_count", Value::U32(2));
            put("expert_shared_count", Value::U32(1));
            put("leading_dense_block_count", Value::U32(1));
        }
        "gpt-oss" => {
            moe(&mut put);
            put("attention.sliding_window", Value::U32(16));
        }
        "olmoe" => {
            moe(&mut put);
            put("attention.head_count_kv", Value::U32(2));
        }
        "nemotron_h" | "nemotron_h_moe" => {
            // Layer 0 Mamba-2 (no key heads, no FFN), layer 1 attention, layer 2 FFN (MoE in
            // nemotron_h_moe).
            put("block_count", Value::U32(3));
            put("attention.head_count_kv", u32s(&[0, 2, 0]));
            put("feed_forward_length", u32s(&[0, 0, 8]));
            put("attention.layer_norm_epsilon", Value::F32(1e-5));
            put("ssm.conv_kernel", Value::U32(4));
            put("ssm.inner_size", Value::U32(16));
            put("ssm.state_size", Value::U32(8));
            put("ssm.time_step_rank", Value::U32(4));
            put("ssm.group_count", Value::U32(2));
            if arch == "nemotron_h_moe" {
                moe(&mut put);
            }
        }
        other => panic!("no metadata for {other}"),
    }
    // Later values win: drop earlier duplicates.
    let mut seen = std::collections::HashSet::new();
    let mut out: Vec<(String, Value)> = m
        .into_iter()
        .rev()
        .filter(|(k, _)| seen.insert(k.clone()))
        .collect();
    out.reverse();
    out
}

/// A hand-written file of `arch` with its metadata edited (one embedding tensor).
fn family_file(arch: &str, edit: impl FnOnce(&mut Vec<(String, Value)>)) -> Vec<u8> {
    let mut meta = family_meta(arch);
    edit(&mut meta);
    meta_file(
        &meta,
        &[TensorSpec::new("token_embd.weight", &[8, 4], GgmlType::F32)],
    )
}

const HAND_WRITTEN: [&str; 12] = [
    "qwen2",
    "qwen2moe",
    "qwen35",
    "qwen3next",
    "gemma2",
    "gemma3",
    "phi3",
    "deepseek2",
    "gpt-oss",
    "olmoe",
    "nemotron_h",
    "nemotron_h_moe",
];

#[test]
fn a_well_formed_file_of_every_family_passes() {
    for arch in HAND_WRITTEN {
        let check =
            gate(arch, &family_file(arch, |_| {})).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(check.arch, arch);
        assert!(!check.tensors_planned, "{arch}");
        assert_eq!(check.notes.len(), 1, "{arch}: {:?}", check.notes);
        assert!(
            check.notes[0].contains("were not checked by opledger"),
            "{arch}: {:?}",
            check.notes
        );
    }
    for preset in MICRO {
        let check = gate(preset.name, &micro_file(&preset, |_| {}, |_| {})).unwrap();
        assert!(check.tensors_planned);
    }
}

/// A file llama.cpp would abort on, and what the gate must say.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    key: &'static str,
    /// Words of the message (after the file name and the key).
    words: &'static [&'static str],
}

fn case(
    name: &'static str,
    bytes: Vec<u8>,
    key: &'static str,
    words: &'static [&'static str],
) -> Case {
    Case {
        name,
        bytes,
        key,
        words,
    }
}

fn cases() -> Vec<Case> {
    let llama_moe = |m: &mut Vec<(String, Value)>| {
        set(m, "llama.expert_count", Value::U32(4));
        set(m, "llama.expert_used_count", Value::U32(2));
    };
    vec![
        // llama: its graph asserts value length == key length (llama.cpp:102).
        case(
            "llama_value_length",
            micro_file(
                &MICRO_LLAMA,
                |m| set(m, "llama.attention.value_length", Value::U32(2)),
                |_| {},
            ),
            "llama.attention.value_length",
            &[
                "2 differs from the key length 4",
                "graph asserts they are equal and aborts",
            ],
        ),
        // llama with experts: load_hparams asserts n_expert % n_expert_groups == 0.
        case(
            "llama_moe_groups",
            micro_file(
                &MICRO_LLAMA,
                |m| {
                    llama_moe(m);
                    set(m, "llama.expert_group_count", Value::U32(3));
                },
                |_| {},
            ),
            "llama.expert_group_count",
            &["3 groups do not divide the 4 experts", "aborts"],
        ),
        case(
            "llama_moe_used_above_count",
            micro_file(
                &MICRO_LLAMA,
                |m| {
                    llama_moe(m);
                    set(m, "llama.expert_used_count", Value::U32(5));
                },
                |_| {},
            ),
            "llama.expert_used_count",
            &["5 is more than the expert count 4", "aborts"],
        ),
        // qwen2: no load-time check of the rope dims; the graph asserts n_rot == head dim.
        case(
            "qwen2_rope_dims",
            family_file("qwen2", |m| {
                set(m, "qwen2.rope.dimension_count", Value::U32(2))
            }),
            "qwen2.rope.dimension_count",
            &[
                "2; llama.cpp's qwen2 needs it equal to the head dim 4",
                "aborts",
            ],
        ),
        // qwen2moe: experts without any used: GGML_ASSERT(n_expert_used_max > 0).
        case(
            "qwen2moe_no_experts_used",
            family_file("qwen2moe", |m| remove(m, "qwen2moe.expert_used_count")),
            "qwen2moe.expert_used_count",
            &["is 0 (or missing) with 4 experts", "aborts"],
        ),
        case(
            "qwen3_value_length",
            micro_file(
                &MICRO_QWEN3,
                |m| set(m, "qwen3.attention.value_length", Value::U32(8)),
                |_| {},
            ),
            "qwen3.attention.value_length",
            &["8 differs from the key length 4"],
        ),
        case(
            "qwen3moe_too_many_experts",
            micro_file(
                &MICRO_QWEN3MOE,
                |m| set(m, "qwen3moe.expert_count", Value::U32(2000)),
                |_| {},
            ),
            "qwen3moe.expert_count",
            &["2000 experts; llama.cpp takes at most 1024"],
        ),
        // qwen35moe: (i + 1) % full_attention_interval in load_arch_hparams.
        case(
            "qwen35moe_zero_interval",
            micro_file(
                &MICRO_QWEN35MOE,
                |m| set(m, "qwen35moe.full_attention_interval", Value::U32(0)),
                |_| {},
            ),
            "qwen35moe.full_attention_interval",
            &["is 0; it must be above 0"],
        ),
        // qwen35moe has no expert count check: without experts and without an expert width it
        // divides feed_forward_length by expert_used_count = 0.
        case(
            "qwen35moe_expert_width_division",
            micro_file(
                &MICRO_QWEN35MOE,
                |m| {
                    remove(m, "qwen35moe.expert_count");
                    remove(m, "qwen35moe.expert_used_count");
                    remove(m, "qwen35moe.expert_feed_forward_length");
                },
                |_| {},
            ),
            "qwen35moe.expert_feed_forward_length",
            &["expert_used_count is 0 at layer 0", "divides by zero"],
        ),
        // qwen35: the state reshape needs inner_size == state_size x time_step_rank.
        case(
            "qwen35_inner_size",
            family_file("qwen35", |m| set(m, "qwen35.ssm.inner_size", Value::U32(6))),
            "qwen35.ssm.inner_size",
            &["6, not ssm.state_size x ssm.time_step_rank = 4"],
        ),
        // qwen3next: the delta-net asserts H_v % H_k == 0.
        case(
            "qwen3next_value_heads",
            family_file("qwen3next", |m| {
                set(m, "qwen3next.ssm.group_count", Value::U32(2));
                set(m, "qwen3next.ssm.time_step_rank", Value::U32(3));
                set(m, "qwen3next.ssm.inner_size", Value::U32(6));
            }),
            "qwen3next.ssm.time_step_rank",
            &["3 value heads are not a multiple of the 2 key heads"],
        ),
        // gemma2: a pattern without sliding layers; GGML_ASSERT(hparams.is_swa_any()).
        case(
            "gemma2_no_sliding_layer",
            family_file("gemma2", |m| {
                set(m, "gemma2.attention.sliding_window_pattern", Value::U32(1))
            }),
            "gemma2.attention.sliding_window_pattern",
            &[
                "1 leaves none of the 2 layers with a sliding window",
                "aborts",
            ],
        ),
        case(
            "gemma3_no_sliding_layer",
            family_file("gemma3", |m| {
                set(
                    m,
                    "gemma3.attention.sliding_window_pattern",
                    Value::Array(Array::Bool(vec![false, false])),
                )
            }),
            "gemma3.attention.sliding_window_pattern",
            &["the array leaves none of the 2 layers with a sliding window"],
        ),
        // gemma3 27B shape (62 layers) without heads: n_embd / n_head(0) in load_arch_hparams.
        case(
            "gemma3_no_heads",
            family_file("gemma3", |m| {
                set(m, "gemma3.block_count", Value::U32(62));
                set(m, "gemma3.attention.head_count", Value::U32(0));
                set(m, "gemma3.attention.head_count_kv", Value::U32(0));
            }),
            "gemma3.attention.head_count",
            &["is 0 at layer 0"],
        ),
        case(
            "phi3_value_length",
            family_file("phi3", |m| {
                set(m, "phi3.attention.value_length", Value::U32(2))
            }),
            "phi3.attention.value_length",
            &["2 differs from the key length 4"],
        ),
        // phi3's graph has no rope assert; the CPU rope kernel aborts on odd dims.
        case(
            "phi3_odd_rope",
            family_file("phi3", |m| {
                set(m, "phi3.rope.dimension_count", Value::U32(3))
            }),
            "phi3.rope.dimension_count",
            &["3 rope dims for heads of 4; it must be even and fit"],
        ),
        // deepseek2: GGML_ASSERT(n_embd_head_qk_nope >= 1) before any tensor.
        case(
            "deepseek2_mla_key_length",
            family_file("deepseek2", |m| {
                set(m, "deepseek2.rope.dimension_count", Value::U32(6))
            }),
            "deepseek2.attention.key_length_mla",
            &[
                "6 is not above rope.dimension_count 6",
                "aborts while loading",
            ],
        ),
        case(
            "deepseek2_gating",
            family_file("deepseek2", |m| {
                set(m, "deepseek2.expert_gating_func", Value::U32(7))
            }),
            "deepseek2.expert_gating_func",
            &[
                "7 is not a gating llama.cpp knows",
                "GGML_ABORT in build_moe_ffn",
            ],
        ),
        case(
            "deepseek2_no_kv_lora",
            family_file("deepseek2", |m| {
                remove(m, "deepseek2.attention.kv_lora_rank")
            }),
            "deepseek2.attention.kv_lora_rank",
            &["is missing; llama.cpp's deepseek2 requires it"],
        ),
        // gpt-oss: projections sized by rope dims, KV cache by key length: ggml_set_rows.
        case(
            "gpt_oss_key_length",
            family_file("gpt-oss", |m| {
                set(m, "gpt-oss.rope.dimension_count", Value::U32(2))
            }),
            "gpt-oss.attention.key_length",
            &["4, not rope.dimension_count 2", "ggml_set_rows"],
        ),
        case(
            "gpt_oss_no_window",
            family_file("gpt-oss", |m| remove(m, "gpt-oss.attention.sliding_window")),
            "gpt-oss.attention.sliding_window",
            &["is missing; llama.cpp's gpt-oss requires it"],
        ),
        // olmoe: the key norm is as wide as all heads.
        case(
            "olmoe_grouped_keys",
            family_file("olmoe", |m| {
                set(m, "olmoe.attention.head_count_kv", Value::U32(1))
            }),
            "olmoe.attention.head_count_kv",
            &["1 at layer 0, not the head count 2", "ggml_mul"],
        ),
        // nemotron_h: d_inner / n_group while loading the Mamba-2 layer.
        case(
            "nemotron_h_zero_groups",
            family_file("nemotron_h", |m| {
                set(m, "nemotron_h.ssm.group_count", Value::U32(0))
            }),
            "nemotron_h.ssm.group_count",
            &["is 0", "division by zero"],
        ),
        case(
            "nemotron_h_no_eps",
            family_file("nemotron_h", |m| {
                remove(m, "nemotron_h.attention.layer_norm_epsilon")
            }),
            "nemotron_h.attention.layer_norm_epsilon",
            &["is missing; llama.cpp's nemotron_h requires it"],
        ),
        // nemotron_h_moe: ggml's scan asserts heads % groups == 0.
        case(
            "nemotron_h_moe_heads_per_group",
            family_file("nemotron_h_moe", |m| {
                set(m, "nemotron_h_moe.ssm.group_count", Value::U32(8))
            }),
            "nemotron_h_moe.ssm.time_step_rank",
            &[
                "4 heads are not a multiple of the 8 groups",
                "aborts on the first decode",
            ],
        ),
        case(
            "nemotron_h_moe_inner_size",
            family_file("nemotron_h_moe", |m| {
                set(m, "nemotron_h_moe.ssm.time_step_rank", Value::U32(3))
            }),
            "nemotron_h_moe.ssm.time_step_rank",
            &["3 heads (ssm.time_step_rank) do not divide ssm.inner_size 16"],
        ),
    ]
}

#[test]
fn a_file_of_every_family_that_would_abort_llama_cpp_gets_its_exact_error() {
    let cases = cases();
    let mut names = std::collections::HashSet::new();
    for c in &cases {
        assert!(names.insert(c.name), "duplicate case {}", c.name);
        let e = match gate(c.name, &c.bytes) {
            Ok(check) => panic!("{}: accepted ({check:?})", c.name),
            Err(e) => e,
        };
        let msg = e.to_string();
        let key = match &e {
            GgufError::BadKeyValue { key, .. }
            | GgufError::MissingKey { key, .. }
            | GgufError::WrongKeyType { key, .. } => key.clone(),
            other => panic!("{}: not a key error: {other:?}", c.name),
        };
        assert_eq!(key, c.key, "{}: {msg}", c.name);
        let head = format!("{}.gguf: metadata key '{}'", c.name, c.key);
        assert!(msg.starts_with(&head), "{}: {msg}", c.name);
        for w in c.words {
            assert!(msg.contains(w), "{}: '{w}' not in: {msg}", c.name);
        }
    }
    // Every family of the presets has at least one.
    for family in [
        "llama_",
        "llama_moe",
        "qwen2_",
        "qwen2moe",
        "qwen3_",
        "qwen3moe",
        "qwen35moe",
        "qwen35_",
        "qwen3next",
        "gemma2",
        "gemma3",
        "phi3",
        "deepseek2",
        "gpt_oss",
        "olmoe",
        "nemotron_h_",
        "nemotron_h_moe",
    ] {
        assert!(
            cases.iter().any(|c| c.name.starts_with(family)),
            "no case for {family}"
        );
    }
}

#[test]
fn architectures_llama_cpp_does_not_load_are_refused_by_name() {
    for (arch, words) in [
        (
            "notanarch",
            &[
                "is 'notanarch': not an architecture the linked llama.cpp",
                "it would refuse the file",
            ][..],
        ),
        (
            "qwen3.5",
            &[
                "knows; it would refuse the file",
                "qwen3, qwen3moe",
                "qwen35, qwen35moe",
            ][..],
        ),
        (
            "clip",
            &[
                "is 'clip': known to the linked llama.cpp, but not a model it loads",
                "--mmproj",
            ][..],
        ),
        ("gptj", &["without a model class"][..]),
    ] {
        let bytes = micro_file(
            &MICRO_LLAMA,
            |m| set(m, "general.architecture", Value::String(arch.into())),
            |_| {},
        );
        let e = gate("other", &bytes).unwrap_err();
        assert!(
            matches!(&e, GgufError::ArchNotLoadable { arch: a, .. } if a == arch),
            "{arch}: {e:?}"
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("other.gguf: metadata key 'general.architecture'"),
            "{msg}"
        );
        for w in words {
            assert!(msg.contains(w), "{arch}: '{w}' not in {msg}");
        }
    }
}

/// Through a worker of another llama.cpp build, which architectures load is that build's
/// answer: a name the vendored table does not load passes with a note saying so, while the
/// checks of an architecture the vendored llama.cpp loads (an abort it would meet) still run.
#[test]
fn another_build_decides_which_architectures_load_and_the_known_checks_stay() {
    let other = |bytes: &[u8]| {
        let f = GgufFile::read_from(Cursor::new(bytes.to_vec()), "other.gguf").unwrap();
        validate_for_llama_build(&f, LlamaBuild::Other)
    };
    for arch in ["notanarch", "clip", "gptj"] {
        let bytes = micro_file(
            &MICRO_LLAMA,
            |m| set(m, "general.architecture", Value::String(arch.into())),
            |_| {},
        );
        // the vendored gate refuses it ...
        assert!(gate("other", &bytes).is_err(), "{arch}");
        // ... another build's gate lets its loader answer, and says what was checked
        let c = other(&bytes).unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert_eq!(c.arch, arch);
        assert!(!c.tensors_planned);
        assert_eq!(c.tensors_checked, 0);
        assert_eq!(c.notes.len(), 1, "{:?}", c.notes);
        assert!(
            c.notes[0].contains(&format!(
                "'{arch}' is not an architecture the vendored llama.cpp"
            )) && c.notes[0].contains("the answer of the worker's own llama.cpp"),
            "{}",
            c.notes[0]
        );
    }
    // an architecture both know: the same checks, the same refusal
    let gemma2 = family_file("gemma2", |m| {
        set(m, "gemma2.attention.sliding_window_pattern", Value::U32(1))
    });
    let vendored = gate("other", &gemma2).unwrap_err().to_string();
    let through_other = other(&gemma2).unwrap_err().to_string();
    assert_eq!(vendored, through_other);
    assert!(
        vendored.contains("leaves none of the 2 layers with a sliding window"),
        "{vendored}"
    );
    // and a file both load is checked alike
    let fine = family_file("gemma2", |_| {});
    assert_eq!(gate("other", &fine).unwrap(), other(&fine).unwrap());
}

#[test]
fn hostile_values_in_any_family_are_errors_not_panics() {
    let mut refused = 0;
    for arch in HAND_WRITTEN {
        // Read once, then edited in memory: the metadata is all the key checks see.
        let base =
            GgufFile::read_from(Cursor::new(family_file(arch, |_| {})), "hostile.gguf").unwrap();
        let keys: Vec<String> = base
            .metadata
            .iter()
            .filter(|(_, v)| matches!(v, Value::U32(_) | Value::Array(Array::U32(_))))
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            for v in [0, 1, 3, 1 << 16, u32::MAX - 1, u32::MAX] {
                let mut f = base.clone();
                set(&mut f.metadata, key, Value::U32(v));
                // Ok or Err, never a panic; an Err names the file.
                if let Err(e) = validate_for_llama(&f) {
                    assert!(e.to_string().starts_with("hostile.gguf: "), "{e}");
                    refused += 1;
                }
            }
        }
    }
    assert!(refused > 100, "only {refused} hostile files refused");
}
