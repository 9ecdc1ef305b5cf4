//! The HTML page and chart of an A/B.

use std::fmt::Write as _;

use opledger_core::ab::{AbReport, Outcome};

use super::layout::{checks_section, figure, page, table, text_rows};
use super::manifest::manifest_section;
use crate::ab::{ab_checks, scenario_label, verdict_name};
use crate::palette::{SIDE_A, SIDE_B};
use crate::svg::{bar_chart_svg, esc, Bar, BarChart, BarRow, Panel};
use crate::view::AbView;

pub(super) fn ab_chart(v: &AbView) -> BarChart {
    let r = v.report;
    let order = v.manifest.band_rules.band_names();
    BarChart {
        title: format!(
            "Where the difference lives: B ({}) against A ({})",
            r.b, r.a
        ),
        unit: "ms per token by band".into(),
        legend: vec![
            (format!("A: {}", r.a), SIDE_A.into()),
            (format!("B: {}", r.b), SIDE_B.into()),
        ],
        panels: r
            .scenarios
            .iter()
            .map(|s| {
                let mut ledger: Vec<&opledger_core::ab::LedgerRow> = s.ledger.iter().collect();
                ledger.sort_by_key(|l| {
                    order
                        .iter()
                        .position(|o| *o == l.band)
                        .unwrap_or(order.len())
                });
                Panel {
                    title: Some(format!(
                        "{} · B/A {:.3} [{:.3}–{:.3}] {}",
                        scenario_label(&s.work),
                        s.ratio,
                        s.ratio_lo,
                        s.ratio_hi,
                        verdict_name(s.verdict)
                    )),
                    rows: ledger
                        .iter()
                        .map(|l| BarRow {
                            label: l.band.clone(),
                            bars: vec![
                                Bar {
                                    value: l.a_ms_per_token,
                                    colour: SIDE_A.into(),
                                    range: None,
                                },
                                Bar {
                                    value: l.b_ms_per_token,
                                    colour: SIDE_B.into(),
                                    range: None,
                                },
                            ],
                            note: format!(
                                "gap {:+.4} ms{}{}",
                                l.gap_ms_per_token,
                                if l.ratio.is_finite() {
                                    format!(" · B/A {:.3}", l.ratio)
                                } else {
                                    String::new()
                                },
                                match &l.judged {
                                    Some(j) if j.ratio_lo.is_finite() => format!(
                                        " [{:.3}–{:.3}] {}",
                                        j.ratio_lo,
                                        j.ratio_hi,
                                        verdict_name(j.verdict)
                                    ),
                                    _ => String::new(),
                                }
                            ),
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

pub(super) fn ab_html(v: &AbView) -> String {
    let m = v.manifest;
    let r = v.report;
    let mut body = String::new();
    let verdict_class = match r.verdict {
        Outcome::Refused | Outcome::Inconclusive => "fail",
        Outcome::Slower => "warn",
        Outcome::Faster | Outcome::FasterInSome | Outcome::NoChange => "pass",
    };
    let _ = writeln!(
        body,
        "<p class=\"headline banner {verdict_class}\">verdict: {}</p>",
        esc(r.verdict.words())
    );
    checks_section(&mut body, "Cross-checks", &ab_checks(v.report));
    figure(
        &mut body,
        "chart",
        "Ledger by band",
        &bar_chart_svg(&ab_chart(v)),
        "ms per token by band for A and B in every scenario, with the gap (B - A)",
    );
    scenarios_section(&mut body, r);
    manifest_section(&mut body, m);
    page(
        &format!("opledger A/B · {}", m.model_label()),
        &format!("A/B on {}", m.model_label()),
        &[
            format!("A (baseline): {} · B (candidate): {}", r.a, r.b),
            format!(
                "{} · {} · {} {} · {}",
                m.model_label(),
                m.model.arch.arch,
                m.engine.engine,
                m.engine.version,
                m.engine.backend
            ),
        ],
        &body,
    )
}

/// Every scenario's band ledger with its intervals, control and verdicts.
fn band_tables(body: &mut String, r: &AbReport) {
    for s in &r.scenarios {
        if s.ledger.is_empty() {
            continue;
        }
        let _ = writeln!(
            body,
            "<h3>Where the difference lives · {}</h3>",
            esc(&scenario_label(&s.work))
        );
        let rows = crate::ab::band_rows(s);
        table(
            body,
            &crate::ab::BAND_HEADER,
            &[false, true, true, true, true, true, true, false],
            &text_rows(rows),
        );
    }
}

/// Every scenario's walls, ratio and verdict, its control and output, then the ablations.
fn scenarios_section(body: &mut String, r: &AbReport) {
    body.push_str("<section id=\"scenarios\"><h2>Scenarios</h2>\n");
    let med = |x: &[f64]| opledger_core::stats::median(x).unwrap_or(f64::NAN);
    let rows: Vec<Vec<String>> = r
        .scenarios
        .iter()
        .map(|s| {
            vec![
                scenario_label(&s.work),
                format!("{:.2}", med(&s.a_ms)),
                format!("{:.2}", med(&s.b_ms)),
                format!("{:.3}", s.ratio),
                format!("[{:.3}–{:.3}]", s.ratio_lo, s.ratio_hi),
                verdict_name(s.verdict).into(),
                format!(
                    "{:.3} [{:.3}–{:.3}] {}",
                    s.control_ratio,
                    s.control_lo,
                    s.control_hi,
                    verdict_name(s.control_verdict)
                ),
                crate::ab::output_words(s),
            ]
        })
        .collect();
    table(
        body,
        &[
            "scenario",
            "A ms",
            "B ms",
            "B/A",
            "95 % interval",
            "verdict",
            &format!(
                "control: {}",
                r.scenarios
                    .first()
                    .map(crate::ab::control_name)
                    .unwrap_or("A 2nd vs A 1st")
            ),
            "output",
        ],
        &[false, true, true, true, true, false, false, false],
        &text_rows(rows),
    );
    let _ = writeln!(
        body,
        "<p>{} interleaved cycles a scenario; {}.</p>",
        r.config.pairs,
        esc(&crate::ab::thresholds_words(r))
    );
    band_tables(body, r);
    for s in &r.scenarios {
        if let Some(d) = &s.op_diff {
            let _ = writeln!(body, "<h3>Ops · {}</h3>", esc(&scenario_label(&s.work)));
            body.push_str(&super::opdiff::op_diff_html(d, 40));
        }
    }
    ablations_table(body, r);
    body.push_str("</section>\n");
}

/// B with one change turned back, against A, on the first scenario.
fn ablations_table(body: &mut String, r: &AbReport) {
    if r.ablations.is_empty() {
        return;
    }
    body.push_str("<h3>Ablations: B with one change turned back, against A, first scenario</h3>\n");
    let rows: Vec<Vec<String>> = r
        .ablations
        .iter()
        .map(|a| {
            vec![
                a.reverted.clone(),
                a.knobs.to_string(),
                format!("{:.3}", a.ratio),
                format!("[{:.3}–{:.3}]", a.ratio_lo, a.ratio_hi),
                verdict_name(a.verdict).into(),
                if a.correct { "same" } else { "CHANGED" }.into(),
            ]
        })
        .collect();
    table(
        body,
        &[
            "without",
            "knobs",
            "B/A",
            "95 % interval",
            "verdict",
            "output",
        ],
        &[false, false, true, true, false, false],
        &text_rows(rows),
    );
}
