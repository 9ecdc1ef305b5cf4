//! `opledger waste`: the rows of every node that nothing kept reads (the requested logits, cache
//! writes) and the time spent on them, from a fresh profile on an engine or a stored profile run,
//! written to a run folder.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::{open_engine, EngineKind};
use opledger_app::manifest::utc_stamp;
use opledger_core::engine::Work;
use opledger_core::profile::ProfileConfig;
use opledger_core::run_folder::{fresh_run_path, RunFolder};

use super::common::{EngineArg, ModelArgs, Term};

#[derive(Args)]
pub struct WasteArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The engine to measure.
    #[arg(long, value_enum, default_value_t = EngineArg::LlamaCpp)]
    pub engine: EngineArg,
    /// Tokens in the measured chunk (one ubatch).
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    /// Tokens already in the context (filled untimed before measuring).
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: u32,
    /// Measured cycles (each: FUSED, FUSED with the instrument, TIMED).
    #[arg(short = 'r', long, default_value_t = 3, value_parser = super::flags::at_least_one)]
    pub cycles: u32,
    /// Unmeasured warm-up cycles.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Request logits for every token of the chunk (default: the last one, as llama-bench).
    #[arg(long)]
    pub all_logits: bool,
    /// Seed of the filler token ids.
    #[arg(long, default_value_t = 0)]
    pub token_seed: u64,
    /// A band rule set (TOML) instead of the built-in one (or the stored run's).
    #[arg(long)]
    pub bands: Option<PathBuf>,
    /// Analyse a stored profile run folder (its raw.json and manifest.json) instead of measuring.
    #[arg(long, conflicts_with_all = ["model", "chunk", "depth", "cycles", "warmup", "all_logits", "token_seed", "threads"])]
    pub run: Option<PathBuf>,
    /// Nodes to list in the terminal table (0: all; every node is in nodes.csv).
    #[arg(long, default_value_t = 15)]
    pub top: usize,
    /// The run folder to write (default: runs/<time>-waste-<model>); never overwritten.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: WasteArgs) -> Result<ExitCode> {
    let out_for = |label: &str| {
        args.output
            .clone()
            .unwrap_or_else(|| fresh_run_path(Path::new("runs"), "waste", label, &utc_stamp()))
    };
    let mut ui = Term::new(args.quiet || args.json);
    let (folder, m, raw, source) = match &args.run {
        Some(dir) => {
            // read (and refuse) the stored run before creating anything
            let (m, raw) = opledger_app::waste::from_stored(dir, args.bands.as_deref(), &mut ui)?;
            let label = dir
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into());
            let folder = RunFolder::create(&out_for(&label))?;
            (folder, m, raw, Some(dir.display().to_string()))
        }
        None => {
            let kind = EngineKind::from(args.engine);
            let file = args.model.open(kind)?;
            let bands = Bands::load(args.bands.as_deref(), &file.arch.arch)?;
            let label = file
                .path()
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            // Create the folder first: a taken name fails before minutes of measuring (a
            // measurement that fails leaves it empty, and it is removed).
            let folder = RunFolder::create(&out_for(&label))?;
            let cfg = ProfileConfig {
                work: Work {
                    all_logits: args.all_logits,
                    token_seed: args.token_seed,
                    ..Work::prefill(args.chunk, args.depth)
                },
                cycles: args.cycles,
                warmup: args.warmup,
                overhead_pairs: 0,
                gate: Default::default(),
            };
            let mut engine = open_engine(kind, &file, &args.model.settings())?;
            let (m, raw) =
                opledger_app::waste::measured(engine.as_mut(), &file, &bands, &cfg, &mut ui)
                    .context("measuring")?;
            (folder, m, raw, None)
        }
    };
    drop(ui);
    let summary = opledger_app::runs::write_waste(&folder, &m, &raw, source, args.top)?;
    let path = folder.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if !args.quiet {
        print!(
            "{}",
            opledger_report::waste::waste_text(&m, &summary, args.top)
        );
        println!("run folder: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}
