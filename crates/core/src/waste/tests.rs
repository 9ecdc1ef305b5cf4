use std::collections::BTreeMap;

use super::*;
use crate::band::Assignment;
use crate::band::Reason;
use crate::node::NodeInfo;
use crate::node::{is_view_op, layer_of, TensorDesc};
use crate::profile::ProfileRaw;
use crate::profile::{CycleRecord, ProfileConfig};

/// A source of a hand-made node.
enum S {
    /// The output of node i.
    N(u32),
    /// An input or cache tensor (no producer).
    Leaf(&'static str, [i64; 4]),
    /// A model weight.
    W(&'static str, [i64; 4]),
}

#[derive(Default)]
struct G(Vec<NodeInfo>);

fn desc(name: &str, ne: [i64; 4]) -> TensorDesc {
    TensorDesc {
        name: name.into(),
        ne,
        ggml_type: "F32".into(),
        size_bytes: 4 * ne.iter().product::<i64>() as u64,
        is_weight: false,
        producer: None,
        nb: [0; 4],
    }
}

impl G {
    fn add(&mut self, op: &str, name: &str, ne: [i64; 4], srcs: &[S]) -> u32 {
        let srcs = srcs
            .iter()
            .map(|s| {
                Some(match s {
                    S::N(i) => {
                        let p = &self.0[*i as usize];
                        TensorDesc {
                            producer: Some(*i),
                            nb: [0; 4],
                            ..desc(&p.out.name, p.out.ne)
                        }
                    }
                    S::Leaf(n, ne) => desc(n, *ne),
                    S::W(n, ne) => TensorDesc {
                        is_weight: true,
                        ..desc(n, *ne)
                    },
                })
            })
            .collect();
        let index = self.0.len() as u32;
        let is_view = is_view_op(op);
        self.0.push(NodeInfo {
            index,
            op: op.into(),
            name: name.into(),
            layer: layer_of(name),
            out: desc(name, ne),
            srcs,
            is_view,
            inplace: op == "SET_ROWS" || op == "CPY",
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        });
        index
    }
}

fn last_only(tokens: u32) -> Work {
    Work::prefill(tokens, 0)
}

/// (needed, rows) of every node.
fn counts(needs: &[NodeNeed]) -> Vec<(u32, u32)> {
    needs.iter().map(|d| (d.needed, d.rows)).collect()
}

/// x = embeddings of 8 tokens; norm, matmul, activation; the out_ids selection; logits.
fn chain(selected: i64) -> G {
    let mut g = G::default();
    let x = g.add(
        "GET_ROWS",
        "embd",
        [16, 8, 1, 1],
        &[
            S::W("token_embd.weight", [16, 32, 1, 1]),
            S::Leaf("inp_tokens", [8, 1, 1, 1]),
        ],
    );
    let n = g.add("RMS_NORM", "norm-0", [16, 8, 1, 1], &[S::N(x)]);
    let m = g.add(
        "MUL_MAT",
        "ffn_up-0",
        [24, 8, 1, 1],
        &[S::W("blk.0.ffn_up.weight", [16, 24, 1, 1]), S::N(n)],
    );
    let a = g.add("SILU", "ffn_act-0", [24, 8, 1, 1], &[S::N(m)]);
    let s = g.add(
        "GET_ROWS",
        "result_norm",
        [24, selected, 1, 1],
        &[S::N(a), S::Leaf("out_ids", [selected, 1, 1, 1])],
    );
    g.add(
        "MUL_MAT",
        "result_output",
        [32, selected, 1, 1],
        &[S::W("output.weight", [24, 32, 1, 1]), S::N(s)],
    );
    g
}

#[test]
fn a_chain_ending_in_a_row_selection_needs_only_the_selected_row() {
    let g = chain(1);
    let d = needs(&g.0, &last_only(8));
    assert_eq!(counts(&d), [(1, 8), (1, 8), (1, 8), (1, 8), (1, 1), (1, 1)]);
    // the row that survives is the last token's
    assert!(d[..4].iter().all(|n| n.last_needed == Some(7)));
    assert_eq!(d[5].kept, Some(Kept::Logits));
    assert_eq!(d[2].token_dim, Some(1));
    assert_eq!(d[4].token_dim, None);
}

#[test]
fn all_logits_need_every_row() {
    let g = chain(8);
    let work = Work {
        all_logits: true,
        ..last_only(8)
    };
    let d = needs(&g.0, &work);
    assert!(d.iter().all(|n| n.needed == n.rows), "{:?}", counts(&d));
    assert_eq!(d[5].rows, 8);
}

#[test]
fn a_selection_the_request_does_not_explain_keeps_every_row() {
    // out_ids holds 2 rows but the work asked for the last token only: the rows are unknown
    let g = chain(2);
    let d = needs(&g.0, &last_only(8));
    assert_eq!(d[3].needed, 8);
}

/// Q, K and V projections of 8 tokens (3 heads of 4), attention without a cache (K and V are
/// computed in the graph), the output projection, the selection, logits.
fn attention_graph(op_for_k: &str) -> G {
    let mut g = G::default();
    let x = g.add(
        "GET_ROWS",
        "embd",
        [12, 8, 1, 1],
        &[
            S::W("token_embd.weight", [12, 32, 1, 1]),
            S::Leaf("inp_tokens", [8, 1, 1, 1]),
        ],
    );
    let proj = |g: &mut G, w: &'static str, name: &'static str, op: &str| {
        let m = g.add(op, name, [12, 8, 1, 1], &[S::W(w, [12, 12, 1, 1]), S::N(x)]);
        let r = g.add("RESHAPE", name, [4, 3, 8, 1], &[S::N(m)]);
        g.add("PERMUTE", name, [4, 8, 3, 1], &[S::N(r)])
    };
    let q = proj(&mut g, "blk.0.attn_q.weight", "Qcur-0", "MUL_MAT");
    let k = proj(&mut g, "blk.0.attn_k.weight", "Kcur-0", op_for_k);
    let v = proj(&mut g, "blk.0.attn_v.weight", "Vcur-0", "MUL_MAT");
    let fa = g.add(
        "FLASH_ATTN_EXT",
        "node_10",
        [4, 3, 8, 1],
        &[
            S::N(q),
            S::N(k),
            S::N(v),
            S::Leaf("attn_inp_kq_mask", [8, 8, 1, 1]),
        ],
    );
    let o = g.add("RESHAPE", "kqv_out-0", [12, 8, 1, 1], &[S::N(fa)]);
    let s = g.add(
        "GET_ROWS",
        "node_12",
        [12, 1, 1, 1],
        &[S::N(o), S::Leaf("out_ids", [1, 1, 1, 1])],
    );
    g.add(
        "MUL_MAT",
        "result_output",
        [32, 1, 1, 1],
        &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
    );
    g
}

#[test]
fn attention_needs_every_row_of_k_and_v_but_only_the_read_rows_of_q() {
    let g = attention_graph("MUL_MAT");
    let d = needs(&g.0, &last_only(8));
    let by_name = |name: &str, op: &str| {
        let i =
            g.0.iter()
                .position(|n| n.name == name && n.op == op)
                .unwrap();
        (d[i].needed, d[i].rows)
    };
    assert_eq!(by_name("node_10", "FLASH_ATTN_EXT"), (1, 8));
    assert_eq!(by_name("Qcur-0", "MUL_MAT"), (1, 8));
    assert_eq!(by_name("Kcur-0", "MUL_MAT"), (8, 8));
    assert_eq!(by_name("Vcur-0", "MUL_MAT"), (8, 8));
    assert_eq!(by_name("embd", "GET_ROWS"), (8, 8));
    // the permuted query keeps its token dimension through the view ops
    assert_eq!(d[3].token_dim, Some(1));
    assert_eq!(d[10].token_dim, Some(2));
}

#[test]
fn an_unknown_op_needs_everything() {
    // K computed by an op no rule knows: all its rows count as needed, and so do its inputs'
    let g = attention_graph("MYSTERY_OP");
    let d = needs(&g.0, &last_only(8));
    let k = g.0.iter().position(|n| n.op == "MYSTERY_OP").unwrap();
    assert_eq!(d[k].treatment, Treatment::Unknown);
    assert_eq!((d[k].needed, d[k].rows), (8, 8));

    // an unknown op on the path to the logits: the selection's row saving stops there
    let mut g = G::default();
    let x = g.add(
        "GET_ROWS",
        "embd",
        [12, 8, 1, 1],
        &[
            S::W("token_embd.weight", [12, 32, 1, 1]),
            S::Leaf("inp_tokens", [8, 1, 1, 1]),
        ],
    );
    let m = g.add("MYSTERY_OP", "mystery-0", [12, 8, 1, 1], &[S::N(x)]);
    let y = g.add(
        "MUL_MAT",
        "y-0",
        [12, 8, 1, 1],
        &[S::W("blk.0.y.weight", [12, 12, 1, 1]), S::N(m)],
    );
    let s = g.add(
        "GET_ROWS",
        "sel",
        [12, 1, 1, 1],
        &[S::N(y), S::Leaf("out_ids", [1, 1, 1, 1])],
    );
    g.add(
        "MUL_MAT",
        "result_output",
        [32, 1, 1, 1],
        &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
    );
    let d = needs(&g.0, &last_only(8));
    assert_eq!(counts(&d), [(8, 8), (8, 8), (1, 8), (1, 1), (1, 1)]);
}

#[test]
fn a_cache_write_keeps_rows_alive() {
    let mut g = G::default();
    let x = g.add(
        "GET_ROWS",
        "embd",
        [12, 8, 1, 1],
        &[
            S::W("token_embd.weight", [12, 32, 1, 1]),
            S::Leaf("inp_tokens", [8, 1, 1, 1]),
        ],
    );
    let k = g.add(
        "MUL_MAT",
        "Kcur-0",
        [12, 8, 1, 1],
        &[S::W("blk.0.attn_k.weight", [12, 12, 1, 1]), S::N(x)],
    );
    let w = g.add(
        "SET_ROWS",
        "cache_k_l0 (view)",
        [12, 16, 1, 1],
        &[
            S::N(k),
            S::Leaf("attn_inp_k_idxs", [8, 1, 1, 1]),
            S::Leaf("cache_k_l0", [12, 16, 1, 1]),
        ],
    );
    let q = g.add(
        "MUL_MAT",
        "Qcur-0",
        [12, 8, 1, 1],
        &[S::W("blk.0.attn_q.weight", [12, 12, 1, 1]), S::N(x)],
    );
    let s = g.add(
        "GET_ROWS",
        "sel",
        [12, 1, 1, 1],
        &[S::N(q), S::Leaf("out_ids", [1, 1, 1, 1])],
    );
    g.add(
        "MUL_MAT",
        "result_output",
        [32, 1, 1, 1],
        &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
    );
    // a conv-state write: a CPY into a view of cache_r_l0 whose own name does not say so
    let tail = g.add("VIEW", "conv_state_last-0", [12, 3, 1, 1], &[S::N(x)]);
    let dst = g.add(
        "VIEW",
        "conv_state_update-0",
        [36, 1, 1, 1],
        &[S::Leaf("cache_r_l0", [36, 1, 1, 1])],
    );
    let cpy = g.add(
        "CPY",
        "conv_state_update-0 (copy of conv_state_last-0)",
        [36, 1, 1, 1],
        &[S::N(tail), S::N(dst)],
    );
    let d = needs(&g.0, &last_only(8));
    assert_eq!(d[w as usize].kept, Some(Kept::CacheWrite));
    assert_eq!(d[cpy as usize].kept, Some(Kept::CacheWrite));
    assert_eq!((d[k as usize].needed, d[k as usize].rows), (8, 8));
    assert_eq!((d[q as usize].needed, d[q as usize].rows), (1, 8));
    assert_eq!((d[x as usize].needed, d[x as usize].rows), (8, 8));
    // a view of 3 rows of 8 does not say which: its source is needed whole
    assert_eq!(d[tail as usize].token_dim, None);
}

#[test]
fn a_scan_needs_every_row_up_to_the_last_needed_one() {
    let mut g = G::default();
    let x = g.add(
        "GET_ROWS",
        "embd",
        [12, 8, 1, 1],
        &[
            S::W("token_embd.weight", [12, 32, 1, 1]),
            S::Leaf("inp_tokens", [8, 1, 1, 1]),
        ],
    );
    let c = g.add("SSM_CONV", "conv-0", [12, 8, 1, 1], &[S::N(x)]);
    let a = g.add("SILU", "act-0", [12, 8, 1, 1], &[S::N(c)]);
    let s = g.add(
        "GET_ROWS",
        "sel",
        [12, 1, 1, 1],
        &[S::N(a), S::Leaf("out_ids", [1, 1, 1, 1])],
    );
    g.add(
        "MUL_MAT",
        "result_output",
        [32, 1, 1, 1],
        &[S::W("output.weight", [12, 32, 1, 1]), S::N(s)],
    );
    // output row 3 of 8 requested: the scan runs rows 0..=3, the activation after it row 3
    let d = needs_for(&g.0, 8, &[3]);
    assert_eq!(counts(&d), [(4, 8), (4, 8), (1, 8), (1, 1), (1, 1)]);
    assert_eq!(d[0].last_needed, Some(3));
    // the last row requested: the scan needs every row
    let d = needs(&g.0, &last_only(8));
    assert_eq!(counts(&d)[..3], [(8, 8), (8, 8), (1, 8)]);
}

#[test]
fn a_width_equal_to_the_chunk_does_not_hide_the_token_dimension() {
    // experts of width 8 on a chunk of 8 tokens: [8, 2, 8] outputs, then the selection
    // leaves a [12, 1] row (one row, not 12 tokens)
    let mut g = G::default();
    let x = g.add(
        "GET_ROWS",
        "embd",
        [12, 8, 1, 1],
        &[
            S::W("token_embd.weight", [12, 32, 1, 1]),
            S::Leaf("inp_tokens", [8, 1, 1, 1]),
        ],
    );
    let r = g.add("RESHAPE", "embd (reshaped)", [12, 1, 8, 1], &[S::N(x)]);
    let h = g.add(
        "MUL_MAT",
        "h-0",
        [8, 8, 1, 1],
        &[S::W("blk.0.h.weight", [12, 8, 1, 1]), S::N(x)],
    );
    let gate = g.add(
        "MUL_MAT_ID",
        "ffn_moe_gate-0",
        [8, 2, 8, 1],
        &[
            S::W("blk.0.ffn_gate_exps.weight", [12, 8, 4, 1]),
            S::N(r),
            S::Leaf("ffn_moe_topk-0", [2, 8, 1, 1]),
        ],
    );
    let act = g.add("SILU", "ffn_moe_act-0", [8, 2, 8, 1], &[S::N(gate)]);
    let down = g.add(
        "MUL_MAT_ID",
        "ffn_moe_down-0",
        [12, 2, 8, 1],
        &[
            S::W("blk.0.ffn_down_exps.weight", [8, 12, 4, 1]),
            S::N(act),
            S::Leaf("ffn_moe_topk-0", [2, 8, 1, 1]),
        ],
    );
    let v = g.add(
        "VIEW",
        "ffn_moe_down-0 (view)",
        [12, 8, 1, 1],
        &[S::N(down)],
    );
    let hv = g.add(
        "MUL_MAT",
        "hv-0",
        [12, 8, 1, 1],
        &[S::W("blk.0.hv.weight", [8, 12, 1, 1]), S::N(h)],
    );
    let sum = g.add("ADD", "sum-0", [12, 8, 1, 1], &[S::N(v), S::N(hv)]);
    let s = g.add(
        "GET_ROWS",
        "sel",
        [12, 1, 1, 1],
        &[S::N(sum), S::Leaf("out_ids", [1, 1, 1, 1])],
    );
    let e = g.add(
        "MUL_MAT",
        "sel_proj",
        [8, 1, 1, 1],
        &[S::W("blk.0.e.weight", [12, 8, 1, 1]), S::N(s)],
    );
    g.add(
        "MUL_MAT",
        "result_output",
        [32, 1, 1, 1],
        &[S::W("output.weight", [8, 32, 1, 1]), S::N(e)],
    );
    let d = needs(&g.0, &last_only(8));
    assert_eq!(d[h as usize].token_dim, Some(1));
    assert_eq!(d[gate as usize].token_dim, Some(2));
    assert_eq!(d[act as usize].token_dim, Some(2));
    for i in [x, r, h, gate, act, down, v, hv, sum] {
        assert_eq!(
            (d[i as usize].needed, d[i as usize].rows),
            (1, 8),
            "node {i}"
        );
    }
    assert_eq!(d[e as usize].token_dim, None);
    assert_eq!((d[e as usize].needed, d[e as usize].rows), (1, 1));
}

fn raw_of(graph: Vec<NodeInfo>, times: &[&[f64]], fused_ms: f64) -> ProfileRaw {
    ProfileRaw {
        schema_version: 1,
        config: ProfileConfig {
            work: last_only(8),
            cycles: times.len() as u32,
            warmup: 0,
            overhead_pairs: 0,
            gate: Default::default(),
        },
        graph,
        cycles: times
            .iter()
            .map(|t| CycleRecord {
                device_timed: None,
                device_fused: None,
                order: vec![],
                fused_ms,
                fused_observed_ms: fused_ms,
                timed_wall_ms: fused_ms,
                node_us: t.to_vec(),
                isolation_us: None,
                isolation_node_us: vec![],
                noise: Vec::new(),
            })
            .collect(),
        output_hashes: BTreeMap::new(),
        overhead_pairs: vec![],
        overhead_pairs_noise: Vec::new(),
        gate: Default::default(),
        outputs_checked_finite: true,
        node_steps: Some(1),
        one_process_fused_ms: Vec::new(),
        one_process_outputs: None,
        one_process_skipped: None,
        outputs_compared: Vec::new(),
    }
}

fn assign(bands: &[&str]) -> Vec<Assignment> {
    bands
        .iter()
        .map(|b| Assignment {
            band: b.to_string(),
            reason: Reason::None,
        })
        .collect()
}

#[test]
fn wasted_time_is_node_time_times_unread_share() {
    // times 10/20/80/10/5/40 µs: the first four read 1 row of 8
    let times: &[f64] = &[10.0, 20.0, 80.0, 10.0, 5.0, 40.0];
    let raw = raw_of(chain(1).0, &[times, times, times], 0.33);
    let bands = assign(&["other", "moe", "moe", "moe", "other", "other"]);
    let d = needs(&raw.graph, &raw.config.work);
    let s = summarise(&raw, &bands, &d, &["moe", "other"]).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let wasted_us = 120.0 * 7.0 / 8.0;
    assert!(close(s.wasted_timed_ms, wasted_us / 1e3));
    assert!(close(s.wasted_share, wasted_us / 165.0));
    assert!(close(s.wasted_ms_per_token, wasted_us / 165.0 * 0.33 / 8.0));
    assert!(close(
        s.gain_if_trimmed,
        1.0 / (1.0 - wasted_us / 165.0) - 1.0
    ));
    assert!(close(s.wasted_share_of_minimums, s.wasted_share));
    let moe = s.bands.iter().find(|b| b.band == "moe").unwrap();
    assert!(close(moe.wasted_share_of_band, 7.0 / 8.0));
    assert_eq!(moe.nodes, 3);
    assert_eq!(s.nodes[0].name, "ffn_up-0");
    assert_eq!((s.nodes[0].needed_rows, s.nodes[0].rows), (1, 8));
    assert_eq!(s.layers.len(), 2); // layer 0 and the nodes outside layers (embd)
    assert_eq!(s.layers[0].layer, Some(0));
    assert_eq!(s.kept.logits_nodes, 1);
    assert!(s.unknown_ops.is_empty());
    let v = serde_json::to_value(&s).unwrap();
    for key in [
        "schema_version",
        "wasted_share",
        "wasted_ms_per_token",
        "bands",
        "layers",
        "nodes",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
}

#[test]
fn the_wasted_point_lies_within_its_range() {
    // node times 10/20/x/10/5/y µs, the first four read 1 row of 8 (7/8 unread)
    // cycle:       1     2     3
    // x:          10    10   200
    // y:          10   200   200
    // FUSED ms:  0.2   0.8   0.2
    // per-cycle wasted ms/token = unread share of the TIMED sum x FUSED / 8 tokens:
    // 43.75/65 x 0.025, 43.75/255 x 0.1, 210/445 x 0.025 = 0.016827, 0.017157, 0.011798.
    // The old formula (medians 10/20/10/10/5/200 -> 43.75/255 x median FUSED 0.2 / 8 =
    // 0.004289) lay outside that range.
    let mut raw = raw_of(
        chain(1).0,
        &[
            &[10.0, 20.0, 10.0, 10.0, 5.0, 10.0],
            &[10.0, 20.0, 10.0, 10.0, 5.0, 200.0],
            &[10.0, 20.0, 200.0, 10.0, 5.0, 200.0],
        ],
        0.2,
    );
    raw.cycles[1].fused_ms = 0.8;
    let bands = assign(&["other", "moe", "moe", "moe", "other", "other"]);
    let d = needs(&raw.graph, &raw.config.work);
    let s = summarise(&raw, &bands, &d, &["moe", "other"]).unwrap();
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    let point = 43.75 / 65.0 * 0.2 / 8.0;
    assert!(
        close(s.wasted_ms_per_token, point),
        "{}",
        s.wasted_ms_per_token
    );
    assert!(close(s.wasted_ms_per_token_min, 210.0 / 445.0 * 0.2 / 8.0));
    assert!(close(s.wasted_ms_per_token_max, 43.75 / 255.0 * 0.8 / 8.0));
    // the whole: median of 0.2, 0.8, 0.2 / 8; the share is the ratio of the points
    assert!(close(s.ms_per_token, 0.2 / 8.0));
    assert!(close(s.wasted_share, 43.75 / 65.0));
    // every band's and node's figure by the same estimator: moe's unread rows
    // (nodes 1-3: 7/8 of 40, 40, 230) per cycle 35/65 x 0.025, 35/255 x 0.1,
    // 201.25/445 x 0.025 -> median 0.013462
    let moe = s.bands.iter().find(|b| b.band == "moe").unwrap();
    assert!(
        close(moe.wasted_ms_per_token, 35.0 / 65.0 * 0.025),
        "{moe:?}"
    );
}

#[test]
fn a_node_the_backend_skips_is_not_charged() {
    let mut g = chain(1);
    g.0[1].skipped = true;
    let d = needs(&g.0, &last_only(8));
    assert_eq!((d[1].needed, d[1].rows), (8, 8));
    assert_eq!((d[2].needed, d[2].rows), (1, 8));
}

#[test]
fn every_known_op_has_one_treatment() {
    for (i, (op, _)) in TREATMENTS.iter().enumerate() {
        assert!(
            TREATMENTS[i + 1..].iter().all(|(o, _)| o != op),
            "{op} listed twice"
        );
    }
    assert_eq!(treatment("NOT_AN_OP"), Treatment::Unknown);
}
