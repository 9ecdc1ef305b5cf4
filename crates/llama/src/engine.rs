//! The llama.cpp engine adapter: loads a model, fills the context to a depth, and runs a chunk in
//! FUSED (no callback), FUSED-observed and TIMED modes through the eval-callback instrument.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use opledger_core::engine::{
    check_finite, Capability, ChunkTiming, Engine, EngineError, EngineInfo, GraphCapture,
    GraphCapturer, Mode, OpTime, OpTimeRequest, OpTimer, ReplayEngine, SweepEngine, Work,
};
use opledger_core::node::NodeInfo;
use opledger_core::split::Slot;
use opledger_core::tokens::{filler_tokens, hash_f32};

use crate::backend::{Backend, LLAMA_CPP_SYS_VERSION};
use crate::context::{Context, ContextParams, FlashAttn, KvType, ThreadPool};
use crate::error::LlamaError;
use crate::model::{Model, ModelParams};
use crate::observer::ObserveMode;

/// How to set up the llama.cpp engine.
#[derive(Debug, Clone)]
pub struct LlamaConfig {
    /// The model, through opledger's gate (nothing else reaches llama.cpp's loader).
    pub model: opledger_gguf::LlamaLoadable,
    pub threads: u32,
    pub flash_attn: FlashAttn,
    pub gpu_layers: i32,
    /// Load without weight repacking (see [`ModelParams::no_repack`]): for census-only work, or
    /// as a knob of an A/B.
    pub no_repack: bool,
    /// Physical batch (ubatch) size: a chunk is computed in ubatches of at most this many tokens
    /// (`None`: the whole chunk at once).
    pub ubatch: Option<u32>,
    /// KV cache types (`None`: F16).
    pub type_k: Option<KvType>,
    pub type_v: Option<KvType>,
    /// Print llama.cpp's log to stderr.
    pub verbose: bool,
    /// Split the model across this machine's CPU and remote RPC servers.
    pub rpc: Option<crate::rpc::RpcSplit>,
}

impl LlamaConfig {
    /// Defaults for `model` on `threads` threads: CPU, flash attention auto, weights
    /// repacked, the whole chunk one ubatch, F16 KV cache, llama.cpp's log captured.
    pub fn new(model: opledger_gguf::LlamaLoadable, threads: u32) -> LlamaConfig {
        LlamaConfig {
            model,
            threads,
            flash_attn: FlashAttn::Auto,
            gpu_layers: 0,
            no_repack: false,
            ubatch: None,
            type_k: None,
            type_v: None,
            verbose: false,
            rpc: None,
        }
    }
}

/// llama.cpp as an [`Engine`].
pub struct LlamaEngine {
    backend: Backend,
    cfg: LlamaConfig,
    model: Arc<Model>,
    pool: Arc<ThreadPool>,
    /// The two contexts of the prepared work.
    contexts: Option<Contexts>,
    work: Option<Work>,
    chunk: Vec<i32>,
    state: Vec<u8>,
    /// A sweep in progress.
    sweep: Option<opledger_core::sweep::PassOrder>,
    /// The graph of the prepared work, once `graph()` captured it.
    graph: Option<CapturedGraph>,
    /// The graph of one decode step of a sweep (`sweep_decode_graph`), which TIMED decode steps
    /// must follow.
    decode_graph: Option<CapturedGraph>,
    load_ms: f64,
    /// The mode of the last run, whose context holds the logits.
    last_mode: Option<Mode>,
    /// Split graphs: per position of the graph, the round trip to a remote node's device the
    /// last TIMED run measured right after it (0 elsewhere), µs.
    remote_iso_us: Vec<f64>,
    /// The processes the noise gate counts as this run's own while the engine lives: the RPC
    /// servers on this machine its graph is split over ([`LlamaEngine::count_as_own`]).
    own: Vec<opledger_core::noise::OwnGuard>,
}

/// The two contexts of the prepared work, on one model and thread pool.
struct Contexts {
    /// No instrument: the true native path.
    plain: Context,
    /// The instrument installed.
    observed: Context,
}

/// What the engine keeps of a captured graph.
#[derive(Debug, Clone)]
struct CapturedGraph {
    /// Its ops in order: a TIMED run must compute the same graph.
    ops: Vec<u32>,
    /// How ggml dispatches each node (the isolation calibration graph follows it).
    dispatch: Vec<crate::calibrate::Dispatch>,
    /// The largest node output: the replay scratch buffer's size.
    scratch_bytes: usize,
    /// What each position of the reported graph holds: the observed nodes, and where the graph
    /// is split across devices the transfers between them (see `opledger_core::split`).
    slots: Vec<Slot>,
    /// Per observed node: the remote device it ran on (an index into the graph's remote
    /// devices), `None` for a local node.
    remote: Vec<Option<usize>>,
}

impl CapturedGraph {
    /// The captured graph and the graph to report: with a transfer node at every change of
    /// device when the model is split.
    fn of(
        nodes: Vec<NodeInfo>,
        ops: Vec<u32>,
        all_threads: &[bool],
    ) -> (CapturedGraph, Vec<NodeInfo>) {
        let dispatch = opledger_core::calibration::dispatch_of(&nodes, all_threads);
        let scratch_bytes = nodes
            .iter()
            .map(|n| n.out.size_bytes as usize)
            .max()
            .unwrap_or(0);
        let mut remote_devices: Vec<&str> = Vec::new();
        let remote = nodes
            .iter()
            .map(|n| {
                let d = n
                    .device
                    .as_deref()
                    .filter(|d| opledger_core::split::is_remote(d))?;
                Some(match remote_devices.iter().position(|r| *r == d) {
                    Some(k) => k,
                    None => {
                        remote_devices.push(d);
                        remote_devices.len() - 1
                    }
                })
            })
            .collect();
        let (reported, slots) = opledger_core::split::with_transfers(nodes);
        (
            CapturedGraph {
                ops,
                dispatch,
                scratch_bytes,
                slots,
                remote,
            },
            reported,
        )
    }

    /// The graph has transfer nodes (it is split across devices).
    fn split(&self) -> bool {
        self.slots.len() != self.ops.len()
    }
}

impl LlamaEngine {
    pub fn load(cfg: LlamaConfig) -> Result<LlamaEngine, LlamaError> {
        let t0 = Instant::now();
        let backend = Backend::init(cfg.verbose);
        let model = Model::load(
            &backend,
            &cfg.model,
            &ModelParams {
                gpu_layers: cfg.gpu_layers,
                no_repack: cfg.no_repack,
                rpc: cfg.rpc.clone(),
            },
        )?;
        let pool = ThreadPool::new(cfg.threads)?;
        Ok(LlamaEngine {
            backend,
            cfg,
            model: Arc::new(model),
            pool: Arc::new(pool),
            contexts: None,
            work: None,
            chunk: Vec::new(),
            state: Vec::new(),
            sweep: None,
            graph: None,
            decode_graph: None,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
            last_mode: None,
            remote_iso_us: Vec::new(),
            own: Vec::new(),
        })
    }

    /// Counts `pids` (the RPC servers on this machine that compute part of the graph) as this
    /// run's own work in the noise gate for as long as the engine lives.
    pub fn count_as_own(&mut self, pids: &[u32]) {
        self.own.push(opledger_core::noise::count_as_own(pids));
    }

    /// The loaded model.
    pub fn model(&self) -> &Model {
        &self.model
    }

    fn context_params(
        &self,
        n_tokens: u64,
        chunk_tokens: u32,
        n_seq: u32,
        instrumented: bool,
    ) -> Result<ContextParams, LlamaError> {
        // llama.cpp pads the context to 256 cells.
        let n_ctx = u32::try_from(n_tokens.max(1).div_ceil(256) * 256).map_err(|_| {
            LlamaError::Invalid(format!("a context of {n_tokens} tokens is too large"))
        })?;
        Ok(ContextParams {
            n_ctx,
            n_batch: chunk_tokens,
            n_ubatch: self
                .cfg
                .ubatch
                .unwrap_or(chunk_tokens)
                .clamp(1, chunk_tokens.max(1)),
            flash_attn: self.cfg.flash_attn,
            instrumented,
            split: self.cfg.rpc.is_some(),
            n_seq_max: n_seq.max(1),
            kv_unified: n_seq > 1,
            type_k: self.cfg.type_k,
            type_v: self.cfg.type_v,
        })
    }

    /// Replaces both contexts by new ones holding `n_tokens` over `n_seq` sequences.
    fn create_contexts(
        &mut self,
        n_tokens: u64,
        chunk_tokens: u32,
        n_seq: u32,
    ) -> Result<(), LlamaError> {
        if chunk_tokens == 0 {
            return Err(LlamaError::Invalid("the chunk has no tokens".into()));
        }
        // Free the old contexts before creating new ones.
        self.contexts = None;
        let plain_params = self.context_params(n_tokens, chunk_tokens, n_seq, false)?;
        let observed_params = self.context_params(n_tokens, chunk_tokens, n_seq, true)?;
        self.contexts = Some(Contexts {
            plain: Context::new(self.model.clone(), self.pool.clone(), &plain_params)?,
            observed: Context::new(self.model.clone(), self.pool.clone(), &observed_params)?,
        });
        self.graph = None;
        self.sweep = None;
        Ok(())
    }

    fn context(&mut self, mode: Mode) -> Result<&mut Context, EngineError> {
        let c = self
            .contexts
            .as_mut()
            .ok_or_else(|| EngineError::Failed("the engine is not prepared".into()))?;
        Ok(match mode {
            Mode::Fused => &mut c.plain,
            Mode::FusedObserved | Mode::Timed => &mut c.observed,
        })
    }

    /// Decodes `tokens` at `pos0` in `mode`'s context (no state restore), timed, and hashes the
    /// requested logits.
    fn decode_timed(
        &mut self,
        mode: Mode,
        tokens: &[i32],
        pos0: u32,
        all_logits: bool,
    ) -> Result<(f64, u64), EngineError> {
        let ctx = self.context(mode)?;
        if mode != Mode::Fused {
            ctx.set_observe_mode(observe_mode(mode))?;
        }
        let t0 = Instant::now();
        ctx.decode(tokens, pos0, all_logits)?;
        let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
        let what = format!("the {} run", mode.label());
        let hash = if all_logits {
            let mut h = 0u64;
            for i in 0..tokens.len() as i32 {
                let row = ctx.logits(i)?;
                check_finite(&what, &row)?;
                h = h.rotate_left(5) ^ hash_f32(&row);
            }
            h
        } else {
            let row = ctx.logits(-1)?;
            check_finite(&what, &row)?;
            hash_f32(&row)
        };
        Ok((wall_ms, hash))
    }

    /// The instrument's records of the run just done, checked against the captured graph.
    fn timing(
        &mut self,
        mode: Mode,
        wall_ms: f64,
        output_hash: u64,
    ) -> Result<ChunkTiming, EngineError> {
        if mode == Mode::Fused {
            return Ok(ChunkTiming {
                wall_ms,
                node_us: Vec::new(),
                nodes_seen: 0,
                output_hash,
            });
        }
        let graph = self.graph.take();
        let result = self
            .read_observer(mode, graph.as_ref().map(|g| g.ops.as_slice()))
            .and_then(|(nodes_seen, node_us)| {
                let node_us = match &graph {
                    Some(g) if mode == Mode::Timed && g.split() => self.split_times(g, &node_us)?,
                    _ => node_us,
                };
                Ok(ChunkTiming {
                    wall_ms,
                    node_us,
                    nodes_seen,
                    output_hash,
                })
            });
        self.graph = graph;
        result
    }

    /// A TIMED run of a split graph in the reported graph's positions: the nodes' times, each
    /// transfer the gap before the node it feeds, the outputs the time from the last node to the
    /// end of the decode. Keeps each remote node's isolation: the median TIMED time of the nodes
    /// that do no work (views) on its device in this run, each of which is one graph sent, a
    /// server's dispatch of nothing and one round trip (what isolating a node costs there).
    fn split_times(&mut self, g: &CapturedGraph, node_us: &[f64]) -> Result<Vec<f64>, EngineError> {
        let ctx = self.context(Mode::Timed)?;
        let decoded_at = ctx.decoded_at;
        let obs = ctx.observer_mut()?;
        let gap_us: Vec<f64> = obs.gap_ns.iter().map(|&ns| ns as f64 / 1e3).collect();
        let tail_us = match (decoded_at, obs.last_end) {
            (Some(end), Some(last)) => end.saturating_duration_since(last).as_secs_f64() * 1e6,
            _ => 0.0,
        };
        let devices = g.remote.iter().flatten().max().map_or(0, |m| m + 1);
        let per_device: Vec<f64> = (0..devices)
            .map(|d| {
                let idle: Vec<f64> = (0..node_us.len())
                    .filter(|&i| {
                        g.remote.get(i) == Some(&Some(d))
                            && g.dispatch.get(i) == Some(&crate::calibrate::Dispatch::Idle)
                    })
                    .map(|i| node_us[i])
                    .collect();
                opledger_core::stats::median(&idle).unwrap_or(0.0)
            })
            .collect();
        // a transfer into a remote device was timed up to the answer of a read on it: half a
        // round trip (the answer's way back) more than the FUSED run waits for
        let on = |i: usize| g.remote.get(i).copied().flatten();
        self.remote_iso_us = g
            .slots
            .iter()
            .map(|s| match *s {
                Slot::Node(i) => on(i).map_or(0.0, |d| per_device[d]),
                Slot::TransferBefore(i) => on(i).map_or(0.0, |d| per_device[d] / 2.0),
                Slot::Output => 0.0,
            })
            .collect();
        Ok(opledger_core::split::slot_times(
            &g.slots, node_us, &gap_us, tail_us,
        ))
    }

    fn read_observer(
        &mut self,
        mode: Mode,
        graph_ops: Option<&[u32]>,
    ) -> Result<(u32, Vec<f64>), EngineError> {
        let obs = self.context(mode)?.observer_mut()?;
        let nodes_seen = obs.nodes_seen;
        if let Some(ops) = graph_ops {
            if nodes_seen as usize != ops.len() {
                return Err(EngineError::GraphChanged(format!(
                    "{} mode saw {nodes_seen} nodes, the captured graph has {}",
                    mode.label(),
                    ops.len()
                )));
            }
            if mode == Mode::Timed && obs.ops != ops {
                let at = ops
                    .iter()
                    .zip(&obs.ops)
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                return Err(EngineError::GraphChanged(format!(
                    "TIMED mode computed a different op at node {at} than the captured graph"
                )));
            }
        }
        let node_us: Vec<f64> = obs.timed_ns.iter().map(|&ns| ns as f64 / 1e3).collect();
        if mode == Mode::Timed && node_us.len() != nodes_seen as usize {
            return Err(EngineError::GraphChanged(format!(
                "TIMED mode asked about {nodes_seen} nodes but observed {}",
                node_us.len()
            )));
        }
        Ok((nodes_seen, node_us))
    }

    /// Restores the prepared state into `mode`'s context and decodes the chunk.
    fn run_chunk(&mut self, mode: Mode) -> Result<(f64, u64), EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("run() before prepare()".into()))?;
        let chunk = std::mem::take(&mut self.chunk);
        let state = std::mem::take(&mut self.state);
        let result = self
            .context(mode)
            .and_then(|ctx| ctx.restore_state(&state).map_err(EngineError::from))
            .and_then(|_| self.decode_timed(mode, &chunk, work.depth_tokens, work.all_logits));
        self.chunk = chunk;
        self.state = state;
        result
    }

    /// Decode mode: contexts for `parallel` sequences sharing the filled prefix (a unified KV
    /// cache), sequence 0 filled to the depth and copied to the others, the whole state saved.
    fn prepare_decode(&mut self, work: &Work) -> Result<(), EngineError> {
        let n_seq = work.parallel.max(1);
        let fill_batch = work.chunk_tokens.max(n_seq).max(1);
        let needed = work.depth_tokens as u64 + n_seq as u64 * work.decode_tokens as u64 + 1;
        self.create_contexts(needed, fill_batch, n_seq)?;
        let vocab = self.model.n_vocab();
        let plain = self.context(Mode::Fused)?;
        plain.clear_memory();
        let state = if work.depth_tokens > 0 {
            let fill = filler_tokens(work.token_seed, 0, work.depth_tokens, vocab);
            plain.decode(&fill, 0, false)?;
            for s in 1..n_seq as i32 {
                plain.copy_sequence(0, s);
            }
            plain.save_full_state()?
        } else {
            Vec::new()
        };
        self.state = state;
        self.chunk = Vec::new();
        self.work = Some(work.clone());
        Ok(())
    }

    /// Decode mode: restores the filled state, then `decode_tokens` steps of one token per
    /// sequence; node times are summed over the steps.
    fn run_decode(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("no work".into()))?;
        let vocab = self.model.n_vocab();
        let state = std::mem::take(&mut self.state);
        let restored = self
            .context(mode)
            .and_then(|ctx| ctx.restore_full_state(&state).map_err(EngineError::from));
        self.state = state;
        restored?;
        let mut total = ChunkTiming {
            wall_ms: 0.0,
            node_us: Vec::new(),
            nodes_seen: 0,
            output_hash: 0,
        };
        for step in 0..work.decode_tokens {
            let tokens = decode_step_tokens(&work, step, vocab);
            let ctx = self.context(mode)?;
            if mode != Mode::Fused {
                ctx.set_observe_mode(observe_mode(mode))?;
            }
            let t0 = Instant::now();
            ctx.decode_step(&tokens, work.depth_tokens + step)?;
            let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
            let mut hash = 0u64;
            for s in 0..tokens.len() as i32 {
                let row = ctx.logits(s)?;
                check_finite(
                    &format!(
                        "decode step {step} (sequence {s}) of the {} run",
                        mode.label()
                    ),
                    &row,
                )?;
                hash = hash.rotate_left(7) ^ hash_f32(&row);
            }
            let t = self.timing(mode, wall_ms, hash)?;
            total.wall_ms += t.wall_ms;
            total.output_hash = total.output_hash.rotate_left(3) ^ t.output_hash;
            total.nodes_seen = t.nodes_seen;
            if total.node_us.is_empty() {
                total.node_us = t.node_us;
            } else {
                for (acc, v) in total.node_us.iter_mut().zip(&t.node_us) {
                    *acc += v;
                }
            }
        }
        Ok(total)
    }

    /// A replay run (see [`Engine::replay`]); with `launches_only`, every marked node dispatches
    /// `k` rounds of one trivial clone instead of `k` clones (see [`Engine::replay_launches`]).
    fn replay_run(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        k: u32,
        launches_only: bool,
    ) -> Result<ChunkTiming, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("replay() before prepare()".into()))?;
        if work.is_decode() {
            return Err(EngineError::Unsupported {
                what: "replay of decode runs".into(),
                why: "replay measures one prefill chunk".into(),
            });
        }
        if crate::replay::gpu_present() {
            return Err(EngineError::Unsupported {
                what: "in-graph replay".into(),
                why: "a GPU device is present: llama.cpp may offload nodes, and replay clones \
                      compute on the CPU"
                    .into(),
            });
        }
        // the scratch size and the node count come from graph() of this very work
        let (expected_nodes, scratch) = self
            .graph
            .as_ref()
            .map(|g| (g.ops.len() as u32, g.scratch_bytes.max(1)))
            .ok_or_else(|| EngineError::Failed("replay() before graph()".into()))?;
        let pool = self.pool.clone();
        let chunk = std::mem::take(&mut self.chunk);
        let state = std::mem::take(&mut self.state);
        let result = (|| {
            let ctx = self.context(Mode::FusedObserved)?;
            ctx.restore_state(&state)?;
            ctx.set_observe_mode(ObserveMode::Replay)?;
            let obs = ctx.observer_mut()?;
            if obs.replayer.is_none() {
                obs.replayer = Some(crate::replay::Replayer::new(
                    &pool,
                    scratch,
                    crate::replay::CLONES_PER_ROUND as usize,
                )?);
            }
            if let Some(r) = obs.replayer.as_mut() {
                r.reset_counts();
            }
            obs.plan = crate::replay::ReplayPlan {
                cut: cut.to_vec(),
                replay: replay.to_vec(),
                k,
                launches_only,
            };
            let t0 = Instant::now();
            ctx.decode(&chunk, work.depth_tokens, work.all_logits)?;
            let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
            let row = ctx.logits(-1)?;
            check_finite("the replay run", &row)?;
            let hash = hash_f32(&row);
            let obs = ctx.observer_mut()?;
            let nodes_seen = obs.nodes_seen;
            let (skipped, failed) = obs
                .replayer
                .as_ref()
                .map(|r| (r.skipped, r.failed))
                .unwrap_or((0, 0));
            Ok::<_, EngineError>((wall_ms, hash, nodes_seen, skipped, failed))
        })();
        self.chunk = chunk;
        self.state = state;
        self.last_mode = Some(Mode::FusedObserved);
        self.pool.pause();
        let (wall_ms, output_hash, nodes_seen, skipped, failed) = result?;
        if nodes_seen != expected_nodes {
            return Err(EngineError::GraphChanged(format!(
                "the replay run asked about {nodes_seen} nodes, the captured graph has {expected_nodes}"
            )));
        }
        if skipped > 0 || failed > 0 {
            return Err(EngineError::Failed(format!(
                "{skipped} node(s) could not be replayed and {failed} replay(s) failed to compute: \
                 the run's timing would undercount"
            )));
        }
        Ok(ChunkTiming {
            wall_ms,
            node_us: Vec::new(),
            nodes_seen,
            output_hash,
        })
    }

    /// The tokens of sweep chunk `index` and its first position.
    fn sweep_tokens(&self, work: &Work, index: u32) -> Result<(Vec<i32>, u32), EngineError> {
        let pos0 = index
            .checked_mul(work.chunk_tokens)
            .ok_or_else(|| EngineError::Failed(format!("chunk {index} lies beyond 2^32 tokens")))?;
        Ok((
            filler_tokens(
                work.token_seed,
                pos0,
                work.chunk_tokens,
                self.model.n_vocab(),
            ),
            pos0,
        ))
    }

    /// The graph llama.cpp computes for `work`, described without running the model: one
    /// instrumented context answers "no" to every ask (so the scheduler asks about every node of
    /// the split before computing it) and llama.cpp's abort callback stops the computation after
    /// the first node. The context is filled to the depth first, which does compute (the graph
    /// at depth L attends over L cached keys). If the capture does not end at the logits node
    /// (a graph in several splits), the chunk is run in full instead, and the result says so.
    fn capture_graph_inner(&mut self, work: &Work) -> Result<GraphCapture, LlamaError> {
        let t0 = Instant::now();
        let needed = work.depth_tokens as u64 + work.chunk_tokens.max(1) as u64;
        let n_ctx = u32::try_from(needed.div_ceil(256) * 256).map_err(|_| {
            LlamaError::Invalid(format!("depth + chunk = {needed} tokens is too large"))
        })?;
        let mut ctx = Context::new(
            self.model.clone(),
            self.pool.clone(),
            &ContextParams {
                n_ctx,
                n_batch: work.chunk_tokens,
                n_ubatch: work.chunk_tokens,
                flash_attn: self.cfg.flash_attn,
                instrumented: true,
                split: self.cfg.rpc.is_some(),
                n_seq_max: 1,
                kv_unified: false,
                type_k: self.cfg.type_k,
                type_v: self.cfg.type_v,
            },
        )?;
        let vocab = self.model.n_vocab();
        ctx.set_observe_mode(ObserveMode::Count)?;
        let state = if work.depth_tokens > 0 {
            let fill = filler_tokens(work.token_seed, 0, work.depth_tokens, vocab);
            ctx.decode(&fill, 0, false)?;
            ctx.save_state()?
        } else {
            Vec::new()
        };
        let chunk = filler_tokens(work.token_seed, work.depth_tokens, work.chunk_tokens, vocab);
        ctx.set_observe_mode(ObserveMode::Capture)?;
        ctx.set_abort(true);
        let aborted = ctx.decode(&chunk, work.depth_tokens, work.all_logits);
        ctx.set_abort(false);
        let computed_one = match aborted {
            Err(LlamaError::Decode { code: 2, .. }) => true,
            Ok(()) => false,
            Err(e) => return Err(e),
        };
        let mut nodes = std::mem::take(&mut ctx.observer_mut()?.captured);
        let complete = nodes.last().is_some_and(|n| n.name == "result_output");
        let mut chunk_nodes_computed = if computed_one { 1 } else { nodes.len() as u32 };
        if !complete {
            ctx.restore_state(&state)?;
            ctx.set_observe_mode(ObserveMode::Capture)?;
            ctx.decode(&chunk, work.depth_tokens, work.all_logits)?;
            nodes = std::mem::take(&mut ctx.observer_mut()?.captured);
            chunk_nodes_computed = nodes.len() as u32;
        }
        // a split graph: the transfers between devices as nodes of their own
        let (nodes, _) = opledger_core::split::with_transfers(nodes);
        Ok(GraphCapture {
            nodes,
            filled_tokens: work.depth_tokens,
            chunk_nodes_computed,
            wall_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }
}

impl Engine for LlamaEngine {
    fn info(&self) -> EngineInfo {
        let mut settings = BTreeMap::new();
        settings.insert(
            "flash_attn".into(),
            format!("{:?}", self.cfg.flash_attn).to_lowercase(),
        );
        settings.insert("gpu_layers".into(), self.cfg.gpu_layers.to_string());
        settings.insert("swa_full".into(), "false".into());
        settings.insert("weight_repack".into(), (!self.cfg.no_repack).to_string());
        if let Some(u) = self.cfg.ubatch {
            settings.insert("ubatch".into(), u.to_string());
        }
        if let Some(t) = self.cfg.type_k {
            settings.insert("type_k".into(), format!("{t:?}").to_lowercase());
        }
        if let Some(t) = self.cfg.type_v {
            settings.insert("type_v".into(), format!("{t:?}").to_lowercase());
        }
        if let Some(r) = &self.cfg.rpc {
            settings.insert("rpc".into(), r.servers.join(","));
            let split: Vec<String> = r.layers.iter().map(|l| l.to_string()).collect();
            settings.insert("rpc_split".into(), split.join(","));
        }
        settings.insert("system_info".into(), self.backend.system_info());
        // what ggml registered and sees, as a worker's manifest records them
        settings.insert("backends".into(), self.backend.backends().join(","));
        settings.insert("devices".into(), self.backend.devices().join("; "));
        settings.insert("model_description".into(), self.model.description());
        if let Some(c) = &self.contexts {
            settings.insert("n_ctx".into(), c.observed.n_ctx().to_string());
        }
        EngineInfo {
            engine: "llama.cpp".into(),
            version: format!("{LLAMA_CPP_SYS_VERSION} (ggml {})", ggml_version()),
            backend: if self.cfg.gpu_layers > 0 && cfg!(feature = "cuda") {
                "CUDA".into()
            } else {
                "CPU".into()
            },
            threads: self.pool.threads(),
            settings,
        }
    }

    fn prepare(&mut self, work: &Work) -> Result<(), EngineError> {
        if work.is_decode() {
            return self.prepare_decode(work);
        }
        let needed = work.depth_tokens as u64 + work.chunk_tokens as u64;
        self.create_contexts(needed, work.chunk_tokens, 1)?;
        let vocab = self.model.n_vocab();
        let plain = self.context(Mode::Fused)?;
        plain.clear_memory();
        let state = if work.depth_tokens > 0 {
            let fill = filler_tokens(work.token_seed, 0, work.depth_tokens, vocab);
            plain.decode(&fill, 0, false)?;
            plain.save_state()?
        } else {
            Vec::new()
        };
        self.state = state;
        self.chunk = filler_tokens(work.token_seed, work.depth_tokens, work.chunk_tokens, vocab);
        self.work = Some(work.clone());
        Ok(())
    }

    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("graph() before prepare()".into()))?;
        let chunk = std::mem::take(&mut self.chunk);
        let state = std::mem::take(&mut self.state);
        let step_tokens = decode_step_tokens(&work, 0, self.model.n_vocab());
        let result = (|| {
            let ctx = self.context(Mode::FusedObserved)?;
            if work.is_decode() {
                ctx.restore_full_state(&state)?;
                ctx.set_observe_mode(ObserveMode::Capture)?;
                ctx.decode_step(&step_tokens, work.depth_tokens)?;
            } else {
                ctx.restore_state(&state)?;
                ctx.set_observe_mode(ObserveMode::Capture)?;
                ctx.decode(&chunk, work.depth_tokens, work.all_logits)?;
            }
            let obs = ctx.observer_mut()?;
            Ok::<_, EngineError>((
                std::mem::take(&mut obs.captured),
                std::mem::take(&mut obs.ops),
                std::mem::take(&mut obs.all_threads),
            ))
        })();
        self.chunk = chunk;
        self.state = state;
        let (nodes, ops, all_threads) = result?;
        let (graph, reported) = CapturedGraph::of(nodes, ops, &all_threads);
        self.graph = Some(graph);
        Ok(reported)
    }

    fn logits(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        let (Some(mode), Some(work)) = (self.last_mode, self.work.clone()) else {
            return Err(EngineError::Failed("logits() before a run".into()));
        };
        let ctx = self.context(mode)?;
        if work.is_decode() {
            (0..work.parallel.max(1) as i32)
                .map(|s| ctx.logits(s).map_err(EngineError::from))
                .collect()
        } else {
            Ok(vec![ctx.logits(-1)?])
        }
    }

    fn run(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        self.last_mode = Some(mode);
        let r = if self.work.as_ref().is_some_and(|w| w.is_decode()) {
            self.run_decode(mode)
        } else {
            self.run_chunk(mode)
                .and_then(|(wall_ms, hash)| self.timing(mode, wall_ms, hash))
        };
        // the timing is taken: stop the workers polling before whatever runs next
        self.pool.pause();
        r
    }

    fn isolation_cost_us(&mut self) -> Result<Option<f64>, EngineError> {
        Ok(self.calibrate_isolation()?.map(|c| c.per_node_us))
    }

    fn calibrate_isolation(
        &mut self,
    ) -> Result<Option<opledger_core::engine::IsolationCalibration>, EngineError> {
        calibrate(&self.pool, self.graph.as_ref(), &self.remote_iso_us)
    }

    fn routed_experts(&mut self) -> Result<Option<BTreeMap<u32, u32>>, EngineError> {
        let ids = self.capture_routing()?;
        Ok(Some(
            ids.into_iter()
                .map(|(i, ids)| (i, opledger_core::ops::distinct_experts(&ids)))
                .collect(),
        ))
    }

    fn gemm_peak(&mut self) -> Result<Option<(f64, String)>, EngineError> {
        // the shared probe (opledger_core::peaks), ggml's own matmul on this engine's thread pool
        let node = opledger_core::peaks::gemm_probe(Some(llama_cpp_sys_2::GGML_OP_MUL_MAT));
        let t = OpTimer::time_node(
            self,
            &node,
            &OpTimeRequest {
                routing: None,
                reps: opledger_core::peaks::GEMM_PROBE_REPS,
                rotate_bytes: 0,
                flush_bytes: 0,
            },
        )?;
        Ok(opledger_core::peaks::gemm_peak_of(t.median_us))
    }

    fn supports(&self, c: Capability) -> bool {
        // a split model's remote nodes live in memory this process cannot read: no replay of
        // them, no op timing of them on this CPU
        let split = self.cfg.rpc.is_some();
        match c {
            Capability::Replay | Capability::OpTiming => !split,
            _ => matches!(
                c,
                Capability::Decode
                    | Capability::Logits
                    | Capability::Sweep
                    | Capability::GraphCapture
            ),
        }
    }

    fn load_ms(&self) -> Option<f64> {
        Some(self.load_ms)
    }

    fn as_sweep(&mut self) -> Option<&mut dyn SweepEngine> {
        Some(self)
    }

    fn as_replay(&mut self) -> Option<&mut dyn ReplayEngine> {
        if self.cfg.rpc.is_some() {
            return None;
        }
        Some(self)
    }

    fn as_op_timer(&mut self) -> Option<&mut dyn OpTimer> {
        if self.cfg.rpc.is_some() {
            return None;
        }
        Some(self)
    }

    fn as_graph_capturer(&mut self) -> Option<&mut dyn GraphCapturer> {
        Some(self)
    }
}

impl ReplayEngine for LlamaEngine {
    fn replay(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        k: u32,
    ) -> Result<ChunkTiming, EngineError> {
        self.replay_run(cut, replay, k, false)
    }

    fn replay_rounds(&self, k: u32) -> u32 {
        crate::replay::rounds(k)
    }

    fn replay_launches(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        rounds: u32,
    ) -> Result<ChunkTiming, EngineError> {
        self.replay_run(cut, replay, rounds, true)
    }
}

impl SweepEngine for LlamaEngine {
    fn prepare_sweep(
        &mut self,
        work: &Work,
        chunks: u32,
        decode: Option<(u32, u32)>,
    ) -> Result<(), EngineError> {
        if chunks == 0 {
            return Err(EngineError::Failed("a sweep of no chunks".into()));
        }
        // decode steps run on forked sequences 1..=P sharing sequence 0's cells (one unified
        // KV buffer), each needing room for its steps
        let (steps, parallel) = decode.unwrap_or((0, 0));
        let needed = chunks as u64 * work.chunk_tokens as u64
            + steps as u64 * parallel as u64
            + u64::from(decode.is_some());
        self.create_contexts(needed, work.chunk_tokens, 1 + parallel)?;
        let first = Work {
            depth_tokens: 0,
            ..work.clone()
        };
        self.chunk = self.sweep_tokens(&first, 0)?.0;
        self.state = Vec::new();
        self.work = Some(first);
        self.sweep = Some(opledger_core::sweep::PassOrder::new(chunks, decode));
        Ok(())
    }

    fn start_pass(&mut self, mode: Mode, first_chunk: u32) -> Result<(), EngineError> {
        self.sweep
            .as_ref()
            .ok_or_else(|| EngineError::Failed("start_pass() before prepare_sweep()".into()))?
            .check_start(first_chunk)?;
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("no work".into()))?;
        let fill = filler_tokens(
            work.token_seed,
            0,
            first_chunk * work.chunk_tokens,
            self.model.n_vocab(),
        );
        let ctx = self.context(mode)?;
        ctx.clear_memory();
        if mode != Mode::Fused {
            ctx.set_observe_mode(ObserveMode::Count)?;
        }
        if !fill.is_empty() {
            ctx.decode(&fill, 0, false)?;
        }
        self.pool.pause();
        if let Some(s) = self.sweep.as_mut() {
            s.set_next(mode, first_chunk);
        }
        Ok(())
    }

    fn pass_chunk(&mut self, mode: Mode, index: u32) -> Result<ChunkTiming, EngineError> {
        self.sweep
            .as_ref()
            .ok_or_else(|| EngineError::Failed("pass_chunk() before prepare_sweep()".into()))?
            .check_chunk(mode, index)?;
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("no work".into()))?;
        let (tokens, pos0) = self.sweep_tokens(&work, index)?;
        let timed = self.decode_timed(mode, &tokens, pos0, work.all_logits);
        self.pool.pause();
        let (wall_ms, hash) = timed?;
        if let Some(s) = self.sweep.as_mut() {
            s.set_next(mode, index + 1);
        }
        self.timing(mode, wall_ms, hash)
    }

    fn pass_decode(
        &mut self,
        mode: Mode,
        after_chunk: u32,
        steps: u32,
        parallel: u32,
    ) -> Result<ChunkTiming, EngineError> {
        self.sweep
            .as_ref()
            .ok_or_else(|| EngineError::Failed("pass_decode() before prepare_sweep()".into()))?
            .check_decode(mode, after_chunk, steps, parallel)?;
        if mode != Mode::Fused && self.decode_graph.is_none() {
            return Err(EngineError::Failed(
                "pass_decode() before sweep_decode_graph()".into(),
            ));
        }
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("no work".into()))?;
        let vocab = self.model.n_vocab();
        let depth = (after_chunk + 1) * work.chunk_tokens;
        // the forks share sequence 0's cells (unified KV) and copy its recurrent state
        {
            let ctx = self.context(mode)?;
            for s in 1..=parallel as i32 {
                ctx.copy_sequence(0, s);
            }
        }
        // TIMED steps follow the decode step's graph, not the prefill chunk's
        let prefill_graph = std::mem::replace(&mut self.graph, self.decode_graph.clone());
        let result = (|| {
            let mut total = ChunkTiming {
                wall_ms: 0.0,
                node_us: Vec::new(),
                nodes_seen: 0,
                output_hash: 0,
            };
            for step in 0..steps {
                let tokens = sweep_step_tokens(&work, depth + step, parallel, vocab);
                let ctx = self.context(mode)?;
                if mode != Mode::Fused {
                    ctx.set_observe_mode(observe_mode(mode))?;
                }
                let t0 = Instant::now();
                ctx.decode_step_from(&tokens, depth + step, 1)?;
                let wall_ms = t0.elapsed().as_secs_f64() * 1e3;
                let what = format!("the {} decode step", mode.label());
                let mut hash = 0u64;
                for s in 0..tokens.len() as i32 {
                    let row = ctx.logits(s)?;
                    check_finite(&what, &row)?;
                    hash = hash.rotate_left(7) ^ hash_f32(&row);
                }
                let t = self.timing(mode, wall_ms, hash)?;
                total.wall_ms += t.wall_ms;
                total.output_hash = total.output_hash.rotate_left(3) ^ t.output_hash;
                total.nodes_seen = t.nodes_seen;
                if total.node_us.is_empty() {
                    total.node_us = t.node_us;
                } else {
                    for (acc, v) in total.node_us.iter_mut().zip(&t.node_us) {
                        *acc += v;
                    }
                }
            }
            Ok::<_, EngineError>(total)
        })();
        self.graph = prefill_graph;
        self.pool.pause();
        // the pass continues from sequence 0 as it was
        let ctx = self.context(mode)?;
        for s in 1..=parallel as i32 {
            ctx.remove_sequence(s)?;
        }
        result
    }

    fn sweep_decode_graph(&mut self, parallel: u32) -> Result<Vec<NodeInfo>, EngineError> {
        let work = self.work.clone().ok_or_else(|| {
            EngineError::Failed("sweep_decode_graph() before prepare_sweep()".into())
        })?;
        if self.sweep.as_ref().and_then(|s| s.decode()).is_none() {
            return Err(EngineError::Failed(
                "sweep_decode_graph() on a sweep prepared without decode steps".into(),
            ));
        }
        let vocab = self.model.n_vocab();
        let (chunk, pos0) = self.sweep_tokens(&work, 0)?;
        let tokens = sweep_step_tokens(&work, pos0 + work.chunk_tokens, parallel, vocab);
        let captured = (|| {
            let ctx = self.context(Mode::FusedObserved)?;
            ctx.clear_memory();
            ctx.set_observe_mode(ObserveMode::Count)?;
            ctx.decode(&chunk, pos0, false)?;
            for s in 1..=parallel as i32 {
                ctx.copy_sequence(0, s);
            }
            ctx.set_observe_mode(ObserveMode::Capture)?;
            ctx.decode_step_from(&tokens, pos0 + work.chunk_tokens, 1)?;
            let obs = ctx.observer_mut()?;
            let out = (
                std::mem::take(&mut obs.captured),
                std::mem::take(&mut obs.ops),
                std::mem::take(&mut obs.all_threads),
            );
            ctx.clear_memory();
            Ok::<_, EngineError>(out)
        })();
        self.pool.pause();
        let (nodes, ops, all_threads) = captured?;
        let (graph, nodes) = CapturedGraph::of(nodes, ops, &all_threads);
        self.decode_graph = Some(graph);
        // the passes start from an empty context again
        if let Some(s) = self.sweep.as_mut() {
            s.reset();
        }
        Ok(nodes)
    }

    fn calibrate_sweep_decode(
        &mut self,
    ) -> Result<Option<opledger_core::engine::IsolationCalibration>, EngineError> {
        calibrate(&self.pool, self.decode_graph.as_ref(), &self.remote_iso_us)
    }
}

impl OpTimer for LlamaEngine {
    /// The expert ids every MUL_MAT_ID node of the prepared chunk routes in a real (TIMED) run:
    /// (node index, ids `[n_used, n_tokens]`).
    fn capture_routing(&mut self) -> Result<Vec<(u32, Vec<i32>)>, EngineError> {
        self.context(Mode::Timed)?.observer_mut()?.capture_ids = true;
        let run = self.run(Mode::Timed);
        let obs = self.context(Mode::Timed)?.observer_mut()?;
        obs.capture_ids = false;
        let ids = std::mem::take(&mut obs.ids);
        run?;
        Ok(ids)
    }

    /// Times one node of the captured graph alone on this engine's thread pool (see
    /// [`crate::optime`]); weights repacked as the model's are.
    fn time_node(&mut self, node: &NodeInfo, req: &OpTimeRequest) -> Result<OpTime, EngineError> {
        let r = crate::optime::time_node(
            &self.pool,
            node,
            req.routing,
            &crate::optime::OpTimeConfig {
                repack: !self.cfg.no_repack,
                rotate_bytes: req.rotate_bytes,
                reps: req.reps,
                flush_bytes: req.flush_bytes,
            },
        );
        self.pool.pause();
        Ok(r?)
    }
}

impl GraphCapturer for LlamaEngine {
    /// The graph llama.cpp computes for `work`, described without running the model (see
    /// `capture_graph_inner`).
    fn capture_graph(&mut self, work: &Work) -> Result<GraphCapture, EngineError> {
        Ok(self.capture_graph_inner(work)?)
    }
}

/// How each captured node is dispatched (no work, one thread, every thread), for a calibration
/// graph that is dispatched the same way node for node.
/// The isolation cost on a calibration graph dispatched as `graph` is, node for node (no graph
/// captured yet: the average, for every node).
///
/// A split graph (RPC): a local node's isolation is the calibration's, a remote node's and a
/// transfer's what the last TIMED run measured on its device (`remote_iso_us`, by position; see
/// `split_times`).
fn calibrate(
    pool: &ThreadPool,
    graph: Option<&CapturedGraph>,
    remote_iso_us: &[f64],
) -> Result<Option<opledger_core::engine::IsolationCalibration>, EngineError> {
    let dispatch = graph.map(|g| g.dispatch.as_slice()).unwrap_or(&[]);
    let c = crate::calibrate::isolation_cost(pool, dispatch, 5)?;
    let mut each_node_us = if !dispatch.is_empty() && c.each_node_us.len() == dispatch.len() {
        c.each_node_us
    } else {
        Vec::new()
    };
    let mut per_node_us = c.per_node_us;
    if let Some(g) = graph.filter(|g| g.split()) {
        if remote_iso_us.len() != g.slots.len() {
            return Err(EngineError::Failed(
                "the isolation of a split graph's remote nodes comes from a TIMED run of it, and none ran yet".into(),
            ));
        }
        let local = |i: usize| each_node_us.get(i).copied().unwrap_or(c.per_node_us);
        let split: Vec<f64> = g
            .slots
            .iter()
            .enumerate()
            .map(|(pos, s)| match *s {
                Slot::Node(i) if g.remote.get(i).is_some_and(|r| r.is_some()) => remote_iso_us[pos],
                Slot::Node(i) => local(i),
                Slot::TransferBefore(_) | Slot::Output => remote_iso_us[pos],
            })
            .collect();
        let working: Vec<f64> = g
            .slots
            .iter()
            .zip(&split)
            .filter(|(s, _)| matches!(s, Slot::Node(i) if g.dispatch.get(*i) != Some(&crate::calibrate::Dispatch::Idle)))
            .map(|(_, v)| *v)
            .collect();
        per_node_us = working.iter().sum::<f64>() / working.len().max(1) as f64;
        each_node_us = split;
    }
    Ok(Some(opledger_core::engine::IsolationCalibration {
        per_node_us,
        each_node_us,
    }))
}

/// The tokens of one sweep decode step at position `pos`: one per forked sequence, each
/// sequence its own stream.
fn sweep_step_tokens(work: &Work, pos: u32, parallel: u32, vocab: u32) -> Vec<i32> {
    opledger_core::tokens::forked_step_tokens(work.token_seed, pos, parallel, vocab)
}

/// The tokens of decode step `step`: one per sequence, each sequence its own stream.
fn decode_step_tokens(work: &Work, step: u32, vocab: u32) -> Vec<i32> {
    opledger_core::tokens::decode_step_tokens(
        work.token_seed,
        work.depth_tokens,
        step,
        work.parallel,
        vocab,
    )
}

/// What the instrument does in each mode (the plain context has none).
fn observe_mode(mode: Mode) -> ObserveMode {
    match mode {
        Mode::Fused | Mode::FusedObserved => ObserveMode::Count,
        Mode::Timed => ObserveMode::Timed,
    }
}

fn ggml_version() -> String {
    // SAFETY: ggml_version returns a static NUL-terminated string.
    unsafe {
        let p = llama_cpp_sys_2::ggml_version();
        if p.is_null() {
            return "?".into();
        }
        std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}
