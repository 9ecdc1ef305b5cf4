//! What a stored run holds, as the renderers see it: one view per kind of run (profile, a set of
//! parallel-decode profiles, sweep, A/B, discover, waste, ledger, ops), derived by pure functions
//! from the raw data read from the run folder.

use opledger_core::ab::{AbReport, DiscoverReport};
use opledger_core::band::Assignment;
use opledger_core::census::{census, predicts_engine, Census};
use opledger_core::device::DeviceStats;
use opledger_core::ledger::LedgerReport;
use opledger_core::manifest::Manifest;
use opledger_core::node::NodeInfo;
use opledger_core::ops::OpsSummary;
use opledger_core::profile::{self, ProfileRaw, ProfileSummary, SummaryError};
use opledger_core::sweep::{
    summarise_sweep_with_decode, ChunkRecord, PassLog, SweepConfig, SweepError, SweepIndex,
    SweepSummary,
};
use opledger_core::waste::{self, NodeNeed, WasteError, WasteSummary};

/// A profile run: `manifest.json` and `raw.json`, categorised and summarised.
#[derive(Debug, Clone)]
pub struct ProfileView<'a> {
    pub manifest: &'a Manifest,
    pub raw: &'a ProfileRaw,
    /// The band of every node of `raw.graph`.
    pub assignments: Vec<Assignment>,
    pub summary: ProfileSummary,
    /// The graph counted and checked against the architecture.
    pub census: Census,
}

impl<'a> ProfileView<'a> {
    pub fn new(manifest: &'a Manifest, raw: &'a ProfileRaw) -> Result<Self, SummaryError> {
        let (assignments, mut summary) =
            profile::analyse(raw, &manifest.band_rules, &manifest.model.arch)?;
        let census = census(
            &raw.graph,
            &assignments,
            &manifest.model.arch,
            predicts_engine(&manifest.engine.engine),
        );
        summary.add_census_check(&census);
        if manifest.command == IMPORTED && manifest.engine.settings.contains_key("trace_blake3") {
            state_imported_checks(&mut summary);
        }
        Ok(ProfileView {
            manifest,
            raw,
            assignments,
            summary,
            census,
        })
    }

    /// The view with an imported trace's device ledger in its summary (`None`: no device
    /// activity, or a measured profile).
    /// Its `device coverage` check fails where device activity matched no rule (the figures
    /// of that activity are in the `unassigned` band), as the host's coverage check does.
    pub fn with_device(mut self, device: Option<DeviceStats>) -> Self {
        use opledger_core::profile::{Check, CheckStatus};
        if let Some(d) = &device {
            self.summary.checks.push(if d.unassigned.is_empty() {
                Check {
                    name: "device coverage".into(),
                    status: CheckStatus::Pass,
                    detail: format!(
                        "every one of the {} device activities took a band from its launch",
                        d.activities
                    ),
                }
            } else {
                Check {
                    name: "device coverage".into(),
                    status: CheckStatus::Fail,
                    detail: format!(
                        "{} kinds of device activity no rule matched: {}",
                        d.unassigned.len(),
                        d.unassigned
                            .iter()
                            .map(|(n, p, ms)| format!(
                                "'{n}' launched by '{p}' {ms:.4} ms per step"
                            ))
                            .collect::<Vec<_>>()
                            .join("; ")
                    ),
                }
            });
        }
        self.summary.device = device;
        self
    }
}

/// The manifest command of an imported run (`opledger import`); a Chrome trace's carries
/// `trace_blake3` in its engine settings.
pub const IMPORTED: &str = "import";

/// What a rendering says where a run did not record a figure (never a zero in its place).
pub const NOT_RECORDED: &str = "not recorded";

/// What a rendering says of the model's file, size, hash and layers for a run whose model was
/// not recorded: `not recorded (imported without --model)` for an import.
pub fn model_not_recorded(m: &Manifest) -> String {
    if m.command == IMPORTED {
        format!("{NOT_RECORDED} (imported without --model)")
    } else {
        NOT_RECORDED.to_string()
    }
}

/// `2 threads`; `threads not recorded` for an import whose records carry no thread count (node
/// records: the engine's threads are its own business), never `0 threads`.
pub fn threads_label(m: &Manifest) -> String {
    if m.engine.threads == 0 && m.command == IMPORTED {
        format!("threads {NOT_RECORDED}")
    } else {
        format!("{} threads", m.engine.threads)
    }
}

/// The run recorded its model file (a hash of it): every measuring command does, an import
/// only with `--model`.
pub fn model_recorded(m: &Manifest) -> bool {
    !m.model.blake3.is_empty()
}

/// How the checks of an imported run begin that could not be measured.
pub const NOT_MEASURABLE: &str = "not measurable for an imported trace";

/// A summary of an imported trace (its agreement check says so).
pub fn is_imported(s: &ProfileSummary) -> bool {
    s.checks
        .iter()
        .any(|c| c.name == "agreement" && c.detail.starts_with(NOT_MEASURABLE))
}

/// An imported trace is one run of an engine by itself: its agreement, overhead, outputs and
/// noise could not be measured, and its checks say so rather than show figures that would
/// mean something else (a self-time sum over several threads is not a TIMED sum).
fn state_imported_checks(summary: &mut ProfileSummary) {
    use opledger_core::profile::{Check, CheckStatus};
    let not = |name: &str, why: &str| Check {
        name: name.into(),
        status: CheckStatus::Warn,
        detail: format!("{NOT_MEASURABLE}: {why}"),
    };
    summary
        .checks
        .retain(|c| !matches!(c.name.as_str(), "finite" | "census"));
    for c in &mut summary.checks {
        *c = match c.name.as_str() {
            "agreement" => not(
                "agreement",
                "one self-traced run, no separate FUSED run to hold its sum against",
            ),
            "overhead" => not(
                "overhead",
                "the cost of the engine's own tracing is unknown",
            ),
            "outputs" => not(
                "outputs",
                "a trace carries no logits to check identical or finite",
            ),
            "noise" => not(
                "noise",
                "opledger did not run the engine, no noise gate was around it",
            ),
            _ => continue,
        };
    }
}

/// A depth sweep: its manifest, settings, graph and chunk records, summarised.
#[derive(Debug, Clone)]
pub struct SweepView<'a> {
    pub manifest: &'a Manifest,
    pub graph: &'a [NodeInfo],
    pub summary: SweepSummary,
}

impl<'a> SweepView<'a> {
    /// `decode_graph`: the graph of one decode step, where the sweep measured decode steps.
    pub fn new(
        manifest: &'a Manifest,
        cfg: &SweepConfig,
        graph: &'a [NodeInfo],
        decode_graph: Option<&[NodeInfo]>,
        records: &[ChunkRecord],
        passes: &[PassLog],
    ) -> Result<Self, SweepError> {
        let rules = &manifest.band_rules;
        let arch = &manifest.model.arch;
        let cat = opledger_core::band::Categoriser::new(rules, arch);
        let index = SweepIndex::new(graph, &cat.categorise(graph), rules, arch);
        let decode = decode_graph.map(|g| (g, SweepIndex::new(g, &cat.categorise(g), rules, arch)));
        let summary = summarise_sweep_with_decode(
            cfg,
            rules,
            graph,
            &index,
            decode.as_ref().map(|(g, i)| (*g, i)),
            records,
            passes,
        )?;
        Ok(SweepView {
            manifest,
            graph,
            summary,
        })
    }
}

/// An A/B run: its manifest and `ab.json`.
#[derive(Debug, Clone)]
pub struct AbView<'a> {
    pub manifest: &'a Manifest,
    pub report: &'a AbReport,
}

/// A waste run: `manifest.json` and `raw.json`, with the rows every node's readers need.
#[derive(Debug, Clone)]
pub struct WasteView<'a> {
    pub manifest: &'a Manifest,
    pub raw: &'a ProfileRaw,
    pub assignments: Vec<Assignment>,
    pub needs: Vec<NodeNeed>,
    pub summary: WasteSummary,
}

impl<'a> WasteView<'a> {
    /// `source_run`: the stored profile run the timings came from, if any.
    pub fn new(
        manifest: &'a Manifest,
        raw: &'a ProfileRaw,
        source_run: Option<String>,
    ) -> Result<Self, WasteError> {
        let (assignments, needs, mut summary) =
            waste::analyse(raw, &manifest.band_rules, &manifest.model.arch)?;
        summary.source_run = source_run;
        Ok(WasteView {
            manifest,
            raw,
            assignments,
            needs,
            summary,
        })
    }
}

/// `profile -n N --parallel 1,4,...`: one profile per sequence count, side by side (never
/// empty).
#[derive(Debug, Clone)]
pub struct ParallelView<'a> {
    pub members: Vec<ProfileView<'a>>,
}

impl ParallelView<'_> {
    pub fn summaries(&self) -> Vec<&ProfileSummary> {
        self.members.iter().map(|m| &m.summary).collect()
    }
}

/// A knob search: its candidates, the confirmation and the verdict.
#[derive(Debug, Clone)]
pub struct DiscoverView<'a> {
    pub manifest: &'a Manifest,
    pub report: &'a DiscoverReport,
}

/// Two engines compared band by band.
#[derive(Debug, Clone)]
pub struct LedgerView<'a> {
    pub manifest: &'a Manifest,
    pub report: &'a LedgerReport,
}

/// Every distinct op timed alone against the in-graph bands.
#[derive(Debug, Clone)]
pub struct OpsView<'a> {
    pub manifest: &'a Manifest,
    pub summary: &'a OpsSummary,
}

/// A bisect: `manifest.json` and `bisect.json`.
#[derive(Debug, Clone)]
pub struct BisectView<'a> {
    pub manifest: &'a Manifest,
    pub report: &'a opledger_core::bisect::BisectReport,
}

/// Any stored run. One exists at a time (never in collections), so the size difference between
/// the variants costs nothing worth a box.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum RunView<'a> {
    Profile(ProfileView<'a>),
    Sweep(SweepView<'a>),
    Ab(AbView<'a>),
    Waste(WasteView<'a>),
    Parallel(ParallelView<'a>),
    Discover(DiscoverView<'a>),
    Ledger(LedgerView<'a>),
    Ops(OpsView<'a>),
    Bisect(BisectView<'a>),
}

impl RunView<'_> {
    pub fn manifest(&self) -> &Manifest {
        match self {
            RunView::Profile(v) => v.manifest,
            RunView::Sweep(v) => v.manifest,
            RunView::Ab(v) => v.manifest,
            RunView::Waste(v) => v.manifest,
            RunView::Parallel(v) => v.members[0].manifest,
            RunView::Discover(v) => v.manifest,
            RunView::Ledger(v) => v.manifest,
            RunView::Ops(v) => v.manifest,
            RunView::Bisect(v) => v.manifest,
        }
    }

    /// The command that made the run (`parallel profile` for a set of profiles).
    pub fn kind(&self) -> &'static str {
        match self {
            RunView::Profile(_) => "profile",
            RunView::Sweep(_) => "sweep",
            RunView::Ab(_) => "ab",
            RunView::Waste(_) => "waste",
            RunView::Parallel(_) => "parallel profile",
            RunView::Discover(_) => "discover",
            RunView::Ledger(_) => "ledger",
            RunView::Ops(_) => "ops",
            RunView::Bisect(_) => "bisect",
        }
    }
}
