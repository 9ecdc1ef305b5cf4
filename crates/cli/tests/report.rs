//! `opledger report` on stored runs of every kind (the report crate's deterministic fixture,
//! written as run folders): every format re-rendered byte for byte twice, several formats into a
//! new write-once folder, clear refusals.

#[path = "../../report/tests/fixture/mod.rs"]
mod fixture;

use assert_cmd::Command;
use predicates::prelude::*;

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

fn formats(kind: &str) -> Vec<&'static str> {
    let mut f = vec!["text", "md", "csv", "json", "html", "sql", "svg"];
    match kind {
        "profile" => f.extend(["bands", "nodes", "perfetto"]),
        "sweep" => f.push("bands"),
        "waste" => f.extend(["nodes", "perfetto"]),
        _ => {}
    }
    f
}

#[test]
fn every_format_of_every_run_renders_the_same_bytes_twice() {
    let dir = tempfile::tempdir().unwrap();
    for (kind, run) in fixture::write_runs(dir.path()) {
        for format in formats(kind) {
            let render = || {
                opledger()
                    .args(["report", "--format", format])
                    .arg(&run)
                    .assert()
                    .success()
                    .get_output()
                    .stdout
                    .clone()
            };
            let first = render();
            assert!(!first.is_empty(), "{kind} {format}: nothing printed");
            assert_eq!(first, render(), "{kind} {format} differs between runs");
        }
        // -o: every format into a new folder, the same bytes as on stdout
        let out = dir.path().join(format!("{kind}-report"));
        opledger()
            .arg("report")
            .arg(&run)
            .arg("-o")
            .arg(&out)
            .assert()
            .success();
        let mut files: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        assert_eq!(files.len(), formats(kind).len(), "{kind}: {files:?}");
        assert!(!files.iter().any(|f| f == "INCOMPLETE"));
        let html = std::fs::read(out.join("report.html")).unwrap();
        let stdout = opledger()
            .args(["report", "--format", "html"])
            .arg(&run)
            .output()
            .unwrap()
            .stdout;
        assert_eq!(html, stdout, "{kind}: report.html differs from stdout");
        // write-once
        opledger()
            .arg("report")
            .arg(&run)
            .arg("-o")
            .arg(&out)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("already exists"));
    }
}

#[test]
fn a_stored_waste_summary_is_re_rendered_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let runs = fixture::write_runs(dir.path());
    let (_, waste) = runs.iter().find(|(k, _)| *k == "waste").unwrap();
    let json = opledger()
        .args(["report", "--format", "json"])
        .arg(waste)
        .output()
        .unwrap()
        .stdout;
    assert_eq!(json, std::fs::read(waste.join("summary.json")).unwrap());
}

#[test]
fn chosen_formats_go_to_a_folder_and_stdout_takes_one() {
    let dir = tempfile::tempdir().unwrap();
    let runs = fixture::write_runs(dir.path());
    let (_, profile) = &runs[0];
    let out = dir.path().join("chosen");
    opledger()
        .args([
            "report",
            "--format",
            "html,perfetto,sql",
            "--trace-tracks",
            "layer",
        ])
        .arg(profile)
        .arg("-o")
        .arg(&out)
        .assert()
        .success();
    for f in ["report.html", "trace.json", "results.sql"] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let trace = std::fs::read_to_string(out.join("trace.json")).unwrap();
    assert!(trace.contains("\"layer 1\""), "layer tracks asked for");
    opledger()
        .args(["report", "--format", "html,sql"])
        .arg(profile)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("write several with -o DIR"));
    let (_, sweep) = &runs[1];
    opledger()
        .args(["report", "--format", "perfetto"])
        .arg(sweep)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "a sweep run has no perfetto rendering",
        ));
    // a refused format creates no folder
    let none = dir.path().join("none");
    opledger()
        .args(["report", "--format", "nodes"])
        .arg(sweep)
        .arg("-o")
        .arg(&none)
        .assert()
        .code(2);
    assert!(!none.exists());
}
