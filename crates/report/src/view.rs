//! What a stored run holds, as the renderers see it: one view per kind of run (profile, sweep,
//! A/B, waste), derived by pure functions from the raw data the CLI read from the run folder.

use opledger_core::ab::AbReport;
use opledger_core::band::Assignment;
use opledger_core::census::{census, predicts_engine, Census};
use opledger_core::manifest::Manifest;
use opledger_core::node::NodeInfo;
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
        Ok(ProfileView {
            manifest,
            raw,
            assignments,
            summary,
            census,
        })
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

/// Any stored run. One exists at a time (never in collections), so the size difference between
/// the variants costs nothing worth a box.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant)]
pub enum RunView<'a> {
    Profile(ProfileView<'a>),
    Sweep(SweepView<'a>),
    Ab(AbView<'a>),
    Waste(WasteView<'a>),
}

impl RunView<'_> {
    pub fn manifest(&self) -> &Manifest {
        match self {
            RunView::Profile(v) => v.manifest,
            RunView::Sweep(v) => v.manifest,
            RunView::Ab(v) => v.manifest,
            RunView::Waste(v) => v.manifest,
        }
    }

    /// `profile`, `sweep`, `ab` or `waste`.
    pub fn kind(&self) -> &'static str {
        match self {
            RunView::Profile(_) => "profile",
            RunView::Sweep(_) => "sweep",
            RunView::Ab(_) => "ab",
            RunView::Waste(_) => "waste",
        }
    }
}
