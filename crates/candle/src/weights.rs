//! Model weights read from a validated GGUF file into candle tensors: quantised matmul weights
//! stay quantised (`QMatMul`), 3-D expert tensors are split into one 2-D `QTensor` per expert
//! without dequantising, norms become f32 tensors. Each weight keeps the record the graph shows
//! for it (its GGUF name, ggml shape and type).

use std::borrow::Cow;
use std::fs::File;
use std::io::BufReader;

use candle_core::quantized::{GgmlDType, QMatMul, QStorage, QTensor};
use candle_core::{Device, Tensor};
use opledger_core::node::TensorDesc;
use opledger_gguf::{GgmlType, GgufFile, TensorInfo};

use crate::error::CandleError;
use crate::hparams::{Arch, Hparams};

/// A matmul weight: `x @ W^T` through candle's quantised kernels (F32/F16 weights are
/// dequantised by `QMatMul` itself and run through the float gemm).
pub(crate) struct Linear {
    pub mm: QMatMul,
    pub desc: TensorDesc,
}

/// A norm weight (f32).
pub(crate) struct Norm {
    pub w: Tensor,
    pub desc: TensorDesc,
}

/// The token embedding: rows are dequantised on lookup (`QTensor::embedding`, ggml's GET_ROWS).
pub(crate) struct Embedding {
    pub q: QTensor,
    pub desc: TensorDesc,
}

/// One 3-D expert tensor as one 2-D quantised matmul per expert. `descs[e]` describes expert
/// e's slice: the tensor's GGUF name decorated ` (expert e)`, one expert's shape and bytes.
pub(crate) struct Experts {
    pub mm: Vec<QMatMul>,
    pub descs: Vec<TensorDesc>,
    /// Rows of one expert's weight (its output width).
    pub rows: usize,
}

/// The routed experts' gate and up projections: two tensors, or one fused `ffn_gate_up_exps`
/// whose rows are gate then up.
pub(crate) enum GateUp {
    Separate { gate: Experts, up: Experts },
    Fused(Experts),
}

pub(crate) enum Ffn {
    Dense {
        gate: Linear,
        up: Linear,
        down: Linear,
    },
    Moe {
        router: Linear,
        gate_up: GateUp,
        down: Experts,
    },
}

pub(crate) struct Layer {
    pub attn_norm: Norm,
    pub wq: Linear,
    pub wk: Linear,
    pub wv: Linear,
    pub wo: Linear,
    pub q_norm: Option<Norm>,
    pub k_norm: Option<Norm>,
    pub ffn_norm: Norm,
    pub ffn: Ffn,
}

pub(crate) struct Weights {
    pub token_embd: Embedding,
    pub layers: Vec<Layer>,
    pub output_norm: Norm,
    /// The LM head (`output.weight`, or the token embedding when the file ties them).
    pub output: Linear,
    /// Llama 3 rope frequency factors (`rope_freqs.weight`), one per rotated pair.
    pub rope_freqs: Option<Vec<f32>>,
    /// Bytes of quantised and float weights held (before any repacking by candle).
    pub weight_bytes: u64,
}

/// candle's type for a ggml type, where candle has one.
fn candle_dtype(t: GgmlType) -> Option<GgmlDType> {
    Some(match t {
        GgmlType::F32 => GgmlDType::F32,
        GgmlType::F16 => GgmlDType::F16,
        GgmlType::BF16 => GgmlDType::BF16,
        GgmlType::Q4_0 => GgmlDType::Q4_0,
        GgmlType::Q4_1 => GgmlDType::Q4_1,
        GgmlType::Q5_0 => GgmlDType::Q5_0,
        GgmlType::Q5_1 => GgmlDType::Q5_1,
        GgmlType::Q8_0 => GgmlDType::Q8_0,
        GgmlType::Q8_1 => GgmlDType::Q8_1,
        GgmlType::Q2_K => GgmlDType::Q2K,
        GgmlType::Q3_K => GgmlDType::Q3K,
        GgmlType::Q4_K => GgmlDType::Q4K,
        GgmlType::Q5_K => GgmlDType::Q5K,
        GgmlType::Q6_K => GgmlDType::Q6K,
        GgmlType::Q8_K => GgmlDType::Q8K,
        _ => return None,
    })
}

/// The record of a weight tensor as a graph source.
fn desc(info: &TensorInfo) -> TensorDesc {
    let mut ne = [1i64; 4];
    for (slot, d) in ne.iter_mut().zip(&info.dims) {
        *slot = *d as i64;
    }
    TensorDesc {
        name: info.name.clone(),
        ne,
        ggml_type: info.ggml_type.name().to_string(),
        size_bytes: info.size_bytes,
        is_weight: true,
        producer: None,
        nb: [0; 4],
    }
}

/// Reads tensors of one validated GGUF file.
pub(crate) struct Loader<'a> {
    file: &'a GgufFile,
    reader: BufReader<File>,
    device: Device,
    bytes: u64,
}

impl<'a> Loader<'a> {
    pub fn new(file: &'a GgufFile) -> Result<Loader<'a>, CandleError> {
        let f = File::open(&file.path).map_err(|source| opledger_gguf::GgufError::Io {
            path: file.path.clone(),
            source,
        })?;
        Ok(Loader {
            file,
            reader: BufReader::with_capacity(1 << 20, f),
            device: Device::Cpu,
            bytes: 0,
        })
    }

    fn bad(&self, what: String) -> CandleError {
        CandleError::Model {
            path: self.file.path.clone(),
            what,
        }
    }

    fn info(&self, name: &str) -> Result<&'a TensorInfo, CandleError> {
        self.file
            .tensor(name)
            .ok_or_else(|| self.bad(format!("missing tensor {name}")))
    }

    fn has(&self, name: &str) -> bool {
        self.file.tensor(name).is_some()
    }

    fn dtype(&self, info: &TensorInfo) -> Result<GgmlDType, CandleError> {
        candle_dtype(info.ggml_type).ok_or_else(|| CandleError::UnsupportedType {
            path: self.file.path.clone(),
            name: info.name.clone(),
            ggml_type: info.ggml_type.name().to_string(),
        })
    }

    /// Checks the tensor's ggml shape (ne[0] first).
    fn expect_dims(&self, info: &TensorInfo, dims: &[usize]) -> Result<(), CandleError> {
        let found: Vec<usize> = info.dims.iter().map(|&d| d as usize).collect();
        if found != dims {
            return Err(self.bad(format!(
                "tensor {} has shape {found:?}, the metadata implies {dims:?}",
                info.name
            )));
        }
        Ok(())
    }

    /// A tensor's bytes as a candle `QTensor` of candle's (reversed) shape.
    fn qtensor(&mut self, info: &TensorInfo) -> Result<QTensor, CandleError> {
        let dtype = self.dtype(info)?;
        let data = self.file.read_tensor_data(&mut self.reader, &info.name)?;
        self.bytes += data.len() as u64;
        let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
        let storage = QStorage::from_data(aligned(&data), &self.device, dtype)?;
        Ok(QTensor::new(storage, shape)?)
    }

    pub fn linear(&mut self, name: &str, dims: &[usize]) -> Result<Linear, CandleError> {
        let info = self.info(name)?;
        self.expect_dims(info, dims)?;
        let q = self.qtensor(info)?;
        Ok(Linear {
            mm: QMatMul::from_qtensor(q)?,
            desc: desc(info),
        })
    }

    pub fn norm(&mut self, name: &str, n: usize) -> Result<Norm, CandleError> {
        let info = self.info(name)?;
        self.expect_dims(info, &[n])?;
        let w = self.qtensor(info)?.dequantize(&self.device)?;
        Ok(Norm {
            w,
            desc: desc(info),
        })
    }

    pub fn embedding(&mut self, name: &str, dims: &[usize]) -> Result<Embedding, CandleError> {
        let info = self.info(name)?;
        self.expect_dims(info, dims)?;
        let q = self.qtensor(info)?;
        Ok(Embedding {
            q,
            desc: desc(info),
        })
    }

    /// A 3-D expert tensor `{k, n, n_expert}` split into `n_expert` 2-D `(n, k)` quantised
    /// tensors: expert e's blocks are the bytes `e * len .. (e + 1) * len`, with
    /// `len = n * k / block_size * type_size`. Nothing is dequantised.
    pub fn experts(
        &mut self,
        name: &str,
        k: usize,
        n: usize,
        n_expert: usize,
    ) -> Result<Experts, CandleError> {
        let info = self.info(name)?;
        self.expect_dims(info, &[k, n, n_expert])?;
        let dtype = self.dtype(info)?;
        if !k.is_multiple_of(dtype.block_size()) {
            return Err(self.bad(format!(
                "tensor {name}: rows of {k} are not whole blocks of {}",
                dtype.block_size()
            )));
        }
        let len = n * k / dtype.block_size() * dtype.type_size();
        let data = self.file.read_tensor_data(&mut self.reader, name)?;
        if data.len() != len * n_expert {
            return Err(self.bad(format!(
                "tensor {name}: {} bytes, {n_expert} experts of {len} expected",
                data.len()
            )));
        }
        self.bytes += data.len() as u64;
        let whole = desc(info);
        let mut mm = Vec::with_capacity(n_expert);
        let mut descs = Vec::with_capacity(n_expert);
        for e in 0..n_expert {
            let bytes = &data[e * len..(e + 1) * len];
            let storage = QStorage::from_data(aligned(bytes), &self.device, dtype)?;
            mm.push(QMatMul::from_qtensor(QTensor::new(storage, (n, k))?)?);
            descs.push(TensorDesc {
                name: format!("{name} (expert {e})"),
                ne: [k as i64, n as i64, 1, 1],
                ggml_type: whole.ggml_type.clone(),
                size_bytes: len as u64,
                is_weight: true,
                producer: None,
                nb: [0; 4],
            });
        }
        Ok(Experts { mm, descs, rows: n })
    }

    fn f32_vec(&mut self, name: &str, n: usize) -> Result<Vec<f32>, CandleError> {
        let info = self.info(name)?;
        self.expect_dims(info, &[n])?;
        let t = self.qtensor(info)?.dequantize(&self.device)?;
        Ok(t.to_vec1::<f32>()?)
    }
}

/// The bytes, copied into a fresh buffer only if they are not aligned for candle's block types
/// (candle asserts the alignment; the largest a block type needs is 4).
fn aligned(bytes: &[u8]) -> Cow<'_, [u8]> {
    if (bytes.as_ptr() as usize).is_multiple_of(8) {
        Cow::Borrowed(bytes)
    } else {
        // A Vec<u64> is 8-aligned; copy the bytes into it and hand them over as bytes.
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        for (w, chunk) in words.iter_mut().zip(bytes.chunks(8)) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            *w = u64::from_le_bytes(b);
        }
        let mut out: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        out.truncate(bytes.len());
        Cow::Owned(out)
    }
}

impl Weights {
    /// Loads every weight the forward pass of `hp.arch` reads, checking each shape against the
    /// metadata.
    pub fn load(file: &GgufFile, hp: &Hparams) -> Result<Weights, CandleError> {
        let mut l = Loader::new(file)?;
        let e = hp.n_embd;
        let v = hp.n_vocab;
        let q_width = hp.head_dim * hp.n_head;
        let kv_width = hp.head_dim * hp.n_head_kv;
        let token_embd = l.embedding("token_embd.weight", &[e, v])?;
        let rope_freqs = if l.has("rope_freqs.weight") {
            Some(l.f32_vec("rope_freqs.weight", hp.head_dim / 2)?)
        } else {
            None
        };
        let mut layers = Vec::with_capacity(hp.n_layer);
        for il in 0..hp.n_layer {
            let n = |t: &str| format!("blk.{il}.{t}.weight");
            let qk_norm = hp.arch.has_qk_norm();
            let attn_norm = l.norm(&n("attn_norm"), e)?;
            let wq = l.linear(&n("attn_q"), &[e, q_width])?;
            let wk = l.linear(&n("attn_k"), &[e, kv_width])?;
            let wv = l.linear(&n("attn_v"), &[e, kv_width])?;
            let wo = l.linear(&n("attn_output"), &[q_width, e])?;
            let q_norm = if qk_norm {
                Some(l.norm(&n("attn_q_norm"), hp.head_dim)?)
            } else {
                None
            };
            let k_norm = if qk_norm {
                Some(l.norm(&n("attn_k_norm"), hp.head_dim)?)
            } else {
                None
            };
            let ffn_norm = l.norm(&n("ffn_norm"), e)?;
            if hp.arch == Arch::Llama && l.has(&n("ffn_gate_inp")) {
                return Err(l.bad(
                    "llama files with routed experts (Mixtral-style) are not implemented by the \
                     candle engine"
                        .into(),
                ));
            }
            let ffn = if hp.is_moe() && l.has(&n("ffn_gate_inp")) {
                let ne = hp.n_expert;
                let router = l.linear(&n("ffn_gate_inp"), &[e, ne])?;
                let down_info = l.info(&n("ffn_down_exps"))?;
                let ff = *down_info.dims.first().unwrap_or(&0) as usize;
                let gate_up = if l.has(&n("ffn_gate_up_exps")) {
                    GateUp::Fused(l.experts(&n("ffn_gate_up_exps"), e, 2 * ff, ne)?)
                } else {
                    GateUp::Separate {
                        gate: l.experts(&n("ffn_gate_exps"), e, ff, ne)?,
                        up: l.experts(&n("ffn_up_exps"), e, ff, ne)?,
                    }
                };
                let down = l.experts(&n("ffn_down_exps"), ff, e, ne)?;
                Ffn::Moe {
                    router,
                    gate_up,
                    down,
                }
            } else if hp.arch == Arch::Qwen3Moe {
                return Err(l.bad(format!("qwen3moe layer {il} has no router ffn_gate_inp")));
            } else {
                let ff_info = l.info(&n("ffn_gate"))?;
                let ff = *ff_info.dims.get(1).unwrap_or(&0) as usize;
                Ffn::Dense {
                    gate: l.linear(&n("ffn_gate"), &[e, ff])?,
                    up: l.linear(&n("ffn_up"), &[e, ff])?,
                    down: l.linear(&n("ffn_down"), &[ff, e])?,
                }
            };
            layers.push(Layer {
                attn_norm,
                wq,
                wk,
                wv,
                wo,
                q_norm,
                k_norm,
                ffn_norm,
                ffn,
            });
        }
        let output_norm = l.norm("output_norm.weight", e)?;
        let output = if l.has("output.weight") {
            l.linear("output.weight", &[e, v])?
        } else {
            l.linear("token_embd.weight", &[e, v])?
        };
        Ok(Weights {
            token_embd,
            layers,
            output_norm,
            output,
            rope_freqs,
            weight_bytes: l.bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opledger_gguf::{synthesize, SynthOptions};

    #[test]
    fn expert_split_matches_the_whole_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        synthesize(&SynthOptions::new("tiny-qwen3moe"), &path, &mut |_, _| {}).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let mut l = Loader::new(&file).unwrap();
        let name = "blk.1.ffn_down_exps.weight";
        let info = l.info(name).unwrap();
        let (k, n, ne) = (
            info.dims[0] as usize,
            info.dims[1] as usize,
            info.dims[2] as usize,
        );
        let whole = l.qtensor(info).unwrap();
        assert_eq!(whole.shape().dims(), &[ne, n, k], "candle's reversed shape");
        let whole = whole.dequantize(&Device::Cpu).unwrap();
        let experts = l.experts(name, k, n, ne).unwrap();
        assert_eq!(experts.mm.len(), ne);
        for e in [0, 5, ne - 1] {
            let QMatMul::QTensor(q) = &experts.mm[e] else {
                panic!("a quantised expert was dequantised at load");
            };
            let one = q.dequantize(&Device::Cpu).unwrap();
            let slice = whole.get(e).unwrap();
            let diff = (one - slice)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(diff, 0.0, "expert {e}");
            assert_eq!(experts.descs[e].name, format!("{name} (expert {e})"));
            assert_eq!(experts.descs[e].size_bytes * ne as u64, info.size_bytes);
        }
    }

    #[test]
    fn a_wrong_shape_names_the_tensor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        synthesize(&SynthOptions::new("tiny-qwen3"), &path, &mut |_, _| {}).unwrap();
        let file = GgufFile::open(&path).unwrap();
        let mut l = Loader::new(&file).unwrap();
        let err = l.linear("blk.0.attn_q.weight", &[256, 7]).err().unwrap();
        let msg = err.to_string();
        assert!(
            msg.contains("blk.0.attn_q.weight") && msg.contains("m.gguf"),
            "{msg}"
        );
    }
}
