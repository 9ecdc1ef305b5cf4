//! `opledger profile`: the per-node profile of one chunk on an engine (llama.cpp or candle), written
//! to a run folder.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_core::band::BandRules;
use opledger_core::engine::Work;
use opledger_core::manifest::{Manifest, ModelRecord, MANIFEST_SCHEMA_VERSION};
use opledger_core::node::NodeInfo;
use opledger_core::profile::{self, CheckStatus, ProfileConfig, ProfileRaw, ProfileSummary};
use opledger_core::run_folder::RunFolder;
use opledger_core::system::SystemSnapshot;
use opledger_report::{Format, ProfileView, RenderOptions, RunView};

use super::common::ModelArgs;
use super::engines::{load_engine, EngineKind};
use crate::model_file::{hash_file, ModelFile};
use crate::progress::steps_bar;

#[derive(Args)]
pub struct ProfileArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The engine to measure.
    #[arg(long, value_enum, default_value_t = EngineKind::LlamaCpp)]
    pub engine: EngineKind,
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
    /// The run folder to write (default: runs/<time>-profile-<model>); never overwritten.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

/// The band rules: a file given by the user (which must name the model's architecture), else
/// the built-in set of the architecture.
pub fn load_rules(path: Option<&Path>, arch: &str) -> Result<BandRules> {
    match path {
        Some(p) => {
            let text =
                std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?;
            let file = p.display().to_string();
            let rules = BandRules::parse(&text, &file)?;
            rules.check_arch(arch, &file)?;
            Ok(rules)
        }
        None => Ok(BandRules::builtin(arch)?),
    }
}

/// Warns, before measuring, about the keys of a user's band file (`path`) that match no op,
/// weight or node name of the captured graph: most likely typos, which would otherwise show
/// only as a coverage failure after the measurement. Only the keys the file itself writes are
/// checked, not those of the generic set it may extend (which names every architecture's
/// tensors), nor the built-in sets.
pub fn warn_unmatched(path: Option<&Path>, graph: &[NodeInfo]) {
    let Some(p) = path else { return };
    let file = p.display().to_string();
    // load_rules has read and parsed this file already; a file that changed since is not
    // checked again here
    let Ok(own) = std::fs::read_to_string(p)
        .map_err(|_| ())
        .and_then(|t| BandRules::parse_unmerged(&t, &file).map_err(|_| ()))
    else {
        return;
    };
    for key in own.unmatched_keys(graph) {
        eprintln!(
            "warning: {file}: {key} matches no op, weight or node name of this model's graph"
        );
    }
}

/// The manifest of a run on `file`.
pub fn manifest(
    command: &str,
    file: &ModelFile,
    model_path: &Path,
    engine: opledger_core::engine::EngineInfo,
    rules: &BandRules,
) -> Result<Manifest> {
    let hash = hash_file(model_path)?;
    Ok(Manifest {
        schema_version: MANIFEST_SCHEMA_VERSION,
        tool: format!("opledger {}", env!("CARGO_PKG_VERSION")),
        command: command.into(),
        args: std::env::args().collect(),
        created_utc: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        engine,
        model: ModelRecord {
            path: hash.path,
            size_bytes: hash.size_bytes,
            blake3: hash.blake3,
            arch: file.arch.clone(),
            metadata: file.metadata_summary(),
        },
        band_rules: rules.clone(),
        system: SystemSnapshot::take(),
    })
}

/// Writes a profile's files into `folder`: raw data first, then everything derived from it.
/// Writes a profile's files into `folder` (under `prefix`, e.g. `p4/`): raw data first, then
/// everything derived from it.
pub fn write_profile(
    folder: &RunFolder,
    prefix: &str,
    m: &Manifest,
    raw: &ProfileRaw,
) -> Result<ProfileSummary> {
    folder.write_json(&format!("{prefix}manifest.json"), m)?;
    folder.write_json(&format!("{prefix}raw.json"), raw)?;
    let summary = render_profile(m, raw, |name, bytes| {
        folder
            .write(&format!("{prefix}{name}"), bytes)
            .map(|_| ())
            .map_err(Into::into)
    })?;
    Ok(summary)
}

/// The files a profile run folder holds beside its raw data, as (format, file) pairs.
pub const PROFILE_FILES: [Format; 5] = [
    Format::Json,
    Format::Text,
    Format::Md,
    Format::Bands,
    Format::Nodes,
];

/// Derives the summary and its renderings from raw data, handing each file to `emit`.
pub fn render_profile(
    m: &Manifest,
    raw: &ProfileRaw,
    mut emit: impl FnMut(&str, &[u8]) -> Result<()>,
) -> Result<ProfileSummary> {
    let view = RunView::Profile(ProfileView::new(m, raw)?);
    let opts = RenderOptions::default();
    for format in PROFILE_FILES {
        let name = opledger_report::render::file_name(&view, format)
            .expect("a profile has every rendering it writes");
        emit(name, &opledger_report::render(&view, format, &opts)?)?;
    }
    let RunView::Profile(v) = view else {
        unreachable!()
    };
    Ok(v.summary)
}

pub fn run(args: ProfileArgs) -> Result<ExitCode> {
    if args.parallel.is_empty() || args.parallel.contains(&0) {
        bail!("--parallel takes sequence counts of at least 1");
    }
    if args.decode == 0 && args.parallel != [1] {
        bail!("--parallel applies to decode (-n N)");
    }
    let model_path = args.model.path()?;
    // the llama.cpp gate for llama.cpp; candle reads files llama.cpp would refuse
    let file = match args.engine {
        EngineKind::LlamaCpp => ModelFile::open(&model_path)?,
        EngineKind::Candle => ModelFile::open_structural(&model_path)?,
    };
    super::common::print_notes(&file);
    let rules = load_rules(args.bands.as_deref(), &file.arch.arch)?;
    let out = super::common::run_path(args.output.as_deref(), "profile", &model_path);
    let cfg = ProfileConfig {
        work: Work {
            chunk_tokens: args.chunk,
            depth_tokens: args.depth,
            all_logits: args.all_logits,
            token_seed: args.token_seed,
            decode_tokens: args.decode,
            parallel: args.parallel[0],
        },
        cycles: args.cycles,
        warmup: args.warmup,
        overhead_pairs: args.overhead_pairs,
        gate: opledger_core::noise::GateConfig {
            max_others: args.noise_gate,
            retries: opledger_core::noise::DEFAULT_RETRIES,
            enabled: !args.no_noise_gate,
        },
    };
    {
        // Create the folder first: a taken name fails before minutes of measuring.
        let folder = RunFolder::create(&out)?;
        let mut model_args = args.model.clone();
        model_args.model = Some(model_path.clone());
        let mut engine = load_engine(args.engine, &model_args)?;
        let bar = steps_bar(args.quiet || args.json);
        let several = args.parallel.len() > 1;
        let mut results = Vec::new();
        for &p in &args.parallel {
            let mut cfg = cfg.clone();
            cfg.work.parallel = p;
            let raw = profile::measure_with(
                engine.as_mut(),
                &cfg,
                &mut |phase, done, total| {
                    bar.set_message(if several {
                        format!("P={p} {phase}")
                    } else {
                        phase.to_string()
                    });
                    bar.set_length(total as u64);
                    bar.set_position(done as u64);
                },
                &mut |graph| warn_unmatched(args.bands.as_deref(), graph),
            )
            .with_context(|| format!("measuring (parallel {p})"))?;
            let m = manifest("profile", &file, &model_path, engine.info(), &rules)?;
            let prefix = if several {
                format!("p{p}/")
            } else {
                String::new()
            };
            let summary = write_profile(&folder, &prefix, &m, &raw)?;
            results.push((m, summary));
        }
        bar.finish_and_clear();
        if several {
            let summaries: Vec<&ProfileSummary> = results.iter().map(|(_, s)| s).collect();
            let table = opledger_report::profile::parallel_text(&summaries);
            folder.write("parallel.txt", table.as_bytes())?;
            folder.write(
                "parallel.csv",
                opledger_report::profile::parallel_csv(&summaries)?.as_bytes(),
            )?;
            folder.write_json("parallel.json", &summaries)?;
        }
        let path = folder.finish()?;
        if args.json {
            let summaries: Vec<&ProfileSummary> = results.iter().map(|(_, s)| s).collect();
            if several {
                println!("{}", serde_json::to_string_pretty(&summaries)?);
            } else {
                println!("{}", serde_json::to_string_pretty(summaries[0])?);
            }
        } else if !args.quiet {
            for (m, summary) in &results {
                print!("{}", opledger_report::profile_text(m, summary));
                println!();
            }
            if several {
                let summaries: Vec<&ProfileSummary> = results.iter().map(|(_, s)| s).collect();
                print!("{}", opledger_report::profile::parallel_text(&summaries));
            }
            println!("run folder: {}", path.display());
        }
        let worst = results
            .iter()
            .map(|(_, s)| exit_code(s))
            .find(|c| *c != ExitCode::SUCCESS)
            .unwrap_or(ExitCode::SUCCESS);
        Ok(worst)
    }
}

/// 0 when every check passed or only warned; 3 when a result must not be trusted.
pub fn exit_code(summary: &ProfileSummary) -> ExitCode {
    if summary.worst() == CheckStatus::Fail {
        for c in summary
            .checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
        {
            eprintln!("check failed: {}: {}", c.name, c.detail);
        }
        ExitCode::from(crate::exit::CHECK_FAILED)
    } else {
        ExitCode::SUCCESS
    }
}
