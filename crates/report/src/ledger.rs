//! Renderers of a ledger (two engines, builds or configurations side by side by band): a terminal
//! table, markdown and CSV. The largest gap comes first, then the method's validations.

use std::fmt::Write as _;

use opledger_core::ledger::{LedgerReport, Row};
use opledger_core::replay::ReplayResult;

use crate::table::{markdown_cell, markdown_table, text_table, Align};

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

const HEADER: [&str; 12] = [
    "band (ms/token)",
    "A",
    "B",
    "gap A-B",
    "ahead",
    "A replay",
    "B replay",
    "bytes A/B",
    "time A/B",
    "A GB/s",
    "B GB/s",
    "verdict",
];

fn cells(row: &Row) -> Vec<String> {
    vec![
        row.band.clone(),
        format!("{:.4}", row.a_ms_per_token),
        format!("{:.4}", row.b_ms_per_token),
        format!("{:+.4}", row.gap_ms_per_token),
        row.ahead.clone(),
        opt(row.a_replay_ms_per_token, 4),
        opt(row.b_replay_ms_per_token, 4),
        opt(row.bytes_ratio, 2),
        opt(row.time_ratio, 2),
        opt(row.a_gb_per_s, 1),
        opt(row.b_gb_per_s, 1),
        row.verdict.clone(),
    ]
}

fn rows(r: &LedgerReport) -> Vec<Vec<String>> {
    let l = &r.ledger;
    let mut rows: Vec<Vec<String>> = l.rows.iter().map(cells).collect();
    let mut total = vec![
        "total".to_string(),
        format!("{:.4}", l.total_a_ms_per_token),
        format!("{:.4}", l.total_b_ms_per_token),
        format!("{:+.4}", l.total_a_ms_per_token - l.total_b_ms_per_token),
    ];
    total.resize(HEADER.len(), String::new());
    rows.push(total);
    rows
}

const ALIGN: [Align; 12] = [
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Left,
];

fn heading(r: &LedgerReport) -> String {
    let l = &r.ledger;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "A (being optimised): {}\nB (reference):       {}",
        l.a.label, l.b.label
    );
    let _ = writeln!(
        out,
        "work: {} tokens at depth {} · FUSED wall A {:.1} ms, B {:.1} ms (A/B {:.3})",
        l.a.tokens,
        l.a.depth_tokens,
        l.a.fused_ms,
        l.b.fused_ms,
        if l.b.fused_ms > 0.0 {
            l.a.fused_ms / l.b.fused_ms
        } else {
            f64::NAN
        }
    );
    let _ = writeln!(
        out,
        "coverage A {:.1} %, B {:.1} % · agreement A {:+.1} %, B {:+.1} %{}",
        l.a.coverage * 100.0,
        l.b.coverage * 100.0,
        l.a.agreement * 100.0,
        l.b.agreement * 100.0,
        if l.forced {
            " · FORCED: the runs did different work"
        } else {
            ""
        }
    );
    out
}

fn validations(name: &str, rr: &ReplayResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replay {name}: baseline {:.1} ms (spread {:.1} ms over {} cycles), outputs {}",
        rr.baseline_ms,
        rr.baseline_spread_ms,
        rr.cycles,
        if rr.outputs_identical {
            "bit-identical in every replay"
        } else {
            "CHANGED by a replay"
        }
    );
    let _ = writeln!(
        out,
        "  1. replay all bands once / baseline: {:.3} (expect ~1)",
        rr.replay_all_over_baseline
    );
    let _ = writeln!(
        out,
        "  2. sum of band increments / replay-all increment: {:.3} (expect ~1)",
        rr.sum_over_replay_all
    );
    let _ = writeln!(
        out,
        "  3. {} replayed k = {}: {} per replay; line through the increments: {:.2} ms per replay, R² {:.4}",
        rr.scaling_band,
        rr.scaling_ms_per_replay
            .iter()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
            .join(", "),
        rr.scaling_ms_per_replay
            .iter()
            .map(|(_, ms)| format!("{ms:.2} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        rr.scaling_slope_ms,
        rr.scaling_r2
    );
    let _ = writeln!(
        out,
        "  k per band: {}",
        rr.bands
            .iter()
            .map(|b| format!(
                "{} {}{}",
                b.band,
                b.k,
                if b.stands_out { "" } else { " (within noise)" }
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let _ = writeln!(
        out,
        "  not replayed (write in place): {} nodes, {:.2} % of TIMED node time",
        rr.excluded_inplace.len(),
        rr.excluded_share * 100.0
    );
    out
}

fn tail(r: &LedgerReport) -> String {
    let l = &r.ledger;
    let mut out = String::new();
    let flops: Vec<String> = l
        .rows
        .iter()
        .filter(|row| {
            row.a_gflop_per_s.unwrap_or(0.0) > 0.0 || row.b_gflop_per_s.unwrap_or(0.0) > 0.0
        })
        .map(|row| {
            format!(
                "{} A {} B {}",
                row.band,
                opt(row.a_gflop_per_s, 1),
                opt(row.b_gflop_per_s, 1)
            )
        })
        .collect();
    if !flops.is_empty() {
        let _ = writeln!(out, "GFLOP/s: {}", flops.join(" · "));
    }
    if let Some(p) = &r.peaks {
        let _ = writeln!(
            out,
            "machine peaks: copy {:.1} GB/s (read + write){}",
            p.copy_gb_per_s,
            match (p.gemm_gflop_per_s, &p.gemm_shape) {
                (Some(g), Some(s)) => format!(", matmul {g:.1} GFLOP/s ({s})"),
                _ => String::new(),
            }
        );
    }
    for (name, rr) in [("A", &r.replay_a), ("B", &r.replay_b)] {
        if let Some(rr) = rr {
            out.push_str(&validations(name, rr));
        }
    }
    for n in &r.notes {
        let _ = writeln!(out, "note: {n}");
    }
    match l.rows.first() {
        Some(top) if top.gap_ms_per_token > 0.0 => {
            let _ = writeln!(
                out,
                "the largest gap: {} ({:+.4} ms/token, A/B {}): {}",
                top.band,
                top.gap_ms_per_token,
                opt(top.time_ratio, 2),
                top.verdict
            );
        }
        _ => {
            let _ = writeln!(out, "A is ahead or even in every band");
        }
    }
    out
}

/// The terminal rendering.
pub fn ledger_text(r: &LedgerReport) -> String {
    format!(
        "{}\n{}\n\nbytes, time: A/B ratios; verdicts place A on this machine's roofline: bandwidth- or compute-bound at half the measured copy or matmul peak or more, else neither (latency and overhead)\n{}",
        heading(r),
        text_table(&HEADER, &ALIGN, &rows(r)),
        tail(r)
    )
}

/// Markdown: the heading and validations as text, the ledger as a table.
pub fn ledger_markdown(r: &LedgerReport) -> String {
    let rows: Vec<Vec<String>> = rows(r)
        .into_iter()
        .map(|row| row.iter().map(|c| markdown_cell(c)).collect())
        .collect();
    format!(
        "## Ledger\n\n```\n{}```\n\n{}\n\n```\n{}```\n",
        heading(r),
        markdown_table(&HEADER, &ALIGN, &rows),
        tail(r)
    )
}

/// CSV: one row per band, raw numbers (empty where unknown).
pub fn ledger_csv(r: &LedgerReport) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "band",
        "a_ms_per_token",
        "b_ms_per_token",
        "gap_ms_per_token",
        "ahead",
        "leave_alone",
        "a_replay_ms_per_token",
        "b_replay_ms_per_token",
        "bytes_ratio",
        "time_ratio",
        "a_gb_per_s",
        "b_gb_per_s",
        "a_gflop_per_s",
        "b_gflop_per_s",
        "verdict",
    ])?;
    let o = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    for row in &r.ledger.rows {
        w.write_record([
            row.band.clone(),
            row.a_ms_per_token.to_string(),
            row.b_ms_per_token.to_string(),
            row.gap_ms_per_token.to_string(),
            row.ahead.clone(),
            row.leave_alone.to_string(),
            o(row.a_replay_ms_per_token),
            o(row.b_replay_ms_per_token),
            o(row.bytes_ratio),
            o(row.time_ratio),
            o(row.a_gb_per_s),
            o(row.b_gb_per_s),
            o(row.a_gflop_per_s),
            o(row.b_gflop_per_s),
            row.verdict.clone(),
        ])?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8(bytes).expect("csv of UTF-8 strings"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_core::ledger::{compare, Side};
    use std::collections::BTreeMap;

    fn report() -> LedgerReport {
        let side = |label: &str, p: f64, m: f64| Side {
            label: label.into(),
            arch: "qwen3moe".into(),
            tokens: 512,
            depth_tokens: 0,
            decode_tokens: 0,
            fused_ms: 1000.0,
            coverage: 1.0,
            agreement: 0.01,
            ms_per_token: BTreeMap::from([("projections".into(), p), ("moe".into(), m)]),
            work: BTreeMap::new(),
            replay_ms_per_token: BTreeMap::new(),
        };
        LedgerReport {
            ledger: compare(side("a", 2.0, 1.0), side("b", 1.0, 1.5), false, None).unwrap(),
            replay_a: None,
            replay_b: None,
            peaks: None,
            notes: vec![],
        }
    }

    #[test]
    fn the_largest_gap_leads_in_every_format() {
        let r = report();
        let t = ledger_text(&r);
        assert!(
            t.contains("the largest gap: projections (+1.0000 ms/token, A/B 2.00)"),
            "{t}"
        );
        let md = ledger_markdown(&r);
        let first_row = md.lines().find(|l| l.starts_with("| proj")).unwrap();
        assert!(first_row.contains("+1.0000"), "{md}");
        let csv = ledger_csv(&r).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[1].starts_with("projections,2,1,1,b,false"), "{csv}");
        assert!(lines[2].starts_with("moe,1,1.5,-0.5,a,true"), "{csv}");
    }
}
