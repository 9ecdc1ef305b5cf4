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

/// A split profile's comparison with one process: the same work on this machine's CPU alone
/// (every layer local, the RPC servers unused), `warmup` unmeasured then `cycles` FUSED runs;
/// their walls, and its logits against `split_logits` (the split engine's last run) under the
/// A/B correctness gate's tolerance. Refused before loading when the whole model would not fit
/// the memory available now.
pub fn one_process(
    file: &ModelFile,
    settings: &crate::engines::EngineSettings,
    work: &Work,
    cycles: u32,
    warmup: u32,
    split_logits: &[Vec<f32>],
    ui: &mut dyn Ui,
) -> Result<(Vec<f64>, opledger_core::ab::Correctness)> {
    use opledger_core::engine::Mode;
    let need = opledger_core::memory::estimate(
        &file.arch,
        file.gguf.file_size_bytes,
        (work.depth_tokens + work.chunk_tokens) as u64,
        work.chunk_tokens as u64,
        2,
        work.all_logits,
    );
    let available = opledger_core::system::SystemSnapshot::take()
        .mem_available_bytes
        .unwrap_or(u64::MAX);
    opledger_core::memory::check(need, available)
        .context("the whole model on this machine would not fit its memory")?;
    let local = crate::engines::EngineSettings {
        rpc: None,
        ..settings.clone()
    };
    let mut engine =
        crate::engines::open_engine(crate::engines::EngineKind::LlamaCpp, file, &local)
            .context("loading the model on one process for the comparison")?;
    engine.prepare(work)?;
    let total = (warmup + cycles) as u64;
    let mut walls = Vec::with_capacity(cycles as usize);
    for i in 0..warmup + cycles {
        ui.progress(i as u64, total, "one process FUSED");
        let t = engine.run(Mode::Fused)?;
        if i >= warmup {
            walls.push(t.wall_ms);
        }
    }
    ui.progress(total, total, "one process FUSED");
    let logits = engine.logits()?;
    let outputs = opledger_core::ab::compare_logits(
        split_logits,
        &logits,
        &opledger_core::ab::Tolerance::default(),
    );
    Ok((walls, outputs))
}
