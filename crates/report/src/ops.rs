//! Renderers of standalone op timing: bands standalone (per routing) against in-graph, coverage
//! per routing, the first-k undercount, and the expert matmuls' routings in detail.

use std::fmt::Write as _;

use opledger_core::manifest::Manifest;
use opledger_core::ops::OpsSummary;

use crate::table::{text_table, Align};

/// The title line of an ops run's table.
pub fn ops_title(m: &Manifest) -> String {
    format!(
        "{} · {} · {} · {} threads · ops alone against in-graph",
        m.model_label(),
        m.model.arch.arch,
        m.engine.version,
        m.engine.threads
    )
}

pub fn ops_text(title: &str, s: &OpsSummary) -> String {
    let mut out = String::new();
    let work = if s.decode_tokens > 0 {
        format!(
            "one decode step of {} sequence(s) ({} token(s) a graph; in-graph bands from {} steps), FUSED wall {:.3} ms a step",
            s.parallel, s.tokens, s.decode_tokens, s.fused_ms
        )
    } else {
        format!(
            "chunk of {} tokens, FUSED wall {:.2} ms",
            s.tokens, s.fused_ms
        )
    };
    let cache = if s.flush_bytes > 0 {
        format!(
            "ops alone: {} MiB written before every repetition, so weights come from memory",
            s.flush_bytes >> 20
        )
    } else {
        "ops alone: no cache flush (weights as warm as the repetitions leave them)".to_string()
    };
    let _ = writeln!(out, "{title}\n{work}\n{cache}\n");
    let routings: Vec<&str> = s.routings.iter().map(|r| r.name()).collect();
    let mut header = vec![if s.decode_tokens > 0 {
        "in-graph ms/token (isolation removed)"
    } else {
        "in-graph ms/token"
    }];
    header.insert(0, "band");
    let named: Vec<String> = routings.iter().map(|r| format!("alone, {r}")).collect();
    header.extend(named.iter().map(String::as_str));
    let mut rows: Vec<Vec<String>> = s
        .bands
        .iter()
        .map(|b| {
            let in_graph = if b.in_graph_clamped_nodes > 0 {
                format!(
                    "{:.4} ({} nodes at 0)",
                    b.in_graph_ms_per_token, b.in_graph_clamped_nodes
                )
            } else {
                format!("{:.4}", b.in_graph_ms_per_token)
            };
            let mut r = vec![b.band.clone(), in_graph];
            for name in &routings {
                let v = b.standalone_ms_per_token.get(*name).copied().unwrap_or(0.0);
                let delta = if b.in_graph_ms_per_token > 0.0 {
                    format!(" ({:+.0} %)", (v / b.in_graph_ms_per_token - 1.0) * 100.0)
                } else {
                    String::new()
                };
                r.push(format!("{v:.4}{delta}"));
            }
            r
        })
        .collect();
    let mut cov = vec!["coverage".to_string(), "100 %".to_string()];
    for name in &routings {
        cov.push(format!(
            "{:.1} %",
            s.coverage.get(*name).copied().unwrap_or(0.0) * 100.0
        ));
    }
    rows.push(cov);
    let mut align = vec![Align::Right; header.len()];
    align[0] = Align::Left;
    let _ = writeln!(out, "{}\n", text_table(&header, &align, &rows));
    // weight bytes one graph reads, per band and routing
    let mut bheader = vec!["band".to_string()];
    bheader.extend(routings.iter().map(|r| format!("MiB read, {r}")));
    let brows: Vec<Vec<String>> = s
        .bands
        .iter()
        .filter(|b| !b.weight_bytes.is_empty())
        .map(|b| {
            let mut r = vec![b.band.clone()];
            for name in &routings {
                r.push(format!(
                    "{:.2}",
                    b.weight_bytes.get(*name).copied().unwrap_or(0) as f64 / (1u64 << 20) as f64
                ));
            }
            r
        })
        .collect();
    if !brows.is_empty() {
        let h: Vec<&str> = bheader.iter().map(String::as_str).collect();
        let mut align = vec![Align::Right; h.len()];
        align[0] = Align::Left;
        let _ =
            writeln!(
            out,
            "weights read by one {} (expert tensors: only the experts the routing touches):\n{}\n",
            if s.decode_tokens > 0 { "decode step" } else { "chunk" },
            text_table(&h, &align, &brows)
        );
    }
    if let (Some(u), Some(m)) = (s.moe_first_k_undercount, &s.moe_band) {
        let _ = writeln!(
            out,
            "first-k routing (every token on experts 0..k-1) puts the {m} band {:.1} % {} captured routing\n",
            u.abs() * 100.0,
            if u >= 0.0 { "below" } else { "above" }
        );
    }
    let expert: Vec<Vec<String>> = s
        .rows
        .iter()
        .filter(|r| r.routing.is_some())
        .map(|r| {
            vec![
                r.routing.map(|x| x.name().to_string()).unwrap_or_default(),
                r.count.to_string(),
                format!("{:.1}", r.median_us),
                format!("{:.1}–{:.1}", r.min_us, r.max_us),
                r.experts_touched.map(|e| e.to_string()).unwrap_or_default(),
                r.expert_bytes
                    .map(|b| format!("{:.1}", b as f64 / (1u64 << 20) as f64))
                    .unwrap_or_default(),
                r.signature.clone(),
            ]
        })
        .collect();
    if !expert.is_empty() {
        let _ = writeln!(
            out,
            "expert matmuls alone, per call:\n{}",
            text_table(
                &[
                    "routing",
                    "calls",
                    "median µs",
                    "range",
                    "experts",
                    "MiB read",
                    "output <- sources"
                ],
                &[
                    Align::Left,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Left
                ],
                &expert
            )
        );
    }
    out
}
