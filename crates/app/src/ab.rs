//! `ab` (two runtime configurations of llama.cpp compared interleaved, with a control,
//! ablations and a correctness gate) and `discover` (the fastest configuration of a grid of
//! knobs that still returns the same thing, confirmed and ablated).

use anyhow::Result;
use opledger_core::ab::{
    AbConfig, AbReport, Ablation, Candidate, DiscoverReport, Knobs, Outcome, ScenarioResult,
    Verdict, AB_SCHEMA_VERSION, DISCOVER_SCHEMA_VERSION,
};
use opledger_core::engine::{Capability, EngineInfo};
use opledger_core::manifest::Manifest;

use crate::bands::Bands;
use crate::engines::{open_engine, require, EngineKind, EngineSettings};
use crate::model::ModelFile;
use crate::ui::Ui;

/// A and B (each knobs over `settings`) on every scenario of `cfg`.
fn compare(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    a: &Knobs,
    b: &Knobs,
    cfg: &AbConfig,
    ui: &mut dyn Ui,
) -> Result<Vec<ScenarioResult>> {
    let open = |k: &Knobs| {
        open_engine(
            EngineKind::LlamaCpp,
            file,
            &EngineSettings {
                knobs: k.clone(),
                ..settings.clone()
            },
        )
    };
    let mut ea = open(a)?;
    let mut eb = open(b)?;
    for e in [ea.as_ref(), eb.as_ref()] {
        require(e, &[Capability::Logits])?;
        if cfg.scenarios.iter().any(|w| w.is_decode()) {
            require(e, &[Capability::Decode])?;
        }
    }
    Ok(opledger_core::ab::run_ab(
        ea.as_mut(),
        eb.as_mut(),
        cfg,
        &bands.rules,
        &file.arch,
        &mut |done, total, what| ui.progress(done as u64, total as u64, what),
    )?)
}

/// B against A on every scenario, then each knob B changes turned back alone (ablations).
pub fn ab_with_ablations(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    a: &Knobs,
    b: &Knobs,
    cfg: &AbConfig,
    ui: &mut dyn Ui,
) -> Result<AbReport> {
    let scenarios = compare(file, bands, settings, a, b, cfg, ui)?;
    // a gain is shared out only where the confirmation found one beyond the noise
    let ratio_b = scenarios
        .first()
        .filter(|s| s.verdict == Verdict::Faster)
        .map(|s| s.ratio)
        .unwrap_or(1.0);
    let mut ablations = Vec::new();
    let first = AbConfig {
        scenarios: cfg.scenarios.iter().take(1).cloned().collect(),
        ..cfg.clone()
    };
    for knob in b.differences(a) {
        let reverted = b.reverted(&knob, a);
        let r = compare(file, bands, settings, a, &reverted, &first, ui)?;
        let s = &r[0];
        ablations.push(Ablation {
            reverted: knob,
            knobs: reverted,
            ratio: s.ratio,
            ratio_lo: s.ratio_lo,
            ratio_hi: s.ratio_hi,
            verdict: s.verdict,
            correct: s.correctness.passed,
            share_of_gain: opledger_core::ab::share_of_gain(ratio_b, s.ratio),
        });
    }
    Ok(AbReport {
        schema_version: AB_SCHEMA_VERSION,
        a: a.clone(),
        b: b.clone(),
        config: cfg.clone(),
        verdict: Outcome::of(&scenarios),
        scenarios,
        ablations,
    })
}

/// Every candidate against the baseline on `search` (the first scenario, few pairs), fastest
/// first; then the fastest correct one that changes something, confirmed against the baseline
/// on `confirm` with ablations and a control.
pub fn discover(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    candidates: &[Knobs],
    search: &AbConfig,
    confirm: &AbConfig,
    ui: &mut dyn Ui,
) -> Result<DiscoverReport> {
    let baseline = Knobs::default();
    let mut found = Vec::new();
    for (i, c) in candidates.iter().enumerate() {
        ui.progress(i as u64, candidates.len() as u64, &c.to_string());
        let r = compare(
            file,
            bands,
            settings,
            &baseline,
            c,
            search,
            &mut crate::ui::Silent,
        )?;
        let s = &r[0];
        found.push(Candidate {
            knobs: c.clone(),
            ratio: s.ratio,
            ratio_lo: s.ratio_lo,
            ratio_hi: s.ratio_hi,
            correct: s.correctness.passed,
        });
    }
    found.sort_by(|x, y| x.ratio.total_cmp(&y.ratio));
    let chunk = search
        .scenarios
        .first()
        .map(|w| w.chunk_tokens)
        .unwrap_or(512);
    let defaults = settings.resolved_defaults(chunk);
    let winner = found
        .iter()
        .find(|c| c.correct && !c.knobs.without_defaults(&defaults).0.is_empty() && c.ratio < 1.0);
    let confirmation = match winner {
        // knobs the winner sets to their default are no change: confirmed and ablated
        // without them
        Some(w) => Some(ab_with_ablations(
            file,
            bands,
            settings,
            &baseline,
            &w.knobs.without_defaults(&defaults),
            confirm,
            ui,
        )?),
        None => None,
    };
    Ok(DiscoverReport {
        schema_version: DISCOVER_SCHEMA_VERSION,
        baseline,
        candidates: found,
        confirmation,
    })
}

/// The manifest of an `ab` or `discover` run (llama.cpp, configured per side by knobs). A side
/// run in a llama.cpp worker records the worker's path, BLAKE3 and llama.cpp build
/// (`a.worker`, `a.llama`, ...), next to the model's hash.
pub fn manifest(
    kind: &str,
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    sides: &[(&str, &Knobs)],
) -> Result<Manifest> {
    let mut recorded = std::collections::BTreeMap::new();
    for (side, knobs) in sides {
        let s = EngineSettings {
            knobs: (*knobs).clone(),
            ..settings.clone()
        };
        if let Some(w) = s.worker() {
            let env = crate::engines::knob_env(&s.knobs);
            let (hello, hash) = opledger_worker::identify(&w.path, w.timeout, &env)?;
            recorded.insert(format!("{side}.worker"), w.path.display().to_string());
            recorded.insert(format!("{side}.worker_blake3"), hash);
            recorded.insert(format!("{side}.llama"), hello.build_label());
            recorded.insert(
                format!("{side}.build_options"),
                hello.llama.build_options.clone(),
            );
            // the devices, the environment the side's worker saw and its backend switches
            for (k, v) in opledger_worker::engine::recorded_settings(&hello, &hello.llama.devices) {
                recorded.insert(format!("{side}.{k}"), v);
            }
        }
    }
    crate::manifest::manifest(
        kind,
        file,
        EngineInfo {
            engine: "llama.cpp".into(),
            version: llama_version(),
            backend: "CPU".into(),
            threads: settings.threads,
            settings: recorded,
        },
        &bands.rules,
    )
}

fn llama_version() -> String {
    #[cfg(feature = "llama")]
    {
        opledger_llama::LLAMA_CPP_SYS_VERSION.to_string()
    }
    #[cfg(not(feature = "llama"))]
    {
        String::new()
    }
}
