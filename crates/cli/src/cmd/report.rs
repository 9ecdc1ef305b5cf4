//! `opledger report`: re-render a stored run (profile, sweep, A/B, waste) from its raw data,
//! without measuring again: one format to stdout, or several into a new write-once folder. The
//! renderings themselves are pure functions in `opledger_report`; this file reads the folder and
//! decides where the bytes go.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::{Args, ValueEnum};
use opledger_core::ab::{AbReport, AB_SCHEMA_VERSION};
use opledger_core::manifest::Manifest;
use opledger_core::node::NodeInfo;
use opledger_core::profile::{CheckStatus, ProfileRaw};
use opledger_core::run_folder::{open_complete, read_json, read_versioned, RunFolder};
use opledger_core::sweep::{load_folder, SweepConfig};
use opledger_core::waste::WASTE_SCHEMA_VERSION;
use opledger_report::perfetto::TraceTracks;
use opledger_report::render::{available, file_name};
use opledger_report::{
    render, AbView, Format, ProfileView, RenderOptions, RunView, SweepView, WasteView,
};

#[derive(Args)]
pub struct ReportArgs {
    /// The run folder (a profile, sweep, ab or waste run).
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
        }
    }
}

#[derive(ValueEnum, Clone, Copy, PartialEq, Eq, Debug)]
enum TracksArg {
    Band,
    Layer,
}

/// What a run folder holds, read from disk; views borrow from it.
enum Stored {
    Profile(Manifest, ProfileRaw),
    Sweep(Manifest, SweepConfig, Vec<NodeInfo>, Option<Vec<NodeInfo>>),
    Ab(Manifest, AbReport),
    Waste(Manifest, ProfileRaw, Option<String>),
}

fn load(dir: &Path) -> Result<Stored> {
    let m = Manifest::read(&dir.join("manifest.json"))?;
    Ok(match m.command.as_str() {
        "profile" => {
            let raw = ProfileRaw::read(&dir.join("raw.json"))?;
            Stored::Profile(m, raw)
        }
        "sweep" => {
            let cfg: SweepConfig = read_json(&dir.join("config.json"))?;
            let graph = read_json(&dir.join("graph.json"))?;
            let decode_graph = if cfg.decode.is_some() {
                Some(read_json(&dir.join("decode_graph.json"))?)
            } else {
                None
            };
            Stored::Sweep(m, cfg, graph, decode_graph)
        }
        "ab" => {
            let mut r: AbReport = read_versioned(&dir.join("ab.json"), AB_SCHEMA_VERSION)?;
            r.upgrade();
            Stored::Ab(m, r)
        }
        "waste" => {
            let raw = ProfileRaw::read(&dir.join("raw.json"))?;
            // where the timings came from is recorded in the summary only
            let summary: serde_json::Value =
                read_versioned(&dir.join("summary.json"), WASTE_SCHEMA_VERSION)?;
            let source = summary
                .get("source_run")
                .and_then(|s| s.as_str())
                .map(String::from);
            Stored::Waste(m, raw, source)
        }
        other => bail!(
            "{}: a '{other}' run; report renders profile, sweep, ab and waste runs",
            dir.display()
        ),
    })
}

pub fn run(args: ReportArgs) -> Result<ExitCode> {
    let dir = open_complete(&args.run)?;
    let stored = load(&dir)?;
    let sweep_data;
    let view = match &stored {
        Stored::Profile(m, raw) => RunView::Profile(
            ProfileView::new(m, raw).with_context(|| format!("summarising {}", dir.display()))?,
        ),
        Stored::Sweep(m, cfg, graph, decode_graph) => {
            sweep_data = load_folder(&dir)?;
            RunView::Sweep(
                SweepView::new(
                    m,
                    cfg,
                    graph,
                    decode_graph.as_deref(),
                    &sweep_data.0,
                    &sweep_data.1,
                )
                .with_context(|| format!("summarising {}", dir.display()))?,
            )
        }
        Stored::Ab(m, r) => RunView::Ab(AbView {
            manifest: m,
            report: r,
        }),
        Stored::Waste(m, raw, source) => RunView::Waste(
            WasteView::new(m, raw, source.clone())
                .with_context(|| format!("analysing {}", dir.display()))?,
        ),
    };
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
            for &f in &formats {
                let name = file_name(&view, f).expect("checked above");
                folder.write(name, &render(&view, f, &opts)?)?;
            }
            folder.finish()?;
        }
    }
    Ok(exit_code(&view))
}

/// 3 when a check failed (as the measuring command would exit), 4 for an A/B refused by the
/// correctness gate, 5 for an inconclusive one, else 0.
fn exit_code(view: &RunView) -> ExitCode {
    let failed: Vec<(String, String)> = match view {
        RunView::Profile(v) => v
            .summary
            .checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| (c.name.clone(), c.detail.clone()))
            .collect(),
        RunView::Sweep(v) => v
            .summary
            .checks
            .iter()
            .filter(|c| c.status == CheckStatus::Fail)
            .map(|c| (c.name.clone(), c.detail.clone()))
            .collect(),
        RunView::Ab(v) => return super::ab::ab_exit_code(v.report),
        RunView::Waste(_) => Vec::new(),
    };
    for (name, detail) in &failed {
        eprintln!("check failed: {name}: {detail}");
    }
    if failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(crate::exit::CHECK_FAILED)
    }
}
