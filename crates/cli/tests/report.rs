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

#[test]
fn an_ab_whose_control_moved_is_inconclusive_in_every_format_and_exits_5() {
    use opledger_core::ab::{Outcome, Verdict};
    let dir = tempfile::tempdir().unwrap();
    let mut r = fixture::ab_report();
    // the prefill scenario's A against itself moved by 6 %: its "faster" cannot stand
    r.scenarios[0].control_ratio = 0.94;
    r.scenarios[0].control_lo = 0.92;
    r.scenarios[0].control_hi = 0.96;
    r.scenarios[0].control_verdict = Verdict::Faster;
    r.scenarios[0].verdict = Verdict::Inconclusive;
    r.verdict = Outcome::of(&r.scenarios);
    assert_eq!(r.verdict, Outcome::Inconclusive);
    let run = dir.path().join("ab");
    let f = opledger_core::run_folder::RunFolder::create(&run).unwrap();
    f.write_json("manifest.json", &fixture::manifest("ab"))
        .unwrap();
    f.write_json("ab.json", &r).unwrap();
    f.finish().unwrap();
    let render = |format: &str| {
        let out = opledger()
            .args(["report", "--format", format])
            .arg(&run)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(5), "{format}");
        String::from_utf8(out.stdout).unwrap()
    };
    let json: serde_json::Value = serde_json::from_str(&render("json")).unwrap();
    assert_eq!(json["verdict"], "inconclusive");
    assert_eq!(json["scenarios"][0]["verdict"], "inconclusive");
    let html = render("html");
    assert!(
        html.contains("banner fail\">verdict: inconclusive"),
        "the HTML banner does not say inconclusive"
    );
    assert!(render("text").contains("verdict: inconclusive"));
}
