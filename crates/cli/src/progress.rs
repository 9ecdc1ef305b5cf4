//! Progress bars on stderr (hidden when stderr is not a terminal or with --quiet).

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A bar for byte counts (file writing).
pub fn bytes_bar(total: u64, quiet: bool) -> ProgressBar {
    let bar = ProgressBar::new(total);
    if quiet {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}

/// A bar for steps of a measurement, whose phase shows as the message.
pub fn steps_bar(quiet: bool) -> ProgressBar {
    let bar = ProgressBar::new(1);
    if quiet {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>18} [{bar:30}] {pos}/{len} elapsed {elapsed} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    bar
}
