//! The ledger: two profiles of the same work (two engines, builds, configurations or models)
//! side by side by band, sorted by gap, with each side's coverage and agreement, a "leave alone"
//! mark where the side being optimised is already ahead, and byte and FLOP math per band
//! (achieved GB/s and GFLOP/s against the measured peaks say what limits a band).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::Assignment;
use crate::engine::Work as EngineWork;
use crate::node::NodeInfo;
use crate::peaks::Peaks;
use crate::profile::ProfileSummary;
use crate::replay::ReplayResult;

/// 2: verdicts from each side's position against the measured peaks (`a_position`,
/// `b_position`, `flops_ratio`); bytes and FLOPs per run. 3: an opportunity per row, each
/// side's per-band range and cycles (the regression gate's spread).
pub const LEDGER_SCHEMA_VERSION: u32 = 3;

/// Bytes and FLOPs of one band for one run: the prefill chunk, or every step of a decode run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Work {
    /// Weight bytes read (expert matmuls: the experts routed to only, where known).
    pub weight_bytes: u64,
    /// Activation bytes read and written (sources that are not weights, and outputs).
    pub activation_bytes: u64,
    /// 2·M·N·K of every matmul (per routed token for expert matmuls) and the attention core.
    pub flops: f64,
}

/// Graph computations one run makes: 1 for a prefill chunk, one per step of a decode run.
pub fn graph_runs(work: &EngineWork) -> u32 {
    if work.is_decode() {
        work.decode_tokens
    } else {
        1
    }
}

/// FLOPs of one FLASH_ATTN_EXT node over one run, and how many whole K (and V) views the run
/// reads.
///
/// What is counted: for every query row and head, QK^T over the key positions the row really
/// attends (2 DK per position) and PV over the same positions (2 DV per position). A row of a
/// prefill chunk at depth D attends D + i + 1 positions (row i, causal); a row of decode step s
/// (one row per sequence) attends D + s + 1 (the shared prefix and its own tokens; the unified
/// cache's cells of other sequences are masked). Never the padded `n_kv` of the K view: ggml's
/// CPU kernel does not compute masked positions (ggml/src/ggml-cpu/ops.cpp of llama-cpp-sys-2
/// 0.1.161). Its row-by-row path, `ggml_compute_forward_flash_attn_ext_f16_one_chunk` (fewer
/// than 64 query rows, and decode's split-KV path), skips every position whose mask is -inf
/// before the dot product (ops.cpp:8968), so it computes exactly this. Its tiled path,
/// `ggml_compute_forward_flash_attn_ext_tiled` (64 or more query rows with an F32/F16 cache,
/// chosen at ops.cpp:9546-9550), skips a 64-position KV tile only when it is masked for every
/// row of the 64-row query tile (ops.cpp:9226-9245) and computes the other tiles in full
/// (ops.cpp:9265, 9328), so along the diagonal it does up to one KV tile per row more than
/// counted here: the count is the useful work, a lower bound of that path's arithmetic.
/// Sliding windows are not modelled (no preset has one). The K and V bytes are scaled the same
/// way: a step reads its widest row's positions, not the padding.
fn flash_attn(node: &NodeInfo, work: &EngineWork) -> Option<(f64, f64)> {
    let (q, k) = (node.src(0)?, node.src(1)?);
    let dv = node.src(2).map(|v| v.ne[0]).unwrap_or(q.ne[0]) as f64;
    let (dk, rows, heads) = (q.ne[0] as f64, q.ne[1].max(0) as u64, q.ne[2].max(1) as f64);
    let n_kv = k.ne[1].max(1) as u64;
    let depth = work.depth_tokens as u64;
    let mut positions = 0u64;
    let mut views_read = 0.0;
    for step in 0..graph_runs(work) as u64 {
        let mut widest = 0u64;
        for row in 0..rows {
            let span = if work.is_decode() {
                depth + step + 1
            } else {
                depth + row + 1
            };
            let a = span.min(n_kv);
            positions += a;
            widest = widest.max(a);
        }
        views_read += widest as f64 / n_kv as f64;
    }
    Some(((2.0 * dk + 2.0 * dv) * positions as f64 * heads, views_read))
}

/// FLOPs and bytes of every band of a graph over one run of `work`: a decode run computes the
/// graph once per step (the captured graph of step 0, its routing repeated; the attention span
/// grows one position a step), so its bytes and FLOPs are the step's times the steps, as its
/// time is. `experts_routed[i]`: how many distinct experts the expert matmul at node `i` really
/// used (from captured ids); without it, every expert counts (an upper bound, flagged by the
/// caller).
pub fn band_work(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    experts_routed: &BTreeMap<u32, u32>,
    work: &EngineWork,
) -> BTreeMap<String, Work> {
    let steps = graph_runs(work) as u64;
    let mut out: BTreeMap<String, Work> = BTreeMap::new();
    for (n, a) in graph.iter().zip(assignments) {
        if !n.is_working() {
            continue;
        }
        let w = out.entry(a.band.clone()).or_default();
        let elems = |ne: [i64; 4]| ne.iter().map(|&d| d.max(0) as f64).product::<f64>();
        // whole K and V views a flash-attention node reads over the run
        let mut kv_views = steps as f64;
        match n.op.as_str() {
            "MUL_MAT" | "MUL_MAT_ID" => {
                // 2 K per output element. K is ne[0] of the activations (src 1) in both
                // engines' graphs: ggml's out[N, M] = src0[K, N] x src1[K, M] (and
                // out[N, n_used, T] for expert matmuls, per routed token), and candle's
                // lhs[.., M, K] x rhs[.., K, N], listed as (rhs, lhs), whose lhs has ne[0] = K,
                // while its rhs (a transposed K cache, say) need not
                if let Some(k) = n.src(1).or_else(|| n.src(0)).map(|s| s.ne[0]) {
                    w.flops += 2.0 * k as f64 * elems(n.out.ne) * steps as f64;
                }
            }
            "FLASH_ATTN_EXT" => {
                if let Some((flops, views)) = flash_attn(n, work) {
                    w.flops += flops;
                    kv_views = views;
                }
            }
            _ => {}
        }
        for (slot, s) in n.srcs.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.is_weight {
                let bytes = if n.op == "MUL_MAT_ID" && slot == 0 && s.ne[2] > 0 {
                    let per_expert = s.size_bytes / s.ne[2] as u64;
                    let used = experts_routed
                        .get(&n.index)
                        .copied()
                        .unwrap_or(s.ne[2] as u32);
                    per_expert * used as u64
                } else {
                    s.size_bytes
                };
                w.weight_bytes += bytes * steps;
            } else if n.op == "FLASH_ATTN_EXT" && (slot == 1 || slot == 2) {
                w.activation_bytes += (s.size_bytes as f64 * kv_views).round() as u64;
            } else {
                w.activation_bytes += s.size_bytes * steps;
            }
        }
        w.activation_bytes += n.out.size_bytes * steps;
    }
    out
}

/// One side of a ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// `llama.cpp llama-cpp-sys-2 0.1.161 (ggml 0.26.0)`, `candle 0.11.1`, or a run folder.
    pub label: String,
    pub arch: String,
    pub tokens: u32,
    pub depth_tokens: u32,
    pub decode_tokens: u32,
    pub fused_ms: f64,
    pub coverage: f64,
    /// NaN (null in JSON) where it cannot be measured: an imported trace is one run of its
    /// engine, with no untraced run to hold its sum against.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub agreement: f64,
    /// Band -> ms/token (share x wall).
    pub ms_per_token: BTreeMap<String, f64>,
    /// Band -> bytes and FLOPs of one run (the chunk, or every step of a decode run), where
    /// known: the same run whose time `ms_per_token` x `tokens` is.
    #[serde(default)]
    pub work: BTreeMap<String, Work>,
    /// In-graph replay: band -> ms/token, where measured.
    #[serde(default)]
    pub replay_ms_per_token: BTreeMap<String, f64>,
    /// Band -> the range (min, max) of the per-cycle values whose median `ms_per_token` is:
    /// the run's own spread, which `compare --fail-above` must exceed. Equal to the median for
    /// a run of one cycle (an imported trace of one step).
    #[serde(default)]
    pub ms_per_token_range: BTreeMap<String, (f64, f64)>,
    /// Cycles behind `ms_per_token` (1: no spread is known).
    #[serde(default = "one")]
    pub cycles: u32,
}

fn one() -> u32 {
    1
}

impl Side {
    pub fn from_summary(label: &str, arch: &str, s: &ProfileSummary) -> Side {
        Side {
            label: label.to_string(),
            arch: arch.to_string(),
            tokens: s.tokens,
            depth_tokens: s.depth_tokens,
            decode_tokens: s.decode_tokens,
            fused_ms: s.fused_ms,
            coverage: s.coverage,
            agreement: s.agreement,
            ms_per_token: s
                .bands
                .iter()
                .map(|b| (b.band.clone(), b.ms_per_token))
                .collect(),
            work: BTreeMap::new(),
            replay_ms_per_token: BTreeMap::new(),
            ms_per_token_range: s
                .bands
                .iter()
                .map(|b| (b.band.clone(), (b.ms_per_token_min, b.ms_per_token_max)))
                .collect(),
            cycles: s.cycles,
        }
    }
}

/// One band of the ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub band: String,
    pub a_ms_per_token: f64,
    pub b_ms_per_token: f64,
    /// a - b: positive where A (the side being optimised) spends more.
    pub gap_ms_per_token: f64,
    /// `a`, `b` or `even` (within 1 % of each other).
    pub ahead: String,
    /// A is already ahead here: optimising this band for A is not where the gap lives.
    pub leave_alone: bool,
    /// The same from in-graph replay, where both sides have it.
    pub a_replay_ms_per_token: Option<f64>,
    pub b_replay_ms_per_token: Option<f64>,
    /// bytes(A) / bytes(B), FLOPs(A) / FLOPs(B) and time(A) / time(B).
    pub bytes_ratio: Option<f64>,
    #[serde(default)]
    pub flops_ratio: Option<f64>,
    pub time_ratio: Option<f64>,
    pub a_gb_per_s: Option<f64>,
    pub b_gb_per_s: Option<f64>,
    pub a_gflop_per_s: Option<f64>,
    pub b_gflop_per_s: Option<f64>,
    /// Where each side's band sits against this machine's measured peaks (`None` without
    /// peaks or bytes).
    #[serde(default)]
    pub a_position: Option<Position>,
    #[serde(default)]
    pub b_position: Option<Position>,
    /// What A's position (and B's) says about where A's time goes ([`verdict`]).
    pub verdict: String,
    /// What the slower side would gain end to end if it matched the faster one in this band
    /// (`None` where they are even).
    #[serde(default)]
    pub opportunity: Option<Opportunity>,
}

/// Amdahl's law on one band: the slower side's time in the band brought down to the faster
/// side's, the rest of its time unchanged.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Opportunity {
    /// The side that would gain: `a` or `b`.
    pub side: String,
    /// ms/token it would save: the band's gap.
    pub saved_ms_per_token: f64,
    /// The saving over that side's total ms/token (the sum of its bands): the share of its
    /// time that goes.
    pub share: f64,
    /// total / (total - saved): its end-to-end speed-up.
    pub speedup: f64,
}

/// The opportunity of a band where one side spends `slow` ms/token against the other's `fast`,
/// out of the slower side's `total`.
pub fn opportunity(side: &str, slow: f64, fast: f64, total: f64) -> Option<Opportunity> {
    let saved = slow - fast;
    (saved > 0.0 && total > 0.0 && saved < total).then(|| Opportunity {
        side: side.into(),
        saved_ms_per_token: saved,
        share: saved / total,
        speedup: total / (total - saved),
    })
}

/// What limits a band on this machine, from its achieved rates against the measured peaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Bound {
    /// Its bytes move at [`NEAR_ROOF`] or more of the copy peak, a larger share than its FLOPs
    /// reach of the matmul peak.
    Bandwidth,
    /// Its FLOPs run at [`NEAR_ROOF`] or more of the matmul peak, a larger share than its bytes
    /// reach of the copy peak.
    Compute,
    /// Below [`NEAR_ROOF`] of both peaks: neither resource is saturated, the time goes to
    /// latency and overhead (synchronisation, dispatch, small kernels, dependent steps).
    Neither,
}

/// A band's place on the roofline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Position {
    pub bound: Bound,
    /// Achieved GB/s over the measured copy peak (bytes read plus written, as the peak counts).
    pub of_copy_peak: f64,
    /// Achieved GFLOP/s over the measured matmul peak.
    pub of_matmul_peak: f64,
}

/// The share of a measured peak at which a band counts as limited by that resource. A roofline
/// bounds a kernel by min(compute peak, bandwidth peak x intensity); real kernels reach their
/// roof at well under 100 % (the copy probe is a streaming best case, the GEMM probe a large
/// square one), so half of a roof is taken as "on it". Below half of both, neither roof explains
/// the time.
pub const NEAR_ROOF: f64 = 0.5;

/// Where a band with these achieved rates sits against `peaks`; `None` when a rate or a peak
/// (the copy peak or the matmul peak) is unknown.
pub fn position(
    gb_per_s: Option<f64>,
    gflop_per_s: Option<f64>,
    peaks: Option<&Peaks>,
) -> Option<Position> {
    let peaks = peaks?;
    let gemm = peaks.gemm_gflop_per_s.filter(|g| *g > 0.0)?;
    if peaks.copy_gb_per_s <= 0.0 {
        return None;
    }
    let bw = gb_per_s? / peaks.copy_gb_per_s;
    let fl = gflop_per_s? / gemm;
    let bound = if bw.max(fl) < NEAR_ROOF {
        Bound::Neither
    } else if bw >= fl {
        Bound::Bandwidth
    } else {
        Bound::Compute
    };
    Some(Position {
        bound,
        of_copy_peak: bw,
        of_matmul_peak: fl,
    })
}

/// Ratios this close to 1 mean both sides read the same bytes (or do the same FLOPs): two
/// builds of one engine.
const SAME: f64 = 0.02;

/// The ratios of one band, A over B.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratios {
    pub bytes: Option<f64>,
    pub flops: Option<f64>,
    pub time: Option<f64>,
}

fn times(r: Option<f64>) -> String {
    r.map(|r| format!("{r:.2}x")).unwrap_or_else(|| "?x".into())
}

fn pct(x: f64) -> String {
    format!("{:.0} %", x * 100.0)
}

/// The verdict of a band from roofline reasoning: where A's band sits against the measured
/// peaks decides what limits it, and the bytes or FLOPs ratio against B says whether A does
/// more of what limits it or does the same amount more slowly. B's position is quoted where it
/// shows what B achieves on the same resource.
pub fn verdict(
    ahead: &str,
    a: Option<Position>,
    b: Option<Position>,
    r: Ratios,
    unknown: &str,
) -> String {
    let t = times(r.time);
    let more = |x: Option<f64>| x.is_some_and(|x| x > 1.0 + SAME);
    match (ahead, a) {
        ("a", _) => "A is ahead: leave alone".into(),
        ("even", _) => "even".into(),
        (_, None) => format!("A is slower ({t}); what limits it is unknown: {unknown}"),
        (_, Some(p)) => match p.bound {
            Bound::Bandwidth if more(r.bytes) => format!(
                "A is bandwidth-bound ({} of the copy peak) and reads {} B's bytes, {t} slower: read fewer bytes",
                pct(p.of_copy_peak),
                times(r.bytes)
            ),
            Bound::Bandwidth => format!(
                "A is bandwidth-bound ({} of the copy peak) on {} B's bytes, {t} slower: B moves its bytes faster{}: improve A's memory access (layout, locality, prefetch)",
                pct(p.of_copy_peak),
                times(r.bytes),
                b.map(|b| format!(" ({} of the copy peak)", pct(b.of_copy_peak)))
                    .unwrap_or_default()
            ),
            Bound::Compute if more(r.flops) => format!(
                "A is compute-bound ({} of the matmul peak) and does {} B's FLOPs, {t} slower: do less arithmetic",
                pct(p.of_matmul_peak),
                times(r.flops)
            ),
            Bound::Compute => format!(
                "A is compute-bound ({} of the matmul peak) on {} B's FLOPs, {t} slower: B computes faster{}: faster kernels (SIMD width, dequantisation, tiling)",
                pct(p.of_matmul_peak),
                times(r.flops),
                b.map(|b| format!(" ({} of the matmul peak)", pct(b.of_matmul_peak)))
                    .unwrap_or_default()
            ),
            Bound::Neither => format!(
                "A is neither bandwidth- nor compute-bound ({} of the copy peak, {} of the matmul peak), {t} slower: its time goes to latency and overhead (synchronisation, dispatch, small kernels): fuse or batch",
                pct(p.of_copy_peak),
                pct(p.of_matmul_peak)
            ),
        },
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ledger {
    pub schema_version: u32,
    pub a: Side,
    pub b: Side,
    /// Sorted by gap, largest first (where A loses most).
    pub rows: Vec<Row>,
    pub total_a_ms_per_token: f64,
    pub total_b_ms_per_token: f64,
    /// The runs did not do the same work but were compared anyway (`--force`).
    pub forced: bool,
}

impl Ledger {
    /// The rows with an opportunity, largest end-to-end gain first (either side's).
    pub fn by_opportunity(&self) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self
            .rows
            .iter()
            .filter(|r| r.opportunity.is_some())
            .collect();
        let share = |r: &Row| r.opportunity.as_ref().map_or(0.0, |o| o.share);
        rows.sort_by(|x, y| share(y).total_cmp(&share(x)));
        rows
    }
}

/// One band before the regression gate (`compare --fail-above`): A is the new run, B the
/// baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRow {
    pub band: String,
    pub a_ms_per_token: f64,
    pub b_ms_per_token: f64,
    /// A / B - 1 (`None` where the baseline has no time in the band).
    pub slower: Option<f64>,
    /// A's range (min, max) over its cycles and B's.
    pub a_range: (f64, f64),
    pub b_range: (f64, f64),
    /// The change exceeds the threshold: A / B - 1 above it, or, for a band the baseline
    /// does not have, A's time above the threshold's share of the baseline's total.
    pub beyond_threshold: bool,
    /// The runs' own spreads do not overlap: A's fastest cycle is slower than B's slowest.
    pub beyond_spread: bool,
    /// Both: the band regressed.
    pub fails: bool,
}

/// The regression gate over a ledger.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Gate {
    /// The threshold as a fraction (0.05 for `--fail-above 5`).
    pub threshold: f64,
    /// Every band, the ledger's order.
    pub rows: Vec<GateRow>,
    /// Cycles behind each side (1: that side has no spread, the threshold alone decides).
    pub a_cycles: u32,
    pub b_cycles: u32,
}

impl GateRow {
    /// The change as printed: `+9.0 %`, or `new in A` for a band the baseline lacks.
    pub fn change(&self) -> String {
        self.slower
            .map_or("new in A".to_string(), |s| format!("{:+.1} %", s * 100.0))
    }
}

impl Gate {
    pub fn failed(&self) -> Vec<&GateRow> {
        self.rows.iter().filter(|r| r.fails).collect()
    }
}

/// Gates A (the new run) against B (the baseline): a band fails when A is slower than B by more
/// than `threshold` (a fraction) and by more than the two runs' own spreads (A's fastest cycle
/// slower than B's slowest). A band the baseline has no time in fails when A spends more than
/// `threshold` of B's total in it, beyond A's spread from zero.
pub fn gate(l: &Ledger, threshold: f64) -> Gate {
    let range = |s: &Side, band: &str, median: f64| {
        s.ms_per_token_range
            .get(band)
            .copied()
            .unwrap_or((median, median))
    };
    let rows = l
        .rows
        .iter()
        .map(|r| {
            let (am, bm) = (r.a_ms_per_token, r.b_ms_per_token);
            let a_range = range(&l.a, &r.band, am);
            let b_range = range(&l.b, &r.band, bm);
            let slower = (bm > 0.0).then(|| am / bm - 1.0);
            let beyond_threshold = match slower {
                Some(s) => s > threshold,
                None => am > threshold * l.total_b_ms_per_token,
            };
            let beyond_spread = a_range.0 > b_range.1;
            GateRow {
                band: r.band.clone(),
                a_ms_per_token: am,
                b_ms_per_token: bm,
                slower,
                a_range,
                b_range,
                beyond_threshold,
                beyond_spread,
                fails: beyond_threshold && beyond_spread,
            }
        })
        .collect();
    Gate {
        threshold,
        rows,
        a_cycles: l.a.cycles,
        b_cycles: l.b.cycles,
    }
}

/// A ledger with what each side measured besides: what `opledger ledger` stores and prints.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerReport {
    pub ledger: Ledger,
    pub replay_a: Option<ReplayResult>,
    pub replay_b: Option<ReplayResult>,
    pub peaks: Option<Peaks>,
    pub notes: Vec<String>,
    /// `compare --fail-above`: the regression gate, A the new run and B the baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<Gate>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    #[error("the runs did not do the same work: {0} (compare anyway with --force)")]
    DifferentWork(String),
}

/// The ledger of A (the side being optimised) against B (the reference); `peaks` are this
/// machine's measured peaks, where the sides were measured on it (verdicts need them).
pub fn compare(
    a: Side,
    b: Side,
    force: bool,
    peaks: Option<&Peaks>,
) -> Result<Ledger, CompareError> {
    let mut diffs = Vec::new();
    if a.tokens != b.tokens {
        diffs.push(format!("chunk {} vs {} tokens", a.tokens, b.tokens));
    }
    if a.depth_tokens != b.depth_tokens {
        diffs.push(format!("depth {} vs {}", a.depth_tokens, b.depth_tokens));
    }
    if a.decode_tokens != b.decode_tokens {
        diffs.push(format!(
            "decode {} vs {} tokens",
            a.decode_tokens, b.decode_tokens
        ));
    }
    if a.arch != b.arch {
        diffs.push(format!("architecture {} vs {}", a.arch, b.arch));
    }
    if !diffs.is_empty() && !force {
        return Err(CompareError::DifferentWork(diffs.join(", ")));
    }
    let mut bands: Vec<&String> = a.ms_per_token.keys().chain(b.ms_per_token.keys()).collect();
    bands.sort();
    bands.dedup();
    let ratio = |x: f64, y: f64| (y > 0.0).then(|| x / y);
    let total_a: f64 = a.ms_per_token.values().sum();
    let total_b: f64 = b.ms_per_token.values().sum();
    let mut rows: Vec<Row> = bands
        .into_iter()
        .map(|band| {
            let am = a.ms_per_token.get(band).copied().unwrap_or(0.0);
            let bm = b.ms_per_token.get(band).copied().unwrap_or(0.0);
            let ahead = if (am - bm).abs() <= 0.01 * am.max(bm) {
                "even"
            } else if am < bm {
                "a"
            } else {
                "b"
            };
            let (aw, bw) = (a.work.get(band), b.work.get(band));
            let bytes = |w: Option<&Work>| w.map(|w| (w.weight_bytes + w.activation_bytes) as f64);
            let per_s = |amount: Option<f64>, ms: f64, tokens: u32| {
                amount
                    .filter(|_| ms > 0.0)
                    .map(|x| x / (ms * tokens as f64 / 1e3) / 1e9)
            };
            let bytes_ratio = match (bytes(aw), bytes(bw)) {
                (Some(x), Some(y)) => ratio(x, y),
                _ => None,
            };
            let flops_ratio = match (aw, bw) {
                (Some(x), Some(y)) => ratio(x.flops, y.flops),
                _ => None,
            };
            let a_gb_per_s = per_s(bytes(aw), am, a.tokens);
            let b_gb_per_s = per_s(bytes(bw), bm, b.tokens);
            let a_gflop_per_s = per_s(aw.map(|w| w.flops), am, a.tokens);
            let b_gflop_per_s = per_s(bw.map(|w| w.flops), bm, b.tokens);
            let a_position = position(a_gb_per_s, a_gflop_per_s, peaks);
            let b_position = position(b_gb_per_s, b_gflop_per_s, peaks);
            let unknown = if peaks.is_none() {
                "no measured peaks (`opledger ledger` measures this machine's)"
            } else if aw.is_none() {
                "A's bytes and FLOPs are unknown"
            } else {
                "no measured matmul peak"
            };
            Row {
                verdict: verdict(
                    ahead,
                    a_position,
                    b_position,
                    Ratios {
                        bytes: bytes_ratio,
                        flops: flops_ratio,
                        time: ratio(am, bm),
                    },
                    unknown,
                ),
                band: band.clone(),
                a_ms_per_token: am,
                b_ms_per_token: bm,
                gap_ms_per_token: am - bm,
                ahead: ahead.into(),
                leave_alone: ahead == "a",
                a_replay_ms_per_token: a.replay_ms_per_token.get(band).copied(),
                b_replay_ms_per_token: b.replay_ms_per_token.get(band).copied(),
                bytes_ratio,
                flops_ratio,
                time_ratio: ratio(am, bm),
                a_gb_per_s,
                b_gb_per_s,
                a_gflop_per_s,
                b_gflop_per_s,
                a_position,
                b_position,
                opportunity: match ahead {
                    "b" => opportunity("a", am, bm, total_a),
                    "a" => opportunity("b", bm, am, total_b),
                    _ => None,
                },
            }
        })
        .collect();
    rows.sort_by(|x, y| y.gap_ms_per_token.total_cmp(&x.gap_ms_per_token));
    Ok(Ledger {
        schema_version: LEDGER_SCHEMA_VERSION,
        total_a_ms_per_token: total_a,
        total_b_ms_per_token: total_b,
        forced: !diffs.is_empty(),
        a,
        b,
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn side(label: &str, bands: &[(&str, f64)]) -> Side {
        Side {
            label: label.into(),
            arch: "qwen3moe".into(),
            tokens: 512,
            depth_tokens: 0,
            decode_tokens: 0,
            fused_ms: 1000.0,
            coverage: 1.0,
            agreement: 0.01,
            ms_per_token: bands.iter().map(|(b, v)| (b.to_string(), *v)).collect(),
            work: BTreeMap::new(),
            replay_ms_per_token: BTreeMap::new(),
            ms_per_token_range: BTreeMap::new(),
            cycles: 1,
        }
    }

    #[test]
    fn opportunity_is_amdahl_on_the_slower_side_by_hand() {
        // seed 000's table again: A totals 570.7 ms, B 519.7 ms
        let l = seed_000();
        let get = |band: &str| {
            l.rows
                .iter()
                .find(|r| r.band == band)
                .unwrap()
                .opportunity
                .clone()
                .unwrap()
        };
        // A matching B's projections saves 63.9 of its 570.7 ms: 570.7 / 506.8 = 1.126x
        let p = get("projections");
        assert_eq!(p.side, "a");
        assert!((p.saved_ms_per_token - 63.9).abs() < 1e-9);
        assert!((p.share - 63.9 / 570.7).abs() < 1e-12);
        assert!((p.speedup - 570.7 / 506.8).abs() < 1e-12);
        // B is the slower side in moe: B matching A saves 24.2 of its 519.7 ms
        let m = get("moe");
        assert_eq!(m.side, "b");
        assert!((m.share - 24.2 / 519.7).abs() < 1e-12);
        assert!((m.speedup - 519.7 / 495.5).abs() < 1e-12);
        // sorted by end-to-end gain, either side: 11.2 %, 4.66 %, 2.33 % (13.3 / 570.7), 0.38 %
        let order: Vec<&str> = l.by_opportunity().iter().map(|r| r.band.as_str()).collect();
        assert_eq!(
            order,
            ["projections", "moe", "attention", "linear_attention"]
        );
        // even bands have none; a band that is the whole of a side's time has no finite speed-up
        assert_eq!(opportunity("a", 1.0, 1.0, 5.0), None);
        assert_eq!(opportunity("a", 5.0, 0.0, 5.0), None);
    }

    fn ranged(bands: &[(&str, f64, f64, f64)], cycles: u32) -> Side {
        let mut s = side(
            "s",
            &bands
                .iter()
                .map(|(b, m, _, _)| (*b, *m))
                .collect::<Vec<_>>(),
        );
        s.ms_per_token_range = bands
            .iter()
            .map(|(b, _, lo, hi)| (b.to_string(), (*lo, *hi)))
            .collect();
        s.cycles = cycles;
        s
    }

    #[test]
    fn the_gate_needs_the_threshold_and_the_spread_by_hand() {
        let new = ranged(
            &[
                // 10 % slower and the ranges apart: fails
                ("x", 1.10, 1.08, 1.12),
                // 10 % slower inside the spread: passes
                ("y", 1.10, 0.95, 1.20),
                // beyond the spread, 3 % is under the threshold: passes
                ("z", 1.03, 1.02, 1.04),
                // a band the baseline does not have, 0.2 > 5 % of its 3.0 total: fails
                ("w", 0.20, 0.19, 0.21),
            ],
            5,
        );
        let base = ranged(
            &[
                ("x", 1.0, 0.98, 1.02),
                ("y", 1.0, 0.90, 1.10),
                ("z", 1.0, 0.99, 1.01),
            ],
            5,
        );
        let l = compare(new, base, false, None).unwrap();
        let g = gate(&l, 0.05);
        let failed: Vec<&str> = g.failed().iter().map(|r| r.band.as_str()).collect();
        assert_eq!(failed, ["w", "x"]);
        let row = |band: &str| g.rows.iter().find(|r| r.band == band).unwrap();
        assert!((row("x").slower.unwrap() - 0.10).abs() < 1e-12);
        assert!(row("y").beyond_threshold && !row("y").beyond_spread);
        assert!(!row("z").beyond_threshold && row("z").beyond_spread);
        assert_eq!(row("w").slower, None);
        // at 12 % both pass; at 7 % x (10 % slower) fails and w (0.2 of 3.0 = 6.7 %) passes
        let failed: Vec<String> = gate(&l, 0.12)
            .failed()
            .iter()
            .map(|r| r.band.clone())
            .collect();
        assert_eq!(failed, Vec::<String>::new());
        let failed: Vec<String> = gate(&l, 0.07)
            .failed()
            .iter()
            .map(|r| r.band.clone())
            .collect();
        assert_eq!(failed, ["x"]);
    }

    /// Seed 000's table: mine vs llama.cpp, ms.
    fn seed_000() -> Ledger {
        let a = side(
            "mine",
            &[
                ("projections", 252.2),
                ("attention", 19.1),
                ("linear_attention", 53.5),
                ("moe", 245.9),
            ],
        );
        let b = side(
            "llama.cpp",
            &[
                ("projections", 188.3),
                ("attention", 5.8),
                ("linear_attention", 55.5),
                ("moe", 270.1),
            ],
        );
        compare(a, b, false, None).unwrap()
    }

    #[test]
    fn the_seed_000_ledger_by_hand() {
        let l = seed_000();
        let order: Vec<&str> = l.rows.iter().map(|r| r.band.as_str()).collect();
        assert_eq!(
            order,
            ["projections", "attention", "linear_attention", "moe"]
        );
        assert!((l.rows[0].gap_ms_per_token - 63.9).abs() < 1e-9);
        let moe = l.rows.iter().find(|r| r.band == "moe").unwrap();
        assert!(moe.leave_alone && moe.ahead == "a");
        assert!((moe.gap_ms_per_token + 24.2).abs() < 1e-9);
        assert!(!l.rows[0].leave_alone);
        assert!((l.total_a_ms_per_token - 570.7).abs() < 1e-9);
    }

    #[test]
    fn different_work_is_refused_unless_forced() {
        let a = side("a", &[("moe", 1.0)]);
        let mut b = side("b", &[("moe", 1.0)]);
        b.depth_tokens = 4096;
        let e = compare(a.clone(), b.clone(), false, None).unwrap_err();
        assert!(e.to_string().contains("depth 0 vs 4096"), "{e}");
        let l = compare(a, b, true, None).unwrap();
        assert!(l.forced);
        assert_eq!(l.rows[0].ahead, "even");
    }

    #[test]
    fn bytes_ratio_against_time_ratio() {
        // seed 000: A reads 4.5-bit weights, B 8.5-bit; A takes 252.2 ms, B 188.3
        let mut a = side("a", &[("projections", 252.2)]);
        let mut b = side("b", &[("projections", 188.3)]);
        a.work.insert(
            "projections".into(),
            Work {
                weight_bytes: 45,
                activation_bytes: 0,
                flops: 1e9,
            },
        );
        b.work.insert(
            "projections".into(),
            Work {
                weight_bytes: 85,
                activation_bytes: 0,
                flops: 1e9,
            },
        );
        let l = compare(a, b, false, None).unwrap();
        let r = &l.rows[0];
        assert!((r.bytes_ratio.unwrap() - 45.0 / 85.0).abs() < 1e-12);
        assert!((r.time_ratio.unwrap() - 252.2 / 188.3).abs() < 1e-12);
        assert_eq!(r.flops_ratio, Some(1.0));
        // FLOP rate: 1e9 FLOP in 252.2 ms/token x 512 tokens
        assert!((r.a_gflop_per_s.unwrap() - 1e9 / (252.2 * 512.0 / 1e3) / 1e9).abs() < 1e-12);
        // without this machine's peaks (compare of stored runs) nothing is claimed
        assert_eq!(r.a_position, None);
        assert_eq!(
            r.verdict,
            "A is slower (1.34x); what limits it is unknown: no measured peaks (`opledger ledger` measures this machine's)"
        );
    }

    fn peaks(copy_gb_per_s: f64, gemm: Option<f64>) -> Peaks {
        Peaks {
            copy_gb_per_s,
            gemm_gflop_per_s: gemm,
            gemm_shape: None,
        }
    }

    #[test]
    fn position_against_the_measured_peaks_by_hand() {
        // copy peak 20 GB/s, matmul peak 100 GFLOP/s
        let p = peaks(20.0, Some(100.0));
        let at = |gb: f64, gf: f64| position(Some(gb), Some(gf), Some(&p)).unwrap();
        // 12 / 20 = 60 % of the copy peak, 10 % of the matmul peak
        let bw = at(12.0, 10.0);
        assert_eq!(bw.bound, Bound::Bandwidth);
        assert!((bw.of_copy_peak - 0.6).abs() < 1e-12 && (bw.of_matmul_peak - 0.1).abs() < 1e-12);
        // 10 % and 70 %
        assert_eq!(at(2.0, 70.0).bound, Bound::Compute);
        // near both roofs: the larger share names the limit (60 % < 80 %)
        assert_eq!(at(12.0, 80.0).bound, Bound::Compute);
        // 25 % and 30 %: neither roof
        assert_eq!(at(5.0, 30.0).bound, Bound::Neither);
        // exactly half of a roof is on it
        assert_eq!(at(10.0, 0.0).bound, Bound::Bandwidth);
        // a rate or a peak unknown: no position
        assert_eq!(position(Some(12.0), Some(10.0), None), None);
        assert_eq!(
            position(Some(12.0), Some(10.0), Some(&peaks(20.0, None))),
            None
        );
        assert_eq!(position(None, Some(10.0), Some(&p)), None);
    }

    #[test]
    fn verdicts_by_hand() {
        let pos = |bound, bw, fl| {
            Some(Position {
                bound,
                of_copy_peak: bw,
                of_matmul_peak: fl,
            })
        };
        let r = |bytes, flops, time| Ratios {
            bytes: Some(bytes),
            flops: Some(flops),
            time: Some(time),
        };
        let bw = pos(Bound::Bandwidth, 0.7, 0.1);
        assert_eq!(
            verdict("a", bw, None, r(0.5, 1.0, 0.9), ""),
            "A is ahead: leave alone"
        );
        assert_eq!(verdict("even", bw, None, r(2.0, 1.0, 1.0), ""), "even");
        assert_eq!(
            verdict("b", None, None, r(2.0, 1.0, 1.2), "no measured matmul peak"),
            "A is slower (1.20x); what limits it is unknown: no measured matmul peak"
        );
        // on the copy roof with twice the bytes: the bytes are the problem
        assert_eq!(
            verdict("b", bw, None, r(2.0, 1.0, 1.9), ""),
            "A is bandwidth-bound (70 % of the copy peak) and reads 2.00x B's bytes, 1.90x slower: read fewer bytes"
        );
        // on the copy roof with the same bytes (1.01x is within 2 %): B streams them faster
        assert_eq!(
            verdict("b", bw, pos(Bound::Bandwidth, 0.95, 0.1), r(1.01, 1.0, 1.3), ""),
            "A is bandwidth-bound (70 % of the copy peak) on 1.01x B's bytes, 1.30x slower: B moves its bytes faster (95 % of the copy peak): improve A's memory access (layout, locality, prefetch)"
        );
        // on the matmul roof with 1.5x the FLOPs
        let fl = pos(Bound::Compute, 0.2, 0.8);
        assert_eq!(
            verdict("b", fl, None, r(1.0, 1.5, 1.4), ""),
            "A is compute-bound (80 % of the matmul peak) and does 1.50x B's FLOPs, 1.40x slower: do less arithmetic"
        );
        // on the matmul roof with the same FLOPs: B's kernels are faster
        assert_eq!(
            verdict("b", fl, None, r(0.53, 1.0, 1.34), ""),
            "A is compute-bound (80 % of the matmul peak) on 1.00x B's FLOPs, 1.34x slower: B computes faster: faster kernels (SIMD width, dequantisation, tiling)"
        );
        // under both roofs: latency and overhead, whatever the bytes ratio
        assert_eq!(
            verdict("b", pos(Bound::Neither, 0.03, 0.01), None, r(3.5, 1.0, 2.4), ""),
            "A is neither bandwidth- nor compute-bound (3 % of the copy peak, 1 % of the matmul peak), 2.40x slower: its time goes to latency and overhead (synchronisation, dispatch, small kernels): fuse or batch"
        );
    }

    #[test]
    fn more_bytes_far_below_the_copy_peak_is_not_called_bandwidth_bound() {
        // A reads 3.5x B's bytes and is 2.4x slower; the old rule read "more bytes, less than
        // that slower" as "the bytes lead". A moves 3.5e8 bytes in 0.24 ms/token x 512 tokens
        // = 122.88 ms: 2.848 GB/s, 2.8 % of a 100 GB/s copy peak. Its bytes are not what
        // limits it.
        let mut a = side("a", &[("moe", 0.24)]);
        let mut b = side("b", &[("moe", 0.10)]);
        let work = |bytes: u64| Work {
            weight_bytes: bytes,
            activation_bytes: 0,
            flops: 1e9,
        };
        a.work.insert("moe".into(), work(350_000_000));
        b.work.insert("moe".into(), work(100_000_000));
        let p = peaks(100.0, Some(1000.0));
        let l = compare(a, b, false, Some(&p)).unwrap();
        let r = &l.rows[0];
        let gb = 3.5e8 / 0.12288 / 1e9;
        assert!((r.a_gb_per_s.unwrap() - gb).abs() < 1e-12);
        let pos = r.a_position.unwrap();
        assert!((pos.of_copy_peak - gb / 100.0).abs() < 1e-12);
        // 1e9 FLOP in 122.88 ms = 8.14 GFLOP/s, 0.8 % of the matmul peak
        assert!((pos.of_matmul_peak - 1e9 / 0.12288 / 1e9 / 1000.0).abs() < 1e-12);
        assert_eq!(pos.bound, Bound::Neither);
        assert!(!r.verdict.contains("bytes lead"), "{}", r.verdict);
        assert!(r.verdict.starts_with("A is neither"), "{}", r.verdict);
    }

    fn t(name: &str, ne: [i64; 4], bytes: u64, w: bool) -> Option<crate::node::TensorDesc> {
        Some(crate::node::TensorDesc {
            name: name.into(),
            ne,
            ggml_type: "F32".into(),
            size_bytes: bytes,
            is_weight: w,
            producer: None,
            nb: [0; 4],
        })
    }

    fn node(
        i: u32,
        op: &str,
        out: [i64; 4],
        srcs: Vec<Option<crate::node::TensorDesc>>,
    ) -> NodeInfo {
        NodeInfo {
            index: i,
            op: op.into(),
            name: format!("n{i}"),
            layer: Some(0),
            out: crate::node::TensorDesc {
                name: "o".into(),
                ne: out,
                ggml_type: "F32".into(),
                size_bytes: 100,
                is_weight: false,
                producer: None,
                nb: [0; 4],
            },
            srcs,
            is_view: false,
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        }
    }

    fn in_band(band: &str) -> Assignment {
        Assignment {
            band: band.into(),
            reason: crate::band::Reason::None,
        }
    }

    #[test]
    fn decode_bytes_and_flops_are_per_step_times_steps() {
        // one decode step of 2 sequences: a [K=64, N=32] weight (8192 bytes) times [64, 2]
        // (512 bytes), out [32, 2] (100 bytes); 4 steps
        let mm = node(
            0,
            "MUL_MAT",
            [32, 2, 1, 1],
            vec![
                t("w", [64, 32, 1, 1], 8192, true),
                t("x", [64, 2, 1, 1], 512, false),
            ],
        );
        let decode = EngineWork {
            decode_tokens: 4,
            parallel: 2,
            ..EngineWork::prefill(512, 0)
        };
        let w = band_work(&[mm], &[in_band("projections")], &BTreeMap::new(), &decode);
        let p = w["projections"];
        assert_eq!(p.weight_bytes, 4 * 8192);
        assert_eq!(p.activation_bytes, 4 * (512 + 100));
        assert_eq!(p.flops, 4.0 * 2.0 * 64.0 * 32.0 * 2.0);
        // a side of that decode run: 8 tokens at 0.5 ms/token = 4 ms for the 4 steps
        let mut a = side("a", &[("projections", 0.5)]);
        a.tokens = decode.tokens_per_run();
        a.decode_tokens = 4;
        a.work.insert("projections".into(), p);
        let mut b = a.clone();
        b.ms_per_token.insert("projections".into(), 0.25);
        let l = compare(a, b, false, None).unwrap();
        let r = &l.rows[0];
        // 4 x 8804 bytes in 4 ms: 8.804e-3 GB/s (one step's bytes over all steps' time gave a
        // quarter of it)
        let gb = 4.0 * 8804.0 / 4e-3 / 1e9;
        assert!(
            (r.a_gb_per_s.unwrap() - gb).abs() < 1e-15,
            "{:?}",
            r.a_gb_per_s
        );
        assert!((r.b_gb_per_s.unwrap() - 2.0 * gb).abs() < 1e-15);
        let gflop = 4.0 * 8192.0 / 4e-3 / 1e9;
        assert!((r.a_gflop_per_s.unwrap() - gflop).abs() < 1e-15);
    }

    #[test]
    fn flash_attention_counts_the_causal_span_not_the_padded_kv() {
        // q [DK=64, 4 rows, 2 heads], K and V views [64, n_kv=256 (padded), 1 kv head]
        // (256 x 64 x 2 bytes each), at depth 100
        let fa = || {
            node(
                0,
                "FLASH_ATTN_EXT",
                [64, 2, 4, 1],
                vec![
                    t("q", [64, 4, 2, 1], 2048, false),
                    t("k", [64, 256, 1, 1], 32768, false),
                    t("v", [64, 256, 1, 1], 32768, false),
                    t("mask", [256, 4, 1, 1], 0, false),
                ],
            )
        };
        let prefill = EngineWork::prefill(4, 100);
        let w = band_work(&[fa()], &[in_band("attention")], &BTreeMap::new(), &prefill);
        // rows attend 101, 102, 103, 104 positions: (2 x 64 + 2 x 64) x 410 x 2 heads
        assert_eq!(w["attention"].flops, 256.0 * 410.0 * 2.0);
        // K and V: 104 of 256 positions read; q, mask and out whole
        let kv = (32768.0_f64 * 104.0 / 256.0).round() as u64;
        assert_eq!(w["attention"].activation_bytes, 2048 + 2 * kv + 100);
        // decode: 3 steps of 4 sequences at depth 100 attend 101, 102, 103 positions each
        let decode = EngineWork {
            decode_tokens: 3,
            parallel: 4,
            ..EngineWork::prefill(4, 100)
        };
        let w = band_work(&[fa()], &[in_band("attention")], &BTreeMap::new(), &decode);
        assert_eq!(
            w["attention"].flops,
            256.0 * (101.0 + 102.0 + 103.0) * 4.0 * 2.0
        );
        let kv = (32768.0_f64 * (101.0 + 102.0 + 103.0) / 256.0).round() as u64;
        assert_eq!(w["attention"].activation_bytes, 3 * 2048 + 2 * kv + 3 * 100);
        // never more than the view holds: depth 300 > n_kv 256 attends 256
        let deep = EngineWork::prefill(4, 300);
        let w = band_work(&[fa()], &[in_band("attention")], &BTreeMap::new(), &deep);
        assert_eq!(w["attention"].flops, 256.0 * 256.0 * 4.0 * 2.0);
    }

    #[test]
    fn band_work_counts_matmul_flops_and_routed_expert_bytes() {
        // a [K=64, N=32] weight times [64, 512]: 2 x 64 x 32 x 512 FLOPs
        let mm = node(
            0,
            "MUL_MAT",
            [32, 512, 1, 1],
            vec![
                t("w", [64, 32, 1, 1], 8192, true),
                t("x", [64, 512, 1, 1], 1000, false),
            ],
        );
        // 16 experts of [64, 32]; out [32, 4 used, 512 tokens]; 10 experts routed
        let id = node(
            1,
            "MUL_MAT_ID",
            [32, 4, 512, 1],
            vec![
                t("e", [64, 32, 16, 1], 16 * 8192, true),
                t("x", [64, 1, 512, 1], 1000, false),
            ],
        );
        let a = vec![
            Assignment {
                band: "projections".into(),
                reason: crate::band::Reason::None,
            },
            Assignment {
                band: "moe".into(),
                reason: crate::band::Reason::None,
            },
        ];
        let w = band_work(
            &[mm, id],
            &a,
            &BTreeMap::from([(1, 10)]),
            &EngineWork::prefill(512, 0),
        );
        assert_eq!(w["projections"].flops, 2.0 * 64.0 * 32.0 * 512.0);
        assert_eq!(w["projections"].weight_bytes, 8192);
        assert_eq!(w["projections"].activation_bytes, 1100);
        assert_eq!(w["moe"].flops, 2.0 * 64.0 * 32.0 * 4.0 * 512.0);
        assert_eq!(w["moe"].weight_bytes, 10 * 8192);
        let all = band_work(
            &[node(
                1,
                "MUL_MAT_ID",
                [32, 4, 512, 1],
                vec![t("e", [64, 32, 16, 1], 16 * 8192, true)],
            )],
            &a[1..],
            &BTreeMap::new(),
            &EngineWork::prefill(512, 0),
        );
        assert_eq!(all["moe"].weight_bytes, 16 * 8192);
        // candle's q x k^T per key/value head: lhs q [hd=128, M=512, 4 heads], rhs k^T
        // [n_kv=512, hd=128, 4], listed (rhs, lhs); out [512, 512, 4]: K is 128, not 512
        let kq = node(
            2,
            "MUL_MAT",
            [512, 512, 4, 1],
            vec![
                t("kt", [512, 128, 4, 1], 0, false),
                t("q", [128, 512, 4, 1], 0, false),
            ],
        );
        let w = band_work(
            &[kq],
            &a[..1],
            &BTreeMap::new(),
            &EngineWork::prefill(512, 0),
        );
        assert_eq!(w["projections"].flops, 2.0 * 128.0 * 512.0 * 512.0 * 4.0);
    }
}
