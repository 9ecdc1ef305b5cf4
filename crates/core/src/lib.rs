//! opledger's core: the data model (node records, bands, profiles), the Engine trait, the
//! categoriser, statistics and run folders. No FFI; every part is tested without an engine.

#![forbid(unsafe_code)]

pub mod ab;
pub mod arch;
pub mod band;
pub mod bisect;
pub mod calibration;
pub mod census;
pub mod device;
pub mod device_clock;
pub mod engine;
pub mod import_rules;
pub mod isolation;
pub mod ledger;
pub mod manifest;
pub mod memory;
pub mod mock;
pub mod node;
pub mod noise;
pub mod opdiff;
pub mod ops;
pub mod outputs;
pub mod peaks;
pub mod profile;
pub mod rank;
pub mod records;
pub mod replay;
pub mod run_folder;
pub mod split;
pub mod stats;
pub mod sweep;
pub mod system;
pub mod tokens;
pub mod trace;
pub mod waste;
