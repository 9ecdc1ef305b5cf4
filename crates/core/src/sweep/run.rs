//! The sweep's measurement loop: per cycle, FUSED and TIMED in lockstep, each mode's context
//! refilled to where its stored records end, then every depth measured in both modes back to
//! back (which goes first alternating by depth and by cycle), every record stored as it lands.

use std::time::Instant;

use super::record::{mode_name, ChunkRecord, ChunkStore, PassLog, Phase};
use super::{SweepConfig, SweepError};
use crate::engine::{EngineError, Mode, SweepEngine};
use crate::outputs::{compare_rows, At};

/// Progress of a sweep: (units done, units in all, what is running).
pub type SweepProgress<'a> = &'a mut dyn FnMut(u64, u64, &str);

/// How many units (prefill chunk, then its decode steps where the sweep decodes) of a mode's
/// pass are stored, checking they are a prefix.
fn stored_units(
    store: &dyn ChunkStore,
    cfg: &SweepConfig,
    cycle: u32,
    mode: Mode,
) -> Result<u32, SweepError> {
    let prefix = |phase: Phase| -> Result<u32, SweepError> {
        let mut found = store.stored(cycle, mode, phase)?;
        found.sort_unstable();
        found.dedup();
        if found.iter().enumerate().any(|(i, &c)| c != i as u32) {
            return Err(SweepError::Gap {
                cycle,
                mode: mode_name(mode).into(),
                phase: format!("{phase:?}").to_lowercase(),
                found,
            });
        }
        Ok(found.len() as u32)
    };
    let prefill = prefix(Phase::Prefill)?;
    if cfg.decode.is_none() {
        return Ok(prefill);
    }
    let decode = prefix(Phase::Decode)?;
    // decode c follows prefill c: c prefills and c or c - 1 decodes
    if decode > prefill || decode + 1 < prefill {
        return Err(SweepError::Gap {
            cycle,
            mode: mode_name(mode).into(),
            phase: "decode".into(),
            found: (0..decode).collect(),
        });
    }
    Ok(prefill + decode)
}

/// Runs (or resumes) the sweep. Per cycle, each mode's context is refilled (untimed) to where
/// its stored records end; then unit by unit (chunk c, the decode steps after it, chunk c + 1,
/// ...) both modes measure it back to back from the same state, FUSED first at even chunks and
/// TIMED first at odd ones. `graph_len` / `decode_graph_len` are the node counts every TIMED
/// prefill / decode unit must have. With `compare_outputs` (a graph on a device other than the
/// CPU, whose backend may fuse ops in FUSED and not in TIMED), the first unit of each pair has
/// its logits read (a chunk's last token; decode steps: the last step's, a row per sequence),
/// and the second, where its output hash differs, its logits compared with them, the FUSED
/// unit's as the reference ([`ChunkRecord::outputs_nmse`]).
pub fn run_sweep(
    engine: &mut dyn SweepEngine,
    cfg: &SweepConfig,
    graph_len: usize,
    decode_graph_len: usize,
    store: &mut dyn ChunkStore,
    compare_outputs: bool,
    progress: SweepProgress<'_>,
) -> Result<(), SweepError> {
    let mut compare_outputs = compare_outputs;
    let per_chunk = cfg.units_per_chunk();
    let units = cfg.chunks * per_chunk;
    let total = cfg.cycles as u64 * 2 * units as u64;
    let mut done = 0u64;
    // the noise gate's judgement without its retakes: /proc and the canary on the engine's threads
    let mut gate =
        crate::noise::Gate::new(&crate::noise::GateConfig::default(), engine.info().threads);
    const MODES: [Mode; 2] = [Mode::Fused, Mode::Timed];
    for cycle in 0..cfg.cycles {
        let mut first = [0u32; 2];
        let mut logs: Vec<Option<(Instant, PassLog)>> = vec![None, None];
        for (m, mode) in MODES.into_iter().enumerate() {
            first[m] = stored_units(store, cfg, cycle, mode)?;
            done += first[m] as u64;
            if first[m] >= units {
                continue;
            }
            let t0 = Instant::now();
            progress(
                done,
                total,
                &format!("cycle {} {} refill", cycle + 1, mode_name(mode)),
            );
            // the context must hold every chunk before the first unit to measure: a decode unit
            // comes after its chunk
            let refill = first[m].div_ceil(per_chunk);
            engine.start_pass(mode, refill)?;
            logs[m] = Some((
                t0,
                PassLog {
                    cycle,
                    mode,
                    first_chunk: first[m] / per_chunk,
                    fill_ms: t0.elapsed().as_secs_f64() * 1e3,
                    total_ms: 0.0,
                    noisy_chunks: 0,
                },
            ));
        }
        let start = first.iter().copied().min().unwrap_or(units);
        // time spent on each mode's units, for the cost; a mode's refill is in its fill_ms
        let mut spent_ms = [0f64; 2];
        for unit in start..units {
            let chunk = unit / per_chunk;
            let phase = if unit % per_chunk == 0 {
                Phase::Prefill
            } else {
                Phase::Decode
            };
            // which mode goes first alternates by depth and by cycle, so each depth is measured
            // in both orders when the cycles are even (the second run of a pair finds warmer
            // caches: about 10 % on a tiny model's decode steps)
            let order = if (chunk + cycle).is_multiple_of(2) {
                [0, 1]
            } else {
                [1, 0]
            };
            // the pair's first unit: its output hash and logits, where read
            let mut first_outputs: Option<(u64, Vec<Vec<f32>>)> = None;
            for m in order {
                let mode = MODES[m];
                if unit < first[m] {
                    continue;
                }
                let depth = match phase {
                    Phase::Prefill => cfg.depth_of(chunk),
                    Phase::Decode => cfg.decode_depth_of(chunk),
                };
                progress(
                    done,
                    total,
                    &format!(
                        "cycle {} {} {} at depth {depth}",
                        cycle + 1,
                        mode_name(mode),
                        match phase {
                            Phase::Prefill => "prefill",
                            Phase::Decode => "decode",
                        }
                    ),
                );
                let t_unit = Instant::now();
                let o = gate.observe(&mut || match (phase, cfg.decode) {
                    (Phase::Prefill, _) => engine.pass_chunk(mode, chunk),
                    (Phase::Decode, Some(d)) => {
                        engine.pass_decode(mode, chunk, d.steps, d.parallel)
                    }
                    (Phase::Decode, None) => {
                        unreachable!("decode units only where the sweep decodes")
                    }
                })?;
                // judged as the gate judges (/proc from 20 ms of the unit, the canary around it)
                if o.noisy(&gate.cfg) {
                    if let Some((_, log)) = logs[m].as_mut() {
                        log.noisy_chunks += 1;
                    }
                }
                let t = o.value;
                let want = match phase {
                    Phase::Prefill => graph_len,
                    Phase::Decode => decode_graph_len,
                };
                if mode == Mode::Timed && t.node_us.len() != want {
                    return Err(EngineError::GraphChanged(format!(
                        "{} {chunk} timed {} nodes, the graph has {want}",
                        match phase {
                            Phase::Prefill => "chunk",
                            Phase::Decode => "the decode steps after chunk",
                        },
                        t.node_us.len()
                    ))
                    .into());
                }
                // a TIMED decode unit's isolation cost, measured now, to be removed from it
                // (node by node where the engine calibrates each node of the decode graph)
                let (isolation_us, isolation_node_us) = match (mode, phase) {
                    (Mode::Timed, Phase::Decode) => match engine.calibrate_sweep_decode()? {
                        Some(c) if c.each_node_us.len() == t.node_us.len() => (
                            c.per_node_us,
                            c.each_node_us.iter().map(|&v| v as f32).collect(),
                        ),
                        Some(c) => (c.per_node_us, Vec::new()),
                        None => (0.0, Vec::new()),
                    },
                    _ => (0.0, Vec::new()),
                };
                let mut outputs_nmse = None;
                if compare_outputs {
                    match &first_outputs {
                        None => match engine.logits() {
                            Ok(l) => first_outputs = Some((t.output_hash, l)),
                            Err(EngineError::Unsupported { .. } | EngineError::Lacks { .. }) => {
                                compare_outputs = false
                            }
                            Err(e) => return Err(e.into()),
                        },
                        Some((h, a)) if *h != t.output_hash => {
                            let b = engine.logits()?;
                            // against FUSED's logits, whichever mode went first
                            let (fused, timed) = if mode == Mode::Fused {
                                (&b, a)
                            } else {
                                (a, &b)
                            };
                            outputs_nmse = fused
                                .iter()
                                .zip(timed)
                                .enumerate()
                                .map(|(i, (f, t))| compare_rows(At::Position(i as u32), f, t).nmse)
                                .reduce(|x, y| {
                                    if x.is_nan() || y.is_nan() {
                                        f64::NAN
                                    } else {
                                        x.max(y)
                                    }
                                });
                        }
                        Some(_) => {}
                    }
                }
                store.store(&ChunkRecord {
                    cycle,
                    mode,
                    chunk,
                    phase,
                    wall_ms: t.wall_ms,
                    output_hash: t.output_hash,
                    isolation_us,
                    isolation_node_us,
                    node_us: t.node_us.iter().map(|&v| v as f32).collect(),
                    outputs_nmse,
                })?;
                spent_ms[m] += t_unit.elapsed().as_secs_f64() * 1e3;
                done += 1;
            }
        }
        for (m, log) in logs.into_iter().enumerate() {
            if let Some((_, mut log)) = log {
                log.total_ms = log.fill_ms + spent_ms[m];
                store.store_pass(&log)?;
            }
        }
    }
    progress(total, total, "done");
    Ok(())
}
