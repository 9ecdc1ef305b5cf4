//! The HTML section of an op-level diff of two graphs ([`OpDiff`]): the table of op groups,
//! then the added, removed, changed, fused and split nodes. A section, not a page: the A/B
//! page places it.

use std::fmt::Write as _;

use opledger_core::ab::Verdict;
use opledger_core::opdiff::OpDiff;

use super::layout::{list, table};
use crate::opdiff::{
    capped, lists, more_groups, ops_caption, row_cells, summary, thresholds, HEADER, NUMERIC,
};
use crate::svg::esc;

/// The section `#opdiff`: the counts, the `max_rows` op groups with the largest gap (a slower
/// verdict marked bad, a faster one good), then each structural list, at most `max_rows`
/// items each. Every text is escaped; no script.
pub fn op_diff_html(d: &OpDiff, max_rows: usize) -> String {
    let mut body = String::new();
    let _ = writeln!(
        body,
        "<section id=\"opdiff\"><h2>Op-level diff</h2>\n<p>{}</p>",
        esc(&summary(d))
    );
    if !d.ops.is_empty() {
        let (rows, more) = capped(&d.ops, max_rows);
        let _ = writeln!(body, "<h3>{}</h3>", esc(&capitalised(&ops_caption(d))));
        let cells: Vec<Vec<String>> = rows
            .iter()
            .map(|r| {
                let class = match r.verdict {
                    Verdict::Slower => Some("bad"),
                    Verdict::Faster => Some("ok"),
                    _ => None,
                };
                row_cells(r)
                    .iter()
                    .enumerate()
                    .map(|(i, c)| match class {
                        Some(class) if i == HEADER.len() - 1 => {
                            format!("<span class=\"{class}\">{}</span>", esc(c))
                        }
                        _ => esc(c),
                    })
                    .collect()
            })
            .collect();
        table(&mut body, &HEADER, &NUMERIC, &cells);
        if more > 0 {
            let _ = writeln!(body, "<p>… and {}</p>", more_groups(more));
        }
    }
    for (label, items) in lists(d) {
        if items.is_empty() {
            continue;
        }
        let _ = writeln!(
            body,
            "<h3>{} ({})</h3>",
            esc(&capitalised(label)),
            items.len()
        );
        let (shown, more) = capped(&items, max_rows);
        let mut shown = shown.to_vec();
        if more > 0 {
            shown.push(format!("… and {more} more"));
        }
        list(&mut body, &shown);
    }
    let _ = writeln!(
        body,
        "<p>{}</p>\n</section>",
        esc(&capitalised(&thresholds(d)))
    );
    body
}

/// The text with its first letter capitalised.
fn capitalised(s: &str) -> String {
    let mut c = s.chars();
    match c.next() {
        Some(f) => f.to_uppercase().chain(c).collect(),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::opdiff::tests::sample;

    #[test]
    fn the_section_escapes_its_text_and_has_every_part() {
        let h = op_diff_html(&sample(), 10);
        assert!(h.starts_with("<section id=\"opdiff\"><h2>Op-level diff</h2>\n<p>A 30 working nodes, B 31: 27 matched,"), "{h}");
        assert!(h.trim_end().ends_with("</section>"), "{h}");
        assert!(!h.contains("<script") && !h.contains("<b>"), "{h}");
        assert!(h.contains("<td>&lt;b&gt;|x&amp;y</td>"), "{h}");
        assert!(
            h.contains("<tr><td>MUL_MAT</td><td>ffn_up</td><td class=\"num\">2</td><td class=\"num\">1.0000</td><td class=\"num\">3.0000</td><td class=\"num\">3.000</td><td class=\"num\">[2.900–3.100]</td><td class=\"num\">1.000 [0.980–1.020]</td><td><span class=\"bad\">slower</span></td></tr>"),
            "{h}"
        );
        assert!(
            h.contains("<td><span class=\"ok\">faster</span></td>"),
            "{h}"
        );
        assert!(h.contains("<td class=\"num\">n/a</td><td class=\"num\">n/a</td><td class=\"num\">n/a</td><td>within noise</td>"), "{h}");
        assert!(h.contains("<h3>Added (2)</h3>\n<ul>\n<li>#24 CLAMP kq_extra-1 (layer 1) -&gt; [64,4] F32</li>\n<li>#25 "), "{h}");
        assert!(h.contains("<h3>Fused (1)</h3>\n<ul>\n<li>A&#39;s MUL+ADD (layer 3) -&gt; B&#39;s FOO: ffn_mul-3, ffn_act-3 -&gt; ffn_fused-3 [128,4] F32</li>"), "{h}");
        assert!(h.contains("<h3>Split (1)</h3>"), "{h}");
        assert!(!h.contains("more"), "{h}");

        let h = op_diff_html(&sample(), 1);
        assert!(h.contains("<p>… and 2 more op groups</p>"), "{h}");
        assert!(h.contains("<li>#24 CLAMP kq_extra-1 (layer 1) -&gt; [64,4] F32</li>\n<li>… and 1 more</li>\n</ul>"), "{h}");
        assert_eq!(h.matches("<tr><td>").count(), 1, "one op row: {h}");
    }
}
