//! A measured profile's device clock in every rendering: per band the host's TIMED time and the
//! device's own time of the same nodes with their ratio, and the device's time in the FUSED runs
//! beside the profile's band figure with theirs (`opledger_core::device_clock`). The table, the
//! lines and the CSV rows come from here; the JSON is the summary's `device_clock`.

use opledger_core::device_clock::DeviceClockSummary;
use opledger_core::stats::Spread;

use crate::table::{markdown_section, text_section, Align};

pub(crate) const HEADER: [&str; 8] = [
    "band",
    "nodes",
    "host TIMED ms/token",
    "device TIMED ms/token",
    "host / device",
    "band ms/token",
    "device FUSED ms/token",
    "band / device",
];
const ALIGN: [Align; 8] = [
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
];

/// `0.0850 [0.0060–0.1640]`, or "not recorded".
fn spread(s: &Spread) -> String {
    if s.median.is_finite() {
        if s.n > 1 && s.min.is_finite() && s.max.is_finite() {
            format!("{:.4} [{:.4}–{:.4}]", s.median, s.min, s.max)
        } else {
            format!("{:.4}", s.median)
        }
    } else {
        "not recorded".into()
    }
}

fn ms(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "not recorded".into()
    }
}

fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "–".into()
    }
}

/// One row per band, then the totals of the medians.
pub(crate) fn rows(d: &DeviceClockSummary) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = d
        .bands
        .iter()
        .map(|b| {
            vec![
                b.band.clone(),
                b.nodes.to_string(),
                spread(&b.host_timed_ms_per_token),
                spread(&b.device_timed_ms_per_token),
                ratio(b.timed_ratio),
                ms(b.ms_per_token),
                spread(&b.device_fused_ms_per_token),
                ratio(b.fused_ratio),
            ]
        })
        .collect();
    let band_total: f64 = d
        .bands
        .iter()
        .map(|b| b.ms_per_token)
        .filter(|v| v.is_finite())
        .sum();
    let r = |a: f64, b: f64| if b > 0.0 { a / b } else { f64::NAN };
    rows.push(vec![
        "total".into(),
        d.bands.iter().map(|b| b.nodes).sum::<u32>().to_string(),
        ms(d.host_timed_ms_per_token),
        ms(d.device_timed_ms_per_token),
        ratio(r(d.host_timed_ms_per_token, d.device_timed_ms_per_token)),
        ms(band_total),
        ms(d.device_fused_ms_per_token),
        ratio(r(band_total, d.device_fused_ms_per_token)),
    ]);
    rows
}

/// The line above the table.
pub(crate) fn title(d: &DeviceClockSummary) -> String {
    format!(
        "device clock: {}. Per band, the host's TIMED time of the nodes the device timed beside the device's own time of the same nodes (each node its own submission), and the profile's band figure beside the device's time in the FUSED runs (the backend's own graph execution, op kinds shared by the TIMED nodes that showed them); medians [ranges] over cycles",
        d.source
    )
}

/// The figures under the table.
pub(crate) fn lines(d: &DeviceClockSummary) -> Vec<String> {
    let mut out = vec![format!(
        "nodes on the device timed on its clock in every TIMED run: {} of {}{}",
        d.nodes_matched,
        d.nodes_expected,
        if d.unmatched.is_empty() {
            String::new()
        } else {
            format!(" (not: {})", d.unmatched.join(", "))
        }
    )];
    for (kind, us) in &d.fused_unattributed {
        out.push(format!(
            "FUSED device time of an op kind no TIMED node showed (in no band): '{kind}' {us:.1} µs a run"
        ));
    }
    out
}

/// The terminal section.
pub fn device_clock_text(d: &DeviceClockSummary) -> String {
    text_section(&title(d), &HEADER, &ALIGN, &rows(d), &lines(d))
}

/// The markdown section.
pub fn device_clock_markdown(d: &DeviceClockSummary) -> String {
    markdown_section(
        "Device clock",
        &title(d),
        &HEADER,
        &ALIGN,
        &rows(d),
        &lines(d),
    )
}

/// `bands.csv`'s rows of the device clock: per band its device TIMED ms/token under clock
/// `device-timed` and its device FUSED ms/token under `device-fused` (median, range, nodes).
pub(crate) fn csv_rows(d: &DeviceClockSummary, tokens: u32, depth_tokens: u32) -> Vec<Vec<String>> {
    let f = |x: f64| {
        if x.is_finite() {
            format!("{x:.6}")
        } else {
            String::new()
        }
    };
    let mut out = Vec::new();
    for (clock, pick) in [
        (
            "device-timed",
            (|b| &b.device_timed_ms_per_token)
                as fn(&opledger_core::device_clock::DeviceClockBand) -> &Spread,
        ),
        ("device-fused", |b| &b.device_fused_ms_per_token),
    ] {
        for b in &d.bands {
            let s = pick(b);
            out.push(vec![
                b.band.clone(),
                f(s.median),
                String::new(),
                f(s.min),
                f(s.max),
                String::new(),
                b.nodes.to_string(),
                String::new(),
                String::new(),
                tokens.to_string(),
                depth_tokens.to_string(),
                String::new(),
                String::new(),
                clock.into(),
            ]);
        }
    }
    out
}
