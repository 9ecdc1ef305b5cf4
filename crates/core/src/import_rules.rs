//! Import rules: a small TOML file per engine that maps the spans of its traces to bands by
//! patterns on the span's name, category, parent span and arguments (first matching rule wins),
//! and the built-in sets (`crates/core/import-rules/`).

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::band::BandDef;
use crate::trace::SpanKey;

/// The built-in rule sets: (name, file name, TOML text).
pub const BUILTIN_IMPORT_RULES: [(&str, &str, &str); 2] = [
    (
        "candle",
        "candle.toml",
        include_str!("../import-rules/candle.toml"),
    ),
    (
        "pytorch",
        "pytorch.toml",
        include_str!("../import-rules/pytorch.toml"),
    ),
];

/// A pattern on one argument of a span.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArgPattern {
    pub key: String,
    pub pattern: String,
}

/// One rule: every pattern given must match.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleText {
    pub band: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cat: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parent: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arg: Option<ArgPattern>,
    /// Patterns that must each match the span's own name or the name of a context span it is
    /// nested in (for device activity: of its launch's), e.g. a linear layer inside an
    /// attention module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub within: Vec<String>,
}

/// An import rule file as written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportRulesText {
    /// The engine whose traces these rules read.
    pub engine: String,
    /// What one span of this engine covers (its granularity), stated beside every comparison.
    pub granularity: String,
    /// The pattern of a step span's name (a forward pass); `--step` overrides it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// The names of spans that are context for the spans nested in them (modules,
    /// annotations, ops), which `within` patterns read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    pub bands: Vec<BandDef>,
    pub rules: Vec<RuleText>,
}

struct Compiled {
    band: String,
    name: Option<Regex>,
    cat: Option<Regex>,
    parent: Option<Regex>,
    arg: Option<(String, Regex)>,
    within: Vec<Regex>,
}

/// A checked rule set with its patterns compiled.
pub struct ImportRules {
    pub text: ImportRulesText,
    compiled: Vec<Compiled>,
}

#[derive(Debug, thiserror::Error)]
pub enum ImportRulesError {
    #[error("{file}: invalid import rules: {source}")]
    Parse {
        file: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("{file}: rule {rule}: pattern /{pattern}/: {why}")]
    Pattern {
        file: String,
        rule: usize,
        pattern: String,
        why: String,
    },
    #[error("{file}: rule {rule} names band '{band}', which is not in the file's bands")]
    UnknownBand {
        file: String,
        rule: usize,
        band: String,
    },
    #[error(
        "{file}: rule {rule} has no pattern (name, cat, parent, arg or within): it would match every span"
    )]
    Empty { file: String, rule: usize },
}

impl ImportRules {
    /// Parses and checks a rule file; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<ImportRules, ImportRulesError> {
        let t: ImportRulesText = toml::from_str(text).map_err(|e| ImportRulesError::Parse {
            file: file.into(),
            source: Box::new(e),
        })?;
        let re = |rule: usize, p: &Option<String>| -> Result<Option<Regex>, ImportRulesError> {
            p.as_deref()
                .map(|p| {
                    Regex::new(p).map_err(|e| ImportRulesError::Pattern {
                        file: file.into(),
                        rule,
                        pattern: p.into(),
                        why: e.to_string(),
                    })
                })
                .transpose()
        };
        let mut compiled = Vec::new();
        for (i, r) in t.rules.iter().enumerate() {
            let rule = i + 1;
            if !t.bands.iter().any(|b| b.name == r.band) {
                return Err(ImportRulesError::UnknownBand {
                    file: file.into(),
                    rule,
                    band: r.band.clone(),
                });
            }
            if r.name.is_none()
                && r.cat.is_none()
                && r.parent.is_none()
                && r.arg.is_none()
                && r.within.is_empty()
            {
                return Err(ImportRulesError::Empty {
                    file: file.into(),
                    rule,
                });
            }
            let arg = match &r.arg {
                Some(a) => Some((
                    a.key.clone(),
                    re(rule, &Some(a.pattern.clone()))?.expect("given"),
                )),
                None => None,
            };
            let mut within = Vec::new();
            for w in &r.within {
                within.push(re(rule, &Some(w.clone()))?.expect("given"));
            }
            compiled.push(Compiled {
                band: r.band.clone(),
                name: re(rule, &r.name)?,
                cat: re(rule, &r.cat)?,
                parent: re(rule, &r.parent)?,
                arg,
                within,
            });
        }
        re(0, &t.step)?;
        re(0, &t.context)?;
        Ok(ImportRules { text: t, compiled })
    }

    /// A built-in set by name (`candle`).
    pub fn builtin(name: &str) -> Option<Result<ImportRules, ImportRulesError>> {
        BUILTIN_IMPORT_RULES
            .iter()
            .find(|(n, _, _)| *n == name)
            .map(|(_, file, text)| ImportRules::parse(text, file))
    }

    /// The argument keys the rules read (kept in span keys while reading a trace).
    pub fn arg_keys(&self) -> Vec<String> {
        self.compiled
            .iter()
            .filter_map(|c| c.arg.as_ref().map(|(k, _)| k.clone()))
            .collect()
    }

    /// The pattern of context span names, compiled (checked by `parse`).
    pub fn context(&self) -> Option<Regex> {
        self.text
            .context
            .as_deref()
            .map(|p| Regex::new(p).expect("checked by parse"))
    }

    /// The band of a span, or `None` when no rule matches.
    pub fn band_of(&self, key: &SpanKey) -> Option<&str> {
        self.compiled
            .iter()
            .find(|c| {
                c.name.as_ref().is_none_or(|r| r.is_match(&key.name))
                    && c.cat.as_ref().is_none_or(|r| r.is_match(&key.cat))
                    && c.parent.as_ref().is_none_or(|r| r.is_match(&key.parent))
                    && c.arg
                        .as_ref()
                        .is_none_or(|(k, r)| key.arg(k).is_some_and(|v| r.is_match(v)))
                    && c.within
                        .iter()
                        .all(|r| r.is_match(&key.name) || key.within.iter().any(|w| r.is_match(w)))
            })
            .map(|c| c.band.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(name: &str, cat: &str, parent: &str, args: &[(&str, &str)]) -> SpanKey {
        SpanKey {
            name: name.into(),
            cat: cat.into(),
            parent: parent.into(),
            args: args
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            within: Vec::new(),
        }
    }

    #[test]
    fn first_matching_rule_wins_on_name_parent_cat_and_args() {
        let r = ImportRules::builtin("candle").unwrap().unwrap();
        assert_eq!(
            r.band_of(&key("qmatmul", "", "attn", &[])),
            Some("projections")
        );
        assert_eq!(
            r.band_of(&key("qmatmul", "", "mlp", &[])),
            Some("dense_ffn")
        );
        assert_eq!(r.band_of(&key("attn", "", "model", &[])), Some("attention"));
        assert_eq!(r.band_of(&key("qmatmul", "", "output", &[])), Some("other"));
        assert_eq!(r.band_of(&key("mystery", "", "model", &[])), None);
        let text = r#"
            engine = "torch"
            granularity = "aten ops"
            [[bands]]
            name = "mm"
            description = "matmuls"
            [[rules]]
            band = "mm"
            cat = "^cpu_op$"
            arg = { key = "Input Dims", pattern = "^\\[\\[4," }
        "#;
        let r = ImportRules::parse(text, "t.toml").unwrap();
        assert_eq!(r.arg_keys(), vec!["Input Dims".to_string()]);
        assert_eq!(
            r.band_of(&key("aten::mm", "cpu_op", "", &[("Input Dims", "[[4,8]]")])),
            Some("mm")
        );
        assert_eq!(
            r.band_of(&key("aten::mm", "cpu_op", "", &[("Input Dims", "[[2,8]]")])),
            None
        );
        assert_eq!(
            r.band_of(&key("aten::mm", "cuda", "", &[("Input Dims", "[[4,8]]")])),
            None
        );
    }

    /// (span, parent, band) as the shipped candle rules must read them.
    fn expect(cases: &[(&str, &str, &str)]) {
        let r = ImportRules::builtin("candle").unwrap().unwrap();
        for (name, parent, band) in cases {
            assert_eq!(
                r.band_of(&key(name, "", parent, &[])),
                Some(*band),
                "'{name}' in '{parent}'"
            );
        }
    }

    /// The step pattern of the shipped candle rules.
    fn candle_step() -> Regex {
        let r = ImportRules::builtin("candle").unwrap().unwrap();
        Regex::new(r.text.step.as_deref().unwrap()).unwrap()
    }

    #[test]
    fn candle_llama_qwen2_phi_phi3_lfm2_rotary_inside_attention() {
        // quantized_llama.rs, quantized_qwen2.rs, quantized_phi*.rs, quantized_lfm2.rs: the
        // rotary embedding's span "attn-rot" inside "attn"
        expect(&[
            ("attn-rot", "attn", "attention"),
            ("attn", "model", "attention"),
            ("qmatmul", "attn", "projections"),
            ("rms-norm", "attn", "attention"),
            ("attn-mlp", "model", "dense_ffn"),
            ("qmatmul", "attn-mlp", "dense_ffn"),
            ("rms-norm", "model", "other"),
            ("embedding", "model", "other"),
            ("output", "model", "other"),
            ("qmatmul", "output", "other"),
            ("rms-norm", "output", "other"),
        ]);
    }

    #[test]
    fn candle_mlp_spans_of_qwen3_lfm2_stable_lm_and_mlps_without_a_span() {
        expect(&[
            // quantized_qwen3.rs, quantized_stable_lm.rs: "mlp"; quantized_lfm2.rs: "ffn"
            ("mlp", "model", "dense_ffn"),
            ("qmatmul", "mlp", "dense_ffn"),
            ("mlp", "layer", "dense_ffn"),
            ("ffn", "model", "dense_ffn"),
            ("qmatmul", "ffn", "dense_ffn"),
            // quantized_stable_lm.rs: the decoder layer's own span and its norms
            ("layer", "model", "other"),
            ("attn", "layer", "attention"),
            ("layer-norm", "layer", "other"),
            // quantized_phi.rs, quantized_phi3.rs, quantized_glm4.rs: the MLP has no span, its
            // matmuls run in the step span (the head runs in "output")
            ("qmatmul", "model", "dense_ffn"),
        ]);
    }

    #[test]
    fn candle_mixformer_metavoice_mpt() {
        let step = candle_step();
        assert!(step.is_match("mixformer") && step.is_match("qtransformer"));
        assert!(step.is_match("model") && !step.is_match("block"));
        expect(&[
            // quantized_mixformer.rs: step "mixformer" > "block" > "mha"; the MLP in the block,
            // the head in the step
            ("mixformer", "", "other"),
            ("block", "mixformer", "other"),
            ("mha", "block", "attention"),
            ("qmatmul", "mha", "projections"),
            ("qmatmul", "block", "dense_ffn"),
            ("layer-norm", "block", "other"),
            ("qmatmul", "mixformer", "other"),
            // quantized_metavoice.rs: "qtransformer" > "block" > "attention" / "feed-forward"
            ("qtransformer", "", "other"),
            ("block", "qtransformer", "other"),
            ("attention", "block", "attention"),
            ("qmatmul", "attention", "projections"),
            ("feed-forward", "block", "dense_ffn"),
            ("qmatmul", "feed-forward", "dense_ffn"),
            // quantized_mpt.rs: attention "gqa"
            ("gqa", "block", "attention"),
            ("qmatmul", "gqa", "projections"),
        ]);
    }

    #[test]
    fn candle_t5_encoder_decoder() {
        // quantized_t5.rs
        expect(&[
            ("decode", "", "other"),
            ("encoder", "", "other"),
            ("stack", "decode", "other"),
            ("block", "stack", "other"),
            ("self-attn", "block", "attention"),
            ("cross-attn", "block", "attention"),
            ("layer-norm", "self-attn", "attention"),
            ("attention", "self-attn", "attention"),
            ("attention-cache", "attention", "attention"),
            ("attention-mm", "attention", "attention"),
            ("attention-sm", "attention", "attention"),
            ("qmatmul", "attention", "projections"),
            ("layer-ff", "block", "dense_ffn"),
            ("layer-norm", "layer-ff", "dense_ffn"),
            ("dense-act-dense", "layer-ff", "dense_ffn"),
            ("dense-gated-act-dense", "layer-ff", "dense_ffn"),
            ("qmatmul", "dense-gated-act-dense", "dense_ffn"),
            ("decode-head", "decode", "other"),
            ("layer-norm", "stack", "other"),
        ]);
    }

    /// A step of candle-transformers' quantized llama as `tracing-chrome` writes it (B/E on one
    /// thread), read by the trace reader: every span it holds has a band.
    #[test]
    fn a_quantized_llama_trace_leaves_no_span_unassigned() {
        let mut t = String::from("[");
        let mut ts = 0;
        let mut ev = |ph: &str, name: &str| {
            ts += 1;
            t.push_str(&format!(
                r#"{{"ph":"{ph}","name":"{name}","ts":{ts},"pid":1,"tid":1}},"#
            ));
        };
        ev("B", "model");
        ev("B", "embedding");
        ev("E", "embedding");
        for _ in 0..2 {
            ev("B", "rms-norm");
            ev("E", "rms-norm");
            ev("B", "attn");
            for _ in 0..3 {
                ev("B", "qmatmul");
                ev("E", "qmatmul");
            }
            ev("B", "attn-rot");
            ev("E", "attn-rot");
            ev("B", "qmatmul");
            ev("E", "qmatmul");
            ev("E", "attn");
            ev("B", "attn-mlp");
            ev("B", "rms-norm");
            ev("E", "rms-norm");
            for _ in 0..3 {
                ev("B", "qmatmul");
                ev("E", "qmatmul");
            }
            ev("E", "attn-mlp");
        }
        ev("B", "output");
        ev("B", "rms-norm");
        ev("E", "rms-norm");
        ev("B", "qmatmul");
        ev("E", "qmatmul");
        ev("E", "output");
        ev("E", "model");
        t.pop();
        t.push(']');
        let r = ImportRules::builtin("candle").unwrap().unwrap();
        let opts = crate::trace::TraceOptions {
            step: candle_step(),
            arg_keys: r.arg_keys(),
            context: r.context(),
        };
        let s = crate::trace::read_chrome(t.as_bytes(), "llama.json", &opts).unwrap();
        assert_eq!(s.steps.len(), 1);
        let unassigned: Vec<&SpanKey> = s.keys.iter().filter(|k| r.band_of(k).is_none()).collect();
        assert!(unassigned.is_empty(), "{unassigned:?}");
        let rot = s.keys.iter().find(|k| k.name == "attn-rot").unwrap();
        assert_eq!(rot.parent, "attn");
    }

    /// The band the shipped PyTorch rules give a span `name` of category `cat` nested in the
    /// context spans `within` (outermost first).
    fn torch_band(name: &str, cat: &str, within: &[&str]) -> Option<String> {
        let r = ImportRules::builtin("pytorch").unwrap().unwrap();
        let key = SpanKey {
            name: name.into(),
            cat: cat.into(),
            parent: within.last().copied().unwrap_or_default().into(),
            args: Vec::new(),
            within: within.iter().map(|w| w.to_string()).collect(),
        };
        r.band_of(&key).map(str::to_string)
    }

    /// (span, category, context, band) as the shipped PyTorch rules must read them.
    fn expect_torch(cases: &[(&str, &str, &[&str], &str)]) {
        for (name, cat, within, band) in cases {
            assert_eq!(
                torch_band(name, cat, within).as_deref(),
                Some(*band),
                "'{name}' ({cat}) in {within:?}"
            );
        }
    }

    /// A module span as torch's Python tracer names it ("nn.Module: <Class>_<n>", the n-th
    /// instance of the class).
    fn m(class: &str, n: u32) -> &'static str {
        Box::leak(format!("nn.Module: {class}_{n}").into_boxed_str())
    }

    #[test]
    fn pytorch_llama_projections_attention_mlp_norms_rotary_head() {
        // transformers 5.25.0, src/transformers/models/llama/modeling_llama.py: LlamaForCausalLM
        // > LlamaModel (embed_tokens: nn.Embedding, layers, norm: LlamaRMSNorm, rotary_emb:
        // LlamaRotaryEmbedding) > LlamaDecoderLayer (self_attn: LlamaAttention with q/k/v/o_proj
        // nn.Linear; mlp: LlamaMLP with gate/up/down_proj nn.Linear; input_layernorm and
        // post_attention_layernorm: LlamaRMSNorm); lm_head: nn.Linear
        let (t, mo, l) = (
            m("LlamaForCausalLM", 0),
            m("LlamaModel", 0),
            m("LlamaDecoderLayer", 3),
        );
        let (attn, q, mlp, up) = (
            m("LlamaAttention", 3),
            m("Linear", 12),
            m("LlamaMLP", 3),
            m("Linear", 17),
        );
        expect_torch(&[
            // a linear layer inside the attention module, and every op under it
            (q, "python_function", &[t, mo, l, attn], "projections"),
            (
                "aten::linear",
                "cpu_op",
                &[t, mo, l, attn, q],
                "projections",
            ),
            (
                "aten::addmm",
                "cpu_op",
                &[t, mo, l, attn, q, "aten::linear"],
                "projections",
            ),
            // the attention core: the module's own work and sdpa
            (attn, "python_function", &[t, mo, l], "attention"),
            (
                "aten::scaled_dot_product_attention",
                "cpu_op",
                &[t, mo, l, attn],
                "attention",
            ),
            ("aten::mul", "cpu_op", &[t, mo, l, attn], "attention"),
            // the MLP and its linear layers
            (mlp, "python_function", &[t, mo, l], "dense_ffn"),
            ("aten::mm", "cpu_op", &[t, mo, l, mlp, up], "dense_ffn"),
            ("aten::silu", "cpu_op", &[t, mo, l, mlp], "dense_ffn"),
            // norms, rotary tables, embedding, the layer's residual adds, the head
            (
                "aten::rsqrt",
                "cpu_op",
                &[t, mo, l, m("LlamaRMSNorm", 7)],
                "other",
            ),
            (
                "aten::cos",
                "cpu_op",
                &[t, mo, m("LlamaRotaryEmbedding", 0)],
                "other",
            ),
            (
                "aten::embedding",
                "cpu_op",
                &[t, mo, m("Embedding", 0)],
                "other",
            ),
            ("aten::add", "cpu_op", &[t, mo, l], "other"),
            ("aten::linear", "cpu_op", &[t, m("Linear", 224)], "other"),
        ]);
    }

    #[test]
    fn pytorch_qwen2_attention_with_biased_projections_and_its_mlp() {
        // src/transformers/models/qwen2/modeling_qwen2.py: Qwen2Attention (q/k/v_proj
        // nn.Linear with bias, o_proj), Qwen2MLP, Qwen2RMSNorm, Qwen2RotaryEmbedding, Qwen2Model
        let (t, mo, l) = (
            m("Qwen2ForCausalLM", 0),
            m("Qwen2Model", 0),
            m("Qwen2DecoderLayer", 0),
        );
        let (a, k, mlp, n) = (
            m("Qwen2Attention", 0),
            m("Linear", 1),
            m("Qwen2MLP", 0),
            m("Qwen2RMSNorm", 0),
        );
        expect_torch(&[
            ("aten::addmm", "cpu_op", &[t, mo, l, a, k], "projections"),
            (
                "aten::scaled_dot_product_attention",
                "cpu_op",
                &[t, mo, l, a],
                "attention",
            ),
            ("aten::mul", "cpu_op", &[t, mo, l, mlp], "dense_ffn"),
            ("aten::pow", "cpu_op", &[t, mo, l, n], "other"),
            (
                "aten::cos",
                "cpu_op",
                &[t, mo, m("Qwen2RotaryEmbedding", 0)],
                "other",
            ),
            ("aten::slice", "cpu_op", &[t, mo], "other"),
        ]);
    }

    #[test]
    fn pytorch_qwen3_moe_router_experts_and_its_dense_layers() {
        // src/transformers/models/qwen3_moe/modeling_qwen3_moe.py: Qwen3MoeSparseMoeBlock
        // (gate: Qwen3MoeTopKRouter, experts: Qwen3MoeExperts, the experts' 3-D weights used
        // directly), Qwen3MoeMLP in the layers listed in mlp_only_layers, Qwen3MoeAttention with
        // q_norm / k_norm (Qwen3MoeRMSNorm) on the head dimension
        let (t, mo, l) = (
            m("Qwen3MoeForCausalLM", 0),
            m("Qwen3MoeModel", 0),
            m("Qwen3MoeDecoderLayer", 2),
        );
        let moe = m("Qwen3MoeSparseMoeBlock", 1);
        let a = m("Qwen3MoeAttention", 2);
        expect_torch(&[
            (
                "aten::linear",
                "cpu_op",
                &[t, mo, l, moe, m("Qwen3MoeTopKRouter", 1)],
                "moe",
            ),
            (
                "aten::topk",
                "cpu_op",
                &[t, mo, l, moe, m("Qwen3MoeTopKRouter", 1)],
                "moe",
            ),
            (
                "aten::linear",
                "cpu_op",
                &[t, mo, l, moe, m("Qwen3MoeExperts", 1)],
                "moe",
            ),
            ("aten::index_add_", "cpu_op", &[t, mo, l, moe], "moe"),
            (moe, "python_function", &[t, mo, l], "moe"),
            // a dense layer's MLP is the dense FFN, not the MoE
            (
                "aten::mm",
                "cpu_op",
                &[t, mo, l, m("Qwen3MoeMLP", 0), m("Linear", 40)],
                "dense_ffn",
            ),
            // q_norm inside the attention module is a norm
            (
                "aten::rsqrt",
                "cpu_op",
                &[t, mo, l, a, m("Qwen3MoeRMSNorm", 4)],
                "other",
            ),
            (
                "aten::mm",
                "cpu_op",
                &[t, mo, l, a, m("Linear", 9)],
                "projections",
            ),
        ]);
    }

    #[test]
    fn pytorch_gemma3_scaled_embedding_four_norms_and_qk_norms() {
        // src/transformers/models/gemma3/modeling_gemma3.py: Gemma3TextScaledWordEmbedding (an
        // nn.Embedding that scales), Gemma3DecoderLayer with input_layernorm,
        // post_attention_layernorm, pre_feedforward_layernorm, post_feedforward_layernorm
        // (Gemma3RMSNorm), Gemma3Attention with q_norm / k_norm, Gemma3MLP, Gemma3TextModel,
        // Gemma3ForCausalLM
        let (t, mo, l) = (
            m("Gemma3ForCausalLM", 0),
            m("Gemma3TextModel", 0),
            m("Gemma3DecoderLayer", 5),
        );
        let a = m("Gemma3Attention", 5);
        expect_torch(&[
            (
                "aten::embedding",
                "cpu_op",
                &[t, mo, m("Gemma3TextScaledWordEmbedding", 0)],
                "other",
            ),
            (
                "aten::mul",
                "cpu_op",
                &[t, mo, m("Gemma3TextScaledWordEmbedding", 0)],
                "other",
            ),
            (
                "aten::mean",
                "cpu_op",
                &[t, mo, l, m("Gemma3RMSNorm", 22)],
                "other",
            ),
            (
                "aten::mean",
                "cpu_op",
                &[t, mo, l, a, m("Gemma3RMSNorm", 20)],
                "other",
            ),
            (
                "aten::linear",
                "cpu_op",
                &[t, mo, l, a, m("Linear", 35)],
                "projections",
            ),
            (
                "aten::_scaled_dot_product_flash_attention_for_cpu",
                "cpu_op",
                &[t, mo, l, a, "aten::scaled_dot_product_attention"],
                "attention",
            ),
            (
                "aten::gelu",
                "cpu_op",
                &[t, mo, l, m("Gemma3MLP", 5)],
                "dense_ffn",
            ),
            (
                "torch/nn/modules/linear.py(134): forward",
                "python_function",
                &[t, mo, l, m("Gemma3MLP", 5), m("Linear", 38)],
                "dense_ffn",
            ),
            ("aten::linear", "cpu_op", &[t, m("Linear", 126)], "other"),
        ]);
    }

    #[test]
    fn pytorch_mixtral_router_and_experts() {
        // src/transformers/models/mixtral/modeling_mixtral.py: MixtralSparseMoeBlock (gate:
        // MixtralTopKRouter, experts: MixtralExperts), MixtralAttention, MixtralRMSNorm
        let (t, mo, l) = (
            m("MixtralForCausalLM", 0),
            m("MixtralModel", 0),
            m("MixtralDecoderLayer", 0),
        );
        let moe = m("MixtralSparseMoeBlock", 0);
        expect_torch(&[
            (
                "aten::softmax",
                "cpu_op",
                &[t, mo, l, moe, m("MixtralTopKRouter", 0)],
                "moe",
            ),
            (
                "aten::mm",
                "cpu_op",
                &[t, mo, l, moe, m("MixtralExperts", 0)],
                "moe",
            ),
            (
                "aten::mm",
                "cpu_op",
                &[t, mo, l, m("MixtralAttention", 0), m("Linear", 0)],
                "projections",
            ),
        ]);
    }

    #[test]
    fn pytorch_collectives_are_the_network_band_on_host_and_device() {
        // torch.distributed's c10d ops as the profiler records them (cpu_op c10d::allreduce_,
        // record_param_comms, nccl:all_reduce) and NCCL's kernels, launched from them
        let (t, l) = (m("LlamaForCausalLM", 0), m("LlamaDecoderLayer", 1));
        expect_torch(&[
            ("c10d::allreduce_", "cpu_op", &[t, l], "network"),
            (
                "record_param_comms",
                "cpu_op",
                &[t, l, "c10d::allreduce_"],
                "network",
            ),
            ("nccl:all_reduce", "user_annotation", &[t], "network"),
            (
                "cudaLaunchKernel",
                "cuda_runtime",
                &[t, l, "c10d::allreduce_", "record_param_comms"],
                "network",
            ),
            (
                "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)",
                "kernel",
                &[t, l],
                "network",
            ),
            (
                "ncclDevKernel_SendRecv(ncclDevComm*, unsigned long, ncclWork*)",
                "kernel",
                &[t, l, "c10d::alltoall_base_"],
                "network",
            ),
            ("c10d::_allgather_base_", "cpu_op", &[t], "network"),
            (
                "c10d::reduce_scatter_tensor_coalesced_",
                "cpu_op",
                &[t],
                "network",
            ),
        ]);
    }

    #[test]
    fn pytorch_flash_kernels_the_step_and_python_outside_every_module() {
        let (t, a) = (m("LlamaForCausalLM", 0), m("LlamaAttention", 0));
        expect_torch(&[
            // a flash-attention kernel is attention by its own name, wherever it was launched
            ("void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128>>(Flash_fwd_params)", "kernel", &[t], "attention"),
            ("fmha_cutlassF_f16_aligned_64x64_rf_sm80", "kernel", &[t, a], "attention"),
            ("ProfilerStep#7", "user_annotation", &[], "other"),
            ("torch/profiler/profiler.py(880): step", "python_function", &[], "other"),
            ("cudaDeviceSynchronize", "cuda_runtime", &[], "other"),
        ]);
        // an op outside every module is no band's: the coverage check lists it
        assert_eq!(torch_band("aten::fill_", "cpu_op", &[]), None);
        assert_eq!(torch_band("fill_kernel", "kernel", &["aten::fill_"]), None);
        let r = ImportRules::builtin("pytorch").unwrap().unwrap();
        let step = Regex::new(r.text.step.as_deref().unwrap()).unwrap();
        assert!(step.is_match("ProfilerStep#12") && !step.is_match("ProfilerStep"));
        let ctx = r.context().unwrap();
        assert!(
            ctx.is_match(m("Gemma3MLP", 0))
                && ctx.is_match("cpu_op")
                && ctx.is_match("user_annotation")
        );
        assert!(
            !ctx.is_match("python_function")
                && !ctx.is_match("torch/nn/modules/module.py(1750): _call_impl")
        );
    }

    #[test]
    fn bad_rules_are_refused_naming_the_file_and_rule() {
        let base =
            "engine = \"e\"\ngranularity = \"g\"\n[[bands]]\nname = \"a\"\ndescription = \"d\"\n";
        let e = ImportRules::parse(
            &format!("{base}[[rules]]\nband = \"b\"\nname = \"x\"\n"),
            "r.toml",
        )
        .err()
        .unwrap();
        assert!(
            e.to_string().contains("r.toml: rule 1 names band 'b'"),
            "{e}"
        );
        let e = ImportRules::parse(
            &format!("{base}[[rules]]\nband = \"a\"\nname = \"(\"\n"),
            "r.toml",
        )
        .err()
        .unwrap();
        assert!(
            e.to_string().starts_with("r.toml: rule 1: pattern /(/"),
            "{e}"
        );
        let e = ImportRules::parse(&format!("{base}[[rules]]\nband = \"a\"\n"), "r.toml")
            .err()
            .unwrap();
        assert!(e.to_string().contains("would match every span"), "{e}");
    }
}
