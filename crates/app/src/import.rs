//! `import`: a trace written by an engine opledger does not run (Chrome trace-event JSON, read
//! streamed by `core::trace`), its spans mapped to bands by an engine's import rules, stored as
//! a profile-shaped run (one graph node per distinct span, one cycle per step: node µs = self
//! time, FUSED wall = step wall), so `report`, `compare` and the band summary take it as they
//! take a measured profile. An imported run is one run of the engine by itself: agreement
//! (TIMED against a separate FUSED run), overhead, outputs and the noise gate cannot be
//! measured, and the summary says so instead of showing figures.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use opledger_core::arch::ArchInfo;
use opledger_core::band::BandRules;
use opledger_core::engine::{EngineInfo, Mode, Work};
use opledger_core::import_rules::ImportRules;
use opledger_core::manifest::{Manifest, ModelRecord, MANIFEST_SCHEMA_VERSION};
use opledger_core::node::{base_name, is_generic_name, NodeInfo, TensorDesc};
use opledger_core::profile::{CycleRecord, ProfileConfig, ProfileRaw, PROFILE_SCHEMA_VERSION};
use opledger_core::stats::Spread;
use opledger_core::system::SystemSnapshot;
use opledger_core::trace::{
    read_chrome, read_chrome_sorted, TraceError, TraceOptions, TraceSummary, DEFAULT_STEP_PATTERN,
};
use regex::Regex;
use serde::Serialize;

use crate::model::{hash_file, HashingReader, ModelFile};

/// The manifest's command for an imported run.
pub const IMPORT_COMMAND: &str = "import";

/// What to import.
pub struct ImportRequest {
    pub trace: PathBuf,
    /// The rules' file name (for the record) and text.
    pub rules_file: String,
    pub rules_text: String,
    /// Overrides the rules' step pattern.
    pub step: Option<String>,
    /// Tokens one step computes (ms/token = step ms / tokens).
    pub tokens: u32,
    /// Steps at the start of the trace left out (warm-up passes).
    pub skip_steps: u32,
}

/// What the import saw beside the bands (`import.json`).
#[derive(Debug, Clone, Serialize)]
pub struct ImportStats {
    pub trace: String,
    pub trace_blake3: String,
    pub trace_bytes: u64,
    pub rules_file: String,
    pub rules_blake3: String,
    pub engine: String,
    pub granularity: String,
    pub step_pattern: String,
    pub time_unit: String,
    pub events: u64,
    pub spans: u64,
    pub skipped_events: u64,
    pub outside_steps: u64,
    pub unclosed: u64,
    pub threads: usize,
    pub steps: usize,
    /// Steps at the start of the trace left out (`--skip-steps`), not among `steps`.
    pub skipped_steps: u32,
    pub distinct_spans: usize,
    /// Distinct spans no rule matched (name, category, parent), with their self ms per step.
    pub unassigned: Vec<(String, String, String, f64)>,
    pub not_measurable: Vec<String>,
    /// Per step, the sum of every span's self time over the step's wall (1: one thread at a
    /// time; above: threads or streams working at once), median and range over the steps;
    /// absent for node records, which carry no threads.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<opledger_core::stats::Spread>,
    /// Spans of another thread read after their step was finished: the step thread's time
    /// under them could not be removed (see `core::trace::RETAINED_PIECES`).
    #[serde(default)]
    pub late_spans: u64,
    /// What the reader noticed without refusing the trace (an event array cut short).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The device's side of a trace with device activity (Kineto's kernels, copies and sets on
    /// a device's streams); absent for a trace of host spans only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<DeviceStats>,
}

pub use opledger_core::device::{DeviceBand, DeviceStats};

fn spread_of(values: &[f64]) -> Spread {
    match opledger_core::stats::Sample::new(values) {
        Ok(s) => s.spread(),
        Err(_) => Spread {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
            n: 0,
        },
    }
}

/// The device's side of `trace`, with bands by `rules`; `None` without device activity.
pub fn device_stats(trace: &TraceSummary, rules: &ImportRules, tokens: u32) -> Option<DeviceStats> {
    if trace.device.events == 0 {
        return None;
    }
    let tokens = f64::from(tokens.max(1));
    let band_of: Vec<Option<&str>> = trace.keys.iter().map(|k| rules.band_of(k)).collect();
    let mut names: Vec<String> = rules.text.bands.iter().map(|b| b.name.clone()).collect();
    let steps = &trace.steps;
    let unassigned_device: Vec<usize> = (0..trace.keys.len())
        .filter(|&k| {
            band_of[k].is_none()
                && steps
                    .iter()
                    .any(|s| s.device_us.get(k).is_some_and(|v| *v > 0.0))
        })
        .collect();
    let unassigned_host = (0..trace.keys.len())
        .any(|k| band_of[k].is_none() && steps.iter().any(|s| s.self_us[k] > 0.0));
    if !unassigned_device.is_empty() || unassigned_host {
        names.push("unassigned".into());
    }
    // each key's band by its place in `names` (past the end: a key of no band and no time), and
    // every band's time per step from one pass over the step's keys
    let group: Vec<usize> = band_of
        .iter()
        .map(|b| {
            let b = b.unwrap_or("unassigned");
            names.iter().position(|n| n == b).unwrap_or(names.len())
        })
        .collect();
    let per_step = |device: bool| -> Vec<Vec<f64>> {
        let mut out = vec![Vec::with_capacity(steps.len()); names.len() + 1];
        for s in steps {
            let v = if device { &s.device_us } else { &s.self_us };
            let mut sums = vec![0.0; names.len() + 1];
            for (us, &g) in v.iter().zip(&group) {
                sums[g] += us;
            }
            for (o, sum) in out.iter_mut().zip(sums) {
                o.push(sum / 1e3 / tokens);
            }
        }
        out
    };
    let (host, device) = (per_step(false), per_step(true));
    let bands = names
        .iter()
        .enumerate()
        .map(|(g, b)| DeviceBand {
            band: b.clone(),
            host_ms_per_token: spread_of(&host[g]),
            device_ms_per_token: spread_of(&device[g]),
            device_ms_per_token_steps: device[g].clone(),
        })
        .collect();
    let ms = |f: &dyn Fn(&opledger_core::trace::StepAgg) -> f64| -> Spread {
        spread_of(&steps.iter().map(f).collect::<Vec<_>>())
    };
    let sum = |s: &opledger_core::trace::StepAgg| s.device_us.iter().sum::<f64>();
    let concurrency: Vec<f64> = steps
        .iter()
        .filter(|s| s.device_busy_us > 0.0)
        .map(|s| sum(s) / s.device_busy_us)
        .collect();
    let n = steps.len() as f64;
    Some(DeviceStats {
        activities: steps.iter().map(|s| s.kernels).sum(),
        devices: trace.device.devices,
        streams: trace.device.streams,
        bands,
        step_wall_ms: ms(&|s| s.wall_us / 1e3),
        step_wall_with_device_ms: ms(&|s| {
            (s.start_us + s.wall_us).max(s.device_end_us.unwrap_or(f64::NEG_INFINITY)) / 1e3
                - s.start_us / 1e3
        }),
        busy_ms: ms(&|s| s.device_busy_us / 1e3),
        activity_ms: ms(&|s| sum(s) / 1e3),
        stream_concurrency: (!concurrency.is_empty()).then(|| spread_of(&concurrency)),
        outside_steps: trace.device.outside_steps,
        outside_steps_ms: trace.device.outside_steps_us / 1e3,
        unlinked: trace.device.unlinked,
        unlinked_ms: trace.device.unlinked_us / 1e3,
        links_dropped: trace.device.links_dropped,
        unassigned: unassigned_device
            .iter()
            .map(|&k| {
                let key = &trace.keys[k];
                (
                    key.name.clone(),
                    key.parent.clone(),
                    steps.iter().map(|s| s.device_us[k]).sum::<f64>() / n / 1e3,
                )
            })
            .collect(),
    })
}

/// An imported run, ready to be written.
pub struct Imported {
    pub manifest: Manifest,
    pub raw: ProfileRaw,
    pub stats: ImportStats,
}

/// What cannot be measured in a run the engine traced by itself.
pub fn not_measurable() -> Vec<String> {
    vec![
        "agreement: the trace is one run of the engine, with no separate untraced (FUSED) run to hold its sum against".into(),
        "overhead: the cost of the engine's own tracing is not measured".into(),
        "outputs: the trace carries no logits to check identical or finite".into(),
        "noise: opledger did not run the engine, so no noise gate was around it".into(),
    ]
}

/// What node records cannot carry: the run with the instrument installed and the noise gate;
/// the outputs where the records hold no hashes.
fn records_not_measurable(raw: &ProfileRaw) -> Vec<String> {
    let mut out = vec![
        "overhead: node records carry no run with the instrument installed".to_string(),
        "noise: opledger did not run the engine, so no noise gate was around it".into(),
    ];
    if raw.output_hashes.is_empty() {
        out.push("outputs: the records carry no output hashes".into());
    }
    out
}

/// Reads opledger's node records (JSON lines): the run's nodes, times and walls as the engine
/// wrote them; band rules from the file, else the built-in ones for the architecture of
/// `model` or of the file.
pub fn run_records(
    path: &Path,
    tokens: Option<u32>,
    model: Option<&ModelFile>,
) -> Result<Imported> {
    use opledger_core::records::read_jsonl;
    let file = path.display().to_string();
    let hash = hash_file(path)?;
    let f = std::fs::File::open(path).with_context(|| format!("opening {file}"))?;
    let rec = read_jsonl(std::io::BufReader::new(f), &file)?;
    let arch = model
        .map(|m| m.arch.clone())
        .or(rec.arch.clone())
        .unwrap_or_else(unknown_arch);
    let band_rules = match &rec.band_rules {
        Some(r) => r.clone(),
        None => BandRules::builtin(&arch.arch)?,
    };
    if let Some(t) = tokens {
        if rec.work.is_decode() && t != rec.tokens {
            bail!(
                "{file}: --tokens {t}: the records are a decode run of {} tokens ({} steps of {} sequences); their tokens cannot be changed",
                rec.tokens,
                rec.work.decode_tokens,
                rec.work.parallel
            );
        }
    }
    let raw = rec.to_raw(tokens);
    let settings: BTreeMap<String, String> = [
        ("imported_from", hash.path.clone()),
        ("records_blake3", hash.blake3.clone()),
        (
            "format",
            format!(
                "opledger node records (jsonl), schema version {}",
                rec.schema_version
            ),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let model_record = match model {
        Some(m) => {
            let h = hash_file(m.path())?;
            ModelRecord {
                path: h.path,
                size_bytes: h.size_bytes,
                blake3: h.blake3,
                arch,
                metadata: m.metadata_summary(),
            }
        }
        None => ModelRecord {
            path: hash.path.clone(),
            size_bytes: 0,
            blake3: String::new(),
            arch,
            metadata: Default::default(),
        },
    };
    let manifest = Manifest {
        schema_version: MANIFEST_SCHEMA_VERSION,
        tool: format!("opledger {}", env!("CARGO_PKG_VERSION")),
        command: IMPORT_COMMAND.into(),
        args: std::env::args().collect(),
        created_utc: crate::manifest::now_utc(),
        engine: EngineInfo {
            engine: rec.engine.clone(),
            version: "node records".into(),
            backend: "as recorded".into(),
            threads: 0,
            settings,
        },
        model: model_record,
        band_rules,
        system: SystemSnapshot::take(),
    };
    let stats = ImportStats {
        trace: hash.path,
        trace_blake3: hash.blake3,
        trace_bytes: hash.size_bytes,
        rules_file: "the records' own band rules, or the built-in ones for the architecture".into(),
        rules_blake3: String::new(),
        engine: rec.engine,
        granularity: "one record per graph node".into(),
        step_pattern: String::new(),
        time_unit: "us".into(),
        events: (rec.graph.len() * rec.runs.len() + rec.runs.len()) as u64,
        spans: (rec.graph.len() * rec.runs.len()) as u64,
        skipped_events: 0,
        skipped_steps: 0,
        outside_steps: 0,
        unclosed: 0,
        threads: 0,
        steps: rec.runs.len(),
        distinct_spans: rec.graph.len(),
        unassigned: Vec::new(),
        not_measurable: records_not_measurable(&raw),
        concurrency: None,
        late_spans: 0,
        notes: Vec::new(),
        device: None,
    };
    Ok(Imported {
        manifest,
        raw,
        stats,
    })
}

/// Reads the trace and maps its spans to bands.
pub fn run(req: &ImportRequest, model: Option<&ModelFile>) -> Result<Imported> {
    let rules = ImportRules::parse(&req.rules_text, &req.rules_file)?;
    let pattern = req
        .step
        .clone()
        .or_else(|| rules.text.step.clone())
        .unwrap_or_else(|| DEFAULT_STEP_PATTERN.to_string());
    let step = Regex::new(&pattern).with_context(|| format!("--step /{pattern}/"))?;
    let opts = TraceOptions {
        step,
        arg_keys: rules.arg_keys(),
        context: rules.context(),
    };
    let file = req.trace.display().to_string();
    let (mut trace, hash) = read_trace(req, &file, &opts)?;
    let skip = req.skip_steps as usize;
    if skip >= trace.steps.len() {
        bail!(
            "{file}: --skip-steps {skip} leaves no step of the {} the trace holds",
            trace.steps.len()
        );
    }
    trace.steps.drain(..skip);
    build(req, &rules, &pattern, &trace, hash, model)
}

/// Reads the trace at `req.trace`, streamed, and hashes the file's bytes as they are read.
fn read_trace(
    req: &ImportRequest,
    file: &str,
    opts: &TraceOptions,
) -> Result<(TraceSummary, crate::model::FileHash)> {
    use std::io::Read;
    // a gzip file (what torch.profiler writes for a name ending in .gz) is read through the
    // decoder, streamed like the plain text; the hash is of the file's own bytes
    let mut magic = [0u8; 2];
    let gz = std::fs::File::open(&req.trace)
        .and_then(|mut f| f.read(&mut magic))
        .with_context(|| format!("reading {file}"))?
        == 2
        && magic == [0x1f, 0x8b];
    // streamed; a trace whose threads' events are not in start order (Kineto with Python
    // stacks) is read again sorted by start, in runs on a temporary file past a cap (a note says
    // how)
    let mut first = HashingReader::open(&req.trace)?;
    match read_chrome(trace_text(&mut first, gz), file, opts) {
        Err(TraceError::OutOfOrder { .. }) => {
            let mut again = HashingReader::open(&req.trace)?;
            let trace = read_chrome_sorted(trace_text(&mut again, gz), file, opts)?;
            Ok((trace, again.finish()?))
        }
        r => Ok((r?, first.finish()?)),
    }
}

/// The trace's text: the file's bytes, or what a gzip file decodes to.
fn trace_text(file: &mut HashingReader, gz: bool) -> Box<dyn std::io::Read + '_> {
    if gz {
        Box::new(flate2::read::MultiGzDecoder::new(
            std::io::BufReader::with_capacity(1 << 16, file),
        ))
    } else {
        Box::new(file)
    }
}

fn build(
    req: &ImportRequest,
    rules: &ImportRules,
    pattern: &str,
    trace: &TraceSummary,
    hash: crate::model::FileHash,
    model: Option<&ModelFile>,
) -> Result<Imported> {
    // keys that never had self time in a step are left out of the graph
    let mut any = vec![false; trace.keys.len()];
    for s in &trace.steps {
        for (any, us) in any.iter_mut().zip(&s.self_us) {
            *any |= *us > 0.0;
        }
    }
    let used: Vec<usize> = (0..trace.keys.len()).filter(|&k| any[k]).collect();
    let labels = labels(trace, &used);
    let mut name_rules = BTreeMap::new();
    let mut unassigned = Vec::new();
    let mut graph = Vec::with_capacity(used.len());
    let steps = trace.steps.len() as f64;
    for (i, (&k, label)) in used.iter().zip(&labels).enumerate() {
        let key = &trace.keys[k];
        match rules.band_of(key) {
            Some(b) => {
                name_rules.insert(label.clone(), b.to_string());
            }
            None => unassigned.push((
                key.name.clone(),
                key.cat.clone(),
                key.parent.clone(),
                trace.steps.iter().map(|s| s.self_us[k]).sum::<f64>() / steps / 1e3,
            )),
        }
        let out = TensorDesc {
            name: label.clone(),
            ne: [1, 1, 1, 1],
            ggml_type: "span".into(),
            size_bytes: 0,
            is_weight: false,
            nb: [0; 4],
            producer: None,
        };
        graph.push(NodeInfo {
            index: i as u32,
            op: if key.cat.is_empty() {
                "span".into()
            } else {
                key.cat.clone()
            },
            name: label.clone(),
            layer: None,
            out,
            srcs: Vec::new(),
            is_view: false,
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        });
    }
    let cycles = trace
        .steps
        .iter()
        .map(|s| CycleRecord {
            device_timed: None,
            device_fused: None,
            order: vec![Mode::Timed],
            fused_ms: s.wall_us / 1e3,
            fused_observed_ms: s.wall_us / 1e3,
            timed_wall_ms: s.wall_us / 1e3,
            node_us: used.iter().map(|&k| s.self_us[k]).collect(),
            isolation_us: None,
            isolation_node_us: Vec::new(),
            noise: Vec::new(),
        })
        .collect();
    let raw = ProfileRaw {
        schema_version: PROFILE_SCHEMA_VERSION,
        config: ProfileConfig {
            work: Work::prefill(req.tokens, 0),
            cycles: trace.steps.len() as u32,
            warmup: 0,
            overhead_pairs: 0,
            gate: opledger_core::noise::GateConfig {
                enabled: false,
                ..Default::default()
            },
        },
        graph,
        cycles,
        output_hashes: BTreeMap::new(),
        overhead_pairs: Vec::new(),
        overhead_pairs_noise: Vec::new(),
        gate: Default::default(),
        outputs_checked_finite: false,
        node_steps: Some(1),
        one_process_fused_ms: Vec::new(),
        one_process_outputs: None,
        one_process_skipped: None,
        outputs_compared: Vec::new(),
    };
    let band_rules = BandRules {
        architectures: vec!["*".into()],
        extends: None,
        bands: rules.text.bands.clone(),
        attention_band: rules
            .text
            .bands
            .iter()
            .any(|b| b.name == "attention")
            .then(|| "attention".into()),
        ffn_band: None,
        op: BTreeMap::new(),
        weight: BTreeMap::new(),
        weight_by_layer: BTreeMap::new(),
        name: name_rules,
        name_by_layer: BTreeMap::new(),
        follow_consumer: Vec::new(),
        audit: BTreeMap::new(),
        audit_ffn: BTreeMap::new(),
    };
    let rules_blake3 = blake3::hash(req.rules_text.as_bytes()).to_hex().to_string();
    let stats = ImportStats {
        trace: hash.path.clone(),
        trace_blake3: hash.blake3.clone(),
        trace_bytes: hash.size_bytes,
        rules_file: req.rules_file.clone(),
        rules_blake3: rules_blake3.clone(),
        engine: rules.text.engine.clone(),
        granularity: rules.text.granularity.clone(),
        step_pattern: pattern.to_string(),
        time_unit: trace.time_unit.clone(),
        events: trace.events,
        spans: trace.spans,
        skipped_events: trace.skipped_events,
        outside_steps: trace.outside_steps,
        unclosed: trace.unclosed,
        threads: trace.threads,
        steps: trace.steps.len(),
        skipped_steps: req.skip_steps,
        distinct_spans: used.len(),
        unassigned,
        not_measurable: not_measurable(),
        concurrency: opledger_core::stats::Sample::new(
            &trace
                .steps
                .iter()
                .map(|s| s.concurrency())
                .collect::<Vec<_>>(),
        )
        .ok()
        .map(|s| s.spread()),
        late_spans: trace.late,
        notes: trace.notes.clone(),
        device: device_stats(trace, rules, req.tokens),
    };
    let settings: BTreeMap<String, String> = [
        ("imported_from", hash.path.clone()),
        ("trace_blake3", hash.blake3.clone()),
        ("import_rules", req.rules_file.clone()),
        ("import_rules_blake3", rules_blake3),
        ("granularity", rules.text.granularity.clone()),
        ("step_pattern", pattern.to_string()),
        ("tokens_per_step", req.tokens.to_string()),
        (
            "agreement",
            "not measurable: one self-traced run, no separate FUSED run".into(),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let engine = EngineInfo {
        engine: rules.text.engine.clone(),
        version: "imported trace".into(),
        backend: "as traced".into(),
        threads: trace.threads as u32,
        settings,
    };
    let model_record = match model {
        Some(m) => {
            let h = hash_file(m.path())?;
            ModelRecord {
                path: h.path,
                size_bytes: h.size_bytes,
                blake3: h.blake3,
                arch: m.arch.clone(),
                metadata: m.metadata_summary(),
            }
        }
        None => ModelRecord {
            path: hash.path.clone(),
            size_bytes: 0,
            blake3: String::new(),
            arch: unknown_arch(),
            metadata: Default::default(),
        },
    };
    let manifest = Manifest {
        schema_version: MANIFEST_SCHEMA_VERSION,
        tool: format!("opledger {}", env!("CARGO_PKG_VERSION")),
        command: IMPORT_COMMAND.into(),
        args: std::env::args().collect(),
        created_utc: crate::manifest::now_utc(),
        engine,
        model: model_record,
        band_rules,
        system: SystemSnapshot::take(),
    };
    Ok(Imported {
        manifest,
        raw,
        stats,
    })
}

/// A graph node's name per used span key: the span's name, made unique (and kept from being
/// read as a layer suffix or a decoration by the band rules' name tokens).
fn labels(trace: &TraceSummary, used: &[usize]) -> Vec<String> {
    let clean = |s: &str| -> String {
        let mut s = s.replace(" (", " [");
        if s.is_empty() || is_generic_name(&s) || base_name(&s) != s {
            s.push('·');
        }
        s
    };
    let mut taken = BTreeSet::new();
    let mut count: BTreeMap<&str, u32> = BTreeMap::new();
    for &k in used {
        *count.entry(trace.keys[k].name.as_str()).or_default() += 1;
    }
    used.iter()
        .map(|&k| {
            let key = &trace.keys[k];
            let mut label = if count[key.name.as_str()] == 1 {
                clean(&key.name)
            } else {
                let mut l = key.name.clone();
                if !key.parent.is_empty() {
                    l.push_str(&format!(" in {}", key.parent));
                }
                if !key.cat.is_empty() {
                    l.push_str(&format!(" @{}", key.cat));
                }
                for (a, v) in &key.args {
                    l.push_str(&format!(" {a}={v}"));
                }
                clean(&l)
            };
            let base = label.clone();
            let mut n = 2;
            while !taken.insert(label.clone()) {
                label = format!("{base} #{n}");
                n += 1;
            }
            label
        })
        .collect()
}

/// The architecture of a run imported without its model file: nothing known.
fn unknown_arch() -> ArchInfo {
    ArchInfo {
        arch: "unknown (imported without --model)".into(),
        layers: Vec::new(),
        n_experts: 0,
        n_experts_used: 0,
        shared_expert: false,
        fused_gate_up: false,
        n_embd: 0,
        n_head: 0,
        n_head_kv: 0,
        n_vocab: 0,
        key_length: 0,
        value_length: 0,
        ssm_conv_kernel: 0,
        ssm_state_size: 0,
        ssm_group_count: 0,
        ssm_time_step_rank: 0,
        ssm_inner_size: 0,
        ffn_length: 0,
        notes: vec!["imported without --model: the model is not known".into()],
    }
}

/// The run folder an import writes: `output` when given, else `runs/<time>-import-<trace>`.
pub fn run_path(output: Option<&Path>, trace: &Path) -> PathBuf {
    crate::manifest::run_path(output, IMPORT_COMMAND, trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the hand-written GPU trace of the core tests (crates/core/tests/kineto_gpu.rs holds
    /// its arithmetic) with the PyTorch rules, from `name` written with `bytes`.
    fn import(name: &str, bytes: &[u8]) -> Imported {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, bytes).unwrap();
        let (_, file, text) = opledger_core::import_rules::BUILTIN_IMPORT_RULES
            .iter()
            .find(|(n, _, _)| *n == "pytorch")
            .unwrap();
        let req = ImportRequest {
            trace: path,
            rules_file: file.to_string(),
            rules_text: text.to_string(),
            step: None,
            tokens: 2,
            skip_steps: 0,
        };
        run(&req, None).unwrap()
    }

    const HAND: &str = include_str!("../../core/tests/fixtures/kineto-gpu-by-hand.json");

    #[test]
    fn device_stats_hold_host_and_device_per_band_busy_time_and_what_is_outside() {
        let d = import("hand.json", HAND.as_bytes()).stats.device.unwrap();
        // two steps, 2 tokens each: per band, (min, max) of the two steps' µs / 2 / 1000
        let band = |b: &str| d.bands.iter().find(|x| x.band == b).unwrap().clone();
        let range = |s: &Spread| (s.min, s.max);
        let close =
            |a: (f64, f64), b: (f64, f64)| (a.0 - b.0).abs() < 1e-12 && (a.1 - b.1).abs() < 1e-12;
        // host: dense_ffn 55 (step 1) and 20 (step 2); other 71 and 80; attention 51 and 0
        assert!(close(
            range(&band("dense_ffn").host_ms_per_token),
            (0.010, 0.0275)
        ));
        assert!(close(
            range(&band("other").host_ms_per_token),
            (0.0355, 0.040)
        ));
        assert!(close(
            range(&band("attention").host_ms_per_token),
            (0.0, 0.0255)
        ));
        // device: dense_ffn 66 and 6; network 60 and 0; the unassigned fill_ kernel 4 and 0
        assert!(close(
            range(&band("dense_ffn").device_ms_per_token),
            (0.003, 0.033)
        ));
        assert!(close(
            range(&band("network").device_ms_per_token),
            (0.0, 0.030)
        ));
        assert!(close(
            range(&band("unassigned").device_ms_per_token),
            (0.0, 0.002)
        ));
        assert!(close(range(&d.busy_ms), (0.006, 0.164)));
        assert!(close(range(&d.activity_ms), (0.006, 0.224)));
        let c = d.stream_concurrency.as_ref().unwrap();
        assert!(close((c.min, c.max), (1.0, 224.0 / 164.0)));
        assert!(close(range(&d.step_wall_ms), (0.1, 0.2)));
        assert!(close(range(&d.step_wall_with_device_ms), (0.1, 0.204)));
        assert_eq!((d.activities, d.devices, d.streams), (9, 1, 2));
        assert_eq!(d.outside_steps, 1);
        assert!((d.outside_steps_ms - 0.005).abs() < 1e-12);
        assert_eq!(d.unlinked, 0);
        // the kernel launched outside every module: listed with its launch, per step over 2
        assert_eq!(d.unassigned.len(), 1);
        assert_eq!(
            (d.unassigned[0].0.as_str(), d.unassigned[0].1.as_str()),
            ("fill_kernel", "cudaLaunchKernel")
        );
        assert!((d.unassigned[0].2 - 0.002).abs() < 1e-12);
    }

    #[test]
    fn a_gzip_trace_reads_as_the_plain_one() {
        use std::io::Write;
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(HAND.as_bytes()).unwrap();
        let gz = gz.finish().unwrap();
        let plain = import("hand.json", HAND.as_bytes());
        let zipped = import("hand.json.gz", &gz);
        assert_eq!(plain.raw.cycles.len(), 2);
        for (a, b) in plain.raw.cycles.iter().zip(&zipped.raw.cycles) {
            assert_eq!(a.node_us, b.node_us);
            assert_eq!(a.fused_ms, b.fused_ms);
        }
        assert_eq!(plain.stats.events, zipped.stats.events);
        // a gzip stream cut short is refused naming the file
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.json.gz");
        std::fs::write(&path, &gz[..gz.len() / 2]).unwrap();
        let (_, file, text) = opledger_core::import_rules::BUILTIN_IMPORT_RULES[1];
        let req = ImportRequest {
            trace: path.clone(),
            rules_file: file.to_string(),
            rules_text: text.to_string(),
            step: None,
            tokens: 1,
            skip_steps: 0,
        };
        let e = run(&req, None).err().unwrap().to_string();
        assert!(e.contains("cut.json.gz"), "{e}");
    }
}
