//! Real llama.cpp runs on tiny synthetic models the tool writes itself: every node in a band,
//! coverage 100 %, and node counts that follow from the architecture's metadata. llama.cpp is
//! opened as `--engine llama.cpp` opens it: the bundled worker, in its own process.

use std::path::{Path, PathBuf};

use opledger_app::engines::EngineSettings;
use opledger_app::model::ModelFile;
use opledger_core::arch::{ArchInfo, LayerKind};
use opledger_core::band::BandRules;
use opledger_core::engine::{Engine, Work};
use opledger_core::profile::{analyse, measure, ProfileConfig};
use opledger_gguf::{synthesize, SynthOptions};

fn synth(dir: &Path, preset: &str, fused_gate_up: bool) -> PathBuf {
    let path = dir.join(format!("{preset}-{fused_gate_up}.gguf"));
    let mut opts = SynthOptions::new(preset);
    opts.fused_gate_up = fused_gate_up;
    synthesize(&opts, &path, &mut |_, _| {}).unwrap();
    path
}

/// llama.cpp on 2 threads, flash attention auto, weights repacked.
fn engine(path: &Path) -> Box<dyn Engine> {
    crate::llama_cpp(path, &EngineSettings::new(2))
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
    let raw = measure(e.as_mut(), &cfg, &mut |_, _, _| {}).unwrap();
    let (assignments, summary) = analyse(&raw, &rules, &arch).unwrap();
    crate::assert_profile_is_sound(&raw, &assignments, &summary);
    // the TIMED sum is a real fraction of the chunk
    assert!(summary.timed_sum_ms > 0.0 && summary.fused_ms > 0.0);
    let share_sum: f64 = summary.bands.iter().map(|b| b.share).sum();
    assert!((share_sum - 1.0).abs() < 1e-9);
    (arch, raw.graph)
}

#[test]
fn tiny_qwen35moe_counts_follow_the_architecture() {
    let _machine = crate::machine::shared();
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
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (arch, graph) = profile_and_check(&synth(dir.path(), "tiny-qwen35moe", true));
    assert!(arch.fused_gate_up);
    assert_eq!(count(&graph, "MUL_MAT_ID"), arch.n_layers() * 2);
}

#[test]
fn tiny_qwen3moe_counts_follow_the_architecture() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (arch, graph) = profile_and_check(&synth(dir.path(), "tiny-qwen3moe", false));
    assert_eq!(arch.layers_of(LayerKind::FullAttention), arch.n_layers());
    assert_eq!(count(&graph, "MUL_MAT_ID"), arch.n_layers() * 3);
    assert_eq!(count(&graph, "FLASH_ATTN_EXT"), arch.n_layers());
    assert_eq!(count(&graph, "GATED_DELTA_NET"), 0);
}

#[test]
fn dense_models_profile_with_full_coverage() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-qwen3", "tiny-llama"] {
        let (arch, graph) = profile_and_check(&synth(dir.path(), preset, false));
        assert_eq!(count(&graph, "MUL_MAT_ID"), 0, "{preset}");
        assert_eq!(count(&graph, "FLASH_ATTN_EXT"), arch.n_layers(), "{preset}");
    }
}

#[test]
fn depth_state_is_restored_between_runs() {
    let _machine = crate::machine::shared();
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

/// What a tiny preset's graph must hold, computed here from the preset's own numbers and each
/// family's loader and graph builder (src/models/<arch>.cpp), independently of opledger's census
/// rules: (op, band, count) of working nodes, and the kind of every layer.
fn expected_counts(
    p: &opledger_gguf::Preset,
) -> (Vec<(&'static str, &'static str, u32)>, Vec<LayerKind>) {
    use opledger_gguf::Arch;
    #[derive(Clone, Copy, PartialEq)]
    enum Mixer {
        Attention,
        DeltaNet,
        Mamba2,
        None,
    }
    let layers = p.block_count;
    let mixer_of = |il: u32| match (p.extras.layer_pattern, p.linear_attention) {
        (Some(pat), _) => match pat.as_bytes()[il as usize % pat.len()] {
            b'M' => Mixer::Mamba2,
            b'*' => Mixer::Attention,
            _ => Mixer::None,
        },
        (None, Some(la)) if !(il + 1).is_multiple_of(la.full_attention_interval) => Mixer::DeltaNet,
        _ => Mixer::Attention,
    };
    // an FFN on every layer, but Nemotron-H's FFN-only layers carry the only FFNs there
    let has_ffn = |il: u32| p.extras.layer_pattern.is_none() || mixer_of(il) == Mixer::None;
    let is_moe = |il: u32| has_ffn(il) && p.moe.is_some() && il >= p.extras.leading_dense_layers;
    // sliding layers: llama.cpp's set_swa_pattern(n): il % n < n - 1
    let slides = |il: u32| match (p.arch, p.extras.sliding_window) {
        (Arch::Gemma2 | Arch::GptOss, Some(_)) => il % 2 < 1,
        (Arch::Gemma3, Some(_)) => il % 6 < 5,
        _ => false,
    };
    let n = |f: &dyn Fn(u32) -> bool| (0..layers).filter(|&il| f(il)).count() as u32;
    let attention = n(&|il| mixer_of(il) == Mixer::Attention);
    let delta = n(&|il| mixer_of(il) == Mixer::DeltaNet);
    let mamba = n(&|il| mixer_of(il) == Mixer::Mamba2);
    let moe = n(&|il| is_moe(il));
    let dense = n(&|il| has_ffn(il) && !is_moe(il));
    // Q/K/V/O; phi3: one fused QKV and O; deepseek2's MLA: q_a, q_b, kv_a_mqa, k_b, v_b, o
    let proj = match p.arch {
        Arch::Phi3 => 2,
        Arch::Deepseek2 => 6,
        _ => 4,
    };
    // gate/up/down; phi3 (gate and up fused) and nemotron_h (no gate): two
    let dense_mm = match p.arch {
        Arch::Phi3 | Arch::NemotronH => 2,
        _ => 3,
    };
    // the router, and the shared expert's matmuls (with its sigmoid gate in the qwen families)
    let router_shared = match p.arch {
        Arch::Qwen2Moe | Arch::Qwen35Moe | Arch::Qwen3Next => 5,
        Arch::Deepseek2 => 4,
        _ => 1,
    };
    let delta_mm = if p.arch == Arch::Qwen3Next { 4 } else { 5 };
    let mut rows = vec![
        ("FLASH_ATTN_EXT", "attention", attention),
        ("MUL_MAT", "projections", attention * proj),
        ("MUL_MAT", "dense_ffn", dense * dense_mm),
        ("MUL_MAT_ID", "moe", moe * 3),
        ("MUL_MAT", "moe", moe * router_shared),
        ("MUL_MAT", "other", 1),
        ("GATED_DELTA_NET", "linear_attention", delta),
        ("SSM_SCAN", "linear_attention", mamba),
        ("SSM_CONV", "linear_attention", delta + mamba),
        ("MUL_MAT", "linear_attention", delta * delta_mm + mamba * 2),
    ];
    rows.retain(|r| r.2 > 0 || r.0 == "MUL_MAT_ID");
    let kinds = (0..layers)
        .map(|il| match mixer_of(il) {
            Mixer::Attention if slides(il) => LayerKind::SlidingWindow,
            Mixer::Attention => LayerKind::FullAttention,
            Mixer::DeltaNet | Mixer::Mamba2 => LayerKind::LinearAttention,
            Mixer::None => LayerKind::FeedForward,
        })
        .collect();
    (rows, kinds)
}

#[test]
fn every_family_profiles_with_full_coverage_and_the_counts_its_architecture_predicts() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let families: Vec<&opledger_gguf::Preset> = opledger_gguf::presets()
        .iter()
        .filter(|p| p.name.starts_with("tiny-"))
        .collect();
    // one tiny preset per family the synthesiser writes
    for a in opledger_gguf::Arch::ALL {
        assert!(
            families.iter().any(|p| p.arch == a),
            "no tiny preset of {a}"
        );
    }
    for p in families {
        let path = synth(dir.path(), p.name, false);
        let (arch, graph) = profile_and_check(&path);
        let (rows, kinds) = expected_counts(p);
        assert_eq!(arch.layer_kinds(), kinds, "{}: layer kinds", p.name);
        if let Some(sw) = p.extras.sliding_window {
            assert!(
                arch.layers
                    .iter()
                    .filter(|l| l.kind == LayerKind::SlidingWindow)
                    .all(|l| l.window == Some(sw.window)),
                "{}",
                p.name
            );
        }
        let rules = BandRules::builtin(&arch.arch).unwrap();
        let cat = opledger_core::band::Categoriser::new(&rules, &arch);
        let a = cat.categorise(&graph);
        let census = opledger_core::census::census(&graph, &a, &arch, true);
        for (op, band, expected) in rows {
            let found = census
                .per_op_band
                .get(&format!("{op}/{band}"))
                .copied()
                .unwrap_or(0);
            assert_eq!(found, expected, "{}: {op} in {band}", p.name);
        }
        // and opledger's own predictions hold on the real graph
        assert!(
            census.mismatches().is_empty(),
            "{}: {:?}",
            p.name,
            census.mismatches()
        );
    }
}

/// The isolation calibration through the engine the commands use: before a graph is captured,
/// one figure for every node (the average of 64 working nodes); after, one finite, non-negative
/// figure per node of the captured graph, 0 exactly at the nodes that do no work, whose mean
/// over the working nodes is the per-node figure. That the callback's path costs no less than
/// the bare graph compute is a timing claim: `scripts/acceptance` (isolation).
#[test]
fn isolation_is_calibrated_node_by_node_on_the_captured_graph() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let mut e = engine(&synth(dir.path(), "tiny-qwen35moe", false));
    let c = e
        .calibrate_isolation()
        .unwrap()
        .expect("a model on the CPU alone is calibrated");
    assert!(
        c.per_node_us.is_finite() && c.per_node_us >= 0.0,
        "before a graph: {}",
        c.per_node_us
    );
    assert!(
        c.each_node_us.is_empty(),
        "no graph captured yet, yet {} figures node by node",
        c.each_node_us.len()
    );
    e.prepare(&Work::prefill(32, 0)).unwrap();
    let graph = e.graph().unwrap();
    let c = e
        .calibrate_isolation()
        .unwrap()
        .expect("a model on the CPU alone is calibrated");
    assert_eq!(c.each_node_us.len(), graph.len(), "one figure per node");
    let working = graph.iter().filter(|n| n.is_working()).count();
    assert!(
        working > 0 && working < graph.len(),
        "the graph has nodes with and without work ({working} of {})",
        graph.len()
    );
    for (n, &us) in graph.iter().zip(&c.each_node_us) {
        assert!(us.is_finite() && us >= 0.0, "{}: {us}", n.name);
        if !n.is_working() {
            assert_eq!(us, 0.0, "{} does no work, yet costs {us} µs", n.name);
        }
    }
    let mean = graph
        .iter()
        .zip(&c.each_node_us)
        .filter(|(n, _)| n.is_working())
        .map(|(_, &us)| us)
        .sum::<f64>()
        / working as f64;
    assert!(
        (mean - c.per_node_us).abs() <= 1e-9 * mean.max(1.0),
        "per node {} is not the working nodes' mean {mean}",
        c.per_node_us
    );
}
