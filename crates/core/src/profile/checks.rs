//! The checks of a profile summary: coverage, audit, the census, agreement, overhead, outputs
//! identical and finite, the noise gate, enough cycles.

use super::{
    Check, CheckStatus, ProfileRaw, ProfileSummary, AGREEMENT_GOAL, DEVICE_MODES_MAX_NMSE,
    OVERHEAD_GOAL,
};
use crate::band::{Assignment, AuditFinding, UNASSIGNED};
use crate::noise::{GateConfig, GateStats};

/// The worst status among `checks` (pass when there are none).
pub fn worst(checks: &[Check]) -> CheckStatus {
    if checks.iter().any(|c| c.status == CheckStatus::Fail) {
        CheckStatus::Fail
    } else if checks.iter().any(|c| c.status == CheckStatus::Warn) {
        CheckStatus::Warn
    } else {
        CheckStatus::Pass
    }
}

/// The noise gate as a check: runs rejected and retaken, runs kept although still noisy (a
/// warning), and how busy other processes were in the kept runs; a gate that was off measured
/// nothing and says so.
pub fn noise_check(gate: &GateStats, config: &GateConfig) -> Check {
    let max_others = config.max_others;
    if !config.enabled {
        return Check {
            name: "noise".into(),
            status: CheckStatus::Warn,
            detail: format!(
                "{NOT_MEASURED}: the noise gate was off (--no-noise-gate): no run was checked against other processes' use of the CPUs"
            ),
        };
    }
    Check {
        name: "noise".into(),
        status: if gate.kept_noisy == 0 {
            CheckStatus::Pass
        } else {
            CheckStatus::Warn
        },
        detail: format!(
            "{} runs rejected and retaken because other processes used the CPUs (threshold {:.0} % of one CPU for the busiest other process, and of the machine for all others); {} kept although still noisy; in kept runs the busiest other process used up to {:.0} % of one CPU, all others up to {:.1} % of the machine",
            gate.rejected,
            max_others * 100.0,
            gate.kept_noisy,
            gate.max_busiest_kept * 100.0,
            gate.max_others_kept * 100.0
        ) + &gate
            .canary_text()
            .map(|t| format!("; {t}"))
            .unwrap_or_default(),
    }
}

/// How the detail of a check begins whose figure the run did not measure.
pub const NOT_MEASURED: &str = "not measured";

/// The summary's figures the checks judge.
pub(super) struct Figures<'a> {
    pub audit: &'a [AuditFinding],
    /// The share of the TIMED time in a band, and the `unassigned` band's ms/token.
    pub coverage: f64,
    pub unassigned_ms: f64,
    /// Medians of sum TIMED / FUSED - 1 and of FUSED-with-instrument / FUSED (`None`: the
    /// runs they compare did not take place).
    pub agreement: Option<f64>,
    pub overhead: Option<f64>,
    /// Every run of every mode computed bit-identical logits.
    pub identical: bool,
}

/// The largest NMSE of a run's logits against the first run's, over the runs whose hash
/// differed (NaN where a row was not finite); `None` where none was compared.
pub(super) fn outputs_max_nmse(raw: &ProfileRaw) -> Option<f64> {
    let rows = raw.outputs_compared.iter().flat_map(|c| &c.rows);
    rows.map(|r| r.nmse).reduce(|a, b| {
        if a.is_nan() || b.is_nan() {
            f64::NAN
        } else {
            a.max(b)
        }
    })
}

/// The check "outputs": every run of every mode bit-identical, or, where the graph runs on a
/// device other than the CPU, every differing run's logits within [`DEVICE_MODES_MAX_NMSE`] of
/// the first run's, the bound and its reason stated.
fn outputs_check(raw: &ProfileRaw, identical: bool) -> Check {
    let check = |status, detail| Check {
        name: "outputs".into(),
        status,
        detail,
    };
    if raw.output_hashes.is_empty() {
        // node records and imported traces carry no outputs: nothing was compared
        return check(
            CheckStatus::Warn,
            format!("{NOT_MEASURED}: the run recorded no output hashes"),
        );
    }
    if identical {
        return check(
            CheckStatus::Pass,
            "every run of every mode returned bit-identical logits".into(),
        );
    }
    let modes: Vec<String> = raw
        .output_hashes
        .iter()
        .map(|(m, h)| format!("{m} {}", h.join("/")))
        .collect();
    // every distinct hash but the reference's compared
    let distinct: std::collections::BTreeSet<&String> =
        raw.output_hashes.values().flatten().collect();
    let Some(max) =
        outputs_max_nmse(raw).filter(|_| distinct.len() == raw.outputs_compared.len() + 1)
    else {
        return check(
            CheckStatus::Fail,
            format!(
                "runs returned different logits (hashes: {}); by how much was not measured: no logits were read (the engine does not expose its logits, or the run was stored without them)",
                modes.join(", ")
            ),
        );
    };
    let devices = crate::split::off_cpu_devices(&raw.graph);
    let pairs: Vec<String> = raw
        .outputs_compared
        .iter()
        .map(|c| {
            let worst = c.rows.iter().map(|r| r.nmse).fold(0.0, f64::max);
            let top1 = c.rows.iter().filter(|r| r.a_top == r.b_top).count();
            format!(
                "{} against {}: NMSE {worst:.2e}, top-1 the same on {top1} of {} rows",
                c.mode,
                c.against_mode,
                c.rows.len()
            )
        })
        .collect();
    if devices.is_empty() {
        return check(
            CheckStatus::Fail,
            format!(
                "runs returned different logits ({}) on the CPU alone, where no mode may change the arithmetic",
                pairs.join("; ")
            ),
        );
    }
    within_device_bound(&pairs.join("; "), max, &devices)
}

/// The check "outputs" of modes whose logits differed by at most `max_nmse` on `devices`
/// (other than the CPU): passing within [`DEVICE_MODES_MAX_NMSE`], the bound and its reason
/// stated after `what` differed.
pub fn within_device_bound(what: &str, max_nmse: f64, devices: &[&str]) -> Check {
    let within = max_nmse <= DEVICE_MODES_MAX_NMSE;
    Check {
        name: "outputs".into(),
        status: if within {
            CheckStatus::Pass
        } else {
            CheckStatus::Fail
        },
        detail: format!(
            "not bit-identical: {what}; bound NMSE {DEVICE_MODES_MAX_NMSE:.0e} (test-backend-ops' for MUL_MAT, a device kernel against the CPU's) because on {} the backend fuses neighbouring ops when it runs the graph whole and cannot when each node is its own submission (TIMED), and a fused kernel rounds differently{}",
            devices.join(", "),
            if within { "" } else { ": BEYOND the bound" }
        ),
    }
}

/// The checks of a summary, in the order they are shown (the census goes in later, after
/// coverage and audit: [`ProfileSummary::add_census_check`]).
pub(super) fn checks(raw: &ProfileRaw, assignments: &[Assignment], f: &Figures<'_>) -> Vec<Check> {
    let Figures {
        audit,
        coverage,
        unassigned_ms,
        identical,
        ..
    } = *f;
    let mut checks = vec![
        Check {
            name: "coverage".into(),
            status: if unassigned_ms == 0.0 && coverage >= 1.0 {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: format!(
                "{:.2} % of TIMED time is in a band ({} nodes unassigned)",
                coverage * 100.0,
                assignments.iter().filter(|a| a.band == UNASSIGNED).count()
            ),
        },
        Check {
            name: "audit".into(),
            status: if audit.is_empty() {
                CheckStatus::Pass
            } else {
                CheckStatus::Fail
            },
            detail: if audit.is_empty() {
                "every matmul sits in a band its layer kind allows".into()
            } else {
                format!("{} matmuls in a band their layer kind forbids", audit.len())
            },
        },
        match f.agreement {
            Some(a) => Check {
                name: "agreement".into(),
                status: if a.abs() <= AGREEMENT_GOAL {
                    CheckStatus::Pass
                } else {
                    CheckStatus::Warn
                },
                detail: format!(
                    "sum TIMED / FUSED - 1 = {:+.2} % (goal within ±{:.0} %)",
                    a * 100.0,
                    AGREEMENT_GOAL * 100.0
                ),
            },
            None => Check {
                name: "agreement".into(),
                status: CheckStatus::Warn,
                detail: format!(
                    "{NOT_MEASURED}: no FUSED run apart from the TIMED one to hold its sum against"
                ),
            },
        },
        match f.overhead {
            Some(o) => Check {
                name: "overhead".into(),
                status: if o <= OVERHEAD_GOAL {
                    CheckStatus::Pass
                } else {
                    CheckStatus::Warn
                },
                detail: format!(
                    "FUSED with instrument / without = {o:.4} (goal ≤ {OVERHEAD_GOAL})"
                ),
            },
            None => Check {
                name: "overhead".into(),
                status: CheckStatus::Warn,
                detail: format!(
                    "{NOT_MEASURED}: no FUSED run with the instrument installed to hold against the FUSED wall"
                ),
            },
        },
        outputs_check(raw, identical),
        Check {
            name: "finite".into(),
            status: if raw.outputs_checked_finite {
                CheckStatus::Pass
            } else {
                CheckStatus::Warn
            },
            detail: if raw.outputs_checked_finite {
                "every run of every mode returned finite logits (a NaN or infinite logit stops the measurement, exit 3)".into()
            } else {
                "not checked: the run was recorded before logits were checked for NaN and infinity"
                    .into()
            },
        },
    ];
    checks.push(noise_check(&raw.gate, &raw.config.gate));
    if raw.cycles.len() < 3 {
        checks.push(Check {
            name: "cycles".into(),
            status: CheckStatus::Warn,
            detail: format!(
                "{} cycle(s): medians of fewer than 3 are fragile",
                raw.cycles.len()
            ),
        });
    }
    checks
}

impl ProfileSummary {
    /// Adds the census check after coverage and audit.
    pub fn add_census_check(&mut self, c: &crate::census::Census) {
        let at = self.checks.len().min(2);
        self.checks.insert(at, census_check(c));
    }
}

/// The census of the graph against the architecture, as a check: a predicted count that does
/// not hold fails the run; rows nothing predicts are said to be so.
pub fn census_check(c: &crate::census::Census) -> Check {
    let bad = c.mismatches();
    let (predicted, _) = c.predicted();
    let unpredicted = c.expectations.len() - predicted;
    let not_predicted = if unpredicted > 0 {
        format!(
            "; {unpredicted} {} not predicted for {}",
            if unpredicted == 1 { "row" } else { "rows" },
            c.arch
        )
    } else {
        String::new()
    };
    Check {
        name: "census".into(),
        status: if bad.is_empty() {
            CheckStatus::Pass
        } else {
            CheckStatus::Fail
        },
        detail: if bad.is_empty() {
            format!(
                "the graph's {} working nodes hold the {predicted} op counts the architecture \
                 predicts{not_predicted}",
                c.total.working
            )
        } else {
            let items: Vec<String> = bad
                .iter()
                .map(|e| {
                    format!(
                        "{} in {}: expected {}, found {}",
                        e.op,
                        e.band,
                        e.expected.map(|x| x.to_string()).unwrap_or_default(),
                        e.found
                    )
                })
                .collect();
            format!(
                "{} of {predicted} predicted counts differ: {}{not_predicted}",
                bad.len(),
                items.join("; ")
            )
        },
    }
}
