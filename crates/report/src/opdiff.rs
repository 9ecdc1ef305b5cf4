//! Renderers of an op-level diff of two graphs ([`OpDiff`]): the terminal table of op groups
//! with the added, removed, changed and regrouped nodes, and the same in markdown. The HTML
//! section is in `html/opdiff.rs`; the item texts are shared from here.

use std::fmt::Write as _;

use opledger_core::opdiff::{DiffNode, OpDiff, OpRow, Regroup, RegroupKind};

use crate::ab::verdict_name;
use crate::table::{markdown_cell, markdown_table, text_table, Align};

/// The column headers of the op table.
pub(crate) const HEADER: [&str; 9] = [
    "op",
    "name",
    "nodes",
    "A ms/token",
    "B ms/token",
    "B/A",
    "interval",
    "control A2/A",
    "verdict",
];

/// Which columns are numbers.
pub(crate) const NUMERIC: [bool; 9] = [false, false, true, true, true, true, true, true, false];

/// A ratio, or `n/a` where it cannot be formed (NaN).
fn ratio_text(r: f64) -> String {
    if r.is_nan() {
        "n/a".into()
    } else {
        format!("{r:.3}")
    }
}

/// `[2.900–3.100]`, or `n/a`.
fn interval_text(lo: f64, hi: f64) -> String {
    if lo.is_nan() || hi.is_nan() {
        "n/a".into()
    } else {
        format!("[{lo:.3}–{hi:.3}]")
    }
}

fn ms_text(ms: f64) -> String {
    if ms.is_nan() {
        "n/a".into()
    } else {
        format!("{ms:.4}")
    }
}

/// The cells of one op row, as text.
pub(crate) fn row_cells(r: &OpRow) -> Vec<String> {
    vec![
        r.op.clone(),
        r.name.clone(),
        r.nodes.to_string(),
        ms_text(r.a_ms_per_token),
        ms_text(r.b_ms_per_token),
        ratio_text(r.ratio),
        interval_text(r.ratio_lo, r.ratio_hi),
        if r.control_ratio.is_nan() {
            "n/a".into()
        } else {
            format!(
                "{} {}",
                ratio_text(r.control_ratio),
                interval_text(r.control_lo, r.control_hi)
            )
        },
        verdict_name(r.verdict).into(),
    ]
}

/// `99.667 %`: a confidence level with at most three decimals.
fn percent(level: f64) -> String {
    let s = format!("{:.3}", level * 100.0);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s} %")
}

/// The counts of the diff in one line.
pub(crate) fn summary(d: &OpDiff) -> String {
    let count = |k: RegroupKind| d.regrouped.iter().filter(|r| r.kind == k).count();
    format!(
        "A {} working nodes, B {}: {} matched, {} added, {} removed, {} changed, {} fused, {} split",
        d.a_nodes,
        d.b_nodes,
        d.matched,
        d.added.len(),
        d.removed.len(),
        d.changed.len(),
        count(RegroupKind::Fused),
        count(RegroupKind::Split)
    )
}

/// How the rows are sorted and at what level their intervals are.
pub(crate) fn ops_caption(d: &OpDiff) -> String {
    format!(
        "per op group of matched nodes, sorted by |B - A| ms/token; each interval at {} ({} of the {} groups read together)",
        percent(1.0 - d.alpha / d.ops.len().max(1) as f64),
        percent(1.0 - d.alpha),
        d.ops.len()
    )
}

/// The verdict rule in one sentence.
pub(crate) fn thresholds(d: &OpDiff) -> String {
    format!(
        "faster or slower when the whole interval of B/A lies beyond ±{e} % and beyond the control's interval (a second process of A), no change when it lies within ±{e} %, within noise otherwise; inconclusive when the control moved (its whole interval beyond ±{e} %); fused and split are a guess from shapes between matched neighbours",
        e = format!("{:.0}", d.min_effect * 100.0)
    )
}

/// `(layer 3)`, `(layers 3–4)` or nothing.
fn layers_text<'n>(nodes: impl Iterator<Item = &'n DiffNode>) -> String {
    let layers: Vec<u32> = nodes.filter_map(|n| n.layer).collect();
    match (layers.iter().min(), layers.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => format!(" (layer {lo})"),
        (Some(lo), Some(hi)) => format!(" (layers {lo}–{hi})"),
        _ => String::new(),
    }
}

/// `#24 CLAMP kq_extra-1 (layer 1) -> [64,4] F32`.
fn node_text(n: &DiffNode) -> String {
    format!(
        "#{} {} {}{} -> {} {}",
        n.index,
        n.op,
        n.name,
        layers_text(std::iter::once(n)),
        n.out_shape,
        n.out_type
    )
}

/// `A's MUL+ADD (layer 1) -> B's FOO: ffn_mul-1, ffn_act-1 -> ffn_fused-1 [128,4] F32`.
fn regroup_text(r: &Regroup) -> String {
    let ops = |ns: &[DiffNode]| {
        ns.iter()
            .map(|n| n.op.as_str())
            .collect::<Vec<_>>()
            .join("+")
    };
    let names = |ns: &[DiffNode]| {
        ns.iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let last = r.b.last().or(r.a.last());
    format!(
        "A's {}{} -> B's {}: {} -> {}{}",
        ops(&r.a),
        layers_text(r.a.iter().chain(&r.b)),
        ops(&r.b),
        names(&r.a),
        names(&r.b),
        last.map(|n| format!(" {} {}", n.out_shape, n.out_type))
            .unwrap_or_default()
    )
}

/// The structural lists: (label, every item's text), in the order they are shown.
pub(crate) fn lists(d: &OpDiff) -> Vec<(&'static str, Vec<String>)> {
    let regroups = |k: RegroupKind| {
        d.regrouped
            .iter()
            .filter(|r| r.kind == k)
            .map(regroup_text)
            .collect()
    };
    vec![
        ("added", d.added.iter().map(node_text).collect()),
        ("removed", d.removed.iter().map(node_text).collect()),
        (
            "changed",
            d.changed
                .iter()
                .map(|c| {
                    format!(
                        "{} {} ({}A #{}, B #{}): {}",
                        c.a.op,
                        c.a.name,
                        c.a.layer
                            .map(|l| format!("layer {l}, "))
                            .unwrap_or_default(),
                        c.a.index,
                        c.b.index,
                        c.what
                    )
                })
                .collect(),
        ),
        ("fused", regroups(RegroupKind::Fused)),
        ("split", regroups(RegroupKind::Split)),
    ]
}

/// `2 more op groups`, `1 more op group`.
pub(crate) fn more_groups(n: usize) -> String {
    format!("{n} more op group{}", if n == 1 { "" } else { "s" })
}

/// At most `max` items, and how many were left out.
pub(crate) fn capped<T>(items: &[T], max: usize) -> (&[T], usize) {
    let shown = items.len().min(max);
    (&items[..shown], items.len() - shown)
}

/// The terminal rendering: the counts, the table of the `max_rows` op groups with the largest
/// gap, then the lines `added: ...`, `removed: ...`, `changed: ...`, `fused: ...`,
/// `split: ...`, at most `max_rows` of each.
pub fn op_diff_text(d: &OpDiff, max_rows: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "op-level diff: {}", summary(d));
    if !d.ops.is_empty() {
        let (rows, more) = capped(&d.ops, max_rows);
        let rows: Vec<Vec<String>> = rows.iter().map(row_cells).collect();
        let align: Vec<Align> = NUMERIC
            .iter()
            .map(|&n| if n { Align::Right } else { Align::Left })
            .collect();
        let _ = writeln!(
            out,
            "\n{}:\n{}",
            ops_caption(d),
            text_table(&HEADER, &align, &rows)
        );
        if more > 0 {
            let _ = writeln!(out, "... and {}", more_groups(more));
        }
    }
    let mut first = true;
    for (label, items) in lists(d) {
        let (shown, more) = capped(&items, max_rows);
        for item in shown {
            if std::mem::take(&mut first) {
                out.push('\n');
            }
            let _ = writeln!(out, "{label}: {item}");
        }
        if more > 0 {
            let _ = writeln!(out, "{label}: ... and {more} more");
        }
    }
    let _ = writeln!(out, "\n{}", thresholds(d));
    out
}

/// The markdown rendering: the counts, a GitHub table of the `max_rows` op groups with the
/// largest gap, then the structural lists, at most `max_rows` items each.
pub fn op_diff_markdown(d: &OpDiff, max_rows: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "### Op-level diff\n\n{}\n", summary(d));
    if !d.ops.is_empty() {
        let (rows, more) = capped(&d.ops, max_rows);
        let rows: Vec<Vec<String>> = rows
            .iter()
            .map(|r| row_cells(r).iter().map(|c| markdown_text(c)).collect())
            .collect();
        let align: Vec<Align> = NUMERIC
            .iter()
            .map(|&n| if n { Align::Right } else { Align::Left })
            .collect();
        let _ = writeln!(
            out,
            "{}:\n\n{}\n",
            markdown_text(&ops_caption(d)),
            markdown_table(&HEADER, &align, &rows)
        );
        if more > 0 {
            let _ = writeln!(out, "… and {}\n", more_groups(more));
        }
    }
    for (label, items) in lists(d) {
        if items.is_empty() {
            continue;
        }
        let _ = writeln!(out, "**{label}** ({}):\n", items.len());
        let (shown, more) = capped(&items, max_rows);
        for item in shown {
            let _ = writeln!(out, "- {}", markdown_text(item));
        }
        if more > 0 {
            let _ = writeln!(out, "- … and {more} more");
        }
        out.push('\n');
    }
    let _ = writeln!(out, "{}", thresholds(d));
    out
}

/// Text for markdown, in a table cell or a list item: `|` would end a cell, `<` and `&` would
/// be read as HTML.
fn markdown_text(text: &str) -> String {
    markdown_cell(&text.replace('&', "&amp;").replace('<', "&lt;"))
}

#[cfg(test)]
pub(crate) mod tests {
    use opledger_core::ab::Verdict;
    use opledger_core::opdiff::ChangedNode;

    use super::*;

    fn node(index: u32, layer: Option<u32>, op: &str, name: &str, shape: &str) -> DiffNode {
        DiffNode {
            index,
            layer,
            op: op.into(),
            name: name.into(),
            out_shape: shape.into(),
            out_type: "F32".into(),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn op_row(
        op: &str,
        name: &str,
        nodes: u32,
        a: f64,
        b: f64,
        r: [f64; 3],
        c: [f64; 3],
        v: Verdict,
    ) -> OpRow {
        OpRow {
            op: op.into(),
            name: name.into(),
            nodes,
            a_ms_per_token: a,
            b_ms_per_token: b,
            ratio: r[0],
            ratio_lo: r[1],
            ratio_hi: r[2],
            control_ratio: c[0],
            control_lo: c[1],
            control_hi: c[2],
            verdict: v,
        }
    }

    /// A diff with every kind of item: three op groups (one named with markup, one that A
    /// spends nothing in), two added nodes, one removed, one changed, one fused, one split.
    pub(crate) fn sample() -> OpDiff {
        let nan = f64::NAN;
        OpDiff {
            a_nodes: 30,
            b_nodes: 31,
            matched: 27,
            added: vec![
                node(24, Some(1), "CLAMP", "kq_extra-1", "[64,4]"),
                node(25, Some(1), "CLAMP", "kq_other-1", "[64,4]"),
            ],
            removed: vec![node(7, None, "SCALE", "node_7", "[16,4,4]")],
            changed: vec![ChangedNode {
                a: node(3, Some(0), "MUL_MAT", "Qcur-0", "[64,4]"),
                b: node(4, Some(0), "MUL_MAT", "Qcur-0", "[64,4]"),
                what: "src0 [64,64] Q4_K -> [64,64] Q8_0".into(),
            }],
            regrouped: vec![
                Regroup {
                    kind: RegroupKind::Fused,
                    a: vec![
                        node(10, Some(3), "MUL", "ffn_mul-3", "[128,4]"),
                        node(11, Some(3), "ADD", "ffn_act-3", "[128,4]"),
                    ],
                    b: vec![node(10, Some(3), "FOO", "ffn_fused-3", "[128,4]")],
                },
                Regroup {
                    kind: RegroupKind::Split,
                    a: vec![node(20, Some(4), "BAR", "ffn_bar-4", "[64,4]")],
                    b: vec![
                        node(20, Some(4), "MUL", "ffn_a-4", "[64,4]"),
                        node(21, Some(5), "ADD", "ffn_b-4", "[64,4]"),
                    ],
                },
            ],
            ops: vec![
                op_row(
                    "MUL_MAT",
                    "ffn_up",
                    2,
                    1.0,
                    3.0,
                    [3.0, 2.9, 3.1],
                    [1.0, 0.98, 1.02],
                    Verdict::Slower,
                ),
                op_row(
                    "ADD",
                    "<b>|x&y",
                    4,
                    0.25,
                    0.2,
                    [0.8, 0.7, 0.9],
                    [1.0, 0.97, 1.03],
                    Verdict::Faster,
                ),
                op_row(
                    "MUL_MAT",
                    "result_output",
                    1,
                    0.0,
                    0.1,
                    [nan; 3],
                    [nan; 3],
                    Verdict::WithinNoise,
                ),
            ],
            alpha: 0.05,
            min_effect: 0.02,
        }
    }

    #[test]
    fn the_text_has_the_table_and_every_list_capped() {
        let t = op_diff_text(&sample(), 10);
        assert!(
            t.starts_with("op-level diff: A 30 working nodes, B 31: 27 matched, 2 added, 1 removed, 1 changed, 1 fused, 1 split\n"),
            "{t}"
        );
        // 0.05 / 3 groups: 98.333 % each
        assert!(
            t.contains("each interval at 98.333 % (95 % of the 3 groups read together)"),
            "{t}"
        );
        let up = t
            .lines()
            .find(|l| l.contains("ffn_up"))
            .expect("ffn_up row");
        let cells: Vec<&str> = up.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "MUL_MAT",
                "ffn_up",
                "2",
                "1.0000",
                "3.0000",
                "3.000",
                "[2.900–3.100]",
                "1.000",
                "[0.980–1.020]",
                "slower"
            ]
        );
        let out = t.lines().find(|l| l.contains("result_output")).unwrap();
        assert_eq!(
            out.split_whitespace().collect::<Vec<_>>(),
            [
                "MUL_MAT",
                "result_output",
                "1",
                "0.0000",
                "0.1000",
                "n/a",
                "n/a",
                "n/a",
                "within",
                "noise"
            ]
        );
        for line in [
            "added: #24 CLAMP kq_extra-1 (layer 1) -> [64,4] F32",
            "added: #25 CLAMP kq_other-1 (layer 1) -> [64,4] F32",
            "removed: #7 SCALE node_7 -> [16,4,4] F32",
            "changed: MUL_MAT Qcur-0 (layer 0, A #3, B #4): src0 [64,64] Q4_K -> [64,64] Q8_0",
            "fused: A's MUL+ADD (layer 3) -> B's FOO: ffn_mul-3, ffn_act-3 -> ffn_fused-3 [128,4] F32",
            "split: A's BAR (layers 4–5) -> B's MUL+ADD: ffn_bar-4 -> ffn_a-4, ffn_b-4 [64,4] F32",
        ] {
            assert!(t.lines().any(|l| l == line), "no line {line:?} in\n{t}");
        }
        assert!(!t.contains("more"), "{t}");

        let t = op_diff_text(&sample(), 1);
        assert!(t.contains("\n... and 2 more op groups\n"), "{t}");
        assert!(t.contains("\nadded: #24 CLAMP kq_extra-1 (layer 1) -> [64,4] F32\nadded: ... and 1 more\nremoved: "), "{t}");
        assert!(
            !t.contains("kq_other-1") && !t.contains("result_output"),
            "{t}"
        );
        assert!(!t.contains("removed: ... and"), "{t}");
    }

    #[test]
    fn the_markdown_escapes_its_cells_and_lists_the_structure() {
        let m = op_diff_markdown(&sample(), 2);
        assert!(
            m.starts_with("### Op-level diff\n\nA 30 working nodes"),
            "{m}"
        );
        let row = m
            .lines()
            .find(|l| l.contains("x&amp;y"))
            .expect("the escaped row");
        assert!(
            row.contains(" &lt;b>\\|x&amp;y "),
            "markup and a | in a cell are escaped: {row}"
        );
        assert_eq!(row.matches(" | ").count() + 2, 10, "nine cells: {row}");
        assert!(m.contains("\n… and 1 more op group\n"), "{m}");
        assert!(m.contains("sorted by \\|B - A\\| ms/token"), "{m}");
        assert!(
            m.contains("**added** (2):\n\n- #24 CLAMP kq_extra-1 (layer 1) -> [64,4] F32\n- #25 "),
            "{m}"
        );
        assert!(
            m.contains("**fused** (1):\n\n- A's MUL+ADD (layer 3) -> B's FOO"),
            "{m}"
        );
        let one = op_diff_markdown(&sample(), 1);
        assert!(one.contains("**added** (2):\n\n- #24 CLAMP kq_extra-1 (layer 1) -> [64,4] F32\n- … and 1 more\n"), "{one}");
        // an empty list is left out
        let mut d = sample();
        d.removed.clear();
        assert!(!op_diff_markdown(&d, 5).contains("**removed**"));
    }
}
