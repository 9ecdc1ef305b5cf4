//! A deterministic mock engine: a fixed graph with known per-node costs, so that the whole
//! measure -> categorise -> summarise pipeline can be tested with exact expectations and without
//! any real engine.

use std::collections::BTreeMap;

use crate::engine::{ChunkTiming, Engine, EngineError, EngineInfo, Mode, Work};
use crate::node::{is_view_op, layer_of, NodeInfo, TensorDesc};

/// One node of the mock graph: (op, name, weight name or "", cost in µs).
pub type MockNode = (&'static str, &'static str, &'static str, f64);

/// A mock engine whose timings follow exact rules:
/// - TIMED: each node takes `cost + isolation_us` (views cost only `isolation_us`);
/// - FUSED: the chunk takes `sum(cost) * fused_factor`;
/// - FUSED with the instrument: FUSED x `observed_factor`.
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
    runs: usize,
    prepared: Option<Work>,
}

impl MockEngine {
    pub fn new(nodes: &[MockNode]) -> MockEngine {
        let mut graph: Vec<NodeInfo> = Vec::new();
        for (i, &(op, name, weight, _)) in nodes.iter().enumerate() {
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
                    name: nodes[i - 1].1.to_string(),
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
            });
        }
        MockEngine {
            cost_us: nodes
                .iter()
                .map(|n| if is_view_op(n.0) { 0.0 } else { n.3 })
                .collect(),
            graph,
            isolation_us: 0.0,
            fused_factor: 1.0,
            observed_factor: 1.0,
            noise: vec![1.0],
            calibration_us: None,
            logits: vec![0.5, 2.0, -1.0],
            runs: 0,
            prepared: None,
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
        Ok(vec![self.logits.clone(); rows])
    }

    fn run(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        if self.prepared.is_none() {
            return Err(EngineError::Failed("run() before prepare()".into()));
        }
        crate::engine::check_finite(&format!("the mock's {} run", mode.label()), &self.logits)?;
        let noise = self.noise();
        // a decode run sums its steps, each step costing the same
        let steps = self
            .prepared
            .as_ref()
            .map(|w| w.decode_tokens.max(1))
            .unwrap_or(1) as f64;
        let fused_us: f64 = self.cost_us.iter().sum::<f64>() * self.fused_factor * steps;
        let (wall_us, node_us) = match mode {
            Mode::Fused => (fused_us, Vec::new()),
            Mode::FusedObserved => (fused_us * self.observed_factor, Vec::new()),
            Mode::Timed => {
                let node_us: Vec<f64> = self
                    .cost_us
                    .iter()
                    .map(|c| (c + self.isolation_us) * noise * steps)
                    .collect();
                (node_us.iter().sum(), node_us)
            }
        };
        let wall_us = if mode == Mode::Timed {
            wall_us
        } else {
            wall_us * noise
        };
        Ok(ChunkTiming {
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
}
