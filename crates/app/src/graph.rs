//! `graph`: the census of the graph an engine computes for a chunk at a depth, described
//! without running the model where the engine can, checked against the architecture.

use anyhow::Result;
use opledger_core::arch::{ArchInfo, LayerKind};
use opledger_core::band::{Assignment, Categoriser, Reason};
use opledger_core::census::{census, Census};
use opledger_core::engine::{Engine, GraphCapture, Work};
use opledger_core::node::NodeInfo;
use opledger_core::run_folder::RunFolder;
use serde::Serialize;

use crate::bands::Bands;
use crate::outcome::Exit;
use crate::ui::Ui;

/// A captured graph, every node in its band, and the census.
pub struct GraphCensus {
    pub capture: GraphCapture,
    pub assignments: Vec<Assignment>,
    pub census: Census,
    /// Seconds loading the model took, where the engine measured it.
    pub load_s: Option<f64>,
}

/// The JSON export: the census and the same node records the profiler stores, with bands.
#[derive(Serialize)]
pub struct GraphExport<'a> {
    pub schema_version: u32,
    /// The architecture as opledger read it: every layer's kind, window, mixer and FFN.
    pub arch: &'a ArchInfo,
    pub census: &'a Census,
    pub nodes: Vec<NodeWithBand<'a>>,
}

#[derive(Serialize)]
pub struct NodeWithBand<'a> {
    #[serde(flatten)]
    pub node: &'a NodeInfo,
    pub band: &'a str,
    pub by: &'a Reason,
}

/// Captures the graph of `work` on `engine` and counts it against `arch`.
pub fn run(
    engine: &mut dyn Engine,
    arch: &ArchInfo,
    bands: &Bands,
    work: &Work,
    ui: &mut dyn Ui,
) -> Result<GraphCensus> {
    let load_s = engine.load_ms().map(|ms| ms / 1e3);
    let capture = engine.graph_capturer()?.capture_graph(work)?;
    for w in bands.unmatched(&capture.nodes) {
        ui.note(&w);
    }
    let assignments = Categoriser::new(&bands.rules, arch).categorise(&capture.nodes);
    let census = census(&capture.nodes, &assignments, arch, true);
    Ok(GraphCensus {
        capture,
        assignments,
        census,
        load_s,
    })
}

impl GraphCensus {
    pub fn export<'a>(&'a self, arch: &'a ArchInfo) -> GraphExport<'a> {
        GraphExport {
            schema_version: self.census.schema_version,
            arch,
            census: &self.census,
            nodes: self
                .capture
                .nodes
                .iter()
                .zip(&self.assignments)
                .map(|(node, a)| NodeWithBand {
                    node,
                    band: &a.band,
                    by: &a.reason,
                })
                .collect(),
        }
    }

    /// Writes census.json, graph.json, nodes.csv and one DOT file per layer kind into `folder`.
    pub fn write(&self, folder: &RunFolder, arch: &ArchInfo, model_label: &str) -> Result<()> {
        let graph = &self.capture.nodes;
        folder.write_json("census.json", &self.census)?;
        folder.write_json("graph.json", &self.export(arch))?;
        folder.write(
            "nodes.csv",
            opledger_report::nodes_csv(graph, &self.assignments, &[])?.as_bytes(),
        )?;
        for kind in LayerKind::ALL {
            if let Some(layer) = arch.layers.iter().position(|l| l.kind == kind) {
                let title = format!(
                    "{} layer {layer} ({}) of {model_label}",
                    kind.as_str(),
                    arch.arch,
                );
                let dot = opledger_report::census::layer_dot(
                    graph,
                    &self.assignments,
                    layer as u32,
                    &title,
                );
                folder.write(
                    &format!("layer-{layer}-{}.dot", kind.as_str()),
                    dot.as_bytes(),
                )?;
            }
        }
        Ok(())
    }

    /// Failed when the graph does not hold what its architecture predicts.
    pub fn exit(&self) -> Exit {
        let bad: Vec<(String, String)> = self
            .census
            .mismatches()
            .into_iter()
            .map(|e| {
                (
                    "census".to_string(),
                    format!(
                        "{} in band {}: expected {} ({}), found {}",
                        e.op,
                        e.band,
                        e.expected.map(|x| x.to_string()).unwrap_or_default(),
                        e.rule,
                        e.found
                    ),
                )
            })
            .collect();
        if bad.is_empty() {
            Exit::Ok
        } else {
            Exit::CheckFailed(bad)
        }
    }
}
