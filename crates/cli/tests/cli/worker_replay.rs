//! In-graph replay and the isolation calibration through the llama.cpp worker built here
//! (`scripts/build-worker --from-cargo`), set against the worker cargo built from the same
//! llama.cpp libraries (the bundled worker) on the same model: every replayed run returns the
//! logits of a plain run bit for bit, the worker replays exactly k clones of every node asked
//! (and reports nothing skipped or failed), the graph, its bands and the nodes each band replays
//! are the bundled worker's, a replay ledger runs through `--llama-worker` with the structure of
//! the bundled worker's ledger, and the calibration of both gives one finite, non-negative
//! figure per node, 0 exactly at the nodes that do no work. Nothing here asserts a timing (the
//! replay's accuracy is `scripts/acceptance`'s claim).

use std::path::{Path, PathBuf};
use std::time::Duration;

use opledger_core::band::{BandRules, Categoriser};
use opledger_core::engine::{Engine, Mode, Work};
use opledger_core::node::NodeInfo;

/// The worker at `worker` on `model`, 2 threads.
fn worker_engine(worker: PathBuf, model: &Path) -> opledger_worker::WorkerEngine {
    opledger_worker::WorkerEngine::load(opledger_worker::WorkerConfig {
        worker,
        model: model.to_path_buf(),
        threads: 2,
        flash_attn: "auto".into(),
        gpu_layers: 0,
        no_repack: false,
        ubatch: None,
        type_k: None,
        type_v: None,
        timeout: Duration::from_secs(600),
        verbose: false,
        env: Default::default(),
        rpc: None,
    })
    .unwrap()
}

/// The worker cargo built (`worker=bundled`), written out where opledger writes it.
fn bundled_engine(model: &Path) -> opledger_worker::WorkerEngine {
    worker_engine(opledger_worker::bundled::path().unwrap(), model)
}

/// Each band's replayable nodes (working, not in place: what `core::replay` replays), by index.
fn band_masks(model: &Path, graph: &[NodeInfo]) -> Vec<(String, Vec<bool>)> {
    let file = opledger_app::model::ModelFile::open(model).unwrap();
    let rules = BandRules::builtin(&file.arch.arch).unwrap();
    let a = Categoriser::new(&rules, &file.arch).categorise(graph);
    rules
        .bands_in(&a)
        .into_iter()
        .map(|band| {
            let mask = graph
                .iter()
                .zip(&a)
                .map(|(n, x)| n.is_working() && !n.inplace && x.band == band)
                .collect();
            (band, mask)
        })
        .collect()
}

/// The worker built here and the bundled worker on one model: the same graph, logits and band
/// masks; every replay through the worker built here (each band at `k`, every node at 20,
/// launch rounds) returns the plain run's logits with exactly k clones a replayed node and
/// nothing skipped or failed; the calibration of both gives one figure per node, 0 exactly
/// where a node does no work.
fn replays_and_calibration_match_the_bundled_worker(model: &Path, chunk: u32, k: u32) {
    let work = Work::prefill(chunk, 0);
    let mut bundled = bundled_engine(model);
    bundled.prepare(&work).unwrap();
    let bundled_plain = bundled.run(Mode::Fused).unwrap();
    let bundled_graph = bundled.graph().unwrap();
    let bundled_cal = bundled.calibrate_isolation().unwrap().unwrap();
    drop(bundled);

    let mut w = worker_engine(crate::worker::worker(), model);
    w.prepare(&work).unwrap();
    // a replay needs the captured graph (its scratch is sized from it)
    let e = {
        let engine: &mut dyn Engine = &mut w;
        let r = engine.replayer().unwrap();
        r.replay(&[], &[], 1).unwrap_err().to_string()
    };
    assert!(e.contains("replay() before graph()"), "{e}");
    let plain = w.run(Mode::Fused).unwrap();
    let graph = w.graph().unwrap();
    // the same graph as the bundled worker's, node for node
    assert_eq!(graph.len(), bundled_graph.len());
    for (a, b) in bundled_graph.iter().zip(&graph) {
        assert_eq!(
            (&a.op, &a.name, a.is_working(), a.inplace),
            (&b.op, &b.name, b.is_working(), b.inplace)
        );
    }
    // the same logits as the bundled worker's plain run
    assert_eq!(
        plain.output_hash, bundled_plain.output_hash,
        "the two builds computed different logits"
    );
    let bands = band_masks(model, &graph);
    assert_eq!(
        bands,
        band_masks(model, &bundled_graph),
        "bands or their nodes differ"
    );
    assert!(
        bands.len() >= 3,
        "{:?}",
        bands.iter().map(|b| &b.0).collect::<Vec<_>>()
    );
    let replayable: Vec<bool> = graph.iter().map(|n| n.is_working() && !n.inplace).collect();
    let n_replayable = replayable.iter().filter(|&&x| x).count() as u32;
    let none = vec![false; graph.len()];
    let nodes = graph.len() as u32;

    // (what, output hash, the worker's (replayed, skipped, failed), those expected)
    type Counts = (u32, u32, u32);
    let mut runs: Vec<(String, u64, Counts, Counts)> = Vec::new();
    {
        let engine: &mut dyn Engine = &mut w;
        let r = engine.replayer().unwrap();
        assert_eq!(r.replay_rounds(16), 1);
        assert_eq!(r.replay_rounds(17), 2);
        let t = r.replay(&replayable, &none, 0).unwrap();
        assert_eq!(t.nodes_seen, nodes);
        runs.push(("baseline".into(), t.output_hash, (0, 0, 0), (0, 0, 0)));
    }
    let counts = |w: &opledger_worker::WorkerEngine| w.last_replay_counts().unwrap();
    runs[0].2 = counts(&w);
    for (band, mask) in &bands {
        let n = mask.iter().filter(|&&m| m).count() as u32;
        let t = {
            let engine: &mut dyn Engine = &mut w;
            engine
                .replayer()
                .unwrap()
                .replay(&replayable, mask, k)
                .unwrap()
        };
        assert_eq!(t.nodes_seen, nodes);
        runs.push((band.clone(), t.output_hash, counts(&w), (k * n, 0, 0)));
    }
    // more than one round a node, and launch rounds
    for (what, kk, launches) in [("every node", 20u32, false), ("launch rounds", 16, true)] {
        let t = {
            let engine: &mut dyn Engine = &mut w;
            let r = engine.replayer().unwrap();
            if launches {
                r.replay_launches(&replayable, &replayable, kk).unwrap()
            } else {
                r.replay(&replayable, &replayable, kk).unwrap()
            }
        };
        runs.push((
            what.into(),
            t.output_hash,
            counts(&w),
            (kk * n_replayable, 0, 0),
        ));
    }
    for (what, hash, got, want) in &runs {
        assert_eq!(
            *hash, plain.output_hash,
            "{what}: a replay changed the logits"
        );
        assert_eq!(got, want, "{what}: (replayed, skipped, failed)");
    }
    // the plain run after the replays: still the same logits
    assert_eq!(w.run(Mode::Fused).unwrap().output_hash, plain.output_hash);

    // the calibration: one figure per node, 0 exactly at the nodes that do no work, as the
    // bundled worker's
    let cal = w.calibrate_isolation().unwrap().unwrap();
    for (c, name) in [
        (&cal, "worker built here"),
        (&bundled_cal, "bundled worker"),
    ] {
        assert_eq!(c.each_node_us.len(), graph.len(), "{name}");
        assert!(c.per_node_us.is_finite() && c.per_node_us >= 0.0, "{name}");
        for (n, &v) in graph.iter().zip(&c.each_node_us) {
            assert!(v.is_finite() && v >= 0.0, "{name}: {} {v}", n.name);
            if !n.is_working() {
                assert_eq!(v, 0.0, "{name}: {} does no work", n.name);
            }
        }
        // the mean over the working nodes
        let working: Vec<f64> = graph
            .iter()
            .zip(&c.each_node_us)
            .filter(|(n, _)| n.is_working())
            .map(|(_, &v)| v)
            .collect();
        let mean = working.iter().sum::<f64>() / working.len() as f64;
        assert!(
            (mean - c.per_node_us).abs() <= 1e-9 * mean.max(1.0),
            "{name}"
        );
    }
}

#[test]
fn worker_replays_and_calibrates_the_tiny_qwen35moe_as_the_bundled_worker() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    replays_and_calibration_match_the_bundled_worker(&model, 64, 4);
}

#[test]
fn worker_replays_and_calibrates_gemma3_270m_as_the_bundled_worker() {
    let _machine = crate::machine::shared();
    let model = crate::published::gemma3_270m();
    replays_and_calibration_match_the_bundled_worker(&model, 32, 2);
}

/// A profile through the worker removes the isolation its calibration measured node by node.
#[test]
fn a_profile_through_the_worker_is_calibrated_node_by_node() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let out = dir.path().join("p");
    let w = crate::worker::worker();
    let o = std::process::Command::new(assert_cmd::cargo::cargo_bin("opledger"))
        .args([
            "profile",
            "-p",
            "32",
            "-r",
            "2",
            "-t",
            "2",
            "-q",
            "--llama-worker",
        ])
        .arg(&w)
        .arg("-m")
        .arg(&model)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    // exit 0, or 3 where a timing check judged this machine's noise
    assert!(
        matches!(o.status.code(), Some(0 | 3)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let raw: opledger_core::profile::ProfileRaw =
        serde_json::from_slice(&std::fs::read(out.join("raw.json")).unwrap()).unwrap();
    let sum: opledger_core::profile::ProfileSummary =
        serde_json::from_slice(&std::fs::read(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(sum.isolation_source, "calibration, node by node");
    for c in &raw.cycles {
        assert!(c.isolation_us.is_some_and(|v| v.is_finite() && v >= 0.0));
        assert_eq!(c.isolation_node_us.len(), raw.graph.len());
        for (n, &v) in raw.graph.iter().zip(&c.isolation_node_us) {
            assert!(v.is_finite() && v >= 0.0);
            assert!(v == 0.0 || n.is_working(), "{} does no work", n.name);
        }
    }
}

/// The replay ledger of the tiny qwen3moe through `--llama-worker` (the worker built here), and
/// the bundled worker's with the same arguments: every band with the same replayable nodes (measured or skipped for
/// the machine's noise, each with its node count), the worker's replays bit-identical, and the
/// run's exit and reliability what its validations say.
#[test]
fn a_replay_ledger_runs_through_a_worker_built_separately_with_the_bundled_worker_s_structure() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen3moe");
    let w = crate::worker::worker();
    let ledger = |name: &str, extra: &[&str]| {
        let o = std::process::Command::new(assert_cmd::cargo::cargo_bin("opledger"))
            .args([
                "ledger",
                "-p",
                "64",
                "-r",
                "1",
                "-k",
                "4",
                "--replay-cycles",
                "2",
            ])
            .args(["-t", "2", "--json", "-m"])
            .arg(&model)
            .arg("-o")
            .arg(dir.path().join(name))
            .args(extra)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&o.stderr).to_string();
        let r: serde_json::Value = serde_json::from_slice(&o.stdout)
            .unwrap_or_else(|e| panic!("no ledger on stdout ({e}): {stderr}"));
        (r, stderr, o.status.code())
    };
    let (bundled, _, _) = ledger("bundled", &[]);
    let (r, stderr, code) = ledger("worker", &["--llama-worker", w.to_str().unwrap()]);
    let rows = |r: &serde_json::Value| -> Vec<String> {
        let mut b: Vec<String> = r["ledger"]["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x["band"].as_str().unwrap().to_string())
            .collect();
        b.sort();
        b
    };
    assert_eq!(
        rows(&r),
        rows(&bundled),
        "the two builds' ledgers have other bands"
    );
    let notes = r["notes"].to_string();
    // every band with its replayable node count, measured or skipped
    let band_nodes = |rr: &serde_json::Value| -> std::collections::BTreeMap<String, u64> {
        rr["bands"]
            .as_array()
            .unwrap()
            .iter()
            .chain(rr["skipped"].as_array().unwrap())
            .map(|b| {
                (
                    b["band"].as_str().unwrap().to_string(),
                    b["nodes"].as_u64().unwrap(),
                )
            })
            .collect()
    };
    let rr = &r["replay_b"];
    if rr.is_null() {
        assert!(
            notes.contains(
                "llama.cpp: no in-graph replay of this work (too small to replay measurably"
            ),
            "{notes}"
        );
        assert_eq!(code, Some(0), "{stderr}");
        return;
    }
    assert_eq!(rr["outputs_identical"], true, "a replay changed the logits");
    assert!(rr["round_cost_us"].as_f64().unwrap().is_finite());
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
        "{checks:?}"
    );
    assert_eq!(code, Some(if reliable { 0 } else { 3 }), "{stderr}");
    if !bundled["replay_b"].is_null() {
        assert_eq!(band_nodes(rr), band_nodes(&bundled["replay_b"]));
        assert_eq!(
            rr["excluded_inplace"],
            bundled["replay_b"]["excluded_inplace"]
        );
    }
}
