//! The ledger on real engines: llama.cpp against candle on a tiny qwen3moe, by share x wall and
//! by in-graph replay; replays leave the outputs bit-identical, the method's validations decide
//! whether the replay column is reliable and a failed one fails the run; `compare` refuses runs
//! that did different work.

use assert_cmd::Command;
use predicates::prelude::*;

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
fn replay_keeps_outputs_and_a_failed_validation_fails_the_run() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let output = opledger()
        .args(crate::runs::LEDGER_REPLAY)
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("ledger"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    let r: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no ledger on stdout ({e}): {stderr}"));
    let rows = r["ledger"]["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "attention, projections, moe, other");
    // sorted by gap, largest first
    let gaps: Vec<f64> = rows
        .iter()
        .map(|x| x["gap_ms_per_token"].as_f64().unwrap())
        .collect();
    assert!(gaps.windows(2).all(|w| w[0] >= w[1]), "{gaps:?}");
    // A is candle, B llama.cpp. Whether a tiny run on two shared cores passes the validations
    // depends on the machine's noise; what must hold every time: a side is reliable exactly when
    // each of its validations is within its bound, and the run exits 3 (a check failed) exactly
    // when a side is not, naming each failed validation.
    let mut any_unreliable = false;
    let notes = r["notes"].to_string();
    // candle offers no replay, and says why
    assert!(r["replay_a"].is_null(), "{}", r["replay_a"]);
    assert!(
        notes.contains("candle: no in-graph replay (a replayed op pays a cost once per node"),
        "{notes}"
    );
    for (side, letter) in [("replay_a", "A"), ("replay_b", "B")] {
        let rr = &r[side];
        if rr.is_null() {
            continue;
        }
        assert_eq!(
            rr["outputs_identical"], true,
            "{side}: a replay changed the logits"
        );
        let checks = rr["checks"].as_array().unwrap();
        let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(
            names,
            ["replay-all", "sum-of-bands", "k-scaling", "outputs"]
        );
        let reliable = rr["reliable"].as_bool().unwrap();
        assert_eq!(
            reliable,
            checks.iter().all(|c| c["pass"] == true),
            "{side}: {checks:?}"
        );
        any_unreliable |= !reliable;
        for c in checks.iter().filter(|c| c["pass"] == false) {
            let line = format!(
                "check failed: replay {letter} {}",
                c["name"].as_str().unwrap()
            );
            assert!(stderr.contains(&line), "{line} not on stderr: {stderr}");
        }
        // the k-scaling check reads the spread of the per-replay costs, not the line alone
        let per: Vec<f64> = rr["scaling_ms_per_replay"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[1].as_f64().unwrap())
            .collect();
        assert_eq!(per.len(), 3);
        let spread = rr["scaling_spread"].as_f64().unwrap_or(f64::INFINITY);
        if per.iter().all(|&x| x > 0.0) {
            let (lo, hi) = per
                .iter()
                .fold((f64::MAX, 0.0f64), |(a, b), &x| (a.min(x), b.max(x)));
            assert!(
                (spread - hi / lo).abs() < 1e-9,
                "{side}: {per:?} spread {spread}"
            );
        }
        if spread > opledger_core::replay::SCALING_SPREAD_MAX {
            assert!(!reliable, "{side}: per-replay costs {per:?} pass");
        }
        for b in rr["bands"].as_array().unwrap() {
            let k = b["k"].as_u64().unwrap();
            assert!([4, 16, 64].contains(&k), "{side}: k {k} for {}", b["band"]);
        }
    }
    // llama.cpp computes clones in rounds: the launch of a round is measured and stated; work
    // too small to replay measurably is skipped before measuring, with its figures
    if r["replay_b"].is_null() {
        assert!(
            notes.contains(
                "llama.cpp: no in-graph replay of this work (too small to replay measurably against this machine's noise: "
            ),
            "{notes}"
        );
    } else {
        assert!(r["replay_b"]["round_cost_us"].as_f64().unwrap().is_finite());
    }
    assert_eq!(
        output.status.code(),
        Some(if any_unreliable { 3 } else { 0 }),
        "{stderr}"
    );
    let folder = dir.path().join("ledger");
    let csv = std::fs::read_to_string(folder.join("ledger.csv")).unwrap();
    assert_eq!(csv.lines().count(), 1 + rows.len());
    let md = std::fs::read_to_string(folder.join("ledger.md")).unwrap();
    assert!(md.contains("the largest gap") || md.contains("A is ahead or even"));
    let table = std::fs::read_to_string(folder.join("table.txt")).unwrap();
    for (side, col) in [("replay_a", "A replay"), ("replay_b", "B replay")] {
        if r[side].is_null() {
            continue;
        }
        let marked = format!("{col} (unreliable)");
        let unreliable = r[side]["reliable"] == false;
        assert_eq!(md.contains(&marked), unreliable, "{md}");
        assert_eq!(table.contains(&marked), unreliable, "{table}");
    }
}

/// In-graph replay never changes what the graph computes: on llama.cpp, each band's nodes
/// replayed k times, and every replayable node at once, return the logits of a plain FUSED run
/// bit for bit. Asked of the engine directly, past the plan that may skip a tiny model's replay
/// for the machine's noise, so this is asserted whatever the machine's load (the `ledger` test
/// above can find both sides skipped or refused).
#[test]
fn llama_cpp_replays_return_the_logits_of_a_plain_run_bit_for_bit() {
    use opledger_core::engine::{Mode, Work};
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let file = opledger_app::model::ModelFile::open(&model).unwrap();
    let rules = opledger_core::band::BandRules::builtin(&file.arch.arch).unwrap();
    // llama.cpp as `--engine llama.cpp` opens it: the bundled worker
    let mut e = crate::llama_cpp(&model, &opledger_app::engines::EngineSettings::new(2));
    e.prepare(&Work::prefill(64, 0)).unwrap();
    let plain = e.run(Mode::Fused).unwrap();
    let graph = e.graph().unwrap();
    let a = opledger_core::band::Categoriser::new(&rules, &file.arch).categorise(&graph);
    let replayable: Vec<bool> = graph.iter().map(|n| n.is_working() && !n.inplace).collect();
    let none = vec![false; graph.len()];
    let r = e.replayer().unwrap();
    let mut runs = vec![(
        "baseline".to_string(),
        r.replay(&replayable, &none, 0).unwrap(),
    )];
    for band in rules.bands_in(&a) {
        let mask: Vec<bool> = a
            .iter()
            .zip(&replayable)
            .map(|(x, &ok)| ok && x.band == band)
            .collect();
        assert!(mask.iter().any(|&m| m), "no replayable node in {band}");
        runs.push((band.clone(), r.replay(&replayable, &mask, 4).unwrap()));
    }
    runs.push((
        "every node".into(),
        r.replay(&replayable, &replayable, 2).unwrap(),
    ));
    assert!(
        runs.len() >= 5,
        "the baseline, 3 or more bands and replay-all"
    );
    for (what, t) in &runs {
        assert_eq!(
            t.output_hash, plain.output_hash,
            "{what}: a replay changed the logits"
        );
    }
}

#[test]
fn compare_puts_two_stored_runs_side_by_side_and_refuses_different_work() {
    let _machine = crate::machine::shared();
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
    // two runs of 2 cycles: no band could fail the gate at 0.05 / 4 bands, so it is refused
    opledger()
        .args(["compare", "--fail-above", "5"])
        .arg(&a)
        .arg(&b)
        .assert()
        .code(2)
        .stderr(predicates::str::contains(
            "the regression gate cannot fail with 2 cycle(s) of the new run and 2 of the baseline",
        ));
    // the same architecture, other weights: another model, named on both sides
    let other = dir.path().join("tq3-seed-7.gguf");
    opledger()
        .args([
            "synth",
            "--preset",
            "tiny-qwen3moe",
            "--seed",
            "7",
            "-q",
            "-o",
        ])
        .arg(&other)
        .assert()
        .success();
    let d = dir.path().join("d");
    opledger()
        .args(["profile", "-p", "64", "-r", "2", "-t", "2", "-q", "-m"])
        .arg(&other)
        .arg("-o")
        .arg(&d)
        .assert()
        .success();
    opledger()
        .arg("compare")
        .arg(&a)
        .arg(&d)
        .assert()
        .code(2)
        .stderr(
            predicates::str::contains("the runs did not do the same work: model tq3.gguf (BLAKE3 ")
                .and(predicates::str::contains("vs tq3-seed-7.gguf (BLAKE3 "))
                .and(predicates::str::contains("--force")),
        );
    opledger()
        .args(["compare", "--force"])
        .arg(&a)
        .arg(&d)
        .assert()
        .success()
        .stdout(predicates::str::contains(
            "FORCED: the runs did different work (model tq3.gguf",
        ));
}

/// `ledger` on the tiny qwen3moe with `args`; its JSON report, stderr and exit code.
fn tiny_ledger(args: &[&str]) -> (serde_json::Value, String, Option<i32>) {
    let dir = tempfile::tempdir().unwrap();
    let model = tiny(dir.path());
    let output = opledger()
        .arg("ledger")
        .args(args)
        .args(["-t", "2", "--json", "-m"])
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("ledger"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    let r: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|e| panic!("no ledger on stdout ({e}): {stderr}"));
    (r, stderr, output.status.code())
}

#[test]
fn candle_refuses_replay_by_capability_and_says_why_instead_of_failing_its_validations() {
    // candle's replays paid a cost per replayed node that does not grow with k (36.3, 22.6,
    // 18.1 ms per replay at k = 1, 2, 4) and failed their three validations on every run
    let _machine = crate::machine::shared();
    let (r, stderr, code) = tiny_ledger(&[
        "--engines",
        "llama.cpp,candle",
        "-p",
        "128",
        "-r",
        "1",
        "--replay-cycles",
        "2",
    ]);
    assert!(
        r["replay_b"].is_null(),
        "candle replayed: {}",
        r["replay_b"]
    );
    let why = opledger_candle::REPLAY_REFUSAL;
    let note = format!("candle: no in-graph replay ({why})");
    let notes: Vec<&str> = r["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(notes.contains(&note.as_str()), "{notes:?}");
    // printed as it happens, not only recorded
    assert!(stderr.contains(&note), "{stderr}");
    // no validation of candle's, so none failed; the run's exit is llama.cpp's alone
    assert!(!stderr.contains("replay B"), "{stderr}");
    let a_failed = r["replay_a"]["reliable"] == false;
    assert_eq!(code, Some(if a_failed { 3 } else { 0 }), "{stderr}");
}

#[test]
fn work_too_small_to_replay_is_found_before_measuring_not_after_the_table() {
    // the tiny qwen3moe's 64-token chunk: llama.cpp's bands take tens of µs each; the probe's
    // noise decides before any cycle what k and scale each can be measured at, skips a band or
    // the whole replay with its figures, and never ends in a failed validation for want of work
    let _machine = crate::machine::shared();
    let (r, stderr, code) = tiny_ledger(&["-p", "64", "-r", "1"]);
    let notes = r["notes"].to_string();
    let rr = &r["replay_b"];
    if rr.is_null() {
        assert!(
            notes.contains(
                "llama.cpp: no in-graph replay of this work (too small to replay measurably against this machine's noise: "
            ),
            "{notes}"
        );
    } else {
        // The work was sized for the noise the probe measured before any cycle: every measured
        // band's expected increment, and replay-all's, clear that noise ten times over
        // (NOISE_SHARE_MAX). Whether the cycles then kept to it is the machine's affair: a burst
        // on shared cores during the replay breaks the run's own 1 +- 0.15 bounds (replay-all /
        // baseline 0.782 once alone on the machine, 0.721 with a sum of bands 1.337 in one CI
        // run), and then the run must say so, check by check, and exit 3. So the test asserts
        // what the figures mean, recomputed from the stored milliseconds, and never that the
        // machine was quiet; the method's accuracy on a real engine is a claim of
        // `scripts/acceptance` (replay-tiny, replay-gemma3), its validations' bounds and plan
        // are core::replay's tests on scripted engines.
        use opledger_core::replay::{ReplayResult, NOISE_SHARE_MAX};
        let r: ReplayResult = serde_json::from_value(rr.clone()).unwrap();
        let noise = r.noise_ms;
        assert!(noise >= 0.0 && r.scale >= 1 && !r.bands.is_empty());
        for b in &r.bands {
            let cleared = b.expected_ms * b.k as f64 * NOISE_SHARE_MAX;
            assert!(cleared >= noise, "{b:?} against noise {noise}");
        }
        let expected_all: f64 = r.bands.iter().map(|b| b.expected_ms).sum::<f64>()
            + r.skipped.iter().map(|s| s.expected_ms).sum::<f64>();
        assert!(
            expected_all * r.scale as f64 * NOISE_SHARE_MAX >= noise,
            "replay-all {expected_all} x {} against noise {noise}",
            r.scale
        );
        for s in &r.skipped {
            assert!(s.reason.contains("against noise of"), "{}", s.reason);
        }
        // each validation's verdict is its stored figure against the bound written here (the
        // README's: 1 ± 0.15, 1 ± 0.15, per-replay costs within a factor 1.5 and a line of R²
        // 0.9 or more), recomputed from the stored milliseconds, not core's own judgement of it
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
        let sum: f64 = r.bands.iter().map(|b| b.ms).sum();
        assert!(close(sum, r.sum_of_bands_ms), "{sum} {}", r.sum_of_bands_ms);
        let all = r.replay_all_ms / r.baseline_work_ms;
        let sums = sum / r.sum_reference_ms;
        assert!(close(all, r.replay_all_over_baseline), "{all}");
        assert!(close(sums, r.sum_over_replay_all), "{sums}");
        let per: Vec<f64> = r.scaling_ms_per_replay.iter().map(|p| p.1).collect();
        let (lo, hi) = per
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                (a.min(x), b.max(x))
            });
        let scales = per.len() == 3 && lo > 0.0 && hi / lo <= 1.5 && r.scaling_r2 >= 0.9;
        let want = [
            ("replay-all", (all - 1.0).abs() <= 0.15),
            ("sum-of-bands", (sums - 1.0).abs() <= 0.15),
            ("k-scaling", scales),
            ("outputs", r.outputs_identical),
        ];
        let got: Vec<(&str, bool)> = r.checks.iter().map(|c| (c.name.as_str(), c.pass)).collect();
        assert_eq!(got, want, "{:?}", r.checks);
        // no load changes the logits
        assert!(r.outputs_identical, "{:?}", r.checks);
        // unreliable is said, each failed check printed with its figure, and the exit is 3
        assert_eq!(r.reliable, r.failed_checks().is_empty());
        for c in r.checks.iter().filter(|c| !c.pass) {
            let line = format!("check failed: replay B {}: {}", c.name, c.detail);
            assert!(stderr.contains(&line), "{line}\n{stderr}");
        }
        assert_eq!(code, Some(if r.reliable { 0 } else { 3 }), "{stderr}");
        eprintln!(
            "noise {noise:.3} ms, scale {}, k per band {}, skipped {}, replay-all / baseline {all:.3}, sum / reference {sums:.3}",
            r.scale,
            r.bands
                .iter()
                .map(|b| format!("{} {}", b.band, b.k))
                .collect::<Vec<_>>()
                .join(", "),
            r.skipped
                .iter()
                .map(|s| s.band.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        );
        return;
    }
    assert_eq!(code, Some(0), "{stderr}");
}
