//! The per-node CSV: every node of the graph with its band, why, shapes and median time.

use opledger_core::band::{Assignment, Reason};
use opledger_core::node::NodeInfo;

/// One row per node. `median_us` may be empty (a census without timings).
pub fn nodes_csv(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    median_us: &[f64],
) -> Result<String, csv::Error> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record([
        "index",
        "op",
        "name",
        "layer",
        "band",
        "by",
        "key",
        "shape",
        "type",
        "is_view",
        "inplace",
        "weight",
        "weight_type",
        "weight_bytes",
        "median_us",
    ])?;
    for (i, n) in graph.iter().enumerate() {
        let (band, by, key) = match assignments.get(i) {
            Some(a) => {
                let (by, key) = match &a.reason {
                    Reason::Op(k) => ("op", k.clone()),
                    Reason::Weight(k) => ("weight", k.clone()),
                    Reason::Name(k) => ("name", k.clone()),
                    Reason::Inherited(p) => ("inherited", p.to_string()),
                    Reason::None => ("none", String::new()),
                };
                (a.band.clone(), by, key)
            }
            None => (String::new(), "", String::new()),
        };
        let w8 = n.weight();
        w.write_record([
            n.index.to_string(),
            n.op.clone(),
            n.name.clone(),
            n.layer.map(|l| l.to_string()).unwrap_or_default(),
            band,
            by.to_string(),
            key,
            n.out.shape_string(),
            n.out.ggml_type.clone(),
            n.is_view.to_string(),
            n.inplace.to_string(),
            w8.map(|t| t.name.clone()).unwrap_or_default(),
            w8.map(|t| t.ggml_type.clone()).unwrap_or_default(),
            n.weight_bytes().to_string(),
            median_us
                .get(i)
                .map(|v| format!("{v:.3}"))
                .unwrap_or_default(),
        ])?;
    }
    let bytes = w.into_inner().map_err(|e| e.into_error())?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
