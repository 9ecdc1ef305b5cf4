//! `opledger import TRACE`: a trace an engine wrote of itself (Chrome trace-event JSON) mapped to
//! bands by import rules, written as a run folder that `report` and `compare` take.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Args;
use opledger_app::import::ImportRequest;
use opledger_app::model::ModelFile;
use opledger_core::import_rules::BUILTIN_IMPORT_RULES;
use opledger_core::run_folder::RunFolder;

#[derive(Args)]
pub struct ImportArgs {
    /// The trace file.
    pub trace: PathBuf,
    /// The trace's format.
    #[arg(long, value_enum, default_value = "chrome")]
    pub format: TraceFormat,
    /// Import rules: a TOML file, or the name of a built-in set (`candle`, `pytorch`).
    #[arg(long, default_value = "candle")]
    pub rules: String,
    /// The pattern (regex) of a step span's name, overriding the rules' own.
    #[arg(long)]
    pub step: Option<String>,
    /// Tokens one step computes (bands are reported per token); default 1 for a trace, the
    /// records' own for node records.
    #[arg(long, value_parser = super::flags::at_least_one)]
    pub tokens: Option<u32>,
    /// Leave out the first N steps of the trace (warm-up passes the engine traced too).
    #[arg(long, default_value_t = 0, value_name = "N")]
    pub skip_steps: u32,
    /// The GGUF file the engine ran, recorded in the manifest (so `compare` can match runs).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// The run folder to write (default: runs/<time>-import-<trace>); never overwritten.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

/// Trace formats `import` reads.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TraceFormat {
    /// Chrome trace-event JSON (Kineto, tracing-chrome, chrome://tracing, Perfetto's JSON).
    Chrome,
    /// opledger's node records, JSON lines (README, "Node records").
    Jsonl,
}

pub fn run(args: ImportArgs) -> Result<ExitCode> {
    let model = args
        .model
        .as_deref()
        .map(ModelFile::open_structural)
        .transpose()?;
    if args.format == TraceFormat::Jsonl {
        let imported = opledger_app::import::run_records(&args.trace, args.tokens, model.as_ref())?;
        let out = opledger_app::import::run_path(args.output.as_deref(), &args.trace);
        let folder = RunFolder::create(&out)?;
        let summary = opledger_app::runs::write_import(&folder, &imported, None)?;
        let path = folder.finish()?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&summary)?);
        } else if !args.quiet {
            print!(
                "{}",
                opledger_report::profile_text(&imported.manifest, &summary)
            );
            for n in &imported.stats.not_measurable {
                println!("not measured: {n}");
            }
            println!("run folder: {}", path.display());
        }
        return Ok(super::common::exit(opledger_app::outcome::of_checks(
            &summary.checks,
        )));
    }
    let (rules_file, rules_text) = match BUILTIN_IMPORT_RULES
        .iter()
        .find(|(name, _, _)| *name == args.rules)
    {
        Some((_, file, text)) => (format!("built-in {file}"), text.to_string()),
        None => {
            let text = std::fs::read_to_string(&args.rules)
                .with_context(|| format!("reading import rules {}", args.rules))?;
            (args.rules.clone(), text)
        }
    };
    let req = ImportRequest {
        trace: args.trace.clone(),
        rules_file,
        rules_text,
        step: args.step.clone(),
        tokens: args.tokens.unwrap_or(1),
        skip_steps: args.skip_steps,
    };
    // read before creating the folder: a bad trace leaves nothing behind
    let imported = opledger_app::import::run(&req, model.as_ref())?;
    for n in &imported.stats.notes {
        eprintln!("note: {n}");
    }
    let out = opledger_app::import::run_path(args.output.as_deref(), &args.trace);
    let folder = RunFolder::create(&out)?;
    let summary = opledger_app::runs::write_import(&folder, &imported, Some(&req.rules_text))?;
    let path = folder.finish()?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else if !args.quiet {
        let s = &imported.stats;
        print!(
            "{}",
            opledger_report::profile_text(&imported.manifest, &summary)
        );
        println!();
        println!(
            "imported {} ({} events, {} spans on {} threads, {} steps matching /{}/; {} spans outside every step, {} never closed)",
            s.trace, s.events, s.spans, s.threads, s.steps, s.step_pattern, s.outside_steps, s.unclosed
        );
        println!("granularity of {}: {}", s.engine, s.granularity);
        if let Some(c) = &s.concurrency {
            println!(
                "concurrency {:.3} [{:.3}–{:.3}]: the spans' self time over the step's wall (median and range over steps; a thread's wait for another thread's span is that span's time, counted once)",
                c.median, c.min, c.max
            );
        }
        if s.late_spans > 0 {
            println!(
                "{} spans of other threads came after their step was finished: the step thread's time under them is counted too",
                s.late_spans
            );
        }

        for (name, cat, parent, ms) in &s.unassigned {
            println!("unassigned: '{name}' (cat '{cat}', in '{parent}') {ms:.4} ms per step");
        }
        for n in &s.not_measurable {
            println!("not measurable: {n}");
        }
        println!("run folder: {}", path.display());
    }
    // a failed `device coverage` (device activity no rule matched) is among the checks
    Ok(super::common::exit(opledger_app::outcome::of_checks(
        &summary.checks,
    )))
}
