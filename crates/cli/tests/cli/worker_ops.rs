//! Standalone op timing, the captured expert routing and the GEMM peak through the llama.cpp
//! worker built here (`scripts/build-worker --from-cargo`), set against the worker cargo built
//! from the same llama.cpp libraries (the bundled worker, what `--engine llama.cpp` runs):
//! `opledger ops` gives the same rows (ops, shapes, routings, experts touched) with finite
//! positive figures; a TIMED run's expert ids are the same bit for bit, for a prefill chunk and
//! for a decode step; the GEMM peak is a finite positive figure with its shape; a node the worker
//! cannot rebuild is refused by name. Nothing here compares a timing (scripts/acceptance does,
//! group `ops-worker`).

use std::path::Path;
use std::process::Command;

use opledger_app::engines::{open_engine, EngineKind, EngineSettings, FlashAttn, WorkerSettings};
use opledger_app::model::ModelFile;
use opledger_core::engine::{OpTimeRequest, Work};
use serde_json::Value;

fn settings(worker: Option<&Path>) -> EngineSettings {
    EngineSettings {
        threads: 2,
        flash_attn: FlashAttn::Auto,
        gpu_layers: 0,
        verbose: false,
        no_repack: false,
        knobs: Default::default(),
        rpc: None,
        worker: worker.map(|p| WorkerSettings {
            path: p.to_path_buf(),
            timeout: opledger_app::engines::DEFAULT_WORKER_TIMEOUT,
        }),
    }
}

/// `opledger ops` on `model` with `extra`: ops.json.
fn ops_json(model: &Path, out: &Path, extra: &[&str]) -> Value {
    let o = Command::new(assert_cmd::cargo::cargo_bin("opledger"))
        .arg("ops")
        .args([
            "-p",
            "64",
            "-r",
            "1",
            "--reps",
            "2",
            "-t",
            "2",
            "-q",
            "--rotate-mib",
            "4",
        ])
        .arg("-m")
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_str(&std::fs::read_to_string(out.join("ops.json")).unwrap()).unwrap()
}

/// What a row is, whatever its timing: op, band, shapes, count, routing, experts touched and
/// their bytes.
fn row_key(r: &Value) -> String {
    let keep: Vec<&str> = [
        "op",
        "band",
        "signature",
        "count",
        "routing",
        "experts_touched",
        "expert_bytes",
    ]
    .to_vec();
    let v: Vec<String> = keep.iter().map(|k| r[*k].to_string()).collect();
    v.join(" | ")
}

#[test]
fn ops_through_a_worker_built_separately_has_the_bundled_worker_s_rows_with_finite_figures() {
    let _machine = crate::machine::shared();
    let w = crate::worker::worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let bundled = ops_json(&model, &dir.path().join("bundled"), &[]);
    let through = ops_json(
        &model,
        &dir.path().join("worker"),
        &["--llama-worker", w.to_str().unwrap()],
    );
    let rows = |v: &Value| v["rows"].as_array().unwrap().clone();
    let (re, rw) = (rows(&bundled), rows(&through));
    assert!(!rw.is_empty());
    let keys = |rows: &[Value]| rows.iter().map(row_key).collect::<Vec<_>>();
    assert_eq!(
        keys(&rw),
        keys(&re),
        "the worker built here has other rows than the bundled worker"
    );
    // every routing touched the same experts (the captured one is a real run's ids)
    assert_eq!(
        through["experts_by_routing"], bundled["experts_by_routing"],
        "the two builds' routings touched different experts"
    );
    assert!(through["experts_by_routing"]["captured"]
        .as_object()
        .is_some_and(|m| !m.is_empty()));
    for (r, e) in rw.iter().zip(&re) {
        let f = |k: &str| r[k].as_f64().unwrap();
        let (median, min, max) = (f("median_us"), f("min_us"), f("max_us"));
        if r["reps"] == 0 {
            // an op over no elements (a state copy of no sequence) does nothing, and neither
            // build times it
            assert_eq!(e["reps"], 0, "{}", row_key(r));
            assert_eq!([median, min, max], [0.0; 3], "{}", row_key(r));
            continue;
        }
        assert!(
            [median, min, max].iter().all(|x| x.is_finite() && *x > 0.0),
            "{}: {median} {min} {max}",
            row_key(r)
        );
        assert!(min <= median && median <= max, "{}", row_key(r));
        assert_eq!(r["reps"], 2, "{}", row_key(r));
        assert!(r["rotation"].as_u64().unwrap() >= 1);
    }
    assert!(rw.iter().any(|r| r["reps"] == 2));
    // the manifests say which worker timed them: the bundled one, and the one built here
    let manifest = |run: &str| -> Value {
        serde_json::from_str(
            &std::fs::read_to_string(dir.path().join(run).join("manifest.json")).unwrap(),
        )
        .unwrap()
    };
    let (mb, mw) = (manifest("bundled"), manifest("worker"));
    assert!(mw.to_string().contains("worker_protocol"), "{mw}");
    assert_eq!(
        mb["engine"]["settings"]["worker_blake3"],
        opledger_worker::bundled::blake3(),
        "ops without --llama-worker was not the bundled worker's: {mb}"
    );
    assert_eq!(mw["engine"]["settings"]["worker"], w.to_str().unwrap());
}

#[test]
fn a_worker_built_separately_captures_the_bundled_worker_s_routing_bit_for_bit_and_a_gemm_peak() {
    let _machine = crate::machine::shared();
    let w = crate::worker::worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let file = ModelFile::open(&model).unwrap();
    let mut bundled = open_engine(EngineKind::LlamaCpp, &file, &settings(None)).unwrap();
    assert_eq!(
        bundled
            .info()
            .settings
            .get("worker_blake3")
            .map(String::as_str),
        Some(opledger_worker::bundled::blake3()),
        "llama.cpp without a worker named is the bundled worker"
    );
    let mut worker = open_engine(EngineKind::LlamaCpp, &file, &settings(Some(&w))).unwrap();
    assert!(worker.info().settings.contains_key("worker_protocol"));
    let decode = Work {
        decode_tokens: 2,
        parallel: 3,
        ..Work::prefill(8, 16)
    };
    for work in [Work::prefill(64, 0), decode] {
        let mut routings = Vec::new();
        let mut routed = Vec::new();
        for e in [&mut bundled, &mut worker] {
            e.prepare(&work).unwrap();
            let graph = e.graph().unwrap();
            let ids = e.op_timer().unwrap().capture_routing().unwrap();
            // one entry per expert matmul, each [n_used, n_tokens] ids in range
            let experts: Vec<u32> = graph
                .iter()
                .filter(|n| n.op == "MUL_MAT_ID")
                .map(|n| n.index)
                .collect();
            assert_eq!(ids.iter().map(|(i, _)| *i).collect::<Vec<_>>(), experts);
            for (i, v) in &ids {
                let n = &graph[*i as usize];
                let src = n.src(2).unwrap();
                assert_eq!(v.len() as i64, src.ne[0] * src.ne[1], "node {i}");
                assert!(v
                    .iter()
                    .all(|x| (0..n.src(0).unwrap().ne[2] as i32).contains(x)));
            }
            routings.push(ids);
            routed.push(e.routed_experts().unwrap().unwrap());
        }
        assert!(!routings[0].is_empty());
        assert_eq!(
            routings[1], routings[0],
            "the worker built here routed otherwise than the bundled worker ({work:?})"
        );
        assert_eq!(routed[1], routed[0], "experts touched ({work:?})");
        // distinct experts counted from the ids themselves
        for (i, ids) in &routings[0] {
            assert_eq!(routed[0][i], opledger_core::ops::distinct_experts(ids));
        }
    }
    let (gflops, shape) = worker.gemm_peak().unwrap().unwrap();
    assert!(gflops.is_finite() && gflops > 0.0, "{gflops}");
    assert_eq!(shape, "F32 4096x4096 x 4096x512");
}

#[test]
fn a_node_the_worker_cannot_rebuild_is_refused_by_name() {
    let _machine = crate::machine::shared();
    let w = crate::worker::worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let file = ModelFile::open(&model).unwrap();
    let mut worker = open_engine(EngineKind::LlamaCpp, &file, &settings(Some(&w))).unwrap();
    let req = OpTimeRequest {
        routing: None,
        reps: 1,
        rotate_bytes: 0,
        flush_bytes: 0,
    };
    let timer = worker.op_timer().unwrap();
    let mut on_gpu9 = opledger_core::peaks::gemm_probe(None);
    on_gpu9.device = Some("GPU9".into());
    let e = timer.time_node(&on_gpu9, &req).unwrap_err().to_string();
    assert!(e.contains("no device 'GPU9'"), "{e}");
    // an op code that is another op in this llama.cpp
    let mut wrong = opledger_core::peaks::gemm_probe(Some(1));
    wrong.out.ne = [4, 4, 1, 1];
    let e = timer.time_node(&wrong, &req).unwrap_err().to_string();
    assert!(e.contains("not 'MUL_MAT'"), "{e}");
    let mut unknown = opledger_core::peaks::gemm_probe(None);
    unknown.srcs[0].as_mut().unwrap().ggml_type = "q9_9".into();
    let e = timer.time_node(&unknown, &req).unwrap_err().to_string();
    assert!(e.contains("unknown tensor type 'q9_9'"), "{e}");
    // the worker still answers: a refusal is no fault
    let probe = opledger_core::peaks::gemm_probe(None);
    let mut small = probe.clone();
    small.out.ne = [64, 8, 1, 1];
    small.srcs[0].as_mut().unwrap().ne = [32, 64, 1, 1];
    small.srcs[0].as_mut().unwrap().nb = [4, 128, 8192, 8192];
    small.srcs[1].as_mut().unwrap().ne = [32, 8, 1, 1];
    small.srcs[1].as_mut().unwrap().nb = [4, 128, 1024, 1024];
    let t = timer.time_node(&small, &req).unwrap();
    assert_eq!(t.reps, 1);
    assert!(t.median_us.is_finite() && t.median_us > 0.0);
}
