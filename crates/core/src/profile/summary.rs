//! The pure summary of a stored profile: every ms/token figure by one estimator (a group's
//! share of each cycle's TIMED sum x that cycle's FUSED wall / tokens), the isolation cost and
//! what removing it leaves, the walls and their ratios; the checks are in `checks`.

use std::collections::BTreeMap;

use super::checks::{checks, Figures};
use super::{BandRow, NameRow, ProfileRaw, ProfileSummary, SummaryError, PROFILE_SCHEMA_VERSION};
use crate::band::{Assignment, AuditFinding, BandRules, UNASSIGNED};
use crate::engine::Mode;
use crate::stats::Sample;

fn sample(values: &[f64], what: &str) -> Result<Sample, SummaryError> {
    Sample::new(values).map_err(|_| SummaryError::BadSample(what.to_string()))
}

/// Summarises a profile. `assignments[i]` is the band of `raw.graph[i]`.
pub fn summarise(
    raw: &ProfileRaw,
    rules: &BandRules,
    assignments: &[Assignment],
    audit: Vec<AuditFinding>,
) -> Result<ProfileSummary, SummaryError> {
    validate(raw, assignments)?;
    let n = raw.graph.len();
    let tokens = raw.config.work.tokens_per_run();
    let tok = tokens.max(1) as f64;
    let isolation = isolation(raw)?;
    // every node's TIMED times must be finite (the per-cycle estimates below sum them)
    if raw
        .cycles
        .iter()
        .any(|c| c.node_us.iter().any(|v| !v.is_finite()))
    {
        return Err(SummaryError::BadSample("node times".to_string()));
    }
    let walls = walls(raw)?;
    let measured = Measured::of(raw, &isolation);
    let est = Estimator {
        raw: raw.cycles.iter().map(|c| c.node_us.as_slice()).collect(),
        corrected: isolation.corrected.iter().map(Vec::as_slice).collect(),
        fused_walls: raw.cycles.iter().map(|c| c.fused_ms).collect(),
        tok,
    };
    let (bands, points) = band_rows(raw, rules, assignments, &est, &isolation.clamped)?;
    let unassigned_ms = bands
        .iter()
        .find(|b| b.band == UNASSIGNED)
        .map_or(0.0, |b| b.ms_per_token);
    let coverage = if points > 0.0 {
        1.0 - unassigned_ms / points
    } else {
        0.0
    };
    let other = name_rows(raw, assignments, &est, "other")?;
    let unassigned = name_rows(raw, assignments, &est, UNASSIGNED)?;
    let (devices, splits, mut device_check) = split_figures(raw, assignments, &est);
    if let (Some(c), false) = (device_check.as_mut(), isolation.per_device.is_empty()) {
        let each: Vec<String> = isolation
            .per_device
            .iter()
            .map(|(d, us)| format!("{d} {us:.1} µs"))
            .collect();
        c.detail += &format!(
            "; isolating a node costs, from the nodes that do no work on each device, a node a step: {}",
            each.join(", ")
        );
    }
    let identical = raw
        .output_hashes
        .values()
        .flatten()
        .collect::<std::collections::BTreeSet<_>>()
        .len()
        <= 1;
    let mut checks = checks(
        raw,
        assignments,
        &Figures {
            audit: &audit,
            coverage,
            unassigned_ms,
            agreement: measured.agreement.then(|| walls.agreement.median()),
            overhead: measured.overhead.then(|| walls.overhead.median()),
            identical,
        },
    );
    checks.extend(clamp_check(&bands));
    checks.extend(device_check);
    let device_clock = device_clock(raw, assignments, &bands, tok);
    checks.extend(device_clock.as_ref().map(device_clock_check));
    if let Some(why) = &raw.one_process_skipped {
        checks.push(super::Check {
            name: "split outputs".into(),
            status: super::CheckStatus::Warn,
            detail: format!("logits not compared with one process: {why}"),
        });
    }
    if let Some(o) = &raw.one_process_outputs {
        checks.push(super::Check {
            name: "split outputs".into(),
            status: if o.passed {
                super::CheckStatus::Pass
            } else {
                super::CheckStatus::Fail
            },
            detail: format!(
                "logits against one process: max relative error {:.2e}, cosine {:.6}, same top-1 in {} of {} rows",
                o.max_rel_error, o.min_cosine, o.same_top1, o.rows
            ),
        });
    }

    Ok(ProfileSummary {
        schema_version: PROFILE_SCHEMA_VERSION,
        tokens,
        depth_tokens: raw.config.work.depth_tokens,
        logits: if raw.config.work.all_logits {
            "all"
        } else {
            "last"
        }
        .into(),
        cycles: raw.cycles.len() as u32,
        fused_ms: walls.fused.median(),
        fused_ms_spread: walls.fused.spread(),
        tok_per_s: tok / walls.fused.median() * 1e3,
        timed_sum_ms: walls.timed_sum.median(),
        timed_wall_ms: walls.timed_wall.median(),
        agreement: measured.figure(measured.agreement, walls.agreement.median()),
        agreement_spread: measured.spread(measured.agreement, walls.agreement.spread()),
        isolation_us: measured.figure(measured.isolation, isolation.cost.median()),
        isolation_us_per_step: measured.figure(
            measured.isolation,
            isolation.cost.median() / isolation.steps,
        ),
        node_steps: isolation.steps as u32,
        isolation_source: isolation.source.into(),
        isolation_idle_us: isolation.idle.median(),
        isolation_nodes: isolation.idle_nodes as u32,
        agreement_corrected: measured.figure(
            measured.agreement && measured.isolation,
            isolation.agreement_corrected.median(),
        ),
        isolation_remainder_us: isolation.remainder.median(),
        decode_tokens: raw.config.work.decode_tokens,
        parallel: raw.config.work.parallel,
        coverage,
        overhead: measured.figure(measured.overhead, walls.overhead.median()),
        overhead_spread: measured.spread(measured.overhead, walls.overhead.spread()),
        agreement_of_minimums: measured.figure(
            measured.agreement,
            walls.timed_sum.min() / walls.fused.min() - 1.0,
        ),
        overhead_of_minimums: measured.figure(
            measured.overhead,
            walls.observed_all.min() / walls.fused_all.min(),
        ),
        outputs_identical: identical,
        outputs_max_nmse: super::checks::outputs_max_nmse(raw),
        noise_gate: raw.gate,
        nodes: n as u32,
        view_nodes: raw.graph.iter().filter(|g| g.is_view).count() as u32,
        bands,
        other,
        unassigned,
        audit,
        checks,
        devices,
        splits,
        one_process_fused_ms: if raw.one_process_fused_ms.is_empty() {
            None
        } else {
            Some(sample(&raw.one_process_fused_ms, "one-process FUSED walls")?.spread())
        },
        one_process_skipped: raw.one_process_skipped.clone(),
        isolation_device_us: isolation.per_device.into_iter().collect(),
        device: None,
        device_clock,
    })
}

/// The device's clock beside the host's, when every cycle's TIMED run has one
/// (`crate::device_clock::summarise`).
fn device_clock(
    raw: &ProfileRaw,
    assignments: &[Assignment],
    bands: &[BandRow],
    tok: f64,
) -> Option<crate::device_clock::DeviceClockSummary> {
    use crate::device_clock::CycleClocks;
    let cycles: Option<Vec<CycleClocks<'_>>> = raw
        .cycles
        .iter()
        .map(|c| {
            c.device_timed.as_ref().map(|timed| CycleClocks {
                host_node_us: &c.node_us,
                timed,
                fused: c.device_fused.as_ref(),
            })
        })
        .collect();
    let cycles = cycles?;
    let band_ms: BTreeMap<String, f64> = bands
        .iter()
        .map(|b| (b.band.clone(), b.ms_per_token))
        .collect();
    let s = crate::device_clock::summarise(
        &raw.graph,
        assignments,
        &cycles,
        tok,
        &band_ms,
        crate::device_clock::VULKAN_SOURCE,
    )?;
    // a worker with the clock on whose graph never ran on a device: nothing to set beside
    (s.nodes_expected > 0).then_some(s)
}

/// Every node the device should have timed was timed in every cycle, or a warning naming
/// those it left untimed.
fn device_clock_check(d: &crate::device_clock::DeviceClockSummary) -> super::Check {
    let all = d.nodes_matched == d.nodes_expected;
    super::Check {
        name: "device clock".into(),
        status: if all {
            super::CheckStatus::Pass
        } else {
            super::CheckStatus::Warn
        },
        detail: if all {
            format!(
                "every one of the {} working nodes on the device timed on its own clock in every TIMED run",
                d.nodes_expected
            )
        } else {
            format!(
                "{} of {} working nodes on the device timed on its own clock in every TIMED run; not: {}",
                d.nodes_matched,
                d.nodes_expected,
                d.unmatched.join(", ")
            )
        },
    }
}

/// A warning where removing the isolation stopped working nodes at 0 (their TIMED time was
/// below what isolating them cost): those bands' corrected figures are lower bounds, and a band
/// that did work can show 0 (nothing when no node was stopped).
fn clamp_check(bands: &[BandRow]) -> Option<super::Check> {
    let hit: Vec<String> = bands
        .iter()
        .filter(|b| b.corrected_clamped_nodes > 0)
        .map(|b| {
            format!(
                "{} {} of {} working nodes{}",
                b.band,
                b.corrected_clamped_nodes,
                b.working_nodes,
                if b.ms_per_token_corrected <= 0.0 {
                    ", the whole band at 0"
                } else {
                    ""
                }
            )
        })
        .collect();
    if hit.is_empty() {
        return None;
    }
    Some(super::Check {
        name: "corrected at 0".into(),
        status: super::CheckStatus::Warn,
        detail: format!(
            "removing the isolation stopped working nodes at 0 in at least one cycle ({}): their \
             TIMED time was below what isolating them cost, so those bands' corrected figures \
             are lower bounds and understate work they did",
            hit.join("; ")
        ),
    })
}

/// A graph split across devices: the bands per device, the census of splits, and the check that
/// every node was attributed to a device (nothing for a graph on one device).
fn split_figures(
    raw: &ProfileRaw,
    assignments: &[Assignment],
    est: &Estimator<'_>,
) -> (
    Vec<crate::split::DeviceBandRow>,
    Vec<crate::split::DeviceRun>,
    Option<super::Check>,
) {
    let attributed = raw.graph.iter().filter(|n| n.device.is_some()).count();
    // a graph on one local device is that device's bands (an engine that names the device of
    // every node, on the CPU alone)
    let distinct: std::collections::BTreeSet<&str> = raw
        .graph
        .iter()
        .filter_map(|n| n.device.as_deref())
        .collect();
    if distinct.len() < 2 && !distinct.iter().any(|d| crate::split::is_remote(d)) {
        return (Vec::new(), Vec::new(), None);
    }
    let bands: Vec<String> = assignments.iter().map(|a| a.band.clone()).collect();
    let devices = crate::split::device_bands(
        &raw.graph,
        &bands,
        &est.raw,
        &est.corrected,
        &est.fused_walls,
        est.tok,
    );
    let splits = crate::split::device_runs(&raw.graph);
    let n = raw.graph.len();
    let cut = crate::split::cut_copies(&raw.graph);
    let mut detail = format!(
        "{attributed} of {n} nodes attributed to a device; {} device runs",
        splits.len()
    );
    if !cut.is_empty() {
        detail += &format!(
            "; {} copies between devices are not counted: ggml cut their names at {} characters \
             (e.g. {}), give --rpc numeric addresses to shorten the device names",
            cut.len(),
            crate::split::MAX_NAME_LEN,
            cut[0]
        );
    }
    let check = super::Check {
        name: "devices".into(),
        status: if attributed == n && cut.is_empty() {
            super::CheckStatus::Pass
        } else {
            super::CheckStatus::Fail
        },
        detail,
    };
    (devices, splits, Some(check))
}

/// What the stored runs measured. A figure of a run that never took place is not measured:
/// NaN in the summary (null in `summary.json`), "not measured" wherever it is shown, never a
/// ratio of a wall to itself.
struct Measured {
    /// A FUSED run apart from the TIMED one (an imported trace is one self-traced run).
    agreement: bool,
    /// A FUSED run with the instrument installed (node records and imports have none).
    overhead: bool,
    /// The engine's calibration, or nodes of the graph that do no work.
    isolation: bool,
}

impl Measured {
    fn of(raw: &ProfileRaw, isolation: &Isolation) -> Measured {
        // runs stored without their order ran every mode
        let ran = |m: Mode| {
            raw.cycles
                .iter()
                .all(|c| c.order.is_empty() || c.order.contains(&m))
        };
        Measured {
            agreement: ran(Mode::Fused) && ran(Mode::Timed),
            overhead: ran(Mode::FusedObserved),
            isolation: isolation.calibrated || isolation.idle_nodes > 0,
        }
    }

    fn figure(&self, measured: bool, value: f64) -> f64 {
        if measured {
            value
        } else {
            f64::NAN
        }
    }

    fn spread(&self, measured: bool, s: crate::stats::Spread) -> crate::stats::Spread {
        if measured {
            s
        } else {
            crate::stats::Spread {
                median: f64::NAN,
                min: f64::NAN,
                max: f64::NAN,
                n: 0,
            }
        }
    }
}

/// Refuses a profile without cycles, with assignments of another graph, or with a cycle that
/// timed another number of nodes than the graph holds.
fn validate(raw: &ProfileRaw, assignments: &[Assignment]) -> Result<(), SummaryError> {
    let n = raw.graph.len();
    if raw.cycles.is_empty() {
        return Err(SummaryError::NoCycles);
    }
    if assignments.len() != n {
        return Err(SummaryError::Assignments(assignments.len(), n));
    }
    for (cycle, c) in raw.cycles.iter().enumerate() {
        if c.node_us.len() != n {
            return Err(SummaryError::NodeCount {
                cycle,
                found: c.node_us.len(),
                expected: n,
            });
        }
    }
    Ok(())
}

/// The isolation cost per node per run and what removing it from every node leaves.
struct Isolation {
    /// Decode steps each node's time sums.
    steps: f64,
    /// Per cycle: the calibration where the engine has one, else the idle nodes' median.
    cost: Sample,
    /// Per cycle: the median time of the nodes that do no work.
    idle: Sample,
    idle_nodes: usize,
    /// Per cycle: the calibrated sum over the FUSED wall - 1.
    agreement_corrected: Sample,
    /// Per cycle: what the calibration left unexplained, µs per working node per step.
    remainder: Sample,
    /// Per cycle, every node's time with the isolation cost removed.
    corrected: Vec<Vec<f64>>,
    /// Per node: a working node stopped at 0 by the removal in at least one cycle.
    clamped: Vec<bool>,
    source: &'static str,
    /// The engine calibrated the cost in every cycle.
    calibrated: bool,
    /// A graph over several devices without the engine's calibration: each device's idle-node
    /// median per node and step (median over cycles), in graph order of the devices.
    per_device: Vec<(String, f64)>,
}

/// The isolation cost per node per run, per cycle: the engine's calibration where it has one
/// (times the steps a node's time sums), else the nodes of the graph that do no work; and every
/// node's time with it removed.
fn isolation(raw: &ProfileRaw) -> Result<Isolation, SummaryError> {
    let n = raw.graph.len();
    let steps = raw.node_steps() as f64;
    let idle: Vec<usize> = (0..n).filter(|&i| !raw.graph[i].is_working()).collect();
    let calibrated = raw.cycles.iter().all(|c| c.isolation_us.is_some());
    let mut isolation = Vec::with_capacity(raw.cycles.len());
    let mut isolation_idle = Vec::with_capacity(raw.cycles.len());
    let mut corrected: Vec<Vec<f64>> = Vec::with_capacity(raw.cycles.len());
    let mut calibrated_sums = Vec::with_capacity(raw.cycles.len());
    let mut remainders = Vec::with_capacity(raw.cycles.len());
    let mut clamped = vec![false; n];
    let working: Vec<bool> = raw.graph.iter().map(|g| g.is_working()).collect();
    let decode = raw.config.work.is_decode();
    // without the engine's calibration, a graph over several devices takes each device's own
    // idle nodes
    let on_device = (!calibrated)
        .then(|| crate::split::isolation_devices(&raw.graph))
        .flatten();
    let mut per_device_cycles: Vec<Vec<f64>> = Vec::new();
    for c in &raw.cycles {
        let idle_us: Vec<f64> = idle.iter().map(|&i| c.node_us[i]).collect();
        let idle_iso = crate::stats::median(&idle_us).unwrap_or(0.0);
        isolation_idle.push(idle_iso);
        let iso = match c.isolation_us {
            Some(per_step) if calibrated => per_step * steps,
            _ => idle_iso,
        };
        isolation.push(iso);
        let device_iso = on_device.as_ref().map(|d| {
            let per = d.idle_medians(&c.node_us, idle_iso);
            per_device_cycles.push(per.clone());
            d.each_node(&per)
        });
        // node by node where the engine calibrated each node (or each device's idle nodes
        // stand for it), else the average for every node; then the remainder the calibration
        // missed, equally from every working node
        let each = calibrated && c.isolation_node_us.len() == n;
        let removed = crate::isolation::remove_isolation(
            &c.node_us,
            &working,
            &|i| {
                if each {
                    c.isolation_node_us[i] * steps
                } else if let Some(d) = &device_iso {
                    d[i]
                } else {
                    iso
                }
            },
            // decode only: a chunk's nodes are large beside their isolation, and what sets
            // its TIMED sum apart from the wall (caches, barriers) grows with the work
            if decode { c.fused_ms * 1e3 } else { 0.0 },
        );
        calibrated_sums.push(removed.calibrated_sum_us);
        remainders.push(removed.remainder_us / steps);
        for (any, &c) in clamped.iter_mut().zip(&removed.clamped) {
            *any |= c;
        }
        corrected.push(removed.times_us);
    }
    let cost = sample(&isolation, "isolation cost")?;
    let idle_cost = sample(&isolation_idle, "isolation cost")?;
    let agreement_corrected = sample(
        &raw.cycles
            .iter()
            .zip(&calibrated_sums)
            .map(|(c, k)| k / 1e3 / c.fused_ms - 1.0)
            .collect::<Vec<_>>(),
        "corrected agreement",
    )?;
    let remainder = sample(&remainders, "isolation remainder")?;
    let source = if calibrated && raw.cycles.iter().all(|c| c.isolation_node_us.len() == n) {
        "calibration, node by node"
    } else if calibrated {
        "calibration"
    } else if on_device.is_some() {
        "idle nodes of each device"
    } else {
        "idle nodes"
    };
    let per_device = on_device
        .map(|d| {
            d.names
                .iter()
                .enumerate()
                .map(|(k, name)| {
                    let v: Vec<f64> = per_device_cycles.iter().map(|p| p[k] / steps).collect();
                    (name.clone(), crate::stats::median(&v).unwrap_or(0.0))
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Isolation {
        steps,
        cost,
        idle: idle_cost,
        idle_nodes: idle.len(),
        agreement_corrected,
        remainder,
        corrected,
        clamped,
        source,
        calibrated,
        per_device,
    })
}

/// The walls of the runs and their ratios, per cycle (and per extra overhead pair).
struct Walls {
    fused: Sample,
    timed_sum: Sample,
    timed_wall: Sample,
    /// sum TIMED / FUSED - 1.
    agreement: Sample,
    /// FUSED over the cycles and the extra overhead pairs.
    fused_all: Sample,
    /// FUSED-with-instrument over the cycles and the extra overhead pairs.
    observed_all: Sample,
    /// FUSED-with-instrument / FUSED over the cycles and the extra overhead pairs.
    overhead: Sample,
}

fn walls(raw: &ProfileRaw) -> Result<Walls, SummaryError> {
    let fused = sample(
        &raw.cycles.iter().map(|c| c.fused_ms).collect::<Vec<_>>(),
        "fused_ms",
    )?;
    let timed_sums: Vec<f64> = raw
        .cycles
        .iter()
        .map(|c| c.node_us.iter().sum::<f64>() / 1e3)
        .collect();
    let timed_sum = sample(&timed_sums, "timed sums")?;
    let timed_wall = sample(
        &raw.cycles
            .iter()
            .map(|c| c.timed_wall_ms)
            .collect::<Vec<_>>(),
        "timed_wall_ms",
    )?;
    let agreement = sample(
        &raw.cycles
            .iter()
            .zip(&timed_sums)
            .map(|(c, s)| s / c.fused_ms - 1.0)
            .collect::<Vec<_>>(),
        "agreement",
    )?;
    let fused_all = sample(
        &raw.cycles
            .iter()
            .map(|c| c.fused_ms)
            .chain(raw.overhead_pairs.iter().map(|(f, _)| *f))
            .collect::<Vec<_>>(),
        "fused_ms",
    )?;
    let observed_all = sample(
        &raw.cycles
            .iter()
            .map(|c| c.fused_observed_ms)
            .chain(raw.overhead_pairs.iter().map(|(_, o)| *o))
            .collect::<Vec<_>>(),
        "fused_observed_ms",
    )?;
    let overhead = sample(
        &raw.cycles
            .iter()
            .map(|c| c.fused_observed_ms / c.fused_ms)
            .chain(raw.overhead_pairs.iter().map(|(f, o)| o / f))
            .collect::<Vec<_>>(),
        "overhead",
    )?;
    Ok(Walls {
        fused,
        timed_sum,
        timed_wall,
        agreement,
        fused_all,
        observed_all,
        overhead,
    })
}

/// One estimator for every ms/token figure: its per-cycle values (the group's share of that
/// cycle's TIMED sum x that cycle's FUSED wall / tokens), the median of them the point and
/// their min..max the range, so the point always lies in its range. A share is a figure's
/// point over the sum of the points it is a share of.
struct Estimator<'a> {
    /// Per cycle, every node's TIMED time.
    raw: Vec<&'a [f64]>,
    /// Per cycle, every node's time with the isolation cost removed.
    corrected: Vec<&'a [f64]>,
    fused_walls: Vec<f64>,
    tok: f64,
}

/// Every band the graph holds, in rule-set order, then `unassigned` if anything fell through;
/// with the sum of their points.
fn band_rows(
    raw: &ProfileRaw,
    rules: &BandRules,
    assignments: &[Assignment],
    est: &Estimator<'_>,
    clamped: &[bool],
) -> Result<(Vec<BandRow>, f64), SummaryError> {
    let n = raw.graph.len();
    let mut band_order: Vec<String> = rules.bands_in(assignments);
    if assignments.iter().any(|a| a.band == UNASSIGNED) {
        band_order.push(UNASSIGNED.to_string());
    }
    struct Estimated {
        band: String,
        raw: Sample,
        corrected: Sample,
        timed: Sample,
    }
    let mut estimated = Vec::with_capacity(band_order.len());
    // each node's band by its place in `band_order`, and every band's per-cycle estimates from
    // one pass over the cycles: a pass per band (and a comparison of band names per node and
    // cycle) took most of the summary of a trace of thousands of steps
    let group: Vec<usize> = assignments
        .iter()
        .map(|a| {
            band_order
                .iter()
                .position(|b| *b == a.band)
                .expect("band_order holds every assigned band")
        })
        .collect();
    let groups = band_order.len();
    let raw_groups =
        per_cycle_group_ms_per_token(&est.raw, &est.fused_walls, est.tok, &group, groups);
    let corrected_groups =
        per_cycle_group_ms_per_token(&est.corrected, &est.fused_walls, est.tok, &group, groups);
    for (b, band) in band_order.iter().enumerate() {
        let timed: Vec<f64> = raw_groups.parts[b].iter().map(|p| p / 1e3).collect();
        estimated.push(Estimated {
            band: band.clone(),
            raw: sample(&raw_groups.ms_per_token[b], "band times")?,
            corrected: sample(&corrected_groups.ms_per_token[b], "band times")?,
            timed: sample(&timed, "band times")?,
        });
    }
    let points: f64 = estimated.iter().map(|e| e.raw.median()).sum();
    let points_corrected: f64 = estimated.iter().map(|e| e.corrected.median()).sum();
    let share = |x: f64, of: f64| if of > 0.0 { x / of } else { 0.0 };
    let mut bands = Vec::with_capacity(estimated.len());
    for (b, e) in estimated.iter().enumerate() {
        let member = |i: usize| group[i] == b;
        bands.push(BandRow {
            band: e.band.clone(),
            ms_per_token: e.raw.median(),
            ms_per_token_min: e.raw.min(),
            ms_per_token_max: e.raw.max(),
            share: share(e.raw.median(), points),
            nodes: (0..n).filter(|&i| member(i)).count() as u32,
            working_nodes: (0..n)
                .filter(|&i| member(i) && raw.graph[i].is_working())
                .count() as u32,
            timed_ms: e.timed.median(),
            ms_per_token_corrected: e.corrected.median(),
            share_corrected: share(e.corrected.median(), points_corrected),
            corrected_clamped_nodes: (0..n).filter(|&i| member(i) && clamped[i]).count() as u32,
        });
    }
    Ok((bands, points))
}

/// What `band` holds: its nodes grouped by name token, most time first.
fn name_rows(
    raw: &ProfileRaw,
    assignments: &[Assignment],
    est: &Estimator<'_>,
    band: &str,
) -> Result<Vec<NameRow>, SummaryError> {
    let n = raw.graph.len();
    let mut rows: BTreeMap<String, NameRow> = BTreeMap::new();
    for i in (0..n).filter(|&i| assignments[i].band == band) {
        let node = &raw.graph[i];
        let row = rows.entry(node.base_name().to_string()).or_insert(NameRow {
            name: node.base_name().to_string(),
            ops: Vec::new(),
            nodes: 0,
            ms_per_token: 0.0,
        });
        row.nodes += 1;
        if !row.ops.contains(&node.op) {
            row.ops.push(node.op.clone());
        }
    }
    let mut rows: Vec<NameRow> = rows.into_values().collect();
    // the same estimate as `per_cycle_ms_per_token` over each row's members, with every cycle's
    // sum taken once: an imported trace can hold thousands of names over thousands of steps,
    // where a pass over the whole graph per name and cycle took minutes
    let mut members: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for i in (0..n).filter(|&i| assignments[i].band == band) {
        members.entry(raw.graph[i].base_name()).or_default().push(i);
    }
    let sums: Vec<f64> = est.raw.iter().map(|t| t.iter().sum()).collect();
    for row in &mut rows {
        let nodes = &members[row.name.as_str()];
        let per_cycle: Vec<f64> = est
            .raw
            .iter()
            .zip(&sums)
            .zip(&est.fused_walls)
            .map(|((t, &sum), &fused)| {
                share_of_wall(nodes.iter().map(|&i| t[i]).sum(), sum, fused, est.tok)
            })
            .collect();
        row.ms_per_token = crate::stats::median(&per_cycle)
            .ok_or_else(|| SummaryError::BadSample("band times".to_string()))?;
    }
    rows.sort_by(|a, b| b.ms_per_token.total_cmp(&a.ms_per_token));
    Ok(rows)
}

/// The per-cycle ms/token of a part of the graph: in cycle c, its share of that cycle's TIMED
/// sum x that cycle's FUSED wall / `tokens`, where the part holds `weight(i)` of node i (1 for a
/// member, 0 for a node outside it; a fraction for the rows of a node nobody reads). The median
/// of these is a figure's point and their min..max its range (one estimator; see
/// [`summarise`]). `times[c][i]` is node i's time in cycle c (raw, or with the isolation cost
/// removed); a cycle whose sum is 0 gives 0.
pub fn per_cycle_ms_per_token(
    times: &[&[f64]],
    fused_ms: &[f64],
    tokens: f64,
    weight: &dyn Fn(usize) -> f64,
) -> Vec<f64> {
    times
        .iter()
        .zip(fused_ms)
        .map(|(t, &fused)| {
            let part = t.iter().enumerate().map(|(i, v)| v * weight(i)).sum();
            share_of_wall(part, t.iter().sum(), fused, tokens)
        })
        .collect()
}

/// What [`per_cycle_ms_per_token`] gives each group of a partition of the nodes, from one pass
/// over each cycle: `group[i]` is node i's group, below `groups`.
pub(super) struct GroupEstimates {
    /// Per group, per cycle: ms/token (the group's share of the cycle's TIMED sum x its FUSED
    /// wall / tokens).
    pub(super) ms_per_token: Vec<Vec<f64>>,
    /// Per group, per cycle: the sum of its nodes' times (µs).
    pub(super) parts: Vec<Vec<f64>>,
}

/// [`per_cycle_ms_per_token`] of every group of a partition at once (`group[i]`: node i's
/// group, below `groups`): the same sums in the same order, so the same figures, from one pass
/// over each cycle instead of one per group.
pub(super) fn per_cycle_group_ms_per_token(
    times: &[&[f64]],
    fused_ms: &[f64],
    tokens: f64,
    group: &[usize],
    groups: usize,
) -> GroupEstimates {
    let mut out = GroupEstimates {
        ms_per_token: vec![Vec::with_capacity(times.len()); groups],
        parts: vec![Vec::with_capacity(times.len()); groups],
    };
    let mut parts = vec![0.0; groups];
    for (t, &fused) in times.iter().zip(fused_ms) {
        parts.iter_mut().for_each(|p| *p = 0.0);
        for (v, &g) in t.iter().zip(group) {
            parts[g] += v;
        }
        let sum: f64 = t.iter().sum();
        for (g, &part) in parts.iter().enumerate() {
            out.parts[g].push(part);
            out.ms_per_token[g].push(share_of_wall(part, sum, fused, tokens));
        }
    }
    out
}

/// `part`'s share of a cycle's TIMED `sum` x that cycle's FUSED wall / `tokens`: ms/token (0
/// where the sum is 0).
fn share_of_wall(part: f64, sum: f64, fused_ms: f64, tokens: f64) -> f64 {
    if sum > 0.0 {
        part / sum * fused_ms / tokens
    } else {
        0.0
    }
}

/// 1 for a member, 0 otherwise: the weight of a group of nodes in [`per_cycle_ms_per_token`].
pub fn membership(member: impl Fn(usize) -> bool) -> impl Fn(usize) -> f64 {
    move |i| if member(i) { 1.0 } else { 0.0 }
}

/// Categorises the graph of a stored profile and summarises it: what `profile` does after
/// measuring and what `report` does from a run folder.
pub fn analyse(
    raw: &ProfileRaw,
    rules: &BandRules,
    arch: &crate::arch::ArchInfo,
) -> Result<(Vec<Assignment>, ProfileSummary), SummaryError> {
    let cat = crate::band::Categoriser::new(rules, arch);
    let assignments = cat.categorise(&raw.graph);
    let audit = cat.audit(&raw.graph, &assignments);
    let summary = summarise(raw, rules, &assignments, audit)?;
    Ok((assignments, summary))
}
