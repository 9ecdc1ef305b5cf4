//! `opledger report`: re-render a stored run of any kind from its raw data, without measuring
//! again: one format to stdout, or several into a new write-once folder. Reading the folder is
//! `opledger_app::runs`, the renderings are pure functions in `opledger_report`; this file
//! decides where the bytes go.

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use opledger_core::run_folder::RunFolder;
use opledger_report::perfetto::TraceTracks;
use opledger_report::render::{available, file_name};
use opledger_report::{render, Format, RenderOptions};

#[derive(Args)]
pub struct ReportArgs {
    /// The run folder (any kind of run).
    run: PathBuf,
    /// Formats, comma-separated. Without -o exactly one, printed on stdout (default: text);
    /// with -o every format the run has unless listed.
    #[arg(long, value_enum, value_delimiter = ',')]
    format: Vec<FormatArg>,
    /// Write the renderings into this new (write-once) folder instead of stdout.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Tracks of the Perfetto trace: one per band or one per layer.
    #[arg(long, value_enum, default_value_t = TracksArg::Band)]
    trace_tracks: TracksArg,
    /// Nodes listed in a waste run's terminal table (0: all).
    #[arg(long, default_value_t = 15)]
    top: usize,
}

#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
enum FormatArg {
    /// The terminal table.
    Text,
    /// llama-bench-style markdown table, then the run's markdown summary.
    Md,
    /// llama-bench-style CSV: a row per test, a column per band's ms/token.
    Csv,
    /// One CSV row per band (profile) or per depth (sweep).
    Bands,
    /// The schema-versioned summary (ab.json for an A/B).
    Json,
    /// Every node with its band, shapes and median time.
    Nodes,
    /// A single-file HTML report.
    Html,
    /// SQL inserts for SQLite.
    Sql,
    /// A Perfetto / Chrome trace of the median TIMED cycle.
    Perfetto,
    /// The run's chart.
    Svg,
    /// opledger's node records (JSON lines), profile runs only.
    Jsonl,
}

impl From<FormatArg> for Format {
    fn from(f: FormatArg) -> Format {
        match f {
            FormatArg::Text => Format::Text,
            FormatArg::Md => Format::Md,
            FormatArg::Csv => Format::Csv,
            FormatArg::Bands => Format::Bands,
            FormatArg::Json => Format::Json,
            FormatArg::Nodes => Format::Nodes,
            FormatArg::Html => Format::Html,
            FormatArg::Sql => Format::Sql,
            FormatArg::Perfetto => Format::Perfetto,
            FormatArg::Svg => Format::Svg,
            FormatArg::Jsonl => Format::Jsonl,
        }
    }
}

#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
enum TracksArg {
    Band,
    Layer,
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let stored = opledger_app::runs::read(&args.run)?;
    let view = opledger_app::runs::view(&stored)
        .with_context(|| format!("re-rendering {}", args.run.display()))?;
    let opts = RenderOptions {
        trace_tracks: match args.trace_tracks {
            TracksArg::Band => TraceTracks::Band,
            TracksArg::Layer => TraceTracks::Layer,
        },
        waste_top: args.top,
    };
    let mut formats: Vec<Format> = Vec::new();
    for f in args.format.iter().map(|&f| Format::from(f)) {
        if !formats.contains(&f) {
            formats.push(f);
        }
    }
    match &args.output {
        None => {
            let format = match formats.as_slice() {
                [] => Format::Text,
                [one] => *one,
                _ => bail!(
                    "{} formats asked for: stdout takes one; write several with -o DIR",
                    formats.len()
                ),
            };
            let bytes = render(&view, format, &opts)?;
            std::io::stdout()
                .write_all(&bytes)
                .context("writing to stdout")?;
        }
        Some(out) => {
            if formats.is_empty() {
                formats = available(&view);
            }
            // refuse a format the run lacks before creating anything
            for &f in &formats {
                if file_name(&view, f).is_none() {
                    render(&view, f, &opts)?;
                }
            }
            let folder = RunFolder::create(out)?;
            opledger_app::runs::write_renderings(&folder, "", &view, &formats, &opts)?;
            folder.finish()?;
        }
    }
    Ok(super::common::exit(opledger_app::runs::outcome(&view)))
}
