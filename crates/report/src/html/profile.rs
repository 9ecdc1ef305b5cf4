//! The HTML page and chart of a profile.

use std::fmt::Write as _;

use opledger_core::census::ExpectationStatus;

use super::layout::{band_cell, band_table, checks_section, figure, list, page, table};
use super::manifest::manifest_section;
use crate::palette::{band_colour, DEVICE_CLOCK, HOST_CLOCK};
use crate::svg::{bar_chart_svg, esc, Bar, BarChart, BarRow, Panel};
use crate::view::ProfileView;
use opledger_core::device::DeviceStats;
use opledger_core::stats::Spread;

/// The run's test as llama-bench names it (`pp512`, `tg16 x4 @ d4096`), for a chart's title.
fn test_name(v: &ProfileView) -> String {
    let s = &v.summary;
    crate::bench::test_name(
        v.raw.config.work.chunk_tokens,
        s.depth_tokens,
        s.decode_tokens,
        s.parallel,
    )
}

pub(super) fn profile_chart(v: &ProfileView) -> BarChart {
    let s = &v.summary;
    if let Some(d) = &s.device {
        return clocks_chart(v, d);
    }
    BarChart {
        title: format!(
            "{} · ms per token by band · {}",
            v.manifest.model_label(),
            test_name(v)
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

/// An imported trace with device activity: per band a host bar (the spans' self time as read)
/// and a device bar (the activity they launched), one scale, whiskers over steps.
fn clocks_chart(v: &ProfileView, d: &DeviceStats) -> BarChart {
    let bar = |x: &Spread, colour: &str| Bar {
        value: x.median,
        colour: colour.to_string(),
        range: (x.min.is_finite() && x.max.is_finite()).then_some((x.min, x.max)),
    };
    BarChart {
        title: format!(
            "{} · ms per token by band, host and device · {}",
            v.manifest.model_label(),
            test_name(v)
        ),
        unit: "ms per token · host: the spans' self time · device: the activity they launched · whiskers: range over steps".into(),
        legend: vec![
            ("host".into(), HOST_CLOCK.into()),
            ("device".into(), DEVICE_CLOCK.into()),
        ],
        panels: vec![Panel {
            title: None,
            rows: d
                .bands_with_time()
                .map(|b| BarRow {
                    label: b.band.clone(),
                    bars: vec![
                        bar(&b.host_ms_per_token, HOST_CLOCK),
                        bar(&b.device_ms_per_token, DEVICE_CLOCK),
                    ],
                    note: format!(
                        "host {:.4} · device {:.4} ms",
                        b.host_ms_per_token.median, b.device_ms_per_token.median
                    ),
                })
                .collect(),
        }],
    }
}

/// The device ledger's section: its table, the busy time against the activity, the streams,
/// the activity outside every step.
fn device_section(body: &mut String, d: &DeviceStats) {
    body.push_str("<section id=\"device\"><h2>Device: time on the device's clock</h2>\n");
    let _ = writeln!(body, "<p>{}</p>", esc(&crate::device::title(d)));
    band_table(
        body,
        &crate::device::HEADER,
        &[false, true, true, true, true, true],
        crate::device::rows(d),
    );
    list(body, &crate::device::lines(d));
    body.push_str("</section>\n");
}

fn device_clock_section(body: &mut String, d: &opledger_core::device_clock::DeviceClockSummary) {
    body.push_str(
        "<section id=\"device-clock\"><h2>Device clock: the host's time beside the device's</h2>\n",
    );
    let _ = writeln!(body, "<p>{}</p>", esc(&crate::device_clock::title(d)));
    band_table(
        body,
        &crate::device_clock::HEADER,
        &[false, true, true, true, true, true, true, true],
        crate::device_clock::rows(d),
    );
    list(body, &crate::device_clock::lines(d));
    body.push_str("</section>\n");
}

pub(super) fn profile_html(v: &ProfileView) -> String {
    let m = v.manifest;
    let s = &v.summary;
    let (title, work) = crate::profile::heading(m, s);
    let mut body = String::new();
    checks_section(&mut body, "Cross-checks", &s.checks);
    let caption = match &s.device {
        Some(d) => format!(
            "host and device side by side: device busy {} ms a step against {} ms of activity{}; step wall {} ms on the host, {} ms to its last device activity",
            crate::device::spread(&d.busy_ms),
            crate::device::spread(&d.activity_ms),
            d.stream_concurrency
                .as_ref()
                .map(|c| format!(" (stream concurrency {})", crate::device::spread(c)))
                .unwrap_or_default(),
            crate::device::spread(&d.step_wall_ms),
            crate::device::spread(&d.step_wall_with_device_ms)
        ),
        None => format!(
            "FUSED wall {:.3} ms for {} tokens: {:.1} tok/s",
            s.fused_ms, s.tokens, s.tok_per_s
        ),
    };
    figure(
        &mut body,
        "chart",
        "Where the time goes",
        &bar_chart_svg(&profile_chart(v)),
        &caption,
    );
    if let Some(d) = &s.device {
        device_section(&mut body, d);
    }
    if let Some(d) = &s.device_clock {
        device_clock_section(&mut body, d);
    }
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
    census_section(&mut body, v);
    manifest_section(&mut body, m);
    page(
        &format!("opledger profile · {}", m.model_label()),
        &format!("Profile of {}", m.model_label()),
        &[title, work],
        &body,
    )
}

/// The census of the graph against the architecture; one line saying why where the run has no
/// architecture to hold it against (an import without `--model`).
fn census_section(body: &mut String, v: &ProfileView) {
    let m = v.manifest;
    body.push_str("<section id=\"census\"><h2>Census: the graph against the architecture</h2>\n");
    if m.model.arch.layers.is_empty() && !crate::view::model_recorded(m) {
        let _ = writeln!(
            body,
            "<p>No census: the model was {}, so there is no architecture to count the graph against.</p>\n</section>",
            esc(&crate::view::model_not_recorded(m))
        );
        return;
    }
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
        body,
        &["op", "band", "expected", "found", "", "rule"],
        &[false, false, true, true, false, false],
        &rows,
    );
    body.push_str("</section>\n");
}
