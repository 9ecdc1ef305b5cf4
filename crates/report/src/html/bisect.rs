//! The HTML page of a bisect: the ends, one row per step, what was found, and the first bad
//! commit's band table and op diff against its parent.

use std::fmt::Write as _;

use opledger_core::bisect::Found;

use super::layout::{band_table, list, page, table, text_rows};
use super::manifest::manifest_section;
use crate::ab::{band_rows, BAND_HEADER};
use crate::bisect::{found_words, step_rows, STEP_HEADER};
use crate::svg::esc;
use crate::view::BisectView;

pub(super) fn bisect_html(v: &BisectView) -> String {
    let r = v.report;
    let m = v.manifest;
    let mut body = String::new();
    let class = match r.found {
        Found::FirstBad { .. } => "pass",
        Found::Range { .. } => "warn",
        Found::Refused { .. } => "fail",
    };
    let _ = writeln!(
        body,
        "<p class=\"headline banner {class}\">{}</p>",
        esc(&found_words(r))
    );
    body.push_str("<h2>The ends</h2>\n");
    let ends: Vec<Vec<String>> = [&r.ends.target, &r.ends.total]
        .iter()
        .map(|f| {
            vec![
                f.what.clone(),
                format!("{:.4}", f.good_ms_per_token),
                format!("{:.4}", f.bad_ms_per_token),
                f.bad_good.to_string(),
                f.control.to_string(),
                crate::ab::verdict_name(f.verdict).to_string(),
            ]
        })
        .collect();
    table(
        &mut body,
        &[
            "what",
            "good ms/token",
            "bad ms/token",
            "bad/good",
            "control",
            "verdict",
        ],
        &[false, true, true, false, false, false],
        &text_rows(ends),
    );
    let _ = writeln!(
        body,
        "<h2>Steps</h2>\n<p class=\"lede\">One row per step: the candidate measured against both ends in {} to {} interleaved cycles; a mid beyond {:.3}x of good in bad's direction and within it of bad is bad, the mirror good.</p>",
        r.config.cycles,
        r.config.max_cycles,
        r.steps.first().map(|s| s.bound).unwrap_or(f64::NAN)
    );
    table(
        &mut body,
        &STEP_HEADER,
        &[true, false, true, true, true, false, false, false],
        &text_rows(step_rows(r)),
    );
    for s in r.steps.iter().filter(|s| !s.build_log_tail.is_empty()) {
        let _ = writeln!(
            body,
            "<details><summary>step {}: the build's last lines</summary><pre>{}</pre></details>",
            s.number,
            esc(&s.build_log_tail.join("\n"))
        );
    }
    if let Some(fb) = &r.first_bad {
        let _ = writeln!(
            body,
            "<h2>The first bad against its parent</h2>\n<p>{} against {}</p>",
            esc(&r.candidates[fb.index].label),
            esc(&r.candidates[fb.parent].label)
        );
        let mut items = Vec::new();
        if let Some(s) = &fb.described.subject {
            items.push(format!("subject: {s}"));
        }
        for f in &fb.described.files {
            items.push(format!("touched: {f}"));
        }
        list(&mut body, &items);
        band_table(
            &mut body,
            &BAND_HEADER,
            &[false, true, true, true, true, false, false, false],
            band_rows(&fb.scenario),
        );
        if let Some(d) = &fb.scenario.op_diff {
            body.push_str(&super::opdiff::op_diff_html(d, crate::ab::OP_ROWS));
        }
    }
    let _ = writeln!(
        body,
        "<p class=\"lede\">time: {:.0} s in all; builds {:.0} s, measurement {:.0} s</p>",
        r.wall.total_seconds, r.wall.build_seconds, r.wall.measure_seconds
    );
    manifest_section(&mut body, m);
    page(
        &format!("opledger bisect · {}", m.model_label()),
        &format!("Bisect of {} on {}", r.config.target, m.model_label()),
        &[format!(
            "{} candidates · {} .. {}",
            r.candidates.len(),
            r.candidates
                .first()
                .map(|c| c.label.as_str())
                .unwrap_or("?"),
            r.candidates.last().map(|c| c.label.as_str()).unwrap_or("?")
        )],
        &body,
    )
}
