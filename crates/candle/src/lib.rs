//! opledger's candle engine: a forward pass of candle CPU ops on the same GGUF files llama.cpp
//! reads (qwen3moe, qwen3, llama), every op a node in opledger's schema, measured by the same
//! method (TIMED: each op alone; FUSED: the plain forward; FUSED-observed: the instrument
//! installed, counting).

#![forbid(unsafe_code)]

pub mod engine;
pub mod error;
pub mod hparams;
mod instrument;
mod model;
mod weights;

pub use engine::{CandleConfig, CandleEngine, CANDLE_CORE_VERSION, REPLAY_REFUSAL};
pub use error::CandleError;
pub use hparams::{Arch, Hparams, RopeStyle};
