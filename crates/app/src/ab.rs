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

/// What the two engines that measured an A/B said of themselves (their `info()` after the
/// runs): the manifest records each side from its own engine, a worker side from the very
/// worker process that measured.
#[derive(Debug, Clone, PartialEq)]
pub struct Sides {
    pub a: EngineInfo,
    pub b: EngineInfo,
}

/// Whether an A/B runs a second process of A as its control (its bands and ledger judged over
/// every cycle) or takes A's own runs, where it ran second against where it ran first (a
/// ranking of candidates, an ablation: only the total's ratio is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Control {
    Process,
    Halves,
}

/// A and B (each knobs over `settings`) on every scenario of `cfg`, and what their engines
/// said of themselves.
#[allow(clippy::too_many_arguments)]
fn compare(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    a: &Knobs,
    b: &Knobs,
    cfg: &AbConfig,
    control: Control,
    ui: &mut dyn Ui,
) -> Result<(Vec<ScenarioResult>, Sides)> {
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
    // two builds that are one binary are refused before anything is measured
    crate::builds::check_two_builds(a, b, &ea.info(), &eb.info())?;
    // the control: a second process of A's build, loaded the same way
    let mut ec = match control {
        Control::Process => Some(open(a)?),
        Control::Halves => None,
    };
    for e in [Some(&ea), Some(&eb), ec.as_ref()].into_iter().flatten() {
        require(e.as_ref(), &[Capability::Logits])?;
        if cfg.outputs.is_some() {
            require(e.as_ref(), &[Capability::Outputs])?;
        }
        if cfg.scenarios.iter().any(|w| w.is_decode()) {
            require(e.as_ref(), &[Capability::Decode])?;
        }
    }
    let sides = opledger_core::ab::AbSides {
        a: ea.as_mut(),
        b: eb.as_mut(),
        control: ec
            .as_mut()
            .map(|e| e.as_mut() as &mut dyn opledger_core::engine::Engine),
    };
    let scenarios = opledger_core::ab::run_ab(
        sides,
        cfg,
        &bands.rules,
        &file.arch,
        &mut |done, total, what| ui.progress(done as u64, total as u64, what),
    )?;
    Ok((
        scenarios,
        Sides {
            a: ea.info(),
            b: eb.info(),
        },
    ))
}

/// B against A on every scenario, then each knob B changes turned back alone (ablations, when B
/// changes more than one knob); with what the engines that measured B against A said of
/// themselves.
pub fn ab_with_ablations(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    a: &Knobs,
    b: &Knobs,
    cfg: &AbConfig,
    ui: &mut dyn Ui,
) -> Result<(AbReport, Sides)> {
    let (scenarios, sides) = compare(file, bands, settings, a, b, cfg, Control::Process, ui)?;
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
    let changes = b.differences(a);
    // with one change, B without it is A: the control has measured that already
    let ablated = if changes.len() > 1 {
        changes
    } else {
        Vec::new()
    };
    for knob in ablated {
        let reverted = b.reverted(&knob, a);
        let (r, _) = compare(
            file,
            bands,
            settings,
            a,
            &reverted,
            &first,
            Control::Halves,
            ui,
        )?;
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
    Ok((
        AbReport {
            schema_version: AB_SCHEMA_VERSION,
            a: a.clone(),
            b: b.clone(),
            config: cfg.clone(),
            verdict: Outcome::of(&scenarios),
            scenarios,
            ablations,
        },
        sides,
    ))
}

/// Every candidate against the baseline on `search` (the first scenario, few pairs), fastest
/// first; then the fastest correct one that changes something, confirmed against the baseline
/// on `confirm` with ablations and a control. With what the engines said of themselves: the
/// confirmation's baseline (`a`) and winner (`b`), or without a confirmation the first
/// search's baseline (`a`).
pub fn discover(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    candidates: &[Knobs],
    search: &AbConfig,
    confirm: &AbConfig,
    ui: &mut dyn Ui,
) -> Result<(DiscoverReport, Vec<(&'static str, EngineInfo)>)> {
    let baseline = Knobs::default();
    let mut found = Vec::new();
    let mut searched_baseline = None;
    for (i, c) in candidates.iter().enumerate() {
        ui.progress(i as u64, candidates.len() as u64, &c.to_string());
        let (r, sides) = compare(
            file,
            bands,
            settings,
            &baseline,
            c,
            search,
            Control::Halves,
            &mut crate::ui::Silent,
        )?;
        searched_baseline.get_or_insert(sides.a);
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
    let (confirmation, sides) = match winner {
        // knobs the winner sets to their default are no change: confirmed and ablated
        // without them
        Some(w) => {
            let (r, sides) = ab_with_ablations(
                file,
                bands,
                settings,
                &baseline,
                &w.knobs.without_defaults(&defaults),
                confirm,
                ui,
            )?;
            (Some(r), vec![("a", sides.a), ("b", sides.b)])
        }
        None => (
            None,
            searched_baseline.map(|a| ("a", a)).into_iter().collect(),
        ),
    };
    Ok((
        DiscoverReport {
            schema_version: DISCOVER_SCHEMA_VERSION,
            baseline,
            candidates: found,
            confirmation,
        },
        sides,
    ))
}

/// The manifest of an `ab` or `discover` run, each side (`sides`: `a`, `b`) recorded from the
/// engine that measured it ([`Sides`]), next to the model's hash: see [`sides_record`].
pub fn manifest(
    kind: &str,
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    sides: &[(&str, &EngineInfo)],
) -> Result<Manifest> {
    crate::manifest::manifest(kind, file, sides_record(settings, sides), &bands.rules)
}

/// The engine record of an A/B's manifest from its sides' own words (each side's `info()`):
/// under the side's name its engine, version (its worker's llama.cpp build, or another
/// engine's own version), backend, threads and every setting it recorded
/// (`a.backends`, `a.devices`, a worker's `a.worker`, `a.worker_blake3`, `a.worker_env`,
/// `a.cuda_graphs`, ...). The top-level engine, version and backend are the sides' common
/// value where they agree, else each side's (`a: CPU; b: CUDA0`); the threads are the common
/// value, else the command's `-t` (each side's own under its name).
pub fn sides_record(settings: &EngineSettings, sides: &[(&str, &EngineInfo)]) -> EngineInfo {
    let mut recorded = std::collections::BTreeMap::new();
    for (side, info) in sides {
        recorded.insert(format!("{side}.engine"), info.engine.clone());
        recorded.insert(format!("{side}.version"), info.version.clone());
        recorded.insert(format!("{side}.backend"), info.backend.clone());
        recorded.insert(format!("{side}.threads"), info.threads.to_string());
        for (k, v) in &info.settings {
            recorded.insert(format!("{side}.{k}"), v.clone());
        }
    }
    let said = |field: fn(&EngineInfo) -> &str| -> String {
        match sides.first() {
            None => "unknown (no engine ran)".into(),
            Some((_, first)) if sides.iter().all(|(_, i)| field(i) == field(first)) => {
                field(first).to_string()
            }
            Some(_) => sides
                .iter()
                .map(|(side, i)| format!("{side}: {}", field(i)))
                .collect::<Vec<_>>()
                .join("; "),
        }
    };
    let threads = match sides.first() {
        Some((_, first)) if sides.iter().all(|(_, i)| i.threads == first.threads) => first.threads,
        _ => settings.threads,
    };
    EngineInfo {
        engine: said(|i| &i.engine),
        version: said(|i| &i.version),
        backend: said(|i| &i.backend),
        threads,
        settings: recorded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_worker::protocol::{Device, Hello, LlamaBuild, Loaded};

    fn device(name: &str, description: &str, kind: &str, total_gib: u64) -> Device {
        Device {
            name: name.into(),
            description: description.into(),
            kind: kind.into(),
            memory_total: total_gib << 30,
            memory_free: (total_gib - 1) << 30,
        }
    }

    /// A worker side as the engine that measured it says it, from a hand-written hello: a
    /// CUDA build of llama.cpp with one GPU, every layer offloaded, CUDA graphs asked off.
    fn cuda_worker_side() -> EngineInfo {
        let hello = Hello {
            protocol: opledger_worker::protocol::PROTOCOL_NAME.into(),
            version: opledger_worker::PROTOCOL_VERSION as u64,
            llama: LlamaBuild {
                commit: "0123abc".into(),
                build: "b7001".into(),
                ggml_version: "0.9.4".into(),
                build_options: "GGML_CUDA=ON".into(),
                backends: vec!["CUDA".into(), "CPU".into()],
                devices: vec![
                    device("CUDA0", "NVIDIA H100 80GB HBM3", "gpu", 80),
                    device("CPU", "AMD EPYC 9454", "cpu", 128),
                ],
                env: [("GGML_CUDA_DISABLE_GRAPHS".to_string(), "1".to_string())].into(),
                ..LlamaBuild::default()
            },
        };
        let loaded = Loaded {
            n_vocab: 32,
            n_layer: 2,
            description: "tiny".into(),
            load_ms: 1.0,
            devices: Vec::new(),
        };
        let cfg = opledger_worker::WorkerConfig {
            worker: "/opt/llama/opledger-llama-worker".into(),
            model: "tiny.gguf".into(),
            threads: 8,
            flash_attn: "auto".into(),
            gpu_layers: 99,
            no_repack: false,
            ubatch: None,
            type_k: None,
            type_v: None,
            timeout: crate::engines::DEFAULT_WORKER_TIMEOUT,
            verbose: false,
            env: hello.llama.env.clone(),
            rpc: None,
        };
        opledger_worker::engine::worker_info(&cfg, &hello, &loaded, "b3hash", None)
    }

    /// A CPU side that names no worker, in its own words (an engine that records only its
    /// version, backend and devices).
    fn cpu_side() -> EngineInfo {
        EngineInfo {
            engine: "llama.cpp".into(),
            version: "llama-cpp-sys-2 0.1.161 (ggml 0.9.4)".into(),
            backend: "CPU".into(),
            threads: 4,
            settings: [
                ("backends".to_string(), "CPU,RPC".to_string()),
                (
                    "devices".to_string(),
                    "CPU (AMD EPYC 9454, cpu, 128.0 GiB, 127.0 GiB free)".to_string(),
                ),
            ]
            .into(),
        }
    }

    #[test]
    fn each_side_of_an_ab_manifest_is_what_its_own_engine_said() {
        // -t 2: neither side's threads (A 4, B 8)
        let settings = EngineSettings::new(2);
        let (a, b) = (cpu_side(), cuda_worker_side());
        let r = sides_record(&settings, &[("a", &a), ("b", &b)]);
        let s = &r.settings;
        // B is the GPU worker: its backend and devices, not the CPU
        assert_eq!(s["b.backend"], "CUDA0");
        assert_eq!(s["b.backends"], "CUDA,CPU");
        assert!(s["b.devices"].starts_with("CUDA0 (NVIDIA H100 80GB HBM3, gpu, 80.0 GiB"));
        assert_eq!(
            s["b.version"],
            "worker: llama.cpp b7001 (0123abc), ggml 0.9.4"
        );
        assert_eq!(s["b.worker_env"], "GGML_CUDA_DISABLE_GRAPHS=1");
        assert!(
            s["b.cuda_graphs"].starts_with("unknown"),
            "{}",
            s["b.cuda_graphs"]
        );
        assert_eq!(s["b.threads"], "8");
        // A is the CPU side: its own version, backend and devices
        assert_eq!(s["a.backend"], "CPU");
        assert_eq!(s["a.version"], "llama-cpp-sys-2 0.1.161 (ggml 0.9.4)");
        assert_eq!(s["a.devices"], a.settings["devices"]);
        assert!(!s.contains_key("a.worker"));
        // the top level claims nothing one side did not say: each side's where they differ
        assert_eq!(r.backend, "a: CPU; b: CUDA0");
        assert_eq!(
            r.version,
            "a: llama-cpp-sys-2 0.1.161 (ggml 0.9.4); b: worker: llama.cpp b7001 (0123abc), ggml 0.9.4"
        );
        assert_eq!(r.engine, "llama.cpp");
        // threads differ (4 and 8): the command's -t at the top, each side's under its name
        assert_eq!(r.threads, 2);

        // both sides the same worker: the common value
        let r = sides_record(&settings, &[("a", &b), ("b", &b)]);
        assert_eq!(r.backend, "CUDA0");
        assert_eq!(r.version, b.version);
        assert_eq!(r.threads, 8);
        // no side ran: nothing claimed
        let r = sides_record(&settings, &[]);
        assert!(r.backend.starts_with("unknown") && r.version.starts_with("unknown"));
        assert!(r.settings.is_empty());
    }
}
