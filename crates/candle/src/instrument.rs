//! The instrument: every candle op of the forward pass goes through [`Observe::node`]. Without an
//! instrument ([`Plain`]) a node is the bare op call; the [`Instrument`] counts nodes, describes
//! them in opledger's schema (capture) or times each one alone (timed). candle executes eagerly
//! on the CPU: an op has completed, on every worker thread, when its call returns, so timing the
//! call times the node in isolation, and the next node starts only after it.

use std::collections::HashMap;
use std::time::Instant;

use candle_core::{DType, Tensor, TensorId};
use opledger_core::node::{is_view_op, layer_of, NodeInfo, TensorDesc};

use crate::error::CandleError;

/// A node's source: an activation (a tensor of this forward pass or a graph input) or a weight.
pub(crate) enum Src<'a> {
    Act(&'a Tensor),
    Weight(&'a TensorDesc),
}

/// What a node computes: one tensor, or several (the first is the node's output).
pub(crate) trait Outputs {
    fn visit(&self, f: &mut dyn FnMut(&Tensor));
}

impl Outputs for Tensor {
    fn visit(&self, f: &mut dyn FnMut(&Tensor)) {
        f(self)
    }
}

/// Runs the forward pass's ops, observed or not.
pub(crate) trait Observe {
    /// Runs `f`, one node of the graph: op `op` (ggml's vocabulary where it has one), named
    /// `name` (`""`: named after its first source, as ggml names views and copies) in `layer`,
    /// reading `srcs`.
    fn node<R: Outputs>(
        &mut self,
        op: &'static str,
        name: &'static str,
        layer: Option<usize>,
        srcs: &[Src<'_>],
        f: impl Fn() -> candle_core::Result<R>,
    ) -> Result<R, CandleError>;

    /// Names a graph input (a leaf: token ids, mask, rope tables, a cache).
    fn input(&mut self, t: &Tensor, name: &str);
}

/// No instrument at all: the plain forward pass.
pub(crate) struct Plain;

impl Observe for Plain {
    #[inline(always)]
    fn node<R: Outputs>(
        &mut self,
        _op: &'static str,
        _name: &'static str,
        _layer: Option<usize>,
        _srcs: &[Src<'_>],
        f: impl Fn() -> candle_core::Result<R>,
    ) -> Result<R, CandleError> {
        Ok(f()?)
    }

    #[inline(always)]
    fn input(&mut self, _t: &Tensor, _name: &str) {}
}

/// What the instrument does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InstrumentMode {
    /// Count nodes only: the forward at native speed with the instrument installed.
    Count,
    /// Describe every node.
    Capture,
    /// Time every node alone.
    Timed,
}

/// A tensor the capture has seen: its name and the node that computed it.
struct Known {
    name: String,
    producer: Option<u32>,
}

/// The installed instrument.
pub(crate) struct Instrument {
    mode: InstrumentMode,
    pub nodes_seen: u32,
    /// Per-node microseconds (Timed).
    pub node_us: Vec<f64>,
    /// Every node described (Capture).
    pub captured: Vec<NodeInfo>,
    /// The op of every node seen (Capture), or expected (Timed: the captured graph's).
    pub ops: Vec<&'static str>,
    /// The first node whose op differed from the expected graph (Timed).
    pub mismatch: Option<String>,
    known: HashMap<TensorId, Known>,
}

impl Instrument {
    pub fn count() -> Instrument {
        Instrument::new(InstrumentMode::Count, Vec::new())
    }

    pub fn capture() -> Instrument {
        Instrument::new(InstrumentMode::Capture, Vec::new())
    }

    /// Times every node and checks that the ops are those of `expected_ops`.
    pub fn timed(expected_ops: Vec<&'static str>) -> Instrument {
        Instrument::new(InstrumentMode::Timed, expected_ops)
    }

    fn new(mode: InstrumentMode, ops: Vec<&'static str>) -> Instrument {
        Instrument {
            mode,
            nodes_seen: 0,
            node_us: Vec::with_capacity(ops.len()),
            captured: Vec::new(),
            ops,
            mismatch: None,
            known: HashMap::new(),
        }
    }

    fn src_desc(&self, s: &Src<'_>) -> TensorDesc {
        match s {
            Src::Weight(d) => (*d).clone(),
            Src::Act(t) => {
                let (name, producer) = match self.known.get(&t.id()) {
                    Some(k) => (k.name.clone(), k.producer),
                    None => ("input".to_string(), None),
                };
                tensor_desc(name, t, producer)
            }
        }
    }

    fn describe(
        &mut self,
        op: &'static str,
        name: &'static str,
        layer: Option<usize>,
        srcs: &[Src<'_>],
        out: &dyn Outputs,
    ) -> Result<(), CandleError> {
        let index = self.captured.len() as u32;
        let srcs: Vec<Option<TensorDesc>> = srcs.iter().map(|s| Some(self.src_desc(s))).collect();
        let full_name = if name.is_empty() && op == "SET_ROWS" {
            // a write into a cache is a view of the cache, as ggml names it
            let base = srcs
                .iter()
                .flatten()
                .rfind(|s| !s.is_weight)
                .map(|s| s.name.clone())
                .unwrap_or_else(|| format!("node_{index}"));
            format!("{base} (view)")
        } else if name.is_empty() {
            let base = srcs
                .iter()
                .flatten()
                .find(|s| !s.is_weight)
                .map(|s| s.name.clone())
                .unwrap_or_else(|| format!("node_{index}"));
            format!("{base}{}", decoration(op))
        } else {
            match layer {
                Some(l) => format!("{name}-{l}"),
                None => name.to_string(),
            }
        };
        let mut first: Option<TensorDesc> = None;
        let mut outs = Vec::new();
        out.visit(&mut |t| {
            if first.is_none() {
                first = Some(tensor_desc(full_name.clone(), t, None));
            }
            outs.push(t.id());
        });
        let out =
            first.ok_or_else(|| CandleError::Invalid(format!("node {full_name} has no output")))?;
        for id in outs {
            self.known.insert(
                id,
                Known {
                    name: full_name.clone(),
                    producer: Some(index),
                },
            );
        }
        self.captured.push(NodeInfo {
            index,
            op: op.to_string(),
            layer: layer_of(&full_name),
            name: full_name,
            out,
            srcs,
            is_view: is_view_op(op),
            inplace: op == "SET_ROWS",
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        });
        self.ops.push(op);
        Ok(())
    }
}

impl Observe for Instrument {
    fn node<R: Outputs>(
        &mut self,
        op: &'static str,
        name: &'static str,
        layer: Option<usize>,
        srcs: &[Src<'_>],
        f: impl Fn() -> candle_core::Result<R>,
    ) -> Result<R, CandleError> {
        let i = self.nodes_seen as usize;
        self.nodes_seen += 1;
        match self.mode {
            InstrumentMode::Count => Ok(f()?),
            InstrumentMode::Capture => {
                if op == "RESHAPE" {
                    // candle copies when it reshapes a non-contiguous tensor: that is no view.
                    if let Some(Src::Act(t)) = srcs.first() {
                        if !t.is_contiguous() {
                            return Err(CandleError::Invalid(format!(
                                "node {i}: RESHAPE of a non-contiguous tensor would copy"
                            )));
                        }
                    }
                }
                let r = f()?;
                self.describe(op, name, layer, srcs, &r)?;
                Ok(r)
            }
            InstrumentMode::Timed => {
                if self.mismatch.is_none() && self.ops.get(i) != Some(&op) {
                    self.mismatch = Some(format!(
                        "TIMED mode computed {op} at node {i}, the captured graph has {}",
                        self.ops.get(i).copied().unwrap_or("no node")
                    ));
                }
                let t0 = Instant::now();
                let r = f();
                let us = t0.elapsed().as_secs_f64() * 1e6;
                self.node_us.push(us);
                Ok(r?)
            }
        }
    }

    fn input(&mut self, t: &Tensor, name: &str) {
        if self.mode == InstrumentMode::Capture {
            self.known.insert(
                t.id(),
                Known {
                    name: name.to_string(),
                    producer: None,
                },
            );
        }
    }
}

/// ggml's decorations of view and copy names.
fn decoration(op: &str) -> &'static str {
    match op {
        "RESHAPE" => " (reshaped)",
        "PERMUTE" => " (permuted)",
        "TRANSPOSE" => " (transposed)",
        "VIEW" => " (view)",
        "CONT" => " (cont)",
        _ => " (copy)",
    }
}

/// A candle tensor in the common schema: ggml order (`ne[0]` innermost), a ggml-style type name.
pub(crate) fn tensor_desc(name: String, t: &Tensor, producer: Option<u32>) -> TensorDesc {
    let dims = t.dims();
    let mut ne = [1i64; 4];
    for (slot, d) in ne.iter_mut().zip(dims.iter().rev()) {
        *slot = *d as i64;
    }
    if dims.len() > 4 {
        // fold the outer dimensions into ne[3]
        ne[3] = dims[..dims.len() - 3].iter().product::<usize>() as i64;
    }
    TensorDesc {
        name,
        ne,
        ggml_type: dtype_name(t.dtype()).to_string(),
        size_bytes: (t.elem_count() * t.dtype().size_in_bytes()) as u64,
        is_weight: false,
        producer,
        nb: [0; 4],
    }
}

fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F16 => "F16",
        DType::BF16 => "BF16",
        DType::F64 => "F64",
        DType::U8 => "U8",
        DType::U32 => "U32",
        DType::I64 => "I64",
        _ => "?",
    }
}
