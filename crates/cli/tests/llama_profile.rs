//! Real llama.cpp runs on tiny synthetic models the tool writes itself: every node in a band,
//! coverage 100 %, and node counts that follow from the architecture's metadata.

use std::path::{Path, PathBuf};

use opledger::model_file::ModelFile;
use opledger_core::arch::{ArchInfo, LayerKind};
use opledger_core::band::{BandRules, UNASSIGNED};
use opledger_core::engine::{Engine, Work};
use opledger_core::profile::{analyse, measure, CheckStatus, ProfileConfig};
use opledger_gguf::{synthesize, SynthOptions};
use opledger_llama::{FlashAttn, LlamaConfig, LlamaEngine};

fn synth(dir: &Path, preset: &str, fused_gate_up: bool) -> PathBuf {
    let path = dir.join(format!("{preset}-{fused_gate_up}.gguf"));
    let mut opts = SynthOptions::new(preset);
    opts.fused_gate_up = fused_gate_up;
    synthesize(&opts, &path, &mut |_, _| {}).unwrap();
    path
}

fn engine(path: &Path) -> LlamaEngine {
    LlamaEngine::load(LlamaConfig {
        model_path: path.to_path_buf(),
        threads: 2,
        flash_attn: FlashAttn::Auto,
        gpu_layers: 0,
        no_repack: false,
        ubatch: None,
        type_k: None,
        type_v: None,
        verbose: false,
    })
    .unwrap()
}

fn count(graph: &[opledger_core::node::NodeInfo], op: &str) -> u32 {
    graph.iter().filter(|n| n.op == op).count() as u32
}

/// Profiles `path` (2 cycles, chunk 64) and checks what must hold for every architecture.
fn profile_and_check(path: &Path) -> (ArchInfo, Vec<opledger_core::node::NodeInfo>) {
    let file = ModelFile::open(path).unwrap();
    let arch = file.arch.clone();
    let rules = BandRules::builtin(&arch.arch).unwrap();
    let mut e = engine(path);
    let cfg = ProfileConfig {
        work: Work {
            chunk_tokens: 64,
            depth_tokens: 0,
            all_logits: false,
            token_seed: 1,
            decode_tokens: 0,
            parallel: 1,
        },
        cycles: 2,
        warmup: 0,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = measure(&mut e, &cfg, &mut |_, _, _| {}).unwrap();
    let (assignments, summary) = analyse(&raw, &rules, &arch).unwrap();
    let unassigned: Vec<&str> = raw
        .graph
        .iter()
        .zip(&assignments)
        .filter(|(_, a)| a.band == UNASSIGNED)
        .map(|(n, _)| n.name.as_str())
        .collect();
    assert!(unassigned.is_empty(), "nodes in no band: {unassigned:?}");
    assert_eq!(summary.coverage, 1.0);
    assert!(summary.audit.is_empty(), "{:?}", summary.audit);
    assert!(
        summary.outputs_identical,
        "FUSED and TIMED runs computed different logits"
    );
    for c in &summary.checks {
        if c.name != "agreement" && c.name != "overhead" && c.name != "cycles" {
            assert_eq!(c.status, CheckStatus::Pass, "{}: {}", c.name, c.detail);
        }
    }
    // every timed node has a time, and the TIMED sum is a real fraction of the chunk
    assert!(raw
        .cycles
        .iter()
        .all(|c| c.node_us.len() == raw.graph.len()));
    assert!(summary.timed_sum_ms > 0.0 && summary.fused_ms > 0.0);
    let share_sum: f64 = summary.bands.iter().map(|b| b.share).sum();
    assert!((share_sum - 1.0).abs() < 1e-9);
    (arch, raw.graph)
}

#[test]
fn tiny_qwen35moe_counts_follow_the_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let (arch, graph) = profile_and_check(&synth(dir.path(), "tiny-qwen35moe", false));
    let full = arch.layers_of(LayerKind::FullAttention);
    let linear = arch.layers_of(LayerKind::LinearAttention);
    assert_eq!(full + linear, arch.n_layers());
    assert!(
        full >= 1 && linear >= 1,
        "the preset keeps both layer kinds"
    );
    // separate gate, up and down expert matmuls in every (MoE) layer
    assert_eq!(count(&graph, "MUL_MAT_ID"), arch.n_layers() * 3);
    // one attention core per full-attention layer, one delta-net scan and conv per linear one
    assert_eq!(count(&graph, "FLASH_ATTN_EXT"), full);
    assert_eq!(count(&graph, "GATED_DELTA_NET"), linear);
    assert_eq!(count(&graph, "SSM_CONV"), linear);
}

#[test]
fn fused_gate_up_has_two_expert_matmuls_per_layer() {
    let dir = tempfile::tempdir().unwrap();
    let (arch, graph) = profile_and_check(&synth(dir.path(), "tiny-qwen35moe", true));
    assert!(arch.fused_gate_up);
    assert_eq!(count(&graph, "MUL_MAT_ID"), arch.n_layers() * 2);
}

#[test]
fn tiny_qwen3moe_counts_follow_the_architecture() {
    let dir = tempfile::tempdir().unwrap();
    let (arch, graph) = profile_and_check(&synth(dir.path(), "tiny-qwen3moe", false));
    assert_eq!(arch.layers_of(LayerKind::FullAttention), arch.n_layers());
    assert_eq!(count(&graph, "MUL_MAT_ID"), arch.n_layers() * 3);
    assert_eq!(count(&graph, "FLASH_ATTN_EXT"), arch.n_layers());
    assert_eq!(count(&graph, "GATED_DELTA_NET"), 0);
}

#[test]
fn dense_models_profile_with_full_coverage() {
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-qwen3", "tiny-llama"] {
        let (arch, graph) = profile_and_check(&synth(dir.path(), preset, false));
        assert_eq!(count(&graph, "MUL_MAT_ID"), 0, "{preset}");
        assert_eq!(count(&graph, "FLASH_ATTN_EXT"), arch.n_layers(), "{preset}");
    }
}

#[test]
fn depth_state_is_restored_between_runs() {
    // At depth 128 every run restores the saved context first: repeated runs of every mode
    // must return bit-identical logits (a run that appended to the cache would not).
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen35moe", false);
    let mut e = engine(&path);
    e.prepare(&Work {
        chunk_tokens: 32,
        depth_tokens: 128,
        all_logits: true,
        token_seed: 3,
        decode_tokens: 0,
        parallel: 1,
    })
    .unwrap();
    let graph = e.graph().unwrap();
    assert!(!graph.is_empty());
    use opledger_core::engine::Mode;
    let first = e.run(Mode::Fused).unwrap().output_hash;
    for mode in [Mode::Timed, Mode::FusedObserved, Mode::Fused, Mode::Timed] {
        assert_eq!(e.run(mode).unwrap().output_hash, first, "{mode:?}");
    }
}

#[test]
fn isolation_is_calibrated_through_the_scheduler_and_the_callback() {
    // The calibration's trivial nodes take TIMED mode's path: every node asked, computed alone
    // by a scheduler, observed by the instrument's callback, with views between them as a real
    // graph has (after a view the pool's workers sleep and the next node must wake them). That
    // path holds the bare graph compute of earlier calibrations and more, so its per-node cost
    // is not below the bare one. Timing on two shared cores: medians of 5 rounds, and the bound
    // allows 1 µs of noise.
    let _backend = opledger_llama::Backend::init(false);
    let pool = opledger_llama::ThreadPool::new(2).unwrap();
    // a view after every other working node, a third of them on one thread
    use opledger_llama::calibrate::Dispatch;
    let pattern: Vec<Dispatch> = (0..96)
        .map(|i| match i % 6 {
            2 | 5 => Dispatch::Idle,
            4 => Dispatch::OneThread,
            _ => Dispatch::AllThreads,
        })
        .collect();
    // other tests of this binary time engines on the same two cores: a preempted thread
    // stalls a barrier for milliseconds in either path, so the comparison gets five attempts
    // and must hold in one
    let mut seen = Vec::new();
    for _ in 0..5 {
        let c = opledger_llama::calibrate::isolation_cost(&pool, &pattern, 5).unwrap();
        eprintln!("{c:?}");
        assert_eq!((c.nodes, c.working), (96, 64));
        assert_eq!(c.observed, 96 * 5, "every node went through the callback");
        assert!(c.timed_us.is_finite() && c.fused_us > 0.0);
        // one cost per node of the pattern, none for a node without work
        assert_eq!(c.each_node_us.len(), 96);
        for (d, us) in pattern.iter().zip(&c.each_node_us) {
            assert!(
                *us >= 0.0 && (*d != Dispatch::Idle || *us == 0.0),
                "{d:?} {us}"
            );
        }
        seen.push((c.per_node_us, c.bare_per_node_us));
        if c.per_node_us + 1.0 >= c.bare_per_node_us {
            break;
        }
    }
    assert!(
        seen.iter().any(|(path, bare)| path + 1.0 >= *bare),
        "through the callback below the bare graph compute every time (µs a node): {seen:?}"
    );
    // no graph captured yet: 64 working nodes
    let c = opledger_llama::calibrate::isolation_cost(&pool, &[], 1).unwrap();
    assert_eq!((c.nodes, c.working, c.observed), (64, 64, 64));
}
