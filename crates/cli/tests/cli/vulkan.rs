//! The device path, run: llama.cpp's Vulkan backend on Mesa's software Vulkan device (lavapipe,
//! `llvmpipe`, which computes on the CPU), through a worker built from the vendored llama.cpp
//! with `-DGGML_VULKAN=ON` (`scripts/build-worker`, which builds a copy of the tree with the
//! `VK_EXT_layer_settings` guard when the installed Vulkan headers need it; through ccache;
//! built once per run of this test binary). The tiny llama preset with `-g 99` on `Vulkan0`:
//! a profile (every node's device, coverage 100 %, the scheduler's copies as TRANSFER nodes in
//! `network`, each device's isolation, outputs bit-identical across modes, the device's own
//! clock per band beside the host's), a sweep over two depths, and an A/B of the CPU worker
//! against the Vulkan worker through the output gate; and the tiny MoE, whose modes differ only
//! by ggml-vulkan's fusions, within the outputs check's stated device bound (a profile with and
//! without the fusions, and a sweep); and the ledger, replaying on the device. Nothing here
//! asserts a timing: lavapipe is
//! 50-200x slower than the CPU backend and the machine is shared; the ratios of the two clocks
//! are printed, never bounded.
//!
//! The tiny model, not Gemma 3 270M: one Gemma profile on lavapipe takes minutes (3.4 minutes
//! for `-p 64 -r 3`), and the CI's budget (45 minutes on 2 cores, about 23 used) holds the
//! Vulkan build (up to 13 minutes cold) and these runs, not Gemma's as well.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use opledger_core::profile::{CheckStatus, ProfileRaw, ProfileSummary};
use opledger_core::split::TRANSFER_OP;
use serde_json::Value;

/// ggml's CPU options as cargo builds the bundled worker, after Vulkan's.
const OPTIONS: [&str; 6] = [
    "-DGGML_VULKAN=ON",
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
];

/// The environment of a Vulkan worker's runs: lavapipe is a CPU-type device, which ggml-vulkan
/// skips unless it is named; the perf logger times every op on the device's clock.
const ENV: [(&str, &str); 2] = [
    ("GGML_VK_VISIBLE_DEVICES", "0"),
    ("GGML_VK_PERF_LOGGER", "1"),
];

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_opledger"))
}

/// The Vulkan worker, built once per run of the test binary.
fn worker() -> &'static Path {
    static W: OnceLock<PathBuf> = OnceLock::new();
    W.get_or_init(|| {
        // minutes of both cores cold; ccache makes a second build of the same tree seconds
        let _machine = crate::machine::alone();
        let t0 = std::time::Instant::now();
        let mut c = Command::new(repo().join("scripts/build-worker"));
        c.arg("--vendored").arg("--").args(OPTIONS);
        if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
            c.env("CARGO_TARGET_DIR", t);
        }
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "building the Vulkan worker failed (scripts/install-deps installs the Vulkan packages): {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let path = PathBuf::from(
            String::from_utf8(o.stdout)
                .unwrap()
                .lines()
                .last()
                .unwrap()
                .trim(),
        );
        let manifest: Value = serde_json::from_str(
            &std::fs::read_to_string(path.with_file_name("opledger-llama-worker.json")).unwrap(),
        )
        .unwrap();
        eprintln!(
            "vulkan: the worker built in {:.0} s (its manifest: {} s of configure and build, ccache {}, the VK_EXT_layer_settings guard on a copy: {})",
            t0.elapsed().as_secs_f64(),
            manifest["build_seconds"],
            manifest["ccache"],
            manifest["vulkan_layer_settings_guard"]
        );
        path
    })
}

/// `opledger` with the Vulkan worker's environment.
fn opledger() -> Command {
    let mut c = Command::new(bin());
    c.envs(ENV);
    c
}

fn run_ok(c: &mut Command) -> std::process::Output {
    let o = c.output().unwrap();
    assert!(
        o.status.success(),
        "exit {:?}: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// A profile of `model` on Vulkan0 (`-p chunk -r 2 -t 2 -g 99`, no noise gate) into `run`,
/// with `env` added to the worker's environment: its summary (from stdout) and raw data.
fn vulkan_profile(
    w: &Path,
    model: &Path,
    chunk: &str,
    run: &Path,
    env: &[(&str, &str)],
) -> (ProfileSummary, ProfileRaw) {
    let t0 = std::time::Instant::now();
    let o = run_ok(
        opledger()
            .envs(env.iter().copied())
            .args(["profile", "-p", chunk, "-r", "2", "-t", "2", "-g", "99"])
            .args(["--no-noise-gate", "--json", "--llama-worker"])
            .arg(w)
            .arg("-m")
            .arg(model)
            .arg("-o")
            .arg(run),
    );
    eprintln!(
        "vulkan: profile -p {chunk} -r 2 -g 99 of {} {env:?} in {:.1} s",
        model.display(),
        t0.elapsed().as_secs_f64()
    );
    let summary: ProfileSummary = serde_json::from_slice(&o.stdout).unwrap();
    (summary, ProfileRaw::read(&run.join("raw.json")).unwrap())
}

#[test]
fn a_profile_on_vulkan0_places_every_node_bands_the_copies_and_sets_both_clocks_side_by_side() {
    let w = worker();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::rpc::tiny_llama(dir.path());
    let run = dir.path().join("profile");
    let (summary, raw) = vulkan_profile(w, &model, "32", &run, &[]);
    let file = opledger_app::model::ModelFile::open(&model).unwrap();
    let rules = opledger_core::band::BandRules::builtin(&file.arch.arch).unwrap();
    let assignments =
        opledger_core::band::Categoriser::new(&rules, &file.arch).categorise(&raw.graph);
    crate::assert_profile_is_sound(&raw, &assignments, &summary);

    // every node has its device, the model's layers on Vulkan0
    assert!(
        raw.graph.iter().all(|n| n.device.is_some()),
        "a node without its device"
    );
    let on = |d: &str| {
        raw.graph
            .iter()
            .filter(|n| n.device.as_deref() == Some(d) && n.op != TRANSFER_OP)
            .count()
    };
    let vulkan = on("Vulkan0");
    assert!(vulkan > 0, "no node on Vulkan0");
    for n in raw.graph.iter().filter(|n| n.op != TRANSFER_OP) {
        for s in n.srcs.iter().flatten().filter(|s| s.is_weight) {
            if s.name.starts_with("blk.") {
                assert_eq!(
                    n.device.as_deref(),
                    Some("Vulkan0"),
                    "{} reads {}",
                    n.name,
                    s.name
                );
            }
        }
    }
    // the scheduler's copies between devices: TRANSFER nodes, all in the network band
    let transfers: Vec<usize> = raw
        .graph
        .iter()
        .enumerate()
        .filter(|(_, n)| n.op == TRANSFER_OP)
        .map(|(i, _)| i)
        .collect();
    for &i in &transfers {
        assert_eq!(assignments[i].band, "network", "{}", raw.graph[i].name);
    }
    let devices: Vec<&str> = summary.splits.iter().map(|r| r.device.as_str()).collect();
    eprintln!(
        "vulkan: {} nodes, {vulkan} on Vulkan0, {} on the CPU, {} transfers; splits {devices:?}; isolation per device {:?}",
        raw.graph.len(),
        on("CPU"),
        transfers.len(),
        summary.isolation_device_us
    );
    if summary.splits.len() > 1 {
        assert!(
            !transfers.is_empty(),
            "splits {devices:?} without a transfer"
        );
        let network = summary.band("network").expect("a network band");
        assert_eq!(network.nodes as usize, transfers.len());
    }
    // each device's isolation: measured, finite, for every device of the graph
    if summary.splits.len() > 1 {
        for d in &devices {
            let us = summary.isolation_device_us.get(*d).unwrap_or_else(|| {
                panic!("no isolation for {d}: {:?}", summary.isolation_device_us)
            });
            assert!(us.is_finite() && *us >= 0.0, "{d}: {us}");
        }
    } else {
        assert!(summary.isolation_us.is_finite() && summary.isolation_us >= 0.0);
    }
    // the device's own clock: every working node on Vulkan0 timed by the device in every
    // TIMED cycle, each band's figures on both clocks present, finite and positive (the ratio
    // is printed, never bounded)
    let d = summary
        .device_clock
        .as_ref()
        .expect("a Vulkan profile with GGML_VK_PERF_LOGGER has the device's clock");
    assert!(d.nodes_expected > 0);
    assert_eq!(
        d.nodes_matched, d.nodes_expected,
        "not timed: {:?}",
        d.unmatched
    );
    let c = summary
        .checks
        .iter()
        .find(|c| c.name == "device clock")
        .unwrap();
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    assert!(d.bands.iter().any(|b| b.nodes > 0));
    for b in d.bands.iter().filter(|b| b.nodes > 0) {
        for (what, v) in [
            ("host TIMED", b.host_timed_ms_per_token.median),
            ("device TIMED", b.device_timed_ms_per_token.median),
            ("host / device", b.timed_ratio),
        ] {
            assert!(v.is_finite() && v > 0.0, "{} {what}: {v}", b.band);
        }
        eprintln!(
            "vulkan: {:<12} {:>3} nodes  host TIMED {:.4} ms/token, device TIMED {:.4} ({:.2}x); band {:.4}, device FUSED {:.4} ({:.2}x)",
            b.band,
            b.nodes,
            b.host_timed_ms_per_token.median,
            b.device_timed_ms_per_token.median,
            b.timed_ratio,
            b.ms_per_token,
            b.device_fused_ms_per_token.median,
            b.fused_ratio
        );
    }
    assert!(d.device_fused_ms_per_token.is_finite() && d.device_fused_ms_per_token > 0.0);
    for f in ["summary.md", "table.txt"] {
        let text = std::fs::read_to_string(run.join(f)).unwrap_or_default();
        assert!(text.contains("host / device"), "{f} lacks the device clock");
    }
    // one backend, its modes: the same logits bit for bit
    assert!(summary.outputs_identical);
    let c = summary.checks.iter().find(|c| c.name == "outputs").unwrap();
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    crate::assert_report_reproduces_summary(&run);
}

#[test]
fn the_graph_on_vulkan0_names_every_node_s_device_and_bands_the_transfer() {
    let w = worker();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::rpc::tiny_llama(dir.path());
    let o = run_ok(
        opledger()
            .args([
                "graph",
                "-p",
                "32",
                "-t",
                "2",
                "-g",
                "99",
                "--json",
                "--llama-worker",
            ])
            .arg(w)
            .arg("-m")
            .arg(&model),
    );
    let g: Value = serde_json::from_slice(&o.stdout).unwrap();
    let nodes = g["nodes"].as_array().unwrap();
    assert!(
        nodes.iter().all(|n| n["device"].is_string()),
        "a node without its device"
    );
    // the token embedding's lookup on the CPU (its weight there, its output in Vulkan0's pinned
    // host memory, which is the CPU's), everything after it on Vulkan0, one transfer between
    let device = |d: &str| nodes.iter().filter(|n| n["device"] == d).count();
    assert!(
        device("CPU") >= 1 && device("Vulkan0") > device("CPU"),
        "{}",
        g["nodes"]
    );
    let transfers: Vec<&Value> = nodes.iter().filter(|n| n["op"] == TRANSFER_OP).collect();
    assert!(!transfers.is_empty());
    for t in transfers {
        assert_eq!(t["band"], "network", "{t}");
        assert_eq!(t["device"], "CPU -> Vulkan0", "{t}");
    }
}

#[test]
fn a_sweep_on_vulkan0_measures_two_depths() {
    let w = worker();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::rpc::tiny_llama(dir.path());
    let run = dir.path().join("sweep");
    let t0 = std::time::Instant::now();
    run_ok(
        opledger()
            .args([
                "sweep",
                "-q",
                "-p",
                "32",
                "--max-depth",
                "32",
                "-r",
                "2",
                "-t",
                "2",
            ])
            .args(["-g", "99", "--llama-worker"])
            .arg(w)
            .arg("-m")
            .arg(&model)
            .arg("-o")
            .arg(&run),
    );
    eprintln!(
        "vulkan: sweep over depths 0 and 32 in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let depths: Vec<u64> = s["depths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["depth"].as_u64().unwrap())
        .collect();
    assert_eq!(depths, [0, 32]);
    for d in s["depths"].as_array().unwrap() {
        assert_eq!(d["coverage"], 1.0, "depth {}", d["depth"]);
    }
    crate::assert_report_reproduces_summary(&run);
}

#[test]
fn an_a_b_of_the_cpu_worker_against_the_vulkan_worker_passes_the_output_gate() {
    let w = worker();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::rpc::tiny_llama(dir.path());
    let out = dir.path().join("ab");
    let t0 = std::time::Instant::now();
    // A: the bundled worker (CPU); B: the Vulkan worker with every layer on Vulkan0. Across
    // backends the logits are not bit-identical: ggml-vulkan's matmul shaders accumulate in
    // another order and in fp16 where the device has it (lavapipe does), and the tiny preset's
    // random weights make the logits sensitive (measured here: max NMSE 1.7e-4, the same top-1
    // in every row). The gate's bound is test-backend-ops' MUL_MAT bound, 5e-4: the tolerance
    // llama.cpp itself grants a backend's matmul against the CPU's (llama-results' 1e-6 is for
    // one backend against itself)
    let o = Command::new(bin())
        .args([
            "ab",
            "-p",
            "32",
            "-r",
            "4",
            "-t",
            "2",
            "-g",
            "99",
            "--greedy-steps",
            "4",
        ])
        .args(["--max-nmse", "5e-4", "--no-noise-gate", "--json", "-m"])
        .arg(&model)
        .arg("--a")
        .arg("worker=bundled")
        .arg("--b")
        .arg(format!(
            "worker={},env:GGML_VK_VISIBLE_DEVICES=0",
            w.display()
        ))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let code = o.status.code().unwrap_or(-1);
    let r: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    let err = String::from_utf8_lossy(&o.stderr);
    eprintln!(
        "vulkan: ab of the CPU worker against the Vulkan worker in {:.1} s, exit {code}",
        t0.elapsed().as_secs_f64()
    );
    // faster, slower, no change or inconclusive: never refused by the gate, never failed
    assert!(code == 0 || code == 5, "exit {code}: {err}\n{r}");
    let g = &r["scenarios"][0]["outputs"];
    assert_eq!(g["passed"], true, "{g}");
    assert_eq!(g["positions"], 32, "{g}");
    assert_eq!(g["steps"], 4, "{g}");
    let nmse = g["max_nmse"].as_f64().unwrap();
    assert!(nmse.is_finite() && nmse <= 5e-4, "{g}");
    assert_eq!(g["top1_differs"], 0, "{g}");
    eprintln!(
        "vulkan: the output gate: max NMSE {nmse:e}, bit-identical {}",
        g["bit_identical"]
    );
    // each side is the worker it names
    let m: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    let set = &m["engine"]["settings"];
    assert_ne!(set["a.worker_blake3"], set["b.worker_blake3"], "{set}");
}

/// The tiny MoE (qwen35moe, the built-in default) on Vulkan0: ggml-vulkan fuses neighbouring
/// ops when it runs the graph whole (FUSED: RMS_NORM with MUL, the router's softmax and top-k,
/// among others) and cannot when each node is its own submission (TIMED), so the two modes'
/// logits differ in their last bits. The profile's outputs check compares them by NMSE under
/// the stated device bound and passes; with the fusions switched off
/// (`GGML_VK_DISABLE_FUSION=1`) the same profile is bit-identical across modes, which shows
/// the fusion is what differs. A sweep over two depths, with decode steps after each chunk,
/// compares its pairs the same way (flash
/// attention off: this model's attention at depth with flash attention crashes lavapipe, a
/// SIGSEGV inside `libvulkan_lvp.so`).
#[test]
fn the_tiny_moe_on_vulkan0_differs_across_modes_only_by_fusion_within_the_stated_bound() {
    let w = worker();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("tiny-qwen35moe.gguf");
    opledger_gguf::synthesize(
        &opledger_gguf::SynthOptions::new("tiny-qwen35moe"),
        &model,
        &mut |_, _| {},
    )
    .unwrap();
    let profile = |name: &str, env: &[(&str, &str)]| {
        let run = dir.path().join(name);
        let (s, raw) = vulkan_profile(w, &model, "16", &run, env);
        let c = s
            .checks
            .iter()
            .find(|c| c.name == "outputs")
            .unwrap()
            .clone();
        (s, raw, c, run)
    };
    let (s, raw, c, run) = profile("fused", &[]);
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);
    assert!(
        !s.outputs_identical,
        "the fused Vulkan kernels computed FUSED's logits bit for bit as TIMED's: the tolerance is no longer exercised here ({})",
        c.detail
    );
    // every distinct hash but the first compared, TIMED among them, within the bound
    let distinct: std::collections::BTreeSet<&String> =
        raw.output_hashes.values().flatten().collect();
    assert_eq!(raw.outputs_compared.len() + 1, distinct.len());
    assert!(raw.outputs_compared.iter().any(|m| m.mode == "timed"));
    let nmse = s.outputs_max_nmse.unwrap();
    assert!(
        nmse > 0.0 && nmse <= opledger_core::profile::DEVICE_MODES_MAX_NMSE,
        "{nmse}"
    );
    assert!(
        c.detail.contains("Vulkan0") && c.detail.contains("5e-4"),
        "{}",
        c.detail
    );
    let table = std::fs::read_to_string(run.join("table.txt")).unwrap();
    assert!(table.contains("within NMSE"), "{table}");
    eprintln!(
        "vulkan: tiny MoE, FUSED against TIMED: NMSE {nmse:.2e} ({})",
        c.detail
    );
    crate::assert_report_reproduces_summary(&run);

    let (s, raw, c, _) = profile("unfused", &[("GGML_VK_DISABLE_FUSION", "1")]);
    assert!(s.outputs_identical, "{}", c.detail);
    assert!(raw.outputs_compared.is_empty());
    assert_eq!(c.status, CheckStatus::Pass, "{}", c.detail);

    let run = dir.path().join("sweep");
    let t0 = std::time::Instant::now();
    run_ok(
        opledger()
            .args([
                "sweep",
                "-q",
                "-p",
                "16",
                "--max-depth",
                "16",
                "-n",
                "2",
                "-r",
                "2",
                "-t",
                "2",
            ])
            .args(["-g", "99", "--flash-attn", "off", "--llama-worker"])
            .arg(w)
            .arg("-m")
            .arg(&model)
            .arg("-o")
            .arg(&run),
    );
    eprintln!(
        "vulkan: sweep of the tiny MoE over depths 0 and 16, 2 decode steps after each chunk, in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let s: Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    let c = s["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "outputs")
        .unwrap();
    assert_eq!(c["status"], "pass", "{c}");
    assert!(
        c["detail"].as_str().unwrap().contains("not bit-identical"),
        "{c}"
    );
    // the decode steps' pairs were compared too (the last step's logits): no pair was left to
    // its hash, or the check would have failed; and some of them carry an NMSE
    let decoded: Vec<f64> = std::fs::read_dir(run.join("chunks"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with("-decode.bin"))
        .filter_map(|p| {
            opledger_core::sweep::ChunkRecord::decode(&std::fs::read(&p).unwrap(), "record")
                .unwrap()
                .outputs_nmse
        })
        .collect();
    eprintln!("vulkan: the decode pairs' NMSE: {decoded:?}");
    assert!(!decoded.is_empty(), "{c}");
}

/// The ledger with llama.cpp on Vulkan0 (candle, which has no device path, on the CPU, said in
/// a note): in-graph replay runs on the device with the outputs bit-identical in every replay,
/// and no matmul peak is taken from the side whose GEMM would run on the device, so no band is
/// placed on a roofline. Whether the replay's validations pass on lavapipe is a timing claim:
/// the run exits 0 or 3, and 3 exactly when a side is unreliable.
#[test]
fn the_ledger_replays_on_vulkan0_and_takes_no_peak_from_the_device() {
    let w = worker();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::rpc::tiny_llama(dir.path());
    let t0 = std::time::Instant::now();
    let o = opledger()
        .env_remove("GGML_VK_PERF_LOGGER")
        .args([
            "ledger",
            "--engines",
            "candle,llama.cpp",
            "-p",
            "16",
            "-r",
            "2",
        ])
        .args(["--replay-cycles", "2", "-t", "2", "-g", "99", "--json"])
        .arg("--llama-worker")
        .arg(w)
        .arg("-m")
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("ledger"))
        .output()
        .unwrap();
    eprintln!(
        "vulkan: ledger of candle (CPU) against llama.cpp on Vulkan0 in {:.1} s",
        t0.elapsed().as_secs_f64()
    );
    let stderr = String::from_utf8_lossy(&o.stderr);
    let r: Value = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("no ledger on stdout ({e}): {stderr}"));
    let notes = r["notes"].to_string();
    assert!(
        notes.contains("candle: on the CPU (it has no device path)"),
        "{notes}"
    );
    assert!(
        notes.contains("llama.cpp: no matmul peak taken from it: its graph runs on Vulkan0"),
        "{notes}"
    );
    for row in r["ledger"]["rows"].as_array().unwrap() {
        assert!(row["a_position"].is_null(), "{row}");
    }
    let rb = &r["replay_b"];
    let mut unreliable = false;
    if rb.is_null() {
        assert!(notes.contains("llama.cpp: no in-graph replay"), "{notes}");
    } else {
        assert_eq!(rb["outputs_identical"], true, "a replay changed the logits");
        let launch = rb["round_cost_us"].as_f64().unwrap();
        assert!(launch.is_finite() && launch > 0.0, "{launch}");
        unreliable = rb["reliable"] == false;
        eprintln!(
            "vulkan: replay on Vulkan0: launch per round {launch:.1} µs, reliable {}",
            rb["reliable"]
        );
    }
    assert_eq!(
        o.status.code(),
        Some(if unreliable { 3 } else { 0 }),
        "{stderr}"
    );
}
