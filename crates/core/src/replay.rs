//! In-graph replay timing: in-graph cost of band B = (T with B's nodes dispatched k extra
//! times, minus T baseline, minus the launches those replays paid) / k, every run cut at the same
//! nodes, with the method validated every time, each validation against a stated bound: replaying
//! every band together costs about the baseline's work, the per-band increments add up to the
//! replay-all increment, and k = 1, 2, 4 scale linearly (the per-replay costs agree within a
//! stated spread, and a line fitted through the increments has R² above a bound). A failed
//! validation marks the result unreliable. A band whose increment at k does not stand out of the
//! baseline's own spread is measured again with k x 4 (up to `MAX_K`), and the k used is reported
//! per band. Nodes that write in place are not replayed and are listed.
//!
//! An engine whose replays dispatch graphs of their own (llama.cpp computes clones in rounds, one
//! graph launch and synchronisation per round, see [`Engine::replay_rounds`]) pays per round a
//! cost the baseline does not: it is measured on the engine every cycle, by runs in which every
//! replayable node dispatches `LAUNCH_ROUNDS` rounds of one trivial clone through the same path
//! ([`Engine::replay_launches`]), and removed from every increment.

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
    /// Median over cycles of (T_band - T_baseline - launches) / k, ms for the chunk.
    pub ms: f64,
    pub ms_min: f64,
    pub ms_max: f64,
    pub ms_per_token: f64,
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
    /// The baselines' max - min over the cycles, ms: the noise a band's increment must clear.
    pub baseline_spread_ms: f64,
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
    /// Validation 1: every replayable node replayed once; its increment against the baseline's
    /// work.
    pub replay_all_ms: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub replay_all_over_baseline: f64,
    /// Validation 2: the sum of per-band increments against the replay-all increment.
    pub sum_of_bands_ms: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub sum_over_replay_all: f64,
    /// Validation 3: the largest band replayed k = 1, 2, 4 times: increment per replay.
    pub scaling_band: String,
    pub scaling_ms_per_replay: Vec<(u32, f64)>,
    /// Largest / smallest of the per-replay costs at k = 1, 2, 4 (infinite when one is not
    /// positive).
    #[serde(default, deserialize_with = "infinite_when_null")]
    pub scaling_spread: f64,
    /// The line through the median total increments at k = 1, 2, 4: slope (ms per replay), R².
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
                "replay all bands once / baseline work: {replay_all_over_baseline:.3} (bound 1 ± {REPLAY_ALL_TOLERANCE})"
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

/// Runs the replay measurement on a prepared engine whose graph is `graph`.
pub fn measure_replay(
    engine: &mut dyn ReplayEngine,
    graph: &[NodeInfo],
    assignments: &[Assignment],
    bands: &[String],
    tokens: u32,
    cfg: &ReplayConfig,
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
    let none = vec![false; graph.len()];
    let present: Vec<(String, Vec<bool>)> = bands
        .iter()
        .map(|b| (b.clone(), of_band(b)))
        .filter(|(_, m)| m.iter().any(|&x| x))
        .collect();
    let k = cfg.k.max(1);
    // does any k this measurement may use dispatch launch rounds of its own?
    // the launch rounds of every k this measurement may use: 1, 2, 4 and k raised by 4 up to
    // MAX_K
    let mut rounds_of: BTreeMap<u32, u32> = BTreeMap::new();
    let mut kk = k;
    for x in [1, 2, 4] {
        rounds_of.insert(x, engine.replay_rounds(x));
    }
    loop {
        rounds_of.insert(kk, engine.replay_rounds(kk));
        if kk >= MAX_K {
            break;
        }
        kk = (kk * 4).min(MAX_K);
    }
    let launches = rounds_of.values().any(|&r| r > 0) && n_replayable > 0;
    // warm-up: allocations and the scratch buffer
    let base0 = engine.replay(&replayable, &none, 0)?;
    let reference = base0.output_hash;
    if launches {
        engine.replay_launches(&replayable, &replayable, LAUNCH_ROUNDS)?;
    }
    let mut identical = true;
    let mut base = Vec::new();
    let mut launch = Vec::new();
    let mut per_band: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut all = Vec::new();
    let mut scaling: BTreeMap<u32, Vec<f64>> = BTreeMap::new();
    let mut check = |h: u64| identical &= h == reference;
    // the largest band by node count leads the scaling check (it has the largest increment)
    let scaling_band = present
        .iter()
        .max_by_key(|(_, m)| m.iter().filter(|&&x| x).count())
        .map(|(b, _)| b.clone())
        .unwrap_or_default();
    let total = cfg.cycles.max(1);
    for c in 0..total {
        progress(c, total, "replay");
        let b = engine.replay(&replayable, &none, 0)?;
        check(b.output_hash);
        base.push(b.wall_ms);
        if launches {
            // every replayable node LAUNCH_ROUNDS rounds of one trivial clone: the launch a
            // round pays
            let l = engine.replay_launches(&replayable, &replayable, LAUNCH_ROUNDS)?;
            check(l.output_hash);
            launch.push((l.wall_ms - b.wall_ms) / (n_replayable as f64 * LAUNCH_ROUNDS as f64));
        }
        for (band, mask) in &present {
            let r = engine.replay(&replayable, mask, k)?;
            check(r.output_hash);
            per_band.entry(band.clone()).or_default().push(r.wall_ms);
        }
        let r = engine.replay(&replayable, &replayable, 1)?;
        check(r.output_hash);
        all.push(r.wall_ms);
        if let Some((_, mask)) = present.iter().find(|(b, _)| *b == scaling_band) {
            for kk in [1u32, 2, 4] {
                let r = engine.replay(&replayable, mask, kk)?;
                check(r.output_hash);
                scaling.entry(kk).or_default().push(r.wall_ms);
            }
        }
    }
    progress(total, total, "replay");
    let med = |v: &[f64]| Sample::new(v).map(|s| s.median()).unwrap_or(0.0);
    let baseline = med(&base);
    let round = Sample::new(&launch).ok();
    // ms per launch round
    let round_ms = round.as_ref().map(|s| s.median()).unwrap_or(0.0);
    let nodes_of = |mask: &[bool]| mask.iter().filter(|&&x| x).count() as f64;
    let launch_ms = |mask: &[bool], kk: u32| -> f64 {
        nodes_of(mask) * rounds_of.get(&kk).copied().unwrap_or(0) as f64 * round_ms
    };
    // per cycle: (T - T_baseline - the replays' launch rounds) / k
    let increments = |v: &[f64], launches_ms: f64, k: u32| -> Vec<f64> {
        v.iter()
            .zip(&base)
            .map(|(t, b)| (t - b - launches_ms) / k as f64)
            .collect()
    };
    let spread = Sample::new(&base).map(|s| s.max() - s.min()).unwrap_or(0.0);
    let mut out_bands = Vec::new();
    for (band, mask) in &present {
        let mut kb = k;
        let mut inc = increments(&per_band[band], launch_ms(mask, k), k);
        let stands = |inc: &[f64], kb: u32| med(inc) * kb as f64 >= STAND_OUT * spread;
        // too small to see at k: more replays, each level measured against its own baselines
        while !stands(&inc, kb) && kb < MAX_K {
            kb = (kb * 4).min(MAX_K);
            let removed = launch_ms(mask, kb);
            let mut again = Vec::new();
            for _ in 0..total {
                let b = engine.replay(&replayable, &none, 0)?;
                let r = engine.replay(&replayable, mask, kb)?;
                identical &= b.output_hash == reference && r.output_hash == reference;
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
            ms,
            ms_min: s.as_ref().map(|s| s.min()).unwrap_or(0.0),
            ms_max: s.as_ref().map(|s| s.max()).unwrap_or(0.0),
            ms_per_token: ms / tokens.max(1) as f64,
        });
    }
    let replay_all_ms = med(&increments(&all, launch_ms(&replayable, 1), 1));
    // the baseline's own cuts are launches too: one per cut node
    let baseline_work_ms = baseline - nodes_of(&replayable) * round_ms;
    let sum_of_bands_ms: f64 = out_bands.iter().map(|b| b.ms).sum();
    let scaling_mask = present
        .iter()
        .find(|(b, _)| *b == scaling_band)
        .map(|(_, m)| m.clone())
        .unwrap_or_else(|| none.clone());
    let scaling_ms_per_replay: Vec<(u32, f64)> = scaling
        .iter()
        .map(|(&kk, v)| (kk, med(&increments(v, launch_ms(&scaling_mask, kk), kk))))
        .collect();
    // the median total increment at k = 1, 2, 4 against k: linear if the method holds
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
    let sum_over_replay_all = if replay_all_ms > 0.0 {
        sum_of_bands_ms / replay_all_ms
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
    Ok(ReplayResult {
        k,
        cycles: total,
        tokens,
        baseline_ms: baseline,
        baseline_spread_ms: spread,
        round_cost_us: round.as_ref().map(|s| s.median() * 1e3),
        round_cost_min_us: round.as_ref().map(|s| s.min() * 1e3).unwrap_or(0.0),
        round_cost_max_us: round.as_ref().map(|s| s.max() * 1e3).unwrap_or(0.0),
        baseline_work_ms,
        bands: out_bands,
        replay_all_ms,
        replay_all_over_baseline,
        sum_of_bands_ms,
        sum_over_replay_all,
        scaling_band,
        scaling_ms_per_replay,
        scaling_spread,
        scaling_slope_ms: fit.map(|f| f.b).unwrap_or(0.0),
        scaling_r2,
        outputs_identical: identical,
        reliable: checks.iter().all(|c| c.pass),
        checks,
        excluded_inplace,
        excluded_share: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ChunkTiming, Engine, EngineInfo, Mode, Work};

    /// Replaying a node costs exactly its cost; cutting costs nothing.
    struct Exact {
        cost: Vec<f64>,
    }

    impl Engine for Exact {
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

    impl Engine for Launching {
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

    impl Engine for Intercept {
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

    impl Engine for Noisy {
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
                wall_ms: 100.0 + wobble + extra,
                node_us: vec![],
                nodes_seen: self.cost.len() as u32,
                output_hash: 9,
            })
        }
    }

    #[test]
    fn small_bands_get_more_replays() {
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
        let mut e = Noisy {
            cost: vec![0.1, 30.0],
            calls: 0,
        };
        let r = measure_replay(
            &mut e,
            &graph,
            &a,
            &bands,
            1,
            &ReplayConfig { k: 4, cycles: 4 },
            &mut |_, _, _| {},
        )
        .unwrap();
        assert_eq!(r.baseline_spread_ms, 4.0);
        let moe = r.bands.iter().find(|b| b.band == "moe").unwrap();
        assert_eq!((moe.k, moe.stands_out), (4, true));
        let att = r.bands.iter().find(|b| b.band == "attention").unwrap();
        // k = 4: 0.4 ms, k = 16: 1.6 ms, k = 64: 6.4 ms, still under 8 ms: reported as such
        assert_eq!((att.k, att.stands_out), (MAX_K, false));
    }
}
