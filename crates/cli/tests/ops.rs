//! Standalone op timing on real llama.cpp graphs of a tiny synthetic model: the captured routing
//! of every expert matmul touches nearly all experts, as uniform routing does and first-k does
//! not; every distinct op of the graph can be rebuilt and timed alone.

use opledger_core::engine::{Engine, Work};
use opledger_core::ops::{distinct_experts, first_k_ids, uniform_ids};
use opledger_gguf::{synthesize, SynthOptions};
use opledger_llama::{LlamaConfig, LlamaEngine};

#[test]
fn captured_routing_touches_nearly_every_expert_and_every_op_times_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.gguf");
    synthesize(&SynthOptions::new("tiny-qwen35moe"), &path, &mut |_, _| {}).unwrap();
    let mut e = LlamaEngine::load(LlamaConfig::new(&path, 2)).unwrap();
    e.prepare(&Work::prefill(512, 0)).unwrap();
    let graph = e.graph().unwrap();
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
            .time_node(node, ids, 1, 1 << 20)
            .unwrap_or_else(|err| panic!("node {} {} {}: {err}", node.index, node.op, node.name));
        assert!(t.median_us >= 0.0);
    }
}
