//! Every run kind written and read in one place. A run folder holds the raw data a kind's summary
//! is a pure function of (schema-versioned), its manifest, and the renderings its command writes;
//! `read` brings any kind back and `view` makes the same view the command rendered, so `report`
//! re-renders any stored run byte for byte. The one switch on the kind of a folder is `read`.

use std::path::Path;

use anyhow::{bail, Context, Result};
use opledger_core::ab::{AbReport, DiscoverReport, AB_SCHEMA_VERSION, DISCOVER_SCHEMA_VERSION};
use opledger_core::device::DeviceStats;
use opledger_core::ledger::LedgerReport;
use opledger_core::manifest::Manifest;
use opledger_core::node::NodeInfo;
use opledger_core::ops::{OpsSummary, OPS_SCHEMA_VERSION};
use opledger_core::profile::{ProfileRaw, ProfileSummary};
use opledger_core::run_folder::{open_complete, read_json, read_versioned, RunFolder};
use opledger_core::sweep::{load_folder, ChunkRecord, PassLog, SweepConfig};
use opledger_core::waste::WASTE_SCHEMA_VERSION;
use opledger_report::{
    render, AbView, DiscoverView, Format, LedgerView, OpsView, ParallelView, ProfileView,
    RenderOptions, RunView, SweepView, WasteView,
};

/// A stored run of any kind, as read back from its folder. One exists at a time (never in
/// collections), so the size difference between the variants costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
pub enum StoredRun {
    Profile {
        manifest: Manifest,
        raw: ProfileRaw,
        /// An imported trace's device ledger (`import.json`'s `device`), where it had device
        /// activity.
        device: Option<DeviceStats>,
    },
    /// `profile -n N --parallel 1,4,...`: one profile per sequence count, in `p<P>/`.
    ProfileSet {
        members: Vec<(u32, Manifest, ProfileRaw)>,
    },
    Sweep {
        manifest: Manifest,
        config: SweepConfig,
        graph: Vec<NodeInfo>,
        decode_graph: Option<Vec<NodeInfo>>,
        records: Vec<ChunkRecord>,
        passes: Vec<PassLog>,
    },
    Ab {
        manifest: Manifest,
        report: AbReport,
    },
    Discover {
        manifest: Manifest,
        report: DiscoverReport,
    },
    Waste {
        manifest: Manifest,
        raw: ProfileRaw,
        /// The profile run its timings came from (`None`: measured by the waste command).
        source: Option<String>,
    },
    Ledger {
        manifest: Manifest,
        report: LedgerReport,
    },
    Ops {
        manifest: Manifest,
        summary: OpsSummary,
    },
    Bisect {
        manifest: Manifest,
        report: opledger_core::bisect::BisectReport,
    },
}

impl StoredRun {
    /// The command that made it.
    pub fn kind(&self) -> &'static str {
        match self {
            StoredRun::Profile { .. } | StoredRun::ProfileSet { .. } => "profile",
            StoredRun::Sweep { .. } => "sweep",
            StoredRun::Ab { .. } => "ab",
            StoredRun::Discover { .. } => "discover",
            StoredRun::Waste { .. } => "waste",
            StoredRun::Ledger { .. } => "ledger",
            StoredRun::Ops { .. } => "ops",
            StoredRun::Bisect { .. } => "bisect",
        }
    }
}

/// The renderings a command writes into its run folder beside the raw data, per kind (the same
/// `report` writes into a folder of its own when asked for every format).
pub fn written_formats(kind: &str) -> &'static [Format] {
    match kind {
        "parallel profile" => &[Format::Text, Format::Csv, Format::Json],
        "ab" | "discover" | "ops" => &[Format::Json, Format::Text],
        "ledger" => &[Format::Json, Format::Text, Format::Md, Format::Csv],
        "profile" => &[
            Format::Json,
            Format::Text,
            Format::Md,
            Format::Bands,
            Format::Nodes,
        ],
        "sweep" => &[Format::Json, Format::Text, Format::Bands, Format::Svg],
        "waste" => &[Format::Json, Format::Text, Format::Md, Format::Nodes],
        "bisect" => &[Format::Json, Format::Text, Format::Md, Format::Html],
        _ => &[],
    }
}

/// Reads any stored run (a complete folder).
pub fn read(dir: &Path) -> Result<StoredRun> {
    let dir = open_complete(dir)?;
    let manifest_path = dir.join("manifest.json");
    if !manifest_path.exists() && dir.join("parallel.json").exists() {
        return read_profile_set(&dir);
    }
    let manifest = Manifest::read(&manifest_path)?;
    Ok(match manifest.command.as_str() {
        // an imported trace is stored as a profile (crate::import)
        "profile" | crate::import::IMPORT_COMMAND => StoredRun::Profile {
            raw: ProfileRaw::read(&dir.join("raw.json"))?,
            device: if manifest.command == crate::import::IMPORT_COMMAND {
                read_device(&dir.join("import.json"))?
            } else {
                None
            },
            manifest,
        },
        "sweep" => read_sweep(&dir, manifest)?,
        "ab" => {
            let mut report: AbReport = read_versioned(&dir.join("ab.json"), AB_SCHEMA_VERSION)?;
            report.upgrade();
            StoredRun::Ab { manifest, report }
        }
        "discover" => StoredRun::Discover {
            report: read_versioned(&dir.join("discover.json"), DISCOVER_SCHEMA_VERSION)?,
            manifest,
        },
        "waste" => {
            let raw = ProfileRaw::read(&dir.join("raw.json"))?;
            // where the timings came from is recorded in the summary only
            let summary: serde_json::Value =
                read_versioned(&dir.join("summary.json"), WASTE_SCHEMA_VERSION)?;
            let source = summary
                .get("source_run")
                .and_then(|s| s.as_str())
                .map(String::from);
            StoredRun::Waste {
                manifest,
                raw,
                source,
            }
        }
        "ledger" => StoredRun::Ledger {
            report: LedgerReport::read(&dir.join("ledger.json"))?,
            manifest,
        },
        "ops" => StoredRun::Ops {
            summary: read_versioned(&dir.join("ops.json"), OPS_SCHEMA_VERSION)?,
            manifest,
        },
        "bisect" => StoredRun::Bisect {
            report: read_versioned(
                &dir.join("bisect.json"),
                opledger_core::bisect::BISECT_SCHEMA_VERSION,
            )?,
            manifest,
        },
        other => bail!(
            "{}: a '{other}' run, which opledger does not know",
            dir.display()
        ),
    })
}

/// The device ledger of an imported run, from its `import.json` (`None`: a trace without
/// device activity, or node records); a malformed one is refused naming the file.
fn read_device(path: &Path) -> Result<Option<DeviceStats>> {
    if !path.exists() {
        return Ok(None);
    }
    let stats: serde_json::Value = read_json(path)?;
    match stats.get("device") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(d) => serde_json::from_value(d.clone())
            .map(Some)
            .with_context(|| format!("{}: its device figures ('device')", path.display())),
    }
}

/// A sweep's folder (complete or not: a sweep renders its own folder before finishing it).
pub(crate) fn read_sweep(dir: &Path, manifest: Manifest) -> Result<StoredRun> {
    let config: SweepConfig = read_json(&dir.join("config.json"))?;
    let graph = read_json(&dir.join("graph.json"))?;
    let decode_graph = if config.decode.is_some() {
        Some(read_json(&dir.join("decode_graph.json"))?)
    } else {
        None
    };
    let (records, passes) = load_folder(dir)?;
    Ok(StoredRun::Sweep {
        manifest,
        config,
        graph,
        decode_graph,
        records,
        passes,
    })
}

fn read_profile_set(dir: &Path) -> Result<StoredRun> {
    let mut members = Vec::new();
    let mut subdirs: Vec<(u32, std::path::PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let p: u32 = name.strip_prefix('p')?.parse().ok()?;
            e.path().is_dir().then(|| (p, e.path()))
        })
        .collect();
    subdirs.sort();
    for (p, sub) in subdirs {
        members.push((
            p,
            Manifest::read(&sub.join("manifest.json"))?,
            ProfileRaw::read(&sub.join("raw.json"))?,
        ));
    }
    if members.is_empty() {
        bail!(
            "{}: a parallel profile without its p<N>/ runs",
            dir.display()
        );
    }
    Ok(StoredRun::ProfileSet { members })
}

/// The view of a stored run that the renderers take: the same view its command rendered.
pub fn view(run: &StoredRun) -> Result<RunView<'_>> {
    Ok(match run {
        StoredRun::Profile {
            manifest,
            raw,
            device,
        } => RunView::Profile(
            ProfileView::new(manifest, raw)
                .context("summarising the profile")?
                .with_device(device.clone()),
        ),
        StoredRun::ProfileSet { members } => RunView::Parallel(ParallelView {
            members: members
                .iter()
                .map(|(p, m, raw)| {
                    ProfileView::new(m, raw)
                        .with_context(|| format!("summarising the profile of {p} sequences"))
                })
                .collect::<Result<_>>()?,
        }),
        StoredRun::Sweep {
            manifest,
            config,
            graph,
            decode_graph,
            records,
            passes,
        } => RunView::Sweep(
            SweepView::new(
                manifest,
                config,
                graph,
                decode_graph.as_deref(),
                records,
                passes,
            )
            .context("summarising the sweep")?,
        ),
        StoredRun::Ab { manifest, report } => RunView::Ab(AbView { manifest, report }),
        StoredRun::Discover { manifest, report } => {
            RunView::Discover(DiscoverView { manifest, report })
        }
        StoredRun::Waste {
            manifest,
            raw,
            source,
        } => RunView::Waste(
            WasteView::new(manifest, raw, source.clone()).context("analysing the graph")?,
        ),
        StoredRun::Ledger { manifest, report } => RunView::Ledger(LedgerView { manifest, report }),
        StoredRun::Ops { manifest, summary } => RunView::Ops(OpsView { manifest, summary }),
        StoredRun::Bisect { manifest, report } => {
            RunView::Bisect(opledger_report::BisectView { manifest, report })
        }
    })
}

/// What a stored run means for the exit status, as its command exited: its failed checks (3),
/// an A/B refused (4) or inconclusive (5), a ledger's unreliable replay (3).
pub fn outcome(view: &RunView) -> crate::outcome::Exit {
    use crate::outcome::{of_ab, of_checks, Exit};
    match view {
        RunView::Profile(v) => of_checks(&v.summary.checks),
        RunView::Parallel(v) => v
            .members
            .iter()
            .fold(Exit::Ok, |e, m| e.and(of_checks(&m.summary.checks))),
        RunView::Sweep(v) => of_checks(&v.summary.checks),
        RunView::Ab(v) => of_ab(v.report.verdict),
        RunView::Discover(v) => v.report.outcome().map_or(Exit::Ok, of_ab),
        RunView::Ledger(v) => crate::ledger::exit(v.report),
        RunView::Waste(_) | RunView::Ops(_) => Exit::Ok,
        RunView::Bisect(v) => crate::outcome::of_bisect(v.report),
    }
}

/// Writes `view`'s renderings in `formats` into `folder` under `prefix`.
pub fn write_renderings(
    folder: &RunFolder,
    prefix: &str,
    view: &RunView,
    formats: &[Format],
    opts: &RenderOptions,
) -> Result<()> {
    for &format in formats {
        let name = opledger_report::render::file_name(view, format).with_context(|| {
            format!(
                "{} {} run has no {} rendering",
                opledger_report::render::article(view.kind()),
                view.kind(),
                format.name()
            )
        })?;
        folder.write(&format!("{prefix}{name}"), &render(view, format, opts)?)?;
    }
    Ok(())
}

/// Writes a profile's files under `prefix` (`p4/` for a member of a set): raw data first, then
/// everything derived from it; returns its summary.
pub fn write_profile(
    folder: &RunFolder,
    prefix: &str,
    manifest: &Manifest,
    raw: &ProfileRaw,
    device: Option<&DeviceStats>,
) -> Result<ProfileSummary> {
    folder.write_json(&format!("{prefix}manifest.json"), manifest)?;
    // the raw data (tens of MB for an imported trace of thousands of steps) is written while
    // the summary is computed from it
    let (written, view) = std::thread::scope(|s| {
        let written = s.spawn(|| folder.write_json_compact(&format!("{prefix}raw.json"), raw));
        let view = ProfileView::new(manifest, raw).map(|v| v.with_device(device.cloned()));
        (written.join(), view)
    });
    written.unwrap_or_else(|p| std::panic::resume_unwind(p))?;
    let view = RunView::Profile(view?);
    write_renderings(
        folder,
        prefix,
        &view,
        written_formats("profile"),
        &RenderOptions::default(),
    )?;
    let RunView::Profile(v) = view else {
        unreachable!()
    };
    Ok(v.summary)
}

/// Writes the profiles of a `profile` command: one, or a set side by side.
pub fn write_profiles(folder: &RunFolder, profiles: &[crate::profile::Profiled]) -> Result<()> {
    if let [one] = profiles {
        write_profile(folder, "", &one.manifest, &one.raw, None)?;
        return Ok(());
    }
    for p in profiles {
        write_profile(
            folder,
            &format!("p{}/", p.parallel),
            &p.manifest,
            &p.raw,
            None,
        )?;
    }
    let members = profiles
        .iter()
        .map(|p| ProfileView::new(&p.manifest, &p.raw))
        .collect::<Result<_, _>>()?;
    let view = RunView::Parallel(ParallelView { members });
    write_renderings(
        folder,
        "",
        &view,
        written_formats(view.kind()),
        &RenderOptions::default(),
    )
}

/// Writes a waste run: its manifest and raw data, then its renderings (`top` nodes in the
/// terminal table).
pub fn write_waste(
    folder: &RunFolder,
    manifest: &Manifest,
    raw: &ProfileRaw,
    source: Option<String>,
    top: usize,
) -> Result<opledger_core::waste::WasteSummary> {
    folder.write_json("manifest.json", manifest)?;
    folder.write_json_compact("raw.json", raw)?;
    let view =
        RunView::Waste(WasteView::new(manifest, raw, source).context("analysing the graph")?);
    write_renderings(
        folder,
        "",
        &view,
        written_formats("waste"),
        &RenderOptions {
            waste_top: top,
            ..RenderOptions::default()
        },
    )?;
    let RunView::Waste(v) = view else {
        unreachable!()
    };
    Ok(v.summary)
}

/// Writes an A/B run.
pub fn write_ab(folder: &RunFolder, manifest: &Manifest, report: &AbReport) -> Result<()> {
    folder.write_json("manifest.json", manifest)?;
    write_all(folder, &RunView::Ab(AbView { manifest, report }))
}

/// Writes a discover run.
pub fn write_discover(
    folder: &RunFolder,
    manifest: &Manifest,
    report: &DiscoverReport,
) -> Result<()> {
    folder.write_json("manifest.json", manifest)?;
    write_all(
        folder,
        &RunView::Discover(DiscoverView { manifest, report }),
    )
}

/// Writes a ledger run: each side's raw profile (`llama_cpp/raw.json`), then the report.
pub fn write_ledger(
    folder: &RunFolder,
    manifest: &Manifest,
    raws: &[(String, ProfileRaw)],
    report: &LedgerReport,
) -> Result<()> {
    for (name, raw) in raws {
        folder.write_json_compact(&format!("{}/raw.json", name.replace('.', "_")), raw)?;
    }
    folder.write_json("manifest.json", manifest)?;
    write_all(folder, &RunView::Ledger(LedgerView { manifest, report }))
}

/// Writes an ops run: its manifest, the in-graph profile's raw data, the summary and its table.
pub fn write_ops(
    folder: &RunFolder,
    manifest: &Manifest,
    raw: &ProfileRaw,
    summary: &OpsSummary,
) -> Result<()> {
    folder.write_json("manifest.json", manifest)?;
    folder.write_json_compact("raw.json", raw)?;
    write_all(folder, &RunView::Ops(OpsView { manifest, summary }))
}

/// Writes a bisect run's result (its ends and steps are in the folder already): the manifest,
/// then `bisect.json` and its renderings.
pub fn write_bisect(
    folder: &RunFolder,
    manifest: &Manifest,
    report: &opledger_core::bisect::BisectReport,
) -> Result<()> {
    folder.write_json("manifest.json", manifest)?;
    write_all(
        folder,
        &RunView::Bisect(opledger_report::BisectView { manifest, report }),
    )
}

/// Writes the renderings a command writes for this kind of run.
fn write_all(folder: &RunFolder, view: &RunView) -> Result<()> {
    write_renderings(
        folder,
        "",
        view,
        written_formats(view.kind()),
        &RenderOptions::default(),
    )
}

/// Writes an imported run: a profile's files, the import's statistics (`import.json`) and the
/// import rules of a trace (`import-rules.toml`).
pub fn write_import(
    folder: &RunFolder,
    imported: &crate::import::Imported,
    rules_text: Option<&str>,
) -> Result<ProfileSummary> {
    if let Some(text) = rules_text {
        folder.write("import-rules.toml", text.as_bytes())?;
    }
    folder.write_json("import.json", &imported.stats)?;
    write_profile(
        folder,
        "",
        &imported.manifest,
        &imported.raw,
        imported.stats.device.as_ref(),
    )
}
