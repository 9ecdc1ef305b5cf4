//! The ledger on real engines: llama.cpp against candle on a tiny qwen3moe, by share x wall and
//! by in-graph replay; replays leave the outputs bit-identical and the method's three
//! validations hold; `compare` refuses runs that did different work.

use assert_cmd::Command;

/// The tests of this file time engines: one at a time, not beside each other on two cores.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

fn tiny(dir: &std::path::Path) -> std::path::PathBuf {
    let model = dir.join("tq3.gguf");
    opledger()
        .args(["synth", "--preset", "tiny-qwen3moe", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    model
}

#[test]
fn replay_keeps_outputs_and_its_validations_hold_on_both_engines() {
    let _one_at_a_time = serial();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let out = opledger()
        .args([
            "ledger",
            "-r",
            "3",
            "-k",
            "4",
            "--replay-cycles",
            "7",
            "-t",
            "2",
            "--json",
            "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("ledger"))
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let r: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let rows = r["ledger"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "attention, projections, moe, other");
    // sorted by gap, largest first
    let gaps: Vec<f64> = rows
        .iter()
        .map(|x| x["gap_ms_per_token"].as_f64().unwrap())
        .collect();
    assert!(gaps.windows(2).all(|w| w[0] >= w[1]), "{gaps:?}");
    // A is candle, B llama.cpp. llama.cpp replays a clone of the ggml node into a scratch
    // buffer: its validations are held tight. candle replays the op's closure, whose cost also
    // holds the allocator's work for a fresh output, and runs of ~100 ms on two shared cores
    // wander by tens of ms: its bounds are loose, still failing a replay that costs nothing or
    // several times the op.
    // (the per-replay cost at k = 1 against k = 4 is held for llama.cpp only: a candle replay at
    // k = 1 adds ~20 ms to a run that wanders by ~30 ms, so candle's k-scaling is judged by the
    // line through k = 1, 2, 4 alone)
    for (side, all_in, sum_in, r2_min, max_spread) in [
        ("replay_a", 0.3..1.7, 0.4..3.0, 0.8, f64::INFINITY),
        ("replay_b", 0.7..1.3, 0.75..1.3, 0.9, 1.8),
    ] {
        let rr = &r[side];
        assert_eq!(
            rr["outputs_identical"], true,
            "{side}: a replay changed the logits"
        );
        let all = rr["replay_all_over_baseline"].as_f64().unwrap();
        assert!(all_in.contains(&all), "{side}: replay-all / baseline {all}");
        let sum = rr["sum_over_replay_all"].as_f64().unwrap();
        assert!(
            sum_in.contains(&sum),
            "{side}: sum of bands / replay-all {sum}"
        );
        let per: Vec<f64> = rr["scaling_ms_per_replay"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap())
            .collect();
        assert_eq!(per.len(), 3);
        let (lo, hi) = per
            .iter()
            .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
        assert!(
            lo > 0.0 && hi / lo < max_spread,
            "{side}: per-replay cost at k = 1, 2, 4: {per:?}"
        );
        let r2 = rr["scaling_r2"].as_f64().unwrap();
        assert!(r2 > r2_min, "{side}: increments against k, R² {r2}");
        for b in rr["bands"].as_array().unwrap() {
            let k = b["k"].as_u64().unwrap();
            assert!([4, 16, 64].contains(&k), "{side}: k {k} for {}", b["band"]);
        }
    }
    let folder = dir.path().join("ledger");
    let csv = std::fs::read_to_string(folder.join("ledger.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + rows.len());
    let md = std::fs::read_to_string(folder.join("ledger.md")).unwrap();
    assert!(md.contains("the largest gap") || md.contains("A is ahead or even"));
}

#[test]
fn compare_puts_two_stored_runs_side_by_side_and_refuses_different_work() {
    let _one_at_a_time = serial();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let profile = |name: &str, depth: &str| {
        let run = dir.path().join(name);
        opledger()
            .args([
                "profile", "-p", "64", "-r", "2", "-t", "2", "-q", "-d", depth, "-m",
            ])
            .arg(&model)
            .arg("-o")
            .arg(&run)
            .assert()
            .success();
        run
    };
    let a = profile("a", "0");
    let b = profile("b", "0");
    let c = profile("c", "64");
    let out = opledger()
        .args(["compare", "--json"])
        .arg(&a)
        .arg(&b)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let r: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(r["ledger"]["rows"].as_array().unwrap().len(), 4);
    opledger()
        .arg("compare")
        .arg(&a)
        .arg(&c)
        .assert()
        .code(2)
        .stderr(predicates::str::contains("depth 0 vs 64"));
    opledger()
        .args(["compare", "--force"])
        .arg(&a)
        .arg(&c)
        .assert()
        .success();
}
