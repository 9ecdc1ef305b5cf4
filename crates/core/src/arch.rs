//! What the model's metadata says about its architecture: layers and their kinds, experts, heads.
//! Built from GGUF keys by the caller (core reads no files), used by the categoriser's layer rules,
//! the audit and the census cross-check.

use serde::{Deserialize, Serialize};

/// The kind of a transformer layer's token mixer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LayerKind {
    /// Softmax attention over the whole context (with a KV cache).
    FullAttention,
    /// A recurrent mixer (gated delta-net, SSM scan) with a fixed-size state.
    LinearAttention,
}

impl LayerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LayerKind::FullAttention => "full_attention",
            LayerKind::LinearAttention => "linear_attention",
        }
    }
}

/// The architecture facts opledger needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArchInfo {
    /// `general.architecture` (`qwen35moe`, `qwen3moe`, `qwen3`, `llama`).
    pub arch: String,
    /// Kind of every layer, in order.
    pub layer_kinds: Vec<LayerKind>,
    /// Routed experts per MoE layer (0 for a dense FFN).
    pub n_experts: u32,
    /// Experts each token is routed to.
    pub n_experts_used: u32,
    /// A shared expert runs beside the routed ones.
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
    /// key-head groups, value heads (`ssm.*`); all 0 without linear-attention layers.
    #[serde(default)]
    pub ssm_conv_kernel: u32,
    #[serde(default)]
    pub ssm_state_size: u32,
    #[serde(default)]
    pub ssm_group_count: u32,
    #[serde(default)]
    pub ssm_time_step_rank: u32,
    /// Width of one expert's FFN (MoE) or of the dense FFN.
    #[serde(default)]
    pub ffn_length: u32,
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
    fn get_i64_array(&self, key: &str) -> Option<Vec<i64>>;
    fn get_string(&self, key: &str) -> Option<String>;
    fn has_tensor(&self, name: &str) -> bool;
}

impl ArchInfo {
    /// Reads the architecture from metadata by the rules the vendored llama.cpp applies.
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
        let recurrent = recurrent_layers(&arch, md, n_layer)?;
        let layer_kinds = recurrent
            .iter()
            .map(|&r| {
                if r {
                    LayerKind::LinearAttention
                } else {
                    LayerKind::FullAttention
                }
            })
            .collect();
        let n_experts = md.get_u64(&key("expert_count")).unwrap_or(0) as u32;
        let n_experts_used = md.get_u64(&key("expert_used_count")).unwrap_or(0) as u32;
        let n_vocab = md
            .get_u64(&key("vocab_size"))
            .or_else(|| md.get_u64("tokenizer.ggml.vocab_size"))
            .unwrap_or(0) as u32;
        let n_head = req("attention.head_count")? as u32;
        let n_embd = req("embedding_length")? as u32;
        let head_dim = n_embd.checked_div(n_head).unwrap_or(0);
        let opt = |k: &str| md.get_u64(&key(k)).unwrap_or(0) as u32;
        Ok(ArchInfo {
            layer_kinds,
            n_experts,
            n_experts_used,
            shared_expert: md.has_tensor("blk.0.ffn_down_shexp.weight"),
            fused_gate_up: md.has_tensor("blk.0.ffn_gate_up_exps.weight"),
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
            ffn_length: md
                .get_u64(&key("expert_feed_forward_length"))
                .or_else(|| md.get_u64(&key("feed_forward_length")))
                .unwrap_or(0) as u32,
            n_head_kv: md
                .get_u64(&key("attention.head_count_kv"))
                .unwrap_or(n_head as u64) as u32,
            n_vocab,
            arch,
        })
    }

    pub fn n_layers(&self) -> u32 {
        self.layer_kinds.len() as u32
    }

    pub fn layers_of(&self, kind: LayerKind) -> u32 {
        self.layer_kinds.iter().filter(|&&k| k == kind).count() as u32
    }

    pub fn kind_of(&self, layer: u32) -> Option<LayerKind> {
        self.layer_kinds.get(layer as usize).copied()
    }

    pub fn is_moe(&self) -> bool {
        self.n_experts > 0
    }
}

/// Which layers are recurrent, as llama.cpp decides it for each architecture.
fn recurrent_layers(arch: &str, md: &dyn Metadata, n_layer: usize) -> Result<Vec<bool>, ArchError> {
    match arch {
        // llama_model_qwen35(moe)/qwen3next::load_arch_hparams: the array
        // `attention.recurrent_layers` if present, else full attention where
        // (i + 1) % full_attention_interval == 0 (interval 4 by default).
        "qwen35moe" | "qwen35" | "qwen3next" => {
            let arr_key = format!("{arch}.attention.recurrent_layers");
            if let Some(arr) = md.get_i64_array(&arr_key) {
                if arr.len() != n_layer {
                    return Err(ArchError::BadKey {
                        key: arr_key,
                        why: format!("{} entries for {n_layer} layers", arr.len()),
                    });
                }
                return Ok(arr.iter().map(|&v| v != 0).collect());
            }
            let interval_key = format!("{arch}.full_attention_interval");
            let interval = md.get_u64(&interval_key).unwrap_or(4);
            if interval == 0 {
                return Err(ArchError::BadKey {
                    key: interval_key,
                    why: "an interval of 0".into(),
                });
            }
            Ok((0..n_layer as u64)
                .map(|i| (i + 1) % interval != 0)
                .collect())
        }
        _ => Ok(vec![false; n_layer]),
    }
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

    pub fn qwen35moe_md(layers: u64) -> MapMetadata {
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
        md.tensors.push("blk.0.ffn_down_shexp.weight".into());
        md
    }

    #[test]
    fn qwen35moe_every_fourth_layer_is_full_attention() {
        let info = ArchInfo::from_metadata(&qwen35moe_md(40)).unwrap();
        assert_eq!(info.layers_of(LayerKind::FullAttention), 10);
        assert_eq!(info.layers_of(LayerKind::LinearAttention), 30);
        assert_eq!(info.kind_of(3), Some(LayerKind::FullAttention));
        assert_eq!(info.kind_of(0), Some(LayerKind::LinearAttention));
        assert!(info.shared_expert && !info.fused_gate_up);
        let four = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        assert_eq!(
            four.layer_kinds
                .iter()
                .filter(|k| **k == LayerKind::FullAttention)
                .count(),
            1
        );
    }

    #[test]
    fn recurrent_layers_array_wins_and_is_checked() {
        let mut md = qwen35moe_md(4);
        md.a.insert(
            "qwen35moe.attention.recurrent_layers".into(),
            vec![0, 1, 1, 0],
        );
        let info = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(info.layers_of(LayerKind::FullAttention), 2);
        md.a.insert("qwen35moe.attention.recurrent_layers".into(), vec![0, 1]);
        let err = ArchInfo::from_metadata(&md).unwrap_err();
        assert!(err.to_string().contains("2 entries for 4 layers"), "{err}");
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
