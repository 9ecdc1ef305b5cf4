//! `opledger compare RUN_A RUN_B` (two stored profile runs side by side) and `opledger ledger`
//! (profile two engines on the same model and compare them, by share x wall and by in-graph
//! replay, with byte and FLOP math against this machine's measured peaks).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Result};
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::EngineKind;
use opledger_app::ledger::LedgerRequest;
use opledger_core::device::Clock;
use opledger_core::engine::Work;
use opledger_core::ledger::LedgerReport;
use opledger_core::replay::ReplayConfig;
use opledger_core::run_folder::RunFolder;
use opledger_report::ledger::{ledger_csv, ledger_markdown, ledger_text};

use super::common::{ModelArgs, Term};

#[derive(Args)]
pub struct CompareArgs {
    /// The run of the side being optimised (yours).
    pub run_a: PathBuf,
    /// The reference run.
    pub run_b: PathBuf,
    /// Compare runs that did not do the same work (chunk, depth, decode tokens, architecture,
    /// model: two files of different BLAKE3, another size or quantisation).
    #[arg(long)]
    pub force: bool,
    /// Gate: exit 6 when a band of RUN_A (the new run) is slower than RUN_B (the baseline) by
    /// more than PCT % (medians) and its cycles rank above the baseline's beyond chance
    /// (one-sided Mann-Whitney at 5 % over the number of bands).
    #[arg(long, value_name = "PCT", value_parser = super::flags::percent)]
    pub fail_above: Option<f64>,
    /// The clock the bands' times are read on: `host` (the spans' or nodes' time on the CPU)
    /// or `device` (an import's device activity); default: device where both runs have
    /// device time, else host.
    #[arg(long, value_enum)]
    pub clock: Option<ClockArg>,
    /// What to print.
    #[arg(long, value_enum, default_value = "text")]
    pub format: LedgerFormat,
    /// The same as --format json.
    #[arg(long)]
    pub json: bool,
}

/// `--clock`.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ClockArg {
    Host,
    Device,
}

impl From<ClockArg> for Clock {
    fn from(c: ClockArg) -> Clock {
        match c {
            ClockArg::Host => Clock::Host,
            ClockArg::Device => Clock::Device,
        }
    }
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

pub fn run_compare(args: CompareArgs) -> Result<ExitCode> {
    let report = opledger_app::ledger::compare_runs(
        &args.run_a,
        &args.run_b,
        args.force,
        args.fail_above,
        args.clock.map(Clock::from),
    )?;
    print_report(
        &report,
        if args.json {
            LedgerFormat::Json
        } else {
            args.format
        },
    )?;
    Ok(super::common::exit(opledger_app::ledger::exit(&report)))
}

fn engine_kind(name: &str) -> Result<EngineKind> {
    match name {
        "llama.cpp" | "llama" => Ok(EngineKind::LlamaCpp),
        "candle" => Ok(EngineKind::Candle),
        // the deterministic engine of the tests (not listed)
        "mock" => Ok(EngineKind::Mock),
        other => bail!("--engines: unknown engine '{other}' (llama.cpp, candle)"),
    }
}

pub fn run_ledger(args: LedgerArgs) -> Result<ExitCode> {
    if args.engines.len() != 2 {
        bail!("--engines takes two engines: the one being optimised, then the reference");
    }
    let engines = [
        engine_kind(&args.engines[0])?,
        engine_kind(&args.engines[1])?,
    ];
    if engines[0] == engines[1] {
        bail!(
            "--engines: {} twice; the ledger compares two engines (two builds or settings of one engine: opledger ab)",
            args.engines[0]
        );
    }
    let share = args.method.iter().any(|m| m == "share");
    let replay = args.method.iter().any(|m| m == "replay");
    if !share && !replay {
        bail!("--method takes share, replay or both");
    }
    let kind = if engines.contains(&EngineKind::LlamaCpp) {
        EngineKind::LlamaCpp
    } else {
        engines[0]
    };
    let file = args.model.open(kind)?;
    let bands = Bands::load(None, &file.arch.arch)?;
    let out = opledger_app::manifest::run_path(args.output.as_deref(), "ledger", file.path());
    let folder = RunFolder::create(&out)?;
    let format = if args.json {
        LedgerFormat::Json
    } else {
        args.format
    };
    let req = LedgerRequest {
        engines,
        work: Work::prefill(args.chunk, args.depth),
        cycles: args.cycles,
        share,
        replay: replay.then_some(ReplayConfig {
            k: args.k,
            cycles: args.replay_cycles,
        }),
    };
    let run = {
        let mut ui = Term::new(args.quiet || format != LedgerFormat::Text);
        opledger_app::ledger::run(&file, &bands, &args.model.settings(), &req, &mut ui)?
    };
    opledger_app::runs::write_ledger(&folder, &run.manifest, &run.raws, &run.report)?;
    let dir = folder.finish()?;
    if format != LedgerFormat::Text {
        print_report(&run.report, format)?;
    } else if !args.quiet {
        print!("{}", ledger_text(&run.report));
        println!("run folder: {}", dir.display());
    }
    Ok(super::common::exit(opledger_app::ledger::exit(&run.report)))
}
