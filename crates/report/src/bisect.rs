//! Renderers of a bisect (`bisect.json`): the ends, one row per step (candidate, build and
//! measurement time, mid/good and mid/bad with their intervals, decision), what was found, and
//! the first bad commit's band table and op diff against its parent.

use opledger_core::bisect::{BisectReport, Decision, Found, Step};

use crate::ab::{band_rows, output_words, verdict_name, BAND_HEADER, OP_ROWS};
use crate::table::{markdown_cell, markdown_table, text_table, Align};

/// The columns of the steps' table.
pub const STEP_HEADER: [&str; 8] = [
    "step",
    "candidate",
    "build s",
    "measure s",
    "cycles",
    "mid/good",
    "mid/bad",
    "decision",
];

const STEP_ALIGN: [Align; 8] = [
    Align::Right,
    Align::Left,
    Align::Right,
    Align::Right,
    Align::Right,
    Align::Left,
    Align::Left,
    Align::Left,
];

fn interval(i: &Option<opledger_core::bisect::Interval>) -> String {
    i.map(|i| i.to_string()).unwrap_or_else(|| "–".into())
}

/// A step's decision in words: skipped with why.
pub fn decision_words(s: &Step) -> String {
    match (&s.decision, &s.skipped_because) {
        (Decision::Skipped, Some(why)) => format!("skipped: {why}"),
        (d, _) => d.name().to_string(),
    }
}

/// One row per step under [`STEP_HEADER`].
pub fn step_rows(r: &BisectReport) -> Vec<Vec<String>> {
    r.steps
        .iter()
        .map(|s| {
            vec![
                s.number.to_string(),
                s.label.clone(),
                format!("{:.0}", s.build_seconds),
                format!("{:.0}", s.measure_seconds),
                s.cycles.to_string(),
                interval(&s.mid_good),
                interval(&s.mid_bad),
                decision_words(s),
            ]
        })
        .collect()
}

/// What the search found, in one sentence.
pub fn found_words(r: &BisectReport) -> String {
    let label = |i: usize| {
        r.candidates
            .get(i)
            .map(|c| c.label.clone())
            .unwrap_or_else(|| format!("candidate {i}"))
    };
    match &r.found {
        Found::Refused { why } => format!("refused: {why}"),
        Found::FirstBad { index } => format!("first bad: {}", label(*index)),
        Found::Range { good, bad, why } => format!(
            "the first bad lies after {} and at or before {} ({} candidates): {why}",
            label(*good),
            label(*bad),
            bad - good
        ),
    }
}

fn head(r: &BisectReport) -> Vec<String> {
    let n = r.candidates.len();
    let mut lines = vec![format!(
        "bisect of {} over {} candidates: {} (good) .. {} (bad), {} tokens a run",
        r.config.target,
        n,
        r.candidates
            .first()
            .map(|c| c.label.as_str())
            .unwrap_or("?"),
        r.candidates.last().map(|c| c.label.as_str()).unwrap_or("?"),
        r.config.work.tokens_per_run()
    )];
    lines.push(format!(
        "the ends over {} cycles (bad/good against a second process of good, each interval at 97.5 %):",
        r.ends.cycles
    ));
    for f in [&r.ends.target, &r.ends.total] {
        lines.push(format!(
            "  {}: bad/good {} control {} ({:.4} -> {:.4} ms/token): {}",
            f.what,
            f.bad_good,
            f.control,
            f.good_ms_per_token,
            f.bad_ms_per_token,
            verdict_name(f.verdict)
        ));
    }
    lines
}

fn time_line(r: &BisectReport) -> String {
    format!(
        "time: {:.0} s in all; builds {:.0} s, measurement {:.0} s; {} steps, {} measured",
        r.wall.total_seconds,
        r.wall.build_seconds,
        r.wall.measure_seconds,
        r.steps.len(),
        r.measured_steps()
    )
}

fn first_bad_lines(r: &BisectReport) -> Vec<String> {
    let Some(fb) = &r.first_bad else {
        return Vec::new();
    };
    let label = |i: usize| r.candidates[i].label.clone();
    let mut lines = Vec::new();
    if let Some(s) = &fb.described.subject {
        lines.push(format!("subject: {s}"));
    }
    if !fb.described.files.is_empty() {
        lines.push(format!("files touched: {}", fb.described.files.join(", ")));
    }
    let s = &fb.scenario;
    lines.push(format!(
        "against its parent {}: total B/A {:.3} [{:.3}–{:.3}] {}; {}",
        label(fb.parent),
        s.ratio,
        s.ratio_lo,
        s.ratio_hi,
        verdict_name(s.verdict),
        output_words(s)
    ));
    lines
}

/// The terminal table.
pub fn bisect_text(r: &BisectReport) -> String {
    let mut out = head(r).join("\n");
    out.push_str("\n\n");
    if !r.steps.is_empty() {
        out.push_str(&text_table(&STEP_HEADER, &STEP_ALIGN, &step_rows(r)));
        out.push_str("\n\n");
        for s in r.steps.iter().filter(|s| !s.build_log_tail.is_empty()) {
            out.push_str(&format!(
                "step {} ({}): the build's last lines:\n",
                s.number, s.label
            ));
            for l in &s.build_log_tail {
                out.push_str(&format!("  {l}\n"));
            }
            out.push('\n');
        }
    }
    out.push_str(&found_words(r));
    out.push('\n');
    for l in first_bad_lines(r) {
        out.push_str(&format!("  {l}\n"));
    }
    if let Some(fb) = &r.first_bad {
        let align = [Align::Left]
            .into_iter()
            .chain([Align::Right; 4])
            .chain([Align::Left; 3])
            .collect::<Vec<_>>();
        out.push('\n');
        out.push_str(&text_table(&BAND_HEADER, &align, &band_rows(&fb.scenario)));
        out.push('\n');
        if let Some(d) = &fb.scenario.op_diff {
            out.push('\n');
            out.push_str(&crate::opdiff::op_diff_text(d, OP_ROWS));
        }
    }
    out.push_str(&time_line(r));
    out.push('\n');
    out
}

/// The markdown summary.
pub fn bisect_markdown(r: &BisectReport) -> String {
    let mut out = String::from("## bisect\n\n");
    for l in head(r) {
        out.push_str(&format!("{}\n", markdown_cell(&l)));
    }
    out.push('\n');
    if !r.steps.is_empty() {
        let rows: Vec<Vec<String>> = step_rows(r)
            .into_iter()
            .map(|row| row.iter().map(|c| markdown_cell(c)).collect())
            .collect();
        out.push_str(&markdown_table(&STEP_HEADER, &STEP_ALIGN, &rows));
        out.push_str("\n\n");
    }
    out.push_str(&format!("**{}**\n\n", markdown_cell(&found_words(r))));
    for l in first_bad_lines(r) {
        out.push_str(&format!("- {}\n", markdown_cell(&l)));
    }
    if let Some(fb) = &r.first_bad {
        let align = [Align::Left]
            .into_iter()
            .chain([Align::Right; 4])
            .chain([Align::Left; 3])
            .collect::<Vec<_>>();
        out.push('\n');
        out.push_str(&markdown_table(
            &BAND_HEADER,
            &align,
            &band_rows(&fb.scenario),
        ));
        out.push('\n');
        if let Some(d) = &fb.scenario.op_diff {
            out.push('\n');
            out.push_str(&crate::opdiff::op_diff_markdown(d, OP_ROWS));
        }
    }
    out.push_str(&format!("\n{}\n", time_line(r)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_core::ab::Verdict;
    use opledger_core::bisect::{
        BisectConfig, Candidate, Ends, EndsFigure, Interval, Target, WallTime,
        BISECT_SCHEMA_VERSION,
    };

    fn figure(what: &str, ratio: f64, verdict: Verdict) -> EndsFigure {
        EndsFigure {
            what: what.into(),
            good_ms_per_token: 1.0,
            bad_ms_per_token: ratio,
            bad_good: Interval {
                ratio,
                lo: ratio * 0.9,
                hi: ratio * 1.1,
            },
            control: Interval {
                ratio: 1.0,
                lo: 0.98,
                hi: 1.02,
            },
            verdict,
            good_cycles: vec![],
            bad_cycles: vec![],
            control_cycles: vec![],
        }
    }

    fn step(number: u32, index: usize, decision: Decision) -> Step {
        let measured = decision != Decision::Skipped;
        Step {
            schema_version: BISECT_SCHEMA_VERSION,
            number,
            index,
            id: format!("c{index}"),
            label: format!("c{index} subject | with a bar"),
            decision,
            skipped_because: (!measured).then(|| "it does not build".into()),
            build_log_tail: if measured {
                vec![]
            } else {
                vec!["ops.cpp:1:1: error: expected unqualified-id".into()]
            },
            build_seconds: 12.4,
            measure_seconds: if measured { 3.0 } else { 0.0 },
            cycles: if measured { 6 } else { 0 },
            mid_good: measured.then_some(Interval {
                ratio: 1.01,
                lo: 0.95,
                hi: 1.08,
            }),
            mid_bad: measured.then_some(Interval {
                ratio: 0.1,
                lo: 0.09,
                hi: 0.11,
            }),
            level: 0.975,
            bound: 3.0,
            good_cycles: vec![],
            mid_cycles: vec![],
            bad_cycles: vec![],
        }
    }

    fn report() -> BisectReport {
        BisectReport {
            schema_version: BISECT_SCHEMA_VERSION,
            config: BisectConfig {
                work: opledger_core::engine::Work::prefill(128, 0),
                target: Target::Band("dense_ffn".into()),
                ends_cycles: 6,
                cycles: 6,
                max_cycles: 12,
                min_effect: 0.05,
                resamples: 100,
                seed: 1,
                gate: Default::default(),
                outputs: Default::default(),
            },
            candidates: (0..6)
                .map(|i| Candidate {
                    id: format!("c{i}"),
                    label: format!("c{i} subject | with a bar"),
                })
                .collect(),
            ends: Ends {
                schema_version: BISECT_SCHEMA_VERSION,
                cycles: 6,
                outputs_passed: true,
                outputs_refusal: None,
                target: figure("band dense_ffn", 9.0, Verdict::Slower),
                total: figure("the total", 4.0, Verdict::Slower),
                build_seconds: 30.0,
                measure_seconds: 5.0,
            },
            steps: vec![
                step(1, 2, Decision::Skipped),
                step(2, 3, Decision::Good),
                step(3, 4, Decision::Skipped),
            ],
            found: Found::Range {
                good: 3,
                bad: 5,
                why: "every candidate between was skipped".into(),
            },
            first_bad: None,
            wall: WallTime {
                build_seconds: 55.0,
                measure_seconds: 8.0,
                total_seconds: 64.0,
            },
        }
    }

    #[test]
    fn a_bisect_renders_one_row_per_step_and_what_it_found() {
        let r = report();
        let rows = step_rows(&r);
        assert_eq!(rows.len(), 3);
        assert_eq!(
            rows[0],
            vec![
                "1",
                "c2 subject | with a bar",
                "12",
                "0",
                "0",
                "–",
                "–",
                "skipped: it does not build"
            ]
        );
        assert_eq!(rows[1][5], "1.010 [0.950–1.080]");
        assert_eq!(rows[1][7], "good");
        let text = bisect_text(&r);
        assert!(
            text.contains("band dense_ffn: bad/good 9.000 [8.100–9.900]"),
            "{text}"
        );
        assert!(
            text.contains(
                "step 1 (c2 subject | with a bar): the build's last lines:\n  ops.cpp:1:1: error"
            ),
            "{text}"
        );
        assert!(text.contains(
            "the first bad lies after c3 subject | with a bar and at or before c5 subject | with a bar (2 candidates): every candidate between was skipped"
        ), "{text}");
        assert!(
            text.ends_with(
                "time: 64 s in all; builds 55 s, measurement 8 s; 3 steps, 1 measured\n"
            ),
            "{text}"
        );
        // a cell's bar is escaped in markdown, the table keeps its columns
        let md = bisect_markdown(&r);
        assert!(md.contains("c2 subject \\| with a bar"), "{md}");
        let refused = BisectReport {
            found: Found::Refused {
                why: "nothing to bisect: ...".into(),
            },
            steps: vec![],
            ..r
        };
        assert!(bisect_text(&refused).contains("refused: nothing to bisect: ..."));
    }
}
