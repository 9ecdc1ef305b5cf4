//! Node records: what one operation of an engine's compute graph is (op, name, layer, shapes,
//! types, the weight it reads). Timings live in `crate::profile`; bands in `crate::band`.

use serde::{Deserialize, Serialize};

/// Ops that only reinterpret memory and do no work (ggml's view ops and leaves).
pub const VIEW_OPS: [&str; 5] = ["VIEW", "RESHAPE", "PERMUTE", "TRANSPOSE", "NONE"];

/// Is `op` (as `ggml_op_desc` spells it) a view op?
pub fn is_view_op(op: &str) -> bool {
    VIEW_OPS.contains(&op)
}

/// One tensor as a node sees it: its own output, or one of its sources.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TensorDesc {
    pub name: String,
    /// ggml order: `ne[0]` is the innermost (contiguous) dimension.
    pub ne: [i64; 4],
    /// ggml type name (`F32`, `Q4_K`, ...).
    #[serde(rename = "type")]
    pub ggml_type: String,
    /// Bytes of the tensor's data (`ggml_nbytes`).
    pub size_bytes: u64,
    /// True when the tensor lives in a model-weights buffer.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub is_weight: bool,
    /// Strides in bytes (`nb`), for re-creating the tensor's layout (views are not contiguous).
    #[serde(default, skip_serializing_if = "is_zero4")]
    pub nb: [u64; 4],
    /// The index of the graph node that computes this tensor; `None` for weights, inputs and
    /// caches (leaves of the graph).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub producer: Option<u32>,
}

impl TensorDesc {
    /// The shape without trailing 1s, for display: `[2048, 512]`.
    pub fn shape_string(&self) -> String {
        let mut n = 4;
        while n > 1 && self.ne[n - 1] == 1 {
            n -= 1;
        }
        let dims: Vec<String> = self.ne[..n].iter().map(|d| d.to_string()).collect();
        format!("[{}]", dims.join(","))
    }
}

fn is_zero4(v: &[u64; 4]) -> bool {
    v.iter().all(|&x| x == 0)
}

/// One node of a compute graph, in the common schema every engine reports.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Position in the order the engine computes the graph.
    pub index: u32,
    /// Operation name (`MUL_MAT`, `SILU`, `FLASH_ATTN_EXT`, ...): ggml's `ggml_op_desc`.
    pub op: String,
    /// The node's own name (`ffn_moe_gate-3`, `node_17`, `Qcur-3 (reshaped)`).
    pub name: String,
    /// The layer the node belongs to, parsed from the `-<layer>` suffix of its name.
    pub layer: Option<u32>,
    /// The node's output tensor.
    pub out: TensorDesc,
    /// The node's sources by position (`src[0]`, `src[1]`, ...); `None` where a slot is empty
    /// (a flash-attention node without a mask, say).
    pub srcs: Vec<Option<TensorDesc>>,
    /// The node only reinterprets memory (see [`VIEW_OPS`]).
    pub is_view: bool,
    /// The node writes into memory it views (a cache write, an in-place op).
    pub inplace: bool,
    /// The backend skips the node: it lacks ggml's COMPUTE flag (the unselected branch of a
    /// `ggml_build_forward_select`, such as llama.cpp's mixed-batch input path).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub skipped: bool,
    /// The engine's own op code and parameters (ggml's `op` and `op_params`, trailing zeros
    /// dropped), so one node can be rebuilt and timed alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_code: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub op_params: Vec<i32>,
    /// The device the node ran on, where the graph is split across devices (`CPU`,
    /// `RPC0[host:port]`; for a transfer node the link, `CPU -> RPC0[...]`); `None` on one
    /// device.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
}

impl NodeInfo {
    /// The node does work: not a view, not skipped by the backend.
    pub fn is_working(&self) -> bool {
        !self.is_view && !self.skipped
    }

    /// The first source that is a model weight, if any.
    pub fn weight(&self) -> Option<&TensorDesc> {
        self.srcs.iter().flatten().find(|s| s.is_weight)
    }

    /// Bytes of all weight sources (for an expert matmul: the whole expert tensor, not only the
    /// routed experts).
    pub fn weight_bytes(&self) -> u64 {
        self.srcs
            .iter()
            .flatten()
            .filter(|s| s.is_weight)
            .map(|s| s.size_bytes)
            .sum()
    }

    /// The name without its layer suffix and view decorations: `Qcur-3 (reshaped)` -> `Qcur`.
    pub fn base_name(&self) -> &str {
        base_name(&self.name)
    }

    /// The source in slot `i`, if present.
    pub fn src(&self, i: usize) -> Option<&TensorDesc> {
        self.srcs.get(i).and_then(|s| s.as_ref())
    }
}

/// A generic node name (`node_17`, empty) carries no meaning of its own.
pub fn is_generic_name(name: &str) -> bool {
    name.is_empty()
        || name
            .strip_prefix("node_")
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

/// Does the node's name say nothing of its own? True for views, unnamed nodes and nodes named
/// after another tensor (`x (copy of y)`): these take their band and layer from their neighbours.
pub fn borrows_identity(node: &NodeInfo) -> bool {
    node.is_view || is_generic_name(&node.name) || node.name.contains(" (")
}

/// The layer of every node: its own (from its name) where it has one, else, for nodes that
/// borrow their identity, the layer of the node it reads or, failing that, of the node that
/// reads it. Named nodes outside layers (`result_norm`) stay `None`.
pub fn effective_layers(graph: &[NodeInfo]) -> Vec<Option<u32>> {
    let mut layers: Vec<Option<u32>> = graph.iter().map(|n| n.layer).collect();
    for i in 0..graph.len() {
        if layers[i].is_some() || !borrows_identity(&graph[i]) {
            continue;
        }
        layers[i] = graph[i]
            .srcs
            .iter()
            .flatten()
            .filter_map(|s| s.producer)
            .filter(|&p| (p as usize) < i)
            .find_map(|p| layers[p as usize]);
    }
    let mut first_consumer: Vec<Option<usize>> = vec![None; graph.len()];
    for (i, n) in graph.iter().enumerate() {
        for p in n.srcs.iter().flatten().filter_map(|s| s.producer) {
            if let Some(slot) = first_consumer.get_mut(p as usize) {
                slot.get_or_insert(i);
            }
        }
    }
    for i in (0..graph.len()).rev() {
        if layers[i].is_none() && borrows_identity(&graph[i]) {
            layers[i] = first_consumer[i].and_then(|c| layers[c]);
        }
    }
    layers
}

/// Strips ggml's decorations (` (view)`, ` (reshaped)`, ` (permuted)`, ` (transposed)`,
/// ` (copy of ...)`, ` (cont)`) and the `-<layer>` suffix from a node name.
pub fn base_name(name: &str) -> &str {
    let s = strip_decorations(name);
    if let Some((head, _)) = cache_layer(s) {
        return head;
    }
    match s.rsplit_once('-') {
        Some((head, tail))
            if !head.is_empty() && !tail.is_empty() && tail.bytes().all(|b| b.is_ascii_digit()) =>
        {
            head
        }
        _ => s,
    }
}

/// A name without ggml's ` (view)`-style decorations (they can stack).
fn strip_decorations(name: &str) -> &str {
    match name.find(" (") {
        Some(pos) => &name[..pos],
        None => name,
    }
}

/// Cache tensors are named `cache_<x>_l<layer>` (`cache_k_l3`, `cache_r_l0`): (`cache_k`, 3).
fn cache_layer(s: &str) -> Option<(&str, u32)> {
    if !s.starts_with("cache_") {
        return None;
    }
    let (head, tail) = s.rsplit_once("_l")?;
    if head.len() <= "cache".len() || tail.is_empty() || !tail.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((head, tail.parse().ok()?))
}

/// The layer number of a node name (`ffn_moe_gate-3` -> 3), if the name carries one.
pub fn layer_of(name: &str) -> Option<u32> {
    let s = strip_decorations(name);
    if let Some((_, layer)) = cache_layer(s) {
        return Some(layer);
    }
    let (head, tail) = s.rsplit_once('-')?;
    if head.is_empty() || tail.is_empty() || !tail.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    tail.parse().ok()
}

/// The token of a weight name: `blk.3.attn_qkv.weight` -> `attn_qkv`, `token_embd.weight` ->
/// `token_embd`, `blk.0.ssm_a` -> `ssm_a`. Exact tokens, never substrings: `attn_q` is not
/// `attn_qkv`.
pub fn weight_token(name: &str) -> &str {
    let s = weight_base(name);
    match s.strip_prefix("blk.") {
        Some(rest) => match rest.split_once('.') {
            Some((layer, token)) if layer.bytes().all(|b| b.is_ascii_digit()) => token,
            _ => rest,
        },
        None => s,
    }
}

/// The layer of a weight: 3 for `blk.3.attn_output.weight`.
pub fn weight_layer(name: &str) -> Option<u32> {
    let rest = weight_base(name).strip_prefix("blk.")?;
    let (layer, _) = rest.split_once('.')?;
    layer.parse().ok()
}

/// A weight name without what llama.cpp and ggml add around the tensor-name format of
/// `src/llama-arch.cpp`: the scheduler's copy of a split input (`CUDA0#blk.3.ffn_up.weight#0`),
/// ggml's decorations, a LoRA suffix and the type suffix (`weight`, `bias`, `scale`,
/// `input_scale`, `scales`).
fn weight_base(name: &str) -> &str {
    let mut s = strip_decorations(name);
    if let Some((_, inner)) = s.split_once('#') {
        s = inner.rsplit_once('#').map(|(n, _)| n).unwrap_or(inner);
    }
    for suffix in [".lora_a", ".lora_b"] {
        s = s.strip_suffix(suffix).unwrap_or(s);
    }
    for suffix in [".weight", ".bias", ".input_scale", ".scales", ".scale"] {
        if let Some(t) = s.strip_suffix(suffix) {
            return t;
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_name_strips_layer_and_decorations() {
        assert_eq!(base_name("ffn_moe_gate-3"), "ffn_moe_gate");
        assert_eq!(base_name("Qcur-12 (reshaped)"), "Qcur");
        assert_eq!(base_name("Qcur-12 (reshaped) (permuted)"), "Qcur");
        assert_eq!(base_name("node_17"), "node_17");
        assert_eq!(base_name("Kcur-post-rope-3"), "Kcur-post-rope");
        assert_eq!(base_name("result_output"), "result_output");
        assert_eq!(base_name("cache_k_l3 (view)"), "cache_k");
        assert_eq!(base_name("cache_r_l0 (reshaped) (view) (view)"), "cache_r");
        assert_eq!(base_name("cache_l3"), "cache_l3");
        assert_eq!(base_name("a-b"), "a-b");
        assert_eq!(base_name("-3"), "-3");
    }

    #[test]
    fn layer_parsed_from_suffix_only() {
        assert_eq!(layer_of("ffn_moe_gate-3"), Some(3));
        assert_eq!(layer_of("Qcur-39 (reshaped)"), Some(39));
        assert_eq!(layer_of("node_17"), None);
        assert_eq!(layer_of("result_norm"), None);
        assert_eq!(layer_of("x-"), None);
        assert_eq!(layer_of("cache_s_l12 (view)"), Some(12));
        assert_eq!(layer_of("cache_x"), None);
    }

    #[test]
    fn attn_q_token_does_not_match_attn_qkv() {
        assert_eq!(weight_token("blk.0.attn_qkv.weight"), "attn_qkv");
        assert_eq!(weight_token("blk.3.attn_q.weight"), "attn_q");
        assert_ne!(weight_token("blk.0.attn_qkv.weight"), "attn_q");
        assert_eq!(weight_token("blk.1.ssm_a"), "ssm_a");
        assert_eq!(weight_token("token_embd.weight"), "token_embd");
        assert_eq!(weight_token("output.weight"), "output");
        assert_eq!(
            weight_token("blk.2.ffn_down_exps.weight (view)"),
            "ffn_down_exps"
        );
        assert_eq!(weight_token("blk.2.ssm_dt.bias"), "ssm_dt");
        assert_eq!(weight_token("CUDA0#blk.3.ffn_up.weight#0"), "ffn_up");
        assert_eq!(weight_token("blk.3.attn_q.scale"), "attn_q");
        assert_eq!(weight_token("blk.3.attn_q.weight.lora_a"), "attn_q");
        assert_eq!(
            weight_token("blk.4.shortconv.in_proj.weight"),
            "shortconv.in_proj"
        );
        assert_eq!(weight_token("blk.4.nextn.eh_proj.weight"), "nextn.eh_proj");
        assert_eq!(weight_layer("blk.12.attn_output.weight"), Some(12));
        assert_eq!(weight_layer("CUDA0#blk.3.ffn_up.weight#0"), Some(3));
        assert_eq!(weight_layer("output.weight"), None);
    }

    #[test]
    fn shape_string_drops_trailing_ones() {
        let t = TensorDesc {
            name: "x".into(),
            ne: [2048, 512, 1, 1],
            ggml_type: "F32".into(),
            size_bytes: 0,
            is_weight: false,
            producer: None,
            nb: [0; 4],
        };
        assert_eq!(t.shape_string(), "[2048,512]");
    }
}
