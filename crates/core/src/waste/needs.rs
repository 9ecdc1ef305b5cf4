//! The rows of every node's output that something kept reads: token dimensions found forward
//! through the graph, the kept outputs, and needed rows propagated backwards from them (see the
//! module's documentation for how each op passes them).

use super::{requested_rows, treatment, Kept, NodeNeed, Treatment, OUTPUT_IDS};
use crate::engine::Work;
use crate::node::{base_name, NodeInfo, TensorDesc};

/// The rows of every node's output that something kept reads, for a chunk of `work`.
pub fn needs(graph: &[NodeInfo], work: &Work) -> Vec<NodeNeed> {
    needs_for(graph, work.chunk_tokens, &requested_rows(work))
}

/// [`needs`] for a chunk of `chunk` tokens whose `out_ids` selection picks `selection`.
pub fn needs_for(graph: &[NodeInfo], chunk: u32, selection: &[u32]) -> Vec<NodeNeed> {
    let n = graph.len();
    let tok = token_dims(graph, chunk);
    let kept = kept_outputs(graph);
    let mut need = needed_rows(graph, &tok, &kept, selection);
    // nodes that compute nothing (skipped by the backend, or empty) are not charged
    for i in 0..n {
        if computes_nothing(&graph[i]) {
            need[i].iter_mut().for_each(|b| *b = true);
        }
    }
    (0..n)
        .map(|i| NodeNeed {
            token_dim: tok[i].map(|d| d as u8),
            rows: need[i].len() as u32,
            needed: need[i].iter().filter(|&&b| b).count() as u32,
            last_needed: need[i].iter().rposition(|&b| b).map(|r| r as u32),
            treatment: treatment(&graph[i].op),
            kept: kept[i],
        })
        .collect()
}

/// The node that computes a source, if it is a node of the graph.
fn producer_of(s: &TensorDesc, n: usize) -> Option<usize> {
    s.producer.map(|p| p as usize).filter(|&p| p < n)
}

/// A node the backend skips, or an empty one: neither kept nor charged.
fn computes_nothing(node: &NodeInfo) -> bool {
    node.skipped || node.out.ne.contains(&0)
}

/// Forward: the token rows each tensor holds, then its token dimension.
fn token_dims(graph: &[NodeInfo], chunk: u32) -> Vec<Option<usize>> {
    let n = graph.len();
    let mut basis = vec![chunk; n];
    let mut tok: Vec<Option<usize>> = vec![None; n];
    for i in 0..n {
        let node = &graph[i];
        let t = treatment(&node.op);
        let srcs: Vec<(usize, usize)> = node
            .srcs
            .iter()
            .enumerate()
            .filter_map(|(slot, s)| {
                s.as_ref()
                    .and_then(|s| producer_of(s, n))
                    .map(|p| (slot, p))
            })
            .collect();
        // an out_ids selection of tokens: the output holds the selected rows
        if t == Treatment::GetRows {
            if let (Some(a), Some(ids)) = (node.src(0), node.src(1)) {
                let a_tok = producer_of(a, n).and_then(|p| tok[p]);
                if a_tok == Some(1) && ids.producer.is_none() && is_output_ids(&ids.name) {
                    let rows = ids.ne[0].max(0) as u32;
                    basis[i] = rows;
                    tok[i] = (rows > 1 && node.out.ne[1] == rows as i64).then_some(1);
                    continue;
                }
            }
        }
        basis[i] = srcs.iter().map(|&(_, p)| basis[p]).max().unwrap_or(chunk);
        let rows = basis[i] as i64;
        if rows <= 1 {
            continue;
        }
        let hint = srcs.iter().find_map(|&(slot, p)| {
            let ds = tok[p]?;
            if basis[p] != basis[i] {
                return None;
            }
            let src = node.src(slot)?;
            maps_to(node, t, slot, &src.ne, ds).filter(|&k| node.out.ne[k] == rows)
        });
        tok[i] = hint.or_else(|| token_dim_by_shape(&node.out.ne, basis[i]));
    }
    tok
}

/// Token rows of node i's output (1 without a token dimension).
fn rows_of(graph: &[NodeInfo], tok: &[Option<usize>], i: usize) -> usize {
    match tok[i] {
        Some(d) => graph[i].out.ne[d].max(0) as usize,
        None => 1,
    }
}

/// The kept outputs: cache writes, the logits, and any other node nothing reads.
fn kept_outputs(graph: &[NodeInfo]) -> Vec<Option<Kept>> {
    let n = graph.len();
    let mut consumed = vec![false; n];
    for node in graph {
        for p in node.srcs.iter().flatten().filter_map(|s| producer_of(s, n)) {
            consumed[p] = true;
        }
    }
    let mut kept: Vec<Option<Kept>> = vec![None; n];
    for i in 0..n {
        let node = &graph[i];
        if computes_nothing(node) {
            continue;
        }
        kept[i] = if writes_cache(graph, i) {
            Some(Kept::CacheWrite)
        } else if consumed[i] {
            None
        } else if base_name(&node.name) == "result_output" {
            Some(Kept::Logits)
        } else {
            Some(Kept::OtherSink)
        };
    }
    kept
}

/// Backward: needed rows, from the kept outputs to the inputs.
fn needed_rows(
    graph: &[NodeInfo],
    tok: &[Option<usize>],
    kept: &[Option<Kept>],
    selection: &[u32],
) -> Vec<Vec<bool>> {
    let n = graph.len();
    let mut need: Vec<Vec<bool>> = (0..n)
        .map(|i| vec![false; rows_of(graph, tok, i)])
        .collect();
    for i in (0..n).rev() {
        let node = &graph[i];
        let t = treatment(&node.op);
        if kept[i].is_some() {
            need[i].iter_mut().for_each(|b| *b = true);
        }
        let Some(last) = need[i].iter().rposition(|&b| b) else {
            continue;
        };
        match t {
            Treatment::Scan => need[i][..=last].iter_mut().for_each(|b| *b = true),
            Treatment::Unknown | Treatment::IndexedWrite => {
                need[i].iter_mut().for_each(|b| *b = true)
            }
            _ => {}
        }
        let out_need = need[i].clone();
        for (slot, src) in node.srcs.iter().enumerate() {
            let Some(p) = src.as_ref().and_then(|s| producer_of(s, n)) else {
                continue;
            };
            if p >= i {
                continue;
            }
            let src = src.as_ref().expect("a source with a producer is present");
            let aligned = match (tok[p], tok[i]) {
                (Some(tp), Some(ti)) if rows_of(graph, tok, p) == rows_of(graph, tok, i) => match t
                {
                    Treatment::View => true,
                    _ => maps_to(node, t, slot, &src.ne, tp) == Some(ti),
                },
                _ => false,
            };
            let pass = pass_of(node, t, slot, tok[p], aligned, selection);
            pass_back(&mut need[p], pass, &out_need, last, selection);
        }
    }
    need
}

/// How source `slot` (of token dimension `src_tok`) of `node` takes the output's needed rows;
/// `aligned`: the op maps the source's token dimension to the output's, both of as many rows.
fn pass_of(
    node: &NodeInfo,
    t: Treatment,
    slot: usize,
    src_tok: Option<usize>,
    aligned: bool,
    selection: &[u32],
) -> Pass {
    match t {
        Treatment::GetRows
            if slot == 0
                && src_tok == Some(1)
                && node.src(1).is_some_and(|ids| {
                    ids.producer.is_none()
                        && is_output_ids(&ids.name)
                        && ids.ne[0] == selection.len() as i64
                }) =>
        {
            Pass::Select
        }
        Treatment::Unknown | Treatment::IndexedWrite => Pass::All,
        Treatment::Scan if aligned => Pass::Prefix,
        Treatment::Scan => Pass::All,
        _ if aligned => Pass::RowWise,
        _ => Pass::All,
    }
}

/// Marks the rows of a source (`target`) that the output's needed rows (`out_need`, the last
/// of them `last`) need under `pass`.
fn pass_back(target: &mut [bool], pass: Pass, out_need: &[bool], last: usize, selection: &[u32]) {
    match pass {
        Pass::RowWise => {
            for (dst, &src_needed) in target.iter_mut().zip(out_need) {
                *dst |= src_needed;
            }
        }
        Pass::Prefix => {
            let end = (last + 1).min(target.len());
            target[..end].iter_mut().for_each(|b| *b = true);
        }
        Pass::Select => {
            let wanted: Vec<usize> = if out_need.len() == selection.len() {
                (0..selection.len()).filter(|&r| out_need[r]).collect()
            } else {
                // the output is one indivisible row: every selected row
                (0..selection.len()).collect()
            };
            for r in wanted {
                match target.get_mut(selection[r] as usize) {
                    Some(b) => *b = true,
                    None => target.iter_mut().for_each(|b| *b = true),
                }
            }
        }
        Pass::All => target.iter_mut().for_each(|b| *b = true),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Output row r needs source row r.
    RowWise,
    /// Output row r needs source row `selection[r]`.
    Select,
    /// Every source row up to the last needed output row.
    Prefix,
    /// Every source row.
    All,
}

/// The output dimension a source's dimension `ds` maps to under the op, if it maps to one.
fn maps_to(node: &NodeInfo, t: Treatment, slot: usize, src: &[i64; 4], ds: usize) -> Option<usize> {
    let out = &node.out.ne;
    let same = |d: usize| (d < 4 && out[d] == src[ds]).then_some(d);
    match t {
        Treatment::Elementwise | Treatment::Scan => same(ds),
        Treatment::RowReduce => (ds >= 1).then(|| same(ds)).flatten(),
        Treatment::MatMul => match (slot, ds) {
            (_, 0) => None,
            (0, 1) => same(0),
            (1, 1) => same(1),
            (0 | 1, d) => same(d),
            _ => None,
        },
        Treatment::MatMulId => match slot {
            1 if ds >= 1 => same(ds),
            2 => same(ds + 1),
            _ => None,
        },
        Treatment::GetRows => match slot {
            0 if ds >= 2 => same(ds),
            1 => same(ds + 1),
            _ => None,
        },
        Treatment::Attention => match (slot, ds) {
            (0, 1) => same(2),
            (0, 2) => same(1),
            (0, 3) => same(3),
            _ => None,
        },
        Treatment::Reshape => {
            if slot != 0 || src.iter().product::<i64>() != out.iter().product::<i64>() {
                return None;
            }
            let before: i64 = src[..ds].iter().product();
            (0..4).find(|&k| out[k] == src[ds] && out[..k].iter().product::<i64>() == before)
        }
        Treatment::View => {
            if slot != 0 {
                return None;
            }
            if node.op == "TRANSPOSE" {
                return same(match ds {
                    0 => 1,
                    1 => 0,
                    d => d,
                });
            }
            let hits: Vec<usize> = (0..4).filter(|&k| out[k] == src[ds]).collect();
            match hits.as_slice() {
                [k] => Some(*k),
                _ => hits.contains(&ds).then_some(ds),
            }
        }
        Treatment::IndexedWrite | Treatment::Unknown => None,
    }
}

/// The token dimension of a tensor of shape `ne` holding `rows` token rows, without hints.
fn token_dim_by_shape(ne: &[i64; 4], rows: u32) -> Option<usize> {
    if rows <= 1 {
        return None;
    }
    let r = rows as i64;
    let hits: Vec<usize> = (0..4).filter(|&d| ne[d] == r).collect();
    match hits.as_slice() {
        [] => None,
        [d] => Some(*d),
        _ if ne[2] == 1 && ne[3] == 1 && hits.contains(&1) => Some(1),
        _ => hits.last().copied(),
    }
}

fn is_output_ids(name: &str) -> bool {
    OUTPUT_IDS.contains(&base_name(name))
}

/// Does the node write into a cache tensor? Its own name, or the destination it writes into (a
/// CPY's second source, a SET_ROWS's third, followed through views to the leaf), names one.
fn writes_cache(graph: &[NodeInfo], i: usize) -> bool {
    let node = &graph[i];
    if node.is_view {
        return false;
    }
    let is_cache = |name: &str| base_name(name).starts_with("cache_");
    if !(node.inplace || node.op == "CPY" || node.op == "SET_ROWS") {
        return false;
    }
    if is_cache(&node.name) {
        return true;
    }
    let dest = match node.op.as_str() {
        "CPY" => node.src(1),
        "SET_ROWS" => node.src(2),
        _ => node.src(0),
    };
    let mut cur = dest;
    for _ in 0..graph.len() {
        let Some(t) = cur else { return false };
        if is_cache(&t.name) {
            return true;
        }
        match t.producer.map(|p| &graph[p as usize]) {
            Some(p) if p.is_view => cur = p.src(0),
            _ => return false,
        }
    }
    false
}
