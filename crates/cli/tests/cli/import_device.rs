//! `opledger import` of a GPU-shaped Kineto trace (crates/core/tests/fixtures/
//! kineto-gpu-by-hand.json, every figure of it computed by hand in
//! crates/core/tests/kineto_gpu.rs): the device ledger is part of the run, in every stored
//! format and in `report`'s re-rendering byte for byte; `compare` reads the bands on the
//! device's clock; an import without `--model` says what it did not record.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

const HAND: &str = include_str!("../../../core/tests/fixtures/kineto-gpu-by-hand.json");

/// Per band, the hand-computed µs of the fixture's two steps (kineto_gpu.rs), host self time
/// then device time:
///   host   step 1: other 71, attention 51, projections 14, network 3, dense_ffn 55,
///                  unassigned 6 (the sum 200 is the wall); step 2: other 80, dense_ffn 20
///   device step 1: other 14 (index select 10 + memcpy 4), projections 30 (gemm),
///                  attention 50 (flash), network 60 (all-reduce on stream 20), dense_ffn 66
///                  (gemm 60 + silu 6), unassigned 4 (fill_); step 2: dense_ffn 6 (silu)
/// At one token a step, a band's ms/token per step is its µs / 1000, and the median of two
/// steps is their mean.
const BANDS: [(&str, [f64; 2], [f64; 2]); 6] = [
    ("attention", [51.0, 0.0], [50.0, 0.0]),
    ("projections", [14.0, 0.0], [30.0, 0.0]),
    ("dense_ffn", [55.0, 20.0], [66.0, 6.0]),
    ("network", [3.0, 0.0], [60.0, 0.0]),
    ("other", [71.0, 80.0], [14.0, 0.0]),
    ("unassigned", [6.0, 0.0], [4.0, 0.0]),
];

/// The table's rows as printed (4 decimals, ms/token; device share = the band's device median
/// over the device total 0.1150 = (224 + 6) / 2 / 1000): written out by hand from `BANDS`.
const ROWS: [&str; 7] = [
    "attention 0.0255 0.0000–0.0510 0.0250 0.0000–0.0500 21.7 %",
    "projections 0.0070 0.0000–0.0140 0.0150 0.0000–0.0300 13.0 %",
    "dense_ffn 0.0375 0.0200–0.0550 0.0360 0.0060–0.0660 31.3 %",
    "network 0.0015 0.0000–0.0030 0.0300 0.0000–0.0600 26.1 %",
    "other 0.0755 0.0710–0.0800 0.0070 0.0000–0.0140 6.1 %",
    "unassigned 0.0030 0.0000–0.0060 0.0020 0.0000–0.0040 1.7 %",
    "total 0.1500 0.1150 100.0 %",
];

/// Busy: step 1 the union over both streams 10 + 4 + 146 + 4 = 164 µs, step 2 6 µs; activity
/// 224 and 6; stream concurrency 224 / 164 = 1.36585 and 1; the host wall 200 and 100, to the
/// last activity 204 (it ends at 304) and 100 (its last ends at 326, inside the step).
const BUSY: &str = "device busy 0.0850 [0.0060–0.1640] ms a step (the union over each device's streams) against 0.1150 [0.0060–0.2240] ms of activity: stream concurrency 1.1829 [1.0000–1.3659]";
const WALL: &str = "step wall 0.1500 [0.1000–0.2000] ms on the host, 0.1520 [0.1000–0.2040] ms to its last device activity";
/// The fill_ launched before the first step: 5 µs, in no band; one device, two streams.
const OUTSIDE: &str = "activity launched outside every step: 1 (0.0050 ms, in no band); with no launch found: 0 (0.0000 ms)";
const STREAMS: &str = "streams: 2 on 1 device(s)";

fn import(dir: &Path, name: &str, text: &str, extra: &[&str]) -> (PathBuf, Option<i32>) {
    let trace = dir.join(format!("{name}.json"));
    std::fs::write(&trace, text).unwrap();
    let out = dir.join(name);
    let status = opledger()
        .arg("import")
        .arg(&trace)
        .args(["--rules", "pytorch", "--tokens", "1", "-q", "-o"])
        .arg(&out)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.join("manifest.json").exists(),
        "{name}: no run folder; {}",
        String::from_utf8_lossy(&status.stderr)
    );
    (out, status.status.code())
}

fn render(run: &Path, format: &str) -> (String, Option<i32>) {
    let out = opledger()
        .args(["report", "--format", format])
        .arg(run)
        .output()
        .unwrap();
    (String::from_utf8(out.stdout).unwrap(), out.status.code())
}

/// The text's words, so the columns' widths do not matter.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn a_gpu_trace_import_holds_its_device_ledger_in_every_format() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    // exit 3: the fill_ kernel launched outside every module matched no rule (device coverage)
    // and its host launch neither (coverage), as the import said
    let (run, code) = import(dir.path(), "gpu", HAND, &[]);
    assert_eq!(code, Some(3));

    // report re-renders every file the import wrote byte for byte, and exits as it did
    for (format, file) in [
        ("text", "table.txt"),
        ("md", "summary.md"),
        ("bands", "bands.csv"),
        ("json", "summary.json"),
        ("nodes", "nodes.csv"),
    ] {
        let stored = std::fs::read_to_string(run.join(file)).unwrap();
        let (rendered, rc) = render(&run, format);
        assert_eq!(
            rendered, stored,
            "report --format {format} differs from {file}"
        );
        assert_eq!(rc, Some(3), "{format}: report exits as the import did");
    }

    // table.txt and summary.md: the table, busy time, concurrency, walls, outside, streams
    let text = words(&std::fs::read_to_string(run.join("table.txt")).unwrap());
    let md = words(
        &std::fs::read_to_string(run.join("summary.md"))
            .unwrap()
            .replace('|', " "),
    );
    for doc in [&text, &md] {
        for row in ROWS {
            assert!(doc.contains(row), "no row '{row}' in\n{doc}");
        }
        for line in [BUSY, WALL, OUTSIDE, STREAMS] {
            assert!(doc.contains(&words(line)), "no '{line}' in\n{doc}");
        }
        // moe is in the rules but took no time on either clock: no row
        assert!(!doc.contains("moe 0.0000"), "{doc}");
    }
    assert!(text.contains("FAIL device coverage"), "{text}");
    assert!(md.contains("device coverage FAIL"), "{md}");

    // bands.csv: the host's rows as before, then one per band on the device's clock
    let csv = std::fs::read_to_string(run.join("bands.csv")).unwrap();
    let mut lines = csv.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    assert_eq!(*header.last().unwrap(), "clock");
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    for (band, host, device) in BANDS {
        let on = |clock: &str| {
            rows.iter()
                .find(|r| r[0] == band && r[col("clock")] == clock)
                .unwrap_or_else(|| panic!("no {clock} row of {band} in\n{csv}"))
        };
        let num = |r: &Vec<&str>, c: &str| r[col(c)].parse::<f64>().unwrap();
        let d = on("device");
        assert!(
            close(num(d, "ms_per_token"), (device[0] + device[1]) / 2e3),
            "{band}"
        );
        assert!(close(
            num(d, "ms_per_token_min"),
            device[0].min(device[1]) / 1e3
        ));
        assert!(close(
            num(d, "ms_per_token_max"),
            device[0].max(device[1]) / 1e3
        ));
        assert!(
            close(num(d, "fused_ms"), 0.152),
            "{band}: the wall to the last activity"
        );
        // the device has no corrected figure, no nodes of its own: empty, not 0
        assert_eq!(d[col("ms_per_token_corrected")], "", "{band}");
        assert_eq!(d[col("nodes")], "", "{band}");
        // the host's row: the spans' self time scaled to the wall, which here is their sum
        let h = on("host");
        assert!(
            close(num(h, "ms_per_token"), (host[0] + host[1]) / 2e3),
            "{band}"
        );
    }

    // summary.json carries the device ledger
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let d = &json["device"];
    for (band, host, device) in BANDS {
        let b = d["bands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["band"] == band)
            .unwrap();
        let f = |k: &str, x: &str| b[k][x].as_f64().unwrap();
        assert!(close(
            f("device_ms_per_token", "median"),
            (device[0] + device[1]) / 2e3
        ));
        assert!(close(
            f("host_ms_per_token", "median"),
            (host[0] + host[1]) / 2e3
        ));
        let steps: Vec<f64> = b["device_ms_per_token_steps"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert!(
            steps.len() == 2
                && close(steps[0], device[0] / 1e3)
                && close(steps[1], device[1] / 1e3)
        );
    }
    let med = |k: &str| d[k]["median"].as_f64().unwrap();
    assert!(close(med("busy_ms"), (164.0 + 6.0) / 2e3));
    assert!(close(med("activity_ms"), (224.0 + 6.0) / 2e3));
    assert!(close(
        med("stream_concurrency"),
        (224.0 / 164.0 + 1.0) / 2.0
    ));
    assert!(close(
        med("step_wall_with_device_ms"),
        (204.0 + 100.0) / 2e3
    ));
    assert_eq!(
        (d["activities"].as_u64(), d["streams"].as_u64()),
        (Some(9), Some(2))
    );
    assert_eq!(d["outside_steps"].as_u64(), Some(1));

    // results.sql: the device's run row and band rows
    let (sql, _) = render(&run, "sql");
    assert!(
        sql.contains("CREATE TABLE IF NOT EXISTS opledger_run_device_bands"),
        "{sql}"
    );
    let values = |table: &str, band: Option<&str>| -> Vec<String> {
        let line = sql
            .lines()
            .find(|l| {
                l.starts_with(&format!("INSERT OR REPLACE INTO {table} "))
                    && band.is_none_or(|b| l.contains(&format!(", '{b}', ")))
            })
            .unwrap_or_else(|| panic!("no {table} row {band:?} in\n{sql}"));
        let v = &line[line.rfind("VALUES (").unwrap() + 8..line.len() - 2];
        v.split(", ").map(String::from).collect()
    };
    let attention = values("opledger_run_device_bands", Some("attention"));
    let num = |s: &str| s.parse::<f64>().unwrap();
    // host 51 and 0 µs; device 50 and 0 µs
    assert!(close(num(&attention[2]), 0.0255) && close(num(&attention[4]), 0.051));
    assert!(close(num(&attention[5]), 0.025) && close(num(&attention[7]), 0.05));
    let device = values("opledger_run_device", None);
    // activities 9, devices 1, streams 2, busy 0.085, activity 0.115, concurrency 1.1829
    assert_eq!(&device[1..4], ["9", "1", "2"]);
    assert!(close(num(&device[4]), 0.085) && close(num(&device[5]), 0.115));
    assert!(close(num(&device[6]), (224.0 / 164.0 + 1.0) / 2.0));

    // report.html: both clocks in one chart, the device section, the busy time and streams
    let (html, _) = render(&run, "html");
    assert!(
        html.contains("ms per token by band, host and device"),
        "no chart of both clocks"
    );
    assert!(html.contains("<section id=\"device\">"));
    for needle in [
        "host 0.0255 · device 0.0250 ms",
        "host 0.0015 · device 0.0300 ms",
        "0.0850 [0.0060–0.1640]",
        "stream concurrency 1.1829 [1.0000–1.3659]",
        "streams: 2 on 1 device(s)",
        "activity launched outside every step: 1 (0.0050 ms, in no band)",
    ] {
        assert!(html.contains(needle), "no '{needle}' in the HTML");
    }
    // one host bar and one device bar per band with time (six bands), in the clocks' colours
    let chart = &html[html.find("<section id=\"chart\">").unwrap()
        ..html.find("<section id=\"device\">").unwrap()];
    let host_bars = chart
        .matches(&format!(
            "fill=\"{}\"",
            opledger_report::palette::HOST_CLOCK
        ))
        .count();
    let device_bars = chart
        .matches(&format!(
            "fill=\"{}\"",
            opledger_report::palette::DEVICE_CLOCK
        ))
        .count();
    // (each colour also fills its legend swatch)
    assert_eq!((host_bars, device_bars), (7, 7), "{chart}");
}

/// The fixture as engine B ran it: the flash attention kernel takes 10 µs, not 50 (device:
/// attention 5 µs a step at the median, not 25), and step 2's MLP module spans 60 µs, not 20
/// (host: step 2's dense_ffn 52 + 4 + 4 = 60 µs, its other 10 + 90 - 60 = 40 µs, not 80).
fn engine_b() -> String {
    let b = HAND
        .replace(
            r#""ts":180,"dur":50,"args":{"External id":8"#,
            r#""ts":180,"dur":10,"args":{"External id":8"#,
        )
        .replace(
            r#""name":"nn.Module: LlamaMLP_0","pid":100,"tid":100,"ts":310,"dur":20"#,
            r#""name":"nn.Module: LlamaMLP_0","pid":100,"tid":100,"ts":310,"dur":60"#,
        );
    assert_ne!(b, HAND);
    assert_eq!(
        b.matches("\"dur\":10,\"args\":{\"External id\":8").count(),
        1
    );
    assert_eq!(b.matches("\"ts\":310,\"dur\":60").count(), 1);
    b
}

/// `compare A B` printed, its rows' bands in order, and the exit code.
fn compare(a: &Path, b: &Path, extra: &[&str]) -> (String, Vec<String>, Option<i32>) {
    let out = opledger()
        .arg("compare")
        .arg(a)
        .arg(b)
        .args(extra)
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let header = text
        .lines()
        .position(|l| l.trim_start().starts_with("band ("))
        .unwrap_or_else(|| {
            panic!(
                "no table in\n{text}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let bands = text
        .lines()
        .skip(header + 1)
        .map(|l| l.split_whitespace().next().unwrap_or("").to_string())
        .take_while(|b| b != "total" && !b.is_empty())
        .collect();
    (text, bands, out.status.code())
}

#[test]
fn compare_ranks_two_gpu_imports_by_device_time_on_the_device_clock() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (a, _) = import(dir.path(), "a", HAND, &[]);
    let (b, _) = import(dir.path(), "b", &engine_b(), &[]);

    // both have device time: the device's clock by default, said in the header
    let (text, bands, code) = compare(&a, &b, &[]);
    assert_eq!(code, Some(0), "{text}");
    assert!(text.contains("clock: device"), "{text}");
    assert!(text.contains("band (device ms/token)"), "{text}");
    // device: A's attention 25 µs a token at the median against B's 5 (A behind by 0.0200);
    // every other band the same on both: attention ranks first, A would gain
    // 0.115 / (0.115 - 0.020) = 1.211x by matching B in it
    assert_eq!(bands[0], "attention", "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("attention"))
        .unwrap();
    let w = words(row);
    assert!(w.starts_with("attention 0.0250 0.0050 +0.0200 b"), "{row}");
    assert!(w.contains("A 1.211x"), "{row}");
    let total = words(
        text.lines()
            .find(|l| l.trim_start().starts_with("total"))
            .unwrap(),
    );
    assert!(total.starts_with("total 0.1150 0.0950 +0.0200"), "{total}");
    let (explicit, explicit_bands, _) = compare(&a, &b, &["--clock", "device"]);
    assert_eq!(explicit, text);
    assert_eq!(explicit_bands, bands);

    // host: attention is even (the spans are the same); other ranks first, A behind by
    // ((71 + 80) - (71 + 40)) / 2 µs = 0.0200 ms/token; dense_ffn last, A ahead by
    // ((55 + 20) - (55 + 60)) / 2 = -0.0200
    let (host, host_bands, _) = compare(&a, &b, &["--clock", "host"]);
    assert!(host.contains("clock: host"), "{host}");
    assert_eq!(
        host_bands.first().map(String::as_str),
        Some("other"),
        "{host}"
    );
    assert_eq!(
        host_bands.last().map(String::as_str),
        Some("dense_ffn"),
        "{host}"
    );
    let row = words(
        host.lines()
            .find(|l| l.trim_start().starts_with("attention"))
            .unwrap(),
    );
    assert!(
        row.starts_with("attention 0.0255 0.0255 +0.0000 even"),
        "{row}"
    );
    assert_ne!(host_bands, bands);

    // JSON says which clock
    let out = opledger()
        .arg("compare")
        .arg(&a)
        .arg(&b)
        .arg("--json")
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(j["ledger"]["clock"], "device");

    // a run without device time: the host's clock by default, refused on the device's
    let cpu_trace = HAND
        .lines()
        .filter(|l| !l.contains("\"pid\":0,"))
        .collect::<Vec<_>>()
        .join("\n")
        .replace("},\n]", "}\n]");
    let (cpu, _) = import(dir.path(), "cpu", &cpu_trace, &[]);
    assert!(!std::fs::read_to_string(cpu.join("import.json"))
        .unwrap()
        .contains("\"device\""));
    let (text, _, _) = compare(&a, &cpu, &[]);
    assert!(text.contains("clock: host"), "{text}");
    opledger()
        .arg("compare")
        .arg(&a)
        .arg(&cpu)
        .args(["--clock", "device"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(format!(
            "--clock device: {} holds no device time",
            cpu.display()
        )));
}

#[test]
fn an_import_without_its_model_says_not_recorded_instead_of_zeros() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (run, _) = import(dir.path(), "gpu", HAND, &[]);
    const NR: &str = "not recorded (imported without --model)";
    let (html, _) = render(&run, "html");
    for key in [
        "file",
        "size",
        "BLAKE3",
        "layers",
        "layer kinds",
        "embedding",
        "vocabulary",
    ] {
        assert!(
            html.contains(&format!("<tr><th>{key}</th><td>{NR}</td></tr>")),
            "{key} is not said to be not recorded"
        );
    }
    for zero in ["0.00 GiB", "(0 bytes)", "<td>0 ()</td>", "dense FFN"] {
        assert!(!html.contains(zero), "the HTML shows '{zero}'");
    }
    // no census table: one line saying why
    let census = &html[html.find("<section id=\"census\">").unwrap()..];
    let census = &census[..census.find("</section>").unwrap()];
    assert!(!census.contains("<table"), "{census}");
    assert!(
        census.contains(&format!("No census: the model was {NR}")),
        "{census}"
    );

    let (text, _) = render(&run, "text");
    assert!(text.contains(&format!("layers: {NR}")), "{text}");
    let (md, _) = render(&run, "md");
    // the bench table: size not recorded, params unknown (spans carry no weights), not 0
    let bench = md.lines().nth(2).unwrap();
    assert!(
        words(&bench.replace('|', " ")).starts_with("gpu.json not recorded -"),
        "{bench}"
    );
    let (csv, _) = render(&run, "csv");
    let row: Vec<&str> = csv.lines().nth(1).unwrap().split(',').collect();
    assert_eq!((row[1], row[2]), ("", ""), "size and params: {csv}");
    let (sql, _) = render(&run, "sql");
    let run_row = sql
        .lines()
        .find(|l| l.starts_with("INSERT OR IGNORE INTO opledger_runs"))
        .unwrap();
    assert!(
        run_row.contains("'gpu.json', NULL, NULL, NULL, 'unknown (imported without --model)'"),
        "{run_row}"
    );
}

/// A Kineto-shaped trace of `steps` steps, each 100 µs on the host: the step's own 50 µs, an MLP
/// module of 50 µs holding `aten::mm` (28 µs, its launch 4 µs) whose GEMM runs `kernel_us` on
/// the device (linked by its correlation). Host per step: other 50, dense_ffn 50 µs; device:
/// dense_ffn `kernel_us`.
fn mlp_steps(steps: u32, kernel_us: u32) -> String {
    let mut cpu = Vec::new();
    let mut gpu = Vec::new();
    for i in 0..steps {
        let t = 1000 * i;
        let c = 100 + i;
        cpu.push(format!(
            r#"{{"ph":"X","cat":"user_annotation","name":"ProfilerStep#{i}","pid":100,"tid":100,"ts":{t},"dur":100,"args":{{}}}}"#
        ));
        cpu.push(format!(
            r#"{{"ph":"X","cat":"python_function","name":"nn.Module: LlamaMLP_0","pid":100,"tid":100,"ts":{},"dur":50,"args":{{}}}}"#,
            t + 10
        ));
        cpu.push(format!(
            r#"{{"ph":"X","cat":"cpu_op","name":"aten::mm","pid":100,"tid":100,"ts":{},"dur":28,"args":{{}}}}"#,
            t + 12
        ));
        cpu.push(format!(
            r#"{{"ph":"X","cat":"cuda_runtime","name":"cudaLaunchKernel","pid":100,"tid":100,"ts":{},"dur":4,"args":{{"correlation":{c}}}}}"#,
            t + 14
        ));
        gpu.push(format!(
            r#"{{"ph":"X","cat":"kernel","name":"gemm","pid":0,"tid":7,"ts":{},"dur":{kernel_us},"args":{{"correlation":{c},"stream":7}}}}"#,
            t + 20
        ));
    }
    cpu.extend(gpu);
    format!(r#"{{"traceEvents":[{}]}}"#, cpu.join(",\n"))
}

#[test]
fn compare_fail_above_gates_the_device_clock_on_each_steps_device_time() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    // six steps each: A's GEMM 50 µs, B's 30 µs; the host spans are the same
    let (a, code) = import(dir.path(), "a", &mlp_steps(6, 50), &[]);
    assert_eq!(code, Some(0));
    let (b, _) = import(dir.path(), "b", &mlp_steps(6, 30), &[]);
    // device: dense_ffn 0.0500 against 0.0300 ms/token in every step, 66.7 % slower, its six
    // steps all above B's six (one ordering in C(12, 6) = 924: p 0.0011, below 0.05 / 2 bands):
    // the gate fails it, exit 6
    let out = opledger()
        .arg("compare")
        .arg(&a)
        .arg(&b)
        .args(["--fail-above", "5"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(6), "{text}");
    let row = words(
        text.lines()
            .find(|l| l.trim_start().starts_with("dense_ffn"))
            .unwrap(),
    );
    assert!(
        row.starts_with("dense_ffn 0.0500 0.0300 +0.0200 b"),
        "{row}"
    );
    assert!(text.contains("+66.7 %"), "{text}");
    // host: the same spans on both (other 0.0500, dense_ffn 0.0500 a token): nothing regressed
    opledger()
        .arg("compare")
        .arg(&a)
        .arg(&b)
        .args(["--fail-above", "5", "--clock", "host"])
        .assert()
        .code(0);
}
