//! How a long command reports progress and notes while it works, without knowing where they go
//! (a progress bar and stderr for the CLI, nothing for a test).

/// Progress and notes of a running command.
pub trait Ui {
    /// `done` of `total` steps, `what` running now.
    fn progress(&mut self, done: u64, total: u64, what: &str);
    /// A line worth telling the user before the result (a warning, what was not checked).
    fn note(&mut self, line: &str);
}

/// Progress and notes go nowhere.
pub struct Silent;

impl Ui for Silent {
    fn progress(&mut self, _: u64, _: u64, _: &str) {}
    fn note(&mut self, _: &str) {}
}
