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

use serde::{Deserialize, Serialize};

use crate::engine::Work;

mod needs;
mod summary;

pub use needs::{needs, needs_for};
pub use summary::{analyse, summarise};

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

#[cfg(test)]
mod tests;
