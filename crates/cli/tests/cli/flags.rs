//! Every flag value is checked when the command line is parsed, with a clear message and exit
//! 2, and a refused command leaves no run folder behind; band files are checked against the
//! model (architecture: error; keys that match nothing: warning before measuring); stored runs
//! of a newer or unknown schema version are refused naming the file.

use crate::fixture;

use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;

fn opledger(cwd: &Path) -> Command {
    let mut c = Command::cargo_bin("opledger").unwrap();
    c.current_dir(cwd);
    c
}

fn tiny(dir: &Path) -> std::path::PathBuf {
    let model = dir.join("tiny.gguf");
    opledger(dir)
        .args(["synth", "--preset", "tiny-qwen35moe", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    model
}

/// Nothing but the model under `dir`: no `runs/` folder, no `-o` folder.
fn nothing_written(dir: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["tiny.gguf"], "a refused command left files behind");
}

#[test]
fn bad_flag_values_are_refused_with_exit_2_and_leave_no_folder() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let m = model.to_str().unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["profile", "-t", "0"], "must be at least 1"),
        (&["profile", "-t", "100000"], "CPUs available"),
        (&["profile", "-t", "3000000000"], "CPUs available"),
        (&["profile", "-t", "5000000000"], "not a whole number"),
        (&["profile", "-t", "-1"], "not a whole number"),
        (&["profile", "-p", "0"], "must be at least 1"),
        (&["profile", "-r", "0"], "must be at least 1"),
        (
            &["profile", "--parallel", "1,0", "-n", "4"],
            "must be at least 1",
        ),
        (&["profile", "--noise-gate", "NaN"], "not a finite number"),
        (
            &["profile", "--noise-gate", "-0.1"],
            "not a share between 0 and 1",
        ),
        (
            &["profile", "--noise-gate", "1.5"],
            "not a share between 0 and 1",
        ),
        (&["profile", "--canary", "0"], "not a slowdown above 0"),
        (&["profile", "--canary", "inf"], "not a finite number"),
        (
            &["ab", "--b", "threads=1", "--canary", "-0.5"],
            "not a slowdown above 0",
        ),
        (&["graph", "-p", "0"], "must be at least 1"),
        (
            &["ledger", "--engines", "llama.cpp,llama.cpp"],
            "llama.cpp twice",
        ),
        (
            &["sweep", "-p", "512", "--max-depth", "100"],
            "below the chunk",
        ),
        (
            &["ab", "--b", "threads=1", "--min-effect", "-0.01"],
            "relative change",
        ),
        (
            &["ab", "--b", "threads=1", "--max-nmse", "0"],
            "must be above 0",
        ),
        (
            &["ab", "--b", "threads=1", "--near-tie", "-1"],
            "must be at least 0",
        ),
        (&["ab", "--b", "threads=1", "-p", "0"], "must be at least 1"),
        (&["ab", "--b", "threads=1", "-r", "2"], "2 is not in 4.."),
        (&["ab", "--b", "threads=100000"], "CPUs available"),
        (
            &["discover", "--knobs", "threads=1", "--search-pairs", "1"],
            "1 is not in 2..",
        ),
        (&["ledger", "-r", "0"], "must be at least 1"),
        (&["ledger", "-k", "0"], "must be at least 1"),
        (&["ledger", "-p", "0"], "must be at least 1"),
        (&["ledger", "--replay-cycles", "0"], "must be at least 1"),
        (&["ops", "--reps", "0"], "must be at least 1"),
        (&["waste", "-r", "0"], "must be at least 1"),
    ];
    for (args, message) in cases {
        opledger(dir.path())
            .args(*args)
            .args(["-m", m, "-o", "out"])
            .assert()
            .code(2)
            .stderr(predicate::str::contains(*message));
        nothing_written(dir.path());
    }
    // a stored run that is not one: refused before a folder is created
    opledger(dir.path())
        .args(["waste", "--run", "NOT_A_RUN", "-o", "out"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("NOT_A_RUN").and(predicate::str::contains("no such folder")),
        );
    nothing_written(dir.path());
}

#[test]
fn a_band_file_for_another_architecture_is_refused() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let bands = dir.path().join("grok-bands.toml");
    std::fs::write(
        &bands,
        opledger_core::band::BUILTIN_RULES
            .iter()
            .find(|(f, _)| *f == "grok.toml")
            .unwrap()
            .1,
    )
    .unwrap();
    opledger(dir.path())
        .args(["profile", "-p", "8", "-r", "1", "--bands"])
        .arg(&bands)
        .arg("-m")
        .arg(&model)
        .args(["-o", "out"])
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("grok-bands.toml")
                .and(predicate::str::contains("'qwen35moe'")),
        );
    assert!(!dir.path().join("out").exists());
}

#[test]
fn band_file_keys_that_match_nothing_are_a_warning_before_measuring() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let builtin = opledger_core::band::BUILTIN_RULES
        .iter()
        .find(|(f, _)| *f == "qwen35moe.toml")
        .unwrap()
        .1;
    // the built-in set with one misspelt weight token added
    let text = builtin.replace("[weight]\n", "[weight]\nattn_qkvv = \"linear_attention\"\n");
    assert_ne!(text, builtin);
    let bands = dir.path().join("mine.toml");
    std::fs::write(&bands, text).unwrap();
    let out = opledger(dir.path())
        .args([
            "profile",
            "-p",
            "8",
            "-r",
            "1",
            "-t",
            "2",
            "--no-noise-gate",
            "--bands",
        ])
        .arg(&bands)
        .arg("-m")
        .arg(&model)
        .args(["-o", "out"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(
            "warning: mine.toml: weight.attn_qkvv matches no op, weight or node name of this model's graph"
        ) || stderr.contains("weight.attn_qkvv matches no op"),
        "{stderr}"
    );
    // keys this graph has are not listed (the built-in set also carries keys of other graph
    // variants, the fused gate/up experts or the soft-max attention path, which are)
    assert!(!stderr.contains("weight.attn_qkv matches"), "{stderr}");
    assert!(!stderr.contains("op.GATED_DELTA_NET matches"), "{stderr}");
    // a warning, not a failure: the run is measured (its checks decide the exit code)
    assert!(dir.path().join("out/summary.json").is_file());
}

#[test]
fn a_stored_run_of_a_newer_schema_version_is_refused_naming_the_file() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let runs = fixture::write_runs(dir.path());
    let bump = |file: &Path| {
        let mut v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(file).unwrap()).unwrap();
        v["schema_version"] = 99.into();
        std::fs::write(file, serde_json::to_vec(&v).unwrap()).unwrap();
    };
    let (_, profile) = runs.iter().find(|(k, _)| *k == "profile").unwrap();
    bump(&profile.join("raw.json"));
    opledger(dir.path())
        .args(["report", "--format", "json"])
        .arg(profile)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("raw.json").and(predicate::str::contains("schema version 99")),
        );
    let (_, ab) = runs.iter().find(|(k, _)| *k == "ab").unwrap();
    bump(&ab.join("ab.json"));
    opledger(dir.path())
        .args(["report"])
        .arg(ab)
        .assert()
        .code(2)
        .stderr(
            predicate::str::contains("ab.json").and(predicate::str::contains("schema version 99")),
        );
    let (_, waste) = runs.iter().find(|(k, _)| *k == "waste").unwrap();
    bump(&waste.join("summary.json"));
    opledger(dir.path())
        .args(["report"])
        .arg(waste)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("summary.json"));
    let (_, sweep) = runs.iter().find(|(k, _)| *k == "sweep").unwrap();
    bump(&sweep.join("manifest.json"));
    opledger(dir.path())
        .args(["report"])
        .arg(sweep)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("manifest.json"));
    // compare and waste --run read profile runs the same way
    opledger(dir.path())
        .args(["compare"])
        .arg(profile)
        .arg(profile)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("raw.json"));
}
