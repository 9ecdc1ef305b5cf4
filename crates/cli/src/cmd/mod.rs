//! One file per subcommand: arguments, conversion to a configuration, wiring.

pub mod common;
pub mod engines;
pub mod graph;
pub mod profile;
pub mod report;
pub mod synth;
