//! Renderers of an A/B comparison (`ab.json`): the terminal table of scenarios, the band ledger
//! of where the difference lives and the ablations.

use opledger_core::ab::{AbReport, DiscoverReport, Verdict};
use opledger_core::engine::Work;

/// The words of a verdict.
pub fn verdict_name(v: Verdict) -> &'static str {
    match v {
        Verdict::Faster => "faster",
        Verdict::Slower => "slower",
        Verdict::NoChange => "no change",
        Verdict::WithinNoise => "within noise",
        Verdict::Inconclusive => "inconclusive",
    }
}

/// `prefill 512 @0`, `decode 32x4 @4096`.
pub fn scenario_label(w: &Work) -> String {
    if w.is_decode() {
        format!(
            "decode {}x{} @{}",
            w.decode_tokens, w.parallel, w.depth_tokens
        )
    } else {
        format!("prefill {} @{}", w.chunk_tokens, w.depth_tokens)
    }
}

/// The terminal rendering of an A/B.
pub fn ab_text(r: &AbReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "A (baseline): {}\nB (candidate): {}\n", r.a, r.b);
    let _ = writeln!(
        out,
        "{:<22} {:>10} {:>10} {:>7} {:>17} {:<13} {:>28} output",
        "scenario", "A ms", "B ms", "B/A", "95 % interval", "verdict", "control: A vs A (halves)",
    );
    let med = |v: &[f64]| opledger_core::stats::median(v).unwrap_or(0.0);
    for s in &r.scenarios {
        let _ = writeln!(
            out,
            "{:<22} {:>10.2} {:>10.2} {:>7.3} {:>17} {:<13} {:>28} {}",
            scenario_label(&s.work),
            med(&s.a_ms),
            med(&s.b_ms),
            s.ratio,
            format!("[{:.3}–{:.3}]", s.ratio_lo, s.ratio_hi),
            verdict_name(s.verdict),
            format!(
                "{:.3} [{:.3}–{:.3}] {}",
                s.control_ratio,
                s.control_lo,
                s.control_hi,
                verdict_name(s.control_verdict)
            ),
            if s.correctness.passed {
                format!(
                    "same (top-1 {}/{}, rel {:.1e})",
                    s.correctness.same_top1, s.correctness.rows, s.correctness.max_rel_error
                )
            } else {
                format!(
                    "CHANGED (top-1 {}/{}, rel {:.1e}, cos {:.5})",
                    s.correctness.same_top1,
                    s.correctness.rows,
                    s.correctness.max_rel_error,
                    s.correctness.min_cosine
                )
            }
        );
    }
    if let Some(s) = r.scenarios.first() {
        let _ = writeln!(
            out,
            "\nwhere the difference lives ({}), sorted by gap:",
            scenario_label(&s.work)
        );
        let _ = writeln!(
            out,
            "  {:<18} {:>12} {:>12} {:>12} {:>8}",
            "band", "A ms/token", "B ms/token", "gap", "B/A"
        );
        for row in &s.ledger {
            let _ = writeln!(
                out,
                "  {:<18} {:>12.4} {:>12.4} {:>+12.4} {:>8.3}",
                row.band, row.a_ms_per_token, row.b_ms_per_token, row.gap_ms_per_token, row.ratio
            );
        }
    }
    if !r.ablations.is_empty() {
        let _ = writeln!(
            out,
            "\nablations (B with one change turned back off, against A, first scenario):"
        );
        for a in &r.ablations {
            let _ = writeln!(
                out,
                "  without {:<12} ({}) B/A {:.3} [{:.3}–{:.3}] {}{}{}",
                a.reverted,
                a.knobs,
                a.ratio,
                a.ratio_lo,
                a.ratio_hi,
                verdict_name(a.verdict),
                share_text(a.share_of_gain),
                if a.correct { "" } else { ", output CHANGED" }
            );
        }
    }
    let noise: u32 = r.scenarios.iter().map(|s| s.gate.rejected).sum();
    let _ = writeln!(
        out,
        "\nthresholds: faster/slower when the whole 95 % interval of B/A lies beyond ±{:.0} %, no change when it lies within; inconclusive when the control (A against itself) does not lie within; noise gate rejected and retook {noise} runs",
        r.config.min_effect * 100.0
    );
    let _ = writeln!(out, "verdict: {}", r.verdict.words());
    out
}

/// The markdown rendering (after the per-scenario table of [`crate::bench`]): ratios with their
/// intervals and the control, the band ledger of each scenario, the ablations and the verdict.
pub fn ab_markdown(r: &AbReport) -> String {
    use crate::table::{markdown_table, Align};
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## A/B: {} against {}\n\nA (baseline): {} · B (candidate): {}\n",
        r.b, r.a, r.a, r.b
    );
    let rows: Vec<Vec<String>> = r
        .scenarios
        .iter()
        .map(|s| {
            vec![
                scenario_label(&s.work),
                format!("{:.3}", s.ratio),
                format!("[{:.3}–{:.3}]", s.ratio_lo, s.ratio_hi),
                verdict_name(s.verdict).to_string(),
                format!(
                    "{:.3} [{:.3}–{:.3}] {}",
                    s.control_ratio,
                    s.control_lo,
                    s.control_hi,
                    verdict_name(s.control_verdict)
                ),
                if s.correctness.passed {
                    "same".to_string()
                } else {
                    "CHANGED".to_string()
                },
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "{}\n",
        markdown_table(
            &[
                "scenario",
                "B/A",
                "95 % interval",
                "verdict",
                "control (A vs A)",
                "output"
            ],
            &[
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Left,
                Align::Left,
                Align::Left
            ],
            &rows
        )
    );
    for s in &r.scenarios {
        let rows: Vec<Vec<String>> = s
            .ledger
            .iter()
            .map(|l| {
                vec![
                    l.band.clone(),
                    format!("{:.4}", l.a_ms_per_token),
                    format!("{:.4}", l.b_ms_per_token),
                    format!("{:+.4}", l.gap_ms_per_token),
                    format!("{:.3}", l.ratio),
                ]
            })
            .collect();
        let _ = writeln!(
            out,
            "where the difference lives ({}), sorted by gap:\n\n{}\n",
            scenario_label(&s.work),
            markdown_table(
                &["band", "A ms/token", "B ms/token", "gap", "B/A"],
                &[
                    Align::Left,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right
                ],
                &rows
            )
        );
    }
    for a in &r.ablations {
        let _ = writeln!(
            out,
            "- without {} ({}): B/A {:.3} [{:.3}–{:.3}] {}{}{}",
            a.reverted,
            a.knobs,
            a.ratio,
            a.ratio_lo,
            a.ratio_hi,
            verdict_name(a.verdict),
            share_text(a.share_of_gain),
            if a.correct { "" } else { ", output CHANGED" }
        );
    }
    let _ = writeln!(out, "\n**verdict: {}**", r.verdict.words());
    out
}

/// ", carries 75 % of the gain" (the share turning the knob back alone loses).
fn share_text(share: Option<f64>) -> String {
    share
        .map(|s| format!(", carries {:.0} % of the gain", s * 100.0))
        .unwrap_or_default()
}

/// The terminal rendering of a `discover` search: the candidates fastest first, then the
/// confirmation of the winner.
pub fn discover_text(r: &DiscoverReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "candidates against the baseline ({}), fastest first:",
        r.baseline
    );
    for c in &r.candidates {
        let _ = writeln!(
            out,
            "  {:<48} B/A {:.3} [{:.3}–{:.3}]{}",
            c.knobs.to_string(),
            c.ratio,
            c.ratio_lo,
            c.ratio_hi,
            if c.correct {
                ""
            } else {
                "  refused: output changed"
            }
        );
    }
    match &r.confirmation {
        Some(ab) => {
            let _ = writeln!(out, "\nconfirmation of the winner:\n{}", ab_text(ab));
        }
        None => {
            let _ = writeln!(
                out,
                "\nno candidate was faster than the baseline and correct"
            );
        }
    }
    out
}
