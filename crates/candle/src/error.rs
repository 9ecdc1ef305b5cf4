//! Errors of the candle engine, each naming the file, tensor or key it is about.

use std::path::PathBuf;

use opledger_core::engine::EngineError;

#[derive(Debug, thiserror::Error)]
pub enum CandleError {
    #[error(transparent)]
    Gguf(#[from] opledger_gguf::GgufError),
    #[error("{path}: {what}", path = path.display())]
    Model { path: PathBuf, what: String },
    #[error("{path}: architecture '{arch}' is not implemented by the candle engine (qwen3moe, qwen3 and llama are)", path = path.display())]
    UnsupportedArch { path: PathBuf, arch: String },
    #[error("{path}: tensor '{name}' has type {ggml_type}, which candle cannot load", path = path.display())]
    UnsupportedType {
        path: PathBuf,
        name: String,
        ggml_type: String,
    },
    #[error("candle: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("{0}")]
    Invalid(String),
    #[error("the graph changed between runs: {0}")]
    GraphChanged(String),
    #[error(transparent)]
    Engine(#[from] EngineError),
}

impl From<CandleError> for EngineError {
    fn from(e: CandleError) -> EngineError {
        match e {
            CandleError::GraphChanged(why) => EngineError::GraphChanged(why),
            CandleError::Engine(e) => e,
            other => EngineError::Failed(other.to_string()),
        }
    }
}
