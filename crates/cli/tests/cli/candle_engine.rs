#![cfg(all(feature = "candle", feature = "llama"))]

//! The candle engine on tiny synthetic models the tool writes itself: its logits agree with
//! llama.cpp's on the same file and the same tokens, every node lands in a band, and its node
//! counts follow from the architecture and the routing the run used.

use std::path::{Path, PathBuf};

use opledger_app::model::ModelFile;
use opledger_candle::{CandleConfig, CandleEngine};
use opledger_core::arch::ArchInfo;
use opledger_core::band::{Assignment, BandRules};
use opledger_core::engine::{Engine, Mode, Work};
use opledger_core::node::{weight_token, NodeInfo};
use opledger_core::profile::{analyse, measure, ProfileConfig};
use opledger_gguf::{synthesize, GgmlType, GgufFile, GgufWriter, SynthOptions, TensorSpec};

/// How close two engines' logits must be.
struct Tolerance {
    /// Largest relative L2 error of a row.
    rel: f64,
    /// Smallest cosine similarity of a row.
    cos: f64,
    /// A top-1 miss is accepted only where llama.cpp's top-2 margin is under this share of the
    /// row's logit spread (max - min).
    tie: f32,
}

/// Quantised weights: llama.cpp and candle both quantise activations (Q8) for their quantised
/// matmuls, with their own kernels and rounding, and llama.cpp keeps its KV cache (and the
/// queries of its flash attention) in F16; on these tiny widths that leaves about 1e-2 of
/// relative error (REFERENCE.md saw 5e-3 at real widths).
const QUANTISED: Tolerance = Tolerance {
    rel: 3e-2,
    cos: 0.9995,
    tie: 5e-3,
};
/// Float weights: only llama.cpp's F16 cache and queries differ.
const FLOAT: Tolerance = Tolerance {
    rel: 3e-3,
    cos: 0.99999,
    tie: 0.0,
};

fn synth(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("{preset}.gguf"));
    synthesize(&SynthOptions::new(preset), &path, &mut |_, _| {}).unwrap();
    path
}

/// A tiny model with every matmul weight in float: no engine quantises activations then.
fn synth_f32(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("{preset}-f32.gguf"));
    let mut opts = SynthOptions::new(preset);
    opts.expert_type = GgmlType::F32;
    opts.dense_type = GgmlType::F32;
    synthesize(&opts, &path, &mut |_, _| {}).unwrap();
    path
}

fn candle(path: &Path) -> CandleEngine {
    CandleEngine::load(CandleConfig {
        model: opledger_gguf::WellFormed::of(&opledger_gguf::GgufFile::open(path).unwrap()),
        threads: 2,
    })
    .unwrap()
}

fn work(chunk: u32, depth: u32, all_logits: bool) -> Work {
    Work {
        all_logits,
        token_seed: 5,
        ..Work::prefill(chunk, depth)
    }
}

/// The logits candle computes for `work` (FUSED run).
fn candle_logits(path: &Path, w: &Work) -> Vec<Vec<f32>> {
    let mut e = candle(path);
    e.prepare(w).unwrap();
    e.run(Mode::Fused).unwrap();
    e.last_logits().to_vec()
}

/// The last row of logits llama.cpp computes for `work` (a FUSED run of the bundled worker, as
/// `--engine llama.cpp` opens it; the engine's logits are the last row of a prefill chunk).
fn llama_logits(path: &Path, w: &Work) -> Vec<Vec<f32>> {
    let mut e = crate::llama_cpp(path, &opledger_app::engines::EngineSettings::new(2));
    let rows = decode_logits(e.as_mut(), w);
    assert_eq!(rows.len(), 1, "llama.cpp's last row of the chunk");
    rows
}

fn argmax(v: &[f32]) -> usize {
    (0..v.len()).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap()
}

/// Checks candle's rows against llama.cpp's in relative terms and returns (worst relative
/// error, worst cosine, top-1 misses).
fn compare(what: &str, tol: &Tolerance, candle: &[Vec<f32>], llama: &[Vec<f32>]) {
    assert_eq!(candle.len(), llama.len(), "{what}: rows");
    let (mut worst_rel, mut worst_cos, mut misses) = (0f64, 1f64, 0usize);
    for (r, (c, l)) in candle.iter().zip(llama).enumerate() {
        assert_eq!(c.len(), l.len(), "{what}: row {r} width");
        assert!(
            c.iter().all(|x| x.is_finite()),
            "{what}: row {r} not finite"
        );
        let (mut diff2, mut l2, mut c2, mut dot) = (0f64, 0f64, 0f64, 0f64);
        for (&a, &b) in c.iter().zip(l) {
            let (a, b) = (a as f64, b as f64);
            diff2 += (a - b) * (a - b);
            l2 += b * b;
            c2 += a * a;
            dot += a * b;
        }
        let rel = (diff2 / l2).sqrt();
        let cos = dot / (l2.sqrt() * c2.sqrt());
        worst_rel = worst_rel.max(rel);
        worst_cos = worst_cos.min(cos);
        let (tc, tl) = (argmax(c), argmax(l));
        if tc != tl {
            misses += 1;
            let mut sorted = l.clone();
            sorted.sort_by(|a, b| b.total_cmp(a));
            let spread = sorted[0] - sorted[sorted.len() - 1];
            let margin = sorted[0] - sorted[1];
            eprintln!(
                "{what}: row {r}: top-1 {tc} (candle) vs {tl} (llama.cpp), top-2 margin \
                 {:.2e} of the spread",
                margin / spread
            );
            assert!(
                margin < tol.tie * spread,
                "{what}: row {r}: top-1 {tc} (candle) vs {tl} (llama.cpp) with a top-2 margin \
                 of {margin} ({:.2e} of the spread)",
                margin / spread
            );
        }
    }
    eprintln!(
        "{what}: {} rows, worst relative error {worst_rel:.4e}, worst cosine {worst_cos:.8}, \
         top-1 misses {misses}",
        candle.len()
    );
    assert!(
        worst_rel <= tol.rel,
        "{what}: relative error {worst_rel:.3e}"
    );
    assert!(worst_cos >= tol.cos, "{what}: cosine {worst_cos}");
    // nearly every row: at most one in eight misses, and each only on a near-tie
    assert!(
        misses * 8 <= candle.len(),
        "{what}: {misses} top-1 misses in {} rows",
        candle.len()
    );
}

/// Candle's logits against llama.cpp's last row: with `all_logits`, candle computes a row per
/// token, and its last is set against llama.cpp's (the worker returns the last row only).
fn agree(path: &Path, what: &str, tol: &Tolerance, w: &Work) {
    let c = candle_logits(path, w);
    if w.all_logits {
        assert_eq!(c.len() as u32, w.chunk_tokens, "{what}: candle's rows");
    }
    let l = llama_logits(path, w);
    compare(what, tol, &c[c.len() - 1..], &l);
}

#[test]
fn tiny_qwen3moe_logits_agree_with_llama_cpp() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen3moe");
    agree(&path, "qwen3moe last", &QUANTISED, &work(64, 0, false));
    agree(&path, "qwen3moe all", &QUANTISED, &work(64, 0, true));
    // at depth: the cache filled in two batches, then a chunk attending over it
    agree(
        &path,
        "qwen3moe depth 64 all",
        &QUANTISED,
        &work(32, 64, true),
    );
}

#[test]
fn float_weights_agree_closely() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = synth_f32(dir.path(), "tiny-qwen3moe");
    agree(&path, "qwen3moe f32 all", &FLOAT, &work(64, 0, true));
    agree(
        &path,
        "qwen3moe f32 depth 64 all",
        &FLOAT,
        &work(32, 64, true),
    );
    // llama: interleaved rope with Llama 3 frequency factors, no q/k norms
    let path = synth_f32(dir.path(), "tiny-llama");
    agree(&path, "llama f32 depth 64 all", &FLOAT, &work(32, 64, true));
}

#[test]
fn dense_models_agree_with_llama_cpp() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-qwen3", "tiny-llama"] {
        let path = synth(dir.path(), preset);
        agree(
            &path,
            &format!("{preset} last"),
            &QUANTISED,
            &work(48, 0, false),
        );
        agree(
            &path,
            &format!("{preset} depth 32 all"),
            &QUANTISED,
            &work(48, 32, true),
        );
    }
}

/// Profiles `path` on candle (2 cycles) and checks what must hold for every architecture;
/// returns the graph, its bands and the routing of the last run.
fn profile_and_check(
    path: &Path,
    w: &Work,
) -> (ArchInfo, Vec<NodeInfo>, Vec<Assignment>, Vec<Vec<usize>>) {
    let file = ModelFile::open_structural(path).unwrap();
    let arch = file.arch.clone();
    let rules = BandRules::builtin(&arch.arch).unwrap();
    let mut e = candle(path);
    let cfg = ProfileConfig {
        work: w.clone(),
        cycles: 2,
        warmup: 1,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = measure(&mut e, &cfg, &mut |_, _, _| {}).unwrap();
    let (assignments, summary) = analyse(&raw, &rules, &arch).unwrap();
    crate::assert_profile_is_sound(&raw, &assignments, &summary);
    assert_eq!(e.info().engine, "candle");
    // producers point backwards at nodes that exist, and every layer parses
    for n in &raw.graph {
        for s in n.srcs.iter().flatten() {
            if let Some(p) = s.producer {
                assert!(p < n.index, "node {} reads node {p}", n.index);
            }
        }
    }
    (arch, raw.graph, assignments, e.last_routing().to_vec())
}

/// Working (non-view) nodes per band.
fn working(graph: &[NodeInfo], bands: &[Assignment], band: &str) -> usize {
    graph
        .iter()
        .zip(bands)
        .filter(|(n, a)| a.band == band && n.is_working())
        .count()
}

fn matmuls_of(graph: &[NodeInfo], tokens: &[&str]) -> usize {
    graph
        .iter()
        .filter(|n| n.op == "MUL_MAT")
        .filter(|n| {
            n.weight()
                .is_some_and(|w| tokens.contains(&weight_token(&w.name)))
        })
        .count()
}

fn count(graph: &[NodeInfo], op: &str, name_token: &str) -> usize {
    graph
        .iter()
        .filter(|n| n.op == op && n.base_name() == name_token)
        .count()
}

#[test]
fn tiny_qwen3moe_graph_follows_the_architecture_and_the_routing() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen3moe");
    let chunk = 64usize;
    let (arch, graph, bands, routing) = profile_and_check(&path, &work(chunk as u32, 0, false));
    let layers = arch.n_layers() as usize;
    let k = arch.n_experts_used as usize;
    assert_eq!(routing.len(), layers, "one routing per MoE layer");
    for (il, r) in routing.iter().enumerate() {
        assert_eq!(r.len(), arch.n_experts as usize);
        // every layer routes every token to k experts; the last layer only the last token
        let rows = if il + 1 == layers { 1 } else { chunk };
        assert_eq!(r.iter().sum::<usize>(), rows * k, "layer {il}");
    }
    // (layer, expert) pairs that received at least one token
    let pairs: Vec<usize> = routing
        .iter()
        .map(|r| r.iter().filter(|&&n| n > 0).count())
        .collect();
    let all_pairs: usize = pairs.iter().sum();
    assert_eq!(
        matmuls_of(&graph, &["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]),
        3 * all_pairs
    );
    assert_eq!(matmuls_of(&graph, &["ffn_gate_inp"]), layers, "routers");
    assert_eq!(
        matmuls_of(&graph, &["attn_q", "attn_k", "attn_v", "attn_output"]),
        4 * layers
    );
    assert_eq!(matmuls_of(&graph, &["output"]), 1, "LM head");
    // one attention core per layer: kq, softmax, kqv
    assert_eq!(count(&graph, "MUL_MAT", "kq"), layers);
    assert_eq!(count(&graph, "SOFT_MAX", "kq_soft_max"), layers);
    assert_eq!(count(&graph, "MUL_MAT", "kqv"), layers);
    assert_eq!(count(&graph, "MOE_ROUTE", "ffn_moe_route"), layers);
    assert_eq!(count(&graph, "SET_ROWS", "cache_k"), layers);
    // working nodes per band, from the forward pass's construction:
    // attention: q/k norm + rope (4), two cache writes, the q copy, kq, scale, mask, softmax,
    // kqv and its copy (13); projections: attn_norm, Q, K, V, O (5); other: embedding,
    // ffn_inp and l_out per layer, final norm, LM head; moe: ffn_norm, router logits, probs,
    // argsort, top-k copy, weights, sum, clamp, norm, route, gather (11), per routed expert
    // gate, up, silu, x up, down (5), concat, weighted, scatter-add (3)
    assert_eq!(working(&graph, &bands, "attention"), 13 * layers);
    assert_eq!(working(&graph, &bands, "projections"), 5 * layers);
    assert_eq!(working(&graph, &bands, "other"), 3 + 2 * layers);
    assert_eq!(working(&graph, &bands, "moe"), 14 * layers + 5 * all_pairs);
    assert_eq!(
        graph.iter().filter(|n| n.is_working()).count(),
        (13 + 5 + 2 + 14) * layers + 3 + 5 * all_pairs
    );
}

#[test]
fn all_logits_run_the_last_layer_on_every_token() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen3moe");
    let (arch, _, _, routing) = profile_and_check(&path, &work(32, 0, true));
    let k = arch.n_experts_used as usize;
    assert!(routing.iter().all(|r| r.iter().sum::<usize>() == 32 * k));
}

#[test]
fn dense_models_profile_with_full_coverage() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    for (preset, attention_per_layer) in [("tiny-qwen3", 13), ("tiny-llama", 11)] {
        let path = synth(dir.path(), preset);
        let (arch, graph, bands, routing) = profile_and_check(&path, &work(32, 16, false));
        let layers = arch.n_layers() as usize;
        assert!(routing.is_empty(), "{preset}");
        assert_eq!(
            matmuls_of(&graph, &["ffn_gate", "ffn_up", "ffn_down"]),
            3 * layers
        );
        assert_eq!(working(&graph, &bands, "dense_ffn"), 6 * layers, "{preset}");
        assert_eq!(
            working(&graph, &bands, "attention"),
            attention_per_layer * layers,
            "{preset}"
        );
        assert_eq!(working(&graph, &bands, "projections"), 5 * layers);
    }
}

#[test]
fn depth_state_is_restored_between_runs() {
    let _machine = crate::machine::shared();
    // At depth 96 every run must start from the prepared cache: repeated runs of every mode
    // return bit-identical logits (a run that moved the cache on would not).
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen3moe");
    let mut e = candle(&path);
    e.prepare(&work(32, 96, true)).unwrap();
    let graph = e.graph().unwrap();
    assert!(!graph.is_empty());
    let first = e.run(Mode::Fused).unwrap().output_hash;
    for mode in [Mode::Timed, Mode::FusedObserved, Mode::Fused, Mode::Timed] {
        let r = e.run(mode).unwrap();
        assert_eq!(r.output_hash, first, "{mode:?}");
        if mode == Mode::Timed {
            assert_eq!(r.node_us.len(), graph.len());
        }
        if mode == Mode::FusedObserved {
            assert_eq!(r.nodes_seen as usize, graph.len());
        }
    }
}

/// Rewrites a file with separate gate and up expert tensors into one with a fused
/// `ffn_gate_up_exps {E, 2ff, n_expert}` (per expert: the gate rows, then the up rows).
fn fuse_gate_up(src: &Path, dst: &Path) {
    let file = GgufFile::open(src).unwrap();
    let mut reader = std::fs::File::open(src).unwrap();
    let mut specs = Vec::new();
    for t in &file.tensors {
        if t.name.ends_with("ffn_up_exps.weight") {
            continue;
        }
        if t.name.ends_with("ffn_gate_exps.weight") {
            let name = t.name.replace("ffn_gate_exps", "ffn_gate_up_exps");
            specs.push(TensorSpec::new(
                name,
                &[t.dims[0], 2 * t.dims[1], t.dims[2]],
                t.ggml_type,
            ));
        } else {
            specs.push(TensorSpec::new(t.name.clone(), &t.dims, t.ggml_type));
        }
    }
    let mut w = GgufWriter::create(dst, &file.metadata, &specs).unwrap();
    for t in &file.tensors {
        if t.name.ends_with("ffn_up_exps.weight") {
            continue;
        }
        if t.name.ends_with("ffn_gate_exps.weight") {
            let up_name = t.name.replace("ffn_gate_exps", "ffn_up_exps");
            let gate = file.read_tensor_data(&mut reader, &t.name).unwrap();
            let up = file.read_tensor_data(&mut reader, &up_name).unwrap();
            let n = t.dims[2] as usize;
            let per = gate.len() / n;
            let mut fused = Vec::with_capacity(2 * gate.len());
            for e in 0..n {
                fused.extend_from_slice(&gate[e * per..(e + 1) * per]);
                fused.extend_from_slice(&up[e * per..(e + 1) * per]);
            }
            let name = t.name.replace("ffn_gate_exps", "ffn_gate_up_exps");
            w.write_tensor(&name, &fused).unwrap();
        } else {
            let data = file.read_tensor_data(&mut reader, &t.name).unwrap();
            w.write_tensor(&t.name, &data).unwrap();
        }
    }
    w.finish().unwrap();
}

#[test]
fn fused_gate_up_experts_compute_what_separate_ones_do() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let separate = synth(dir.path(), "tiny-qwen3moe");
    let fused = dir.path().join("fused.gguf");
    fuse_gate_up(&separate, &fused);
    let w = work(32, 0, true);
    let a = candle_logits(&separate, &w);
    let b = candle_logits(&fused, &w);
    // the same dot products, row by row: equal up to the order of nothing
    let worst = a
        .iter()
        .flatten()
        .zip(b.iter().flatten())
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= 1e-4,
        "fused and separate gate/up differ by {worst}"
    );
    let (arch, graph, bands, routing) = profile_and_check(&fused, &work(32, 0, false));
    assert!(arch.fused_gate_up);
    let pairs: usize = routing
        .iter()
        .map(|r| r.iter().filter(|&&n| n > 0).count())
        .sum();
    assert_eq!(
        matmuls_of(&graph, &["ffn_gate_up_exps", "ffn_down_exps"]),
        2 * pairs
    );
    assert_eq!(
        working(&graph, &bands, "moe"),
        14 * arch.n_layers() as usize + 4 * pairs
    );
}

fn decode_work(fill_batch: u32, depth: u32, steps: u32, parallel: u32) -> Work {
    Work {
        token_seed: 5,
        decode_tokens: steps,
        parallel,
        ..Work::prefill(fill_batch, depth)
    }
}

/// The logits of the last decode step, one row per sequence, from `engine` (FUSED run).
fn decode_logits(engine: &mut dyn Engine, w: &Work) -> Vec<Vec<f32>> {
    engine.prepare(w).unwrap();
    engine.run(Mode::Fused).unwrap();
    engine.logits().unwrap()
}

fn candle_decode_logits(path: &Path, w: &Work) -> Vec<Vec<f32>> {
    let mut e = candle(path);
    e.prepare(w).unwrap();
    e.run(Mode::Fused).unwrap();
    e.last_logits().to_vec()
}

/// The same from llama.cpp as `--engine llama.cpp` opens it (the bundled worker).
fn llama_decode_logits(path: &Path, w: &Work) -> Vec<Vec<f32>> {
    let mut e = crate::llama_cpp(path, &opledger_app::engines::EngineSettings::new(2));
    decode_logits(e.as_mut(), w)
}

#[test]
fn candle_decode_steps_agree_with_llama_cpp_decode() {
    let _machine = crate::machine::shared();
    // 4 steps of 3 sequences sharing a context filled to 40 tokens (in batches of 16): each
    // sequence attends over the shared prefix and its own earlier steps only
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen3moe");
    let w = decode_work(16, 40, 4, 3);
    let c = candle_decode_logits(&path, &w);
    assert_eq!(c.len(), 3, "one row per sequence of the last step");
    compare(
        "qwen3moe decode",
        &QUANTISED,
        &c,
        &llama_decode_logits(&path, &w),
    );
    // no prefix: the sequences share nothing
    let w = decode_work(16, 0, 3, 2);
    compare(
        "qwen3moe decode from empty",
        &QUANTISED,
        &candle_decode_logits(&path, &w),
        &llama_decode_logits(&path, &w),
    );
    let path = synth_f32(dir.path(), "tiny-llama");
    let w = decode_work(16, 24, 3, 4);
    compare(
        "llama f32 decode",
        &FLOAT,
        &candle_decode_logits(&path, &w),
        &llama_decode_logits(&path, &w),
    );
}

#[test]
fn candle_decode_computes_one_token_per_sequence_per_step() {
    let _machine = crate::machine::shared();
    // `profile --engine candle -n 3 --parallel 2`: the run is 3 steps of 2 tokens, never a
    // prefill chunk divided by decode tokens
    let dir = tempfile::tempdir().unwrap();
    let path = synth(dir.path(), "tiny-qwen3moe");
    let (steps, parallel, depth) = (3usize, 2usize, 20usize);
    let w = decode_work(8, depth as u32, steps as u32, parallel as u32);
    let (arch, graph, bands, routing) = profile_and_check(&path, &w);
    let layers = arch.n_layers() as usize;
    // the graph lists every step: one LM head a step, each over one row per sequence
    let heads: Vec<&NodeInfo> = graph.iter().filter(|n| n.name == "result_output").collect();
    assert_eq!(heads.len(), steps);
    for h in &heads {
        assert_eq!(h.out.ne[1] as usize, parallel, "logits rows of a step");
    }
    // every activation matmul of the projections reads P rows
    for n in graph
        .iter()
        .zip(&bands)
        .filter(|(n, a)| a.band == "projections" && n.op == "MUL_MAT")
        .map(|(n, _)| n)
    {
        assert_eq!(
            n.srcs[1].as_ref().unwrap().ne[1] as usize,
            parallel,
            "{}",
            n.name
        );
    }
    // attention of step s spans the prefix and P rows a step so far
    let kq: Vec<&NodeInfo> = graph
        .iter()
        .filter(|n| n.op == "MUL_MAT" && n.base_name() == "kq")
        .collect();
    assert_eq!(kq.len(), steps * layers);
    for (i, n) in kq.iter().enumerate() {
        let s = i / layers;
        assert_eq!(
            n.out.ne[0] as usize,
            depth + (s + 1) * parallel,
            "kq of step {s}"
        );
    }
    // routing: per step, per layer, every sequence's token to k experts
    let k = arch.n_experts_used as usize;
    assert_eq!(routing.len(), steps * layers);
    assert!(routing
        .iter()
        .all(|r| r.iter().sum::<usize>() == parallel * k));
    let pairs: usize = routing
        .iter()
        .map(|r| r.iter().filter(|&&n| n > 0).count())
        .sum();
    assert_eq!(
        matmuls_of(&graph, &["ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"]),
        3 * pairs
    );
    // the summary: 6 tokens a run, each node one step's time
    let file = ModelFile::open_structural(&path).unwrap();
    let rules = BandRules::builtin(&file.arch.arch).unwrap();
    let mut e = candle(&path);
    let cfg = ProfileConfig {
        work: w,
        cycles: 1,
        warmup: 0,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = measure(&mut e, &cfg, &mut |_, _, _| {}).unwrap();
    assert_eq!(raw.node_steps(), 1);
    let (_, summary) = analyse(&raw, &rules, &file.arch).unwrap();
    assert_eq!((summary.tokens, summary.decode_tokens), (6, 3));
    assert_eq!(summary.node_steps, 1);
    assert_eq!(
        e.info().settings["n_ctx"],
        (depth + steps * parallel).to_string()
    );
}
