//! The `opledger` binary driven end to end: synth, profile into a write-once run folder, report
//! re-renders the same bytes, bad input gets a clear error.

use assert_cmd::Command;
use predicates::prelude::*;

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

#[test]
fn profile_writes_a_complete_run_folder_once() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen35moe", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    let run = dir.path().join("run");
    let out = opledger()
        .args([
            "profile", "-p", "64", "-r", "2", "--warmup", "0", "-t", "2", "--json", "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&run)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let summary: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(summary["coverage"], 1.0);
    assert_eq!(summary["tokens"], 64);
    assert!(summary["fused_ms"].as_f64().unwrap() > 0.0);
    let bands: Vec<&str> = summary["bands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["band"].as_str().unwrap())
        .collect();
    assert_eq!(
        bands,
        [
            "attention",
            "linear_attention",
            "projections",
            "moe",
            "other"
        ]
    );
    for f in [
        "manifest.json",
        "raw.json",
        "summary.json",
        "table.txt",
        "summary.md",
        "bands.csv",
        "nodes.csv",
    ] {
        assert!(run.join(f).is_file(), "{f} missing");
    }
    assert!(!run.join("INCOMPLETE").exists());

    // report re-renders the stored summary byte for byte
    let again = opledger()
        .args(["report", "--format", "json"])
        .arg(&run)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let stored = std::fs::read_to_string(run.join("summary.json")).unwrap();
    let again = String::from_utf8(again).unwrap();
    let differing = stored
        .lines()
        .zip(again.lines())
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        stored == again,
        "report differs from the stored summary on {differing} lines"
    );

    // run folders are write-once
    opledger()
        .args(["profile", "-p", "64", "-r", "1", "-m"])
        .arg(&model)
        .arg("-o")
        .arg(&run)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("already exists"));
}

#[test]
fn a_file_that_is_not_gguf_is_refused_before_llama_cpp_sees_it() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.gguf");
    std::fs::write(&bad, b"definitely not a model file").unwrap();
    opledger()
        .args(["profile", "-m"])
        .arg(&bad)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("bad.gguf").and(predicate::str::contains("not a GGUF file")),
        );
    let truncated = dir.path().join("truncated.gguf");
    let model = dir.path().join("tiny.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-llama", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    opledger()
        .args(["graph", "-m"])
        .arg(&truncated)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("truncated.gguf"));
}

#[test]
fn synth_refuses_to_overwrite_and_lists_presets() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("m.gguf");
    std::fs::write(&model, b"x").unwrap();
    opledger()
        .args(["synth", "-o"])
        .arg(&model)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("exists"));
    opledger()
        .args(["synth", "--list"])
        .assert()
        .success()
        .stdout(
            predicate::str::contains("qwen3.6-35b-a3b")
                .and(predicate::str::contains("tiny-qwen3moe")),
        );
}

#[test]
fn profile_engine_candle_writes_a_run_folder_named_after_candle() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen3moe", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    let run = dir.path().join("run");
    let out = opledger()
        .args([
            "profile", "--engine", "candle", "-p", "32", "-r", "2", "-t", "2", "--json", "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&run)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let summary: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(summary["coverage"], 1.0);
    assert_eq!(summary["outputs_identical"], true);
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["engine"]["engine"], "candle");
    assert_eq!(manifest["engine"]["threads"], 2);
    // an architecture candle does not implement is refused by name
    let q35 = dir.path().join("q35.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen35moe", "-q", "-o"])
        .arg(&q35)
        .assert()
        .success();
    opledger()
        .args(["profile", "--engine", "candle", "-p", "8", "-r", "1", "-m"])
        .arg(&q35)
        .arg("-o")
        .arg(dir.path().join("run2"))
        .assert()
        .failure()
        .stderr(predicate::str::contains("qwen35moe").and(predicate::str::contains("candle")));
}
