//! Sweeps driven end to end through mock engines whose per-node costs are known.

use super::*;
use crate::band::BandRules;
use crate::engine::{ChunkTiming, Engine, EngineError, Mode, SweepEngine, Work};
use crate::node::NodeInfo;

/// An engine of two nodes, an attention node that grows linearly with depth and a flat MoE
/// node, keeping a pass position per mode (the two modes run in lockstep, each in its own
/// context) and logging every call. Decode steps cost `decode_attn(depth)` and a flat MoE per
/// step, plus `iso_us` of isolation per node per step in TIMED mode.
#[derive(Default)]
struct DepthMock {
    chunk: u32,
    next: [Option<u32>; 2],
    attn_a: f64,
    attn_b: f64,
    moe: f64,
    /// Relative noise: cycle c, chunk k multiply every time by 1 + noise x pseudo-random(-1..1).
    noise: f64,
    cycle: u32,
    iso_us: f64,
    /// Isolation node by node (attention, MoE), calibrated by the engine; replaces `iso_us`.
    iso_each: Option<[f64; 2]>,
    /// What the engine's calibration reports where it is not `iso_us` (a calibration that
    /// misses part of the isolation).
    iso_reported: Option<f64>,
    fail_at: Option<(Mode, u32, Phase)>,
    /// TIMED returns another output hash at this chunk.
    diverge_at: Option<u32>,
    calls: Vec<(Mode, u32, Phase)>,
}

fn slot(mode: Mode) -> usize {
    if mode == Mode::Fused {
        0
    } else {
        1
    }
}

impl DepthMock {
    fn new(attn_a: f64, attn_b: f64, moe: f64) -> DepthMock {
        DepthMock {
            chunk: 512,
            attn_a,
            attn_b,
            moe,
            ..Default::default()
        }
    }

    fn jitter(&self, chunk: u32, mode: Mode) -> f64 {
        let h = crate::tokens::splitmix64(
            ((self.cycle as u64) << 40) ^ ((chunk as u64) << 8) ^ slot(mode) as u64,
        );
        1.0 + self.noise * ((h % 2001) as f64 / 1000.0 - 1.0)
    }

    fn timing(&self, mode: Mode, attn_us: f64, moe_us: f64, hash: u64) -> ChunkTiming {
        ChunkTiming {
            device: None,
            wall_ms: (attn_us + moe_us) / 1e3,
            node_us: if mode == Mode::Timed {
                vec![attn_us, moe_us]
            } else {
                Vec::new()
            },
            nodes_seen: 2,
            output_hash: hash,
        }
    }
}

/// What the sweep asks of the mocks: their thread count (the canary's).
fn mock_info() -> crate::engine::EngineInfo {
    crate::engine::EngineInfo {
        engine: "mock".into(),
        version: String::new(),
        backend: "CPU".into(),
        threads: 1,
        settings: Default::default(),
    }
}

impl Engine for DepthMock {
    fn info(&self) -> crate::engine::EngineInfo {
        mock_info()
    }
    fn prepare(&mut self, _: &Work) -> Result<(), EngineError> {
        Ok(())
    }
    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
        Ok(Vec::new())
    }
    fn run(&mut self, _: Mode) -> Result<ChunkTiming, EngineError> {
        unimplemented!()
    }
    fn isolation_cost_us(&mut self) -> Result<Option<f64>, EngineError> {
        Ok(Some(self.iso_us))
    }

    fn as_sweep(&mut self) -> Option<&mut dyn SweepEngine> {
        Some(self)
    }
}

impl SweepEngine for DepthMock {
    fn prepare_sweep(
        &mut self,
        _: &Work,
        _: u32,
        _: Option<(u32, u32)>,
    ) -> Result<(), EngineError> {
        Ok(())
    }
    fn sweep_decode_graph(&mut self, _: u32) -> Result<Vec<NodeInfo>, EngineError> {
        Ok(Vec::new())
    }
    fn start_pass(&mut self, mode: Mode, first: u32) -> Result<(), EngineError> {
        if mode == Mode::Fused && first == 0 {
            self.cycle += 1;
        }
        self.next[slot(mode)] = Some(first);
        Ok(())
    }

    fn pass_chunk(&mut self, mode: Mode, index: u32) -> Result<ChunkTiming, EngineError> {
        assert_eq!(self.next[slot(mode)], Some(index), "chunks out of order");
        if self.fail_at == Some((mode, index, Phase::Prefill)) {
            return Err(EngineError::Failed("killed".into()));
        }
        self.calls.push((mode, index, Phase::Prefill));
        self.next[slot(mode)] = Some(index + 1);
        let depth = (index * self.chunk) as f64;
        let j = self.jitter(index, mode);
        // per token ms x tokens = chunk ms; node µs = ms x 1000
        let attn = (self.attn_a + self.attn_b * depth) * self.chunk as f64 * 1e3 * j;
        let moe = self.moe * self.chunk as f64 * 1e3 * j;
        let hash = if mode == Mode::Timed && self.diverge_at == Some(index) {
            2
        } else {
            1
        };
        Ok(self.timing(mode, attn, moe, hash))
    }

    fn pass_decode(
        &mut self,
        mode: Mode,
        after: u32,
        steps: u32,
        parallel: u32,
    ) -> Result<ChunkTiming, EngineError> {
        assert_eq!(
            self.next[slot(mode)],
            Some(after + 1),
            "decode steps come right after their chunk"
        );
        if self.fail_at == Some((mode, after, Phase::Decode)) {
            return Err(EngineError::Failed("killed".into()));
        }
        self.calls.push((mode, after, Phase::Decode));
        let depth = ((after + 1) * self.chunk) as f64;
        let tokens = (steps * parallel) as f64;
        // the same laws per generated token; TIMED adds the isolation to both nodes every step
        let attn = (self.attn_a + self.attn_b * depth) * tokens * 1e3;
        let moe = self.moe * tokens * 1e3;
        let iso = if mode == Mode::Timed {
            self.iso_us * steps as f64
        } else {
            0.0
        };
        let mut t = self.timing(mode, attn, moe, 3);
        if mode == Mode::Timed {
            t.node_us = match self.iso_each {
                Some([a, m]) => vec![attn + a * steps as f64, moe + m * steps as f64],
                None => vec![attn + iso, moe + iso],
            };
        }
        Ok(t)
    }

    fn calibrate_sweep_decode(
        &mut self,
    ) -> Result<Option<crate::engine::IsolationCalibration>, EngineError> {
        Ok(Some(match self.iso_each {
            Some(each) => crate::engine::IsolationCalibration {
                per_node_us: (each[0] + each[1]) / 2.0,
                each_node_us: each.to_vec(),
            },
            None => crate::engine::IsolationCalibration {
                per_node_us: self.iso_reported.unwrap_or(self.iso_us),
                each_node_us: Vec::new(),
            },
        }))
    }
}

fn mock_graph() -> (Vec<NodeInfo>, BandRules, SweepIndex) {
    let rules = BandRules::builtin("qwen35moe").unwrap();
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
    let md = crate::arch::tests::qwen35moe_md(4);
    let arch = crate::arch::ArchInfo::from_metadata(&md).unwrap();
    let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
    let idx = SweepIndex::new(&graph, &a, &rules, &arch);
    (graph, rules, idx)
}

fn cfg(chunks: u32, cycles: u32) -> SweepConfig {
    SweepConfig {
        work: Work {
            chunk_tokens: 512,
            depth_tokens: 0,
            all_logits: false,
            token_seed: 0,
            decode_tokens: 0,
            parallel: 1,
        },
        chunks,
        cycles,
        decode: None,
    }
}

fn sweep(e: &mut DepthMock, c: &SweepConfig, store: &mut MemoryStore) -> Result<(), SweepError> {
    run_sweep(e, c, 2, 2, store, false, &mut |_, _, _| {})
}

#[test]
fn fits_and_crossover_have_the_known_answer() {
    // attention 0.1 + 3e-4 x L ms/token, moe flat 4.3: they cross at L = 14000
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    let c = cfg(33, 2);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    assert_eq!(store.records.len(), 33 * 2 * 2);
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    assert_eq!(s.depths.len(), 33);
    assert_eq!(s.max_depth, 16384);
    let att = s.fits.iter().find(|f| f.band == "attention").unwrap();
    assert!(
        (att.fit.a - 0.1).abs() < 1e-6 && (att.fit.b - 3e-4).abs() < 1e-9,
        "{att:?}"
    );
    assert!(att.fit.r2 > 0.999999 && !att.flat);
    let moe = s.fits.iter().find(|f| f.band == "moe").unwrap();
    assert!(moe.flat && (moe.mean_ms_per_token - 4.3).abs() < 1e-6);
    let x = s.crossover.unwrap();
    assert_eq!(x.status, "within");
    assert!((x.depth.unwrap() - 14_000.0).abs() < 1.0, "{:?}", x.depth);
    // without noise every resample gives the same lines: a zero-width interval at the answer
    let (lo, hi) = x.interval.unwrap();
    assert!(
        (lo - 14_000.0).abs() < 1.0 && (hi - 14_000.0).abs() < 1.0,
        "{lo} {hi}"
    );
    // first measured depth with attention >= moe: 0.1 + 3e-4 L >= 4.3 -> L >= 14000 -> 14336
    assert_eq!(x.first_measured_depth, Some(14336));
    // node times are stored as f32: agreement is exact up to f32 rounding
    assert!(s.mean_abs_agreement < 1e-6);
    assert!(s.cost.is_some());
    assert!(
        s.depth_axis.contains("when a chunk starts"),
        "{}",
        s.depth_axis
    );
}

#[test]
fn both_modes_of_a_depth_run_back_to_back_in_alternating_order() {
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    let c = cfg(6, 1);
    sweep(&mut e, &c, &mut MemoryStore::default()).unwrap();
    // every depth's FUSED and TIMED runs are adjacent: FUSED first at even chunks
    assert_eq!(e.calls.len(), 12);
    for (k, pair) in e.calls.chunks(2).enumerate() {
        let k = k as u32;
        assert_eq!((pair[0].1, pair[1].1), (k, k), "{pair:?}");
        let first = if k.is_multiple_of(2) {
            Mode::Fused
        } else {
            Mode::Timed
        };
        assert_eq!(pair[0].0, first, "chunk {k}");
        assert_ne!(pair[0].0, pair[1].0);
    }
}

#[test]
fn a_depth_whose_two_runs_compute_different_logits_fails_the_sweep() {
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.diverge_at = Some(3);
    let c = cfg(6, 1);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    let outputs = s.checks.iter().find(|c| c.name == "outputs").unwrap();
    assert_eq!(
        outputs.status,
        crate::profile::CheckStatus::Fail,
        "{}",
        outputs.detail
    );
}

#[test]
fn a_point_lies_inside_its_own_range_at_every_depth() {
    // noisy cycles: the point is the median of the per-cycle values, the range their min..max
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.noise = 0.15;
    let c = cfg(9, 4);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    for d in &s.depths {
        for b in 0..s.bands.len() {
            assert!(
                d.ms_per_token_min[b] <= d.ms_per_token[b]
                    && d.ms_per_token[b] <= d.ms_per_token_max[b],
                "depth {} band {}: {} outside {}..{}",
                d.depth,
                s.bands[b],
                d.ms_per_token[b],
                d.ms_per_token_min[b],
                d.ms_per_token_max[b]
            );
        }
        assert!(d.fused_ms_min <= d.fused_ms && d.fused_ms <= d.fused_ms_max);
    }
}

#[test]
fn the_crossover_interval_covers_the_true_crossing_under_noise() {
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.noise = 0.10;
    let c = cfg(33, 3);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    let x = s.crossover.unwrap();
    let (lo, hi) = x.interval.unwrap();
    assert!(lo < hi, "{lo} {hi}");
    assert!(lo <= 14_000.0 && 14_000.0 <= hi, "{lo}..{hi}");
    let d = x.depth.unwrap();
    assert!(
        lo <= d && d <= hi,
        "the fit's crossing {d} lies in its interval {lo}..{hi}"
    );
    assert!(x.sigma.unwrap() > 0.0);
    assert!(x.text.contains("95 % interval"), "{}", x.text);
}

#[test]
fn a_flat_band_is_found_flat_and_a_growing_one_growing_under_run_to_run_noise() {
    // the shape of the CLI's sweep (17 depths, 3 cycles) with every run moved by up to ±15 %:
    // the MoE band does not depend on depth and must be found flat, attention must not
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.noise = 0.15;
    let c = cfg(17, 3);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    let fit = |band: &str| s.fits.iter().find(|f| f.band == band).unwrap();
    let moe = fit("moe");
    assert!(moe.flat, "{moe:?}");
    // its fitted change is noise: the slope within 3 standard errors of zero
    assert!(moe.fit.b.abs() <= 3.0 * moe.fit.se_b, "{moe:?}");
    let att = fit("attention");
    assert!(!att.flat && att.fit.b > 3.0 * att.fit.se_b, "{att:?}");
    // 0.1 -> 0.1 + 3e-4 x 8192: attention grows about 25-fold, recovered within the noise
    assert!((att.fit.b - 3e-4).abs() < 0.15 * 3e-4, "{att:?}");
}

#[test]
fn no_crossover_up_to_the_last_depth() {
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    let c = cfg(9, 1);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    let x = s.crossover.unwrap();
    assert_eq!(x.status, "beyond");
    assert!(x.text.starts_with("no crossover up to 4096"), "{}", x.text);
    assert_eq!(x.first_measured_depth, None);
}

#[test]
fn an_interrupted_sweep_resumes_without_losing_or_repeating_a_chunk() {
    let (graph, rules, idx) = mock_graph();
    let c = cfg(6, 2);
    let mut store = MemoryStore::default();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    // chunk 3 is TIMED first (odd chunks): the sweep dies with chunks 0..2 of both modes
    e.fail_at = Some((Mode::Timed, 3, Phase::Prefill));
    assert!(sweep(&mut e, &c, &mut store).is_err());
    assert_eq!(store.records.len(), 3 * 2);
    e.fail_at = None;
    sweep(&mut e, &c, &mut store).unwrap();
    let mut keys: Vec<(u32, Mode, u32)> = store
        .records
        .iter()
        .map(|r| (r.cycle, r.mode, r.chunk))
        .collect();
    let n = keys.len();
    keys.sort_unstable_by_key(|k| (k.0, slot(k.1), k.2));
    keys.dedup();
    assert_eq!(keys.len(), n, "a chunk was measured twice");
    assert_eq!(n, 6 * 2 * 2);
    let resumed: Vec<&PassLog> = store.passes.iter().filter(|p| p.first_chunk > 0).collect();
    assert_eq!(resumed.len(), 2, "both modes resumed");
    assert!(resumed.iter().all(|p| (p.cycle, p.first_chunk) == (0, 3)));
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    assert_eq!(s.depths.len(), 6);
    // every check but the noise gate's, which reads this (shared) machine's load
    assert!(
        s.checks
            .iter()
            .filter(|c| c.name != "noise")
            .all(|c| c.status == crate::profile::CheckStatus::Pass),
        "{:?}",
        s.checks
    );
}

fn decode_cfg(chunks: u32, cycles: u32) -> SweepConfig {
    SweepConfig {
        decode: Some(DecodeSteps {
            steps: 4,
            parallel: 2,
        }),
        ..cfg(chunks, cycles)
    }
}

#[test]
fn decode_steps_follow_every_chunk_with_their_isolation_removed() {
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.iso_us = 30.0;
    let c = decode_cfg(9, 2);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    // per cycle and mode: 9 chunks and 9 decode units
    assert_eq!(store.records.len(), 2 * 2 * 18);
    // chunk k, then its decode steps, in both modes, before chunk k + 1
    let first_cycle: Vec<(u32, Phase)> = e.calls[..36].iter().map(|c| (c.1, c.2)).collect();
    for k in 0..9u32 {
        let i = 4 * k as usize;
        assert_eq!(
            first_cycle[i..i + 4],
            [
                (k, Phase::Prefill),
                (k, Phase::Prefill),
                (k, Phase::Decode),
                (k, Phase::Decode)
            ]
        );
    }
    // which mode goes first alternates by depth and by cycle: every depth is measured in both
    // orders over the two cycles
    let firsts = |cycle: usize| -> Vec<Mode> {
        e.calls[cycle * 36..(cycle + 1) * 36]
            .chunks(4)
            .map(|unit| unit[0].0)
            .collect()
    };
    for (k, (a, b)) in firsts(0).iter().zip(firsts(1)).enumerate() {
        assert_ne!(*a, b, "depth {k} was measured in one order only");
    }
    assert_eq!(firsts(0)[..2], [Mode::Fused, Mode::Timed]);
    let s = summarise_sweep_with_decode(
        &c,
        &rules,
        &graph,
        &idx,
        Some((&graph, &idx)),
        &store.records,
        &store.passes,
    )
    .unwrap();
    let d = s.decode.as_ref().unwrap();
    assert_eq!(d.tokens, 8);
    assert_eq!(d.depths.len(), 9);
    // the decode depth is the context after the chunk
    assert_eq!(d.depths[0].depth, 512);
    // TIMED paid 30 µs a node a step: raw agreement above 0, exactly 0 once removed
    assert!(d.mean_abs_agreement > 0.0);
    assert!(
        d.mean_abs_agreement_corrected < 1e-6,
        "{}",
        d.mean_abs_agreement_corrected
    );
    // the bands per generated token follow the laws: attention grows, the MoE is flat
    let att = d.fits.iter().find(|f| f.band == "attention").unwrap();
    assert!((att.fit.b - 3e-4).abs() < 1e-9 && !att.flat, "{att:?}");
    let moe = d.fits.iter().find(|f| f.band == "moe").unwrap();
    assert!(moe.flat && (moe.mean_ms_per_token - 4.3).abs() < 1e-6);
    // the same laws cross at depth 14000, beyond the 4608 tokens of this sweep
    let x = d.crossover.as_ref().unwrap();
    assert_eq!(x.status, "beyond");
    assert!((x.depth.unwrap() - 14_000.0).abs() < 1.0, "{:?}", x.depth);
}

#[test]
fn a_decode_crossover_past_the_last_prefill_depth_is_measured_not_extrapolated() {
    // attention 0.1 + 3e-4 x L, the MoE flat at 1.42: they cross at L = 4400, past the last
    // prefill depth (8 x 512 = 4096) but before the decode steps after it (9 x 512 = 4608)
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 1.42);
    let c = decode_cfg(9, 2);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep_with_decode(
        &c,
        &rules,
        &graph,
        &idx,
        Some((&graph, &idx)),
        &store.records,
        &store.passes,
    )
    .unwrap();
    assert_eq!(s.crossover.as_ref().unwrap().status, "beyond");
    let x = s.decode.as_ref().unwrap().crossover.as_ref().unwrap();
    assert_eq!(x.status, "within", "{}", x.text);
    assert!((x.depth.unwrap() - 4400.0).abs() < 1.0, "{:?}", x.depth);
    assert_eq!(x.first_measured_depth, Some(4608));
    assert!(!x.text.contains("extrapolated"), "{}", x.text);
}

#[test]
fn a_node_by_node_decode_calibration_removes_each_node_s_own_isolation() {
    // the attention node pays 40 µs a step to be isolated, the MoE node 4: the average (22)
    // would leave the MoE band 18 µs a step too high and the attention band 18 too low
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.iso_each = Some([40.0, 4.0]);
    let c = decode_cfg(5, 2);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let timed: Vec<&ChunkRecord> = store
        .records
        .iter()
        .filter(|r| r.mode == Mode::Timed && r.phase == Phase::Decode)
        .collect();
    assert!(timed.iter().all(|r| r.isolation_node_us == [40.0, 4.0]));
    let s = summarise_sweep_with_decode(
        &c,
        &rules,
        &graph,
        &idx,
        Some((&graph, &idx)),
        &store.records,
        &store.passes,
    )
    .unwrap();
    let d = s.decode.as_ref().unwrap();
    assert!(
        d.mean_abs_agreement_corrected < 1e-6,
        "{}",
        d.mean_abs_agreement_corrected
    );
    let moe = d.fits.iter().find(|f| f.band == "moe").unwrap();
    assert!((moe.mean_ms_per_token - 4.3).abs() < 1e-6, "{moe:?}");
    let att = d.fits.iter().find(|f| f.band == "attention").unwrap();
    assert!((att.fit.b - 3e-4).abs() < 1e-9, "{att:?}");
}

#[test]
fn what_the_decode_calibration_misses_does_not_make_flat_bands_grow() {
    // every node pays 30 µs a step to be isolated, the calibration finds 20: the 10 left over
    // a node and step, apportioned by share x wall, would go to the MoE in a share that grows
    // with the wall as attention grows with depth; taken equally from every node it is gone
    let (graph, rules, idx) = mock_graph();
    let mut e = DepthMock::new(0.01, 3e-5, 0.05);
    e.iso_us = 30.0;
    e.iso_reported = Some(20.0);
    let c = decode_cfg(9, 2);
    let mut store = MemoryStore::default();
    sweep(&mut e, &c, &mut store).unwrap();
    let s = summarise_sweep_with_decode(
        &c,
        &rules,
        &graph,
        &idx,
        Some((&graph, &idx)),
        &store.records,
        &store.passes,
    )
    .unwrap();
    let d = s.decode.as_ref().unwrap();
    // the calibrated agreement shows what was missed: 2 nodes x 10 µs x 4 steps over the wall
    assert!(d.mean_abs_agreement_corrected > 0.01);
    // (node times are stored as f32: 1e-8 ms)
    let moe = d.fits.iter().find(|f| f.band == "moe").unwrap();
    assert!(
        moe.flat && moe.fit.b.abs() < 1e-12 && (moe.mean_ms_per_token - 0.05).abs() < 1e-8,
        "{moe:?}"
    );
    let att = d.fits.iter().find(|f| f.band == "attention").unwrap();
    assert!((att.fit.b - 3e-5).abs() < 1e-12, "{att:?}");
}

#[test]
fn a_sweep_killed_between_a_chunk_and_its_decode_steps_resumes_at_the_steps() {
    let c = decode_cfg(5, 1);
    let mut store = MemoryStore::default();
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    e.fail_at = Some((Mode::Fused, 2, Phase::Decode));
    assert!(sweep(&mut e, &c, &mut store).is_err());
    e.fail_at = None;
    e.calls.clear();
    sweep(&mut e, &c, &mut store).unwrap();
    // the resumed pass starts with the decode steps of chunk 2 (refilled past chunk 2)
    assert_eq!(e.calls[0].1, 2);
    assert_eq!(e.calls[0].2, Phase::Decode);
    assert_eq!(store.records.len(), 2 * 5 * 2);
    let mut keys: Vec<(Mode, u32, Phase)> = store
        .records
        .iter()
        .map(|r| (r.mode, r.chunk, r.phase))
        .collect();
    let n = keys.len();
    keys.sort_unstable_by_key(|k| (slot(k.0), k.1, k.2));
    keys.dedup();
    assert_eq!(keys.len(), n, "a unit was measured twice");
}

/// Chunk times of a two-layer model: layer 0 slides over `window` tokens (its attention
/// grows with depth only until the window is full), layer 1 attends to everything.
struct SlidingMock {
    chunk: u32,
    window: u32,
    next: [Option<u32>; 2],
}

impl Engine for SlidingMock {
    fn info(&self) -> crate::engine::EngineInfo {
        mock_info()
    }
    fn prepare(&mut self, _: &Work) -> Result<(), EngineError> {
        Ok(())
    }
    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
        Ok(Vec::new())
    }
    fn run(&mut self, _: Mode) -> Result<ChunkTiming, EngineError> {
        unimplemented!()
    }

    fn as_sweep(&mut self) -> Option<&mut dyn SweepEngine> {
        Some(self)
    }
}

impl SweepEngine for SlidingMock {
    fn prepare_sweep(
        &mut self,
        _: &Work,
        _: u32,
        _: Option<(u32, u32)>,
    ) -> Result<(), EngineError> {
        Ok(())
    }
    fn sweep_decode_graph(&mut self, _: u32) -> Result<Vec<NodeInfo>, EngineError> {
        Ok(Vec::new())
    }
    fn pass_decode(&mut self, _: Mode, _: u32, _: u32, _: u32) -> Result<ChunkTiming, EngineError> {
        unimplemented!("the sliding mock sweeps prefill chunks only")
    }
    fn start_pass(&mut self, mode: Mode, first: u32) -> Result<(), EngineError> {
        self.next[slot(mode)] = Some(first);
        Ok(())
    }

    fn pass_chunk(&mut self, mode: Mode, index: u32) -> Result<ChunkTiming, EngineError> {
        self.next[slot(mode)] = Some(index + 1);
        let depth = (index * self.chunk) as f64;
        let tok = self.chunk as f64 * 1e3;
        let sliding = (0.2 + 1e-4 * depth.min(self.window as f64)) * tok;
        let full = (0.2 + 1e-4 * depth) * tok;
        let ffn = 1.0 * tok;
        Ok(ChunkTiming {
            device: None,
            wall_ms: (sliding + full + ffn) / 1e3,
            node_us: if mode == Mode::Timed {
                vec![sliding, full, ffn]
            } else {
                Vec::new()
            },
            nodes_seen: 3,
            output_hash: 1,
        })
    }
}

#[test]
fn sliding_window_attention_is_fitted_apart_and_flattens_past_its_window() {
    let mut md = crate::arch::tests::dense_md("gemma3", 2);
    md.u.insert("gemma3.attention.sliding_window".into(), 2048);
    md.a.insert("gemma3.attention.sliding_window_pattern".into(), vec![1, 0]);
    let arch = crate::arch::ArchInfo::from_metadata(&md).unwrap();
    let rules = BandRules::builtin("gemma3").unwrap();
    let graph = crate::mock::MockEngine::new(&[
        ("SOFT_MAX", "kq_soft_max-0", "", 1.0),
        ("SOFT_MAX", "kq_soft_max-1", "", 1.0),
        ("MUL_MAT", "ffn_out-0", "blk.0.ffn_down.weight", 1.0),
    ])
    .graph;
    let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
    let idx = SweepIndex::new(&graph, &a, &rules, &arch);
    // only the bands the graph holds, and @ffn resolved for a dense model
    assert_eq!(idx.bands, vec!["attention", "dense_ffn"]);
    assert_eq!(idx.ffn_band.as_deref(), Some("dense_ffn"));
    assert_eq!(idx.kind, vec![0, 1, u8::MAX]);
    let c = cfg(17, 1);
    let mut store = MemoryStore::default();
    let mut e = SlidingMock {
        chunk: 512,
        window: 2048,
        next: [None, None],
    };
    run_sweep(
        &mut e,
        &c,
        graph.len(),
        0,
        &mut store,
        false,
        &mut |_, _, _| {},
    )
    .unwrap();
    let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
    assert_eq!(s.attention_kinds.len(), 2);
    let sliding = &s.attention_kinds[0];
    assert_eq!(
        (sliding.kind, sliding.window, sliding.fit_from_depth),
        (crate::arch::LayerKind::SlidingWindow, Some(2048), 2048)
    );
    let f = sliding.fit.as_ref().unwrap();
    assert!(f.flat && f.fit.b.abs() < 1e-9, "{f:?}");
    assert!(
        sliding.text.contains("flat past the window"),
        "{}",
        sliding.text
    );
    let full = s.attention_kinds[1].fit.as_ref().unwrap();
    assert!(!full.flat && (full.fit.b - 1e-4).abs() < 1e-9, "{full:?}");
    // the two kinds add up to the attention band at every depth
    for d in &s.depths {
        let sum: f64 = d.attention_by_kind.iter().sum();
        assert!((sum - d.ms_per_token[0]).abs() < 1e-9);
    }
}

#[test]
fn a_gap_in_stored_chunks_is_refused() {
    let mut store = MemoryStore::default();
    for chunk in [0, 2] {
        store
            .store(&ChunkRecord {
                cycle: 0,
                mode: Mode::Fused,
                chunk,
                phase: Phase::Prefill,
                wall_ms: 1.0,
                output_hash: 1,
                outputs_nmse: None,
                isolation_us: 0.0,
                isolation_node_us: Vec::new(),
                node_us: vec![],
            })
            .unwrap();
    }
    let mut e = DepthMock::new(0.1, 3e-4, 4.3);
    assert!(matches!(
        sweep(&mut e, &cfg(4, 1), &mut store),
        Err(SweepError::Gap { .. })
    ));
}

#[test]
fn pairs_that_differ_are_compared_by_nmse_within_the_device_bound_and_fail_on_the_cpu() {
    use crate::profile::CheckStatus;
    let mut md = crate::arch::tests::dense_md("gemma3", 2);
    md.u.insert("gemma3.attention.sliding_window".into(), 2048);
    md.a.insert("gemma3.attention.sliding_window_pattern".into(), vec![1, 0]);
    let arch = crate::arch::ArchInfo::from_metadata(&md).unwrap();
    let rules = BandRules::builtin("gemma3").unwrap();
    // TIMED's logits off by 2^-10 in one value of three: NMSE = 2^-20 / 5.25 per pair
    let sweep_with = |device: &str, d: f32, compare: bool, decode: bool| {
        let mut e = crate::mock::MockEngine::new(&[
            ("SOFT_MAX", "kq_soft_max-0", "", 1.0),
            ("MUL_MAT", "ffn_out-0", "blk.0.ffn_down.weight", 1.0),
        ]);
        e.timed_logits = Some(vec![0.5, 2.0 + d, -1.0]);
        for n in &mut e.graph {
            n.device = Some(device.into());
        }
        let graph = e.graph.clone();
        let mut c = cfg(3, 2);
        c.decode = decode.then_some(DecodeSteps {
            steps: 2,
            parallel: 1,
        });
        e.prepare_sweep(&c.work, c.chunks, decode.then_some((2, 1)))
            .unwrap();
        let mut store = MemoryStore::default();
        run_sweep(
            &mut e,
            &c,
            graph.len(),
            graph.len(),
            &mut store,
            compare,
            &mut |_, _, _| {},
        )
        .unwrap();
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let idx = SweepIndex::new(&graph, &a, &rules, &arch);
        let s = summarise_sweep_with_decode(
            &c,
            &rules,
            &graph,
            &idx,
            decode.then_some((graph.as_slice(), &idx)),
            &store.records,
            &store.passes,
        )
        .unwrap();
        let check = s
            .checks
            .iter()
            .find(|c| c.name == "outputs")
            .unwrap()
            .clone();
        (store.records, check)
    };
    let sweep_on = |device: &str, d: f32, compare: bool| sweep_with(device, d, compare, false);
    let (records, c) = sweep_on("Vulkan0", 2f32.powi(-10), true);
    // 3 depths x 2 cycles: every pair's second unit carries the NMSE, the first none
    let nmse: Vec<f64> = records.iter().filter_map(|r| r.outputs_nmse).collect();
    assert_eq!(nmse.len(), 6, "{records:?}");
    let want = 2f64.powi(-20) / 5.25;
    assert!(nmse.iter().all(|n| (n - want).abs() < 1e-12 * want));
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    for said in [
        "not bit-identical",
        "6 paired",
        "1.82e-7",
        "5e-4",
        "Vulkan0",
    ] {
        assert!(c.detail.contains(said), "{said}: {}", c.detail);
    }
    // beyond the bound
    let (_, c) = sweep_on("Vulkan0", 2f32.powi(-3), true);
    assert_eq!(c.status, CheckStatus::Fail, "{}", c.detail);
    assert!(c.detail.contains("BEYOND the bound"), "{}", c.detail);
    // the CPU: compared or not, a difference fails
    let (_, c) = sweep_on("CPU", 2f32.powi(-10), false);
    assert_eq!(c.status, CheckStatus::Fail, "{}", c.detail);
    assert!(c.detail.contains("6 paired units"), "{}", c.detail);
    // a device whose pairs were not compared: the hashes alone, a failure
    let (records, c) = sweep_on("Vulkan0", 2f32.powi(-10), false);
    assert!(records.iter().all(|r| r.outputs_nmse.is_none()));
    assert_eq!(c.status, CheckStatus::Fail, "{}", c.detail);
    // with decode steps after every chunk: their pairs compared too (the last step's logits)
    let (records, c) = sweep_with("Vulkan0", 2f32.powi(-10), true, true);
    let decoded: Vec<f64> = records
        .iter()
        .filter(|r| r.phase == Phase::Decode)
        .filter_map(|r| r.outputs_nmse)
        .collect();
    assert_eq!(decoded.len(), 6, "{records:?}");
    assert!(decoded.iter().all(|n| (n - want).abs() < 1e-12 * want));
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    assert!(c.detail.contains("12 paired units differ"), "{}", c.detail);
    // the same logits in both modes: nothing compared, bit-identical
    let (records, c) = sweep_on("Vulkan0", 0.0, true);
    assert!(records.iter().all(|r| r.outputs_nmse.is_none()));
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    assert!(c.detail.contains("bit-identical"), "{}", c.detail);
}
