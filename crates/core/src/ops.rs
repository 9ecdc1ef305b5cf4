//! Standalone op timing from the census of a prefill chunk or of one decode step: expert
//! routings (first-k, uniform, captured) for the expert matmuls, the weight bytes each routing
//! reads per band (expert weights only of the experts it touches), and the band times they add
//! up to (per-call time x count) set against the in-graph band times and the FUSED wall, so the
//! user sees what standalone timing under- or over-counts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::band::Assignment;
use crate::node::NodeInfo;
use crate::tokens::splitmix64;

pub const OPS_SCHEMA_VERSION: u32 = 2;

/// How the expert ids of a standalone expert matmul are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// Every token uses experts 0..k-1 (what many op benchmarks do).
    FirstK,
    /// Each token k distinct experts of n, uniformly at random (seeded).
    Uniform,
    /// The ids a real run of the model routed.
    Captured,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::FirstK => "first-k",
            Routing::Uniform => "uniform",
            Routing::Captured => "captured",
        }
    }

    pub fn parse(s: &str) -> Option<Routing> {
        match s {
            "first-k" | "firstk" => Some(Routing::FirstK),
            "uniform" => Some(Routing::Uniform),
            "captured" => Some(Routing::Captured),
            _ => None,
        }
    }
}

/// Ids `[n_used, n_tokens]` (n_used fastest) where every token uses experts 0..n_used-1.
pub fn first_k_ids(n_used: u32, n_tokens: u32) -> Vec<i32> {
    (0..n_tokens).flat_map(|_| 0..n_used as i32).collect()
}

/// Ids `[n_used, n_tokens]`: each token `n_used` distinct experts of `n_experts`, uniformly
/// (a partial Fisher-Yates shuffle driven by SplitMix64 from `seed`).
pub fn uniform_ids(n_experts: u32, n_used: u32, n_tokens: u32, seed: u64) -> Vec<i32> {
    let k = n_used.min(n_experts) as usize;
    let mut state = seed;
    let mut pool: Vec<i32> = (0..n_experts as i32).collect();
    let mut out = Vec::with_capacity(k * n_tokens as usize);
    for _ in 0..n_tokens {
        for i in 0..k {
            state = splitmix64(state);
            let j = i + (state % (pool.len() - i) as u64) as usize;
            pool.swap(i, j);
            out.push(pool[i]);
        }
    }
    out
}

/// Distinct experts an ids tensor touches.
pub fn distinct_experts(ids: &[i32]) -> u32 {
    ids.iter().collect::<BTreeSet<_>>().len() as u32
}

/// The expert ids a routing gives the expert matmul `node` (`[n_used, n_tokens]` from its ids
/// source): `None` for a node that is no expert matmul, or for captured routing without ids.
pub fn routing_ids(
    node: &NodeInfo,
    routing: Routing,
    seed: u64,
    captured: &BTreeMap<u32, Vec<i32>>,
) -> Option<Vec<i32>> {
    if node.op != "MUL_MAT_ID" {
        return None;
    }
    let ids = node.src(2)?;
    let (n_used, n_tokens) = (ids.ne[0].max(0) as u32, ids.ne[1].max(0) as u32);
    let experts = node.src(0).map(|w| w.ne[2].max(1) as u32).unwrap_or(1);
    match routing {
        Routing::FirstK => Some(first_k_ids(n_used, n_tokens)),
        Routing::Uniform => Some(uniform_ids(experts, n_used, n_tokens, seed)),
        Routing::Captured => captured.get(&node.index).cloned(),
    }
}

/// Values for an integer source of `node` (slot `slot`, `count` elements) when the node is
/// rebuilt and timed alone: indices in range for the op. An expert matmul's ids are `routing`
/// repeated (the ids `[n_used, n_tokens]` of one routing), else the experts in turn; a
/// GET_ROWS selects the source's rows in turn, a SET_ROWS writes the output's rows in turn, a
/// ROPE's positions count up; any other integer source is 0, an index valid for every op.
pub fn int_source_values(
    node: &NodeInfo,
    slot: usize,
    count: usize,
    routing: Option<&[i32]>,
) -> Vec<i64> {
    let cycle = |n: i64| {
        (0..count as i64)
            .map(move |i| i % n.max(1))
            .collect::<Vec<i64>>()
    };
    match (node.op.as_str(), slot) {
        ("MUL_MAT_ID", 2) => match routing {
            Some(ids) if !ids.is_empty() => (0..count).map(|i| ids[i % ids.len()] as i64).collect(),
            _ => cycle(node.src(0).map_or(1, |s| s.ne[2])),
        },
        ("GET_ROWS", 1) => cycle(node.src(0).map_or(1, |s| s.ne[1])),
        ("SET_ROWS", 1) => cycle(node.out.ne[1]),
        ("ROPE", 1) => (0..count as i64).collect(),
        _ => vec![0; count],
    }
}

/// Weight bytes `node` reads when its expert matmul touches `experts_used` distinct experts:
/// every weight source whole, except an expert tensor (only the touched experts' slices) and
/// the table of a GET_ROWS (only the rows its ids select).
pub fn weight_bytes_read(node: &NodeInfo, experts_used: Option<u32>) -> u64 {
    let mut bytes = 0;
    for (slot, s) in node.srcs.iter().enumerate() {
        let Some(s) = s else { continue };
        if !s.is_weight {
            continue;
        }
        bytes += if node.op == "MUL_MAT_ID" && slot == 0 && s.ne[2] > 0 {
            let per_expert = s.size_bytes / s.ne[2] as u64;
            per_expert * experts_used.unwrap_or(s.ne[2] as u32).min(s.ne[2] as u32) as u64
        } else if node.op == "GET_ROWS" && slot == 0 && s.ne[1] > 0 {
            // rows selected: the elements of the ids source
            let rows = node
                .src(1)
                .map(|ids| ids.ne.iter().map(|&d| d.max(1) as u64).product::<u64>())
                .unwrap_or(s.ne[1] as u64)
                .min(s.ne[1] as u64);
            s.size_bytes / s.ne[1] as u64 * rows
        } else {
            s.size_bytes
        };
    }
    bytes
}

/// Weight bytes read per band by the working nodes of `graph` when every expert matmul touches
/// the experts of `experts[node]` (distinct experts; a node missing from it: every expert).
pub fn band_weight_bytes(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    experts: &BTreeMap<u32, u32>,
) -> BTreeMap<String, u64> {
    let mut out: BTreeMap<String, u64> = BTreeMap::new();
    for (n, a) in graph.iter().zip(assignments) {
        if !n.is_working() {
            continue;
        }
        *out.entry(a.band.clone()).or_default() +=
            weight_bytes_read(n, experts.get(&n.index).copied());
    }
    out
}

/// One distinct (op, shapes, types) timed alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRow {
    pub op: String,
    pub band: String,
    pub signature: String,
    /// Nodes of the graph with this signature.
    pub count: u32,
    /// The routing of an expert matmul (`None` for other ops).
    pub routing: Option<Routing>,
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub reps: u32,
    /// Distinct experts the ids touch, and the bytes of their weights.
    pub experts_touched: Option<u32>,
    pub expert_bytes: Option<u64>,
    /// Copies of the inputs the timing rotated over (so weights are not all cache-warm).
    pub rotation: u32,
}

/// One band, standalone against in-graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpsBandRow {
    pub band: String,
    /// TIMED share x FUSED wall / tokens, from a profile of the same work (decode: the share
    /// with the isolation cost removed).
    pub in_graph_ms_per_token: f64,
    /// Per-call time x count / tokens, per routing.
    pub standalone_ms_per_token: BTreeMap<String, f64>,
    /// Weight bytes one graph (the chunk, or one decode step) reads per routing.
    #[serde(default)]
    pub weight_bytes: BTreeMap<String, u64>,
    /// Decode: working nodes of the band that removing the isolation stopped at 0 (the
    /// profile's `corrected_clamped_nodes`): the in-graph figure is then a lower bound.
    #[serde(default)]
    pub in_graph_clamped_nodes: u32,
}

/// What one graph of an ops run is: a prefill chunk or one decode step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct OpsWork {
    /// Tokens one graph computes: the chunk, or one token per sequence of a decode step.
    pub tokens: u32,
    /// Decode steps of the in-graph profile (0: a prefill chunk) and sequences.
    pub decode_tokens: u32,
    pub parallel: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpsSummary {
    pub schema_version: u32,
    /// Tokens one graph computes (the chunk, or the sequences of one decode step).
    pub tokens: u32,
    /// Decode steps of the in-graph profile (0: a prefill chunk) and sequences.
    #[serde(default)]
    pub decode_tokens: u32,
    #[serde(default)]
    pub parallel: u32,
    /// FUSED wall of one graph (a decode run's wall over its steps).
    pub fused_ms: f64,
    /// Bytes of the cache-flushing write before every timed repetition (0: none; weights then
    /// stay as warm as the repetitions leave them).
    #[serde(default)]
    pub flush_bytes: u64,
    /// Per routing: distinct experts each expert matmul (node index) reads.
    #[serde(default)]
    pub experts_by_routing: BTreeMap<String, BTreeMap<u32, u32>>,
    pub routings: Vec<Routing>,
    pub rows: Vec<OpRow>,
    pub bands: Vec<OpsBandRow>,
    /// Sum of standalone band times / FUSED wall, per routing.
    pub coverage: BTreeMap<String, f64>,
    /// How much lower the MoE band comes out with first-k routing than with captured routing
    /// (a share of the captured figure); `None` without both.
    pub moe_first_k_undercount: Option<f64>,
    pub moe_band: Option<String>,
}

/// Adds up per-call times into bands per routing. `rows` holds one row per signature for ops
/// without routing and one per (signature, routing) for expert matmuls; `fused_ms` is one
/// graph's FUSED wall; `bytes[routing][band]` the weight bytes one graph reads.
#[allow(clippy::too_many_arguments)]
pub fn summarise_ops(
    bands: &[String],
    in_graph: &BTreeMap<String, f64>,
    rows: Vec<OpRow>,
    routings: &[Routing],
    work: OpsWork,
    fused_ms: f64,
    moe_band: Option<&str>,
    bytes: &BTreeMap<String, BTreeMap<String, u64>>,
) -> OpsSummary {
    let tokens = work.tokens;
    let tok = tokens.max(1) as f64;
    let mut band_rows: Vec<OpsBandRow> = bands
        .iter()
        .map(|b| OpsBandRow {
            band: b.clone(),
            in_graph_ms_per_token: in_graph.get(b).copied().unwrap_or(0.0),
            standalone_ms_per_token: BTreeMap::new(),
            weight_bytes: bytes
                .iter()
                .map(|(r, by_band)| (r.clone(), by_band.get(b).copied().unwrap_or(0)))
                .collect(),
            in_graph_clamped_nodes: 0,
        })
        .collect();
    let mut coverage = BTreeMap::new();
    for &r in routings {
        let mut total = 0.0;
        for br in &mut band_rows {
            let ms: f64 = rows
                .iter()
                .filter(|row| {
                    row.band == br.band && (row.routing.is_none() || row.routing == Some(r))
                })
                .map(|row| row.median_us * row.count as f64 / 1e3)
                .sum();
            total += ms;
            br.standalone_ms_per_token
                .insert(r.name().to_string(), ms / tok);
        }
        coverage.insert(
            r.name().to_string(),
            if fused_ms > 0.0 {
                total / fused_ms
            } else {
                0.0
            },
        );
    }
    let moe_first_k_undercount = moe_band.and_then(|m| {
        let row = band_rows.iter().find(|b| b.band == m)?;
        let fk = row.standalone_ms_per_token.get("first-k")?;
        let cap = row.standalone_ms_per_token.get("captured")?;
        (*cap > 0.0).then(|| (cap - fk) / cap)
    });
    OpsSummary {
        schema_version: OPS_SCHEMA_VERSION,
        tokens,
        decode_tokens: work.decode_tokens,
        parallel: work.parallel,
        fused_ms,
        flush_bytes: 0,
        experts_by_routing: BTreeMap::new(),
        routings: routings.to_vec(),
        rows,
        bands: band_rows,
        coverage,
        moe_first_k_undercount,
        moe_band: moe_band.map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::TensorDesc;

    #[test]
    fn integer_sources_of_a_rebuilt_op_hold_indices_in_range() {
        let t = |ne: [i64; 4], ty: &str| TensorDesc {
            name: "t".into(),
            ne,
            ggml_type: ty.into(),
            size_bytes: 0,
            is_weight: false,
            producer: None,
            nb: [0; 4],
        };
        let node = |op: &str, out: [i64; 4], srcs: Vec<TensorDesc>| NodeInfo {
            index: 0,
            op: op.into(),
            name: "n".into(),
            layer: None,
            out: t(out, "f32"),
            srcs: srcs.into_iter().map(Some).collect(),
            is_view: false,
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: vec![],
            device: None,
        };
        // 3 experts, 2 used, 2 tokens: a routing repeated; without one, the experts in turn
        let mm = node(
            "MUL_MAT_ID",
            [4, 2, 2, 1],
            vec![
                t([8, 4, 3, 1], "q8_0"),
                t([8, 1, 2, 1], "f32"),
                t([2, 2, 1, 1], "i32"),
            ],
        );
        assert_eq!(
            int_source_values(&mm, 2, 6, Some(&[2, 0, 1, 2])),
            [2, 0, 1, 2, 2, 0]
        );
        assert_eq!(int_source_values(&mm, 2, 4, None), [0, 1, 2, 0]);
        // rows of a 5-row table; rows of a 2-row destination; positions; anything else 0
        let gr = node(
            "GET_ROWS",
            [8, 3, 1, 1],
            vec![t([8, 5, 1, 1], "f32"), t([7, 1, 1, 1], "i32")],
        );
        assert_eq!(int_source_values(&gr, 1, 7, None), [0, 1, 2, 3, 4, 0, 1]);
        let sr = node(
            "SET_ROWS",
            [8, 2, 1, 1],
            vec![t([8, 3, 1, 1], "f32"), t([3, 1, 1, 1], "i64")],
        );
        assert_eq!(int_source_values(&sr, 1, 3, None), [0, 1, 0]);
        let rope = node(
            "ROPE",
            [8, 1, 3, 1],
            vec![t([8, 1, 3, 1], "f32"), t([3, 1, 1, 1], "i32")],
        );
        assert_eq!(int_source_values(&rope, 1, 3, None), [0, 1, 2]);
        assert_eq!(int_source_values(&rope, 2, 2, None), [0, 0]);
    }

    #[test]
    fn routings_touch_the_experts_they_should() {
        // first-k: exactly k experts
        let fk = first_k_ids(8, 512);
        assert_eq!(fk.len(), 8 * 512);
        assert_eq!(distinct_experts(&fk), 8);
        // uniform, 8 of 256 for 512 tokens: expected distinct = 256 (1 - (1 - 8/256)^512),
        // computed here independently of the generator
        let u = uniform_ids(256, 8, 512, 42);
        let expected = 256.0 * (1.0 - (1.0f64 - 8.0 / 256.0).powi(512));
        let got = distinct_experts(&u) as f64;
        assert!((got - expected).abs() <= 3.0, "{got} vs {expected:.1}");
        // every token's experts are distinct and in range
        for t in u.chunks(8) {
            let mut s = t.to_vec();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), 8);
            assert!(t.iter().all(|&e| (0..256).contains(&e)));
        }
        // fewer tokens, fewer experts: 4 tokens x 8 = at most 32
        assert!(distinct_experts(&uniform_ids(256, 8, 4, 1)) <= 32);
        assert_eq!(uniform_ids(256, 8, 512, 42), u, "seeded");
    }

    fn tensor(name: &str, ne: [i64; 4], ty: &str, bytes: u64, weight: bool) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            ne,
            ggml_type: ty.into(),
            size_bytes: bytes,
            is_weight: weight,
            producer: None,
            nb: [0; 4],
        }
    }

    fn node(index: u32, op: &str, srcs: Vec<TensorDesc>) -> NodeInfo {
        NodeInfo {
            index,
            op: op.into(),
            name: format!("n{index}"),
            layer: Some(0),
            out: tensor("out", [8, 4, 1, 1], "f32", 128, false),
            srcs: srcs.into_iter().map(Some).collect(),
            is_view: false,
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: vec![],
            device: None,
        }
    }

    #[test]
    fn expert_bytes_count_only_the_experts_a_routing_touches() {
        // 16 experts of 1000 bytes, top-4, 4 tokens (decode of 4 sequences)
        let gate = node(
            3,
            "MUL_MAT_ID",
            vec![
                tensor(
                    "blk.0.ffn_gate_exps.weight",
                    [64, 32, 16, 1],
                    "q4_K",
                    16_000,
                    true,
                ),
                tensor("x", [64, 4, 4, 1], "f32", 4096, false),
                tensor("ids", [4, 4, 1, 1], "i32", 64, false),
            ],
        );
        // a routing by hand: tokens on {0,1,2,3}, {0,1,2,4}, {5,6,7,8}, {0,9,10,11}: 12 experts
        let captured =
            BTreeMap::from([(3u32, vec![0, 1, 2, 3, 0, 1, 2, 4, 5, 6, 7, 8, 0, 9, 10, 11])]);
        let fk = routing_ids(&gate, Routing::FirstK, 1, &captured).unwrap();
        let cap = routing_ids(&gate, Routing::Captured, 1, &captured).unwrap();
        assert_eq!((distinct_experts(&fk), distinct_experts(&cap)), (4, 12));
        assert_eq!(weight_bytes_read(&gate, Some(4)), 4_000);
        assert_eq!(weight_bytes_read(&gate, Some(12)), 12_000);
        // an embedding lookup reads the rows of its 4 ids, not the table: 4 x 100 bytes
        let embd = node(
            0,
            "GET_ROWS",
            vec![
                tensor("token_embd.weight", [64, 1000, 1, 1], "q8_0", 100_000, true),
                tensor("inp_tokens", [4, 1, 1, 1], "i32", 16, false),
            ],
        );
        assert_eq!(weight_bytes_read(&embd, None), 400);
        // a dense matmul reads its weight whole; no routing for it
        let mm = node(
            1,
            "MUL_MAT",
            vec![
                tensor("blk.0.attn_q.weight", [64, 64, 1, 1], "q8_0", 4352, true),
                tensor("x", [64, 4, 1, 1], "f32", 1024, false),
            ],
        );
        assert_eq!(weight_bytes_read(&mm, None), 4352);
        assert_eq!(routing_ids(&mm, Routing::FirstK, 1, &captured), None);
        let graph = vec![embd, mm, gate];
        let bands = ["other", "projections", "moe"]
            .iter()
            .map(|b| Assignment {
                band: b.to_string(),
                reason: crate::band::Reason::None,
            })
            .collect::<Vec<_>>();
        let by = |used: u32| band_weight_bytes(&graph, &bands, &BTreeMap::from([(3, used)]));
        assert_eq!(by(4)["moe"], 4_000);
        assert_eq!(by(12)["moe"], 12_000);
        assert_eq!((by(4)["other"], by(4)["projections"]), (400, 4352));
    }

    #[test]
    fn band_times_and_the_first_k_undercount() {
        let bands = vec!["moe".to_string(), "other".into()];
        let row = |band: &str, routing: Option<Routing>, us: f64, count: u32| OpRow {
            op: "X".into(),
            band: band.into(),
            signature: "s".into(),
            count,
            routing,
            median_us: us,
            min_us: us,
            max_us: us,
            reps: 5,
            experts_touched: None,
            expert_bytes: None,
            rotation: 1,
        };
        let rows = vec![
            row("moe", Some(Routing::FirstK), 600.0, 10),
            row("moe", Some(Routing::Captured), 1000.0, 10),
            row("other", None, 100.0, 10),
        ];
        let in_graph = BTreeMap::from([("moe".to_string(), 0.02), ("other".to_string(), 0.002)]);
        let s = summarise_ops(
            &bands,
            &in_graph,
            rows,
            &[Routing::FirstK, Routing::Captured],
            OpsWork {
                tokens: 512,
                decode_tokens: 0,
                parallel: 1,
            },
            12.0,
            Some("moe"),
            &BTreeMap::from([(
                "captured".to_string(),
                BTreeMap::from([("moe".to_string(), 7u64)]),
            )]),
        );
        assert_eq!(s.bands[0].weight_bytes["captured"], 7);
        assert_eq!(s.bands[1].weight_bytes["captured"], 0);
        // captured: moe 10 ms + other 1 ms over 12 ms of FUSED wall
        assert!((s.coverage["captured"] - 11.0 / 12.0).abs() < 1e-12);
        assert!((s.coverage["first-k"] - 7.0 / 12.0).abs() < 1e-12);
        assert!((s.moe_first_k_undercount.unwrap() - 0.4).abs() < 1e-12);
        assert!((s.bands[0].standalone_ms_per_token["captured"] - 10.0 / 512.0).abs() < 1e-12);
    }
}
