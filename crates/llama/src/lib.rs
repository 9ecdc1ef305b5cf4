//! The only crate of opledger that names `llama-cpp-sys-2` or writes `unsafe`: a safe layer over
//! llama.cpp (backend token, model, context, thread pool, eval-callback instrument) and the
//! llama.cpp engine adapter. Every `unsafe` block carries a `// SAFETY:` note.

pub mod backend;
pub mod calibrate;
pub mod context;
pub mod engine;
pub mod error;
mod ggml;
pub mod model;
pub mod observer;
pub mod optime;
pub mod replay;
pub mod rpc;
pub mod threadpool;

pub use backend::{Backend, LLAMA_CPP_SYS_VERSION};
pub use context::{Context, ContextParams, FlashAttn, KvType, ThreadPool};
pub use engine::{LlamaConfig, LlamaEngine};
pub use error::LlamaError;
pub use model::{Model, ModelParams};
