//! `opledger ops`: every distinct (op, shapes, types) of the census of a prefill chunk or of one
//! decode step timed alone on an engine (llama.cpp's CPU backend), expert matmuls under three routings with
//! the weight bytes each reads, set against the in-graph band times.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::{open_engine, EngineKind};
use opledger_app::ops::{default_flush_bytes, OpsRequest};
use opledger_core::engine::Work;
use opledger_core::ops::Routing;
use opledger_core::run_folder::RunFolder;

use super::common::{EngineArg, ModelArgs, Term};

#[derive(Args)]
pub struct OpsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The engine to measure (one that can time a node alone).
    #[arg(long, value_enum, default_value_t = EngineArg::LlamaCpp)]
    pub engine: EngineArg,
    /// Tokens in the chunk.
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    /// Tokens already in the context.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: u32,
    /// Decode instead of prefill: the ops of one decode step (one token per sequence) timed
    /// alone, against the in-graph bands of this many decode steps per sequence.
    #[arg(short = 'n', long = "decode", default_value_t = 0)]
    pub decode: u32,
    /// Sequences decoded together (decode only): the activations of every op have this many
    /// rows, and the captured routing touches the experts of this many tokens.
    #[arg(long, default_value_t = 1)]
    pub parallel: u32,
    /// Write this many MiB before every timed repetition, untimed, so that weights come from
    /// memory and not from the cache (default: for decode, twice the last-level cache the
    /// system reports; for prefill, none).
    #[arg(long)]
    pub flush_mib: Option<u64>,
    /// Routings of the expert matmuls.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "first-k,uniform,captured"
    )]
    pub routing: Vec<String>,
    /// Profile cycles for the in-graph band times.
    #[arg(short = 'r', long, default_value_t = 3, value_parser = super::flags::at_least_one)]
    pub cycles: u32,
    /// Timed repetitions of each op alone.
    #[arg(long, default_value_t = 15, value_parser = super::flags::at_least_one)]
    pub reps: u32,
    /// Input copies rotated over, up to this many MiB per op (weights not all cache-warm).
    #[arg(long, default_value_t = 256)]
    pub rotate_mib: u64,
    /// Seed of the uniform routing.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: OpsArgs) -> Result<ExitCode> {
    if args.parallel == 0 {
        bail!("--parallel takes a sequence count of at least 1");
    }
    if args.decode == 0 && args.parallel != 1 {
        bail!("--parallel applies to decode (-n N)");
    }
    let decode = args.decode > 0;
    let routings: Vec<Routing> = args
        .routing
        .iter()
        .map(|r| {
            Routing::parse(r)
                .with_context(|| format!("--routing: unknown '{r}' (first-k, uniform, captured)"))
        })
        .collect::<Result<_>>()?;
    let kind = EngineKind::from(args.engine);
    let file = args.model.open(kind)?;
    let bands = Bands::load(None, &file.arch.arch)?;
    let req = OpsRequest {
        work: Work {
            decode_tokens: args.decode,
            parallel: args.parallel,
            ..Work::prefill(args.chunk, args.depth)
        },
        cycles: args.cycles,
        routings,
        reps: args.reps,
        rotate_bytes: args.rotate_mib << 20,
        flush_bytes: match args.flush_mib {
            Some(mib) => mib << 20,
            None => default_flush_bytes(decode),
        },
        seed: args.seed,
    };
    let out = opledger_app::manifest::run_path(args.output.as_deref(), "ops", file.path());
    let folder = RunFolder::create(&out)?;
    let mut engine = open_engine(kind, &file, &args.model.settings())?;
    let ops = {
        let mut ui = Term::new(args.quiet || args.json);
        opledger_app::ops::run(engine.as_mut(), &file, &bands, &req, &mut ui)?
    };
    opledger_app::runs::write_ops(&folder, &ops.manifest, &ops.raw, &ops.summary)?;
    let dir = folder.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&ops.summary)?);
    } else if !args.quiet {
        print!(
            "{}",
            opledger_report::ops::ops_text(
                &opledger_report::ops::ops_title(&ops.manifest),
                &ops.summary
            )
        );
        println!("run folder: {}", dir.display());
    }
    Ok(ExitCode::SUCCESS)
}
