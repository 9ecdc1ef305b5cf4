//! A Perfetto / Chrome trace-event JSON of one TIMED cycle of a profile: the cycle whose TIMED
//! sum is the median, every node a complete event (`"ph":"X"`) laid end to end in graph order
//! (node i starts where node i-1 ended: in TIMED mode they ran one after another), on one track
//! per band or per layer, with metadata events naming the process and the tracks. Times are in
//! microseconds on a 1/16 µs grid, exact in binary floating point.

use std::collections::{BTreeMap, BTreeSet};

use opledger_core::band::Assignment;
use opledger_core::manifest::Manifest;
use opledger_core::node::{effective_layers, is_generic_name, NodeInfo, TensorDesc};
use opledger_core::profile::ProfileRaw;
use serde_json::{json, Value};

/// How nodes are put on tracks (Perfetto "threads").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceTracks {
    /// One track per band, in the rule set's order.
    Band,
    /// One track per layer, in layer order; nodes outside layers on a last track.
    Layer,
}

/// The process id of every event.
pub const PID: u32 = 1;

/// The cycle whose TIMED sum is the median: with an even count, the lower of the two middle
/// sums; ties go to the earlier cycle. `None` without cycles.
pub fn median_cycle(raw: &ProfileRaw) -> Option<usize> {
    let mut sums: Vec<(f64, usize)> = raw
        .cycles
        .iter()
        .enumerate()
        .map(|(i, c)| (c.node_us.iter().sum::<f64>(), i))
        .collect();
    if sums.is_empty() {
        return None;
    }
    sums.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    Some(sums[(sums.len() - 1) / 2].1)
}

fn tensor_label(t: &TensorDesc) -> String {
    format!(
        "{} {} {}",
        t.name,
        t.shape_string(),
        t.ggml_type.to_lowercase()
    )
}

/// The event name of a node: its own name, or its op where the name says nothing (`node_17`).
fn event_name(n: &NodeInfo) -> String {
    if is_generic_name(&n.name) {
        n.op.clone()
    } else {
        n.name.clone()
    }
}

/// Steps per microsecond of the trace's times: 1/16 µs (62.5 ns) is exact in binary floating
/// point, so `ts + dur` of one event is bit-equal to the next event's `ts` for any reader that
/// adds floats (Chrome's viewer does; Perfetto rounds to nanoseconds), and never overlaps it.
const STEPS_PER_US: f64 = 16.0;

/// A time in µs on the 1/16 µs grid.
fn on_grid(us: f64) -> f64 {
    (us * STEPS_PER_US).round() / STEPS_PER_US
}

/// The trace of the median TIMED cycle.
pub fn trace_json(
    m: &Manifest,
    raw: &ProfileRaw,
    assignments: &[Assignment],
    tracks: TraceTracks,
) -> Result<Vec<u8>, serde_json::Error> {
    let Some(cycle) = median_cycle(raw) else {
        return serde_json::to_vec(&json!({ "traceEvents": [] }));
    };
    let node_us = &raw.cycles[cycle].node_us;
    let layers = effective_layers(&raw.graph);
    let band_of = |i: usize| -> &str {
        assignments
            .get(i)
            .map(|a| a.band.as_str())
            .unwrap_or("unassigned")
    };

    // the tracks: (sort key, label) -> tid, tids numbered from 1 in sort order
    let mut keys: BTreeSet<(u32, String)> = BTreeSet::new();
    let track_key = |i: usize| -> (u32, String) {
        match tracks {
            TraceTracks::Band => {
                let band = band_of(i);
                let pos = m
                    .band_rules
                    .bands
                    .iter()
                    .position(|b| b.name == band)
                    .unwrap_or(m.band_rules.bands.len()) as u32;
                (pos, band.to_string())
            }
            TraceTracks::Layer => match layers[i] {
                Some(l) => (l, format!("layer {l}")),
                None => (u32::MAX, "outside layers".to_string()),
            },
        }
    };
    for i in 0..raw.graph.len() {
        keys.insert(track_key(i));
    }
    let tid_of: BTreeMap<(u32, String), u32> = keys
        .iter()
        .enumerate()
        .map(|(t, k)| (k.clone(), t as u32 + 1))
        .collect();

    let mut events: Vec<Value> = Vec::with_capacity(raw.graph.len() + 2 * tid_of.len() + 1);
    events.push(json!({
        "ph": "M", "pid": PID, "tid": 0, "name": "process_name",
        "args": { "name": format!(
            "{} · {} · TIMED cycle {} of {}",
            m.model_label(), m.engine.engine, cycle + 1, raw.cycles.len()
        ) },
    }));
    for ((_, label), tid) in &tid_of {
        events.push(json!({
            "ph": "M", "pid": PID, "tid": tid, "name": "thread_name",
            "args": { "name": label },
        }));
        events.push(json!({
            "ph": "M", "pid": PID, "tid": tid, "name": "thread_sort_index",
            "args": { "sort_index": tid },
        }));
    }
    // boundaries on the grid from the exact running sum: no rounding drift along the graph
    let mut elapsed_us = 0.0;
    let mut start = 0.0;
    for (i, n) in raw.graph.iter().enumerate() {
        let t = node_us.get(i).copied().unwrap_or(0.0);
        if t.is_finite() && t > 0.0 {
            elapsed_us += t;
        }
        let end = on_grid(elapsed_us);
        let srcs: Vec<Value> = n
            .srcs
            .iter()
            .map(|s| match s {
                Some(t) => Value::from(tensor_label(t)),
                None => Value::Null,
            })
            .collect();
        events.push(json!({
            "ph": "X",
            "pid": PID,
            "tid": tid_of[&track_key(i)],
            "name": event_name(n),
            "cat": band_of(i),
            "ts": start,
            "dur": end - start,
            "args": {
                "index": n.index,
                "op": n.op,
                "node": n.name,
                "layer": layers[i],
                "band": band_of(i),
                "output": format!("{} {}", n.out.shape_string(), n.out.ggml_type.to_lowercase()),
                "sources": srcs,
                "view": n.is_view,
                "skipped": n.skipped,
            },
        }));
        start = end;
    }
    let doc = json!({
        "traceEvents": events,
        "displayTimeUnit": "ns",
        "otherData": {
            "tool": m.tool,
            "command": m.command,
            "created_utc": m.created_utc,
            "model": m.model.path,
            "model_blake3": m.model.blake3,
            "engine": format!("{} {} · {} · {} threads", m.engine.engine, m.engine.version, m.engine.backend, m.engine.threads),
            "cycle": cycle + 1,
            "cycles": raw.cycles.len(),
            "timed_sum_us": start,
            "note": "TIMED mode: every node computed alone and waited on, so nodes ran one after another; times include the isolation cost",
        },
    });
    let mut bytes = serde_json::to_vec_pretty(&doc)?;
    bytes.push(b'\n');
    Ok(bytes)
}
