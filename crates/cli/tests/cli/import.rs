//! `opledger import`: hand-made traces in the span names of candle-transformers' modules
//! (B/E as `tracing-chrome` writes them) imported with the shipped rules; the run folder is taken
//! by `report` (every format) and `compare`; bad traces are refused naming the file, with
//! nothing left behind.

use std::path::Path;

use assert_cmd::Command;
use predicates::prelude::*;

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

/// `steps` forward passes of two layers: attn (3 qmatmuls of `qmm_us` each, 5 µs of its own),
/// mlp (one qmatmul of 10 µs, 2 µs of its own); each step has 1 + 2 x 2 µs of its own (1 µs
/// before the first layer, 1 µs after each attn and after each mlp).
fn candle_like_trace(steps: u32, qmm_us: u64) -> String {
    candle_like_steps(&vec![qmm_us; steps as usize])
}

/// The same with each step's qmatmul time given: one step per entry.
fn candle_like_steps(qmm_us: &[u64]) -> String {
    let mut ev = Vec::new();
    let mut ts = 0u64;
    let mut push = |ph: &str, name: &str, ts: u64| {
        ev.push(format!(
            r#"{{"ph":"{ph}","name":"{name}","ts":{ts},"pid":1,"tid":1}}"#
        ))
    };
    for &qmm_us in qmm_us {
        push("B", "model", ts);
        ts += 1;
        for _ in 0..2 {
            push("B", "attn", ts);
            for _ in 0..3 {
                push("B", "qmatmul", ts);
                ts += qmm_us;
                push("E", "qmatmul", ts);
            }
            ts += 5;
            push("E", "attn", ts);
            ts += 1;
            push("B", "mlp", ts);
            push("B", "qmatmul", ts);
            ts += 10;
            push("E", "qmatmul", ts);
            ts += 2;
            push("E", "mlp", ts);
            ts += 1;
        }
        push("E", "model", ts);
        ts += 100;
    }
    format!(r#"{{"traceEvents":[{}]}}"#, ev.join(",\n"))
}

fn import(dir: &Path, trace_text: &str, name: &str) -> std::path::PathBuf {
    let trace = dir.join(format!("{name}.json"));
    std::fs::write(&trace, trace_text).unwrap();
    let out = dir.join(name);
    opledger()
        .arg("import")
        .arg(&trace)
        .args(["--tokens", "2", "-q", "-o"])
        .arg(&out)
        .assert()
        .success();
    out
}

fn band_ms(run: &Path, band: &str) -> f64 {
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    s["bands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["band"] == band)
        .unwrap()["ms_per_token"]
        .as_f64()
        .unwrap()
}

#[test]
fn a_candle_trace_imports_into_bands_with_known_self_times() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let run = import(dir.path(), &candle_like_trace(3, 4), "run");
    // per step: projections 2 x 3 x 4 = 24 µs, attention 2 x 5 = 10, dense_ffn 2 x (10 + 2)
    // = 24, other (the step's own) 1 + 2 x 2 = 5 µs; 2 tokens a step
    for (band, us) in [
        ("projections", 24.0),
        ("attention", 10.0),
        ("dense_ffn", 24.0),
        ("other", 5.0),
    ] {
        let ms = band_ms(&run, band);
        assert!((ms - us / 1e3 / 2.0).abs() < 1e-9, "{band}: {ms}");
    }
    let manifest = std::fs::read_to_string(run.join("manifest.json")).unwrap();
    assert!(manifest.contains(r#""command": "import""#), "{manifest}");
    assert!(manifest.contains("trace_blake3"), "{manifest}");
    assert!(run.join("import-rules.toml").exists());
    let stats = std::fs::read_to_string(run.join("import.json")).unwrap();
    assert!(stats.contains(r#""steps": 3"#), "{stats}");
    // report takes it in every profile format; its checks say what cannot be measured
    for format in [
        "text", "md", "csv", "json", "bands", "nodes", "html", "sql", "svg", "perfetto",
    ] {
        opledger()
            .args(["report", "--format", format])
            .arg(&run)
            .assert()
            .success();
    }
    opledger()
        .args(["report", "--format", "text"])
        .arg(&run)
        .assert()
        .success()
        .stdout(predicate::str::contains(
            "agreement: not measurable for an imported trace",
        ));
}

#[test]
fn compare_takes_imported_runs() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let slow = import(dir.path(), &candle_like_trace(3, 8), "slow");
    let fast = import(dir.path(), &candle_like_trace(3, 4), "fast");
    let out = opledger()
        .args(["compare", "--format", "json"])
        .arg(&slow)
        .arg(&fast)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let rows = v["ledger"]["rows"].as_array().unwrap();
    let proj = rows.iter().find(|r| r["band"] == "projections").unwrap();
    assert!(
        (proj["gap_ms_per_token"].as_f64().unwrap() - 0.012).abs() < 1e-9,
        "{proj}"
    );
}

#[test]
fn compare_fail_above_fails_a_slowed_band_and_passes_a_change_within_noise() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    // the baseline's projections vary step to step: 6 x 10..14 µs a step
    let base = import(
        dir.path(),
        &candle_like_steps(&[10, 11, 12, 13, 14]),
        "base",
    );
    // 11..15 µs: its median 8 % above the baseline's, its steps interleaved with the
    // baseline's: within the runs' noise (the rank test's p is far above 0.05 / 4 bands)
    let noisy = import(
        dir.path(),
        &candle_like_steps(&[11, 12, 13, 14, 15]),
        "noisy",
    );
    // 16..20 µs: 50 % slower and every step slower than every baseline step (p = 1/252)
    let slowed = import(
        dir.path(),
        &candle_like_steps(&[16, 17, 18, 19, 20]),
        "slowed",
    );
    let gate = |new: &Path, pct: &str| {
        let mut c = opledger();
        c.args(["compare", "--fail-above", pct]).arg(new).arg(&base);
        c.assert()
    };
    let out = gate(&noisy, "5").success().get_output().stdout.clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("gate: ") && text.contains(": passed"),
        "{text}"
    );
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("projections") && l.contains("within the noise"));
    assert!(line.is_some(), "{text}");
    gate(&slowed, "5")
        .code(6)
        .stderr(predicate::str::contains("regressed: projections: +"));
    // the threshold decides too: 50 % slower passes a 60 % gate
    gate(&slowed, "60").success();
    // machine-readable: the gate in the JSON, the opportunity of every uneven band
    let out = opledger()
        .args(["compare", "--json", "--fail-above", "5"])
        .arg(&slowed)
        .arg(&base)
        .assert()
        .code(6)
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let failed: Vec<&str> = v["gate"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["fails"] == true)
        .map(|r| r["band"].as_str().unwrap())
        .collect();
    assert_eq!(failed, ["projections"], "{}", v["gate"]);
    let proj = v["ledger"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["band"] == "projections")
        .unwrap();
    assert_eq!(proj["opportunity"]["side"], "a", "{proj}");
    // a bad threshold is refused when the command line is parsed
    opledger()
        .args(["compare", "--fail-above=-3"])
        .arg(&slowed)
        .arg(&base)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("percentage"));
}

/// What a process killed while tracing leaves: whole events, no closing bracket. It is read up
/// to there, with a note, and gives the bands of the whole file.
#[test]
fn a_trace_without_its_closing_bracket_is_imported_with_a_note() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let whole = candle_like_trace(3, 4);
    let cut = whole.strip_suffix("]}").unwrap().to_string() + ",\n";
    let full = import(dir.path(), &whole, "whole");
    let trace = dir.path().join("cut.json");
    std::fs::write(&trace, &cut).unwrap();
    let out = dir.path().join("cut");
    opledger()
        .arg("import")
        .arg(&trace)
        .args(["--tokens", "2", "-q", "-o"])
        .arg(&out)
        .assert()
        .success()
        .stderr(predicate::str::contains("note: "))
        .stderr(predicate::str::contains(
            "cut.json: the event array stops after",
        ));
    assert_eq!(bands(&full), bands(&out));
    let stats = std::fs::read_to_string(out.join("import.json")).unwrap();
    assert!(stats.contains("without its closing"), "{stats}");
}

#[test]
fn bad_traces_are_refused_naming_the_file_and_leave_no_folder() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        (
            "truncated",
            &candle_like_trace(1, 4)[..200],
            "the trace stops inside event",
        ),
        (
            "nostep",
            r#"[{"ph":"X","name":"qmatmul","ts":0,"dur":3,"pid":1,"tid":1}]"#,
            "no step span",
        ),
        (
            "overlap",
            r#"[{"ph":"X","name":"model","ts":0,"dur":100,"pid":1,"tid":1},
                {"ph":"X","name":"attn","ts":10,"dur":20,"pid":1,"tid":1},
                {"ph":"X","name":"mlp","ts":20,"dur":20,"pid":1,"tid":1}]"#,
            "spans overlap without nesting",
        ),
        (
            "endless",
            r#"[{"ph":"E","name":"model","ts":5,"pid":1,"tid":1}]"#,
            "without a B to close",
        ),
    ];
    for (name, text, words) in cases {
        let trace = dir.path().join(format!("{name}.json"));
        std::fs::write(&trace, text).unwrap();
        let out = dir.path().join(name);
        opledger()
            .arg("import")
            .arg(&trace)
            .arg("-o")
            .arg(&out)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(format!("{name}.json")))
            .stderr(predicate::str::contains(words));
        assert!(!out.exists(), "{name}: a folder was left");
    }
}

/// The bands of a run's `summary.json`: (band, ms/token).
fn bands(run: &Path) -> Vec<(String, f64)> {
    let s: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    s["bands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["band"].as_str().unwrap().to_string(),
                b["ms_per_token"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_llama_cpp_profile_written_as_node_records_imports_with_the_same_bands() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen35moe", "-o"])
        .arg(&model)
        .assert()
        .success();
    let prof = dir.path().join("prof");
    opledger()
        .args([
            "profile",
            "-p",
            "16",
            "-r",
            "3",
            "--no-noise-gate",
            "-q",
            "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&prof)
        .assert()
        .success();
    let records = opledger()
        .args(["report", "--format", "jsonl"])
        .arg(&prof)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(records.clone()).unwrap();
    assert!(
        text.starts_with(r#"{"record":"run","schema_version":2,"#),
        "{}",
        &text[..80]
    );
    assert!(text.contains(r#""mode":"TIMED""#) && text.contains(r#""mode":"FUSED""#));
    let path = dir.path().join("nodes.jsonl");
    std::fs::write(&path, &records).unwrap();
    let imported = dir.path().join("imported");
    opledger()
        .args(["import", "--format", "jsonl", "-q"])
        .arg(&path)
        .arg("-o")
        .arg(&imported)
        .assert()
        .success();
    let (a, b) = (bands(&prof), bands(&imported));
    assert_eq!(a.len(), b.len());
    for ((ba, ma), (bb, mb)) in a.iter().zip(&b) {
        assert_eq!(ba, bb);
        assert!(
            (ma - mb).abs() <= 1e-9 * ma.abs().max(1.0),
            "{ba}: {ma} vs {mb}"
        );
    }
    // a damaged record is refused naming the file and line
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, format!("{}{{\"record\":\"node\"", text)).unwrap();
    opledger()
        .args(["import", "--format", "jsonl"])
        .arg(&bad)
        .arg("-o")
        .arg(dir.path().join("badrun"))
        .assert()
        .code(2)
        .stderr(predicate::str::contains("bad.jsonl:"));
    assert!(!dir.path().join("badrun").exists());
    // what records do not carry is said so, not shown as a figure
    let s = summary(&imported);
    assert!(s["overhead"].is_null(), "{}", s["overhead"]);
    assert!(s["agreement"].is_number());
    let out = opledger()
        .args(["report", "--format", "text"])
        .arg(&imported)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(out).unwrap();
    assert!(
        text.contains("instrument overhead not measured") && text.contains("WARN overhead"),
        "{text}"
    );
    assert!(
        !text.contains("ok overhead") && !text.contains("ok noise"),
        "{text}"
    );
}

fn summary(run: &Path) -> serde_json::Value {
    serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap()
}

/// A decode profile at depth, written as node records and imported back, is the same decode
/// profile: its work, isolation calibration, outputs and bands.
#[test]
fn a_decode_profile_written_as_node_records_imports_as_the_same_decode_profile() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen35moe", "-o"])
        .arg(&model)
        .assert()
        .success();
    let prof = dir.path().join("prof");
    opledger()
        .args([
            "profile",
            "-p",
            "8",
            "-d",
            "16",
            "-n",
            "3",
            "-r",
            "3",
            "--no-noise-gate",
            "-q",
            "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&prof)
        .assert()
        .success();
    let records = opledger()
        .args(["report", "--format", "jsonl"])
        .arg(&prof)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let path = dir.path().join("nodes.jsonl");
    std::fs::write(&path, &records).unwrap();
    let imported = dir.path().join("imported");
    opledger()
        .args(["import", "--format", "jsonl", "-q"])
        .arg(&path)
        .arg("-o")
        .arg(&imported)
        .assert()
        .success();
    let (a, b) = (summary(&prof), summary(&imported));
    for key in [
        "tokens",
        "depth_tokens",
        "decode_tokens",
        "parallel",
        "node_steps",
        "cycles",
        "fused_ms",
        "agreement",
        "isolation_us",
        "isolation_source",
        "agreement_corrected",
        "isolation_remainder_us",
        "outputs_identical",
        "bands",
    ] {
        assert_eq!(a[key], b[key], "{key}");
    }
    assert_eq!(a["decode_tokens"], 3);
    assert_eq!(a["depth_tokens"], 16);
    let outputs = |s: &serde_json::Value| {
        s["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "outputs")
            .unwrap()["status"]
            .clone()
    };
    assert_eq!(outputs(&b), "pass");
    assert!(b["overhead"].is_null());
}
