//! `opledger report` on stored runs of every kind (the report crate's deterministic fixture,
//! written as run folders): every format re-rendered byte for byte twice, several formats into a
//! new write-once folder, clear refusals.

use crate::fixture;

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
    let _machine = crate::machine::shared();
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
    let _machine = crate::machine::shared();
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
    let _machine = crate::machine::shared();
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
    let _machine = crate::machine::shared();
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

/// The renderings each kind of run's command writes, by `report` format: (format, file).
fn written(kind: &str) -> &'static [(&'static str, &'static str)] {
    match kind {
        "profile" => &[
            ("text", "table.txt"),
            ("md", "summary.md"),
            ("bands", "bands.csv"),
            ("json", "summary.json"),
            ("nodes", "nodes.csv"),
        ],
        "parallel" => &[
            ("text", "parallel.txt"),
            ("csv", "parallel.csv"),
            ("json", "parallel.json"),
        ],
        "sweep" => &[
            ("text", "table.txt"),
            ("bands", "depths.csv"),
            ("json", "summary.json"),
            ("svg", "chart.svg"),
        ],
        "waste" => &[
            ("text", "table.txt"),
            ("md", "summary.md"),
            ("json", "summary.json"),
            ("nodes", "nodes.csv"),
        ],
        "ops" => &[("text", "table.txt"), ("json", "ops.json")],
        "ledger" => &[
            ("text", "table.txt"),
            ("md", "ledger.md"),
            ("csv", "ledger.csv"),
            ("json", "ledger.json"),
        ],
        "ab" => &[("text", "table.txt"), ("json", "ab.json")],
        "discover" => &[("text", "table.txt"), ("json", "discover.json")],
        other => panic!("no such kind {other}"),
    }
}

/// Every kind of run a command writes, measured for real on a tiny model (the mock engine where
/// it offers what the command needs; llama.cpp for the runtime knobs of `ab` and `discover` and
/// for `ops`, whose expert matmuls need the shapes of real routing ids):
/// `report` re-renders each file the command wrote byte for byte from the raw data alone, and
/// a format the kind lacks is refused naming what it has.
#[test]
fn every_kind_of_run_a_command_writes_is_re_rendered_byte_for_byte() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen35moe", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    let quick = ["--no-noise-gate", "-q"];
    let runs: Vec<(&str, Vec<&str>)> = vec![
        (
            "profile",
            vec!["profile", "--engine", "mock", "-p", "16", "-r", "2"],
        ),
        (
            "parallel",
            vec![
                "profile",
                "--engine",
                "mock",
                "-p",
                "16",
                "-n",
                "2",
                "--parallel",
                "1,2",
                "-r",
                "2",
            ],
        ),
        (
            "sweep",
            vec![
                "sweep",
                "--engine",
                "mock",
                "-p",
                "16",
                "--max-depth",
                "32",
                "-r",
                "1",
                "-n",
                "2",
            ],
        ),
        (
            "waste",
            vec!["waste", "--engine", "mock", "-p", "16", "-r", "1"],
        ),
        (
            "ops",
            vec!["ops", "-p", "16", "-r", "1", "--reps", "1", "-t", "2"],
        ),
        (
            "ledger",
            vec![
                "ledger",
                "--engines",
                "mock,llama.cpp",
                "-p",
                "16",
                "-r",
                "1",
                "--replay-cycles",
                "1",
            ],
        ),
        (
            "ab",
            vec![
                "ab",
                "-p",
                "8",
                "-r",
                "4",
                "-t",
                "2",
                "--a",
                "threads=2",
                "--b",
                "threads=1",
            ],
        ),
        (
            "discover",
            vec![
                "discover",
                "-p",
                "8",
                "-r",
                "4",
                "-t",
                "2",
                "--knobs",
                "threads=1",
                "--search-pairs",
                "2",
            ],
        ),
    ];
    // `report` re-renders each file the command wrote into `out` byte for byte, exiting as the
    // command did
    let re_rendered = |kind: &str, written_as: &str, out: &std::path::Path, code: Option<i32>| {
        for (format, file) in written(written_as) {
            let stored =
                std::fs::read(out.join(file)).unwrap_or_else(|e| panic!("{kind}: {file}: {e}"));
            let rendered = opledger()
                .args(["report", "--format", format])
                .arg(out)
                .output()
                .unwrap();
            assert_eq!(
                String::from_utf8_lossy(&rendered.stdout),
                String::from_utf8_lossy(&stored),
                "{kind}: report --format {format} differs from the {file} its command wrote; {}",
                String::from_utf8_lossy(&rendered.stderr)
            );
            assert_eq!(
                rendered.status.code(),
                code,
                "{kind} {format}: exit codes differ"
            );
        }
    };
    for (kind, args) in runs {
        let out = dir.path().join(kind);
        let status = opledger()
            .args(&args)
            .args(
                if matches!(kind, "profile" | "parallel" | "ab" | "discover") {
                    &quick[..]
                } else {
                    &quick[1..]
                },
            )
            .arg("-m")
            .arg(&model)
            .arg("-o")
            .arg(&out)
            .output()
            .unwrap();
        assert!(
            out.join("manifest.json").exists() || out.join("parallel.json").exists(),
            "{kind}: no run folder; {}",
            String::from_utf8_lossy(&status.stderr)
        );
        re_rendered(kind, kind, &out, status.status.code());
    }
    // an import of a GPU-shaped trace: a profile's files, its device ledger in each, and the
    // failed device coverage (a kernel no rule matched) in report's exit code as in import's
    let out = dir.path().join("import");
    let status = opledger()
        .arg("import")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../core/tests/fixtures/kineto-gpu-by-hand.json"
        ))
        .args(["--rules", "pytorch", "-q", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(status.status.code(), Some(3));
    assert!(std::fs::read_to_string(out.join("table.txt"))
        .unwrap()
        .contains("device ledger"));
    re_rendered("import", "profile", &out, Some(3));
    // a kind without an HTML page says what it has
    opledger()
        .args(["report", "--format", "html"])
        .arg(dir.path().join("ops"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "an ops run has no html rendering (it has: text, json)",
        ));
}
