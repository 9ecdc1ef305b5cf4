//! Pure renderers of stored results: each takes what a run folder holds and returns bytes; only
//! the CLI decides whether they go to a file or to stdout.

#![forbid(unsafe_code)]

pub mod ab;
pub mod census;
pub mod nodes;
pub mod profile;
pub mod sweep;
mod table;
pub mod waste;

pub use nodes::nodes_csv;
pub use profile::{bands_csv, profile_markdown, profile_text};
