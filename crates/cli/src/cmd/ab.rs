//! `opledger ab` and `opledger discover`: runtime configurations of llama.cpp compared
//! interleaved on the same work, with a control, ablations and a correctness gate; `discover`
//! searches a grid of knobs for the fastest configuration that still returns the same thing.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::EngineKind;
use opledger_app::outcome::of_ab;
use opledger_core::ab::{grid, AbConfig, Knobs, Tolerance};
use opledger_core::engine::Work;
use opledger_core::run_folder::RunFolder;
use opledger_report::ab::{ab_text, discover_text};

use super::common::{ModelArgs, Term};

/// The work both commands measure.
#[derive(Args, Clone)]
pub struct WorkArgs {
    /// Prefill chunk size.
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    /// Depths of the prefill scenarios (and of the decode ones).
    #[arg(short = 'd', long, value_delimiter = ',', default_value = "0")]
    pub depths: Vec<u32>,
    /// Also decode this many tokens per sequence (0: prefill only).
    #[arg(short = 'n', long = "decode", default_value_t = 0)]
    pub decode: u32,
    /// Sequence counts of the decode scenarios.
    #[arg(long, value_delimiter = ',', default_value = "1", value_parser = super::flags::at_least_one)]
    pub parallel: Vec<u32>,
    /// The smallest change a verdict calls faster or slower; an A/A control whose whole
    /// interval lies beyond it moved (inconclusive), and a wider control that did not move
    /// raises it to the noise the control shows.
    #[arg(long, default_value_t = 0.02, value_parser = super::flags::effect, allow_negative_numbers = true)]
    pub min_effect: f64,
    /// The output gate: the largest NMSE of one row of logits, sum((b-a)^2) / sum(a^2), that
    /// still counts as the same output, over every position of the chunk and the greedy steps
    /// (1e-6: llama.cpp's `llama-results`).
    #[arg(long, default_value_t = opledger_core::outputs::DEFAULT_MAX_NMSE, value_parser = super::flags::positive, allow_negative_numbers = true)]
    pub max_nmse: f64,
    /// The output gate: a top-1 token that differs where A's two largest logits lie within
    /// this many logits of each other is a near tie, reported and not refused.
    #[arg(long, default_value_t = opledger_core::outputs::DEFAULT_NEAR_TIE, value_parser = super::flags::non_negative, allow_negative_numbers = true)]
    pub near_tie: f64,
    /// The output gate: greedy decode steps after the chunk, both sides fed A's tokens.
    #[arg(long, default_value_t = opledger_core::outputs::DEFAULT_STEPS)]
    pub greedy_steps: u32,
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
}

impl WorkArgs {
    fn scenarios(&self) -> Vec<Work> {
        let mut out = Vec::new();
        for &d in &self.depths {
            out.push(Work::prefill(self.chunk, d));
        }
        if self.decode > 0 {
            for &d in &self.depths {
                for &p in &self.parallel {
                    out.push(Work {
                        decode_tokens: self.decode,
                        parallel: p,
                        ..Work::prefill(self.chunk, d)
                    });
                }
            }
        }
        out
    }

    fn config(&self, pairs: u32, scenarios: Vec<Work>) -> AbConfig {
        AbConfig {
            scenarios,
            pairs,
            gate: opledger_core::noise::GateConfig {
                max_others: self.noise_gate,
                enabled: !self.no_noise_gate,
                canary: (!self.no_canary).then_some(self.canary),
                ..Default::default()
            },
            tolerance: Tolerance::default(),
            min_effect: self.min_effect,
            resamples: 2000,
            seed: 0x0a_b0,
            outputs: Some(opledger_core::outputs::OutputGateConfig {
                max_nmse: self.max_nmse,
                near_tie: self.near_tie,
                steps: self.greedy_steps,
            }),
        }
    }
}

#[derive(Args)]
pub struct AbArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Configuration A, the baseline: `threads=2,flash_attn=on,...` (empty: defaults).
    #[arg(long, default_value = "")]
    pub a: String,
    /// Configuration B, the candidate.
    #[arg(long)]
    pub b: String,
    #[command(flatten)]
    pub work: WorkArgs,
    /// Interleaved cycles per scenario (at least 4), each a FUSED and a TIMED run of A, B and
    /// the control (a second process of A), in an order that turns every cycle; every band's
    /// B/A is judged over the cycles.
    #[arg(short = 'r', long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(4..))]
    pub pairs: u32,
    /// The run folder (default: runs/<time>-ab-<model>).
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

#[derive(Args)]
pub struct DiscoverArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The grid: knobs separated by `;`, values by `,`:
    /// `threads=1,2;flash_attn=on,off;ubatch=128,512`.
    #[arg(long)]
    pub knobs: String,
    #[command(flatten)]
    pub work: WorkArgs,
    /// Interleaved pairs per candidate in the search (first scenario only; at least 2).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(2..))]
    pub search_pairs: u32,
    /// Interleaved pairs of the confirmation of the winner (every scenario; at least 4).
    #[arg(short = 'r', long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(4..))]
    pub pairs: u32,
    /// The largest grid searched.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_candidates: u64,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

/// Refuses a `threads` knob this machine cannot run (as `-t` is refused).
fn check_knob_threads(flag: &str, k: &Knobs) -> Result<()> {
    if let Some(t) = k.get("threads") {
        let t: u32 = t.parse().with_context(|| format!("{flag}: threads={t}"))?;
        super::flags::check_threads(t, super::flags::cpus())
            .map_err(|e| anyhow::anyhow!("{flag}: threads={t}: {e}"))?;
    }
    Ok(())
}

pub fn run_ab(args: AbArgs) -> Result<ExitCode> {
    let a: Knobs = args.a.parse().context("--a")?;
    let b: Knobs = args.b.parse().context("--b")?;
    check_knob_threads("--a", &a)?;
    check_knob_threads("--b", &b)?;
    // a side in a worker of another build: that build says which architectures load
    let other_build = args.model.llama_worker.is_some()
        || [&a, &b].iter().any(|k| {
            k.get("worker")
                .is_some_and(|w| w != opledger_app::engines::BUNDLED)
        });
    let file = args.model.open_for(EngineKind::LlamaCpp, other_build)?;
    let bands = Bands::load(None, &file.arch.arch)?;
    let cfg = args.work.config(args.pairs, args.work.scenarios());
    let out = opledger_app::manifest::run_path(args.output.as_deref(), "ab", file.path());
    let folder = RunFolder::create(&out)?;
    let settings = args.model.settings();
    let (report, sides) = {
        let mut ui = Term::new(args.quiet || args.json);
        opledger_app::ab::ab_with_ablations(&file, &bands, &settings, &a, &b, &cfg, &mut ui)?
    };
    // each side as the engine that measured it said
    let m = opledger_app::ab::manifest(
        "ab",
        &file,
        &bands,
        &settings,
        &[("a", &sides.a), ("b", &sides.b)],
    )?;
    opledger_app::runs::write_ab(&folder, &m, &report)?;
    let dir = folder.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !args.quiet {
        print!("{}", ab_text(&report));
        println!("run folder: {}", dir.display());
    }
    Ok(super::common::exit(of_ab(report.verdict)))
}

pub fn run_discover(args: DiscoverArgs) -> Result<ExitCode> {
    let candidates = grid(
        &args.knobs,
        usize::try_from(args.max_candidates).unwrap_or(usize::MAX),
    )
    .context("--knobs")?;
    for c in &candidates {
        check_knob_threads("--knobs", c)?;
    }
    let file = args.model.open(EngineKind::LlamaCpp)?;
    let bands = Bands::load(None, &file.arch.arch)?;
    let scenarios = args.work.scenarios();
    let search = args.work.config(
        args.search_pairs,
        scenarios.iter().take(1).cloned().collect(),
    );
    let confirm = args.work.config(args.pairs, scenarios);
    let out = opledger_app::manifest::run_path(args.output.as_deref(), "discover", file.path());
    let folder = RunFolder::create(&out)?;
    let settings = args.model.settings();
    let (report, sides) = {
        let mut ui = Term::new(args.quiet || args.json);
        opledger_app::ab::discover(
            &file,
            &bands,
            &settings,
            &candidates,
            &search,
            &confirm,
            &mut ui,
        )?
    };
    let sides: Vec<(&str, &opledger_core::engine::EngineInfo)> =
        sides.iter().map(|(side, info)| (*side, info)).collect();
    let m = opledger_app::ab::manifest("discover", &file, &bands, &settings, &sides)?;
    opledger_app::runs::write_discover(&folder, &m, &report)?;
    let dir = folder.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else if !args.quiet {
        print!("{}", discover_text(&report));
        println!("run folder: {}", dir.display());
    }
    // a refused or inconclusive confirmation is not a discovery
    Ok(super::common::exit(
        report
            .outcome()
            .map_or(opledger_app::outcome::Exit::Ok, of_ab),
    ))
}
