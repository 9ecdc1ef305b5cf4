//! Renderers of a per-node profile: the terminal table, markdown and the bands CSV.

use std::fmt::Write as _;

use opledger_core::manifest::Manifest;
use opledger_core::profile::{BandRow, CheckStatus, ProfileSummary, NOT_MEASURED};

use crate::table::{markdown_table, text_table, Align};

pub(crate) const BAND_HEADER: [&str; 7] = [
    "band",
    "ms/token",
    "range (cycles)",
    "share",
    "corrected",
    "nodes",
    "working",
];
const BAND_ALIGN: [Align; 7] = [
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
];

pub(crate) fn band_rows(s: &ProfileSummary) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = s
        .bands
        .iter()
        .map(|b| {
            vec![
                b.band.clone(),
                format!("{:.4}", b.ms_per_token),
                format!("{:.4}–{:.4}", b.ms_per_token_min, b.ms_per_token_max),
                format!("{:.1} %", b.share * 100.0),
                corrected_cell(b),
                b.nodes.to_string(),
                b.working_nodes.to_string(),
            ]
        })
        .collect();
    rows.push(vec![
        "total".into(),
        format!("{:.4}", s.bands.iter().map(|b| b.ms_per_token).sum::<f64>()),
        String::new(),
        format!(
            "{:.1} %",
            s.bands.iter().map(|b| b.share).sum::<f64>() * 100.0
        ),
        format!(
            "{:.4}",
            s.bands
                .iter()
                .map(|b| b.ms_per_token_corrected)
                .sum::<f64>()
        ),
        s.nodes.to_string(),
        (s.nodes - s.view_nodes).to_string(),
    ]);
    rows
}

/// A band's corrected ms/token, marked where removing the isolation stopped some of its working
/// nodes at 0 (a lower bound then; the `corrected at 0` check says more).
pub(crate) fn corrected_cell(b: &BandRow) -> String {
    if b.corrected_clamped_nodes > 0 {
        format!(
            "{:.4} ({} nodes at 0)",
            b.ms_per_token_corrected, b.corrected_clamped_nodes
        )
    } else {
        format!("{:.4}", b.ms_per_token_corrected)
    }
}

pub(crate) fn mark(status: CheckStatus) -> &'static str {
    match status {
        CheckStatus::Pass => "ok",
        CheckStatus::Warn => "WARN",
        CheckStatus::Fail => "FAIL",
    }
}

pub(crate) fn heading(m: &Manifest, s: &ProfileSummary) -> (String, String) {
    let title = format!(
        "{} · {} · {} {} · {} · {}",
        m.model_label(),
        m.model.arch.arch,
        m.engine.engine,
        m.engine.version,
        m.engine.backend,
        crate::view::threads_label(m)
    );
    let work = if s.decode_tokens > 0 {
        format!(
            "decode of {} tokens by {} sequence(s) ({} tokens a run) at depth {} · {} cycles, medians",
            s.decode_tokens, s.parallel, s.tokens, s.depth_tokens, s.cycles
        )
    } else {
        format!(
            "chunk of {} tokens at depth {}, logits: {} · {} cycles, medians",
            s.tokens, s.depth_tokens, s.logits, s.cycles
        )
    };
    (title, work)
}

pub(crate) fn figures(s: &ProfileSummary) -> Vec<String> {
    let f = &s.fused_ms_spread;
    if crate::view::is_imported(s) {
        // one self-traced run: no FUSED run apart, no instrument, no outputs, no noise gate
        return vec![
            format!(
                "step wall {:.3} ms [{:.3}–{:.3}] for {} tokens: {:.1} tok/s",
                s.fused_ms, f.min, f.max, s.tokens, s.tok_per_s
            ),
            format!(
                "self time of the spans {:.2} ms a step (over every thread) · agreement, overhead, outputs, noise: {}",
                s.timed_sum_ms,
                crate::view::NOT_MEASURABLE
            ),
            format!("coverage {:.2} %", s.coverage * 100.0),
        ];
    }
    let a = &s.agreement_spread;
    let o = &s.overhead_spread;
    vec![
        format!(
            "FUSED wall {:.3} ms [{:.3}–{:.3}] for {} tokens: {:.1} tok/s",
            s.fused_ms, f.min, f.max, s.tokens, s.tok_per_s
        ),
        format!(
            "TIMED sum {:.2} ms (TIMED wall {:.2} ms) · agreement {}",
            s.timed_sum_ms,
            s.timed_wall_ms,
            if s.agreement.is_finite() {
                format!(
                    "{:+.2} % [{:+.2}–{:+.2}]",
                    s.agreement * 100.0,
                    a.min * 100.0,
                    a.max * 100.0
                )
            } else {
                format!("{NOT_MEASURED} (no FUSED run apart from the TIMED one)")
            }
        ),
        if s.isolation_us_per_step.is_finite() {
            format!(
                "isolation cost {:.1} µs a node a step (from the {}; {} idle nodes say {:.1}{}); agreement after removing it {}{}",
                s.isolation_us_per_step,
                s.isolation_source,
                s.isolation_nodes,
                s.isolation_idle_us / (s.node_steps.max(1) as f64),
                if s.isolation_device_us.is_empty() {
                    String::new()
                } else {
                    let each: Vec<String> = s
                        .isolation_device_us
                        .iter()
                        .map(|(d, us)| format!("{d} {us:.1}"))
                        .collect();
                    format!("; removed per device: {} µs", each.join(", "))
                },
                percent(s.agreement_corrected),
                if s.decode_tokens > 0 {
                    format!(
                        "; the {:+.2} µs a working node a step it leaves is taken equally from every working node in the corrected columns",
                        s.isolation_remainder_us
                    )
                } else {
                    String::new()
                }
            )
        } else {
            format!(
                "isolation cost {NOT_MEASURED} (no calibration, no idle nodes): the corrected columns remove nothing{}",
                if s.decode_tokens > 0 {
                    format!(
                        " but the {:+.2} µs a working node a step between the TIMED sum and the FUSED wall, taken equally from every working node",
                        s.isolation_remainder_us
                    )
                } else {
                    String::new()
                }
            )
        },
        if check_not_measured(s, "noise") {
            format!("noise gate: {NOT_MEASURED} (off: no run was checked against other processes' use of the CPUs)")
        } else {
            format!(
                "noise gate: {} runs rejected and retaken, {} kept although noisy (busiest other process up to {:.0} % of one CPU, all others up to {:.1} % of the machine)",
                s.noise_gate.rejected,
                s.noise_gate.kept_noisy,
                s.noise_gate.max_busiest_kept * 100.0,
                s.noise_gate.max_others_kept * 100.0
            ) + &s
                .noise_gate
                .canary_text()
                .map(|t| format!("; {t}"))
                .unwrap_or_default()
        },
        format!(
            "from the fastest run of each mode: agreement {}, overhead {}",
            percent(s.agreement_of_minimums),
            ratio(s.overhead_of_minimums)
        ),
        format!(
            "coverage {:.2} % · instrument overhead {} · outputs {}",
            s.coverage * 100.0,
            if s.overhead.is_finite() {
                format!("{:.4} [{:.4}–{:.4}]", s.overhead, o.min, o.max)
            } else {
                format!("{NOT_MEASURED} (no FUSED run with the instrument installed)")
            },
            if check_not_measured(s, "outputs") {
                format!("{NOT_MEASURED} (no output hashes recorded)")
            } else if s.outputs_identical {
                "bit-identical across modes".into()
            } else {
                match (
                    s.outputs_max_nmse,
                    s.checks
                        .iter()
                        .find(|c| c.name == "outputs")
                        .map(|c| c.status),
                ) {
                    (Some(n), Some(CheckStatus::Pass)) => {
                        format!(
                            "within NMSE {n:.1e} across modes (bound {:.0e}: the device backend fuses ops when it runs the graph whole, not in TIMED)",
                            opledger_core::profile::DEVICE_MODES_MAX_NMSE
                        )
                    }
                    (Some(n), _) => format!("DIFFER between runs (NMSE up to {n:.1e})"),
                    (None, _) => "DIFFER between runs".into(),
                }
            }
        ),
    ]
}

/// A fraction as a signed percentage with `digits` decimals, or "not measured" (NaN).
pub(crate) fn percent_to(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{:+.digits$} %", x * 100.0)
    } else {
        NOT_MEASURED.into()
    }
}

/// A fraction as a signed percentage, or "not measured" (NaN).
pub(crate) fn percent(x: f64) -> String {
    percent_to(x, 2)
}

/// A ratio, or "not measured" (NaN).
pub(crate) fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        NOT_MEASURED.into()
    }
}

/// The check `name` says its figure was not measured.
pub(crate) fn check_not_measured(s: &ProfileSummary, name: &str) -> bool {
    s.checks
        .iter()
        .any(|c| c.name == name && c.detail.starts_with(NOT_MEASURED))
}

pub(crate) fn contents_line(
    label: &str,
    rows: &[opledger_core::profile::NameRow],
) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    // the largest first; past CONTENTS_SHOWN (an imported trace may have thousands of names)
    // the rest is one figure, every row being in summary.json
    let mut order: Vec<&opledger_core::profile::NameRow> = rows.iter().collect();
    order.sort_by(|a, b| b.ms_per_token.total_cmp(&a.ms_per_token));
    let mut items: Vec<String> = order
        .iter()
        .take(CONTENTS_SHOWN)
        .map(|r| {
            format!(
                "{} ({}, {}×, {:.4})",
                r.name,
                r.ops.join("/"),
                r.nodes,
                r.ms_per_token
            )
        })
        .collect();
    if order.len() > CONTENTS_SHOWN {
        let rest = &order[CONTENTS_SHOWN..];
        items.push(format!(
            "and {} more names ({:.4} ms/token together; all in summary.json)",
            rest.len(),
            rest.iter().map(|r| r.ms_per_token).sum::<f64>()
        ));
    }
    Some(format!("{label}: {}", items.join(", ")))
}

/// Names listed on a band's contents line; the rest is summed.
const CONTENTS_SHOWN: usize = 12;

/// The model's layers, or that they were not recorded (an import without `--model`).
pub(crate) fn layers_line(m: &Manifest) -> String {
    if m.model.arch.layers.is_empty() && !crate::view::model_recorded(m) {
        crate::view::model_not_recorded(m)
    } else {
        m.model.arch.layer_summary()
    }
}

/// The terminal rendering.
pub fn profile_text(m: &Manifest, s: &ProfileSummary) -> String {
    let (title, work) = heading(m, s);
    let mut out = String::new();
    let _ = writeln!(out, "{title}\n{work}\nlayers: {}\n", layers_line(m));
    let _ = writeln!(
        out,
        "{}\n",
        text_table(&BAND_HEADER, &BAND_ALIGN, &band_rows(s))
    );
    for line in figures(s) {
        let _ = writeln!(out, "{line}");
    }
    if let Some(d) = &s.device {
        out.push_str(&crate::device::device_text(d));
    }
    if let Some(d) = &s.device_clock {
        out.push_str(&crate::device_clock::device_clock_text(d));
    }
    if !s.devices.is_empty() {
        let _ = writeln!(
            out,
            "\nby device (the same estimator; transfers under their link):\n{}",
            text_table(&DEVICE_HEADER, &DEVICE_ALIGN, &device_rows(s))
        );
        for line in split_lines(s) {
            let _ = writeln!(out, "{line}");
        }
        let _ = writeln!(out);
    }
    if let Some(l) = contents_line("other holds", &s.other) {
        let _ = writeln!(out, "{l}");
    }
    if let Some(l) = contents_line("UNASSIGNED", &s.unassigned) {
        let _ = writeln!(out, "{l}");
    }
    for f in &s.audit {
        let _ = writeln!(
            out,
            "AUDIT: node {} {} ({}): {}",
            f.node, f.name, f.op, f.why
        );
    }
    let checks: Vec<String> = s
        .checks
        .iter()
        .map(|c| format!("{} {}", mark(c.status), c.name))
        .collect();
    let _ = writeln!(out, "checks: {}", checks.join(" · "));
    for c in s.checks.iter().filter(|c| c.status != CheckStatus::Pass) {
        let _ = writeln!(out, "  {} {}: {}", mark(c.status), c.name, c.detail);
    }
    out
}

const DEVICE_HEADER: [&str; 6] = [
    "device",
    "band",
    "ms/token",
    "range (cycles)",
    "corrected",
    "nodes",
];
const DEVICE_ALIGN: [Align; 6] = [
    Align::Left,
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Right,
];

/// The (device, band) rows of a split profile.
fn device_rows(s: &ProfileSummary) -> Vec<Vec<String>> {
    s.devices
        .iter()
        .map(|d| {
            vec![
                d.device.clone(),
                d.band.clone(),
                format!("{:.4}", d.ms_per_token),
                format!("{:.4}–{:.4}", d.ms_per_token_min, d.ms_per_token_max),
                format!("{:.4}", d.ms_per_token_corrected),
                d.nodes.to_string(),
            ]
        })
        .collect()
}

/// One run of nodes on one device: its layers, nodes and the bytes copied into it.
pub fn device_run_line(r: &opledger_core::split::DeviceRun) -> String {
    let layers = match r.layers {
        Some((a, b)) if a == b => format!("layer {a}"),
        Some((a, b)) => format!("layers {a}-{b}"),
        None => "no layer".into(),
    };
    if r.bytes_in > 0 {
        format!(
            "{} {layers} ({} nodes, {:.1} KiB in: {})",
            r.device,
            r.nodes,
            r.bytes_in as f64 / 1024.0,
            r.inputs.join(", ")
        )
    } else {
        format!("{} {layers} ({} nodes)", r.device, r.nodes)
    }
}

/// The census of splits, the network's share and the one-process comparison of a split
/// profile.
pub(crate) fn split_lines(s: &ProfileSummary) -> Vec<String> {
    let mut lines = Vec::new();
    let runs: Vec<String> = s.splits.iter().map(device_run_line).collect();
    lines.push(format!("splits ({}): {}", s.splits.len(), runs.join(" | ")));
    if let Some(n) = s.band("network") {
        lines.push(format!(
            "network: {:.4} ms/token ({:.1} % of the bands; corrected {:.4})",
            n.ms_per_token,
            n.share * 100.0,
            n.ms_per_token_corrected
        ));
    }
    lines.push(format!(
        "agreement: raw {}, each device's isolation (and remote round trips) removed {}",
        percent_to(s.agreement, 1),
        percent_to(s.agreement_corrected, 1)
    ));
    if let Some(why) = &s.one_process_skipped {
        lines.push(format!(
            "FUSED split {:.2} ms ({:.2}–{:.2}); one process not measured: {why}",
            s.fused_ms_spread.median, s.fused_ms_spread.min, s.fused_ms_spread.max
        ));
    }
    if let Some(one) = &s.one_process_fused_ms {
        lines.push(format!(
            "FUSED split {:.2} ms ({:.2}–{:.2}) vs one process {:.2} ms ({:.2}–{:.2}): {:.3}x",
            s.fused_ms_spread.median,
            s.fused_ms_spread.min,
            s.fused_ms_spread.max,
            one.median,
            one.min,
            one.max,
            s.fused_ms_spread.median / one.median
        ));
    }
    lines
}

/// The markdown rendering (a section of a report).
pub fn profile_markdown(m: &Manifest, s: &ProfileSummary) -> String {
    let (title, work) = heading(m, s);
    let mut out = String::new();
    let _ = writeln!(out, "## {title}\n\n{work}\n");
    let _ = writeln!(
        out,
        "{}\n",
        markdown_table(&BAND_HEADER, &BAND_ALIGN, &band_rows(s))
    );
    for line in figures(s) {
        let _ = writeln!(out, "- {line}");
    }
    if let Some(d) = &s.device {
        out.push_str(&crate::device::device_markdown(d));
    }
    if let Some(d) = &s.device_clock {
        out.push_str(&crate::device_clock::device_clock_markdown(d));
    }
    if !s.devices.is_empty() {
        let _ = writeln!(
            out,
            "\nBy device (the same estimator; transfers under their link):\n\n{}\n",
            markdown_table(&DEVICE_HEADER, &DEVICE_ALIGN, &device_rows(s))
        );
        for line in split_lines(s) {
            let _ = writeln!(out, "- {line}");
        }
    }
    if let Some(l) = contents_line("other holds", &s.other) {
        let _ = writeln!(out, "- {l}");
    }
    if let Some(l) = contents_line("unassigned", &s.unassigned) {
        let _ = writeln!(out, "- {l}");
    }
    let _ = writeln!(out, "\n| check | status | detail |\n| --- | --- | --- |");
    for c in &s.checks {
        let _ = writeln!(
            out,
            "| {} | {} | {} |",
            c.name,
            mark(c.status),
            crate::table::markdown_cell(&c.detail)
        );
    }
    out
}

/// One row per band: the figures a spreadsheet wants, each on its clock (`host`: every measured
/// profile's bands, and an imported trace's spans; `device`: an imported trace's device
/// activity, a second row per band after the host's).
pub fn bands_csv(s: &ProfileSummary) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "band",
        "ms_per_token",
        "ms_per_token_corrected",
        "ms_per_token_min",
        "ms_per_token_max",
        "share",
        "nodes",
        "working_nodes",
        "timed_ms",
        "tokens",
        "depth_tokens",
        "fused_ms",
        "corrected_clamped_nodes",
        "clock",
    ])?;
    for b in &s.bands {
        w.write_record([
            b.band.clone(),
            format!("{:.6}", b.ms_per_token),
            format!("{:.6}", b.ms_per_token_corrected),
            format!("{:.6}", b.ms_per_token_min),
            format!("{:.6}", b.ms_per_token_max),
            format!("{:.6}", b.share),
            b.nodes.to_string(),
            b.working_nodes.to_string(),
            format!("{:.6}", b.timed_ms),
            s.tokens.to_string(),
            s.depth_tokens.to_string(),
            format!("{:.6}", s.fused_ms),
            b.corrected_clamped_nodes.to_string(),
            "host".into(),
        ])?;
    }
    if let Some(d) = &s.device {
        for row in crate::device::csv_rows(d, s.tokens, s.depth_tokens) {
            w.write_record(row)?;
        }
    }
    if let Some(d) = &s.device_clock {
        for row in crate::device_clock::csv_rows(d, s.tokens, s.depth_tokens) {
            w.write_record(row)?;
        }
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Parallel decode side by side: one row per sequence count, ms per generated token per band
/// (isolation cost removed), so the step where a band's cost changes shows in one table.
pub fn parallel_text(runs: &[&ProfileSummary]) -> String {
    let Some(first) = runs.first() else {
        return String::new();
    };
    let bands: Vec<&str> = first.bands.iter().map(|b| b.band.as_str()).collect();
    let mut header = vec!["P", "tok/s", "ms/token"];
    header.extend(bands.iter().copied());
    header.push("agreement (raw → corrected)");
    let mut align = vec![Align::Right; header.len()];
    align[header.len() - 1] = Align::Left;
    let rows: Vec<Vec<String>> = runs
        .iter()
        .map(|s| {
            let mut r = vec![
                s.parallel.to_string(),
                format!("{:.1}", s.tok_per_s),
                format!("{:.4}", s.fused_ms / s.tokens.max(1) as f64),
            ];
            for band in &bands {
                r.push(s.band(band).map(corrected_cell).unwrap_or_default());
            }
            r.push(format!(
                "{} → {}",
                percent_to(s.agreement, 1),
                percent_to(s.agreement_corrected, 1)
            ));
            r
        })
        .collect();
    format!(
        "parallel decode: ms per generated token by band (isolation cost removed), depth {}, {} tokens a sequence\n{}\n",
        first.depth_tokens,
        first.decode_tokens,
        text_table(&header, &align, &rows)
    )
}

/// The parallel table as CSV: one row per (P, band).
pub fn parallel_csv(runs: &[&ProfileSummary]) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "parallel",
        "band",
        "ms_per_token",
        "ms_per_token_corrected",
        "tok_per_s",
        "agreement",
        "agreement_corrected",
        "corrected_clamped_nodes",
    ])?;
    for s in runs {
        for b in &s.bands {
            w.write_record([
                s.parallel.to_string(),
                b.band.clone(),
                format!("{:.6}", b.ms_per_token),
                format!("{:.6}", b.ms_per_token_corrected),
                format!("{:.3}", s.tok_per_s),
                format!("{:.6}", s.agreement),
                format!("{:.6}", s.agreement_corrected),
                b.corrected_clamped_nodes.to_string(),
            ])?;
        }
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_core::profile::NameRow;

    fn row(name: &str, ms: f64) -> NameRow {
        NameRow {
            name: name.into(),
            ops: vec!["MUL".into()],
            nodes: 2,
            ms_per_token: ms,
        }
    }

    #[test]
    fn a_contents_line_lists_the_largest_names_then_sums_the_rest() {
        assert_eq!(contents_line("other holds", &[]), None);
        let few = [row("a", 0.5), row("b", 1.5)];
        assert_eq!(
            contents_line("other holds", &few).unwrap(),
            "other holds: b (MUL, 2×, 1.5000), a (MUL, 2×, 0.5000)"
        );
        // 20 names of 0.01 .. 0.20: the 12 largest (0.20 down to 0.09), then 8 more summing
        // 0.01 + ... + 0.08 = 0.36
        let many: Vec<NameRow> = (1..=20)
            .map(|i| row(&format!("n{i}"), i as f64 / 100.0))
            .collect();
        let line = contents_line("other holds", &many).unwrap();
        assert!(
            line.starts_with("other holds: n20 (MUL, 2×, 0.2000), n19"),
            "{line}"
        );
        assert!(line.contains("n9 (MUL, 2×, 0.0900), and 8 more names (0.3600 ms/token together; all in summary.json)"), "{line}");
        assert!(!line.contains("n8 "), "{line}");
    }
}
