//! The exit codes of every command (README.md, "Exit codes"), in one place.

/// A check of the run failed (coverage, audit, outputs identical, outputs finite, a census
/// mismatch, a replay validation): the folder is written, its figures must not be trusted.
pub const CHECK_FAILED: u8 = 3;
/// Bad input or usage: an invalid flag value, an unreadable or malformed file, a refused
/// command; nothing was measured.
pub const BAD_INPUT: u8 = 2;
/// The correctness gate refused B: it changes the model's output beyond the tolerance (`ab`,
/// `discover`'s confirmation, `report` of such an A/B).
pub const REFUSED: u8 = 4;
/// The A/A control moved: the noise exceeds the threshold, so no speed verdict stands (`ab`,
/// `discover`'s confirmation, `report` of such an A/B).
pub const INCONCLUSIVE: u8 = 5;

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

/// The exit code and the words of a command's error.
pub fn of_error(e: &anyhow::Error) -> (u8, String) {
    if is_failed_check(e) {
        (CHECK_FAILED, format!("check failed: {e:#}"))
    } else {
        (BAD_INPUT, format!("error: {e:#}"))
    }
}
