//! `profile`: the per-node profile of one chunk (or decode steps, for one or several sequence
//! counts) on one engine.

use anyhow::{Context, Result};
use opledger_core::engine::{Capability, Engine, Work};
use opledger_core::manifest::Manifest;
use opledger_core::noise::GateConfig;
use opledger_core::profile::{self, ProfileConfig, ProfileRaw, ProfileSummary};

use crate::bands::Bands;
use crate::model::ModelFile;
use crate::outcome::{of_checks, Exit};
use crate::ui::Ui;

/// What to profile.
#[derive(Debug, Clone)]
pub struct ProfileRequest {
    /// The work; with decode steps, `parallel` below sets its sequence counts.
    pub work: Work,
    /// Sequence counts of decode (one profile each); `[1]` for a prefill chunk.
    pub parallel: Vec<u32>,
    pub cycles: u32,
    pub warmup: u32,
    pub overhead_pairs: u32,
    pub gate: GateConfig,
}

/// One measured profile: its manifest, raw data and summary.
#[derive(Debug, Clone)]
pub struct Profiled {
    pub parallel: u32,
    pub manifest: Manifest,
    pub raw: ProfileRaw,
    pub summary: ProfileSummary,
}

/// Profiles `req` on `engine` (once per sequence count).
pub fn run(
    engine: &mut dyn Engine,
    file: &ModelFile,
    bands: &Bands,
    req: &ProfileRequest,
    ui: &mut dyn Ui,
) -> Result<Vec<Profiled>> {
    if req.work.is_decode() {
        engine.require(Capability::Decode)?;
    }
    let several = req.parallel.len() > 1;
    let mut out = Vec::with_capacity(req.parallel.len());
    for &p in &req.parallel {
        let cfg = ProfileConfig {
            work: Work {
                parallel: p,
                ..req.work.clone()
            },
            cycles: req.cycles,
            warmup: req.warmup,
            overhead_pairs: req.overhead_pairs,
            gate: req.gate,
        };
        let mut warnings = Vec::new();
        let raw = profile::measure_with(
            engine,
            &cfg,
            &mut |phase, done, total| {
                let what = if several {
                    format!("P={p} {phase}")
                } else {
                    phase.to_string()
                };
                ui.progress(done as u64, total as u64, &what);
            },
            &mut |graph| warnings = bands.unmatched(graph),
        )
        .with_context(|| format!("measuring (parallel {p})"))?;
        for w in &warnings {
            ui.note(w);
        }
        let manifest = crate::manifest::manifest("profile", file, engine.info(), &bands.rules)?;
        let summary = summarise(&manifest, &raw)?;
        out.push(Profiled {
            parallel: p,
            manifest,
            raw,
            summary,
        });
    }
    Ok(out)
}

/// The summary of a stored profile, with the checks its report adds (the census).
pub fn summarise(m: &Manifest, raw: &ProfileRaw) -> Result<ProfileSummary> {
    Ok(opledger_report::ProfileView::new(m, raw)?.summary)
}

/// How the profiles end: failed when a check of any failed.
pub fn exit(profiles: &[Profiled]) -> Exit {
    profiles
        .iter()
        .fold(Exit::Ok, |e, p| e.and(of_checks(&p.summary.checks)))
}
