//! `opledger graph`: every node of the graph llama.cpp computes for a chunk at a depth, in order,
//! with its band.

use std::process::ExitCode;

use anyhow::Result;
use clap::Args;
use opledger_core::band::{BandRules, Categoriser};
use opledger_core::engine::{Engine, Work};

use super::common::ModelArgs;

#[derive(Args)]
pub struct GraphArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens in the chunk.
    #[arg(short = 'p', long, default_value_t = 512)]
    chunk: u32,
    /// Tokens already in the context.
    #[arg(short = 'd', long, default_value_t = 0)]
    depth: u32,
    /// Request logits for every token of the chunk.
    #[arg(long)]
    all_logits: bool,
    /// Print the node list as JSON.
    #[arg(long)]
    json: bool,
}

pub fn run(args: GraphArgs) -> Result<ExitCode> {
    let mut model_args = args.model.clone();
    model_args.model = Some(model_args.path()?);
    let file = model_args.open()?;
    let rules = BandRules::builtin(&file.arch.arch)?;
    #[cfg(feature = "llama")]
    {
        let mut engine = super::common::load_llama(&model_args)?;
        engine.prepare(&Work {
            chunk_tokens: args.chunk,
            depth_tokens: args.depth,
            all_logits: args.all_logits,
            token_seed: 0,
        })?;
        let graph = engine.graph()?;
        let cat = Categoriser::new(&rules, &file.arch);
        let assignments = cat.categorise(&graph);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&graph)?);
            return Ok(ExitCode::SUCCESS);
        }
        for (n, a) in graph.iter().zip(&assignments) {
            let srcs: Vec<String> = n
                .srcs
                .iter()
                .flatten()
                .map(|s| {
                    format!(
                        "{}{}{}",
                        s.name,
                        s.shape_string(),
                        if s.is_weight { "W" } else { "" }
                    )
                })
                .collect();
            println!(
                "{:4} {:16} {:32} {:>3} {:16} {:?} {} {} | {}",
                n.index,
                n.op,
                n.name,
                n.layer.map(|l| l.to_string()).unwrap_or_default(),
                a.band,
                a.reason,
                n.out.shape_string(),
                n.out.ggml_type,
                srcs.join(" ")
            );
        }
        Ok(ExitCode::SUCCESS)
    }
    #[cfg(not(feature = "llama"))]
    {
        let _ = (rules, args);
        anyhow::bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
    }
}
