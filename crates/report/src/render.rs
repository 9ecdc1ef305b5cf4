//! The one place that maps (kind of run, format) to a renderer and a file name: every rendering
//! is a pure function of a [`RunView`] returning bytes.

use crate::perfetto::TraceTracks;
use crate::view::RunView;

/// An output format of `opledger report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Format {
    /// The terminal table (`table.txt`).
    Text,
    /// llama-bench-style markdown table, then the run's markdown summary (`summary.md`).
    Md,
    /// llama-bench-style CSV: one row per test, one column per band (`bench.csv`).
    Csv,
    /// The long CSV: one row per band (`bands.csv`) or per depth (`depths.csv`).
    Bands,
    /// The schema-versioned summary (`summary.json`; `ab.json` for an A/B).
    Json,
    /// Every node with its band, shapes and median time (`nodes.csv`).
    Nodes,
    /// A single-file HTML report (`report.html`).
    Html,
    /// SQL for SQLite: `CREATE TABLE IF NOT EXISTS` and one `INSERT` per band and test
    /// (`results.sql`).
    Sql,
    /// A Perfetto / Chrome trace-event JSON of the median TIMED cycle (`trace.json`).
    Perfetto,
    /// The run's chart (`chart.svg`).
    Svg,
    /// opledger's node records, JSON lines (`nodes.jsonl`; README, "Node records").
    Jsonl,
}

impl Format {
    /// The formats a run's every rendering covers (`report -o DIR` without `--format`).
    /// [`Format::Jsonl`] is left out: node records are an export, written when asked for.
    pub const ALL: [Format; 10] = [
        Format::Text,
        Format::Md,
        Format::Csv,
        Format::Bands,
        Format::Json,
        Format::Nodes,
        Format::Html,
        Format::Sql,
        Format::Perfetto,
        Format::Svg,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Format::Text => "text",
            Format::Md => "md",
            Format::Csv => "csv",
            Format::Bands => "bands",
            Format::Json => "json",
            Format::Nodes => "nodes",
            Format::Html => "html",
            Format::Sql => "sql",
            Format::Perfetto => "perfetto",
            Format::Svg => "svg",
            Format::Jsonl => "jsonl",
        }
    }
}

/// Choices that change a rendering.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenderOptions {
    /// One trace track per band or per layer.
    pub trace_tracks: TraceTracks,
    /// Nodes listed in a waste run's terminal table (0: all).
    pub waste_top: usize,
}

impl Default for RenderOptions {
    fn default() -> Self {
        RenderOptions {
            trace_tracks: TraceTracks::Band,
            waste_top: 15,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error(
        "{} {kind} run has no {format} rendering (it has: {available})",
        article(kind)
    )]
    Unsupported {
        kind: &'static str,
        format: &'static str,
        available: String,
    },
    #[error("writing CSV: {0}")]
    Csv(#[from] csv::Error),
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("drawing the chart: {0}")]
    Chart(String),
}

/// "an" before a vowel, else "a".
pub fn article(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "an"
    } else {
        "a"
    }
}

/// The file a format is written to for this kind of run; `None` where the run has no such
/// rendering.
pub fn file_name(view: &RunView, format: Format) -> Option<&'static str> {
    use RunView::*;
    Some(match (format, view) {
        // the kinds whose renderings are their command's tables and JSON only
        (Format::Text, Parallel(_)) => "parallel.txt",
        (Format::Csv, Parallel(_)) => "parallel.csv",
        (Format::Json, Parallel(_)) => "parallel.json",
        (Format::Json, Discover(_)) => "discover.json",
        (Format::Md, Ledger(_)) => "ledger.md",
        (Format::Csv, Ledger(_)) => "ledger.csv",
        (Format::Json, Ledger(_)) => "ledger.json",
        (Format::Json, Ops(_)) => "ops.json",
        (Format::Json, Bisect(_)) => "bisect.json",
        (Format::Text, Discover(_) | Ledger(_) | Ops(_) | Bisect(_)) => "table.txt",
        (Format::Md, Bisect(_)) => "summary.md",
        (Format::Html, Bisect(_)) => "report.html",
        (_, Bisect(_)) => return None,
        (_, Parallel(_) | Discover(_) | Ledger(_) | Ops(_)) => return None,
        (Format::Text, _) => "table.txt",
        (Format::Md, _) => "summary.md",
        (Format::Csv, _) => "bench.csv",
        (Format::Bands, Profile(_)) => "bands.csv",
        (Format::Bands, Sweep(_)) => "depths.csv",
        (Format::Bands, _) => return None,
        (Format::Json, Ab(_)) => "ab.json",
        (Format::Json, _) => "summary.json",
        (Format::Nodes, Profile(_) | Waste(_)) => "nodes.csv",
        (Format::Nodes, _) => return None,
        (Format::Html, _) => "report.html",
        (Format::Sql, _) => "results.sql",
        (Format::Perfetto, Profile(_) | Waste(_)) => "trace.json",
        (Format::Perfetto, _) => return None,
        (Format::Jsonl, Profile(_)) => "nodes.jsonl",
        (Format::Jsonl, _) => return None,
        (Format::Svg, _) => "chart.svg",
    })
}

/// The formats this kind of run has, in [`Format::ALL`] order.
pub fn available(view: &RunView) -> Vec<Format> {
    Format::ALL
        .into_iter()
        .filter(|f| file_name(view, *f).is_some())
        .collect()
}

fn pretty_json<T: serde::Serialize>(value: &T) -> Result<Vec<u8>, RenderError> {
    let mut bytes = serde_json::to_vec_pretty(value)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// Renders `view` in `format`.
pub fn render(
    view: &RunView,
    format: Format,
    opts: &RenderOptions,
) -> Result<Vec<u8>, RenderError> {
    if file_name(view, format).is_none() {
        let available: Vec<&str> = available(view).iter().map(|f| f.name()).collect();
        return Err(RenderError::Unsupported {
            kind: view.kind(),
            format: format.name(),
            available: available.join(", "),
        });
    }
    let rows = crate::bench::rows(view);
    let bytes = match (format, view) {
        (Format::Text, RunView::Parallel(v)) => {
            crate::profile::parallel_text(&v.summaries()).into_bytes()
        }
        (Format::Csv, RunView::Parallel(v)) => {
            crate::profile::parallel_csv(&v.summaries())?.into_bytes()
        }
        (Format::Json, RunView::Parallel(v)) => pretty_json(&v.summaries())?,
        (Format::Text, RunView::Discover(v)) => crate::ab::discover_text(v.report).into_bytes(),
        (Format::Json, RunView::Discover(v)) => pretty_json(v.report)?,
        (Format::Text, RunView::Ledger(v)) => crate::ledger::ledger_text(v.report).into_bytes(),
        (Format::Md, RunView::Ledger(v)) => crate::ledger::ledger_markdown(v.report).into_bytes(),
        (Format::Csv, RunView::Ledger(v)) => crate::ledger::ledger_csv(v.report)?.into_bytes(),
        (Format::Json, RunView::Ledger(v)) => pretty_json(v.report)?,
        (Format::Text, RunView::Ops(v)) => {
            crate::ops::ops_text(&crate::ops::ops_title(v.manifest), v.summary).into_bytes()
        }
        (Format::Json, RunView::Ops(v)) => pretty_json(v.summary)?,
        (Format::Text, RunView::Bisect(v)) => crate::bisect::bisect_text(v.report).into_bytes(),
        (Format::Md, RunView::Bisect(v)) => crate::bisect::bisect_markdown(v.report).into_bytes(),
        (Format::Json, RunView::Bisect(v)) => pretty_json(v.report)?,
        (Format::Jsonl, RunView::Profile(v)) => {
            let records = opledger_core::records::profile_to_records(
                &v.manifest.engine.engine,
                &v.manifest.model.arch,
                &v.manifest.band_rules,
                v.raw,
            );
            opledger_core::records::to_jsonl(&records)?
        }
        (Format::Text, RunView::Profile(v)) => {
            crate::profile::profile_text(v.manifest, &v.summary).into_bytes()
        }
        (Format::Text, RunView::Sweep(v)) => {
            crate::sweep::sweep_text(v.manifest, &v.summary).into_bytes()
        }
        (Format::Text, RunView::Ab(v)) => crate::ab::ab_text(v.report).into_bytes(),
        (Format::Text, RunView::Waste(v)) => {
            crate::waste::waste_text(v.manifest, &v.summary, opts.waste_top).into_bytes()
        }
        // an A/B: compare-llama-bench's table of the two sides, not a row per side
        (Format::Md, RunView::Ab(v)) => {
            crate::ab::ab_markdown(v.manifest.model_label(), v.report).into_bytes()
        }
        (Format::Md, _) => {
            let mut md = crate::bench::bench_markdown(&rows);
            md.push('\n');
            md.push_str(&match view {
                RunView::Profile(v) => crate::profile::profile_markdown(v.manifest, &v.summary),
                RunView::Sweep(v) => crate::sweep::sweep_markdown(v.manifest, &v.summary),
                RunView::Waste(v) => crate::waste::waste_markdown(v.manifest, &v.summary),
                _ => unreachable!("file_name() refused their markdown"),
            });
            md.into_bytes()
        }
        (Format::Csv, _) => crate::bench::bench_csv(&rows)?.into_bytes(),
        (Format::Bands, RunView::Profile(v)) => crate::profile::bands_csv(&v.summary)?.into_bytes(),
        (Format::Bands, RunView::Sweep(v)) => crate::sweep::sweep_csv(&v.summary)?.into_bytes(),
        (Format::Json, RunView::Profile(v)) => pretty_json(&v.summary)?,
        (Format::Json, RunView::Sweep(v)) => pretty_json(&v.summary)?,
        (Format::Json, RunView::Ab(v)) => pretty_json(v.report)?,
        (Format::Json, RunView::Waste(v)) => pretty_json(&v.summary)?,
        (Format::Nodes, RunView::Profile(v)) => crate::nodes::nodes_csv(
            &v.raw.graph,
            &v.assignments,
            &opledger_core::profile::node_medians_us(v.raw),
        )?
        .into_bytes(),
        (Format::Nodes, RunView::Waste(v)) => crate::waste::waste_nodes_csv(
            &v.raw.graph,
            &v.assignments,
            &v.needs,
            &opledger_core::profile::node_medians_us(v.raw),
        )?
        .into_bytes(),
        (Format::Html, _) => crate::html::html(view)
            .map_err(RenderError::Chart)?
            .into_bytes(),
        (Format::Sql, _) => {
            let (device, clock) = match view {
                RunView::Profile(v) => (v.summary.device.as_ref(), v.summary.device_clock.as_ref()),
                _ => (None, None),
            };
            crate::sql::sql(view.manifest(), &rows, device, clock).into_bytes()
        }
        (Format::Perfetto, RunView::Profile(v)) => {
            crate::perfetto::trace_json(v.manifest, v.raw, &v.assignments, opts.trace_tracks)?
        }
        (Format::Perfetto, RunView::Waste(v)) => {
            crate::perfetto::trace_json(v.manifest, v.raw, &v.assignments, opts.trace_tracks)?
        }
        (Format::Svg, _) => crate::html::chart_svg(view)
            .map_err(RenderError::Chart)?
            .into_bytes(),
        _ => unreachable!("file_name() refused the combinations without a renderer"),
    };
    Ok(bytes)
}
