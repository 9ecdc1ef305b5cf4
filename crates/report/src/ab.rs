//! Renderers of an A/B comparison (`ab.json`): the terminal table of scenarios, the band ledger
//! of where the difference lives and the ablations.

use opledger_core::ab::{AbReport, DiscoverReport, Verdict};
use opledger_core::engine::Work;
use opledger_core::noise::GateStats;
use opledger_core::profile::{noise_check, Check, CheckStatus};

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
        "scenario", "A ms", "B ms", "B/A", "95 % interval", "verdict", "control: A 2nd vs A 1st",
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
        "\nthresholds: faster/slower when the whole 95 % interval of B/A lies beyond ±{e:.0} % and beyond the noise the control shows (A against itself, its interval scaled from half the runs to all of them), no change when it lies within ±{e:.0} %, within noise otherwise; inconclusive when the control moved (its whole interval beyond ±{e:.0} %); noise gate rejected and retook {noise} runs",
        e = r.config.min_effect * 100.0
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

/// The checks of an A/B: the correctness gate and the control of every scenario, the noise gate.
pub fn ab_checks(r: &AbReport) -> Vec<Check> {
    let mut out = Vec::new();
    for s in &r.scenarios {
        let c = &s.correctness;
        out.push(Check {
            name: format!("output · {}", scenario_label(&s.work)),
            status: if c.passed {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: format!(
                "{}: top-1 token the same in {}/{} rows, largest relative logit difference {:.1e} (tolerance {:.1e}), lowest cosine {:.5}",
                if c.passed { "same output" } else { "the output CHANGED" },
                c.same_top1,
                c.rows,
                c.max_rel_error,
                r.config.tolerance.max_rel_error,
                c.min_cosine
            ),
        });
    }
    for s in &r.scenarios {
        let (n_lo, n_hi) = Verdict::noise_bounds(s.control_lo, s.control_hi);
        out.push(Check {
            name: format!("control · {}", scenario_label(&s.work)),
            // a control that moved makes the scenario inconclusive (Verdict::of_scenario); one
            // wider than the threshold sets the smallest effect a verdict may claim
            status: if s.control_verdict.moved() {
                CheckStatus::Fail
            } else if s.control_verdict == Verdict::NoChange {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "A against itself (where it ran second in a pair against where it ran first): {:.3} [{:.3}–{:.3}], {}: {}",
                s.control_ratio,
                s.control_lo,
                s.control_hi,
                verdict_name(s.control_verdict),
                if s.control_verdict.moved() {
                    format!(
                        "moved beyond ±{:.0} %, so the scenario is inconclusive",
                        r.config.min_effect * 100.0
                    )
                } else if s.control_verdict == Verdict::NoChange {
                    format!(
                        "within ±{:.0} %, the threshold decides",
                        r.config.min_effect * 100.0
                    )
                } else {
                    format!(
                        "noisier than ±{:.0} %: a verdict needs B/A beyond [{n_lo:.3}–{n_hi:.3}]",
                        r.config.min_effect * 100.0
                    )
                }
            ),
        });
    }
    // every scenario's gate together: runs summed, the busiest kept run over all of them
    let gate = GateStats {
        rejected: r.scenarios.iter().map(|s| s.gate.rejected).sum(),
        kept_noisy: r.scenarios.iter().map(|s| s.gate.kept_noisy).sum(),
        max_busiest_kept: r
            .scenarios
            .iter()
            .map(|s| s.gate.max_busiest_kept)
            .fold(0.0, f64::max),
        max_others_kept: r
            .scenarios
            .iter()
            .map(|s| s.gate.max_others_kept)
            .fold(0.0, f64::max),
        ..GateStats::default()
    };
    out.push(noise_check(&gate, &r.config.gate));
    out
}

#[cfg(test)]
mod tests {
    use opledger_core::ab::{AbConfig, Correctness, Knobs, Outcome, ScenarioResult};
    use opledger_core::noise::GateConfig;

    use super::*;

    fn report(passed: bool, control: Verdict, kept_noisy: u32) -> AbReport {
        let work = Work::prefill(64, 0);
        AbReport {
            schema_version: opledger_core::ab::AB_SCHEMA_VERSION,
            a: Knobs::default(),
            b: Knobs::default(),
            config: AbConfig {
                scenarios: vec![work.clone()],
                pairs: 4,
                gate: GateConfig::default(),
                tolerance: Default::default(),
                min_effect: 0.02,
                resamples: 100,
                seed: 1,
            },
            scenarios: vec![ScenarioResult {
                work,
                a_ms: vec![10.0; 4],
                b_ms: vec![9.0; 4],
                ratio: 0.9,
                ratio_lo: 0.89,
                ratio_hi: 0.91,
                verdict: Verdict::Faster,
                control_ratio: 1.0,
                control_lo: 0.99,
                control_hi: 1.01,
                control_verdict: control,
                correctness: Correctness {
                    rows: 1,
                    same_top1: u32::from(passed),
                    max_rel_error: 1e-3,
                    min_cosine: 0.9999,
                    passed,
                },
                ledger: Vec::new(),
                gate: GateStats {
                    kept_noisy,
                    ..GateStats::default()
                },
            }],
            ablations: Vec::new(),
            verdict: Outcome::Faster,
        }
    }

    fn statuses(r: &AbReport) -> Vec<(String, CheckStatus)> {
        ab_checks(r)
            .into_iter()
            .map(|c| (c.name, c.status))
            .collect()
    }

    #[test]
    fn a_clean_ab_passes_output_control_and_noise() {
        let s = statuses(&report(true, Verdict::NoChange, 0));
        let names: Vec<&str> = s.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["output · prefill 64 @0", "control · prefill 64 @0", "noise"],
            "one output and one control check per scenario, then the noise gate"
        );
        assert!(s.iter().all(|(_, st)| *st == CheckStatus::Pass));
    }

    #[test]
    fn a_noisy_control_that_did_not_move_warns_and_names_the_bound() {
        let mut r = report(true, Verdict::WithinNoise, 0);
        r.scenarios[0].control_lo = 0.827;
        r.scenarios[0].control_hi = 1.467;
        let checks = ab_checks(&r);
        assert_eq!(checks[1].status, CheckStatus::Warn);
        assert!(
            checks[1]
                .detail
                .ends_with("a verdict needs B/A beyond [0.874–1.311]"),
            "{}",
            checks[1].detail
        );
    }

    #[test]
    fn a_changed_output_or_a_moving_control_fails_and_noise_warns() {
        let s = statuses(&report(false, Verdict::Slower, 1));
        let st: Vec<CheckStatus> = s.iter().map(|(_, st)| *st).collect();
        assert_eq!(
            st,
            [CheckStatus::Fail, CheckStatus::Fail, CheckStatus::Warn]
        );
        let detail = &ab_checks(&report(false, Verdict::NoChange, 0))[0].detail;
        assert!(detail.starts_with("the output CHANGED"), "{detail}");
    }
}
