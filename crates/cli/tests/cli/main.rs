//! The integration tests of the `opledger` binary and its wiring, in one test binary so that
//! llama.cpp and candle are linked once: one module per command or concern.

#[path = "../../../report/tests/fixture/mod.rs"]
mod fixture;

/// The machine the tests share. A test whose assertions rest on timing (slopes across depth,
/// replay validations, the isolation cost against the bare graph compute) takes it alone; every other test shares it, so a timed measurement never
/// runs beside another engine's threads (two two-thread engines on two cores time the
/// scheduler, not the engine). The lock prefers a waiting writer: once a timing test waits, no
/// new test starts beside it.
mod machine {
    use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

    static MACHINE: RwLock<()> = RwLock::new(());

    pub fn alone() -> RwLockWriteGuard<'static, ()> {
        MACHINE.write().unwrap_or_else(|e| e.into_inner())
    }

    pub fn shared() -> RwLockReadGuard<'static, ()> {
        MACHINE.read().unwrap_or_else(|e| e.into_inner())
    }
}

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
