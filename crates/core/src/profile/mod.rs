//! The per-node profile of one chunk: the measurement loop (FUSED, FUSED with the instrument,
//! TIMED, interleaved per cycle) and the pure summary (band ms/token = TIMED share x FUSED wall /
//! tokens, agreement, coverage, overhead, checks).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::AuditFinding;
use crate::engine::{Mode, Work};
use crate::node::NodeInfo;
use crate::stats::Spread;

mod checks;
mod measure;
mod summary;

pub use checks::{census_check, noise_check, within_device_bound, worst, NOT_MEASURED};
pub use measure::{measure, measure_with, ProgressFn};
pub use summary::{analyse, membership, per_cycle_ms_per_token, summarise};

/// Version of `raw.json` and `summary.json`; bumped on any incompatible change.
pub const PROFILE_SCHEMA_VERSION: u32 = 1;

/// Agreement (|sum TIMED / FUSED - 1|) beyond which the share method is not trusted.
pub const AGREEMENT_GOAL: f64 = 0.03;
/// Instrument overhead (FUSED with callback / without) beyond which FUSED-with-callback is not
/// native speed.
pub const OVERHEAD_GOAL: f64 = 1.01;

/// How to profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileConfig {
    pub work: Work,
    /// Measured cycles; each runs FUSED, FUSED with the instrument and TIMED once.
    pub cycles: u32,
    /// Unmeasured cycles first (allocations, weight repacking, caches).
    pub warmup: u32,
    /// Extra interleaved (FUSED, FUSED with the instrument) pairs after the cycles, for a
    /// tighter overhead estimate on a noisy machine.
    #[serde(default)]
    pub overhead_pairs: u32,
    /// The noise gate around every run.
    #[serde(default)]
    pub gate: crate::noise::GateConfig,
}

/// One measured cycle.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CycleRecord {
    /// The order the three runs took in this cycle (rotated from cycle to cycle).
    pub order: Vec<Mode>,
    pub fused_ms: f64,
    pub fused_observed_ms: f64,
    /// Wall of the TIMED run (node times plus what lies between nodes).
    pub timed_wall_ms: f64,
    /// Per-node microseconds of the TIMED run, in graph order.
    pub node_us: Vec<f64>,
    /// The engine's calibration of the isolation cost, µs per node per step, taken in this
    /// cycle right after the TIMED run: on average over the working nodes, and per node of the
    /// graph where the engine measures it node by node (empty: the average for every node).
    #[serde(default)]
    pub isolation_us: Option<f64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub isolation_node_us: Vec<f64>,
    /// What the noise gate saw around each of the three runs, in `order` (empty in runs stored
    /// before it was recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub noise: Vec<crate::noise::RunNoise>,
    /// The TIMED run and the FUSED run on the device's own clock, where the engine reads one
    /// (`crate::device_clock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_timed: Option<crate::device_clock::DeviceTiming>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_fused: Option<crate::device_clock::DeviceTiming>,
}

/// Everything measured, as stored in a run folder's `raw.json`; the summary is a pure function
/// of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileRaw {
    pub schema_version: u32,
    pub config: ProfileConfig,
    pub graph: Vec<NodeInfo>,
    pub cycles: Vec<CycleRecord>,
    /// Distinct output hashes seen per mode (one each when every run computed the same logits).
    pub output_hashes: BTreeMap<String, Vec<String>>,
    /// The extra overhead pairs: (FUSED ms, FUSED-with-instrument ms).
    #[serde(default)]
    pub overhead_pairs: Vec<(f64, f64)>,
    /// What the noise gate saw around each run of the extra pairs: (FUSED, with the instrument).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub overhead_pairs_noise: Vec<(crate::noise::RunNoise, crate::noise::RunNoise)>,
    /// What the noise gate rejected and kept.
    #[serde(default)]
    pub gate: crate::noise::GateStats,
    /// Every run's logits were checked finite (the engine fails a run whose logits are NaN or
    /// infinite, and the measurement stops there); false in files written before the check.
    #[serde(default)]
    pub outputs_checked_finite: bool,
    /// Decode steps each node's TIMED time sums: every step of the run where the graph is one
    /// step's (llama.cpp), 1 where the graph lists every step's nodes (candle, see
    /// [`crate::engine::Engine::graph_lists_every_step`]) and for a prefill chunk. `None` in runs stored before
    /// it was recorded: every step of the run.
    #[serde(default)]
    pub node_steps: Option<u32>,
    /// A split profile (RPC): FUSED walls of the same work on one process, every layer on this
    /// machine's CPU, measured after the split cycles.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub one_process_fused_ms: Vec<f64>,
    /// A split profile: its logits against the one-process run's, under the A/B tolerance.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_process_outputs: Option<crate::ab::Correctness>,
    /// A split profile whose one-process comparison was not measured: why (asked not to, the
    /// whole model would not fit this machine's memory, or the run failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_process_skipped: Option<String>,
    /// Each run whose logits hashed differently from the first run's, its logits compared with
    /// that run's row by row (read once per distinct hash, outside the timed runs). Empty when
    /// every run computed bit-identical logits or the engine does not expose its logits.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub outputs_compared: Vec<ModesCompared>,
}

/// The logits of a run whose hash differed from the reference run's (the first measured),
/// compared with the reference's row by row under the A/B gate's arithmetic
/// ([`crate::outputs::compare_rows`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModesCompared {
    /// The mode (label) and output hash of the run that differed.
    pub mode: String,
    pub hash: String,
    /// The reference run's mode and hash.
    pub against_mode: String,
    pub against_hash: String,
    /// One finding per row of logits (a prefill chunk's last token; a decode run's sequences).
    pub rows: Vec<crate::outputs::RowFinding>,
}

/// The largest NMSE between the logits of two modes of one profile that still counts as the
/// same output where the graph runs on a device other than the CPU: `test-backend-ops`' bound for
/// MUL_MAT, llama.cpp's own tolerance for a device's kernel against the CPU's, and the bound the
/// A/B of a CPU build against a device build is held to. A device backend fuses neighbouring
/// ops when it runs the graph whole (FUSED; ggml-vulkan fuses RMS_NORM with MUL, MUL_MAT with
/// ADD, the MoE router's softmax and top-k, among others) and cannot when each node is its own
/// submission (TIMED); a fused kernel rounds differently, each within `test-backend-ops`' 1e-7
/// of the unfused ops, and the model carries it to the logits (3e-6 on the tiny MoE on
/// lavapipe; with `GGML_VK_DISABLE_FUSION=1` the modes agree bit for bit). On the CPU no mode
/// may change the arithmetic, and the modes must agree bit for bit.
pub const DEVICE_MODES_MAX_NMSE: f64 = 5e-4;

impl ProfileRaw {
    /// Reads a run's `raw.json`, refusing a newer or unknown schema version.
    pub fn read(path: &std::path::Path) -> Result<ProfileRaw, crate::run_folder::RunFolderError> {
        crate::run_folder::read_versioned(path, PROFILE_SCHEMA_VERSION)
    }

    /// Decode steps each node's TIMED time sums (1 for a prefill chunk).
    pub fn node_steps(&self) -> u32 {
        self.node_steps
            .unwrap_or(self.config.work.decode_tokens)
            .max(1)
    }
}
/// One band of the summary.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandRow {
    pub band: String,
    /// The median over cycles of the per-cycle value (the band's share of that cycle's TIMED
    /// sum x that cycle's FUSED wall / tokens): one estimator for the point and its range.
    pub ms_per_token: f64,
    /// Range (min..max) of the same per-cycle values.
    pub ms_per_token_min: f64,
    pub ms_per_token_max: f64,
    /// This band's ms/token over the sum of every band's (the shares add up to 1).
    pub share: f64,
    /// Nodes in the band, views included.
    pub nodes: u32,
    /// Nodes in the band that do work (views and nodes the backend skips excluded).
    pub working_nodes: u32,
    /// The band's median over cycles of its TIMED milliseconds for the whole chunk.
    pub timed_ms: f64,
    /// The same estimator after removing the isolation cost (see
    /// [`ProfileSummary::isolation_us`]) from every node: what matters in decode, where a node's
    /// work is small beside its isolation; `share_corrected` is its share of the corrected sum.
    pub ms_per_token_corrected: f64,
    pub share_corrected: f64,
    /// Working nodes of the band that removing the isolation stopped at 0 in at least one
    /// cycle (their TIMED time was below what isolating them cost): the corrected figure is
    /// then a lower bound, and the `corrected at 0` check warns.
    #[serde(default)]
    pub corrected_clamped_nodes: u32,
}

/// Nodes of one band grouped by name token, for listing what a band holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NameRow {
    pub name: String,
    pub ops: Vec<String>,
    pub nodes: u32,
    pub ms_per_token: f64,
}

/// Status of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CheckStatus {
    Pass,
    /// Outside a goal: the numbers stand but deserve caution.
    Warn,
    /// A result that must not be trusted.
    Fail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub status: CheckStatus,
    pub detail: String,
}

/// The summary of a profile (`summary.json`). Scripts rely on the top-level fields `coverage`,
/// `agreement`, `overhead`, `fused_ms`, `tokens` and `bands`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProfileSummary {
    pub schema_version: u32,
    /// Tokens in the measured chunk.
    pub tokens: u32,
    pub depth_tokens: u32,
    /// Which logits were requested: `last` (as llama-bench) or `all`.
    pub logits: String,
    pub cycles: u32,
    /// Median FUSED wall of the chunk, no instrument.
    pub fused_ms: f64,
    pub fused_ms_spread: Spread,
    pub tok_per_s: f64,
    /// Median sum of TIMED node times.
    pub timed_sum_ms: f64,
    pub timed_wall_ms: f64,
    /// Median over cycles of (sum TIMED / FUSED - 1). This and every figure below that compares
    /// runs of two modes (their spreads, the isolation cost and the corrected agreement, the
    /// overhead) is NaN, null in JSON, where the run did not measure it: an imported trace
    /// (one self-traced run), node records (no run with the instrument installed), a graph
    /// without calibration or idle nodes.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub agreement: f64,
    pub agreement_spread: Spread,
    /// What isolating one node costs in TIMED mode (thread-pool wake-up, synchronisation,
    /// callback), measured, not assumed, per node and per run (a decode run sums its steps):
    /// the engine's calibration graph of trivial nodes where it has one, else the graph's own
    /// nodes that do no work.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub isolation_us: f64,
    /// The same per decode step (equal to `isolation_us` for a prefill chunk).
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub isolation_us_per_step: f64,
    /// Decode steps each node's TIMED time sums (see [`ProfileRaw::node_steps`]).
    #[serde(default = "one")]
    pub node_steps: u32,
    /// `calibration, node by node`, `calibration`, `idle nodes of each device` or `idle nodes`.
    pub isolation_source: String,
    /// The estimate from the graph's nodes that do no work (views, skipped nodes), per node per
    /// run: a lower bound, since a view is not dispatched to the thread pool.
    pub isolation_idle_us: f64,
    /// Nodes that do no work, the idle estimate's sample.
    pub isolation_nodes: u32,
    /// Agreement after removing the calibrated isolation cost from every node.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub agreement_corrected: f64,
    /// Decode: what the calibration left unexplained, µs per working node per step (median
    /// over cycles), taken equally from every working node for the corrected columns, so they
    /// sum to the FUSED wall (see [`crate::isolation`]); negative where the calibration took too
    /// much. 0 for a prefill chunk, whose corrected columns remove the calibration only.
    #[serde(default)]
    pub isolation_remainder_us: f64,
    /// Generated tokens per sequence in decode mode (0: a prefill chunk), and sequences.
    pub decode_tokens: u32,
    pub parallel: u32,
    /// 1 - the `unassigned` band's ms/token over the sum of every band's: the share of the TIMED
    /// time that landed in a band.
    pub coverage: f64,
    /// Median over interleaved pairs (one per cycle, plus any extra pairs) of
    /// FUSED-with-instrument / FUSED.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub overhead: f64,
    pub overhead_spread: Spread,
    /// The same two ratios from the fastest run of each mode (min TIMED sum / min FUSED - 1,
    /// min FUSED-with-instrument / min FUSED): on a machine whose speed drifts, the least
    /// disturbed runs, as a cross-check of the medians.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub agreement_of_minimums: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub overhead_of_minimums: f64,
    /// Every run of every mode computed bit-identical logits.
    pub outputs_identical: bool,
    /// Where they did not: the largest NMSE of a differing run's logits against the first
    /// run's ([`ProfileRaw::outputs_compared`]); `None` where nothing was compared (and, read
    /// back, where a row was not finite: the check says so).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs_max_nmse: Option<f64>,
    /// The noise gate: runs kept, rejected and retaken, kept although still noisy.
    pub noise_gate: crate::noise::GateStats,
    pub nodes: u32,
    pub view_nodes: u32,
    pub bands: Vec<BandRow>,
    /// What the `other` band holds.
    pub other: Vec<NameRow>,
    /// Nodes no rule matched (coverage below 100 % lists them here).
    pub unassigned: Vec<NameRow>,
    pub audit: Vec<AuditFinding>,
    pub checks: Vec<Check>,
    /// A graph split across devices (RPC): every (device, band) by the same estimator, the
    /// transfers under their link in the `network` band. Empty on one device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<crate::split::DeviceBandRow>,
    /// The census of splits: each contiguous run of nodes on one device, its layers and the
    /// bytes copied into it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub splits: Vec<crate::split::DeviceRun>,
    /// A split profile: the FUSED wall of the same chunk on one process (every layer on this
    /// machine's CPU), measured right after the split runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_process_fused_ms: Option<Spread>,
    /// A split profile without the one-process comparison: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub one_process_skipped: Option<String>,
    /// A graph over several devices measured without the engine's calibration (a llama.cpp
    /// worker): what isolating a node costs on each device, µs a node a step (median over
    /// cycles), from that device's nodes that do no work; removed from every node on it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub isolation_device_us: BTreeMap<String, f64>,
    /// An imported trace with device activity: the device ledger beside the host's bands
    /// (`import.json`'s `device`, set by the view of the run); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<crate::device::DeviceStats>,
    /// A profile on a device whose own clock the engine reads: per band, the host's figures
    /// beside the device's, with their ratio (`crate::device_clock`); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_clock: Option<crate::device_clock::DeviceClockSummary>,
}

#[derive(Debug, thiserror::Error)]
pub enum SummaryError {
    #[error("the profile has no measured cycle")]
    NoCycles,
    #[error("cycle {cycle} timed {found} nodes, the graph has {expected}")]
    NodeCount {
        cycle: usize,
        found: usize,
        expected: usize,
    },
    #[error("{0} assignments for a graph of {1} nodes")]
    Assignments(usize, usize),
    #[error("a non-finite or empty measurement in {0}")]
    BadSample(String),
}

fn one() -> u32 {
    1
}

impl ProfileSummary {
    /// The worst status among the checks.
    pub fn worst(&self) -> CheckStatus {
        worst(&self.checks)
    }

    pub fn band(&self, name: &str) -> Option<&BandRow> {
        self.bands.iter().find(|b| b.band == name)
    }
}

/// Per-node medians over cycles (microseconds), in graph order.
pub fn node_medians_us(raw: &ProfileRaw) -> Vec<f64> {
    (0..raw.graph.len())
        .map(|i| {
            let col: Vec<f64> = raw
                .cycles
                .iter()
                .filter_map(|c| c.node_us.get(i).copied())
                .collect();
            crate::stats::median(&col).unwrap_or(0.0)
        })
        .collect()
}

#[cfg(test)]
mod tests;
