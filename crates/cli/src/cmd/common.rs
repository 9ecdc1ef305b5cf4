//! Arguments shared by the measuring commands (model, threads, engine settings) and the step
//! from them to a loaded engine.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::{Args, ValueEnum};

use crate::model_file::ModelFile;

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// The GGUF model file (see `opledger synth`). Without it, the built-in default: a
    /// synthetic tiny-qwen35moe model the tool writes itself (under runs/models/).
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Threads (default: the machine's available parallelism; at most that many).
    #[arg(short, long, value_parser = super::flags::threads, allow_negative_numbers = true)]
    pub threads: Option<u32>,
    /// Flash attention.
    #[arg(long, value_enum, default_value_t = FlashAttnArg::Auto)]
    pub flash_attn: FlashAttnArg,
    /// Layers to offload to a GPU (needs a build with the `cuda` feature).
    #[arg(long = "gpu-layers", short = 'g', default_value_t = 0)]
    pub gpu_layers: i32,
    /// Print llama.cpp's own log.
    #[arg(long)]
    pub verbose: bool,
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashAttnArg {
    Auto,
    On,
    Off,
}

impl ModelArgs {
    pub fn threads(&self) -> u32 {
        self.threads.unwrap_or_else(|| {
            std::thread::available_parallelism()
                .map(|n| n.get() as u32)
                .unwrap_or(1)
        })
    }

    /// The model file: the one given, else the built-in default (written on first use).
    pub fn path(&self) -> Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => default_model(),
        }
    }

    /// Validates the file in Rust before any C code sees it.
    pub fn open(&self) -> Result<ModelFile> {
        ModelFile::open(&self.path()?)
    }
}

/// Prints what the gate and the architecture reader noted about the model (what they did not
/// check, how layer kinds were decided), one line each to stderr before a run is measured, so
/// that no --json output carries them.
pub fn print_notes(file: &ModelFile) {
    for note in file.notes() {
        eprintln!("note: {note}");
    }
}

/// The preset of the built-in default model.
pub const DEFAULT_PRESET: &str = "tiny-qwen35moe";

/// The built-in default model: `runs/models/tiny-qwen35moe.gguf`, synthesised (seed 0) when
/// missing. The same seed always gives the same bytes, so a file left by an earlier run is the
/// same model.
pub fn default_model() -> Result<PathBuf> {
    let path = PathBuf::from("runs/models").join(format!("{DEFAULT_PRESET}.gguf"));
    if !path.exists() {
        std::fs::create_dir_all("runs/models").context("creating runs/models")?;
        let opts = opledger_gguf::SynthOptions::new(DEFAULT_PRESET);
        opledger_gguf::synthesize(&opts, &path, &mut |_, _| {})
            .with_context(|| format!("writing the default model {}", path.display()))?;
        eprintln!(
            "no --model given: wrote the built-in synthetic {DEFAULT_PRESET} model to {}",
            path.display()
        );
    } else {
        eprintln!(
            "no --model given: using the built-in synthetic {DEFAULT_PRESET} model {}",
            path.display()
        );
    }
    Ok(path)
}

#[cfg(feature = "llama")]
pub fn load_llama(args: &ModelArgs, no_repack: bool) -> Result<opledger_llama::LlamaEngine> {
    use opledger_llama::{FlashAttn, LlamaConfig, LlamaEngine};
    let model_path = args.path()?;
    let cfg = LlamaConfig {
        model_path: model_path.clone(),
        threads: args.threads(),
        flash_attn: match args.flash_attn {
            FlashAttnArg::Auto => FlashAttn::Auto,
            FlashAttnArg::On => FlashAttn::On,
            FlashAttnArg::Off => FlashAttn::Off,
        },
        gpu_layers: args.gpu_layers,
        no_repack,
        ubatch: None,
        type_k: None,
        type_v: None,
        verbose: args.verbose,
    };
    LlamaEngine::load(cfg).with_context(|| format!("loading model '{}'", model_path.display()))
}

/// The UTC time as a folder-name stamp: 20261201T060858Z.
pub fn utc_stamp() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .replace(['-', ':'], "")
}

/// The run folder a command writes: `output` when given, else a fresh
/// `runs/<time>-<kind>-<model file stem>`.
pub fn run_path(output: Option<&Path>, kind: &str, model: &Path) -> PathBuf {
    output.map(Path::to_path_buf).unwrap_or_else(|| {
        let label = model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        opledger_core::run_folder::fresh_run_path(Path::new("runs"), kind, &label, &utc_stamp())
    })
}

/// Loads llama.cpp with `args`, overridden by the knobs of an A/B (threads, flash_attn, ubatch,
/// type_k, type_v, repack).
#[cfg(feature = "llama")]
pub fn load_llama_knobs(
    args: &ModelArgs,
    knobs: &opledger_core::ab::Knobs,
) -> Result<opledger_llama::LlamaEngine> {
    use opledger_llama::{FlashAttn, KvType, LlamaConfig, LlamaEngine};
    let model_path = args.path()?;
    let kv = |key: &str| -> Result<Option<KvType>> {
        knobs
            .get(key)
            .map(|v| {
                KvType::parse(v)
                    .ok_or_else(|| anyhow::anyhow!("knob {key}={v}: not a KV cache type"))
            })
            .transpose()
    };
    let cfg = LlamaConfig {
        model_path: model_path.clone(),
        threads: knobs
            .get("threads")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| args.threads()),
        flash_attn: match knobs.get("flash_attn") {
            Some("on") => FlashAttn::On,
            Some("off") => FlashAttn::Off,
            Some(_) => FlashAttn::Auto,
            None => match args.flash_attn {
                FlashAttnArg::Auto => FlashAttn::Auto,
                FlashAttnArg::On => FlashAttn::On,
                FlashAttnArg::Off => FlashAttn::Off,
            },
        },
        gpu_layers: args.gpu_layers,
        no_repack: knobs.get("repack") == Some("off"),
        ubatch: knobs.get("ubatch").and_then(|u| u.parse().ok()),
        type_k: kv("type_k")?,
        type_v: kv("type_v")?,
        verbose: args.verbose,
    };
    LlamaEngine::load(cfg)
        .with_context(|| format!("loading model '{}' with {knobs}", model_path.display()))
}
