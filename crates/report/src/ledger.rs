//! Renderers of a ledger (two engines, builds or configurations side by side by band): a terminal
//! table, markdown and CSV. The largest gap comes first, then the method's validations.

use std::fmt::Write as _;

use opledger_core::device::Clock;
use opledger_core::ledger::{Gate, LedgerReport, Row};
use opledger_core::replay::ReplayResult;

use crate::table::{markdown_cell, markdown_table, text_table, Align};

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map(|x| format!("{x:.digits$}"))
        .unwrap_or_else(|| "-".into())
}

const HEADER: [&str; 13] = [
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
    "opportunity",
    "verdict",
];

/// The end-to-end speed-up of the side that would gain by matching the other in this band.
fn opportunity_cell(row: &Row) -> String {
    row.opportunity
        .as_ref()
        .map(|o| format!("{} {:.3}x", o.side.to_uppercase(), o.speedup))
        .unwrap_or_else(|| "-".into())
}

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
        opportunity_cell(row),
        row.verdict.clone(),
    ]
}

/// What marks a replay column whose validations failed, in every format.
pub const UNRELIABLE: &str = "unreliable";

/// The header, the replay columns marked where their side's validations failed, the first
/// naming the device's clock where the bands are read on it.
fn header(r: &LedgerReport) -> Vec<String> {
    let mut h: Vec<String> = HEADER.iter().map(|s| s.to_string()).collect();
    if r.ledger.clock == Some(Clock::Device) {
        h[0] = "band (device ms/token)".into();
    }
    for (col, rr) in [(5, &r.replay_a), (6, &r.replay_b)] {
        if rr.as_ref().is_some_and(|rr| !rr.reliable) {
            h[col] = format!("{} ({UNRELIABLE})", h[col]);
        }
    }
    h
}

fn header_refs(h: &[String]) -> Vec<&str> {
    h.iter().map(String::as_str).collect()
}

/// `ok`, `unreliable`, or empty where the side has no replay.
fn replay_status(rr: &Option<ReplayResult>) -> String {
    match rr {
        Some(rr) if rr.reliable => "ok".into(),
        Some(_) => UNRELIABLE.into(),
        None => String::new(),
    }
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

const ALIGN: [Align; 13] = [
    Align::Left,
    Align::Right,
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
    let agreement = |a: f64| {
        if a.is_finite() {
            format!("{:+.1} %", a * 100.0)
        } else {
            "not measurable".to_string()
        }
    };
    let _ = writeln!(
        out,
        "coverage A {:.1} %, B {:.1} % · agreement A {}, B {}{}",
        l.a.coverage * 100.0,
        l.b.coverage * 100.0,
        agreement(l.a.agreement),
        agreement(l.b.agreement),
        match (l.forced, l.differences.is_empty()) {
            (true, false) => format!(
                " · FORCED: the runs did different work ({})",
                l.differences.join(", ")
            ),
            (true, true) => " · FORCED: the runs did different work".to_string(),
            _ => String::new(),
        }
    );
    if let Some(clock) = l.clock {
        let _ = writeln!(out, "{}", clock_line(clock));
    }
    out
}

/// What the bands' times are, where a side had device time to choose from.
pub fn clock_line(clock: Clock) -> String {
    match clock {
        Clock::Device => "clock: device · each band's time is the device time of the activity its spans launched (median over steps), gaps and opportunities on the same clock (--clock host: the spans' self time)".into(),
        Clock::Host => "clock: host · each band's time is its spans' self time on the host, scaled to the step's wall (--clock device: the time of the device activity they launched)".into(),
    }
}

fn validations(name: &str, rr: &ReplayResult) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "replay {name}: {} · baseline {:.1} ms (spread {:.1} ms over {} cycles), outputs {}",
        if rr.reliable {
            "every validation within its bound".to_string()
        } else {
            format!(
                "UNRELIABLE ({} failed): the replay column must not be trusted",
                rr.failed_checks().join(", ")
            )
        },
        rr.baseline_ms,
        rr.baseline_spread_ms,
        rr.cycles,
        if rr.outputs_identical {
            "bit-identical in every replay"
        } else {
            "CHANGED by a replay"
        }
    );
    match rr.round_cost_us {
        Some(us) => {
            let _ = writeln!(
                out,
                "  launch per replay round: {us:.2} µs (range {:.2}-{:.2}), measured by rounds of one trivial clone at every replayable node and removed from every increment; baseline work {:.1} ms",
                rr.round_cost_min_us, rr.round_cost_max_us, rr.baseline_work_ms
            );
        }
        None => {
            let _ = writeln!(
                out,
                "  launch per replay round: none (a replay is the op's own call again)"
            );
        }
    }
    let _ = writeln!(
        out,
        "  planned before measuring for noise of {:.2} ms (the probe's {} baselines{}): replay-all at {} replay(s) a node, k-scaling at k = {}",
        rr.noise_ms,
        opledger_core::replay::PROBE_RUNS,
        if rr.attempts > 1 {
            format!(
                "; retaken once: the first measurement failed {} in cycles noisier than its probe",
                rr.retaken_after.join(", ")
            )
        } else {
            String::new()
        },
        rr.scale,
        rr.scaling_ms_per_replay
            .iter()
            .map(|(k, _)| k.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    );
    for s in &rr.skipped {
        let _ = writeln!(
            out,
            "  not replayed, too small to measure here: {} ({} nodes, {}); the sum of bands is set against the measured bands replayed together",
            s.band, s.nodes, s.reason
        );
    }
    for (i, c) in rr.checks.iter().filter(|c| c.name != "outputs").enumerate() {
        let _ = writeln!(
            out,
            "  {}. {}: {}",
            i + 1,
            if c.pass { "ok" } else { "FAILED" },
            c.detail
        );
    }
    let _ = writeln!(
        out,
        "     {} replayed k = {}: {} per replay; line through the increments: {:.2} ms per replay",
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
    let by_gain = l.by_opportunity();
    if !by_gain.is_empty() {
        let _ = writeln!(
            out,
            "opportunities, largest first: {}",
            by_gain
                .iter()
                .filter_map(|row| row.opportunity.as_ref().map(|o| (row, o)))
                .map(|(row, o)| format!(
                    "{} for {} {:.3}x ({:.1} % of its time)",
                    row.band,
                    o.side.to_uppercase(),
                    o.speedup,
                    o.share * 100.0
                ))
                .collect::<Vec<_>>()
                .join(" · ")
        );
    }
    if let Some(g) = &r.gate {
        out.push_str(&gate_text(g));
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

/// The regression gate: the threshold, the rank test and its level, every band that fails.
fn gate_text(g: &Gate) -> String {
    let mut out = String::new();
    let failed = g.failed();
    let _ = writeln!(
        out,
        "gate: a band fails when A's median is more than {:.1} % slower than B's and A's cycles rank above B's beyond chance (one-sided Mann-Whitney p at most {:.4}: {:.0} % over {} bands; A {} cycles, B {}): {}",
        g.threshold * 100.0,
        g.alpha_per_band,
        opledger_core::ledger::GATE_ALPHA * 100.0,
        g.rows.len(),
        g.a_cycles,
        g.b_cycles,
        if failed.is_empty() {
            "passed".to_string()
        } else {
            format!("FAILED in {} band(s)", failed.len())
        }
    );
    for row in &g.rows {
        let _ = writeln!(
            out,
            "  {:<18} {:>9} A {:.4} ({:.4}-{:.4}) B {:.4} ({:.4}-{:.4}) p {:.4}{}",
            row.band,
            row.change(),
            row.a_ms_per_token,
            row.a_range.0,
            row.a_range.1,
            row.b_ms_per_token,
            row.b_range.0,
            row.b_range.1,
            row.p_value,
            match (row.beyond_threshold, row.beyond_noise) {
                (true, true) => "  REGRESSED",
                (true, false) => "  within the noise",
                _ => "",
            }
        );
    }
    out
}

/// The terminal rendering.
pub fn ledger_text(r: &LedgerReport) -> String {
    format!(
        "{}\n{}\n\nbytes, time: A/B ratios; opportunity: the end-to-end speed-up of the slower side if it matched the faster one in that band (Amdahl); verdicts place A on this machine's roofline: bandwidth- or compute-bound at half the measured copy or matmul peak or more, else neither (latency and overhead)\n{}",
        heading(r),
        text_table(&header_refs(&header(r)), &ALIGN, &rows(r)),
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
        markdown_table(&header_refs(&header(r)), &ALIGN, &rows),
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
        "a_replay_status",
        "b_replay_status",
        "bytes_ratio",
        "time_ratio",
        "a_gb_per_s",
        "b_gb_per_s",
        "a_gflop_per_s",
        "b_gflop_per_s",
        "opportunity_side",
        "opportunity_share",
        "opportunity_speedup",
        "regressed",
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
            replay_status(&r.replay_a),
            replay_status(&r.replay_b),
            o(row.bytes_ratio),
            o(row.time_ratio),
            o(row.a_gb_per_s),
            o(row.b_gb_per_s),
            o(row.a_gflop_per_s),
            o(row.b_gflop_per_s),
            row.opportunity
                .as_ref()
                .map(|o| o.side.clone())
                .unwrap_or_default(),
            o(row.opportunity.as_ref().map(|o| o.share)),
            o(row.opportunity.as_ref().map(|o| o.speedup)),
            r.gate
                .as_ref()
                .and_then(|g| g.rows.iter().find(|g| g.band == row.band))
                .map(|g| g.fails.to_string())
                .unwrap_or_default(),
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
        // five cycles a side, each band's cycles 2 % apart around its median
        let cycles = |x: f64| vec![x * 0.98, x * 0.99, x, x * 1.01, x * 1.02];
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
            ms_per_token_range: BTreeMap::new(),
            cycles: 5,
            ms_per_token_cycles: BTreeMap::from([
                ("projections".into(), cycles(p)),
                ("moe".into(), cycles(m)),
            ]),
            model: String::new(),
            model_blake3: String::new(),
        };
        LedgerReport {
            ledger: compare(side("a", 2.0, 1.0), side("b", 1.0, 1.5), false, None).unwrap(),
            replay_a: None,
            replay_b: None,
            peaks: None,
            notes: vec![],
            gate: None,
        }
    }

    #[test]
    fn opportunities_and_the_gate_in_every_format() {
        // A: projections 2.0 + moe 1.0 = 3.0 ms/token; B: 1.0 + 1.5 = 2.5. A matching B's
        // projections saves 1.0 of 3.0 (3.0 / 2.0 = 1.5x); B matching A's moe saves 0.5 of 2.5
        // (2.5 / 2.0 = 1.25x)
        let mut r = report();
        let t = ledger_text(&r);
        assert!(
            t.contains("opportunities, largest first: projections for A 1.500x (33.3 % of its time) · moe for B 1.250x (20.0 % of its time)"),
            "{t}"
        );
        assert!(!t.contains("gate:"), "{t}");
        let md = ledger_markdown(&r);
        let first_row = md.lines().find(|l| l.starts_with("| proj")).unwrap();
        assert!(first_row.contains("A 1.500x"), "{md}");
        // projections: every cycle of A above every cycle of B, p = 1/252 <= 0.05 / 2 bands
        r.gate = Some(opledger_core::ledger::gate(&r.ledger, 0.05).unwrap());
        let t = ledger_text(&r);
        assert!(t.contains("FAILED in 1 band(s)"), "{t}");
        let line = t
            .lines()
            .find(|l| l.trim_start().starts_with("projections") && l.contains("REGRESSED"));
        assert!(line.is_some_and(|l| l.contains("+100.0 %")), "{t}");
        let csv = ledger_csv(&r).unwrap();
        let lines: Vec<&str> = csv.lines().collect();
        let head: Vec<&str> = lines[0].split(',').collect();
        let col = |name: &str| head.iter().position(|h| *h == name).unwrap();
        let proj: Vec<&str> = lines[1].split(',').collect();
        let moe: Vec<&str> = lines[2].split(',').collect();
        assert_eq!(
            (
                proj[col("opportunity_side")],
                proj[col("opportunity_speedup")],
                proj[col("regressed")]
            ),
            ("a", "1.5", "true")
        );
        assert_eq!(
            (moe[col("opportunity_side")], moe[col("regressed")]),
            ("b", "false")
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["gate"]["rows"][0]["fails"], true);
        assert_eq!(json["ledger"]["rows"][0]["opportunity"]["side"], "a");
    }

    fn replay(reliable: bool) -> ReplayResult {
        let all = if reliable { 1.0 } else { 0.84 };
        let (checks, spread) =
            opledger_core::replay::validate(all, 1.0, &[(1, 5.0), (2, 5.0), (4, 5.0)], 1.0, true);
        ReplayResult {
            k: 4,
            cycles: 3,
            tokens: 512,
            baseline_ms: 100.0,
            baseline_spread_ms: 1.0,
            noise_ms: 1.0,
            scale: 1,
            attempts: 1,
            retaken_after: vec![],
            round_cost_us: Some(12.5),
            round_cost_min_us: 12.0,
            round_cost_max_us: 13.0,
            baseline_work_ms: 98.0,
            bands: vec![],
            skipped: vec![],
            replay_all_ms: 98.0 * all,
            replay_all_over_baseline: all,
            sum_of_bands_ms: 98.0 * all,
            sum_over_replay_all: 1.0,
            sum_reference_ms: 98.0 * all,
            scaling_band: "moe".into(),
            scaling_ms_per_replay: vec![(1, 5.0), (2, 5.0), (4, 5.0)],
            scaling_spread: spread,
            scaling_slope_ms: 5.0,
            scaling_r2: 1.0,
            outputs_identical: true,
            reliable: checks.iter().all(|c| c.pass),
            checks,
            excluded_inplace: vec![],
            excluded_share: 0.0,
        }
    }

    #[test]
    fn a_failed_replay_validation_marks_the_replay_column_unreliable_in_every_format() {
        let mut r = report();
        r.replay_a = Some(replay(true));
        r.replay_b = Some(replay(false));
        let t = ledger_text(&r);
        assert!(t.contains("B replay (unreliable)"), "{t}");
        assert!(!t.contains("A replay (unreliable)"), "{t}");
        assert!(
            t.contains("replay B: UNRELIABLE (replay-all failed)"),
            "{t}"
        );
        assert!(
            t.contains("FAILED: replay all bands, per replay / baseline work: 0.840"),
            "{t}"
        );
        assert!(t.contains("launch per replay round: 12.50 µs"), "{t}");
        let md = ledger_markdown(&r);
        assert!(md.contains("B replay (unreliable)"), "{md}");
        let csv = ledger_csv(&r).unwrap();
        let mut lines = csv.lines();
        let head: Vec<&str> = lines.next().unwrap().split(',').collect();
        let a = head.iter().position(|h| *h == "a_replay_status").unwrap();
        let b = head.iter().position(|h| *h == "b_replay_status").unwrap();
        for line in lines {
            let cells: Vec<&str> = line.split(',').collect();
            assert_eq!((cells[a], cells[b]), ("ok", UNRELIABLE), "{csv}");
        }
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["replay_b"]["reliable"], false);
        assert_eq!(json["replay_a"]["reliable"], true);
        assert_eq!(json["replay_b"]["checks"][0]["name"], "replay-all");
        assert_eq!(json["replay_b"]["checks"][0]["pass"], false);
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
