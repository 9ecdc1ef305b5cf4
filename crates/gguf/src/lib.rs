//! opledger-gguf: a validating GGUF reader, a streaming GGUF writer and synthetic model presets.
//!
//! Everything here is pure Rust and checks its input before any C code could see it: the
//! reader turns every byte string into a [`GgufFile`] or a [`GgufError`] naming the file and
//! the problem, never a panic.
#![forbid(unsafe_code)]

pub mod error;
pub mod llama_archs;
pub mod reader;
pub mod synth;
pub mod types;
pub mod validate;
pub mod value;
pub mod writer;

pub use error::GgufError;
pub use reader::{GgufFile, TensorInfo};
pub use synth::{
    plan, preset, presets, synthesize, synthesize_preset, Arch, ModelPlan, Preset, SynthError,
    SynthOptions, SynthReport,
};
pub use types::{GgmlType, ParseGgmlTypeError};
pub use validate::{
    validate_for_llama, validate_for_llama_build, ArchCheck, LlamaBuild, LlamaLoadable, WellFormed,
};
pub use value::{Array, Value, ValueType};
pub use writer::{GgufWriter, Layout, TensorSpec};
