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
use opledger_core::system::SystemSnapshot;
use opledger_core::trace::{read_chrome, TraceOptions, TraceSummary, DEFAULT_STEP_PATTERN};
use regex::Regex;
use serde::Serialize;

use crate::model::{hash_file, ModelFile};

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
    };
    let file = req.trace.display().to_string();
    let hash = hash_file(&req.trace)?;
    let f = std::fs::File::open(&req.trace).with_context(|| format!("opening {file}"))?;
    let mut trace = read_chrome(std::io::BufReader::with_capacity(1 << 20, f), &file, &opts)?;
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

fn build(
    req: &ImportRequest,
    rules: &ImportRules,
    pattern: &str,
    trace: &TraceSummary,
    hash: crate::model::FileHash,
    model: Option<&ModelFile>,
) -> Result<Imported> {
    // keys that never had self time in a step are left out of the graph
    let used: Vec<usize> = (0..trace.keys.len())
        .filter(|&k| trace.steps.iter().any(|s| s.self_us[k] > 0.0))
        .collect();
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
