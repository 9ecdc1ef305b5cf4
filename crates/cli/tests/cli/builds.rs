//! Two builds that stay apart and say who they are: `scripts/build-worker`'s keyed folders,
//! archives and manifests (checked by `scripts/test-build-worker` without compiling llama.cpp).

use std::path::{Path, PathBuf};
use std::process::Command;

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
