//! In-graph replay timing: in-graph cost of band B = (T with B's nodes dispatched k extra
//! times, minus T baseline, minus the launches those replays paid) / k, every run cut at the same
//! nodes, with the method validated every time, each validation against a stated bound: replaying
//! every band together costs about the baseline's work, the per-band increments add up to the
//! replay-all increment, and k = 1, 2, 4 (times a scale) scale linearly (the per-replay costs
//! agree within a stated spread, and a line fitted through the increments has R² above a bound).
//! A failed validation marks the result unreliable. Nodes that write in place are not replayed
//! and are listed.
//!
//! Work too small to replay measurably is found before measuring: a probe of [`PROBE_RUNS`]
//! baselines gives the machine's noise, the profile gives each band's expected cost of one
//! replay, and [`plan_replay`] (pure) chooses per band the smallest k on the ladder k, 4k, 16k
//! up to [`MAX_K`] whose increment carries at most [`NOISE_SHARE_MAX`] of noise, and for
//! replay-all and the k-scaling the smallest power-of-two scale up to [`MAX_SCALE`] that does;
//! a band too small even at [`MAX_K`] is skipped with its figures (the sum of bands is then set
//! against a replay of the measured bands together), and a run whose replay-all, k-scaling or
//! baseline work cannot be measured is refused with its figures, before any cycle.
//!
//! An engine whose replays dispatch graphs of their own (llama.cpp computes clones in rounds, one
//! graph launch and synchronisation per round, see [`ReplayEngine::replay_rounds`]) pays per
//! round a cost the baseline does not: it is measured on the engine every cycle, by runs in which
//! every replayable node dispatches `LAUNCH_ROUNDS` rounds of one trivial clone through the same
//! path ([`ReplayEngine::replay_launches`]), and removed from every increment.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::Assignment;
use crate::engine::{EngineError, ReplayEngine};
use crate::node::NodeInfo;
use crate::stats::{linear_fit, Sample};

/// The most extra dispatches a small band is given to stand out of the noise.
pub const MAX_K: u32 = 64;
/// A band stands out when its increment is at least this many times the baseline's spread.
pub const STAND_OUT: f64 = 2.0;
/// Launch rounds of one trivial clone each replayable node dispatches in the run that measures
/// what a round costs: many, so that the rounds stand out of a run's noise.
pub const LAUNCH_ROUNDS: u32 = 16;
/// Validation 1: replay-all increment / the baseline's work within 1 ± this.
pub const REPLAY_ALL_TOLERANCE: f64 = 0.15;
/// Validation 2: sum of the band increments / replay-all increment within 1 ± this.
pub const SUM_TOLERANCE: f64 = 0.15;
/// Validation 3: the per-replay costs at k = 1, 2, 4, largest / smallest, at most this.
pub const SCALING_SPREAD_MAX: f64 = 1.5;
/// Validation 3: R² of the line through the total increments at k = 1, 2, 4, at least this.
pub const SCALING_R2_MIN: f64 = 0.9;
/// Baselines (each with its launch run, where the engine's replays pay launches) the probe takes
/// before the cycles: their spread is the noise a measured increment must see through.
pub const PROBE_RUNS: u32 = 5;
/// An increment is measured only where the noise on it (the probe's baseline spread, plus the
/// uncertainty of the launches removed from it) is at most this share of it: a tenth, so that
/// the validations' 15 % bounds judge the method and not the machine.
pub const NOISE_SHARE_MAX: f64 = 0.1;
/// The most replay-all and the k-scaling are scaled (the k-scaling at scale x 1, 2, 4 stays
/// within [`MAX_K`]).
pub const MAX_SCALE: u32 = MAX_K / 4;
/// Measurements one replay may take: the first, and one retake planned with the cycles' own
/// noise when validations failed and the cycles were noisier than the probe had shown.
pub const ATTEMPTS: u32 = 2;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayConfig {
    /// Extra dispatches per replayed node in the per-band runs.
    pub k: u32,
    /// Interleaved cycles (each: baseline, every band, replay-all, and the k-scaling runs).
    pub cycles: u32,
}

/// One band's replay cost.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandReplay {
    pub band: String,
    pub nodes: u32,
    /// Extra dispatches per node used for this band (raised above the configured k for bands too
    /// small to stand out of the baseline's spread at it).
    pub k: u32,
    /// The band's total increment at that k stood out of the baseline's spread.
    pub stands_out: bool,
    /// What one replay of the band was expected to cost before measuring (the profile's band
    /// time for one run, or the probe's), ms.
    #[serde(default)]
    pub expected_ms: f64,
    /// Median over cycles of (T_band - T_baseline - launches) / k, ms for the chunk.
    pub ms: f64,
    pub ms_min: f64,
    pub ms_max: f64,
    pub ms_per_token: f64,
}

/// A band not replayed because its replays would not stand out of the noise even at
/// [`MAX_K`], with the figures that decided it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SkippedBand {
    pub band: String,
    pub nodes: u32,
    /// What one replay of the band was expected to cost, ms.
    pub expected_ms: f64,
    /// Why, in words, with the figures.
    pub reason: String,
}

/// One of the method's validations, with its bound.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayCheck {
    /// `replay-all`, `sum-of-bands`, `k-scaling`, `outputs`.
    pub name: String,
    pub pass: bool,
    /// The value against its bound, in words.
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayResult {
    pub k: u32,
    pub cycles: u32,
    pub tokens: u32,
    /// Median baseline (cut at every replayable node, nothing replayed), ms.
    pub baseline_ms: f64,
    /// The baselines' max - min over the cycles and the probe, ms: the noise a band's increment
    /// must clear.
    pub baseline_spread_ms: f64,
    /// The noise the plan was made with: the probe's baselines' max - min (or, on a retake,
    /// the noisier cycles' of the measurement before), ms.
    #[serde(default)]
    pub noise_ms: f64,
    /// Replays per node in the replay-all run (a power of two, 1 unless the noise asked for
    /// more).
    #[serde(default = "one")]
    pub scale: u32,
    /// Measurements taken: 2 when the first failed its validations in cycles noisier than its
    /// probe, and was retaken with a plan for that noise.
    #[serde(default = "one")]
    pub attempts: u32,
    /// The validations the first measurement failed, where it was retaken.
    #[serde(default)]
    pub retaken_after: Vec<String>,
    /// What one launch round of a replay costs beyond its clones' work, µs (median over cycles
    /// of (T with `LAUNCH_ROUNDS` trivial rounds at every replayable node - T baseline) /
    /// (nodes x rounds)); `None`
    /// where the engine's replays dispatch no rounds of their own.
    #[serde(default)]
    pub round_cost_us: Option<f64>,
    /// Its per-cycle range, µs.
    #[serde(default)]
    pub round_cost_min_us: f64,
    #[serde(default)]
    pub round_cost_max_us: f64,
    /// The baseline without the launches of its own cuts (cuts x round cost): the work that
    /// replaying every node once should add again, ms.
    #[serde(default)]
    pub baseline_work_ms: f64,
    pub bands: Vec<BandReplay>,
    /// Bands not replayed: too small to stand out of the noise at any k up to [`MAX_K`].
    #[serde(default)]
    pub skipped: Vec<SkippedBand>,
    /// Validation 1: every replayable node replayed `scale` times; its increment per replay
    /// against the baseline's work.
    pub replay_all_ms: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub replay_all_over_baseline: f64,
    /// Validation 2: the sum of per-band increments against the replay-all increment (or, where
    /// bands were skipped, against the measured bands replayed together at `scale`).
    pub sum_of_bands_ms: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub sum_over_replay_all: f64,
    /// The increment per replay the sum of bands was set against, ms.
    #[serde(default)]
    pub sum_reference_ms: f64,
    /// Validation 3: the band with the largest expected cost, replayed k = scale x 1, 2, 4
    /// times: increment per replay.
    pub scaling_band: String,
    pub scaling_ms_per_replay: Vec<(u32, f64)>,
    /// Largest / smallest of the per-replay costs at the three k (infinite when one is not
    /// positive).
    #[serde(default, deserialize_with = "infinite_when_null")]
    pub scaling_spread: f64,
    /// The line through the median total increments at the three k: slope (ms per replay), R².
    pub scaling_slope_ms: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub scaling_r2: f64,
    /// Every replay run returned the baseline's logits bit for bit.
    pub outputs_identical: bool,
    /// Every validation within its bound; otherwise the replay column is unreliable.
    #[serde(default)]
    pub reliable: bool,
    /// The validations, with their values and bounds.
    #[serde(default)]
    pub checks: Vec<ReplayCheck>,
    /// Nodes that write in place (a cache write, an in-place op) and are not replayed.
    pub excluded_inplace: Vec<String>,
    /// Their share of the TIMED node time, where the caller knows it (else 0).
    #[serde(default)]
    pub excluded_share: f64,
}

fn one() -> u32 {
    1
}

/// The spread of costs is infinite (stored as `null`) when one cost is not positive.
fn infinite_when_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::INFINITY))
}

impl ReplayResult {
    /// The names of the validations that failed.
    pub fn failed_checks(&self) -> Vec<&str> {
        self.checks
            .iter()
            .filter(|c| !c.pass)
            .map(|c| c.name.as_str())
            .collect()
    }
}

/// What a band is expected to cost before it is replayed.
#[derive(Debug, Clone, PartialEq)]
pub struct BandPrior {
    pub band: String,
    /// Its replayable nodes.
    pub nodes: u32,
    /// One replay of all of them, ms.
    pub ms: f64,
}

/// The noise the probe measured.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProbeNoise {
    /// The baselines' max - min, ms: the noise on one increment.
    pub baseline_spread_ms: f64,
    /// What the per-round launch cost removed may be off by, ms: half its max - min over the
    /// probe (0 where replays pay no rounds); a node replayed in r rounds carries r x this of
    /// uncertainty once its launches are removed.
    pub round_spread_ms: f64,
}

/// What to measure, decided before measuring ([`plan_replay`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReplayPlan {
    /// The bands to measure and their k.
    pub bands: Vec<(String, u32)>,
    /// The bands too small to measure.
    pub skipped: Vec<SkippedBand>,
    /// Replays per node in the replay-all run (and the measured-bands run).
    pub all_scale: u32,
    /// The band of the k-scaling (the measured band with the largest expected cost) and its
    /// scale: it is replayed scale x 1, 2, 4 times.
    pub scaling_band: String,
    pub scaling_scale: u32,
}

/// Decides, from each band's expected cost of one replay and the probe's noise, what can be
/// measured (pure). The noise on an increment of `n` nodes replayed `k` times is the baselines'
/// spread plus n x rounds(k) x the round cost's spread (what removing the launches may be off
/// by); an increment is measured when that noise is at most [`NOISE_SHARE_MAX`] of it.
///
/// - each band: the first k of k, 4k, 16k, ... (up to [`MAX_K`]) at which it is; else skipped
///   with its figures;
/// - replay-all (and, where bands were skipped, the measured bands together): the smallest
///   power-of-two scale up to [`MAX_SCALE`] at which both are;
/// - the k-scaling: the measured band with the largest expected cost, at the smallest
///   power-of-two scale up to [`MAX_SCALE`] at which its smallest increment is;
/// - the baseline's work (baseline less its `nodes` cuts' launches): the launches' uncertainty
///   at most [`NOISE_SHARE_MAX`] of it.
///
/// `Err` (the replay is not run, and why) when no band, replay-all, the k-scaling or the
/// baseline's work can be measured.
pub fn plan_replay(
    k: u32,
    bands: &[BandPrior],
    nodes: u32,
    baseline_work_ms: f64,
    noise: ProbeNoise,
    rounds: &dyn Fn(u32) -> u32,
) -> Result<ReplayPlan, String> {
    let k = k.max(1);
    let err = |n: u32, kk: u32| {
        noise.baseline_spread_ms + n as f64 * rounds(kk) as f64 * noise.round_spread_ms
    };
    let clears = |ms: f64, n: u32, kk: u32| ms * kk as f64 * NOISE_SHARE_MAX >= err(n, kk);
    let share = NOISE_SHARE_MAX * 100.0;
    let cuts_err = nodes as f64 * noise.round_spread_ms;
    if cuts_err > NOISE_SHARE_MAX * baseline_work_ms {
        return Err(format!(
            "the launches of the baseline's {nodes} cuts are known only to ±{cuts_err:.3} ms, \
             over {share:.0} % of its work ({baseline_work_ms:.3} ms)"
        ));
    }
    let mut measured = Vec::new();
    let mut skipped = Vec::new();
    for b in bands {
        let mut kk = k;
        loop {
            if clears(b.ms, b.nodes, kk) {
                measured.push((b.band.clone(), kk, b.nodes, b.ms));
                break;
            }
            if kk >= MAX_K {
                skipped.push(SkippedBand {
                    band: b.band.clone(),
                    nodes: b.nodes,
                    expected_ms: b.ms,
                    reason: format!(
                        "{:.4} ms a replay: {kk} replays add {:.3} ms, against noise of {:.3} ms \
                         (at most {share:.0} % of an increment)",
                        b.ms,
                        b.ms * kk as f64,
                        err(b.nodes, kk)
                    ),
                });
                break;
            }
            kk = (kk * 4).min(MAX_K);
        }
    }
    if measured.is_empty() {
        return Err(format!(
            "no band's replays stand out of the noise ({:.3} ms) even at k = {MAX_K}: {}",
            noise.baseline_spread_ms,
            skipped
                .iter()
                .map(|s| format!("{} {:.4} ms a replay", s.band, s.expected_ms))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let smallest_scale = |ok: &dyn Fn(u32) -> bool| -> Option<u32> {
        let mut s = 1;
        loop {
            if ok(s) {
                return Some(s);
            }
            if s >= MAX_SCALE {
                return None;
            }
            s *= 2;
        }
    };
    let all_ms: f64 = bands.iter().map(|b| b.ms).sum();
    let all_nodes: u32 = bands.iter().map(|b| b.nodes).sum();
    let measured_ms: f64 = measured.iter().map(|m| m.3).sum();
    let measured_nodes: u32 = measured.iter().map(|m| m.2).sum();
    let all_scale = smallest_scale(&|s| {
        clears(all_ms, all_nodes, s)
            && (skipped.is_empty() || clears(measured_ms, measured_nodes, s))
    })
    .ok_or_else(|| {
        format!(
            "replaying every node adds {all_ms:.3} ms a replay: even {MAX_SCALE} replays carry \
             noise of {:.3} ms, over {share:.0} % of them",
            err(all_nodes, MAX_SCALE)
        )
    })?;
    // the largest expected cost leads the k-scaling (the first of equals in band order)
    let lead = measured
        .iter()
        .fold(None::<&(String, u32, u32, f64)>, |best, m| match best {
            Some(b) if b.3 >= m.3 => Some(b),
            _ => Some(m),
        })
        .expect("a measured band");
    let scaling_scale = smallest_scale(&|s| clears(lead.3, lead.2, s)).ok_or_else(|| {
        format!(
            "the largest band ({}) adds {:.4} ms a replay: even {MAX_SCALE} replays carry noise of \
             {:.3} ms, over {share:.0} % of them, so k-scaling cannot be judged",
            lead.0,
            lead.3,
            err(lead.2, MAX_SCALE)
        )
    })?;
    Ok(ReplayPlan {
        bands: measured.iter().map(|m| (m.0.clone(), m.1)).collect(),
        skipped,
        all_scale,
        scaling_band: lead.0.clone(),
        scaling_scale,
    })
}

/// The method's validations from the measured ratios (pure).
pub fn validate(
    replay_all_over_baseline: f64,
    sum_over_replay_all: f64,
    scaling_ms_per_replay: &[(u32, f64)],
    scaling_r2: f64,
    outputs_identical: bool,
) -> (Vec<ReplayCheck>, f64) {
    let within = |v: f64, tol: f64| v.is_finite() && (v - 1.0).abs() <= tol;
    let per: Vec<f64> = scaling_ms_per_replay.iter().map(|(_, ms)| *ms).collect();
    let lo = per.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = per.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let spread = if per.len() >= 2 && lo > 0.0 && hi.is_finite() {
        hi / lo
    } else {
        f64::INFINITY
    };
    let checks = vec![
        ReplayCheck {
            name: "replay-all".into(),
            pass: within(replay_all_over_baseline, REPLAY_ALL_TOLERANCE),
            detail: format!(
                "replay all bands, per replay / baseline work: {replay_all_over_baseline:.3} (bound 1 ± {REPLAY_ALL_TOLERANCE})"
            ),
        },
        ReplayCheck {
            name: "sum-of-bands".into(),
            pass: within(sum_over_replay_all, SUM_TOLERANCE),
            detail: format!(
                "sum of band increments / replay-all increment: {sum_over_replay_all:.3} (bound 1 ± {SUM_TOLERANCE})"
            ),
        },
        ReplayCheck {
            name: "k-scaling".into(),
            pass: spread <= SCALING_SPREAD_MAX && scaling_r2 >= SCALING_R2_MIN,
            detail: format!(
                "per-replay cost at k = {}: largest / smallest {spread:.2} (bound ≤ {SCALING_SPREAD_MAX}), R² of the line {scaling_r2:.4} (bound ≥ {SCALING_R2_MIN})",
                scaling_ms_per_replay
                    .iter()
                    .map(|(k, _)| k.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        },
        ReplayCheck {
            name: "outputs".into(),
            pass: outputs_identical,
            detail: if outputs_identical {
                "every replay run returned the baseline's logits bit for bit".into()
            } else {
                "a replay run CHANGED the logits".into()
            },
        },
    ];
    (checks, spread)
}

/// Runs the replay measurement on a prepared engine whose graph is `graph`. `expected_ms` gives
/// each band's expected cost of one replay of its nodes, ms for the run (the profile's band
/// time); a band missing from it is replayed at k in every probe run to find it.
///
/// First a probe ([`PROBE_RUNS`] baselines, each with its launch run where replays pay
/// launches) measures the noise; [`plan_replay`] decides from it what can be measured, and what
/// cannot is skipped or the whole replay refused (`EngineError::Unsupported`, with the figures)
/// before any cycle. When the validations then fail in cycles whose baselines spread more than
/// the probe's, the replay is planned again for that noise and retaken once ([`ATTEMPTS`]).
#[allow(clippy::too_many_arguments)]
pub fn measure_replay(
    engine: &mut dyn ReplayEngine,
    graph: &[NodeInfo],
    assignments: &[Assignment],
    bands: &[String],
    tokens: u32,
    cfg: &ReplayConfig,
    expected_ms: &BTreeMap<String, f64>,
    progress: &mut dyn FnMut(u32, u32, &str),
) -> Result<ReplayResult, EngineError> {
    let replayable: Vec<bool> = graph.iter().map(|n| n.is_working() && !n.inplace).collect();
    let n_replayable = replayable.iter().filter(|&&x| x).count();
    let excluded_inplace: Vec<String> = graph
        .iter()
        .filter(|n| n.is_working() && n.inplace)
        .map(|n| format!("{} {}", n.op, n.name))
        .collect();
    let of_band = |b: &str| -> Vec<bool> {
        graph
            .iter()
            .zip(assignments)
            .enumerate()
            .map(|(i, (_, a))| replayable[i] && a.band == b)
            .collect()
    };
    let present: Vec<(String, Vec<bool>)> = bands
        .iter()
        .map(|b| (b.clone(), of_band(b)))
        .filter(|(_, m)| m.iter().any(|&x| x))
        .collect();
    let k = cfg.k.max(1);
    // the launch rounds of every k this measurement may use
    let rounds_of: Vec<u32> = (0..=k.max(MAX_K))
        .map(|kk| engine.replay_rounds(kk))
        .collect();
    let launches = rounds_of.iter().any(|&r| r > 0) && n_replayable > 0;
    let setup = Setup {
        replayable,
        present,
        rounds_of,
        launches,
        k,
        tokens,
        cycles: cfg.cycles.max(1),
    };
    // warm-up: allocations and the scratch buffer
    let none = vec![false; graph.len()];
    let base0 = engine.replay(&setup.replayable, &none, 0)?;
    if launches {
        engine.replay_launches(&setup.replayable, &setup.replayable, LAUNCH_ROUNDS)?;
    }
    let mut noise_floor = 0.0;
    let mut attempt = 1;
    let mut failed_before = Vec::new();
    loop {
        let (mut r, cycles_spread) = setup.measure(
            engine,
            base0.output_hash,
            expected_ms,
            noise_floor,
            progress,
        )?;
        r.attempts = attempt;
        r.retaken_after = failed_before;
        r.excluded_inplace = excluded_inplace.clone();
        // changed logits are no noise: never retaken
        if r.reliable || !r.outputs_identical || attempt >= ATTEMPTS || cycles_spread <= r.noise_ms
        {
            return Ok(r);
        }
        // the cycles were noisier than the probe said: plan again for their noise
        failed_before = r.failed_checks().iter().map(|c| c.to_string()).collect();
        noise_floor = cycles_spread;
        attempt += 1;
    }
}

/// The mask of `band` in `present`, or `none`.
fn mask_in<'a>(present: &'a [(String, Vec<bool>)], none: &'a [bool], band: &str) -> &'a [bool] {
    present
        .iter()
        .find(|(b, _)| b == band)
        .map_or(none, |(_, m)| m.as_slice())
}

/// What every attempt of one replay measurement shares.
struct Setup {
    replayable: Vec<bool>,
    present: Vec<(String, Vec<bool>)>,
    rounds_of: Vec<u32>,
    launches: bool,
    k: u32,
    tokens: u32,
    cycles: u32,
}

impl Setup {
    fn rounds(&self, k: u32) -> u32 {
        self.rounds_of.get(k as usize).copied().unwrap_or(0)
    }

    /// One attempt: probe, plan, cycles, figures. Returns the result and the cycles' baseline
    /// spread.
    fn measure(
        &self,
        engine: &mut dyn ReplayEngine,
        reference: u64,
        expected_ms: &BTreeMap<String, f64>,
        noise_floor: f64,
        progress: &mut dyn FnMut(u32, u32, &str),
    ) -> Result<(ReplayResult, f64), EngineError> {
        let replayable = &self.replayable;
        let n_replayable = replayable.iter().filter(|&&x| x).count();
        let none = vec![false; replayable.len()];
        let nodes_of = |mask: &[bool]| mask.iter().filter(|&&x| x).count() as f64;
        let med = |v: &[f64]| Sample::new(v).map(|s| s.median()).unwrap_or(0.0);
        let spread_of = |v: &[f64]| Sample::new(v).map(|s| s.max() - s.min()).unwrap_or(0.0);
        let mut identical = true;
        let mut check = |h: u64| identical &= h == reference;
        let k = self.k;

        // the probe: the noise, the launch of a round, and the bands the profile did not give
        let unknown: Vec<&(String, Vec<bool>)> = self
            .present
            .iter()
            .filter(|(b, _)| !expected_ms.contains_key(b))
            .collect();
        let mut probe_base = Vec::new();
        let mut probe_round = Vec::new();
        let mut probe_band: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for i in 0..PROBE_RUNS {
            progress(i, PROBE_RUNS, "replay probe");
            let b = engine.replay(replayable, &none, 0)?;
            check(b.output_hash);
            probe_base.push(b.wall_ms);
            if self.launches {
                let l = engine.replay_launches(replayable, replayable, LAUNCH_ROUNDS)?;
                check(l.output_hash);
                probe_round
                    .push((l.wall_ms - b.wall_ms) / (n_replayable as f64 * LAUNCH_ROUNDS as f64));
            }
            for (band, mask) in &unknown {
                let r = engine.replay(replayable, mask, k)?;
                check(r.output_hash);
                probe_band
                    .entry(band.as_str())
                    .or_default()
                    .push(r.wall_ms - b.wall_ms);
            }
        }
        let probe_round_ms = med(&probe_round);
        let noise = ProbeNoise {
            baseline_spread_ms: spread_of(&probe_base).max(noise_floor),
            // the launches removed are the median of the cycles' round costs, which lies within
            // their range: half the probe's range is what a round removed may be off by
            round_spread_ms: spread_of(&probe_round) / 2.0,
        };
        let priors: Vec<BandPrior> = self
            .present
            .iter()
            .map(|(band, mask)| BandPrior {
                band: band.clone(),
                nodes: nodes_of(mask) as u32,
                ms: expected_ms.get(band).copied().unwrap_or_else(|| {
                    let launched = nodes_of(mask) * self.rounds(k) as f64 * probe_round_ms;
                    (med(&probe_band[band.as_str()]) - launched) / k as f64
                }),
            })
            .collect();
        let plan = plan_replay(
            k,
            &priors,
            n_replayable as u32,
            med(&probe_base) - n_replayable as f64 * probe_round_ms,
            noise,
            &|kk| self.rounds(kk),
        )
        .map_err(|why| EngineError::Unsupported {
            what: "in-graph replay of this work".into(),
            why: format!(
                "too small to replay measurably against this machine's noise: {why} (a longer \
                 chunk, -p, gives each replay more work; a quieter machine has less noise)"
            ),
        })?;
        let mask_of = |band: &str| mask_in(&self.present, &none, band);
        let measured_mask: Vec<bool> = if plan.skipped.is_empty() {
            Vec::new()
        } else {
            let mut m = none.clone();
            for (band, _) in &plan.bands {
                for (x, &y) in m.iter_mut().zip(mask_of(band)) {
                    *x |= y;
                }
            }
            m
        };
        let scale = plan.all_scale;
        let scaling_mask = mask_of(&plan.scaling_band).to_vec();
        let scaling_ks = [1, 2, 4].map(|x| x * plan.scaling_scale);

        let mut base = Vec::new();
        let mut launch = Vec::new();
        let mut per_band: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        let mut all = Vec::new();
        let mut together = Vec::new();
        let mut scaling: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
        let total = self.cycles;
        for c in 0..total {
            progress(c, total, "replay");
            let b = engine.replay(replayable, &none, 0)?;
            check(b.output_hash);
            base.push(b.wall_ms);
            if self.launches {
                // every replayable node LAUNCH_ROUNDS rounds of one trivial clone: the launch a
                // round pays
                let l = engine.replay_launches(replayable, replayable, LAUNCH_ROUNDS)?;
                check(l.output_hash);
                launch.push((l.wall_ms - b.wall_ms) / (n_replayable as f64 * LAUNCH_ROUNDS as f64));
            }
            for (band, kb) in &plan.bands {
                let r = engine.replay(replayable, mask_of(band), *kb)?;
                check(r.output_hash);
                per_band.entry(band.clone()).or_default().push(r.wall_ms);
            }
            let r = engine.replay(replayable, replayable, scale)?;
            check(r.output_hash);
            all.push(r.wall_ms);
            if !measured_mask.is_empty() {
                let r = engine.replay(replayable, &measured_mask, scale)?;
                check(r.output_hash);
                together.push(r.wall_ms);
            }
            for kk in scaling_ks {
                let r = engine.replay(replayable, &scaling_mask, kk)?;
                check(r.output_hash);
                scaling.entry(kk).or_default().push(r.wall_ms);
            }
        }
        progress(total, total, "replay");
        let baseline = med(&base);
        let round = Sample::new(&launch).ok();
        // ms per launch round
        let round_ms = round.as_ref().map(|s| s.median()).unwrap_or(0.0);
        let launch_ms =
            |mask: &[bool], kk: u32| -> f64 { nodes_of(mask) * self.rounds(kk) as f64 * round_ms };
        // per cycle: (T - T_baseline - the replays' launch rounds) / k
        let increments = |v: &[f64], launches_ms: f64, k: u32| -> Vec<f64> {
            v.iter()
                .zip(&base)
                .map(|(t, b)| (t - b - launches_ms) / k as f64)
                .collect()
        };
        let cycles_spread = spread_of(&base);
        // the noise a band must clear: the cycles' baselines, and the noise planned for
        let spread = cycles_spread.max(noise.baseline_spread_ms);
        let mut out_bands = Vec::new();
        for (band, k0) in &plan.bands {
            let mask = mask_of(band);
            let mut kb = *k0;
            let mut inc = increments(&per_band[band], launch_ms(mask, kb), kb);
            let stands = |inc: &[f64], kb: u32| med(inc) * kb as f64 >= STAND_OUT * spread;
            // noisier cycles than planned for: more replays, each level measured against its
            // own baselines
            while !stands(&inc, kb) && kb < MAX_K {
                kb = (kb * 4).min(MAX_K);
                let removed = launch_ms(mask, kb);
                let mut again = Vec::new();
                for _ in 0..total {
                    let b = engine.replay(replayable, &none, 0)?;
                    let r = engine.replay(replayable, mask, kb)?;
                    check(b.output_hash);
                    check(r.output_hash);
                    again.push((r.wall_ms - b.wall_ms - removed) / kb as f64);
                }
                inc = again;
            }
            let s = Sample::new(&inc).ok();
            let ms = s.as_ref().map(|s| s.median()).unwrap_or(0.0);
            out_bands.push(BandReplay {
                band: band.clone(),
                nodes: nodes_of(mask) as u32,
                k: kb,
                stands_out: stands(&inc, kb),
                expected_ms: priors
                    .iter()
                    .find(|p| p.band == *band)
                    .map_or(0.0, |p| p.ms),
                ms,
                ms_min: s.as_ref().map(|s| s.min()).unwrap_or(0.0),
                ms_max: s.as_ref().map(|s| s.max()).unwrap_or(0.0),
                ms_per_token: ms / self.tokens.max(1) as f64,
            });
        }
        let replay_all_ms = med(&increments(&all, launch_ms(replayable, scale), scale));
        let sum_reference_ms = if measured_mask.is_empty() {
            replay_all_ms
        } else {
            med(&increments(
                &together,
                launch_ms(&measured_mask, scale),
                scale,
            ))
        };
        // the baseline's own cuts are launches too: one per cut node
        let baseline_work_ms = baseline - nodes_of(replayable) * round_ms;
        let sum_of_bands_ms: f64 = out_bands.iter().map(|b| b.ms).sum();
        let scaling_ms_per_replay: Vec<(u32, f64)> = scaling
            .iter()
            .map(|(&kk, v)| (kk, med(&increments(v, launch_ms(&scaling_mask, kk), kk))))
            .collect();
        // the median total increment at the three k against k: linear if the method holds
        let (xs, ys): (Vec<f64>, Vec<f64>) = scaling
            .iter()
            .map(|(&kk, v)| {
                (
                    kk as f64,
                    med(&increments(v, launch_ms(&scaling_mask, kk), 1)),
                )
            })
            .unzip();
        let fit = linear_fit(&xs, &ys).ok();
        let replay_all_over_baseline = if baseline_work_ms > 0.0 {
            replay_all_ms / baseline_work_ms
        } else {
            0.0
        };
        let sum_over_replay_all = if sum_reference_ms > 0.0 {
            sum_of_bands_ms / sum_reference_ms
        } else {
            0.0
        };
        let scaling_r2 = fit.map(|f| f.r2).unwrap_or(0.0);
        let (checks, scaling_spread) = validate(
            replay_all_over_baseline,
            sum_over_replay_all,
            &scaling_ms_per_replay,
            scaling_r2,
            identical,
        );
        Ok((
            ReplayResult {
                k,
                cycles: total,
                tokens: self.tokens,
                baseline_ms: baseline,
                baseline_spread_ms: spread,
                noise_ms: noise.baseline_spread_ms,
                scale,
                attempts: 1,
                retaken_after: Vec::new(),
                round_cost_us: round.as_ref().map(|s| s.median() * 1e3),
                round_cost_min_us: round.as_ref().map(|s| s.min() * 1e3).unwrap_or(0.0),
                round_cost_max_us: round.as_ref().map(|s| s.max() * 1e3).unwrap_or(0.0),
                baseline_work_ms,
                bands: out_bands,
                skipped: plan.skipped,
                replay_all_ms,
                replay_all_over_baseline,
                sum_of_bands_ms,
                sum_over_replay_all,
                sum_reference_ms,
                scaling_band: plan.scaling_band,
                scaling_ms_per_replay,
                scaling_spread,
                scaling_slope_ms: fit.map(|f| f.b).unwrap_or(0.0),
                scaling_r2,
                outputs_identical: identical,
                reliable: checks.iter().all(|c| c.pass),
                checks,
                excluded_inplace: Vec::new(),
                excluded_share: 0.0,
            },
            cycles_spread,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ChunkTiming, Engine, EngineInfo, Mode, Work};

    /// The test engines below only replay: the rest of `Engine` is never called.
    macro_rules! replay_only {
        ($($engine:ident),*) => {$(
            impl Engine for $engine {
                fn info(&self) -> EngineInfo {
                    unimplemented!()
                }
                fn prepare(&mut self, _: &Work) -> Result<(), EngineError> {
                    Ok(())
                }
                fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
                    Ok(vec![])
                }
                fn run(&mut self, _: Mode) -> Result<ChunkTiming, EngineError> {
                    unimplemented!()
                }
                fn as_replay(&mut self) -> Option<&mut dyn ReplayEngine> {
                    Some(self)
                }
            }
        )*};
    }
    replay_only!(Exact, Launching, Intercept, Noisy, Burst);

    /// Replaying a node costs exactly its cost; cutting costs nothing.
    struct Exact {
        cost: Vec<f64>,
    }

    impl ReplayEngine for Exact {
        fn replay(
            &mut self,
            _: &[bool],
            replay: &[bool],
            k: u32,
        ) -> Result<ChunkTiming, EngineError> {
            let base: f64 = self.cost.iter().sum();
            let extra: f64 = self
                .cost
                .iter()
                .zip(replay)
                .filter(|(_, &r)| r)
                .map(|(c, _)| c * k as f64)
                .sum();
            Ok(ChunkTiming {
                device: None,
                wall_ms: base + extra,
                node_us: vec![],
                nodes_seen: self.cost.len() as u32,
                output_hash: 9,
            })
        }
    }

    #[test]
    fn the_three_validations_hold_for_an_exact_engine() {
        let graph = crate::mock::MockEngine::new(&[
            ("FLASH_ATTN_EXT", "node_0", "", 1.0),
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
            (
                "MUL_MAT_ID",
                "ffn_moe_up-0",
                "blk.0.ffn_up_exps.weight",
                1.0,
            ),
            ("ADD", "l_out-0", "", 1.0),
        ])
        .graph;
        let rules = crate::band::BandRules::builtin("qwen35moe").unwrap();
        let arch =
            crate::arch::ArchInfo::from_metadata(&crate::arch::tests::qwen35moe_md(4)).unwrap();
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let bands: Vec<String> = rules.bands.iter().map(|b| b.name.clone()).collect();
        let mut e = Exact {
            cost: vec![10.0, 30.0, 40.0, 2.0],
        };
        let r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            100,
            &ReplayConfig { k: 4, cycles: 3 },
            &BTreeMap::new(),
            &mut |_, _, _| {},
        )
        .unwrap();
        assert_eq!(r.baseline_ms, 82.0);
        let moe = r.bands.iter().find(|b| b.band == "moe").unwrap();
        assert_eq!((moe.ms, moe.nodes), (70.0, 2));
        assert!((moe.ms_per_token - 0.7).abs() < 1e-12);
        assert_eq!(r.replay_all_ms, 82.0);
        assert_eq!(r.replay_all_over_baseline, 1.0);
        assert_eq!(r.sum_over_replay_all, 1.0);
        assert_eq!(r.scaling_band, "moe");
        assert_eq!(
            r.scaling_ms_per_replay,
            vec![(1, 70.0), (2, 70.0), (4, 70.0)]
        );
        assert!((r.scaling_slope_ms - 70.0).abs() < 1e-9 && (r.scaling_r2 - 1.0).abs() < 1e-12);
        assert!(r.outputs_identical);
        // a noiseless baseline: every band stands out at the configured k
        assert!(r.bands.iter().all(|b| b.k == 4 && b.stands_out));
        // replays that dispatch nothing of their own: no launch measured or removed
        assert_eq!(r.round_cost_us, None);
        assert!(r.reliable && r.failed_checks().is_empty(), "{:?}", r.checks);
    }

    /// An exact engine whose replays pay `launch_ms` per round of at most 16 clones, as
    /// llama.cpp's do, and whose cuts pay it too (a cut is a graph launch).
    struct Launching {
        cost: Vec<f64>,
        launch_ms: f64,
    }

    impl Launching {
        fn wall(&self, cut: &[bool], replay: &[bool], per_node: impl Fn(f64) -> f64) -> f64 {
            let base: f64 = self.cost.iter().sum();
            let cuts = cut.iter().filter(|&&c| c).count() as f64 * self.launch_ms;
            let extra: f64 = self
                .cost
                .iter()
                .zip(replay)
                .filter(|(_, &r)| r)
                .map(|(&c, _)| per_node(c))
                .sum();
            base + cuts + extra
        }
    }

    impl ReplayEngine for Launching {
        fn replay(
            &mut self,
            cut: &[bool],
            replay: &[bool],
            k: u32,
        ) -> Result<ChunkTiming, EngineError> {
            let rounds = self.replay_rounds(k) as f64;
            let launch = self.launch_ms;
            let wall_ms = self.wall(cut, replay, |c| c * k as f64 + launch * rounds);
            Ok(ChunkTiming {
                device: None,
                wall_ms,
                node_us: vec![],
                nodes_seen: self.cost.len() as u32,
                output_hash: 9,
            })
        }

        fn replay_rounds(&self, k: u32) -> u32 {
            k.div_ceil(16)
        }

        fn replay_launches(
            &mut self,
            cut: &[bool],
            replay: &[bool],
            rounds: u32,
        ) -> Result<ChunkTiming, EngineError> {
            // a trivial clone does no work: only the round's launch
            let launch = self.launch_ms;
            let wall_ms = self.wall(cut, replay, |_| launch * rounds as f64);
            Ok(ChunkTiming {
                device: None,
                wall_ms,
                node_us: vec![],
                nodes_seen: self.cost.len() as u32,
                output_hash: 9,
            })
        }
    }

    fn four_node_graph() -> (Vec<NodeInfo>, Vec<Assignment>, Vec<String>) {
        let graph = crate::mock::MockEngine::new(&[
            ("FLASH_ATTN_EXT", "node_0", "", 1.0),
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
            (
                "MUL_MAT_ID",
                "ffn_moe_up-0",
                "blk.0.ffn_up_exps.weight",
                1.0,
            ),
            ("ADD", "l_out-0", "", 1.0),
        ])
        .graph;
        let rules = crate::band::BandRules::builtin("qwen35moe").unwrap();
        let arch =
            crate::arch::ArchInfo::from_metadata(&crate::arch::tests::qwen35moe_md(4)).unwrap();
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let bands: Vec<String> = rules.bands.iter().map(|b| b.name.clone()).collect();
        (graph, a, bands)
    }

    #[test]
    fn replay_launch_rounds_are_measured_and_removed_from_every_increment() {
        let (graph, a, bands) = four_node_graph();
        let mut e = Launching {
            cost: vec![10.0, 30.0, 40.0, 2.0],
            launch_ms: 0.5,
        };
        let r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            100,
            &ReplayConfig { k: 4, cycles: 3 },
            &BTreeMap::new(),
            &mut |_, _, _| {},
        )
        .unwrap();
        let close = |x: f64, y: f64| (x - y).abs() < 1e-9;
        // the launch of one round, measured on the engine
        assert!(
            close(r.round_cost_us.unwrap(), 500.0),
            "{:?}",
            r.round_cost_us
        );
        // without the removal the moe band would be (2 x (4 x 35 + 0.5)) / 4 = 70.25 ms
        let moe = r.bands.iter().find(|b| b.band == "moe").unwrap();
        assert!(close(moe.ms, 70.0), "moe {} ms", moe.ms);
        let att = r.bands.iter().find(|b| b.band == "attention").unwrap();
        assert!(close(att.ms, 10.0), "attention {} ms", att.ms);
        // replay-all adds the work once; the baseline's own four cuts are launches too
        assert!(close(r.replay_all_ms, 82.0));
        assert!(close(r.baseline_ms, 84.0) && close(r.baseline_work_ms, 82.0));
        assert!(close(r.replay_all_over_baseline, 1.0));
        assert!(close(r.sum_over_replay_all, 1.0));
        for (_, ms) in &r.scaling_ms_per_replay {
            assert!(close(*ms, 70.0), "{:?}", r.scaling_ms_per_replay);
        }
        assert!(close(r.scaling_spread, 1.0));
        assert!(r.reliable, "{:?}", r.checks);
    }

    /// Replays whose cost per replay falls with k (a fixed cost per replayed node that the
    /// engine does not declare): a + b k with a = 8 b.
    struct Intercept {
        b: Vec<f64>,
    }

    impl ReplayEngine for Intercept {
        fn replay(
            &mut self,
            _: &[bool],
            replay: &[bool],
            k: u32,
        ) -> Result<ChunkTiming, EngineError> {
            let base: f64 = self.b.iter().sum();
            let extra: f64 = self
                .b
                .iter()
                .zip(replay)
                .filter(|(_, &r)| r && k > 0)
                .map(|(b, _)| 8.0 * b + b * k as f64)
                .sum();
            Ok(ChunkTiming {
                device: None,
                wall_ms: base + extra,
                node_us: vec![],
                nodes_seen: self.b.len() as u32,
                output_hash: 9,
            })
        }
    }

    #[test]
    fn a_failed_replay_with_infinite_and_nan_ratios_round_trips_through_json() {
        let (graph, a, bands) = four_node_graph();
        let mut e = Intercept {
            b: vec![10.0, 30.0, 40.0, 2.0],
        };
        let mut r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            100,
            &ReplayConfig { k: 4, cycles: 3 },
            &BTreeMap::new(),
            &mut |_, _, _| {},
        )
        .unwrap();
        // what a replay drowned in noise gives: a cost that is not positive, ratios over nothing
        r.scaling_spread = f64::INFINITY;
        r.scaling_r2 = f64::NAN;
        r.sum_over_replay_all = f64::NAN;
        r.replay_all_over_baseline = f64::NAN;
        let json = serde_json::to_string(&r).unwrap();
        let back: ReplayResult = serde_json::from_str(&json).unwrap();
        assert_eq!(back.scaling_spread, f64::INFINITY);
        assert!(back.scaling_r2.is_nan());
        assert!(back.sum_over_replay_all.is_nan());
        assert!(back.replay_all_over_baseline.is_nan());
        assert_eq!(back.checks, r.checks);
    }

    #[test]
    fn per_replay_costs_three_times_apart_fail_the_scaling_check_despite_a_straight_line() {
        let (graph, a, bands) = four_node_graph();
        let mut e = Intercept {
            b: vec![10.0, 30.0, 40.0, 2.0],
        };
        let r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            100,
            &ReplayConfig { k: 4, cycles: 3 },
            &BTreeMap::new(),
            &mut |_, _, _| {},
        )
        .unwrap();
        // per replay 9 b, 5 b, 3 b: three times apart, on a line of R² 1
        let per: Vec<f64> = r.scaling_ms_per_replay.iter().map(|p| p.1).collect();
        assert_eq!(per, vec![9.0 * 70.0, 5.0 * 70.0, 3.0 * 70.0]);
        assert!(r.scaling_r2 > 0.999, "R² {}", r.scaling_r2);
        assert!((r.scaling_spread - 3.0).abs() < 1e-12);
        assert!(!r.reliable);
        assert!(r.failed_checks().contains(&"k-scaling"), "{:?}", r.checks);
    }

    #[test]
    fn each_validation_fails_outside_its_bound() {
        let line = [(1, 10.0), (2, 10.0), (4, 10.0)];
        let failed = |all: f64, sum: f64, per: &[(u32, f64)], r2: f64, same: bool| {
            validate(all, sum, per, r2, same)
                .0
                .into_iter()
                .filter(|c| !c.pass)
                .map(|c| c.name)
                .collect::<Vec<_>>()
        };
        assert!(failed(1.0, 1.0, &line, 1.0, true).is_empty());
        // a replay-all at 0.84 of the baseline's work is outside 1 ± 0.15
        assert_eq!(failed(0.84, 1.0, &line, 1.0, true), vec!["replay-all"]);
        assert_eq!(failed(1.0, 1.2, &line, 1.0, true), vec!["sum-of-bands"]);
        assert_eq!(
            failed(1.0, 1.0, &[(1, 10.0), (2, 10.0), (4, 16.0)], 1.0, true),
            vec!["k-scaling"]
        );
        assert_eq!(failed(1.0, 1.0, &line, 0.5, true), vec!["k-scaling"]);
        // a per-replay cost of nothing is no scaling
        assert_eq!(
            failed(1.0, 1.0, &[(1, 0.0), (2, 10.0), (4, 10.0)], 1.0, true),
            vec!["k-scaling"]
        );
        assert_eq!(failed(1.0, 1.0, &line, 1.0, false), vec!["outputs"]);
        assert_eq!(failed(f64::NAN, 1.0, &line, 1.0, true), vec!["replay-all"]);
    }

    /// Baselines that wander by 4 ms: a 0.1 ms band needs k = 64 to clear 2 x 4 ms.
    struct Noisy {
        cost: Vec<f64>,
        calls: u32,
    }

    impl ReplayEngine for Noisy {
        fn replay(
            &mut self,
            _: &[bool],
            replay: &[bool],
            k: u32,
        ) -> Result<ChunkTiming, EngineError> {
            self.calls += 1;
            // the baseline alternates 100, 104 ms on calls with nothing replayed
            let wobble = if replay.iter().any(|&r| r) {
                0.0
            } else {
                4.0 * (self.calls % 2) as f64
            };
            let extra: f64 = self
                .cost
                .iter()
                .zip(replay)
                .filter(|(_, &r)| r)
                .map(|(c, _)| c * k as f64)
                .sum();
            Ok(ChunkTiming {
                device: None,
                wall_ms: 100.0 + wobble + extra,
                node_us: vec![],
                nodes_seen: self.cost.len() as u32,
                output_hash: 9,
            })
        }
    }

    fn three_band_graph() -> (Vec<NodeInfo>, Vec<Assignment>, Vec<String>) {
        let graph = crate::mock::MockEngine::new(&[
            ("FLASH_ATTN_EXT", "node_0", "", 1.0),
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
            ("ADD", "l_out-0", "", 1.0),
        ])
        .graph;
        let rules = crate::band::BandRules::builtin("qwen35moe").unwrap();
        let arch =
            crate::arch::ArchInfo::from_metadata(&crate::arch::tests::qwen35moe_md(4)).unwrap();
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let bands: Vec<String> = rules.bands.iter().map(|b| b.name.clone()).collect();
        (graph, a, bands)
    }

    fn expected(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(b, ms)| (b.to_string(), *ms)).collect()
    }

    #[test]
    fn small_bands_get_more_replays_and_a_band_too_small_at_max_k_is_skipped_before_measuring() {
        let (graph, a, bands) = three_band_graph();
        // the probe's five baselines read 100, 104, 100, 104, 100 ms: noise 4 ms
        let mut e = Noisy {
            cost: vec![1.5, 30.0, 0.1],
            calls: 0,
        };
        let r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            1,
            &ReplayConfig { k: 4, cycles: 4 },
            &expected(&[("attention", 1.5), ("moe", 30.0), ("other", 0.1)]),
            &mut |_, _, _| {},
        )
        .unwrap();
        assert_eq!(r.noise_ms, 4.0);
        let k_of = |band: &str| r.bands.iter().find(|b| b.band == band).map(|b| b.k);
        // moe: 4 x 30 = 120 ms carries 4 ms (a tenth is 12); attention: 16 x 1.5 = 24 ms does
        // not (2.4), 64 x 1.5 = 96 ms does (9.6)
        assert_eq!(k_of("moe"), Some(4));
        assert_eq!(k_of("attention"), Some(MAX_K));
        // other: 64 x 0.1 = 6.4 ms, a tenth 0.64 ms, under 4 ms: skipped, with its figures
        assert_eq!(k_of("other"), None);
        assert_eq!(r.skipped.len(), 1);
        assert_eq!(r.skipped[0].band, "other");
        assert!(
            r.skipped[0]
                .reason
                .contains("64 replays add 6.400 ms, against noise of 4.000 ms"),
            "{}",
            r.skipped[0].reason
        );
        // replay-all: 31.6 ms a replay, a tenth of 2 x 31.6 clears 4 ms, of 1 x 31.6 not; the
        // k-scaling's moe the same
        assert_eq!(r.scale, 2);
        assert_eq!(
            r.scaling_ms_per_replay
                .iter()
                .map(|p| p.0)
                .collect::<Vec<_>>(),
            vec![2, 4, 8]
        );
        assert_eq!(r.scaling_band, "moe");
    }

    #[test]
    fn work_too_small_to_replay_measurably_is_refused_before_the_cycles_with_its_figures() {
        let (graph, a, bands) = three_band_graph();
        let mut e = Noisy {
            cost: vec![0.1, 0.3, 0.05],
            calls: 0,
        };
        let err = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            1,
            &ReplayConfig { k: 4, cycles: 3 },
            &expected(&[("attention", 0.1), ("moe", 0.3), ("other", 0.05)]),
            &mut |_, _, _| {},
        )
        .unwrap_err();
        let EngineError::Unsupported { what, why } = &err else {
            panic!("{err}")
        };
        assert_eq!(what, "in-graph replay of this work");
        assert!(
            why.contains("too small to replay measurably")
                && why.contains("noise (4.000 ms)")
                && why.contains("moe 0.3000 ms a replay"),
            "{why}"
        );
        // the warm-up and the probe's baselines only: no cycle ran
        assert_eq!(e.calls, 1 + PROBE_RUNS);
    }

    /// The plan's figures computed by hand: three bands, 1 ms of noise, a launch round known to
    /// ±1 µs, 16 clones a round.
    #[test]
    fn the_plan_raises_k_and_scales_until_the_noise_is_a_tenth_and_skips_what_cannot_be() {
        let bands = [
            BandPrior {
                band: "a".into(),
                nodes: 10,
                ms: 2.0,
            },
            BandPrior {
                band: "b".into(),
                nodes: 100,
                ms: 0.5,
            },
            BandPrior {
                band: "c".into(),
                nodes: 5,
                ms: 0.01,
            },
        ];
        let rounds = |k: u32| k.div_ceil(16);
        let noise = ProbeNoise {
            baseline_spread_ms: 1.0,
            round_spread_ms: 0.001,
        };
        let p = plan_replay(4, &bands, 115, 20.0, noise, &rounds).unwrap();
        // a: noise 1 + 10 x 1 x 0.001 = 1.01 ms; 4 x 2 = 8 ms (a tenth 0.8) no, 16 x 2 = 32 yes
        // b: at 16, 1.1 ms against a tenth of 8; at 64 (4 rounds) 1 + 100 x 4 x 0.001 = 1.4 ms
        //    against a tenth of 32 ms
        assert_eq!(p.bands, vec![("a".to_string(), 16), ("b".to_string(), 64)]);
        // c: 64 x 0.01 = 0.64 ms against 1 + 5 x 4 x 0.001 = 1.02 ms
        assert_eq!(p.skipped.len(), 1);
        assert_eq!(p.skipped[0].band, "c");
        assert_eq!(
            p.skipped[0].reason,
            "0.0100 ms a replay: 64 replays add 0.640 ms, against noise of 1.020 ms (at most 10 % of an increment)"
        );
        // replay-all 2.51 ms a replay, noise 1 + 115 x 0.001 = 1.115: a tenth of 4 x 2.51 is
        // 1.004, of 8 x 2.51 2.008; the measured bands (2.5 ms, 110 nodes) clear at 8 too
        assert_eq!(p.all_scale, 8);
        // the k-scaling: a (the largest cost) at 8: a tenth of 16 ms against 1.01 ms
        assert_eq!((p.scaling_band.as_str(), p.scaling_scale), ("a", 8));

        // without noise everything is measured at the configured k, unscaled
        let quiet = ProbeNoise {
            baseline_spread_ms: 0.0,
            round_spread_ms: 0.0,
        };
        let p = plan_replay(4, &bands, 115, 20.0, quiet, &rounds).unwrap();
        assert!(p.bands.iter().all(|(_, k)| *k == 4) && p.skipped.is_empty());
        assert_eq!((p.all_scale, p.scaling_scale), (1, 1));

        // launches known to ±0.02 ms a round: 115 cuts x 0.02 = 2.3 ms, over a tenth of 20 ms
        let shaky = ProbeNoise {
            baseline_spread_ms: 1.0,
            round_spread_ms: 0.02,
        };
        let why = plan_replay(4, &bands, 115, 20.0, shaky, &rounds).unwrap_err();
        assert!(
            why.contains("115 cuts are known only to ±2.300 ms"),
            "{why}"
        );

        // noise 50 ms: nothing clears even at k = 64
        let loud = ProbeNoise {
            baseline_spread_ms: 50.0,
            round_spread_ms: 0.0,
        };
        let why = plan_replay(4, &bands, 115, 20.0, loud, &rounds).unwrap_err();
        assert!(why.starts_with("no band's replays stand out"), "{why}");

        // noise 5 ms: a clears at 64 (a tenth of 128 ms is 12.8), b and c do not; replay-all
        // at 16 adds 40.2 ms, a tenth of which (4.0) is under 5 ms: refused for replay-all
        let five = ProbeNoise {
            baseline_spread_ms: 5.0,
            round_spread_ms: 0.0,
        };
        let why = plan_replay(4, &bands, 115, 20.0, five, &rounds).unwrap_err();
        assert!(
            why.starts_with("replaying every node adds 2.510 ms a replay"),
            "{why}"
        );
    }

    /// Exact replays, except that one call (the first cycle's baseline) is `burst_ms` slower.
    struct Burst {
        cost: Vec<f64>,
        calls: u32,
        burst_call: u32,
        burst_ms: f64,
    }

    impl ReplayEngine for Burst {
        fn replay(
            &mut self,
            _: &[bool],
            replay: &[bool],
            k: u32,
        ) -> Result<ChunkTiming, EngineError> {
            self.calls += 1;
            let extra: f64 = self
                .cost
                .iter()
                .zip(replay)
                .filter(|(_, &r)| r)
                .map(|(c, _)| c * k as f64)
                .sum();
            let burst = if self.calls == self.burst_call {
                self.burst_ms
            } else {
                0.0
            };
            Ok(ChunkTiming {
                device: None,
                wall_ms: self.cost.iter().sum::<f64>() + extra + burst,
                node_us: vec![],
                nodes_seen: self.cost.len() as u32,
                output_hash: 9,
            })
        }
    }

    #[test]
    fn cycles_noisier_than_their_probe_that_fail_a_validation_are_planned_again_and_retaken() {
        let graph = crate::mock::MockEngine::new(&[
            ("FLASH_ATTN_EXT", "node_0", "", 1.0),
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
        ])
        .graph;
        let rules = crate::band::BandRules::builtin("qwen35moe").unwrap();
        let arch =
            crate::arch::ArchInfo::from_metadata(&crate::arch::tests::qwen35moe_md(4)).unwrap();
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let bands: Vec<String> = rules.bands.iter().map(|b| b.name.clone()).collect();
        // calls: 1 the warm-up, 2-6 the probe's baselines (quiet: noise 0), 7 the first cycle's
        // baseline, 8 ms slow: the first cycle's increments read 8 ms short
        let mut e = Burst {
            cost: vec![10.0, 30.0],
            calls: 0,
            burst_call: 7,
            burst_ms: 8.0,
        };
        let r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            1,
            &ReplayConfig { k: 4, cycles: 2 },
            &expected(&[("attention", 10.0), ("moe", 30.0)]),
            &mut |_, _, _| {},
        )
        .unwrap();
        // the first measurement: replay-all (32 + 40) / 2 = 36 ms against a baseline of 44 ms,
        // 0.82, failed in cycles 8 ms apart after a probe of 0: planned again for 8 ms
        assert_eq!(r.attempts, 2);
        assert_eq!(r.retaken_after, vec!["replay-all".to_string()]);
        assert_eq!(r.noise_ms, 8.0);
        // attention: 4 x 10 carries 8 ms at most as a tenth of 80: k = 16; moe at 4 (120 ms);
        // replay-all at 2 (80 ms), the k-scaling's moe at 4 (120 ms)
        let k_of = |band: &str| r.bands.iter().find(|b| b.band == band).map(|b| b.k);
        assert_eq!((k_of("attention"), k_of("moe")), (Some(16), Some(4)));
        assert_eq!(r.scale, 2);
        assert_eq!(
            r.scaling_ms_per_replay,
            vec![(4, 30.0), (8, 30.0), (16, 30.0)]
        );
        assert!(r.reliable, "{:?}", r.checks);
        assert_eq!(r.replay_all_over_baseline, 1.0);
    }
}
