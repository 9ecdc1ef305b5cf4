//! One file per subcommand: arguments, conversion to a configuration, wiring.

pub mod ab;
pub mod bisect;
pub mod common;
pub mod flags;
pub mod graph;
pub mod import;
pub mod ledger;
pub mod ops;
pub mod profile;
pub mod report;
pub mod rpc_link;
pub mod rpc_server;
pub mod sweep;
pub mod synth;
pub mod waste;
