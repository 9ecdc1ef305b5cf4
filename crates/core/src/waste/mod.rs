//! Work computed and thrown away: for every node of a real graph, the share of its output rows
//! (tokens) that reach something kept (the requested logits, a KV-cache or recurrent-state
//! write), found by propagating needed rows backwards from the kept outputs, and the time spent
//! on the other rows (TIMED median x (1 - needed share)). Measuring lives in `crate::profile`.
//!
//! # How ops pass needed rows back
//!
//! Every tensor has at most one *token dimension*: the dimension whose size is the number of
//! token rows it holds (the chunk's tokens; after llama.cpp's `out_ids` selection, the requested
//! outputs). It is found from the shapes, forward through the graph: the dimension an op maps its
//! source's token dimension to, else the only dimension of that size, else `ne[1]` of a 2-D
//! tensor, else the last dimension of that size. A tensor without one (a recurrent state, a
//! concatenation along time, a tensor of one row) is one indivisible row. Each op is treated as
//! [`TREATMENTS`] says; an op missing from that table is [`Treatment::Unknown`]: it needs every
//! row of every source, and all of its own rows count as needed (waste is never over-claimed).
//! A source row is passed back one-to-one ("row-wise") only when the op maps the source's token
//! dimension to the output's and both hold the same number of rows; in every other case the
//! source is needed whole.
//!
//! The rows an `out_ids` / `inp_out_ids` GET_ROWS selects are runtime data the graph does not
//! carry: they are taken from the work's request (the last token, or every token with all
//! logits). Every other GET_ROWS that selects tokens needs all rows of its source.
//!
//! Kept outputs are the nodes nothing in the graph reads (the logits `result_output`, cache
//! writes, and any other sink, which is conservatively kept whole) and every node that writes
//! into a cache tensor (`cache_k_l*`, `cache_v_l*`, `cache_r_l*`, `cache_s_l*`). Nodes the backend
//! skips, and empty nodes, are neither kept nor charged: all their rows count as needed.
//!
//! The wasted time of a node is an upper bound on what trimming could save: a matmul computed for
//! one row instead of many still streams its whole weight.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::Assignment;
use crate::engine::Work;
use crate::node::{base_name, effective_layers, NodeInfo};
use crate::profile::{membership, node_medians_us, per_cycle_ms_per_token, ProfileRaw};
use crate::stats::Sample;

/// Version of the waste `summary.json`; bumped on any incompatible change.
pub const WASTE_SCHEMA_VERSION: u32 = 1;

/// Names of the input that holds the rows whose outputs were requested (llama.cpp calls it
/// `inp_out_ids` in its graph code and names the tensor `out_ids`).
pub const OUTPUT_IDS: [&str; 2] = ["out_ids", "inp_out_ids"];

/// How an op passes the needed rows of its output back to its sources.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Treatment {
    /// Element by element, broadcasting: a source dimension of the output's size maps to the same
    /// output dimension (ADD, MUL, SCALE, unary ops, GLU ops).
    Elementwise,
    /// Works along `ne[0]` within each row (norms, soft-max, sums, sorting, rope): row-wise over a
    /// token dimension of 1 or more; a token dimension 0 is mixed, so the source is needed whole.
    RowReduce,
    /// `MUL_MAT(a, b)`: output `ne[0]` is a row of `a` (its `ne[1]`), `ne[1]` a row of `b`,
    /// `ne[2..]` broadcast; a token dimension 0 is contracted over, so needed whole.
    MatMul,
    /// `MUL_MAT_ID(experts, b, ids)`: each token's rows of `b` and `ids` map to that token's
    /// output; the expert weights are needed whole.
    MatMulId,
    /// `GET_ROWS(a, ids)`: selects `ne[1]` rows of `a` per batch. Batched over a token dimension
    /// of 2 or more it is row-wise; selecting tokens by `out_ids` uses the request; selecting
    /// tokens by any other ids needs the source whole.
    GetRows,
    /// `FLASH_ATTN_EXT(q, k, v, mask)`: a query row makes one output row, so `q` is row-wise;
    /// `k`, `v` (every context row) and the mask are needed whole.
    Attention,
    /// Mixes rows along time (SSM_CONV, SSM_SCAN, GATED_DELTA_NET, RWKV, CONCAT): computing row t
    /// takes every row up to t, so the op itself and its aligned sources need every row up to the
    /// last needed one; other sources are needed whole.
    Scan,
    /// Keeps the elements' flattened order (RESHAPE, CONT, DUP, CPY): the token dimension maps
    /// when the dimensions before it hold the same number of elements.
    Reshape,
    /// Reinterprets memory (VIEW, PERMUTE, TRANSPOSE): token rows map one-to-one when source and
    /// output hold the same number of token rows.
    View,
    /// Writes rows at runtime indices (SET_ROWS): every source is needed whole.
    IndexedWrite,
    /// Anything else: every source needed whole, and the node's own rows all needed.
    Unknown,
}

impl Treatment {
    pub fn as_str(self) -> &'static str {
        match self {
            Treatment::Elementwise => "elementwise",
            Treatment::RowReduce => "row_reduce",
            Treatment::MatMul => "mat_mul",
            Treatment::MatMulId => "mat_mul_id",
            Treatment::GetRows => "get_rows",
            Treatment::Attention => "attention",
            Treatment::Scan => "scan",
            Treatment::Reshape => "reshape",
            Treatment::View => "view",
            Treatment::IndexedWrite => "indexed_write",
            Treatment::Unknown => "unknown",
        }
    }
}

/// Every op (as `ggml_op_desc` spells it) with a known treatment.
pub const TREATMENTS: &[(&str, Treatment)] = &[
    ("ADD", Treatment::Elementwise),
    ("ADD1", Treatment::Elementwise),
    ("SUB", Treatment::Elementwise),
    ("MUL", Treatment::Elementwise),
    ("DIV", Treatment::Elementwise),
    ("SCALE", Treatment::Elementwise),
    ("CLAMP", Treatment::Elementwise),
    ("SQR", Treatment::Elementwise),
    ("SQRT", Treatment::Elementwise),
    ("LOG", Treatment::Elementwise),
    ("SIN", Treatment::Elementwise),
    ("COS", Treatment::Elementwise),
    ("ABS", Treatment::Elementwise),
    ("SGN", Treatment::Elementwise),
    ("NEG", Treatment::Elementwise),
    ("STEP", Treatment::Elementwise),
    ("TANH", Treatment::Elementwise),
    ("ELU", Treatment::Elementwise),
    ("RELU", Treatment::Elementwise),
    ("LEAKY_RELU", Treatment::Elementwise),
    ("SIGMOID", Treatment::Elementwise),
    ("GELU", Treatment::Elementwise),
    ("GELU_QUICK", Treatment::Elementwise),
    ("GELU_ERF", Treatment::Elementwise),
    ("SILU", Treatment::Elementwise),
    ("HARDSWISH", Treatment::Elementwise),
    ("HARDSIGMOID", Treatment::Elementwise),
    ("EXP", Treatment::Elementwise),
    ("SOFTPLUS", Treatment::Elementwise),
    ("SWIGLU", Treatment::Elementwise),
    ("SWIGLU_OAI", Treatment::Elementwise),
    ("GEGLU", Treatment::Elementwise),
    ("GEGLU_ERF", Treatment::Elementwise),
    ("GEGLU_QUICK", Treatment::Elementwise),
    ("REGLU", Treatment::Elementwise),
    ("RMS_NORM", Treatment::RowReduce),
    ("NORM", Treatment::RowReduce),
    ("L2_NORM", Treatment::RowReduce),
    ("SOFT_MAX", Treatment::RowReduce),
    ("SUM_ROWS", Treatment::RowReduce),
    ("MEAN", Treatment::RowReduce),
    ("ARGMAX", Treatment::RowReduce),
    ("ARGSORT", Treatment::RowReduce),
    ("TOP_K", Treatment::RowReduce),
    ("CUMSUM", Treatment::RowReduce),
    ("ROPE", Treatment::RowReduce),
    ("MUL_MAT", Treatment::MatMul),
    ("MUL_MAT_ID", Treatment::MatMulId),
    ("GET_ROWS", Treatment::GetRows),
    ("FLASH_ATTN_EXT", Treatment::Attention),
    ("SSM_CONV", Treatment::Scan),
    ("SSM_SCAN", Treatment::Scan),
    ("GATED_DELTA_NET", Treatment::Scan),
    ("RWKV_WKV6", Treatment::Scan),
    ("RWKV_WKV7", Treatment::Scan),
    ("GATED_LINEAR_ATTN", Treatment::Scan),
    ("CONCAT", Treatment::Scan),
    ("RESHAPE", Treatment::Reshape),
    ("CONT", Treatment::Reshape),
    ("DUP", Treatment::Reshape),
    ("CPY", Treatment::Reshape),
    ("VIEW", Treatment::View),
    ("PERMUTE", Treatment::View),
    ("TRANSPOSE", Treatment::View),
    ("SET_ROWS", Treatment::IndexedWrite),
];

/// The treatment of an op; [`Treatment::Unknown`] for an op not in [`TREATMENTS`].
pub fn treatment(op: &str) -> Treatment {
    TREATMENTS
        .iter()
        .find(|(o, _)| *o == op)
        .map(|(_, t)| *t)
        .unwrap_or(Treatment::Unknown)
}

/// What a kept node keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kept {
    /// The requested logits (`result_output`).
    Logits,
    /// A write into a KV cache or recurrent-state tensor (`cache_*`).
    CacheWrite,
    /// A node nothing reads that is neither: kept whole, to be safe.
    OtherSink,
}

/// The rows of one node's output and how many of them something kept reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeNeed {
    /// The output's token dimension (`None`: the output is one indivisible row).
    pub token_dim: Option<u8>,
    /// Token rows of the output (1 without a token dimension).
    pub rows: u32,
    /// Rows something kept reads.
    pub needed: u32,
    /// The highest needed row, if any.
    pub last_needed: Option<u32>,
    pub treatment: Treatment,
    /// Set when the node is a kept output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kept: Option<Kept>,
}

impl NodeNeed {
    /// The share of the output's rows that something kept reads.
    pub fn needed_fraction(&self) -> f64 {
        if self.rows == 0 {
            1.0
        } else {
            self.needed as f64 / self.rows as f64
        }
    }
}

/// Which rows of a chunk the work requested outputs for: the rows an `out_ids` selection picks,
/// in order.
pub fn requested_rows(work: &Work) -> Vec<u32> {
    let t = work.chunk_tokens;
    if work.all_logits {
        (0..t).collect()
    } else if t > 0 {
        vec![t - 1]
    } else {
        Vec::new()
    }
}

/// How one source's rows follow from the output's needed rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Output row r needs source row r.
    RowWise,
    /// Output row r needs source row `selection[r]`.
    Select,
    /// Every source row up to the last needed output row.
    Prefix,
    /// Every source row.
    All,
}

/// The output dimension a source's dimension `ds` maps to under the op, if it maps to one.
fn maps_to(node: &NodeInfo, t: Treatment, slot: usize, src: &[i64; 4], ds: usize) -> Option<usize> {
    let out = &node.out.ne;
    let same = |d: usize| (d < 4 && out[d] == src[ds]).then_some(d);
    match t {
        Treatment::Elementwise | Treatment::Scan => same(ds),
        Treatment::RowReduce => (ds >= 1).then(|| same(ds)).flatten(),
        Treatment::MatMul => match (slot, ds) {
            (_, 0) => None,
            (0, 1) => same(0),
            (1, 1) => same(1),
            (0 | 1, d) => same(d),
            _ => None,
        },
        Treatment::MatMulId => match slot {
            1 if ds >= 1 => same(ds),
            2 => same(ds + 1),
            _ => None,
        },
        Treatment::GetRows => match slot {
            0 if ds >= 2 => same(ds),
            1 => same(ds + 1),
            _ => None,
        },
        Treatment::Attention => match (slot, ds) {
            (0, 1) => same(2),
            (0, 2) => same(1),
            (0, 3) => same(3),
            _ => None,
        },
        Treatment::Reshape => {
            if slot != 0 || src.iter().product::<i64>() != out.iter().product::<i64>() {
                return None;
            }
            let before: i64 = src[..ds].iter().product();
            (0..4).find(|&k| out[k] == src[ds] && out[..k].iter().product::<i64>() == before)
        }
        Treatment::View => {
            if slot != 0 {
                return None;
            }
            if node.op == "TRANSPOSE" {
                return same(match ds {
                    0 => 1,
                    1 => 0,
                    d => d,
                });
            }
            let hits: Vec<usize> = (0..4).filter(|&k| out[k] == src[ds]).collect();
            match hits.as_slice() {
                [k] => Some(*k),
                _ => hits.contains(&ds).then_some(ds),
            }
        }
        Treatment::IndexedWrite | Treatment::Unknown => None,
    }
}

/// The token dimension of a tensor of shape `ne` holding `rows` token rows, without hints.
fn token_dim_by_shape(ne: &[i64; 4], rows: u32) -> Option<usize> {
    if rows <= 1 {
        return None;
    }
    let r = rows as i64;
    let hits: Vec<usize> = (0..4).filter(|&d| ne[d] == r).collect();
    match hits.as_slice() {
        [] => None,
        [d] => Some(*d),
        _ if ne[2] == 1 && ne[3] == 1 && hits.contains(&1) => Some(1),
        _ => hits.last().copied(),
    }
}

fn is_output_ids(name: &str) -> bool {
    OUTPUT_IDS.contains(&base_name(name))
}

/// Does the node write into a cache tensor? Its own name, or the destination it writes into (a
/// CPY's second source, a SET_ROWS's third, followed through views to the leaf), names one.
fn writes_cache(graph: &[NodeInfo], i: usize) -> bool {
    let node = &graph[i];
    if node.is_view {
        return false;
    }
    let is_cache = |name: &str| base_name(name).starts_with("cache_");
    if !(node.inplace || node.op == "CPY" || node.op == "SET_ROWS") {
        return false;
    }
    if is_cache(&node.name) {
        return true;
    }
    let dest = match node.op.as_str() {
        "CPY" => node.src(1),
        "SET_ROWS" => node.src(2),
        _ => node.src(0),
    };
    let mut cur = dest;
    for _ in 0..graph.len() {
        let Some(t) = cur else { return false };
        if is_cache(&t.name) {
            return true;
        }
        match t.producer.map(|p| &graph[p as usize]) {
            Some(p) if p.is_view => cur = p.src(0),
            _ => return false,
        }
    }
    false
}

/// The rows of every node's output that something kept reads, for a chunk of `work`.
pub fn needs(graph: &[NodeInfo], work: &Work) -> Vec<NodeNeed> {
    needs_for(graph, work.chunk_tokens, &requested_rows(work))
}

/// [`needs`] for a chunk of `chunk` tokens whose `out_ids` selection picks `selection`.
pub fn needs_for(graph: &[NodeInfo], chunk: u32, selection: &[u32]) -> Vec<NodeNeed> {
    let n = graph.len();

    // forward: the token rows each tensor holds, then its token dimension
    let mut basis = vec![chunk; n];
    let mut tok: Vec<Option<usize>> = vec![None; n];
    let producer_of =
        |s: &crate::node::TensorDesc| s.producer.map(|p| p as usize).filter(|&p| p < n);
    for i in 0..n {
        let node = &graph[i];
        let t = treatment(&node.op);
        let srcs: Vec<(usize, usize)> = node
            .srcs
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| s.as_ref().and_then(producer_of).map(|p| (slot, p)))
            .collect();
        // an out_ids selection of tokens: the output holds the selected rows
        if t == Treatment::GetRows {
            if let (Some(a), Some(ids)) = (node.src(0), node.src(1)) {
                let a_tok = producer_of(a).and_then(|p| tok[p]);
                if a_tok == Some(1) && ids.producer.is_none() && is_output_ids(&ids.name) {
                    let rows = ids.ne[0].max(0) as u32;
                    basis[i] = rows;
                    tok[i] = (rows > 1 && node.out.ne[1] == rows as i64).then_some(1);
                    continue;
                }
            }
        }
        basis[i] = srcs.iter().map(|&(_, p)| basis[p]).max().unwrap_or(chunk);
        let rows = basis[i] as i64;
        if rows <= 1 {
            continue;
        }
        let hint = srcs.iter().find_map(|&(slot, p)| {
            let ds = tok[p]?;
            if basis[p] != basis[i] {
                return None;
            }
            let src = node.src(slot)?;
            maps_to(node, t, slot, &src.ne, ds).filter(|&k| node.out.ne[k] == rows)
        });
        tok[i] = hint.or_else(|| token_dim_by_shape(&node.out.ne, basis[i]));
    }
    let rows_of = |i: usize| -> usize {
        match tok[i] {
            Some(d) => graph[i].out.ne[d].max(0) as usize,
            None => 1,
        }
    };

    // the kept outputs
    let mut consumed = vec![false; n];
    for node in graph {
        for p in node.srcs.iter().flatten().filter_map(producer_of) {
            consumed[p] = true;
        }
    }
    let mut kept: Vec<Option<Kept>> = vec![None; n];
    for i in 0..n {
        let node = &graph[i];
        if node.skipped || node.out.ne.contains(&0) {
            continue;
        }
        kept[i] = if writes_cache(graph, i) {
            Some(Kept::CacheWrite)
        } else if consumed[i] {
            None
        } else if base_name(&node.name) == "result_output" {
            Some(Kept::Logits)
        } else {
            Some(Kept::OtherSink)
        };
    }

    // backward: needed rows, from the kept outputs to the inputs
    let mut need: Vec<Vec<bool>> = (0..n).map(|i| vec![false; rows_of(i)]).collect();
    for i in (0..n).rev() {
        let node = &graph[i];
        let t = treatment(&node.op);
        if kept[i].is_some() {
            need[i].iter_mut().for_each(|b| *b = true);
        }
        let Some(last) = need[i].iter().rposition(|&b| b) else {
            continue;
        };
        match t {
            Treatment::Scan => need[i][..=last].iter_mut().for_each(|b| *b = true),
            Treatment::Unknown | Treatment::IndexedWrite => {
                need[i].iter_mut().for_each(|b| *b = true)
            }
            _ => {}
        }
        let out_need = need[i].clone();
        for (slot, src) in node.srcs.iter().enumerate() {
            let Some(p) = src.as_ref().and_then(producer_of) else {
                continue;
            };
            if p >= i {
                continue;
            }
            let src = src.as_ref().expect("a source with a producer is present");
            let aligned = match (tok[p], tok[i]) {
                (Some(tp), Some(ti)) if rows_of(p) == rows_of(i) => match t {
                    Treatment::View => true,
                    _ => maps_to(node, t, slot, &src.ne, tp) == Some(ti),
                },
                _ => false,
            };
            let pass = match t {
                Treatment::GetRows
                    if slot == 0
                        && tok[p] == Some(1)
                        && node.src(1).is_some_and(|ids| {
                            ids.producer.is_none()
                                && is_output_ids(&ids.name)
                                && ids.ne[0] == selection.len() as i64
                        }) =>
                {
                    Pass::Select
                }
                Treatment::Unknown | Treatment::IndexedWrite => Pass::All,
                Treatment::Scan if aligned => Pass::Prefix,
                Treatment::Scan => Pass::All,
                _ if aligned => Pass::RowWise,
                _ => Pass::All,
            };
            let target = &mut need[p];
            match pass {
                Pass::RowWise => {
                    for (dst, &src_needed) in target.iter_mut().zip(&out_need) {
                        *dst |= src_needed;
                    }
                }
                Pass::Prefix => {
                    let end = (last + 1).min(target.len());
                    target[..end].iter_mut().for_each(|b| *b = true);
                }
                Pass::Select => {
                    let wanted: Vec<usize> = if out_need.len() == selection.len() {
                        (0..selection.len()).filter(|&r| out_need[r]).collect()
                    } else {
                        // the output is one indivisible row: every selected row
                        (0..selection.len()).collect()
                    };
                    for r in wanted {
                        match target.get_mut(selection[r] as usize) {
                            Some(b) => *b = true,
                            None => target.iter_mut().for_each(|b| *b = true),
                        }
                    }
                }
                Pass::All => target.iter_mut().for_each(|b| *b = true),
            }
        }
    }

    // nodes that compute nothing (skipped by the backend, or empty) are not charged
    for i in 0..n {
        if graph[i].skipped || graph[i].out.ne.contains(&0) {
            need[i].iter_mut().for_each(|b| *b = true);
        }
    }
    (0..n)
        .map(|i| NodeNeed {
            token_dim: tok[i].map(|d| d as u8),
            rows: need[i].len() as u32,
            needed: need[i].iter().filter(|&&b| b).count() as u32,
            last_needed: need[i].iter().rposition(|&b| b).map(|r| r as u32),
            treatment: treatment(&graph[i].op),
            kept: kept[i],
        })
        .collect()
}

/// One band: its time and the part of it spent on rows nobody reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WasteBandRow {
    pub band: String,
    /// The band's ms/token, by the same estimator as the summary's (the median of the per-cycle
    /// values); its wasted ms/token likewise, and the shares are ratios of these points.
    pub ms_per_token: f64,
    pub wasted_ms_per_token: f64,
    /// Wasted share of the band's own time.
    pub wasted_share_of_band: f64,
    /// Wasted share of the whole chunk.
    pub wasted_share: f64,
    /// Nodes with waste.
    pub nodes: u32,
}

/// One layer (`None`: nodes outside layers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WasteLayerRow {
    pub layer: Option<u32>,
    pub ms_per_token: f64,
    pub wasted_ms_per_token: f64,
    pub wasted_share_of_layer: f64,
    pub wasted_share: f64,
    pub nodes: u32,
}

/// One node with waste.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeWaste {
    pub index: u32,
    pub op: String,
    pub name: String,
    pub layer: Option<u32>,
    pub band: String,
    pub treatment: Treatment,
    pub rows: u32,
    pub needed_rows: u32,
    pub median_us: f64,
    pub wasted_us: f64,
    pub wasted_ms_per_token: f64,
}

/// Nodes of one op counted together (ops treated as unknown, kept sinks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpCount {
    pub op: String,
    pub nodes: u32,
    /// Their median TIMED ms for the chunk.
    pub timed_ms: f64,
}

/// What the graph keeps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KeptCounts {
    /// Logits nodes and the rows they hold.
    pub logits_nodes: u32,
    pub logits_rows: u32,
    pub cache_writes: u32,
    /// Names of sinks kept whole only to be safe.
    pub other_sinks: Vec<String>,
}

/// The waste summary (`summary.json` of a `waste` run).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WasteSummary {
    pub schema_version: u32,
    pub tokens: u32,
    pub depth_tokens: u32,
    /// Which logits were requested: `last` or `all`.
    pub logits: String,
    pub cycles: u32,
    /// Median FUSED wall of the chunk.
    pub fused_ms: f64,
    /// FUSED wall / tokens.
    pub ms_per_token: f64,
    /// Sum of the per-node TIMED medians.
    pub timed_sum_ms: f64,
    /// Sum of TIMED median x (1 - needed share), over nodes.
    pub wasted_timed_ms: f64,
    /// `wasted_ms_per_token` over `ms_per_token`: the share of the FUSED wall spent on rows
    /// nobody reads.
    pub wasted_share: f64,
    /// The median over cycles of the per-cycle value (the unread rows' share of that cycle's
    /// TIMED sum x that cycle's FUSED wall / tokens): one estimator for the point and its range.
    pub wasted_ms_per_token: f64,
    /// Range (min..max) of the same per-cycle values.
    pub wasted_ms_per_token_min: f64,
    pub wasted_ms_per_token_max: f64,
    /// The wasted share from each node's fastest TIMED time over the cycles: on a busy machine,
    /// where a few stalls inflate small nodes, the least disturbed estimate, as a cross-check.
    pub wasted_share_of_minimums: f64,
    /// Throughput gain if the rows nobody reads were not computed: 1 / (1 - share) - 1.
    pub gain_if_trimmed: f64,
    pub kept: KeptCounts,
    /// Every band, in rule-set order as the assignments name them.
    pub bands: Vec<WasteBandRow>,
    /// Layers with waste, in layer order (nodes outside layers last).
    pub layers: Vec<WasteLayerRow>,
    /// Nodes with waste, most first.
    pub nodes: Vec<NodeWaste>,
    /// Ops no rule knows, treated as needing every row (never claimed as waste).
    pub unknown_ops: Vec<OpCount>,
    /// The stored run the timings came from, when not measured by this command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_run: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum WasteError {
    #[error("the profile has no measured cycle")]
    NoCycles,
    #[error("{0} assignments for a graph of {1} nodes")]
    Assignments(usize, usize),
    #[error("cycle {cycle} timed {found} nodes, the graph has {expected}")]
    NodeCount {
        cycle: usize,
        found: usize,
        expected: usize,
    },
    #[error("a non-finite or empty measurement in {0}")]
    BadSample(String),
}

/// Summarises the waste of a stored profile: `assignments[i]` is the band of `raw.graph[i]`,
/// `needs` what [`needs`] found for it; bands are listed in `band_order`, then any other band the
/// assignments name.
pub fn summarise(
    raw: &ProfileRaw,
    assignments: &[Assignment],
    needs: &[NodeNeed],
    band_order: &[&str],
) -> Result<WasteSummary, WasteError> {
    let n = raw.graph.len();
    if raw.cycles.is_empty() {
        return Err(WasteError::NoCycles);
    }
    if assignments.len() != n || needs.len() != n {
        return Err(WasteError::Assignments(
            assignments.len().min(needs.len()),
            n,
        ));
    }
    for (cycle, c) in raw.cycles.iter().enumerate() {
        if c.node_us.len() != n {
            return Err(WasteError::NodeCount {
                cycle,
                found: c.node_us.len(),
                expected: n,
            });
        }
    }
    let tokens = raw.config.work.chunk_tokens;
    let tok = tokens.max(1) as f64;
    let medians = node_medians_us(raw);
    let unneeded: Vec<f64> = needs.iter().map(|d| 1.0 - d.needed_fraction()).collect();
    let wasted_us: Vec<f64> = (0..n).map(|i| medians[i] * unneeded[i]).collect();
    let total_us: f64 = medians.iter().sum();
    // one estimator for every ms/token figure (as the profile's): the median of its per-cycle
    // values (the part's share of that cycle's TIMED sum x that cycle's FUSED wall / tokens),
    // their min..max the range; a share is a point over the point it is a share of
    let times: Vec<&[f64]> = raw.cycles.iter().map(|c| c.node_us.as_slice()).collect();
    let walls: Vec<f64> = raw.cycles.iter().map(|c| c.fused_ms).collect();
    let estimate = |weight: &dyn Fn(usize) -> f64| -> Result<Sample, WasteError> {
        Sample::new(&per_cycle_ms_per_token(&times, &walls, tok, weight))
            .map_err(|_| WasteError::BadSample("ms/token".into()))
    };
    let point = |weight: &dyn Fn(usize) -> f64| estimate(weight).map(|s| s.median());
    let fused = Sample::new(&walls)
        .map_err(|_| WasteError::BadSample("fused_ms".into()))?
        .median();
    let whole_ms = point(&|_| 1.0)?;
    let share = |ms: f64| if whole_ms > 0.0 { ms / whole_ms } else { 0.0 };
    let per_cycle = estimate(&|i| unneeded[i])?;
    let minimums: Vec<f64> = (0..n)
        .map(|i| {
            raw.cycles
                .iter()
                .map(|c| c.node_us[i])
                .fold(f64::INFINITY, f64::min)
        })
        .collect();
    let min_total: f64 = minimums.iter().sum();
    let wasted_share_of_minimums = if min_total > 0.0 {
        (0..n).map(|i| minimums[i] * unneeded[i]).sum::<f64>() / min_total
    } else {
        0.0
    };

    let layers_of = effective_layers(&raw.graph);
    let mut band_order: Vec<&str> = band_order.to_vec();
    for a in assignments {
        if !band_order.contains(&a.band.as_str()) {
            band_order.push(&a.band);
        }
    }
    // (ms/token, wasted ms/token, nodes with waste) of a group of nodes
    let group = |member: &dyn Fn(usize) -> bool| -> Result<(f64, f64, u32), WasteError> {
        let all = point(&membership(member))?;
        let wasted = point(&|i| if member(i) { unneeded[i] } else { 0.0 })?;
        let count = (0..n).filter(|&i| member(i) && wasted_us[i] > 0.0).count() as u32;
        Ok((all, wasted, count))
    };
    let bands = band_order
        .iter()
        .map(|&band| {
            let (all, wasted, nodes) = group(&|i| assignments[i].band == band)?;
            Ok(WasteBandRow {
                band: band.to_string(),
                ms_per_token: all,
                wasted_ms_per_token: wasted,
                wasted_share_of_band: if all > 0.0 { wasted / all } else { 0.0 },
                wasted_share: share(wasted),
                nodes,
            })
        })
        .collect::<Result<Vec<_>, WasteError>>()?;
    let mut layer_keys: Vec<Option<u32>> = layers_of.clone();
    layer_keys.sort_by_key(|l| (l.is_none(), *l));
    layer_keys.dedup();
    let mut layers = Vec::new();
    for layer in layer_keys {
        let (all, wasted, nodes) = group(&|i| layers_of[i] == layer)?;
        if wasted > 0.0 {
            layers.push(WasteLayerRow {
                layer,
                ms_per_token: all,
                wasted_ms_per_token: wasted,
                wasted_share_of_layer: if all > 0.0 { wasted / all } else { 0.0 },
                wasted_share: share(wasted),
                nodes,
            });
        }
    }
    let mut nodes: Vec<NodeWaste> = Vec::new();
    for i in (0..n).filter(|&i| wasted_us[i] > 0.0) {
        let g = &raw.graph[i];
        nodes.push(NodeWaste {
            index: g.index,
            op: g.op.clone(),
            name: g.name.clone(),
            layer: layers_of[i],
            band: assignments[i].band.clone(),
            treatment: needs[i].treatment,
            rows: needs[i].rows,
            needed_rows: needs[i].needed,
            median_us: medians[i],
            wasted_us: wasted_us[i],
            wasted_ms_per_token: point(&|j| if j == i { unneeded[i] } else { 0.0 })?,
        });
    }
    nodes.sort_by(|a, b| {
        b.wasted_us
            .total_cmp(&a.wasted_us)
            .then(a.index.cmp(&b.index))
    });

    let mut unknown: BTreeMap<String, OpCount> = BTreeMap::new();
    for (i, g) in raw.graph.iter().enumerate() {
        if needs[i].treatment == Treatment::Unknown {
            let e = unknown.entry(g.op.clone()).or_insert(OpCount {
                op: g.op.clone(),
                nodes: 0,
                timed_ms: 0.0,
            });
            e.nodes += 1;
            e.timed_ms += medians[i] / 1e3;
        }
    }
    let kept_of = |k: Kept| needs.iter().filter(move |d| d.kept == Some(k));
    let wasted_total: f64 = wasted_us.iter().sum();
    let wasted_share = share(per_cycle.median());
    Ok(WasteSummary {
        schema_version: WASTE_SCHEMA_VERSION,
        tokens,
        depth_tokens: raw.config.work.depth_tokens,
        logits: if raw.config.work.all_logits {
            "all"
        } else {
            "last"
        }
        .into(),
        cycles: raw.cycles.len() as u32,
        fused_ms: fused,
        ms_per_token: whole_ms,
        timed_sum_ms: total_us / 1e3,
        wasted_timed_ms: wasted_total / 1e3,
        wasted_share,
        wasted_ms_per_token: per_cycle.median(),
        wasted_ms_per_token_min: per_cycle.min(),
        wasted_ms_per_token_max: per_cycle.max(),
        wasted_share_of_minimums,
        gain_if_trimmed: if wasted_share < 1.0 {
            1.0 / (1.0 - wasted_share) - 1.0
        } else {
            f64::INFINITY
        },
        kept: KeptCounts {
            logits_nodes: kept_of(Kept::Logits).count() as u32,
            logits_rows: kept_of(Kept::Logits).map(|d| d.rows).sum(),
            cache_writes: kept_of(Kept::CacheWrite).count() as u32,
            other_sinks: (0..n)
                .filter(|&i| needs[i].kept == Some(Kept::OtherSink))
                .map(|i| raw.graph[i].name.clone())
                .collect(),
        },
        bands,
        layers,
        nodes,
        unknown_ops: unknown.into_values().collect(),
        source_run: None,
    })
}

/// Categorises the graph of a stored profile, finds the needed rows and summarises the waste:
/// what `waste` does after measuring or from a stored run.
pub fn analyse(
    raw: &ProfileRaw,
    rules: &crate::band::BandRules,
    arch: &crate::arch::ArchInfo,
) -> Result<(Vec<Assignment>, Vec<NodeNeed>, WasteSummary), WasteError> {
    let cat = crate::band::Categoriser::new(rules, arch);
    let assignments = cat.categorise(&raw.graph);
    let needs = needs(&raw.graph, &raw.config.work);
    let bands = rules.bands_in(&assignments);
    let band_order: Vec<&str> = bands.iter().map(String::as_str).collect();
    let summary = summarise(raw, &assignments, &needs, &band_order)?;
    Ok((assignments, needs, summary))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::band::Reason;
    use crate::node::{is_view_op, layer_of, TensorDesc};
    use crate::profile::{CycleRecord, ProfileConfig};

    /// A source of a hand-made node.
    enum S {
        /// The output of node i.
        N(u32),
        /// An input or cache tensor (no producer).
        Leaf(&'static str, [i64; 4]),
        /// A model weight.
        W(&'static str, [i64; 4]),
    }

    #[derive(Default)]
    struct G(Vec<NodeInfo>);

    fn desc(name: &str, ne: [i64; 4]) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            ne,
            ggml_type: "F32".into(),
            size_bytes: 4 * ne.iter().product::<i64>() as u64,
            is_weight: false,
            producer: None,
            nb: [0; 4],
        }
    }

    impl G {
        fn add(&mut self, op: &str, name: &str, ne: [i64; 4], srcs: &[S]) -> u32 {
            let srcs = srcs
                .iter()
                .map(|s| {
                    Some(match s {
                        S::N(i) => {
                            let p = &self.0[*i as usize];
                            TensorDesc {
                                producer: Some(*i),
                                nb: [0; 4],
                                ..desc(&p.out.name, p.out.ne)
                            }
                        }
                        S::Leaf(n, ne) => desc(n, *ne),
                        S::W(n, ne) => TensorDesc {
                            is_weight: true,
                            ..desc(n, *ne)
                        },
                    })
                })
                .collect();
            let index = self.0.len() as u32;
            let is_view = is_view_op(op);
            self.0.push(NodeInfo {
                index,
                op: op.into(),
                name: name.into(),
                layer: layer_of(name),
                out: desc(name, ne),
                srcs,
                is_view,
                inplace: op == "SET_ROWS" || op == "CPY",
                skipped: false,
                op_code: None,
                op_params: Vec::new(),
            });
            index
        }
    }

    fn last_only(tokens: u32) -> Work {
        Work::prefill(tokens, 0)
    }

    /// (needed, rows) of every node.
    fn counts(needs: &[NodeNeed]) -> Vec<(u32, u32)> {
        needs.iter().map(|d| (d.needed, d.rows)).collect()
    }

    /// x = embeddings of 8 tokens; norm, matmul, activation; the out_ids selection; logits.
    fn chain(selected: i64) -> G {
        let mut g = G::default();
        let x = g.add(
            "GET_ROWS",
            "embd",
            [16, 8, 1, 1],
            &[
                S::W("token_embd.weight", [16, 32, 1, 1]),
                S::Leaf("inp_tokens", [8, 1, 1, 1]),
            ],
        );
        let n = g.add("RMS_NORM", "norm-0", [16, 8, 1, 1], &[S::N(x)]);
        let m = g.add(
            "MUL_MAT",
            "ffn_up-0",
            [24, 8, 1, 1],
            &[S::W("blk.0.ffn_up.weight", [16, 24, 1, 1]), S::N(n)],
        );
        let a = g.add("SILU", "ffn_act-0", [24, 8, 1, 1], &[S::N(m)]);
        let s = g.add(
            "GET_ROWS",
            "result_norm",
            [24, selected, 1, 1],
            &[S::N(a), S::Leaf("out_ids", [selected, 1, 1, 1])],
        );
        g.add(
            "MUL_MAT",
            "result_output",
            [32, selected, 1, 1],
            &[S::W("output.weight", [24, 32, 1, 1]), S::N(s)],
        );
        g
    }

    #[test]
    fn a_chain_ending_in_a_row_selection_needs_only_the_selected_row() {
        let g = chain(1);
        let d = needs(&g.0, &last_only(8));
        assert_eq!(counts(&d), [(1, 8), (1, 8), (1, 8), (1, 8), (1, 1), (1, 1)]);
        // the row that survives is the last token's
        assert!(d[..4].iter().all(|n| n.last_needed == Some(7)));
        assert_eq!(d[5].kept, Some(Kept::Logits));
        assert_eq!(d[2].token_dim, Some(1));
        assert_eq!(d[4].token_dim, None);
    }

    #[test]
    fn all_logits_need_every_row() {
        let g = chain(8);
        let work = Work {
            all_logits: true,
            ..last_only(8)
        };
        let d = needs(&g.0, &work);
        assert!(d.iter().all(|n| n.needed == n.rows), "{:?}", counts(&d));
        assert_eq!(d[5].rows, 8);
    }

    #[test]
    fn a_selection_the_request_does_not_explain_keeps_every_row() {
        // out_ids holds 2 rows but the work asked for the last token only: the rows are unknown
        let g = chain(2);
        let d = needs(&g.0, &last_only(8));
        assert_eq!(d[3].needed, 8);
    }

    /// Q, K and V projections of 8 tokens (3 heads of 4), attention without a cache (K and V are
    /// computed in the graph), the output projection, the selection, logits.
    fn attention_graph(op_for_k: &str) -> G {
        let mut g = G::default();
        let x = g.add(
            "GET_ROWS",
            "embd",
            [12, 8, 1, 1],
            &[
                S::W("token_embd.weight", [12, 32, 1, 1]),
                S::Leaf("inp_tokens", [8, 1, 1, 1]),
            ],
        );
        let proj = |g: &mut G, w: &'static str, name: &'static str, op: &str| {
            let m = g.add(op, name, [12, 8, 1, 1], &[S::W(w, [12, 12, 1, 1]), S::N(x)]);
            let r = g.add("RESHAPE", name, [4, 3, 8, 1], &[S::N(m)]);
            g.add("PERMUTE", name, [4, 8, 3, 1], &[S::N(r)])
        };
        let q = proj(&mut g, "blk.0.attn_q.weight", "Qcur-0", "MUL_MAT");
        let k = proj(&mut g, "blk.0.attn_k.weight", "Kcur-0", op_for_k);
        let v = proj(&mut g, "blk.0.attn_v.weight", "Vcur-0", "MUL_MAT");
        let fa = g.add(
            "FLASH_ATTN_EXT",
            "node_10",
            [4, 3, 8, 1],
            &[
                S::N(q),
                S::N(k),
                S::N(v),
                S::Leaf("attn_inp_kq_mask", [8, 8, 1, 1]),
            ],
        );
        let o = g.add("RESHAPE", "kqv_out-0", [12, 8, 1, 1], &[S::N(fa)]);
        let s = g.add(
            "GET_ROWS",
            "node_12",
            [12, 1, 1, 1],
            &[S::N(o), S::Leaf("out_ids", [1, 1, 1, 1])],
        );
        g.add(
            "MUL_MAT",
            "result_output",
            [32, 1, 1, 1],
            &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
        );
        g
    }

    #[test]
    fn attention_needs_every_row_of_k_and_v_but_only_the_read_rows_of_q() {
        let g = attention_graph("MUL_MAT");
        let d = needs(&g.0, &last_only(8));
        let by_name = |name: &str, op: &str| {
            let i =
                g.0.iter()
                    .position(|n| n.name == name && n.op == op)
                    .unwrap();
            (d[i].needed, d[i].rows)
        };
        assert_eq!(by_name("node_10", "FLASH_ATTN_EXT"), (1, 8));
        assert_eq!(by_name("Qcur-0", "MUL_MAT"), (1, 8));
        assert_eq!(by_name("Kcur-0", "MUL_MAT"), (8, 8));
        assert_eq!(by_name("Vcur-0", "MUL_MAT"), (8, 8));
        assert_eq!(by_name("embd", "GET_ROWS"), (8, 8));
        // the permuted query keeps its token dimension through the view ops
        assert_eq!(d[3].token_dim, Some(1));
        assert_eq!(d[10].token_dim, Some(2));
    }

    #[test]
    fn an_unknown_op_needs_everything() {
        // K computed by an op no rule knows: all its rows count as needed, and so do its inputs'
        let g = attention_graph("MYSTERY_OP");
        let d = needs(&g.0, &last_only(8));
        let k = g.0.iter().position(|n| n.op == "MYSTERY_OP").unwrap();
        assert_eq!(d[k].treatment, Treatment::Unknown);
        assert_eq!((d[k].needed, d[k].rows), (8, 8));

        // an unknown op on the path to the logits: the selection's row saving stops there
        let mut g = G::default();
        let x = g.add(
            "GET_ROWS",
            "embd",
            [12, 8, 1, 1],
            &[
                S::W("token_embd.weight", [12, 32, 1, 1]),
                S::Leaf("inp_tokens", [8, 1, 1, 1]),
            ],
        );
        let m = g.add("MYSTERY_OP", "mystery-0", [12, 8, 1, 1], &[S::N(x)]);
        let y = g.add(
            "MUL_MAT",
            "y-0",
            [12, 8, 1, 1],
            &[S::W("blk.0.y.weight", [12, 12, 1, 1]), S::N(m)],
        );
        let s = g.add(
            "GET_ROWS",
            "sel",
            [12, 1, 1, 1],
            &[S::N(y), S::Leaf("out_ids", [1, 1, 1, 1])],
        );
        g.add(
            "MUL_MAT",
            "result_output",
            [32, 1, 1, 1],
            &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
        );
        let d = needs(&g.0, &last_only(8));
        assert_eq!(counts(&d), [(8, 8), (8, 8), (1, 8), (1, 1), (1, 1)]);
    }

    #[test]
    fn a_cache_write_keeps_rows_alive() {
        let mut g = G::default();
        let x = g.add(
            "GET_ROWS",
            "embd",
            [12, 8, 1, 1],
            &[
                S::W("token_embd.weight", [12, 32, 1, 1]),
                S::Leaf("inp_tokens", [8, 1, 1, 1]),
            ],
        );
        let k = g.add(
            "MUL_MAT",
            "Kcur-0",
            [12, 8, 1, 1],
            &[S::W("blk.0.attn_k.weight", [12, 12, 1, 1]), S::N(x)],
        );
        let w = g.add(
            "SET_ROWS",
            "cache_k_l0 (view)",
            [12, 16, 1, 1],
            &[
                S::N(k),
                S::Leaf("attn_inp_k_idxs", [8, 1, 1, 1]),
                S::Leaf("cache_k_l0", [12, 16, 1, 1]),
            ],
        );
        let q = g.add(
            "MUL_MAT",
            "Qcur-0",
            [12, 8, 1, 1],
            &[S::W("blk.0.attn_q.weight", [12, 12, 1, 1]), S::N(x)],
        );
        let s = g.add(
            "GET_ROWS",
            "sel",
            [12, 1, 1, 1],
            &[S::N(q), S::Leaf("out_ids", [1, 1, 1, 1])],
        );
        g.add(
            "MUL_MAT",
            "result_output",
            [32, 1, 1, 1],
            &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
        );
        // a conv-state write: a CPY into a view of cache_r_l0 whose own name does not say so
        let tail = g.add("VIEW", "conv_state_last-0", [12, 3, 1, 1], &[S::N(x)]);
        let dst = g.add(
            "VIEW",
            "conv_state_update-0",
            [36, 1, 1, 1],
            &[S::Leaf("cache_r_l0", [36, 1, 1, 1])],
        );
        let cpy = g.add(
            "CPY",
            "conv_state_update-0 (copy of conv_state_last-0)",
            [36, 1, 1, 1],
            &[S::N(tail), S::N(dst)],
        );
        let d = needs(&g.0, &last_only(8));
        assert_eq!(d[w as usize].kept, Some(Kept::CacheWrite));
        assert_eq!(d[cpy as usize].kept, Some(Kept::CacheWrite));
        assert_eq!((d[k as usize].needed, d[k as usize].rows), (8, 8));
        assert_eq!((d[q as usize].needed, d[q as usize].rows), (1, 8));
        assert_eq!((d[x as usize].needed, d[x as usize].rows), (8, 8));
        // a view of 3 rows of 8 does not say which: its source is needed whole
        assert_eq!(d[tail as usize].token_dim, None);
    }

    #[test]
    fn a_scan_needs_every_row_up_to_the_last_needed_one() {
        let mut g = G::default();
        let x = g.add(
            "GET_ROWS",
            "embd",
            [12, 8, 1, 1],
            &[
                S::W("token_embd.weight", [12, 32, 1, 1]),
                S::Leaf("inp_tokens", [8, 1, 1, 1]),
            ],
        );
        let c = g.add("SSM_CONV", "conv-0", [12, 8, 1, 1], &[S::N(x)]);
        let a = g.add("SILU", "act-0", [12, 8, 1, 1], &[S::N(c)]);
        let s = g.add(
            "GET_ROWS",
            "sel",
            [12, 1, 1, 1],
            &[S::N(a), S::Leaf("out_ids", [1, 1, 1, 1])],
        );
        g.add(
            "MUL_MAT",
            "result_output",
            [32, 1, 1, 1],
            &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
        );
        // output row 3 of 8 requested: the scan runs rows 0..=3, the activation after it row 3
        let d = needs_for(&g.0, 8, &[3]);
        assert_eq!(counts(&d), [(4, 8), (4, 8), (1, 8), (1, 1), (1, 1)]);
        assert_eq!(d[0].last_needed, Some(3));
        // the last row requested: the scan needs every row
        let d = needs(&g.0, &last_only(8));
        assert_eq!(counts(&d)[..3], [(8, 8), (8, 8), (1, 8)]);
    }

    #[test]
    fn a_width_equal_to_the_chunk_does_not_hide_the_token_dimension() {
        // experts of width 8 on a chunk of 8 tokens: [8, 2, 8] outputs, then the selection
        // leaves a [12, 1] row (one row, not 12 tokens)
        let mut g = G::default();
        let x = g.add(
            "GET_ROWS",
            "embd",
            [12, 8, 1, 1],
            &[
                S::W("token_embd.weight", [12, 32, 1, 1]),
                S::Leaf("inp_tokens", [8, 1, 1, 1]),
            ],
        );
        let r = g.add("RESHAPE", "embd (reshaped)", [12, 1, 8, 1], &[S::N(x)]);
        let h = g.add(
            "MUL_MAT",
            "h-0",
            [8, 8, 1, 1],
            &[S::W("blk.0.h.weight", [12, 8, 1, 1]), S::N(x)],
        );
        let gate = g.add(
            "MUL_MAT_ID",
            "ffn_moe_gate-0",
            [8, 2, 8, 1],
            &[
                S::W("blk.0.ffn_gate_exps.weight", [12, 8, 4, 1]),
                S::N(r),
                S::Leaf("ffn_moe_topk-0", [2, 8, 1, 1]),
            ],
        );
        let act = g.add("SILU", "ffn_moe_act-0", [8, 2, 8, 1], &[S::N(gate)]);
        let down = g.add(
            "MUL_MAT_ID",
            "ffn_moe_down-0",
            [12, 2, 8, 1],
            &[
                S::W("blk.0.ffn_down_exps.weight", [8, 12, 4, 1]),
                S::N(act),
                S::Leaf("ffn_moe_topk-0", [2, 8, 1, 1]),
            ],
        );
        let v = g.add(
            "VIEW",
            "ffn_moe_down-0 (view)",
            [12, 8, 1, 1],
            &[S::N(down)],
        );
        let hv = g.add(
            "MUL_MAT",
            "hv-0",
            [12, 8, 1, 1],
            &[S::W("blk.0.hv.weight", [8, 12, 1, 1]), S::N(h)],
        );
        let sum = g.add("ADD", "sum-0", [12, 8, 1, 1], &[S::N(v), S::N(hv)]);
        let s = g.add(
            "GET_ROWS",
            "sel",
            [12, 1, 1, 1],
            &[S::N(sum), S::Leaf("out_ids", [1, 1, 1, 1])],
        );
        let e = g.add(
            "MUL_MAT",
            "sel_proj",
            [8, 1, 1, 1],
            &[S::W("blk.0.e.weight", [12, 8, 1, 1]), S::N(s)],
        );
        g.add(
            "MUL_MAT",
            "result_output",
            [32, 1, 1, 1],
            &[S::W("output.weight", [8, 32, 1, 1]), S::N(e)],
        );
        let d = needs(&g.0, &last_only(8));
        assert_eq!(d[h as usize].token_dim, Some(1));
        assert_eq!(d[gate as usize].token_dim, Some(2));
        assert_eq!(d[act as usize].token_dim, Some(2));
        for i in [x, r, h, gate, act, down, v, hv, sum] {
            assert_eq!(
                (d[i as usize].needed, d[i as usize].rows),
                (1, 8),
                "node {i}"
            );
        }
        assert_eq!(d[e as usize].token_dim, None);
        assert_eq!((d[e as usize].needed, d[e as usize].rows), (1, 1));
    }

    fn raw_of(graph: Vec<NodeInfo>, times: &[&[f64]], fused_ms: f64) -> ProfileRaw {
        ProfileRaw {
            schema_version: 1,
            config: ProfileConfig {
                work: last_only(8),
                cycles: times.len() as u32,
                warmup: 0,
                overhead_pairs: 0,
                gate: Default::default(),
            },
            graph,
            cycles: times
                .iter()
                .map(|t| CycleRecord {
                    order: vec![],
                    fused_ms,
                    fused_observed_ms: fused_ms,
                    timed_wall_ms: fused_ms,
                    node_us: t.to_vec(),
                    isolation_us: None,
                    isolation_node_us: vec![],
                })
                .collect(),
            output_hashes: BTreeMap::new(),
            overhead_pairs: vec![],
            gate: Default::default(),
            outputs_checked_finite: true,
            node_steps: Some(1),
        }
    }

    fn assign(bands: &[&str]) -> Vec<Assignment> {
        bands
            .iter()
            .map(|b| Assignment {
                band: b.to_string(),
                reason: Reason::None,
            })
            .collect()
    }

    #[test]
    fn wasted_time_is_node_time_times_unread_share() {
        // times 10/20/80/10/5/40 µs: the first four read 1 row of 8
        let times: &[f64] = &[10.0, 20.0, 80.0, 10.0, 5.0, 40.0];
        let raw = raw_of(chain(1).0, &[times, times, times], 0.33);
        let bands = assign(&["other", "moe", "moe", "moe", "other", "other"]);
        let d = needs(&raw.graph, &raw.config.work);
        let s = summarise(&raw, &bands, &d, &["moe", "other"]).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        let wasted_us = 120.0 * 7.0 / 8.0;
        assert!(close(s.wasted_timed_ms, wasted_us / 1e3));
        assert!(close(s.wasted_share, wasted_us / 165.0));
        assert!(close(s.wasted_ms_per_token, wasted_us / 165.0 * 0.33 / 8.0));
        assert!(close(
            s.gain_if_trimmed,
            1.0 / (1.0 - wasted_us / 165.0) - 1.0
        ));
        assert!(close(s.wasted_share_of_minimums, s.wasted_share));
        let moe = s.bands.iter().find(|b| b.band == "moe").unwrap();
        assert!(close(moe.wasted_share_of_band, 7.0 / 8.0));
        assert_eq!(moe.nodes, 3);
        assert_eq!(s.nodes[0].name, "ffn_up-0");
        assert_eq!((s.nodes[0].needed_rows, s.nodes[0].rows), (1, 8));
        assert_eq!(s.layers.len(), 2); // layer 0 and the nodes outside layers (embd)
        assert_eq!(s.layers[0].layer, Some(0));
        assert_eq!(s.kept.logits_nodes, 1);
        assert!(s.unknown_ops.is_empty());
        let v = serde_json::to_value(&s).unwrap();
        for key in [
            "schema_version",
            "wasted_share",
            "wasted_ms_per_token",
            "bands",
            "layers",
            "nodes",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
    }

    #[test]
    fn the_wasted_point_lies_within_its_range() {
        // node times 10/20/x/10/5/y µs, the first four read 1 row of 8 (7/8 unread)
        // cycle:       1     2     3
        // x:          10    10   200
        // y:          10   200   200
        // FUSED ms:  0.2   0.8   0.2
        // per-cycle wasted ms/token = unread share of the TIMED sum x FUSED / 8 tokens:
        // 43.75/65 x 0.025, 43.75/255 x 0.1, 210/445 x 0.025 = 0.016827, 0.017157, 0.011798.
        // The old formula (medians 10/20/10/10/5/200 -> 43.75/255 x median FUSED 0.2 / 8 =
        // 0.004289) lay outside that range.
        let mut raw = raw_of(
            chain(1).0,
            &[
                &[10.0, 20.0, 10.0, 10.0, 5.0, 10.0],
                &[10.0, 20.0, 10.0, 10.0, 5.0, 200.0],
                &[10.0, 20.0, 200.0, 10.0, 5.0, 200.0],
            ],
            0.2,
        );
        raw.cycles[1].fused_ms = 0.8;
        let bands = assign(&["other", "moe", "moe", "moe", "other", "other"]);
        let d = needs(&raw.graph, &raw.config.work);
        let s = summarise(&raw, &bands, &d, &["moe", "other"]).unwrap();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        let point = 43.75 / 65.0 * 0.2 / 8.0;
        assert!(
            close(s.wasted_ms_per_token, point),
            "{}",
            s.wasted_ms_per_token
        );
        assert!(close(s.wasted_ms_per_token_min, 210.0 / 445.0 * 0.2 / 8.0));
        assert!(close(s.wasted_ms_per_token_max, 43.75 / 255.0 * 0.8 / 8.0));
        // the whole: median of 0.2, 0.8, 0.2 / 8; the share is the ratio of the points
        assert!(close(s.ms_per_token, 0.2 / 8.0));
        assert!(close(s.wasted_share, 43.75 / 65.0));
        // every band's and node's figure by the same estimator: moe's unread rows
        // (nodes 1-3: 7/8 of 40, 40, 230) per cycle 35/65 x 0.025, 35/255 x 0.1,
        // 201.25/445 x 0.025 -> median 0.013462
        let moe = s.bands.iter().find(|b| b.band == "moe").unwrap();
        assert!(
            close(moe.wasted_ms_per_token, 35.0 / 65.0 * 0.025),
            "{moe:?}"
        );
    }

    #[test]
    fn a_node_the_backend_skips_is_not_charged() {
        let mut g = chain(1);
        g.0[1].skipped = true;
        let d = needs(&g.0, &last_only(8));
        assert_eq!((d[1].needed, d[1].rows), (8, 8));
        assert_eq!((d[2].needed, d[2].rows), (1, 8));
    }

    #[test]
    fn every_known_op_has_one_treatment() {
        for (i, (op, _)) in TREATMENTS.iter().enumerate() {
            assert!(
                TREATMENTS[i + 1..].iter().all(|(o, _)| o != op),
                "{op} listed twice"
            );
        }
        assert_eq!(treatment("NOT_AN_OP"), Treatment::Unknown);
    }
}
