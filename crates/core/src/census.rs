//! The census of a real graph: nodes counted per op, per band, per layer kind and per distinct
//! (op, shapes, types), views excluded from the working counts, and cross-checked against the
//! counts the architecture's metadata predicts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::arch::{ArchInfo, FfnKind, LayerKind, Mixer};
use crate::band::Assignment;
use crate::node::{effective_layers, NodeInfo};

pub const CENSUS_SCHEMA_VERSION: u32 = 2;

/// Nodes and working nodes (neither views nor skipped by the backend) of one group.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Count {
    pub nodes: u32,
    pub working: u32,
}

impl Count {
    fn add(&mut self, node: &NodeInfo) {
        self.nodes += 1;
        if node.is_working() {
            self.working += 1;
        }
    }
}

/// One distinct (op, output shape and type, sources' shapes and types) and how often it occurs:
/// what a standalone op benchmark has to time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShapeCount {
    pub op: String,
    pub band: String,
    /// `[2048,512] f32 <- [2048,1024] q8_0, [2048,512] f32`
    pub signature: String,
    pub count: u32,
    /// The first node with this signature.
    pub first_node: u32,
}

/// An expected count from the architecture and what the graph holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Expectation {
    pub op: String,
    pub band: String,
    /// `None`: nothing opledger knows of this architecture predicts the count (the row only
    /// reports what the graph holds).
    pub expected: Option<u32>,
    pub found: u32,
    /// How the expected number follows from the metadata, or why there is none.
    pub rule: String,
}

/// How a census row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpectationStatus {
    /// The prediction holds.
    AsExpected,
    Mismatch,
    /// Nothing predicts this count.
    NotPredicted,
}

impl Expectation {
    pub fn status(&self) -> ExpectationStatus {
        match self.expected {
            None => ExpectationStatus::NotPredicted,
            Some(e) if e == self.found => ExpectationStatus::AsExpected,
            Some(_) => ExpectationStatus::Mismatch,
        }
    }

    /// The prediction holds (a row that predicts nothing is not a mismatch, but not "ok"
    /// either: see [`Expectation::status`]).
    pub fn ok(&self) -> bool {
        self.status() == ExpectationStatus::AsExpected
    }

    /// The prediction fails.
    pub fn mismatch(&self) -> bool {
        self.status() == ExpectationStatus::Mismatch
    }
}

/// The census of one graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Census {
    pub schema_version: u32,
    pub arch: String,
    pub layers: u32,
    pub total: Count,
    pub view_nodes: u32,
    /// Nodes in the graph that the backend skips (no COMPUTE flag), not views.
    pub skipped_nodes: u32,
    /// The attention path the graph uses: `flash_attn` or `soft_max`.
    pub attention_path: String,
    pub per_op: BTreeMap<String, Count>,
    pub per_band: BTreeMap<String, Count>,
    /// Working nodes of each (op, band) pair, `"MUL_MAT/projections"`.
    pub per_op_band: BTreeMap<String, u32>,
    /// Per layer kind: layers of that kind and their nodes; nodes outside layers under `none`.
    /// Views and unnamed nodes count in the layer of the node they read (or that reads them).
    pub per_layer_kind: BTreeMap<String, LayerKindCount>,
    /// Nodes of each layer, in layer order.
    pub per_layer: Vec<Count>,
    pub shapes: Vec<ShapeCount>,
    pub expectations: Vec<Expectation>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerKindCount {
    pub layers: u32,
    pub nodes: u32,
    pub working: u32,
}

impl Census {
    /// The expectations that do not hold.
    pub fn mismatches(&self) -> Vec<&Expectation> {
        self.expectations.iter().filter(|e| e.mismatch()).collect()
    }

    /// Rows that predict a count, and how many of them hold.
    pub fn predicted(&self) -> (usize, usize) {
        let predicted = self
            .expectations
            .iter()
            .filter(|e| e.expected.is_some())
            .count();
        let ok = self.expectations.iter().filter(|e| e.ok()).count();
        (predicted, ok)
    }
}

fn signature(n: &NodeInfo) -> String {
    let srcs: Vec<String> = n
        .srcs
        .iter()
        .map(|s| match s {
            Some(t) => format!("{} {}", t.shape_string(), t.ggml_type.to_lowercase()),
            None => "-".into(),
        })
        .collect();
    format!(
        "{} {} <- {}",
        n.out.shape_string(),
        n.out.ggml_type.to_lowercase(),
        srcs.join(", ")
    )
}

/// Whether the census predicts the graph of `engine`: the predictions describe the graph
/// llama.cpp builds (and the mock engine's fixtures, which copy it); another engine (candle, an
/// imported trace) builds its own, whose counts the architecture does not predict.
pub fn predicts_engine(engine: &str) -> bool {
    matches!(engine, "llama.cpp" | "mock")
}

/// Counts the graph and checks it against the architecture. With `predict` false (a graph not
/// built by llama.cpp) every row reports what the graph holds and says it is not predicted.
pub fn census(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    arch: &ArchInfo,
    predict: bool,
) -> Census {
    let mut total = Count::default();
    let mut per_op: BTreeMap<String, Count> = BTreeMap::new();
    let mut per_band: BTreeMap<String, Count> = BTreeMap::new();
    let mut per_op_band: BTreeMap<String, u32> = BTreeMap::new();
    let mut per_kind: BTreeMap<String, LayerKindCount> = BTreeMap::new();
    for kind in LayerKind::ALL {
        let layers = arch.layers_of(kind);
        if layers > 0 {
            per_kind.entry(kind.as_str().into()).or_default().layers = layers;
        }
    }
    let mut shapes: Vec<ShapeCount> = Vec::new();
    let mut shape_index: BTreeMap<(String, String, String), usize> = BTreeMap::new();
    let layers = effective_layers(graph);
    let mut per_layer = vec![Count::default(); arch.n_layers() as usize];
    for ((n, a), layer) in graph.iter().zip(assignments).zip(&layers) {
        total.add(n);
        per_op.entry(n.op.clone()).or_default().add(n);
        per_band.entry(a.band.clone()).or_default().add(n);
        if let Some(c) = layer.and_then(|l| per_layer.get_mut(l as usize)) {
            c.add(n);
        }
        let kind = layer
            .and_then(|l| arch.kind_of(l))
            .map(|k| k.as_str())
            .unwrap_or("none");
        let k = per_kind.entry(kind.into()).or_default();
        k.nodes += 1;
        if n.is_working() {
            k.working += 1;
            *per_op_band
                .entry(format!("{}/{}", n.op, a.band))
                .or_default() += 1;
            let key = (n.op.clone(), a.band.clone(), signature(n));
            match shape_index.get(&key) {
                Some(&i) => shapes[i].count += 1,
                None => {
                    shape_index.insert(key.clone(), shapes.len());
                    shapes.push(ShapeCount {
                        op: key.0,
                        band: key.1,
                        signature: key.2,
                        count: 1,
                        first_node: n.index,
                    });
                }
            }
        }
    }
    let flash = per_op.get("FLASH_ATTN_EXT").is_some_and(|c| c.working > 0);
    let expected = if predict {
        expected_counts(arch, flash)
    } else {
        Vec::new()
    };
    let mut expectations: Vec<Expectation> = expected
        .into_iter()
        .map(|(op, band, expected, rule)| {
            let found = per_op_band
                .get(&format!("{op}/{band}"))
                .copied()
                .unwrap_or(0);
            Expectation {
                op,
                band,
                expected,
                found,
                rule,
            }
        })
        .collect();
    // the structural ops the graph holds that no prediction covers: listed, not judged
    for (key, &found) in &per_op_band {
        let Some((op, band)) = key.split_once('/') else {
            continue;
        };
        let covered = expectations.iter().any(|e| e.op == op && e.band == band);
        if STRUCTURAL_OPS.contains(&op) && !covered {
            expectations.push(Expectation {
                op: op.to_string(),
                band: band.to_string(),
                expected: None,
                found,
                rule: format!(
                    "not predicted: no rule of {} counts {op} in {band}",
                    arch.arch
                ),
            });
        }
    }
    Census {
        schema_version: CENSUS_SCHEMA_VERSION,
        arch: arch.arch.clone(),
        layers: arch.n_layers(),
        view_nodes: graph.iter().filter(|n| n.is_view).count() as u32,
        skipped_nodes: graph.iter().filter(|n| n.skipped).count() as u32,
        total,
        attention_path: if flash { "flash_attn" } else { "soft_max" }.into(),
        per_op,
        per_band,
        per_op_band,
        per_layer_kind: per_kind,
        per_layer,
        shapes,
        expectations,
    }
}

/// Ops whose count says something about the structure of a model: matmuls, the attention core,
/// recurrent scans, top-k selection. Every (op, band) of these the graph holds gets a census row.
pub const STRUCTURAL_OPS: [&str; 12] = [
    "MUL_MAT",
    "MUL_MAT_ID",
    "FLASH_ATTN_EXT",
    "SOFT_MAX",
    "GATED_DELTA_NET",
    "SSM_SCAN",
    "SSM_CONV",
    "RWKV_WKV6",
    "RWKV_WKV7",
    "GATED_LINEAR_ATTN",
    "ARGSORT",
    "TOP_K",
];

/// One part of a predicted count: `each` per layer of `layers` layers (by kind).
struct Part {
    what: String,
    each: Option<u32>,
    layers: BTreeMap<String, u32>,
}

/// One predicted count per (op, band), summed over layers: the count, or `None` where some
/// layer's part is unknown, and its parts.
#[derive(Default)]
struct Tally {
    rows: Vec<(String, String, Option<u32>, Vec<Part>)>,
}

impl Tally {
    /// `each` nodes in each of `layers` layers of `kind` (`kind` empty: once for the model).
    fn add(
        &mut self,
        op: &str,
        band: &str,
        each: Option<u32>,
        layers: u32,
        kind: &str,
        what: &str,
    ) {
        let n = each.map(|e| e * layers.max(u32::from(kind.is_empty())));
        let row = match self.rows.iter().position(|r| r.0 == op && r.1 == band) {
            Some(i) => &mut self.rows[i],
            None => {
                self.rows
                    .push((op.to_string(), band.to_string(), Some(0), Vec::new()));
                self.rows.last_mut().expect("just pushed")
            }
        };
        row.2 = match (row.2, n) {
            (Some(a), Some(b)) => Some(a + b),
            _ => None,
        };
        match row.3.iter_mut().find(|p| p.what == what && p.each == each) {
            Some(p) => *p.layers.entry(kind.to_string()).or_default() += layers,
            None => row.3.push(Part {
                what: what.to_string(),
                each,
                layers: [(kind.to_string(), layers)].into_iter().collect(),
            }),
        }
    }
}

impl Part {
    /// "the Q/K/V/O projection weights (4 a layer) x 18 layers (15 sliding_window, 3
    /// full_attention)".
    fn describe(&self) -> String {
        let total: u32 = self.layers.values().sum();
        if self.layers.keys().all(|k| k.is_empty()) {
            return self.what.clone();
        }
        let each = self
            .each
            .map(|e| format!(" ({e} a layer)"))
            .unwrap_or_default();
        let kinds: Vec<String> = self
            .layers
            .iter()
            .map(|(k, n)| format!("{n} {k}"))
            .collect();
        if kinds.len() == 1 {
            format!("{}{each} x {}", self.what, kinds[0])
        } else {
            format!(
                "{}{each} x {total} layers ({})",
                self.what,
                kinds.join(", ")
            )
        }
    }
}

/// The working-node counts an architecture's metadata predicts, as (op, band, count, rule):
/// one matmul per projection, expert, router and FFN weight a layer holds (counted from the
/// file's tensors, by role: [`crate::arch::LayerWeights`]), the attention core of every
/// attention layer (one FLASH_ATTN_EXT, or a SOFT_MAX between two matmuls on the soft-max
/// path), one scan and one conv per delta-net or Mamba layer, one top-k selection per MoE layer,
/// one LM head. `None` where a layer's mixer uses its weights in a way opledger does not predict.
///
/// Matmuls are counted per band, so a band rule that moves one (the shared expert to `other`,
/// say) breaks two expectations at once. `flash_attn` is the attention path the graph uses (a
/// runtime setting, not a count).
pub fn expected_counts(
    arch: &ArchInfo,
    flash_attn: bool,
) -> Vec<(String, String, Option<u32>, String)> {
    let mut t = Tally::default();
    // group layers by what decides their counts, so the rules read "x 15 layers"
    let mut groups: BTreeMap<String, (u32, crate::arch::LayerInfo)> = BTreeMap::new();
    for l in &arch.layers {
        let key = format!(
            "{}|{:?}|{:?}|{:?}",
            l.kind.as_str(),
            l.mixer,
            l.ffn,
            l.weights
        );
        groups.entry(key).or_insert((0, *l)).0 += 1;
    }
    for (n, l) in groups.values() {
        let n = *n;
        let kind = l.kind.as_str();
        match l.mixer {
            Mixer::Attention | Mixer::Mla => {
                if flash_attn {
                    t.add(
                        "FLASH_ATTN_EXT",
                        "attention",
                        Some(1),
                        n,
                        kind,
                        "the attention core",
                    );
                } else {
                    t.add(
                        "SOFT_MAX",
                        "attention",
                        Some(1),
                        n,
                        kind,
                        "the attention scores' soft-max",
                    );
                    t.add("MUL_MAT", "attention", Some(2), n, kind, "KQ and KQV");
                }
                let w = l.weights.mixer.unwrap_or(0);
                t.add(
                    "MUL_MAT",
                    "projections",
                    Some(w),
                    n,
                    kind,
                    "the Q/K/V/O projection weights",
                );
            }
            Mixer::DeltaNet => {
                t.add(
                    "GATED_DELTA_NET",
                    "linear_attention",
                    Some(1),
                    n,
                    kind,
                    "the delta-net scan",
                );
                t.add(
                    "SSM_CONV",
                    "linear_attention",
                    Some(1),
                    n,
                    kind,
                    "the short conv",
                );
                let w = l.weights.mixer.unwrap_or(0);
                t.add(
                    "MUL_MAT",
                    "linear_attention",
                    Some(w),
                    n,
                    kind,
                    "the delta-net's projection weights",
                );
            }
            Mixer::Mamba | Mixer::Mamba2 => {
                t.add(
                    "SSM_SCAN",
                    "linear_attention",
                    Some(1),
                    n,
                    kind,
                    "the selective scan",
                );
                t.add("SSM_CONV", "linear_attention", Some(1), n, kind, "the conv");
                let w = l.weights.mixer.unwrap_or(0);
                let what = format!("the {}'s projection weights", l.mixer.as_str());
                t.add("MUL_MAT", "linear_attention", Some(w), n, kind, &what);
            }
            Mixer::None => {}
            other => {
                // RWKV, short conv, other recurrences: their matmuls are not predicted
                let (band, core) = if l.kind.is_attention() {
                    ("projections", "attention")
                } else {
                    ("linear_attention", "linear_attention")
                };
                let what = format!("the {} mixer", other.as_str());
                t.add("MUL_MAT", band, None, n, kind, &what);
                if l.kind.is_attention() {
                    let op = if flash_attn {
                        "FLASH_ATTN_EXT"
                    } else {
                        "SOFT_MAX"
                    };
                    t.add(op, core, None, n, kind, &what);
                }
            }
        }
        match l.ffn {
            FfnKind::Dense => {
                let w = l.weights.dense_ffn;
                t.add(
                    "MUL_MAT",
                    "dense_ffn",
                    Some(w),
                    n,
                    kind,
                    "the dense FFN's gate/up/down weights",
                );
            }
            FfnKind::Moe => {
                let e = l.weights.experts;
                t.add("MUL_MAT_ID", "moe", Some(e), n, kind, "the expert tensors");
                let r = l.weights.router_shared;
                t.add(
                    "MUL_MAT",
                    "moe",
                    Some(r),
                    n,
                    kind,
                    if l.shared_expert {
                        "the router and the shared expert's weights"
                    } else {
                        "the router"
                    },
                );
                t.add("ARGSORT", "moe", Some(1), n, kind, "the top-k selection");
            }
            FfnKind::None => {}
        }
    }
    t.add("MUL_MAT", "other", Some(1), 1, "", "the LM head");
    // what no layer has: stated zeros, so a node in a band the model cannot have shows
    if arch.moe_layers() == 0 {
        t.add(
            "MUL_MAT_ID",
            "moe",
            Some(0),
            1,
            "",
            "a model without routed experts",
        );
    }
    t.rows
        .into_iter()
        .map(|(op, band, n, parts)| {
            let parts: Vec<String> = parts.iter().map(Part::describe).collect();
            let rule = match n {
                Some(_) => parts.join(" + "),
                None => format!(
                    "not predicted: {} uses its weights in a way opledger does not count",
                    parts.join(", ")
                ),
            };
            (op, band, n, rule)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md_with;
    use crate::band::{BandRules, Categoriser};
    use crate::mock::{MockEngine, MockNode};

    /// A hand-written one-layer-of-each-kind graph shaped like llama.cpp's qwen35moe (2 layers:
    /// layer 0 linear attention, layer 1 full attention).
    fn two_layer_graph() -> (Vec<NodeInfo>, ArchInfo) {
        let md = qwen35moe_md_with(&[false, true]);
        let arch = ArchInfo::from_metadata(&md).unwrap();
        let moe = |l: &'static [&'static str; 11]| -> Vec<MockNode> {
            vec![
                ("MUL_MAT", l[0], l[1], 1.0),
                ("SOFT_MAX", l[2], "", 1.0),
                ("ARGSORT", l[3], "", 1.0),
                ("MUL_MAT_ID", l[4], l[5], 1.0),
                ("MUL_MAT_ID", l[6], "", 1.0),
                ("MUL_MAT_ID", l[7], "", 1.0),
                ("MUL_MAT", "ffn_gate-x", l[8], 1.0),
                ("MUL_MAT", "ffn_up-x", l[9], 1.0),
                ("MUL_MAT", "ffn_shexp-x", l[10], 1.0),
            ]
        };
        let mut nodes: Vec<MockNode> = vec![
            ("GET_ROWS", "model.input_embed", "token_embd.weight", 1.0),
            ("MUL_MAT", "node_1", "blk.0.attn_qkv.weight", 1.0),
            ("SSM_CONV", "conv_output_raw-0", "", 1.0),
            ("MUL_MAT", "node_3", "blk.0.ssm_alpha.weight", 1.0),
            ("MUL_MAT", "node_4", "blk.0.ssm_beta.weight", 1.0),
            ("GATED_DELTA_NET", "node_5", "", 1.0),
            ("VIEW", "attn_output-0", "", 0.0),
            ("MUL_MAT", "z-0", "blk.0.attn_gate.weight", 1.0),
            ("MUL_MAT", "linear_attn_out-0", "blk.0.ssm_out.weight", 1.0),
        ];
        nodes.extend(moe(&[
            "ffn_moe_logits-0",
            "blk.0.ffn_gate_inp.weight",
            "ffn_moe_probs-0",
            "ffn_moe_argsort-0",
            "ffn_moe_gate-0",
            "blk.0.ffn_gate_exps.weight",
            "ffn_moe_up-0",
            "ffn_moe_down-0",
            "blk.0.ffn_gate_shexp.weight",
            "blk.0.ffn_up_shexp.weight",
            "blk.0.ffn_down_shexp.weight",
        ]));
        nodes.push((
            "MUL_MAT",
            "shared_expert_gate-0",
            "blk.0.ffn_gate_inp_shexp.weight",
            1.0,
        ));
        nodes.extend([
            ("MUL_MAT", "Qcur_full-1", "blk.1.attn_q.weight", 1.0),
            ("MUL_MAT", "Kcur-1", "blk.1.attn_k.weight", 1.0),
            ("MUL_MAT", "Vcur-1", "blk.1.attn_v.weight", 1.0),
            ("FLASH_ATTN_EXT", "node_20", "", 1.0),
            ("MUL_MAT", "attn_output-1", "blk.1.attn_output.weight", 1.0),
        ]);
        nodes.extend(moe(&[
            "ffn_moe_logits-1",
            "blk.1.ffn_gate_inp.weight",
            "ffn_moe_probs-1",
            "ffn_moe_argsort-1",
            "ffn_moe_gate-1",
            "blk.1.ffn_gate_exps.weight",
            "ffn_moe_up-1",
            "ffn_moe_down-1",
            "blk.1.ffn_gate_shexp.weight",
            "blk.1.ffn_up_shexp.weight",
            "blk.1.ffn_down_shexp.weight",
        ]));
        nodes.push((
            "MUL_MAT",
            "shared_expert_gate-1",
            "blk.1.ffn_gate_inp_shexp.weight",
            1.0,
        ));
        nodes.push(("MUL_MAT", "result_output", "output.weight", 1.0));
        (MockEngine::new(&nodes).graph, arch)
    }

    fn run(rules: &BandRules) -> Census {
        let (graph, arch) = two_layer_graph();
        let a = Categoriser::new(rules, &arch).categorise(&graph);
        census(&graph, &a, &arch, true)
    }

    #[test]
    fn every_expectation_holds_on_a_graph_shaped_by_the_architecture() {
        let c = run(&BandRules::builtin("qwen35moe").unwrap());
        assert!(c.mismatches().is_empty(), "{:#?}", c.mismatches());
        let get = |op: &str, band: &str| {
            c.expectations
                .iter()
                .find(|e| e.op == op && e.band == band)
                .unwrap()
                .found
        };
        // 2 MoE layers x (gate, up, down); router + 3 shared + shared gate = 5 per layer
        assert_eq!(get("MUL_MAT_ID", "moe"), 6);
        assert_eq!(get("MUL_MAT", "moe"), 10);
        assert_eq!(get("MUL_MAT", "projections"), 4);
        assert_eq!(get("MUL_MAT", "linear_attention"), 5);
        assert_eq!(get("GATED_DELTA_NET", "linear_attention"), 1);
        assert_eq!(get("FLASH_ATTN_EXT", "attention"), 1);
        assert_eq!(c.total.nodes, 35);
        assert_eq!(c.view_nodes, 1);
        assert_eq!(c.per_layer_kind["linear_attention"].layers, 1);
        assert_eq!(c.attention_path, "flash_attn");
    }

    #[test]
    fn a_rule_that_drops_the_shared_expert_fails_the_cross_check() {
        let mut rules = BandRules::builtin("qwen35moe").unwrap();
        for t in ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"] {
            rules.weight.insert(t.into(), "other".into());
        }
        let c = run(&rules);
        let bad = c.mismatches();
        assert_eq!(bad.len(), 2, "{bad:#?}");
        let moe = bad.iter().find(|e| e.band == "moe").unwrap();
        assert_eq!(
            (moe.op.as_str(), moe.expected, moe.found),
            ("MUL_MAT", Some(10), 4)
        );
        let other = bad.iter().find(|e| e.band == "other").unwrap();
        assert_eq!((other.expected, other.found), (Some(1), 7));
    }

    #[test]
    fn distinct_shapes_carry_their_multiplicity() {
        let c = run(&BandRules::builtin("qwen35moe").unwrap());
        let total: u32 = c.shapes.iter().map(|s| s.count).sum();
        assert_eq!(total, c.total.working);
        // the mock gives every node with a weight the same shapes: all weighted MUL_MATs of a band
        // collapse into one signature
        let mm_moe = c
            .shapes
            .iter()
            .find(|s| s.op == "MUL_MAT" && s.band == "moe")
            .unwrap();
        assert_eq!(mm_moe.count, 10);
    }

    #[test]
    fn dense_expectations_follow_the_layers() {
        let md = crate::arch::tests::dense_md("llama", 32);
        let arch = ArchInfo::from_metadata(&md).unwrap();
        let e = expected_counts(&arch, false);
        let find = |op: &str, band: &str| e.iter().find(|x| x.0 == op && x.1 == band).unwrap().2;
        assert_eq!(find("MUL_MAT", "dense_ffn"), Some(96));
        assert_eq!(find("MUL_MAT", "attention"), Some(64));
        assert_eq!(find("SOFT_MAX", "attention"), Some(32));
        assert_eq!(find("MUL_MAT", "projections"), Some(128));
        assert_eq!(find("MUL_MAT_ID", "moe"), Some(0));
    }

    #[test]
    fn sliding_and_full_attention_layers_both_count_in_the_attention_core() {
        // Gemma 3 270M's shape: 18 attention layers, 15 of them sliding
        let mut md = crate::arch::tests::dense_md("gemma3", 18);
        md.u.insert("gemma3.attention.sliding_window".into(), 512);
        let arch = ArchInfo::from_metadata(&md).unwrap();
        let e = expected_counts(&arch, true);
        let find = |op: &str, band: &str| e.iter().find(|x| x.0 == op && x.1 == band).unwrap();
        let fa = find("FLASH_ATTN_EXT", "attention");
        assert_eq!(fa.2, Some(18));
        assert!(
            fa.3.contains("x 18 layers (3 full_attention, 15 sliding_window)"),
            "{}",
            fa.3
        );
        assert_eq!(find("MUL_MAT", "projections").2, Some(72));
    }

    #[test]
    fn a_mixer_opledger_does_not_count_is_not_predicted_never_as_expected() {
        // RWKV time mixing: its matmuls are not predicted; the row says so and is no mismatch
        let mut md = crate::arch::tests::MapMetadata::default();
        md.s.insert("general.architecture".into(), "rwkv6".into());
        md.u.insert("rwkv6.block_count".into(), 2);
        md.u.insert("rwkv6.embedding_length".into(), 256);
        for il in 0..2 {
            md.layer_tensors(
                il,
                &[
                    "time_mix_key",
                    "time_mix_value",
                    "time_mix_receptance",
                    "time_mix_output",
                    "channel_mix_key",
                    "channel_mix_value",
                    "channel_mix_receptance",
                ],
            );
        }
        let arch = ArchInfo::from_metadata(&md).unwrap();
        assert_eq!(arch.layer(0).unwrap().mixer, Mixer::Rwkv);
        let graph = MockEngine::new(&[
            ("MUL_MAT", "k-0", "blk.0.time_mix_key.weight", 1.0),
            ("MUL_MAT", "k-1", "blk.1.time_mix_key.weight", 1.0),
            ("MUL_MAT", "result_output", "output.weight", 1.0),
        ])
        .graph;
        let rules = BandRules::builtin("rwkv6").unwrap();
        let a = Categoriser::new(&rules, &arch).categorise(&graph);
        let c = census(&graph, &a, &arch, true);
        let mixer = c
            .expectations
            .iter()
            .find(|e| e.op == "MUL_MAT" && e.band == "linear_attention")
            .unwrap();
        assert_eq!(mixer.expected, None);
        assert_eq!(mixer.found, 2);
        assert_eq!(mixer.status(), ExpectationStatus::NotPredicted);
        assert!(!mixer.ok() && !mixer.mismatch());
        assert!(mixer.rule.starts_with("not predicted"), "{}", mixer.rule);
        // the channel mix is still predicted (3 weights x 2 layers), and the graph here has
        // none of it: a mismatch
        let ffn = c
            .expectations
            .iter()
            .find(|e| e.op == "MUL_MAT" && e.band == "dense_ffn")
            .unwrap();
        assert_eq!((ffn.expected, ffn.found), (Some(6), 0));
        assert!(c.mismatches().iter().any(|e| e.band == "dense_ffn"));
        // a graph no llama.cpp built: nothing is predicted at all
        let c = census(&graph, &a, &arch, false);
        assert!(c.expectations.iter().all(|e| e.expected.is_none()));
        assert!(c.mismatches().is_empty());
    }
}
