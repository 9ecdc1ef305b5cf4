//! opledger's node-record format: JSON lines, one record per node per run, so an engine in any
//! language can emit its own per-node times and get bands, agreement and coverage as llama.cpp
//! does. A file opens with one `run` record (schema version, engine, tokens per run, optionally
//! the architecture and band rules; from version 2 the work: depth, decode steps and parallel
//! sequences, the decode steps a node's time sums, and the outputs' hashes), then for every
//! measured run `r` one `node` record per node in graph order (mode `TIMED`: the node's own µs,
//! the TIMED run's wall, from version 2 the node's own isolation calibration), one `fused`
//! record (mode `FUSED`: the wall of the same work run without timing each node) and, from
//! version 2, one `calibration` record where the engine calibrated the isolation cost.
//!
//! A stored profile written as records and read back is the same profile ([`RecordRun::to_raw`]),
//! but for what records do not carry: the run with the instrument installed (overhead) and the
//! noise gate, both not measured in an import.

use std::collections::BTreeMap;
use std::io::BufRead;

use serde::{Deserialize, Serialize};

use crate::arch::ArchInfo;
use crate::band::BandRules;
use crate::engine::{Mode, Work};
use crate::node::NodeInfo;
use crate::profile::{CycleRecord, ProfileConfig, ProfileRaw, PROFILE_SCHEMA_VERSION};

/// The node-record format's version; a reader refuses a newer one. Version 1 (a prefill chunk
/// at depth 0, no calibration, no outputs) is still read.
pub const RECORDS_SCHEMA_VERSION: u32 = 2;

/// One line of a node-record file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
// one record a line, read and written one at a time: the header's size costs nothing
#[allow(clippy::large_enum_variant)]
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
        /// Version 2: what one run computes (the chunk, its depth, decode steps and parallel
        /// sequences); absent: a prefill chunk of `tokens` at depth 0.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        work: Option<Work>,
        /// Version 2: decode steps each node's time sums (1 where the graph lists every step's
        /// nodes, or for a prefill chunk); absent: every step of the run.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        node_steps: Option<u32>,
        /// Version 2: distinct output (logits) hashes seen per mode; absent: not recorded.
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        output_hashes: BTreeMap<String, Vec<String>>,
        /// Version 2: every run's logits were checked finite.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        outputs_checked_finite: bool,
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
        /// Version 2: this node's isolation cost as the engine calibrated it node by node, µs
        /// per step (every node of a run carries it, or none).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        isolation_us: Option<f64>,
    },
    /// Version 2: run `run`'s calibration of the isolation cost, µs per node per step on
    /// average over the working nodes, taken right after its TIMED run.
    Calibration { run: u32, isolation_us: f64 },
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
        work: Some(raw.config.work.clone()),
        node_steps: Some(raw.node_steps()),
        output_hashes: raw.output_hashes.clone(),
        outputs_checked_finite: raw.outputs_checked_finite,
    }];
    for (r, c) in raw.cycles.iter().enumerate() {
        let each = c.isolation_node_us.len() == raw.graph.len();
        for (i, (node, us)) in raw.graph.iter().zip(&c.node_us).enumerate() {
            out.push(Record::Node {
                run: r as u32,
                mode: "TIMED".into(),
                node: node.clone(),
                us: *us,
                run_wall_ms: c.timed_wall_ms,
                isolation_us: each.then(|| c.isolation_node_us[i]),
            });
        }
        out.push(Record::Fused {
            run: r as u32,
            mode: "FUSED".into(),
            run_wall_ms: c.fused_ms,
        });
        if let Some(iso) = c.isolation_us {
            out.push(Record::Calibration {
                run: r as u32,
                isolation_us: iso,
            });
        }
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
    /// The file's schema version.
    pub schema_version: u32,
    pub engine: String,
    pub tokens: u32,
    pub arch: Option<ArchInfo>,
    pub band_rules: Option<BandRules>,
    /// What one run computes (a prefill chunk of `tokens` at depth 0 in version 1).
    pub work: Work,
    pub node_steps: Option<u32>,
    pub output_hashes: BTreeMap<String, Vec<String>>,
    pub outputs_checked_finite: bool,
    pub graph: Vec<NodeInfo>,
    /// Per run: (node µs in graph order, TIMED wall ms, FUSED wall ms).
    pub runs: Vec<(Vec<f64>, f64, f64)>,
    /// Per run: the engine's calibration of the isolation cost (average, and node by node or
    /// empty), where it has one.
    pub calibration: Vec<(Option<f64>, Vec<f64>)>,
}

impl RecordRun {
    /// The records as a stored profile: one cycle per run (FUSED, then TIMED), with the
    /// calibration and outputs the records carry. `tokens` overrides the records' tokens a run
    /// (a prefill chunk of that many tokens). No run with the instrument installed, no noise
    /// gate: the summary says both were not measured.
    pub fn to_raw(&self, tokens: Option<u32>) -> ProfileRaw {
        let work = match tokens {
            Some(t) if t != self.work.tokens_per_run() => Work::prefill(t, self.work.depth_tokens),
            _ => self.work.clone(),
        };
        ProfileRaw {
            schema_version: PROFILE_SCHEMA_VERSION,
            config: ProfileConfig {
                work,
                cycles: self.runs.len() as u32,
                warmup: 0,
                overhead_pairs: 0,
                gate: crate::noise::GateConfig {
                    enabled: false,
                    ..Default::default()
                },
            },
            graph: self.graph.clone(),
            cycles: self
                .runs
                .iter()
                .zip(&self.calibration)
                .map(|((us, timed_wall, fused), (iso, iso_nodes))| CycleRecord {
                    device_timed: None,
                    device_fused: None,
                    order: vec![Mode::Fused, Mode::Timed],
                    fused_ms: *fused,
                    fused_observed_ms: *fused,
                    timed_wall_ms: *timed_wall,
                    node_us: us.clone(),
                    isolation_us: *iso,
                    isolation_node_us: iso_nodes.clone(),
                    noise: Vec::new(),
                })
                .collect(),
            output_hashes: self.output_hashes.clone(),
            overhead_pairs: Vec::new(),
            overhead_pairs_noise: Vec::new(),
            gate: Default::default(),
            outputs_checked_finite: self.outputs_checked_finite,
            node_steps: Some(self.node_steps.unwrap_or(if self.schema_version < 2 {
                1
            } else {
                self.work.decode_tokens.max(1)
            })),
            one_process_fused_ms: Vec::new(),
            one_process_outputs: None,
            one_process_skipped: None,
            outputs_compared: Vec::new(),
        }
    }
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
    let mut calibration: Vec<(Option<f64>, Vec<f64>)> = Vec::new();
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
                    work,
                    node_steps,
                    output_hashes,
                    outputs_checked_finite,
                },
                None,
            ) => {
                if schema_version > RECORDS_SCHEMA_VERSION {
                    return Err(bad(n, format!("schema version {schema_version} is newer than this opledger reads ({RECORDS_SCHEMA_VERSION})")));
                }
                if schema_version == 0 {
                    return Err(bad(n, "schema version 0: versions start at 1".into()));
                }
                if schema_version < 2
                    && (work.is_some() || node_steps.is_some() || !output_hashes.is_empty())
                {
                    return Err(bad(
                        n,
                        format!("schema version {schema_version} carries no `work`, `node_steps` or `output_hashes` (version 2 does)"),
                    ));
                }
                let tokens = tokens.max(1);
                let work = match work {
                    Some(w) => {
                        if w.tokens_per_run() != tokens {
                            return Err(bad(
                                n,
                                format!(
                                    "`tokens` {tokens} is not what the `work` computes in one run ({})",
                                    w.tokens_per_run()
                                ),
                            ));
                        }
                        w
                    }
                    None => Work::prefill(tokens, 0),
                };
                if node_steps == Some(0) {
                    return Err(bad(n, "`node_steps` 0 (at least 1)".into()));
                }
                header = Some(RecordRun {
                    schema_version,
                    engine,
                    tokens,
                    arch,
                    band_rules,
                    work,
                    node_steps,
                    output_hashes,
                    outputs_checked_finite,
                    graph: Vec::new(),
                    runs: Vec::new(),
                    calibration: Vec::new(),
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
                    isolation_us,
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
                    calibration.push((None, Vec::new()));
                }
                let at = timed[r].0.len();
                match isolation_us {
                    Some(iso) if iso.is_finite() && iso >= 0.0 => {
                        if calibration[r].1.len() != at {
                            return Err(bad(n, format!("run {run} node {at} carries `isolation_us`, earlier nodes of the run do not")));
                        }
                        calibration[r].1.push(iso);
                    }
                    Some(iso) => return Err(bad(n, format!("node isolation {iso} µs"))),
                    None if !calibration[r].1.is_empty() => {
                        return Err(bad(n, format!("run {run} node {at} has no `isolation_us`, earlier nodes of the run do")));
                    }
                    None => {}
                }
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
            (Record::Calibration { run, isolation_us }, Some(h)) => {
                if h.schema_version < 2 {
                    return Err(bad(n, "a `calibration` record in a version 1 file".into()));
                }
                if !isolation_us.is_finite() || isolation_us < 0.0 {
                    return Err(bad(n, format!("isolation cost {isolation_us} µs")));
                }
                let slot = calibration.get_mut(run as usize).ok_or_else(|| {
                    bad(n, format!("the calibration of run {run} before its nodes"))
                })?;
                slot.0 = Some(isolation_us);
            }
        }
    }
    let mut h = header.ok_or_else(|| bad(0, "no records".into()))?;
    let calibrated = calibration.iter().filter(|c| c.0.is_some()).count();
    if calibrated != 0 && calibrated != calibration.len() {
        return Err(bad(
            0,
            format!(
                "{calibrated} of {} runs have a `calibration` record: every run, or none",
                calibration.len()
            ),
        ));
    }
    for (r, c) in calibration.iter().enumerate() {
        if !c.1.is_empty() && c.1.len() != h.graph.len() {
            return Err(bad(
                0,
                format!("run {r}: some nodes carry `isolation_us`, not all"),
            ));
        }
    }
    h.calibration = calibration;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;
    use crate::mock::{MockEngine, MockNode};
    use crate::profile::{analyse, CheckStatus, ProfileSummary};

    const NODES: [MockNode; 5] = [
        ("GATED_DELTA_NET", "node_0", "", 300.0),
        ("RESHAPE", "node_0 (reshaped)", "", 0.0),
        (
            "MUL_MAT_ID",
            "ffn_moe_gate-0",
            "blk.0.ffn_gate_exps.weight",
            500.0,
        ),
        ("FLASH_ATTN_EXT", "node_3", "", 100.0),
        ("MUL_MAT", "Qcur_full-3", "blk.3.attn_q.weight", 50.0),
    ];

    fn measured(work: Work, calibration: Option<f64>) -> ProfileRaw {
        let mut e = MockEngine::new(&NODES);
        e.isolation_us = 2.0;
        e.calibration_us = calibration;
        let cfg = ProfileConfig {
            work,
            cycles: 3,
            warmup: 1,
            overhead_pairs: 0,
            gate: crate::noise::GateConfig {
                enabled: false,
                ..Default::default()
            },
        };
        crate::profile::measure(&mut e, &cfg, &mut |_, _, _| {}).unwrap()
    }

    fn summary(raw: &ProfileRaw) -> ProfileSummary {
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        analyse(raw, &rules, &arch).unwrap().1
    }

    /// Writes `raw` as records, reads them back: the same profile, and the same summary but
    /// for the overhead (no run with the instrument installed is carried: not measured).
    fn round_trip(raw: &ProfileRaw) -> ProfileRaw {
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let bytes = to_jsonl(&profile_to_records("mock", &arch, &rules, raw)).unwrap();
        let back = read_jsonl(bytes.as_slice(), "nodes.jsonl").unwrap();
        assert_eq!(back.schema_version, RECORDS_SCHEMA_VERSION);
        let got = back.to_raw(None);
        assert_eq!(got.config.work, raw.config.work);
        assert_eq!(got.graph, raw.graph);
        assert_eq!(got.node_steps(), raw.node_steps());
        assert_eq!(got.output_hashes, raw.output_hashes);
        assert_eq!(got.outputs_checked_finite, raw.outputs_checked_finite);
        assert_eq!(got.cycles.len(), raw.cycles.len());
        for (a, b) in got.cycles.iter().zip(&raw.cycles) {
            assert_eq!(a.node_us, b.node_us);
            assert_eq!(a.fused_ms, b.fused_ms);
            assert_eq!(a.timed_wall_ms, b.timed_wall_ms);
            assert_eq!(a.isolation_us, b.isolation_us);
            assert_eq!(a.isolation_node_us, b.isolation_node_us);
        }
        let (s, t) = (summary(raw), summary(&got));
        assert_eq!(t.bands, s.bands);
        for (x, y) in [
            (t.agreement, s.agreement),
            (t.agreement_corrected, s.agreement_corrected),
            (t.isolation_us, s.isolation_us),
            (t.isolation_us_per_step, s.isolation_us_per_step),
            (t.isolation_remainder_us, s.isolation_remainder_us),
            (t.fused_ms, s.fused_ms),
        ] {
            assert!(x == y || (x.is_nan() && y.is_nan()), "{x} against {y}");
        }
        assert_eq!(
            (t.tokens, t.depth_tokens, t.decode_tokens, t.parallel),
            (s.tokens, s.depth_tokens, s.decode_tokens, s.parallel)
        );
        assert_eq!(
            (&t.isolation_source, t.node_steps),
            (&s.isolation_source, s.node_steps)
        );
        let status = |s: &ProfileSummary, name: &str| {
            s.checks.iter().find(|c| c.name == name).unwrap().status
        };
        assert_eq!(status(&t, "outputs"), CheckStatus::Pass);
        assert!(s.overhead.is_finite() && t.overhead.is_nan());
        got
    }

    #[test]
    fn a_parallel_decode_profile_round_trips_through_node_records() {
        let work = Work {
            chunk_tokens: 32,
            depth_tokens: 64,
            all_logits: false,
            token_seed: 7,
            decode_tokens: 4,
            parallel: 2,
        };
        let mut raw = measured(work, Some(1.5));
        assert!(raw.cycles.iter().all(|c| c.isolation_us == Some(1.5)));
        assert!(!raw.output_hashes.is_empty());
        // a calibration node by node, as candle's engine takes it
        for (k, c) in raw.cycles.iter_mut().enumerate() {
            c.isolation_node_us = (0..NODES.len())
                .map(|i| 1.0 + (i + k) as f64 / 10.0)
                .collect();
        }
        let got = round_trip(&raw);
        assert_eq!(got.config.work.decode_tokens, 4);
        assert_eq!(summary(&got).isolation_source, "calibration, node by node");
    }

    #[test]
    fn a_sweep_shaped_chunk_at_depth_round_trips_through_node_records() {
        // what a sweep measures at each depth: a prefill chunk deep in the context, all logits;
        // this engine calibrates nothing: the idle nodes estimate the isolation cost
        let mut work = Work::prefill(16, 512);
        work.all_logits = true;
        let raw = measured(work, None);
        let got = round_trip(&raw);
        assert_eq!(got.config.work.depth_tokens, 512);
        assert_eq!(summary(&got).isolation_source, "idle nodes");
    }

    #[test]
    fn version_1_records_are_read_as_a_prefill_chunk_at_depth_0() {
        let text = r#"{"record":"run","schema_version":1,"engine":"e","tokens":8}
{"record":"node","run":0,"mode":"TIMED","index":0,"op":"ADD","name":"a","out":{"name":"a","ne":[1,1,1,1],"type":"F32","size_bytes":4},"srcs":[],"is_view":false,"inplace":false,"us":10.0,"run_wall_ms":0.02}
{"record":"fused","run":0,"mode":"FUSED","run_wall_ms":0.011}
"#;
        let r = read_jsonl(text.as_bytes(), "v1.jsonl").unwrap();
        assert_eq!(r.schema_version, 1);
        assert_eq!(r.work, Work::prefill(8, 0));
        let raw = r.to_raw(None);
        assert_eq!(raw.node_steps(), 1);
        assert_eq!(raw.cycles[0].isolation_us, None);
        // version 1 does not know the fields of version 2
        let v1_with_work = text.replacen(
            r#""tokens":8}"#,
            r#""tokens":8,"work":{"chunk_tokens":8,"depth_tokens":3,"all_logits":false,"token_seed":0}}"#,
            1,
        );
        let e = read_jsonl(v1_with_work.as_bytes(), "v1.jsonl").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("v1.jsonl:1: schema version 1 carries no `work`"),
            "{e}"
        );
        let v3 = text.replacen(r#""schema_version":1"#, r#""schema_version":3"#, 1);
        let e = read_jsonl(v3.as_bytes(), "v3.jsonl").unwrap_err();
        assert!(e.to_string().contains("schema version 3 is newer"), "{e}");
    }

    #[test]
    fn a_calibration_of_some_runs_only_or_tokens_the_work_does_not_compute_are_refused() {
        let raw = measured(Work::prefill(16, 0), Some(1.0));
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let mut records = profile_to_records("mock", &arch, &rules, &raw);
        let at = records
            .iter()
            .position(|r| matches!(r, Record::Calibration { run: 1, .. }))
            .unwrap();
        records.remove(at);
        let bytes = to_jsonl(&records).unwrap();
        let e = read_jsonl(bytes.as_slice(), "r.jsonl")
            .unwrap_err()
            .to_string();
        assert!(e.contains("2 of 3 runs have a `calibration` record"), "{e}");
        let mut records = profile_to_records("mock", &arch, &rules, &raw);
        if let Record::Run { tokens, .. } = &mut records[0] {
            *tokens = 17;
        }
        let bytes = to_jsonl(&records).unwrap();
        let e = read_jsonl(bytes.as_slice(), "r.jsonl")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("`tokens` 17 is not what the `work` computes"),
            "{e}"
        );
    }
}
