//! The census of a real graph: nodes counted per op, per band, per layer kind and per distinct
//! (op, shapes, types), views excluded from the working counts, and cross-checked against the
//! counts the architecture's metadata predicts.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::arch::{ArchInfo, LayerKind};
use crate::band::Assignment;
use crate::node::{effective_layers, NodeInfo};

pub const CENSUS_SCHEMA_VERSION: u32 = 1;

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
    pub expected: u32,
    pub found: u32,
    /// How the expected number follows from the metadata.
    pub rule: String,
}

impl Expectation {
    pub fn ok(&self) -> bool {
        self.expected == self.found
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
        self.expectations.iter().filter(|e| !e.ok()).collect()
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

/// Counts the graph and checks it against the architecture.
pub fn census(graph: &[NodeInfo], assignments: &[Assignment], arch: &ArchInfo) -> Census {
    let mut total = Count::default();
    let mut per_op: BTreeMap<String, Count> = BTreeMap::new();
    let mut per_band: BTreeMap<String, Count> = BTreeMap::new();
    let mut per_op_band: BTreeMap<String, u32> = BTreeMap::new();
    let mut per_kind: BTreeMap<String, LayerKindCount> = BTreeMap::new();
    for kind in [LayerKind::FullAttention, LayerKind::LinearAttention] {
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
    let expected = expected_counts(arch, flash);
    let expectations = expected
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

/// The working-node counts an architecture's metadata predicts, as (op, band, count, rule).
///
/// Matmuls are counted per band, so a band rule that moves one (the shared expert to `other`,
/// say) breaks two expectations at once. `flash_attn` is the attention path the graph uses (a
/// runtime setting, not a count): flash attention has one FLASH_ATTN_EXT per full-attention layer,
/// the soft-max path one SOFT_MAX and two matmuls (KQ, KQV).
pub fn expected_counts(arch: &ArchInfo, flash_attn: bool) -> Vec<(String, String, u32, String)> {
    let l = arch.n_layers();
    let full = arch.layers_of(LayerKind::FullAttention);
    let linear = arch.layers_of(LayerKind::LinearAttention);
    let mut out: Vec<(String, String, u32, String)> = Vec::new();
    let mut push = |op: &str, band: &str, n: u32, rule: String| {
        out.push((op.to_string(), band.to_string(), n, rule));
    };
    if flash_attn {
        push(
            "FLASH_ATTN_EXT",
            "attention",
            full,
            format!("one per full-attention layer ({full})"),
        );
        push(
            "MUL_MAT",
            "attention",
            0,
            "flash attention does KQ and KQV itself".into(),
        );
    } else {
        push(
            "SOFT_MAX",
            "attention",
            full,
            format!("one per full-attention layer ({full})"),
        );
        push(
            "MUL_MAT",
            "attention",
            2 * full,
            format!("KQ and KQV per full-attention layer (2 x {full})"),
        );
    }
    push(
        "MUL_MAT",
        "projections",
        4 * full,
        format!("Q, K, V, O per full-attention layer (4 x {full})"),
    );
    push("MUL_MAT", "other", 1, "the LM head".into());
    match arch.arch.as_str() {
        "qwen35moe" | "qwen3next" => {
            push(
                "GATED_DELTA_NET",
                "linear_attention",
                linear,
                format!("one scan per linear-attention layer ({linear})"),
            );
            push(
                "SSM_CONV",
                "linear_attention",
                linear,
                format!("one conv per linear-attention layer ({linear})"),
            );
            push(
                "MUL_MAT",
                "linear_attention",
                5 * linear,
                format!("attn_qkv, attn_gate, ssm_alpha, ssm_beta, ssm_out per linear-attention layer (5 x {linear})"),
            );
        }
        _ => {}
    }
    if arch.is_moe() {
        let per_layer = if arch.fused_gate_up { 2 } else { 3 };
        push(
            "MUL_MAT_ID",
            "moe",
            per_layer * l,
            format!(
                "{} per MoE layer ({per_layer} x {l})",
                if arch.fused_gate_up {
                    "gate_up and down"
                } else {
                    "gate, up and down"
                }
            ),
        );
        let (n, what) = if arch.shared_expert {
            (5, "router, shared expert gate/up/down and its gate")
        } else {
            (1, "router")
        };
        push(
            "MUL_MAT",
            "moe",
            n * l,
            format!("{what} per MoE layer ({n} x {l})"),
        );
        push(
            "ARGSORT",
            "moe",
            l,
            format!("top-k selection per MoE layer ({l})"),
        );
    } else {
        push(
            "MUL_MAT",
            "dense_ffn",
            3 * l,
            format!("gate, up and down per layer (3 x {l})"),
        );
        push(
            "MUL_MAT_ID",
            "moe",
            0,
            "a dense model routes no experts".into(),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;
    use crate::band::{BandRules, Categoriser};
    use crate::mock::{MockEngine, MockNode};

    /// A hand-written one-layer-of-each-kind graph shaped like llama.cpp's qwen35moe (2 layers:
    /// layer 0 linear attention, layer 1 full attention, via a recurrent_layers array).
    fn two_layer_graph() -> (Vec<NodeInfo>, ArchInfo) {
        let mut md = qwen35moe_md(2);
        md.a.insert("qwen35moe.attention.recurrent_layers".into(), vec![1, 0]);
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
        census(&graph, &a, &arch)
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
            ("MUL_MAT", 10, 4)
        );
        let other = bad.iter().find(|e| e.band == "other").unwrap();
        assert_eq!((other.expected, other.found), (1, 7));
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
        let mut md = crate::arch::tests::MapMetadata::default();
        md.s.insert("general.architecture".into(), "llama".into());
        for (k, v) in [
            ("block_count", 32u64),
            ("embedding_length", 4096),
            ("attention.head_count", 32),
        ] {
            md.u.insert(format!("llama.{k}"), v);
        }
        let arch = ArchInfo::from_metadata(&md).unwrap();
        let e = expected_counts(&arch, false);
        let find = |op: &str, band: &str| e.iter().find(|x| x.0 == op && x.1 == band).unwrap().2;
        assert_eq!(find("MUL_MAT", "dense_ffn"), 96);
        assert_eq!(find("MUL_MAT", "attention"), 64);
        assert_eq!(find("SOFT_MAX", "attention"), 32);
        assert_eq!(find("MUL_MAT", "projections"), 128);
    }
}
