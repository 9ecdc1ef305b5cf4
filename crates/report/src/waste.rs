//! Renderers of a waste analysis: the terminal table, markdown and the per-node CSV of needed
//! rows.

use std::fmt::Write as _;

use opledger_core::band::Assignment;
use opledger_core::manifest::Manifest;
use opledger_core::node::NodeInfo;
use opledger_core::profile::{Check, CheckStatus, ProfileRaw};
use opledger_core::waste::{Kept, NodeNeed, WasteSummary};

use crate::table::{markdown_table, text_table, Align};

pub(crate) const BAND_HEADER: [&str; 6] = [
    "band",
    "ms/token",
    "wasted ms/token",
    "of band",
    "of total",
    "nodes",
];
pub(crate) const LAYER_HEADER: [&str; 6] = [
    "layer",
    "ms/token",
    "wasted ms/token",
    "of layer",
    "of total",
    "nodes",
];
pub(crate) const NODE_HEADER: [&str; 8] = [
    "#",
    "op",
    "name",
    "layer",
    "band",
    "rows read",
    "wasted ms/token",
    "of total",
];
const NUM6: [Align; 6] = [
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
];
const NODE_ALIGN: [Align; 8] = [
    Align::Right,
    Align::Left,
    Align::Left,
    Align::Right,
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
];

fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

pub(crate) fn band_rows(s: &WasteSummary) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = s
        .bands
        .iter()
        .map(|b| {
            vec![
                b.band.clone(),
                format!("{:.4}", b.ms_per_token),
                format!("{:.4}", b.wasted_ms_per_token),
                pct(b.wasted_share_of_band),
                pct(b.wasted_share),
                b.nodes.to_string(),
            ]
        })
        .collect();
    rows.push(vec![
        "total".into(),
        format!("{:.4}", s.ms_per_token),
        format!("{:.4}", s.wasted_ms_per_token),
        String::new(),
        pct(s.wasted_share),
        s.nodes.len().to_string(),
    ]);
    rows
}

fn layer_label(layer: Option<u32>) -> String {
    layer.map_or_else(|| "outside layers".into(), |l| l.to_string())
}

pub(crate) fn layer_rows(s: &WasteSummary) -> Vec<Vec<String>> {
    s.layers
        .iter()
        .map(|l| {
            vec![
                layer_label(l.layer),
                format!("{:.4}", l.ms_per_token),
                format!("{:.4}", l.wasted_ms_per_token),
                pct(l.wasted_share_of_layer),
                pct(l.wasted_share),
                l.nodes.to_string(),
            ]
        })
        .collect()
}

pub(crate) fn node_rows(s: &WasteSummary, top: usize) -> Vec<Vec<String>> {
    s.nodes
        .iter()
        .take(if top == 0 { usize::MAX } else { top })
        .map(|n| {
            vec![
                n.index.to_string(),
                n.op.clone(),
                n.name.clone(),
                n.layer.map(|l| l.to_string()).unwrap_or_default(),
                n.band.clone(),
                format!("{}/{}", n.needed_rows, n.rows),
                format!("{:.4}", n.wasted_ms_per_token),
                pct(if s.wasted_timed_ms > 0.0 {
                    n.wasted_us / 1e3 / s.timed_sum_ms
                } else {
                    0.0
                }),
            ]
        })
        .collect()
}

pub(crate) fn heading(m: &Manifest, s: &WasteSummary) -> (String, String) {
    let title = format!(
        "{} · {} · {} {} · {} · {} threads",
        m.model_label(),
        m.model.arch.arch,
        m.engine.engine,
        m.engine.version,
        m.engine.backend,
        m.engine.threads
    );
    let mut work = format!(
        "chunk of {} tokens at depth {}, logits: {} · {} cycles, medians",
        s.tokens, s.depth_tokens, s.logits, s.cycles
    );
    if let Some(run) = &s.source_run {
        let _ = write!(work, " · timings from {run}");
    }
    (title, work)
}

/// The one-line answer: how much of the chunk goes to rows nobody reads.
pub fn headline(s: &WasteSummary) -> String {
    format!(
        "up to {:.4} ms/token ({:.2} %) is spent on rows nobody reads \
         [{:.4}–{:.4} over cycles]; without them: up to {:+.2} % tok/s",
        s.wasted_ms_per_token,
        s.wasted_share * 100.0,
        s.wasted_ms_per_token_min,
        s.wasted_ms_per_token_max,
        s.gain_if_trimmed * 100.0
    )
}

pub(crate) fn notes(s: &WasteSummary) -> Vec<String> {
    let mut out = vec![format!(
        "kept: {} logits node(s) holding {} row(s), {} cache write(s){}",
        s.kept.logits_nodes,
        s.kept.logits_rows,
        s.kept.cache_writes,
        if s.kept.other_sinks.is_empty() {
            String::new()
        } else {
            format!(
                ", {} other sink(s) kept whole to be safe: {}",
                s.kept.other_sinks.len(),
                s.kept.other_sinks.join(", ")
            )
        }
    )];
    if !s.unknown_ops.is_empty() {
        let ops: Vec<String> = s
            .unknown_ops
            .iter()
            .map(|o| format!("{} ({}×, {:.3} ms)", o.op, o.nodes, o.timed_ms))
            .collect();
        out.push(format!(
            "ops with no rule, treated as needing every row: {}",
            ops.join(", ")
        ));
    }
    out.push(format!(
        "FUSED wall {:.2} ms for {} tokens ({:.4} ms/token); TIMED sum {:.2} ms, of which {:.2} ms \
         on rows nobody reads (an upper bound: a matmul trimmed to fewer rows still reads its \
         whole weight)",
        s.fused_ms, s.tokens, s.ms_per_token, s.timed_sum_ms, s.wasted_timed_ms
    ));
    out.push(format!(
        "from each node's fastest cycle: {:.2} % on rows nobody reads (medians: {:.2} %)",
        s.wasted_share_of_minimums * 100.0,
        s.wasted_share * 100.0
    ));
    out
}

/// The terminal rendering; `top` nodes listed (0: all).
pub fn waste_text(m: &Manifest, s: &WasteSummary, top: usize) -> String {
    let (title, work) = heading(m, s);
    let mut out = String::new();
    let _ = writeln!(out, "{title}\n{work}\n");
    let _ = writeln!(out, "{}\n", headline(s));
    let _ = writeln!(out, "{}\n", text_table(&BAND_HEADER, &NUM6, &band_rows(s)));
    if !s.layers.is_empty() {
        let _ = writeln!(
            out,
            "{}\n",
            text_table(&LAYER_HEADER, &NUM6, &layer_rows(s))
        );
        let _ = writeln!(
            out,
            "{}\n",
            text_table(&NODE_HEADER, &NODE_ALIGN, &node_rows(s, top))
        );
        if top != 0 && s.nodes.len() > top {
            let _ = writeln!(
                out,
                "({} more nodes with waste in nodes.csv)",
                s.nodes.len() - top
            );
        }
    }
    for line in notes(s) {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The markdown rendering (a section of a report); every node with waste listed.
pub fn waste_markdown(m: &Manifest, s: &WasteSummary) -> String {
    let (title, work) = heading(m, s);
    let mut out = String::new();
    let _ = writeln!(out, "## Rows nobody reads: {title}\n\n{work}\n");
    let _ = writeln!(out, "**{}**\n", headline(s));
    let _ = writeln!(
        out,
        "{}\n",
        markdown_table(&BAND_HEADER, &NUM6, &band_rows(s))
    );
    if !s.layers.is_empty() {
        let _ = writeln!(
            out,
            "{}\n",
            markdown_table(&LAYER_HEADER, &NUM6, &layer_rows(s))
        );
        let _ = writeln!(
            out,
            "{}\n",
            markdown_table(&NODE_HEADER, &NODE_ALIGN, &node_rows(s, 0))
        );
    }
    for line in notes(s) {
        let _ = writeln!(out, "- {line}");
    }
    out
}

/// One row per node: its token dimension, rows, rows read, treatment, time and waste.
pub fn waste_nodes_csv(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    needs: &[NodeNeed],
    median_us: &[f64],
) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "index",
        "op",
        "name",
        "layer",
        "band",
        "shape",
        "token_dim",
        "rows",
        "needed_rows",
        "last_needed_row",
        "treatment",
        "kept",
        "median_us",
        "wasted_us",
    ])?;
    for (i, n) in graph.iter().enumerate() {
        let d = needs.get(i);
        let median = median_us.get(i).copied();
        let wasted = match (d, median) {
            (Some(d), Some(t)) => Some(t * (1.0 - d.needed_fraction())),
            _ => None,
        };
        w.write_record([
            n.index.to_string(),
            n.op.clone(),
            n.name.clone(),
            n.layer.map(|l| l.to_string()).unwrap_or_default(),
            assignments
                .get(i)
                .map(|a| a.band.clone())
                .unwrap_or_default(),
            n.out.shape_string(),
            d.and_then(|d| d.token_dim)
                .map(|t| t.to_string())
                .unwrap_or_default(),
            d.map(|d| d.rows.to_string()).unwrap_or_default(),
            d.map(|d| d.needed.to_string()).unwrap_or_default(),
            d.and_then(|d| d.last_needed)
                .map(|r| r.to_string())
                .unwrap_or_default(),
            d.map(|d| d.treatment.as_str().to_string())
                .unwrap_or_default(),
            match d.and_then(|d| d.kept) {
                Some(Kept::Logits) => "logits",
                Some(Kept::CacheWrite) => "cache_write",
                Some(Kept::OtherSink) => "other_sink",
                None => "",
            }
            .to_string(),
            median.map(|v| format!("{v:.3}")).unwrap_or_default(),
            wasted.map(|v| format!("{v:.3}")).unwrap_or_default(),
        ])?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// The checks of a waste page: the timings' own cross-checks (from the same raw data), then
/// ops without a row rule and sinks kept whole.
pub fn checks(m: &Manifest, raw: &ProfileRaw, s: &WasteSummary) -> Vec<Check> {
    // the timings' own cross-checks, from the same raw data
    let mut checks = match opledger_core::profile::analyse(raw, &m.band_rules, &m.model.arch) {
        Ok((_, p)) => p.checks,
        Err(e) => vec![Check {
            name: "timings".into(),
            status: CheckStatus::Fail,
            detail: e.to_string(),
        }],
    };
    checks.push(Check {
        name: "ops without a rule".into(),
        status: if s.unknown_ops.is_empty() {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: if s.unknown_ops.is_empty() {
            "every op of the graph has a row rule".into()
        } else {
            format!(
                "{} op(s) treated as needing every row (waste never claimed for them)",
                s.unknown_ops.len()
            )
        },
    });
    checks.push(Check {
        name: "sinks".into(),
        status: if s.kept.other_sinks.is_empty() {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: if s.kept.other_sinks.is_empty() {
            "every output is the logits or a cache write".into()
        } else {
            format!(
                "{} other sink(s) kept whole to be safe: {}",
                s.kept.other_sinks.len(),
                s.kept.other_sinks.join(", ")
            )
        },
    });
    checks
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_core::node::TensorDesc;
    use opledger_core::waste::{KeptCounts, Treatment};

    fn summary() -> WasteSummary {
        WasteSummary {
            schema_version: 1,
            tokens: 512,
            depth_tokens: 0,
            logits: "last".into(),
            cycles: 3,
            fused_ms: 512.0,
            ms_per_token: 1.0,
            timed_sum_ms: 500.0,
            wasted_timed_ms: 50.0,
            wasted_share: 0.1,
            wasted_ms_per_token: 0.1,
            wasted_ms_per_token_min: 0.09,
            wasted_ms_per_token_max: 0.11,
            wasted_share_of_minimums: 0.1,
            gain_if_trimmed: 1.0 / 0.9 - 1.0,
            kept: KeptCounts {
                logits_nodes: 1,
                logits_rows: 1,
                cache_writes: 2,
                other_sinks: vec![],
            },
            bands: vec![],
            layers: vec![],
            nodes: vec![],
            unknown_ops: vec![],
            source_run: None,
        }
    }

    #[test]
    fn headline_says_how_much_goes_to_unread_rows() {
        assert_eq!(
            headline(&summary()),
            "up to 0.1000 ms/token (10.00 %) is spent on rows nobody reads \
             [0.0900–0.1100 over cycles]; without them: up to +11.11 % tok/s"
        );
    }

    #[test]
    fn nodes_csv_has_needed_rows_and_waste() {
        let t = |name: &str| TensorDesc {
            name: name.into(),
            ne: [16, 8, 1, 1],
            ggml_type: "F32".into(),
            size_bytes: 512,
            is_weight: false,
            producer: None,
            nb: [0; 4],
        };
        let graph = vec![NodeInfo {
            index: 0,
            op: "MUL_MAT".into(),
            name: "ffn_up-0".into(),
            layer: Some(0),
            out: t("ffn_up-0"),
            srcs: vec![Some(t("x"))],
            is_view: false,
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        }];
        let needs = vec![NodeNeed {
            token_dim: Some(1),
            rows: 8,
            needed: 2,
            last_needed: Some(7),
            treatment: Treatment::MatMul,
            kept: None,
        }];
        let a = vec![Assignment {
            band: "moe".into(),
            reason: opledger_core::band::Reason::None,
        }];
        let csv = waste_nodes_csv(&graph, &a, &needs, &[40.0]).unwrap();
        let mut lines = csv.lines();
        assert!(lines
            .next()
            .unwrap()
            .starts_with("index,op,name,layer,band,shape,token_dim"));
        assert_eq!(
            lines.next().unwrap(),
            "0,MUL_MAT,ffn_up-0,0,moe,\"[16,8]\",1,8,2,7,mat_mul,,40.000,30.000"
        );
    }
}
