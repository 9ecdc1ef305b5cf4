//! The per-node profile of one chunk: the measurement loop (FUSED, FUSED with the instrument,
//! TIMED, interleaved per cycle) and the pure summary (band ms/token = TIMED share x FUSED wall /
//! tokens, agreement, coverage, overhead, checks).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::{Assignment, AuditFinding, BandRules, UNASSIGNED};
use crate::engine::{Engine, EngineError, Mode, Work};
use crate::node::NodeInfo;
use crate::stats::{Sample, Spread};

/// Version of `raw.json` and `summary.json`; bumped on any incompatible change.
pub const PROFILE_SCHEMA_VERSION: u32 = 1;

/// Agreement (|sum TIMED / FUSED - 1|) beyond which the share method is not trusted.
pub const AGREEMENT_GOAL: f64 = 0.03;
/// Instrument overhead (FUSED with callback / without) beyond which FUSED-with-callback is not
/// native speed.
pub const OVERHEAD_GOAL: f64 = 1.01;

/// How to profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileConfig {
    pub work: Work,
    /// Measured cycles; each runs FUSED, FUSED with the instrument and TIMED once.
    pub cycles: u32,
    /// Unmeasured cycles first (allocations, weight repacking, caches).
    pub warmup: u32,
    /// Extra interleaved (FUSED, FUSED with the instrument) pairs after the cycles, for a
    /// tighter overhead estimate on a noisy machine.
    #[serde(default)]
    pub overhead_pairs: u32,
    /// The noise gate around every run.
    #[serde(default)]
    pub gate: crate::noise::GateConfig,
}

/// One measured cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleRecord {
    /// The order the three runs took in this cycle (rotated from cycle to cycle).
    pub order: Vec<Mode>,
    pub fused_ms: f64,
    pub fused_observed_ms: f64,
    /// Wall of the TIMED run (node times plus what lies between nodes).
    pub timed_wall_ms: f64,
    /// Per-node microseconds of the TIMED run, in graph order.
    pub node_us: Vec<f64>,
    /// The engine's calibration of the isolation cost, µs per node per step, taken in this
    /// cycle right after the TIMED run: on average over the working nodes, and per node of the
    /// graph where the engine measures it node by node (empty: the average for every node).
    #[serde(default)]
    pub isolation_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolation_node_us: Vec<f64>,
}

/// Everything measured, as stored in a run folder's `raw.json`; the summary is a pure function
/// of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileRaw {
    pub schema_version: u32,
    pub config: ProfileConfig,
    pub graph: Vec<NodeInfo>,
    pub cycles: Vec<CycleRecord>,
    /// Distinct output hashes seen per mode (one each when every run computed the same logits).
    pub output_hashes: BTreeMap<String, Vec<String>>,
    /// The extra overhead pairs: (FUSED ms, FUSED-with-instrument ms).
    #[serde(default)]
    pub overhead_pairs: Vec<(f64, f64)>,
    /// What the noise gate rejected and kept.
    #[serde(default)]
    pub gate: crate::noise::GateStats,
    /// Every run's logits were checked finite (the engine fails a run whose logits are NaN or
    /// infinite, and the measurement stops there); false in files written before the check.
    #[serde(default)]
    pub outputs_checked_finite: bool,
    /// Decode steps each node's TIMED time sums: every step of the run where the graph is one
    /// step's (llama.cpp), 1 where the graph lists every step's nodes (candle, see
    /// [`Engine::graph_lists_every_step`]) and for a prefill chunk. `None` in runs stored before
    /// it was recorded: every step of the run.
    #[serde(default)]
    pub node_steps: Option<u32>,
}

impl ProfileRaw {
    /// Reads a run's `raw.json`, refusing a newer or unknown schema version.
    pub fn read(path: &std::path::Path) -> Result<ProfileRaw, crate::run_folder::RunFolderError> {
        crate::run_folder::read_versioned(path, PROFILE_SCHEMA_VERSION)
    }

    /// Decode steps each node's TIMED time sums (1 for a prefill chunk).
    pub fn node_steps(&self) -> u32 {
        self.node_steps
            .unwrap_or(self.config.work.decode_tokens)
            .max(1)
    }
}

/// The orders cycles rotate through: FUSED and FUSED-observed stay adjacent (their ratio is the
/// overhead), and each mode takes each position.
const ORDERS: [[Mode; 3]; 4] = [
    [Mode::Fused, Mode::FusedObserved, Mode::Timed],
    [Mode::FusedObserved, Mode::Fused, Mode::Timed],
    [Mode::Timed, Mode::Fused, Mode::FusedObserved],
    [Mode::Timed, Mode::FusedObserved, Mode::Fused],
];

/// Progress of a measurement: (phase, done, total).
pub type ProgressFn<'a> = &'a mut dyn FnMut(&str, u32, u32);

/// Prepares the work, captures the graph, warms up, then measures `cycles` cycles.
pub fn measure(
    engine: &mut dyn Engine,
    cfg: &ProfileConfig,
    progress: ProgressFn<'_>,
) -> Result<ProfileRaw, EngineError> {
    measure_with(engine, cfg, progress, &mut |_| {})
}

/// [`measure`], with `on_graph` shown the captured graph before the warm-up and the measured
/// cycles (to check a band file against it, say).
pub fn measure_with(
    engine: &mut dyn Engine,
    cfg: &ProfileConfig,
    progress: ProgressFn<'_>,
    on_graph: &mut dyn FnMut(&[NodeInfo]),
) -> Result<ProfileRaw, EngineError> {
    progress("filling context", 0, 1);
    engine.prepare(&cfg.work)?;
    progress("capturing graph", 0, 1);
    let graph = engine.graph()?;
    on_graph(&graph);
    let mut hashes: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut note = |mode: Mode, h: u64| {
        let list = hashes.entry(mode.label().to_string()).or_default();
        let h = format!("{h:016x}");
        if !list.contains(&h) {
            list.push(h);
        }
    };
    for w in 0..cfg.warmup {
        progress("warm-up", w, cfg.warmup);
        for mode in ORDERS[0] {
            engine.run(mode)?;
        }
    }
    let mut gate = crate::noise::GateStats::default();
    let mut cycles = Vec::with_capacity(cfg.cycles as usize);
    for c in 0..cfg.cycles {
        progress("measuring", c, cfg.cycles);
        let order = ORDERS[c as usize % ORDERS.len()];
        let (mut fused, mut observed, mut timed) = (None, None, None);
        for mode in order {
            let r = crate::noise::gated(&cfg.gate, &mut gate, || engine.run(mode))?;
            note(mode, r.output_hash);
            match mode {
                Mode::Fused => fused = Some(r),
                Mode::FusedObserved => observed = Some(r),
                Mode::Timed => timed = Some(r),
            }
        }
        let (Some(fused), Some(observed), Some(timed)) = (fused, observed, timed) else {
            unreachable!("every order runs the three modes");
        };
        if timed.node_us.len() != graph.len() {
            return Err(EngineError::GraphChanged(format!(
                "TIMED run timed {} nodes, the graph has {}",
                timed.node_us.len(),
                graph.len()
            )));
        }
        let calibration = engine.calibrate_isolation()?;
        let isolation_us = calibration.as_ref().map(|c| c.per_node_us);
        let isolation_node_us = calibration
            .map(|c| c.each_node_us)
            .filter(|each| each.len() == graph.len())
            .unwrap_or_default();
        cycles.push(CycleRecord {
            order: order.to_vec(),
            fused_ms: fused.wall_ms,
            fused_observed_ms: observed.wall_ms,
            timed_wall_ms: timed.wall_ms,
            node_us: timed.node_us,
            isolation_us,
            isolation_node_us,
        });
    }
    let mut overhead_pairs = Vec::with_capacity(cfg.overhead_pairs as usize);
    for p in 0..cfg.overhead_pairs {
        progress("overhead pairs", p, cfg.overhead_pairs);
        let order = if p % 2 == 0 {
            [Mode::Fused, Mode::FusedObserved]
        } else {
            [Mode::FusedObserved, Mode::Fused]
        };
        let (mut fused, mut observed) = (0.0, 0.0);
        for mode in order {
            let r = crate::noise::gated(&cfg.gate, &mut gate, || engine.run(mode))?;
            note(mode, r.output_hash);
            if mode == Mode::Fused {
                fused = r.wall_ms;
            } else {
                observed = r.wall_ms;
            }
        }
        overhead_pairs.push((fused, observed));
    }
    progress("done", 1, 1);
    let node_steps = if cfg.work.is_decode() && !engine.graph_lists_every_step() {
        cfg.work.decode_tokens
    } else {
        1
    };
    Ok(ProfileRaw {
        schema_version: PROFILE_SCHEMA_VERSION,
        config: cfg.clone(),
        graph,
        cycles,
        output_hashes: hashes,
        overhead_pairs,
        gate,
        outputs_checked_finite: true,
        node_steps: Some(node_steps),
    })
}

/// One band of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandRow {
    pub band: String,
    /// The median over cycles of the per-cycle value (the band's share of that cycle's TIMED
    /// sum x that cycle's FUSED wall / tokens): one estimator for the point and its range.
    pub ms_per_token: f64,
    /// Range (min..max) of the same per-cycle values.
    pub ms_per_token_min: f64,
    pub ms_per_token_max: f64,
    /// This band's ms/token over the sum of every band's (the shares add up to 1).
    pub share: f64,
    /// Nodes in the band, views included.
    pub nodes: u32,
    /// Nodes in the band that do work (views and nodes the backend skips excluded).
    pub working_nodes: u32,
    /// The band's median over cycles of its TIMED milliseconds for the whole chunk.
    pub timed_ms: f64,
    /// The same estimator after removing the isolation cost (see
    /// [`ProfileSummary::isolation_us`]) from every node: what matters in decode, where a node's
    /// work is small beside its isolation; `share_corrected` is its share of the corrected sum.
    pub ms_per_token_corrected: f64,
    pub share_corrected: f64,
}

/// Nodes of one band grouped by name token, for listing what a band holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NameRow {
    pub name: String,
    pub ops: Vec<String>,
    pub nodes: u32,
    pub ms_per_token: f64,
}

/// Status of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    /// Outside a goal: the numbers stand but deserve caution.
    Warn,
    /// A result that must not be trusted.
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
}

/// The summary of a profile (`summary.json`). Scripts rely on the top-level fields `coverage`,
/// `agreement`, `overhead`, `fused_ms`, `tokens` and `bands`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileSummary {
    pub schema_version: u32,
    /// Tokens in the measured chunk.
    pub tokens: u32,
    pub depth_tokens: u32,
    /// Which logits were requested: `last` (as llama-bench) or `all`.
    pub logits: String,
    pub cycles: u32,
    /// Median FUSED wall of the chunk, no instrument.
    pub fused_ms: f64,
    pub fused_ms_spread: Spread,
    pub tok_per_s: f64,
    /// Median sum of TIMED node times.
    pub timed_sum_ms: f64,
    pub timed_wall_ms: f64,
    /// Median over cycles of (sum TIMED / FUSED - 1).
    pub agreement: f64,
    pub agreement_spread: Spread,
    /// What isolating one node costs in TIMED mode (thread-pool wake-up, synchronisation,
    /// callback), measured, not assumed, per node and per run (a decode run sums its steps):
    /// the engine's calibration graph of trivial nodes where it has one, else the graph's own
    /// nodes that do no work.
    pub isolation_us: f64,
    /// The same per decode step (equal to `isolation_us` for a prefill chunk).
    pub isolation_us_per_step: f64,
    /// Decode steps each node's TIMED time sums (see [`ProfileRaw::node_steps`]).
    #[serde(default = "one")]
    pub node_steps: u32,
    /// `calibration, node by node`, `calibration` or `idle nodes`.
    pub isolation_source: String,
    /// The estimate from the graph's nodes that do no work (views, skipped nodes), per node per
    /// run: a lower bound, since a view is not dispatched to the thread pool.
    pub isolation_idle_us: f64,
    /// Nodes that do no work, the idle estimate's sample.
    pub isolation_nodes: u32,
    /// Agreement after removing the calibrated isolation cost from every node.
    pub agreement_corrected: f64,
    /// Decode: what the calibration left unexplained, µs per working node per step (median
    /// over cycles), taken equally from every working node for the corrected columns, so they
    /// sum to the FUSED wall (see [`crate::isolation`]); negative where the calibration took too
    /// much. 0 for a prefill chunk, whose corrected columns remove the calibration only.
    #[serde(default)]
    pub isolation_remainder_us: f64,
    /// Generated tokens per sequence in decode mode (0: a prefill chunk), and sequences.
    pub decode_tokens: u32,
    pub parallel: u32,
    /// 1 - the `unassigned` band's ms/token over the sum of every band's: the share of the TIMED
    /// time that landed in a band.
    pub coverage: f64,
    /// Median over interleaved pairs (one per cycle, plus any extra pairs) of
    /// FUSED-with-instrument / FUSED.
    pub overhead: f64,
    pub overhead_spread: Spread,
    /// The same two ratios from the fastest run of each mode (min TIMED sum / min FUSED - 1,
    /// min FUSED-with-instrument / min FUSED): on a machine whose speed drifts, the least
    /// disturbed runs, as a cross-check of the medians.
    pub agreement_of_minimums: f64,
    pub overhead_of_minimums: f64,
    /// Every run of every mode computed bit-identical logits.
    pub outputs_identical: bool,
    /// The noise gate: runs kept, rejected and retaken, kept although still noisy.
    pub noise_gate: crate::noise::GateStats,
    pub nodes: u32,
    pub view_nodes: u32,
    pub bands: Vec<BandRow>,
    /// What the `other` band holds.
    pub other: Vec<NameRow>,
    /// Nodes no rule matched (coverage below 100 % lists them here).
    pub unassigned: Vec<NameRow>,
    pub audit: Vec<AuditFinding>,
    pub checks: Vec<Check>,
}

#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("the profile has no measured cycle")]
    NoCycles,
    #[error("cycle {cycle} timed {found} nodes, the graph has {expected}")]
    NodeCount {
        cycle: usize,
        found: usize,
        expected: usize,
    },
    #[error("{0} assignments for a graph of {1} nodes")]
    Assignments(usize, usize),
    #[error("a non-finite or empty measurement in {0}")]
    BadSample(String),
}

fn sample(values: &[f64], what: &str) -> Result<Sample, SummaryError> {
    Sample::new(values).map_err(|_| SummaryError::BadSample(what.to_string()))
}

/// Summarises a profile. `assignments[i]` is the band of `raw.graph[i]`.
pub fn summarise(
    raw: &ProfileRaw,
    rules: &BandRules,
    assignments: &[Assignment],
    audit: Vec<AuditFinding>,
) -> Result<ProfileSummary, SummaryError> {
    let n = raw.graph.len();
    if raw.cycles.is_empty() {
        return Err(SummaryError::NoCycles);
    }
    if assignments.len() != n {
        return Err(SummaryError::Assignments(assignments.len(), n));
    }
    for (cycle, c) in raw.cycles.iter().enumerate() {
        if c.node_us.len() != n {
            return Err(SummaryError::NodeCount {
                cycle,
                found: c.node_us.len(),
                expected: n,
            });
        }
    }
    let tokens = raw.config.work.tokens_per_run();
    let tok = tokens.max(1) as f64;

    // the isolation cost per node per run, per cycle: the engine's calibration where it has one
    // (times the steps a node's time sums), else the nodes of the graph that do no work
    let steps = raw.node_steps() as f64;
    let idle: Vec<usize> = (0..n).filter(|&i| !raw.graph[i].is_working()).collect();
    let calibrated = raw.cycles.iter().all(|c| c.isolation_us.is_some());
    let mut isolation = Vec::with_capacity(raw.cycles.len());
    let mut isolation_idle = Vec::with_capacity(raw.cycles.len());
    let mut corrected: Vec<Vec<f64>> = Vec::with_capacity(raw.cycles.len());
    let mut calibrated_sums = Vec::with_capacity(raw.cycles.len());
    let mut remainders = Vec::with_capacity(raw.cycles.len());
    let working: Vec<bool> = raw.graph.iter().map(|g| g.is_working()).collect();
    let decode = raw.config.work.is_decode();
    for c in &raw.cycles {
        let idle_us: Vec<f64> = idle.iter().map(|&i| c.node_us[i]).collect();
        let idle_iso = crate::stats::median(&idle_us).unwrap_or(0.0);
        isolation_idle.push(idle_iso);
        let iso = match c.isolation_us {
            Some(per_step) if calibrated => per_step * steps,
            _ => idle_iso,
        };
        isolation.push(iso);
        // node by node where the engine calibrated each node, else the average for every node;
        // then the remainder the calibration missed, equally from every working node
        let each = calibrated && c.isolation_node_us.len() == n;
        let removed = crate::isolation::remove_isolation(
            &c.node_us,
            &working,
            &|i| {
                if each {
                    c.isolation_node_us[i] * steps
                } else {
                    iso
                }
            },
            // decode only: a chunk's nodes are large beside their isolation, and what sets
            // its TIMED sum apart from the wall (caches, barriers) grows with the work
            if decode { c.fused_ms * 1e3 } else { 0.0 },
        );
        calibrated_sums.push(removed.calibrated_sum_us);
        remainders.push(removed.remainder_us / steps);
        corrected.push(removed.times_us);
    }
    let isolation = sample(&isolation, "isolation cost")?;
    let isolation_idle = sample(&isolation_idle, "isolation cost")?;
    let agreement_corrected = sample(
        &raw.cycles
            .iter()
            .zip(&calibrated_sums)
            .map(|(c, k)| k / 1e3 / c.fused_ms - 1.0)
            .collect::<Vec<_>>(),
        "corrected agreement",
    )?;
    let isolation_remainder = sample(&remainders, "isolation remainder")?;

    // every node's TIMED times must be finite (the per-cycle estimates below sum them)
    for i in 0..n {
        sample(
            &raw.cycles.iter().map(|c| c.node_us[i]).collect::<Vec<_>>(),
            "node times",
        )?;
    }

    let fused = sample(
        &raw.cycles.iter().map(|c| c.fused_ms).collect::<Vec<_>>(),
        "fused_ms",
    )?;
    let timed_sums: Vec<f64> = raw
        .cycles
        .iter()
        .map(|c| c.node_us.iter().sum::<f64>() / 1e3)
        .collect();
    let timed_sum = sample(&timed_sums, "timed sums")?;
    let timed_wall = sample(
        &raw.cycles
            .iter()
            .map(|c| c.timed_wall_ms)
            .collect::<Vec<_>>(),
        "timed_wall_ms",
    )?;
    let agreement = sample(
        &raw.cycles
            .iter()
            .zip(&timed_sums)
            .map(|(c, s)| s / c.fused_ms - 1.0)
            .collect::<Vec<_>>(),
        "agreement",
    )?;
    let fused_all = sample(
        &raw.cycles
            .iter()
            .map(|c| c.fused_ms)
            .chain(raw.overhead_pairs.iter().map(|(f, _)| *f))
            .collect::<Vec<_>>(),
        "fused_ms",
    )?;
    let observed_all = sample(
        &raw.cycles
            .iter()
            .map(|c| c.fused_observed_ms)
            .chain(raw.overhead_pairs.iter().map(|(_, o)| *o))
            .collect::<Vec<_>>(),
        "fused_observed_ms",
    )?;
    let overhead = sample(
        &raw.cycles
            .iter()
            .map(|c| c.fused_observed_ms / c.fused_ms)
            .chain(raw.overhead_pairs.iter().map(|(f, o)| o / f))
            .collect::<Vec<_>>(),
        "overhead",
    )?;

    // the bands the graph holds, in rule-set order, then unassigned if anything fell through
    let mut band_order: Vec<String> = rules.bands_in(assignments);
    if assignments.iter().any(|a| a.band == UNASSIGNED) {
        band_order.push(UNASSIGNED.to_string());
    }
    // One estimator for every ms/token figure: its per-cycle values (the group's share of that
    // cycle's TIMED sum x that cycle's FUSED wall / tokens), the median of them the point and
    // their min..max the range, so the point always lies in its range. A share is a figure's
    // point over the sum of the points it is a share of.
    let raw_times: Vec<&[f64]> = raw.cycles.iter().map(|c| c.node_us.as_slice()).collect();
    let corrected_times: Vec<&[f64]> = corrected.iter().map(Vec::as_slice).collect();
    let fused_walls: Vec<f64> = raw.cycles.iter().map(|c| c.fused_ms).collect();
    let estimate =
        |member: &dyn Fn(usize) -> bool, times: &[&[f64]]| -> Result<Sample, SummaryError> {
            sample(
                &per_cycle_ms_per_token(times, &fused_walls, tok, &membership(member)),
                "band times",
            )
        };
    struct Estimated {
        band: String,
        raw: Sample,
        corrected: Sample,
        timed: Sample,
    }
    let mut estimated = Vec::with_capacity(band_order.len());
    for band in &band_order {
        let member = |i: usize| assignments[i].band == *band;
        let timed: Vec<f64> = raw_times
            .iter()
            .map(|t| (0..n).filter(|&i| member(i)).map(|i| t[i]).sum::<f64>() / 1e3)
            .collect();
        estimated.push(Estimated {
            band: band.clone(),
            raw: estimate(&member, &raw_times)?,
            corrected: estimate(&member, &corrected_times)?,
            timed: sample(&timed, "band times")?,
        });
    }
    let points: f64 = estimated.iter().map(|e| e.raw.median()).sum();
    let points_corrected: f64 = estimated.iter().map(|e| e.corrected.median()).sum();
    let share = |x: f64, of: f64| if of > 0.0 { x / of } else { 0.0 };
    let mut bands = Vec::with_capacity(estimated.len());
    for e in &estimated {
        let member = |i: usize| assignments[i].band == e.band;
        bands.push(BandRow {
            band: e.band.clone(),
            ms_per_token: e.raw.median(),
            ms_per_token_min: e.raw.min(),
            ms_per_token_max: e.raw.max(),
            share: share(e.raw.median(), points),
            nodes: (0..n).filter(|&i| member(i)).count() as u32,
            working_nodes: (0..n)
                .filter(|&i| member(i) && raw.graph[i].is_working())
                .count() as u32,
            timed_ms: e.timed.median(),
            ms_per_token_corrected: e.corrected.median(),
            share_corrected: share(e.corrected.median(), points_corrected),
        });
    }
    let unassigned_ms = bands
        .iter()
        .find(|b| b.band == UNASSIGNED)
        .map_or(0.0, |b| b.ms_per_token);
    let coverage = if points > 0.0 {
        1.0 - unassigned_ms / points
    } else {
        0.0
    };

    let contents = |band: &str| -> Result<Vec<NameRow>, SummaryError> {
        let mut rows: BTreeMap<String, NameRow> = BTreeMap::new();
        for i in (0..n).filter(|&i| assignments[i].band == band) {
            let node = &raw.graph[i];
            let row = rows.entry(node.base_name().to_string()).or_insert(NameRow {
                name: node.base_name().to_string(),
                ops: Vec::new(),
                nodes: 0,
                ms_per_token: 0.0,
            });
            row.nodes += 1;
            if !row.ops.contains(&node.op) {
                row.ops.push(node.op.clone());
            }
        }
        let mut rows: Vec<NameRow> = rows.into_values().collect();
        for row in &mut rows {
            let member =
                |i: usize| assignments[i].band == band && raw.graph[i].base_name() == row.name;
            row.ms_per_token = estimate(&member, &raw_times)?.median();
        }
        rows.sort_by(|a, b| b.ms_per_token.total_cmp(&a.ms_per_token));
        Ok(rows)
    };

    let identical = raw
        .output_hashes
        .values()
        .flatten()
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        <= 1;
    let mut checks = vec![
        Check {
            name: "coverage".into(),
            status: if unassigned_ms == 0.0 && coverage >= 1.0 {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: format!(
                "{:.2} % of TIMED time is in a band ({} nodes unassigned)",
                coverage * 100.0,
                assignments.iter().filter(|a| a.band == UNASSIGNED).count()
            ),
        },
        Check {
            name: "audit".into(),
            status: if audit.is_empty() {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: if audit.is_empty() {
                "every matmul sits in a band its layer kind allows".into()
            } else {
                format!("{} matmuls in a band their layer kind forbids", audit.len())
            },
        },
        Check {
            name: "agreement".into(),
            status: if agreement.median().abs() <= AGREEMENT_GOAL {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "sum TIMED / FUSED - 1 = {:+.2} % (goal within ±{:.0} %)",
                agreement.median() * 100.0,
                AGREEMENT_GOAL * 100.0
            ),
        },
        Check {
            name: "overhead".into(),
            status: if overhead.median() <= OVERHEAD_GOAL {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "FUSED with instrument / without = {:.4} (goal ≤ {OVERHEAD_GOAL})",
                overhead.median()
            ),
        },
        Check {
            name: "outputs".into(),
            status: if identical {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: if identical {
                "every run of every mode returned bit-identical logits".into()
            } else {
                "runs returned different logits".into()
            },
        },
        Check {
            name: "finite".into(),
            status: if raw.outputs_checked_finite {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: if raw.outputs_checked_finite {
                "every run of every mode returned finite logits (a NaN or infinite logit stops the measurement, exit 3)".into()
            } else {
                "not checked: the run was recorded before logits were checked for NaN and infinity"
                    .into()
            },
        },
    ];
    checks.push(Check {
        name: "noise".into(),
        status: if raw.gate.kept_noisy == 0 {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: format!(
            "{} runs rejected and retaken because other processes used the CPUs (threshold {:.0} % of one CPU for the busiest other process, and of the machine for all others); {} kept although still noisy; in kept runs the busiest other process used up to {:.0} % of one CPU, all others up to {:.1} % of the machine",
            raw.gate.rejected,
            raw.config.gate.max_others * 100.0,
            raw.gate.kept_noisy,
            raw.gate.max_busiest_kept * 100.0,
            raw.gate.max_others_kept * 100.0
        ),
    });
    if raw.cycles.len() < 3 {
        checks.push(Check {
            name: "cycles".into(),
            status: CheckStatus::Warn,
            detail: format!(
                "{} cycle(s): medians of fewer than 3 are fragile",
                raw.cycles.len()
            ),
        });
    }

    Ok(ProfileSummary {
        schema_version: PROFILE_SCHEMA_VERSION,
        tokens,
        depth_tokens: raw.config.work.depth_tokens,
        logits: if raw.config.work.all_logits {
            "all"
        } else {
            "last"
        }
        .into(),
        cycles: raw.cycles.len() as u32,
        fused_ms: fused.median(),
        fused_ms_spread: fused.spread(),
        tok_per_s: tok / fused.median() * 1e3,
        timed_sum_ms: timed_sum.median(),
        timed_wall_ms: timed_wall.median(),
        agreement: agreement.median(),
        agreement_spread: agreement.spread(),
        isolation_us: isolation.median(),
        isolation_us_per_step: isolation.median() / steps,
        node_steps: steps as u32,
        isolation_source:
            if calibrated && raw.cycles.iter().all(|c| c.isolation_node_us.len() == n) {
                "calibration, node by node"
            } else if calibrated {
                "calibration"
            } else {
                "idle nodes"
            }
            .into(),
        isolation_idle_us: isolation_idle.median(),
        isolation_nodes: idle.len() as u32,
        agreement_corrected: agreement_corrected.median(),
        isolation_remainder_us: isolation_remainder.median(),
        decode_tokens: raw.config.work.decode_tokens,
        parallel: raw.config.work.parallel,
        coverage,
        overhead: overhead.median(),
        overhead_spread: overhead.spread(),
        agreement_of_minimums: timed_sum.min() / fused.min() - 1.0,
        overhead_of_minimums: observed_all.min() / fused_all.min(),
        outputs_identical: identical,
        noise_gate: raw.gate,
        nodes: n as u32,
        view_nodes: raw.graph.iter().filter(|g| g.is_view).count() as u32,
        bands,
        other: contents("other")?,
        unassigned: contents(UNASSIGNED)?,
        audit,
        checks,
    })
}

fn one() -> u32 {
    1
}

impl ProfileSummary {
    /// The worst status among the checks.
    pub fn worst(&self) -> CheckStatus {
        if self.checks.iter().any(|c| c.status == CheckStatus::Fail) {
            CheckStatus::Fail
        } else if self.checks.iter().any(|c| c.status == CheckStatus::Warn) {
            CheckStatus::Warn
        } else {
            CheckStatus::Pass
        }
    }

    pub fn band(&self, name: &str) -> Option<&BandRow> {
        self.bands.iter().find(|b| b.band == name)
    }
}

/// The per-cycle ms/token of a part of the graph: in cycle c, its share of that cycle's TIMED
/// sum x that cycle's FUSED wall / `tokens`, where the part holds `weight(i)` of node i (1 for a
/// member, 0 for a node outside it; a fraction for the rows of a node nobody reads). The median
/// of these is a figure's point and their min..max its range (one estimator; see
/// [`summarise`]). `times[c][i]` is node i's time in cycle c (raw, or with the isolation cost
/// removed); a cycle whose sum is 0 gives 0.
pub fn per_cycle_ms_per_token(
    times: &[&[f64]],
    fused_ms: &[f64],
    tokens: f64,
    weight: &dyn Fn(usize) -> f64,
) -> Vec<f64> {
    times
        .iter()
        .zip(fused_ms)
        .map(|(t, fused)| {
            let sum: f64 = t.iter().sum();
            if sum > 0.0 {
                let part: f64 = t.iter().enumerate().map(|(i, v)| v * weight(i)).sum();
                part / sum * fused / tokens
            } else {
                0.0
            }
        })
        .collect()
}

/// 1 for a member, 0 otherwise: the weight of a group of nodes in [`per_cycle_ms_per_token`].
pub fn membership(member: impl Fn(usize) -> bool) -> impl Fn(usize) -> f64 {
    move |i| if member(i) { 1.0 } else { 0.0 }
}

/// Categorises the graph of a stored profile and summarises it: what `profile` does after
/// measuring and what `report` does from a run folder.
pub fn analyse(
    raw: &ProfileRaw,
    rules: &BandRules,
    arch: &crate::arch::ArchInfo,
) -> Result<(Vec<Assignment>, ProfileSummary), SummaryError> {
    let cat = crate::band::Categoriser::new(rules, arch);
    let assignments = cat.categorise(&raw.graph);
    let audit = cat.audit(&raw.graph, &assignments);
    let summary = summarise(raw, rules, &assignments, audit)?;
    Ok((assignments, summary))
}

impl ProfileSummary {
    /// Adds the census check after coverage and audit.
    pub fn add_census_check(&mut self, c: &crate::census::Census) {
        let at = self.checks.len().min(2);
        self.checks.insert(at, census_check(c));
    }
}

/// The census of the graph against the architecture, as a check: a predicted count that does
/// not hold fails the run; rows nothing predicts are said to be so.
pub fn census_check(c: &crate::census::Census) -> Check {
    let bad = c.mismatches();
    let (predicted, _) = c.predicted();
    let unpredicted = c.expectations.len() - predicted;
    let not_predicted = if unpredicted > 0 {
        format!(
            "; {unpredicted} {} not predicted for {}",
            if unpredicted == 1 { "row" } else { "rows" },
            c.arch
        )
    } else {
        String::new()
    };
    Check {
        name: "census".into(),
        status: if bad.is_empty() {
            CheckStatus::Pass
        } else {
            CheckStatus::Fail
        },
        detail: if bad.is_empty() {
            format!(
                "the graph's {} working nodes hold the {predicted} op counts the architecture \
                 predicts{not_predicted}",
                c.total.working
            )
        } else {
            let items: Vec<String> = bad
                .iter()
                .map(|e| {
                    format!(
                        "{} in {}: expected {}, found {}",
                        e.op,
                        e.band,
                        e.expected.map(|x| x.to_string()).unwrap_or_default(),
                        e.found
                    )
                })
                .collect();
            format!(
                "{} of {predicted} predicted counts differ: {}{not_predicted}",
                bad.len(),
                items.join("; ")
            )
        },
    }
}

/// Per-node medians over cycles (microseconds), in graph order.
pub fn node_medians_us(raw: &ProfileRaw) -> Vec<f64> {
    (0..raw.graph.len())
        .map(|i| {
            let col: Vec<f64> = raw
                .cycles
                .iter()
                .filter_map(|c| c.node_us.get(i).copied())
                .collect();
            crate::stats::median(&col).unwrap_or(0.0)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;
    use crate::arch::ArchInfo;
    use crate::mock::{MockEngine, MockNode};

    const NODES: [MockNode; 6] = [
        ("GATED_DELTA_NET", "node_0", "", 300.0),
        ("RESHAPE", "node_0 (reshaped)", "", 0.0),
        (
            "MUL_MAT_ID",
            "ffn_moe_gate-0",
            "blk.0.ffn_gate_exps.weight",
            500.0,
        ),
        ("FLASH_ATTN_EXT", "node_3", "", 100.0),
        ("MUL_MAT", "Qcur_full-3", "blk.3.attn_q.weight", 50.0),
        ("ADD", "l_out-3", "", 50.0),
    ];

    fn cfg(cycles: u32) -> ProfileConfig {
        ProfileConfig {
            work: Work {
                chunk_tokens: 100,
                depth_tokens: 0,
                all_logits: false,
                token_seed: 0,
                decode_tokens: 0,
                parallel: 1,
            },
            cycles,
            warmup: 1,
            overhead_pairs: 2,
            gate: crate::noise::GateConfig::default(),
        }
    }

    fn run(engine: &mut MockEngine, cycles: u32) -> ProfileSummary {
        let raw = measure(engine, &cfg(cycles), &mut |_, _, _| {}).unwrap();
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        analyse(&raw, &rules, &arch).unwrap().1
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9 * b.abs().max(1.0)
    }

    #[test]
    fn band_ms_per_token_is_share_times_fused_wall_over_tokens() {
        // TIMED node costs 300/0/500/100/50/50 µs (sum 1000); FUSED = 0.9 x 1000 µs.
        let mut e = MockEngine::new(&NODES);
        e.fused_factor = 0.9;
        let s = run(&mut e, 3);
        assert!(close(s.fused_ms, 0.9));
        assert!(close(s.timed_sum_ms, 1.0));
        assert!(close(s.agreement, 1.0 / 0.9 - 1.0));
        let expect = [
            ("linear_attention", 0.3),
            ("moe", 0.5),
            ("attention", 0.1),
            ("projections", 0.05),
            ("other", 0.05),
        ];
        for (band, share) in expect {
            let row = s.band(band).unwrap();
            assert!(close(row.share, share), "{band}: {}", row.share);
            assert!(
                close(row.ms_per_token, share * 0.9 / 100.0),
                "{band}: {}",
                row.ms_per_token
            );
        }
        assert_eq!(s.band("linear_attention").unwrap().nodes, 2);
        assert_eq!(s.band("linear_attention").unwrap().working_nodes, 1);
        assert!(close(s.coverage, 1.0));
        assert!(close(s.overhead, 1.0));
        // agreement of +11 % is outside the ±3 % goal: a warning, not a failure
        let agreement = s.checks.iter().find(|c| c.name == "agreement").unwrap();
        assert_eq!(agreement.status, CheckStatus::Warn);
        assert_eq!(s.worst(), CheckStatus::Warn);
        // the six-node mock holds far fewer matmuls than a 4-layer qwen35moe: the census
        // check fails the run
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let graph = MockEngine::new(&NODES).graph;
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let mut s = s;
        s.add_census_check(&crate::census::census(&graph, &a, &arch, true));
        let census = s.checks.iter().find(|c| c.name == "census").unwrap();
        assert_eq!(census.status, CheckStatus::Fail, "{}", census.detail);
        assert_eq!(s.worst(), CheckStatus::Fail);
        assert!(s.outputs_identical);
    }

    #[test]
    fn isolation_cost_lands_in_agreement_and_views() {
        // every node, views included, pays 10 µs of isolation in TIMED mode
        let mut e = MockEngine::new(&NODES);
        e.isolation_us = 10.0;
        let s = run(&mut e, 3);
        assert!(close(s.timed_sum_ms, 1.06));
        assert!(close(s.agreement, 0.06));
        assert!(close(
            s.band("linear_attention").unwrap().share,
            320.0 / 1060.0
        ));
    }

    #[test]
    fn isolation_cost_is_measured_on_idle_nodes_and_removed() {
        // decode: 4 steps of 2 sequences = 8 tokens a run; every node pays 30 µs of isolation,
        // the view (no work) pays only that
        let mut e = MockEngine::new(&NODES);
        e.isolation_us = 30.0;
        let mut c = cfg(3);
        c.work.decode_tokens = 4;
        c.work.parallel = 2;
        let raw = measure(&mut e, &c, &mut |_, _, _| {}).unwrap();
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        assert_eq!(s.tokens, 8);
        assert_eq!(s.isolation_nodes, 1);
        assert_eq!(s.isolation_source, "idle nodes");
        // a run sums 4 steps: 4 x 30 µs a node
        assert!(close(s.isolation_us, 120.0));
        assert!(close(s.isolation_us_per_step, 30.0));
        // raw: 1000 µs of work + 6 x 30 of isolation against a FUSED wall of 1000 µs
        assert!(close(s.agreement, 0.18));
        assert!(close(s.agreement_corrected, 0.0));
        let moe = s.band("moe").unwrap();
        assert!(close(moe.share_corrected, 0.5));
        // FUSED is 4 steps x 1 ms for 8 tokens
        assert!(close(moe.ms_per_token_corrected, 0.5 * 4.0 / 8.0));
        assert!(close(moe.share, 530.0 / 1180.0));
    }

    #[test]
    fn an_engine_calibration_wins_over_idle_nodes() {
        // the engine calibrates 40 µs a node a step; idle nodes say 30 (a lower bound)
        let mut e = MockEngine::new(&NODES);
        e.isolation_us = 40.0;
        e.calibration_us = Some(40.0);
        let mut c = cfg(3);
        c.work.decode_tokens = 2;
        let raw = measure(&mut e, &c, &mut |_, _, _| {}).unwrap();
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        assert_eq!(s.isolation_source, "calibration");
        // per run = 2 steps x 40 µs, removed exactly
        assert!(close(s.isolation_us, 80.0));
        assert!(close(s.isolation_us_per_step, 40.0));
        assert!(close(s.isolation_idle_us, 80.0));
        assert!(close(s.agreement_corrected, 0.0));
        assert!(close(s.agreement, 6.0 * 40.0 / 1000.0));
    }

    /// The mock's decode as an engine whose graph lists every step's nodes one after the other
    /// (as candle's does): each node's time is one step's.
    struct EveryStep(MockEngine, u32);

    impl Engine for EveryStep {
        fn info(&self) -> crate::engine::EngineInfo {
            self.0.info()
        }
        fn prepare(&mut self, work: &Work) -> Result<(), EngineError> {
            self.1 = work.decode_tokens.max(1);
            self.0.prepare(work)
        }
        fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
            let one = self.0.graph()?;
            let n = one.len() as u32;
            Ok((0..self.1)
                .flat_map(|step| {
                    one.iter().map(move |node| {
                        let mut node = node.clone();
                        node.index += step * n;
                        node
                    })
                })
                .collect())
        }
        fn run(&mut self, mode: Mode) -> Result<crate::engine::ChunkTiming, EngineError> {
            let mut r = self.0.run(mode)?;
            let steps = self.1;
            let per_step: Vec<f64> = r.node_us.iter().map(|us| us / steps as f64).collect();
            r.node_us = (0..steps).flat_map(|_| per_step.clone()).collect();
            Ok(r)
        }
        fn isolation_cost_us(&mut self) -> Result<Option<f64>, EngineError> {
            self.0.isolation_cost_us()
        }
        fn graph_lists_every_step(&self) -> bool {
            true
        }
    }

    #[test]
    fn a_graph_of_every_decode_step_removes_the_isolation_cost_once_a_node() {
        // 2 steps listed one after the other: each node is one step and pays 40 µs once
        let mut e = MockEngine::new(&NODES);
        e.isolation_us = 40.0;
        e.calibration_us = Some(40.0);
        let mut e = EveryStep(e, 1);
        let mut c = cfg(3);
        c.work.decode_tokens = 2;
        let raw = measure(&mut e, &c, &mut |_, _, _| {}).unwrap();
        assert_eq!(raw.graph.len(), 2 * NODES.len());
        assert_eq!(raw.node_steps(), 1);
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        assert_eq!(s.node_steps, 1);
        assert!(close(s.isolation_us, 40.0));
        assert!(close(s.isolation_us_per_step, 40.0));
        assert!(close(s.agreement, 12.0 * 40.0 / 2000.0));
        assert!(close(s.agreement_corrected, 0.0));
    }

    #[test]
    fn a_node_by_node_calibration_removes_each_node_s_own_isolation() {
        // the mock's nodes cost their work plus, per step, an isolation that differs from node
        // to node (a node after a view wakes the pool: 20 µs; the others 1 µs); the engine
        // calibrated each node. Removing the average (4.8 µs) from every node keeps the total
        // but takes 3.8 µs of work a step from each cheap node and leaves the woken node 15.2 µs
        // too long.
        let mut e = MockEngine::new(&NODES);
        e.calibration_us = Some(1.0);
        let mut c = cfg(3);
        c.work.decode_tokens = 2;
        let mut raw = measure(&mut e, &c, &mut |_, _, _| {}).unwrap();
        let each: Vec<f64> = raw
            .graph
            .iter()
            .enumerate()
            .map(
                |(i, n)| match (n.is_working(), i > 0 && raw.graph[i - 1].is_view) {
                    (false, _) => 0.0,
                    (true, true) => 20.0,
                    (true, false) => 1.0,
                },
            )
            .collect();
        let working = raw.graph.iter().filter(|n| n.is_working()).count() as f64;
        for cycle in &mut raw.cycles {
            for (t, iso) in cycle.node_us.iter_mut().zip(&each) {
                *t += iso * 2.0;
            }
            cycle.isolation_us = Some(each.iter().sum::<f64>() / working);
            cycle.isolation_node_us = each.clone();
        }
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        assert_eq!(s.isolation_source, "calibration, node by node");
        assert!(
            close(s.agreement_corrected, 0.0),
            "{}",
            s.agreement_corrected
        );
        // the MoE node (after the view) is back to its 500 µs of work a step: half the work
        assert!(close(s.band("moe").unwrap().share_corrected, 0.5));
        // with the average alone
        for cycle in &mut raw.cycles {
            cycle.isolation_node_us.clear();
        }
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        assert_eq!(s.isolation_source, "calibration");
        assert!(close(s.agreement_corrected, 0.0));
        let moe = s.band("moe").unwrap().share_corrected;
        assert!(close(moe, (1000.0 + 2.0 * 15.2) / 2000.0), "{moe}");
    }

    #[test]
    fn overhead_is_the_ratio_of_fused_runs() {
        let mut e = MockEngine::new(&NODES);
        e.observed_factor = 1.02;
        let s = run(&mut e, 4);
        assert!(close(s.overhead, 1.02));
        assert!(close(s.overhead_of_minimums, 1.02));
        let c = s.checks.iter().find(|c| c.name == "overhead").unwrap();
        assert_eq!(c.status, CheckStatus::Warn);
    }

    #[test]
    fn medians_resist_one_noisy_cycle() {
        // runs per cycle: 3; the noise list cycles per run, so the third cycle (runs 9..12 of
        // warm-up 3 + cycles) sees x2 on every run
        let mut e = MockEngine::new(&NODES);
        e.noise = vec![
            1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 1.0, 1.0, 1.0,
        ];
        let s = run(&mut e, 4);
        assert!(close(s.fused_ms, 1.0), "{}", s.fused_ms);
        assert!(close(s.fused_ms_spread.max, 2.0));
        // the fastest runs are the undisturbed ones: TIMED sum 1.0 ms vs FUSED 1.0 ms
        assert!(close(s.agreement_of_minimums, 0.0));
        assert!(close(
            s.band("moe").unwrap().ms_per_token,
            0.5 * 1.0 / 100.0
        ));
    }

    #[test]
    fn an_unknown_named_node_breaks_coverage_and_is_listed() {
        let mut nodes = NODES.to_vec();
        nodes.push(("ADD", "mystery-3", "", 100.0));
        let mut e = MockEngine::new(&nodes);
        let s = run(&mut e, 3);
        assert!(close(s.coverage, 1000.0 / 1100.0));
        assert_eq!(s.unassigned.len(), 1);
        assert_eq!(s.unassigned[0].name, "mystery");
        assert_eq!(s.band(UNASSIGNED).unwrap().nodes, 1);
        assert_eq!(s.worst(), CheckStatus::Fail);
    }

    #[test]
    fn summary_json_has_the_fields_scripts_rely_on() {
        let mut e = MockEngine::new(&NODES);
        let s = run(&mut e, 3);
        let v = serde_json::to_value(&s).unwrap();
        for key in [
            "coverage",
            "agreement",
            "overhead",
            "fused_ms",
            "tokens",
            "bands",
        ] {
            assert!(v.get(key).is_some(), "missing {key}");
        }
        let band = &v["bands"][0];
        for key in ["band", "ms_per_token", "share", "nodes"] {
            assert!(band.get(key).is_some(), "missing bands[].{key}");
        }
        assert_eq!(v["tokens"], 100);
    }

    #[test]
    fn a_model_whose_logits_are_nan_is_not_timed() {
        let mut e = MockEngine::new(&NODES);
        e.logits = vec![0.5, f32::NAN, f32::INFINITY];
        let err = measure(&mut e, &cfg(3), &mut |_, _, _| {}).unwrap_err();
        assert!(
            matches!(
                err,
                EngineError::NonFiniteOutputs {
                    non_finite: 2,
                    values: 3,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().starts_with("outputs finite: "), "{err}");
        // a finite model passes the check, and says so
        let s = run(&mut MockEngine::new(&NODES), 3);
        let c = s.checks.iter().find(|c| c.name == "finite").unwrap();
        assert_eq!(c.status, CheckStatus::Pass);
    }

    #[test]
    fn a_band_point_lies_within_its_range() {
        // three nodes (moe, linear attention, other), 3 cycles, 1 token a run
        // cycle:      1    2    3
        // moe µs:    10   10   60
        // lin µs:    10   90   90
        // other µs:  20  100   50
        // TIMED sum: 40  200  200
        // FUSED ms:  50  200   50
        // per-cycle moe ms/token = share x FUSED: 12.5, 10, 15 -> point 12.5, range 10-15.
        // The old formula, share of the per-node medians x the median FUSED, gave
        // 10 / (10 + 90 + 50) x 50 = 3.33, outside its own range.
        let nodes: [MockNode; 3] = [
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
            ("GATED_DELTA_NET", "node_1", "", 1.0),
            ("ADD", "l_out-3", "", 1.0),
        ];
        let e = MockEngine::new(&nodes);
        let mut c = cfg(3);
        c.work.chunk_tokens = 1;
        let cycle = |t: [f64; 3], fused: f64| CycleRecord {
            order: ORDERS[0].to_vec(),
            fused_ms: fused,
            fused_observed_ms: fused,
            timed_wall_ms: fused,
            node_us: t.to_vec(),
            isolation_us: None,
            isolation_node_us: Vec::new(),
        };
        let raw = ProfileRaw {
            schema_version: PROFILE_SCHEMA_VERSION,
            config: c,
            graph: e.graph.clone(),
            cycles: vec![
                cycle([10.0, 10.0, 20.0], 50.0),
                cycle([10.0, 90.0, 100.0], 200.0),
                cycle([60.0, 90.0, 50.0], 50.0),
            ],
            output_hashes: BTreeMap::new(),
            overhead_pairs: Vec::new(),
            gate: Default::default(),
            outputs_checked_finite: true,
            node_steps: None,
        };
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        let moe = s.band("moe").unwrap();
        assert!(close(moe.ms_per_token, 12.5), "{moe:?}");
        assert!(close(moe.ms_per_token_min, 10.0) && close(moe.ms_per_token_max, 15.0));
        // linear attention: 12.5, 90, 22.5 -> point 22.5, range 12.5-90
        let lin = s.band("linear_attention").unwrap();
        assert!(close(lin.ms_per_token, 22.5), "{lin:?}");
        assert!(close(lin.ms_per_token_min, 12.5) && close(lin.ms_per_token_max, 90.0));
        // other: 25, 100, 12.5 -> 25, and its one row (l_out) the same (old: 16.67)
        let other = s.band("other").unwrap();
        assert!(close(other.ms_per_token, 25.0), "{other:?}");
        assert_eq!(s.other.len(), 1);
        assert!(close(s.other[0].ms_per_token, 25.0), "{:?}", s.other);
        // shares are the points over their sum (60); the table's total is that sum
        assert!(close(moe.share, 12.5 / 60.0) && close(lin.share, 22.5 / 60.0));
        assert!(close(other.share, 25.0 / 60.0));
        // median over cycles of the band's TIMED sum, in ms
        assert!(close(moe.timed_ms, 10.0 / 1e3));
        for b in &s.bands {
            assert!(
                b.ms_per_token_min <= b.ms_per_token && b.ms_per_token <= b.ms_per_token_max,
                "{b:?}"
            );
        }
        // the corrected columns use the same estimator (no isolation cost measured here: the
        // graph has no idle node, so they equal the raw ones)
        assert!(close(moe.ms_per_token_corrected, 12.5));
        assert!(close(moe.share_corrected, moe.share));
    }

    #[test]
    fn a_decode_remainder_is_taken_from_every_working_node_not_by_share() {
        // 4 steps of one token; per step the MoE node does 10 µs of work and the attention node
        // 30, each paid 7 µs to be isolated of which the calibration found 5: removing only the
        // calibration leaves 12 and 32 a step, whose shares x the 160 µs wall would give the
        // MoE band 43.6 µs instead of its 40
        let nodes: [MockNode; 2] = [
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
            ("FLASH_ATTN_EXT", "__fattn__-3", "", 1.0),
        ];
        let e = MockEngine::new(&nodes);
        let mut c = cfg(2);
        c.work.decode_tokens = 4;
        let cycle = CycleRecord {
            order: ORDERS[0].to_vec(),
            fused_ms: 0.160,
            fused_observed_ms: 0.160,
            timed_wall_ms: 0.220,
            node_us: vec![4.0 * 17.0, 4.0 * 37.0],
            isolation_us: Some(5.0),
            isolation_node_us: vec![5.0, 5.0],
        };
        let raw = ProfileRaw {
            schema_version: PROFILE_SCHEMA_VERSION,
            config: c,
            graph: e.graph.clone(),
            cycles: vec![cycle.clone(), cycle],
            output_hashes: BTreeMap::new(),
            overhead_pairs: Vec::new(),
            gate: Default::default(),
            outputs_checked_finite: true,
            node_steps: Some(4),
        };
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        // the calibrated agreement: (48 + 128) / 160 - 1
        assert!(
            close(s.agreement_corrected, 0.1),
            "{}",
            s.agreement_corrected
        );
        assert!(
            close(s.isolation_remainder_us, 2.0),
            "{}",
            s.isolation_remainder_us
        );
        // 40 µs of MoE work over 4 tokens: 0.01 ms a token; attention 0.03
        let moe = s.band("moe").unwrap();
        assert!(close(moe.ms_per_token_corrected, 0.010), "{moe:?}");
        let att = s.band("attention").unwrap();
        assert!(close(att.ms_per_token_corrected, 0.030), "{att:?}");
    }

    #[test]
    fn a_timed_run_of_the_wrong_length_is_refused() {
        let mut e = MockEngine::new(&NODES);
        let mut raw = measure(&mut e, &cfg(2), &mut |_, _, _| {}).unwrap();
        raw.cycles[1].node_us.pop();
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let err = analyse(&raw, &rules, &arch).unwrap_err();
        assert!(err.to_string().contains("cycle 1 timed 5 nodes"), "{err}");
    }
}
