//! Standalone op timing on real llama.cpp graphs of a tiny synthetic model: the captured routing
//! of every expert matmul touches nearly all experts, as uniform routing does and first-k does
//! not; every distinct op of the graph can be rebuilt and timed alone; `ops -n N --parallel P`
//! times the ops of one decode step, where first-k reads fewer expert bytes than a real step.
//! llama.cpp is opened as `--engine llama.cpp` opens it: the bundled worker, in its own process.

use opledger_app::engines::EngineSettings;
use opledger_core::engine::{OpTimeRequest, Work};
use opledger_core::ops::{distinct_experts, first_k_ids, uniform_ids};
use opledger_gguf::{synthesize, SynthOptions};
use serde_json::Value;

#[test]
fn captured_routing_touches_nearly_every_expert_and_every_op_times_alone() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    synthesize(&SynthOptions::new("tiny-qwen35moe"), &path, &mut |_, _| {}).unwrap();
    let mut e = crate::llama_cpp(&path, &EngineSettings::new(2));
    e.prepare(&Work::prefill(512, 0)).unwrap();
    let graph = e.graph().unwrap();
    let e = e.op_timer().unwrap();
    let captured = e.capture_routing().unwrap();
    let expert_nodes: Vec<_> = graph.iter().filter(|n| n.op == "MUL_MAT_ID").collect();
    assert_eq!(captured.len(), expert_nodes.len());
    for (index, ids) in &captured {
        let node = &graph[*index as usize];
        assert_eq!(node.op, "MUL_MAT_ID");
        let (k, n_tokens, n) = (
            node.src(2).unwrap().ne[0] as u32,
            node.src(2).unwrap().ne[1] as u32,
            node.src(0).unwrap().ne[2] as u32,
        );
        assert_eq!(ids.len() as u32, k * n_tokens);
        assert!(ids.iter().all(|&x| (0..n as i32).contains(&x)));
        // 16 experts, top-4, 512 tokens: expected distinct = 16 (1 - (12/16)^512) = 16.0
        let expected = n as f64 * (1.0 - (1.0 - k as f64 / n as f64).powi(n_tokens as i32));
        assert!(
            distinct_experts(ids) as f64 >= expected - 1.0,
            "{} of {n}",
            distinct_experts(ids)
        );
        assert_eq!(distinct_experts(&first_k_ids(k, n_tokens)), k);
        assert!(distinct_experts(&uniform_ids(n, k, n_tokens, 3)) as f64 >= expected - 1.0);
    }
    // every working node rebuilds and runs alone, without a crash in C
    for node in graph.iter().filter(|n| n.is_working()) {
        let ids = captured
            .iter()
            .find(|(i, _)| *i == node.index)
            .map(|(_, v)| v.as_slice());
        let t = e
            .time_node(
                node,
                &OpTimeRequest {
                    routing: ids,
                    reps: 1,
                    rotate_bytes: 1 << 20,
                    flush_bytes: 0,
                },
            )
            .unwrap_or_else(|err| panic!("node {} {} {}: {err}", node.index, node.op, node.name));
        assert!(t.median_us >= 0.0);
    }
}

/// `opledger ops` with `args` on `model`, run folder `out`: (ops.json, raw.json).
fn ops_run(model: &std::path::Path, out: &std::path::Path, args: &[&str]) -> (Value, Value) {
    let output = assert_cmd::Command::cargo_bin("opledger")
        .unwrap()
        .arg("ops")
        .args(args)
        .args(["-r", "1", "--reps", "2", "-t", "2", "-q", "-m"])
        .arg(model)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let read = |f: &str| -> Value {
        serde_json::from_str(&std::fs::read_to_string(out.join(f)).unwrap()).unwrap()
    };
    (read("ops.json"), read("raw.json"))
}

#[test]
fn decode_ops_time_one_step_and_first_k_reads_fewer_expert_bytes_than_the_real_routing() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("t.gguf");
    synthesize(&SynthOptions::new("tiny-qwen35moe"), &model, &mut |_, _| {}).unwrap();
    let p = 4u64;
    let (ops, raw) = ops_run(
        &model,
        &dir.path().join("ops"),
        &["-n", "2", "--parallel", "4", "--flush-mib", "8"],
    );
    assert_eq!(ops["decode_tokens"], 2);
    assert_eq!(ops["parallel"], p);
    assert_eq!(ops["tokens"], p, "one decode step: one token per sequence");
    assert_eq!(ops["flush_bytes"], 8u64 << 20);
    let graph = raw["graph"].as_array().unwrap();
    let working: Vec<&Value> = graph
        .iter()
        .filter(|n| n["is_view"] != true && n["skipped"] != true)
        .collect();
    // the graph is one decode step: every weight matmul's activations have P rows (ne[1], or
    // ne[1] x ne[2] where the recurrent layers lay out [tokens per sequence, sequences]; an
    // expert matmul's tokens are its ne[2])
    let ne = |n: &Value, slot: usize, d: usize| n["srcs"][slot]["ne"][d].as_u64().unwrap();
    let mut matmuls = 0;
    for n in &working {
        match n["op"].as_str().unwrap() {
            "MUL_MAT" if n["srcs"][0]["is_weight"] == true => {
                assert_eq!(ne(n, 1, 1) * ne(n, 1, 2) * ne(n, 1, 3), p, "{}", n["name"]);
                matmuls += 1;
            }
            "MUL_MAT_ID" => assert_eq!(ne(n, 1, 2), p, "{}", n["name"]),
            _ => {}
        }
    }
    assert!(matmuls > 0);
    // every op of the step's census is timed: the rows of ops without routing and those of one
    // routing count every working node once
    let rows = ops["rows"].as_array().unwrap();
    for r in ["first-k", "uniform", "captured"] {
        let counted: u64 = rows
            .iter()
            .filter(|row| row["routing"].is_null() || row["routing"] == r)
            .map(|row| row["count"].as_u64().unwrap())
            .sum();
        assert_eq!(counted, working.len() as u64, "{r}");
    }
    // first-k touches k experts per expert matmul; the captured routing of P tokens touches the
    // distinct experts of its ids, and the weight bytes differ by exactly the per-expert bytes
    // of the experts first-k leaves out
    let experts = &ops["experts_by_routing"];
    let (mut fk_total, mut cap_total, mut extra_bytes) = (0u64, 0u64, 0u64);
    for n in working.iter().filter(|n| n["op"] == "MUL_MAT_ID") {
        let i = n["index"].to_string();
        let k = ne(n, 2, 0);
        let n_expert = ne(n, 0, 2);
        let fk = experts["first-k"][&i].as_u64().unwrap();
        let cap = experts["captured"][&i].as_u64().unwrap();
        let uni = experts["uniform"][&i].as_u64().unwrap();
        assert_eq!(fk, k, "first-k: experts 0..k-1");
        assert!((k..=(k * p).min(n_expert)).contains(&cap), "captured {cap}");
        assert!((k..=(k * p).min(n_expert)).contains(&uni), "uniform {uni}");
        fk_total += fk;
        cap_total += cap;
        let per_expert = n["srcs"][0]["size_bytes"].as_u64().unwrap() / n_expert;
        extra_bytes += per_expert * (cap - fk);
    }
    assert!(
        cap_total > fk_total,
        "4 tokens routed by a real step touch more experts than first-k: {cap_total} vs {fk_total}"
    );
    let moe = ops["bands"]
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["band"] == "moe")
        .unwrap();
    let bytes = |r: &str| moe["weight_bytes"][r].as_u64().unwrap();
    assert_eq!(bytes("captured") - bytes("first-k"), extra_bytes);
    assert!(bytes("uniform") > bytes("first-k"));
    // the in-graph decode bands stand beside the standalone ones: each step's TIMED times less
    // their isolation (that they then sum to the FUSED wall holds by construction and is
    // tested in core::isolation). A band of tiny experts may hold less than its isolation on a
    // busy machine and stop at 0, but never silently: a band with working nodes shows work, or
    // the nodes the removal stopped at 0
    // a band with working nodes has op rows (every working node is timed alone)
    let working_in = |band: &str| rows.iter().any(|row| row["band"] == band);
    for b in ops["bands"].as_array().unwrap() {
        let band = b["band"].as_str().unwrap();
        let ms = b["in_graph_ms_per_token"].as_f64().unwrap();
        let clamped = b["in_graph_clamped_nodes"].as_u64().unwrap();
        assert!(ms >= 0.0, "{band}: {ms}");
        if working_in(band) {
            assert!(
                ms > 0.0 || clamped > 0,
                "{band} shows 0 ms/token in-graph with no node said to be stopped at 0: {b}"
            );
        }
    }
    let moe_clamped = moe["in_graph_clamped_nodes"].as_u64().unwrap();
    assert!(moe["in_graph_ms_per_token"].as_f64().unwrap() > 0.0 || moe_clamped > 0);
    for r in ["first-k", "uniform", "captured"] {
        assert!(moe["standalone_ms_per_token"][r].as_f64().unwrap() > 0.0);
    }
}
