//! A deterministic mock engine: a fixed graph with known per-node costs, so that the whole
//! measure -> categorise -> summarise pipeline can be tested with exact expectations and without
//! any real engine.

use std::collections::BTreeMap;

use crate::engine::{
    Capability, ChunkTiming, Engine, EngineError, EngineInfo, GraphCapture, GraphCapturer, Mode,
    OpTime, OpTimeRequest, OpTimer, OutputReader, ReplayEngine, SweepEngine, Work,
};
use crate::node::{is_view_op, layer_of, NodeInfo, TensorDesc};

/// One node of the mock graph: (op, name, weight name or "", cost in µs).
pub type MockNode = (&'static str, &'static str, &'static str, f64);

/// A mock engine whose timings follow exact rules:
/// - TIMED: each node takes `cost + isolation_us` (views cost only `isolation_us`);
/// - FUSED: the chunk takes `sum(cost) * fused_factor`;
/// - FUSED with the instrument: FUSED x `observed_factor`;
/// - at depth d, a FLASH_ATTN_EXT node costs `cost x (1 + attention_growth x d)` (sweeps);
/// - a replay adds k x the cost of every replayed node to the FUSED wall;
/// - an op timed alone takes its cost.
#[derive(Debug, Clone)]
pub struct MockEngine {
    pub graph: Vec<NodeInfo>,
    pub cost_us: Vec<f64>,
    pub isolation_us: f64,
    pub fused_factor: f64,
    pub observed_factor: f64,
    /// Per-run multiplicative noise, cycled through (1.0 = none).
    pub noise: Vec<f64>,
    /// What [`Engine::isolation_cost_us`] reports (`None`: no calibration).
    pub calibration_us: Option<f64>,
    /// The logits every run returns (one row per requested output).
    pub logits: Vec<f32>,
    /// The logits a TIMED run returns instead, where set: a backend that fuses ops when it runs
    /// the graph whole and cannot when each node is its own submission.
    pub timed_logits: Option<Vec<f32>>,
    /// Relative growth of an attention node's cost per token of depth.
    pub attention_growth: f64,
    /// A scripted device clock (`crate::device_clock`): every run reports the device's own
    /// time, each working node on a device other than the CPU taking exactly its cost (no
    /// isolation: the device timed the work alone) in TIMED, its op kind's costs x
    /// `fused_factor` in FUSED; both x the run's noise.
    pub device_clock: bool,
    runs: usize,
    prepared: Option<Work>,
    /// A sweep's work and each mode's next chunk (FUSED, TIMED).
    sweep: Option<(Work, [u32; 2])>,
    /// The output reader's chunk positions and next greedy step.
    outputs: Option<(u32, u32)>,
    /// The mode of the last run ([`Engine::run`], a sweep's chunk or decode steps).
    last_mode: Option<Mode>,
}

impl MockEngine {
    pub fn new(nodes: &[MockNode]) -> MockEngine {
        let owned: Vec<(String, String, String, f64)> = nodes
            .iter()
            .map(|&(op, name, weight, cost)| (op.into(), name.into(), weight.into(), cost))
            .collect();
        MockEngine::of_nodes(&owned)
    }

    /// A mock of `arch`'s graph as llama.cpp names it: the token embedding, per layer the
    /// mixer's norm, projections (one matmul per weight the layer holds) and core (attention,
    /// a delta-net or a Mamba scan with its conv), the FFN's norm and matmuls (dense: gate, up,
    /// down and the activation; MoE: the router and shared expert, the top-k, the expert
    /// matmuls), the residual add, then the final norm and the LM head. Matmuls cost 10 µs,
    /// the attention core 20 (growing 0.1 % a token of depth), everything else 1.
    pub fn for_arch(arch: &crate::arch::ArchInfo) -> MockEngine {
        use crate::arch::{FfnKind, Mixer};
        let mut nodes: Vec<(String, String, String, f64)> = Vec::new();
        let mut push = |op: &str, name: String, weight: String, cost: f64| {
            nodes.push((op.to_string(), name, weight, cost));
        };
        push(
            "GET_ROWS",
            "inp_embd".into(),
            "token_embd.weight".into(),
            1.0,
        );
        let take = |names: &[&'static str], n: u32| -> Vec<&'static str> {
            names.iter().copied().cycle().take(n as usize).collect()
        };
        for (il, l) in arch.layers.iter().enumerate() {
            let w = |t: &str| format!("blk.{il}.{t}.weight");
            let n = |t: &str| format!("{t}-{il}");
            let mixer_w = l.weights.mixer.unwrap_or(4);
            match l.mixer {
                Mixer::None => {}
                Mixer::DeltaNet => {
                    push("RMS_NORM", n("attn_norm"), w("attn_norm"), 1.0);
                    let names = ["attn_qkv", "attn_gate", "ssm_beta", "ssm_alpha", "ssm_out"];
                    for t in take(&names, mixer_w) {
                        push("MUL_MAT", n(t), w(t), 10.0);
                    }
                    push("SSM_CONV", n("conv_output_silu"), String::new(), 1.0);
                    push("GATED_DELTA_NET", n("delta_net"), String::new(), 5.0);
                }
                Mixer::Mamba | Mixer::Mamba2 => {
                    push("RMS_NORM", n("attn_norm"), w("attn_norm"), 1.0);
                    for t in take(&["ssm_in", "ssm_x", "ssm_dt", "ssm_out"], mixer_w) {
                        push("MUL_MAT", n(t), w(t), 10.0);
                    }
                    push("SSM_CONV", n("conv_x"), String::new(), 1.0);
                    push("SSM_SCAN", n("ssm_scan"), String::new(), 5.0);
                }
                _ => {
                    push("RMS_NORM", n("attn_norm"), w("attn_norm"), 1.0);
                    let names = if mixer_w == 2 {
                        vec!["attn_qkv", "attn_output"]
                    } else {
                        take(&["attn_q", "attn_k", "attn_v", "attn_output"], mixer_w)
                    };
                    for t in names {
                        push("MUL_MAT", n(t), w(t), 10.0);
                    }
                    push("FLASH_ATTN_EXT", n("__fattn__"), String::new(), 20.0);
                }
            }
            match l.ffn {
                FfnKind::None => {}
                FfnKind::Dense => {
                    push("RMS_NORM", n("ffn_norm"), w("ffn_norm"), 1.0);
                    for t in take(&["ffn_gate", "ffn_up", "ffn_down"], l.weights.dense_ffn) {
                        push("MUL_MAT", n(t), w(t), 10.0);
                    }
                    push("GLU", n("ffn_swiglu"), String::new(), 1.0);
                }
                FfnKind::Moe => {
                    push("RMS_NORM", n("ffn_norm"), w("ffn_norm"), 1.0);
                    let router = [
                        "ffn_gate_inp",
                        "ffn_gate_inp_shexp",
                        "ffn_gate_shexp",
                        "ffn_up_shexp",
                        "ffn_down_shexp",
                    ];
                    for t in take(&router, l.weights.router_shared) {
                        push("MUL_MAT", n(t), w(t), 10.0);
                    }
                    push("ARGSORT", n("ffn_moe_argsort"), String::new(), 1.0);
                    let experts = ["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"];
                    for t in take(&experts, l.weights.experts) {
                        push("MUL_MAT_ID", n(t), w(t), 10.0);
                    }
                }
            }
            push("ADD", n("l_out"), String::new(), 1.0);
        }
        push(
            "RMS_NORM",
            "result_norm".into(),
            "output_norm.weight".into(),
            1.0,
        );
        push(
            "MUL_MAT",
            "result_output".into(),
            "output.weight".into(),
            10.0,
        );
        let mut e = MockEngine::of_nodes(&nodes);
        e.attention_growth = 1e-3;
        e
    }

    fn of_nodes(nodes: &[(String, String, String, f64)]) -> MockEngine {
        let mut graph: Vec<NodeInfo> = Vec::new();
        for (i, (op, name, weight, _)) in nodes.iter().enumerate() {
            let (op, name, weight) = (op.as_str(), name.as_str(), weight.as_str());
            let mut srcs = Vec::new();
            if !weight.is_empty() {
                srcs.push(Some(TensorDesc {
                    name: weight.to_string(),
                    ne: [64, 64, 1, 1],
                    ggml_type: "Q8_0".into(),
                    size_bytes: 64 * 68,
                    is_weight: true,
                    producer: None,
                    nb: [0; 4],
                }));
            }
            if i > 0 {
                srcs.push(Some(TensorDesc {
                    name: nodes[i - 1].1.clone(),
                    ne: [64, 8, 1, 1],
                    ggml_type: "F32".into(),
                    size_bytes: 64 * 8 * 4,
                    is_weight: false,
                    producer: Some(i as u32 - 1),
                    nb: [0; 4],
                }));
            }
            graph.push(NodeInfo {
                index: i as u32,
                op: op.to_string(),
                name: name.to_string(),
                layer: layer_of(name),
                out: TensorDesc {
                    name: name.to_string(),
                    ne: [64, 8, 1, 1],
                    ggml_type: "F32".into(),
                    size_bytes: 64 * 8 * 4,
                    is_weight: false,
                    producer: None,
                    nb: [0; 4],
                },
                srcs,
                is_view: is_view_op(op),
                inplace: false,
                skipped: false,
                op_code: None,
                op_params: Vec::new(),
                device: None,
            });
        }
        MockEngine {
            cost_us: nodes
                .iter()
                .map(|n| if is_view_op(&n.0) { 0.0 } else { n.3 })
                .collect(),
            graph,
            isolation_us: 0.0,
            fused_factor: 1.0,
            observed_factor: 1.0,
            noise: vec![1.0],
            calibration_us: None,
            logits: vec![0.5, 2.0, -1.0],
            timed_logits: None,
            attention_growth: 0.0,
            device_clock: false,
            runs: 0,
            prepared: None,
            sweep: None,
            outputs: None,
            last_mode: None,
        }
    }

    /// Node costs at `depth`: attention grows with it.
    fn costs_at(&self, depth: u32) -> Vec<f64> {
        self.graph
            .iter()
            .zip(&self.cost_us)
            .map(|(n, &c)| {
                if n.op == "FLASH_ATTN_EXT" {
                    c * (1.0 + self.attention_growth * depth as f64)
                } else {
                    c
                }
            })
            .collect()
    }

    /// One run of nodes costing `costs` for `steps` steps in `mode`.
    fn timing(
        &mut self,
        mode: Mode,
        costs: &[f64],
        steps: f64,
    ) -> Result<ChunkTiming, EngineError> {
        crate::engine::check_finite(&format!("the mock's {} run", mode.label()), &self.logits)?;
        let noise = self.noise();
        let fused_us: f64 = costs.iter().sum::<f64>() * self.fused_factor * steps;
        let (wall_us, node_us) = match mode {
            Mode::Fused => (fused_us * noise, Vec::new()),
            Mode::FusedObserved => (fused_us * self.observed_factor * noise, Vec::new()),
            Mode::Timed => {
                let node_us: Vec<f64> = costs
                    .iter()
                    .map(|c| (c + self.isolation_us) * noise * steps)
                    .collect();
                (node_us.iter().sum(), node_us)
            }
        };
        let device = self.device_clock.then(|| {
            let on_device: Vec<bool> = self
                .graph
                .iter()
                .map(|n| n.is_working() && n.device.as_deref().is_some_and(|d| d != "CPU"))
                .collect();
            let mut t = crate::device_clock::DeviceTiming::default();
            let factor = match mode {
                Mode::Timed => noise * steps,
                Mode::Fused => self.fused_factor * noise * steps,
                Mode::FusedObserved => self.fused_factor * self.observed_factor * noise * steps,
            };
            for ((n, &c), &dev) in self.graph.iter().zip(costs).zip(&on_device) {
                if dev {
                    *t.kinds.entry(n.op.clone()).or_insert(0.0) += c * factor;
                }
            }
            if mode == Mode::Timed {
                t.node_us = costs
                    .iter()
                    .zip(&on_device)
                    .map(|(&c, &dev)| dev.then_some(c * factor))
                    .collect();
                t.node_kind = self
                    .graph
                    .iter()
                    .zip(&on_device)
                    .map(|(n, &dev)| dev.then(|| n.op.clone()))
                    .collect();
            }
            t
        });
        Ok(ChunkTiming {
            device,
            wall_ms: wall_us / 1e3,
            nodes_seen: if mode == Mode::Fused {
                0
            } else {
                self.graph.len() as u32
            },
            node_us,
            output_hash: 42,
        })
    }

    /// The logits a run in `mode` computes.
    fn run_logits(&self, mode: Option<Mode>) -> &Vec<f32> {
        match (&self.timed_logits, mode) {
            (Some(t), Some(Mode::Timed)) => t,
            _ => &self.logits,
        }
    }

    fn noise(&mut self) -> f64 {
        let n = self.noise[self.runs % self.noise.len()];
        self.runs += 1;
        n
    }
}

impl Engine for MockEngine {
    fn info(&self) -> EngineInfo {
        EngineInfo {
            engine: "mock".into(),
            version: "1".into(),
            backend: "none".into(),
            threads: 1,
            settings: BTreeMap::new(),
        }
    }

    fn prepare(&mut self, work: &Work) -> Result<(), EngineError> {
        self.prepared = Some(work.clone());
        Ok(())
    }

    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
        if self.prepared.is_none() {
            return Err(EngineError::Failed("graph() before prepare()".into()));
        }
        Ok(self.graph.clone())
    }

    fn isolation_cost_us(&mut self) -> Result<Option<f64>, EngineError> {
        Ok(self.calibration_us)
    }

    fn logits(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        let rows = match &self.prepared {
            Some(w) if w.is_decode() => w.parallel.max(1) as usize,
            Some(_) => 1,
            None => return Err(EngineError::Failed("logits() before prepare()".into())),
        };
        Ok(vec![self.run_logits(self.last_mode).clone(); rows])
    }

    fn run(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        let Some(work) = self.prepared.clone() else {
            return Err(EngineError::Failed("run() before prepare()".into()));
        };
        // a decode run sums its steps, each step costing the same
        let costs = self.costs_at(work.depth_tokens);
        let mut t = self.timing(mode, &costs, work.decode_tokens.max(1) as f64)?;
        self.last_mode = Some(mode);
        if self.timed_logits.is_some() {
            t.output_hash = crate::tokens::hash_f32(self.run_logits(Some(mode)));
        }
        Ok(t)
    }

    fn supports(&self, c: Capability) -> bool {
        matches!(
            c,
            Capability::Decode
                | Capability::Logits
                | Capability::Sweep
                | Capability::Replay
                | Capability::OpTiming
                | Capability::GraphCapture
                | Capability::Outputs
        )
    }

    fn as_sweep(&mut self) -> Option<&mut dyn SweepEngine> {
        Some(self)
    }

    fn as_replay(&mut self) -> Option<&mut dyn ReplayEngine> {
        Some(self)
    }

    fn as_op_timer(&mut self) -> Option<&mut dyn OpTimer> {
        Some(self)
    }

    fn as_graph_capturer(&mut self) -> Option<&mut dyn GraphCapturer> {
        Some(self)
    }

    fn as_output_reader(&mut self) -> Option<&mut dyn OutputReader> {
        Some(self)
    }
}

/// Every position's row is [`MockEngine::logits`] rotated left by the position; greedy step
/// `s` fed token `t` returns them rotated by `t + s`.
impl OutputReader for MockEngine {
    fn decode_outputs(&mut self, work: &Work, _steps: u32) -> Result<u32, EngineError> {
        self.prepared = None;
        self.outputs = Some((work.chunk_tokens, 0));
        Ok(work.chunk_tokens)
    }

    fn output_rows(&mut self, first: u32, count: u32) -> Result<Vec<Vec<f32>>, EngineError> {
        let Some((positions, _)) = self.outputs else {
            return Err(EngineError::Failed(
                "output_rows() before decode_outputs()".into(),
            ));
        };
        if first.saturating_add(count) > positions {
            return Err(EngineError::Failed(format!(
                "rows {first}..{} of a chunk of {positions}",
                first.saturating_add(count)
            )));
        }
        Ok((first..first + count).map(|p| self.rotated(p)).collect())
    }

    fn greedy_step(&mut self, token: u32) -> Result<Vec<f32>, EngineError> {
        let Some((positions, step)) = self.outputs else {
            return Err(EngineError::Failed(
                "greedy_step() before decode_outputs()".into(),
            ));
        };
        self.outputs = Some((positions, step + 1));
        Ok(self.rotated(token.wrapping_add(step)))
    }
}

impl MockEngine {
    fn rotated(&self, by: u32) -> Vec<f32> {
        let mut r = self.logits.clone();
        if !r.is_empty() {
            let n = r.len();
            r.rotate_left(by as usize % n);
        }
        r
    }
}

fn slot(mode: Mode) -> usize {
    usize::from(mode != Mode::Fused)
}

impl SweepEngine for MockEngine {
    fn prepare_sweep(
        &mut self,
        work: &Work,
        _chunks: u32,
        _decode: Option<(u32, u32)>,
    ) -> Result<(), EngineError> {
        self.prepared = Some(work.clone());
        self.sweep = Some((work.clone(), [0, 0]));
        Ok(())
    }

    fn start_pass(&mut self, mode: Mode, first_chunk: u32) -> Result<(), EngineError> {
        let s = self
            .sweep
            .as_mut()
            .ok_or_else(|| EngineError::Failed("start_pass() before prepare_sweep()".into()))?;
        s.1[slot(mode)] = first_chunk;
        Ok(())
    }

    fn pass_chunk(&mut self, mode: Mode, index: u32) -> Result<ChunkTiming, EngineError> {
        let (work, next) = self
            .sweep
            .clone()
            .ok_or_else(|| EngineError::Failed("pass_chunk() before prepare_sweep()".into()))?;
        if next[slot(mode)] != index {
            return Err(EngineError::Failed(format!(
                "chunk {index} out of order (the pass is at {})",
                next[slot(mode)]
            )));
        }
        if let Some(s) = self.sweep.as_mut() {
            s.1[slot(mode)] = index + 1;
        }
        let costs = self.costs_at(index * work.chunk_tokens);
        let mut t = self.timing(mode, &costs, 1.0)?;
        self.last_mode = Some(mode);
        if self.timed_logits.is_some() {
            t.output_hash = crate::tokens::hash_f32(self.run_logits(Some(mode)));
        }
        Ok(t)
    }

    fn pass_decode(
        &mut self,
        mode: Mode,
        after_chunk: u32,
        steps: u32,
        _parallel: u32,
    ) -> Result<ChunkTiming, EngineError> {
        let (work, next) = self
            .sweep
            .clone()
            .ok_or_else(|| EngineError::Failed("pass_decode() before prepare_sweep()".into()))?;
        if next[slot(mode)] != after_chunk + 1 {
            return Err(EngineError::Failed(
                "decode steps come right after their chunk".into(),
            ));
        }
        let costs = self.costs_at((after_chunk + 1) * work.chunk_tokens);
        let mut t = self.timing(mode, &costs, steps.max(1) as f64)?;
        self.last_mode = Some(mode);
        if self.timed_logits.is_some() {
            // the steps' logits hashed apart from the chunk's
            t.output_hash = crate::tokens::hash_f32(self.run_logits(Some(mode))) ^ 0x5eed;
        }
        Ok(t)
    }

    fn sweep_decode_graph(&mut self, _parallel: u32) -> Result<Vec<NodeInfo>, EngineError> {
        Ok(self.graph.clone())
    }
}

impl ReplayEngine for MockEngine {
    fn replay(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        k: u32,
    ) -> Result<ChunkTiming, EngineError> {
        let Some(work) = self.prepared.clone() else {
            return Err(EngineError::Failed("replay() before prepare()".into()));
        };
        let _ = cut;
        let costs = self.costs_at(work.depth_tokens);
        let mut t = self.timing(Mode::Fused, &costs, 1.0)?;
        let extra_us: f64 = costs
            .iter()
            .zip(replay)
            .filter(|(_, &r)| r)
            .map(|(c, _)| c * k as f64)
            .sum();
        t.wall_ms += extra_us / 1e3;
        Ok(t)
    }
}

impl OpTimer for MockEngine {
    fn capture_routing(&mut self) -> Result<Vec<(u32, Vec<i32>)>, EngineError> {
        Ok(self
            .graph
            .iter()
            .filter(|n| n.op == "MUL_MAT_ID")
            .map(|n| (n.index, vec![0, 1]))
            .collect())
    }

    fn time_node(&mut self, node: &NodeInfo, req: &OpTimeRequest) -> Result<OpTime, EngineError> {
        let depth = self.prepared.as_ref().map_or(0, |w| w.depth_tokens);
        let c = self
            .costs_at(depth)
            .get(node.index as usize)
            .copied()
            .ok_or_else(|| EngineError::Failed(format!("no node {}", node.index)))?;
        Ok(OpTime {
            median_us: c,
            min_us: c,
            max_us: c,
            reps: req.reps,
            rotation: 1,
            weight_buffer: "CPU".into(),
        })
    }
}

impl GraphCapturer for MockEngine {
    fn capture_graph(&mut self, work: &Work) -> Result<GraphCapture, EngineError> {
        self.prepared = Some(work.clone());
        Ok(GraphCapture {
            nodes: self.graph.clone(),
            filled_tokens: work.depth_tokens,
            chunk_nodes_computed: 0,
            wall_ms: 0.0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;
    use crate::arch::ArchInfo;
    use crate::band::{BandRules, Categoriser, UNASSIGNED};

    #[test]
    fn a_mock_of_an_architecture_is_categorised_and_counted_as_its_architecture_predicts() {
        let arch = ArchInfo::from_metadata(&qwen35moe_md(8)).unwrap();
        let e = MockEngine::for_arch(&arch);
        let rules = BandRules::builtin(&arch.arch).unwrap();
        let a = Categoriser::new(&rules, &arch).categorise(&e.graph);
        assert!(a.iter().all(|a| a.band != UNASSIGNED), "{a:?}");
        let c = crate::census::census(&e.graph, &a, &arch, true);
        assert!(c.mismatches().is_empty(), "{:?}", c.mismatches());
        // 2 full-attention layers of 8: two attention cores, six delta-nets, eight MoE blocks
        let count = |op: &str| e.graph.iter().filter(|n| n.op == op).count();
        assert_eq!(count("FLASH_ATTN_EXT"), 2);
        assert_eq!(count("GATED_DELTA_NET"), 6);
        assert_eq!(count("ARGSORT"), 8);
    }

    #[test]
    fn the_mock_sweeps_and_replays_by_its_rules() {
        use crate::engine::{Engine, Mode};
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let mut e = MockEngine::for_arch(&arch);
        let work = Work::prefill(512, 0);
        let engine: &mut dyn Engine = &mut e;
        // a chunk at depth 1000 costs its attention core 20 x (1 + 1e-3 x 1000) = 40 µs
        let s = engine.sweep().unwrap();
        s.prepare_sweep(&work, 3, None).unwrap();
        s.start_pass(Mode::Timed, 0).unwrap();
        let t0 = s.pass_chunk(Mode::Timed, 0).unwrap();
        let t1 = s.pass_chunk(Mode::Timed, 1).unwrap();
        let fattn = e
            .graph
            .iter()
            .position(|n| n.op == "FLASH_ATTN_EXT")
            .unwrap();
        assert_eq!(t0.node_us[fattn], 20.0);
        assert!((t1.node_us[fattn] - 20.0 * (1.0 + 0.512)).abs() < 1e-9);
        // a replay of one node k times adds k x its cost to the wall
        let engine: &mut dyn Engine = &mut e;
        engine.prepare(&work).unwrap();
        let n = engine.graph().unwrap().len();
        let mut mask = vec![false; n];
        mask[fattn] = true;
        let r = engine.replayer().unwrap();
        let base = r.replay(&vec![true; n], &vec![false; n], 0).unwrap();
        let four = r.replay(&vec![true; n], &mask, 4).unwrap();
        assert!((four.wall_ms - base.wall_ms - 4.0 * 20.0 / 1e3).abs() < 1e-12);
    }

    #[test]
    fn an_engine_without_a_capability_is_refused_by_name() {
        struct Plain;
        impl Engine for Plain {
            fn info(&self) -> EngineInfo {
                EngineInfo {
                    engine: "plain".into(),
                    version: "0".into(),
                    backend: "none".into(),
                    threads: 1,
                    settings: BTreeMap::new(),
                }
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
        }
        let mut p = Plain;
        let e: &mut dyn Engine = &mut p;
        let words = |r: Result<(), EngineError>| r.unwrap_err().to_string();
        assert_eq!(
            words(e.sweep().map(|_| ())),
            "the plain engine does not offer depth sweeps"
        );
        assert!(words(e.replayer().map(|_| ())).contains("in-graph replay"));
        assert!(words(e.op_timer().map(|_| ())).contains("timing ops alone"));
        assert!(words(e.require(Capability::Decode)).contains("decode"));
    }
}
