//! The graph census on real llama.cpp graphs of tiny synthetic models: the cheap capture (abort
//! after the first node) sees the same graph as a full run, every count the architecture
//! predicts is found, counts do not depend on widths, and a wrong band rule is caught. llama.cpp
//! is opened as `--engine llama.cpp` opens it: the bundled worker, in its own process.

use std::path::{Path, PathBuf};

use opledger_app::engines::{EngineSettings, FlashAttn};
use opledger_app::model::ModelFile;
use opledger_core::band::{BandRules, Categoriser};
use opledger_core::census::{census, Census};
use opledger_core::engine::{Engine, GraphCapture, Work};
use opledger_gguf::synth::TINY_QWEN35MOE;
use opledger_gguf::{synthesize, synthesize_preset, Preset, SynthOptions};

/// llama.cpp on 2 threads (`no_repack`: loaded for a census, as `census` loads it).
fn engine(path: &Path, flash_attn: FlashAttn, no_repack: bool) -> Box<dyn Engine> {
    let mut settings = EngineSettings::new(2);
    settings.flash_attn = flash_attn;
    settings.no_repack = no_repack;
    crate::llama_cpp(path, &settings)
}

/// The cheap capture of `work`'s graph (abort after the first node).
fn cheap_capture(e: &mut dyn Engine, work: &Work) -> GraphCapture {
    e.graph_capturer().unwrap().capture_graph(work).unwrap()
}

fn work(chunk: u32, depth: u32) -> Work {
    Work {
        chunk_tokens: chunk,
        depth_tokens: depth,
        all_logits: false,
        token_seed: 0,
        decode_tokens: 0,
        parallel: 1,
    }
}

fn census_of(path: &Path, rules: Option<BandRules>, flash_attn: FlashAttn) -> Census {
    let file = ModelFile::open(path).unwrap();
    let rules = rules.unwrap_or_else(|| BandRules::builtin(&file.arch.arch).unwrap());
    let mut e = engine(path, flash_attn, true);
    let capture = cheap_capture(e.as_mut(), &work(64, 0));
    assert_eq!(
        capture.chunk_nodes_computed, 1,
        "the capture ran more than one node"
    );
    let a = Categoriser::new(&rules, &file.arch).categorise(&capture.nodes);
    census(&capture.nodes, &a, &file.arch, true)
}

fn synth(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("{preset}.gguf"));
    synthesize(&SynthOptions::new(preset), &path, &mut |_, _| {}).unwrap();
    path
}

#[test]
fn cheap_capture_sees_the_graph_a_full_run_computes() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-qwen35moe", "tiny-qwen3moe"] {
        let path = synth(dir.path(), preset);
        let mut e = engine(&path, FlashAttn::Auto, false);
        e.prepare(&work(64, 0)).unwrap();
        let full = e.graph().unwrap();
        let mut cheap = engine(&path, FlashAttn::Auto, true);
        let captured = cheap_capture(cheap.as_mut(), &work(64, 0));
        assert_eq!(captured.chunk_nodes_computed, 1);
        let sig = |g: &[opledger_core::node::NodeInfo]| -> Vec<(String, String, [i64; 4])> {
            g.iter()
                .map(|n| (n.op.clone(), n.name.clone(), n.out.ne))
                .collect()
        };
        assert_eq!(sig(&full), sig(&captured.nodes), "{preset}");
    }
}

#[test]
fn every_expected_count_is_found_on_tiny_models() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    for preset in [
        "tiny-qwen35moe",
        "tiny-qwen3moe",
        "tiny-qwen3",
        "tiny-llama",
    ] {
        let path = synth(dir.path(), preset);
        for fa in [FlashAttn::On, FlashAttn::Off] {
            let c = census_of(&path, None, fa);
            assert!(
                c.mismatches().is_empty(),
                "{preset} {fa:?}: {:#?}",
                c.mismatches()
            );
            assert_eq!(
                c.attention_path,
                if fa == FlashAttn::On {
                    "flash_attn"
                } else {
                    "soft_max"
                }
            );
            assert!(c.expectations.len() >= 5, "{preset}");
            assert_eq!(
                c.total.nodes,
                c.total.working + c.view_nodes + c.skipped_nodes
            );
            assert_eq!(
                c.skipped_nodes, 3,
                "{preset}: the unselected mixed-batch input branch"
            );
            let per_layer: u32 = c.per_layer.iter().map(|l| l.nodes).sum();
            let outside = c.per_layer_kind.get("none").map(|k| k.nodes).unwrap_or(0);
            assert_eq!(per_layer + outside, c.total.nodes, "{preset}");
        }
    }
}

#[test]
fn a_rule_that_drops_the_shared_expert_fails_on_the_real_graph() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen35moe");
    let mut rules = BandRules::builtin("qwen35moe").unwrap();
    for token in ["ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp"] {
        rules.weight.insert(token.into(), "other".into());
    }
    let c = census_of(&path, Some(rules), FlashAttn::Auto);
    let mut bad: Vec<(String, String, Option<u32>, u32)> = c
        .mismatches()
        .iter()
        .map(|e| (e.op.clone(), e.band.clone(), e.expected, e.found))
        .collect();
    bad.sort();
    // 4 layers: 20 moe matmuls expected, the 12 shared-expert ones moved to `other`
    assert_eq!(
        bad,
        vec![
            ("MUL_MAT".to_string(), "moe".to_string(), Some(20), 8),
            ("MUL_MAT".to_string(), "other".to_string(), Some(1), 13),
        ]
    );
}

#[test]
fn counts_do_not_depend_on_widths() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let narrow = TINY_QWEN35MOE;
    let wide = Preset {
        name: "wide-qwen35moe",
        embedding_length: 1024,
        vocab_size: 4096,
        head_count: 8,
        head_count_kv: 2,
        head_dim: 256,
        rope_dimension_count: 64,
        rope_dimension_sections: [11, 11, 10, 0],
        moe: narrow.moe.map(|m| opledger_gguf::synth::MoeShape {
            expert_count: 64,
            expert_feed_forward_length: 512,
            shared_expert_feed_forward_length: 512,
            ..m
        }),
        linear_attention: narrow.linear_attention.map(|l| {
            opledger_gguf::synth::LinearAttentionShape {
                group_count: 4,
                time_step_rank: 8,
                ..l
            }
        }),
        ..narrow
    };
    let mut counts = Vec::new();
    for p in [narrow, wide] {
        let path = dir.path().join(format!("{}.gguf", p.name));
        synthesize_preset(&p, &SynthOptions::new(p.name), &path, &mut |_, _| {}).unwrap();
        let c = census_of(&path, None, FlashAttn::Auto);
        assert!(c.mismatches().is_empty());
        counts.push((c.total, c.per_op, c.per_band, c.per_layer));
    }
    assert_eq!(counts[0], counts[1]);
}

#[test]
fn census_at_a_depth_attends_over_the_filled_cache() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen35moe");
    let mut e = engine(&path, FlashAttn::On, true);
    let capture = cheap_capture(e.as_mut(), &work(64, 256));
    assert_eq!(capture.filled_tokens, 256);
    let fa = capture
        .nodes
        .iter()
        .find(|n| n.op == "FLASH_ATTN_EXT")
        .unwrap();
    let k = fa.src(1).unwrap();
    // K holds at least the 256 cached and the 64 new tokens (llama.cpp pads to 256 cells)
    assert!(k.ne[1] >= 320, "K view of {:?}", k.ne);
    let at_zero = cheap_capture(engine(&path, FlashAttn::On, true).as_mut(), &work(64, 0));
    let k0 = at_zero
        .nodes
        .iter()
        .find(|n| n.op == "FLASH_ATTN_EXT")
        .unwrap()
        .src(1)
        .unwrap()
        .ne[1];
    assert!(
        k.ne[1] > k0,
        "depth 256 attends over {} keys, depth 0 over {k0}",
        k.ne[1]
    );
    assert_eq!(at_zero.nodes.len(), capture.nodes.len());
}
