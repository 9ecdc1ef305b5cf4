//! The engine factory every command uses: an engine kind and its settings, over a model that
//! passed the gate its engine needs, into one `Box<dyn Engine>`. What an engine can do beyond a
//! prefill profile is asked for by capability (`dyn Engine::sweep`, `replayer`, ...), which
//! refuses an engine that lacks it by name; a kind this build lacks is refused here.

use anyhow::{bail, Result};
use opledger_core::ab::Knobs;
use opledger_core::engine::{Capability, Engine};

use crate::model::ModelFile;

/// The engines a command can run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// llama.cpp through its eval callback, in a worker process (the bundled worker with the
    /// feature `llama`, else one named by --llama-worker).
    LlamaCpp,
    /// A forward pass of candle CPU ops (feature `candle`).
    Candle,
    /// A deterministic engine over the model's architecture, with known per-node costs: for
    /// tests of everything around the measurement, fast and without timing noise.
    Mock,
}

impl EngineKind {
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::LlamaCpp => "llama.cpp",
            EngineKind::Candle => "candle",
            EngineKind::Mock => "mock",
        }
    }

    /// Whether the engine reads the file through llama.cpp's gate (else only its structure is
    /// checked: candle loads files llama.cpp refuses).
    pub fn needs_llama_gate(self) -> bool {
        matches!(self, EngineKind::LlamaCpp)
    }
}

/// Flash attention as asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlashAttn {
    Auto,
    On,
    Off,
}

impl FlashAttn {
    pub fn name(self) -> &'static str {
        match self {
            FlashAttn::Auto => "auto",
            FlashAttn::On => "on",
            FlashAttn::Off => "off",
        }
    }
}

/// How to set an engine up.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineSettings {
    pub threads: u32,
    pub flash_attn: FlashAttn,
    /// Layers offloaded to a GPU (llama.cpp built with `cuda`).
    pub gpu_layers: i32,
    /// Print the engine's own log.
    pub verbose: bool,
    /// Load without weight repacking (census-only work).
    pub no_repack: bool,
    /// Runtime knobs of an A/B (`threads`, `flash_attn`, `ubatch`, `type_k`, `type_v`,
    /// `repack`), over the settings above; llama.cpp only.
    pub knobs: Knobs,
    /// Split the model across this machine's CPU and remote RPC servers (llama.cpp only).
    pub rpc: Option<RpcSettings>,
    /// Run llama.cpp in a worker built in another llama.cpp tree (`--llama-worker`; a side's
    /// `worker=` knob overrides it), instead of the bundled worker.
    pub worker: Option<WorkerSettings>,
}

/// A llama.cpp worker (`tools/llama-worker`) and how long one request to it may take.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerSettings {
    pub path: std::path::PathBuf,
    pub timeout: std::time::Duration,
}

/// How long one request to a worker may take by default (a model's load included).
pub const DEFAULT_WORKER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(300);

impl EngineSettings {
    /// The worker these settings run llama.cpp in: a `worker=` knob, else `--llama-worker`,
    /// else the worker cargo built with this opledger (`opledger_worker::bundled`, also named
    /// by `worker=bundled`). `worker=embedded`, the retired engine linked into opledger, is
    /// refused.
    pub fn worker(&self) -> Result<WorkerSettings> {
        let timeout = self
            .worker
            .as_ref()
            .map_or(DEFAULT_WORKER_TIMEOUT, |w| w.timeout);
        Ok(match self.knobs.get("worker") {
            Some("embedded") => bail!(
                "worker=embedded: the embedded llama.cpp engine is retired; llama.cpp runs in a worker process (`worker={BUNDLED}` names the one built with this opledger, `worker=PATH` another build)"
            ),
            Some(BUNDLED) => WorkerSettings {
                path: bundled_worker()?,
                timeout,
            },
            Some(path) => WorkerSettings {
                path: path.into(),
                timeout,
            },
            None => match &self.worker {
                Some(w) => w.clone(),
                None => WorkerSettings {
                    path: bundled_worker()?,
                    timeout,
                },
            },
        })
    }
}

/// The knob value and manifest name of the worker cargo built with this opledger.
pub const BUNDLED: &str = "bundled";

/// The path of the worker cargo built with this opledger (feature `llama`), written out on
/// first use.
#[cfg(feature = "llama")]
pub fn bundled_worker() -> Result<std::path::PathBuf> {
    opledger_worker::bundled::path().map_err(anyhow::Error::msg)
}

/// Without the bundled worker, llama.cpp runs only in a worker the user built.
#[cfg(not(feature = "llama"))]
pub fn bundled_worker() -> Result<std::path::PathBuf> {
    bail!("this opledger was built without the bundled llama.cpp worker (feature `llama`): name a worker built in a llama.cpp tree with --llama-worker PATH (tools/llama-worker, scripts/build-worker)")
}

/// A model split across this machine's CPU and remote RPC servers (`--rpc`, `--rpc-split`).
#[derive(Debug, Clone, PartialEq)]
pub struct RpcSettings {
    /// `host:port` of each server, in the order their devices take layers.
    pub servers: Vec<String>,
    /// Layers per device, this machine's CPU first (`None`: as even as the layers allow, the
    /// remainder to the first devices).
    pub layers: Option<Vec<u32>>,
    /// How long a server may take to answer before the run is stopped.
    pub timeout: std::time::Duration,
}

impl RpcSettings {
    /// The layers per device for a model of `n_layer` layers: the ones asked, checked, or an
    /// even split. Every device needs at least one layer.
    pub fn layers_for(&self, n_layer: u32) -> Result<Vec<u32>> {
        let devices = self.servers.len() as u32 + 1;
        let layers = match &self.layers {
            Some(l) => {
                if l.len() as u32 != devices {
                    bail!(
                        "--rpc-split lists {} devices; the split has {devices} (this machine's CPU, then {} server{})",
                        l.len(),
                        devices - 1,
                        if devices == 2 { "" } else { "s" }
                    );
                }
                l.clone()
            }
            None => {
                if n_layer < devices {
                    bail!("a model of {n_layer} layers cannot be split over {devices} devices (at least one layer each)");
                }
                (0..devices)
                    .map(|d| n_layer / devices + u32::from(d < n_layer % devices))
                    .collect()
            }
        };
        let sum: u64 = layers.iter().map(|&l| l as u64).sum();
        if sum != n_layer as u64 {
            bail!("--rpc-split places {sum} layers; the model has {n_layer}");
        }
        if layers.contains(&0) {
            bail!("--rpc-split: every device needs at least one layer (the token embedding stays on this machine's CPU)");
        }
        Ok(layers)
    }

    /// The layers whose weights and caches this machine holds: this machine's CPU's, and those
    /// of the servers on loopback (their processes run here too).
    pub fn layers_here(&self, n_layer: u32) -> Result<u32> {
        let layers = self.layers_for(n_layer)?;
        let servers = self.servers.iter().zip(&layers[1..]);
        Ok(layers[0]
            + servers
                .filter(|(e, _)| crate::rpc::is_loopback(e))
                .map(|(_, l)| l)
                .sum::<u32>())
    }
}

impl EngineSettings {
    /// `threads` threads, flash attention auto, no GPU, weights repacked, no knobs.
    pub fn new(threads: u32) -> EngineSettings {
        EngineSettings {
            threads,
            flash_attn: FlashAttn::Auto,
            gpu_layers: 0,
            verbose: false,
            no_repack: false,
            knobs: Knobs::default(),
            rpc: None,
            worker: None,
        }
    }

    /// What llama.cpp runs with when a knob is not set: these threads, flash attention as
    /// asked, weights repacked, the whole chunk one ubatch, an F16 KV cache.
    pub fn resolved_defaults(&self, chunk: u32) -> Knobs {
        Knobs(
            [
                ("threads", self.threads.to_string()),
                ("flash_attn", self.flash_attn.name().to_string()),
                ("repack", "on".to_string()),
                ("ubatch", chunk.to_string()),
                ("type_k", "f16".to_string()),
                ("type_v", "f16".to_string()),
                (
                    "worker",
                    self.worker
                        .as_ref()
                        .map_or(BUNDLED.to_string(), |w| w.path.display().to_string()),
                ),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect(),
        )
    }
}

/// Loads `model` into the engine `kind` with `settings`.
pub fn open_engine(
    kind: EngineKind,
    model: &ModelFile,
    settings: &EngineSettings,
) -> Result<Box<dyn Engine>> {
    if kind != EngineKind::LlamaCpp && settings.rpc.is_some() {
        bail!(
            "--rpc splits a model through llama.cpp's RPC backend; the {} engine has none",
            kind.name()
        );
    }
    if settings.rpc.is_some() && settings.gpu_layers > 0 {
        bail!("--rpc and --gpu-layers together are not supported: the split places every layer");
    }
    if kind != EngineKind::LlamaCpp && !settings.knobs.0.is_empty() {
        bail!(
            "runtime knobs ({}) are llama.cpp's; the {} engine has none",
            settings.knobs,
            kind.name()
        );
    }
    // --llama-worker applies to the llama.cpp engine of a command (a ledger's candle side
    // runs as it always does); a worker= knob on another engine was refused above
    match kind {
        EngineKind::LlamaCpp => open_worker(model, settings, &settings.worker()?),
        EngineKind::Candle => open_candle(model, settings),
        EngineKind::Mock => Ok(Box::new(opledger_core::mock::MockEngine::for_arch(
            &model.arch,
        ))),
    }
}

/// Refuses `engine` unless it has every capability in `needs` (one place for the words).
pub fn require(engine: &dyn Engine, needs: &[Capability]) -> Result<()> {
    for &c in needs {
        engine.require(c)?;
    }
    Ok(())
}

/// The prefix of a knob that sets an environment variable in a worker's process
/// (`env:GGML_CUDA_DISABLE_GRAPHS=1`).
pub const ENV_KNOB: &str = opledger_core::ab::ENV_KNOB_PREFIX;

/// The environment variables a side's `env:NAME=VALUE` knobs set.
pub fn knob_env(knobs: &Knobs) -> std::collections::BTreeMap<String, String> {
    knobs
        .0
        .iter()
        .filter_map(|(k, v)| Some((k.strip_prefix(ENV_KNOB)?.to_string(), v.clone())))
        .collect()
}

/// llama.cpp in a worker process (the bundled one, or one built in the user's own llama.cpp
/// tree) with the settings and knobs; `--rpc` splits the model over RPC servers from the worker
/// (each server asked for its version and devices here first: ggml's client would abort the
/// worker on a refused connection or another version).
fn open_worker(
    model: &ModelFile,
    s: &EngineSettings,
    w: &WorkerSettings,
) -> Result<Box<dyn Engine>> {
    use anyhow::Context;
    let knobs = &s.knobs;
    let flash = knobs.get("flash_attn").unwrap_or(s.flash_attn.name());
    let cfg = opledger_worker::WorkerConfig {
        worker: w.path.clone(),
        model: model.path().to_path_buf(),
        threads: knobs
            .get("threads")
            .and_then(|t| t.parse().ok())
            .unwrap_or(s.threads),
        flash_attn: flash.to_string(),
        gpu_layers: s.gpu_layers,
        no_repack: s.no_repack || knobs.get("repack") == Some("off"),
        ubatch: knobs.get("ubatch").and_then(|u| u.parse().ok()),
        type_k: knobs.get("type_k").map(str::to_string),
        type_v: knobs.get("type_v").map(str::to_string),
        timeout: w.timeout,
        verbose: s.verbose,
        env: knob_env(knobs),
        rpc: match &s.rpc {
            Some(r) => {
                let layers = r.layers_for(model.arch.layers.len() as u32)?;
                let (gpu_layers, tensor_split) = opledger_core::split::layer_split(&layers)
                    .ok_or_else(|| {
                        anyhow::anyhow!("--rpc-split: every device needs at least one layer")
                    })?;
                preflight(&r.servers, r.timeout)?;
                Some(opledger_worker::WorkerRpc {
                    servers: r.servers.clone(),
                    layers,
                    gpu_layers,
                    tensor_split,
                    timeout: r.timeout,
                })
            }
            None => None,
        },
    };
    // the worker's errors name it
    let mut engine = opledger_worker::WorkerEngine::load(cfg)
        .with_context(|| format!("loading model '{}'", model.path().display()))?;
    if let Some(r) = &s.rpc {
        // servers on this machine compute part of the measured graph, as the worker does,
        // while the engine lives
        engine.count_as_own(&crate::rpc::local_server_pids(&r.servers));
    }
    Ok(Box::new(engine))
}

/// Each RPC server asked for its protocol version and devices before the worker's ggml client
/// connects (which aborts the worker on a refused connection or another version).
fn preflight(servers: &[String], timeout: std::time::Duration) -> Result<()> {
    for s in servers {
        opledger_worker::rpc::preflight(s, timeout)?;
    }
    Ok(())
}

#[cfg(feature = "candle")]
fn open_candle(model: &ModelFile, s: &EngineSettings) -> Result<Box<dyn Engine>> {
    use anyhow::Context;
    use opledger_candle::{CandleConfig, CandleEngine};
    if s.gpu_layers > 0 {
        bail!(
            "the candle engine runs on the CPU only (--gpu-layers {})",
            s.gpu_layers
        );
    }
    if s.flash_attn == FlashAttn::On {
        bail!("the candle engine has no flash attention (--flash-attn on)");
    }
    let engine = CandleEngine::load(CandleConfig {
        model: model.well_formed.clone(),
        threads: s.threads,
    })
    .with_context(|| format!("loading model '{}' into candle", model.path().display()))?;
    Ok(Box::new(engine))
}

#[cfg(not(feature = "candle"))]
fn open_candle(_model: &ModelFile, _s: &EngineSettings) -> Result<Box<dyn Engine>> {
    bail!("this opledger was built without the candle engine (feature `candle`)")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rpc(servers: usize, layers: Option<Vec<u32>>) -> RpcSettings {
        RpcSettings {
            servers: (0..servers)
                .map(|i| format!("127.0.0.1:{}", 50052 + i))
                .collect(),
            layers,
            timeout: std::time::Duration::from_secs(1),
        }
    }

    #[test]
    fn a_split_places_every_layer_once_with_at_least_one_a_device() {
        // 10 layers over 3 devices: 4, 3, 3 (the remainder to the first)
        assert_eq!(rpc(2, None).layers_for(10).unwrap(), [4, 3, 3]);
        assert_eq!(rpc(1, None).layers_for(8).unwrap(), [4, 4]);
        assert_eq!(
            rpc(2, Some(vec![2, 1, 1])).layers_for(4).unwrap(),
            [2, 1, 1]
        );
        for (servers, layers, n) in [
            (2, Some(vec![2, 2]), 4),        // two counts for three devices
            (2, Some(vec![2, 1, 2]), 4),     // five layers for four
            (1, Some(vec![0, 4]), 4),        // nothing local
            (2, None, 2),                    // fewer layers than devices
            (1, Some(vec![u32::MAX, 5]), 4), // a sum past u32 (wraps to 4)
        ] {
            assert!(
                rpc(servers, layers.clone()).layers_for(n).is_err(),
                "{layers:?} of {n}"
            );
        }
    }

    #[test]
    fn a_side_s_worker_knob_overrides_the_flag_and_the_bundled_worker_is_the_default() {
        let mut s = EngineSettings::new(2);
        let bundled = bundled_worker();
        assert_eq!(
            s.worker().ok().map(|w| w.path),
            bundled.as_ref().ok().cloned()
        );
        s.worker = Some(WorkerSettings {
            path: "/w/flag".into(),
            timeout: std::time::Duration::from_secs(7),
        });
        assert_eq!(s.worker().unwrap().path, std::path::Path::new("/w/flag"));
        s.knobs = "worker=/w/knob".parse().unwrap();
        let w = s.worker().unwrap();
        // the knob's worker, with the flag's timeout
        assert_eq!(
            (w.path.as_path(), w.timeout),
            (
                std::path::Path::new("/w/knob"),
                std::time::Duration::from_secs(7)
            )
        );
        s.knobs = "worker=bundled".parse().unwrap();
        assert_eq!(s.worker().ok().map(|w| w.path), bundled.ok());
        // the retired embedded engine is refused by name
        s.knobs = "worker=embedded".parse().unwrap();
        let e = s.worker().unwrap_err().to_string();
        assert!(e.contains("embedded llama.cpp engine is retired"), "{e}");
        // the defaults an A/B resolves name the engine each side runs
        assert_eq!(
            EngineSettings::new(2).resolved_defaults(64).get("worker"),
            Some("bundled")
        );
    }

    #[test]
    fn the_layers_here_are_the_cpus_and_the_loopback_servers() {
        let mut r = rpc(2, Some(vec![3, 3, 2]));
        assert_eq!(r.layers_here(8).unwrap(), 8);
        r.servers[1] = "10.0.0.7:50052".into();
        assert_eq!(r.layers_here(8).unwrap(), 6);
        r.servers[0] = "gpu-host:50052".into();
        assert_eq!(r.layers_here(8).unwrap(), 3);
        r.servers[0] = "localhost:50052".into();
        assert_eq!(r.layers_here(8).unwrap(), 6);
    }
}
