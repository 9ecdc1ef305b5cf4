//! Renderers of a graph census: the node listing, the count tables with the architecture
//! cross-check, and Graphviz DOT of one layer coloured by band.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use opledger_core::band::Assignment;
use opledger_core::census::{Census, ExpectationStatus};
use opledger_core::node::NodeInfo;

use crate::table::{text_table, Align};

/// Every node in order: index, op, name, layer, band, output, sources, view / in-place flags.
pub fn node_listing(graph: &[NodeInfo], assignments: &[Assignment]) -> String {
    let rows: Vec<Vec<String>> = graph
        .iter()
        .zip(assignments)
        .map(|(n, a)| {
            let srcs: Vec<String> = n
                .srcs
                .iter()
                .map(|s| match s {
                    Some(t) => format!(
                        "{}{} {}{}",
                        t.name,
                        t.shape_string(),
                        t.ggml_type.to_lowercase(),
                        if t.is_weight { " (weight)" } else { "" }
                    ),
                    None => "-".into(),
                })
                .collect();
            let flags = match (n.is_view, n.skipped, n.inplace) {
                (true, _, _) => "view",
                (false, true, _) => "skipped",
                (false, false, true) => "in-place",
                _ => "",
            };
            vec![
                n.index.to_string(),
                n.op.clone(),
                n.name.clone(),
                n.layer.map(|l| l.to_string()).unwrap_or_default(),
                a.band.clone(),
                format!(
                    "{} {}",
                    n.out.shape_string(),
                    n.out.ggml_type.to_lowercase()
                ),
                flags.to_string(),
                srcs.join("; "),
            ]
        })
        .collect();
    text_table(
        &[
            "#", "op", "name", "layer", "band", "output", "flags", "sources",
        ],
        &[
            Align::Right,
            Align::Left,
            Align::Left,
            Align::Right,
            Align::Left,
            Align::Left,
            Align::Left,
            Align::Left,
        ],
        &rows,
    )
}

/// The counts and the cross-check. `shapes_shown` limits the distinct-shape table (0: all).
pub fn census_text(c: &Census, shapes_shown: usize) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "nodes {} · views {} · skipped by the backend {} · working {} · attention path: {}\n",
        c.total.nodes, c.view_nodes, c.skipped_nodes, c.total.working, c.attention_path
    );
    let band_rows: Vec<Vec<String>> = c
        .per_band
        .iter()
        .map(|(b, n)| vec![b.clone(), n.nodes.to_string(), n.working.to_string()])
        .collect();
    let _ = writeln!(
        out,
        "{}\n",
        text_table(
            &["band", "nodes", "working"],
            &[Align::Left, Align::Right, Align::Right],
            &band_rows
        )
    );
    let kind_rows: Vec<Vec<String>> = c
        .per_layer_kind
        .iter()
        .map(|(k, n)| {
            vec![
                k.clone(),
                if k == "none" {
                    String::new()
                } else {
                    n.layers.to_string()
                },
                n.nodes.to_string(),
                n.working.to_string(),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "{}\n",
        text_table(
            &["layer kind", "layers", "nodes", "working"],
            &[Align::Left, Align::Right, Align::Right, Align::Right],
            &kind_rows
        )
    );
    let per_layer: Vec<String> = c
        .per_layer
        .iter()
        .enumerate()
        .map(|(i, n)| format!("{i}:{}/{}", n.nodes, n.working))
        .collect();
    let _ = writeln!(out, "per layer (nodes/working): {}\n", per_layer.join(" "));
    let mut ops: Vec<(&String, &opledger_core::census::Count)> = c.per_op.iter().collect();
    ops.sort_by(|a, b| b.1.nodes.cmp(&a.1.nodes).then(a.0.cmp(b.0)));
    let op_rows: Vec<Vec<String>> = ops
        .iter()
        .map(|(op, n)| vec![op.to_string(), n.nodes.to_string(), n.working.to_string()])
        .collect();
    let _ = writeln!(
        out,
        "{}\n",
        text_table(
            &["op", "nodes", "working"],
            &[Align::Left, Align::Right, Align::Right],
            &op_rows
        )
    );
    let mut shapes = c.shapes.clone();
    shapes.sort_by(|a, b| b.count.cmp(&a.count).then(a.first_node.cmp(&b.first_node)));
    let shown = if shapes_shown == 0 {
        shapes.len()
    } else {
        shapes_shown.min(shapes.len())
    };
    let shape_rows: Vec<Vec<String>> = shapes[..shown]
        .iter()
        .map(|s| {
            vec![
                s.count.to_string(),
                s.op.clone(),
                s.band.clone(),
                s.signature.clone(),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "distinct (op, shapes, types): {} (showing {shown})\n{}\n",
        shapes.len(),
        text_table(
            &["count", "op", "band", "output <- sources"],
            &[Align::Right, Align::Left, Align::Left, Align::Left],
            &shape_rows
        )
    );
    let exp_rows: Vec<Vec<String>> = c
        .expectations
        .iter()
        .map(|e| {
            vec![
                e.op.clone(),
                e.band.clone(),
                e.expected
                    .map(|x| x.to_string())
                    .unwrap_or_else(|| "-".into()),
                e.found.to_string(),
                match e.status() {
                    ExpectationStatus::AsExpected => "ok",
                    ExpectationStatus::Mismatch => "MISMATCH",
                    ExpectationStatus::NotPredicted => "not predicted",
                }
                .to_string(),
                e.rule.clone(),
            ]
        })
        .collect();
    let _ = writeln!(
        out,
        "cross-check against the architecture ({}, {} layers):\n{}",
        c.arch,
        c.layers,
        text_table(
            &["op", "band", "expected", "found", "", "rule"],
            &[
                Align::Left,
                Align::Left,
                Align::Right,
                Align::Right,
                Align::Left,
                Align::Left
            ],
            &exp_rows
        )
    );
    out
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

/// Graphviz DOT of the nodes of one layer, edges between them, coloured by band. Views are
/// drawn small and dashed.
pub fn layer_dot(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    layer: u32,
    title: &str,
) -> String {
    let in_layer: BTreeMap<u32, usize> = graph
        .iter()
        .enumerate()
        .filter(|(_, n)| n.layer == Some(layer))
        .map(|(i, n)| (n.index, i))
        .collect();
    let mut out = String::new();
    let _ = writeln!(out, "digraph \"{}\" {{", dot_escape(title));
    let _ = writeln!(
        out,
        "  rankdir=TB;\n  labelloc=t;\n  label=\"{}\";",
        dot_escape(title)
    );
    let _ = writeln!(
        out,
        "  node [shape=box, style=filled, fontname=\"Helvetica\", fontsize=10];"
    );
    let mut bands_seen: BTreeMap<&str, ()> = BTreeMap::new();
    for &i in in_layer.values() {
        let n = &graph[i];
        let band = assignments.get(i).map(|a| a.band.as_str()).unwrap_or("?");
        bands_seen.insert(band, ());
        let colour = crate::svg::band_colour(band);
        let font = if matches!(band, "linear_attention") {
            "white"
        } else {
            "black"
        };
        if n.is_view {
            let _ = writeln!(
                out,
                "  n{} [label=\"{}\", style=\"dashed,filled\", fillcolor=\"{colour}40\", fontsize=8];",
                n.index,
                dot_escape(&n.op)
            );
        } else {
            let _ = writeln!(
                out,
                "  n{} [label=\"{}\\n{}\\n{}\", fillcolor=\"{colour}\", fontcolor={font}];",
                n.index,
                dot_escape(&n.op),
                dot_escape(n.base_name()),
                dot_escape(&n.out.shape_string())
            );
        }
        for s in n.srcs.iter().flatten() {
            if let Some(p) = s.producer {
                if in_layer.contains_key(&p) {
                    let _ = writeln!(out, "  n{p} -> n{};", n.index);
                }
            }
        }
    }
    let _ = writeln!(out, "  subgraph cluster_legend {{\n    label=\"bands\";");
    for band in bands_seen.keys() {
        let _ = writeln!(
            out,
            "    \"legend_{band}\" [label=\"{band}\", fillcolor=\"{}\"];",
            crate::svg::band_colour(band)
        );
    }
    let _ = writeln!(out, "  }}\n}}");
    out
}
