//! The Engine trait every adapter implements (llama.cpp, candle, the mock), and the shape of the
//! work it is asked to do. Measurement loops live in `crate::profile`.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::node::NodeInfo;

/// How a chunk is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Native speed, no instrument at all: the true wall.
    Fused,
    /// Native speed with the instrument installed but never isolating a node: its overhead.
    FusedObserved,
    /// Every node isolated, computed alone and waited on: per-node times.
    Timed,
}

impl Mode {
    pub fn label(self) -> &'static str {
        match self {
            Mode::Fused => "fused",
            Mode::FusedObserved => "fused+cb",
            Mode::Timed => "timed",
        }
    }
}

/// One shape of work: a chunk of tokens decoded at a depth.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Work {
    /// Tokens decoded together in the measured chunk (one ubatch).
    pub chunk_tokens: u32,
    /// Tokens already in the context when the chunk is decoded.
    pub depth_tokens: u32,
    /// Request logits for every token of the chunk instead of the last one only.
    pub all_logits: bool,
    /// Seed of the filler token ids (spread over the vocabulary).
    pub token_seed: u64,
}

/// What an engine says about itself, for manifests.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EngineInfo {
    /// `llama.cpp`, `candle`, `mock`.
    pub engine: String,
    /// The engine's version as far as it can be known (crate version, commit).
    pub version: String,
    /// Compute backend (`CPU`, `CUDA0`, ...).
    pub backend: String,
    pub threads: u32,
    /// Build and runtime settings worth recording (flash attention, SIMD features, ...).
    pub settings: BTreeMap<String, String>,
}

/// The result of running a chunk once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChunkTiming {
    /// Wall time of the whole chunk, from submit to synchronised.
    pub wall_ms: f64,
    /// Per-node microseconds in graph order (TIMED mode only; empty otherwise).
    pub node_us: Vec<f64>,
    /// Nodes the instrument saw (0 in plain FUSED mode, which has no instrument).
    pub nodes_seen: u32,
    /// A hash of the requested logits, to check that modes compute the same thing.
    pub output_hash: u64,
}

/// An error from an engine, with the engine's own words.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{0}")]
    Failed(String),
    #[error("the graph changed between runs: {0}")]
    GraphChanged(String),
    #[error("{what} is not supported by this engine: {why}")]
    Unsupported { what: String, why: String },
}

/// An inference engine that can decode a chunk at a depth and report its nodes.
pub trait Engine {
    fn info(&self) -> EngineInfo;

    /// Fills the context to `work.depth_tokens` (untimed) and keeps that state so that every
    /// later [`Engine::run`] starts from it.
    fn prepare(&mut self, work: &Work) -> Result<(), EngineError>;

    /// Runs the prepared chunk once with the instrument observing, and returns every node of the
    /// graph in the order the engine computes it. Counts as a warm-up run.
    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError>;

    /// Restores the prepared state and runs the chunk once in `mode`.
    fn run(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError>;

    /// Sets up a cumulative depth sweep of `chunks` chunks of `work.chunk_tokens` (chunk c is
    /// decoded at depth c x chunk). Afterwards [`Engine::graph`] describes chunk 0 at depth 0.
    fn prepare_sweep(&mut self, work: &Work, chunks: u32) -> Result<(), EngineError> {
        let _ = (work, chunks);
        Err(EngineError::Unsupported {
            what: "depth sweeps".into(),
            why: "this engine has no cumulative passes".into(),
        })
    }

    /// Starts a cumulative pass in `mode`: empties the context, then decodes chunks
    /// `0..first_chunk` untimed (a resumed pass continues where the stored one stopped).
    fn start_pass(&mut self, mode: Mode, first_chunk: u32) -> Result<(), EngineError> {
        let _ = (mode, first_chunk);
        Err(EngineError::Unsupported {
            what: "depth sweeps".into(),
            why: "this engine has no cumulative passes".into(),
        })
    }

    /// Decodes the pass's next chunk, `index`, at depth `index x chunk`, timed as in
    /// [`Engine::run`]. Chunks must come in order.
    fn pass_chunk(&mut self, mode: Mode, index: u32) -> Result<ChunkTiming, EngineError> {
        let _ = (mode, index);
        Err(EngineError::Unsupported {
            what: "depth sweeps".into(),
            why: "this engine has no cumulative passes".into(),
        })
    }
}
