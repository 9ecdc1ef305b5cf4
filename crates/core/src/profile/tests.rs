use super::measure::ORDERS;
use super::*;
use crate::arch::tests::qwen35moe_md;
use crate::arch::ArchInfo;
use crate::band::{BandRules, UNASSIGNED};
use crate::engine::{Engine, EngineError};
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
        gate: no_gate(),
    }
}

/// The noise gate off: it reads the real machine (/proc, the canary's timing), and a retake it
/// calls on a busy machine would shift the mock engine's scripted runs.
fn no_gate() -> crate::noise::GateConfig {
    crate::noise::GateConfig {
        enabled: false,
        ..Default::default()
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
        device_timed: None,
        device_fused: None,
        order: ORDERS[0].to_vec(),
        fused_ms: fused,
        fused_observed_ms: fused,
        timed_wall_ms: fused,
        node_us: t.to_vec(),
        isolation_us: None,
        isolation_node_us: Vec::new(),
        noise: Vec::new(),
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
        overhead_pairs_noise: Vec::new(),
        gate: Default::default(),
        outputs_checked_finite: true,
        node_steps: None,
        one_process_fused_ms: Vec::new(),
        one_process_outputs: None,
        one_process_skipped: None,
        outputs_compared: Vec::new(),
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
        device_timed: None,
        device_fused: None,
        order: ORDERS[0].to_vec(),
        fused_ms: 0.160,
        fused_observed_ms: 0.160,
        timed_wall_ms: 0.220,
        node_us: vec![4.0 * 17.0, 4.0 * 37.0],
        isolation_us: Some(5.0),
        isolation_node_us: vec![5.0, 5.0],
        noise: Vec::new(),
    };
    let raw = ProfileRaw {
        schema_version: PROFILE_SCHEMA_VERSION,
        config: c,
        graph: e.graph.clone(),
        cycles: vec![cycle.clone(), cycle],
        output_hashes: BTreeMap::new(),
        overhead_pairs: Vec::new(),
        overhead_pairs_noise: Vec::new(),
        gate: Default::default(),
        outputs_checked_finite: true,
        node_steps: Some(4),
        one_process_fused_ms: Vec::new(),
        one_process_outputs: None,
        one_process_skipped: None,
        outputs_compared: Vec::new(),
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
fn a_band_stopped_at_zero_by_the_isolation_removal_is_said_so() {
    // decode of 4 steps: the MoE node's TIMED time (3 µs a step) is below its 5 µs calibrated
    // isolation, so it is left at 0; attention keeps 148 - 20 = 128 µs, and the remainder (8 µs)
    // brings it to the 120 µs wall. The MoE band did work yet its corrected figure is 0.
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
    let cycle = |moe_us: f64| CycleRecord {
        device_timed: None,
        device_fused: None,
        order: ORDERS[0].to_vec(),
        fused_ms: 0.120,
        fused_observed_ms: 0.120,
        timed_wall_ms: 0.200,
        node_us: vec![moe_us, 4.0 * 37.0],
        isolation_us: Some(5.0),
        isolation_node_us: vec![5.0, 5.0],
        noise: Vec::new(),
    };
    let mut raw = ProfileRaw {
        schema_version: PROFILE_SCHEMA_VERSION,
        config: c,
        graph: e.graph.clone(),
        // the second cycle's MoE node keeps 6 µs: a node stopped in one cycle counts
        cycles: vec![cycle(4.0 * 3.0), cycle(4.0 * 10.0)],
        output_hashes: BTreeMap::new(),
        overhead_pairs: Vec::new(),
        overhead_pairs_noise: Vec::new(),
        gate: Default::default(),
        outputs_checked_finite: true,
        node_steps: Some(4),
        one_process_fused_ms: Vec::new(),
        one_process_outputs: None,
        one_process_skipped: None,
        outputs_compared: Vec::new(),
    };
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    let moe = s.band("moe").unwrap();
    assert_eq!(moe.corrected_clamped_nodes, 1, "{moe:?}");
    assert_eq!(s.band("attention").unwrap().corrected_clamped_nodes, 0);
    let warn = s
        .checks
        .iter()
        .find(|c| c.name == "corrected at 0")
        .unwrap();
    assert_eq!(warn.status, CheckStatus::Warn);
    assert!(warn.detail.contains("moe 1 of 1 working nodes"), "{warn:?}");
    assert!(!warn.detail.contains("whole band"), "{warn:?}");
    // both cycles stopped: the whole band is at 0, and the warning says so
    raw.cycles[1] = raw.cycles[0].clone();
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    assert_eq!(s.band("moe").unwrap().ms_per_token_corrected, 0.0);
    let warn = s
        .checks
        .iter()
        .find(|c| c.name == "corrected at 0")
        .unwrap();
    assert!(warn.detail.contains("the whole band at 0"), "{warn:?}");
    // no node below its isolation: no warning
    raw.cycles = vec![cycle(4.0 * 17.0), cycle(4.0 * 17.0)];
    raw.cycles.iter_mut().for_each(|c| c.fused_ms = 0.160);
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    assert!(s.checks.iter().all(|c| c.name != "corrected at 0"));
    assert!(s.bands.iter().all(|b| b.corrected_clamped_nodes == 0));
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

#[test]
fn a_run_without_output_hashes_does_not_claim_identical_outputs() {
    let mut e = MockEngine::new(&NODES);
    let mut raw = measure(&mut e, &cfg(2), &mut |_, _, _| {}).unwrap();
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    let measured = analyse(&raw, &rules, &arch).unwrap().1;
    let c = measured
        .checks
        .iter()
        .find(|c| c.name == "outputs")
        .unwrap();
    assert_eq!(c.status, CheckStatus::Pass);
    // node records and imported traces carry no outputs
    raw.output_hashes.clear();
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    let c = s.checks.iter().find(|c| c.name == "outputs").unwrap();
    assert_eq!(c.status, CheckStatus::Warn);
    assert!(c.detail.contains("not measured"), "{}", c.detail);
}

#[test]
fn a_split_whose_copies_ggml_cut_fails_its_device_check_and_an_uncompared_one_warns() {
    let mut e = MockEngine::new(&NODES);
    let mut raw = measure(&mut e, &cfg(2), &mut |_, _, _| {}).unwrap();
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    let device = "RPC0[gpu-node-17.cluster.example.org:50052]";
    for n in &mut raw.graph {
        n.device = Some(device.into());
    }
    raw.one_process_skipped = Some("--no-one-process".into());
    let check = |raw: &ProfileRaw, name: &str| {
        let s = analyse(raw, &rules, &arch).unwrap().1;
        s.checks.into_iter().find(|c| c.name == name).unwrap()
    };
    assert_eq!(check(&raw, "devices").status, CheckStatus::Pass);
    let outputs = check(&raw, "split outputs");
    assert_eq!(outputs.status, CheckStatus::Warn);
    assert!(outputs.detail.contains("--no-one-process"), "{outputs:?}");
    // a copy "<device>#ffn_moe_weights_norm-12#0" cut at 63 characters
    let cut =
        format!("{device}#ffn_moe_weights_norm-12#0")[..crate::split::MAX_NAME_LEN].to_string();
    let mut src = raw.graph[0].out.clone();
    src.name = cut;
    raw.graph[2].srcs.push(Some(src));
    let devices = check(&raw, "devices");
    assert_eq!(devices.status, CheckStatus::Fail);
    assert!(
        devices
            .detail
            .contains("1 copies between devices are not counted"),
        "{devices:?}"
    );
}

#[test]
fn figures_of_runs_that_did_not_take_place_are_null_and_their_checks_say_not_measured() {
    use crate::engine::Mode;
    let mut e = MockEngine::new(&NODES);
    // the gate on (what it reads is not asserted here, only that it measured)
    let mut config = cfg(3);
    config.gate = crate::noise::GateConfig::default();
    let mut raw = measure(&mut e, &config, &mut |_, _, _| {}).unwrap();
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    let summary = |raw: &ProfileRaw| analyse(raw, &rules, &arch).unwrap().1;
    let check =
        |s: &ProfileSummary, name: &str| s.checks.iter().find(|c| c.name == name).unwrap().clone();
    // a measured profile: every figure a number
    let s = summary(&raw);
    for x in [
        s.agreement,
        s.overhead,
        s.isolation_us,
        s.agreement_corrected,
    ] {
        assert!(x.is_finite());
    }
    assert!(!check(&s, "noise").detail.starts_with(NOT_MEASURED));

    // node records: FUSED and TIMED runs, no run with the instrument installed, no gate
    for c in &mut raw.cycles {
        c.order = vec![Mode::Fused, Mode::Timed];
        c.fused_observed_ms = c.fused_ms;
    }
    raw.overhead_pairs.clear();
    raw.config.gate.enabled = false;
    let s = summary(&raw);
    assert!(s.agreement.is_finite() && s.agreement_of_minimums.is_finite());
    assert!(s.overhead.is_nan() && s.overhead_of_minimums.is_nan());
    assert!(s.overhead_spread.median.is_nan() && s.overhead_spread.max.is_nan());
    let v = serde_json::to_value(&s).unwrap();
    assert!(v["overhead"].is_null() && v["overhead_of_minimums"].is_null());
    assert!(v["agreement"].is_number());
    for name in ["overhead", "noise"] {
        let c = check(&s, name);
        assert_eq!(c.status, CheckStatus::Warn, "{name}");
        assert!(c.detail.starts_with(NOT_MEASURED), "{name}: {}", c.detail);
    }
    assert!(!check(&s, "agreement").detail.starts_with(NOT_MEASURED));

    // an imported trace: one self-traced (TIMED) run, no idle node, no calibration
    let keep: Vec<usize> = (0..raw.graph.len())
        .filter(|&i| raw.graph[i].is_working())
        .collect();
    assert!(keep.len() < raw.graph.len(), "the mock graph has a view");
    raw.graph = keep.iter().map(|&i| raw.graph[i].clone()).collect();
    for c in &mut raw.cycles {
        c.node_us = keep.iter().map(|&i| c.node_us[i]).collect();
        c.order = vec![Mode::Timed];
        c.isolation_us = None;
        c.isolation_node_us.clear();
    }
    let s = summary(&raw);
    for (name, x) in [
        ("agreement", s.agreement),
        ("agreement_corrected", s.agreement_corrected),
        ("isolation_us", s.isolation_us),
        ("isolation_us_per_step", s.isolation_us_per_step),
        ("overhead", s.overhead),
        ("agreement_of_minimums", s.agreement_of_minimums),
    ] {
        assert!(x.is_nan(), "{name} = {x}");
    }
    let v = serde_json::to_value(&s).unwrap();
    for key in [
        "agreement",
        "agreement_corrected",
        "isolation_us",
        "overhead",
    ] {
        assert!(v[key].is_null(), "{key}: {}", v[key]);
    }
    assert!(v["agreement_spread"]["median"].is_null());
    // summary.json is read back with its nulls
    let back: ProfileSummary = serde_json::from_value(v).unwrap();
    assert!(back.agreement.is_nan() && back.agreement_spread.min.is_nan());
    let c = check(&s, "agreement");
    assert_eq!(c.status, CheckStatus::Warn);
    assert!(c.detail.starts_with(NOT_MEASURED), "{}", c.detail);
    // the bands still stand: the shares of the TIMED run times its wall
    assert!(s.fused_ms.is_finite() && s.bands.iter().all(|b| b.ms_per_token.is_finite()));
}

#[test]
fn without_a_calibration_each_device_pays_its_own_idle_nodes() {
    // a graph over the CPU (nodes 0-2) and a GPU (3-5), each with one view, measured by an
    // engine without an isolation calibration (a llama.cpp worker)
    const SPLIT: [MockNode; 6] = [
        ("GATED_DELTA_NET", "node_0", "", 300.0),
        ("RESHAPE", "node_0 (reshaped)", "", 0.0),
        (
            "MUL_MAT_ID",
            "ffn_moe_gate-0",
            "blk.0.ffn_gate_exps.weight",
            500.0,
        ),
        ("FLASH_ATTN_EXT", "node_3", "", 100.0),
        ("VIEW", "node_3 (view)", "", 0.0),
        ("ADD", "l_out-3", "", 50.0),
    ];
    let mut e = MockEngine::new(&SPLIT);
    let mut raw = measure(&mut e, &cfg(2), &mut |_, _, _| {}).unwrap();
    for (i, n) in raw.graph.iter_mut().enumerate() {
        n.device = Some(if i < 3 { "CPU" } else { "CUDA0" }.into());
    }
    let times = [
        [310.0, 4.0, 520.0, 130.0, 30.0, 60.0],
        [305.0, 6.0, 505.0, 120.0, 20.0, 55.0],
    ];
    for (c, (us, fused)) in raw.cycles.iter_mut().zip(times.iter().zip([1.0, 0.9])) {
        c.node_us = us.to_vec();
        c.fused_ms = fused;
        c.isolation_us = None;
        c.isolation_node_us.clear();
    }
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    assert_eq!(s.isolation_source, "idle nodes of each device");
    // each device's view: CPU 4 and 6 µs, GPU 30 and 20: medians over the two cycles
    assert!(close(s.isolation_device_us["CPU"], 5.0), "{s:?}");
    assert!(close(s.isolation_device_us["CUDA0"], 25.0), "{s:?}");
    // removed node by node: cycle 1 (310-4) + (520-4) + (130-30) + (60-30) = 952 µs against
    // 1.0 ms; cycle 2 (305-6) + (505-6) + (120-20) + (55-20) = 933 µs against 0.9 ms
    let want = ((952.0 / 1000.0 - 1.0) + (933.0 / 900.0 - 1.0)) / 2.0;
    assert!(
        close(s.agreement_corrected, want),
        "{} vs {want}",
        s.agreement_corrected
    );
    // raw: 1054 / 1000 and 1011 / 900
    assert!(close(
        s.agreement,
        ((1054.0 / 1000.0 - 1.0) + (1011.0 / 900.0 - 1.0)) / 2.0
    ));
    let devices = s.checks.iter().find(|c| c.name == "devices").unwrap();
    assert!(
        devices.detail.contains("CPU 5.0 µs, CUDA0 25.0 µs"),
        "{}",
        devices.detail
    );
    // one device: the single idle-node figure, no table of devices
    for n in &mut raw.graph {
        n.device = Some("CPU".into());
    }
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    assert_eq!(s.isolation_source, "idle nodes");
    assert!(s.isolation_device_us.is_empty() && s.devices.is_empty());
    assert!(!s.checks.iter().any(|c| c.name == "devices"));
}

#[test]
fn every_group_at_once_gives_each_group_s_own_estimate() {
    // cycle 0: nodes 10, 30, 0, 60 (sum 100), FUSED 2 ms; cycle 1: 20, 20, 40, 20 (sum 100),
    // FUSED 4 ms; 2 tokens. Groups {0, 2}, {1}, {3}, and an empty one
    let times: [&[f64]; 2] = [&[10.0, 30.0, 0.0, 60.0], &[20.0, 20.0, 40.0, 20.0]];
    let fused = [2.0, 4.0];
    let group = [0, 1, 0, 2];
    let all = summary::per_cycle_group_ms_per_token(&times, &fused, 2.0, &group, 4);
    // group 0: 10/100 x 2 / 2 = 0.1 and 60/100 x 4 / 2 = 1.2
    assert_eq!(all.ms_per_token[0], [0.1, 1.2]);
    assert_eq!(all.parts[0], [10.0, 60.0]);
    assert_eq!(all.ms_per_token[3], [0.0, 0.0]);
    for g in 0..4 {
        let one = per_cycle_ms_per_token(&times, &fused, 2.0, &membership(|i| group[i] == g));
        let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&all.ms_per_token[g]), bits(&one), "group {g}");
    }
}

#[test]
fn a_node_time_that_is_not_finite_is_refused() {
    let mut e = MockEngine::new(&NODES);
    let mut raw = measure(&mut e, &cfg(3), &mut |_, _, _| {}).unwrap();
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    assert!(analyse(&raw, &rules, &arch).is_ok());
    raw.cycles[2].node_us[4] = f64::NAN;
    match analyse(&raw, &rules, &arch) {
        Err(SummaryError::BadSample(what)) => assert_eq!(what, "node times"),
        other => panic!("expected node times refused, got {:?}", other.map(|_| ())),
    }
}

#[test]
fn modes_that_differ_are_compared_by_nmse_within_a_stated_bound_off_the_cpu_and_fail_on_it() {
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
    // TIMED's logits off by 2^-10 in one value of three: NMSE = 2^-20 / (0.25 + 4 + 1)
    let off_by = |d: f32, device: &str| {
        let mut e = MockEngine::new(&NODES);
        e.timed_logits = Some(vec![0.5, 2.0 + d, -1.0]);
        for n in &mut e.graph {
            n.device = Some(device.into());
        }
        let raw = measure(&mut e, &cfg(4), &mut |_, _, _| {}).unwrap();
        let s = analyse(&raw, &rules, &arch).unwrap().1;
        let c = s
            .checks
            .iter()
            .find(|c| c.name == "outputs")
            .unwrap()
            .clone();
        (raw, s, c)
    };
    let small = 2f64.powi(-20) / 5.25;
    let (raw, s, c) = off_by(2f32.powi(-10), "Vulkan0");
    // FUSED's and FUSED-observed's hash, TIMED's: one comparison, TIMED against the first run
    // (FUSED, the first mode of the first order), its logits read once
    assert_eq!(raw.outputs_compared.len(), 1, "{:?}", raw.outputs_compared);
    let cmp = &raw.outputs_compared[0];
    assert_eq!(
        (cmp.mode.as_str(), cmp.against_mode.as_str()),
        ("timed", "fused")
    );
    assert_eq!(cmp.rows.len(), 1);
    assert!((cmp.rows[0].nmse - small).abs() < 1e-12 * small.max(1.0));
    assert!(!s.outputs_identical);
    assert_eq!(s.outputs_max_nmse, Some(cmp.rows[0].nmse));
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    for said in ["not bit-identical", "1.82e-7", "5e-4", "Vulkan0", "fuses"] {
        assert!(c.detail.contains(said), "{said}: {}", c.detail);
    }
    // beyond the bound: 2^-3, NMSE 2^-6 / 5.25 = 2.98e-3
    let (_, s, c) = off_by(2f32.powi(-3), "Vulkan0");
    assert_eq!(c.status, CheckStatus::Fail, "{}", c.detail);
    assert!(c.detail.contains("BEYOND the bound"), "{}", c.detail);
    assert!((s.outputs_max_nmse.unwrap() - 2f64.powi(-6) / 5.25).abs() < 1e-12);
    // on the CPU no difference is allowed, however small
    let (_, _, c) = off_by(2f32.powi(-10), "CPU");
    assert_eq!(c.status, CheckStatus::Fail, "{}", c.detail);
    assert!(c.detail.contains("on the CPU alone"), "{}", c.detail);
    // an engine that cannot show its logits: the hashes alone, a failure that says so
    let (mut raw, _, _) = off_by(2f32.powi(-10), "Vulkan0");
    raw.outputs_compared.clear();
    let s = analyse(&raw, &rules, &arch).unwrap().1;
    let c = s.checks.iter().find(|c| c.name == "outputs").unwrap();
    assert_eq!(c.status, CheckStatus::Fail);
    assert!(
        c.detail.contains("does not expose its logits"),
        "{}",
        c.detail
    );
    assert_eq!(s.outputs_max_nmse, None);
    // bit-identical modes read one set of logits and compare nothing
    let mut e = MockEngine::new(&NODES);
    let raw = measure(&mut e, &cfg(4), &mut |_, _, _| {}).unwrap();
    assert!(raw.outputs_compared.is_empty());
}
