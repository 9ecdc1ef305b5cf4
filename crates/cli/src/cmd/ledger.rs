//! `opledger compare RUN_A RUN_B` (two stored profile runs side by side) and `opledger ledger`
//! (profile two engines on the same model and compare them, by share x wall and by in-graph
//! replay, with byte and FLOP math against this machine's measured peaks).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_core::band::Categoriser;
use opledger_core::engine::Work;
use opledger_core::ledger::{band_work, compare, LedgerReport, Side};
use opledger_core::manifest::Manifest;
use opledger_core::peaks::Peaks;
use opledger_core::profile::{analyse, ProfileConfig, ProfileRaw};
use opledger_core::replay::{measure_replay, ReplayConfig};
use opledger_core::run_folder::{open_complete, RunFolder};
use opledger_report::ledger::{ledger_csv, ledger_markdown, ledger_text};

use super::common::ModelArgs;
use super::engines::{load_engine, EngineKind};
use super::profile::{load_rules, manifest};
use crate::model_file::ModelFile;
use crate::progress::steps_bar;

#[derive(Args)]
pub struct CompareArgs {
    /// The run of the side being optimised (yours).
    pub run_a: PathBuf,
    /// The reference run.
    pub run_b: PathBuf,
    /// Compare runs that did not do the same work (chunk, depth, architecture).
    #[arg(long)]
    pub force: bool,
    /// What to print.
    #[arg(long, value_enum, default_value = "text")]
    pub format: LedgerFormat,
    /// The same as --format json.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args)]
pub struct LedgerArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The two engines: the one being optimised first, the reference second.
    #[arg(long, value_delimiter = ',', default_value = "candle,llama.cpp")]
    pub engines: Vec<String>,
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: u32,
    /// Profile cycles (share x wall).
    #[arg(short = 'r', long, default_value_t = 5, value_parser = super::flags::at_least_one)]
    pub cycles: u32,
    /// Methods: `share` (TIMED share x FUSED wall) and `replay` (in-graph replay).
    #[arg(long, value_delimiter = ',', default_value = "share,replay")]
    pub method: Vec<String>,
    /// Extra dispatches per replayed node.
    #[arg(short = 'k', long, default_value_t = 4, value_parser = super::flags::at_least_one)]
    pub k: u32,
    /// Replay cycles.
    #[arg(long, default_value_t = 3, value_parser = super::flags::at_least_one)]
    pub replay_cycles: u32,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// What to print (the run folder gets all of them).
    #[arg(long, value_enum, default_value = "text")]
    pub format: LedgerFormat,
    /// The same as --format json.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

/// What goes to stdout.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LedgerFormat {
    Text,
    Json,
    Md,
    Csv,
}

fn print_report(report: &LedgerReport, format: LedgerFormat) -> Result<()> {
    match format {
        LedgerFormat::Text => print!("{}", ledger_text(report)),
        LedgerFormat::Json => println!("{}", serde_json::to_string_pretty(report)?),
        LedgerFormat::Md => print!("{}", ledger_markdown(report)),
        LedgerFormat::Csv => print!("{}", ledger_csv(report)?),
    }
    Ok(())
}

fn side_of_run(dir: &Path) -> Result<Side> {
    let dir = open_complete(dir)?;
    let m = Manifest::read(&dir.join("manifest.json"))?;
    if m.command != "profile" {
        bail!(
            "{}: a '{}' run; compare takes profile runs",
            dir.display(),
            m.command
        );
    }
    let raw = ProfileRaw::read(&dir.join("raw.json"))?;
    let (assignments, summary) = analyse(&raw, &m.band_rules, &m.model.arch)?;
    let mut side = Side::from_summary(
        &format!(
            "{} {} · {}",
            m.engine.engine,
            m.engine.version,
            dir.display()
        ),
        &m.model.arch.arch,
        &summary,
    );
    side.work = band_work(&raw.graph, &assignments, &BTreeMap::new(), &raw.config.work);
    Ok(side)
}

pub fn run_compare(args: CompareArgs) -> Result<ExitCode> {
    let a = side_of_run(&args.run_a)?;
    let b = side_of_run(&args.run_b)?;
    // stored runs carry no peaks (and may come from another machine): no roofline verdict
    let ledger = compare(a, b, args.force, None)?;
    let report = LedgerReport {
        ledger,
        replay_a: None,
        replay_b: None,
        peaks: None,
        notes: vec![
            "bytes count every expert of an expert matmul (routing not stored): an upper bound"
                .into(),
            "no peaks are measured for stored runs: what limits a band is not judged (`opledger ledger` measures them)"
                .into(),
        ],
    };
    print_report(
        &report,
        if args.json {
            LedgerFormat::Json
        } else {
            args.format
        },
    )?;
    Ok(ExitCode::SUCCESS)
}

fn engine_kind(name: &str) -> Result<EngineKind> {
    match name {
        "llama.cpp" | "llama" => Ok(EngineKind::LlamaCpp),
        "candle" => Ok(EngineKind::Candle),
        other => bail!("--engines: unknown engine '{other}' (llama.cpp, candle)"),
    }
}

pub fn run_ledger(args: LedgerArgs) -> Result<ExitCode> {
    if args.engines.len() != 2 {
        bail!("--engines takes two engines: the one being optimised, then the reference");
    }
    let kinds = [
        engine_kind(&args.engines[0])?,
        engine_kind(&args.engines[1])?,
    ];
    let share = args.method.iter().any(|m| m == "share");
    let replay = args.method.iter().any(|m| m == "replay");
    if !share && !replay {
        bail!("--method takes share, replay or both");
    }
    let model_path = args.model.path()?;
    let file = if kinds.contains(&EngineKind::LlamaCpp) {
        ModelFile::open(&model_path)?
    } else {
        ModelFile::open_structural(&model_path)?
    };
    let rules = load_rules(None, &file.arch.arch)?;
    let out = super::common::run_path(args.output.as_deref(), "ledger", &model_path);
    let folder = RunFolder::create(&out)?;
    let mut model_args = args.model.clone();
    model_args.model = Some(model_path.clone());
    let cfg = ProfileConfig {
        work: Work::prefill(args.chunk, args.depth),
        cycles: args.cycles,
        warmup: 1,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let format = if args.json {
        LedgerFormat::Json
    } else {
        args.format
    };
    let bar = steps_bar(args.quiet || format != LedgerFormat::Text);
    let mut sides = Vec::new();
    let mut replays = Vec::new();
    let mut notes = Vec::new();
    let mut peaks: Option<Peaks> = None;
    for (i, kind) in kinds.iter().enumerate() {
        let name = &args.engines[i];
        let mut engine = load_engine(*kind, &model_args)?;
        let raw =
            opledger_core::profile::measure(engine.as_mut(), &cfg, &mut |phase, done, total| {
                bar.set_message(format!("{name}: {phase}"));
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })
            .with_context(|| format!("profiling on {name}"))?;
        let (assignments, summary) = analyse(&raw, &rules, &file.arch)?;
        let info = opledger_core::engine::Engine::info(engine.as_ref());
        let mut side = Side::from_summary(
            &format!("{} {}", info.engine, info.version),
            &file.arch.arch,
            &summary,
        );
        let routed = engine.routed_experts()?;
        if routed.is_none() && file.arch.is_moe() && *kind == EngineKind::LlamaCpp {
            notes.push(format!(
                "{name}: expert bytes count every expert (routing unknown)"
            ));
        }
        side.work = band_work(
            &raw.graph,
            &assignments,
            &routed.unwrap_or_default(),
            &cfg.work,
        );
        let mut replay_result = None;
        if replay {
            engine.prepare(&cfg.work)?;
            let graph = engine.graph()?;
            let a = Categoriser::new(&rules, &file.arch).categorise(&graph);
            // the bands this engine's graph holds (a generic rule set names more)
            let bands = rules.bands_in(&a);
            match measure_replay(
                engine.as_mut(),
                &graph,
                &a,
                &bands,
                cfg.work.tokens_per_run(),
                &ReplayConfig {
                    k: args.k,
                    cycles: args.replay_cycles,
                },
                &mut |done, total, _| {
                    bar.set_message(format!("{name}: replay"));
                    bar.set_length(total as u64);
                    bar.set_position(done as u64);
                },
            ) {
                Ok(mut r) => {
                    r.excluded_share = timed_share(&raw, &r.excluded_inplace);
                    side.replay_ms_per_token = r
                        .bands
                        .iter()
                        .map(|b| (b.band.clone(), b.ms_per_token))
                        .collect();
                    replay_result = Some(r);
                }
                Err(opledger_core::engine::EngineError::Unsupported { what, why }) => {
                    notes.push(format!("{name}: no {what} ({why})"));
                }
                Err(e) => return Err(e).with_context(|| format!("replaying on {name}")),
            }
        }
        if peaks.is_none() {
            if let Some((gflops, shape)) = engine.gemm_peak()? {
                let threads = model_args.threads() as usize;
                peaks = Some(Peaks {
                    copy_gb_per_s: opledger_core::peaks::copy_bandwidth_gb_per_s(
                        1 << 30,
                        threads,
                        3,
                    ),
                    gemm_gflop_per_s: Some(gflops),
                    gemm_shape: Some(format!("{shape} on {name}")),
                });
            }
        }
        folder.write_json(&format!("{}/raw.json", name.replace('.', "_")), &raw)?;
        sides.push(side);
        replays.push(replay_result);
    }
    bar.finish_and_clear();
    let b = sides.pop().expect("two sides");
    let a = sides.pop().expect("two sides");
    let ledger = compare(a, b, false, peaks.as_ref())?;
    let replay_b = replays.pop().flatten();
    let replay_a = replays.pop().flatten();
    let report = LedgerReport {
        ledger,
        replay_a,
        replay_b,
        peaks,
        notes,
    };
    let m = manifest(
        "ledger",
        &file,
        &model_path,
        opledger_core::engine::EngineInfo {
            engine: args.engines.join(" vs "),
            version: String::new(),
            backend: "CPU".into(),
            threads: model_args.threads(),
            settings: Default::default(),
        },
        &rules,
    )?;
    let text = ledger_text(&report);
    folder.write_json("manifest.json", &m)?;
    folder.write_json("ledger.json", &report)?;
    folder.write("table.txt", text.as_bytes())?;
    folder.write("ledger.md", ledger_markdown(&report).as_bytes())?;
    folder.write("ledger.csv", ledger_csv(&report)?.as_bytes())?;
    let dir = folder.finish()?;
    if format != LedgerFormat::Text {
        print_report(&report, format)?;
    } else if !args.quiet {
        print!("{text}");
        println!("run folder: {}", dir.display());
    }
    // a replay whose validations failed (outputs changed, replay-all or the sum of bands
    // outside its bound, k-scaling failed) is a failed check: exit 3, as the other checks do
    let mut bad_replay = false;
    for (side, rr) in [("A", &report.replay_a), ("B", &report.replay_b)] {
        if let Some(rr) = rr.as_ref().filter(|rr| !rr.reliable) {
            bad_replay = true;
            for c in rr.checks.iter().filter(|c| !c.pass) {
                eprintln!("check failed: replay {side} {}: {}", c.name, c.detail);
            }
        }
    }
    Ok(if bad_replay {
        ExitCode::from(crate::exit::CHECK_FAILED)
    } else {
        ExitCode::SUCCESS
    })
}

/// The share of the TIMED node time (median over cycles) spent in the nodes `listed` as
/// `OP name` (matched by op and name: the profile's and the replay's graphs are built
/// separately).
fn timed_share(raw: &ProfileRaw, listed: &[String]) -> f64 {
    let wanted: std::collections::BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    let per_node: Vec<f64> = (0..raw.graph.len())
        .map(|i| {
            let v: Vec<f64> = raw
                .cycles
                .iter()
                .filter_map(|c| c.node_us.get(i).copied())
                .collect();
            opledger_core::stats::median(&v).unwrap_or(0.0)
        })
        .collect();
    let total: f64 = per_node.iter().sum();
    let hit: f64 = raw
        .graph
        .iter()
        .zip(&per_node)
        .filter(|(n, _)| wanted.contains(format!("{} {}", n.op, n.name).as_str()))
        .map(|(_, t)| t)
        .sum();
    if total > 0.0 {
        hit / total
    } else {
        0.0
    }
}
