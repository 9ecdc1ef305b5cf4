//! In-graph replay timing: in-graph cost of band B = (T with B's nodes dispatched k extra
//! times, minus T baseline) / k, every run cut at the same nodes, with the method validated every time:
//! replaying every band together costs about one baseline, the per-band increments add up to
//! the replay-all increment, and k = 1, 2, 4 scale linearly (a line fitted through the
//! increments, with its R²). A band whose increment at k does not stand out of the baseline's own
//! spread is measured again with k x 4 (up to `MAX_K`), and the k used is reported per band.
//! Nodes that write in place are not replayed and are listed.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::Assignment;
use crate::engine::{Engine, EngineError};
use crate::node::NodeInfo;
use crate::stats::{linear_fit, Sample};

/// The most extra dispatches a small band is given to stand out of the noise.
pub const MAX_K: u32 = 64;
/// A band stands out when its increment is at least this many times the baseline's spread.
pub const STAND_OUT: f64 = 2.0;

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
    /// Median over cycles of (T_band - T_baseline) / k, ms for the chunk.
    pub ms: f64,
    pub ms_min: f64,
    pub ms_max: f64,
    pub ms_per_token: f64,
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
    pub bands: Vec<BandReplay>,
    /// Validation 1: every replayable node replayed once; its increment against the baseline.
    pub replay_all_ms: f64,
    pub replay_all_over_baseline: f64,
    /// Validation 2: the sum of per-band increments against the replay-all increment.
    pub sum_of_bands_ms: f64,
    pub sum_over_replay_all: f64,
    /// Validation 3: the largest band replayed k = 1, 2, 4 times: increment per replay.
    pub scaling_band: String,
    pub scaling_ms_per_replay: Vec<(u32, f64)>,
    /// The line through the median total increments at k = 1, 2, 4: slope (ms per replay), R².
    pub scaling_slope_ms: f64,
    pub scaling_r2: f64,
    /// Every replay run returned the baseline's logits bit for bit.
    pub outputs_identical: bool,
    /// Nodes that write in place (a cache write, an in-place op) and are not replayed.
    pub excluded_inplace: Vec<String>,
    /// Their share of the TIMED node time, where the caller knows it (else 0).
    #[serde(default)]
    pub excluded_share: f64,
}

/// Runs the replay measurement on a prepared engine whose graph is `graph`.
pub fn measure_replay(
    engine: &mut dyn Engine,
    graph: &[NodeInfo],
    assignments: &[Assignment],
    bands: &[String],
    tokens: u32,
    cfg: &ReplayConfig,
    progress: &mut dyn FnMut(u32, u32, &str),
) -> Result<ReplayResult, EngineError> {
    let replayable: Vec<bool> = graph.iter().map(|n| n.is_working() && !n.inplace).collect();
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
    // warm-up: allocations and the scratch buffer
    let base0 = engine.replay(&replayable, &none, 0)?;
    let reference = base0.output_hash;
    let mut identical = true;
    let mut base = Vec::new();
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
    let increments = |v: &[f64], k: u32| -> Vec<f64> {
        v.iter()
            .zip(&base)
            .map(|(t, b)| (t - b) / k as f64)
            .collect()
    };
    let spread = Sample::new(&base).map(|s| s.max() - s.min()).unwrap_or(0.0);
    let mut out_bands = Vec::new();
    for (band, mask) in &present {
        let mut kb = k;
        let mut inc = increments(&per_band[band], k);
        let stands = |inc: &[f64], kb: u32| med(inc) * kb as f64 >= STAND_OUT * spread;
        // too small to see at k: more replays, each level measured against its own baselines
        while !stands(&inc, kb) && kb < MAX_K {
            kb = (kb * 4).min(MAX_K);
            let mut again = Vec::new();
            for _ in 0..total {
                let b = engine.replay(&replayable, &none, 0)?;
                let r = engine.replay(&replayable, mask, kb)?;
                identical &= b.output_hash == reference && r.output_hash == reference;
                again.push((r.wall_ms - b.wall_ms) / kb as f64);
            }
            inc = again;
        }
        let s = Sample::new(&inc).ok();
        let ms = s.as_ref().map(|s| s.median()).unwrap_or(0.0);
        out_bands.push(BandReplay {
            band: band.clone(),
            nodes: mask.iter().filter(|&&x| x).count() as u32,
            k: kb,
            stands_out: stands(&inc, kb),
            ms,
            ms_min: s.as_ref().map(|s| s.min()).unwrap_or(0.0),
            ms_max: s.as_ref().map(|s| s.max()).unwrap_or(0.0),
            ms_per_token: ms / tokens.max(1) as f64,
        });
    }
    let replay_all_ms = med(&increments(&all, 1));
    let sum_of_bands_ms: f64 = out_bands.iter().map(|b| b.ms).sum();
    let scaling_ms_per_replay = scaling
        .iter()
        .map(|(&kk, v)| (kk, med(&increments(v, kk))))
        .collect();
    // the median total increment at k = 1, 2, 4 against k: linear if the method holds
    let (xs, ys): (Vec<f64>, Vec<f64>) = scaling
        .iter()
        .map(|(&kk, v)| (kk as f64, med(&increments(v, 1))))
        .unzip();
    let fit = linear_fit(&xs, &ys).ok();
    Ok(ReplayResult {
        k,
        cycles: total,
        tokens,
        baseline_ms: baseline,
        baseline_spread_ms: spread,
        bands: out_bands,
        replay_all_ms,
        replay_all_over_baseline: if baseline > 0.0 {
            replay_all_ms / baseline
        } else {
            0.0
        },
        sum_of_bands_ms,
        sum_over_replay_all: if replay_all_ms > 0.0 {
            sum_of_bands_ms / replay_all_ms
        } else {
            0.0
        },
        scaling_band,
        scaling_ms_per_replay,
        scaling_slope_ms: fit.map(|f| f.b).unwrap_or(0.0),
        scaling_r2: fit.map(|f| f.r2).unwrap_or(0.0),
        outputs_identical: identical,
        excluded_inplace,
        excluded_share: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{ChunkTiming, EngineInfo, Mode, Work};

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
