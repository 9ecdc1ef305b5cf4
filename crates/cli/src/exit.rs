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
