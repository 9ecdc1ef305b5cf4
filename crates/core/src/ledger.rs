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
use crate::profile::{membership, per_cycle_ms_per_token, ProfileRaw, ProfileSummary};
use crate::replay::ReplayResult;

/// 2: verdicts from each side's position against the measured peaks (`a_position`,
/// `b_position`, `flops_ratio`); bytes and FLOPs per run. 3: an opportunity per row, each
/// side's per-band range and cycles (the regression gate's spread). 4: each side's per-cycle
/// band values and model identity, the differences a forced ledger was made despite, the
/// regression gate's rank test.
pub const LEDGER_SCHEMA_VERSION: u32 = 4;

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
    /// Band -> its per-cycle values (the estimator's: `ms_per_token` is their median), what the
    /// regression gate tests; see [`band_cycles`].
    #[serde(default)]
    pub ms_per_token_cycles: BTreeMap<String, Vec<f64>>,
    /// The model file the side ran (its name) and its BLAKE3, where known (empty for an
    /// imported trace without its model): two runs of different models are not the same work.
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub model_blake3: String,
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
            ms_per_token_cycles: BTreeMap::new(),
            model: String::new(),
            model_blake3: String::new(),
        }
    }

    /// The side with its per-cycle band values from the stored profile it summarises
    /// ([`band_cycles`]) and the model it ran.
    pub fn with_cycles(
        mut self,
        raw: &ProfileRaw,
        assignments: &[Assignment],
        model: &str,
        model_blake3: &str,
    ) -> Side {
        self.ms_per_token_cycles = band_cycles(raw, assignments);
        self.model = model.to_string();
        self.model_blake3 = model_blake3.to_string();
        self
    }
}

/// Band -> the per-cycle ms/token of a stored profile: in each cycle the band's share of the
/// TIMED sum x that cycle's FUSED wall / tokens, the values whose median and range the
/// summary reports ([`crate::profile::per_cycle_ms_per_token`]).
pub fn band_cycles(raw: &ProfileRaw, assignments: &[Assignment]) -> BTreeMap<String, Vec<f64>> {
    let times: Vec<&[f64]> = raw.cycles.iter().map(|c| c.node_us.as_slice()).collect();
    let walls: Vec<f64> = raw.cycles.iter().map(|c| c.fused_ms).collect();
    let tokens = raw.config.work.tokens_per_run().max(1) as f64;
    let mut bands: Vec<&str> = assignments.iter().map(|a| a.band.as_str()).collect();
    bands.sort_unstable();
    bands.dedup();
    bands
        .into_iter()
        .map(|band| {
            let member = membership(|i| assignments.get(i).is_some_and(|a| a.band == band));
            (
                band.to_string(),
                per_cycle_ms_per_token(&times, &walls, tokens, &member),
            )
        })
        .collect()
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
    /// How they differ (chunk, depth, decode tokens, architecture, model), where forced.
    #[serde(default)]
    pub differences: Vec<String>,
    /// The clock the bands' times are read on, where a side had device time to choose
    /// (`compare --clock`); absent: the host's, the only one either side had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock: Option<crate::device::Clock>,
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

/// The regression gate's false-alarm rate over a whole ledger: each band is tested at this
/// over the number of bands (Bonferroni), so a run that did not change fails with at most this
/// chance, whatever the number of bands.
pub const GATE_ALPHA: f64 = 0.05;

/// One band before the regression gate (`compare --fail-above`): A is the new run, B the
/// baseline.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateRow {
    pub band: String,
    pub a_ms_per_token: f64,
    pub b_ms_per_token: f64,
    /// A / B - 1 of the medians (`None` where the baseline has no time in the band).
    pub slower: Option<f64>,
    /// A's range (min, max) over its cycles and B's.
    pub a_range: (f64, f64),
    pub b_range: (f64, f64),
    /// The change exceeds the threshold: A / B - 1 above it, or, for a band the baseline
    /// does not have, A's time above the threshold's share of the baseline's total.
    pub beyond_threshold: bool,
    /// One-sided Mann-Whitney p-value of A's cycles ranking above B's (a band B does not have
    /// counts as zero in each of its cycles): the chance of ranks at least this far apart when
    /// nothing changed.
    pub p_value: f64,
    /// `p_value` at most the gate's per-band level: A is slower beyond the runs' noise.
    pub beyond_noise: bool,
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
    /// Cycles behind each side.
    pub a_cycles: u32,
    pub b_cycles: u32,
    /// The level each band's rank test must reach: [`GATE_ALPHA`] over the number of bands.
    pub alpha_per_band: f64,
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

/// The regression gate cannot be run.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GateError {
    #[error("the regression gate cannot fail with {a} cycle(s) of the new run and {b} of the baseline: its rank test's smallest p-value, 1/{orderings:.0}, is above {alpha} / {bands} bands; profile both with at least {needed} cycles (-r {needed})")]
    TooFewCycles {
        a: u32,
        b: u32,
        orderings: f64,
        alpha: f64,
        bands: usize,
        needed: u32,
    },
}

/// Gates A (the new run) against B (the baseline): a band fails when A's median is slower than
/// B's by more than `threshold` (a fraction) and A's cycles rank above B's beyond chance (a
/// one-sided Mann-Whitney test of the per-cycle values at [`GATE_ALPHA`] over the number of
/// bands), so one slow baseline cycle does not hide a regression and more cycles give more
/// power. A band the baseline has no time in fails when A spends more than `threshold` of B's
/// total in it, its cycles ranking above B's zeros. Refused when so few cycles that no band
/// could fail.
pub fn gate(l: &Ledger, threshold: f64) -> Result<Gate, GateError> {
    let range = |s: &Side, band: &str, median: f64| {
        s.ms_per_token_range
            .get(band)
            .copied()
            .unwrap_or((median, median))
    };
    // a band's per-cycle values, zero in every cycle of a side without the band; the median
    // alone (one value) for a side that stored none
    let cycles = |s: &Side, band: &str| -> Vec<f64> {
        if s.ms_per_token_cycles.is_empty() {
            vec![s.ms_per_token.get(band).copied().unwrap_or(0.0)]
        } else {
            s.ms_per_token_cycles
                .get(band)
                .cloned()
                .unwrap_or_else(|| vec![0.0; s.cycles.max(1) as usize])
        }
    };
    let bands = l.rows.len().max(1);
    let alpha = GATE_ALPHA / bands as f64;
    let count = |s: &Side| {
        if s.ms_per_token_cycles.is_empty() {
            1
        } else {
            s.cycles.max(1)
        }
    };
    let (n, m) = (count(&l.a), count(&l.b));
    if crate::rank::smallest_p(n as usize, m as usize) > alpha {
        let needed = (1u32..)
            .find(|&k| crate::rank::smallest_p(k as usize, k as usize) <= alpha)
            .expect("some number of cycles reaches any level");
        return Err(GateError::TooFewCycles {
            a: n,
            b: m,
            orderings: 1.0 / crate::rank::smallest_p(n as usize, m as usize),
            alpha: GATE_ALPHA,
            bands,
            needed,
        });
    }
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
            let p_value = crate::rank::p_greater(&cycles(&l.a, &r.band), &cycles(&l.b, &r.band));
            let beyond_noise = p_value <= alpha;
            GateRow {
                band: r.band.clone(),
                a_ms_per_token: am,
                b_ms_per_token: bm,
                slower,
                a_range,
                b_range,
                beyond_threshold,
                p_value,
                beyond_noise,
                fails: beyond_threshold && beyond_noise,
            }
        })
        .collect();
    Ok(Gate {
        threshold,
        rows,
        a_cycles: n,
        b_cycles: m,
        alpha_per_band: alpha,
    })
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

impl LedgerReport {
    /// Reads a ledger run's `ledger.json`, refusing a newer or unknown schema version (the
    /// ledger's own `schema_version`, which every version wrote) as every run file is.
    pub fn read(path: &std::path::Path) -> Result<LedgerReport, crate::run_folder::RunFolderError> {
        use crate::run_folder::RunFolderError;
        let value: serde_json::Value = crate::run_folder::read_json(path)?;
        let version = value.pointer("/ledger/schema_version");
        match version.and_then(|v| v.as_u64()) {
            Some(n) if (1..=LEDGER_SCHEMA_VERSION as u64).contains(&n) => {}
            _ => {
                return Err(RunFolderError::Version {
                    path: path.to_path_buf(),
                    found: version.map_or("none".to_string(), |v| v.to_string()),
                    newest: LEDGER_SCHEMA_VERSION,
                })
            }
        }
        serde_json::from_value(value).map_err(|source| RunFolderError::Json {
            path: path.to_path_buf(),
            source,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    #[error("the runs did not do the same work: {0} (compare anyway with --force)")]
    DifferentWork(String),
}

/// `name (BLAKE3 0123456789ab)`.
fn model_named(name: &str, blake3: &str) -> String {
    format!("{name} (BLAKE3 {})", &blake3[..blake3.len().min(12)])
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
    // two models of one architecture (another size, another quantisation) are other work; a
    // side whose model is unknown (an imported trace without it) cannot be checked
    if !a.model_blake3.is_empty() && !b.model_blake3.is_empty() && a.model_blake3 != b.model_blake3
    {
        diffs.push(format!(
            "model {} vs {}",
            model_named(&a.model, &a.model_blake3),
            model_named(&b.model, &b.model_blake3)
        ));
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
        differences: diffs,
        a,
        b,
        rows,
        clock: None,
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
            ms_per_token_cycles: BTreeMap::new(),
            model: String::new(),
            model_blake3: String::new(),
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

    /// A side whose bands have these per-cycle values (median, range and cycles from them).
    fn cycled(bands: &[(&str, &[f64])]) -> Side {
        let median = |v: &[f64]| crate::stats::median(v).unwrap();
        let mut s = side(
            "s",
            &bands
                .iter()
                .map(|(b, v)| (*b, median(v)))
                .collect::<Vec<_>>(),
        );
        s.ms_per_token_range = bands
            .iter()
            .map(|(b, v)| {
                let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                (b.to_string(), (lo, hi))
            })
            .collect();
        s.ms_per_token_cycles = bands
            .iter()
            .map(|(b, v)| (b.to_string(), v.to_vec()))
            .collect();
        s.cycles = bands[0].1.len() as u32;
        s
    }

    fn failed(g: &Gate) -> Vec<&str> {
        g.failed().iter().map(|r| r.band.as_str()).collect()
    }

    #[test]
    fn the_gate_needs_the_threshold_and_the_rank_test_by_hand() {
        let new = cycled(&[
            // 10 % slower, every cycle above every baseline cycle: p = 1 / C(10, 5) = 1/252
            ("x", &[1.08, 1.09, 1.10, 1.11, 1.12]),
            // 10 % slower by the medians, the cycles interleaved with the baseline's
            ("y", &[0.95, 1.05, 1.10, 1.15, 1.20]),
            // 3 % slower beyond the noise, under the threshold
            ("z", &[1.02, 1.025, 1.03, 1.035, 1.04]),
            // a band the baseline does not have, 0.2 > 5 % of its 3.0 total
            ("w", &[0.19, 0.20, 0.20, 0.21, 0.21]),
        ]);
        let base = cycled(&[
            ("x", &[0.98, 0.99, 1.0, 1.01, 1.02]),
            ("y", &[0.90, 0.95, 1.0, 1.05, 1.10]),
            ("z", &[0.99, 0.995, 1.0, 1.005, 1.01]),
        ]);
        let l = compare(new, base, false, None).unwrap();
        let g = gate(&l, 0.05).unwrap();
        // four bands: each tested at 0.05 / 4
        assert!((g.alpha_per_band - 0.0125).abs() < 1e-15);
        assert_eq!(failed(&g), ["w", "x"]);
        let row = |band: &str| g.rows.iter().find(|r| r.band == band).unwrap();
        assert!((row("x").slower.unwrap() - 0.10).abs() < 1e-12);
        assert!((row("x").p_value - 1.0 / 252.0).abs() < 1e-12);
        assert!((row("w").p_value - 1.0 / 252.0).abs() < 1e-12);
        // y: U = 19.5 of 25 (A above B in 18 pairs, 3 ties); P(U >= 19) = P(U <= 6) = 28 / 252
        // (the partitions of 0..=6 that fit a 5 x 5 box)
        assert!(row("y").beyond_threshold && !row("y").beyond_noise);
        assert!((row("y").p_value - 28.0 / 252.0).abs() < 1e-12);
        assert!(!row("z").beyond_threshold && row("z").beyond_noise);
        assert_eq!(row("w").slower, None);
        // at 12 % both pass; at 7 % x (10 % slower) fails and w (0.2 of 3.0 = 6.7 %) passes
        assert!(failed(&gate(&l, 0.12).unwrap()).is_empty());
        assert_eq!(failed(&gate(&l, 0.07).unwrap()), ["x"]);
    }

    #[test]
    fn one_slow_baseline_cycle_no_longer_hides_a_regression() {
        // 10 % slower in every cycle; one baseline cycle took twice as long (another process)
        let new = cycled(&[("x", &[1.09, 1.10, 1.10, 1.11, 1.12, 1.10, 1.09, 1.11, 1.10])]);
        let base = cycled(&[("x", &[1.0, 0.99, 1.01, 1.0, 2.0, 1.0, 0.99, 1.01, 1.0])]);
        let l = compare(new, base, false, None).unwrap();
        let g = gate(&l, 0.05).unwrap();
        let r = &g.rows[0];
        // the gate before: A's fastest cycle (1.09) is not slower than B's slowest (2.0)
        assert!(r.a_range.0 < r.b_range.1);
        // U = 72 of 81: P(U >= 72) = P(U <= 9) with 9 and 9 cycles = 97 / C(18, 9) = 97 / 48620
        // (the partitions of 0..=9: 1 + 1 + 2 + 3 + 5 + 7 + 11 + 15 + 22 + 30)
        assert!((r.p_value - 97.0 / 48620.0).abs() < 1e-12, "{}", r.p_value);
        assert_eq!(failed(&g), ["x"]);
    }

    #[test]
    fn too_few_cycles_to_fail_are_refused() {
        let two = cycled(&[
            ("a", &[1.0, 1.1]),
            ("b", &[1.0, 1.1]),
            ("c", &[1.0, 1.1]),
            ("d", &[1.0, 1.1]),
        ]);
        let l = compare(two.clone(), two, false, None).unwrap();
        let e = gate(&l, 0.05).unwrap_err();
        // 1 / C(4, 2) = 1/6 > 0.05 / 4; 4 and 4 give 1/70 > 0.0125, 5 and 5 give 1/252
        assert_eq!(
            e.to_string(),
            "the regression gate cannot fail with 2 cycle(s) of the new run and 2 of the baseline: its rank test's smallest p-value, 1/6, is above 0.05 / 4 bands; profile both with at least 5 cycles (-r 5)"
        );
    }

    #[test]
    fn a_side_s_cycles_are_the_summary_s_estimator() {
        use crate::arch::tests::qwen35moe_md;
        use crate::mock::{MockEngine, MockNode};
        use crate::profile::{analyse, measure, ProfileConfig};
        const NODES: [MockNode; 3] = [
            ("GATED_DELTA_NET", "node_0", "", 300.0),
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                500.0,
            ),
            ("MUL_MAT", "Qcur_full-3", "blk.3.attn_q.weight", 200.0),
        ];
        let mut e = MockEngine::new(&NODES);
        // one cycle's runs twice as slow
        e.noise = vec![1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0];
        let cfg = ProfileConfig {
            work: EngineWork::prefill(100, 0),
            cycles: 3,
            warmup: 0,
            overhead_pairs: 0,
            gate: crate::noise::GateConfig {
                enabled: false,
                ..Default::default()
            },
        };
        let raw = measure(&mut e, &cfg, &mut |_, _, _| {}).unwrap();
        let rules = crate::band::BandRules::builtin("qwen35moe").unwrap();
        let arch = crate::arch::ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let (assignments, summary) = analyse(&raw, &rules, &arch).unwrap();
        let side = Side::from_summary("s", "qwen35moe", &summary).with_cycles(
            &raw,
            &assignments,
            "m.gguf",
            "00ff",
        );
        assert_eq!(side.ms_per_token_cycles.len(), summary.bands.len());
        for b in &summary.bands {
            let v = &side.ms_per_token_cycles[&b.band];
            assert_eq!(v.len(), 3, "{}", b.band);
            let median = crate::stats::median(v).unwrap();
            assert!((median - b.ms_per_token).abs() < 1e-12, "{}", b.band);
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            assert_eq!((lo, hi), (b.ms_per_token_min, b.ms_per_token_max));
        }
        // the moe band holds half the work: 0.5 x 1 ms / 100 tokens, twice that in the slow cycle
        let moe = &side.ms_per_token_cycles["moe"];
        assert!(
            moe.iter().filter(|v| (**v - 0.005).abs() < 1e-12).count() == 2,
            "{moe:?}"
        );
        assert!(moe.iter().any(|v| (*v - 0.010).abs() < 1e-12), "{moe:?}");
    }

    /// Uniform in [0, 1) and standard normal (Box-Muller) from a SplitMix64 state.
    fn uniform(state: &mut u64) -> f64 {
        *state = crate::tokens::splitmix64(*state);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(state: &mut u64) -> f64 {
        let u = uniform(state).max(1e-300);
        let v = uniform(state);
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// A side of six bands over `cycles` cycles, as a profile measures them: each cycle's wall
    /// is 1 + `noise` x a standard normal (and 30 % slower with probability `outliers`), shared
    /// by the bands of that cycle, each band also jittering by 1 %; band "b2" is `slower`
    /// slower.
    fn synthetic(cycles: usize, noise: f64, outliers: f64, slower: f64, state: &mut u64) -> Side {
        let base = [4.0, 2.0, 1.0, 0.5, 0.25, 0.125];
        let names = ["b0", "b1", "b2", "b3", "b4", "b5"];
        let mut values = vec![Vec::new(); base.len()];
        for _ in 0..cycles {
            let slow = if uniform(state) < outliers { 1.3 } else { 1.0 };
            let wall = (1.0 + noise * normal(state)) * slow;
            for (k, v) in values.iter_mut().enumerate() {
                let effect = if k == 2 { 1.0 + slower } else { 1.0 };
                v.push(base[k] * effect * wall * (1.0 + 0.01 * normal(state)));
            }
        }
        let bands: Vec<(&str, &[f64])> = names
            .iter()
            .zip(&values)
            .map(|(n, v)| (*n, v.as_slice()))
            .collect();
        cycled(&bands)
    }

    /// Of `trials` gated pairs of synthetic runs, the share whose gate failed (any band), and
    /// the same under the gate before (medians beyond the threshold and A's fastest cycle
    /// slower than B's slowest).
    fn failure_rates(
        cycles: usize,
        noise: f64,
        outliers: f64,
        slower: f64,
        threshold: f64,
        trials: u64,
    ) -> (f64, f64) {
        let (mut now, mut before) = (0, 0);
        for t in 0..trials {
            let mut state = 0x6a7e_0000 + t;
            let base = synthetic(cycles, noise, outliers, 0.0, &mut state);
            let new = synthetic(cycles, noise, outliers, slower, &mut state);
            let l = compare(new, base, false, None).unwrap();
            let g = gate(&l, threshold).unwrap();
            now += u32::from(!g.failed().is_empty());
            before += u32::from(
                g.rows
                    .iter()
                    .any(|r| r.beyond_threshold && r.a_range.0 > r.b_range.1),
            );
        }
        (now as f64 / trials as f64, before as f64 / trials as f64)
    }

    #[test]
    fn the_gate_rarely_fails_an_unchanged_run() {
        // A/A over six bands: the false-alarm rate of the whole gate stays under GATE_ALPHA.
        // 1000 trials each gave, at --fail-above 0 (the threshold never helps): 3 % noise 2.3 %
        // (5 cycles), 2.3 % (15), with one cycle in ten 30 % slower 2.1 % and 2.5 %; at
        // --fail-above 5: 0.7 %, 0.2 %, 1.1 %, 0.7 %
        for (cycles, outliers) in [(5, 0.0), (15, 0.0), (5, 0.1), (15, 0.1)] {
            for threshold in [0.0, 0.05] {
                let (now, _) = failure_rates(cycles, 0.03, outliers, 0.0, threshold, 500);
                assert!(
                    now <= GATE_ALPHA,
                    "{cycles} cycles, outliers {outliers}, threshold {threshold}: {now}"
                );
            }
        }
    }

    #[test]
    fn the_gate_finds_a_known_slowdown_and_more_cycles_find_it_more_often() {
        // one band of six 10 % slower, --fail-above 5. 1000 trials each gave, with 3 % noise:
        // 87 % (5 cycles), 97 % (7), 99.7 % (9), 99.9 % (15), where the gate before (A's fastest
        // cycle slower than B's slowest) gave 75 %, 63 %, 54 %, 29 %; with one cycle in ten
        // 30 % slower: 54 %, 52 %, 78 %, 96 % against 47 %, 32 %, 24 %, 6 %
        let (p5, before5) = failure_rates(5, 0.03, 0.0, 0.10, 0.05, 500);
        let (p15, before15) = failure_rates(15, 0.03, 0.0, 0.10, 0.05, 500);
        assert!(p5 >= 0.8 && p15 >= 0.99, "{p5} {p15}");
        assert!(before15 < before5, "{before5} {before15}");
        let (o5, obefore5) = failure_rates(5, 0.03, 0.1, 0.10, 0.05, 500);
        let (o15, obefore15) = failure_rates(15, 0.03, 0.1, 0.10, 0.05, 500);
        assert!(o15 >= 0.9 && o15 > o5, "{o5} {o15}");
        // the gate before lost power with more cycles: more chances of one slow cycle
        assert!(
            obefore15 < 0.2 && obefore15 < obefore5,
            "{obefore5} {obefore15}"
        );
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
        assert_eq!(l.differences, ["depth 0 vs 4096"]);
        assert_eq!(l.rows[0].ahead, "even");
    }

    #[test]
    fn ledger_json_is_read_with_its_schema_version_checked() {
        let dir = tempfile::tempdir().unwrap();
        let report = LedgerReport {
            ledger: seed_000(),
            replay_a: None,
            replay_b: None,
            peaks: None,
            notes: vec!["a note".into()],
            gate: None,
        };
        let path = dir.path().join("ledger.json");
        let write = |v: &serde_json::Value| {
            std::fs::write(&path, serde_json::to_vec_pretty(v).unwrap()).unwrap()
        };
        let mut v = serde_json::to_value(&report).unwrap();
        write(&v);
        assert_eq!(LedgerReport::read(&path).unwrap(), report);
        // a version 3 file (no per-cycle values, model or differences) still reads
        v["ledger"]["schema_version"] = 3.into();
        for side in ["a", "b"] {
            let side = v["ledger"][side].as_object_mut().unwrap();
            for key in ["ms_per_token_cycles", "model", "model_blake3"] {
                side.remove(key);
            }
        }
        v["ledger"].as_object_mut().unwrap().remove("differences");
        write(&v);
        assert_eq!(LedgerReport::read(&path).unwrap().ledger.schema_version, 3);
        // a newer version, or none, is refused naming the file
        for (version, found) in [
            (serde_json::json!(99), "99"),
            (serde_json::Value::Null, "null"),
        ] {
            v["ledger"]["schema_version"] = version;
            write(&v);
            let e = LedgerReport::read(&path).unwrap_err().to_string();
            assert!(
                e.contains("ledger.json")
                    && e.contains(&format!("schema version {found} is not one")),
                "{e}"
            );
        }
        v["ledger"]
            .as_object_mut()
            .unwrap()
            .remove("schema_version");
        write(&v);
        let e = LedgerReport::read(&path).unwrap_err().to_string();
        assert!(e.contains("schema version none"), "{e}");
    }

    #[test]
    fn two_models_of_one_architecture_are_different_work() {
        let mut a = side("a", &[("moe", 1.0)]);
        let mut b = side("b", &[("moe", 1.0)]);
        (a.model, a.model_blake3) = ("q4_k_m.gguf".into(), "1111aaaa2222bbbb3333".into());
        (b.model, b.model_blake3) = ("q8_0.gguf".into(), "4444cccc5555dddd6666".into());
        let e = compare(a.clone(), b.clone(), false, None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "the runs did not do the same work: model q4_k_m.gguf (BLAKE3 1111aaaa2222) vs \
             q8_0.gguf (BLAKE3 4444cccc5555) (compare anyway with --force)"
        );
        let l = compare(a.clone(), b.clone(), true, None).unwrap();
        assert!(l.forced && l.differences[0].starts_with("model q4_k_m.gguf"));
        // the same file under another name is the same model; an unknown one is not checked
        b.model_blake3 = a.model_blake3.clone();
        assert!(!compare(a.clone(), b.clone(), false, None).unwrap().forced);
        b.model_blake3.clear();
        assert!(!compare(a, b, false, None).unwrap().forced);
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
