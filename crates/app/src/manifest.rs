//! The manifest every run folder opens with: the tool, the command and its arguments, the
//! engine, the model file's identity and architecture, the band rules and the machine.

use anyhow::Result;
use opledger_core::band::BandRules;
use opledger_core::engine::EngineInfo;
use opledger_core::manifest::{Manifest, ModelRecord, MANIFEST_SCHEMA_VERSION};
use opledger_core::system::SystemSnapshot;

use crate::model::{hash_file, ModelFile};

/// The manifest of a `command` run of `engine` on `file` with `rules`.
pub fn manifest(
    command: &str,
    file: &ModelFile,
    engine: EngineInfo,
    rules: &BandRules,
) -> Result<Manifest> {
    let hash = hash_file(file.path())?;
    Ok(Manifest {
        schema_version: MANIFEST_SCHEMA_VERSION,
        tool: format!("opledger {}", env!("CARGO_PKG_VERSION")),
        command: command.into(),
        args: std::env::args().collect(),
        created_utc: now_utc(),
        engine,
        model: ModelRecord {
            path: hash.path,
            size_bytes: hash.size_bytes,
            blake3: hash.blake3,
            arch: file.arch.clone(),
            metadata: file.metadata_summary(),
        },
        band_rules: rules.clone(),
        system: SystemSnapshot::take(),
    })
}

/// The time now, RFC 3339 in UTC to the second.
pub fn now_utc() -> String {
    humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string()
}

/// The UTC time as a folder-name stamp: 20261201T060858Z.
pub fn utc_stamp() -> String {
    now_utc().replace(['-', ':'], "")
}

/// The run folder a command writes: `output` when given, else a fresh
/// `runs/<time>-<kind>-<model file stem>`.
pub fn run_path(
    output: Option<&std::path::Path>,
    kind: &str,
    model: &std::path::Path,
) -> std::path::PathBuf {
    output.map(std::path::Path::to_path_buf).unwrap_or_else(|| {
        let label = model
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into());
        opledger_core::run_folder::fresh_run_path(
            std::path::Path::new("runs"),
            kind,
            &label,
            &utc_stamp(),
        )
    })
}
