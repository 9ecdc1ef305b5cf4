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
        assert_eq!(r.band_of(&key("qmatmul", "", "model", &[])), Some("other"));
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
