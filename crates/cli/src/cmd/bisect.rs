//! `opledger bisect`: which commit of a llama.cpp checkout (or which of a list of trees and
//! archives) first moved a band, the total or an op; `--resume RUN` continues a killed bisect
//! from its stored steps.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::bisect::{BuildSetup, Request, Source};
use opledger_app::engines::EngineKind;
use opledger_app::model::ModelFile;
use opledger_core::bisect::{BisectConfig, Target, BISECT_SCHEMA_VERSION};
use opledger_core::engine::Work;
use opledger_core::run_folder::{read_versioned, RunFolder};
use opledger_report::bisect::bisect_text;

use super::common::{ModelArgs, Term};

/// ggml's CPU options of every build (not GGML_NATIVE: some VMs report AMX and die of SIGILL in
/// its kernels).
pub const CPU_OPTIONS: [&str; 5] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
];

#[derive(Args)]
pub struct BisectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A git checkout of llama.cpp (yours: opledger never changes its working tree; each
    /// commit is checked out into a worktree of opledger's own under --work-dir).
    #[arg(long, requires_all = ["good", "bad"], conflicts_with = "trees")]
    pub repo: Option<PathBuf>,
    /// The good commit (any revision git knows).
    #[arg(long, requires = "repo")]
    pub good: Option<String>,
    /// The bad commit: a descendant of --good along first parents.
    #[arg(long, requires = "repo")]
    pub bad: Option<String>,
    /// Instead of a git checkout: llama.cpp source trees or .tar.gz archives in order, the
    /// good one first, the bad one last (release archives by build number).
    #[arg(long, num_args = 2.., value_name = "TREE")]
    pub trees: Vec<PathBuf>,
    /// Bisect this band (default: the total).
    #[arg(long, conflicts_with = "op")]
    pub band: Option<String>,
    /// Bisect this op (every node of that op type, as the graph names it: GLU, MUL_MAT, ...).
    #[arg(long)]
    pub op: Option<String>,
    /// Prefill chunk size.
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    /// Measure N decode steps after the chunk instead of the chunk (0: the prefill chunk).
    #[arg(short = 'n', long = "decode", default_value_t = 0)]
    pub decode: u32,
    /// Cycles of a step's first measurement (good, mid and bad, interleaved), and of each
    /// further round while it is undecided (at least 2).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u32).range(2..))]
    pub cycles: u32,
    /// The most cycles a step is measured for before it is called undecided (which ends the
    /// search with the range it narrowed to).
    #[arg(long, default_value_t = 12, value_parser = clap::value_parser!(u32).range(2..))]
    pub max_cycles: u32,
    /// Cycles of the ends (good, bad and a second process of good as the control) and of the
    /// first bad commit against its parent.
    #[arg(long, default_value_t = 6, value_parser = clap::value_parser!(u32).range(2..))]
    pub ends_cycles: u32,
    /// The smallest change of the ends that is something to bisect.
    #[arg(long, default_value_t = 0.05, value_parser = super::flags::effect, allow_negative_numbers = true)]
    pub min_effect: f64,
    /// The output gate of each step against good: the largest NMSE of a row of logits.
    #[arg(long, default_value_t = opledger_core::outputs::DEFAULT_MAX_NMSE, value_parser = super::flags::positive, allow_negative_numbers = true)]
    pub max_nmse: f64,
    /// The output gate: greedy decode steps after the chunk.
    #[arg(long, default_value_t = opledger_core::outputs::DEFAULT_STEPS)]
    pub greedy_steps: u32,
    /// Turn the noise gate off.
    #[arg(long)]
    pub no_noise_gate: bool,
    /// The build script (default: scripts/build-worker of the checkout this opledger was built
    /// from).
    #[arg(long, value_name = "PATH")]
    pub build_worker: Option<PathBuf>,
    /// A CMake option of every build (repeat it; default: ggml's CPU options -DGGML_NATIVE=OFF
    /// -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON).
    #[arg(
        long = "cmake-option",
        value_name = "OPTION",
        allow_hyphen_values = true
    )]
    pub cmake_options: Vec<String>,
    /// opledger's folder for the worktrees of the commits (default: ~/.cache/opledger/bisect).
    #[arg(long, value_name = "DIR")]
    pub work_dir: Option<PathBuf>,
    /// The run folder (default: runs/<time>-bisect-<model>).
    #[arg(short, long, conflicts_with = "resume")]
    pub output: Option<PathBuf>,
    /// Continue a bisect that was stopped, from the steps its folder holds.
    #[arg(long, value_name = "RUN")]
    pub resume: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

/// The build script of the checkout this binary was built from.
fn default_build_worker() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/build-worker")
}

fn default_work_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .context("neither XDG_CACHE_HOME nor HOME is set: give --work-dir")?;
    Ok(base.join("opledger/bisect"))
}

impl BisectArgs {
    fn target(&self) -> Target {
        match (&self.band, &self.op) {
            (Some(b), _) => Target::Band(b.clone()),
            (_, Some(o)) => Target::Op(o.clone()),
            _ => Target::Total,
        }
    }

    fn config(&self) -> BisectConfig {
        let work = Work {
            decode_tokens: self.decode,
            ..Work::prefill(self.chunk, 0)
        };
        BisectConfig {
            work,
            target: self.target(),
            ends_cycles: self.ends_cycles,
            cycles: self.cycles,
            max_cycles: self.max_cycles,
            min_effect: self.min_effect,
            resamples: 2000,
            seed: 0xB15E,
            gate: opledger_core::noise::GateConfig {
                enabled: !self.no_noise_gate,
                ..Default::default()
            },
            outputs: opledger_core::outputs::OutputGateConfig {
                max_nmse: self.max_nmse,
                steps: self.greedy_steps,
                ..Default::default()
            },
        }
    }

    fn source(&self) -> Result<Source> {
        match (&self.repo, self.trees.is_empty()) {
            (Some(repo), true) => Ok(Source::Git {
                repo: repo.clone(),
                good: self.good.clone().unwrap_or_default(),
                bad: self.bad.clone().unwrap_or_default(),
            }),
            (None, false) => Ok(Source::Trees {
                trees: self.trees.clone(),
            }),
            _ => bail!("name what to bisect: --repo PATH --good REF --bad REF, or --trees A B ..."),
        }
    }
}

/// A new bisect's request: the candidates listed, the band checked against the rules.
fn new_request(args: &BisectArgs, file: &ModelFile, bands: &Bands) -> Result<Request> {
    let source = args.source()?;
    let candidates = match &source {
        Source::Git { repo, good, bad } => opledger_app::bisect::git_candidates(repo, good, bad)?,
        Source::Trees { trees } => opledger_app::bisect::tree_candidates(trees)?,
    };
    let config = args.config();
    if let Target::Band(b) = &config.target {
        let names = bands.rules.band_names();
        if !names.iter().any(|n| n == b) {
            bail!("--band {b}: no such band (the bands: {})", names.join(", "));
        }
    }
    if args.max_cycles < args.cycles {
        bail!(
            "--max-cycles {} is below --cycles {}",
            args.max_cycles,
            args.cycles
        );
    }
    let script = args
        .build_worker
        .clone()
        .unwrap_or_else(default_build_worker);
    if !script.is_file() {
        bail!(
            "{}: the worker's build script is not there; give --build-worker PATH (scripts/build-worker of an opledger checkout)",
            script.display()
        );
    }
    let work_dir = match &args.work_dir {
        Some(d) => d.clone(),
        None => default_work_dir()?,
    };
    let cmake_options = if args.cmake_options.is_empty() {
        CPU_OPTIONS.iter().map(|s| s.to_string()).collect()
    } else {
        args.cmake_options.clone()
    };
    Ok(Request {
        schema_version: BISECT_SCHEMA_VERSION,
        source,
        setup: BuildSetup {
            script: std::fs::canonicalize(&script).unwrap_or(script),
            cmake_options,
            work_dir: std::path::absolute(&work_dir).unwrap_or(work_dir),
        },
        candidates,
        config,
        model: std::fs::canonicalize(file.path()).unwrap_or_else(|_| file.path().to_path_buf()),
        threads: args.model.threads(),
    })
}

pub fn run(args: BisectArgs) -> Result<ExitCode> {
    let mut settings = args.model.settings();
    let (request, file, folder) = match &args.resume {
        Some(dir) => {
            let folder = RunFolder::resume(dir)?;
            let request: Request =
                read_versioned(&dir.join("request.json"), BISECT_SCHEMA_VERSION)?;
            settings.threads = request.threads;
            let file = ModelFile::open_for(&request.model, opledger_gguf::LlamaBuild::Other)?;
            super::common::print_notes(&file);
            (request, file, folder)
        }
        None => {
            let file = args.model.open_for(EngineKind::LlamaCpp, true)?;
            let bands = Bands::load(None, &file.arch.arch)?;
            let request = new_request(&args, &file, &bands)?;
            let out =
                opledger_app::manifest::run_path(args.output.as_deref(), "bisect", file.path());
            let folder = RunFolder::create(&out)?;
            folder.write_json("request.json", &request)?;
            (request, file, folder)
        }
    };
    let bands = Bands::load(None, &file.arch.arch)?;
    let (report, engine) = {
        let mut ui = Term::new(args.quiet || args.json);
        opledger_app::bisect::bisect(&request, &file, &bands, &settings, &folder, &mut ui)
            .with_context(|| {
                format!(
                    "bisecting (the steps so far are kept: continue with --resume {})",
                    folder.path().display()
                )
            })?
    };
    let m = opledger_app::bisect::manifest(&file, &bands, engine)?;
    opledger_app::runs::write_bisect(&folder, &m, &report)?;
    let dir = folder.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !args.quiet {
        print!("{}", bisect_text(&report));
        println!("run folder: {}", dir.display());
    }
    Ok(super::common::exit(opledger_app::outcome::of_bisect(
        &report,
    )))
}
