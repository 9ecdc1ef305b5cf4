//! The candle engine adapter: loads a GGUF model into candle, fills the KV cache to a depth, and
//! runs a chunk (prefill) or steps of one token per sequence (decode) plain (FUSED), with the
//! instrument counting (FUSED-observed) or timing every op alone (TIMED).

use std::collections::BTreeMap;
use std::sync::OnceLock;
use std::time::Instant;

use opledger_core::engine::{Capability, ChunkTiming, Engine, EngineError, EngineInfo, Mode, Work};
use opledger_core::node::NodeInfo;
use opledger_core::tokens::{decode_step_tokens, filler_tokens, hash_f32};
use opledger_gguf::GgufFile;

use crate::error::CandleError;
use crate::hparams::Hparams;
use crate::instrument::{Instrument, Plain};
use crate::model::{ChunkInputs, KvCache, Model};
use crate::weights::Weights;

/// The candle-core version this adapter is built against (`Cargo.lock`; a test checks it).
pub const CANDLE_CORE_VERSION: &str = "0.11.1";

/// How to set up the candle engine.
#[derive(Debug, Clone)]
pub struct CandleConfig {
    /// The model, its structure checked by opledger's GGUF reader.
    pub model: opledger_gguf::WellFormed,
    /// Threads of candle's CPU kernels. candle sizes its thread pools once per process, from
    /// `CANDLE_NUM_THREADS` / `RAYON_NUM_THREADS`: the first engine loaded sets them.
    pub threads: u32,
}

/// The thread count this process's candle pools were given.
static THREADS: OnceLock<u32> = OnceLock::new();

/// Sets candle's thread count before its first op (its pools read the environment once).
fn set_threads(threads: u32) -> Result<u32, CandleError> {
    let threads = threads.max(1);
    let set = *THREADS.get_or_init(|| {
        // candle's quantised kernels read CANDLE_NUM_THREADS, its float gemm and rayon-parallel
        // ops RAYON_NUM_THREADS: pin both.
        std::env::set_var("CANDLE_NUM_THREADS", threads.to_string());
        std::env::set_var("RAYON_NUM_THREADS", threads.to_string());
        threads
    });
    if set != threads {
        return Err(CandleError::Invalid(format!(
            "candle's thread pools were sized to {set} threads earlier in this process; \
             {threads} cannot be set now"
        )));
    }
    // Start the pools now, so that their start-up is not inside the first run.
    let workers = candle_core::utils::barrier_pool().n_workers() as u32;
    Ok(workers + 1)
}

/// The prepared work: the prefill chunk's inputs, or one per decode step.
struct Prepared {
    work: Work,
    cache: KvCache,
    steps: Vec<ChunkInputs>,
}

/// candle as an [`Engine`].
pub struct CandleEngine {
    cfg: CandleConfig,
    model: Model,
    threads: u32,
    prepared: Option<Prepared>,
    /// The ops of the captured graph, to check that TIMED runs compute the same graph.
    graph_ops: Option<Vec<&'static str>>,
    last_logits: Vec<Vec<f32>>,
    last_routing: Vec<Vec<usize>>,
    load_ms: f64,
}

impl CandleEngine {
    /// Validates the file (opledger's GGUF reader), reads the architecture from its metadata and
    /// loads its weights.
    pub fn load(cfg: CandleConfig) -> Result<CandleEngine, CandleError> {
        let t0 = Instant::now();
        let threads = set_threads(cfg.threads)?;
        let file = GgufFile::open(cfg.model.path())?;
        let hp = Hparams::from_gguf(&file)?;
        let w = Weights::load(&file, &hp)?;
        Ok(CandleEngine {
            cfg,
            model: Model { hp, w },
            threads,
            prepared: None,
            graph_ops: None,
            last_logits: Vec::new(),
            last_routing: Vec::new(),
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }

    /// Milliseconds the model took to load.
    pub fn load_ms(&self) -> f64 {
        self.load_ms
    }

    pub fn hparams(&self) -> &Hparams {
        &self.model.hp
    }

    /// The logits of the last run: one row per requested token (the last one, or all), or
    /// one row per sequence of a decode run's last step.
    pub fn last_logits(&self) -> &[Vec<f32>] {
        &self.last_logits
    }

    /// The routing of the last run: per MoE layer (per decode step, then per layer, in decode
    /// mode), the tokens each expert received.
    pub fn last_routing(&self) -> &[Vec<usize>] {
        &self.last_routing
    }

    /// Runs the prepared work with `o` observing (a prefill chunk, or every decode step one after
    /// the other), and keeps the logits of its last forward pass. Returns the wall of the
    /// forward passes and a hash of every requested logit.
    fn run_with<O: crate::instrument::Observe>(
        &mut self,
        o: &mut O,
    ) -> Result<(f64, u64), CandleError> {
        let p = self
            .prepared
            .as_ref()
            .ok_or_else(|| CandleError::Invalid("run() before prepare()".into()))?;
        // Every run writes the rows of its chunk or steps (rows depth..) and reads rows below
        // them: the prepared rows 0..depth are never written, so each run starts from the
        // prepared state without a copy.
        let decode = p.work.is_decode();
        // decode asks for the logits of every sequence, as llama.cpp's decode step does
        let all_logits = p.work.all_logits || decode;
        let mut wall_ms = 0.0;
        let mut hash = 0u64;
        let mut routing = Vec::new();
        self.last_routing.clear();
        for inputs in &p.steps {
            let t0 = Instant::now();
            let logits = self
                .model
                .forward(o, inputs, &p.cache, all_logits, &mut routing)?;
            wall_ms += t0.elapsed().as_secs_f64() * 1e3;
            self.last_routing.append(&mut routing);
            let rows = logits.to_vec2::<f32>()?;
            for r in &rows {
                opledger_core::engine::check_finite("a candle run", r)?;
            }
            let step_hash = if decode {
                let mut h = 0u64;
                for r in &rows {
                    h = h.rotate_left(7) ^ hash_f32(r);
                }
                h
            } else if p.work.all_logits {
                let mut h = 0u64;
                for r in &rows {
                    h = h.rotate_left(5) ^ hash_f32(r);
                }
                h
            } else {
                hash_f32(rows.last().map(Vec::as_slice).unwrap_or(&[]))
            };
            hash = if decode {
                hash.rotate_left(3) ^ step_hash
            } else {
                step_hash
            };
            self.last_logits = rows;
        }
        Ok((wall_ms, hash))
    }

    fn vocab(&self) -> u32 {
        self.model.hp.n_vocab as u32
    }
}

fn as_u32(tokens: Vec<i32>) -> Vec<u32> {
    tokens.into_iter().map(|t| t as u32).collect()
}

impl Engine for CandleEngine {
    fn info(&self) -> EngineInfo {
        let hp = &self.model.hp;
        let mut settings = BTreeMap::new();
        settings.insert("arch".into(), hp.arch_name.clone());
        settings.insert(
            "candle_num_threads".into(),
            std::env::var("CANDLE_NUM_THREADS").unwrap_or_default(),
        );
        settings.insert(
            "rayon_threads".into(),
            candle_core::utils::get_num_threads().to_string(),
        );
        settings.insert(
            "simd".into(),
            format!(
                "avx {}, f16c {}",
                candle_core::utils::with_avx(),
                candle_core::utils::with_f16c()
            ),
        );
        settings.insert(
            "attention".into(),
            "matmul + masked softmax (f32 KV cache)".into(),
        );
        if hp.is_moe() {
            settings.insert(
                "moe".into(),
                "per-expert quantised matmul over the routed rows".into(),
            );
        }
        settings.insert("weight_bytes".into(), self.model.w.weight_bytes.to_string());
        settings.insert(
            "model_path".into(),
            self.cfg.model.path().display().to_string(),
        );
        if let Some(p) = &self.prepared {
            settings.insert("n_ctx".into(), p.cache.capacity.to_string());
        }
        EngineInfo {
            engine: "candle".into(),
            version: format!("candle-core {CANDLE_CORE_VERSION}"),
            backend: "CPU".into(),
            threads: self.threads,
            settings,
        }
    }

    fn prepare(&mut self, work: &Work) -> Result<(), EngineError> {
        if work.chunk_tokens == 0 {
            return Err(EngineError::Failed("the chunk has no tokens".into()));
        }
        self.prepared = None;
        self.graph_ops = None;
        let depth = work.depth_tokens as usize;
        let chunk = work.chunk_tokens as usize;
        let n_seq = work.parallel.max(1) as usize;
        let steps = work.decode_tokens as usize;
        // decode: the prefix, then P rows a step (llama.cpp's unified KV cache)
        let rows = if work.is_decode() {
            steps
                .checked_mul(n_seq)
                .and_then(|r| r.checked_add(depth))
                .ok_or_else(|| EngineError::Failed("a decode too long for a cache".into()))?
        } else {
            depth + chunk
        };
        let cache = KvCache::new(&self.model.hp, rows)?;
        // Fill the cache to the depth in chunk-sized batches, as llama.cpp decodes it.
        let fill = as_u32(filler_tokens(
            work.token_seed,
            0,
            work.depth_tokens,
            self.vocab(),
        ));
        let mut routing = Vec::new();
        for (i, part) in fill.chunks(chunk).enumerate() {
            let inputs = self.model.inputs(part, i * chunk)?;
            self.model
                .forward(&mut Plain, &inputs, &cache, false, &mut routing)?;
        }
        let steps = if work.is_decode() {
            (0..work.decode_tokens)
                .map(|s| {
                    let tokens = as_u32(decode_step_tokens(
                        work.token_seed,
                        work.depth_tokens,
                        s,
                        work.parallel,
                        self.vocab(),
                    ));
                    self.model.decode_inputs(&tokens, depth, s as usize)
                })
                .collect::<Result<Vec<_>, _>>()?
        } else {
            let tokens = as_u32(filler_tokens(
                work.token_seed,
                work.depth_tokens,
                work.chunk_tokens,
                self.vocab(),
            ));
            vec![self.model.inputs(&tokens, depth)?]
        };
        self.prepared = Some(Prepared {
            work: work.clone(),
            cache,
            steps,
        });
        Ok(())
    }

    fn graph_lists_every_step(&self) -> bool {
        // the MoE's nodes follow each step's routing (one matmul per expert with tokens), so
        // steps differ: the graph of a decode run is every step's nodes, one after the other
        true
    }

    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
        let mut inst = Instrument::capture();
        self.run_with(&mut inst)?;
        self.graph_ops = Some(inst.ops);
        Ok(inst.captured)
    }

    fn run(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        match mode {
            Mode::Fused => {
                let (wall_ms, output_hash) = self.run_with(&mut Plain)?;
                Ok(ChunkTiming {
                    device: None,
                    wall_ms,
                    node_us: Vec::new(),
                    nodes_seen: 0,
                    output_hash,
                })
            }
            Mode::FusedObserved => {
                let mut inst = Instrument::count();
                let (wall_ms, output_hash) = self.run_with(&mut inst)?;
                if let Some(ops) = &self.graph_ops {
                    if inst.nodes_seen as usize != ops.len() {
                        return Err(EngineError::GraphChanged(format!(
                            "fused+cb mode saw {} nodes, the captured graph has {}",
                            inst.nodes_seen,
                            ops.len()
                        )));
                    }
                }
                Ok(ChunkTiming {
                    device: None,
                    wall_ms,
                    node_us: Vec::new(),
                    nodes_seen: inst.nodes_seen,
                    output_hash,
                })
            }
            Mode::Timed => {
                let ops = match &self.graph_ops {
                    Some(ops) => ops.clone(),
                    None => {
                        // no captured graph yet: capture one first (counts as a warm-up run)
                        self.graph()?;
                        self.graph_ops.clone().unwrap_or_default()
                    }
                };
                let n = ops.len();
                let mut inst = Instrument::timed(ops);
                let (wall_ms, output_hash) = self.run_with(&mut inst)?;
                if let Some(why) = inst.mismatch {
                    return Err(EngineError::GraphChanged(why));
                }
                if inst.node_us.len() != n {
                    return Err(EngineError::GraphChanged(format!(
                        "TIMED mode timed {} nodes, the captured graph has {n}",
                        inst.node_us.len()
                    )));
                }
                Ok(ChunkTiming {
                    device: None,
                    wall_ms,
                    node_us: inst.node_us,
                    nodes_seen: inst.nodes_seen,
                    output_hash,
                })
            }
        }
    }

    fn supports(&self, c: Capability) -> bool {
        matches!(c, Capability::Decode)
    }

    fn refusal(&self, c: Capability) -> Option<String> {
        (c == Capability::Replay).then(|| REPLAY_REFUSAL.to_string())
    }
}

/// Why candle offers no in-graph replay.
pub const REPLAY_REFUSAL: &str = "a replayed op pays a cost once per node, whatever the number \
     of replays, beside their work, and candle has no dispatch of its own to measure it by (as \
     llama.cpp's launch rounds are): the largest band's cost per replay fell from 36.3 to 22.6 \
     and 18.1 ms at k = 1, 2, 4 on the tiny qwen3moe (-p 128), so a band's replay figure would \
     hold that cost and not the band's";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candle_core_version_matches_the_lock_file() {
        let lock =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.lock"))
                .unwrap();
        let at = lock.find("name = \"candle-core\"\nversion = \"").unwrap();
        let rest = &lock[at + "name = \"candle-core\"\nversion = \"".len()..];
        let version = &rest[..rest.find('"').unwrap()];
        assert_eq!(version, CANDLE_CORE_VERSION);
    }
}
