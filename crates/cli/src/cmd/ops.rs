//! `opledger ops`: every distinct (op, shapes, types) of the census timed alone on llama.cpp's
//! CPU backend, expert matmuls under three routings, set against the in-graph band times.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;
use opledger_core::engine::Work;
use opledger_core::ops::Routing;
use opledger_core::profile::ProfileConfig;
use opledger_core::run_folder::RunFolder;

use super::common::ModelArgs;
use super::profile::{load_rules, manifest};
use crate::model_file::ModelFile;
use crate::progress::steps_bar;

#[derive(Args)]
pub struct OpsArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Tokens in the chunk.
    #[arg(short = 'p', long, default_value_t = 512, value_parser = super::flags::at_least_one)]
    pub chunk: u32,
    /// Tokens already in the context.
    #[arg(short = 'd', long, default_value_t = 0)]
    pub depth: u32,
    /// Routings of the expert matmuls.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "first-k,uniform,captured"
    )]
    pub routing: Vec<String>,
    /// Profile cycles for the in-graph band times.
    #[arg(short = 'r', long, default_value_t = 3, value_parser = super::flags::at_least_one)]
    pub cycles: u32,
    /// Timed repetitions of each op alone.
    #[arg(long, default_value_t = 15, value_parser = super::flags::at_least_one)]
    pub reps: u32,
    /// Input copies rotated over, up to this many MiB per op (weights not all cache-warm).
    #[arg(long, default_value_t = 256)]
    pub rotate_mib: u64,
    /// Seed of the uniform routing.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    #[arg(short, long)]
    pub output: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(args: OpsArgs) -> Result<ExitCode> {
    let routings: Vec<Routing> = args
        .routing
        .iter()
        .map(|r| {
            Routing::parse(r)
                .with_context(|| format!("--routing: unknown '{r}' (first-k, uniform, captured)"))
        })
        .collect::<Result<_>>()?;
    let model_path = args.model.path()?;
    let file = ModelFile::open(&model_path)?;
    super::common::print_notes(&file);
    let rules = load_rules(None, &file.arch.arch)?;
    #[cfg(not(feature = "llama"))]
    {
        let _ = (routings, file, rules);
        bail!("this opledger was built without the llama.cpp engine (feature `llama`)")
    }
    #[cfg(feature = "llama")]
    {
        use opledger_core::engine::Engine;
        use opledger_core::ops::{
            distinct_experts, first_k_ids, summarise_ops, uniform_ids, OpRow,
        };
        let out = super::common::run_path(args.output.as_deref(), "ops", &model_path);
        let folder = RunFolder::create(&out)?;
        let mut model_args = args.model.clone();
        model_args.model = Some(model_path.clone());
        let mut engine = super::common::load_llama(&model_args, false)?;
        let cfg = ProfileConfig {
            work: Work::prefill(args.chunk, args.depth),
            cycles: args.cycles,
            warmup: 1,
            overhead_pairs: 0,
            gate: Default::default(),
        };
        let bar = steps_bar(args.quiet || args.json);
        let raw = opledger_core::profile::measure(&mut engine, &cfg, &mut |phase, done, total| {
            bar.set_message(format!("in-graph: {phase}"));
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })?;
        let (assignments, summary) = opledger_core::profile::analyse(&raw, &rules, &file.arch)?;
        let captured: BTreeMap<u32, Vec<i32>> = engine.capture_routing()?.into_iter().collect();
        let census = opledger_core::census::census(&raw.graph, &assignments, &file.arch, true);
        let rotate = args.rotate_mib << 20;
        let mut rows = Vec::new();
        bar.set_length(census.shapes.len() as u64);
        for (i, shape) in census.shapes.iter().enumerate() {
            bar.set_position(i as u64);
            bar.set_message(format!("alone: {}", shape.op));
            let node = &raw.graph[shape.first_node as usize];
            if node.op == "MUL_MAT_ID" {
                let (n_used, n_tokens) = node
                    .src(2)
                    .map(|ids| (ids.ne[0] as u32, ids.ne[1] as u32))
                    .context("an expert matmul without ids")?;
                let experts = node.src(0).map(|w| w.ne[2] as u32).unwrap_or(1).max(1);
                let expert_bytes = node
                    .src(0)
                    .map(|w| w.size_bytes / experts as u64)
                    .unwrap_or(0);
                for &r in &routings {
                    let ids = match r {
                        Routing::FirstK => first_k_ids(n_used, n_tokens),
                        Routing::Uniform => uniform_ids(experts, n_used, n_tokens, args.seed),
                        Routing::Captured => match captured.get(&shape.first_node) {
                            Some(ids) => ids.clone(),
                            None => bail!("no routing was captured for node {}", shape.first_node),
                        },
                    };
                    let t = engine
                        .time_node(node, Some(&ids), args.reps, rotate)
                        .with_context(|| {
                            format!(
                                "timing node {} ({} {}) alone",
                                node.index, node.op, node.name
                            )
                        })?;
                    let touched = distinct_experts(&ids);
                    rows.push(OpRow {
                        op: shape.op.clone(),
                        band: shape.band.clone(),
                        signature: shape.signature.clone(),
                        count: shape.count,
                        routing: Some(r),
                        median_us: t.median_us,
                        min_us: t.min_us,
                        max_us: t.max_us,
                        reps: t.reps,
                        experts_touched: Some(touched),
                        expert_bytes: Some(touched as u64 * expert_bytes),
                        rotation: t.rotation,
                    });
                }
            } else {
                let t = engine
                    .time_node(node, None, args.reps, rotate)
                    .with_context(|| {
                        format!(
                            "timing node {} ({} {}) alone",
                            node.index, node.op, node.name
                        )
                    })?;
                rows.push(OpRow {
                    op: shape.op.clone(),
                    band: shape.band.clone(),
                    signature: shape.signature.clone(),
                    count: shape.count,
                    routing: None,
                    median_us: t.median_us,
                    min_us: t.min_us,
                    max_us: t.max_us,
                    reps: t.reps,
                    experts_touched: None,
                    expert_bytes: None,
                    rotation: t.rotation,
                });
            }
        }
        bar.finish_and_clear();
        let bands: Vec<String> = summary.bands.iter().map(|b| b.band.clone()).collect();
        let in_graph: BTreeMap<String, f64> = summary
            .bands
            .iter()
            .map(|b| (b.band.clone(), b.ms_per_token))
            .collect();
        let moe = rules
            .ffn_band_for(&file.arch)
            .filter(|_| file.arch.is_moe());
        let ops = summarise_ops(
            &bands,
            &in_graph,
            rows,
            &routings,
            summary.tokens,
            summary.fused_ms,
            moe.as_deref(),
        );
        let m = manifest("ops", &file, &model_path, engine.info(), &rules)?;
        let title = format!(
            "{} · {} · {} · {} threads · ops alone against in-graph",
            m.model_label(),
            file.arch.arch,
            m.engine.version,
            m.engine.threads
        );
        let text = opledger_report::ops::ops_text(&title, &ops);
        folder.write_json("manifest.json", &m)?;
        folder.write_json("raw.json", &raw)?;
        folder.write_json("ops.json", &ops)?;
        folder.write("table.txt", text.as_bytes())?;
        let dir = folder.finish()?;
        if args.json {
            println!("{}", serde_json::to_string_pretty(&ops)?);
        } else if !args.quiet {
            print!("{text}");
            println!("run folder: {}", dir.display());
        }
        Ok(ExitCode::SUCCESS)
    }
}
