//! The depth sweep: the context decoded cumulatively in chunks, chunk c being the probe at depth
//! c x chunk, one FUSED and one TIMED pass per cycle; chunk records stored as they land (so an
//! interrupted sweep resumes), then per-depth bands, a linear fit per band and the depth where
//! attention overtakes the FFN.

use std::collections::BTreeMap;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::band::{Assignment, BandRules, UNASSIGNED};
use crate::engine::{Engine, EngineError, Mode, Work};
use crate::node::NodeInfo;
use crate::profile::{Check, CheckStatus, AGREEMENT_GOAL};
use crate::stats::{crossing, linear_fit, LinearFit, Sample};

pub const SWEEP_SCHEMA_VERSION: u32 = 1;

/// A band is flat when its fitted change across the swept depths is within this share of its
/// mean, or when its slope is within `SLOPE_SIGMAS` (3) standard errors of zero (no growth the noise cannot
/// explain).
pub const FLAT_CHANGE: f64 = 0.10;
/// A slope within this many standard errors of zero is not significant. Three, not two: the
/// depths of a pass are measured one after the other, so host noise that drifts over minutes
/// is shared by neighbouring depths, and the fit's standard error (which assumes independent
/// points) is too small.
pub const SLOPE_SIGMAS: f64 = 3.0;

/// What to sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepConfig {
    /// The chunk (its `depth_tokens` is ignored: depths follow from the chunk index).
    pub work: Work,
    /// Chunks per pass: depths 0, chunk, ..., (chunks - 1) x chunk.
    pub chunks: u32,
    pub cycles: u32,
}

impl SweepConfig {
    /// Chunks needed to reach `max_depth` (the last probe at the largest multiple of the chunk
    /// not above it).
    pub fn chunks_for(max_depth: u32, chunk_tokens: u32) -> u32 {
        max_depth / chunk_tokens.max(1) + 1
    }

    pub fn depth_of(&self, chunk: u32) -> u32 {
        chunk * self.work.chunk_tokens
    }

    pub fn max_depth(&self) -> u32 {
        self.depth_of(self.chunks.saturating_sub(1))
    }
}

/// One measured chunk of one pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkRecord {
    pub cycle: u32,
    /// `Fused` or `Timed`.
    pub mode: Mode,
    pub chunk: u32,
    pub wall_ms: f64,
    /// Per-node µs of a TIMED chunk, in graph order; empty for FUSED.
    pub node_us: Vec<f32>,
}

const RECORD_MAGIC: &[u8; 4] = b"OPLC";
const RECORD_VERSION: u32 = 1;
const RECORD_HEADER_BYTES: usize = 4 + 4 + 4 + 4 + 4 + 4 + 8;

#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error("{what}: {why}")]
    BadRecord { what: String, why: String },
    #[error("{0}")]
    Store(String),
    #[error("pass {mode} of cycle {cycle} has chunks {found:?} stored, not a prefix 0..n")]
    Gap {
        cycle: u32,
        mode: String,
        found: Vec<u32>,
    },
    #[error("no chunk of the sweep was measured")]
    Empty,
}

fn mode_code(mode: Mode) -> u32 {
    match mode {
        Mode::Fused => 0,
        Mode::FusedObserved => 1,
        Mode::Timed => 2,
    }
}

impl ChunkRecord {
    /// The file a record is stored in: `c000-timed-00012.bin`.
    pub fn file_name(cycle: u32, mode: Mode, chunk: u32) -> String {
        format!("c{cycle:03}-{}-{chunk:05}.bin", mode_name(mode))
    }

    /// Little-endian binary: magic, version, cycle, mode, chunk, node count, wall (f64), then one
    /// f32 of µs per node. About 4 bytes a node.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + 4 * self.node_us.len());
        out.extend_from_slice(RECORD_MAGIC);
        for v in [
            RECORD_VERSION,
            self.cycle,
            mode_code(self.mode),
            self.chunk,
            self.node_us.len() as u32,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&self.wall_ms.to_le_bytes());
        for v in &self.node_us {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out
    }

    /// Decodes a record; `what` names it in errors (a file path).
    pub fn decode(bytes: &[u8], what: &str) -> Result<ChunkRecord, SweepError> {
        let bad = |why: String| SweepError::BadRecord {
            what: what.to_string(),
            why,
        };
        if bytes.len() < RECORD_HEADER_BYTES || &bytes[..4] != RECORD_MAGIC {
            return Err(bad("not a chunk record".into()));
        }
        let u = |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        if u(4) != RECORD_VERSION {
            return Err(bad(format!("record version {}", u(4))));
        }
        let mode = match u(12) {
            0 => Mode::Fused,
            1 => Mode::FusedObserved,
            2 => Mode::Timed,
            m => return Err(bad(format!("unknown mode {m}"))),
        };
        let n = u(20) as usize;
        let expected = RECORD_HEADER_BYTES as u64 + 4 * n as u64;
        if bytes.len() as u64 != expected {
            return Err(bad(format!(
                "{} bytes for {n} nodes (expected {expected})",
                bytes.len()
            )));
        }
        let mut wall = [0u8; 8];
        wall.copy_from_slice(&bytes[24..32]);
        let node_us = bytes[RECORD_HEADER_BYTES..]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(ChunkRecord {
            cycle: u(8),
            mode,
            chunk: u(16),
            wall_ms: f64::from_le_bytes(wall),
            node_us,
        })
    }
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Fused => "fused",
        Mode::FusedObserved => "observed",
        Mode::Timed => "timed",
    }
}

/// Wall time of one pass, for the cost of a sweep against a plain prefill.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PassLog {
    pub cycle: u32,
    pub mode: Mode,
    /// The chunk the pass (re)started at: > 0 after a resume.
    pub first_chunk: u32,
    /// Untimed refill of the chunks before `first_chunk`.
    pub fill_ms: f64,
    /// The whole pass as the sweep paid it: fill, chunks, storing.
    pub total_ms: f64,
    /// Chunks measured while other processes used more than the noise gate allows (a cumulative
    /// pass cannot retake a chunk: they are counted, not rejected).
    #[serde(default)]
    pub noisy_chunks: u32,
}

/// Where chunk records go as they land, and what is already there.
pub trait ChunkStore {
    /// Chunks of (cycle, mode) already stored.
    fn stored(&self, cycle: u32, mode: Mode) -> Result<Vec<u32>, SweepError>;
    fn store(&mut self, record: &ChunkRecord) -> Result<(), SweepError>;
    fn store_pass(&mut self, log: &PassLog) -> Result<(), SweepError>;
}

/// Records in memory (tests).
#[derive(Debug, Default)]
pub struct MemoryStore {
    pub records: Vec<ChunkRecord>,
    pub passes: Vec<PassLog>,
}

impl ChunkStore for MemoryStore {
    fn stored(&self, cycle: u32, mode: Mode) -> Result<Vec<u32>, SweepError> {
        Ok(self
            .records
            .iter()
            .filter(|r| r.cycle == cycle && r.mode == mode)
            .map(|r| r.chunk)
            .collect())
    }
    fn store(&mut self, record: &ChunkRecord) -> Result<(), SweepError> {
        if self
            .records
            .iter()
            .any(|r| (r.cycle, r.mode, r.chunk) == (record.cycle, record.mode, record.chunk))
        {
            return Err(SweepError::Store(format!(
                "chunk {} of cycle {} measured twice",
                record.chunk, record.cycle
            )));
        }
        self.records.push(record.clone());
        Ok(())
    }
    fn store_pass(&mut self, log: &PassLog) -> Result<(), SweepError> {
        self.passes.push(log.clone());
        Ok(())
    }
}

/// Records in a run folder: `chunks/c000-timed-00012.bin` (one file a chunk, each written
/// atomically, so a killed sweep leaves whole records only) and `passes/c000-timed.json`.
#[derive(Debug)]
pub struct FolderStore {
    folder: crate::run_folder::RunFolder,
}

impl FolderStore {
    pub fn new(folder: crate::run_folder::RunFolder) -> FolderStore {
        FolderStore { folder }
    }

    pub fn folder(&self) -> &crate::run_folder::RunFolder {
        &self.folder
    }

    pub fn into_folder(self) -> crate::run_folder::RunFolder {
        self.folder
    }
}

fn store_err(e: impl std::fmt::Display) -> SweepError {
    SweepError::Store(e.to_string())
}

impl ChunkStore for FolderStore {
    fn stored(&self, cycle: u32, mode: Mode) -> Result<Vec<u32>, SweepError> {
        let dir = self.folder.path().join("chunks");
        if !dir.is_dir() {
            return Ok(Vec::new());
        }
        let prefix = format!("c{cycle:03}-{}-", mode_name(mode));
        let mut out = Vec::new();
        for entry in
            std::fs::read_dir(&dir).map_err(|e| store_err(format!("{}: {e}", dir.display())))?
        {
            let name = entry.map_err(store_err)?.file_name();
            let name = name.to_string_lossy();
            if let Some(n) = name
                .strip_prefix(&prefix)
                .and_then(|r| r.strip_suffix(".bin"))
            {
                out.push(n.parse().map_err(|_| {
                    store_err(format!("{}: unexpected file {name}", dir.display()))
                })?);
            }
        }
        Ok(out)
    }

    fn store(&mut self, record: &ChunkRecord) -> Result<(), SweepError> {
        let name = format!(
            "chunks/{}",
            ChunkRecord::file_name(record.cycle, record.mode, record.chunk)
        );
        self.folder
            .write(&name, &record.encode())
            .map_err(store_err)?;
        Ok(())
    }

    fn store_pass(&mut self, log: &PassLog) -> Result<(), SweepError> {
        let name = format!(
            "passes/c{:03}-{}-from{:05}.json",
            log.cycle,
            mode_name(log.mode),
            log.first_chunk
        );
        self.folder.write_json(&name, log).map_err(store_err)?;
        Ok(())
    }
}

/// Reads every chunk record and pass log of a run folder.
pub fn load_folder(dir: &std::path::Path) -> Result<(Vec<ChunkRecord>, Vec<PassLog>), SweepError> {
    let mut records = Vec::new();
    let chunks = dir.join("chunks");
    if chunks.is_dir() {
        let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(&chunks)
            .map_err(|e| store_err(format!("{}: {e}", chunks.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "bin"))
            .collect();
        names.sort();
        for p in names {
            let bytes =
                std::fs::read(&p).map_err(|e| store_err(format!("{}: {e}", p.display())))?;
            records.push(ChunkRecord::decode(&bytes, &p.display().to_string())?);
        }
    }
    let mut passes = Vec::new();
    let pdir = dir.join("passes");
    if pdir.is_dir() {
        let mut names: Vec<std::path::PathBuf> = std::fs::read_dir(&pdir)
            .map_err(|e| store_err(format!("{}: {e}", pdir.display())))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        names.sort();
        for p in names {
            passes.push(crate::run_folder::read_json(&p).map_err(store_err)?);
        }
    }
    Ok((records, passes))
}

/// How many chunks of a pass are stored, checking they are 0..n.
fn stored_prefix(store: &dyn ChunkStore, cycle: u32, mode: Mode) -> Result<u32, SweepError> {
    let mut found = store.stored(cycle, mode)?;
    found.sort_unstable();
    found.dedup();
    if found.iter().enumerate().any(|(i, &c)| c != i as u32) {
        return Err(SweepError::Gap {
            cycle,
            mode: mode_name(mode).into(),
            found,
        });
    }
    Ok(found.len() as u32)
}

/// Progress of a sweep: (chunks done, chunks in all, what is running).
pub type SweepProgress<'a> = &'a mut dyn FnMut(u64, u64, &str);

/// Runs (or resumes) the sweep: for every cycle a FUSED then a TIMED pass, each starting after
/// its last stored chunk (refilling the context untimed up to there). `graph_len` is the node
/// count every TIMED chunk must have.
pub fn run_sweep(
    engine: &mut dyn Engine,
    cfg: &SweepConfig,
    graph_len: usize,
    store: &mut dyn ChunkStore,
    progress: SweepProgress<'_>,
) -> Result<(), SweepError> {
    let total = cfg.cycles as u64 * 2 * cfg.chunks as u64;
    let mut done = 0u64;
    for cycle in 0..cfg.cycles {
        for mode in [Mode::Fused, Mode::Timed] {
            let first = stored_prefix(store, cycle, mode)?;
            done += first as u64;
            if first >= cfg.chunks {
                continue;
            }
            let t0 = Instant::now();
            progress(
                done,
                total,
                &format!("cycle {} {} refill", cycle + 1, mode_name(mode)),
            );
            engine.start_pass(mode, first)?;
            let fill_ms = t0.elapsed().as_secs_f64() * 1e3;
            let mut noisy_chunks = 0;
            for chunk in first..cfg.chunks {
                progress(
                    done,
                    total,
                    &format!(
                        "cycle {} {} depth {}",
                        cycle + 1,
                        mode_name(mode),
                        cfg.depth_of(chunk)
                    ),
                );
                let before = crate::noise::read_snapshot();
                let started = Instant::now();
                let t = engine.pass_chunk(mode, chunk)?;
                // judged as the gate judges: on the wall this process saw, from 20 ms
                let judged = started.elapsed().as_millis() >= 20;
                if let (Some(b), Some(a)) = (before, crate::noise::read_snapshot()) {
                    if judged
                        && crate::noise::reading(&b, &a).noisy(crate::noise::DEFAULT_MAX_OTHERS)
                    {
                        noisy_chunks += 1;
                    }
                }
                if mode == Mode::Timed && t.node_us.len() != graph_len {
                    return Err(EngineError::GraphChanged(format!(
                        "chunk {chunk} timed {} nodes, the graph has {graph_len}",
                        t.node_us.len()
                    ))
                    .into());
                }
                store.store(&ChunkRecord {
                    cycle,
                    mode,
                    chunk,
                    wall_ms: t.wall_ms,
                    node_us: t.node_us.iter().map(|&v| v as f32).collect(),
                })?;
                done += 1;
            }
            store.store_pass(&PassLog {
                cycle,
                mode,
                first_chunk: first,
                fill_ms,
                total_ms: t0.elapsed().as_secs_f64() * 1e3,
                noisy_chunks,
            })?;
        }
    }
    progress(total, total, "done");
    Ok(())
}

/// One depth of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DepthRow {
    pub chunk: u32,
    pub depth: u32,
    /// Cycles that measured this depth, per pass.
    pub fused_cycles: u32,
    pub timed_cycles: u32,
    pub fused_ms: f64,
    pub fused_ms_min: f64,
    pub fused_ms_max: f64,
    pub tok_per_s: f64,
    pub timed_sum_ms: f64,
    pub agreement: f64,
    pub coverage: f64,
    /// ms/token per band, in the summary's band order.
    pub ms_per_token: Vec<f64>,
}

/// A band's fit against depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandFit {
    pub band: String,
    /// ms/token = a + b x depth.
    pub fit: LinearFit,
    pub mean_ms_per_token: f64,
    /// Coefficient of variation of the band's ms/token across depths.
    pub cv: f64,
    /// Fitted change across the swept depths, as a share of the mean.
    pub change: f64,
    /// The change is within [`FLAT_CHANGE`], or the slope is within [`SLOPE_SIGMAS`] standard
    /// errors of zero.
    pub flat: bool,
}

/// Where the attention band overtakes the FFN band.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Crossover {
    pub attention_band: String,
    pub ffn_band: String,
    /// `within` (the fits cross inside the swept depths), `beyond` (they would cross later:
    /// no crossover up to the last depth), `from_start` (attention already costs more at depth
    /// 0), `never` (attention does not grow faster).
    pub status: String,
    /// The fitted crossing depth and its standard error, where the lines cross at all.
    pub depth: Option<f64>,
    pub sigma: Option<f64>,
    /// The first measured depth where attention costs at least as much as the FFN.
    pub first_measured_depth: Option<u32>,
    pub text: String,
}

/// Cost of the sweep against one plain cumulative prefill to the same depth.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepCost {
    /// Median over cycles of (FUSED pass + TIMED pass) wall, seconds.
    pub cycle_s: f64,
    /// Median over cycles of the sum of FUSED chunk walls: a plain cumulative prefill.
    pub plain_prefill_s: f64,
    pub ratio: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSummary {
    pub schema_version: u32,
    pub tokens: u32,
    pub chunks: u32,
    pub max_depth: u32,
    pub cycles: u32,
    pub bands: Vec<String>,
    pub depths: Vec<DepthRow>,
    pub fits: Vec<BandFit>,
    pub crossover: Option<Crossover>,
    pub mean_abs_agreement: f64,
    pub min_coverage: f64,
    pub cost: Option<SweepCost>,
    pub checks: Vec<Check>,
}

/// Each node's band as an index into `bands` (unassigned nodes get `bands.len()`).
pub fn band_index(assignments: &[Assignment], bands: &[String]) -> Vec<u16> {
    assignments
        .iter()
        .map(|a| {
            bands
                .iter()
                .position(|b| *b == a.band)
                .unwrap_or(bands.len()) as u16
        })
        .collect()
}

/// Median of up to a few values, in place (cycles are few).
fn median_small(v: &mut [f32]) -> f32 {
    v.sort_unstable_by(f32::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Summarises stored records: per depth, per-node medians over cycles give band shares, times
/// the median FUSED wall / tokens; per band a line against depth; the crossover.
pub fn summarise_sweep(
    cfg: &SweepConfig,
    rules: &BandRules,
    graph: &[NodeInfo],
    index: &[u16],
    records: &[ChunkRecord],
    passes: &[PassLog],
) -> Result<SweepSummary, SweepError> {
    let bands: Vec<String> = rules.bands.iter().map(|b| b.name.clone()).collect();
    let nb = bands.len();
    let tok = cfg.work.chunk_tokens.max(1) as f64;
    let mut by_chunk: BTreeMap<u32, (Vec<f64>, Vec<&[f32]>)> = BTreeMap::new();
    for r in records {
        let e = by_chunk.entry(r.chunk).or_default();
        match r.mode {
            Mode::Fused => e.0.push(r.wall_ms),
            Mode::Timed => {
                if r.node_us.len() != graph.len() {
                    return Err(SweepError::BadRecord {
                        what: ChunkRecord::file_name(r.cycle, r.mode, r.chunk),
                        why: format!("{} nodes, the graph has {}", r.node_us.len(), graph.len()),
                    });
                }
                e.1.push(&r.node_us)
            }
            Mode::FusedObserved => {}
        }
    }
    let mut depths = Vec::new();
    let mut column: Vec<f32> = Vec::new();
    for (&chunk, (fused, timed)) in &by_chunk {
        if fused.is_empty() || timed.is_empty() {
            continue;
        }
        let mut band_us = vec![0f64; nb + 1];
        for (i, &b) in index.iter().enumerate() {
            column.clear();
            column.extend(timed.iter().map(|t| t[i]));
            band_us[b as usize] += median_small(&mut column) as f64;
        }
        let total: f64 = band_us.iter().sum();
        let sums: Vec<f64> = timed
            .iter()
            .map(|t| t.iter().map(|&v| v as f64).sum::<f64>() / 1e3)
            .collect();
        let fused_s = Sample::new(fused).map_err(|_| SweepError::BadRecord {
            what: format!("chunk {chunk}"),
            why: "non-finite FUSED wall".into(),
        })?;
        let timed_sum = Sample::new(&sums).map_err(|_| SweepError::BadRecord {
            what: format!("chunk {chunk}"),
            why: "non-finite TIMED times".into(),
        })?;
        let wall = fused_s.median();
        depths.push(DepthRow {
            chunk,
            depth: cfg.depth_of(chunk),
            fused_cycles: fused.len() as u32,
            timed_cycles: timed.len() as u32,
            fused_ms: wall,
            fused_ms_min: fused_s.min(),
            fused_ms_max: fused_s.max(),
            tok_per_s: tok / wall * 1e3,
            timed_sum_ms: timed_sum.median(),
            agreement: timed_sum.median() / wall - 1.0,
            coverage: if total > 0.0 {
                1.0 - band_us[nb] / total
            } else {
                0.0
            },
            ms_per_token: band_us[..nb]
                .iter()
                .map(|us| {
                    if total > 0.0 {
                        us / total * wall / tok
                    } else {
                        0.0
                    }
                })
                .collect(),
        });
    }
    if depths.is_empty() {
        return Err(SweepError::Empty);
    }
    let x: Vec<f64> = depths.iter().map(|d| d.depth as f64).collect();
    let span = x.last().copied().unwrap_or(0.0) - x[0];
    let mut fits = Vec::new();
    if depths.len() >= 2 {
        for (b, band) in bands.iter().enumerate() {
            let y: Vec<f64> = depths.iter().map(|d| d.ms_per_token[b]).collect();
            let Ok(fit) = linear_fit(&x, &y) else {
                continue;
            };
            let s = Sample::new(&y).map_err(|_| SweepError::Empty)?;
            let mean = s.mean();
            let change = if mean != 0.0 {
                (fit.b * span / mean).abs()
            } else {
                0.0
            };
            let insignificant = fit.n > 2 && fit.b.abs() <= SLOPE_SIGMAS * fit.se_b;
            fits.push(BandFit {
                band: band.clone(),
                fit,
                mean_ms_per_token: mean,
                cv: s.cv(),
                change,
                flat: change <= FLAT_CHANGE || insignificant,
            });
        }
    }
    let crossover = crossover_of(rules, &bands, &depths, &fits, cfg.max_depth());
    let mean_abs_agreement =
        depths.iter().map(|d| d.agreement.abs()).sum::<f64>() / depths.len() as f64;
    let min_coverage = depths
        .iter()
        .map(|d| d.coverage)
        .fold(f64::INFINITY, f64::min);
    let cost = sweep_cost(records, passes, cfg.cycles);
    let complete = depths.len() as u32 == cfg.chunks
        && depths
            .iter()
            .all(|d| d.fused_cycles == cfg.cycles && d.timed_cycles == cfg.cycles);
    let mut checks = vec![
        Check {
            name: "coverage".into(),
            status: if min_coverage >= 1.0 && index.iter().all(|&b| (b as usize) < nb) {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: format!(
                "lowest coverage across depths {:.2} %",
                min_coverage * 100.0
            ),
        },
        Check {
            name: "agreement".into(),
            status: if mean_abs_agreement <= AGREEMENT_GOAL {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "mean |sum TIMED / FUSED - 1| across depths {:.2} % (goal ≤ {:.0} %)",
                mean_abs_agreement * 100.0,
                AGREEMENT_GOAL * 100.0
            ),
        },
        Check {
            name: "complete".into(),
            status: if complete {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "{} of {} depths measured by every cycle of both passes",
                depths
                    .iter()
                    .filter(|d| d.fused_cycles == cfg.cycles && d.timed_cycles == cfg.cycles)
                    .count(),
                cfg.chunks
            ),
        },
    ];
    let noisy: u32 = passes.iter().map(|p| p.noisy_chunks).sum();
    checks.push(Check {
        name: "noise".into(),
        status: if noisy == 0 {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: format!(
            "{noisy} chunks measured while the busiest other process used more than {:.0} % of one CPU, or all others more than that share of the machine",
            crate::noise::DEFAULT_MAX_OTHERS * 100.0
        ),
    });
    if let Some(att) = rules
        .attention_band
        .as_ref()
        .and_then(|a| fits.iter().find(|f| &f.band == a))
    {
        checks.push(Check {
            name: "attention fit".into(),
            status: if att.fit.r2 >= 0.9 || att.flat {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: format!(
                "{}: R² {:.4}, slope {:.3e} ms/token per token of depth",
                att.band, att.fit.r2, att.fit.b
            ),
        });
    }
    Ok(SweepSummary {
        schema_version: SWEEP_SCHEMA_VERSION,
        tokens: cfg.work.chunk_tokens,
        chunks: cfg.chunks,
        max_depth: cfg.max_depth(),
        cycles: cfg.cycles,
        bands,
        depths,
        fits,
        crossover,
        mean_abs_agreement,
        min_coverage,
        cost,
        checks,
    })
}

fn crossover_of(
    rules: &BandRules,
    bands: &[String],
    depths: &[DepthRow],
    fits: &[BandFit],
    max_depth: u32,
) -> Option<Crossover> {
    let att = rules.attention_band.as_ref()?;
    let ffn = rules.ffn_band.as_ref()?;
    let ai = bands.iter().position(|b| b == att)?;
    let fi = bands.iter().position(|b| b == ffn)?;
    let fa = fits.iter().find(|f| &f.band == att)?;
    let ff = fits.iter().find(|f| &f.band == ffn)?;
    let first_measured_depth = depths
        .iter()
        .find(|d| d.ms_per_token[ai] >= d.ms_per_token[fi])
        .map(|d| d.depth);
    let (status, depth, sigma) = if fa.fit.a >= ff.fit.a {
        ("from_start", None, None)
    } else {
        match crossing(&fa.fit, &ff.fit) {
            Some((x, s)) if x >= 0.0 && x <= max_depth as f64 => ("within", Some(x), Some(s)),
            Some((x, s)) if x > max_depth as f64 => ("beyond", Some(x), Some(s)),
            _ => ("never", None, None),
        }
    };
    let text = match status {
        "within" => format!(
            "{att} overtakes {ffn} at depth {:.0} ± {:.0} tokens (fit), first measured at {}",
            depth.unwrap_or(0.0),
            sigma.unwrap_or(0.0),
            first_measured_depth
                .map(|d| d.to_string())
                .unwrap_or_else(|| "none".into())
        ),
        "beyond" => format!(
            "no crossover up to {max_depth} tokens; the fits would cross at {:.0} ± {:.0} (extrapolated)",
            depth.unwrap_or(0.0),
            sigma.unwrap_or(0.0)
        ),
        "from_start" => format!("{att} costs at least as much as {ffn} from depth 0"),
        _ => format!("no crossover up to {max_depth} tokens: {att} does not grow faster than {ffn}"),
    };
    Some(Crossover {
        attention_band: att.clone(),
        ffn_band: ffn.clone(),
        status: status.into(),
        depth,
        sigma,
        first_measured_depth,
        text,
    })
}

fn sweep_cost(records: &[ChunkRecord], passes: &[PassLog], cycles: u32) -> Option<SweepCost> {
    let mut cycle_s = Vec::new();
    let mut plain_s = Vec::new();
    for c in 0..cycles {
        let both: Vec<&PassLog> = passes.iter().filter(|p| p.cycle == c).collect();
        // only cycles whose two passes ran whole in one go say what a cycle costs
        if both.len() != 2 || both.iter().any(|p| p.first_chunk != 0) {
            continue;
        }
        cycle_s.push(both.iter().map(|p| p.total_ms).sum::<f64>() / 1e3);
        plain_s.push(
            records
                .iter()
                .filter(|r| r.cycle == c && r.mode == Mode::Fused)
                .map(|r| r.wall_ms)
                .sum::<f64>()
                / 1e3,
        );
    }
    let cycle = Sample::new(&cycle_s).ok()?.median();
    let plain = Sample::new(&plain_s).ok()?.median();
    Some(SweepCost {
        cycle_s: cycle,
        plain_prefill_s: plain,
        ratio: cycle / plain,
    })
}

/// True when every node landed in a band (for callers that want to refuse early).
pub fn fully_assigned(assignments: &[Assignment]) -> bool {
    assignments.iter().all(|a| a.band != UNASSIGNED)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ChunkTiming;

    #[test]
    fn record_round_trip_and_errors() {
        let r = ChunkRecord {
            cycle: 2,
            mode: Mode::Timed,
            chunk: 17,
            wall_ms: 123.25,
            node_us: vec![1.5, 0.0, 1e6],
        };
        let bytes = r.encode();
        assert_eq!(bytes.len(), RECORD_HEADER_BYTES + 12);
        assert_eq!(ChunkRecord::decode(&bytes, "x").unwrap(), r);
        let err = ChunkRecord::decode(&bytes[..bytes.len() - 1], "c002.bin").unwrap_err();
        assert!(err.to_string().contains("c002.bin"), "{err}");
        assert!(ChunkRecord::decode(b"nope", "y").is_err());
        assert_eq!(
            ChunkRecord::file_name(2, Mode::Timed, 17),
            "c002-timed-00017.bin"
        );
    }

    /// An engine whose attention node grows linearly with depth and whose MoE node is flat.
    struct DepthMock {
        chunk: u32,
        pass: Option<(Mode, u32)>,
        attn_a: f64,
        attn_b: f64,
        moe: f64,
        fail_at: Option<(Mode, u32)>,
    }

    impl Engine for DepthMock {
        fn info(&self) -> crate::engine::EngineInfo {
            unimplemented!()
        }
        fn prepare(&mut self, _: &Work) -> Result<(), EngineError> {
            Ok(())
        }
        fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
            Ok(Vec::new())
        }
        fn run(&mut self, _: Mode) -> Result<ChunkTiming, EngineError> {
            unimplemented!()
        }
        fn start_pass(&mut self, mode: Mode, first: u32) -> Result<(), EngineError> {
            self.pass = Some((mode, first));
            Ok(())
        }
        fn pass_chunk(&mut self, mode: Mode, index: u32) -> Result<ChunkTiming, EngineError> {
            assert_eq!(self.pass, Some((mode, index)), "chunks out of order");
            if self.fail_at == Some((mode, index)) {
                return Err(EngineError::Failed("killed".into()));
            }
            self.pass = Some((mode, index + 1));
            let depth = (index * self.chunk) as f64;
            // per token ms x tokens = chunk ms; node µs = ms x 1000
            let attn = (self.attn_a + self.attn_b * depth) * self.chunk as f64 * 1e3;
            let moe = self.moe * self.chunk as f64 * 1e3;
            Ok(ChunkTiming {
                wall_ms: (attn + moe) / 1e3,
                node_us: if mode == Mode::Timed {
                    vec![attn, moe]
                } else {
                    Vec::new()
                },
                nodes_seen: 2,
                output_hash: 0,
            })
        }
    }

    fn mock_graph() -> (Vec<NodeInfo>, BandRules, Vec<u16>) {
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let graph = crate::mock::MockEngine::new(&[
            ("FLASH_ATTN_EXT", "node_0", "", 1.0),
            (
                "MUL_MAT_ID",
                "ffn_moe_gate-0",
                "blk.0.ffn_gate_exps.weight",
                1.0,
            ),
        ])
        .graph;
        let md = crate::arch::tests::qwen35moe_md(4);
        let arch = crate::arch::ArchInfo::from_metadata(&md).unwrap();
        let a = crate::band::Categoriser::new(&rules, &arch).categorise(&graph);
        let bands: Vec<String> = rules.bands.iter().map(|b| b.name.clone()).collect();
        let idx = band_index(&a, &bands);
        (graph, rules, idx)
    }

    fn cfg(chunks: u32, cycles: u32) -> SweepConfig {
        SweepConfig {
            work: Work {
                chunk_tokens: 512,
                depth_tokens: 0,
                all_logits: false,
                token_seed: 0,
                decode_tokens: 0,
                parallel: 1,
            },
            chunks,
            cycles,
        }
    }

    #[test]
    fn fits_and_crossover_have_the_known_answer() {
        // attention 0.1 + 3e-4 x L ms/token, moe flat 4.3: they cross at L = 14000
        let (graph, rules, idx) = mock_graph();
        let mut e = DepthMock {
            chunk: 512,
            pass: None,
            attn_a: 0.1,
            attn_b: 3e-4,
            moe: 4.3,
            fail_at: None,
        };
        let c = cfg(33, 2);
        let mut store = MemoryStore::default();
        run_sweep(&mut e, &c, graph.len(), &mut store, &mut |_, _, _| {}).unwrap();
        assert_eq!(store.records.len(), 33 * 2 * 2);
        let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
        assert_eq!(s.depths.len(), 33);
        assert_eq!(s.max_depth, 16384);
        let att = s.fits.iter().find(|f| f.band == "attention").unwrap();
        assert!(
            (att.fit.a - 0.1).abs() < 1e-6 && (att.fit.b - 3e-4).abs() < 1e-9,
            "{att:?}"
        );
        assert!(att.fit.r2 > 0.999999 && !att.flat);
        let moe = s.fits.iter().find(|f| f.band == "moe").unwrap();
        assert!(moe.flat && (moe.mean_ms_per_token - 4.3).abs() < 1e-6);
        let x = s.crossover.unwrap();
        assert_eq!(x.status, "within");
        assert!((x.depth.unwrap() - 14_000.0).abs() < 1.0, "{:?}", x.depth);
        // first measured depth with attention >= moe: 0.1 + 3e-4 L >= 4.3 -> L >= 14000 -> 14336
        assert_eq!(x.first_measured_depth, Some(14336));
        // node times are stored as f32: agreement is exact up to f32 rounding
        assert!(s.mean_abs_agreement < 1e-6);
        assert!(s.cost.is_some());
    }

    #[test]
    fn no_crossover_up_to_the_last_depth() {
        let (graph, rules, idx) = mock_graph();
        let mut e = DepthMock {
            chunk: 512,
            pass: None,
            attn_a: 0.1,
            attn_b: 3e-4,
            moe: 4.3,
            fail_at: None,
        };
        let c = cfg(9, 1);
        let mut store = MemoryStore::default();
        run_sweep(&mut e, &c, graph.len(), &mut store, &mut |_, _, _| {}).unwrap();
        let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
        let x = s.crossover.unwrap();
        assert_eq!(x.status, "beyond");
        assert!(x.text.starts_with("no crossover up to 4096"), "{}", x.text);
        assert_eq!(x.first_measured_depth, None);
    }

    #[test]
    fn an_interrupted_sweep_resumes_without_losing_or_repeating_a_chunk() {
        let (graph, rules, idx) = mock_graph();
        let c = cfg(6, 2);
        let mut store = MemoryStore::default();
        let mut e = DepthMock {
            chunk: 512,
            pass: None,
            attn_a: 0.1,
            attn_b: 3e-4,
            moe: 4.3,
            fail_at: Some((Mode::Timed, 3)),
        };
        // cycle 0: FUSED pass complete, TIMED pass dies at chunk 3
        assert!(run_sweep(&mut e, &c, graph.len(), &mut store, &mut |_, _, _| {}).is_err());
        assert_eq!(store.records.len(), 6 + 3);
        e.fail_at = None;
        run_sweep(&mut e, &c, graph.len(), &mut store, &mut |_, _, _| {}).unwrap();
        let mut keys: Vec<(u32, u32, u32)> = store
            .records
            .iter()
            .map(|r| (r.cycle, mode_code(r.mode), r.chunk))
            .collect();
        let n = keys.len();
        keys.sort_unstable();
        keys.dedup();
        assert_eq!(keys.len(), n, "a chunk was measured twice");
        assert_eq!(n, 6 * 2 * 2);
        let resumed = store.passes.iter().find(|p| p.first_chunk > 0).unwrap();
        assert_eq!(
            (resumed.cycle, resumed.mode, resumed.first_chunk),
            (0, Mode::Timed, 3)
        );
        let s = summarise_sweep(&c, &rules, &graph, &idx, &store.records, &store.passes).unwrap();
        assert_eq!(s.depths.len(), 6);
        assert!(
            s.checks.iter().all(|c| c.status == CheckStatus::Pass),
            "{:?}",
            s.checks
        );
    }

    #[test]
    fn a_gap_in_stored_chunks_is_refused() {
        let mut store = MemoryStore::default();
        for chunk in [0, 2] {
            store
                .store(&ChunkRecord {
                    cycle: 0,
                    mode: Mode::Fused,
                    chunk,
                    wall_ms: 1.0,
                    node_us: vec![],
                })
                .unwrap();
        }
        assert!(matches!(
            stored_prefix(&store, 0, Mode::Fused),
            Err(SweepError::Gap { .. })
        ));
    }
}
