//! Engine selection: `--engine llama.cpp` (the default) or `--engine candle`, built from the
//! model arguments into one `Box<dyn Engine>`.

use anyhow::{bail, Result};
use clap::ValueEnum;
use opledger_core::engine::Engine;

use super::common::ModelArgs;

/// The engines a measuring command can run.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineKind {
    /// llama.cpp through its eval callback (feature `llama`).
    #[value(name = "llama.cpp")]
    LlamaCpp,
    /// A forward pass of candle CPU ops (feature `candle`).
    Candle,
}

/// Loads `args`' model into the engine `kind`.
pub fn load_engine(kind: EngineKind, args: &ModelArgs) -> Result<Box<dyn Engine>> {
    match kind {
        EngineKind::LlamaCpp => load_llama(args),
        EngineKind::Candle => load_candle(args),
    }
}

#[cfg(feature = "llama")]
fn load_llama(args: &ModelArgs) -> Result<Box<dyn Engine>> {
    Ok(Box::new(super::common::load_llama(args, false)?))
}

#[cfg(not(feature = "llama"))]
fn load_llama(_args: &ModelArgs) -> Result<Box<dyn Engine>> {
    bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
}

#[cfg(feature = "candle")]
fn load_candle(args: &ModelArgs) -> Result<Box<dyn Engine>> {
    use anyhow::Context;
    use opledger_candle::{CandleConfig, CandleEngine};
    if args.gpu_layers > 0 {
        bail!(
            "the candle engine runs on the CPU only (--gpu-layers {})",
            args.gpu_layers
        );
    }
    if args.flash_attn == super::common::FlashAttnArg::On {
        bail!("the candle engine has no flash attention (--flash-attn on)");
    }
    let model_path = args.path()?;
    let engine = CandleEngine::load(CandleConfig {
        model_path: model_path.clone(),
        threads: args.threads(),
    })
    .with_context(|| format!("loading model '{}' into candle", model_path.display()))?;
    Ok(Box::new(engine))
}

#[cfg(not(feature = "candle"))]
fn load_candle(_args: &ModelArgs) -> Result<Box<dyn Engine>> {
    bail!("this opledger was built without the candle engine (feature `candle`)")
}
