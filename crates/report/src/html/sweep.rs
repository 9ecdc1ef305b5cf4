//! The HTML page of a depth sweep.

use std::fmt::Write as _;

use super::layout::{band_table, checks_section, figure, list, page, table, text_rows};
use super::manifest::manifest_section;
use crate::svg::esc;
use crate::view::SweepView;

fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

pub(super) fn sweep_html(v: &SweepView) -> Result<String, String> {
    let m = v.manifest;
    let s = &v.summary;
    let mut body = String::new();
    checks_section(&mut body, "Cross-checks", &s.checks);
    let svg = crate::sweep::sweep_svg(&crate::sweep::sweep_chart_title(m, s), s)?;
    figure(
        &mut body,
        "chart",
        "Bands against context depth",
        &svg,
        &format!(
            "ms/token per band at each depth (points, with the range over cycles), the fitted lines (dashed){}",
            match &s.crossover {
                Some(x) => format!("; crossover: {}", x.text),
                None => String::new(),
            }
        ),
    );
    for (i, (name, p)) in crate::sweep::phases(s).into_iter().enumerate() {
        let decode = p.steps > 0;
        let kinds = crate::sweep::kind_columns(&p);
        let _ = writeln!(
            body,
            "<section id=\"phase{i}\"><h2>{}</h2>",
            esc(&capitalised(&name))
        );
        let mut header: Vec<&str> = vec!["depth", "tok/s", "FUSED ms", "agreement", "coverage"];
        header.extend(p.bands.iter().map(String::as_str));
        header.extend(kinds.iter().map(String::as_str));
        let num = vec![true; header.len()];
        let rows: Vec<Vec<String>> = p
            .depths
            .iter()
            .map(|d| {
                let mut r = vec![
                    d.depth.to_string(),
                    format!("{:.1}", d.tok_per_s),
                    format!("{:.2}", d.fused_ms),
                    crate::sweep::agreement_cell(d, decode),
                    format!("{:.2} %", d.coverage * 100.0),
                ];
                r.extend(d.ms_per_token.iter().map(|x| format!("{x:.4}")));
                r.extend(d.attention_by_kind.iter().map(|x| format!("{x:.4}")));
                r
            })
            .collect();
        let _ = writeln!(
            body,
            "<p>ms/token per band{}, {} tokens a unit, {} cycles: the median of each cycle's paired FUSED and TIMED runs.</p>",
            if decode {
                " per generated token (agreement raw → with the isolation cost removed)"
            } else {
                ""
            },
            p.tokens,
            s.cycles
        );
        table(&mut body, &header, &num, &text_rows(rows));
        body.push_str("<h3>Fits: ms/token = a + b × depth</h3>\n");
        band_table(
            &mut body,
            &["band", "a", "b", "R²", "mean", "CV", "change", ""],
            &[false, true, true, true, true, true, true, false],
            crate::sweep::fit_rows(&p, true),
        );
        let mut items: Vec<String> = p
            .attention_kinds
            .iter()
            .map(|k| format!("attention by layer kind: {}", k.text))
            .collect();
        if let Some(x) = &p.crossover {
            items.push(format!("crossover: {}", x.text));
        }
        items.push(format!(
            "mean |agreement| {:.2} %{} · worst {}",
            p.mean_abs_agreement * 100.0,
            if decode {
                format!(
                    " ({:.2} % after removing the isolation cost)",
                    p.mean_abs_agreement_corrected * 100.0
                )
            } else {
                String::new()
            },
            p.worst_agreement
                .map(|(d, a)| format!("{:+.1} % at depth {d}", a * 100.0))
                .unwrap_or_else(|| "-".into())
        ));
        list(&mut body, &items);
        body.push_str("</section>\n");
    }
    let mut items = vec![format!("lowest coverage {:.2} %", s.min_coverage * 100.0)];
    if let Some(c) = &s.cost {
        items.push(format!(
            "cost: {:.1} s a cycle (both modes at every depth) against {:.1} s for one plain cumulative prefill: {:.2}x",
            c.cycle_s, c.plain_prefill_s, c.ratio
        ));
    }
    body.push_str("<section id=\"cost\"><h2>Coverage and cost</h2>\n");
    list(&mut body, &items);
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    Ok(page(
        &format!("opledger sweep · {}", m.model_label()),
        &format!("Depth sweep of {}", m.model_label()),
        &[
            format!(
                "{} · {} · {} {} · {} · {} threads",
                m.model_label(),
                m.model.arch.arch,
                m.engine.engine,
                m.engine.version,
                m.engine.backend,
                m.engine.threads
            ),
            format!(
                "chunks of {} tokens at depths 0..{} ({} depths) · {} cycles, medians",
                s.tokens, s.max_depth, s.chunks, s.cycles
            ),
        ],
        &body,
    ))
}
