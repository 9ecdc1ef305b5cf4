//! `sweep`: the context filled cumulatively in chunks, every depth measured in both modes (and
//! decode steps after every chunk), stored unit by unit so that a killed sweep resumes.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use opledger_core::engine::{Capability, Engine, EngineInfo};
use opledger_core::manifest::Manifest;
use opledger_core::memory;
use opledger_core::node::NodeInfo;
use opledger_core::run_folder::{read_json, RunFolder};
use opledger_core::sweep::{run_sweep, FolderStore, SweepConfig, SweepSummary};
use opledger_core::system::SystemSnapshot;
use opledger_report::RunView;

use crate::bands::Bands;
use crate::model::{hash_file, ModelFile};
use crate::runs::{read_sweep, view, write_renderings, written_formats};
use crate::ui::Ui;

/// Files derived from the raw data (re-rendered by `report`, rewritten on resume).
const DERIVED: [&str; 4] = ["summary.json", "table.txt", "depths.csv", "chart.svg"];

/// A sweep ready to measure: its folder, manifest (the engine filled in once loaded), settings
/// and model.
pub struct Sweep {
    folder: RunFolder,
    manifest: Manifest,
    pub config: SweepConfig,
    pub model_path: PathBuf,
    /// The band rules, and the user's file they came from (a resumed sweep has the stored rules).
    bands: Option<Bands>,
    resumed: bool,
}

impl Sweep {
    /// A new sweep of `file` to `config.max_depth()`: refused when the KV cache and recurrent
    /// state would not fit in memory (unless `memory_check` is off; with a split, `layers_here`
    /// of the model's layers count, see [`crate::engines::RpcSettings::layers_here`]); creates
    /// the folder.
    pub fn start(
        file: &ModelFile,
        bands: Bands,
        config: SweepConfig,
        threads: u32,
        memory_check: bool,
        layers_here: Option<u32>,
        output: Option<&Path>,
    ) -> Result<Sweep> {
        let model_path = file.path().to_path_buf();
        let (steps, parallel) = config
            .decode
            .map(|d| (d.steps as u64, d.parallel as u64))
            .unwrap_or((0, 0));
        let n_ctx = config.chunks as u64 * config.work.chunk_tokens as u64 + steps * parallel;
        let need = memory::estimate(
            &file.arch,
            file.gguf.file_size_bytes,
            n_ctx,
            config.work.chunk_tokens as u64,
            2,
            config.work.all_logits,
        );
        let layers = file.arch.layers.len() as u32;
        let (need, held) = match layers_here {
            Some(here) => (
                need.share(here, layers),
                format!(", the {here} of {layers} layers held on this machine"),
            ),
            None => (need, String::new()),
        };
        let available = SystemSnapshot::take()
            .mem_available_bytes
            .unwrap_or(u64::MAX);
        if memory_check {
            memory::check(need, available).with_context(|| {
                format!(
                    "a sweep of {} to depth {} ({} tokens of context, two contexts{held})",
                    model_path.display(),
                    config.max_depth(),
                    n_ctx
                )
            })?;
        }
        let out = crate::manifest::run_path(output, "sweep", &model_path);
        let folder = RunFolder::create(&out)?;
        // the engine fills in its own description once loaded
        let manifest = crate::manifest::manifest(
            "sweep",
            file,
            EngineInfo {
                engine: String::new(),
                version: String::new(),
                backend: String::new(),
                threads,
                settings: Default::default(),
            },
            &bands.rules,
        )?;
        Ok(Sweep {
            folder,
            manifest,
            config,
            model_path,
            bands: Some(bands),
            resumed: false,
        })
    }

    /// An interrupted sweep: its folder, manifest and settings; the model must be unchanged.
    pub fn reopen(dir: &Path) -> Result<Sweep> {
        let folder = RunFolder::resume(dir)?;
        if !dir.join("manifest.json").exists() {
            bail!(
                "{}: the sweep was interrupted before it started measuring; start a new one",
                dir.display()
            );
        }
        let manifest = Manifest::read(&dir.join("manifest.json"))?;
        if manifest.command != "sweep" {
            bail!(
                "{}: a '{}' run, not a sweep",
                dir.display(),
                manifest.command
            );
        }
        let config: SweepConfig = read_json(&dir.join("config.json"))?;
        let model_path = PathBuf::from(&manifest.model.path);
        let hash = hash_file(&model_path).with_context(|| {
            format!(
                "{}: the sweep's model {} is gone",
                dir.display(),
                model_path.display()
            )
        })?;
        if hash.blake3 != manifest.model.blake3 {
            bail!(
                "{}: the model {} changed since the sweep began (BLAKE3 {} now, {} then)",
                dir.display(),
                model_path.display(),
                hash.blake3,
                manifest.model.blake3
            );
        }
        Ok(Sweep {
            folder,
            manifest,
            config,
            model_path,
            bands: None,
            resumed: true,
        })
    }

    /// The threads the sweep was started with (a resumed sweep continues with them).
    pub fn threads(&self) -> u32 {
        self.manifest.engine.threads
    }

    pub fn path(&self) -> &Path {
        self.folder.path()
    }

    /// Measures what is missing, then writes the summary and its renderings; returns the
    /// finished folder, the manifest and the summary.
    pub fn run(
        self,
        engine: &mut dyn Engine,
        ui: &mut dyn Ui,
    ) -> Result<(PathBuf, Manifest, SweepSummary)> {
        let Sweep {
            folder,
            manifest,
            config,
            bands,
            resumed,
            ..
        } = self;
        if config.decode.is_some() {
            engine.require(Capability::Decode)?;
        }
        let info = engine.info();
        let sweeper = engine.sweep()?;
        let decode = config.decode.map(|d| (d.steps, d.parallel));
        sweeper.prepare_sweep(&config.work, config.chunks, decode)?;
        let graph = sweeper.graph()?;
        let decode_graph = match config.decode {
            Some(d) => sweeper.sweep_decode_graph(d.parallel)?,
            None => Vec::new(),
        };
        if let Some(b) = &bands {
            for w in b.unmatched(&graph) {
                ui.note(&w);
            }
        }
        if resumed {
            let stored: Vec<NodeInfo> = read_json(&folder.path().join("graph.json"))?;
            let ops = |g: &[NodeInfo]| g.iter().map(|n| n.op.clone()).collect::<Vec<_>>();
            if ops(&stored) != ops(&graph) {
                bail!(
                    "{}: {} now builds a different graph for this model ({} nodes, the run has {}); start a new sweep",
                    folder.path().display(),
                    info.engine,
                    graph.len(),
                    stored.len()
                );
            }
            if config.decode.is_some() {
                let stored: Vec<NodeInfo> = read_json(&folder.path().join("decode_graph.json"))?;
                if ops(&stored) != ops(&decode_graph) {
                    bail!(
                        "{}: {} now builds a different decode step for this model; start a new sweep",
                        folder.path().display(),
                        info.engine
                    );
                }
            }
        } else {
            folder.write_json(
                "manifest.json",
                &Manifest {
                    engine: info,
                    ..manifest
                },
            )?;
            folder.write_json("config.json", &config)?;
            folder.write_json("graph.json", &graph)?;
            if config.decode.is_some() {
                folder.write_json("decode_graph.json", &decode_graph)?;
            }
        }
        let mut store = FolderStore::new(folder);
        run_sweep(
            sweeper,
            &config,
            graph.len(),
            decode_graph.len(),
            &mut store,
            // a device backend may fuse ops in FUSED and not in TIMED: compare the logits
            !opledger_core::split::off_cpu_devices(&graph).is_empty(),
            &mut |done, total, what| ui.progress(done, total, what),
        )
        .with_context(|| {
            format!(
                "sweeping (measured chunks are kept: continue with --resume {})",
                store.folder().path().display()
            )
        })?;
        let folder = store.into_folder();
        for name in DERIVED {
            folder.remove_derived(name)?;
        }
        let summary = write_derived(&folder)?;
        let manifest = Manifest::read(&folder.path().join("manifest.json"))?;
        let path = folder.finish()?;
        Ok((path, manifest, summary))
    }
}

/// Summarises a sweep folder's raw data and writes its renderings into it.
fn write_derived(folder: &RunFolder) -> Result<SweepSummary> {
    let manifest = Manifest::read(&folder.path().join("manifest.json"))?;
    let stored = read_sweep(folder.path(), manifest)?;
    let v = view(&stored)?;
    write_renderings(
        folder,
        "",
        &v,
        written_formats("sweep"),
        &opledger_report::RenderOptions::default(),
    )?;
    let RunView::Sweep(v) = v else { unreachable!() };
    Ok(v.summary)
}
