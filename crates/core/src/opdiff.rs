//! An op-level diff of two compute graphs (the two builds of an A/B): which working nodes were
//! added, removed or changed between A and B, which look fused or split, and per matched op the
//! time ratio B/A with its interval, judged against a control that is a second process of A.
//!
//! **Matching.** Only working nodes ([`NodeInfo::is_working`]) take part: views and skipped
//! nodes are neither added nor removed. In three passes:
//!
//! 1. A named node's identity is (effective layer ([`effective_layers`]), op, base name
//!    ([`NodeInfo::base_name`])); within one identity the k-th node of A matches the k-th of B,
//!    in graph order.
//! 2. A node with a generic name (`node_17`, [`is_generic_name`]) has no identity of its own:
//!    its key is (effective layer, op, what each source slot reads), where a source is read
//!    through views down to the working node that computes it and stands for that node's match
//!    (so both sides name it by A's node), or for a leaf (a weight, an input, a cache) by its
//!    name without decorations. A source computed by a node without a match (yet) leaves the
//!    node without a key. Within a key the k-th generic node of A matches the k-th of B;
//!    repeated until no new match, so a chain of generic nodes matches link by link.
//! 3. Generic nodes still unmatched then match by order between matched neighbours: between
//!    two consecutive anchors (the longest chain of matches in the same order in both graphs),
//!    the k-th unmatched generic node of A with an (effective layer, op) matches the k-th of B.
//!
//! Matched nodes whose output or any source differs in shape (`ne`) or type are `changed`:
//! still matched, still timed.
//!
//! **Fused and split** are a heuristic, not a proof: between two consecutive anchors (as
//! above, after all three passes), where A has k >= 2 unmatched nodes and B exactly one whose
//! output has the shape of A's last unmatched node's output, B is taken to compute in one node
//! what A computed in several (`Fused`); the mirror case is `Split`. Those nodes are listed in
//! `regrouped`, not as added or removed. Nothing checks that the nodes compute the same thing.
//!
//! **Per-op timing.** Matched nodes are grouped by (op, base name; generic names group as
//! [`UNNAMED`]). Per cycle, a side's group ms/token is the group's share of the cycle's TIMED
//! µs over all working nodes times the cycle's FUSED wall / tokens (the band ledger's
//! estimator). B/A is the ratio of the medians over cycles with its bootstrap interval
//! ([`ratio_ci_at`], resampling cycles), the control's A2/A by the same estimator, both at the
//! Bonferroni-corrected level of all groups ([`bonferroni`]); the verdict is
//! [`Verdict::against_control`]. The k-th group in (op, name) order resamples with the seed
//! `splitmix64(seed + k)`, its control with that seed `^ 0xC0`. Unmatched nodes count only in
//! each cycle's TIMED sum.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use serde::{Deserialize, Serialize};

use crate::ab::{bonferroni, nan_when_null, ratio_ci_at, Verdict};
use crate::node::{effective_layers, is_generic_name, NodeInfo, TensorDesc};
use crate::stats::median;
use crate::tokens::splitmix64;

/// The name of the op group of matched nodes with generic names (`node_17`).
pub const UNNAMED: &str = "(unnamed)";

/// Per-cycle TIMED node times and FUSED walls of the three sides of an A/B. `a`, `b`, `control`
/// hold one Vec per cycle: that cycle's TIMED µs per node in graph order (A's and the
/// control's index A's graph, B's B's); the walls are that cycle's FUSED ms; `tokens` per run.
/// A node missing from a cycle's Vec counts as 0 µs; a side's cycles are as many as both its
/// Vecs and its walls hold.
#[derive(Debug, Clone, Copy)]
pub struct CycleTimes<'a> {
    pub a: &'a [Vec<f64>],
    pub b: &'a [Vec<f64>],
    pub control: &'a [Vec<f64>],
    pub a_wall_ms: &'a [f64],
    pub b_wall_ms: &'a [f64],
    pub control_wall_ms: &'a [f64],
    pub tokens: u32,
}

/// How to judge the per-op ratios.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OpDiffConfig {
    /// Bootstrap resamples per interval (many more than 2 / the corrected alpha).
    pub resamples: u32,
    pub seed: u64,
    /// The smallest effect a verdict may claim (0.02: ±2 %).
    pub min_effect: f64,
    /// The family-wise error rate over all op groups (0.05: all intervals hold at once with
    /// probability 95 %).
    pub alpha: f64,
}

/// The op-level diff of two graphs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpDiff {
    /// Working nodes of each graph.
    pub a_nodes: u32,
    pub b_nodes: u32,
    /// Matched pairs of working nodes.
    pub matched: u32,
    /// In B only, in B's graph order.
    pub added: Vec<DiffNode>,
    /// In A only, in A's graph order.
    pub removed: Vec<DiffNode>,
    /// Matched, but the output or a source changed shape or type; in A's graph order.
    pub changed: Vec<ChangedNode>,
    /// Several A nodes computed by one B node (fused) or one A node by several B nodes (split),
    /// by the heuristic of the module's documentation; in A's graph order.
    pub regrouped: Vec<Regroup>,
    /// Per op group, sorted by |b - a| ms/token, largest first.
    pub ops: Vec<OpRow>,
    /// The family-wise alpha the intervals hold at together: each is at `alpha / ops.len()`.
    pub alpha: f64,
    /// The smallest effect a verdict may claim.
    pub min_effect: f64,
}

/// One working node as the diff names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiffNode {
    /// Its position in its own graph.
    pub index: u32,
    /// Its effective layer ([`effective_layers`]).
    pub layer: Option<u32>,
    pub op: String,
    /// Its full name (`ffn_up-3`, `node_17`).
    pub name: String,
    /// Its output's shape (`[2048,512]`) and type (`F32`).
    pub out_shape: String,
    pub out_type: String,
}

/// A matched pair whose output or a source differs in shape or type.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangedNode {
    pub a: DiffNode,
    pub b: DiffNode,
    /// Every difference, `; `-separated: `out [2048,512] F32 -> [2048,512] F16`,
    /// `src1 [64,64] Q4_K -> [64,64] Q8_0`, `src2 none -> [64] F32`.
    pub what: String,
}

/// What a regrouping looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegroupKind {
    /// B computes in one node what A computed in several.
    Fused,
    /// B computes in several nodes what A computed in one.
    Split,
}

/// Nodes of A and B between the same two anchors that look like one computation regrouped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Regroup {
    pub kind: RegroupKind,
    pub a: Vec<DiffNode>,
    pub b: Vec<DiffNode>,
}

/// One op group of matched nodes, A against B.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRow {
    pub op: String,
    /// The base name, layer stripped ([`NodeInfo::base_name`]); [`UNNAMED`] for generic names.
    pub name: String,
    /// Matched nodes in the group.
    pub nodes: u32,
    /// The medians over cycles of each side's ms/token in the group (NaN, stored as `null`,
    /// without a cycle).
    #[serde(deserialize_with = "nan_when_null")]
    pub a_ms_per_token: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub b_ms_per_token: f64,
    /// B/A (ratio of medians) and its interval; NaN (stored as `null`) where A's median is 0 or
    /// there is no cycle.
    #[serde(deserialize_with = "nan_when_null")]
    pub ratio: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub ratio_lo: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub ratio_hi: f64,
    /// The control's A2/A and its interval (NaN without a control).
    #[serde(deserialize_with = "nan_when_null")]
    pub control_ratio: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub control_lo: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub control_hi: f64,
    pub verdict: Verdict,
}

/// The op-level diff of graph `a` against graph `b` (see the module's documentation for the
/// matching, the fused/split heuristic and the timing). Deterministic for a seed.
pub fn op_diff(a: &[NodeInfo], b: &[NodeInfo], times: &CycleTimes, cfg: &OpDiffConfig) -> OpDiff {
    let m = Matching::of(a, b);
    let mut pairs: Vec<(usize, usize)> = m
        .a_match
        .iter()
        .enumerate()
        .filter_map(|(i, j)| j.map(|j| (i, j)))
        .collect();
    pairs.sort_unstable();
    let changed = pairs
        .iter()
        .filter_map(|&(i, j)| {
            let what = differences(&a[i], &b[j]);
            (!what.is_empty()).then(|| ChangedNode {
                a: diff_node(a, &m.a_layers, i),
                b: diff_node(b, &m.b_layers, j),
                what: what.join("; "),
            })
        })
        .collect();
    let a_regrouped: HashSet<usize> = m.regroups.iter().flat_map(|r| r.1.clone()).collect();
    let b_regrouped: HashSet<usize> = m.regroups.iter().flat_map(|r| r.2.clone()).collect();
    let removed = (0..a.len())
        .filter(|&i| a[i].is_working() && m.a_match[i].is_none() && !a_regrouped.contains(&i))
        .map(|i| diff_node(a, &m.a_layers, i))
        .collect();
    let added = (0..b.len())
        .filter(|&j| b[j].is_working() && m.b_match[j].is_none() && !b_regrouped.contains(&j))
        .map(|j| diff_node(b, &m.b_layers, j))
        .collect();
    let regrouped = m
        .regroups
        .iter()
        .map(|(kind, xs, ys)| Regroup {
            kind: *kind,
            a: xs.iter().map(|&i| diff_node(a, &m.a_layers, i)).collect(),
            b: ys.iter().map(|&j| diff_node(b, &m.b_layers, j)).collect(),
        })
        .collect();
    OpDiff {
        a_nodes: a.iter().filter(|n| n.is_working()).count() as u32,
        b_nodes: b.iter().filter(|n| n.is_working()).count() as u32,
        matched: pairs.len() as u32,
        added,
        removed,
        changed,
        regrouped,
        ops: op_rows(a, b, &pairs, times, cfg),
        alpha: cfg.alpha,
        min_effect: cfg.min_effect,
    }
}

fn diff_node(g: &[NodeInfo], layers: &[Option<u32>], i: usize) -> DiffNode {
    let n = &g[i];
    DiffNode {
        index: i as u32,
        layer: layers[i],
        op: n.op.clone(),
        name: n.name.clone(),
        out_shape: n.out.shape_string(),
        out_type: n.out.ggml_type.clone(),
    }
}

/// `[64,4] F32`, or `none` for an empty source slot.
fn tensor_text(t: Option<&TensorDesc>) -> String {
    match t {
        Some(t) => format!("{} {}", t.shape_string(), t.ggml_type),
        None => "none".into(),
    }
}

/// What differs in shape or type between two matched nodes' outputs and sources.
fn differences(a: &NodeInfo, b: &NodeInfo) -> Vec<String> {
    let same = |x: Option<&TensorDesc>, y: Option<&TensorDesc>| match (x, y) {
        (Some(x), Some(y)) => x.ne == y.ne && x.ggml_type == y.ggml_type,
        (None, None) => true,
        _ => false,
    };
    let mut out = Vec::new();
    if !same(Some(&a.out), Some(&b.out)) {
        out.push(format!(
            "out {} -> {}",
            tensor_text(Some(&a.out)),
            tensor_text(Some(&b.out))
        ));
    }
    for s in 0..a.srcs.len().max(b.srcs.len()) {
        if !same(a.src(s), b.src(s)) {
            out.push(format!(
                "src{s} {} -> {}",
                tensor_text(a.src(s)),
                tensor_text(b.src(s))
            ));
        }
    }
    out
}

/// What a source slot of a generic node reads, in A's terms (pass 2 of the matching).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Token<'g> {
    Empty,
    /// A leaf tensor, by its name without decorations.
    Leaf(&'g str),
    /// The working node (A's index) that computes it, on both sides through the match.
    Node(usize),
}

/// A generic node's pass-2 key: (effective layer, op, each source slot's token).
type SourceKey<'g> = (Option<u32>, &'g str, Vec<Token<'g>>);

/// The matching of two graphs and its regroupings, by node position.
struct Matching {
    a_layers: Vec<Option<u32>>,
    b_layers: Vec<Option<u32>>,
    /// A's node i matches B's node `a_match[i]`, and the reverse.
    a_match: Vec<Option<usize>>,
    b_match: Vec<Option<usize>>,
    /// (kind, A's nodes, B's nodes) in A's graph order.
    regroups: Vec<(RegroupKind, Vec<usize>, Vec<usize>)>,
}

impl Matching {
    fn of(a: &[NodeInfo], b: &[NodeInfo]) -> Matching {
        let mut m = Matching {
            a_layers: effective_layers(a),
            b_layers: effective_layers(b),
            a_match: vec![None; a.len()],
            b_match: vec![None; b.len()],
            regroups: Vec::new(),
        };
        m.by_identity(a, b);
        m.by_sources(a, b);
        m.by_order(a, b);
        m.regroup(a, b);
        m
    }

    fn link(&mut self, i: usize, j: usize) {
        self.a_match[i] = Some(j);
        self.b_match[j] = Some(i);
    }

    /// Pass 1: named working nodes by (effective layer, op, base name), in order.
    fn by_identity(&mut self, a: &[NodeInfo], b: &[NodeInfo]) {
        let named = |n: &NodeInfo| n.is_working() && !is_generic_name(&n.name);
        let mut queues: HashMap<(Option<u32>, &str, &str), VecDeque<usize>> = HashMap::new();
        for (j, n) in b.iter().enumerate().filter(|(_, n)| named(n)) {
            queues
                .entry((self.b_layers[j], n.op.as_str(), n.base_name()))
                .or_default()
                .push_back(j);
        }
        for (i, n) in a.iter().enumerate().filter(|(_, n)| named(n)) {
            let key = (self.a_layers[i], n.op.as_str(), n.base_name());
            if let Some(j) = queues.get_mut(&key).and_then(|q| q.pop_front()) {
                self.link(i, j);
            }
        }
    }

    /// Pass 2: generic working nodes by (effective layer, op, what their sources read), in
    /// rounds until a round matches nothing.
    fn by_sources(&mut self, a: &[NodeInfo], b: &[NodeInfo]) {
        let generic = |n: &NodeInfo| n.is_working() && is_generic_name(&n.name);
        loop {
            let mut queues: HashMap<SourceKey, VecDeque<usize>> = HashMap::new();
            for (j, n) in b.iter().enumerate() {
                if generic(n) && self.b_match[j].is_none() {
                    if let Some(key) = source_key(b, &self.b_layers, j, &|p| self.b_match[p]) {
                        queues.entry(key).or_default().push_back(j);
                    }
                }
            }
            if queues.is_empty() {
                return;
            }
            let keyed: Vec<(usize, SourceKey)> = (0..a.len())
                .filter(|&i| generic(&a[i]) && self.a_match[i].is_none())
                .filter_map(|i| Some((i, source_key(a, &self.a_layers, i, &|p| Some(p))?)))
                .collect();
            let mut linked = false;
            for (i, key) in keyed {
                if let Some(j) = queues.get_mut(&key).and_then(|q| q.pop_front()) {
                    self.link(i, j);
                    linked = true;
                }
            }
            if !linked {
                return;
            }
        }
    }

    /// Pass 3: generic working nodes still unmatched, by (effective layer, op) in order between
    /// consecutive anchors.
    fn by_order(&mut self, a: &[NodeInfo], b: &[NodeInfo]) {
        for ((a0, a1), (b0, b1)) in self.gaps(a.len(), b.len()) {
            let left = |g: &[NodeInfo], matched: &[Option<usize>], i: usize| {
                g[i].is_working() && is_generic_name(&g[i].name) && matched[i].is_none()
            };
            let mut queues: HashMap<(Option<u32>, &str), VecDeque<usize>> = HashMap::new();
            for j in (b0..b1).filter(|&j| left(b, &self.b_match, j)) {
                queues
                    .entry((self.b_layers[j], b[j].op.as_str()))
                    .or_default()
                    .push_back(j);
            }
            let xs: Vec<usize> = (a0..a1).filter(|&i| left(a, &self.a_match, i)).collect();
            for i in xs {
                let key = (self.a_layers[i], a[i].op.as_str());
                if let Some(j) = queues.get_mut(&key).and_then(|q| q.pop_front()) {
                    self.link(i, j);
                }
            }
        }
    }

    /// The fused/split heuristic over the gaps between anchors.
    fn regroup(&mut self, a: &[NodeInfo], b: &[NodeInfo]) {
        for ((a0, a1), (b0, b1)) in self.gaps(a.len(), b.len()) {
            let xs: Vec<usize> = (a0..a1)
                .filter(|&i| a[i].is_working() && self.a_match[i].is_none())
                .collect();
            let ys: Vec<usize> = (b0..b1)
                .filter(|&j| b[j].is_working() && self.b_match[j].is_none())
                .collect();
            let kind = match (xs.as_slice(), ys.as_slice()) {
                ([.., x], [y]) if xs.len() >= 2 && b[*y].out.ne == a[*x].out.ne => {
                    RegroupKind::Fused
                }
                ([x], [.., y]) if ys.len() >= 2 && a[*x].out.ne == b[*y].out.ne => {
                    RegroupKind::Split
                }
                _ => continue,
            };
            self.regroups.push((kind, xs, ys));
        }
    }

    /// The half-open ranges of A's and B's positions between consecutive anchors (and before
    /// the first, after the last). The anchors are the longest chain of matched pairs in the
    /// same order in both graphs ([`longest_chain`]).
    fn gaps(&self, a_len: usize, b_len: usize) -> Vec<((usize, usize), (usize, usize))> {
        let pairs: Vec<(usize, usize)> = self
            .a_match
            .iter()
            .enumerate()
            .filter_map(|(i, j)| j.map(|j| (i, j)))
            .collect();
        let mut bounds = vec![(0, 0)];
        for (i, j) in longest_chain(&pairs) {
            bounds.push((i, j));
            bounds.push((i + 1, j + 1));
        }
        bounds.push((a_len, b_len));
        bounds
            .chunks(2)
            .map(|w| ((w[0].0, w[1].0), (w[0].1, w[1].1)))
            .collect()
    }
}

/// The longest subsequence of `pairs` (sorted by their first element, distinct in both) whose
/// second elements increase: patience sorting, O(n log n).
fn longest_chain(pairs: &[(usize, usize)]) -> Vec<(usize, usize)> {
    // tails[k]: the index in `pairs` of the smallest end of a chain of length k + 1
    let mut tails: Vec<usize> = Vec::new();
    let mut prev: Vec<Option<usize>> = vec![None; pairs.len()];
    for (p, &(_, j)) in pairs.iter().enumerate() {
        let k = tails.partition_point(|&t| pairs[t].1 < j);
        prev[p] = k.checked_sub(1).map(|k| tails[k]);
        if k == tails.len() {
            tails.push(p);
        } else {
            tails[k] = p;
        }
    }
    let mut chain = Vec::with_capacity(tails.len());
    let mut at = tails.last().copied();
    while let Some(p) = at {
        chain.push(pairs[p]);
        at = prev[p];
    }
    chain.reverse();
    chain
}

/// A generic node's pass-2 key, or `None` while a source is computed by a working node without
/// a match. `partner(p)` is A's index of the node's own graph's working node `p` (itself on A's
/// side, its match on B's).
fn source_key<'g>(
    g: &'g [NodeInfo],
    layers: &[Option<u32>],
    i: usize,
    partner: &dyn Fn(usize) -> Option<usize>,
) -> Option<SourceKey<'g>> {
    let tokens = g[i]
        .srcs
        .iter()
        .map(|s| match s {
            None => Some(Token::Empty),
            Some(s) => source_token(g, i, s, partner),
        })
        .collect::<Option<Vec<Token>>>()?;
    Some((layers[i], g[i].op.as_str(), tokens))
}

/// What one source of node `i` reads, through views (a view's source 0 is what it views).
fn source_token<'g>(
    g: &'g [NodeInfo],
    i: usize,
    mut src: &'g TensorDesc,
    partner: &dyn Fn(usize) -> Option<usize>,
) -> Option<Token<'g>> {
    let mut below = i;
    loop {
        let Some(p) = src.producer.map(|p| p as usize) else {
            let name = src.name.split(" (").next().unwrap_or_default();
            return Some(Token::Leaf(name));
        };
        // a producer after its consumer is not a graph in order: no key
        if p >= below {
            return None;
        }
        let n = &g[p];
        if n.is_view {
            src = n.src(0)?;
            below = p;
        } else if n.skipped {
            return None;
        } else {
            return partner(p).map(Token::Node);
        }
    }
}

/// Per op group of matched pairs: each side's per-cycle ms/token, B/A and the control's A2/A
/// with their intervals, the verdict; sorted by |b - a|.
fn op_rows(
    a: &[NodeInfo],
    b: &[NodeInfo],
    pairs: &[(usize, usize)],
    times: &CycleTimes,
    cfg: &OpDiffConfig,
) -> Vec<OpRow> {
    let mut groups: BTreeMap<(&str, &str), Vec<(usize, usize)>> = BTreeMap::new();
    for &(i, j) in pairs {
        let n = &a[i];
        let name = if is_generic_name(&n.name) {
            UNNAMED
        } else {
            n.base_name()
        };
        groups
            .entry((n.op.as_str(), name))
            .or_default()
            .push((i, j));
    }
    let alpha = bonferroni(cfg.alpha, groups.len());
    let tokens = f64::from(times.tokens.max(1));
    let a_sums = working_sums(a, times.a);
    let b_sums = working_sums(b, times.b);
    let control_sums = working_sums(a, times.control);
    let mut rows: Vec<OpRow> = groups
        .into_iter()
        .enumerate()
        .map(|(k, ((op, name), members))| {
            let xs: Vec<usize> = members.iter().map(|m| m.0).collect();
            let ys: Vec<usize> = members.iter().map(|m| m.1).collect();
            let a_series = series(&xs, times.a, &a_sums, times.a_wall_ms, tokens);
            let b_series = series(&ys, times.b, &b_sums, times.b_wall_ms, tokens);
            let c_series = series(
                &xs,
                times.control,
                &control_sums,
                times.control_wall_ms,
                tokens,
            );
            let seed = splitmix64(cfg.seed.wrapping_add(k as u64));
            let a_med = median(&a_series).unwrap_or(f64::NAN);
            let b_med = median(&b_series).unwrap_or(f64::NAN);
            let nan3 = (f64::NAN, f64::NAN, f64::NAN);
            let (ratio, lo, hi, c, verdict) = if a_med > 0.0 {
                let r = ratio_ci_at(&a_series, &b_series, cfg.resamples, seed, alpha);
                let c = ratio_ci_at(&a_series, &c_series, cfg.resamples, seed ^ 0xC0, alpha);
                match (r, c) {
                    (Some((r, lo, hi)), Some(c)) => (
                        r,
                        lo,
                        hi,
                        c,
                        Verdict::against_control(lo, hi, c.1, c.2, cfg.min_effect),
                    ),
                    // a control that cannot be formed bounds nothing: it counts as moved
                    (Some((r, lo, hi)), None) => (r, lo, hi, nan3, Verdict::Inconclusive),
                    (None, _) => (f64::NAN, f64::NAN, f64::NAN, nan3, Verdict::WithinNoise),
                }
            } else {
                (f64::NAN, f64::NAN, f64::NAN, nan3, Verdict::WithinNoise)
            };
            OpRow {
                op: op.to_string(),
                name: name.to_string(),
                nodes: members.len() as u32,
                a_ms_per_token: a_med,
                b_ms_per_token: b_med,
                ratio,
                ratio_lo: lo,
                ratio_hi: hi,
                control_ratio: c.0,
                control_lo: c.1,
                control_hi: c.2,
                verdict,
            }
        })
        .collect();
    // largest gap first; a gap that cannot be formed (no cycle) last; ties by (op, name) as
    // the groups came
    let gap = |r: &OpRow| {
        let g = (r.b_ms_per_token - r.a_ms_per_token).abs();
        if g.is_nan() {
            -1.0
        } else {
            g
        }
    };
    rows.sort_by(|p, q| gap(q).total_cmp(&gap(p)));
    rows
}

/// Each cycle's TIMED µs summed over the graph's working nodes.
fn working_sums(g: &[NodeInfo], cycles: &[Vec<f64>]) -> Vec<f64> {
    cycles
        .iter()
        .map(|t| {
            g.iter()
                .zip(t)
                .filter(|(n, _)| n.is_working())
                .map(|(_, v)| v)
                .sum()
        })
        .collect()
}

/// A group's ms/token in each cycle: its share of the cycle's TIMED sum x the cycle's FUSED
/// wall / tokens (0 where the sum is 0).
fn series(
    members: &[usize],
    cycles: &[Vec<f64>],
    sums: &[f64],
    walls: &[f64],
    tokens: f64,
) -> Vec<f64> {
    cycles
        .iter()
        .zip(sums)
        .zip(walls)
        .map(|((t, &sum), &wall)| {
            let part: f64 = members
                .iter()
                .map(|&i| t.get(i).copied().unwrap_or(0.0))
                .sum();
            if sum > 0.0 {
                part / sum * wall / tokens
            } else {
                0.0
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::node::{is_view_op, layer_of};

    /// A source of a built node: another node's output, or a leaf (a weight where its name
    /// starts with `blk.`).
    enum S {
        N(usize),
        L(String, Vec<i64>, &'static str),
    }

    fn tensor(name: &str, shape: &[i64], ty: &str, weight: bool) -> TensorDesc {
        let mut ne = [1; 4];
        ne[..shape.len()].copy_from_slice(shape);
        TensorDesc {
            name: name.into(),
            ne,
            ggml_type: ty.into(),
            size_bytes: 0,
            is_weight: weight,
            nb: [0; 4],
            producer: None,
        }
    }

    /// A graph built node by node, in order.
    #[derive(Default)]
    struct G(Vec<NodeInfo>);

    impl G {
        fn add(&mut self, op: &str, name: &str, shape: &[i64], ty: &str, srcs: Vec<S>) -> usize {
            let index = self.0.len();
            let srcs = srcs
                .into_iter()
                .map(|s| {
                    Some(match s {
                        S::N(p) => TensorDesc {
                            producer: Some(p as u32),
                            ..self.0[p].out.clone()
                        },
                        S::L(name, shape, ty) => {
                            tensor(&name, &shape, ty, name.starts_with("blk."))
                        }
                    })
                })
                .collect();
            self.0.push(NodeInfo {
                index: index as u32,
                op: op.into(),
                name: name.into(),
                layer: layer_of(name),
                out: tensor(name, shape, ty, false),
                srcs,
                is_view: is_view_op(op),
                inplace: false,
                skipped: false,
                op_code: None,
                op_params: Vec::new(),
                device: None,
            });
            index
        }
    }

    fn w(l: u32, token: &str, shape: &[i64], ty: &'static str) -> S {
        S::L(format!("blk.{l}.{token}.weight"), shape.to_vec(), ty)
    }

    /// What differs from the plain graph.
    #[derive(Clone, Copy)]
    struct Opts {
        /// The Q projection's weight type.
        q_type: &'static str,
        /// An extra CLAMP node nobody reads in this layer.
        extra_in: Option<u32>,
        /// In this layer the FFN's MUL and ADD are one FOO node of this shape.
        fuse: Option<(u32, [i64; 2])>,
        /// In this layer the FFN's ADD writes F16.
        act_f16: Option<u32>,
        /// The two generic SOFT_MAX nodes in the other order (and other node_ numbers).
        swap_generic: bool,
        /// The leaf the first generic SOFT_MAX node reads.
        mask: &'static str,
    }

    const PLAIN: Opts = Opts {
        q_type: "Q4_K",
        extra_in: None,
        fuse: None,
        act_f16: None,
        swap_generic: false,
        mask: "kq_mask",
    };

    /// Two transformer-like layers between an embedding and an output: per layer 13 working
    /// nodes (3 of them generic) and one view, 29 working nodes in all.
    fn graph(o: Opts) -> Vec<NodeInfo> {
        let mut g = G::default();
        let mut x = g.add(
            "GET_ROWS",
            "inp_embd",
            &[64, 4],
            "F32",
            vec![
                S::L("token_embd.weight".into(), vec![64, 1000], "Q4_K"),
                S::L("inp_tokens".into(), vec![4], "I32"),
            ],
        );
        for l in 0..2u32 {
            let n = |s: &str| format!("{s}-{l}");
            let norm = g.add("RMS_NORM", &n("norm"), &[64, 4], "F32", vec![S::N(x)]);
            let attn_norm = g.add(
                "MUL",
                &n("attn_norm"),
                &[64, 4],
                "F32",
                vec![S::N(norm), w(l, "attn_norm", &[64], "F32")],
            );
            let q = g.add(
                "MUL_MAT",
                &n("Qcur"),
                &[64, 4],
                "F32",
                vec![w(l, "attn_q", &[64, 64], o.q_type), S::N(attn_norm)],
            );
            let q3 = g.add(
                "RESHAPE",
                &n("Qcur (reshaped)"),
                &[16, 4, 4],
                "F32",
                vec![S::N(q)],
            );
            // two generic SOFT_MAX of different shapes and sources, then a generic SCALE that
            // reads the first
            let soft_q = |g: &mut G, id: u32| {
                g.add(
                    "SOFT_MAX",
                    &format!("node_{id}"),
                    &[16, 4, 4],
                    "F32",
                    vec![S::N(q3), S::L(o.mask.into(), vec![4, 4], "F16")],
                )
            };
            let soft_n = |g: &mut G, id: u32| {
                g.add(
                    "SOFT_MAX",
                    &format!("node_{id}"),
                    &[64, 4],
                    "F32",
                    vec![S::N(attn_norm)],
                )
            };
            let base = 100 * l + if o.swap_generic { 50 } else { 0 };
            let sq = if o.swap_generic {
                soft_n(&mut g, base);
                soft_q(&mut g, base + 1)
            } else {
                let sq = soft_q(&mut g, base);
                soft_n(&mut g, base + 1);
                sq
            };
            let scaled = g.add(
                "SCALE",
                &format!("node_{}", base + 2),
                &[16, 4, 4],
                "F32",
                vec![S::N(sq)],
            );
            let attn_out = g.add(
                "MUL_MAT",
                &n("attn_out"),
                &[64, 4],
                "F32",
                vec![w(l, "attn_output", &[64, 64], "Q4_K"), S::N(scaled)],
            );
            let ffn_inp = g.add(
                "ADD",
                &n("ffn_inp"),
                &[64, 4],
                "F32",
                vec![S::N(attn_out), S::N(x)],
            );
            if o.extra_in == Some(l) {
                g.add(
                    "CLAMP",
                    &n("kq_extra"),
                    &[64, 4],
                    "F32",
                    vec![S::N(ffn_inp)],
                );
            }
            let up = g.add(
                "MUL_MAT",
                &n("ffn_up"),
                &[128, 4],
                "F32",
                vec![w(l, "ffn_up", &[64, 128], "Q4_K"), S::N(ffn_inp)],
            );
            let act = match o.fuse {
                Some((fl, shape)) if fl == l => g.add(
                    "FOO",
                    &n("ffn_fused"),
                    &shape,
                    "F32",
                    vec![S::N(up), w(l, "ffn_bias", &[128], "F32")],
                ),
                _ => {
                    let mul = g.add(
                        "MUL",
                        &n("ffn_mul"),
                        &[128, 4],
                        "F32",
                        vec![S::N(up), S::N(up)],
                    );
                    let ty = if o.act_f16 == Some(l) { "F16" } else { "F32" };
                    g.add(
                        "ADD",
                        &n("ffn_act"),
                        &[128, 4],
                        ty,
                        vec![S::N(mul), w(l, "ffn_bias", &[128], "F32")],
                    )
                }
            };
            let down = g.add(
                "MUL_MAT",
                &n("ffn_down"),
                &[64, 4],
                "F32",
                vec![w(l, "ffn_down", &[128, 64], "Q4_K"), S::N(act)],
            );
            x = g.add(
                "ADD",
                &n("l_out"),
                &[64, 4],
                "F32",
                vec![S::N(down), S::N(ffn_inp)],
            );
        }
        let norm = g.add("RMS_NORM", "result_norm", &[64, 4], "F32", vec![S::N(x)]);
        g.add(
            "MUL_MAT",
            "result_output",
            &[1000, 4],
            "F32",
            vec![
                S::L("output.weight".into(), vec![64, 1000], "Q4_K"),
                S::N(norm),
            ],
        );
        g.0
    }

    const NO_CYCLES: CycleTimes<'static> = CycleTimes {
        a: &[],
        b: &[],
        control: &[],
        a_wall_ms: &[],
        b_wall_ms: &[],
        control_wall_ms: &[],
        tokens: 4,
    };

    const CFG: OpDiffConfig = OpDiffConfig {
        resamples: 4000,
        seed: 7,
        min_effect: 0.05,
        alpha: 0.05,
    };

    fn structure(a: Opts, b: Opts) -> OpDiff {
        op_diff(&graph(a), &graph(b), &NO_CYCLES, &CFG)
    }

    fn names(nodes: &[DiffNode]) -> Vec<&str> {
        nodes.iter().map(|n| n.name.as_str()).collect()
    }

    #[test]
    fn identical_graphs_match_every_working_node() {
        let d = structure(PLAIN, PLAIN);
        assert_eq!((d.a_nodes, d.b_nodes, d.matched), (29, 29, 29));
        assert!(d.added.is_empty() && d.removed.is_empty());
        assert!(d.changed.is_empty() && d.regrouped.is_empty());
        // 13 op groups of named nodes (norm, attn_norm, Qcur, attn_out, ffn_inp, ffn_up,
        // ffn_mul, ffn_act, ffn_down, l_out, and inp_embd, result_norm, result_output) and the
        // generic SOFT_MAX and SCALE: 15
        assert_eq!(d.ops.len(), 15);
        let soft = d
            .ops
            .iter()
            .find(|r| r.op == "SOFT_MAX")
            .expect("a SOFT_MAX row");
        assert_eq!((soft.name.as_str(), soft.nodes), (UNNAMED, 4));
        // without a cycle nothing is timed
        assert!(d
            .ops
            .iter()
            .all(|r| r.ratio.is_nan() && r.verdict == Verdict::WithinNoise));
    }

    #[test]
    fn a_node_in_a_only_is_removed_and_in_b_only_added() {
        let extra = Opts {
            extra_in: Some(1),
            ..PLAIN
        };
        let d = structure(extra, PLAIN);
        assert_eq!((d.a_nodes, d.b_nodes, d.matched), (30, 29, 29));
        assert_eq!(names(&d.removed), ["kq_extra-1"]);
        let r = &d.removed[0];
        assert_eq!(
            (
                r.index,
                r.layer,
                r.op.as_str(),
                r.out_shape.as_str(),
                r.out_type.as_str()
            ),
            // embd 1 + layer 0's 14 nodes (one a view) + layer 1's first 9 (one a view)
            (24, Some(1), "CLAMP", "[64,4]", "F32")
        );
        assert!(d.added.is_empty() && d.changed.is_empty() && d.regrouped.is_empty());

        let d = structure(PLAIN, extra);
        assert_eq!(names(&d.added), ["kq_extra-1"]);
        assert!(d.removed.is_empty() && d.regrouped.is_empty());
    }

    #[test]
    fn a_changed_type_is_changed_and_still_matched() {
        let d = structure(
            PLAIN,
            Opts {
                q_type: "Q8_0",
                ..PLAIN
            },
        );
        assert_eq!(d.matched, 29);
        let what: Vec<(&str, &str)> = d
            .changed
            .iter()
            .map(|c| (c.a.name.as_str(), c.what.as_str()))
            .collect();
        assert_eq!(
            what,
            [
                ("Qcur-0", "src0 [64,64] Q4_K -> [64,64] Q8_0"),
                ("Qcur-1", "src0 [64,64] Q4_K -> [64,64] Q8_0"),
            ]
        );

        // an output's type: the node and the source of its consumer
        let d = structure(
            PLAIN,
            Opts {
                act_f16: Some(1),
                ..PLAIN
            },
        );
        let what: Vec<(&str, &str)> = d
            .changed
            .iter()
            .map(|c| (c.b.name.as_str(), c.what.as_str()))
            .collect();
        assert_eq!(
            what,
            [
                ("ffn_act-1", "out [128,4] F32 -> [128,4] F16"),
                ("ffn_down-1", "src1 [128,4] F32 -> [128,4] F16"),
            ]
        );
        assert!(d.added.is_empty() && d.removed.is_empty());
    }

    #[test]
    fn two_nodes_computed_by_one_of_the_last_ones_shape_are_fused_and_the_mirror_split() {
        let fused = Opts {
            fuse: Some((1, [128, 4])),
            ..PLAIN
        };
        let d = structure(PLAIN, fused);
        assert_eq!((d.a_nodes, d.b_nodes, d.matched), (29, 28, 27));
        assert!(d.added.is_empty() && d.removed.is_empty() && d.changed.is_empty());
        assert_eq!(d.regrouped.len(), 1);
        let r = &d.regrouped[0];
        assert_eq!(r.kind, RegroupKind::Fused);
        assert_eq!(names(&r.a), ["ffn_mul-1", "ffn_act-1"]);
        assert_eq!(names(&r.b), ["ffn_fused-1"]);
        assert_eq!(r.b[0].op, "FOO");

        let d = structure(fused, PLAIN);
        assert_eq!(d.regrouped.len(), 1);
        let r = &d.regrouped[0];
        assert_eq!(r.kind, RegroupKind::Split);
        assert_eq!(names(&r.a), ["ffn_fused-1"]);
        assert_eq!(names(&r.b), ["ffn_mul-1", "ffn_act-1"]);
        assert!(d.added.is_empty() && d.removed.is_empty());
    }

    #[test]
    fn one_node_of_another_shape_is_not_fused_but_added_and_removed() {
        let d = structure(
            PLAIN,
            Opts {
                fuse: Some((1, [64, 4])),
                ..PLAIN
            },
        );
        assert!(d.regrouped.is_empty());
        assert_eq!(names(&d.removed), ["ffn_mul-1", "ffn_act-1"]);
        assert_eq!(names(&d.added), ["ffn_fused-1"]);
        // its consumer now reads [64,4]
        assert_eq!(d.changed.len(), 1);
        assert_eq!(d.changed[0].what, "src1 [128,4] F32 -> [64,4] F32");
    }

    #[test]
    fn generic_nodes_match_by_their_sources_not_their_order_or_number() {
        // B computes the two generic SOFT_MAX the other way round under other numbers: matched
        // by order they would pair [16,4,4] with [64,4] and both be "changed"
        let d = structure(
            PLAIN,
            Opts {
                swap_generic: true,
                ..PLAIN
            },
        );
        assert_eq!(d.matched, 29);
        assert!(d.changed.is_empty(), "{:?}", d.changed);
        assert!(d.added.is_empty() && d.removed.is_empty());
    }

    #[test]
    fn generic_nodes_whose_sources_differ_match_by_order_between_neighbours() {
        // the first SOFT_MAX reads another leaf in B: no key in common, so it and the SCALE
        // that reads it match by (layer, op) in order between their matched neighbours
        let d = structure(
            PLAIN,
            Opts {
                mask: "kq_mask_swa",
                ..PLAIN
            },
        );
        assert_eq!(d.matched, 29);
        assert!(d.added.is_empty() && d.removed.is_empty() && d.changed.is_empty());
    }

    #[test]
    fn the_longest_chain_keeps_the_matches_in_order_in_both() {
        // (0,0) (1,3) (2,1) (3,2) (4,4): the chain skips (1,3)
        let pairs = [(0, 0), (1, 3), (2, 1), (3, 2), (4, 4)];
        assert_eq!(longest_chain(&pairs), [(0, 0), (2, 1), (3, 2), (4, 4)]);
        assert!(longest_chain(&[]).is_empty());
    }

    /// A fixed noise pattern in [-1, 1] (no RNG).
    const P: [f64; 8] = [0.0, 1.0, -1.0, 0.5, -0.5, 0.75, -0.75, 0.25];

    /// One side's scripted cycles over graph `g`: working node i takes (10 + i % 7) µs x
    /// `scale(node)` x (1 + `noise` x the pattern), a view 50 µs (which no estimate may
    /// count); the FUSED wall is 0.8 x the working nodes' sum / 1000 x (1 + `noise` x the
    /// pattern), in ms.
    fn script(
        g: &[NodeInfo],
        cycles: usize,
        offset: usize,
        noise: f64,
        scale: &dyn Fn(&NodeInfo) -> f64,
    ) -> (Vec<Vec<f64>>, Vec<f64>) {
        let mut times = Vec::new();
        let mut walls = Vec::new();
        for c in 0..cycles {
            let t: Vec<f64> = g
                .iter()
                .enumerate()
                .map(|(i, n)| {
                    if n.is_working() {
                        (10.0 + (i % 7) as f64) * scale(n) * (1.0 + noise * P[(c + i + offset) % 8])
                    } else {
                        50.0
                    }
                })
                .collect();
            let sum: f64 = g
                .iter()
                .zip(&t)
                .filter(|(n, _)| n.is_working())
                .map(|(_, v)| v)
                .sum();
            walls.push(0.8 * sum / 1000.0 * (1.0 + noise * P[(c + 3 * offset + 1) % 8]));
            times.push(t);
        }
        (times, walls)
    }

    fn ffn_up_times(k: f64) -> impl Fn(&NodeInfo) -> f64 {
        move |n: &NodeInfo| if n.base_name() == "ffn_up" { k } else { 1.0 }
    }

    fn row<'d>(d: &'d OpDiff, op: &str, name: &str) -> &'d OpRow {
        d.ops
            .iter()
            .find(|r| r.op == op && r.name == name)
            .unwrap_or_else(|| panic!("no row {op} {name}"))
    }

    #[test]
    fn the_estimator_by_hand() {
        let g = graph(PLAIN);
        // working nodes 1 µs, ffn_up 10 µs on A and 30 on B, views 100 µs (never counted):
        // A's TIMED sum 27 + 20 = 47 µs, B's 27 + 60 = 87 µs
        let side = |up: f64| -> Vec<f64> {
            g.iter()
                .map(|n| match (n.is_working(), n.base_name()) {
                    (false, _) => 100.0,
                    (true, "ffn_up") => up,
                    (true, _) => 1.0,
                })
                .collect()
        };
        let a = vec![side(10.0); 3];
        let b = vec![side(30.0); 3];
        let times = CycleTimes {
            a: &a,
            b: &b,
            control: &a,
            a_wall_ms: &[9.4; 3],
            b_wall_ms: &[17.4; 3],
            control_wall_ms: &[9.4; 3],
            tokens: 4,
        };
        let d = op_diff(&g, &g, &times, &CFG);
        // ffn_up: A 20/47 x 9.4 ms / 4 = 1.0 ms/token, B 60/87 x 17.4 / 4 = 3.0
        let up = &d.ops[0];
        assert_eq!(
            (up.op.as_str(), up.name.as_str(), up.nodes),
            ("MUL_MAT", "ffn_up", 2)
        );
        assert!((up.a_ms_per_token - 1.0).abs() < 1e-12, "{up:?}");
        assert!((up.b_ms_per_token - 3.0).abs() < 1e-12, "{up:?}");
        // the same figures every cycle: an interval of one point
        for v in [up.ratio, up.ratio_lo, up.ratio_hi] {
            assert!((v - 3.0).abs() < 1e-12, "{up:?}");
        }
        for v in [up.control_ratio, up.control_lo, up.control_hi] {
            assert!((v - 1.0).abs() < 1e-12, "{up:?}");
        }
        assert_eq!(up.verdict, Verdict::Slower);
        // norm: two nodes, A 2/47 x 9.4 / 4 = 0.1, B 2/87 x 17.4 / 4 = 0.1
        let norm = row(&d, "RMS_NORM", "norm");
        assert!((norm.a_ms_per_token - 0.1).abs() < 1e-12);
        assert!((norm.b_ms_per_token - 0.1).abs() < 1e-12);
        assert_eq!(norm.verdict, Verdict::NoChange);
        // sorted by |b - a|: ffn_up's gap of 2 first, the rest have none
        assert!(d.ops[1..]
            .iter()
            .all(|r| (r.b_ms_per_token - r.a_ms_per_token).abs() < 1e-12));
    }

    #[test]
    fn a_group_three_times_slower_in_noise_is_slower_and_the_others_are_not() {
        let g = graph(PLAIN);
        let (a, a_wall) = script(&g, 8, 0, 0.03, &|_| 1.0);
        let (b, b_wall) = script(&g, 8, 3, 0.03, &ffn_up_times(3.0));
        let (c, c_wall) = script(&g, 8, 5, 0.03, &|_| 1.0);
        let times = CycleTimes {
            a: &a,
            b: &b,
            control: &c,
            a_wall_ms: &a_wall,
            b_wall_ms: &b_wall,
            control_wall_ms: &c_wall,
            tokens: 4,
        };
        let d = op_diff(&g, &g, &times, &CFG);
        let up = &d.ops[0];
        assert_eq!(up.name, "ffn_up", "the largest gap first");
        assert!((up.ratio - 3.0).abs() < 0.2, "{up:?}");
        assert!(up.ratio_lo > 2.5 && up.ratio_hi < 3.5, "{up:?}");
        assert_eq!(up.verdict, Verdict::Slower);
        for r in &d.ops[1..] {
            assert!(
                !matches!(r.verdict, Verdict::Faster | Verdict::Slower),
                "{r:?}"
            );
        }
        // deterministic for a seed
        assert_eq!(d, op_diff(&g, &g, &times, &CFG));
    }

    #[test]
    fn a_control_ten_percent_slower_in_a_group_makes_that_row_inconclusive() {
        let g = graph(PLAIN);
        let (a, a_wall) = script(&g, 8, 0, 0.03, &|_| 1.0);
        let (b, b_wall) = script(&g, 8, 3, 0.03, &ffn_up_times(3.0));
        let (c, c_wall) = script(&g, 8, 5, 0.03, &ffn_up_times(1.1));
        let times = CycleTimes {
            a: &a,
            b: &b,
            control: &c,
            a_wall_ms: &a_wall,
            b_wall_ms: &b_wall,
            control_wall_ms: &c_wall,
            tokens: 4,
        };
        let d = op_diff(&g, &g, &times, &CFG);
        let up = row(&d, "MUL_MAT", "ffn_up");
        assert!(up.control_lo > 1.05, "{up:?}");
        assert_eq!(up.verdict, Verdict::Inconclusive);
        // the other groups' control held
        let down = row(&d, "MUL_MAT", "ffn_down");
        assert!(!Verdict::of(down.control_lo, down.control_hi, 0.05).moved());
        assert_ne!(down.verdict, Verdict::Inconclusive);
    }

    #[test]
    fn a_group_without_time_on_a_has_no_ratio_and_the_diff_round_trips() {
        let a_graph = graph(PLAIN);
        let b_graph = graph(Opts {
            fuse: Some((1, [128, 4])),
            ..PLAIN
        });
        let zero = |n: &NodeInfo| if n.name == "result_output" { 0.0 } else { 1.0 };
        let (a, a_wall) = script(&a_graph, 4, 0, 0.03, &zero);
        let (b, b_wall) = script(&b_graph, 4, 1, 0.03, &|_| 1.0);
        let (c, c_wall) = script(&a_graph, 4, 2, 0.03, &zero);
        let times = CycleTimes {
            a: &a,
            b: &b,
            control: &c,
            a_wall_ms: &a_wall,
            b_wall_ms: &b_wall,
            control_wall_ms: &c_wall,
            tokens: 4,
        };
        let d = op_diff(&a_graph, &b_graph, &times, &CFG);
        let out = row(&d, "MUL_MAT", "result_output");
        assert_eq!(out.a_ms_per_token, 0.0);
        assert!(out.b_ms_per_token > 0.0);
        assert!(out.ratio.is_nan() && out.ratio_lo.is_nan() && out.control_ratio.is_nan());
        assert_eq!(out.verdict, Verdict::WithinNoise);

        let json = serde_json::to_string(&d).unwrap();
        assert!(json.contains(r#""kind":"fused""#), "{json}");
        assert!(json.contains(r#""ratio":null"#), "{json}");
        let back: OpDiff = serde_json::from_str(&json).unwrap();
        assert_eq!(serde_json::to_string(&back).unwrap(), json);
        assert!(row(&back, "MUL_MAT", "result_output").ratio.is_nan());
        assert_eq!(back.regrouped, d.regrouped);
        assert_eq!(back.ops.len(), d.ops.len());
    }

    #[test]
    fn each_interval_is_at_the_bonferroni_level_of_all_groups() {
        // every cycle's working sum is 66 µs and its wall 6.6 ms: ffn_up's two nodes of u µs
        // each are 2u / 66 x 6.6 / 4 = 0.05 u ms/token (result_output takes 40 - 2u)
        let g = graph(PLAIN);
        let side = |us: &[f64]| -> Vec<Vec<f64>> {
            us.iter()
                .map(|&u| {
                    g.iter()
                        .map(|n| match (n.is_working(), n.name.as_str()) {
                            (false, _) => 0.0,
                            (true, "result_output") => 40.0 - 2.0 * u,
                            (true, _) if n.base_name() == "ffn_up" => u,
                            (true, _) => 1.0,
                        })
                        .collect()
                })
                .collect()
        };
        let (ua, ub, uc) = (
            [10.0, 11.0, 9.0, 10.5, 9.5, 10.2],
            [30.0, 31.5, 29.0, 30.6, 28.8, 30.3],
            [10.1, 9.9, 10.3, 9.8, 10.0, 10.4],
        );
        let (a, b, c) = (side(&ua), side(&ub), side(&uc));
        let times = CycleTimes {
            a: &a,
            b: &b,
            control: &c,
            a_wall_ms: &[6.6; 6],
            b_wall_ms: &[6.6; 6],
            control_wall_ms: &[6.6; 6],
            tokens: 4,
        };
        let d = op_diff(&g, &g, &times, &CFG);
        let up = row(&d, "MUL_MAT", "ffn_up");
        let ms = |u: &[f64]| u.iter().map(|u| 0.05 * u).collect::<Vec<f64>>();
        // 15 groups; ffn_up is the 10th in (op, name) order: ADD ffn_act, ffn_inp, l_out,
        // GET_ROWS inp_embd, MUL attn_norm, ffn_mul, MUL_MAT Qcur, attn_out, ffn_down, ffn_up
        let seed = splitmix64(7 + 9);
        let level = 0.05 / 15.0;
        let (r, lo, hi) = ratio_ci_at(&ms(&ua), &ms(&ub), 4000, seed, level).unwrap();
        let (cr, clo, chi) = ratio_ci_at(&ms(&ua), &ms(&uc), 4000, seed ^ 0xC0, level).unwrap();
        let got = [
            up.ratio,
            up.ratio_lo,
            up.ratio_hi,
            up.control_ratio,
            up.control_lo,
            up.control_hi,
        ];
        for (g, e) in got.iter().zip([r, lo, hi, cr, clo, chi]) {
            assert!(
                (g - e).abs() < 1e-9,
                "{got:?} against {:?}",
                [r, lo, hi, cr, clo, chi]
            );
        }
        // at 95 % each the interval would be narrower: the level is not the family's
        let (_, lo95, hi95) = ratio_ci_at(&ms(&ua), &ms(&ub), 4000, seed, 0.05).unwrap();
        assert!(hi95 - lo95 < hi - lo);
        assert_eq!(up.verdict, Verdict::against_control(lo, hi, clo, chi, 0.05));
    }
}
