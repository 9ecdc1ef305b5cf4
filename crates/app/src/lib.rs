//! opledger's application layer, below the command line and above the engines, the analysis and
//! the renderers: each command's work as `run(request, engine(s), ui) -> typed result`; the
//! engine factory by capability (`engines`); the gate-by-type model file (`model`); the band
//! rules a run uses (`bands`); manifests (`manifest`); every stored run written and read in one
//! place (`runs`); and what a result means for the exit code (`outcome`). No argument parsing
//! and no printing here: the CLI turns arguments into requests and results into output.
#![forbid(unsafe_code)]

pub mod ab;
pub mod bands;
pub mod bisect;
pub mod builds;
pub mod engines;
pub mod graph;
pub mod import;
pub mod ledger;
pub mod manifest;
pub mod model;
pub mod ops;
pub mod outcome;
pub mod profile;
pub mod rpc;
pub mod runs;
pub mod sweep;
pub mod ui;
pub mod waste;
