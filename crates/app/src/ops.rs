//! `ops`: every distinct (op, shapes, types) of the census of a prefill chunk or of one decode
//! step timed alone, expert matmuls under several routings with the weight bytes each reads,
//! set against the in-graph band times.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use opledger_core::engine::{Capability, Engine, OpTimeRequest, Work};
use opledger_core::manifest::Manifest;
use opledger_core::ops::{
    band_weight_bytes, distinct_experts, routing_ids, summarise_ops, OpRow, OpsSummary, OpsWork,
    Routing,
};
use opledger_core::profile::{ProfileConfig, ProfileRaw};

use crate::bands::Bands;
use crate::model::ModelFile;
use crate::ui::Ui;

/// What to time.
#[derive(Debug, Clone)]
pub struct OpsRequest {
    /// The chunk, or decode steps (one step's ops are timed; the in-graph profile decodes them
    /// all).
    pub work: Work,
    /// Profile cycles for the in-graph band times.
    pub cycles: u32,
    pub routings: Vec<Routing>,
    /// Timed repetitions of each op alone.
    pub reps: u32,
    /// Input copies rotated over, up to this many bytes per op.
    pub rotate_bytes: u64,
    /// Bytes written before every repetition, untimed (see [`default_flush_bytes`]).
    pub flush_bytes: u64,
    /// Seed of the uniform routing.
    pub seed: u64,
}

/// For decode, twice the last-level cache the system reports (a step's weights then come from
/// memory, as in a model larger than the cache); for prefill, nothing.
pub fn default_flush_bytes(decode: bool) -> u64 {
    if decode {
        last_level_cache_bytes().map(|b| 2 * b).unwrap_or(1 << 30)
    } else {
        0
    }
}

/// An ops run: its manifest, the in-graph profile's raw data, and the summary.
pub struct OpsRun {
    pub manifest: Manifest,
    pub raw: ProfileRaw,
    pub summary: OpsSummary,
}

/// Profiles `req.work` in the graph, then times every distinct op of its census alone.
pub fn run(
    engine: &mut dyn Engine,
    file: &ModelFile,
    bands: &Bands,
    req: &OpsRequest,
    ui: &mut dyn Ui,
) -> Result<OpsRun> {
    let decode = req.work.is_decode();
    if decode {
        engine.require(Capability::Decode)?;
    }
    engine.require(Capability::OpTiming)?;
    let rules = &bands.rules;
    let cfg = ProfileConfig {
        work: req.work.clone(),
        cycles: req.cycles,
        warmup: 1,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = opledger_core::profile::measure(engine, &cfg, &mut |phase, done, total| {
        ui.progress(done as u64, total as u64, &format!("in-graph: {phase}"));
    })?;
    let (assignments, summary) = opledger_core::profile::analyse(&raw, rules, &file.arch)?;
    let timer = engine.op_timer()?;
    // the ids of a real run: of the chunk, or of a decode run's last step (the graph of a
    // decode run is one step's)
    let captured: BTreeMap<u32, Vec<i32>> = timer.capture_routing()?.into_iter().collect();
    let census = opledger_core::census::census(&raw.graph, &assignments, &file.arch, true);
    // distinct experts per expert matmul, and the weight bytes each routing reads per band
    let mut experts_by_routing: BTreeMap<String, BTreeMap<u32, u32>> = BTreeMap::new();
    let mut bytes: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for &r in &req.routings {
        let mut used = BTreeMap::new();
        for n in raw.graph.iter().filter(|n| n.op == "MUL_MAT_ID") {
            match routing_ids(n, r, req.seed, &captured) {
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
    let mut rows = Vec::new();
    let total = census.shapes.len() as u64;
    for (i, shape) in census.shapes.iter().enumerate() {
        ui.progress(i as u64, total, &format!("alone: {}", shape.op));
        let node = &raw.graph[shape.first_node as usize];
        let time = |timer: &mut dyn opledger_core::engine::OpTimer, ids: Option<&[i32]>| {
            timer
                .time_node(
                    node,
                    &OpTimeRequest {
                        routing: ids,
                        reps: req.reps,
                        rotate_bytes: req.rotate_bytes,
                        flush_bytes: req.flush_bytes,
                    },
                )
                .with_context(|| {
                    format!(
                        "timing node {} ({} {}) alone",
                        node.index, node.op, node.name
                    )
                })
        };
        let row = |routing, t: &opledger_core::engine::OpTime, touched: Option<u32>, bytes| OpRow {
            op: shape.op.clone(),
            band: shape.band.clone(),
            signature: shape.signature.clone(),
            count: shape.count,
            routing,
            median_us: t.median_us,
            min_us: t.min_us,
            max_us: t.max_us,
            reps: t.reps,
            experts_touched: touched,
            expert_bytes: bytes,
            rotation: t.rotation,
        };
        if node.op == "MUL_MAT_ID" {
            node.src(2).context("an expert matmul without ids")?;
            let experts = node.src(0).map(|w| w.ne[2] as u32).unwrap_or(1).max(1);
            let expert_bytes = node
                .src(0)
                .map(|w| w.size_bytes / experts as u64)
                .unwrap_or(0);
            for &r in &req.routings {
                let Some(ids) = routing_ids(node, r, req.seed, &captured) else {
                    bail!("no routing was captured for node {}", shape.first_node)
                };
                let t = time(timer, Some(&ids))?;
                let touched = distinct_experts(&ids);
                rows.push(row(
                    Some(r),
                    &t,
                    Some(touched),
                    Some(touched as u64 * expert_bytes),
                ));
            }
        } else {
            let t = time(timer, None)?;
            rows.push(row(None, &t, None, None));
        }
    }
    let band_names: Vec<String> = summary.bands.iter().map(|b| b.band.clone()).collect();
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
    let steps = req.work.decode_tokens.max(1);
    let mut ops = summarise_ops(
        &band_names,
        &in_graph,
        rows,
        &req.routings,
        OpsWork {
            tokens: summary.tokens / steps,
            decode_tokens: req.work.decode_tokens,
            parallel: req.work.parallel,
        },
        summary.fused_ms / steps as f64,
        moe.as_deref(),
        &bytes,
    );
    if decode {
        // a band whose nodes the isolation removal stopped at 0 says so beside its figure
        for b in &mut ops.bands {
            b.in_graph_clamped_nodes = summary
                .band(&b.band)
                .map_or(0, |r| r.corrected_clamped_nodes);
        }
    }
    ops.flush_bytes = req.flush_bytes;
    ops.experts_by_routing = experts_by_routing;
    let manifest = crate::manifest::manifest("ops", file, engine.info(), rules)?;
    Ok(OpsRun {
        manifest,
        raw,
        summary: ops,
    })
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
