//! A run folder's `manifest.json`: what was measured, with what, on what machine; enough to
//! re-derive every summary from the raw data without measuring again.

use serde::{Deserialize, Serialize};

use crate::arch::ArchInfo;
use crate::band::BandRules;
use crate::engine::EngineInfo;
use crate::system::SystemSnapshot;

pub const MANIFEST_SCHEMA_VERSION: u32 = 1;

/// The model file a run measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub path: String,
    pub size_bytes: u64,
    pub blake3: String,
    pub arch: ArchInfo,
    /// Selected GGUF metadata (large arrays summarised).
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    /// `opledger 0.1.0`.
    pub tool: String,
    /// The subcommand (`profile`, `graph`, ...).
    pub command: String,
    /// The command line as given.
    pub args: Vec<String>,
    pub created_utc: String,
    pub engine: EngineInfo,
    pub model: ModelRecord,
    /// The band rules the run was categorised with.
    pub band_rules: BandRules,
    pub system: SystemSnapshot,
}

impl Manifest {
    /// Reads a run's `manifest.json`, refusing a newer or unknown schema version.
    pub fn read(path: &std::path::Path) -> Result<Manifest, crate::run_folder::RunFolderError> {
        crate::run_folder::read_versioned(path, MANIFEST_SCHEMA_VERSION)
    }

    /// A short label of the model for headings: the file name.
    pub fn model_label(&self) -> &str {
        std::path::Path::new(&self.model.path)
            .file_name()
            .and_then(|s| s.to_str())
            .unwrap_or(&self.model.path)
    }
}
