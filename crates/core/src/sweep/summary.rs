//! The pure summary of stored sweep records: per depth and phase (prefill chunk, decode steps)
//! band ms/token as the median over cycles of each cycle's paired FUSED and TIMED runs (point
//! and range from that one estimator), a line per band, attention per layer kind, the crossover
//! with its uncertainty from a bootstrap of the whole pipeline, and the checks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::record::{ChunkRecord, PassLog, Phase};
use super::{SweepConfig, SweepError, FLAT_CHANGE, SLOPE_SIGMAS, SWEEP_SCHEMA_VERSION};
use crate::arch::{ArchInfo, LayerKind};
use crate::band::{Assignment, BandRules, UNASSIGNED};
use crate::engine::Mode;
use crate::node::NodeInfo;
use crate::profile::{Check, CheckStatus, AGREEMENT_GOAL};
use crate::stats::{linear_fit, LinearFit, Sample};

/// One depth of one phase.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DepthRow {
    pub chunk: u32,
    /// Tokens in the context when the chunk (or the first decode step) starts.
    pub depth: u32,
    /// Cycles that measured this depth, per mode.
    pub fused_cycles: u32,
    pub timed_cycles: u32,
    pub fused_ms: f64,
    pub fused_ms_min: f64,
    pub fused_ms_max: f64,
    pub tok_per_s: f64,
    pub timed_sum_ms: f64,
    /// Median over cycles of (TIMED sum / FUSED - 1), each cycle's two runs back to back.
    pub agreement: f64,
    /// The same after removing the isolation cost (decode; equal to `agreement` for prefill).
    #[serde(default)]
    pub agreement_corrected: f64,
    pub coverage: f64,
    /// ms/token per band, in the summary's band order: the median over cycles of each cycle's
    /// band share x its FUSED wall / tokens (decode: isolation cost removed).
    pub ms_per_token: Vec<f64>,
    /// The range of the per-cycle values of the same formula.
    #[serde(default)]
    pub ms_per_token_min: Vec<f64>,
    #[serde(default)]
    pub ms_per_token_max: Vec<f64>,
    /// The attention band's ms/token split by layer kind, in the order of the phase's
    /// `attention_kinds` (empty when the model has one kind of attention layer).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention_by_kind: Vec<f64>,
}

/// A band's fit against depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandFit {
    pub band: String,
    /// ms/token = a + b x depth.
    pub fit: LinearFit,
    pub mean_ms_per_token: f64,
    /// Coefficient of variation of the band's ms/token across depths.
    pub cv: f64,
    /// Fitted change across the swept depths, as a share of the mean.
    pub change: f64,
    /// The change is within [`FLAT_CHANGE`], or the slope is within [`SLOPE_SIGMAS`] standard
    /// errors of zero.
    pub flat: bool,
}

/// Where the attention band overtakes the FFN band.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Crossover {
    pub attention_band: String,
    pub ffn_band: String,
    /// `within` (the fits cross inside the swept depths), `beyond` (they would cross later:
    /// no crossover up to the last depth), `from_start` (attention already costs more at depth
    /// 0), `never` (attention does not grow faster).
    pub status: String,
    /// The fitted crossing depth, where the lines cross at all.
    pub depth: Option<f64>,
    /// The standard deviation of the crossing over the bootstrap resamples.
    pub sigma: Option<f64>,
    /// The 2.5 and 97.5 percentiles of the crossing over the bootstrap resamples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval: Option<(f64, f64)>,
    /// Share of the resamples whose lines do not cross ahead of the attention line's rise.
    #[serde(default)]
    pub resamples_without_crossing: f64,
    /// The first measured depth where attention costs at least as much as the FFN.
    pub first_measured_depth: Option<u32>,
    pub text: String,
}

/// The attention layers of one kind, whose share of the attention band a sweep fits apart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KindSeries {
    pub kind: LayerKind,
    /// The window of sliding-window layers.
    pub window: Option<u32>,
    pub layers: u32,
    /// The fit against depth: for sliding-window layers over the depths at or past the window
    /// only (where their work should stop growing), for full attention over every depth.
    pub fit: Option<BandFit>,
    /// The first depth the fit covers.
    pub fit_from_depth: u32,
    pub text: String,
}

/// One phase of a sweep: its rows, fits, attention by layer kind and crossover.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PhaseSummary {
    /// Tokens one measured unit processes (the chunk; steps x sequences for decode).
    pub tokens: u32,
    /// Decode steps and sequences (0 and 1 for prefill).
    #[serde(default)]
    pub steps: u32,
    #[serde(default)]
    pub parallel: u32,
    /// The bands of this phase's graph, the order of `ms_per_token`.
    #[serde(default)]
    pub bands: Vec<String>,
    pub depths: Vec<DepthRow>,
    pub fits: Vec<BandFit>,
    pub crossover: Option<Crossover>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention_kinds: Vec<KindSeries>,
    pub mean_abs_agreement: f64,
    pub mean_abs_agreement_corrected: f64,
    /// The depth with the largest |agreement|, and that agreement.
    pub worst_agreement: Option<(u32, f64)>,
    /// The bands are raw shares of a graph split over RPC: every remote node's time holds a
    /// round trip to its server that the FUSED run does not pay in the same place, and nothing
    /// removed it (see [`SPLIT_RAW_NOTE`]). Only the prefill phase (a sweep over RPC has no
    /// decode phase).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub raw_split: bool,
}

/// What a split sweep's rows are: raw shares with the round trips in them (a sweep over RPC
/// measures prefill chunks only, which are apportioned as measured). A profile removes each
/// remote node's round trip in its corrected column.
pub const SPLIT_RAW_NOTE: &str = "prefill rows are raw shares of a graph split over RPC: each \
    remote node's time holds a round trip to its server, which is not removed (`profile --rpc` \
    gives the corrected column of one depth)";

/// Cost of the sweep against one plain cumulative prefill to the same depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepCost {
    /// Median over cycles of what a cycle cost (both modes, every unit), seconds.
    pub cycle_s: f64,
    /// Median over cycles of the sum of FUSED prefill chunk walls: a plain cumulative prefill.
    pub plain_prefill_s: f64,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub schema_version: u32,
    pub tokens: u32,
    pub chunks: u32,
    pub max_depth: u32,
    pub cycles: u32,
    /// What the depth axis is.
    #[serde(default)]
    pub depth_axis: String,
    pub bands: Vec<String>,
    /// The prefill phase (its fields flattened here, as before decode sweeps existed).
    pub depths: Vec<DepthRow>,
    pub fits: Vec<BandFit>,
    pub crossover: Option<Crossover>,
    /// The attention band by layer kind (models with sliding-window layers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attention_kinds: Vec<KindSeries>,
    pub mean_abs_agreement: f64,
    #[serde(default)]
    pub worst_agreement: Option<(u32, f64)>,
    /// The decode steps measured after every chunk (`sweep -n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<PhaseSummary>,
    pub min_coverage: f64,
    pub cost: Option<SweepCost>,
    pub checks: Vec<Check>,
    /// The prefill rows are raw shares of a graph split over RPC ([`PhaseSummary::raw_split`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub prefill_raw_split: bool,
}

impl SweepSummary {
    /// The prefill phase as a [`PhaseSummary`].
    pub fn prefill(&self) -> PhaseSummary {
        PhaseSummary {
            tokens: self.tokens,
            steps: 0,
            parallel: 1,
            bands: self.bands.clone(),
            depths: self.depths.clone(),
            fits: self.fits.clone(),
            crossover: self.crossover.clone(),
            attention_kinds: self.attention_kinds.clone(),
            mean_abs_agreement: self.mean_abs_agreement,
            mean_abs_agreement_corrected: self.mean_abs_agreement,
            worst_agreement: self.worst_agreement,
            raw_split: self.prefill_raw_split,
        }
    }
}

/// What a sweep summary needs of a graph, computed once: the bands present, each node's band
/// (an index into them; unassigned nodes get `bands.len()`), and for nodes of the attention band
/// the kind of their layer where the model has several (sliding-window and full attention).
#[derive(Debug, Clone, PartialEq)]
pub struct SweepIndex {
    pub bands: Vec<String>,
    pub band: Vec<u16>,
    /// The attention kinds split apart: (kind, window, layers).
    pub kinds: Vec<(LayerKind, Option<u32>, u32)>,
    /// Per node, an index into `kinds` (`u8::MAX`: not split).
    pub kind: Vec<u8>,
    /// Nodes that do work (views and skipped nodes carry only the isolation cost).
    pub working: Vec<bool>,
    /// The FFN band the crossover compares attention with (`@ffn` resolved for the model).
    pub ffn_band: Option<String>,
    pub attention_band: Option<String>,
}

impl SweepIndex {
    pub fn new(
        graph: &[NodeInfo],
        assignments: &[Assignment],
        rules: &BandRules,
        arch: &ArchInfo,
    ) -> SweepIndex {
        let bands = rules.bands_in(assignments);
        let band = band_index(assignments, &bands);
        let mut kinds: Vec<(LayerKind, Option<u32>, u32)> = Vec::new();
        if arch.layers_of(LayerKind::SlidingWindow) > 0 {
            for k in [LayerKind::SlidingWindow, LayerKind::FullAttention] {
                let layers = arch.layers_of(k);
                if layers > 0 {
                    let window = arch
                        .layers
                        .iter()
                        .find(|l| l.kind == k)
                        .and_then(|l| l.window);
                    kinds.push((k, window, layers));
                }
            }
        }
        let layers = crate::node::effective_layers(graph);
        let kind = assignments
            .iter()
            .zip(&layers)
            .map(|(a, l)| {
                if Some(&a.band) != rules.attention_band.as_ref() {
                    return u8::MAX;
                }
                l.and_then(|l| arch.kind_of(l))
                    .and_then(|k| kinds.iter().position(|(kk, _, _)| *kk == k))
                    .map(|i| i as u8)
                    .unwrap_or(u8::MAX)
            })
            .collect();
        SweepIndex {
            bands,
            band,
            kinds,
            kind,
            working: graph.iter().map(|n| n.is_working()).collect(),
            ffn_band: rules.ffn_band_for(arch),
            attention_band: rules.attention_band.clone(),
        }
    }
}

/// Each node's band as an index into `bands` (unassigned nodes get `bands.len()`).
pub fn band_index(assignments: &[Assignment], bands: &[String]) -> Vec<u16> {
    assignments
        .iter()
        .map(|a| {
            bands
                .iter()
                .position(|b| *b == a.band)
                .unwrap_or(bands.len()) as u16
        })
        .collect()
}

/// True when every node landed in a band (for callers that want to refuse early).
pub fn fully_assigned(assignments: &[Assignment]) -> bool {
    assignments.iter().all(|a| a.band != UNASSIGNED)
}

/// One cycle's paired measurement of one depth: the band ms/token of its TIMED run against its
/// FUSED wall (isolation cost removed for decode), split kinds, agreement, coverage.
struct CycleValues {
    fused_ms: f64,
    timed_sum_ms: f64,
    agreement: f64,
    agreement_corrected: f64,
    coverage: f64,
    band: Vec<f64>,
    kinds: Vec<f64>,
}

fn cycle_values(
    index: &SweepIndex,
    fused: &ChunkRecord,
    timed: &ChunkRecord,
    tokens: f64,
    steps: f64,
    decode: bool,
) -> CycleValues {
    let nb = index.bands.len();
    let mut band_us = vec![0f64; nb + 1];
    let mut kind_us = vec![0f64; index.kinds.len()];
    let wall = fused.wall_ms;
    let node_us: Vec<f64> = timed.node_us.iter().map(|&v| v as f64).collect();
    let raw_sum: f64 = node_us.iter().sum();
    // decode: every working node paid the isolation once a step, node by node where the engine
    // calibrated each node; the remainder the calibration missed comes equally from every
    // working node (crate::isolation); idle nodes hold nothing but isolation. A prefill chunk
    // is apportioned as it was measured.
    let (times, calibrated_sum) = if decode {
        let iso = timed.isolation_us * steps;
        let each = timed.isolation_node_us.len() == node_us.len();
        let r = crate::isolation::remove_isolation(
            &node_us,
            &index.working,
            &|i| {
                if each {
                    timed.isolation_node_us[i] as f64 * steps
                } else {
                    iso
                }
            },
            wall * 1e3,
        );
        (r.times_us, r.calibrated_sum_us)
    } else {
        (node_us, raw_sum)
    };
    let mut corrected_sum = 0f64;
    for (i, &c) in times.iter().enumerate() {
        corrected_sum += c;
        band_us[index.band[i] as usize] += c;
        if let Some(k) = kind_us.get_mut(index.kind[i] as usize) {
            *k += c;
        }
    }
    let per_token = |us: f64| {
        if corrected_sum > 0.0 {
            us / corrected_sum * wall / tokens
        } else {
            0.0
        }
    };
    CycleValues {
        fused_ms: wall,
        timed_sum_ms: raw_sum / 1e3,
        agreement: raw_sum / 1e3 / wall - 1.0,
        agreement_corrected: calibrated_sum / 1e3 / wall - 1.0,
        coverage: if corrected_sum > 0.0 {
            1.0 - band_us[nb] / corrected_sum
        } else {
            0.0
        },
        band: band_us[..nb].iter().map(|&u| per_token(u)).collect(),
        kinds: kind_us.iter().map(|&u| per_token(u)).collect(),
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_unstable_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Per depth, every cycle's paired values (cycles measured in both modes).
type DepthCycles = BTreeMap<u32, Vec<CycleValues>>;

/// A phase's paired values per depth, its (FUSED, TIMED) record counts per chunk, and the pairs
/// that computed different logits.
type PhaseData = (DepthCycles, BTreeMap<u32, (u32, u32)>, Mismatches);

/// The larger of two NMSEs, NaN where either is (a row that was not finite).
fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// FUSED/TIMED pairs whose output hashes differed: those whose logits were compared (with the
/// largest NMSE, NaN where a row was not finite) and those that were not.
#[derive(Debug, Clone, Copy, Default)]
struct Mismatches {
    compared: u32,
    max_nmse: f64,
    uncompared: u32,
}

impl Mismatches {
    fn add(&mut self, nmse: Option<f64>) {
        match nmse {
            Some(n) => {
                self.max_nmse = nan_max(self.max_nmse, n);
                self.compared += 1;
            }
            None => self.uncompared += 1,
        }
    }

    fn merge(self, o: Mismatches) -> Mismatches {
        Mismatches {
            compared: self.compared + o.compared,
            max_nmse: nan_max(self.max_nmse, o.max_nmse),
            uncompared: self.uncompared + o.uncompared,
        }
    }

    fn total(&self) -> u32 {
        self.compared + self.uncompared
    }
}

fn collect_phase(
    index: &SweepIndex,
    graph_len: usize,
    records: &[ChunkRecord],
    phase: Phase,
    tokens: f64,
    steps: f64,
) -> Result<PhaseData, SweepError> {
    let mut fused: BTreeMap<(u32, u32), &ChunkRecord> = BTreeMap::new();
    let mut timed: BTreeMap<(u32, u32), &ChunkRecord> = BTreeMap::new();
    let mut counts: BTreeMap<u32, (u32, u32)> = BTreeMap::new();
    for r in records.iter().filter(|r| r.phase == phase) {
        match r.mode {
            Mode::Fused => {
                fused.insert((r.chunk, r.cycle), r);
                counts.entry(r.chunk).or_default().0 += 1;
            }
            Mode::Timed => {
                if r.node_us.len() != graph_len {
                    return Err(SweepError::BadRecord {
                        what: ChunkRecord::file_name(r.cycle, r.mode, r.chunk, r.phase),
                        why: format!("{} nodes, the graph has {graph_len}", r.node_us.len()),
                    });
                }
                timed.insert((r.chunk, r.cycle), r);
                counts.entry(r.chunk).or_default().1 += 1;
            }
            Mode::FusedObserved => {}
        }
    }
    let mut by_depth: DepthCycles = BTreeMap::new();
    let mut mismatched = Mismatches::default();
    for (key, f) in &fused {
        if let Some(t) = timed.get(key) {
            if f.output_hash != 0 && t.output_hash != 0 && f.output_hash != t.output_hash {
                mismatched.add(f.outputs_nmse.or(t.outputs_nmse));
            }
            by_depth.entry(key.0).or_default().push(cycle_values(
                index,
                f,
                t,
                tokens,
                steps,
                phase == Phase::Decode,
            ));
        }
    }
    Ok((by_depth, counts, mismatched))
}

/// The check "outputs": at every depth FUSED and TIMED bit-identical, or, where the graph runs
/// on a device other than the CPU, every differing pair's logits within
/// [`crate::profile::DEVICE_MODES_MAX_NMSE`] of each other, the bound and its reason stated.
fn outputs_check(graph: &[NodeInfo], m: Mismatches) -> Check {
    let check = |status, detail| Check {
        name: "outputs".into(),
        status,
        detail,
    };
    if m.total() == 0 {
        return check(
            CheckStatus::Pass,
            "at every depth FUSED and TIMED computed bit-identical logits from the same state"
                .into(),
        );
    }
    let devices = crate::split::off_cpu_devices(graph);
    if devices.is_empty() || m.uncompared > 0 {
        return check(
            CheckStatus::Fail,
            format!(
                "{} paired units computed different logits in FUSED and TIMED{}: the two passes \
                 did not hold the same state",
                m.total(),
                if m.compared > 0 {
                    format!(" (NMSE up to {:.2e})", m.max_nmse)
                } else {
                    String::new()
                }
            ),
        );
    }
    crate::profile::within_device_bound(
        &format!(
            "{} paired units differ, NMSE up to {:.2e}",
            m.compared, m.max_nmse
        ),
        m.max_nmse,
        &devices,
    )
}

/// The rows of one phase from its per-depth cycles.
fn rows_of(
    cfg: &SweepConfig,
    phase: Phase,
    by_depth: &DepthCycles,
    counts: &BTreeMap<u32, (u32, u32)>,
    tokens: f64,
    nb: usize,
    nk: usize,
) -> Vec<DepthRow> {
    let mut rows = Vec::new();
    for (&chunk, cycles) in by_depth {
        let col = |f: &dyn Fn(&CycleValues) -> f64| -> Vec<f64> { cycles.iter().map(f).collect() };
        let stats = |mut v: Vec<f64>| -> (f64, f64, f64) {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            (median(&mut v), lo, hi)
        };
        let (fused, fmin, fmax) = stats(col(&|c| c.fused_ms));
        let bands: Vec<(f64, f64, f64)> = (0..nb).map(|b| stats(col(&|c| c.band[b]))).collect();
        let (n_f, n_t) = counts.get(&chunk).copied().unwrap_or((0, 0));
        rows.push(DepthRow {
            chunk,
            depth: match phase {
                Phase::Prefill => cfg.depth_of(chunk),
                Phase::Decode => cfg.decode_depth_of(chunk),
            },
            fused_cycles: n_f,
            timed_cycles: n_t,
            fused_ms: fused,
            fused_ms_min: fmin,
            fused_ms_max: fmax,
            tok_per_s: tokens / fused * 1e3,
            timed_sum_ms: stats(col(&|c| c.timed_sum_ms)).0,
            agreement: stats(col(&|c| c.agreement)).0,
            agreement_corrected: stats(col(&|c| c.agreement_corrected)).0,
            coverage: stats(col(&|c| c.coverage)).1,
            ms_per_token: bands.iter().map(|b| b.0).collect(),
            ms_per_token_min: bands.iter().map(|b| b.1).collect(),
            ms_per_token_max: bands.iter().map(|b| b.2).collect(),
            attention_by_kind: (0..nk).map(|k| stats(col(&|c| c.kinds[k])).0).collect(),
        });
    }
    rows
}

/// Summarises stored records (see the module docs).
pub fn summarise_sweep(
    cfg: &SweepConfig,
    rules: &BandRules,
    graph: &[NodeInfo],
    index: &SweepIndex,
    records: &[ChunkRecord],
    passes: &[PassLog],
) -> Result<SweepSummary, SweepError> {
    summarise_sweep_with_decode(cfg, rules, graph, index, None, records, passes)
}

/// [`summarise_sweep`] with the decode graph's index where the sweep decoded.
pub fn summarise_sweep_with_decode(
    cfg: &SweepConfig,
    rules: &BandRules,
    graph: &[NodeInfo],
    index: &SweepIndex,
    decode: Option<(&[NodeInfo], &SweepIndex)>,
    records: &[ChunkRecord],
    passes: &[PassLog],
) -> Result<SweepSummary, SweepError> {
    let _ = rules; // the index carries what the summary needs of them
    let bands = index.bands.clone();
    let tok = cfg.work.chunk_tokens.max(1) as f64;
    let (by_depth, counts, mismatched) =
        collect_phase(index, graph.len(), records, Phase::Prefill, tok, 1.0)?;
    let rows = rows_of(
        cfg,
        Phase::Prefill,
        &by_depth,
        &counts,
        tok,
        bands.len(),
        index.kinds.len(),
    );
    if rows.is_empty() {
        return Err(SweepError::Empty);
    }
    let prefill = phase_summary(
        index,
        &by_depth,
        rows,
        cfg.work.chunk_tokens,
        (0, 1),
        cfg.max_depth(),
    )?;
    let mut decode_summary = None;
    let mut decode_mismatched = Mismatches::default();
    if let (Some(d), Some((dgraph, dindex))) = (cfg.decode, decode) {
        let dtok = (d.steps * d.parallel.max(1)).max(1) as f64;
        let (by_depth, counts, mm) = collect_phase(
            dindex,
            dgraph.len(),
            records,
            Phase::Decode,
            dtok,
            d.steps.max(1) as f64,
        )?;
        decode_mismatched = mm;
        let rows = rows_of(
            cfg,
            Phase::Decode,
            &by_depth,
            &counts,
            dtok,
            dindex.bands.len(),
            dindex.kinds.len(),
        );
        if !rows.is_empty() {
            decode_summary = Some(phase_summary(
                dindex,
                &by_depth,
                rows,
                dtok as u32,
                (d.steps, d.parallel),
                // the decode steps after the last chunk start a chunk deeper than it
                cfg.decode_depth_of(cfg.chunks.saturating_sub(1)),
            )?);
        }
    }
    let min_coverage = prefill
        .depths
        .iter()
        .chain(decode_summary.iter().flat_map(|d| d.depths.iter()))
        .map(|d| d.coverage)
        .fold(f64::INFINITY, f64::min);
    let cost = sweep_cost(records, passes, cfg.cycles);
    let per_chunk_complete = |rows: &[DepthRow]| {
        rows.iter()
            .filter(|d| d.fused_cycles == cfg.cycles && d.timed_cycles == cfg.cycles)
            .count()
    };
    let complete_prefill = per_chunk_complete(&prefill.depths);
    let complete_decode = decode_summary
        .as_ref()
        .map(|d| per_chunk_complete(&d.depths));
    let complete = complete_prefill == cfg.chunks as usize
        && complete_decode.is_none_or(|n| n == cfg.chunks as usize);
    let mut checks = vec![Check {
        name: "coverage".into(),
        status: if min_coverage >= 1.0
            && index.band.iter().all(|&b| (b as usize) < index.bands.len())
        {
            CheckStatus::Pass
        } else {
            CheckStatus::Fail
        },
        detail: format!(
            "lowest coverage across depths {:.2} %",
            min_coverage * 100.0
        ),
    }];
    // a graph split over RPC: the prefill rows keep the round trips of the remote nodes
    let split = graph
        .iter()
        .any(|n| n.device.as_deref().is_some_and(crate::split::is_remote));
    let mut agreement_detail = format!(
        "prefill{}: mean |sum TIMED / FUSED - 1| across depths {:.2} %, worst {} (goal ≤ {:.0} %)",
        if split {
            " (raw, round trips to the RPC servers included)"
        } else {
            ""
        },
        prefill.mean_abs_agreement * 100.0,
        worst_text(prefill.worst_agreement),
        AGREEMENT_GOAL * 100.0
    );
    let mut agreement_ok = prefill.mean_abs_agreement <= AGREEMENT_GOAL;
    if let Some(d) = &decode_summary {
        agreement_detail.push_str(&format!(
            "; decode: {:.2} % after removing the isolation cost ({:.2} % raw)",
            d.mean_abs_agreement_corrected * 100.0,
            d.mean_abs_agreement * 100.0
        ));
        agreement_ok &= d.mean_abs_agreement_corrected <= AGREEMENT_GOAL;
    }
    checks.push(Check {
        name: "agreement".into(),
        status: if agreement_ok {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: agreement_detail,
    });
    checks.push(outputs_check(graph, mismatched.merge(decode_mismatched)));
    checks.push(Check {
        name: "complete".into(),
        status: if complete {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: format!(
            "{complete_prefill} of {} depths measured by every cycle of both modes{}",
            cfg.chunks,
            complete_decode
                .map(|n| format!(" ({n} with their decode steps)"))
                .unwrap_or_default()
        ),
    });
    if split {
        checks.push(Check {
            name: "split shares".into(),
            status: CheckStatus::Warn,
            detail: SPLIT_RAW_NOTE.into(),
        });
    }
    let noisy: u32 = passes.iter().map(|p| p.noisy_chunks).sum();
    checks.push(Check {
        name: "noise".into(),
        status: if noisy == 0 {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: format!(
            "{noisy} units measured while the busiest other process used more than {:.0} % of one CPU, or all others more than that share of the machine",
            crate::noise::DEFAULT_MAX_OTHERS * 100.0
        ),
    });
    if let Some(att) = index
        .attention_band
        .as_ref()
        .and_then(|a| prefill.fits.iter().find(|f| &f.band == a))
    {
        checks.push(Check {
            name: "attention fit".into(),
            status: if att.fit.r2 >= 0.9 || att.flat {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "{}: R² {:.4}, slope {:.3e} ms/token per token of depth",
                att.band, att.fit.r2, att.fit.b
            ),
        });
    }
    Ok(SweepSummary {
        schema_version: SWEEP_SCHEMA_VERSION,
        tokens: cfg.work.chunk_tokens,
        chunks: cfg.chunks,
        max_depth: cfg.max_depth(),
        cycles: cfg.cycles,
        depth_axis: format!(
            "depth = the tokens already in the context when a chunk starts (the chunk's own \
             tokens attend to depth + 1 .. depth + {} positions, {} more than depth on \
             average){}",
            cfg.work.chunk_tokens,
            (cfg.work.chunk_tokens as f64 + 1.0) / 2.0,
            if decode_summary.is_some() {
                "; decode rows: the tokens in the context when the first step starts"
            } else {
                ""
            }
        ),
        bands,
        depths: prefill.depths,
        fits: prefill.fits,
        crossover: prefill.crossover,
        attention_kinds: prefill.attention_kinds,
        mean_abs_agreement: prefill.mean_abs_agreement,
        worst_agreement: prefill.worst_agreement,
        decode: decode_summary,
        min_coverage,
        cost,
        checks,
        prefill_raw_split: split,
    })
}

fn worst_text(w: Option<(u32, f64)>) -> String {
    match w {
        Some((d, a)) => format!("{:+.1} % at depth {d}", a * 100.0),
        None => "-".into(),
    }
}

/// Fits, attention by kind and the crossover of one phase; `max_depth` is the phase's deepest
/// depth (its crossover is searched up to it, and beyond it is extrapolated).
fn phase_summary(
    index: &SweepIndex,
    by_depth: &DepthCycles,
    rows: Vec<DepthRow>,
    tokens: u32,
    (steps, parallel): (u32, u32),
    max_depth: u32,
) -> Result<PhaseSummary, SweepError> {
    let x: Vec<f64> = rows.iter().map(|d| d.depth as f64).collect();
    let mut fits = Vec::new();
    if rows.len() >= 2 {
        for (b, band) in index.bands.iter().enumerate() {
            let y: Vec<f64> = rows.iter().map(|d| d.ms_per_token[b]).collect();
            if let Some(f) = band_fit(band, &x, &y)? {
                fits.push(f);
            }
        }
    }
    let attention_kinds = index
        .kinds
        .iter()
        .enumerate()
        .map(|(k, &(kind, window, layers))| kind_series(&rows, k, kind, window, layers))
        .collect::<Result<Vec<_>, SweepError>>()?;
    let crossover = crossover_of(index, by_depth, &rows, &fits, max_depth);
    let n = rows.len() as f64;
    let mean_abs = rows.iter().map(|d| d.agreement.abs()).sum::<f64>() / n;
    let mean_abs_corrected = rows
        .iter()
        .map(|d| d.agreement_corrected.abs())
        .sum::<f64>()
        / n;
    let worst = rows
        .iter()
        .max_by(|a, b| a.agreement.abs().total_cmp(&b.agreement.abs()))
        .map(|d| (d.depth, d.agreement));
    Ok(PhaseSummary {
        tokens,
        steps,
        parallel,
        bands: index.bands.clone(),
        depths: rows,
        fits,
        crossover,
        attention_kinds,
        mean_abs_agreement: mean_abs,
        mean_abs_agreement_corrected: mean_abs_corrected,
        worst_agreement: worst,
        raw_split: false,
    })
}

fn kind_series(
    rows: &[DepthRow],
    k: usize,
    kind: LayerKind,
    window: Option<u32>,
    layers: u32,
) -> Result<KindSeries, SweepError> {
    // sliding layers: fit where the window is full, from the first depth at or past it
    let from = match (kind, window) {
        (LayerKind::SlidingWindow, Some(w)) => w,
        _ => 0,
    };
    let (xs, ys): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter(|d| d.depth >= from)
        .map(|d| (d.depth as f64, d.attention_by_kind[k]))
        .unzip();
    let name = match window {
        Some(w) => format!("attention ({}, window {w})", kind.as_str()),
        None => format!("attention ({})", kind.as_str()),
    };
    let fit = if xs.len() >= 2 {
        band_fit(&name, &xs, &ys)?
    } else {
        None
    };
    let layers_word = if layers == 1 { "layer" } else { "layers" };
    let text = match (&fit, kind) {
        (None, _) => {
            format!("{name}, {layers} {layers_word}: fewer than 2 depths from {from} on, no fit")
        }
        (Some(f), LayerKind::SlidingWindow) => format!(
            "{name}, {layers} {layers_word}: {} past the window ({:+.3e} ms/token per token of \
             depth from depth {from}, change {:.1} % of its mean)",
            if f.flat { "flat" } else { "still growing" },
            f.fit.b,
            f.change * 100.0
        ),
        (Some(f), _) => format!(
            "{name}, {layers} {layers_word}: {} ({:+.3e} ms/token per token of depth, R² {:.3})",
            if f.flat { "flat" } else { "grows" },
            f.fit.b,
            f.fit.r2
        ),
    };
    Ok(KindSeries {
        kind,
        window,
        layers,
        fit,
        fit_from_depth: from,
        text,
    })
}

/// A band's line against depth, flagged flat when its fitted change is small or its slope not
/// significant; `None` where the points admit no fit.
fn band_fit(band: &str, x: &[f64], y: &[f64]) -> Result<Option<BandFit>, SweepError> {
    let Ok(fit) = linear_fit(x, y) else {
        return Ok(None);
    };
    let span = x.last().copied().unwrap_or(0.0) - x.first().copied().unwrap_or(0.0);
    let s = Sample::new(y).map_err(|_| SweepError::Empty)?;
    let mean = s.mean();
    let change = if mean != 0.0 {
        (fit.b * span / mean).abs()
    } else {
        0.0
    };
    let insignificant = fit.n > 2 && fit.b.abs() <= SLOPE_SIGMAS * fit.se_b;
    Ok(Some(BandFit {
        band: band.to_string(),
        fit,
        mean_ms_per_token: mean,
        cv: s.cv(),
        change,
        flat: change <= FLAT_CHANGE || insignificant,
    }))
}

/// Resamples of the crossover's bootstrap.
const BOOTSTRAP_RESAMPLES: u32 = 2000;

/// Where two lines cross, when the first rises faster.
fn cross(a: &LinearFit, f: &LinearFit) -> Option<f64> {
    let db = a.b - f.b;
    if db <= 0.0 {
        return None;
    }
    Some((f.a - a.a) / db)
}

/// The crossover of the attention band and the FFN band: the crossing of their fitted lines,
/// with its uncertainty from a bootstrap of the whole pipeline that keeps what the two bands
/// share: each resample draws cycles with replacement (each cycle keeps its paired FUSED and
/// TIMED runs, so both bands of a depth come from the same runs) and moving blocks of
/// neighbouring depths (host noise drifts over minutes and is shared by neighbours), recomputes
/// the per-depth medians and both fits on the same draw, and crosses them.
fn crossover_of(
    index: &SweepIndex,
    by_depth: &DepthCycles,
    rows: &[DepthRow],
    fits: &[BandFit],
    max_depth: u32,
) -> Option<Crossover> {
    let att = index.attention_band.as_ref()?;
    let ffn = index.ffn_band.as_ref()?;
    let ai = index.bands.iter().position(|b| b == att)?;
    let fi = index.bands.iter().position(|b| b == ffn)?;
    let fa = fits.iter().find(|f| &f.band == att)?;
    let ff = fits.iter().find(|f| &f.band == ffn)?;
    let first_measured_depth = rows
        .iter()
        .find(|d| d.ms_per_token[ai] >= d.ms_per_token[fi])
        .map(|d| d.depth);
    // the bootstrap
    let depths: Vec<(f64, &Vec<CycleValues>)> = rows
        .iter()
        .filter_map(|r| by_depth.get(&r.chunk).map(|c| (r.depth as f64, c)))
        .collect();
    let n = depths.len();
    let block = ((n as f64).cbrt().ceil() as usize).clamp(1, n.max(1));
    let mut rng = 0x5EED_C205_u64;
    let mut next = |m: usize| -> usize {
        rng = crate::tokens::splitmix64(rng);
        (rng % m.max(1) as u64) as usize
    };
    let mut crossings = Vec::with_capacity(BOOTSTRAP_RESAMPLES as usize);
    let mut without = 0u32;
    for _ in 0..BOOTSTRAP_RESAMPLES {
        let mut xs = Vec::with_capacity(n);
        let mut ya = Vec::with_capacity(n);
        let mut yf = Vec::with_capacity(n);
        while xs.len() < n {
            let start = next(n.saturating_sub(block) + 1);
            for (x, cycles) in depths.iter().skip(start).take(block) {
                if xs.len() == n {
                    break;
                }
                let draw: Vec<usize> = (0..cycles.len()).map(|_| next(cycles.len())).collect();
                let mut a: Vec<f64> = draw.iter().map(|&c| cycles[c].band[ai]).collect();
                let mut f: Vec<f64> = draw.iter().map(|&c| cycles[c].band[fi]).collect();
                xs.push(*x);
                ya.push(median(&mut a));
                yf.push(median(&mut f));
            }
        }
        match (linear_fit(&xs, &ya), linear_fit(&xs, &yf)) {
            (Ok(la), Ok(lf)) => match cross(&la, &lf) {
                Some(c) if c.is_finite() => crossings.push(c),
                _ => without += 1,
            },
            _ => without += 1,
        }
    }
    let without_share = without as f64 / BOOTSTRAP_RESAMPLES as f64;
    let (sigma, interval) = if crossings.len() >= 20 {
        let m = crossings.iter().sum::<f64>() / crossings.len() as f64;
        let var =
            crossings.iter().map(|c| (c - m).powi(2)).sum::<f64>() / (crossings.len() - 1) as f64;
        crossings.sort_unstable_by(f64::total_cmp);
        let q = |p: f64| crossings[((crossings.len() - 1) as f64 * p).round() as usize];
        (Some(var.sqrt()), Some((q(0.025), q(0.975))))
    } else {
        (None, None)
    };
    let (status, depth) = if fa.fit.a >= ff.fit.a {
        ("from_start", None)
    } else {
        match cross(&fa.fit, &ff.fit) {
            Some(x) if x >= 0.0 && x <= max_depth as f64 => ("within", Some(x)),
            Some(x) if x > max_depth as f64 => ("beyond", Some(x)),
            _ => ("never", None),
        }
    };
    let range = match interval {
        Some((lo, hi)) if without_share <= 0.025 => format!(
            " (95 % interval {lo:.0}–{hi:.0} from a bootstrap over cycles and blocks of depths)"
        ),
        Some((lo, _)) => format!(
            " (from {lo:.0} on; in {:.0} % of the bootstrap resamples the lines do not cross)",
            without_share * 100.0
        ),
        None => " (the bootstrap resamples rarely cross: no interval)".into(),
    };
    let text = match status {
        "within" => format!(
            "{att} overtakes {ffn} at depth {:.0}{range}, first measured at {}",
            depth.unwrap_or(0.0),
            first_measured_depth
                .map(|d| d.to_string())
                .unwrap_or_else(|| "none".into())
        ),
        "beyond" => format!(
            "no crossover up to {max_depth} tokens; the fits would cross at {:.0}{range} \
             (extrapolated)",
            depth.unwrap_or(0.0)
        ),
        "from_start" => format!("{att} costs at least as much as {ffn} from depth 0"),
        _ => {
            format!("no crossover up to {max_depth} tokens: {att} does not grow faster than {ffn}")
        }
    };
    Some(Crossover {
        attention_band: att.clone(),
        ffn_band: ffn.clone(),
        status: status.into(),
        depth,
        sigma: if depth.is_some() { sigma } else { None },
        interval: if depth.is_some() { interval } else { None },
        resamples_without_crossing: without_share,
        first_measured_depth,
        text,
    })
}

fn sweep_cost(records: &[ChunkRecord], passes: &[PassLog], cycles: u32) -> Option<SweepCost> {
    let mut cycle_s = Vec::new();
    let mut plain_s = Vec::new();
    for c in 0..cycles {
        let both: Vec<&PassLog> = passes.iter().filter(|p| p.cycle == c).collect();
        // only cycles whose two modes ran whole in one go say what a cycle costs
        if both.len() != 2 || both.iter().any(|p| p.first_chunk != 0) {
            continue;
        }
        cycle_s.push(both.iter().map(|p| p.total_ms).sum::<f64>() / 1e3);
        plain_s.push(
            records
                .iter()
                .filter(|r| r.cycle == c && r.mode == Mode::Fused && r.phase == Phase::Prefill)
                .map(|r| r.wall_ms)
                .sum::<f64>()
                / 1e3,
        );
    }
    let cycle = Sample::new(&cycle_s).ok()?.median();
    let plain = Sample::new(&plain_s).ok()?.median();
    Some(SweepCost {
        cycle_s: cycle,
        plain_prefill_s: plain,
        ratio: cycle / plain,
    })
}
