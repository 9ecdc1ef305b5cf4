//! llama-bench-style results: one row per test (`pp512`, `pp512 @ d4096`, `tg32`) with the
//! model, its size and parameters, backend, threads and throughput, extended with one column per
//! band's ms/token; as a markdown table and as CSV. The SQL export reads the same rows.

use std::collections::BTreeSet;

use opledger_core::manifest::Manifest;
use opledger_core::node::NodeInfo;

use crate::table::{markdown_table, Align};
use crate::view::RunView;

/// One test of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRow {
    /// The model file's name.
    pub model: String,
    /// The model file's size (`None` where no model file was recorded: an import without
    /// `--model`).
    pub size_bytes: Option<u64>,
    /// Parameters of the weights the graph reads (`None` where the run stores no graph, or a
    /// graph of spans that carry no weights: an imported trace).
    pub params: Option<u64>,
    pub backend: String,
    pub threads: u32,
    /// The configuration of an A/B side (`A: defaults`); empty for single-configuration runs.
    pub config: String,
    /// `pp512`, `pp512 @ d4096`, `tg32`, `tg32 x4 @ d4096`.
    pub test: String,
    /// Tokens one run processes and the context depth it starts at.
    pub tokens: u32,
    pub depth_tokens: u32,
    /// Tokens per second of the FUSED (native speed) wall, median over cycles.
    pub tok_per_s: f64,
    /// (band, ms/token), in the rule set's order.
    pub bands: Vec<(String, f64)>,
}

/// llama-bench's test name: `pp<chunk>` for a prefill, `tg<tokens>` for a decode (with `x<P>`
/// for P parallel sequences), then ` @ d<depth>` when the context is not empty.
pub fn test_name(
    chunk_tokens: u32,
    depth_tokens: u32,
    decode_tokens: u32,
    parallel: u32,
) -> String {
    let mut t = if decode_tokens > 0 {
        let mut t = format!("tg{decode_tokens}");
        if parallel > 1 {
            t.push_str(&format!(" x{parallel}"));
        }
        t
    } else {
        format!("pp{chunk_tokens}")
    };
    if depth_tokens > 0 {
        t.push_str(&format!(" @ d{depth_tokens}"));
    }
    t
}

/// Parameters of the distinct weights a graph reads (every element of every weight tensor).
pub fn graph_params(graph: &[NodeInfo]) -> u64 {
    let mut seen = BTreeSet::new();
    let mut total = 0u64;
    for t in graph.iter().flat_map(|n| n.srcs.iter().flatten()) {
        if t.is_weight && seen.insert(t.name.as_str()) {
            total += t.ne.iter().map(|&d| d.max(1) as u64).product::<u64>();
        }
    }
    total
}

struct Common {
    model: String,
    size_bytes: Option<u64>,
    backend: String,
    threads: u32,
}

fn common(m: &Manifest) -> Common {
    Common {
        model: m.model_label().to_string(),
        size_bytes: crate::view::model_recorded(m).then_some(m.model.size_bytes),
        backend: m.engine.backend.clone(),
        threads: m.engine.threads,
    }
}

/// The rows of a stored run: one for a profile or a waste analysis, one per depth for a sweep,
/// two per scenario (A, B) for an A/B.
pub fn rows(view: &RunView) -> Vec<BenchRow> {
    let c = common(view.manifest());
    let row = |config: String,
               params: Option<u64>,
               test: String,
               tokens: u32,
               depth: u32,
               tok_per_s: f64,
               threads: u32,
               bands: Vec<(String, f64)>| BenchRow {
        model: c.model.clone(),
        size_bytes: c.size_bytes,
        params,
        backend: c.backend.clone(),
        threads,
        config,
        test,
        tokens,
        depth_tokens: depth,
        tok_per_s,
        bands,
    };
    match view {
        RunView::Profile(v) => {
            let s = &v.summary;
            let w = &v.raw.config.work;
            vec![row(
                String::new(),
                // the spans of an imported trace carry no weights: unknown, not 0
                Some(graph_params(&v.raw.graph))
                    .filter(|&p| p > 0 || v.manifest.command != crate::view::IMPORTED),
                test_name(w.chunk_tokens, w.depth_tokens, w.decode_tokens, w.parallel),
                s.tokens,
                s.depth_tokens,
                s.tok_per_s,
                c.threads,
                s.bands
                    .iter()
                    .map(|b| (b.band.clone(), b.ms_per_token))
                    .collect(),
            )]
        }
        RunView::Sweep(v) => {
            let s = &v.summary;
            let params = Some(graph_params(v.graph));
            // prefill chunks (`pp512 @ d4096`), then the decode steps after them
            // (`tg16 x4 @ d4608`: the depth is the context of the first step)
            let mut phases = vec![s.prefill()];
            phases.extend(s.decode.clone());
            phases
                .iter()
                .flat_map(|p| {
                    p.depths.iter().map(move |d| {
                        row(
                            String::new(),
                            params,
                            // a split sweep's prefill shares are raw (RPC round trips in them)
                            test_name(s.tokens, d.depth, p.steps, p.parallel)
                                + if p.raw_split { " (raw)" } else { "" },
                            p.tokens,
                            d.depth,
                            d.tok_per_s,
                            c.threads,
                            p.bands
                                .iter()
                                .cloned()
                                .zip(d.ms_per_token.clone())
                                .collect(),
                        )
                    })
                })
                .collect()
        }
        RunView::Ab(v) => {
            let r = v.report;
            let order: Vec<&str> = v.manifest.band_rules.band_names();
            let mut out = Vec::new();
            for s in &r.scenarios {
                let w = &s.work;
                let test = test_name(w.chunk_tokens, w.depth_tokens, w.decode_tokens, w.parallel);
                let tokens = w.tokens_per_run();
                for (side, knobs, ms) in [("A", &r.a, &s.a_ms), ("B", &r.b, &s.b_ms)] {
                    let median = opledger_core::stats::median(ms).unwrap_or(f64::NAN);
                    let mut bands: Vec<(String, f64)> = s
                        .ledger
                        .iter()
                        .map(|l| {
                            (
                                l.band.clone(),
                                if side == "A" {
                                    l.a_ms_per_token
                                } else {
                                    l.b_ms_per_token
                                },
                            )
                        })
                        .collect();
                    // the ledger is sorted by gap; tables keep the rule set's order
                    bands.sort_by_key(|(b, _)| {
                        order.iter().position(|o| o == b).unwrap_or(order.len())
                    });
                    let threads = knobs
                        .get("threads")
                        .and_then(|t| t.parse().ok())
                        .unwrap_or(c.threads);
                    out.push(row(
                        format!("{side}: {knobs}"),
                        None,
                        test.clone(),
                        tokens,
                        w.depth_tokens,
                        tokens as f64 / median * 1e3,
                        threads,
                        bands,
                    ));
                }
            }
            out
        }
        RunView::Waste(v) => {
            let s = &v.summary;
            let w = &v.raw.config.work;
            vec![row(
                String::new(),
                Some(graph_params(&v.raw.graph)),
                test_name(w.chunk_tokens, w.depth_tokens, w.decode_tokens, w.parallel),
                s.tokens,
                s.depth_tokens,
                s.tokens as f64 / s.fused_ms * 1e3,
                c.threads,
                s.bands
                    .iter()
                    .map(|b| (b.band.clone(), b.ms_per_token))
                    .collect(),
            )]
        }
        // their commands write their own tables, not llama-bench rows
        RunView::Parallel(_)
        | RunView::Discover(_)
        | RunView::Ledger(_)
        | RunView::Ops(_)
        | RunView::Bisect(_) => Vec::new(),
    }
}

/// llama-bench's size column: `16.88 GiB`, `45.31 MiB`.
pub fn size_label(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let b = bytes as f64;
    if b >= 1024.0 * MIB {
        format!("{:.2} GiB", b / (1024.0 * MIB))
    } else {
        format!("{:.2} MiB", b / MIB)
    }
}

/// llama-bench's params column: `30.53 B`, `494.03 M`, `12.29 K`.
pub fn params_label(params: Option<u64>) -> String {
    match params {
        None => "-".into(),
        Some(p) if p >= 1_000_000_000 => format!("{:.2} B", p as f64 / 1e9),
        Some(p) if p >= 1_000_000 => format!("{:.2} M", p as f64 / 1e6),
        Some(p) => format!("{:.2} K", p as f64 / 1e3),
    }
}

/// The band columns of a set of rows: every band any row names, in first-seen order.
fn band_columns(rows: &[BenchRow]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for (b, _) in rows.iter().flat_map(|r| &r.bands) {
        if !out.contains(b) {
            out.push(b.clone());
        }
    }
    out
}

fn band_value(r: &BenchRow, band: &str) -> Option<f64> {
    r.bands.iter().find(|(b, _)| b == band).map(|(_, v)| *v)
}

/// The markdown table: `| model | size | params | backend | threads | test | t/s |` and a
/// column per band.
pub fn bench_markdown(rows: &[BenchRow]) -> String {
    let bands = band_columns(rows);
    let with_config = rows.iter().any(|r| !r.config.is_empty());
    let mut header: Vec<String> = ["model", "size", "params", "backend", "threads"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    if with_config {
        header.push("config".into());
    }
    header.extend(["test".to_string(), "t/s".to_string()]);
    header.extend(bands.iter().map(|b| format!("{b} ms/token")));
    let mut align = vec![
        Align::Left,
        Align::Right,
        Align::Right,
        Align::Left,
        Align::Right,
    ];
    if with_config {
        align.push(Align::Left);
    }
    align.push(Align::Right);
    align.extend(std::iter::repeat_n(Align::Right, 1 + bands.len()));
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut v = vec![
                r.model.clone(),
                r.size_bytes
                    .map(size_label)
                    .unwrap_or_else(|| crate::view::NOT_RECORDED.into()),
                params_label(r.params),
                r.backend.clone(),
                r.threads.to_string(),
            ];
            if with_config {
                v.push(r.config.clone());
            }
            v.push(r.test.clone());
            v.push(format!("{:.2}", r.tok_per_s));
            v.extend(bands.iter().map(|b| {
                band_value(r, b)
                    .map(|x| format!("{x:.4}"))
                    .unwrap_or_default()
            }));
            v
        })
        .collect();
    let header_refs: Vec<&str> = header.iter().map(String::as_str).collect();
    let mut out = markdown_table(&header_refs, &align, &body);
    out.push('\n');
    out
}

/// The CSV: full-precision numbers, one column per band (`<band>_ms_per_token`).
pub fn bench_csv(rows: &[BenchRow]) -> Result<String, csv::Error> {
    let bands = band_columns(rows);
    let mut w = csv::Writer::from_writer(Vec::new());
    let mut header: Vec<String> = [
        "model",
        "size_bytes",
        "params",
        "backend",
        "threads",
        "config",
        "test",
        "n_tokens",
        "n_depth",
        "t_per_s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    header.extend(bands.iter().map(|b| format!("{b}_ms_per_token")));
    w.write_record(&header)?;
    for r in rows {
        let mut v = vec![
            r.model.clone(),
            r.size_bytes.map(|b| b.to_string()).unwrap_or_default(),
            r.params.map(|p| p.to_string()).unwrap_or_default(),
            r.backend.clone(),
            r.threads.to_string(),
            r.config.clone(),
            r.test.clone(),
            r.tokens.to_string(),
            r.depth_tokens.to_string(),
            format!("{:.6}", r.tok_per_s),
        ];
        v.extend(bands.iter().map(|b| {
            band_value(r, b)
                .map(|x| format!("{x:.6}"))
                .unwrap_or_default()
        }));
        w.write_record(&v)?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_names_follow_llama_bench() {
        assert_eq!(test_name(512, 0, 0, 1), "pp512");
        assert_eq!(test_name(512, 4096, 0, 1), "pp512 @ d4096");
        assert_eq!(test_name(512, 0, 32, 1), "tg32");
        assert_eq!(test_name(512, 1024, 32, 4), "tg32 x4 @ d1024");
    }

    #[test]
    fn sizes_and_params_read_like_llama_bench() {
        assert_eq!(size_label(18_125_000_000), "16.88 GiB");
        assert_eq!(size_label(47_510_000), "45.31 MiB");
        assert_eq!(params_label(Some(30_532_000_000)), "30.53 B");
        assert_eq!(params_label(Some(494_030_000)), "494.03 M");
        assert_eq!(params_label(None), "-");
    }
}
