//! The integration tests of the `opledger` binary and its wiring, in one test binary so that
//! llama.cpp and candle are linked once: one module per command or concern.

#[path = "../../../report/tests/fixture/mod.rs"]
mod fixture;

mod ab;
mod candle_engine;
mod census;
mod end_to_end;
mod finite;
mod flags;
mod gate;
mod import;
mod ledger;
mod llama_profile;
mod ops;
mod published;
mod report;
mod soundness;
mod sweep;
mod waste;
