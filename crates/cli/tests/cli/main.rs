//! The integration tests of the `opledger` binary and its wiring, in one test binary so that
//! llama.cpp and candle are linked once: one module per command or concern.

#[path = "../../../report/tests/fixture/mod.rs"]
mod fixture;
#[path = "../shared/runs.rs"]
mod runs;

/// The machine the tests share. No test here asserts a timing statistic of a real engine (those
/// are `scripts/acceptance`'s claims); the one test that compares two timings is the RPC link's,
/// whose difference is a delay the test injects itself (milliseconds against the tiny model's
/// microseconds), and it takes the machine alone; every other test shares it. The lock prefers
/// a waiting writer: once that test waits, no new test starts beside it.
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

/// The synthetic model of `preset` written into `dir` (`<preset>.gguf`).
fn synth(dir: &std::path::Path, preset: &str) -> std::path::PathBuf {
    let model = dir.join(format!("{preset}.gguf"));
    opledger_gguf::synthesize(
        &opledger_gguf::SynthOptions::new(preset),
        &model,
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("writing {}: {e}", model.display()));
    model
}

/// llama.cpp opened as the commands open it (`--engine llama.cpp`): the worker cargo built
/// (`worker=bundled`) in its own process, with `settings`.
fn llama_cpp(
    model: &std::path::Path,
    settings: &opledger_app::engines::EngineSettings,
) -> Box<dyn opledger_core::engine::Engine> {
    let file = opledger_app::model::ModelFile::open(model).unwrap();
    opledger_app::engines::open_engine(opledger_app::engines::EngineKind::LlamaCpp, &file, settings)
        .unwrap_or_else(|e| panic!("opening llama.cpp on {}: {e:#}", model.display()))
}

/// `opledger report --format json RUN` succeeds and prints the stored `summary.json` byte for byte:
/// the run re-renders from what it stored.
fn assert_report_reproduces_summary(run: &std::path::Path) {
    let again = assert_cmd::Command::cargo_bin("opledger")
        .unwrap()
        .args(["report", "--format", "json"])
        .arg(run)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    assert!(
        again == std::fs::read(run.join("summary.json")).unwrap(),
        "report differs"
    );
}

/// A measured profile is sound: every node in a band, coverage 100 %, the audit clean, every run
/// computed the same logits, every check that does not judge the machine's timing passed, the
/// timing checks ran (agreement and overhead are always there), and every cycle timed every node.
/// The timing judgements (agreement within ±3 %, overhead within 1.01, no node corrected at 0,
/// cycles and noise) are the acceptance benchmark's claims on real engines (`scripts/acceptance`,
/// profile-tiny and profile-gemma3) and core::profile's tests on scripted timings: a CI machine
/// shared with other work must not assert that it was quiet (ARCHITECTURE.md, "Where a timing
/// claim is tested").
fn assert_profile_is_sound(
    raw: &opledger_core::profile::ProfileRaw,
    assignments: &[opledger_core::band::Assignment],
    summary: &opledger_core::profile::ProfileSummary,
) {
    let unassigned: Vec<&str> = raw
        .graph
        .iter()
        .zip(assignments)
        .filter(|(_, a)| a.band == opledger_core::band::UNASSIGNED)
        .map(|(n, _)| n.name.as_str())
        .collect();
    assert!(unassigned.is_empty(), "nodes in no band: {unassigned:?}");
    assert_eq!(summary.coverage, 1.0);
    assert!(summary.audit.is_empty(), "{:?}", summary.audit);
    assert!(
        summary.outputs_identical,
        "the runs of the profile computed different logits"
    );
    const TIMING: [&str; 5] = ["agreement", "overhead", "cycles", "noise", "corrected at 0"];
    for name in ["agreement", "overhead"] {
        assert!(
            summary.checks.iter().any(|c| c.name == name),
            "no {name} check: {:?}",
            summary.checks
        );
    }
    for c in &summary.checks {
        if !TIMING.contains(&c.name.as_str()) {
            assert_eq!(
                c.status,
                opledger_core::profile::CheckStatus::Pass,
                "{}: {}",
                c.name,
                c.detail
            );
        }
    }
    assert!(raw
        .cycles
        .iter()
        .all(|c| c.node_us.len() == raw.graph.len()));
}

mod ab;
mod bisect;
mod builds;
mod candle_engine;
mod census;
mod end_to_end;
mod finite;
mod flags;
mod gate;
mod import;
mod import_device;
mod ledger;
mod llama_profile;
#[path = "../shared/llama_trees.rs"]
mod llama_trees;
mod ops;
mod published;
mod report;
mod rpc;
mod soundness;
mod sweep;
mod two_builds;
mod vulkan;
mod waste;
mod worker;
mod worker_faults;
mod worker_ops;
mod worker_replay;
