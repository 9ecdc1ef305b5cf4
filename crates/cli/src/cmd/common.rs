//! Arguments shared by the measuring commands (model, threads, engine settings), the step from
//! them to the application layer's model and engine settings, the terminal's progress and
//! notes, and how a finished command's outcome becomes its exit status.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::{Args, ValueEnum};
use indicatif::ProgressBar;
use opledger_app::engines::{EngineKind, EngineSettings, FlashAttn};
use opledger_app::model::ModelFile;
use opledger_app::outcome::Exit;
use opledger_app::ui::Ui;

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
    /// Layers to offload to a GPU (or another device): needs a llama.cpp built with its backend
    /// (`--llama-worker` built with `-DGGML_CUDA=ON`, `-DGGML_VULKAN=ON`, ...).
    #[arg(long = "gpu-layers", short = 'g', default_value_t = 0)]
    pub gpu_layers: i32,
    /// Print llama.cpp's own log.
    #[arg(long)]
    pub verbose: bool,
    /// Run llama.cpp in this worker, built in your own llama.cpp tree (tools/llama-worker,
    /// README "Your own llama.cpp"), instead of the worker built with opledger.
    #[arg(long = "llama-worker", value_name = "PATH")]
    pub llama_worker: Option<PathBuf>,
    /// Seconds one request to the worker (a model's load, one run) may take before the worker
    /// is stopped (exit 8).
    #[arg(long, default_value_t = 300.0, value_parser = super::flags::seconds)]
    pub worker_timeout: f64,
}

/// A model split across this machine's CPU and llama.cpp RPC servers (`profile`, `graph`,
/// `sweep`).
#[derive(Args, Clone, Debug, Default)]
pub struct RpcArgs {
    /// Split the model's layers across this machine's CPU and these RPC servers (`opledger
    /// rpc-server`), HOST:PORT each, comma-separated, in the order they take layers.
    #[arg(long, value_delimiter = ',', value_parser = super::flags::endpoint)]
    pub rpc: Vec<String>,
    /// Layers per device: this machine's CPU first, then each server's, comma-separated; at
    /// least one each, summing to the model's layers (default: as even as possible). The output
    /// layer goes with the last server, as llama.cpp places it.
    #[arg(long, value_delimiter = ',', requires = "rpc", value_parser = super::flags::at_least_one)]
    pub rpc_split: Option<Vec<u32>>,
    /// Seconds a server may take to answer the pre-flight, and one decode may go without a node
    /// finishing, before the run is stopped (exit 7, the run folder left incomplete).
    #[arg(long, default_value_t = 60.0, value_parser = super::flags::seconds)]
    pub rpc_timeout: f64,
}

impl RpcArgs {
    pub fn settings(&self) -> Option<opledger_app::engines::RpcSettings> {
        (!self.rpc.is_empty()).then(|| opledger_app::engines::RpcSettings {
            servers: self.rpc.clone(),
            layers: self.rpc_split.clone(),
            timeout: std::time::Duration::from_secs_f64(self.rpc_timeout),
        })
    }
}

#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlashAttnArg {
    Auto,
    On,
    Off,
}

/// The engines a measuring command can run.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum EngineArg {
    /// llama.cpp through its eval callback (feature `llama`).
    #[value(name = "llama.cpp", alias = "llama")]
    LlamaCpp,
    /// A forward pass of candle CPU ops (feature `candle`).
    Candle,
    /// A deterministic engine over the model's architecture with known costs (for tests).
    #[value(hide = true)]
    Mock,
}

impl From<EngineArg> for EngineKind {
    fn from(e: EngineArg) -> EngineKind {
        match e {
            EngineArg::LlamaCpp => EngineKind::LlamaCpp,
            EngineArg::Candle => EngineKind::Candle,
            EngineArg::Mock => EngineKind::Mock,
        }
    }
}

impl ModelArgs {
    pub fn threads(&self) -> u32 {
        self.threads.unwrap_or_else(super::flags::cpus)
    }

    /// The model file: the one given, else the built-in default (written on first use).
    pub fn path(&self) -> Result<PathBuf> {
        match &self.model {
            Some(p) => Ok(p.clone()),
            None => {
                let (path, written) = opledger_app::model::default_model()?;
                let preset = opledger_app::model::DEFAULT_PRESET;
                if written {
                    eprintln!(
                        "no --model given: wrote the built-in synthetic {preset} model to {}",
                        path.display()
                    );
                } else {
                    eprintln!(
                        "no --model given: using the built-in synthetic {preset} model {}",
                        path.display()
                    );
                }
                Ok(path)
            }
        }
    }

    /// Validates the file in Rust before any C code sees it, as `engine` needs (llama.cpp's
    /// gate, or the structure only), and prints what the gate noted.
    pub fn open(&self, engine: EngineKind) -> Result<ModelFile> {
        self.open_for(engine, self.llama_worker.is_some())
    }

    /// [`ModelArgs::open`], where `other_build` says that a worker of another llama.cpp build
    /// loads the model (`--llama-worker`, an A/B side's `worker=`): which architectures load is
    /// then that build's answer, and the gate checks what the vendored llama.cpp loads only.
    pub fn open_for(&self, engine: EngineKind, other_build: bool) -> Result<ModelFile> {
        let path = self.path()?;
        let build = if other_build {
            opledger_gguf::LlamaBuild::Other
        } else {
            opledger_gguf::LlamaBuild::Vendored
        };
        let file = if engine.needs_llama_gate() {
            ModelFile::open_for(&path, build)?
        } else {
            ModelFile::open_structural(&path)?
        };
        print_notes(&file);
        Ok(file)
    }

    /// The engine settings these arguments ask for.
    pub fn settings(&self) -> EngineSettings {
        EngineSettings {
            threads: self.threads(),
            flash_attn: match self.flash_attn {
                FlashAttnArg::Auto => FlashAttn::Auto,
                FlashAttnArg::On => FlashAttn::On,
                FlashAttnArg::Off => FlashAttn::Off,
            },
            gpu_layers: self.gpu_layers,
            verbose: self.verbose,
            worker: self
                .llama_worker
                .as_ref()
                .map(|p| opledger_app::engines::WorkerSettings {
                    path: p.clone(),
                    timeout: std::time::Duration::from_secs_f64(self.worker_timeout),
                }),
            ..EngineSettings::new(self.threads())
        }
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

/// Progress on a bar (hidden when quiet or stderr is not a terminal), notes on stderr.
pub struct Term {
    bar: ProgressBar,
}

impl Term {
    pub fn new(quiet: bool) -> Term {
        Term {
            bar: crate::progress::steps_bar(quiet),
        }
    }
}

impl Ui for Term {
    fn progress(&mut self, done: u64, total: u64, what: &str) {
        self.bar.set_length(total);
        self.bar.set_position(done);
        self.bar.set_message(what.to_string());
    }

    fn note(&mut self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Drop for Term {
    fn drop(&mut self) {
        self.bar.finish_and_clear();
    }
}

/// Prints the outcome's lines on stderr and turns it into the exit status.
pub fn exit(outcome: Exit) -> ExitCode {
    for line in outcome.lines() {
        eprintln!("{line}");
    }
    ExitCode::from(outcome.code())
}

/// `r` as it is; when it failed because a remote device failed mid-run, the reason is written
/// into `folder`'s INCOMPLETE marker first (the folder is kept, marked incomplete with why) and
/// stderr says so.
pub fn stop_on_remote_failure<T>(
    folder: &std::path::Path,
    r: anyhow::Result<T>,
) -> anyhow::Result<T> {
    if let Err(e) = &r {
        if opledger_app::rpc::mark_stopped(folder, e) {
            eprintln!(
                "the run folder {} is left incomplete (INCOMPLETE says why)",
                folder.display()
            );
        }
    }
    r
}
