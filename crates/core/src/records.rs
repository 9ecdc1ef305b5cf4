//! opledger's node-record format: JSON lines, one record per node per run, so an engine in any
//! language can emit its own per-node times and get bands, agreement and coverage as llama.cpp
//! does. A file opens with one `run` record (schema version, engine, tokens per run, optionally
//! the architecture and band rules), then for every measured run `r` one `node` record per node
//! in graph order (mode `TIMED`: the node's own µs and the TIMED run's wall) and one `fused`
//! record (mode `FUSED`: the wall of the same work run without timing each node).

use std::io::BufRead;

use serde::{Deserialize, Serialize};

use crate::arch::ArchInfo;
use crate::band::BandRules;
use crate::node::NodeInfo;
use crate::profile::ProfileRaw;

/// The node-record format's version; a reader refuses a newer one.
pub const RECORDS_SCHEMA_VERSION: u32 = 1;

/// One line of a node-record file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum Record {
    /// The first line.
    Run {
        schema_version: u32,
        engine: String,
        /// Tokens one run computes (bands are per token).
        tokens: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        arch: Option<ArchInfo>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        band_rules: Option<BandRules>,
    },
    /// One node of run `run` timed alone (mode `TIMED`).
    Node {
        run: u32,
        mode: String,
        #[serde(flatten)]
        node: NodeInfo,
        us: f64,
        /// The wall of the TIMED run this node belongs to.
        run_wall_ms: f64,
    },
    /// Run `run`'s work without timing each node (mode `FUSED`).
    Fused {
        run: u32,
        mode: String,
        run_wall_ms: f64,
    },
}

/// A stored profile as node records.
pub fn profile_to_records(
    engine: &str,
    arch: &ArchInfo,
    rules: &BandRules,
    raw: &ProfileRaw,
) -> Vec<Record> {
    let mut out = vec![Record::Run {
        schema_version: RECORDS_SCHEMA_VERSION,
        engine: engine.to_string(),
        tokens: raw.config.work.tokens_per_run(),
        arch: Some(arch.clone()),
        band_rules: Some(rules.clone()),
    }];
    for (r, c) in raw.cycles.iter().enumerate() {
        for (node, us) in raw.graph.iter().zip(&c.node_us) {
            out.push(Record::Node {
                run: r as u32,
                mode: "TIMED".into(),
                node: node.clone(),
                us: *us,
                run_wall_ms: c.timed_wall_ms,
            });
        }
        out.push(Record::Fused {
            run: r as u32,
            mode: "FUSED".into(),
            run_wall_ms: c.fused_ms,
        });
    }
    out
}

/// Node records as JSON lines.
pub fn to_jsonl(records: &[Record]) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::new();
    for r in records {
        serde_json::to_writer(&mut out, r)?;
        out.push(b'\n');
    }
    Ok(out)
}

/// What a node-record file holds: its header and, per run, the node times and both walls.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordRun {
    pub engine: String,
    pub tokens: u32,
    pub arch: Option<ArchInfo>,
    pub band_rules: Option<BandRules>,
    pub graph: Vec<NodeInfo>,
    /// Per run: (node µs in graph order, TIMED wall ms, FUSED wall ms).
    pub runs: Vec<(Vec<f64>, f64, f64)>,
}

#[derive(Debug, thiserror::Error)]
pub enum RecordsError {
    #[error("{file}:{line}: {why}")]
    Bad {
        file: String,
        line: usize,
        why: String,
    },
    #[error("{file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
}

/// Reads node records (`file` names it in errors): every run must list the first run's nodes
/// in the same order and have its FUSED wall.
pub fn read_jsonl<R: BufRead>(reader: R, file: &str) -> Result<RecordRun, RecordsError> {
    let bad = |line: usize, why: String| RecordsError::Bad {
        file: file.to_string(),
        line,
        why,
    };
    let mut header: Option<RecordRun> = None;
    let mut timed: Vec<(Vec<f64>, f64)> = Vec::new();
    let mut fused: Vec<Option<f64>> = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.map_err(|source| RecordsError::Io {
            file: file.to_string(),
            source,
        })?;
        if line.trim().is_empty() {
            continue;
        }
        let rec: Record = serde_json::from_str(&line).map_err(|e| bad(n, e.to_string()))?;
        match (rec, header.as_mut()) {
            (
                Record::Run {
                    schema_version,
                    engine,
                    tokens,
                    arch,
                    band_rules,
                },
                None,
            ) => {
                if schema_version > RECORDS_SCHEMA_VERSION {
                    return Err(bad(n, format!("schema version {schema_version} is newer than this opledger reads ({RECORDS_SCHEMA_VERSION})")));
                }
                header = Some(RecordRun {
                    engine,
                    tokens: tokens.max(1),
                    arch,
                    band_rules,
                    graph: Vec::new(),
                    runs: Vec::new(),
                });
            }
            (Record::Run { .. }, Some(_)) => return Err(bad(n, "a second `run` record".into())),
            (_, None) => return Err(bad(n, "the first record must be a `run` record".into())),
            (
                Record::Node {
                    run,
                    mode,
                    node,
                    us,
                    run_wall_ms,
                },
                Some(h),
            ) => {
                if mode != "TIMED" {
                    return Err(bad(
                        n,
                        format!("a node record of mode '{mode}' (node records are TIMED)"),
                    ));
                }
                if !us.is_finite() || us < 0.0 {
                    return Err(bad(n, format!("node time {us} µs")));
                }
                let r = run as usize;
                if r > timed.len() {
                    return Err(bad(n, format!("run {run} before run {}", timed.len())));
                }
                if r == timed.len() {
                    timed.push((Vec::new(), run_wall_ms));
                    fused.push(None);
                }
                let at = timed[r].0.len();
                if r == 0 {
                    h.graph.push(node);
                } else {
                    let first = h
                        .graph
                        .get(at)
                        .ok_or_else(|| bad(n, format!("run {run} has more nodes than run 0")))?;
                    if first.op != node.op || first.name != node.name {
                        return Err(bad(
                            n,
                            format!(
                                "run {run} node {at} is {} '{}', run 0's is {} '{}'",
                                node.op, node.name, first.op, first.name
                            ),
                        ));
                    }
                }
                timed[r].0.push(us);
            }
            (
                Record::Fused {
                    run,
                    mode,
                    run_wall_ms,
                },
                Some(_),
            ) => {
                if mode != "FUSED" {
                    return Err(bad(n, format!("a fused record of mode '{mode}'")));
                }
                let slot = fused.get_mut(run as usize).ok_or_else(|| {
                    bad(n, format!("the FUSED wall of run {run} before its nodes"))
                })?;
                *slot = Some(run_wall_ms);
            }
        }
    }
    let mut h = header.ok_or_else(|| bad(0, "no records".into()))?;
    for (r, ((us, tw), f)) in timed.into_iter().zip(fused).enumerate() {
        if us.len() != h.graph.len() {
            return Err(bad(
                0,
                format!(
                    "run {r} has {} nodes, run 0 has {}",
                    us.len(),
                    h.graph.len()
                ),
            ));
        }
        let f = f.ok_or_else(|| bad(0, format!("run {r} has no FUSED wall")))?;
        h.runs.push((us, tw, f));
    }
    if h.runs.is_empty() {
        return Err(bad(0, "no runs".into()));
    }
    Ok(h)
}
