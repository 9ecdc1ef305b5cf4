//! `opledger sweep`: the depth sweep into a run folder that keeps every chunk as it lands;
//! `--resume RUN` continues an interrupted sweep.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::{open_engine, EngineKind};
use opledger_app::model::ModelFile;
use opledger_app::sweep::Sweep;
use opledger_core::engine::Work;
use opledger_core::sweep::{DecodeSteps, SweepConfig};

use super::common::{EngineArg, ModelArgs, RpcArgs, Term};

#[derive(Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub rpc: RpcArgs,
    /// The engine to measure (one that offers the sweep).
    #[arg(long, value_enum, default_value_t = EngineArg::LlamaCpp)]
    pub engine: EngineArg,
    /// Tokens in each chunk (one ubatch).
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    /// The deepest probe: chunks at depths 0, chunk, 2 x chunk, ... up to this.
    #[arg(long, required_unless_present = "resume")]
    pub max_depth: Option<u32>,
    /// Cycles (each: one pass in which every depth is measured FUSED and TIMED back to back).
    #[arg(short = 'r', long, default_value_t = 3, value_parser = super::flags::at_least_one)]
    pub cycles: u32,
    /// Decode steps measured after every chunk (token generation at every depth): this many
    /// steps of one token per sequence, on sequences forked from the context and removed after.
    #[arg(short = 'n', long = "decode", default_value_t = 0)]
    pub decode: u32,
    /// Sequences decoding together in those steps.
    #[arg(long, default_value_t = 1, value_parser = super::flags::at_least_one)]
    pub parallel: u32,
    /// Request logits for every token of each chunk.
    #[arg(long)]
    pub all_logits: bool,
    /// Seed of the filler token ids.
    #[arg(long, default_value_t = 0)]
    pub token_seed: u64,
    /// A band rule set (TOML) instead of the built-in one.
    #[arg(long)]
    pub bands: Option<PathBuf>,
    /// The run folder to write (default: runs/<time>-sweep-<model>).
    #[arg(short, long, conflicts_with = "resume")]
    pub output: Option<PathBuf>,
    /// Continue an interrupted sweep in its run folder (model and settings come from it).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Skip the memory check.
    #[arg(long)]
    pub no_memory_check: bool,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: SweepArgs) -> Result<ExitCode> {
    let kind = EngineKind::from(args.engine);
    let mut settings = args.model.settings();
    settings.rpc = args.rpc.settings();
    if settings.rpc.is_some() && args.decode > 0 {
        bail!("--rpc sweeps prefill chunks; decode over remote devices (-n) is not supported yet");
    }
    let (sweep, file) = match &args.resume {
        Some(dir) => {
            let sweep = Sweep::reopen(dir)?;
            // the sweep continues with the threads it started with
            settings.threads = super::flags::check_threads(sweep.threads(), super::flags::cpus())
                .map_err(|e| anyhow::anyhow!("{}: resuming: {e}", dir.display()))?;
            let file = if kind.needs_llama_gate() {
                let build = if args.model.llama_worker.is_some() {
                    opledger_gguf::LlamaBuild::Other
                } else {
                    opledger_gguf::LlamaBuild::Vendored
                };
                ModelFile::open_for(&sweep.model_path, build)?
            } else {
                ModelFile::open_structural(&sweep.model_path)?
            };
            (sweep, file)
        }
        None => {
            let max_depth = args.max_depth.unwrap_or(0);
            if max_depth < args.chunk {
                bail!(
                    "--max-depth {max_depth} is below the chunk ({} tokens): a sweep measures \
                     depths 0, {0}, 2 x {0}, ... and needs at least two to fit a line; give \
                     --max-depth {0} or more",
                    args.chunk
                );
            }
            if args.decode == 0 && args.parallel != 1 {
                bail!("--parallel applies to the decode steps (-n N)");
            }
            let file = args.model.open(kind)?;
            let bands = Bands::load(args.bands.as_deref(), &file.arch.arch)?;
            let config = SweepConfig {
                work: Work {
                    chunk_tokens: args.chunk,
                    depth_tokens: 0,
                    all_logits: args.all_logits,
                    token_seed: args.token_seed,
                    decode_tokens: 0,
                    parallel: 1,
                },
                chunks: SweepConfig::chunks_for(max_depth, args.chunk),
                cycles: args.cycles,
                decode: (args.decode > 0).then_some(DecodeSteps {
                    steps: args.decode,
                    parallel: args.parallel,
                }),
            };
            let layers_here = match &settings.rpc {
                Some(r) => Some(r.layers_here(file.arch.layers.len() as u32)?),
                None => None,
            };
            let sweep = Sweep::start(
                &file,
                bands,
                config,
                settings.threads,
                !args.no_memory_check,
                layers_here,
                args.output.as_deref(),
            )?;
            (sweep, file)
        }
    };
    if args.resume.is_some() {
        super::common::print_notes(&file);
    }
    // a remote device failing mid-run leaves the folder marked with why
    let folder = sweep.path().to_path_buf();
    let (path, manifest, summary) = super::common::stop_on_remote_failure(
        &folder,
        (|| {
            let mut engine = open_engine(kind, &file, &settings)?;
            let mut ui = Term::new(args.quiet || args.json);
            sweep.run(engine.as_mut(), &mut ui)
        })(),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if !args.quiet {
        print!(
            "{}",
            opledger_report::sweep::sweep_text(&manifest, &summary)
        );
        println!("run folder: {}", path.display());
    }
    Ok(super::common::exit(opledger_app::outcome::of_checks(
        &summary.checks,
    )))
}
