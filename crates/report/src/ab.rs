//! Renderers of an A/B comparison (`ab.json`): the terminal table of scenarios, the band ledger
//! of where the difference lives and the ablations.

use opledger_core::ab::{AbReport, DiscoverReport, LedgerRow, ScenarioResult, Verdict};
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

/// The control's name: a second process of A (`A2 vs A`), or A's own runs where it ran second
/// against where it ran first (files of version 3 and older, ablations and searches).
pub fn control_name(s: &ScenarioResult) -> &'static str {
    if s.control_ms.is_empty() {
        "A 2nd vs A 1st"
    } else {
        "A2 vs A"
    }
}

/// The output column of a scenario: the gate over every position and the greedy steps where it
/// ran, else the one-row comparison of older files.
pub fn output_words(s: &ScenarioResult) -> String {
    let c = &s.correctness;
    match &s.outputs {
        Some(g) if g.passed && g.bit_identical => format!(
            "same, bit-identical ({} positions, {} steps)",
            g.positions, g.steps
        ),
        Some(g) if g.passed => format!(
            "same (NMSE max {:.1e} at {}, mean {:.1e}; top-1 {}/{}{}{})",
            g.max_nmse,
            g.max_nmse_at.map(|a| a.to_string()).unwrap_or_default(),
            g.mean_nmse,
            g.same_top1,
            g.positions + g.steps,
            if g.near_ties > 0 {
                format!(", {} near ties", g.near_ties)
            } else {
                String::new()
            },
            match g.first_divergent_token {
                Some(t) => format!(", greedy diverges at token {t}"),
                None => String::new(),
            }
        ),
        Some(g) => format!("CHANGED: {}", g.refusal().unwrap_or_default()),
        None if c.passed => format!(
            "same (top-1 {}/{}, rel {:.1e})",
            c.same_top1, c.rows, c.max_rel_error
        ),
        None => format!(
            "CHANGED (top-1 {}/{}, rel {:.1e}, cos {:.5})",
            c.same_top1, c.rows, c.max_rel_error, c.min_cosine
        ),
    }
}

/// A ledger row's B/A interval, control and verdict, where the band was judged over the
/// cycles: `[2.769–2.941] · A2/A 0.956 [0.941–0.971] · slower`.
pub fn band_judgement(l: &LedgerRow) -> (String, String, String) {
    match &l.judged {
        Some(j) if j.ratio_lo.is_finite() => (
            format!("[{:.3}–{:.3}]", j.ratio_lo, j.ratio_hi),
            format!(
                "{:.3} [{:.3}–{:.3}]",
                j.control_ratio, j.control_lo, j.control_hi
            ),
            verdict_name(j.verdict).to_string(),
        ),
        Some(_) => ("–".into(), "–".into(), "A spends nothing here".into()),
        None => ("one run".into(), "–".into(), "–".into()),
    }
}

/// The columns of a scenario's band ledger in md and HTML ([`band_rows`]).
pub const BAND_HEADER: [&str; 8] = [
    "band",
    "A ms/token",
    "B ms/token",
    "gap",
    "B/A",
    "interval",
    "control A2/A",
    "verdict",
];

/// A scenario's band ledger as table rows under [`BAND_HEADER`].
pub fn band_rows(s: &ScenarioResult) -> Vec<Vec<String>> {
    s.ledger
        .iter()
        .map(|l| {
            let (interval, control, verdict) = band_judgement(l);
            vec![
                l.band.clone(),
                format!("{:.4}", l.a_ms_per_token),
                format!("{:.4}", l.b_ms_per_token),
                format!("{:+.4}", l.gap_ms_per_token),
                format!("{:.3}", l.ratio),
                interval,
                control,
                verdict,
            ]
        })
        .collect()
}

/// llama-bench's name of a scenario: `pp512`, `pp512 @ d4096`, `tg16`, `tg16 x4 @ d4096`.
pub fn bench_test_name(w: &Work) -> String {
    let base = if w.is_decode() {
        if w.parallel > 1 {
            format!("tg{} x{}", w.decode_tokens, w.parallel)
        } else {
            format!("tg{}", w.decode_tokens)
        }
    } else {
        format!("pp{}", w.chunk_tokens)
    };
    if w.depth_tokens > 0 {
        format!("{base} @ d{}", w.depth_tokens)
    } else {
        base
    }
}

/// Op groups (and added, removed, changed nodes) shown per scenario in text and markdown.
pub const OP_ROWS: usize = 12;

/// The terminal rendering of an A/B.
pub fn ab_text(r: &AbReport) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "A (baseline): {}\nB (candidate): {}\n", r.a, r.b);
    let control = r
        .scenarios
        .first()
        .map(control_name)
        .unwrap_or("A 2nd vs A 1st");
    let _ = writeln!(
        out,
        "{:<22} {:>10} {:>10} {:>7} {:>17} {:<13} {:>28} output",
        "scenario",
        "A ms",
        "B ms",
        "B/A",
        "95 % interval",
        "verdict",
        format!("control: {control}"),
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
            output_words(s)
        );
    }
    for s in &r.scenarios {
        if s.ledger.is_empty() {
            continue;
        }
        let level = s
            .ledger
            .iter()
            .find_map(|l| l.judged.as_ref().map(|j| j.level));
        let _ = writeln!(
            out,
            "\nwhere the difference lives ({}), sorted by gap{}:",
            scenario_label(&s.work),
            match level {
                Some(l) => format!(
                    ", each band over {} cycles at {:.1} % (Bonferroni over the bands)",
                    s.a_ms.len(),
                    l * 100.0
                ),
                None => " (one TIMED run per side)".into(),
            }
        );
        let _ = writeln!(
            out,
            "  {:<18} {:>12} {:>12} {:>12} {:>8} {:>17} {:>24} verdict",
            "band", "A ms/token", "B ms/token", "gap", "B/A", "interval", "control A2/A"
        );
        for row in &s.ledger {
            let (interval, control, verdict) = band_judgement(row);
            let _ = writeln!(
                out,
                "  {:<18} {:>12.4} {:>12.4} {:>+12.4} {:>8.3} {:>17} {:>24} {}",
                row.band,
                row.a_ms_per_token,
                row.b_ms_per_token,
                row.gap_ms_per_token,
                row.ratio,
                interval,
                control,
                verdict
            );
        }
    }
    for s in &r.scenarios {
        if let Some(d) = &s.op_diff {
            let _ = writeln!(
                out,
                "\nops ({}), matched between the graphs, sorted by gap:",
                scenario_label(&s.work)
            );
            out.push_str(&crate::opdiff::op_diff_text(d, OP_ROWS));
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
        "\nthresholds: {}; noise gate rejected and retook {noise} runs",
        thresholds_words(r)
    );
    let _ = writeln!(out, "verdict: {}", r.verdict.words());
    out
}

/// How the verdicts were reached, in words.
pub fn thresholds_words(r: &AbReport) -> String {
    let e = r.config.min_effect * 100.0;
    let process = r.scenarios.iter().any(|s| !s.control_ms.is_empty());
    if process {
        format!("faster/slower when the whole interval of B/A lies beyond ±{e:.0} % and beyond the control's interval (a second process of A, A2/A, by the same estimator over the same cycles), no change when it lies within ±{e:.0} %, within noise otherwise; inconclusive when the control moved (its whole interval beyond ±{e:.0} %); a band's intervals at the Bonferroni-corrected level of all the bands")
    } else {
        format!("faster/slower when the whole 95 % interval of B/A lies beyond ±{e:.0} % and beyond the noise the control shows (A against itself, its interval scaled from half the runs to all of them), no change when it lies within ±{e:.0} %, within noise otherwise; inconclusive when the control moved (its whole interval beyond ±{e:.0} %)")
    }
}

/// compare-llama-bench's table of an A/B: model, test, t/s of each side, the speedup (A's
/// median wall over B's) with its interval and the verdict.
pub fn compare_bench_markdown(model: &str, r: &AbReport) -> String {
    use crate::table::{markdown_table, Align};
    let med = |v: &[f64]| opledger_core::stats::median(v).unwrap_or(f64::NAN);
    let tps = |ms: f64, w: &Work| w.tokens_per_run() as f64 / (ms / 1e3);
    let rows: Vec<Vec<String>> = r
        .scenarios
        .iter()
        .map(|s| {
            vec![
                model.to_string(),
                bench_test_name(&s.work),
                format!("{:.2}", tps(med(&s.a_ms), &s.work)),
                format!("{:.2}", tps(med(&s.b_ms), &s.work)),
                format!("{:.2}", 1.0 / s.ratio),
                format!("[{:.2}–{:.2}]", 1.0 / s.ratio_hi, 1.0 / s.ratio_lo),
                verdict_name(s.verdict).to_string(),
            ]
        })
        .collect();
    markdown_table(
        &[
            "model",
            "test",
            "t/s A",
            "t/s B",
            "speedup",
            "95 % interval",
            "verdict",
        ],
        &[
            Align::Left,
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Left,
        ],
        &rows,
    )
}

/// The markdown rendering, ready for a pull request's description: compare-llama-bench's table
/// ([`compare_bench_markdown`]), the scenarios with their control and output gate, each
/// scenario's band ledger with intervals and verdicts, the ablations and the verdict.
pub fn ab_markdown(model: &str, r: &AbReport) -> String {
    use crate::table::{markdown_table, Align};
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## A/B: {} against {}\n\nA (baseline): {} · B (candidate): {}\n",
        r.b, r.a, r.a, r.b
    );
    let _ = writeln!(out, "{}\n", compare_bench_markdown(model, r));
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
                output_words(s),
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
                "control",
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
        if s.ledger.is_empty() {
            continue;
        }
        let rows = band_rows(s);
        let _ = writeln!(
            out,
            "where the difference lives ({}), sorted by gap:\n\n{}\n",
            scenario_label(&s.work),
            markdown_table(
                &BAND_HEADER,
                &[
                    Align::Left,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Right,
                    Align::Left
                ],
                &rows
            )
        );
    }
    for s in &r.scenarios {
        if let Some(d) = &s.op_diff {
            let _ = writeln!(
                out,
                "ops ({}), matched between the graphs, the largest gaps:\n\n{}\n",
                scenario_label(&s.work),
                crate::opdiff::op_diff_markdown(d, OP_ROWS)
            );
        }
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
    let _ = writeln!(out, "\n{}.\n", thresholds_words(r));
    let _ = writeln!(out, "**verdict: {}**", r.verdict.words());
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
        let detail = match &s.outputs {
            Some(g) => format!(
                "{}: every one of {} positions and {} greedy steps, NMSE at most {:.1e} (bound {:.1e}), top-1 the same in {}/{} rows ({} near ties within {} logits){}",
                if g.passed { "same output" } else { "the output CHANGED" },
                g.positions,
                g.steps,
                g.max_nmse,
                g.config.max_nmse,
                g.same_top1,
                g.positions + g.steps,
                g.near_ties,
                g.config.near_tie,
                match g.refusal() {
                    Some(why) => format!("; {why}"),
                    None if g.bit_identical => "; bit-identical".into(),
                    None => String::new(),
                }
            ),
            None => format!(
                "{}: top-1 token the same in {}/{} rows, largest relative logit difference {:.1e} (tolerance {:.1e}), lowest cosine {:.5}",
                if c.passed { "same output" } else { "the output CHANGED" },
                c.same_top1,
                c.rows,
                c.max_rel_error,
                r.config.tolerance.max_rel_error,
                c.min_cosine
            ),
        };
        out.push(Check {
            name: format!("output · {}", scenario_label(&s.work)),
            status: if c.passed {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail,
        });
    }
    for s in &r.scenarios {
        let process = !s.control_ms.is_empty();
        // a second process's interval is the noise itself; A's halves are scaled to all runs
        let (n_lo, n_hi) = if process {
            (s.control_lo, s.control_hi)
        } else {
            Verdict::noise_bounds(s.control_lo, s.control_hi)
        };
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
                "{}: {:.3} [{:.3}–{:.3}], {}: {}",
                if process {
                    "A against a second process of A"
                } else {
                    "A against itself (where it ran second in a pair against where it ran first)"
                },
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
                outputs: None,
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
                control_ms: Vec::new(),
                outputs: None,
                op_diff: None,
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
