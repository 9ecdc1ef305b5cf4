//! The depth sweep: the context decoded cumulatively in chunks, chunk c being the probe at depth
//! c x chunk. FUSED and TIMED run in lockstep, each mode in its own context holding the same
//! state, so at every depth the chunk is measured in both modes back to back (optionally followed
//! by decode steps on a forked sequence, the same in both). Records land as they are measured (an
//! interrupted sweep resumes); the pure summary gives per-depth bands, a line per band, attention
//! per layer kind and the depth where attention overtakes the FFN.

mod order;
mod record;
mod run;
mod summary;

use serde::{Deserialize, Serialize};

use crate::engine::{EngineError, Work};

pub use order::PassOrder;
pub use record::{load_folder, ChunkRecord, ChunkStore, FolderStore, MemoryStore, PassLog, Phase};
pub use run::{run_sweep, SweepProgress};
pub use summary::{
    band_index, fully_assigned, summarise_sweep, summarise_sweep_with_decode, BandFit, Crossover,
    DepthRow, KindSeries, PhaseSummary, SweepCost, SweepIndex, SweepSummary, SPLIT_RAW_NOTE,
};

pub const SWEEP_SCHEMA_VERSION: u32 = 1;

/// A band is flat when its fitted change across the swept depths is within this share of its
/// mean, or when its slope is within `SLOPE_SIGMAS` (3) standard errors of zero (no growth the
/// noise cannot explain).
pub const FLAT_CHANGE: f64 = 0.10;
/// A slope within this many standard errors of zero is not significant. Three, not two: the
/// depths of a pass are measured one after the other, so host noise that drifts over minutes
/// is shared by neighbouring depths, and the fit's standard error (which assumes independent
/// points) is too small.
pub const SLOPE_SIGMAS: f64 = 3.0;

/// What to sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepConfig {
    /// The chunk (its `depth_tokens` is ignored: depths follow from the chunk index).
    pub work: Work,
    /// Chunks per pass: depths 0, chunk, ..., (chunks - 1) x chunk.
    pub chunks: u32,
    pub cycles: u32,
    /// Decode steps measured after every chunk (`sweep -n`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode: Option<DecodeSteps>,
}

/// Token generation measured at every depth: `steps` steps of one token for each of `parallel`
/// sequences forked from the context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeSteps {
    pub steps: u32,
    pub parallel: u32,
}

impl SweepConfig {
    /// Chunks needed to reach `max_depth` (the last probe at the largest multiple of the chunk
    /// not above it).
    pub fn chunks_for(max_depth: u32, chunk_tokens: u32) -> u32 {
        max_depth / chunk_tokens.max(1) + 1
    }

    /// The depth of prefill chunk `chunk`: the tokens in the context when it starts.
    pub fn depth_of(&self, chunk: u32) -> u32 {
        chunk * self.work.chunk_tokens
    }

    /// The depth of the decode steps after chunk `chunk`: the tokens in the context when the
    /// first step starts.
    pub fn decode_depth_of(&self, chunk: u32) -> u32 {
        (chunk + 1) * self.work.chunk_tokens
    }

    pub fn max_depth(&self) -> u32 {
        self.depth_of(self.chunks.saturating_sub(1))
    }

    /// Measured units per chunk and mode: the chunk, and the decode steps after it.
    pub fn units_per_chunk(&self) -> u32 {
        if self.decode.is_some() {
            2
        } else {
            1
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{what}: {why}")]
    BadRecord { what: String, why: String },
    #[error("{0}")]
    Store(String),
    #[error("pass {mode} of cycle {cycle} has {phase} units {found:?} stored, not a prefix 0..n")]
    Gap {
        cycle: u32,
        mode: String,
        phase: String,
        found: Vec<u32>,
    },
    #[error("no chunk of the sweep was measured")]
    Empty,
}

#[cfg(test)]
mod tests;
