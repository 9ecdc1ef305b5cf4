//! The HTML page and chart of a profile.

use std::fmt::Write as _;

use opledger_core::census::ExpectationStatus;

use super::layout::{band_cell, band_table, checks_section, figure, list, page, table};
use super::manifest::manifest_section;
use crate::palette::band_colour;
use crate::svg::{bar_chart_svg, esc, Bar, BarChart, BarRow, Panel};
use crate::view::ProfileView;

pub(super) fn profile_chart(v: &ProfileView) -> BarChart {
    let s = &v.summary;
    BarChart {
        title: format!(
            "{} · ms per token by band · {}",
            v.manifest.model_label(),
            crate::bench::test_name(
                v.raw.config.work.chunk_tokens,
                s.depth_tokens,
                s.decode_tokens,
                s.parallel
            )
        ),
        unit: "ms per token (band share of the TIMED time × FUSED wall / tokens); whiskers: range over cycles".into(),
        legend: Vec::new(),
        panels: vec![Panel {
            title: None,
            rows: s
                .bands
                .iter()
                .map(|b| BarRow {
                    label: b.band.clone(),
                    bars: vec![Bar {
                        value: b.ms_per_token,
                        colour: band_colour(&b.band),
                        range: Some((b.ms_per_token_min, b.ms_per_token_max)),
                    }],
                    note: format!("{:.4} ms · {:.1} %", b.ms_per_token, b.share * 100.0),
                })
                .collect(),
        }],
    }
}

pub(super) fn profile_html(v: &ProfileView) -> String {
    let m = v.manifest;
    let s = &v.summary;
    let (title, work) = crate::profile::heading(m, s);
    let mut body = String::new();
    checks_section(&mut body, "Cross-checks", &s.checks);
    figure(
        &mut body,
        "chart",
        "Where the time goes",
        &bar_chart_svg(&profile_chart(v)),
        &format!(
            "FUSED wall {:.3} ms for {} tokens: {:.1} tok/s",
            s.fused_ms, s.tokens, s.tok_per_s
        ),
    );
    body.push_str("<section id=\"bands\"><h2>Bands</h2>\n");
    band_table(
        &mut body,
        &crate::profile::BAND_HEADER,
        &[false, true, true, true, true, true, true],
        crate::profile::band_rows(s),
    );
    list(&mut body, &crate::profile::figures(s));
    let mut contents = Vec::new();
    if let Some(l) = crate::profile::contents_line("other holds", &s.other) {
        contents.push(l);
    }
    if let Some(l) = crate::profile::contents_line("UNASSIGNED", &s.unassigned) {
        contents.push(l);
    }
    for f in &s.audit {
        contents.push(format!(
            "AUDIT: node {} {} ({}): {}",
            f.node, f.name, f.op, f.why
        ));
    }
    if !contents.is_empty() {
        list(&mut body, &contents);
    }
    body.push_str("</section>\n");
    body.push_str("<section id=\"census\"><h2>Census: the graph against the architecture</h2>\n");
    let c = &v.census;
    let _ = writeln!(
        body,
        "<p>{} nodes · {} views · {} skipped by the backend · {} working · attention path: {}</p>",
        c.total.nodes,
        c.view_nodes,
        c.skipped_nodes,
        c.total.working,
        esc(&c.attention_path)
    );
    let rows: Vec<Vec<String>> = c
        .expectations
        .iter()
        .map(|e| {
            vec![
                esc(&e.op),
                band_cell(&e.band),
                e.expected
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "–".into()),
                e.found.to_string(),
                match e.status() {
                    ExpectationStatus::AsExpected => {
                        "<span class=\"ok\">✓ as expected</span>".into()
                    }
                    ExpectationStatus::Mismatch => "<span class=\"bad\">✗ MISMATCH</span>".into(),
                    ExpectationStatus::NotPredicted => "not predicted".into(),
                },
                esc(&e.rule),
            ]
        })
        .collect();
    table(
        &mut body,
        &["op", "band", "expected", "found", "", "rule"],
        &[false, false, true, true, false, false],
        &rows,
    );
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    page(
        &format!("opledger profile · {}", m.model_label()),
        &format!("Profile of {}", m.model_label()),
        &[title, work],
        &body,
    )
}
