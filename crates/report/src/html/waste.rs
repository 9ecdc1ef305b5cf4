//! The HTML page and chart of a waste analysis.

use std::fmt::Write as _;

use super::layout::{band_table, checks_section, figure, list, page, table, text_rows};
use super::manifest::manifest_section;
use crate::palette::{WASTED, WHOLE};
use crate::svg::{bar_chart_svg, esc, Bar, BarChart, BarRow, Panel};
use crate::view::WasteView;

pub(super) fn waste_chart(v: &WasteView) -> BarChart {
    BarChart {
        title: format!(
            "{} · time on rows nobody reads, by band",
            v.manifest.model_label()
        ),
        unit: "ms per token".into(),
        legend: vec![
            ("the band's ms/token".into(), WHOLE.into()),
            ("of which on rows nobody reads".into(), WASTED.into()),
        ],
        panels: vec![Panel {
            title: None,
            rows: v
                .summary
                .bands
                .iter()
                .map(|b| BarRow {
                    label: b.band.clone(),
                    bars: vec![
                        Bar {
                            value: b.ms_per_token,
                            colour: WHOLE.into(),
                            range: None,
                        },
                        Bar {
                            value: b.wasted_ms_per_token,
                            colour: WASTED.into(),
                            range: None,
                        },
                    ],
                    note: format!(
                        "{:.4} of {:.4} ms ({:.1} %)",
                        b.wasted_ms_per_token,
                        b.ms_per_token,
                        b.wasted_share_of_band * 100.0
                    ),
                })
                .collect(),
        }],
    }
}

pub(super) fn waste_html(v: &WasteView) -> String {
    let m = v.manifest;
    let s = &v.summary;
    let (title, work) = crate::waste::heading(m, s);
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<p class=\"headline\">{}</p>",
        esc(&crate::waste::headline(s))
    );
    let checks = crate::waste::checks(m, v.raw, s);
    checks_section(&mut body, "Cross-checks", &checks);
    figure(
        &mut body,
        "chart",
        "Rows nobody reads",
        &bar_chart_svg(&waste_chart(v)),
        "an upper bound on what trimming saves: a matmul cut to fewer rows still streams its whole weight",
    );
    body.push_str("<section id=\"bands\"><h2>By band</h2>\n");
    band_table(
        &mut body,
        &crate::waste::BAND_HEADER,
        &[false, true, true, true, true, true],
        crate::waste::band_rows(s),
    );
    body.push_str("<h3>By layer</h3>\n");
    table(
        &mut body,
        &crate::waste::LAYER_HEADER,
        &[false, true, true, true, true, true],
        &text_rows(crate::waste::layer_rows(s)),
    );
    const TOP: usize = 30;
    let _ = writeln!(
        body,
        "<h3>Nodes with the most waste (top {} of {}; all in nodes.csv)</h3>",
        TOP.min(s.nodes.len()),
        s.nodes.len()
    );
    table(
        &mut body,
        &crate::waste::NODE_HEADER,
        &[true, false, false, true, false, true, true, true],
        &text_rows(crate::waste::node_rows(s, TOP)),
    );
    list(&mut body, &crate::waste::notes(s));
    body.push_str("</section>\n");
    manifest_section(&mut body, m);
    page(
        &format!("opledger waste · {}", m.model_label()),
        &format!("Rows nobody reads in {}", m.model_label()),
        &[title, work],
        &body,
    )
}
