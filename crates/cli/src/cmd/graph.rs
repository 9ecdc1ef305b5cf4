//! `opledger graph`: the census of the graph an engine computes for a chunk at a depth: every
//! node in order with its band, counts per op, band, layer kind and distinct shape, and the
//! cross-check against the architecture.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use opledger_app::bands::Bands;
use opledger_app::engines::{open_engine, EngineKind};
use opledger_core::engine::Work;
use opledger_core::run_folder::RunFolder;

use super::common::{EngineArg, ModelArgs, RpcArgs, Term};

#[derive(Args)]
pub struct GraphArgs {
    #[command(flatten)]
    model: ModelArgs,
    #[command(flatten)]
    rpc: RpcArgs,
    /// The engine whose graph to count (one that can capture its graph).
    #[arg(long, value_enum, default_value_t = EngineArg::LlamaCpp)]
    engine: EngineArg,
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

pub fn run(args: GraphArgs) -> Result<ExitCode> {
    let kind = EngineKind::from(args.engine);
    let file = args.model.open(kind)?;
    let bands = Bands::load(args.bands.as_deref(), &file.arch.arch)?;
    let work = Work {
        chunk_tokens: args.chunk,
        depth_tokens: args.depth,
        all_logits: args.all_logits,
        token_seed: 0,
        decode_tokens: 0,
        parallel: 1,
    };
    let folder = args.output.as_deref().map(RunFolder::create).transpose()?;
    // No weight repacking: the file stays memory-mapped and only touched pages are read.
    let settings = opledger_app::engines::EngineSettings {
        no_repack: true,
        rpc: args.rpc.settings(),
        ..args.model.settings()
    };
    let measured = (|| {
        let mut engine = open_engine(kind, &file, &settings)?;
        let engine_name = engine.info().engine;
        let mut ui = Term::new(true);
        let g = opledger_app::graph::run(engine.as_mut(), &file.arch, &bands, &work, &mut ui)?;
        anyhow::Ok((engine_name, g))
    })();
    // a remote device failing mid-run leaves the folder marked with why
    let (engine_name, g) = match &folder {
        Some(f) => super::common::stop_on_remote_failure(f.path(), measured)?,
        None => measured?,
    };
    let arch = &file.arch;
    let label = file.path().display().to_string();
    if let Some(folder) = folder {
        g.write(&folder, arch, &label)?;
        folder.finish()?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&g.export(arch))?);
    } else {
        let graph = &g.capture.nodes;
        println!(
            "graph of {label} ({}, {} layers), chunk of {} tokens at depth {}",
            arch.arch,
            arch.n_layers(),
            args.chunk,
            args.depth
        );
        println!("layers: {}", arch.layer_summary());
        for note in file.notes() {
            println!("note: {note}");
        }
        let load = g
            .load_s
            .map(|s| format!("model loaded in {s:.2} s (weights not repacked); "))
            .unwrap_or_default();
        println!(
            "to get it: {load}{engine_name} computed {} of the chunk's {} nodes{} in {:.2} s; peak RSS {:.2} GB\n",
            g.capture.chunk_nodes_computed,
            graph.len(),
            if g.capture.filled_tokens > 0 {
                format!(
                    " after filling the context with {} tokens",
                    g.capture.filled_tokens
                )
            } else {
                String::new()
            },
            g.capture.wall_ms / 1e3,
            opledger_core::system::peak_rss_bytes().unwrap_or(0) as f64 / 1e9
        );
        if args.nodes {
            println!(
                "{}\n",
                opledger_report::census::node_listing(graph, &g.assignments)
            );
        }
        print!(
            "{}",
            opledger_report::census::census_text(&g.census, args.shapes)
        );
        let runs = opledger_core::split::device_runs(graph);
        if !runs.is_empty() {
            println!("\nsplits ({}):", runs.len());
            for r in &runs {
                println!("  {}", opledger_report::profile::device_run_line(r));
            }
        }
    }
    Ok(super::common::exit(g.exit()))
}
