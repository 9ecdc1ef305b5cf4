//! Bands as data: the generic rule set for any architecture and per-architecture overrides (TOML,
//! in `crates/core/bands/`), and the categoriser that applies them (op type, then exact
//! weight-name token, then node-name token, each with layer-kind overrides), plus the cross-band
//! audit.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::arch::{ArchInfo, FfnKind, LayerKind};
use crate::node::{base_name, borrows_identity, weight_layer, weight_token, NodeInfo};

/// The band of nodes no rule matched. Coverage is the share of time outside it.
pub const UNASSIGNED: &str = "unassigned";

/// The band a rule names when it means the layer's FFN band: `moe` in a layer with routed
/// experts, `dense_ffn` in a layer with a dense FFN (and, outside layers, the model's).
pub const FFN_OF_LAYER: &str = "@ffn";

/// The generic rule set, for any architecture.
pub const GENERIC_RULES: (&str, &str) = ("generic.toml", include_str!("../bands/generic.toml"));

/// The built-in per-architecture overrides of the generic rules: (file name, TOML text).
pub const BUILTIN_RULES: [(&str, &str); 6] = [
    ("qwen35moe.toml", include_str!("../bands/qwen35moe.toml")),
    ("gpt-oss.toml", include_str!("../bands/gpt-oss.toml")),
    ("rwkv.toml", include_str!("../bands/rwkv.toml")),
    ("minimax-01.toml", include_str!("../bands/minimax-01.toml")),
    ("dbrx.toml", include_str!("../bands/dbrx.toml")),
    ("grok.toml", include_str!("../bands/grok.toml")),
];

/// One band of a rule set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BandDef {
    pub name: String,
    pub description: String,
}

/// A band rule set for one or more architectures.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BandRules {
    /// Architectures (`general.architecture`) this set applies to; `*` for any.
    pub architectures: Vec<String>,
    /// `generic`: this file only overrides entries of the generic rule set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extends: Option<String>,
    /// The bands, in display order (an overriding file may leave them out).
    #[serde(default)]
    pub bands: Vec<BandDef>,
    /// The band whose cost grows with context depth (for crossover reports).
    pub attention_band: Option<String>,
    /// The FFN band attention is compared with (for crossover reports).
    pub ffn_band: Option<String>,
    /// Op type -> band (first signal).
    #[serde(default)]
    pub op: BTreeMap<String, String>,
    /// Exact weight-name token (`attn_qkv` in `blk.3.attn_qkv.weight`) -> band.
    #[serde(default)]
    pub weight: BTreeMap<String, String>,
    /// Weight-name tokens whose band depends on the layer kind; wins over `weight`.
    #[serde(default)]
    pub weight_by_layer: BTreeMap<LayerKind, BTreeMap<String, String>>,
    /// Exact node-name token (`ffn_moe_probs` in `ffn_moe_probs-3`) -> band.
    #[serde(default)]
    pub name: BTreeMap<String, String>,
    /// Node-name tokens whose band depends on the layer kind; wins over `name`.
    #[serde(default)]
    pub name_by_layer: BTreeMap<LayerKind, BTreeMap<String, String>>,
    /// Node-name tokens that take the band of the node that reads them (`norm`: an RMS_NORM
    /// belongs to whatever its weighted MUL belongs to; the CPU backend fuses the two).
    #[serde(default)]
    pub follow_consumer: Vec<String>,
    /// Bands a matmul (MUL_MAT, MUL_MAT_ID) of a layer of this kind must never land in.
    #[serde(default)]
    pub audit: BTreeMap<LayerKind, Vec<String>>,
    /// Bands a matmul of a layer with this FFN must never land in.
    #[serde(default)]
    pub audit_ffn: BTreeMap<FfnKind, Vec<String>>,
}

#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("{file}: invalid band rules")]
    Parse {
        file: String,
        #[source]
        source: Box<toml::de::Error>,
    },
    #[error("{file}: rule {rule} names band '{band}', which is not in the rule set's bands")]
    UnknownBand {
        file: String,
        rule: String,
        band: String,
    },
    #[error("{file}: extends '{base}', but the only rule set a file can extend is 'generic'")]
    UnknownBase { file: String, base: String },
    #[error("{file}: the rule set is for {listed:?}, not for the model's architecture '{arch}' (add it to `architectures` if the rules fit)")]
    WrongArch {
        file: String,
        arch: String,
        listed: Vec<String>,
    },
}

impl BandRules {
    /// Parses and checks a rule set; `file` names it in errors. A file with `extends =
    /// "generic"` is merged onto the generic rules (its entries win).
    pub fn parse(text: &str, file: &str) -> Result<BandRules, RulesError> {
        let rules: BandRules = toml::from_str(text).map_err(|e| RulesError::Parse {
            file: file.to_string(),
            source: Box::new(e),
        })?;
        let rules = match rules.extends.as_deref() {
            None => rules,
            Some("generic") => Self::generic()?.overlaid(rules),
            Some(other) => {
                return Err(RulesError::UnknownBase {
                    file: file.to_string(),
                    base: other.to_string(),
                })
            }
        };
        rules.check(file)?;
        Ok(rules)
    }

    /// A rule set as its file writes it, not merged onto what it extends: the keys its author
    /// wrote (for [`BandRules::unmatched_keys`]).
    pub fn parse_unmerged(text: &str, file: &str) -> Result<BandRules, RulesError> {
        toml::from_str(text).map_err(|e| RulesError::Parse {
            file: file.to_string(),
            source: Box::new(e),
        })
    }

    /// The generic rule set.
    pub fn generic() -> Result<BandRules, RulesError> {
        let (file, text) = GENERIC_RULES;
        let rules: BandRules = toml::from_str(text).map_err(|e| RulesError::Parse {
            file: file.to_string(),
            source: Box::new(e),
        })?;
        rules.check(file)?;
        Ok(rules)
    }

    /// The built-in rules for an architecture: the generic set, with the architecture's
    /// overrides where it has some. Every architecture has rules.
    pub fn builtin(arch: &str) -> Result<BandRules, RulesError> {
        for (file, text) in BUILTIN_RULES {
            let rules = BandRules::parse(text, file)?;
            if rules.architectures.iter().any(|a| a == arch) {
                return Ok(rules);
            }
        }
        Self::generic()
    }

    /// Whether this set is meant for `arch` (`*` matches any).
    pub fn applies_to(&self, arch: &str) -> bool {
        self.architectures.iter().any(|a| a == "*" || a == arch)
    }

    /// This set with `over`'s entries laid on top (tables entry by entry; `over`'s bands,
    /// attention and FFN bands and follow_consumer names where it has them).
    fn overlaid(mut self, over: BandRules) -> BandRules {
        fn merge<K: Ord, V>(base: &mut BTreeMap<K, V>, over: BTreeMap<K, V>) {
            base.extend(over);
        }
        fn merge2<K: Ord, K2: Ord, V>(
            base: &mut BTreeMap<K, BTreeMap<K2, V>>,
            over: BTreeMap<K, BTreeMap<K2, V>>,
        ) {
            for (k, m) in over {
                base.entry(k).or_default().extend(m);
            }
        }
        self.architectures = over.architectures;
        self.extends = over.extends;
        if !over.bands.is_empty() {
            self.bands = over.bands;
        }
        self.attention_band = over.attention_band.or(self.attention_band);
        self.ffn_band = over.ffn_band.or(self.ffn_band);
        merge(&mut self.op, over.op);
        merge(&mut self.weight, over.weight);
        merge2(&mut self.weight_by_layer, over.weight_by_layer);
        merge(&mut self.name, over.name);
        merge2(&mut self.name_by_layer, over.name_by_layer);
        for f in over.follow_consumer {
            if !self.follow_consumer.contains(&f) {
                self.follow_consumer.push(f);
            }
        }
        merge(&mut self.audit, over.audit);
        merge(&mut self.audit_ffn, over.audit_ffn);
        self
    }

    /// The FFN band the crossover compares attention with: `ffn_band`, with `@ffn` read as
    /// `moe` for a model with routed experts and `dense_ffn` otherwise.
    pub fn ffn_band_for(&self, arch: &ArchInfo) -> Option<String> {
        self.ffn_band
            .as_deref()
            .map(|b| resolve_model_ffn(b, arch).to_string())
    }

    fn check(&self, file: &str) -> Result<(), RulesError> {
        let has = |b: &str| self.bands.iter().any(|d| d.name == b);
        let known = |b: &str| {
            if b == FFN_OF_LAYER {
                has("moe") && has("dense_ffn")
            } else {
                has(b)
            }
        };
        let mut refs: Vec<(String, &str)> = Vec::new();
        for (k, b) in &self.op {
            refs.push((format!("op.{k}"), b));
        }
        for (k, b) in &self.weight {
            refs.push((format!("weight.{k}"), b));
        }
        for (kind, m) in &self.weight_by_layer {
            for (k, b) in m {
                refs.push((format!("weight_by_layer.{}.{k}", kind.as_str()), b));
            }
        }
        for (k, b) in &self.name {
            refs.push((format!("name.{k}"), b));
        }
        for (kind, m) in &self.name_by_layer {
            for (k, b) in m {
                refs.push((format!("name_by_layer.{}.{k}", kind.as_str()), b));
            }
        }
        for (kind, bands) in &self.audit {
            for b in bands {
                refs.push((format!("audit.{}", kind.as_str()), b));
            }
        }
        for (kind, bands) in &self.audit_ffn {
            for b in bands {
                refs.push((format!("audit_ffn.{}", kind.as_str()), b));
            }
        }
        for (name, b) in [
            ("attention_band", &self.attention_band),
            ("ffn_band", &self.ffn_band),
        ] {
            if let Some(b) = b {
                refs.push((name.to_string(), b));
            }
        }
        for (rule, band) in refs {
            if !known(band) {
                return Err(RulesError::UnknownBand {
                    file: file.to_string(),
                    rule,
                    band: band.to_string(),
                });
            }
        }
        Ok(())
    }

    pub fn band_names(&self) -> Vec<&str> {
        self.bands.iter().map(|b| b.name.as_str()).collect()
    }

    /// The bands some node of `assignments` is in, in the rule set's order (a generic rule set
    /// names every band; a model uses a few).
    pub fn bands_in(&self, assignments: &[Assignment]) -> Vec<String> {
        self.bands
            .iter()
            .map(|b| b.name.clone())
            .filter(|b| assignments.iter().any(|a| &a.band == b))
            .collect()
    }

    /// Refuses a rule set whose `architectures` does not name `arch` (or `*`, any); `file`
    /// names it.
    pub fn check_arch(&self, arch: &str, file: &str) -> Result<(), RulesError> {
        if self.applies_to(arch) {
            Ok(())
        } else {
            Err(RulesError::WrongArch {
                file: file.to_string(),
                arch: arch.to_string(),
                listed: self.architectures.clone(),
            })
        }
    }

    /// The keys of this rule set that match nothing in `graph`, as `section.key` (`op.ROPE`,
    /// `weight.attn_qkv`, `name_by_layer.full_attention.Qcur`, `follow_consumer.norm`): op keys
    /// no node's op is, weight keys no node's weight token is, name keys no node's name token
    /// is (the signals the categoriser reads; a layer-kind key counts as matched when any node
    /// has the token). Such a key is most likely a typo, found before measuring instead of as a
    /// coverage failure after.
    pub fn unmatched_keys(&self, graph: &[NodeInfo]) -> Vec<String> {
        use std::collections::BTreeSet;
        let ops: BTreeSet<&str> = graph.iter().map(|n| n.op.as_str()).collect();
        let weights: BTreeSet<&str> = graph
            .iter()
            .filter_map(|n| n.weight())
            .map(|w| weight_token(&w.name))
            .collect();
        let names: BTreeSet<&str> = graph.iter().map(|n| n.base_name()).collect();
        let mut out = Vec::new();
        let mut check = |section: String, key: &str, seen: &BTreeSet<&str>| {
            if !seen.contains(key) {
                out.push(format!("{section}.{key}"));
            }
        };
        for k in self.op.keys() {
            check("op".into(), k, &ops);
        }
        for k in self.weight.keys() {
            check("weight".into(), k, &weights);
        }
        for (kind, m) in &self.weight_by_layer {
            for k in m.keys() {
                check(format!("weight_by_layer.{}", kind.as_str()), k, &weights);
            }
        }
        for k in self.name.keys() {
            check("name".into(), k, &names);
        }
        for (kind, m) in &self.name_by_layer {
            for k in m.keys() {
                check(format!("name_by_layer.{}", kind.as_str()), k, &names);
            }
        }
        for k in &self.follow_consumer {
            check("follow_consumer".into(), k, &names);
        }
        out
    }
}

/// Which signal put a node in its band.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "by", content = "key", rename_all = "snake_case")]
pub enum Reason {
    Op(String),
    Weight(String),
    Name(String),
    /// A view, an unnamed node or a `follow_consumer` node takes the band of the node it reads
    /// (or of the node that reads it).
    Inherited(u32),
    None,
}

/// A node's band and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    pub band: String,
    pub reason: Reason,
}

/// A problem the audit found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditFinding {
    pub node: u32,
    pub name: String,
    pub op: String,
    pub layer: u32,
    pub layer_kind: LayerKind,
    pub band: String,
    pub why: String,
}

/// The categoriser: a rule set applied to a graph of one architecture.
#[derive(Debug, Clone)]
pub struct Categoriser<'a> {
    rules: &'a BandRules,
    arch: &'a ArchInfo,
}

impl<'a> Categoriser<'a> {
    pub fn new(rules: &'a BandRules, arch: &'a ArchInfo) -> Categoriser<'a> {
        Categoriser { rules, arch }
    }

    /// The node's layer: from its name (`ffn_moe_gate-3`), else from the weight it reads
    /// (`blk.3.attn_output.weight`: llama.cpp leaves some matmuls unnamed).
    fn layer(&self, node: &NodeInfo) -> Option<u32> {
        node.layer
            .or_else(|| node.weight().and_then(|w| weight_layer(&w.name)))
    }

    fn kind(&self, node: &NodeInfo) -> Option<LayerKind> {
        self.layer(node).and_then(|l| self.arch.kind_of(l))
    }

    /// A rule's band for this node: `@ffn` becomes the band of the layer's FFN.
    fn resolve(&self, band: &str, node: &NodeInfo) -> String {
        if band != FFN_OF_LAYER {
            return band.to_string();
        }
        let ffn = self
            .layer(node)
            .and_then(|l| self.arch.layer(l))
            .map(|l| l.ffn);
        match ffn {
            Some(FfnKind::Moe) => "moe".into(),
            Some(FfnKind::Dense) => "dense_ffn".into(),
            _ => resolve_model_ffn(band, self.arch).into(),
        }
    }

    /// The first rule of `by_layer` for the node's layer kind (a sliding-window layer falls back
    /// on full-attention rules), else of `plain`.
    fn lookup<'r>(
        &self,
        kind: Option<LayerKind>,
        by_layer: &'r BTreeMap<LayerKind, BTreeMap<String, String>>,
        plain: &'r BTreeMap<String, String>,
        token: &str,
    ) -> Option<&'r String> {
        kind.into_iter()
            .flat_map(|k| k.rule_kinds())
            .find_map(|k| by_layer.get(k).and_then(|m| m.get(token)))
            .or_else(|| plain.get(token))
    }

    /// The band from the node's own signals, without inheritance.
    fn direct(&self, node: &NodeInfo) -> Option<Assignment> {
        let kind = self.kind(node);
        if let Some(b) = self.rules.op.get(&node.op) {
            return Some(Assignment {
                band: self.resolve(b, node),
                reason: Reason::Op(node.op.clone()),
            });
        }
        if let Some(w) = node.weight() {
            let token = weight_token(&w.name);
            let rule = self.lookup(kind, &self.rules.weight_by_layer, &self.rules.weight, token);
            if let Some(b) = rule {
                return Some(Assignment {
                    band: self.resolve(b, node),
                    reason: Reason::Weight(token.to_string()),
                });
            }
        }
        let token = base_name(&node.name);
        self.lookup(kind, &self.rules.name_by_layer, &self.rules.name, token)
            .map(|b| Assignment {
                band: self.resolve(b, node),
                reason: Reason::Name(token.to_string()),
            })
    }

    /// Assigns every node of `graph` (in graph order) a band.
    ///
    /// Views never match rules of their own: they do no work and take the band of the node whose
    /// output they view (or, for views of caches and inputs, of the node that reads them).
    /// Unnamed nodes (`node_17`) and nodes named after another tensor (`x (copy of y)`) that no
    /// rule matches inherit the same way; `follow_consumer` nodes inherit from their reader only.
    /// A named node that no rule matches stays `unassigned`, and coverage shows it.
    pub fn categorise(&self, graph: &[NodeInfo]) -> Vec<Assignment> {
        #[derive(Clone, Copy, PartialEq)]
        enum Inherit {
            No,
            Both,
            FromConsumer,
        }
        let mut out: Vec<Option<Assignment>> = Vec::with_capacity(graph.len());
        let mut inherit = Vec::with_capacity(graph.len());
        for n in graph {
            if n.is_view {
                out.push(None);
                inherit.push(Inherit::Both);
                continue;
            }
            let direct = self.direct(n);
            let how = if direct.is_some() {
                Inherit::No
            } else if self
                .rules
                .follow_consumer
                .iter()
                .any(|t| t == n.base_name())
            {
                Inherit::FromConsumer
            } else if borrows_identity(n) {
                Inherit::Both
            } else {
                Inherit::No
            };
            out.push(direct);
            inherit.push(how);
        }
        // forward: from the node it reads (producers come earlier in graph order)
        for i in 0..graph.len() {
            if out[i].is_some() || inherit[i] != Inherit::Both {
                continue;
            }
            let from = graph[i]
                .srcs
                .iter()
                .flatten()
                .filter_map(|s| s.producer)
                .find(|&p| (p as usize) < i && out[p as usize].is_some());
            if let Some(p) = from {
                out[i] = out[p as usize].as_ref().map(|a| Assignment {
                    band: a.band.clone(),
                    reason: Reason::Inherited(p),
                });
            }
        }
        // backward: from the first node that reads it
        let mut first_consumer: Vec<Option<u32>> = vec![None; graph.len()];
        for (i, n) in graph.iter().enumerate() {
            for p in n.srcs.iter().flatten().filter_map(|s| s.producer) {
                if let Some(slot) = first_consumer.get_mut(p as usize) {
                    slot.get_or_insert(i as u32);
                }
            }
        }
        for i in (0..graph.len()).rev() {
            if out[i].is_some() || inherit[i] == Inherit::No {
                continue;
            }
            if let Some(c) = first_consumer[i] {
                out[i] = out[c as usize].as_ref().map(|a| Assignment {
                    band: a.band.clone(),
                    reason: Reason::Inherited(c),
                });
            }
        }
        out.into_iter()
            .map(|a| {
                a.unwrap_or(Assignment {
                    band: UNASSIGNED.to_string(),
                    reason: Reason::None,
                })
            })
            .collect()
    }

    /// The cross-band audit: every matmul of a layer must sit in a band its layer kind and its
    /// FFN allow.
    pub fn audit(&self, graph: &[NodeInfo], assignments: &[Assignment]) -> Vec<AuditFinding> {
        let mut findings = Vec::new();
        for (n, a) in graph.iter().zip(assignments) {
            if n.op != "MUL_MAT" && n.op != "MUL_MAT_ID" {
                continue;
            }
            let Some(layer) = self.layer(n) else {
                continue;
            };
            let Some(info) = self.arch.layer(layer) else {
                continue;
            };
            let by_kind = info
                .kind
                .rule_kinds()
                .iter()
                .find_map(|k| self.rules.audit.get(k))
                .filter(|f| f.contains(&a.band))
                .map(|_| format!("a {} layer", info.kind.as_str()));
            let by_ffn = self
                .rules
                .audit_ffn
                .get(&info.ffn)
                .filter(|f| f.contains(&a.band))
                .map(|_| format!("a layer whose FFN is {}", info.ffn.as_str()));
            if let Some(what) = by_kind.or(by_ffn) {
                findings.push(AuditFinding {
                    node: n.index,
                    name: n.name.clone(),
                    op: n.op.clone(),
                    layer,
                    layer_kind: info.kind,
                    band: a.band.clone(),
                    why: format!(
                        "a matmul of {what} may not be in band '{}' (weight {})",
                        a.band,
                        n.weight().map(|w| w.name.as_str()).unwrap_or("none")
                    ),
                });
            }
        }
        findings
    }
}

/// `@ffn` at the level of the model: `moe` when any layer routes experts, else `dense_ffn`.
fn resolve_model_ffn<'b>(band: &'b str, arch: &ArchInfo) -> &'b str {
    if band != FFN_OF_LAYER {
        band
    } else if arch.is_moe() {
        "moe"
    } else {
        "dense_ffn"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;
    use crate::node::TensorDesc;

    fn t(name: &str, weight: bool, producer: Option<u32>) -> Option<TensorDesc> {
        Some(TensorDesc {
            name: name.into(),
            ne: [1, 1, 1, 1],
            ggml_type: "F32".into(),
            size_bytes: 4,
            is_weight: weight,
            producer,
            nb: [0; 4],
        })
    }

    fn node(index: u32, op: &str, name: &str, srcs: Vec<Option<TensorDesc>>) -> NodeInfo {
        NodeInfo {
            index,
            op: op.into(),
            name: name.into(),
            layer: crate::node::layer_of(name),
            out: t(name, false, None).unwrap(),
            srcs,
            is_view: crate::node::is_view_op(op),
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        }
    }

    fn arch4() -> ArchInfo {
        ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap()
    }

    #[test]
    fn builtin_rule_sets_parse_and_reference_known_bands() {
        for (file, text) in BUILTIN_RULES {
            let r = BandRules::parse(text, file).unwrap();
            assert!(!r.architectures.is_empty(), "{file}");
        }
        assert!(BandRules::builtin("qwen35moe").is_ok());
        // every architecture has rules: the generic set where it has no overrides
        let gpt2 = BandRules::builtin("gpt2").unwrap();
        assert_eq!(gpt2.architectures, vec!["*"]);
        assert!(gpt2.applies_to("gpt2"));
        // an override keeps the generic entries it does not touch
        let q = BandRules::builtin("qwen35moe").unwrap();
        assert_eq!(q.weight["post_attention_norm"], FFN_OF_LAYER);
        assert_eq!(q.weight["attn_q"], "projections");
        assert_eq!(gpt2.weight["post_attention_norm"], "projections");
    }

    #[test]
    fn unknown_band_is_refused_with_the_rule() {
        let text = r#"
architectures = ["x"]
bands = [{ name = "moe", description = "" }]
[op]
MUL_MAT_ID = "mooe"
"#;
        let err = BandRules::parse(text, "mine.toml").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("mine.toml") && msg.contains("op.MUL_MAT_ID") && msg.contains("mooe"),
            "{msg}"
        );
    }

    #[test]
    fn band_file_keys_that_match_nothing_in_the_graph_are_listed() {
        let text = r#"
architectures = ["qwen35moe"]
bands = [{ name = "moe", description = "" }, { name = "other", description = "" }]
follow_consumer = ["norm", "nrom"]
[op]
MUL_MAT_ID = "moe"
MUL_MAT_IDD = "moe"
[weight]
ffn_gate_exps = "moe"
ffn_gate_exp = "moe"
[name]
l_out = "other"
l_outt = "other"
[name_by_layer.full_attention]
ffn_moe_probs = "moe"
"#;
        let rules = BandRules::parse(text, "mine.toml").unwrap();
        let graph = vec![
            node(
                0,
                "MUL_MAT_ID",
                "ffn_moe_gate-3",
                vec![t("blk.3.ffn_gate_exps.weight", true, None)],
            ),
            node(
                1,
                "ADD",
                "l_out-3",
                vec![t("ffn_moe_gate-3", false, Some(0))],
            ),
            node(2, "RMS_NORM", "norm-3", vec![]),
        ];
        assert_eq!(
            rules.unmatched_keys(&graph),
            [
                "op.MUL_MAT_IDD",
                "weight.ffn_gate_exp",
                "name.l_outt",
                "name_by_layer.full_attention.ffn_moe_probs",
                "follow_consumer.nrom"
            ]
        );
        // the architecture must be named
        assert!(rules.check_arch("qwen35moe", "mine.toml").is_ok());
        let e = rules
            .check_arch("llama", "mine.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("mine.toml") && e.contains("'llama'"), "{e}");
    }

    #[test]
    fn attn_q_token_does_not_match_attn_qkv() {
        // The substring trap: attn_q is a prefix of attn_qkv. A linear-attention layer's
        // attn_qkv matmul must land in linear_attention, the full layer's attn_q in projections.
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = arch4();
        let graph = vec![
            node(
                0,
                "MUL_MAT",
                "linear_attn_qkv_mixed-0",
                vec![
                    t("blk.0.attn_qkv.weight", true, None),
                    t("attn_norm-0", false, None),
                ],
            ),
            node(
                1,
                "MUL_MAT",
                "Qcur_full-3",
                vec![
                    t("blk.3.attn_q.weight", true, None),
                    t("attn_norm-3", false, None),
                ],
            ),
        ];
        let c = Categoriser::new(&rules, &arch);
        let a = c.categorise(&graph);
        assert_eq!(a[0].band, "linear_attention");
        assert_eq!(a[0].reason, Reason::Weight("attn_qkv".into()));
        assert_eq!(a[1].band, "projections");
        assert!(c.audit(&graph, &a).is_empty());
    }

    #[test]
    fn audit_flags_a_linear_layer_matmul_in_projections() {
        // A deliberately wrong rule (substring-style) that sends attn_qkv to projections.
        let mut rules = BandRules::builtin("qwen35moe").unwrap();
        rules
            .weight_by_layer
            .entry(LayerKind::LinearAttention)
            .or_default()
            .insert("attn_qkv".into(), "projections".into());
        let arch = arch4();
        let graph = vec![node(
            0,
            "MUL_MAT",
            "linear_attn_qkv_mixed-0",
            vec![t("blk.0.attn_qkv.weight", true, None)],
        )];
        let c = Categoriser::new(&rules, &arch);
        let a = c.categorise(&graph);
        let f = c.audit(&graph, &a);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].layer_kind, LayerKind::LinearAttention);
        assert!(f[0].why.contains("blk.0.attn_qkv.weight"), "{}", f[0].why);
    }

    #[test]
    fn precedence_op_then_weight_then_name_then_inheritance() {
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = arch4();
        let graph = vec![
            // op rule wins over everything
            node(
                0,
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                vec![t("blk.0.ffn_gate_exps.weight", true, None)],
            ),
            // a view with a generic name inherits from its producer
            node(
                1,
                "RESHAPE",
                "node_1",
                vec![t("ffn_moe_gate-0", false, Some(0))],
            ),
            // a named node matches by its name token
            node(
                2,
                "SOFT_MAX",
                "ffn_moe_probs-0",
                vec![t("ffn_moe_logits-0", false, None)],
            ),
            // a named node that no rule knows stays unassigned (coverage must show it)
            node(3, "ADD", "mystery-0", vec![t("x", false, Some(2))]),
            // a view of a leaf inherits from the node that reads it
            node(
                4,
                "VIEW",
                "cache_k_l3 (view)",
                vec![t("cache_k_l3", false, None)],
            ),
            node(
                5,
                "FLASH_ATTN_EXT",
                "node_5",
                vec![t("q", false, None), t("k", false, Some(4))],
            ),
        ];
        let a = Categoriser::new(&rules, &arch).categorise(&graph);
        assert_eq!(a[0].reason, Reason::Op("MUL_MAT_ID".into()));
        assert_eq!(
            (a[1].band.as_str(), &a[1].reason),
            ("moe", &Reason::Inherited(0))
        );
        assert_eq!(a[2].band, "moe");
        assert_eq!(a[3].band, UNASSIGNED);
        assert_eq!(
            (a[4].band.as_str(), &a[4].reason),
            ("attention", &Reason::Inherited(5))
        );
    }
}
