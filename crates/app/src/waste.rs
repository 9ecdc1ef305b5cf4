//! `waste`: the rows a graph computes that no output reads, and the time spent on them, from a
//! profile measured now or read from a stored run.

use std::path::Path;

use anyhow::{bail, Result};
use opledger_core::engine::Engine;
use opledger_core::manifest::Manifest;
use opledger_core::profile::{ProfileConfig, ProfileRaw};

use crate::bands::Bands;
use crate::model::ModelFile;
use crate::runs::{read, StoredRun};
use crate::ui::Ui;

/// The manifest and raw data of a stored profile (or waste) run, re-labelled as a waste run;
/// `bands` re-categorises it with a user's rules.
pub fn from_stored(
    dir: &Path,
    bands: Option<&Path>,
    ui: &mut dyn Ui,
) -> Result<(Manifest, ProfileRaw)> {
    let (mut m, raw) = match read(dir)? {
        StoredRun::Profile { manifest, raw, .. } | StoredRun::Waste { manifest, raw, .. } => {
            (manifest, raw)
        }
        other => bail!(
            "{}: a '{}' run; waste reads profile (or waste) runs",
            dir.display(),
            other.kind()
        ),
    };
    if let Some(p) = bands {
        let b = Bands::load(Some(p), &m.model.arch.arch)?;
        for w in b.unmatched(&raw.graph) {
            ui.note(&w);
        }
        m.band_rules = b.rules;
    }
    m.command = "waste".into();
    m.tool = format!("opledger {}", env!("CARGO_PKG_VERSION"));
    m.args = std::env::args().collect();
    m.created_utc = crate::manifest::now_utc();
    Ok((m, raw))
}

/// Profiles `cfg` on `engine` (as `profile` does) for a waste run.
pub fn measured(
    engine: &mut dyn Engine,
    file: &ModelFile,
    bands: &Bands,
    cfg: &ProfileConfig,
    ui: &mut dyn Ui,
) -> Result<(Manifest, ProfileRaw)> {
    let mut warnings = Vec::new();
    let raw = opledger_core::profile::measure_with(
        engine,
        cfg,
        &mut |phase, done, total| ui.progress(done as u64, total as u64, phase),
        &mut |graph| warnings = bands.unmatched(graph),
    )?;
    for w in &warnings {
        ui.note(w);
    }
    let m = crate::manifest::manifest("waste", file, engine.info(), &bands.rules)?;
    Ok((m, raw))
}
