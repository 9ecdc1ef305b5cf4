//! `opledger profile`: the per-node profile of one chunk on an engine (llama.cpp or candle), written
//! to a run folder.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::{open_engine, EngineKind};
use opledger_app::profile::ProfileRequest;
use opledger_core::engine::Work;
use opledger_core::profile::ProfileSummary;
use opledger_core::run_folder::RunFolder;

use super::common::{EngineArg, ModelArgs, RpcArgs, Term};

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub rpc: RpcArgs,
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
    #[arg(short = 'r', long, default_value_t = 5, value_parser = super::flags::at_least_one)]
    pub cycles: u32,
    /// Unmeasured warm-up cycles.
    #[arg(long, default_value_t = 1)]
    pub warmup: u32,
    /// Decode instead of prefill: generate this many tokens per sequence, one step at a time,
    /// after filling the context to the depth; bands are reported per generated token.
    #[arg(short = 'n', long = "decode", default_value_t = 0)]
    pub decode: u32,
    /// Sequences decoded together (parallel decode); several values (`1,2,4,8`) profile each in
    /// one command and tabulate them side by side.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = super::flags::at_least_one)]
    pub parallel: Vec<u32>,
    /// Noise gate: reject and retake a run during which the busiest other process used more
    /// than this share of one CPU, or all others more than this share of the machine (0..=1).
    #[arg(long, default_value_t = opledger_core::noise::DEFAULT_MAX_OTHERS, value_parser = super::flags::share, allow_negative_numbers = true)]
    pub noise_gate: f64,
    /// Turn the noise gate off.
    #[arg(long)]
    pub no_noise_gate: bool,
    /// The canary's threshold: reject and retake a run when a small fixed workload timed right
    /// before and right after it was both times more than this much slower than its recent best
    /// (0.25 = 25 %): a slowdown /proc cannot see (CPU quota, hypervisor, memory bandwidth).
    #[arg(long, default_value_t = opledger_core::noise::DEFAULT_CANARY_SLOWDOWN, value_parser = super::flags::slowdown, allow_negative_numbers = true)]
    pub canary: f64,
    /// Turn the canary off (the /proc gate stays).
    #[arg(long)]
    pub no_canary: bool,
    /// Extra interleaved FUSED / FUSED-with-instrument pairs for the overhead estimate.
    #[arg(long, default_value_t = 0)]
    pub overhead_pairs: u32,
    /// Request logits for every token of the chunk (default: the last one, as llama-bench).
    #[arg(long)]
    pub all_logits: bool,
    /// Seed of the filler token ids.
    #[arg(long, default_value_t = 0)]
    pub token_seed: u64,
    /// A band rule set (TOML) instead of the built-in one for the model's architecture.
    #[arg(long)]
    pub bands: Option<PathBuf>,
    /// With --rpc: skip the comparison with the same work on one process (every layer on this
    /// machine's CPU: FUSED wall and logits). Skipped by itself when the whole model would not
    /// fit this machine's memory.
    #[arg(long, requires = "rpc")]
    pub no_one_process: bool,
    /// The run folder to write (default: runs/<time>-profile-<model>); never overwritten.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    if args.decode == 0 && args.parallel != [1] {
        bail!("--parallel applies to decode (-n N)");
    }
    let kind = EngineKind::from(args.engine);
    // the llama.cpp gate for llama.cpp; candle reads files llama.cpp would refuse
    let file = args.model.open(kind)?;
    let bands = Bands::load(args.bands.as_deref(), &file.arch.arch)?;
    let req = ProfileRequest {
        work: Work {
            chunk_tokens: args.chunk,
            depth_tokens: args.depth,
            all_logits: args.all_logits,
            token_seed: args.token_seed,
            decode_tokens: args.decode,
            parallel: args.parallel[0],
        },
        parallel: args.parallel.clone(),
        cycles: args.cycles,
        warmup: args.warmup,
        overhead_pairs: args.overhead_pairs,
        gate: opledger_core::noise::GateConfig {
            max_others: args.noise_gate,
            retries: opledger_core::noise::DEFAULT_RETRIES,
            enabled: !args.no_noise_gate,
            canary: (!args.no_canary).then_some(args.canary),
        },
    };
    // Create the folder first: a taken name fails before minutes of measuring.
    let out = opledger_app::manifest::run_path(args.output.as_deref(), "profile", file.path());
    let folder = RunFolder::create(&out)?;
    let settings = opledger_app::engines::EngineSettings {
        rpc: args.rpc.settings(),
        ..args.model.settings()
    };
    if settings.rpc.is_some() && args.decode > 0 {
        bail!(
            "--rpc profiles a prefill chunk; decode over remote devices (-n) is not supported yet"
        );
    }
    // a remote device failing mid-run leaves the folder marked with why
    let stopped = |r| super::common::stop_on_remote_failure(folder.path(), r);
    let (mut engine, mut profiles) = stopped((|| {
        let mut engine = open_engine(kind, &file, &settings)?;
        let mut ui = Term::new(args.quiet || args.json);
        let profiles = opledger_app::profile::run(engine.as_mut(), &file, &bands, &req, &mut ui)?;
        Ok((engine, profiles))
    })())?;
    if settings.rpc.is_some() {
        // the same work on one process, right after: FUSED walls and the logits
        let split_logits = super::common::stop_on_remote_failure(
            folder.path(),
            engine.logits().map_err(Into::into),
        )?;
        // the split engine goes first: its model is freed on the servers too
        drop(engine);
        let compared = if args.no_one_process {
            Err("--no-one-process".to_string())
        } else {
            let mut ui = Term::new(args.quiet || args.json);
            opledger_app::profile::one_process(
                &file,
                &settings,
                &req.work,
                req.cycles,
                req.warmup,
                &split_logits,
                &mut ui,
            )
            .map_err(|e| format!("{e:#}"))
        };
        for p in &mut profiles {
            match &compared {
                Ok((walls, outputs)) => {
                    p.raw.one_process_fused_ms = walls.clone();
                    p.raw.one_process_outputs = Some(outputs.clone());
                }
                Err(why) => p.raw.one_process_skipped = Some(why.clone()),
            }
            p.summary = opledger_app::profile::summarise(&p.manifest, &p.raw)?;
        }
        if let Err(why) = &compared {
            if !args.no_one_process {
                eprintln!("warning: the split is not compared with one process: {why}");
            }
        }
    }
    opledger_app::runs::write_profiles(&folder, &profiles)?;
    let path = folder.finish()?;
    let summaries: Vec<&ProfileSummary> = profiles.iter().map(|p| &p.summary).collect();
    if args.json {
        if let [one] = summaries.as_slice() {
            println!("{}", serde_json::to_string_pretty(one)?);
        } else {
            println!("{}", serde_json::to_string_pretty(&summaries)?);
        }
    } else if !args.quiet {
        for p in &profiles {
            print!("{}", opledger_report::profile_text(&p.manifest, &p.summary));
            println!();
        }
        if summaries.len() > 1 {
            print!("{}", opledger_report::profile::parallel_text(&summaries));
        }
        println!("run folder: {}", path.display());
    }
    Ok(super::common::exit(opledger_app::profile::exit(&profiles)))
}
