//! `opledger sweep`: the depth sweep on llama.cpp into a run folder that keeps every chunk as it
//! lands; `--resume RUN` continues an interrupted sweep.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_core::engine::Work;
use opledger_core::manifest::Manifest;
use opledger_core::memory;
use opledger_core::node::NodeInfo;
use opledger_core::profile::CheckStatus;
use opledger_core::run_folder::{read_json, RunFolder};
use opledger_core::sweep::{load_folder, DecodeSteps, SweepConfig, SweepSummary};
use opledger_core::system::SystemSnapshot;
use opledger_report::{Format, RenderOptions, RunView, SweepView};

use super::common::ModelArgs;
use super::profile::{load_rules, manifest};
use crate::model_file::{hash_file, ModelFile};
use crate::progress::steps_bar;

#[derive(Args)]
pub struct SweepArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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

/// Files derived from the raw data (re-rendered by `report`, rewritten on resume).
const DERIVED: [&str; 4] = ["summary.json", "table.txt", "depths.csv", "chart.svg"];

pub fn run(args: SweepArgs) -> Result<ExitCode> {
    #[cfg(not(feature = "llama"))]
    {
        let _ = args;
        bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
    }
    #[cfg(feature = "llama")]
    {
        use opledger_core::engine::Engine;
        use opledger_core::sweep::{run_sweep, FolderStore};

        let (folder, m, cfg, model_path) = match &args.resume {
            Some(dir) => reopen(dir)?,
            None => start(&args)?,
        };
        let mut model_args = args.model.clone();
        model_args.model = Some(model_path.clone());
        if args.resume.is_some() {
            // the sweep continues with the threads it started with
            let threads = super::flags::check_threads(m.engine.threads, super::flags::cpus())
                .map_err(|e| anyhow::anyhow!("{}: resuming: {e}", folder.path().display()))?;
            model_args.threads = Some(threads);
        }
        let mut engine = super::common::load_llama(&model_args, false)?;
        let decode = cfg.decode.map(|d| (d.steps, d.parallel));
        engine.prepare_sweep(&cfg.work, cfg.chunks, decode)?;
        let graph = engine.graph()?;
        let decode_graph = match cfg.decode {
            Some(d) => engine.sweep_decode_graph(d.parallel)?,
            None => Vec::new(),
        };
        if args.resume.is_none() {
            super::profile::warn_unmatched(args.bands.as_deref(), &graph);
        }
        if args.resume.is_some() {
            let stored: Vec<NodeInfo> = read_json(&folder.path().join("graph.json"))?;
            let ops = |g: &[NodeInfo]| g.iter().map(|n| n.op.clone()).collect::<Vec<_>>();
            if ops(&stored) != ops(&graph) {
                bail!(
                    "{}: llama.cpp now builds a different graph for this model ({} nodes, the run has {}); start a new sweep",
                    folder.path().display(),
                    graph.len(),
                    stored.len()
                );
            }
            if cfg.decode.is_some() {
                let stored: Vec<NodeInfo> = read_json(&folder.path().join("decode_graph.json"))?;
                if ops(&stored) != ops(&decode_graph) {
                    bail!(
                        "{}: llama.cpp now builds a different decode step for this model; start a new sweep",
                        folder.path().display()
                    );
                }
            }
        } else {
            folder.write_json(
                "manifest.json",
                &Manifest {
                    engine: engine.info(),
                    ..m.clone()
                },
            )?;
            folder.write_json("config.json", &cfg)?;
            folder.write_json("graph.json", &graph)?;
            if cfg.decode.is_some() {
                folder.write_json("decode_graph.json", &decode_graph)?;
            }
        }
        let bar = steps_bar(args.quiet || args.json);
        let mut store = FolderStore::new(folder);
        run_sweep(
            &mut engine,
            &cfg,
            graph.len(),
            decode_graph.len(),
            &mut store,
            &mut |done, total, what| {
                bar.set_length(total);
                bar.set_position(done);
                bar.set_message(what.to_string());
            },
        )
        .with_context(|| {
            format!(
                "sweeping (measured chunks are kept: continue with --resume {})",
                store.folder().path().display()
            )
        })?;
        bar.finish_and_clear();
        let folder = store.into_folder();
        for name in DERIVED {
            folder.remove_derived(name)?;
        }
        let m = Manifest::read(&folder.path().join("manifest.json"))?;
        let summary = render_sweep(folder.path(), &m, &cfg, |name, bytes| {
            folder.write(name, bytes).map(|_| ()).map_err(Into::into)
        })?;
        let path = folder.finish()?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else if !args.quiet {
            print!("{}", opledger_report::sweep::sweep_text(&m, &summary));
            println!("run folder: {}", path.display());
        }
        Ok(exit_code(&summary))
    }
}

/// A new sweep: validate, check memory, create the folder.
fn start(args: &SweepArgs) -> Result<(RunFolder, Manifest, SweepConfig, PathBuf)> {
    let max_depth = args.max_depth.unwrap_or(0);
    if max_depth < args.chunk {
        bail!(
            "--max-depth {max_depth} is below the chunk ({} tokens): a sweep measures depths 0, \
             {0}, 2 x {0}, ... and needs at least two to fit a line; give --max-depth {0} or more",
            args.chunk
        );
    }
    let model_path = args.model.path()?;
    let file = ModelFile::open(&model_path)?;
    super::common::print_notes(&file);
    let rules = load_rules(args.bands.as_deref(), &file.arch.arch)?;
    if args.decode == 0 && args.parallel != 1 {
        bail!("--parallel applies to the decode steps (-n N)");
    }
    let cfg = SweepConfig {
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
    let n_ctx = cfg.chunks as u64 * cfg.work.chunk_tokens as u64
        + args.decode as u64 * args.parallel as u64;
    let need = memory::estimate(
        &file.arch,
        file.gguf.file_size_bytes,
        n_ctx,
        cfg.work.chunk_tokens as u64,
        2,
        cfg.work.all_logits,
    );
    let available = SystemSnapshot::take()
        .mem_available_bytes
        .unwrap_or(u64::MAX);
    if !args.no_memory_check {
        memory::check(need, available).with_context(|| {
            format!(
                "a sweep of {} to depth {} ({} tokens of context, two contexts)",
                model_path.display(),
                cfg.max_depth(),
                n_ctx
            )
        })?;
    }
    let out = super::common::run_path(args.output.as_deref(), "sweep", &model_path);
    let folder = RunFolder::create(&out)?;
    // the engine fills in its own description once loaded
    let m = manifest(
        "sweep",
        &file,
        &model_path,
        opledger_core::engine::EngineInfo {
            engine: "llama.cpp".into(),
            version: String::new(),
            backend: String::new(),
            threads: args.model.threads(),
            settings: Default::default(),
        },
        &rules,
    )?;
    Ok((folder, m, cfg, model_path))
}

/// An interrupted sweep: its folder, manifest and settings; the model must be unchanged.
fn reopen(dir: &Path) -> Result<(RunFolder, Manifest, SweepConfig, PathBuf)> {
    let folder = RunFolder::resume(dir)?;
    if !dir.join("manifest.json").exists() {
        bail!(
            "{}: the sweep was interrupted before it started measuring; start a new one",
            dir.display()
        );
    }
    let m = Manifest::read(&dir.join("manifest.json"))?;
    if m.command != "sweep" {
        bail!("{}: a '{}' run, not a sweep", dir.display(), m.command);
    }
    let cfg: SweepConfig = read_json(&dir.join("config.json"))?;
    let model_path = PathBuf::from(&m.model.path);
    let hash = hash_file(&model_path).with_context(|| {
        format!(
            "{}: the sweep's model {} is gone",
            dir.display(),
            model_path.display()
        )
    })?;
    if hash.blake3 != m.model.blake3 {
        bail!(
            "{}: the model {} changed since the sweep began (BLAKE3 {} now, {} then)",
            dir.display(),
            model_path.display(),
            hash.blake3,
            m.model.blake3
        );
    }
    Ok((folder, m, cfg, model_path))
}

/// Summarises a sweep folder's raw data and hands every rendering to `emit`.
pub fn render_sweep(
    dir: &Path,
    m: &Manifest,
    cfg: &SweepConfig,
    mut emit: impl FnMut(&str, &[u8]) -> Result<()>,
) -> Result<SweepSummary> {
    let graph: Vec<NodeInfo> = read_json(&dir.join("graph.json"))?;
    let decode_graph: Option<Vec<NodeInfo>> = if cfg.decode.is_some() {
        Some(read_json(&dir.join("decode_graph.json"))?)
    } else {
        None
    };
    let (records, passes) = load_folder(dir)?;
    let view = RunView::Sweep(SweepView::new(
        m,
        cfg,
        &graph,
        decode_graph.as_deref(),
        &records,
        &passes,
    )?);
    let opts = RenderOptions::default();
    for format in [Format::Json, Format::Text, Format::Bands, Format::Svg] {
        let name = opledger_report::render::file_name(&view, format)
            .expect("a sweep has every rendering it writes");
        emit(name, &opledger_report::render(&view, format, &opts)?)?;
    }
    let RunView::Sweep(v) = view else {
        unreachable!()
    };
    Ok(v.summary)
}

fn exit_code(summary: &SweepSummary) -> ExitCode {
    let failed: Vec<_> = summary
        .checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .collect();
    for c in &failed {
        eprintln!("check failed: {}: {}", c.name, c.detail);
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::CHECK_FAILED)
    }
}
