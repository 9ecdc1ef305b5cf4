//! `opledger ops`: every distinct (op, shapes, types) of the census of a prefill chunk or of one
//! decode step timed alone on llama.cpp's CPU backend, expert matmuls under three routings with
//! the weight bytes each reads, set against the in-graph band times.

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
    /// Decode instead of prefill: the ops of one decode step (one token per sequence) timed
    /// alone, against the in-graph bands of this many decode steps per sequence.
    #[arg(short = 'n', long = "decode", default_value_t = 0)]
    pub decode: u32,
    /// Sequences decoded together (decode only): the activations of every op have this many
    /// rows, and the captured routing touches the experts of this many tokens.
    #[arg(long, default_value_t = 1)]
    pub parallel: u32,
    /// Write this many MiB before every timed repetition, untimed, so that weights come from
    /// memory and not from the cache (default: for decode, twice the last-level cache the
    /// system reports; for prefill, none).
    #[arg(long)]
    pub flush_mib: Option<u64>,
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

/// The last-level cache the system reports, in bytes (`None` where it reports none).
pub fn last_level_cache_bytes() -> Option<u64> {
    let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
    let mut best: Option<(u32, u64)> = None;
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let read = |f: &str| std::fs::read_to_string(entry.path().join(f)).ok();
        let (Some(level), Some(size)) = (read("level"), read("size")) else {
            continue;
        };
        let Ok(level) = level.trim().parse::<u32>() else {
            continue;
        };
        let size = size.trim();
        let (num, unit) = size.split_at(
            size.find(|c: char| !c.is_ascii_digit())
                .unwrap_or(size.len()),
        );
        let Ok(num) = num.parse::<u64>() else {
            continue;
        };
        let bytes = num
            * match unit {
                "K" => 1 << 10,
                "M" => 1 << 20,
                "G" => 1 << 30,
                _ => 1,
            };
        if best.is_none_or(|(l, _)| level > l) {
            best = Some((level, bytes));
        }
    }
    best.map(|(_, b)| b)
}

pub fn run(args: OpsArgs) -> Result<ExitCode> {
    if args.chunk == 0 {
        bail!("--chunk must be at least 1");
    }
    if args.parallel == 0 {
        bail!("--parallel takes a sequence count of at least 1");
    }
    if args.decode == 0 && args.parallel != 1 {
        bail!("--parallel applies to decode (-n N)");
    }
    let decode = args.decode > 0;
    let flush_bytes = match args.flush_mib {
        Some(mib) => mib << 20,
        None if decode => last_level_cache_bytes().map(|b| 2 * b).unwrap_or(1 << 30),
        None => 0,
    };
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
            band_weight_bytes, distinct_experts, routing_ids, summarise_ops, OpRow, OpsWork,
        };
        let out = super::common::run_path(args.output.as_deref(), "ops", &model_path);
        let folder = RunFolder::create(&out)?;
        let mut model_args = args.model.clone();
        model_args.model = Some(model_path.clone());
        let mut engine = super::common::load_llama(&model_args, false)?;
        let cfg = ProfileConfig {
            work: Work {
                decode_tokens: args.decode,
                parallel: args.parallel,
                ..Work::prefill(args.chunk, args.depth)
            },
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
        // the ids of a real run: of the chunk, or of a decode run's last step (the graph of a
        // decode run is one step's)
        let captured: BTreeMap<u32, Vec<i32>> = engine.capture_routing()?.into_iter().collect();
        let census = opledger_core::census::census(&raw.graph, &assignments, &file.arch, true);
        // distinct experts per expert matmul, and the weight bytes each routing reads per band
        let mut experts_by_routing: BTreeMap<String, BTreeMap<u32, u32>> = BTreeMap::new();
        let mut bytes: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
        for &r in &routings {
            let mut used = BTreeMap::new();
            for n in raw.graph.iter().filter(|n| n.op == "MUL_MAT_ID") {
                match routing_ids(n, r, args.seed, &captured) {
                    Some(ids) => {
                        used.insert(n.index, distinct_experts(&ids));
                    }
                    None => bail!("no routing was captured for node {}", n.index),
                }
            }
            bytes.insert(
                r.name().to_string(),
                band_weight_bytes(&raw.graph, &assignments, &used),
            );
            experts_by_routing.insert(r.name().to_string(), used);
        }
        let rotate = args.rotate_mib << 20;
        let mut rows = Vec::new();
        bar.set_length(census.shapes.len() as u64);
        for (i, shape) in census.shapes.iter().enumerate() {
            bar.set_position(i as u64);
            bar.set_message(format!("alone: {}", shape.op));
            let node = &raw.graph[shape.first_node as usize];
            if node.op == "MUL_MAT_ID" {
                node.src(2).context("an expert matmul without ids")?;
                let experts = node.src(0).map(|w| w.ne[2] as u32).unwrap_or(1).max(1);
                let expert_bytes = node
                    .src(0)
                    .map(|w| w.size_bytes / experts as u64)
                    .unwrap_or(0);
                for &r in &routings {
                    let Some(ids) = routing_ids(node, r, args.seed, &captured) else {
                        bail!("no routing was captured for node {}", shape.first_node)
                    };
                    let t = engine
                        .time_node_flushed(node, Some(&ids), args.reps, rotate, flush_bytes)
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
                    .time_node_flushed(node, None, args.reps, rotate, flush_bytes)
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
        // decode: the shares with each node's isolation removed (a decode node's work is small
        // beside what isolating it costs)
        let in_graph: BTreeMap<String, f64> = summary
            .bands
            .iter()
            .map(|b| {
                let ms = if decode {
                    b.ms_per_token_corrected
                } else {
                    b.ms_per_token
                };
                (b.band.clone(), ms)
            })
            .collect();
        let moe = rules
            .ffn_band_for(&file.arch)
            .filter(|_| file.arch.is_moe());
        // one graph: the chunk, or one decode step of P tokens (a decode run's wall is its steps)
        let steps = args.decode.max(1);
        let mut ops = summarise_ops(
            &bands,
            &in_graph,
            rows,
            &routings,
            OpsWork {
                tokens: summary.tokens / steps,
                decode_tokens: args.decode,
                parallel: args.parallel,
            },
            summary.fused_ms / steps as f64,
            moe.as_deref(),
            &bytes,
        );
        ops.flush_bytes = flush_bytes;
        ops.experts_by_routing = experts_by_routing;
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
