//! [`WorkerEngine`]: the llama.cpp engine over the worker's pipe, request by request: two contexts on one model (plain: no
//! callback, the native path; observed: the instrument), the context filled to the depth once
//! and its state restored before every run, the same filler tokens, the same logits hashes. The
//! worker executes; every decision about what to run stays here.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde_json::{json, Map, Value};

use opledger_core::calibration::Dispatch;
use opledger_core::device_clock::DeviceTiming;
use opledger_core::engine::{
    Capability, ChunkTiming, Engine, EngineError, EngineInfo, GraphCapture, GraphCapturer,
    IsolationCalibration, Mode, OpTime, OpTimeRequest, OpTimer, OutputReader, ReplayEngine,
    SweepEngine, Work,
};
use opledger_core::node::NodeInfo;
use opledger_core::split::Slot;
use opledger_core::sweep::PassOrder;
use opledger_core::tokens::{
    decode_step_tokens, filler_tokens, forked_step_tokens as sweep_step_tokens,
};

use crate::process::{WorkerError, WorkerProcess};

mod replay;
use crate::protocol::{
    Contexts, Decoded, Device, Done, Hello, Loaded, Logits, Saved, TimedOp, WireIds,
};

/// Clones the worker computes per round of a replay, one graph per round (PROTOCOL.md,
/// `replay`).
pub const CLONES_PER_ROUND: u32 = 16;

/// Rounds of the isolation calibration per calibration .
const CALIBRATION_ROUNDS: u32 = 5;

/// The environment variable that turns the device's clock on (ggml-vulkan's perf logger).
pub const DEVICE_CLOCK_ENV: &str = "GGML_VK_PERF_LOGGER";

/// How long the engine waits, after a run's answer, for the stderr drain to read the run's end
/// marker (written before the answer: in the pipe already).
const DEVICE_LOG_WAIT: Duration = Duration::from_secs(30);

/// How to start a worker and load the model in it.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// The worker binary (`tools/llama-worker`, built in the user's llama.cpp tree).
    pub worker: PathBuf,
    pub model: PathBuf,
    pub threads: u32,
    /// `auto`, `on` or `off`.
    pub flash_attn: String,
    pub gpu_layers: i32,
    pub no_repack: bool,
    pub ubatch: Option<u32>,
    /// KV cache types (`f16`, `q8_0`, ...; `None`: llama.cpp's default, F16).
    pub type_k: Option<String>,
    pub type_v: Option<String>,
    /// How long one request may take before the worker is stopped.
    pub timeout: Duration,
    /// Pass llama.cpp's log through to stderr.
    pub verbose: bool,
    /// Set in the worker's environment (a side's `env:NAME=VALUE` knobs: a backend's runtime
    /// switches such as `GGML_CUDA_DISABLE_GRAPHS`).
    pub env: BTreeMap<String, String>,
    /// Split the model across this machine's devices and remote RPC servers.
    pub rpc: Option<WorkerRpc>,
}

/// A model split over RPC servers, in llama.cpp's terms (`opledger_core::split::layer_split`):
/// the servers in the order their devices take layers, `gpu_layers` and `tensor_split`.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerRpc {
    pub servers: Vec<String>,
    /// Layers per device, this machine's first (what the manifest records).
    pub layers: Vec<u32>,
    pub gpu_layers: i32,
    pub tensor_split: Vec<f32>,
    /// How long a request may go without progress before the worker ends itself as a remote
    /// failure (`--rpc-timeout`; the worker's watchdog, PROTOCOL.md "Faults").
    pub timeout: std::time::Duration,
}

/// What the engine keeps of a captured graph: its ops, which a TIMED run must follow, and what
/// each position of the reported graph holds (the observed nodes, and where the graph spans
/// several devices the transfers between them: `opledger_core::split`).
#[derive(Debug, Clone)]
struct Captured {
    ops: Vec<u32>,
    slots: Vec<Slot>,
    /// Per observed node: how ggml's CPU backend dispatches it (the calibration graph follows
    /// it) and whether it is computed on the CPU.
    dispatch: Vec<Dispatch>,
    on_cpu: Vec<bool>,
}

impl Captured {
    /// The reported graph has transfer nodes (it spans several devices).
    fn split(&self) -> bool {
        self.slots.len() != self.ops.len()
    }
}

/// llama.cpp in a worker process, as an [`Engine`].
pub struct WorkerEngine {
    proc: WorkerProcess,
    cfg: WorkerConfig,
    worker_hash: String,
    /// The `build.*` settings of the worker's build manifest
    /// ([`crate::build_manifest::build_settings`]).
    build: BTreeMap<String, String>,
    loaded: Loaded,
    n_ctx: Option<u32>,
    work: Option<Work>,
    chunk: Vec<i32>,
    /// What the prepared state is: `seq0` (prefill), `full` (decode), or none (empty context).
    state: Option<&'static str>,
    graph: Option<Captured>,
    decode_graph: Option<Captured>,
    sweep: Option<PassOrder>,
    last_mode: Option<Mode>,
    /// The rows of the last run's logits where it was a sweep's decode steps (one per forked
    /// sequence of the last step); `None`: as the work says.
    last_rows: Option<u32>,
    /// TIMED decodes ask for the expert ids ([`OpTimer::capture_routing`]), and `ids` keeps the
    /// last answer's.
    capture_ids: bool,
    ids: Vec<WireIds>,
    /// The last replay run's counts as the worker answered them: (replayed, skipped, failed).
    last_replay: Option<(u32, u32, u32)>,
    /// The processes the noise gate counts as this run's own while the engine lives: the
    /// worker, and the RPC servers on this machine its graph is split over
    /// ([`WorkerEngine::count_as_own`]).
    own: Vec<opledger_core::noise::OwnGuard>,
    /// The output reader's chunk (positions) and the position of its next greedy step.
    outputs: Option<(u32, u32)>,
}

fn ctx_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Fused => "plain",
        Mode::FusedObserved | Mode::Timed => "observed",
    }
}

fn observe(mode: Mode) -> &'static str {
    match mode {
        Mode::Fused => "none",
        Mode::FusedObserved => "count",
        Mode::Timed => "timed",
    }
}

fn fields(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// A worker error as the engine's error: faults keep their type (the command's exit code says
/// the worker failed), refusals are the engine's own words.
fn engine_err(e: WorkerError) -> EngineError {
    if matches!(e, WorkerError::RemoteFailed { .. }) {
        EngineError::RemoteFailed(e.to_string())
    } else if e.is_fault() || matches!(e, WorkerError::Start { .. }) {
        EngineError::Worker(e.to_string())
    } else {
        EngineError::Failed(e.to_string())
    }
}

impl WorkerEngine {
    /// Starts the worker, checks its protocol, and loads the model in it.
    pub fn load(cfg: WorkerConfig) -> Result<WorkerEngine, WorkerError> {
        let bytes = std::fs::read(&cfg.worker).map_err(|e| WorkerError::Start {
            worker: cfg.worker.clone(),
            why: e.to_string(),
        })?;
        let worker_hash = blake3::hash(&bytes).to_hex().to_string();
        // what scripts/build-worker says it built, when it is this binary
        let build = crate::build_manifest::build_settings(&cfg.worker, &bytes).map_err(|e| {
            WorkerError::Start {
                worker: cfg.worker.clone(),
                why: e.to_string(),
            }
        })?;
        drop(bytes);
        let mut proc = WorkerProcess::start(&cfg.worker, cfg.timeout, cfg.verbose, &cfg.env)?;
        // the worker computes the measured graph: the noise gate counts its CPU time as the
        // run's own, not another process's
        let own = vec![opledger_core::noise::count_as_own(&[proc.pid()])];
        let mut load = json!({
            "model": cfg.model.to_string_lossy(),
            "threads": cfg.threads,
            "gpu_layers": cfg.gpu_layers,
            "no_repack": cfg.no_repack,
        });
        if let Some(r) = &cfg.rpc {
            load["gpu_layers"] = r.gpu_layers.into();
            load["rpc"] = json!(r.servers);
            load["tensor_split"] = json!(r.tensor_split);
            load["rpc_timeout_ms"] = (r.timeout.as_millis().max(1) as u64).into();
            // a worker that ends as a remote failure is told apart from any other fault
            proc.set_remote(true);
        }
        let loaded: Loaded = proc.request("load", fields(load))?;
        Ok(WorkerEngine {
            proc,
            cfg,
            worker_hash,
            build,
            loaded,
            n_ctx: None,
            work: None,
            chunk: Vec::new(),
            state: None,
            graph: None,
            decode_graph: None,
            sweep: None,
            last_mode: None,
            last_rows: None,
            capture_ids: false,
            ids: Vec::new(),
            last_replay: None,
            outputs: None,
            own,
        })
    }

    /// Counts `pids` (the RPC servers on this machine that compute part of the graph) as this
    /// run's own work in the noise gate for as long as the engine lives.
    pub fn count_as_own(&mut self, pids: &[u32]) {
        self.own.push(opledger_core::noise::count_as_own(pids));
    }

    /// The worker's hello: its protocol and the llama.cpp build it was compiled against.
    pub fn hello(&self) -> &crate::protocol::Hello {
        self.proc.hello()
    }

    fn req<T: serde::de::DeserializeOwned>(
        &mut self,
        op: &str,
        v: Value,
    ) -> Result<T, EngineError> {
        self.proc.request(op, fields(v)).map_err(engine_err)
    }

    fn vocab(&self) -> u32 {
        self.loaded.n_vocab
    }

    /// New plain and observed contexts for `n_tokens` over `n_seq` sequences.
    fn contexts(
        &mut self,
        n_tokens: u64,
        chunk_tokens: u32,
        n_seq: u32,
    ) -> Result<(), EngineError> {
        if chunk_tokens == 0 {
            return Err(EngineError::Failed("the chunk has no tokens".into()));
        }
        // llama.cpp pads the context to 256 cells
        let n_ctx = u32::try_from(n_tokens.max(1).div_ceil(256) * 256).map_err(|_| {
            EngineError::Failed(format!("a context of {n_tokens} tokens is too large"))
        })?;
        let ubatch = self
            .cfg
            .ubatch
            .unwrap_or(chunk_tokens)
            .clamp(1, chunk_tokens.max(1));
        let c: Contexts = self.req(
            "contexts",
            json!({
                "n_ctx": n_ctx,
                "n_batch": chunk_tokens,
                "n_ubatch": ubatch,
                "n_seq_max": n_seq.max(1),
                "kv_unified": n_seq > 1,
                "flash_attn": self.cfg.flash_attn,
                "type_k": self.cfg.type_k,
                "type_v": self.cfg.type_v,
            }),
        )?;
        self.n_ctx = Some(c.n_ctx);
        self.graph = None;
        self.sweep = None;
        self.state = None;
        Ok(())
    }

    /// A decode of `tokens` on sequence 0 at `pos0` in `mode`'s context (no restore).
    fn decode(
        &mut self,
        mode: Mode,
        tokens: &[i32],
        pos0: u32,
        all_logits: bool,
        observe_as: &str,
    ) -> Result<Decoded, EngineError> {
        let req = json!({"ctx": ctx_name(mode), "observe": observe_as, "tokens": tokens,
                         "pos0": pos0, "all_logits": all_logits});
        self.observed("decode", req, observe_as)
    }

    /// A `decode` or `step` request; a TIMED one asks for the expert ids while
    /// [`OpTimer::capture_routing`] runs, and keeps them.
    fn observed(
        &mut self,
        op: &str,
        mut req: Value,
        observe_as: &str,
    ) -> Result<Decoded, EngineError> {
        let ids = self.capture_ids && observe_as == "timed";
        if ids {
            req["capture_ids"] = true.into();
        }
        let mut d: Decoded = self.req(op, req)?;
        if self.device_clock() {
            d.device = Some(self.device_timing(&d, observe_as)?);
        }
        if ids {
            self.ids = d.ids.take().ok_or_else(|| {
                EngineError::Worker(format!(
                    "the llama.cpp worker {}: a TIMED decode asked for its expert ids answered none",
                    self.cfg.worker.display()
                ))
            })?;
        }
        Ok(d)
    }

    /// The device's clock is on: ggml-vulkan's perf logger (`GGML_VK_PERF_LOGGER` in the
    /// worker's environment, as its hello reports it) prints every graph's op times on the
    /// worker's stderr, and the worker (protocol 4) marks each run's bounds and each TIMED
    /// node's end there (PROTOCOL.md "The device's clock").
    fn device_clock(&self) -> bool {
        self.proc.hello().llama.env.contains_key(DEVICE_CLOCK_ENV)
    }

    /// The last request's run on the device's clock, from the lines between its markers.
    fn device_timing(&self, d: &Decoded, observe_as: &str) -> Result<DeviceTiming, EngineError> {
        let worker = || self.cfg.worker.display().to_string();
        if let Some(f) = self
            .proc
            .hello()
            .llama
            .env
            .get("GGML_VK_PERF_LOGGER_FREQUENCY")
        {
            if f.trim() != "1" {
                return Err(EngineError::Failed(format!(
                    "the device's clock needs every graph's op times: GGML_VK_PERF_LOGGER_FREQUENCY={f} in the worker's environment prints them every {f} graphs (unset it)"
                )));
            }
        }
        if self
            .proc
            .hello()
            .llama
            .env
            .contains_key("GGML_VK_PERF_LOGGER_CONCURRENT")
        {
            return Err(EngineError::Failed(
                "the device's clock times op by op: GGML_VK_PERF_LOGGER_CONCURRENT in the worker's environment times groups between sync points instead (unset it)".into(),
            ));
        }
        let lines = self
            .proc
            .device_log(self.proc.last_request_id(), DEVICE_LOG_WAIT)
            .map_err(|why| {
                EngineError::Worker(format!("the llama.cpp worker {}: {why}", worker()))
            })?;
        let timed = (observe_as == "timed").then(|| d.node_ns.as_ref().map_or(0, Vec::len));
        opledger_core::device_clock::parse_run(&lines, timed).map_err(|why| {
            EngineError::Worker(format!(
                "the llama.cpp worker {}: its device-clock lines: {why}",
                worker()
            ))
        })
    }

    /// One decode step: token `tokens[s]` for sequence `first_seq + s` at `pos`.
    fn step(
        &mut self,
        mode: Mode,
        tokens: &[i32],
        pos: u32,
        first_seq: u32,
        observe_as: &str,
    ) -> Result<Decoded, EngineError> {
        let req = json!({"ctx": ctx_name(mode), "observe": observe_as, "tokens": tokens,
                         "pos": pos, "first_seq": first_seq});
        self.observed("step", req, observe_as)
    }

    /// Restores the prepared state into `ctx` (an empty context where there is none).
    fn restore(&mut self, ctx: &str) -> Result<(), EngineError> {
        match self.state {
            Some(scope) => {
                let _: Done = self.req(
                    "restore",
                    json!({"ctx": ctx, "scope": scope, "from": "plain"}),
                )?;
            }
            None => {
                let _: Done = self.req("clear", json!({"ctx": ctx}))?;
            }
        }
        Ok(())
    }

    /// The check "outputs finite", as every engine applies it.
    fn check_finite(what: &str, d: &Decoded) -> Result<(), EngineError> {
        if d.non_finite > 0 {
            return Err(EngineError::NonFiniteOutputs {
                what: what.to_string(),
                non_finite: d.non_finite,
                values: d.values,
            });
        }
        Ok(())
    }

    /// The run's timing checked against the captured graph ; a graph
    /// that changed between runs is the worker's failure.
    fn timing(
        &self,
        mode: Mode,
        d: &Decoded,
        graph: Option<&Captured>,
        hash: u64,
    ) -> Result<ChunkTiming, EngineError> {
        self.timing_inner(mode, d, graph, hash)
            .map_err(|e| self.graph_changed(e))
    }

    /// A graph that changed between runs is the worker's failure.
    fn graph_changed(&self, e: EngineError) -> EngineError {
        match e {
            EngineError::GraphChanged(why) => EngineError::Worker(format!(
                "the llama.cpp worker {}: the graph changed between runs: {why}",
                self.cfg.worker.display()
            )),
            e => e,
        }
    }

    fn timing_inner(
        &self,
        mode: Mode,
        d: &Decoded,
        graph: Option<&Captured>,
        hash: u64,
    ) -> Result<ChunkTiming, EngineError> {
        let wall_ms = d.wall_ns as f64 / 1e6;
        if mode == Mode::Fused {
            return Ok(ChunkTiming {
                device: d.device.clone(),
                wall_ms,
                node_us: Vec::new(),
                nodes_seen: 0,
                output_hash: hash,
            });
        }
        let nodes_seen = d.nodes_seen.ok_or_else(|| {
            EngineError::Worker(format!(
                "the llama.cpp worker {}: an observed run without its node count",
                self.cfg.worker.display()
            ))
        })?;
        if let Some(g) = graph {
            if nodes_seen as usize != g.ops.len() {
                return Err(EngineError::GraphChanged(format!(
                    "{} mode saw {nodes_seen} nodes, the captured graph has {}",
                    mode.label(),
                    g.ops.len()
                )));
            }
        }
        let mut node_us = Vec::new();
        if mode == Mode::Timed {
            let ns = d.node_ns.as_deref().unwrap_or(&[]);
            if ns.len() != nodes_seen as usize {
                return Err(EngineError::GraphChanged(format!(
                    "TIMED mode asked about {nodes_seen} nodes but observed {}",
                    ns.len()
                )));
            }
            if let (Some(g), Some(ops)) = (graph, d.ops.as_ref()) {
                if *ops != g.ops {
                    let at = g.ops.iter().zip(ops).position(|(a, b)| a != b).unwrap_or(0);
                    return Err(EngineError::GraphChanged(format!(
                        "TIMED mode computed a different op at node {at} than the captured graph"
                    )));
                }
            }
            node_us = ns.iter().map(|&n| n as f64 / 1e3).collect();
            if let Some(g) = graph.filter(|g| g.split()) {
                // a graph over several devices: each transfer is the gap before the node it
                // feeds, the outputs read back the tail after the last node
                let gap_us: Vec<f64> = d
                    .gap_ns
                    .as_deref()
                    .unwrap_or(&[])
                    .iter()
                    .map(|&n| n as f64 / 1e3)
                    .collect();
                if gap_us.len() != node_us.len() {
                    return Err(EngineError::GraphChanged(format!(
                        "TIMED mode timed {} nodes but {} gaps between them",
                        node_us.len(),
                        gap_us.len()
                    )));
                }
                let tail_us = d.tail_ns.unwrap_or(0) as f64 / 1e3;
                node_us = opledger_core::split::slot_times(&g.slots, &node_us, &gap_us, tail_us);
            }
        }
        // the device's figures at the graph's positions (a transfer's and the outputs': none)
        let device = d.device.clone().map(|t| match graph.filter(|g| g.split()) {
            Some(g) if mode == Mode::Timed => t.placed(
                &g.slots
                    .iter()
                    .map(|s| match *s {
                        Slot::Node(i) => Some(i),
                        _ => None,
                    })
                    .collect::<Vec<_>>(),
            ),
            _ => t,
        });
        Ok(ChunkTiming {
            device,
            wall_ms,
            node_us,
            nodes_seen,
            output_hash: hash,
        })
    }

    /// A prefill run: restore, decode the chunk, hash.
    fn run_chunk(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("run() before prepare()".into()))?;
        self.restore(ctx_name(mode))?;
        let chunk = std::mem::take(&mut self.chunk);
        let d = self.decode(
            mode,
            &chunk,
            work.depth_tokens,
            work.all_logits,
            observe(mode),
        );
        self.chunk = chunk;
        let d = d?;
        Self::check_finite(&format!("the {} run", mode.label()), &d)?;
        let hash = chunk_hash(&d, work.all_logits);
        let graph = self.graph.clone();
        self.timing(mode, &d, graph.as_ref(), hash)
    }

    /// Decode steps from `depth`: `steps` tokens per sequence, node times summed over the steps.
    #[allow(clippy::too_many_arguments)]
    fn run_steps(
        &mut self,
        mode: Mode,
        steps: u32,
        tokens_of: &dyn Fn(u32) -> Vec<i32>,
        pos_of: &dyn Fn(u32) -> u32,
        first_seq: u32,
        graph: Option<&Captured>,
        what: &str,
    ) -> Result<ChunkTiming, EngineError> {
        let mut total = ChunkTiming {
            device: None,
            wall_ms: 0.0,
            node_us: Vec::new(),
            nodes_seen: 0,
            output_hash: 0,
        };
        for step in 0..steps {
            let tokens = tokens_of(step);
            let d = self.step(mode, &tokens, pos_of(step), first_seq, observe(mode))?;
            Self::check_finite(
                &format!("decode step {step} of the {} {what}", mode.label()),
                &d,
            )?;
            let hash = d.row_hashes.iter().fold(0u64, |h, r| h.rotate_left(7) ^ r);
            let t = self.timing(mode, &d, graph, hash)?;
            total.wall_ms += t.wall_ms;
            total.output_hash = total.output_hash.rotate_left(3) ^ t.output_hash;
            total.nodes_seen = t.nodes_seen;
            if let Some(dt) = &t.device {
                total.device.get_or_insert_with(Default::default).add(dt);
            }
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

    fn run_decode(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("run() before prepare()".into()))?;
        self.restore(ctx_name(mode))?;
        let vocab = self.vocab();
        let graph = self.graph.clone();
        let w = work.clone();
        self.run_steps(
            mode,
            work.decode_tokens,
            &|step| decode_step_tokens(w.token_seed, w.depth_tokens, step, w.parallel, vocab),
            &|step| w.depth_tokens + step,
            0,
            graph.as_ref(),
            "run",
        )
    }

    /// Prepares a prefill chunk: contexts for the depth, the chunk and `room` more tokens, the
    /// context filled to the depth and saved.
    fn prepare_prefill(&mut self, work: &Work, room: u32) -> Result<(), EngineError> {
        self.outputs = None;
        let needed = work.depth_tokens as u64 + work.chunk_tokens as u64 + room as u64;
        self.contexts(needed, work.chunk_tokens, 1)?;
        let _: Done = self.req("clear", json!({"ctx": "plain"}))?;
        if work.depth_tokens > 0 {
            let fill = filler_tokens(work.token_seed, 0, work.depth_tokens, self.vocab());
            self.decode(Mode::Fused, &fill, 0, false, "none")?;
            let _: Saved = self.req("save", json!({"ctx": "plain", "scope": "seq0"}))?;
            self.state = Some("seq0");
        }
        self.chunk = filler_tokens(
            work.token_seed,
            work.depth_tokens,
            work.chunk_tokens,
            self.vocab(),
        );
        self.work = Some(work.clone());
        Ok(())
    }

    fn prepare_decode(&mut self, work: &Work) -> Result<(), EngineError> {
        self.outputs = None;
        let n_seq = work.parallel.max(1);
        let fill_batch = work.chunk_tokens.max(n_seq).max(1);
        let needed = work.depth_tokens as u64 + n_seq as u64 * work.decode_tokens as u64 + 1;
        self.contexts(needed, fill_batch, n_seq)?;
        let _: Done = self.req("clear", json!({"ctx": "plain"}))?;
        if work.depth_tokens > 0 {
            let fill = filler_tokens(work.token_seed, 0, work.depth_tokens, self.vocab());
            self.decode(Mode::Fused, &fill, 0, false, "none")?;
            for s in 1..n_seq {
                let _: Done = self.req("seq_cp", json!({"ctx": "plain", "src": 0, "dst": s}))?;
            }
            let _: Saved = self.req("save", json!({"ctx": "plain", "scope": "full"}))?;
            self.state = Some("full");
        }
        self.chunk = Vec::new();
        self.work = Some(work.clone());
        Ok(())
    }

    fn sweep_tokens(&self, work: &Work, index: u32) -> Result<(Vec<i32>, u32), EngineError> {
        let pos0 = index
            .checked_mul(work.chunk_tokens)
            .ok_or_else(|| EngineError::Failed(format!("chunk {index} lies beyond 2^32 tokens")))?;
        Ok((
            filler_tokens(work.token_seed, pos0, work.chunk_tokens, self.vocab()),
            pos0,
        ))
    }

    fn capture(&self, d: &Decoded) -> Result<(Vec<NodeInfo>, Captured), EngineError> {
        let wire = d.nodes.as_deref().ok_or_else(|| {
            EngineError::Worker(format!(
                "the llama.cpp worker {}: a capture without its nodes",
                self.cfg.worker.display()
            ))
        })?;
        let nodes = crate::protocol::node_infos(wire, Some(self.devices())).map_err(|why| {
            EngineError::Worker(format!(
                "the llama.cpp worker {}: {why}",
                self.cfg.worker.display()
            ))
        })?;
        let ops = nodes.iter().map(|n| n.op_code.unwrap_or(0)).collect();
        let all_threads: Vec<bool> = wire.iter().map(|n| n.threads > 1).collect();
        let dispatch = opledger_core::calibration::dispatch_of(&nodes, &all_threads);
        let on_cpu = wire
            .iter()
            .map(|n| n.device.as_deref().is_none_or(|d| d == "CPU"))
            .collect();
        // a graph over several devices: the copies between them as transfer nodes
        let (nodes, slots) = opledger_core::split::with_transfers(nodes);
        Ok((
            nodes,
            Captured {
                ops,
                slots,
                dispatch,
                on_cpu,
            },
        ))
    }

    /// ggml's devices as the load left them (the hello's for a worker that lists none there).
    fn devices(&self) -> &[Device] {
        devices_of(self.proc.hello(), &self.loaded)
    }
}

/// ggml's devices as the load left them (the hello's for a worker that lists none there).
fn devices_of<'a>(h: &'a Hello, loaded: &'a Loaded) -> &'a [Device] {
    if loaded.devices.is_empty() {
        h.llama.devices.as_slice()
    } else {
        loaded.devices.as_slice()
    }
}

/// What a worker engine says of itself ([`Engine::info`]): the settings it loaded with
/// (`cfg`), its hello's build, the devices its load left (`loaded`) and backend environment
/// ([`recorded_settings`]), the binary's BLAKE3 (`worker_hash`) and the context size
/// (`n_ctx`, once created). The backend is the first local GPU's when layers are offloaded to
/// one, else the CPU.
pub fn worker_info(
    cfg: &WorkerConfig,
    h: &Hello,
    loaded: &Loaded,
    worker_hash: &str,
    n_ctx: Option<u32>,
) -> EngineInfo {
    let l = &h.llama;
    let devices = devices_of(h, loaded);
    let mut settings = BTreeMap::new();
    settings.insert("flash_attn".into(), cfg.flash_attn.clone());
    settings.insert("gpu_layers".into(), cfg.gpu_layers.to_string());
    settings.insert("swa_full".into(), "false".into());
    settings.insert("weight_repack".into(), (!cfg.no_repack).to_string());
    if let Some(u) = cfg.ubatch {
        settings.insert("ubatch".into(), u.to_string());
    }
    if let Some(t) = &cfg.type_k {
        settings.insert("type_k".into(), t.clone());
    }
    if let Some(t) = &cfg.type_v {
        settings.insert("type_v".into(), t.clone());
    }
    settings.insert("system_info".into(), l.system_info.clone());
    settings.insert("model_description".into(), loaded.description.clone());
    if let Some(n) = n_ctx {
        settings.insert("n_ctx".into(), n.to_string());
    }
    settings.insert("worker".into(), cfg.worker.display().to_string());
    settings.insert("worker_blake3".into(), worker_hash.to_string());
    settings.insert("worker_protocol".into(), h.version.to_string());
    settings.insert("llama_commit".into(), l.commit.clone());
    settings.insert("llama_build".into(), l.build.clone());
    settings.insert("ggml_commit".into(), l.ggml_commit.clone());
    settings.insert("compiler".into(), l.compiler.clone());
    settings.insert("build_options".into(), l.build_options.clone());
    settings.extend(recorded_settings(h, devices));
    if let Some(r) = &cfg.rpc {
        settings.insert("rpc".into(), r.servers.join(","));
        let split: Vec<String> = r.layers.iter().map(|l| l.to_string()).collect();
        settings.insert("rpc_split".into(), split.join(","));
    }
    // the backend of the offloaded layers: the first GPU that is not a remote server's
    let gpu = devices
        .iter()
        .find(|d| d.kind == "gpu" && !opledger_core::split::is_remote(&d.name));
    EngineInfo {
        engine: "llama.cpp".into(),
        version: format!("worker: {}", h.build_label()),
        backend: match gpu {
            Some(d) if cfg.gpu_layers != 0 => d.name.clone(),
            _ => "CPU".into(),
        },
        threads: cfg.threads,
        settings,
    }
}

impl Engine for WorkerEngine {
    fn info(&self) -> EngineInfo {
        let mut info = worker_info(
            &self.cfg,
            self.proc.hello(),
            &self.loaded,
            &self.worker_hash,
            self.n_ctx,
        );
        info.settings.extend(self.build.clone());
        info
    }

    fn prepare(&mut self, work: &Work) -> Result<(), EngineError> {
        if work.is_decode() {
            return self.prepare_decode(work);
        }
        self.prepare_prefill(work, 0)
    }

    fn graph(&mut self) -> Result<Vec<NodeInfo>, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("graph() before prepare()".into()))?;
        self.restore("observed")?;
        let d = if work.is_decode() {
            let tokens = decode_step_tokens(
                work.token_seed,
                work.depth_tokens,
                0,
                work.parallel,
                self.vocab(),
            );
            self.step(
                Mode::FusedObserved,
                &tokens,
                work.depth_tokens,
                0,
                "capture",
            )?
        } else {
            let chunk = std::mem::take(&mut self.chunk);
            let d = self.decode(
                Mode::FusedObserved,
                &chunk,
                work.depth_tokens,
                work.all_logits,
                "capture",
            );
            self.chunk = chunk;
            d?
        };
        let (nodes, captured) = self.capture(&d)?;
        self.graph = Some(captured);
        Ok(nodes)
    }

    fn run(&mut self, mode: Mode) -> Result<ChunkTiming, EngineError> {
        self.last_mode = Some(mode);
        self.last_rows = None;
        if self.work.as_ref().is_some_and(|w| w.is_decode()) {
            self.run_decode(mode)
        } else {
            self.run_chunk(mode)
        }
    }

    fn supports(&self, c: Capability) -> bool {
        match c {
            // a split model's remote nodes live on servers the worker has no backend for here
            Capability::OpTiming => self.cfg.rpc.is_none(),
            // a split over RPC servers: a remote node's clones would each be a network round
            // trip, and the worker refuses them (see `refusal`)
            Capability::Replay => self.cfg.rpc.is_none(),
            _ => matches!(
                c,
                Capability::Decode
                    | Capability::Logits
                    | Capability::Sweep
                    | Capability::GraphCapture
                    | Capability::Outputs
            ),
        }
    }

    fn routed_experts(&mut self) -> Result<Option<BTreeMap<u32, u32>>, EngineError> {
        let ids = self.capture_routing()?;
        Ok(Some(
            ids.into_iter()
                .map(|(i, ids)| (i, opledger_core::ops::distinct_experts(&ids)))
                .collect(),
        ))
    }

    /// The shared GEMM probe (`opledger_core::peaks`) timed alone on the device of the engine's
    /// backend: the first local GPU where layers are offloaded to one, else the CPU.
    fn gemm_peak(&mut self) -> Result<Option<(f64, String)>, EngineError> {
        let mut node = opledger_core::peaks::gemm_probe(None);
        let backend = self.info().backend;
        node.device = (backend != "CPU").then_some(backend);
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

    fn refusal(&self, c: Capability) -> Option<String> {
        (c == Capability::Replay && self.cfg.rpc.is_some()).then(|| {
            "the model is split over RPC servers, and a remote node's clones would each be a \
             network round trip timed with the node"
                .to_string()
        })
    }

    fn isolation_cost_us(&mut self) -> Result<Option<f64>, EngineError> {
        Ok(self.calibrate_isolation()?.map(|c| c.per_node_us))
    }

    fn calibrate_isolation(&mut self) -> Result<Option<IsolationCalibration>, EngineError> {
        let graph = self.graph.clone();
        self.calibrate_graph(graph)
    }

    fn as_replay(&mut self) -> Option<&mut dyn ReplayEngine> {
        if self.cfg.rpc.is_some() {
            return None;
        }
        Some(self)
    }

    fn logits(&mut self) -> Result<Vec<Vec<f32>>, EngineError> {
        let (Some(mode), Some(work)) = (self.last_mode, self.work.clone()) else {
            return Err(EngineError::Failed("logits() before a run".into()));
        };
        let rows: Vec<i32> = if let Some(n) = self.last_rows {
            (0..n as i32).collect()
        } else if work.is_decode() {
            (0..work.parallel.max(1) as i32).collect()
        } else {
            vec![-1]
        };
        let l: Logits = self.req("logits", json!({"ctx": ctx_name(mode), "rows": rows}))?;
        Ok(l.rows
            .into_iter()
            .map(|r| r.into_iter().map(|v| v.unwrap_or(f32::NAN)).collect())
            .collect())
    }

    fn load_ms(&self) -> Option<f64> {
        Some(self.loaded.load_ms)
    }

    fn as_sweep(&mut self) -> Option<&mut dyn SweepEngine> {
        Some(self)
    }

    fn as_graph_capturer(&mut self) -> Option<&mut dyn GraphCapturer> {
        Some(self)
    }

    fn as_output_reader(&mut self) -> Option<&mut dyn OutputReader> {
        Some(self)
    }

    fn as_op_timer(&mut self) -> Option<&mut dyn OpTimer> {
        if self.cfg.rpc.is_some() {
            return None;
        }
        Some(self)
    }
}

/// The output gate's reads, on the plain context (no instrument): the chunk decoded with every
/// position's logits, rows read by index (`logits`, null where not finite: NaN here, which the
/// gate counts), then greedy `step`s on sequence 0.
impl OutputReader for WorkerEngine {
    fn decode_outputs(&mut self, work: &Work, steps: u32) -> Result<u32, EngineError> {
        let w = Work {
            decode_tokens: 0,
            parallel: 1,
            all_logits: true,
            ..work.clone()
        };
        self.prepare_prefill(&w, steps)?;
        self.restore("plain")?;
        let chunk = std::mem::take(&mut self.chunk);
        let d = self.decode(Mode::Fused, &chunk, w.depth_tokens, true, "none");
        self.chunk = chunk;
        d?;
        // the prepared state is gone: a run must prepare again
        self.work = None;
        self.outputs = Some((w.chunk_tokens, w.depth_tokens + w.chunk_tokens));
        Ok(w.chunk_tokens)
    }

    fn output_rows(&mut self, first: u32, count: u32) -> Result<Vec<Vec<f32>>, EngineError> {
        let Some((positions, _)) = self.outputs else {
            return Err(EngineError::Failed(
                "output_rows() before decode_outputs()".into(),
            ));
        };
        if first.saturating_add(count) > positions {
            return Err(EngineError::Failed(format!(
                "rows {first}..{} of a chunk of {positions}",
                first.saturating_add(count)
            )));
        }
        let rows: Vec<u32> = (first..first + count).collect();
        let l: Logits = self.req("logits", json!({"ctx": "plain", "rows": rows}))?;
        Ok(l.rows
            .into_iter()
            .map(|r| r.into_iter().map(|v| v.unwrap_or(f32::NAN)).collect())
            .collect())
    }

    fn greedy_step(&mut self, token: u32) -> Result<Vec<f32>, EngineError> {
        let Some((positions, pos)) = self.outputs else {
            return Err(EngineError::Failed(
                "greedy_step() before decode_outputs()".into(),
            ));
        };
        let token = i32::try_from(token)
            .ok()
            .filter(|&t| (t as u32) < self.vocab())
            .ok_or_else(|| {
                EngineError::Failed(format!(
                    "greedy token {token} lies outside the vocabulary of {}",
                    self.vocab()
                ))
            })?;
        self.step(Mode::Fused, &[token], pos, 0, "none")?;
        self.outputs = Some((positions, pos + 1));
        let l: Logits = self.req("logits", json!({"ctx": "plain", "rows": [0]}))?;
        l.rows
            .into_iter()
            .next()
            .map(|r| r.into_iter().map(|v| v.unwrap_or(f32::NAN)).collect())
            .ok_or_else(|| {
                EngineError::Worker(format!(
                    "the llama.cpp worker {}: a greedy step's logits came back without a row",
                    self.cfg.worker.display()
                ))
            })
    }
}

impl OpTimer for WorkerEngine {
    /// The expert ids every MUL_MAT_ID node routes in a real TIMED run of the prepared work (of
    /// a decode run, its last step): (node index in the reported graph, ids `[n_used,
    /// n_tokens]`).
    fn capture_routing(&mut self) -> Result<Vec<(u32, Vec<i32>)>, EngineError> {
        self.capture_ids = true;
        self.ids.clear();
        let run = self.run(Mode::Timed);
        self.capture_ids = false;
        let ids = std::mem::take(&mut self.ids);
        run?;
        // a graph over several devices reports transfers between its nodes: the observed
        // node's position in the reported graph
        let slots = self
            .graph
            .as_ref()
            .map(|g| g.slots.as_slice())
            .unwrap_or(&[]);
        ids.into_iter()
            .map(|w| {
                let at = if slots.is_empty() {
                    Some(w.node as usize)
                } else {
                    slots
                        .iter()
                        .position(|s| *s == opledger_core::split::Slot::Node(w.node as usize))
                };
                at.map(|i| (i as u32, w.ids)).ok_or_else(|| {
                    EngineError::Worker(format!(
                        "the llama.cpp worker {}: expert ids of node {}, which the captured graph does not hold",
                        self.cfg.worker.display(),
                        w.node
                    ))
                })
            })
            .collect()
    }

    /// Times one node of the captured graph alone in the worker, on the node's own device (see
    /// PROTOCOL.md, `time_op`): integer sources get in-range indices
    /// (`opledger_core::ops::int_source_values`, an expert matmul the routing asked for), the
    /// worker answers every repetition, and the summary is opledger's ([`OpTime::of_reps`]).
    fn time_node(&mut self, node: &NodeInfo, req: &OpTimeRequest) -> Result<OpTime, EngineError> {
        if node.out.ne.contains(&0) {
            // an op over no elements (a state copy of zero sequences, say) does nothing
            return Ok(OpTime {
                median_us: 0.0,
                min_us: 0.0,
                max_us: 0.0,
                reps: 0,
                rotation: 0,
                weight_buffer: String::new(),
            });
        }
        let ints: Vec<Option<Vec<i64>>> = node
            .srcs
            .iter()
            .enumerate()
            .map(|(slot, s)| {
                s.as_ref()
                    .filter(|t| matches!(t.ggml_type.as_str(), "i32" | "i64"))
                    .map(|t| {
                        let count = t.ne.iter().map(|&n| n.max(1) as usize).product();
                        opledger_core::ops::int_source_values(node, slot, count, req.routing)
                    })
            })
            .collect();
        let t: TimedOp = self.req(
            "time_op",
            json!({
                "node": crate::protocol::time_op_node(node),
                "ints": ints,
                "reps": req.reps.max(1),
                "rotate_bytes": req.rotate_bytes,
                "flush_bytes": req.flush_bytes,
                "repack": !self.cfg.no_repack,
            }),
        )?;
        let us: Vec<f64> = t.ns.iter().map(|&n| n as f64 / 1e3).collect();
        OpTime::of_reps(&us, t.rotation, &t.weight_buffer).ok_or_else(|| {
            EngineError::Worker(format!(
                "the llama.cpp worker {}: timing node {} ({}) alone answered no repetition",
                self.cfg.worker.display(),
                node.index,
                node.op
            ))
        })
    }
}

impl SweepEngine for WorkerEngine {
    fn prepare_sweep(
        &mut self,
        work: &Work,
        chunks: u32,
        decode: Option<(u32, u32)>,
    ) -> Result<(), EngineError> {
        if chunks == 0 {
            return Err(EngineError::Failed("a sweep of no chunks".into()));
        }
        let (steps, parallel) = decode.unwrap_or((0, 0));
        let needed = chunks as u64 * work.chunk_tokens as u64
            + steps as u64 * parallel as u64
            + u64::from(decode.is_some());
        self.contexts(needed, work.chunk_tokens, 1 + parallel)?;
        let first = Work {
            depth_tokens: 0,
            ..work.clone()
        };
        self.chunk = self.sweep_tokens(&first, 0)?.0;
        self.state = None;
        self.work = Some(first);
        self.sweep = Some(PassOrder::new(chunks, decode));
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
            self.vocab(),
        );
        let _: Done = self.req("clear", json!({"ctx": ctx_name(mode)}))?;
        if !fill.is_empty() {
            let obs = if mode == Mode::Fused { "none" } else { "count" };
            self.decode(mode, &fill, 0, false, obs)?;
        }
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
        let d = self.decode(mode, &tokens, pos0, work.all_logits, observe(mode))?;
        // logits() reads this mode's context: the chunk's last token
        self.last_mode = Some(mode);
        self.last_rows = None;
        Self::check_finite(&format!("the {} run", mode.label()), &d)?;
        let hash = chunk_hash(&d, work.all_logits);
        if let Some(s) = self.sweep.as_mut() {
            s.set_next(mode, index + 1);
        }
        let graph = self.graph.clone();
        self.timing(mode, &d, graph.as_ref(), hash)
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
        let vocab = self.vocab();
        let depth = (after_chunk + 1) * work.chunk_tokens;
        let ctx = ctx_name(mode);
        for s in 1..=parallel {
            let _: Done = self.req("seq_cp", json!({"ctx": ctx, "src": 0, "dst": s}))?;
        }
        let graph = self.decode_graph.clone();
        let seed = work.token_seed;
        let result = self.run_steps(
            mode,
            steps,
            &|step| sweep_step_tokens(seed, depth + step, parallel, vocab),
            &|step| depth + step,
            1,
            graph.as_ref(),
            "decode step",
        );
        // the pass continues from sequence 0 as it was
        for s in 1..=parallel {
            let _: Done = self.req("seq_rm", json!({"ctx": ctx, "seq": s}))?;
        }
        // logits() reads the last step's rows, one per forked sequence
        self.last_mode = Some(mode);
        self.last_rows = Some(parallel);
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
        let vocab = self.vocab();
        let (chunk, pos0) = self.sweep_tokens(&work, 0)?;
        let tokens = sweep_step_tokens(work.token_seed, pos0 + work.chunk_tokens, parallel, vocab);
        let _: Done = self.req("clear", json!({"ctx": "observed"}))?;
        self.decode(Mode::FusedObserved, &chunk, pos0, false, "count")?;
        for s in 1..=parallel {
            let _: Done = self.req("seq_cp", json!({"ctx": "observed", "src": 0, "dst": s}))?;
        }
        let d = self.step(
            Mode::FusedObserved,
            &tokens,
            pos0 + work.chunk_tokens,
            1,
            "capture",
        )?;
        let _: Done = self.req("clear", json!({"ctx": "observed"}))?;
        let (nodes, captured) = self.capture(&d)?;
        self.decode_graph = Some(captured);
        if let Some(s) = self.sweep.as_mut() {
            s.reset();
        }
        Ok(nodes)
    }

    fn calibrate_sweep_decode(&mut self) -> Result<Option<IsolationCalibration>, EngineError> {
        let graph = self.decode_graph.clone();
        self.calibrate_graph(graph)
    }
}

impl GraphCapturer for WorkerEngine {
    /// The graph of `work` described by a decode that stops after its first node (the worker's
    /// abort callback), after filling the context to the depth; the whole chunk is run where the
    /// capture did not reach the logits.
    fn capture_graph(&mut self, work: &Work) -> Result<GraphCapture, EngineError> {
        let t0 = Instant::now();
        let needed = work.depth_tokens as u64 + work.chunk_tokens.max(1) as u64;
        self.contexts(needed, work.chunk_tokens, 1)?;
        self.work = None;
        let vocab = self.vocab();
        let _: Done = self.req("clear", json!({"ctx": "observed"}))?;
        if work.depth_tokens > 0 {
            let fill = filler_tokens(work.token_seed, 0, work.depth_tokens, vocab);
            self.decode(Mode::FusedObserved, &fill, 0, false, "count")?;
            let _: Saved = self.req("save", json!({"ctx": "observed", "scope": "seq0"}))?;
        }
        let chunk = filler_tokens(work.token_seed, work.depth_tokens, work.chunk_tokens, vocab);
        let d: Decoded = self.req(
            "decode",
            json!({"ctx": "observed", "observe": "capture", "tokens": chunk,
                   "pos0": work.depth_tokens, "all_logits": work.all_logits,
                   "abort_after_first": true}),
        )?;
        let (mut nodes, _) = self.capture(&d)?;
        let mut computed = if d.aborted { 1 } else { nodes.len() as u32 };
        let last = nodes
            .iter()
            .rev()
            .find(|n| n.op != opledger_core::split::TRANSFER_OP);
        if last.is_none_or(|n| n.name != "result_output") {
            if work.depth_tokens > 0 {
                let _: Done = self.req("restore", json!({"ctx": "observed", "scope": "seq0"}))?;
            } else {
                let _: Done = self.req("clear", json!({"ctx": "observed"}))?;
            }
            let d = self.decode(
                Mode::FusedObserved,
                &chunk,
                work.depth_tokens,
                work.all_logits,
                "capture",
            )?;
            nodes = self.capture(&d)?.0;
            computed = nodes.len() as u32;
        }
        self.graph = None;
        Ok(GraphCapture {
            nodes,
            filled_tokens: work.depth_tokens,
            chunk_nodes_computed: computed,
            wall_ms: t0.elapsed().as_secs_f64() * 1e3,
        })
    }
}

/// What a manifest records of a worker's devices and backend settings, from its hello and the
/// devices its load left (`devices`): every device with its description, kind and memory; the
/// registered backends; the worker's `GGML_*` / `CUDA_*` / `LLAMA_*` environment; with a CUDA
/// backend, what is known of CUDA graphs ([`cuda_graphs`]) and the NVIDIA driver of this
/// machine (`/proc/driver/nvidia/version`).
pub fn recorded_settings(h: &Hello, devices: &[Device]) -> BTreeMap<String, String> {
    let l = &h.llama;
    let mut settings = BTreeMap::new();
    settings.insert("backends".into(), l.backends.join(","));
    let list: Vec<String> = devices
        .iter()
        .map(|d| {
            opledger_core::engine::device_line(
                &d.name,
                &d.description,
                &d.kind,
                d.memory_total,
                d.memory_free,
            )
        })
        .collect();
    settings.insert("devices".into(), list.join("; "));
    let env: Vec<String> = l.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    settings.insert(
        "worker_env".into(),
        if env.is_empty() {
            "none".into()
        } else {
            env.join(" ")
        },
    );
    if l.backends.iter().any(|b| b == "CUDA") {
        settings.insert("cuda_graphs".into(), cuda_graphs(l));
        let driver = std::fs::read_to_string("/proc/driver/nvidia/version")
            .ok()
            .and_then(|t| t.lines().next().map(|l| l.trim().to_string()))
            .unwrap_or_else(|| "unknown (no /proc/driver/nvidia/version)".into());
        settings.insert("driver".into(), driver);
    }
    settings
}

/// What a manifest may say of CUDA graphs in a worker with a CUDA backend. Whether ggml ran a
/// graph through CUDA graphs is reported by no llama.cpp or ggml API (ggml also turns them off
/// by itself, per graph, for reasons it does not report), so a run says `unknown` with what was
/// requested: `GGML_CUDA_DISABLE_GRAPHS` in the worker's environment (ggml reads its presence,
/// whatever its value) asks for them off, its absence leaves ggml's default. Only a build
/// configured with `GGML_CUDA_GRAPHS=OFF` has none to run: that is the build's fact, stated as
/// such.
pub fn cuda_graphs(l: &crate::protocol::LlamaBuild) -> String {
    // CMake's false values, as the worker's CMakeLists writes the option (`NAME=VALUE`)
    let built_without = l.build_options.split_whitespace().find(|o| {
        o.strip_prefix("GGML_CUDA_GRAPHS=").is_some_and(|v| {
            ["OFF", "0", "NO", "FALSE", "N"]
                .iter()
                .any(|f| v.eq_ignore_ascii_case(f))
        })
    });
    if let Some(option) = built_without {
        return format!("off (built with {option})");
    }
    let requested = match l.env.get("GGML_CUDA_DISABLE_GRAPHS") {
        Some(v) => format!("GGML_CUDA_DISABLE_GRAPHS={v} was set"),
        None => "GGML_CUDA_DISABLE_GRAPHS was not set".into(),
    };
    format!("unknown (not reported by the backend; {requested})")
}

/// A prefill chunk's hash from its rows' : every token's row folded
/// in, or the last token's alone.
fn chunk_hash(d: &Decoded, all_logits: bool) -> u64 {
    rows_hash(&d.row_hashes, all_logits)
}

fn rows_hash(row_hashes: &[u64], all_logits: bool) -> u64 {
    if all_logits {
        row_hashes.iter().fold(0u64, |h, r| h.rotate_left(5) ^ r)
    } else {
        row_hashes.first().copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::LlamaBuild;

    fn hello(backends: &[&str], build_options: &str, env: &[(&str, &str)]) -> Hello {
        Hello {
            protocol: crate::protocol::PROTOCOL_NAME.into(),
            version: crate::protocol::PROTOCOL_VERSION as u64,
            llama: LlamaBuild {
                backends: backends.iter().map(|b| b.to_string()).collect(),
                build_options: build_options.into(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
                ..LlamaBuild::default()
            },
        }
    }

    #[test]
    fn the_manifest_says_what_was_asked_of_cuda_graphs_not_that_they_ran() {
        let gpu = Device {
            name: "CUDA0".into(),
            description: "NVIDIA H200".into(),
            kind: "gpu".into(),
            memory_total: 3 << 30,
            memory_free: 1 << 30,
        };
        let on = recorded_settings(
            &hello(&["CUDA", "CPU"], "GGML_CUDA=ON GGML_CUDA_GRAPHS=ON", &[]),
            std::slice::from_ref(&gpu),
        );
        // nothing reports whether CUDA graphs ran: unknown, with what was asked
        assert_eq!(
            on["cuda_graphs"],
            "unknown (not reported by the backend; GGML_CUDA_DISABLE_GRAPHS was not set)"
        );
        assert_eq!(on["worker_env"], "none");
        assert_eq!(
            on["devices"],
            "CUDA0 (NVIDIA H200, gpu, 3.0 GiB, 1.0 GiB free)"
        );
        assert!(on.contains_key("driver"));
        // ggml reads the variable's presence, whatever its value
        let off = recorded_settings(
            &hello(
                &["CUDA", "CPU"],
                "GGML_CUDA=ON GGML_CUDA_GRAPHS=ON",
                &[("GGML_CUDA_DISABLE_GRAPHS", "0")],
            ),
            &[gpu],
        );
        assert_eq!(
            off["cuda_graphs"],
            "unknown (not reported by the backend; GGML_CUDA_DISABLE_GRAPHS=0 was set)"
        );
        assert_eq!(off["worker_env"], "GGML_CUDA_DISABLE_GRAPHS=0");
        let built_without = recorded_settings(
            &hello(&["CUDA", "CPU"], "GGML_CUDA=ON GGML_CUDA_GRAPHS=OFF", &[]),
            &[],
        );
        assert_eq!(
            built_without["cuda_graphs"],
            "off (built with GGML_CUDA_GRAPHS=OFF)"
        );
        // a build without them says so whatever the environment asks; one with them, asked
        // for them off, still says only what was asked
        let both = recorded_settings(
            &hello(
                &["CUDA", "CPU"],
                "GGML_CUDA=ON GGML_CUDA_GRAPHS=0",
                &[("GGML_CUDA_DISABLE_GRAPHS", "1")],
            ),
            &[],
        );
        assert_eq!(both["cuda_graphs"], "off (built with GGML_CUDA_GRAPHS=0)");
        let asked_off = recorded_settings(
            &hello(
                &["CUDA", "CPU"],
                "GGML_CUDA=ON GGML_CUDA_GRAPHS_EXTRA=OFF",
                &[("GGML_CUDA_DISABLE_GRAPHS", "1")],
            ),
            &[],
        );
        assert_eq!(
            asked_off["cuda_graphs"],
            "unknown (not reported by the backend; GGML_CUDA_DISABLE_GRAPHS=1 was set)"
        );
        // no CUDA backend: nothing said of CUDA graphs or an NVIDIA driver
        let cpu = recorded_settings(&hello(&["CPU", "RPC"], "", &[]), &[]);
        assert!(!cpu.contains_key("cuda_graphs") && !cpu.contains_key("driver"));
        assert_eq!(cpu["backends"], "CPU,RPC");
    }

    /// A device buffer is not host memory: the worker (every source file of it) reads tensors
    /// through ggml's backend API and logits through llama.cpp's, never through a tensor's data
    /// pointer.
    #[test]
    fn the_worker_never_reads_a_tensor_through_its_data_pointer() {
        // every source file of the worker (the requests live in several)
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tools/llama-worker");
        let mut code = String::new();
        let mut files = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if !path.extension().is_some_and(|e| e == "cpp" || e == "h") {
                continue;
            }
            files += 1;
            let src = std::fs::read_to_string(&path).unwrap();
            for line in src.lines().filter(|l| !l.trim_start().starts_with("//")) {
                assert!(
                    !line.contains("->data"),
                    "{} dereferences a tensor's data: {line}",
                    path.display()
                );
                code.push_str(line);
                code.push('\n');
            }
        }
        assert!(files >= 2, "no worker sources in {}", dir.display());
        assert!(code.contains("ggml_backend_tensor_get("));
        assert!(code.contains("llama_get_logits_ith("));
    }
}
