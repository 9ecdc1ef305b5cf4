//! Categorising and summarising sweep records: a 40-layer qwen35moe-shaped graph (3848 nodes),
//! 80 depths, 3 cycles (about 0.9 million node records a TIMED pass set). Goal: at least 5
//! million records a second on one core. Run with `cargo bench -p opledger-core`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use opledger_core::arch::{ArchInfo, FfnKind, LayerInfo, LayerKind, LayerWeights, Mixer};
use opledger_core::band::{BandRules, Categoriser};
use opledger_core::engine::{Mode, Work};
use opledger_core::node::{is_view_op, layer_of, NodeInfo, TensorDesc};
use opledger_core::sweep::{summarise_sweep, ChunkRecord, Phase, SweepConfig, SweepIndex};
use opledger_core::tokens::splitmix64;

/// (op, name, weight token) of one layer of each kind, roughly llama.cpp's qwen35moe.
const LINEAR: [(&str, &str, &str); 12] = [
    ("RMS_NORM", "norm", ""),
    ("MUL", "attn_norm", "attn_norm"),
    ("MUL_MAT", "linear_attn_qkv_mixed", "attn_qkv"),
    ("VIEW", "q_conv", ""),
    ("SSM_CONV", "conv_output_raw", ""),
    ("GATED_DELTA_NET", "node", ""),
    ("MUL_MAT", "linear_attn_out", "ssm_out"),
    ("ADD", "attn_residual", ""),
    ("MUL_MAT", "ffn_moe_logits", "ffn_gate_inp"),
    ("MUL_MAT_ID", "ffn_moe_gate", "ffn_gate_exps"),
    ("RESHAPE", "ffn_moe_weighted", ""),
    ("ADD", "l_out", ""),
];
const FULL: [(&str, &str, &str); 8] = [
    ("MUL", "attn_norm", "attn_norm"),
    ("MUL_MAT", "Qcur_full", "attn_q"),
    ("ROPE", "Qcur", ""),
    ("PERMUTE", "Qcur", ""),
    ("FLASH_ATTN_EXT", "node", ""),
    ("MUL_MAT", "attn_output", "attn_output"),
    ("MUL_MAT_ID", "ffn_moe_down", "ffn_down_exps"),
    ("ADD", "l_out", ""),
];

fn graph(layers: u32, nodes: usize) -> Vec<NodeInfo> {
    let mut g = Vec::with_capacity(nodes);
    while g.len() < nodes {
        for l in 0..layers {
            let pattern: &[(&str, &str, &str)] = if (l + 1) % 4 == 0 { &FULL } else { &LINEAR };
            for &(op, name, w) in pattern {
                let i = g.len() as u32;
                let name = if name == "node" {
                    format!("node_{i}")
                } else {
                    format!("{name}-{l}")
                };
                let desc = |n: String, weight: bool, producer: Option<u32>| TensorDesc {
                    name: n,
                    ne: [2048, 512, 1, 1],
                    ggml_type: "F32".into(),
                    size_bytes: 0,
                    is_weight: weight,
                    producer,
                    nb: [0; 4],
                };
                let mut srcs = Vec::new();
                if !w.is_empty() {
                    srcs.push(Some(desc(format!("blk.{l}.{w}.weight"), true, None)));
                }
                if i > 0 {
                    srcs.push(Some(desc("x".into(), false, Some(i - 1))));
                }
                g.push(NodeInfo {
                    index: i,
                    op: op.into(),
                    layer: layer_of(&name),
                    out: desc(name.clone(), false, None),
                    name,
                    srcs,
                    is_view: is_view_op(op),
                    inplace: false,
                    skipped: false,
                    op_code: None,
                    op_params: Vec::new(),
                    device: None,
                });
                if g.len() == nodes {
                    return g;
                }
            }
        }
    }
    g
}

fn bench(c: &mut Criterion) {
    let layers = 40;
    let g = graph(layers, 3848);
    let rules = BandRules::builtin("qwen35moe").unwrap();
    let arch = ArchInfo {
        arch: "qwen35moe".into(),
        layers: (0..layers)
            .map(|l| {
                let full = (l + 1) % 4 == 0;
                LayerInfo {
                    kind: if full {
                        LayerKind::FullAttention
                    } else {
                        LayerKind::LinearAttention
                    },
                    mixer: if full {
                        Mixer::Attention
                    } else {
                        Mixer::DeltaNet
                    },
                    window: None,
                    ffn: FfnKind::Moe,
                    shared_expert: true,
                    weights: LayerWeights::default(),
                }
            })
            .collect(),
        notes: Vec::new(),
        ssm_inner_size: 4096,
        n_experts: 256,
        n_experts_used: 8,
        shared_expert: true,
        fused_gate_up: false,
        n_embd: 2048,
        n_head: 16,
        n_head_kv: 2,
        n_vocab: 248_320,
        key_length: 256,
        value_length: 256,
        ssm_conv_kernel: 4,
        ssm_state_size: 128,
        ssm_group_count: 16,
        ssm_time_step_rank: 32,
        ffn_length: 512,
    };
    let cfg = SweepConfig {
        work: Work {
            chunk_tokens: 512,
            depth_tokens: 0,
            all_logits: false,
            token_seed: 0,
            decode_tokens: 0,
            parallel: 1,
        },
        chunks: 80,
        cycles: 3,
        decode: None,
    };
    let mut records = Vec::new();
    for cycle in 0..cfg.cycles {
        for chunk in 0..cfg.chunks {
            records.push(ChunkRecord {
                cycle,
                mode: Mode::Fused,
                chunk,
                phase: Phase::Prefill,
                wall_ms: 3000.0,
                output_hash: 1,
                outputs_nmse: None,
                isolation_us: 0.0,
                isolation_node_us: Vec::new(),
                node_us: Vec::new(),
            });
            let node_us = (0..g.len())
                .map(|i| {
                    (splitmix64((cycle * 1_000_003 + chunk * 7919 + i as u32) as u64) % 5000) as f32
                })
                .collect();
            records.push(ChunkRecord {
                cycle,
                mode: Mode::Timed,
                chunk,
                phase: Phase::Prefill,
                wall_ms: 3100.0,
                output_hash: 1,
                outputs_nmse: None,
                isolation_us: 0.0,
                isolation_node_us: Vec::new(),
                node_us,
            });
        }
    }
    let node_records = (g.len() as u64) * (cfg.chunks * cfg.cycles) as u64;
    let mut group = c.benchmark_group("sweep");
    group.throughput(Throughput::Elements(node_records));
    group.sample_size(20);
    group.bench_function(
        "categorise_and_summarise_40_layers_80_depths_3_cycles",
        |b| {
            b.iter(|| {
                let a = Categoriser::new(&rules, &arch).categorise(&g);
                let idx = SweepIndex::new(&g, &a, &rules, &arch);
                summarise_sweep(&cfg, &rules, &g, &idx, &records, &[]).unwrap()
            })
        },
    );
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
