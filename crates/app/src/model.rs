//! Opening a model file for measurement: the Rust validator runs first (nothing reaches llama.cpp
//! unless it accepted the file: the engine takes the gate's token, not a path), then the
//! architecture is read from its metadata. The built-in default model and the file's identity
//! for manifests live here too.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use opledger_core::arch::{ArchInfo, Metadata};
use opledger_gguf::{ArchCheck, GgufFile, LlamaBuild, LlamaLoadable, Value, WellFormed};
use serde::Serialize;

/// A validated model file and what opledger knows of it.
pub struct ModelFile {
    pub gguf: GgufFile,
    pub arch: ArchInfo,
    /// The file as the gate for llama.cpp passed it (its checks and notes, e.g. tensors it did
    /// not check); `None` for a file opened for another engine only.
    pub llama: Option<LlamaLoadable>,
    /// The file with its structure checked, for an engine that reads it itself.
    pub well_formed: WellFormed,
}

/// Adapter from the GGUF reader to core's metadata trait.
struct GgufMetadata<'a>(&'a GgufFile);

impl Metadata for GgufMetadata<'_> {
    fn get_u64(&self, key: &str) -> Option<u64> {
        self.0.get_u64(key)
    }
    fn get_i64_array(&self, key: &str) -> Option<Vec<i64>> {
        self.0
            .get_i32_array(key)
            .map(|v| v.into_iter().map(i64::from).collect())
            .or_else(|| match self.0.get(key) {
                // recurrent_layers is an array of bools in some files
                Some(Value::Array(a)) => (0..a.len())
                    .map(|i| a.get(i).and_then(|v| v.as_bool()).map(i64::from))
                    .collect(),
                _ => None,
            })
    }
    fn get_string(&self, key: &str) -> Option<String> {
        self.0.get_str(key).map(str::to_string)
    }
    fn has_tensor(&self, name: &str) -> bool {
        self.0.tensor(name).is_some()
    }
}

impl ModelFile {
    /// Validates `path` (structure, then what llama.cpp requires of its architecture) and
    /// reads its architecture. Errors name the file.
    pub fn open(path: &Path) -> Result<ModelFile> {
        ModelFile::open_for(path, LlamaBuild::Vendored)
    }

    /// [`ModelFile::open`] for `build`: through a worker of another llama.cpp, which
    /// architectures load is that build's answer (`opledger_gguf::LlamaBuild`).
    pub fn open_for(path: &Path, build: LlamaBuild) -> Result<ModelFile> {
        let gguf = GgufFile::open(path)?;
        let llama = LlamaLoadable::gate_for(&gguf, build)?;
        let arch = ArchInfo::from_metadata(&GgufMetadata(&gguf))
            .with_context(|| format!("{}: reading the architecture", path.display()))?;
        Ok(ModelFile {
            well_formed: WellFormed::of(&gguf),
            gguf,
            arch,
            llama: Some(llama),
        })
    }

    /// Validates the file's structure only (every count, offset and type, as `open` does) and
    /// reads its architecture, for an engine other than llama.cpp: candle loads files llama.cpp
    /// refuses (a qwen3moe with fused gate/up experts, say).
    pub fn open_structural(path: &Path) -> Result<ModelFile> {
        let gguf = GgufFile::open(path)?;
        let arch = ArchInfo::from_metadata(&GgufMetadata(&gguf))
            .with_context(|| format!("{}: reading the architecture", path.display()))?;
        Ok(ModelFile {
            well_formed: WellFormed::of(&gguf),
            gguf,
            arch,
            llama: None,
        })
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        self.well_formed.path()
    }

    /// What the gate for llama.cpp checked, where it ran.
    pub fn check(&self) -> Option<&ArchCheck> {
        self.llama.as_ref().map(LlamaLoadable::check)
    }

    /// What the gate and the architecture reader noted about the file (what was not checked,
    /// how layer kinds were decided), for printing before a run.
    pub fn notes(&self) -> Vec<String> {
        let mut notes: Vec<String> = self.check().map(|c| c.notes.clone()).unwrap_or_default();
        notes.extend(self.arch.notes.iter().cloned());
        notes
    }

    /// The metadata worth recording in a manifest (no large arrays).
    pub fn metadata_summary(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut out = serde_json::Map::new();
        for (k, v) in &self.gguf.metadata {
            let j = match v {
                Value::String(s) => serde_json::Value::from(s.clone()),
                Value::Bool(b) => serde_json::Value::from(*b),
                Value::Array(a) if a.len() <= 16 => {
                    serde_json::Value::from(format!("{v:?}").chars().take(200).collect::<String>())
                }
                Value::Array(a) => serde_json::Value::from(format!("array of {} values", a.len())),
                other => match (other.as_i128(), other.as_f32()) {
                    (Some(i), _) => serde_json::Value::from(i as f64),
                    (None, Some(f)) => serde_json::Value::from(f),
                    _ => serde_json::Value::from(format!("{other:?}")),
                },
            };
            out.insert(k.clone(), j);
        }
        out
    }
}

/// The file's identity for manifests: size and BLAKE3 of its bytes.
#[derive(Debug, Clone, Serialize)]
pub struct FileHash {
    pub path: String,
    pub size_bytes: u64,
    pub blake3: String,
}

pub fn hash_file(path: &Path) -> Result<FileHash> {
    HashingReader::open(path)?.finish()
}

/// A file hashed as it is read: a file read once for its content (a trace) needs no second read
/// for its identity in the manifest.
pub struct HashingReader {
    file: std::fs::File,
    path: PathBuf,
    hasher: blake3::Hasher,
    size: u64,
}

impl HashingReader {
    pub fn open(path: &Path) -> Result<HashingReader> {
        Ok(HashingReader {
            file: std::fs::File::open(path)
                .with_context(|| format!("opening {}", path.display()))?,
            path: path.to_path_buf(),
            hasher: blake3::Hasher::new(),
            size: 0,
        })
    }

    /// The whole file's identity: the part not read yet is read and hashed first.
    pub fn finish(mut self) -> Result<FileHash> {
        let mut buf = vec![0u8; 1 << 20];
        while self
            .read(&mut buf)
            .with_context(|| format!("reading {}", self.path.display()))?
            > 0
        {}
        Ok(FileHash {
            path: self.path.display().to_string(),
            size_bytes: self.size,
            blake3: self.hasher.finalize().to_hex().to_string(),
        })
    }
}

impl Read for HashingReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
}

/// The preset of the built-in default model.
pub const DEFAULT_PRESET: &str = "tiny-qwen35moe";

/// The built-in default model: `runs/models/tiny-qwen35moe.gguf`, synthesised (seed 0) when
/// missing, and whether it was written now. The same seed always gives the same bytes, so a
/// file left by an earlier run is the same model.
pub fn default_model() -> Result<(PathBuf, bool)> {
    let path = PathBuf::from("runs/models").join(format!("{DEFAULT_PRESET}.gguf"));
    if path.exists() {
        return Ok((path, false));
    }
    std::fs::create_dir_all("runs/models").context("creating runs/models")?;
    let opts = opledger_gguf::SynthOptions::new(DEFAULT_PRESET);
    opledger_gguf::synthesize(&opts, &path, &mut |_, _| {})
        .with_context(|| format!("writing the default model {}", path.display()))?;
    Ok((path, true))
}
