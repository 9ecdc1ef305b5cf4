//! The gate in front of llama.cpp: a read GGUF file checked against what the linked llama.cpp
//! requires of its architecture (keys and their types, tensors and their shapes, tensor types).
//!
//! The reader ([`crate::reader`]) guarantees the file is well formed. This module adds what
//! llama.cpp would otherwise find out for itself, sometimes by aborting: the rules come from
//! `load_hparams` in `src/llama-model.cpp`, each arch's `load_arch_hparams` and
//! `load_arch_tensors` in `src/models/<arch>.cpp`, the `GGML_ASSERT`s of their graphs, and the
//! CPU kernels of `ggml-cpu.c` (all in llama-cpp-sys-2 0.1.161). In three layers: every
//! architecture llama.cpp loads gets the shared hyperparameter checks ([`generic`]) and, where
//! its own code aborts on a value, those of its family ([`family`]); the architectures opledger
//! plans tensors for get every tensor checked too. Expected tensor shapes are not written
//! twice: the metadata is turned into a [`Preset`] and the synthetic planner ([`plan_for`])
//! lists every tensor the arch loads, as it does when writing a model.

mod family;
mod generic;

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use crate::error::GgufError;
use crate::llama_archs::{llama_support, loadable_archs, LlamaSupport, LLAMA_CPP_SYS_VERSION};
use crate::reader::{GgufFile, TensorInfo};
use crate::synth::{
    plan_for, Arch, LinearAttentionShape, MoeShape, Preset, SynthError, SynthOptions,
};
use crate::types::GgmlType;
use crate::value::{Array, Value};

/// The architectures whose tensors opledger plans and checks one by one.
const KNOWN_ARCHS: [Arch; 4] = [Arch::Qwen35Moe, Arch::Qwen3Moe, Arch::Qwen3, Arch::Llama];

/// What [`validate_for_llama`] checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ArchCheck {
    /// `general.architecture`.
    pub arch: String,
    /// Whether every tensor was checked against opledger's plan of the architecture (its
    /// shape and type). False for the other architectures llama.cpp loads: their metadata was
    /// checked, their tensors were not.
    pub tensors_planned: bool,
    /// Tensors found with the shape the metadata implies.
    pub tensors_checked: usize,
    /// What was not checked, and why.
    pub notes: Vec<String>,
}

/// A model file that passed [`validate_for_llama`]. The llama.cpp engine loads nothing else, so
/// the gate holds by type: the only way to make one is [`LlamaLoadable::gate`].
#[derive(Debug, Clone)]
pub struct LlamaLoadable {
    path: std::path::PathBuf,
    check: ArchCheck,
}

/// Which llama.cpp a file is gated for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LlamaBuild {
    /// The llama.cpp opledger vendors (llama-cpp-sys-2), whose architectures
    /// [`crate::llama_archs`] lists.
    Vendored,
    /// Another build (a user's tree, through its own worker): which architectures load is that
    /// build's answer. An architecture the vendored table does not load passes with a note, and
    /// the build's own loader refuses it or not; the checks of the architectures the vendored
    /// llama.cpp loads still run.
    Other,
}

impl LlamaLoadable {
    /// Runs the gate on a file already read (structure checked by [`GgufFile::open`]), for the
    /// vendored llama.cpp.
    pub fn gate(file: &GgufFile) -> Result<LlamaLoadable, GgufError> {
        LlamaLoadable::gate_for(file, LlamaBuild::Vendored)
    }

    /// Runs the gate for `build`.
    pub fn gate_for(file: &GgufFile, build: LlamaBuild) -> Result<LlamaLoadable, GgufError> {
        let check = validate_for_llama_build(file, build)?;
        Ok(LlamaLoadable {
            path: file.path.clone(),
            check,
        })
    }

    /// Reads `path` and runs the gate.
    pub fn open(path: &std::path::Path) -> Result<LlamaLoadable, GgufError> {
        LlamaLoadable::gate(&GgufFile::open(path)?)
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// What the gate checked, and its notes.
    pub fn check(&self) -> &ArchCheck {
        &self.check
    }
}

/// A model file whose structure [`GgufFile::open`] checked (every count, offset and type), for
/// an engine that reads the file itself and refuses what it cannot load (candle loads files
/// llama.cpp refuses). Made only from a [`GgufFile`].
#[derive(Debug, Clone)]
pub struct WellFormed {
    path: std::path::PathBuf,
}

impl WellFormed {
    pub fn of(file: &GgufFile) -> WellFormed {
        WellFormed {
            path: file.path.clone(),
        }
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }
}

/// Checks `file` for the linked llama.cpp: tensors packed as gguf.cpp requires; an
/// architecture llama.cpp loads; for every such architecture the hyperparameters that
/// llama.cpp's shared loader, vocabulary loader and graphs assert on, and those its own family
/// code asserts on or divides by; and for the architectures opledger plans (qwen35moe,
/// qwen3moe, qwen3, llama) every key the arch reads, every tensor it loads with the shape the
/// file's own metadata implies, and every tensor of a type the CPU backend computes. The first
/// problem found is the error; it names the file and the key or tensor.
pub fn validate_for_llama(file: &GgufFile) -> Result<ArchCheck, GgufError> {
    validate_for_llama_build(file, LlamaBuild::Vendored)
}

/// [`validate_for_llama`] for `build`: for another build, an architecture the vendored
/// llama.cpp does not load is not refused here (that build's loader answers), and the file's
/// structure is all opledger checked of it.
pub fn validate_for_llama_build(
    file: &GgufFile,
    build: LlamaBuild,
) -> Result<ArchCheck, GgufError> {
    file.check_packed()?;
    let keys = Keys { file };
    let arch_name = keys.string("general.architecture", "llama.cpp")?;
    let refused = |reason: String| GgufError::ArchNotLoadable {
        path: file.path.clone(),
        arch: arch_name.to_string(),
        reason,
    };
    let support = llama_support(arch_name);
    if build == LlamaBuild::Other && !matches!(support, LlamaSupport::Loads) {
        return Ok(ArchCheck {
            arch: arch_name.to_string(),
            tensors_planned: false,
            tensors_checked: 0,
            notes: vec![format!(
                "'{arch_name}' is not an architecture the vendored llama.cpp (llama-cpp-sys-2 \
                 {LLAMA_CPP_SYS_VERSION}) loads: opledger checked the file's structure only, \
                 and whether it loads is the answer of the worker's own llama.cpp"
            )],
        });
    }
    match support {
        LlamaSupport::Loads => {}
        LlamaSupport::Refuses(why) => {
            return Err(refused(format!(
                "known to the linked llama.cpp, but not a model it loads: {why}"
            )))
        }
        LlamaSupport::Unknown => {
            // Names that start alike, else a few common ones.
            let stem: String = arch_name.chars().take(4).collect();
            let mut alike: Vec<&str> = loadable_archs()
                .filter(|a| !stem.is_empty() && a.starts_with(stem.as_str()))
                .collect();
            if alike.is_empty() {
                alike = vec!["llama", "qwen3", "gemma3", "phi3", "deepseek2", "gpt-oss"];
            }
            return Err(refused(format!(
                "not an architecture the linked llama.cpp (llama-cpp-sys-2 \
                 {LLAMA_CPP_SYS_VERSION}) knows; it would refuse the file. It loads {} \
                 architectures (opledger_gguf::llama_archs lists them), e.g. {}",
                loadable_archs().count(),
                alike.join(", ")
            )));
        }
    }
    let shared = generic::check(&keys, arch_name)?;
    family::check(&keys, arch_name, &shared)?;
    let Some(arch) = KNOWN_ARCHS.into_iter().find(|a| a.as_str() == arch_name) else {
        return Ok(ArchCheck {
            arch: arch_name.to_string(),
            tensors_planned: false,
            tensors_checked: 0,
            notes: vec![format!(
                "the tensors of this {arch_name} file were not checked by opledger (it plans \
                 tensors for {} only); its metadata was checked against what llama.cpp asserts, \
                 and llama.cpp refuses a missing or misshapen tensor itself, with an error \
                 rather than an abort",
                KNOWN_ARCHS.map(Arch::as_str).join(", ")
            )],
        });
    };
    let hp = Hparams::read(&keys, arch, &shared)?;
    let mut notes = Vec::new();
    let tensors_checked = check_tensors(file, &hp, &mut notes)?;
    check_types(file)?;
    Ok(ArchCheck {
        arch: arch.as_str().to_string(),
        tensors_planned: true,
        tensors_checked,
        notes,
    })
}

/// Typed access to the metadata with llama.cpp's rules: `get_key` takes exactly one type.
struct Keys<'a> {
    file: &'a GgufFile,
}

/// How a value's type is named in errors: gguf.cpp's names, arrays with their element type.
fn type_name(value: &Value) -> String {
    match value {
        Value::Array(a) => format!("array of {}", a.elem_type()),
        other => other.value_type().to_string(),
    }
}

impl Keys<'_> {
    fn missing(&self, key: &str, required_by: &str) -> GgufError {
        GgufError::MissingKey {
            path: self.file.path.clone(),
            key: key.to_string(),
            required_by: required_by.to_string(),
        }
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &Value) -> GgufError {
        GgufError::WrongKeyType {
            path: self.file.path.clone(),
            key: key.to_string(),
            expected: expected.to_string(),
            found: type_name(found),
        }
    }

    fn bad(&self, key: &str, detail: String) -> GgufError {
        GgufError::BadKeyValue {
            path: self.file.path.clone(),
            key: key.to_string(),
            detail,
        }
    }

    /// A u32 read with `get_key`: exactly u32 when present (an array too is the wrong type).
    fn scalar_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::U32(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong_type(key, "u32", other)),
        }
    }

    /// A bool read with `get_key`.
    fn scalar_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::Bool(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong_type(key, "bool", other)),
        }
    }

    /// A key read with `get_key_or_arr` for `n` layers: a u32 for every layer, or an array of
    /// exactly `n` integers (bool, u32 or i32 elements, i32 taken bit for bit as llama.cpp
    /// does). Anything else makes llama.cpp refuse the file.
    fn per_layer(&self, key: &str, n: u32) -> Result<Option<Vec<u32>>, GgufError> {
        let values: Vec<u32> = match self.file.get(key) {
            None => return Ok(None),
            Some(Value::U32(v)) => return Ok(Some(vec![*v; n as usize])),
            Some(Value::Array(Array::U32(v))) => v.clone(),
            Some(Value::Array(Array::I32(v))) => v.iter().map(|&x| x as u32).collect(),
            Some(Value::Array(Array::Bool(v))) => v.iter().map(|&x| u32::from(x)).collect(),
            Some(other @ Value::Array(_)) => {
                return Err(self.wrong_type(key, "array of i32, u32 or bool", other))
            }
            Some(other) => {
                return Err(self.wrong_type(
                    key,
                    "u32, or an array of i32, u32 or bool with one entry per layer",
                    other,
                ))
            }
        };
        if values.len() != n as usize {
            return Err(self.bad(
                key,
                format!(
                    "{} entries for {n} layers (block_count); llama.cpp reads exactly one per \
                     layer and refuses the file otherwise",
                    values.len()
                ),
            ));
        }
        Ok(Some(values))
    }

    fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::U32(v)) => Ok(Some(*v)),
            Some(array @ Value::Array(_)) => Err(self.wrong_type(
                key,
                "u32 (llama.cpp takes a per-layer array for some keys; opledger does not)",
                array,
            )),
            Some(other) => Err(self.wrong_type(key, "u32", other)),
        }
    }

    fn u32(&self, key: &str, required_by: &str) -> Result<u32, GgufError> {
        self.opt_u32(key)?
            .ok_or_else(|| self.missing(key, required_by))
    }

    /// A required u32 that must be above zero.
    fn positive_u32(&self, key: &str, required_by: &str) -> Result<u32, GgufError> {
        let v = self.u32(key, required_by)?;
        if v == 0 {
            return Err(self.bad(key, "is 0; it must be above 0".into()));
        }
        Ok(v)
    }

    fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::F32(v)) => Ok(Some(*v)),
            Some(other) => Err(self.wrong_type(key, "f32", other)),
        }
    }

    fn opt_string(&self, key: &str) -> Result<Option<&str>, GgufError> {
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(key, "str", other)),
        }
    }

    fn string(&self, key: &str, required_by: &str) -> Result<&str, GgufError> {
        self.opt_string(key)?
            .ok_or_else(|| self.missing(key, required_by))
    }

    /// An array of integers llama.cpp reads as int32/uint32 (`get_arr`: bool, u32 or i32
    /// elements), as i64 so that no u32 value wraps.
    fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>, GgufError> {
        let expected = "array of i32, u32 or bool";
        match self.file.get(key) {
            None => Ok(None),
            Some(Value::Array(Array::I32(v))) => {
                Ok(Some(v.iter().map(|&x| i64::from(x)).collect()))
            }
            Some(Value::Array(Array::U32(v))) => {
                Ok(Some(v.iter().map(|&x| i64::from(x)).collect()))
            }
            Some(Value::Array(Array::Bool(v))) => {
                Ok(Some(v.iter().map(|&x| i64::from(x)).collect()))
            }
            Some(other) => Err(self.wrong_type(key, expected, other)),
        }
    }
}

/// The hyper-parameters that decide tensor shapes, read by llama.cpp's rules.
struct Hparams {
    arch: Arch,
    n_embd: u32,
    n_layer: u32,
    n_vocab: u32,
    n_ctx: u32,
    n_head: u32,
    n_head_kv: u32,
    head_dim: u32,
    n_rot: u32,
    sections: [i32; 4],
    rms_eps: f32,
    n_ff: u32,
    moe: Option<MoeShape>,
    linear_attention: Option<LinearAttentionShape>,
    /// Which layers are recurrent (qwen35moe's delta-net layers); all false elsewhere.
    recurrent: Vec<bool>,
}

impl Hparams {
    /// What the planner needs beyond the shared and family checks ([`generic`], [`family`]),
    /// which ran first: the widths as single values (opledger plans every layer alike).
    fn read(keys: &Keys, arch: Arch, shared: &generic::Generic) -> Result<Hparams, GgufError> {
        let a = arch.as_str();
        let by = format!("llama.cpp's {a}");
        let k = |name: &str| format!("{a}.{name}");

        let n_ctx = keys.positive_u32(&k("context_length"), &by)?;
        let n_embd = shared.n_embd;
        let n_layer = shared.n_layer_all;
        let n_expert = shared.n_expert;
        // One count for every layer: a per-layer array is the wrong type here.
        let n_expert_used = keys.opt_u32(&k("expert_used_count"))?.unwrap_or(0);

        let n_ff = keys.opt_u32(&k("feed_forward_length"))?.unwrap_or(0);
        // opledger needs the head count (llama.cpp treats a model without heads as attention
        // free, which none of these archs is).
        let n_head = keys.positive_u32(&k("attention.head_count"), &by)?;
        let n_head_kv = keys
            .opt_u32(&k("attention.head_count_kv"))?
            .unwrap_or(n_head);
        if n_head_kv == 0 || n_head % n_head_kv != 0 {
            return Err(keys.bad(
                &k("attention.head_count_kv"),
                format!("{n_head_kv} does not divide the head count {n_head}"),
            ));
        }
        // Layer 0 has heads, so llama.cpp read the head sizes; the shared checks held them
        // equal (value to key, rope to key except qwen35moe's partial rope, which fits).
        let (key_length, n_rot) = shared.heads.map_or((0, 0), |h| (h.key_length, h.n_rot));
        if key_length == 0 {
            return Err(keys.bad(
                &k("attention.key_length"),
                "a head dim of 0 (set it, or an embedding length of at least the head count)"
                    .into(),
            ));
        }
        let rms_eps = keys
            .opt_f32(&k("attention.layer_norm_rms_epsilon"))?
            .ok_or_else(|| keys.missing(&k("attention.layer_norm_rms_epsilon"), &by))?;

        // The vocabulary size, as llama_vocab counts it: dummy tokens for "none", else the
        // token list (both checked by the shared checks).
        let tokenizer = keys.string("tokenizer.ggml.model", "llama.cpp's vocabulary loader")?;
        let n_vocab = if tokenizer == "none" || tokenizer == "no_vocab" {
            keys.opt_u32(&k("vocab_size"))?.unwrap_or(0)
        } else {
            keys.file
                .get("tokenizer.ggml.tokens")
                .and_then(Value::as_array)
                .map_or(0, |t| u32::try_from(t.len()).unwrap_or(u32::MAX))
        };

        let mut hp = Hparams {
            arch,
            n_embd,
            n_layer,
            n_vocab,
            n_ctx,
            n_head,
            n_head_kv,
            head_dim: key_length,
            n_rot,
            sections: [0; 4],
            rms_eps,
            n_ff,
            moe: None,
            linear_attention: None,
            recurrent: vec![false; n_layer as usize],
        };
        match arch {
            // qwen3 is dense whatever the expert count says; a llama with experts (Mixtral)
            // has experts of width feed_forward_length and no shared one.
            Arch::Qwen3 | Arch::Llama => {
                if n_ff == 0 {
                    return Err(keys.missing(&k("feed_forward_length"), &by));
                }
                if arch == Arch::Llama && n_expert > 0 {
                    hp.moe = Some(MoeShape {
                        expert_count: n_expert,
                        expert_used_count: n_expert_used,
                        expert_feed_forward_length: n_ff,
                        shared_expert_feed_forward_length: 0,
                    });
                }
            }
            Arch::Qwen3Moe | Arch::Qwen35Moe => {
                if n_expert == 0 {
                    return Err(keys.missing(&k("expert_count"), &by));
                }
                // n_ff_exp = expert_feed_forward_length, else n_ff / n_expert_used.
                let ff_exp = match keys.opt_u32(&k("expert_feed_forward_length"))? {
                    Some(v) if v > 0 => v,
                    _ => n_ff / n_expert_used,
                };
                if ff_exp == 0 {
                    return Err(keys.missing(&k("expert_feed_forward_length"), &by));
                }
                let mut shared = 0;
                if arch == Arch::Qwen35Moe {
                    // n_ff_shexp = expert_shared_feed_forward_length, else n_ff.
                    shared = match keys.opt_u32(&k("expert_shared_feed_forward_length"))? {
                        Some(v) if v > 0 => v,
                        _ => n_ff,
                    };
                    if shared == 0 {
                        return Err(keys.missing(&k("expert_shared_feed_forward_length"), &by));
                    }
                }
                hp.moe = Some(MoeShape {
                    expert_count: n_expert,
                    expert_used_count: n_expert_used,
                    expert_feed_forward_length: ff_exp,
                    shared_expert_feed_forward_length: shared,
                });
            }
            // KNOWN_ARCHS holds only the architectures above
            _ => {}
        }
        if arch == Arch::Qwen35Moe {
            hp.read_qwen35moe(keys, shared)?;
        }
        Ok(hp)
    }

    /// qwen35moe's load_arch_hparams and the asserts of its delta-net graph (the checks are
    /// its family's, [`family::delta_net`]).
    fn read_qwen35moe(&mut self, keys: &Keys, shared: &generic::Generic) -> Result<(), GgufError> {
        let a = self.arch.as_str();
        self.sections = family::rope_sections(keys, a)?;
        let net = family::delta_net(keys, a, shared)?;
        self.linear_attention = Some(LinearAttentionShape {
            full_attention_interval: 4,
            conv_kernel: net.conv_kernel,
            state_size: net.state_size,
            group_count: net.group_count,
            time_step_rank: net.time_step_rank,
        });
        debug_assert_eq!(
            Some(u64::from(net.inner_size)),
            self.linear_attention.map(|la| la.inner_size())
        );
        self.recurrent = net.recurrent;
        Ok(())
    }

    /// A preset with these widths; `full_attention_interval` 1 makes every layer full
    /// attention, `u32::MAX` every layer linear attention (at most 512 layers).
    fn preset(&self, full_attention_interval: u32) -> Preset {
        Preset {
            name: "validated-file",
            arch: self.arch,
            source: "the metadata of a file being validated",
            uncertain: "",
            embedding_length: self.n_embd,
            block_count: self.n_layer,
            vocab_size: self.n_vocab,
            context_length: self.n_ctx,
            head_count: self.n_head,
            head_count_kv: self.n_head_kv,
            head_dim: self.head_dim,
            rope_dimension_count: self.n_rot,
            rope_dimension_sections: self.sections,
            rope_freq_base: 10_000.0,
            rms_eps: self.rms_eps,
            feed_forward_length: if self.moe.is_some() { 0 } else { self.n_ff },
            moe: self.moe,
            linear_attention: self.linear_attention.map(|la| LinearAttentionShape {
                full_attention_interval,
                ..la
            }),
            llama3_rope: None,
            extras: crate::synth::Extras::NONE,
        }
    }
}

/// One tensor llama.cpp loads, with the shape the metadata implies.
#[derive(Debug, Clone)]
struct Expected {
    name: String,
    dims: Vec<u64>,
    required: bool,
}

/// The tensors of a model in the planner's order, as templates: the global ones before and
/// after the layers, and one layer of each kind with its names stripped of `blk.0.`. Layers
/// differ only by their index and kind, so a one-layer plan per kind describes them all, and
/// the work of the check grows with the file's tensors, not with its claimed layer count.
struct Templates {
    head: Vec<Expected>,
    /// Full-attention layer (every layer of qwen3moe, qwen3, llama).
    full: Vec<Expected>,
    /// qwen35moe's delta-net layer.
    linear: Vec<Expected>,
    tail: Vec<Expected>,
}

impl Templates {
    fn plan(file: &GgufFile, hp: &Hparams) -> Result<Templates, GgufError> {
        let arch = hp.arch.as_str();
        let plan_of = |interval: u32| {
            let mut opts = SynthOptions::new("validated-file");
            opts.layers = Some(1);
            // F32 fits every width; the file's own types are checked separately.
            opts.expert_type = GgmlType::F32;
            opts.dense_type = GgmlType::F32;
            plan_for(&hp.preset(interval), &opts).map_err(|e| match e {
                SynthError::Gguf(GgufError::DimsOverflow { name, dims, .. }) => {
                    GgufError::ImpliedShapeOverflow {
                        path: file.path.clone(),
                        name,
                        arch: arch.to_string(),
                        dims,
                    }
                }
                other => GgufError::BadKeyValue {
                    path: file.path.clone(),
                    key: format!("{arch}.*"),
                    detail: format!(
                        "the metadata describes a model llama.cpp cannot build: {other}"
                    ),
                },
            })
        };
        let split = |plan: &crate::synth::ModelPlan| {
            let (mut head, mut layer, mut tail) = (Vec::new(), Vec::new(), Vec::new());
            for t in &plan.tensors {
                let mut e = Expected {
                    name: t.name.clone(),
                    dims: t.dims.clone(),
                    required: true,
                };
                if let Some(suffix) = t.name.strip_prefix("blk.0.") {
                    e.name = suffix.to_string();
                    layer.push(e);
                } else if layer.is_empty() {
                    head.push(e);
                } else {
                    tail.push(e);
                }
            }
            (head, layer, tail)
        };
        // qwen35moe: interval 1 makes the planned layer full attention, u32::MAX linear.
        let (mut head, full, mut tail) = split(&plan_of(1)?);
        let linear = match hp.linear_attention {
            Some(_) => split(&plan_of(u32::MAX)?).1,
            None => Vec::new(),
        };
        if hp.arch == Arch::Llama {
            // llama: rope_freqs {n_rot / 2}, optional, shared by all layers.
            head.push(Expected {
                name: "rope_freqs.weight".into(),
                dims: vec![u64::from(hp.n_rot / 2).max(1)],
                required: false,
            });
        }
        // output.weight is TENSOR_NOT_REQUIRED everywhere: the head is tied to the embedding.
        for e in tail.iter_mut().filter(|e| e.name == "output.weight") {
            e.required = false;
        }
        Ok(Templates {
            head,
            full,
            linear,
            tail,
        })
    }

    /// Layer `il`'s tensors, with the alternatives llama.cpp accepts in place of the planned
    /// ones where the file has them.
    fn layer(&self, file: &GgufFile, hp: &Hparams, il: usize) -> Vec<Expected> {
        let recurrent = hp.recurrent.get(il).copied().unwrap_or(false);
        let template = if recurrent { &self.linear } else { &self.full };
        let blk = |t: &str| format!("blk.{il}.{t}");
        let mut layer: Vec<Expected> = template
            .iter()
            .map(|e| Expected {
                name: blk(&e.name),
                ..e.clone()
            })
            .collect();
        let has = |name: &str| file.tensor(name).is_some();
        // create_tensor_qkv: a fused attn_qkv {E, q + k + v} replaces attn_q, attn_k, attn_v.
        let q = blk("attn_q.weight");
        if has(&blk("attn_qkv.weight")) && layer.iter().any(|e| e.name == q) {
            let parts = [q, blk("attn_k.weight"), blk("attn_v.weight")];
            fuse(&mut layer, &parts, blk("attn_qkv.weight"));
        }
        // create_tensor_gate_up_exps (qwen35moe): ffn_gate_up_exps {E, 2 ff, n} replaces both.
        let gate = blk("ffn_gate_exps.weight");
        if hp.arch.supports_fused_gate_up() && has(&blk("ffn_gate_up_exps.weight")) {
            let parts = [gate.clone(), blk("ffn_up_exps.weight")];
            fuse(&mut layer, &parts, blk("ffn_gate_up_exps.weight"));
        }
        // llama (Mixtral): ffn_gate_exps is TENSOR_NOT_REQUIRED.
        if hp.arch == Arch::Llama {
            for e in layer.iter_mut().filter(|e| e.name == gate) {
                e.required = false;
            }
        }
        layer
    }
}

/// Replaces the tensors `parts` of `layer` by one tensor `name` whose ne[1] is the sum of
/// theirs (a fused projection), at the place of the first part.
fn fuse(layer: &mut Vec<Expected>, parts: &[String], name: String) {
    let Some(first) = layer.iter().position(|e| parts.first() == Some(&e.name)) else {
        return;
    };
    let rows = layer
        .iter()
        .filter(|e| parts.contains(&e.name))
        .filter_map(|e| e.dims.get(1).copied())
        .fold(0u64, u64::saturating_add);
    let mut dims = layer[first].dims.clone();
    if let Some(d) = dims.get_mut(1) {
        *d = rows;
    }
    layer[first] = Expected {
        name,
        dims,
        required: true,
    };
    layer.retain(|e| !parts.contains(&e.name));
}

/// Shapes as ggml compares them: four dims, missing ones 1.
fn same_shape(a: &[u64], b: &[u64]) -> bool {
    (0..4).all(|i| a.get(i).copied().unwrap_or(1) == b.get(i).copied().unwrap_or(1))
}

/// Every tensor the arch loads present with the shape the metadata implies, in the planner's
/// order (global tensors, layer by layer, global tensors); the first one missing or of another
/// shape is the error. Returns how many were found; tensors of the file that the plan does
/// not list go into a note.
fn check_tensors(
    file: &GgufFile,
    hp: &Hparams,
    notes: &mut Vec<String>,
) -> Result<usize, GgufError> {
    let arch = hp.arch.as_str();
    let templates = Templates::plan(file, hp)?;
    let by_name: HashMap<&str, &TensorInfo> =
        file.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let mut known: HashSet<String> = HashSet::new();
    let mut checked = 0;
    let mut check = |e: &Expected| -> Result<(), GgufError> {
        match by_name.get(e.name.as_str()) {
            None if e.required => {
                return Err(GgufError::MissingTensor {
                    path: file.path.clone(),
                    name: e.name.clone(),
                    arch: arch.to_string(),
                })
            }
            None => {}
            Some(t) if !same_shape(&t.dims, &e.dims) => {
                return Err(GgufError::WrongShape {
                    path: file.path.clone(),
                    name: e.name.clone(),
                    arch: arch.to_string(),
                    expected: e.dims.clone(),
                    found: t.dims.clone(),
                })
            }
            Some(_) => checked += 1,
        }
        known.insert(e.name.clone());
        Ok(())
    };
    for e in &templates.head {
        check(e)?;
    }
    for il in 0..hp.n_layer as usize {
        for e in &templates.layer(file, hp, il) {
            check(e)?;
        }
    }
    for e in &templates.tail {
        check(e)?;
    }
    let others: Vec<&str> = file
        .tensors
        .iter()
        .map(|t| t.name.as_str())
        .filter(|n| !known.contains(*n))
        .collect();
    if let Some(first) = others.first() {
        notes.push(format!(
            "{} tensors outside what opledger expects of {arch} were not checked (first: \
             '{first}'); llama.cpp loads optional ones (biases) and refuses the others itself",
            others.len()
        ));
    }
    Ok(checked)
}

/// Whether the CPU backend of the linked ggml can compute with weights of this type:
/// `type_traits_cpu` in ggml-cpu.c has a `vec_dot` for every type but these (intermediate
/// quantisations and integer or f64 tensors), and a matmul with one of them would call null.
fn cpu_computes(t: GgmlType) -> bool {
    !matches!(
        t,
        GgmlType::Q8_1
            | GgmlType::Q8_K
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64
            | GgmlType::F64
    )
}

/// Tensor types: every tensor of a type the CPU backend computes; 1-D tensors (norms, biases,
/// ssm_a, router of the shared expert) and the delta-net convolution in F32, the only type
/// the CPU's binary ops (`x * norm`, F32 activations) and `ggml_ssm_conv` take there.
fn check_types(file: &GgufFile) -> Result<(), GgufError> {
    for t in &file.tensors {
        let detail = if !cpu_computes(t.ggml_type) {
            Some("the CPU backend of the linked llama.cpp has no kernel for it (ggml-cpu has no vec_dot)")
        } else if t.ggml_type != GgmlType::F32
            && (t.dims.len() == 1 || t.name.ends_with("ssm_conv1d.weight"))
        {
            Some("llama.cpp computes 1-D tensors and ssm_conv1d with F32 only")
        } else {
            None
        };
        if let Some(detail) = detail {
            return Err(GgufError::UnsupportedType {
                path: file.path.clone(),
                name: t.name.clone(),
                ggml_type: t.ggml_type,
                detail,
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{plan, presets};

    /// The header of the file a plan would write, without writing it.
    fn file_of(plan: &crate::synth::ModelPlan) -> GgufFile {
        GgufFile {
            path: format!("{}.gguf", plan.preset).into(),
            version: 3,
            metadata: plan.metadata.clone(),
            tensors: plan.layout.tensors.clone(),
            alignment: plan.layout.alignment,
            data_offset_bytes: plan.layout.data_offset_bytes,
            file_size_bytes: plan.layout.file_size_bytes,
        }
    }

    #[test]
    fn every_preset_the_synthesiser_writes_passes() {
        for p in presets() {
            for layers in [None, Some(1), Some(5), Some(8)] {
                for fused in [false, true] {
                    if fused && !p.arch.supports_fused_gate_up() {
                        continue;
                    }
                    let mut o = SynthOptions::new(p.name);
                    o.layers = layers;
                    o.fused_gate_up = fused;
                    let plan = plan(&o).unwrap();
                    let check = validate_for_llama(&file_of(&plan))
                        .unwrap_or_else(|e| panic!("{} {layers:?} fused {fused}: {e}", p.name));
                    if !KNOWN_ARCHS.contains(&p.arch) {
                        // families whose keys the gate checks (every check passed above) and
                        // whose tensors llama.cpp checks itself: said in a note
                        assert!(!check.tensors_planned, "{}", p.name);
                        assert_eq!(check.notes.len(), 1, "{}: {:?}", p.name, check.notes);
                        continue;
                    }
                    assert!(check.tensors_planned);
                    assert_eq!(check.tensors_checked, plan.tensors.len(), "{}", p.name);
                    assert!(check.notes.is_empty(), "{}: {:?}", p.name, check.notes);
                }
            }
        }
    }

    #[test]
    fn hostile_widths_are_errors_not_panics() {
        let mut o = SynthOptions::new("tiny-qwen35moe");
        o.layers = Some(4);
        let base = file_of(&plan(&o).unwrap());
        for key in [
            "embedding_length",
            "vocab_size",
            "attention.head_count",
            "attention.head_count_kv",
            "attention.key_length",
            "attention.value_length",
            "rope.dimension_count",
            "expert_count",
            "expert_used_count",
            "expert_feed_forward_length",
            "expert_shared_feed_forward_length",
            "ssm.conv_kernel",
            "ssm.state_size",
            "ssm.group_count",
            "ssm.time_step_rank",
            "ssm.inner_size",
            "full_attention_interval",
            "block_count",
        ] {
            for v in [0, 1, 3, 1 << 16, u32::MAX - 1, u32::MAX] {
                let mut f = base.clone();
                let k = format!("qwen35moe.{key}");
                for (name, value) in f.metadata.iter_mut() {
                    if *name == k {
                        *value = Value::U32(v);
                    }
                }
                // Ok or Err, never a panic; an Err names the file.
                if let Err(e) = validate_for_llama(&f) {
                    assert!(e.to_string().starts_with("tiny-qwen35moe.gguf: "), "{e}");
                }
            }
        }
    }

    #[test]
    fn cpu_kernels_cover_what_llama_quant_writes() {
        for t in crate::synth::GENERATED_TYPES {
            assert!(cpu_computes(t), "{t}");
        }
        for t in [GgmlType::Q8_K, GgmlType::I32, GgmlType::F64] {
            assert!(!cpu_computes(t), "{t}");
        }
    }
}
