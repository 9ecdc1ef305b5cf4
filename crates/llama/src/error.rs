//! Errors of the llama.cpp layer, each with llama.cpp's own last log lines where they explain it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum LlamaError {
    #[error("{path}: {why}", path = path.display())]
    Load { path: PathBuf, why: String },
    #[error("creating a llama.cpp context failed: {0}")]
    Context(String),
    #[error("creating a ggml thread pool of {threads} threads failed")]
    ThreadPool { threads: u32 },
    #[error("llama_decode failed with code {code} ({why})")]
    Decode { code: i32, why: String },
    #[error("restoring the context state failed: {0}")]
    State(String),
    #[error("the eval callback panicked: {0}")]
    CallbackPanicked(String),
    #[error("{0}")]
    Invalid(String),
    #[error("RPC server {endpoint}: {why}")]
    Rpc { endpoint: String, why: String },
}

impl From<LlamaError> for opledger_core::engine::EngineError {
    fn from(e: LlamaError) -> Self {
        opledger_core::engine::EngineError::Failed(e.to_string())
    }
}
