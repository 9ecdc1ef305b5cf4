//! Import rules: a small TOML file per engine that maps the spans of its traces to bands by
//! patterns on the span's name, category, parent span and arguments (first matching rule wins),
//! and the built-in sets (`crates/core/import-rules/`).

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::band::BandDef;
use crate::trace::SpanKey;

/// The built-in rule sets: (name, file name, TOML text).
pub const BUILTIN_IMPORT_RULES: [(&str, &str, &str); 1] = [(
    "candle",
    "candle.toml",
    include_str!("../import-rules/candle.toml"),
)];

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
    pub bands: Vec<BandDef>,
    pub rules: Vec<RuleText>,
}

struct Compiled {
    band: String,
    name: Option<Regex>,
    cat: Option<Regex>,
    parent: Option<Regex>,
    arg: Option<(String, Regex)>,
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
        "{file}: rule {rule} has no pattern (name, cat, parent or arg): it would match every span"
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
            if r.name.is_none() && r.cat.is_none() && r.parent.is_none() && r.arg.is_none() {
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
            compiled.push(Compiled {
                band: r.band.clone(),
                name: re(rule, &r.name)?,
                cat: re(rule, &r.cat)?,
                parent: re(rule, &r.parent)?,
                arg,
            });
        }
        re(0, &t.step)?;
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
        };
        let s = crate::trace::read_chrome(t.as_bytes(), "llama.json", &opts).unwrap();
        assert_eq!(s.steps.len(), 1);
        let unassigned: Vec<&SpanKey> = s.keys.iter().filter(|k| r.band_of(k).is_none()).collect();
        assert!(unassigned.is_empty(), "{unassigned:?}");
        let rot = s.keys.iter().find(|k| k.name == "attn-rot").unwrap();
        assert_eq!(rot.parent, "attn");
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
