//! Hand-made malformed GGUF files, each with the exact error the gate (reader, then
//! `validate_for_llama`) must give: the variant, the words of the message and the file's name.
//! The files are generated here from micro models, so no binary test data is needed; the same
//! files seed the fuzzer (`write_fuzz_seeds`).

mod common;

use std::io::Cursor;

use common::*;
use opledger_gguf::{
    validate_for_llama, ArchCheck, Array, GgmlType, GgufError, GgufFile, TensorSpec, Value,
};

/// One malformed file and what must be said about it.
struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    /// The variant, with its key fields.
    check: fn(&GgufError) -> bool,
    /// Words the message must contain (the file name is checked for every case).
    words: &'static [&'static str],
}

/// Reads and validates `bytes` as the file `name.gguf`.
fn gate(name: &str, bytes: &[u8]) -> Result<ArchCheck, GgufError> {
    let f = GgufFile::read_from(Cursor::new(bytes.to_vec()), format!("{name}.gguf"))?;
    validate_for_llama(&f)
}

fn q35() -> Vec<u8> {
    micro_file(&MICRO_QWEN35MOE, |_| {}, |_| {})
}

fn llama() -> Vec<u8> {
    micro_file(&MICRO_LLAMA, |_| {}, |_| {})
}

fn cut(mut bytes: Vec<u8>, len: usize) -> Vec<u8> {
    bytes.truncate(len);
    bytes
}

/// `base` with `f` applied to its bytes.
fn patch(mut bytes: Vec<u8>, f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    f(&mut bytes);
    bytes
}

fn with_meta(preset: &opledger_gguf::Preset, f: impl FnOnce(&mut Vec<(String, Value)>)) -> Vec<u8> {
    micro_file(preset, f, |_| {})
}

fn with_tensors(preset: &opledger_gguf::Preset, f: impl FnOnce(&mut Vec<TensorSpec>)) -> Vec<u8> {
    micro_file(preset, |_| {}, f)
}

fn data_offset(bytes: &[u8]) -> usize {
    GgufFile::read_from(Cursor::new(bytes.to_vec()), "base.gguf")
        .unwrap()
        .data_offset_bytes as usize
}

fn renamed(bytes: Vec<u8>, from: &str, to: &str) -> Vec<u8> {
    assert_eq!(from.len(), to.len());
    patch(bytes, |b| {
        let at = string_at(b, from) + 8;
        b[at..at + to.len()].copy_from_slice(to.as_bytes());
    })
}

const SECTIONS: &str = "qwen35moe.rope.dimension_sections";

fn cases() -> Vec<Case> {
    use GgufError as E;
    let q = q35();
    let l = llama();
    vec![
        // --- truncated at every section ---
        Case {
            name: "empty",
            bytes: Vec::new(),
            check: |e| matches!(e, E::Truncated { what, offset_bytes: 0, .. } if what == "magic"),
            words: &["truncated: magic at offset 0"],
        },
        Case {
            name: "truncated_header",
            bytes: cut(q.clone(), 10),
            check: |e| matches!(e, E::Truncated { what, .. } if what == "tensor count in the header"),
            words: &["truncated: tensor count in the header"],
        },
        Case {
            name: "truncated_kv",
            bytes: cut(q.clone(), value_type_at(&q, "qwen35moe.block_count") + 2),
            check: |e| {
                matches!(e, E::Truncated { what, .. }
                    if what == "value type of key 'qwen35moe.block_count'")
            },
            words: &["truncated: value type of key 'qwen35moe.block_count'"],
        },
        Case {
            name: "truncated_tensor_infos",
            bytes: cut(q.clone(), tensor_info_at(&q, "output.weight").0 + 2),
            check: |e| {
                matches!(e, E::Truncated { what, .. } if what == "n_dims of tensor 'output.weight'")
            },
            words: &["truncated: n_dims of tensor 'output.weight'"],
        },
        Case {
            name: "truncated_at_data",
            bytes: cut(q.clone(), data_offset(&q)),
            check: |e| matches!(e, E::TensorOutOfBounds { name, .. } if name == "token_embd.weight"),
            words: &["'token_embd.weight': data ends at byte", "past the end of the file"],
        },
        Case {
            name: "truncated_last_byte",
            bytes: cut(q.clone(), q.len() - 1),
            check: |e| matches!(e, E::TensorOutOfBounds { name, .. } if name == "output.weight"),
            words: &["'output.weight': data ends at byte"],
        },
        // --- header ---
        Case {
            name: "bad_magic",
            bytes: patch(q.clone(), |b| b[..4].copy_from_slice(b"GGML")),
            check: |e| matches!(e, E::BadMagic { found: 0x4c4d_4747, .. }),
            words: &["not a GGUF file (magic 0x4c4d4747)"],
        },
        Case {
            name: "bad_version",
            bytes: patch(q.clone(), |b| put_u32(b, 4, 1)),
            check: |e| matches!(e, E::BadVersion { found: 1, .. }),
            words: &["unsupported GGUF version 1"],
        },
        // --- lying counts ---
        Case {
            name: "lying_tensor_count",
            bytes: patch(q.clone(), |b| put_u64(b, 8, u64::MAX)),
            check: |e| {
                matches!(e, E::CountTooLarge { what, count: u64::MAX, .. } if what == "tensor count")
            },
            words: &["tensor count is 18446744073709551615, more than a file of"],
        },
        Case {
            name: "lying_kv_count",
            bytes: patch(q.clone(), |b| put_u64(b, 16, 1 << 40)),
            check: |e| {
                matches!(e, E::CountTooLarge { what, count, .. }
                    if what == "key-value count" && *count == 1 << 40)
            },
            words: &["key-value count is 1099511627776", "(corrupt or hostile file)"],
        },
        Case {
            name: "lying_string_length",
            bytes: patch(q.clone(), |b| put_u64(b, 24, u64::MAX - 1)),
            check: |e| matches!(e, E::CountTooLarge { what, .. } if what == "length of key 0"),
            words: &["length of key 0 is 18446744073709551614"],
        },
        Case {
            name: "lying_array_length",
            bytes: patch(q.clone(), |b| {
                let at = value_type_at(b, SECTIONS) + 8;
                put_u64(b, at, 1 << 61)
            }),
            check: |e| {
                matches!(e, E::CountTooLarge { what, .. }
                    if what == "array length of key 'qwen35moe.rope.dimension_sections'")
            },
            words: &["array length of key 'qwen35moe.rope.dimension_sections' is 2305843009213693952"],
        },
        // --- tensor infos ---
        Case {
            name: "huge_dims",
            bytes: patch(q.clone(), |b| {
                let (_, dims, _, _) = tensor_info_at(b, "token_embd.weight");
                put_u64(b, dims, 1 << 40);
                put_u64(b, dims + 8, 1 << 40);
            }),
            check: |e| {
                matches!(e, E::DimsOverflow { name, dims, .. }
                    if name == "token_embd.weight" && dims == &[1 << 40, 1 << 40])
            },
            words: &["tensor 'token_embd.weight': shape [1099511627776, 1099511627776] has more"],
        },
        Case {
            name: "dims_beyond_file",
            bytes: patch(q.clone(), |b| {
                let (_, dims, _, _) = tensor_info_at(b, "token_embd.weight");
                put_u64(b, dims, 1 << 20);
                put_u64(b, dims + 8, 1 << 20);
            }),
            check: |e| matches!(e, E::TensorOutOfBounds { name, .. } if name == "token_embd.weight"),
            words: &["tensor 'token_embd.weight': data ends at byte"],
        },
        Case {
            name: "overlapping_tensors",
            bytes: patch(q.clone(), |b| {
                let (_, _, _, offset) = tensor_info_at(b, "output_norm.weight");
                put_u64(b, offset, 0);
            }),
            check: |e| {
                matches!(e, E::Overlap { first, second, .. }
                    if first == "token_embd.weight" && second == "output_norm.weight")
            },
            words: &["tensors 'token_embd.weight' and 'output_norm.weight' overlap"],
        },
        Case {
            name: "misaligned_offset",
            bytes: patch(q.clone(), |b| {
                let (_, _, _, offset) = tensor_info_at(b, "output_norm.weight");
                let moved = get_u64(b, offset) + 4;
                put_u64(b, offset, moved);
            }),
            check: |e| {
                matches!(e, E::Misaligned { name, alignment: 32, .. } if name == "output_norm.weight")
            },
            words: &["tensor 'output_norm.weight': data offset", "not a multiple of the alignment 32"],
        },
        Case {
            name: "bad_alignment",
            bytes: patch(q.clone(), |b| {
                let at = value_type_at(b, "general.alignment") + 4;
                put_u32(b, at, 48)
            }),
            check: |e| matches!(e, E::BadAlignment { detail, .. } if detail.contains("48")),
            words: &["bad general.alignment: 48 is not a non-zero power of two"],
        },
        Case {
            name: "alignment_wrong_type",
            bytes: patch(q.clone(), |b| {
                let at = value_type_at(b, "general.alignment");
                put_u32(b, at, 5)
            }),
            check: |e| matches!(e, E::BadAlignment { .. }),
            words: &["bad general.alignment: type i32 (must be u32)"],
        },
        Case {
            name: "not_packed",
            bytes: patch(q.clone(), |b| {
                let (_, _, _, a) = tensor_info_at(b, "blk.0.attn_norm.weight");
                let (_, _, _, p) = tensor_info_at(b, "blk.0.post_attention_norm.weight");
                let (va, vp) = (get_u64(b, a), get_u64(b, p));
                put_u64(b, a, vp);
                put_u64(b, p, va);
            }),
            check: |e| matches!(e, E::NotPacked { name, .. } if name == "blk.0.attn_norm.weight"),
            words: &["llama.cpp expects the tensors packed in order"],
        },
        // --- types ---
        Case {
            name: "unknown_tensor_type",
            bytes: patch(q.clone(), |b| {
                let (_, _, ty, _) = tensor_info_at(b, "token_embd.weight");
                put_u32(b, ty, 99);
            }),
            check: |e| {
                matches!(e, E::BadType { name, type_id: 99, .. } if name == "token_embd.weight")
            },
            words: &["tensor 'token_embd.weight': unknown ggml type id 99"],
        },
        Case {
            name: "removed_tensor_type",
            bytes: patch(q.clone(), |b| {
                let (_, _, ty, _) = tensor_info_at(b, "token_embd.weight");
                put_u32(b, ty, 31);
            }),
            check: |e| matches!(e, E::BadType { type_id: 31, .. }),
            words: &["unknown ggml type id 31 (Q4_0_4_4, removed from GGUF by ggml)"],
        },
        Case {
            name: "unknown_value_type",
            bytes: patch(q.clone(), |b| {
                let at = value_type_at(b, "opledger.seed");
                put_u32(b, at, 13)
            }),
            check: |e| {
                matches!(e, E::BadValueType { key, type_id: 13, .. } if key == "opledger.seed")
            },
            words: &["metadata key 'opledger.seed' has invalid value type 13"],
        },
        Case {
            name: "array_of_arrays",
            bytes: patch(q.clone(), |b| {
                let at = value_type_at(b, SECTIONS) + 4;
                put_u32(b, at, 9)
            }),
            check: |e| matches!(e, E::BadValueType { key, type_id: 9, .. } if key == SECTIONS),
            words: &["(arrays of arrays are not supported)"],
        },
        Case {
            name: "unsupported_tensor_type",
            bytes: with_tensors(&MICRO_LLAMA, |t| t[0].ggml_type = GgmlType::I32),
            check: |e| {
                matches!(e, E::UnsupportedType { name, ggml_type: GgmlType::I32, .. }
                    if name == "token_embd.weight")
            },
            words: &["tensor 'token_embd.weight' has type I32", "has no kernel for it"],
        },
        Case {
            name: "f16_norm",
            bytes: with_tensors(&MICRO_LLAMA, |t| {
                let last_norm = t.iter_mut().find(|t| t.name == "output_norm.weight").unwrap();
                last_norm.ggml_type = GgmlType::F16;
            }),
            check: |e| {
                matches!(e, E::UnsupportedType { name, ggml_type: GgmlType::F16, .. }
                    if name == "output_norm.weight")
            },
            words: &["computes 1-D tensors and ssm_conv1d with F32 only"],
        },
        // --- strings and names ---
        Case {
            name: "non_utf8_key",
            bytes: patch(q.clone(), |b| {
                let at = string_at(b, "general.architecture") + 8;
                b[at] = 0xff;
            }),
            check: |e| matches!(e, E::NotUtf8 { what, .. } if what == "key 0"),
            words: &["key 0 is not valid UTF-8"],
        },
        Case {
            name: "non_utf8_value",
            bytes: patch(q.clone(), |b| {
                let at = value_type_at(b, "general.name") + 4 + 8;
                b[at] = 0xc3;
            }),
            check: |e| matches!(e, E::NotUtf8 { what, .. } if what == "value of key 'general.name'"),
            words: &["value of key 'general.name' is not valid UTF-8"],
        },
        Case {
            name: "non_utf8_tensor_name",
            bytes: patch(q.clone(), |b| {
                let at = string_at(b, "token_embd.weight") + 8;
                b[at] = 0x80;
            }),
            check: |e| matches!(e, E::NotUtf8 { what, .. } if what == "name of tensor 0"),
            words: &["name of tensor 0 is not valid UTF-8"],
        },
        Case {
            name: "duplicate_key",
            bytes: renamed(q.clone(), "opledger.source", "opledger.preset"),
            check: |e| matches!(e, E::DuplicateKey { key, .. } if key == "opledger.preset"),
            words: &["duplicate metadata key 'opledger.preset'"],
        },
        Case {
            name: "duplicate_tensor",
            bytes: renamed(l.clone(), "blk.0.attn_v.weight", "blk.0.attn_k.weight"),
            check: |e| matches!(e, E::DuplicateTensor { name, .. } if name == "blk.0.attn_k.weight"),
            words: &["duplicate tensor name 'blk.0.attn_k.weight'"],
        },
        // --- keys of the wrong type ---
        Case {
            name: "block_count_u64",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| set(m, "qwen35moe.block_count", Value::U64(2))),
            check: |e| {
                matches!(e, E::WrongKeyType { key, expected, found, .. }
                    if key == "qwen35moe.block_count" && expected == "u32" && found == "u64")
            },
            words: &["metadata key 'qwen35moe.block_count' has type u64; u32 expected"],
        },
        Case {
            name: "rms_eps_f64",
            bytes: with_meta(&MICRO_LLAMA, |m| {
                set(m, "llama.attention.layer_norm_rms_epsilon", Value::F64(1e-5))
            }),
            check: |e| {
                matches!(e, E::WrongKeyType { key, found, .. }
                    if key == "llama.attention.layer_norm_rms_epsilon" && found == "f64")
            },
            words: &["has type f64; f32 expected"],
        },
        Case {
            name: "architecture_not_a_string",
            bytes: with_meta(&MICRO_LLAMA, |m| set(m, "general.architecture", Value::U32(1))),
            check: |e| matches!(e, E::WrongKeyType { key, .. } if key == "general.architecture"),
            words: &["metadata key 'general.architecture' has type u32; str expected"],
        },
        Case {
            name: "sections_of_f32",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, SECTIONS, Value::Array(Array::F32(vec![1.0, 1.0, 0.0, 0.0])))
            }),
            check: |e| {
                matches!(e, E::WrongKeyType { key, found, .. }
                    if key == "qwen35moe.rope.dimension_sections" && found == "array of f32")
            },
            words: &["has type array of f32; array of i32, u32 or bool expected"],
        },
        Case {
            name: "per_layer_head_count",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, "qwen35moe.attention.head_count", Value::Array(Array::U32(vec![2, 2])))
            }),
            check: |e| {
                matches!(e, E::WrongKeyType { key, .. } if key == "qwen35moe.attention.head_count")
            },
            words: &["has type array of u32; u32 (llama.cpp takes a per-layer array"],
        },
        // --- missing keys ---
        Case {
            name: "unknown_architecture",
            bytes: with_meta(&MICRO_LLAMA, |m| {
                set(m, "general.architecture", Value::String("llama5".into()))
            }),
            check: |e| matches!(e, E::ArchNotLoadable { arch, .. } if arch == "llama5"),
            words: &["'general.architecture' is 'llama5': not an architecture the linked llama.cpp"],
        },
        Case {
            name: "missing_architecture",
            bytes: with_meta(&MICRO_LLAMA, |m| remove(m, "general.architecture")),
            check: |e| matches!(e, E::MissingKey { key, .. } if key == "general.architecture"),
            words: &["metadata key 'general.architecture' is missing"],
        },
        Case {
            name: "missing_ssm_state_size",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| remove(m, "qwen35moe.ssm.state_size")),
            check: |e| matches!(e, E::MissingKey { key, .. } if key == "qwen35moe.ssm.state_size"),
            words: &["'qwen35moe.ssm.state_size' is missing; llama.cpp's qwen35moe requires it"],
        },
        Case {
            name: "missing_tokenizer_model",
            bytes: with_meta(&MICRO_QWEN3, |m| remove(m, "tokenizer.ggml.model")),
            check: |e| matches!(e, E::MissingKey { key, .. } if key == "tokenizer.ggml.model"),
            words: &["'tokenizer.ggml.model' is missing; llama.cpp's vocabulary loader requires it"],
        },
        Case {
            name: "missing_rms_eps",
            bytes: with_meta(&MICRO_LLAMA, |m| remove(m, "llama.attention.layer_norm_rms_epsilon")),
            check: |e| {
                matches!(e, E::MissingKey { key, .. }
                    if key == "llama.attention.layer_norm_rms_epsilon")
            },
            words: &["is missing; llama.cpp's llama requires it"],
        },
        Case {
            name: "missing_vocab_size",
            bytes: with_meta(&MICRO_QWEN3MOE, |m| remove(m, "qwen3moe.vocab_size")),
            check: |e| matches!(e, E::MissingKey { key, .. } if key == "qwen3moe.vocab_size"),
            words: &["'qwen3moe.vocab_size' is missing; a model without tokenizer"],
        },
        Case {
            name: "missing_expert_count",
            bytes: with_meta(&MICRO_QWEN3MOE, |m| {
                remove(m, "qwen3moe.expert_count");
                remove(m, "qwen3moe.expert_used_count");
            }),
            check: |e| matches!(e, E::MissingKey { key, .. } if key == "qwen3moe.expert_count"),
            words: &["'qwen3moe.expert_count' is missing; llama.cpp's qwen3moe requires it"],
        },
        // --- key values llama.cpp would abort on ---
        Case {
            name: "zero_layers",
            bytes: with_meta(&MICRO_QWEN3, |m| set(m, "qwen3.block_count", Value::U32(0))),
            check: |e| matches!(e, E::BadKeyValue { key, .. } if key == "qwen3.block_count"),
            words: &["'qwen3.block_count': 0 layers; llama.cpp takes 1 to 512"],
        },
        Case {
            name: "too_many_experts",
            bytes: with_meta(&MICRO_QWEN3MOE, |m| {
                set(m, "qwen3moe.expert_count", Value::U32(5000))
            }),
            check: |e| matches!(e, E::BadKeyValue { key, .. } if key == "qwen3moe.expert_count"),
            words: &["5000 experts; llama.cpp takes at most 1024"],
        },
        Case {
            name: "more_experts_used_than_experts",
            bytes: with_meta(&MICRO_QWEN3MOE, |m| {
                set(m, "qwen3moe.expert_used_count", Value::U32(3))
            }),
            check: |e| {
                matches!(e, E::BadKeyValue { key, .. } if key == "qwen3moe.expert_used_count")
            },
            words: &["3 is more than the expert count 2"],
        },
        Case {
            name: "kv_heads_do_not_divide",
            bytes: with_meta(&MICRO_QWEN3, |m| {
                set(m, "qwen3.attention.head_count_kv", Value::U32(3))
            }),
            check: |e| {
                matches!(e, E::BadKeyValue { key, .. } if key == "qwen3.attention.head_count_kv")
            },
            words: &["3 does not divide the head count 2"],
        },
        Case {
            name: "rope_dims_not_head_dim",
            bytes: with_meta(&MICRO_QWEN3, |m| {
                set(m, "qwen3.rope.dimension_count", Value::U32(2))
            }),
            check: |e| {
                matches!(e, E::BadKeyValue { key, .. } if key == "qwen3.rope.dimension_count")
            },
            words: &["needs it equal to the head dim 4"],
        },
        Case {
            name: "unknown_rope_scaling",
            bytes: with_meta(&MICRO_LLAMA, |m| {
                set(m, "llama.rope.scaling.type", Value::String("bogus".into()))
            }),
            check: |e| matches!(e, E::BadKeyValue { key, .. } if key == "llama.rope.scaling.type"),
            words: &["'bogus' is not a rope scaling llama.cpp knows"],
        },
        Case {
            name: "sections_wrong_length",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, SECTIONS, Value::Array(Array::I32(vec![1, 1, 0])))
            }),
            check: |e| matches!(e, E::BadKeyValue { key, .. } if key == SECTIONS),
            words: &["3 entries; llama.cpp reads exactly 4"],
        },
        Case {
            name: "value_heads_not_multiple_of_key_heads",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, "qwen35moe.ssm.group_count", Value::U32(3))
            }),
            check: |e| {
                matches!(e, E::BadKeyValue { key, .. } if key == "qwen35moe.ssm.time_step_rank")
            },
            words: &["2 value heads are not a multiple of the 3 key heads"],
        },
        Case {
            name: "inner_size_mismatch",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, "qwen35moe.ssm.inner_size", Value::U32(12))
            }),
            check: |e| matches!(e, E::BadKeyValue { key, .. } if key == "qwen35moe.ssm.inner_size"),
            words: &["12, not ssm.state_size x ssm.time_step_rank = 4"],
        },
        Case {
            name: "zero_full_attention_interval",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, "qwen35moe.full_attention_interval", Value::U32(0))
            }),
            check: |e| {
                matches!(e, E::BadKeyValue { key, .. } if key == "qwen35moe.full_attention_interval")
            },
            words: &["is 0; it must be above 0"],
        },
        Case {
            name: "recurrent_layers_wrong_length",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, "qwen35moe.attention.recurrent_layers", Value::Array(Array::Bool(vec![true])))
            }),
            check: |e| {
                matches!(e, E::BadKeyValue { key, .. } if key == "qwen35moe.attention.recurrent_layers")
            },
            words: &["1 entries for 2 layers"],
        },
        // --- tensors against the architecture ---
        Case {
            name: "missing_tensor_ssm_a",
            bytes: with_tensors(&MICRO_QWEN35MOE, |t| t.retain(|t| t.name != "blk.0.ssm_a")),
            check: |e| matches!(e, E::MissingTensor { name, .. } if name == "blk.0.ssm_a"),
            words: &["tensor 'blk.0.ssm_a' is missing; llama.cpp's qwen35moe requires it"],
        },
        Case {
            name: "missing_output_norm",
            bytes: with_tensors(&MICRO_QWEN3, |t| t.retain(|t| t.name != "output_norm.weight")),
            check: |e| matches!(e, E::MissingTensor { name, .. } if name == "output_norm.weight"),
            words: &["tensor 'output_norm.weight' is missing; llama.cpp's qwen3 requires it"],
        },
        Case {
            name: "fused_gate_up_in_qwen3moe",
            bytes: with_tensors(&MICRO_QWEN3MOE, |t| {
                t.retain(|t| !t.name.ends_with("ffn_up_exps.weight"));
                let gate = t.iter_mut().find(|t| t.name.ends_with("ffn_gate_exps.weight")).unwrap();
                *gate = TensorSpec::new("blk.0.ffn_gate_up_exps.weight", &[8, 8, 2], GgmlType::F32);
            }),
            check: |e| {
                matches!(e, E::MissingTensor { name, .. } if name == "blk.0.ffn_gate_exps.weight")
            },
            words: &["tensor 'blk.0.ffn_gate_exps.weight' is missing; llama.cpp's qwen3moe"],
        },
        Case {
            name: "wrong_shape_attn_q",
            bytes: with_tensors(&MICRO_QWEN35MOE, |t| {
                // Query without its gate half: {E, hd * nh} instead of {E, hd * nh * 2}.
                let q = t.iter_mut().find(|t| t.name == "blk.1.attn_q.weight").unwrap();
                q.dims = vec![8, 8];
            }),
            check: |e| {
                matches!(e, E::WrongShape { name, expected, found, .. }
                    if name == "blk.1.attn_q.weight" && expected == &[8, 16] && found == &[8, 8])
            },
            words: &["tensor 'blk.1.attn_q.weight' has shape [8, 8]; the qwen35moe metadata of the file implies [8, 16]"],
        },
        Case {
            name: "shape_disagrees_with_metadata",
            bytes: with_meta(&MICRO_LLAMA, |m| {
                set(m, "llama.embedding_length", Value::U32(32))
            }),
            check: |e| {
                matches!(e, E::WrongShape { name, expected, found, .. }
                    if name == "token_embd.weight" && expected == &[32, 4] && found == &[8, 4])
            },
            words: &["tensor 'token_embd.weight' has shape [8, 4]; the llama metadata of the file implies [32, 4]"],
        },
        Case {
            name: "conv_kernel_disagrees",
            bytes: with_meta(&MICRO_QWEN35MOE, |m| {
                set(m, "qwen35moe.ssm.conv_kernel", Value::U32(4))
            }),
            check: |e| {
                matches!(e, E::WrongShape { name, expected, found, .. }
                    if name == "blk.0.ssm_conv1d.weight" && expected == &[4, 8] && found == &[2, 8])
            },
            words: &["tensor 'blk.0.ssm_conv1d.weight' has shape [2, 8]"],
        },
        Case {
            name: "implied_shape_overflow",
            bytes: with_meta(&MICRO_LLAMA, |m| {
                set(m, "llama.embedding_length", Value::U32(u32::MAX));
                set(m, "llama.vocab_size", Value::U32(u32::MAX));
            }),
            check: |e| {
                matches!(e, E::ImpliedShapeOverflow { name, .. } if name == "token_embd.weight")
            },
            words: &["the llama metadata of the file implies tensor 'token_embd.weight'", "more than ggml can hold"],
        },
    ]
}

#[test]
fn every_malformed_file_gets_its_exact_error() {
    let cases = cases();
    assert!(cases.len() >= 30, "only {} cases", cases.len());
    let mut names = std::collections::HashSet::new();
    for case in &cases {
        assert!(names.insert(case.name), "duplicate case {}", case.name);
        let e = match gate(case.name, &case.bytes) {
            Ok(check) => panic!("{}: accepted ({check:?})", case.name),
            Err(e) => e,
        };
        let msg = e.to_string();
        assert!(
            (case.check)(&e),
            "{}: wrong error {e:?}\n  {msg}",
            case.name
        );
        assert!(
            msg.starts_with(&format!("{}.gguf: ", case.name)),
            "{}: the message does not start with the file name: {msg}",
            case.name
        );
        for w in case.words {
            assert!(msg.contains(w), "{}: '{w}' not in: {msg}", case.name);
        }
    }
}

#[test]
fn micro_models_of_every_arch_pass() {
    for preset in MICRO {
        let bytes = micro_file(&preset, |_| {}, |_| {});
        let check = gate(preset.name, &bytes).unwrap();
        let n_tensors = GgufFile::read_from(Cursor::new(bytes.clone()), "x.gguf")
            .unwrap()
            .tensors
            .len();
        assert_eq!(check.arch, preset.arch.as_str());
        assert!(check.tensors_planned);
        assert_eq!(check.tensors_checked, n_tensors, "{}", preset.name);
        assert!(check.notes.is_empty(), "{}: {:?}", preset.name, check.notes);
    }
}

#[test]
fn llama_cpp_alternatives_pass() {
    // A tied head: no output.weight.
    let b = with_tensors(&MICRO_LLAMA, |t| t.retain(|t| t.name != "output.weight"));
    gate("tied", &b).unwrap();
    // No rope factors.
    let b = with_tensors(&MICRO_LLAMA, |t| {
        t.retain(|t| t.name != "rope_freqs.weight")
    });
    gate("no-rope-freqs", &b).unwrap();
    // A fused attn_qkv {E, q + k + v} instead of attn_q, attn_k, attn_v.
    let b = with_tensors(&MICRO_QWEN3, |t| {
        t.retain(|t| !t.name.ends_with("attn_k.weight") && !t.name.ends_with("attn_v.weight"));
        let q = t
            .iter_mut()
            .find(|t| t.name == "blk.0.attn_q.weight")
            .unwrap();
        *q = TensorSpec::new("blk.0.attn_qkv.weight", &[8, 8 + 4 + 4], GgmlType::F32);
    });
    gate("fused-qkv", &b).unwrap();
    // qwen35moe's fused ffn_gate_up_exps {E, 2 ff, n}.
    let b = with_tensors(&MICRO_QWEN35MOE, |t| {
        for il in 0..2 {
            t.retain(|t| t.name != format!("blk.{il}.ffn_up_exps.weight"));
            let gate = format!("blk.{il}.ffn_gate_exps.weight");
            let g = t.iter_mut().find(|t| t.name == gate).unwrap();
            *g = TensorSpec::new(
                format!("blk.{il}.ffn_gate_up_exps.weight"),
                &[8, 8, 2],
                GgmlType::F32,
            );
        }
    });
    gate("fused-gate-up", &b).unwrap();
    // The layer pattern as an array: the same pattern passes, another one does not.
    let key = "qwen35moe.attention.recurrent_layers";
    let b = with_meta(&MICRO_QWEN35MOE, |m| {
        set(m, key, Value::Array(Array::I32(vec![1, 0])))
    });
    gate("recurrent-array", &b).unwrap();
    let b = with_meta(&MICRO_QWEN35MOE, |m| {
        set(m, key, Value::Array(Array::I32(vec![0, 1])))
    });
    // Layer 0 is then full attention, where llama.cpp reads the delta-net's attn_qkv as a
    // fused query-key-value projection {E, q + k + v}, of another shape.
    let e = gate("recurrent-swapped", &b).unwrap_err();
    assert!(
        matches!(e, GgufError::WrongShape { ref name, ref expected, .. }
            if name == "blk.0.attn_qkv.weight" && expected == &[8, 16 + 4 + 4]),
        "{e}"
    );
    // Trailing dims of 1 are the same shape to ggml.
    let b = with_tensors(&MICRO_QWEN3, |t| {
        let n = t
            .iter_mut()
            .find(|t| t.name == "output_norm.weight")
            .unwrap();
        n.dims = vec![8, 1];
    });
    gate("trailing-one", &b).unwrap();
}

#[test]
fn archs_without_a_tensor_plan_get_their_keys_checked_and_a_note() {
    // A qwen3 file relabelled qwen2: an architecture llama.cpp loads, whose tensors opledger
    // does not plan (qwen2 has no q/k norms; they are not checked).
    let b = with_meta(&MICRO_QWEN3, |m| {
        for (k, v) in m.iter_mut() {
            if let Some(rest) = k.strip_prefix("qwen3.") {
                *k = format!("qwen2.{rest}");
            }
            if k == "general.architecture" {
                *v = Value::String("qwen2".into());
            }
        }
    });
    let check = gate("qwen2", &b).unwrap();
    assert!(!check.tensors_planned);
    assert_eq!(check.arch, "qwen2");
    assert_eq!(check.tensors_checked, 0);
    assert!(
        check.notes[0].contains("the tensors of this qwen2 file were not checked by opledger"),
        "{:?}",
        check.notes
    );
    // Its keys are checked: a rope smaller than the head aborts qwen2's graph.
    let bad = with_meta(&MICRO_QWEN3, |m| {
        for (k, v) in m.iter_mut() {
            if let Some(rest) = k.strip_prefix("qwen3.") {
                *k = format!("qwen2.{rest}");
            }
            if k == "general.architecture" {
                *v = Value::String("qwen2".into());
            }
            if k == "qwen2.rope.dimension_count" {
                *v = Value::U32(2);
            }
        }
    });
    assert!(matches!(
        gate("qwen2-rope", &bad),
        Err(GgufError::BadKeyValue { ref key, .. }) if key == "qwen2.rope.dimension_count"
    ));
    // And the structure is still checked.
    let b = patch(b, |b| {
        let (_, _, _, a) = tensor_info_at(b, "blk.0.attn_norm.weight");
        let (_, _, _, f) = tensor_info_at(b, "blk.0.ffn_norm.weight");
        let (va, vf) = (get_u64(b, a), get_u64(b, f));
        put_u64(b, a, vf);
        put_u64(b, f, va);
    });
    assert!(matches!(
        gate("qwen2-unpacked", &b),
        Err(GgufError::NotPacked { .. })
    ));
}

#[test]
fn extra_tensors_are_noted_not_refused() {
    let b = with_tensors(&MICRO_LLAMA, |t| {
        t.push(TensorSpec::new(
            "blk.0.attn_output.bias",
            &[8],
            GgmlType::F32,
        ));
    });
    let check = gate("with-bias", &b).unwrap();
    assert_eq!(check.notes.len(), 1);
    assert!(
        check.notes[0].contains("'blk.0.attn_output.bias'"),
        "{:?}",
        check.notes
    );
}

/// Writes the seed corpus of the fuzzer: every micro model and every malformed case.
/// `cargo test --release -p opledger-gguf --test malformed -- --ignored write_fuzz_seeds`
#[test]
#[ignore = "writes fuzz/seeds/gguf; run by hand when the cases change"]
fn write_fuzz_seeds() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/gguf");
    std::fs::create_dir_all(&dir).unwrap();
    for preset in MICRO {
        let bytes = micro_file(&preset, |_| {}, |_| {});
        std::fs::write(dir.join(format!("{}.gguf", preset.name)), bytes).unwrap();
    }
    for case in cases() {
        std::fs::write(dir.join(format!("{}.gguf", case.name)), case.bytes).unwrap();
    }
}
