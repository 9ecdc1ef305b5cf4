//! `opledger graph`: the census of the graph llama.cpp computes for a chunk at a depth: every
//! node in order with its band, counts per op, band, layer kind and distinct shape, and the
//! cross-check against the architecture.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use opledger_core::arch::LayerKind;
use opledger_core::band::Categoriser;
use opledger_core::census::{census, Census};
use opledger_core::engine::Work;
use opledger_core::node::NodeInfo;
use opledger_core::run_folder::RunFolder;
use serde::Serialize;

use super::common::ModelArgs;
use super::profile::load_rules;

#[derive(Args)]
pub struct GraphArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens in the chunk.
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    chunk: u32,
    /// Tokens already in the context (the context is filled first, which computes them).
    #[arg(short = 'd', long, default_value_t = 0)]
    depth: u32,
    /// Request logits for every token of the chunk.
    #[arg(long)]
    all_logits: bool,
    /// A band rule set (TOML) instead of the built-in one.
    #[arg(long)]
    bands: Option<PathBuf>,
    /// List every node.
    #[arg(long)]
    nodes: bool,
    /// Distinct (op, shapes, types) rows to show (0: all).
    #[arg(long, default_value_t = 12)]
    shapes: usize,
    /// Print the census and the nodes as JSON.
    #[arg(long)]
    json: bool,
    /// Write census.json, graph.json, nodes.csv and one DOT file per layer kind into this new
    /// folder.
    #[arg(short, long)]
    output: Option<PathBuf>,
}

/// The JSON export: the census and the same node records the profiler stores, with bands.
#[derive(Serialize)]
struct GraphExport<'a> {
    schema_version: u32,
    /// The architecture as opledger read it: every layer's kind, window, mixer and FFN.
    arch: &'a opledger_core::arch::ArchInfo,
    census: &'a Census,
    nodes: Vec<NodeWithBand<'a>>,
}

#[derive(Serialize)]
struct NodeWithBand<'a> {
    #[serde(flatten)]
    node: &'a NodeInfo,
    band: &'a str,
    by: &'a opledger_core::band::Reason,
}

pub fn run(args: GraphArgs) -> Result<ExitCode> {
    let mut model_args = args.model.clone();
    model_args.model = Some(model_args.path()?);
    let file = model_args.open()?;
    let rules = load_rules(args.bands.as_deref(), &file.arch.arch)?;
    let work = Work {
        chunk_tokens: args.chunk,
        depth_tokens: args.depth,
        all_logits: args.all_logits,
        token_seed: 0,
        decode_tokens: 0,
        parallel: 1,
    };
    #[cfg(feature = "llama")]
    {
        // No weight repacking: the file stays memory-mapped and only touched pages are read.
        let mut engine = super::common::load_llama(&model_args, true)?;
        let capture = engine.capture_graph(&work)?;
        let graph = capture.nodes;
        super::profile::warn_unmatched(args.bands.as_deref(), &graph);
        let arch = &file.arch;
        let cat = Categoriser::new(&rules, arch);
        let assignments = cat.categorise(&graph);
        let c = census(&graph, &assignments, arch, true);
        let export = GraphExport {
            schema_version: c.schema_version,
            arch,
            census: &c,
            nodes: graph
                .iter()
                .zip(&assignments)
                .map(|(node, a)| NodeWithBand {
                    node,
                    band: &a.band,
                    by: &a.reason,
                })
                .collect(),
        };
        if let Some(dir) = &args.output {
            let folder = RunFolder::create(dir)?;
            folder.write_json("census.json", &c)?;
            folder.write_json("graph.json", &export)?;
            folder.write(
                "nodes.csv",
                opledger_report::nodes_csv(&graph, &assignments, &[])?.as_bytes(),
            )?;
            for kind in LayerKind::ALL {
                if let Some(layer) = arch.layers.iter().position(|l| l.kind == kind) {
                    let title = format!(
                        "{} layer {layer} ({}) of {}",
                        kind.as_str(),
                        arch.arch,
                        model_args.path()?.display()
                    );
                    let dot = opledger_report::census::layer_dot(
                        &graph,
                        &assignments,
                        layer as u32,
                        &title,
                    );
                    folder.write(
                        &format!("layer-{layer}-{}.dot", kind.as_str()),
                        dot.as_bytes(),
                    )?;
                }
            }
            folder.finish()?;
        }
        if args.json {
            println!("{}", serde_json::to_string_pretty(&export)?);
        } else {
            println!(
                "graph of {} ({}, {} layers), chunk of {} tokens at depth {}",
                model_args.path()?.display(),
                arch.arch,
                arch.n_layers(),
                args.chunk,
                args.depth
            );
            println!("layers: {}", arch.layer_summary());
            for note in file.notes() {
                println!("note: {note}");
            }
            println!(
                "to get it: model loaded in {:.2} s (memory-mapped, prefetched by llama.cpp, weights not repacked); \
                 llama.cpp computed {} of the chunk's {} nodes{} in {:.2} s; peak RSS {:.2} GB\n",
                engine.load_ms() / 1e3,
                capture.chunk_nodes_computed,
                graph.len(),
                if capture.filled_tokens > 0 {
                    format!(" after filling the context with {} tokens", capture.filled_tokens)
                } else {
                    String::new()
                },
                capture.wall_ms / 1e3,
                opledger_core::system::peak_rss_bytes().unwrap_or(0) as f64 / 1e9
            );
            if args.nodes {
                println!(
                    "{}\n",
                    opledger_report::census::node_listing(&graph, &assignments)
                );
            }
            print!("{}", opledger_report::census::census_text(&c, args.shapes));
        }
        let bad = c.mismatches();
        if bad.is_empty() {
            Ok(ExitCode::SUCCESS)
        } else {
            for e in bad {
                eprintln!(
                    "census mismatch: {} in band {}: expected {} ({}), found {}",
                    e.op,
                    e.band,
                    e.expected.map(|x| x.to_string()).unwrap_or_default(),
                    e.rule,
                    e.found
                );
            }
            Ok(ExitCode::from(crate::exit::CHECK_FAILED))
        }
    }
    #[cfg(not(feature = "llama"))]
    {
        let _ = (rules, work, file, args);
        anyhow::bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
    }
}
