//! The engine factory every command uses: an engine kind and its settings, over a model that
//! passed the gate its engine needs, into one `Box<dyn Engine>`. What an engine can do beyond a
//! prefill profile is asked for by capability (`dyn Engine::sweep`, `replayer`, ...), which
//! refuses an engine that lacks it by name; a kind this build lacks is refused here.

use anyhow::{bail, Result};
use opledger_core::ab::Knobs;
use opledger_core::engine::{Capability, Engine};

use crate::model::ModelFile;

/// The engines a command can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// llama.cpp through its eval callback (feature `llama`).
    LlamaCpp,
    /// A forward pass of candle CPU ops (feature `candle`).
    Candle,
    /// A deterministic engine over the model's architecture, with known per-node costs: for
    /// tests of everything around the measurement, fast and without timing noise.
    Mock,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::LlamaCpp => "llama.cpp",
            EngineKind::Candle => "candle",
            EngineKind::Mock => "mock",
        }
    }

    /// Whether the engine reads the file through llama.cpp's gate (else only its structure is
    /// checked: candle loads files llama.cpp refuses).
    pub fn needs_llama_gate(self) -> bool {
        matches!(self, EngineKind::LlamaCpp)
    }
}

/// Flash attention as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashAttn {
    Auto,
    On,
    Off,
}

impl FlashAttn {
    pub fn name(self) -> &'static str {
        match self {
            FlashAttn::Auto => "auto",
            FlashAttn::On => "on",
            FlashAttn::Off => "off",
        }
    }
}

/// How to set an engine up.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    pub threads: u32,
    pub flash_attn: FlashAttn,
    /// Layers offloaded to a GPU (llama.cpp built with `cuda`).
    pub gpu_layers: i32,
    /// Print the engine's own log.
    pub verbose: bool,
    /// Load without weight repacking (census-only work).
    pub no_repack: bool,
    /// Runtime knobs of an A/B (`threads`, `flash_attn`, `ubatch`, `type_k`, `type_v`,
    /// `repack`), over the settings above; llama.cpp only.
    pub knobs: Knobs,
}

impl EngineSettings {
    /// `threads` threads, flash attention auto, no GPU, weights repacked, no knobs.
    pub fn new(threads: u32) -> EngineSettings {
        EngineSettings {
            threads,
            flash_attn: FlashAttn::Auto,
            gpu_layers: 0,
            verbose: false,
            no_repack: false,
            knobs: Knobs::default(),
        }
    }

    /// What llama.cpp runs with when a knob is not set: these threads, flash attention as
    /// asked, weights repacked, the whole chunk one ubatch, an F16 KV cache.
    pub fn resolved_defaults(&self, chunk: u32) -> Knobs {
        Knobs(
            [
                ("threads", self.threads.to_string()),
                ("flash_attn", self.flash_attn.name().to_string()),
                ("repack", "on".to_string()),
                ("ubatch", chunk.to_string()),
                ("type_k", "f16".to_string()),
                ("type_v", "f16".to_string()),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        )
    }
}

/// Loads `model` into the engine `kind` with `settings`.
pub fn open_engine(
    kind: EngineKind,
    model: &ModelFile,
    settings: &EngineSettings,
) -> Result<Box<dyn Engine>> {
    if kind != EngineKind::LlamaCpp && !settings.knobs.0.is_empty() {
        bail!(
            "runtime knobs ({}) are llama.cpp's; the {} engine has none",
            settings.knobs,
            kind.name()
        );
    }
    match kind {
        EngineKind::LlamaCpp => open_llama(model, settings),
        EngineKind::Candle => open_candle(model, settings),
        EngineKind::Mock => Ok(Box::new(opledger_core::mock::MockEngine::for_arch(
            &model.arch,
        ))),
    }
}

/// Refuses `engine` unless it has every capability in `needs` (one place for the words).
pub fn require(engine: &dyn Engine, needs: &[Capability]) -> Result<()> {
    for &c in needs {
        engine.require(c)?;
    }
    Ok(())
}

#[cfg(feature = "llama")]
fn open_llama(model: &ModelFile, s: &EngineSettings) -> Result<Box<dyn Engine>> {
    Ok(Box::new(load_llama(model, s)?))
}

#[cfg(not(feature = "llama"))]
fn open_llama(_model: &ModelFile, _s: &EngineSettings) -> Result<Box<dyn Engine>> {
    bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
}

/// llama.cpp itself, for what only it offers beyond the Engine trait (the census's load time
/// is in the trait; nothing else today).
#[cfg(feature = "llama")]
pub fn load_llama(model: &ModelFile, s: &EngineSettings) -> Result<opledger_llama::LlamaEngine> {
    use anyhow::Context;
    use opledger_llama::{FlashAttn as F, KvType, LlamaConfig, LlamaEngine};
    let Some(gated) = model.llama.clone() else {
        bail!(
            "{}: opened without llama.cpp's gate; llama.cpp loads only a file that passed it",
            model.path().display()
        );
    };
    let knobs = &s.knobs;
    let kv = |key: &str| -> Result<Option<KvType>> {
        knobs
            .get(key)
            .map(|v| {
                KvType::parse(v)
                    .ok_or_else(|| anyhow::anyhow!("knob {key}={v}: not a KV cache type"))
            })
            .transpose()
    };
    let flash = match knobs.get("flash_attn") {
        Some("on") => F::On,
        Some("off") => F::Off,
        Some(_) => F::Auto,
        None => match s.flash_attn {
            FlashAttn::Auto => F::Auto,
            FlashAttn::On => F::On,
            FlashAttn::Off => F::Off,
        },
    };
    let cfg = LlamaConfig {
        model: gated,
        threads: knobs
            .get("threads")
            .and_then(|t| t.parse().ok())
            .unwrap_or(s.threads),
        flash_attn: flash,
        gpu_layers: s.gpu_layers,
        no_repack: s.no_repack || knobs.get("repack") == Some("off"),
        ubatch: knobs.get("ubatch").and_then(|u| u.parse().ok()),
        type_k: kv("type_k")?,
        type_v: kv("type_v")?,
        verbose: s.verbose,
    };
    let what = if knobs.0.is_empty() {
        String::new()
    } else {
        format!(" with {knobs}")
    };
    LlamaEngine::load(cfg)
        .with_context(|| format!("loading model '{}'{what}", model.path().display()))
}

#[cfg(feature = "candle")]
fn open_candle(model: &ModelFile, s: &EngineSettings) -> Result<Box<dyn Engine>> {
    use anyhow::Context;
    use opledger_candle::{CandleConfig, CandleEngine};
    if s.gpu_layers > 0 {
        bail!(
            "the candle engine runs on the CPU only (--gpu-layers {})",
            s.gpu_layers
        );
    }
    if s.flash_attn == FlashAttn::On {
        bail!("the candle engine has no flash attention (--flash-attn on)");
    }
    let engine = CandleEngine::load(CandleConfig {
        model: model.well_formed.clone(),
        threads: s.threads,
    })
    .with_context(|| format!("loading model '{}' into candle", model.path().display()))?;
    Ok(Box::new(engine))
}

#[cfg(not(feature = "candle"))]
fn open_candle(_model: &ModelFile, _s: &EngineSettings) -> Result<Box<dyn Engine>> {
    bail!("this opledger was built without the candle engine (feature `candle`)")
}
