//! The measurement loop: prepare, capture the graph, warm up, then cycles of FUSED,
//! FUSED-observed and TIMED in rotating orders, and the extra overhead pairs.

use std::collections::BTreeMap;

use super::{CycleRecord, ModesCompared, ProfileConfig, ProfileRaw, PROFILE_SCHEMA_VERSION};
use crate::engine::{Engine, EngineError, Mode};
use crate::node::NodeInfo;
use crate::noise::{Gate, RunNoise};
use crate::outputs::{compare_rows, At};

/// The orders cycles rotate through: FUSED and FUSED-observed stay adjacent (their ratio is the
/// overhead), and each mode takes each position.
pub(super) const ORDERS: [[Mode; 3]; 4] = [
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
    let mut outputs = Outputs::default();
    let note = &mut outputs;
    for w in 0..cfg.warmup {
        progress("warm-up", w, cfg.warmup);
        for mode in ORDERS[0] {
            engine.run(mode)?;
        }
    }
    // the canary on as many threads as the engine computes with
    let mut gate = Gate::new(&cfg.gate, engine.info().threads);
    let mut cycles = Vec::with_capacity(cfg.cycles as usize);
    for c in 0..cfg.cycles {
        progress("measuring", c, cfg.cycles);
        let order = ORDERS[c as usize % ORDERS.len()];
        cycles.push(measure_cycle(engine, &mut gate, note, order, graph.len())?);
    }
    let mut overhead_pairs = Vec::with_capacity(cfg.overhead_pairs as usize);
    let mut overhead_pairs_noise = Vec::with_capacity(cfg.overhead_pairs as usize);
    for p in 0..cfg.overhead_pairs {
        progress("overhead pairs", p, cfg.overhead_pairs);
        let (pair, noise) = overhead_pair(engine, &mut gate, note, p)?;
        overhead_pairs.push(pair);
        overhead_pairs_noise.push(noise);
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
        output_hashes: outputs.hashes,
        overhead_pairs,
        overhead_pairs_noise,
        gate: gate.stats,
        outputs_checked_finite: true,
        node_steps: Some(node_steps),
        one_process_fused_ms: Vec::new(),
        one_process_outputs: None,
        one_process_skipped: None,
        outputs_compared: outputs.compared,
    })
}

/// What the measured runs computed: each mode's distinct output hashes and, for every hash that
/// differs from the first run's, its logits compared with that run's.
#[derive(Default)]
struct Outputs {
    hashes: BTreeMap<String, Vec<String>>,
    /// The first measured run's mode, hash and logits (`None` until read).
    reference: Option<(Mode, u64, Vec<Vec<f32>>)>,
    /// Hashes whose logits were read.
    read: Vec<u64>,
    /// The engine does not expose its logits: hashes alone say whether the modes agree.
    no_logits: bool,
    compared: Vec<ModesCompared>,
}

impl Outputs {
    /// Notes the run just made in `mode` with output hash `h`. The first run's logits, and
    /// those of each run with a hash not seen before, are read from the engine (after the run,
    /// outside its timing) and compared with the first's.
    fn note(&mut self, engine: &mut dyn Engine, mode: Mode, h: u64) -> Result<(), EngineError> {
        let list = self.hashes.entry(mode.label().to_string()).or_default();
        let hex = format!("{h:016x}");
        if !list.contains(&hex) {
            list.push(hex);
        }
        if self.no_logits || self.read.contains(&h) {
            return Ok(());
        }
        let logits = match engine.logits() {
            Ok(l) => l,
            Err(EngineError::Unsupported { .. } | EngineError::Lacks { .. }) => {
                self.no_logits = true;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        self.read.push(h);
        match &self.reference {
            None => self.reference = Some((mode, h, logits)),
            Some((ref_mode, ref_h, ref_rows)) => self.compared.push(ModesCompared {
                mode: mode.label().into(),
                hash: format!("{h:016x}"),
                against_mode: ref_mode.label().into(),
                against_hash: format!("{ref_h:016x}"),
                rows: ref_rows
                    .iter()
                    .zip(&logits)
                    .enumerate()
                    .map(|(i, (a, b))| compare_rows(At::Position(i as u32), a, b))
                    .collect(),
            }),
        }
        Ok(())
    }
}

/// One measured cycle: the three modes in `order` through the noise gate, each run's output
/// hash shown to `note`, then the engine's isolation calibration.
fn measure_cycle(
    engine: &mut dyn Engine,
    gate: &mut Gate,
    note: &mut Outputs,
    order: [Mode; 3],
    nodes: usize,
) -> Result<CycleRecord, EngineError> {
    let (mut fused, mut observed, mut timed) = (None, None, None);
    let mut noise = Vec::with_capacity(order.len());
    for mode in order {
        let (r, n) = gate.run(|| engine.run(mode))?;
        noise.push(n);
        note.note(engine, mode, r.output_hash)?;
        match mode {
            Mode::Fused => fused = Some(r),
            Mode::FusedObserved => observed = Some(r),
            Mode::Timed => timed = Some(r),
        }
    }
    let (Some(fused), Some(observed), Some(timed)) = (fused, observed, timed) else {
        unreachable!("every order runs the three modes");
    };
    if timed.node_us.len() != nodes {
        return Err(EngineError::GraphChanged(format!(
            "TIMED run timed {} nodes, the graph has {}",
            timed.node_us.len(),
            nodes
        )));
    }
    let calibration = engine.calibrate_isolation()?;
    let isolation_us = calibration.as_ref().map(|c| c.per_node_us);
    let isolation_node_us = calibration
        .map(|c| c.each_node_us)
        .filter(|each| each.len() == nodes)
        .unwrap_or_default();
    Ok(CycleRecord {
        device_timed: timed.device,
        device_fused: fused.device,
        order: order.to_vec(),
        fused_ms: fused.wall_ms,
        fused_observed_ms: observed.wall_ms,
        timed_wall_ms: timed.wall_ms,
        node_us: timed.node_us,
        isolation_us,
        isolation_node_us,
        noise,
    })
}

/// An overhead pair's walls (FUSED ms, FUSED-with-instrument ms) and what the gate saw around
/// each run.
type PairWithNoise = ((f64, f64), (RunNoise, RunNoise));

/// Extra overhead pair `p`: FUSED and FUSED with the instrument, in alternating order, through
/// the noise gate; (FUSED ms, FUSED-with-instrument ms), and what the gate saw around each.
fn overhead_pair(
    engine: &mut dyn Engine,
    gate: &mut Gate,
    note: &mut Outputs,
    p: u32,
) -> Result<PairWithNoise, EngineError> {
    let order = if p.is_multiple_of(2) {
        [Mode::Fused, Mode::FusedObserved]
    } else {
        [Mode::FusedObserved, Mode::Fused]
    };
    let (mut fused, mut observed) = (0.0, 0.0);
    let (mut fused_noise, mut observed_noise) = (RunNoise::default(), RunNoise::default());
    for mode in order {
        let (r, n) = gate.run(|| engine.run(mode))?;
        note.note(engine, mode, r.output_hash)?;
        if mode == Mode::Fused {
            (fused, fused_noise) = (r.wall_ms, n);
        } else {
            (observed, observed_noise) = (r.wall_ms, n);
        }
    }
    Ok(((fused, observed), (fused_noise, observed_noise)))
}
