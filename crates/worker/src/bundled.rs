//! The worker cargo built with this opledger (`build.rs`: `tools/llama-worker` linked against
//! the llama.cpp of `llama-cpp-sys-2`), embedded in the binary and written out on first use, so
//! `--engine llama.cpp` needs nothing more than `cargo build` and the opledger binary still
//! travels alone to another machine.
//!
//! The file lands in `$XDG_CACHE_HOME/opledger` (else `~/.cache/opledger`, else the temporary
//! folder), in a folder named after the BLAKE3 of its bytes: one file per build, written once
//! (to a temporary name, then renamed), never overwritten by another build's.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The bundled worker's bytes.
const BYTES: &[u8] = include_bytes!(env!("OPLEDGER_BUNDLED_WORKER"));

/// The bundled worker's BLAKE3, hex.
pub fn blake3() -> &'static str {
    static H: OnceLock<String> = OnceLock::new();
    H.get_or_init(|| blake3::hash(BYTES).to_hex().to_string())
}

/// The path of the bundled worker, written out on first use.
pub fn path() -> Result<PathBuf, String> {
    static P: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    P.get_or_init(|| {
        let mut tried = Vec::new();
        for base in cache_bases() {
            match write_into(&base) {
                Ok(p) => return Ok(p),
                Err(e) => tried.push(format!("{}: {e}", base.display())),
            }
        }
        Err(format!(
            "the bundled llama.cpp worker could not be written out ({})",
            tried.join("; ")
        ))
    })
    .clone()
}

fn cache_bases() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(x) = std::env::var_os("XDG_CACHE_HOME").filter(|x| !x.is_empty()) {
        v.push(PathBuf::from(x).join("opledger"));
    }
    if let Some(h) = std::env::var_os("HOME").filter(|x| !x.is_empty()) {
        v.push(PathBuf::from(h).join(".cache/opledger"));
    }
    v.push(std::env::temp_dir().join("opledger"));
    v
}

fn write_into(base: &Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = base.join(format!("llama-worker-{}", &blake3()[..16]));
    let file = dir.join("opledger-llama-worker");
    if let Ok(m) = std::fs::metadata(&file) {
        if m.is_file() && m.len() == BYTES.len() as u64 && m.permissions().mode() & 0o111 != 0 {
            return Ok(file);
        }
    }
    std::fs::create_dir_all(&dir)?;
    let tmp = dir.join(format!(".opledger-llama-worker.{}", std::process::id()));
    {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(BYTES)?;
        f.sync_all()?;
    }
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))?;
    // another process may have written the same bytes meanwhile: renaming over it is harmless
    std::fs::rename(&tmp, &file)?;
    Ok(file)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bundled_worker_is_written_once_and_is_the_embedded_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let p = write_into(dir.path()).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), BYTES);
        let m1 = std::fs::metadata(&p).unwrap().modified().unwrap();
        // a second call finds it and leaves it as it is
        let q = write_into(dir.path()).unwrap();
        assert_eq!(p, q);
        assert_eq!(std::fs::metadata(&q).unwrap().modified().unwrap(), m1);
        // a file of another length under that name (a torn write) is replaced
        std::fs::write(&p, b"torn").unwrap();
        let r = write_into(dir.path()).unwrap();
        assert_eq!(std::fs::read(&r).unwrap(), BYTES);
        // the worker answers --hello with the protocol this crate speaks
        let out = std::process::Command::new(&r)
            .arg("--hello")
            .output()
            .unwrap();
        let hello =
            crate::protocol::parse_hello(std::str::from_utf8(&out.stdout).unwrap().trim()).unwrap();
        assert!(
            hello.llama.build.starts_with("llama-cpp-sys-2 "),
            "{:?}",
            hello.llama.build
        );
    }
}
