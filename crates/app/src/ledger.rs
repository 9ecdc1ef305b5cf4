//! `ledger` (profile two engines on the same model and compare them, by share x wall and by
//! in-graph replay, with byte and FLOP math against this machine's measured peaks) and
//! `compare` (two stored profile runs side by side).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{bail, Context, Result};
use opledger_core::band::Categoriser;
use opledger_core::device::{Clock, DeviceStats};
use opledger_core::engine::{EngineError, EngineInfo, Work};
use opledger_core::ledger::{band_work, compare, gate, LedgerReport, Side};
use opledger_core::manifest::Manifest;
use opledger_core::peaks::Peaks;
use opledger_core::profile::{analyse, node_medians_us, ProfileConfig, ProfileRaw};
use opledger_core::replay::{measure_replay, ReplayConfig};

use crate::bands::Bands;
use crate::engines::{open_engine, EngineKind, EngineSettings};
use crate::model::ModelFile;
use crate::outcome::Exit;
use crate::runs::{read, StoredRun};
use crate::ui::Ui;

/// What to compare.
#[derive(Debug, Clone)]
pub struct LedgerRequest {
    /// The engine being optimised first, the reference second.
    pub engines: [EngineKind; 2],
    pub work: Work,
    /// Profile cycles (share x wall).
    pub cycles: u32,
    pub share: bool,
    /// In-graph replay with k extra dispatches per node, over this many cycles.
    pub replay: Option<ReplayConfig>,
}

/// A ledger run: its manifest, each side's raw profile, and the report.
pub struct LedgerRun {
    pub manifest: Manifest,
    pub raws: Vec<(String, ProfileRaw)>,
    pub report: LedgerReport,
}

/// Profiles both engines on `file` and compares them band by band.
pub fn run(
    file: &ModelFile,
    bands: &Bands,
    settings: &EngineSettings,
    req: &LedgerRequest,
    ui: &mut dyn Ui,
) -> Result<LedgerRun> {
    let rules = &bands.rules;
    let cfg = ProfileConfig {
        work: req.work.clone(),
        cycles: req.cycles,
        warmup: 1,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let mut sides = Vec::new();
    let mut replays = Vec::new();
    let mut raws = Vec::new();
    let mut notes = Vec::new();
    let mut peaks: Option<Peaks> = None;
    for kind in req.engines {
        let name = kind.name();
        // candle has no device path: with llama.cpp's layers offloaded, candle stays on the CPU
        // and the report says so
        let on_cpu;
        let s = if kind == EngineKind::Candle && settings.gpu_layers != 0 {
            let note = format!(
                "candle: on the CPU (it has no device path); --gpu-layers {} offloads llama.cpp's layers only",
                settings.gpu_layers
            );
            ui.note(&note);
            notes.push(note);
            on_cpu = EngineSettings {
                gpu_layers: 0,
                ..settings.clone()
            };
            &on_cpu
        } else {
            settings
        };
        let mut engine = open_engine(kind, file, s)?;
        let raw =
            opledger_core::profile::measure(engine.as_mut(), &cfg, &mut |phase, done, total| {
                ui.progress(done as u64, total as u64, &format!("{name}: {phase}"));
            })
            .with_context(|| format!("profiling on {name}"))?;
        let (assignments, summary) = analyse(&raw, rules, &file.arch)?;
        let info = engine.info();
        // both sides run this one file: its identity is the manifest's, set below
        let mut side = Side::from_summary(
            &format!("{} {}", info.engine, info.version),
            &file.arch.arch,
            &summary,
        )
        .with_cycles(&raw, &assignments, "", "");
        let routed = engine.routed_experts()?;
        if routed.is_none() && file.arch.is_moe() && kind == EngineKind::LlamaCpp {
            notes.push(format!(
                "{name}: expert bytes count every expert (routing unknown)"
            ));
        }
        side.work = band_work(
            &raw.graph,
            &assignments,
            &routed.unwrap_or_default(),
            &cfg.work,
        );
        let mut replay_result = None;
        if let Some(rc) = &req.replay {
            match engine.replayer() {
                Err(EngineError::Lacks { why, .. }) => {
                    let note = format!(
                        "{name}: no in-graph replay ({})",
                        why.as_deref().unwrap_or("the engine has none")
                    );
                    ui.note(&note);
                    notes.push(note);
                }
                Err(e) => return Err(e.into()),
                Ok(replayer) => {
                    replayer.prepare(&cfg.work)?;
                    let graph = replayer.graph()?;
                    let a = Categoriser::new(rules, &file.arch).categorise(&graph);
                    // the bands this engine's graph holds (a generic rule set names more)
                    let band_names = rules.bands_in(&a);
                    // what one replay of each band should cost: its time in one run of the
                    // profile, from which the replay plans what it can measure
                    let tokens = cfg.work.tokens_per_run() as f64;
                    let expected: BTreeMap<String, f64> = side
                        .ms_per_token
                        .iter()
                        .map(|(b, ms)| (b.clone(), ms * tokens))
                        .collect();
                    match measure_replay(
                        replayer,
                        &graph,
                        &a,
                        &band_names,
                        cfg.work.tokens_per_run(),
                        rc,
                        &expected,
                        &mut |done, total, what| {
                            ui.progress(done as u64, total as u64, &format!("{name}: {what}"))
                        },
                    ) {
                        Ok(mut r) => {
                            r.excluded_share = timed_share(&raw, &r.excluded_inplace);
                            side.replay_ms_per_token = r
                                .bands
                                .iter()
                                .map(|b| (b.band.clone(), b.ms_per_token))
                                .collect();
                            replay_result = Some(r);
                        }
                        Err(EngineError::Unsupported { what, why }) => {
                            let note = format!("{name}: no {what} ({why})");
                            ui.note(&note);
                            notes.push(note);
                        }
                        Err(e) => return Err(e).with_context(|| format!("replaying on {name}")),
                    }
                }
            }
        }
        // the peaks are this machine's CPU's: llama.cpp with layers offloaded would time its
        // GEMM on the device
        let devices = opledger_core::split::off_cpu_devices(&raw.graph);
        let offloaded = !devices.is_empty();
        if offloaded {
            let note = format!(
                "{name}: no matmul peak taken from it: its graph runs on {}, where its GEMM would run, not on this machine's CPU, whose peaks the verdicts use",
                devices.join(", ")
            );
            ui.note(&note);
            notes.push(note);
        }
        if peaks.is_none() && !offloaded {
            if let Some((gflops, shape)) = engine.gemm_peak()? {
                peaks = Some(Peaks {
                    copy_gb_per_s: opledger_core::peaks::copy_bandwidth_gb_per_s(
                        1 << 30,
                        settings.threads as usize,
                        3,
                    ),
                    gemm_gflop_per_s: Some(gflops),
                    gemm_shape: Some(format!("{shape} on {name}")),
                });
            }
        }
        raws.push((name.to_string(), raw));
        sides.push(side);
        replays.push(replay_result);
    }
    let b = sides.pop().expect("two sides");
    let a = sides.pop().expect("two sides");
    let ledger = compare(a, b, false, peaks.as_ref())?;
    let replay_b = replays.pop().flatten();
    let replay_a = replays.pop().flatten();
    let mut report = LedgerReport {
        ledger,
        replay_a,
        replay_b,
        peaks,
        notes,
        gate: None,
    };
    let manifest = crate::manifest::manifest(
        "ledger",
        file,
        EngineInfo {
            engine: format!("{} vs {}", req.engines[0].name(), req.engines[1].name()),
            version: String::new(),
            backend: "CPU".into(),
            threads: settings.threads,
            settings: Default::default(),
        },
        rules,
    )?;
    for side in [&mut report.ledger.a, &mut report.ledger.b] {
        side.model = manifest.model_label().to_string();
        side.model_blake3 = manifest.model.blake3.clone();
    }
    Ok(LedgerRun {
        manifest,
        raws,
        report,
    })
}

/// A replay side whose validations failed (outputs changed, replay-all or the sum of bands
/// outside its bound, k-scaling failed) is a failed check, as the other checks are.
pub fn exit(report: &LedgerReport) -> Exit {
    let mut failed = Vec::new();
    for (side, rr) in [("A", &report.replay_a), ("B", &report.replay_b)] {
        if let Some(rr) = rr.as_ref().filter(|rr| !rr.reliable) {
            for c in rr.checks.iter().filter(|c| !c.pass) {
                failed.push((format!("replay {side} {}", c.name), c.detail.clone()));
            }
        }
    }
    let checks = if failed.is_empty() {
        Exit::Ok
    } else {
        Exit::CheckFailed(failed)
    };
    checks.and(regressions(report))
}

/// The bands that failed the regression gate, where `compare --fail-above` ran it.
fn regressions(report: &LedgerReport) -> Exit {
    let failed: Vec<(String, String)> = report
        .gate
        .iter()
        .flat_map(|g| g.failed())
        .map(|r| {
            (
                r.band.clone(),
                format!(
                    "{}: {:.4} ms/token (cycles {:.4}-{:.4}) against the baseline's {:.4} ({:.4}-{:.4}), rank test p {:.4}",
                    r.change(), r.a_ms_per_token, r.a_range.0, r.a_range.1, r.b_ms_per_token, r.b_range.0, r.b_range.1, r.p_value
                ),
            )
        })
        .collect();
    if failed.is_empty() {
        Exit::Ok
    } else {
        Exit::Regressed(failed)
    }
}

/// The share of the TIMED node time (median over cycles) spent in the nodes `listed` as
/// `OP name` (matched by op and name: the profile's and the replay's graphs are built
/// separately).
fn timed_share(raw: &ProfileRaw, listed: &[String]) -> f64 {
    let wanted: std::collections::BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    let per_node = node_medians_us(raw);
    let total: f64 = per_node.iter().sum();
    let hit: f64 = raw
        .graph
        .iter()
        .zip(&per_node)
        .filter(|(n, _)| wanted.contains(format!("{} {}", n.op, n.name).as_str()))
        .map(|(_, v)| v)
        .sum();
    if total > 0.0 {
        hit / total
    } else {
        0.0
    }
}

/// One side of a `compare`: a stored profile run, what one of its records covers, and its
/// device ledger where it is an import with device activity.
fn side_of_run(dir: &Path) -> Result<(Side, String, Option<DeviceStats>)> {
    let (m, raw, device) = match read(dir)? {
        StoredRun::Profile {
            manifest,
            raw,
            device,
        } => (manifest, raw, device),
        other => bail!(
            "{}: a '{}' run; compare takes profile runs",
            dir.display(),
            other.kind()
        ),
    };
    let (assignments, summary) = analyse(&raw, &m.band_rules, &m.model.arch)?;
    let mut side = Side::from_summary(
        &format!(
            "{} {} · {}",
            m.engine.engine,
            m.engine.version,
            dir.display()
        ),
        &m.model.arch.arch,
        &summary,
    )
    .with_cycles(&raw, &assignments, m.model_label(), &m.model.blake3);
    side.work = band_work(&raw.graph, &assignments, &BTreeMap::new(), &raw.config.work);
    // a band whose nodes carry no shapes (the spans of an imported trace) has unknown bytes and
    // FLOPs, not zero
    side.work
        .retain(|_, w| w.weight_bytes + w.activation_bytes > 0 || w.flops > 0.0);
    // an imported trace says its agreement cannot be measured (node records measure it)
    if m.engine
        .settings
        .get("agreement")
        .is_some_and(|a| a.starts_with("not measurable"))
    {
        side.agreement = f64::NAN;
    }
    // an imported trace states its rules' granularity; a measured profile times graph nodes
    let granularity = m
        .engine
        .settings
        .get("granularity")
        .cloned()
        .unwrap_or_else(|| {
            format!(
                "one {} graph node per record, each timed alone (TIMED), scaled to the FUSED wall",
                m.engine.engine
            )
        });
    Ok((side, granularity, device))
}

/// The side on the device's clock: each band's time is the device time of the activity its
/// spans launched (median, range and per-step values over the steps), its coverage the share
/// of that time some rule matched. The host's wall, tokens and work stay.
fn on_device(mut side: Side, d: &DeviceStats) -> Side {
    let bands = d
        .bands_with_time()
        .filter(|b| b.device_ms_per_token.median.is_finite());
    side.ms_per_token = bands
        .clone()
        .map(|b| (b.band.clone(), b.device_ms_per_token.median))
        .collect();
    side.ms_per_token_range = bands
        .clone()
        .map(|b| {
            (
                b.band.clone(),
                (b.device_ms_per_token.min, b.device_ms_per_token.max),
            )
        })
        .collect();
    // per-step values where stored (runs imported before them kept only the spread)
    side.ms_per_token_cycles = bands
        .clone()
        .filter(|b| !b.device_ms_per_token_steps.is_empty())
        .map(|b| (b.band.clone(), b.device_ms_per_token_steps.clone()))
        .collect();
    let total = d.device_total_ms_per_token();
    let unassigned = side.ms_per_token.get("unassigned").copied().unwrap_or(0.0);
    side.coverage = if total > 0.0 {
        1.0 - unassigned / total
    } else {
        f64::NAN
    };
    side.replay_ms_per_token.clear();
    side
}

/// Two stored profile runs side by side; `force` compares runs that did not do the same work;
/// `fail_above` (a fraction) runs the regression gate with A as the new run, B the baseline.
/// `clock`: the bands' times on the host's clock or the device's (imports with device
/// activity); `None`: the device's where both runs have device time, else the host's.
pub fn compare_runs(
    a: &Path,
    b: &Path,
    force: bool,
    fail_above: Option<f64>,
    clock: Option<Clock>,
) -> Result<LedgerReport> {
    let (a_side, a_granularity, a_device) = side_of_run(a)?;
    let (b_side, b_granularity, b_device) = side_of_run(b)?;
    let any_device = a_device.is_some() || b_device.is_some();
    let clock = match clock {
        Some(c) => c,
        None if a_device.is_some() && b_device.is_some() => Clock::Device,
        None => Clock::Host,
    };
    let mut notes = Vec::new();
    let (a_side, b_side) = if clock == Clock::Device {
        let missing: Vec<String> = [(a, &a_device), (b, &b_device)]
            .iter()
            .filter(|(_, d)| d.is_none())
            .map(|(p, _)| p.display().to_string())
            .collect();
        if !missing.is_empty() {
            bail!(
                "--clock device: {} holds no device time (a measured profile, or an import of a trace without device activity); compare on the host's clock with --clock host",
                missing.join(" and ")
            );
        }
        let (ad, bd) = (a_device.as_ref().unwrap(), b_device.as_ref().unwrap());
        for (name, d) in [("A", ad), ("B", bd)] {
            notes.push(format!(
                "device {name}: {} activities on {} device(s), {} stream(s); busy {:.4} ms a step against {:.4} ms of activity; {} launched outside every step ({:.4} ms, in no band)",
                d.activities,
                d.devices,
                d.streams,
                d.busy_ms.median,
                d.activity_ms.median,
                d.outside_steps,
                d.outside_steps_ms
            ));
        }
        (on_device(a_side, ad), on_device(b_side, bd))
    } else {
        (a_side, b_side)
    };
    // stored runs carry no peaks (and may come from another machine): no roofline verdict
    let mut ledger = compare(a_side, b_side, force, None)?;
    ledger.clock = any_device.then_some(clock);
    notes.extend([
        format!("granularity A: {a_granularity}"),
        format!("granularity B: {b_granularity}"),
        "bytes count every expert of an expert matmul (routing not stored): an upper bound".into(),
        "no peaks are measured for stored runs: what limits a band is not judged (`opledger ledger` measures them)"
            .into(),
    ]);
    Ok(LedgerReport {
        gate: fail_above.map(|t| gate(&ledger, t)).transpose()?,
        ledger,
        replay_a: None,
        replay_b: None,
        peaks: None,
        notes,
    })
}
