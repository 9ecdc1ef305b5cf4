//! What a result means for the command's exit status (README.md, "Exit codes"), in one place:
//! a failed check, an A/B refused by the correctness gate or left inconclusive by its control,
//! and the errors that are failed checks rather than bad input.

use opledger_core::ab::Outcome as AbOutcome;
use opledger_core::profile::{Check, CheckStatus};

/// A check of the run failed (coverage, audit, outputs identical, outputs finite, a census
/// mismatch, a replay validation): the folder is written, its figures must not be trusted.
pub const CHECK_FAILED: u8 = 3;
/// Bad input or usage: an invalid flag value, an unreadable or malformed file, a refused
/// command; nothing was measured.
pub const BAD_INPUT: u8 = 2;
/// The correctness gate refused B: it changes the model's output beyond the tolerance.
pub const REFUSED: u8 = 4;
/// The A/A control moved (its whole interval beyond the threshold): the measurement is biased
/// by more than the smallest effect a verdict may claim, so no speed verdict stands.
pub const INCONCLUSIVE: u8 = 5;
/// `compare --fail-above`: a band of the new run is slower than the baseline beyond the
/// threshold and beyond the runs' noise (the rank test of their cycles).
pub const REGRESSED: u8 = 6;
/// A remote device (an RPC server) failed during the run: it closed the connection, answered
/// wrongly, or stopped answering for longer than `--rpc-timeout`. The run folder stays marked
/// incomplete.
pub const REMOTE_FAILED: u8 = 7;
/// The llama.cpp worker failed during the run: it died (a crash, a signal), did not answer
/// within `--worker-timeout`, wrote something that is not its protocol, or its graph changed
/// between runs. No run folder is presented as complete.
pub const WORKER_FAILED: u8 = 8;

/// How a finished command ends.
#[derive(Debug, Clone, PartialEq)]
pub enum Exit {
    /// Every check passed or only warned.
    Ok,
    /// These checks failed: (name, detail).
    CheckFailed(Vec<(String, String)>),
    /// The A/B's correctness gate refused B.
    Refused,
    /// The A/B's control moved.
    Inconclusive,
    /// `compare --fail-above`: these bands regressed: (band, detail).
    Regressed(Vec<(String, String)>),
    /// `bisect`: the ends do not differ beyond the noise (or their outputs differ), so there is
    /// nothing to bisect; exits [`REFUSED`] with why, in figures.
    NothingToBisect(String),
    /// `bisect`: a step stayed undecided after the most cycles allowed; the range it narrowed
    /// to is reported and it exits [`INCONCLUSIVE`].
    Undecided(String),
}

impl Exit {
    pub fn code(&self) -> u8 {
        match self {
            Exit::Ok => 0,
            Exit::CheckFailed(_) => CHECK_FAILED,
            Exit::Refused => REFUSED,
            Exit::Inconclusive => INCONCLUSIVE,
            Exit::Regressed(_) => REGRESSED,
            Exit::NothingToBisect(_) => REFUSED,
            Exit::Undecided(_) => INCONCLUSIVE,
        }
    }

    /// The lines to print on stderr: each failed check, or the A/B's verdict.
    pub fn lines(&self) -> Vec<String> {
        match self {
            Exit::Ok => Vec::new(),
            Exit::CheckFailed(c) => c
                .iter()
                .map(|(name, detail)| format!("check failed: {name}: {detail}"))
                .collect(),
            Exit::Refused => vec![format!("verdict: {}", AbOutcome::Refused.words())],
            Exit::Inconclusive => vec![format!("verdict: {}", AbOutcome::Inconclusive.words())],
            Exit::Regressed(r) => r
                .iter()
                .map(|(band, detail)| format!("regressed: {band}: {detail}"))
                .collect(),
            Exit::NothingToBisect(why) => vec![format!("bisect refused: {why}")],
            Exit::Undecided(why) => vec![format!("bisect undecided: {why}")],
        }
    }

    /// The worse of two: a failed check, then refused, then inconclusive, then regressed.
    pub fn and(self, other: Exit) -> Exit {
        match (self, other) {
            (Exit::CheckFailed(mut a), Exit::CheckFailed(b)) => {
                a.extend(b);
                Exit::CheckFailed(a)
            }
            (a @ Exit::CheckFailed(_), _) | (_, a @ Exit::CheckFailed(_)) => a,
            (Exit::Refused, _) | (_, Exit::Refused) => Exit::Refused,
            (a @ Exit::NothingToBisect(_), _) | (_, a @ Exit::NothingToBisect(_)) => a,
            (Exit::Inconclusive, _) | (_, Exit::Inconclusive) => Exit::Inconclusive,
            (a @ Exit::Undecided(_), _) | (_, a @ Exit::Undecided(_)) => a,
            (Exit::Regressed(mut a), Exit::Regressed(b)) => {
                a.extend(b);
                Exit::Regressed(a)
            }
            (a @ Exit::Regressed(_), _) | (_, a @ Exit::Regressed(_)) => a,
            _ => Exit::Ok,
        }
    }
}

/// A run's checks: failed when any failed.
pub fn of_checks(checks: &[Check]) -> Exit {
    let failed: Vec<(String, String)> = checks
        .iter()
        .filter(|c| c.status == CheckStatus::Fail)
        .map(|c| (c.name.clone(), c.detail.clone()))
        .collect();
    if failed.is_empty() {
        Exit::Ok
    } else {
        Exit::CheckFailed(failed)
    }
}

/// An A/B's overall verdict.
pub fn of_ab(verdict: AbOutcome) -> Exit {
    match verdict {
        AbOutcome::Refused => Exit::Refused,
        AbOutcome::Inconclusive => Exit::Inconclusive,
        _ => Exit::Ok,
    }
}

/// A bisect's result: its ends refused (nothing to bisect), a step undecided, else found.
pub fn of_bisect(r: &opledger_core::bisect::BisectReport) -> Exit {
    use opledger_core::bisect::{Decision, Found};
    match &r.found {
        Found::Refused { why } => Exit::NothingToBisect(why.clone()),
        Found::Range { why, .. } if r.steps.iter().any(|s| s.decision == Decision::Undecided) => {
            Exit::Undecided(why.clone())
        }
        _ => Exit::Ok,
    }
}

/// Whether a command's error is a failed check rather than bad input: a run whose logits were
/// NaN or infinite ("outputs finite") stops the measurement, and exits [`CHECK_FAILED`].
pub fn is_failed_check(e: &anyhow::Error) -> bool {
    use opledger_core::engine::EngineError;
    use opledger_core::sweep::SweepError;
    let non_finite = |e: &EngineError| matches!(e, EngineError::NonFiniteOutputs { .. });
    e.chain().any(|c| {
        c.downcast_ref::<EngineError>().is_some_and(non_finite)
            || matches!(c.downcast_ref::<SweepError>(), Some(SweepError::Engine(x)) if non_finite(x))
    })
}

/// Whether a command's error is the llama.cpp worker failing (see [`WORKER_FAILED`]): a fault
/// of the process, or a graph that changed between its runs.
pub fn is_worker_failure(e: &anyhow::Error) -> bool {
    use opledger_core::engine::EngineError;
    use opledger_core::sweep::SweepError;
    let worker = |e: &EngineError| matches!(e, EngineError::Worker(_));
    e.chain().any(|c| {
        c.downcast_ref::<EngineError>().is_some_and(worker)
            || matches!(c.downcast_ref::<SweepError>(), Some(SweepError::Engine(x)) if worker(x))
            || c.downcast_ref::<opledger_worker::WorkerError>()
                .is_some_and(|w| w.is_fault())
    })
}

/// Whether a command's error is a remote device failing mid-run (see [`REMOTE_FAILED`]): the
/// llama.cpp worker over RPC servers ended as a remote failure (PROTOCOL.md, "Faults").
pub fn is_remote_failure(e: &anyhow::Error) -> bool {
    use opledger_core::engine::EngineError;
    use opledger_core::sweep::SweepError;
    let remote = |e: &EngineError| matches!(e, EngineError::RemoteFailed(_));
    e.chain().any(|c| {
        c.downcast_ref::<EngineError>().is_some_and(remote)
            || matches!(c.downcast_ref::<SweepError>(), Some(SweepError::Engine(x)) if remote(x))
            || c.downcast_ref::<opledger_worker::WorkerError>()
                .is_some_and(|w| w.is_remote_failure())
    })
}

/// The exit code and the words of a command's error.
pub fn of_error(e: &anyhow::Error) -> (u8, String) {
    if is_remote_failure(e) {
        (REMOTE_FAILED, format!("error: {e:#}"))
    } else if is_worker_failure(e) {
        (WORKER_FAILED, format!("error: {e:#}"))
    } else if is_failed_check(e) {
        (CHECK_FAILED, format!("check failed: {e:#}"))
    } else {
        (BAD_INPUT, format!("error: {e:#}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_outcome_wins() {
        let failed = Exit::CheckFailed(vec![("coverage".into(), "99 %".into())]);
        assert_eq!(Exit::Ok.and(Exit::Inconclusive), Exit::Inconclusive);
        assert_eq!(Exit::Inconclusive.and(Exit::Refused), Exit::Refused);
        assert_eq!(Exit::Refused.and(failed.clone()), failed);
        assert_eq!(failed.code(), 3);
        assert_eq!(Exit::Refused.code(), 4);
        assert_eq!(Exit::Inconclusive.code(), 5);
        assert_eq!(failed.lines(), ["check failed: coverage: 99 %".to_string()]);
        let regressed = Exit::Regressed(vec![("moe".into(), "+9.0 %".into())]);
        assert_eq!(regressed.code(), 6);
        assert_eq!(Exit::Ok.and(regressed.clone()), regressed);
        assert_eq!(
            regressed.clone().and(Exit::Inconclusive),
            Exit::Inconclusive
        );
    }
}
