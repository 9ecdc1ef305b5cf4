//! `opledger ab` and `opledger discover`: runtime configurations of llama.cpp compared
//! interleaved on the same work, with a control, ablations and a correctness gate; `discover`
//! searches a grid of knobs for the fastest configuration that still returns the same thing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use opledger_core::ab::{
    grid, AbConfig, AbReport, Ablation, Candidate, DiscoverReport, Knobs, Outcome, ScenarioResult,
    Tolerance, AB_SCHEMA_VERSION, DISCOVER_SCHEMA_VERSION,
};
use opledger_core::engine::Work;
use opledger_core::manifest::Manifest;
use opledger_core::run_folder::RunFolder;
pub use opledger_report::ab::ab_text;

use super::common::ModelArgs;
use super::profile::{load_rules, manifest};
use crate::model_file::ModelFile;
use crate::progress::steps_bar;

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
    /// The smallest change a verdict calls faster or slower.
    #[arg(long, default_value_t = 0.02, value_parser = super::flags::effect, allow_negative_numbers = true)]
    pub min_effect: f64,
    /// Largest relative logit difference (max |a-b| / max |a|) that still counts as the same
    /// output; the greedy tokens must match too.
    #[arg(long, default_value_t = 2e-2, value_parser = super::flags::positive, allow_negative_numbers = true)]
    pub tolerance: f64,
    /// Noise gate: reject and retake a run during which the busiest other process used more
    /// than this share of one CPU, or all others more than this share of the machine (0..=1).
    #[arg(long, default_value_t = opledger_core::noise::DEFAULT_MAX_OTHERS, value_parser = super::flags::share, allow_negative_numbers = true)]
    pub noise_gate: f64,
    /// Turn the noise gate off.
    #[arg(long)]
    pub no_noise_gate: bool,
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
                ..Default::default()
            },
            tolerance: Tolerance {
                max_rel_error: self.tolerance,
                ..Default::default()
            },
            min_effect: self.min_effect,
            resamples: 2000,
            seed: 0x0a_b0,
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
    /// Interleaved A/B pairs per scenario (at least 4: the control splits A's runs in two
    /// halves of two or more).
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

/// The exit code of an A/B: 4 when the correctness gate refused B, 5 when a control moved
/// (inconclusive), else 0. The same codes come from `discover` (its confirmation) and from
/// `report` of a stored A/B.
pub fn ab_exit_code(report: &AbReport) -> ExitCode {
    match report.verdict {
        Outcome::Refused => {
            eprintln!("verdict: {}", report.verdict.words());
            ExitCode::from(crate::exit::REFUSED)
        }
        Outcome::Inconclusive => {
            eprintln!("verdict: {}", report.verdict.words());
            ExitCode::from(crate::exit::INCONCLUSIVE)
        }
        _ => ExitCode::SUCCESS,
    }
}

#[cfg(feature = "llama")]
fn compare(
    model: &ModelArgs,
    a: &Knobs,
    b: &Knobs,
    cfg: &AbConfig,
    file: &ModelFile,
    rules: &opledger_core::band::BandRules,
    progress: &mut dyn FnMut(u32, u32, &str),
) -> Result<Vec<ScenarioResult>> {
    let mut ea = super::common::load_llama_knobs(model, a)?;
    let mut eb = super::common::load_llama_knobs(model, b)?;
    Ok(opledger_core::ab::run_ab(
        &mut ea, &mut eb, cfg, rules, &file.arch, progress,
    )?)
}

#[cfg(feature = "llama")]
fn ab_with_ablations(
    model: &ModelArgs,
    a: &Knobs,
    b: &Knobs,
    cfg: &AbConfig,
    file: &ModelFile,
    rules: &opledger_core::band::BandRules,
    quiet: bool,
) -> Result<AbReport> {
    let bar = steps_bar(quiet);
    let mut progress = |done: u32, total: u32, what: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(what.to_string());
    };
    let scenarios = compare(model, a, b, cfg, file, rules, &mut progress)?;
    // a gain is shared out only where the confirmation found one beyond the noise
    let ratio_b = scenarios
        .first()
        .filter(|s| s.verdict == opledger_core::ab::Verdict::Faster)
        .map(|s| s.ratio)
        .unwrap_or(1.0);
    let mut ablations = Vec::new();
    let first = AbConfig {
        scenarios: cfg.scenarios.iter().take(1).cloned().collect(),
        ..cfg.clone()
    };
    for knob in b.differences(a) {
        let reverted = b.reverted(&knob, a);
        let r = compare(model, a, &reverted, &first, file, rules, &mut progress)?;
        let s = &r[0];
        ablations.push(Ablation {
            reverted: knob,
            knobs: reverted,
            ratio: s.ratio,
            ratio_lo: s.ratio_lo,
            ratio_hi: s.ratio_hi,
            verdict: s.verdict,
            correct: s.correctness.passed,
            share_of_gain: opledger_core::ab::share_of_gain(ratio_b, s.ratio),
        });
    }
    bar.finish_and_clear();
    Ok(AbReport {
        schema_version: AB_SCHEMA_VERSION,
        a: a.clone(),
        b: b.clone(),
        config: cfg.clone(),
        verdict: Outcome::of(&scenarios),
        scenarios,
        ablations,
    })
}

fn model_of(model: &ModelArgs) -> Result<(ModelFile, PathBuf, ModelArgs)> {
    let path = model.path()?;
    let file = ModelFile::open(&path)?;
    let mut args = model.clone();
    args.model = Some(path.clone());
    Ok((file, path, args))
}

fn folder_for(out: &Option<PathBuf>, kind: &str, model: &Path) -> Result<RunFolder> {
    Ok(RunFolder::create(&super::common::run_path(
        out.as_deref(),
        kind,
        model,
    ))?)
}

fn manifest_for(
    kind: &str,
    file: &ModelFile,
    path: &Path,
    rules: &opledger_core::band::BandRules,
    threads: u32,
) -> Result<Manifest> {
    manifest(
        kind,
        file,
        path,
        opledger_core::engine::EngineInfo {
            engine: "llama.cpp".into(),
            version: opledger_llama_version(),
            backend: "CPU".into(),
            threads,
            settings: Default::default(),
        },
        rules,
    )
}

fn opledger_llama_version() -> String {
    #[cfg(feature = "llama")]
    {
        opledger_llama::LLAMA_CPP_SYS_VERSION.to_string()
    }
    #[cfg(not(feature = "llama"))]
    {
        String::new()
    }
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
    let (file, path, model) = model_of(&args.model)?;
    let rules = load_rules(None, &file.arch.arch)?;
    let cfg = args.work.config(args.pairs, args.work.scenarios());
    #[cfg(not(feature = "llama"))]
    {
        let _ = (a, b, path, model, rules, cfg);
        anyhow::bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
    }
    #[cfg(feature = "llama")]
    {
        let folder = folder_for(&args.output, "ab", &path)?;
        let report =
            ab_with_ablations(&model, &a, &b, &cfg, &file, &rules, args.quiet || args.json)?;
        folder.write_json(
            "manifest.json",
            &manifest_for("ab", &file, &path, &rules, model.threads())?,
        )?;
        folder.write_json("ab.json", &report)?;
        let text = ab_text(&report);
        folder.write("table.txt", text.as_bytes())?;
        let dir = folder.finish()?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else if !args.quiet {
            print!("{text}");
            println!("run folder: {}", dir.display());
        }
        Ok(ab_exit_code(&report))
    }
}

/// What llama.cpp runs with when a knob is not set: this run's threads, flash attention as asked
/// (`auto` by default), weights repacked, the whole chunk one ubatch, an F16 KV cache.
fn resolved_defaults(model: &ModelArgs, chunk: u32) -> Knobs {
    Knobs(
        [
            ("threads", model.threads().to_string()),
            (
                "flash_attn",
                match model.flash_attn {
                    super::common::FlashAttnArg::Auto => "auto",
                    super::common::FlashAttnArg::On => "on",
                    super::common::FlashAttnArg::Off => "off",
                }
                .to_string(),
            ),
            ("repack", "on".to_string()),
            ("ubatch", chunk.to_string()),
            ("type_k", "f16".to_string()),
            ("type_v", "f16".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    )
}

pub fn run_discover(args: DiscoverArgs) -> Result<ExitCode> {
    let (file, path, model) = model_of(&args.model)?;
    let rules = load_rules(None, &file.arch.arch)?;
    let candidates = grid(
        &args.knobs,
        usize::try_from(args.max_candidates).unwrap_or(usize::MAX),
    )
    .context("--knobs")?;
    for c in &candidates {
        check_knob_threads("--knobs", c)?;
    }
    let scenarios = args.work.scenarios();
    #[cfg(not(feature = "llama"))]
    {
        let _ = (candidates, scenarios, path, model, rules);
        anyhow::bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
    }
    #[cfg(feature = "llama")]
    {
        let folder = folder_for(&args.output, "discover", &path)?;
        let baseline = Knobs::default();
        let search = args.work.config(
            args.search_pairs,
            scenarios.iter().take(1).cloned().collect(),
        );
        let bar = steps_bar(args.quiet || args.json);
        let mut found = Vec::new();
        for (i, c) in candidates.iter().enumerate() {
            bar.set_length(candidates.len() as u64);
            bar.set_position(i as u64);
            bar.set_message(c.to_string());
            let r = compare(
                &model,
                &baseline,
                c,
                &search,
                &file,
                &rules,
                &mut |_, _, _| {},
            )?;
            let s = &r[0];
            found.push(Candidate {
                knobs: c.clone(),
                ratio: s.ratio,
                ratio_lo: s.ratio_lo,
                ratio_hi: s.ratio_hi,
                correct: s.correctness.passed,
            });
        }
        bar.finish_and_clear();
        found.sort_by(|x, y| x.ratio.total_cmp(&y.ratio));
        let defaults = resolved_defaults(&model, args.work.chunk);
        let winner = found.iter().find(|c| {
            c.correct && !c.knobs.without_defaults(&defaults).0.is_empty() && c.ratio < 1.0
        });
        let confirmation = match winner {
            Some(w) => {
                // knobs the winner sets to their default are no change: confirmed and ablated
                // without them
                let w = Candidate {
                    knobs: w.knobs.without_defaults(&defaults),
                    ..w.clone()
                };
                let cfg = args.work.config(args.pairs, scenarios.clone());
                Some(ab_with_ablations(
                    &model,
                    &baseline,
                    &w.knobs,
                    &cfg,
                    &file,
                    &rules,
                    args.quiet || args.json,
                )?)
            }
            None => None,
        };
        let report = DiscoverReport {
            schema_version: DISCOVER_SCHEMA_VERSION,
            baseline,
            candidates: found,
            confirmation,
        };
        let text = opledger_report::ab::discover_text(&report);
        folder.write_json(
            "manifest.json",
            &manifest_for("discover", &file, &path, &rules, model.threads())?,
        )?;
        folder.write_json("discover.json", &report)?;
        folder.write("table.txt", text.as_bytes())?;
        let dir = folder.finish()?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
        } else if !args.quiet {
            print!("{text}");
            println!("run folder: {}", dir.display());
        }
        // a refused or inconclusive confirmation is not a discovery
        Ok(report
            .confirmation
            .as_ref()
            .map(ab_exit_code)
            .unwrap_or(ExitCode::SUCCESS))
    }
}
