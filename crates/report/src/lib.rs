//! Pure renderers of stored results: each takes what a run folder holds and returns bytes; only
//! the CLI decides whether they go to a file or to stdout. [`render::render`] is the one entry
//! point that maps a run and a format to bytes.

#![forbid(unsafe_code)]

pub mod ab;
pub mod bench;
pub mod bisect;
pub mod census;
pub mod device;
pub mod device_clock;
pub mod html;
pub mod ledger;
pub mod nodes;
pub mod opdiff;
pub mod ops;
pub mod palette;
pub mod perfetto;
pub mod profile;
pub mod render;
pub mod sql;
pub mod svg;
pub mod sweep;
mod table;
pub mod view;
pub mod waste;

pub use nodes::nodes_csv;
pub use profile::{bands_csv, profile_markdown, profile_text};
pub use render::{render, Format, RenderError, RenderOptions};
pub use view::{
    AbView, BisectView, DiscoverView, LedgerView, OpsView, ParallelView, ProfileView, RunView,
    SweepView, WasteView,
};
