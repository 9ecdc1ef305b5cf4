//! The architecture hyperparameters the forward pass needs, read from GGUF metadata by the rules
//! the vendored llama.cpp applies (`src/models/{qwen3moe,qwen3,llama}.cpp`, `llama-hparams`).

use opledger_gguf::GgufFile;

use crate::error::CandleError;

/// The architectures this engine implements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    /// Qwen3 MoE: q/k norms, NEOX rope, softmax router with renormalised top-k.
    Qwen3Moe,
    /// Dense Qwen3: q/k norms, NEOX rope, SwiGLU FFN.
    Qwen3,
    /// Llama (2/3): no q/k norms, interleaved ("normal") rope with optional frequency factors,
    /// SwiGLU FFN, or a MoE FFN when the file has a router (Mixtral-style files).
    Llama,
}

impl Arch {
    pub fn from_name(name: &str) -> Option<Arch> {
        match name {
            "qwen3moe" => Some(Arch::Qwen3Moe),
            "qwen3" => Some(Arch::Qwen3),
            "llama" => Some(Arch::Llama),
            _ => None,
        }
    }

    /// ggml's rope mode for the arch (`llama_model_rope_type`).
    pub fn rope_style(self) -> RopeStyle {
        match self {
            Arch::Qwen3Moe | Arch::Qwen3 => RopeStyle::Neox,
            Arch::Llama => RopeStyle::Normal,
        }
    }

    /// Per-head RMS norms of Q and K before rope.
    pub fn has_qk_norm(self) -> bool {
        matches!(self, Arch::Qwen3Moe | Arch::Qwen3)
    }
}

/// How rope pairs dimensions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// GPT-NeoX: dimension i with i + d/2 (`rope_thd`).
    Neox,
    /// Adjacent pairs 2i, 2i+1 (`rope_i`).
    Normal,
}

/// What the forward pass needs to know about the model.
#[derive(Debug, Clone, PartialEq)]
pub struct Hparams {
    pub arch: Arch,
    pub arch_name: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    pub n_vocab: usize,
    pub rms_eps: f32,
    pub rope_base: f32,
    /// 1 / linear scaling factor (1 without scaling).
    pub rope_freq_scale: f32,
    pub kq_scale: f32,
    /// Routed experts (0: a dense FFN).
    pub n_expert: usize,
    pub n_expert_used: usize,
    /// Scale of the routing weights after renormalisation (0 or 1: none).
    pub expert_weights_scale: f32,
}

impl Hparams {
    /// Reads the hyperparameters of `file`; errors name the file and the key.
    pub fn from_gguf(file: &GgufFile) -> Result<Hparams, CandleError> {
        let path = file.path.as_path();
        let bad = |what: String| CandleError::Model {
            path: path.to_path_buf(),
            what,
        };
        let arch_name = file
            .arch()
            .ok_or_else(|| bad("missing metadata key general.architecture".into()))?
            .to_string();
        let arch = Arch::from_name(&arch_name).ok_or_else(|| CandleError::UnsupportedArch {
            path: path.to_path_buf(),
            arch: arch_name.clone(),
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let req = |k: &str| -> Result<usize, CandleError> {
            file.get_u64(&key(k))
                .map(|v| v as usize)
                .ok_or_else(|| bad(format!("missing metadata key {}", key(k))))
        };
        let n_layer = req("block_count")?;
        let n_embd = req("embedding_length")?;
        let n_head = req("attention.head_count")?;
        let n_head_kv = file
            .get_u64(&key("attention.head_count_kv"))
            .map(|v| v as usize)
            .unwrap_or(n_head);
        if n_head == 0 || n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(bad(format!(
                "{n_head} query heads cannot share {n_head_kv} key/value heads"
            )));
        }
        let head_dim = file
            .get_u64(&key("attention.key_length"))
            .map(|v| v as usize)
            .unwrap_or(n_embd / n_head);
        let head_dim_v = file
            .get_u64(&key("attention.value_length"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if head_dim_v != head_dim || head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(bad(format!(
                "key length {head_dim} and value length {head_dim_v} must be equal and even"
            )));
        }
        let n_rot = file
            .get_u64(&key("rope.dimension_count"))
            .map(|v| v as usize)
            .unwrap_or(head_dim);
        if n_rot != head_dim {
            // llama.cpp asserts it for these archs too.
            return Err(bad(format!(
                "rope dimension count {n_rot} differs from the head dimension {head_dim}"
            )));
        }
        let rms_eps = file
            .get_f32(&key("attention.layer_norm_rms_epsilon"))
            .ok_or_else(|| {
                bad(format!(
                    "missing metadata key {}",
                    key("attention.layer_norm_rms_epsilon")
                ))
            })?;
        let rope_base = file.get_f32(&key("rope.freq_base")).unwrap_or(10_000.0);
        let rope_freq_scale = match file.get_str(&key("rope.scaling.type")) {
            None | Some("none") => 1.0,
            Some("linear") => {
                let f = file.get_f32(&key("rope.scaling.factor")).unwrap_or(1.0);
                if f > 0.0 {
                    1.0 / f
                } else {
                    1.0
                }
            }
            Some(other) => {
                return Err(bad(format!(
                    "rope scaling '{other}' is not implemented by the candle engine"
                )))
            }
        };
        let kq_scale = match file.get_f32(&key("attention.scale")) {
            Some(s) if s != 0.0 => s,
            _ => 1.0 / (head_dim as f32).sqrt(),
        };
        let n_expert = file
            .get_u64(&key("expert_count"))
            .map(|v| v as usize)
            .unwrap_or(0);
        let n_expert_used = file
            .get_u64(&key("expert_used_count"))
            .map(|v| v as usize)
            .unwrap_or(0);
        if arch == Arch::Qwen3Moe && (n_expert == 0 || n_expert_used == 0) {
            return Err(bad(
                "qwen3moe needs expert_count and expert_used_count".into()
            ));
        }
        if n_expert_used > n_expert {
            return Err(bad(format!("{n_expert_used} experts used of {n_expert}")));
        }
        let n_vocab =
            file.tensor("token_embd.weight")
                .and_then(|t| t.dims.get(1).copied())
                .ok_or_else(|| bad("no 2-D tensor token_embd.weight".into()))? as usize;
        let expert_weights_scale = file.get_f32(&key("expert_weights_scale")).unwrap_or(0.0);
        Ok(Hparams {
            arch,
            arch_name,
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim,
            n_vocab,
            rms_eps,
            rope_base,
            rope_freq_scale,
            kq_scale,
            n_expert,
            n_expert_used,
            expert_weights_scale,
        })
    }

    pub fn is_moe(&self) -> bool {
        self.n_expert > 0
    }

    /// Query heads per key/value head.
    pub fn n_rep(&self) -> usize {
        self.n_head / self.n_head_kv
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_gguf::{synthesize, SynthOptions};

    fn hparams(preset: &str) -> Result<Hparams, CandleError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(format!("{preset}.gguf"));
        synthesize(&SynthOptions::new(preset), &path, &mut |_, _| {}).unwrap();
        Hparams::from_gguf(&GgufFile::open(&path).unwrap())
    }

    #[test]
    fn qwen3moe_hyperparameters_come_from_the_metadata() {
        let hp = hparams("tiny-qwen3moe").unwrap();
        assert_eq!(hp.arch, Arch::Qwen3Moe);
        assert_eq!((hp.n_layer, hp.n_embd, hp.n_vocab), (4, 256, 2048));
        assert_eq!((hp.n_head, hp.n_head_kv, hp.head_dim), (4, 2, 128));
        assert_eq!((hp.n_expert, hp.n_expert_used), (16, 4));
        assert_eq!(hp.n_rep(), 2);
        assert_eq!(hp.rms_eps, 1e-6);
        assert_eq!(hp.rope_base, 1e6);
        assert!((hp.kq_scale - 1.0 / 128f32.sqrt()).abs() < 1e-9);
        assert_eq!(hp.arch.rope_style(), RopeStyle::Neox);
    }

    #[test]
    fn llama_uses_interleaved_rope_without_qk_norms() {
        let hp = hparams("tiny-llama").unwrap();
        assert_eq!(hp.arch.rope_style(), RopeStyle::Normal);
        assert!(!hp.arch.has_qk_norm());
        assert!(!hp.is_moe());
    }

    #[test]
    fn an_unimplemented_arch_is_refused_by_name() {
        let err = hparams("tiny-qwen35moe").unwrap_err().to_string();
        assert!(
            err.contains("qwen35moe") && err.contains("not implemented"),
            "{err}"
        );
    }
}
