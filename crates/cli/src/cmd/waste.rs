//! `opledger waste`: the rows of every node that nothing kept reads (the requested logits, cache
//! writes) and the time spent on them, from a fresh profile on llama.cpp or a stored profile run,
//! written to a run folder.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_core::engine::Work;
use opledger_core::manifest::Manifest;
use opledger_core::profile::{ProfileConfig, ProfileRaw};
use opledger_core::run_folder::{fresh_run_path, open_complete, RunFolder};
use opledger_core::waste::WasteSummary;
use opledger_report::{Format, RenderOptions, RunView, WasteView};

use super::common::{utc_stamp, ModelArgs};
use super::profile::load_rules;

#[derive(Args)]
pub struct WasteArgs {
    #[command(flatten)]
    pub model: ModelArgs,
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

/// Derives the waste summary and its renderings from raw data, handing each file to `emit`.
pub fn render_waste(
    m: &Manifest,
    raw: &ProfileRaw,
    source_run: Option<String>,
    top: usize,
    mut emit: impl FnMut(&str, &[u8]) -> Result<()>,
) -> Result<WasteSummary> {
    let view = RunView::Waste(WasteView::new(m, raw, source_run).context("analysing the graph")?);
    let opts = RenderOptions {
        waste_top: top,
        ..RenderOptions::default()
    };
    for format in [Format::Json, Format::Text, Format::Md, Format::Nodes] {
        let name = opledger_report::render::file_name(&view, format)
            .expect("a waste run has every rendering it writes");
        emit(name, &opledger_report::render(&view, format, &opts)?)?;
    }
    let RunView::Waste(v) = view else {
        unreachable!()
    };
    Ok(v.summary)
}

/// The manifest and raw data of a stored profile run, re-labelled as this waste run.
fn from_stored(dir: &Path, bands: Option<&Path>) -> Result<(Manifest, ProfileRaw)> {
    let dir = open_complete(dir)?;
    let mut m = Manifest::read(&dir.join("manifest.json"))?;
    if m.command != "profile" && m.command != "waste" {
        bail!(
            "{}: a '{}' run; waste reads profile (or waste) runs",
            dir.display(),
            m.command
        );
    }
    let raw = ProfileRaw::read(&dir.join("raw.json"))?;
    if let Some(p) = bands {
        m.band_rules = load_rules(Some(p), &m.model.arch.arch)?;
        super::profile::warn_unmatched(Some(p), &raw.graph);
    }
    m.command = "waste".into();
    m.tool = format!("opledger {}", env!("CARGO_PKG_VERSION"));
    m.args = std::env::args().collect();
    m.created_utc = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    Ok((m, raw))
}

/// Profiles the model (as `profile` does) and returns the manifest and raw data.
#[cfg(feature = "llama")]
fn measured(args: &WasteArgs, model_path: &Path) -> Result<(Manifest, ProfileRaw)> {
    use opledger_core::engine::Engine;
    let file = crate::model_file::ModelFile::open(model_path)?;
    super::common::print_notes(&file);
    let rules = load_rules(args.bands.as_deref(), &file.arch.arch)?;
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
    let mut model_args = args.model.clone();
    model_args.model = Some(model_path.to_path_buf());
    let mut engine = super::common::load_llama(&model_args, false)?;
    let bar = crate::progress::steps_bar(args.quiet || args.json);
    let raw = opledger_core::profile::measure_with(
        &mut engine,
        &cfg,
        &mut |phase, done, total| {
            bar.set_message(phase.to_string());
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
        &mut |graph| super::profile::warn_unmatched(args.bands.as_deref(), graph),
    )
    .context("measuring")?;
    bar.finish_and_clear();
    let m = super::profile::manifest("waste", &file, model_path, engine.info(), &rules)?;
    Ok((m, raw))
}

#[cfg(not(feature = "llama"))]
fn measured(_: &WasteArgs, _: &Path) -> Result<(Manifest, ProfileRaw)> {
    bail!(
        "this opledger was built without the llama.cpp engine (feature `llama`): \
         analyse a stored run with --run RUN"
    )
}

pub fn run(args: WasteArgs) -> Result<ExitCode> {
    let out_for = |label: &str| {
        args.output
            .clone()
            .unwrap_or_else(|| fresh_run_path(Path::new("runs"), "waste", label, &utc_stamp()))
    };
    let (folder, m, raw, source) = match &args.run {
        Some(dir) => {
            // read (and refuse) the stored run before creating anything
            let (m, raw) = from_stored(dir, args.bands.as_deref())?;
            let label = dir
                .file_name()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "run".into());
            let folder = RunFolder::create(&out_for(&label))?;
            (folder, m, raw, Some(dir.display().to_string()))
        }
        None => {
            let p = args.model.path()?;
            let label = p
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "model".into());
            // Create the folder first: a taken name fails before minutes of measuring (a
            // measurement that fails leaves it empty, and it is removed).
            let folder = RunFolder::create(&out_for(&label))?;
            let (m, raw) = measured(&args, &p)?;
            (folder, m, raw, None)
        }
    };
    folder.write_json("manifest.json", &m)?;
    folder.write_json("raw.json", &raw)?;
    let summary = render_waste(&m, &raw, source, args.top, |name, bytes| {
        folder.write(name, bytes).map(|_| ()).map_err(Into::into)
    })?;
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
