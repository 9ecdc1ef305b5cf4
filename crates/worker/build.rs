//! With the feature `bundled`, builds the llama.cpp worker (`tools/llama-worker`, C++) against the llama.cpp libraries that
//! `llama-cpp-sys-2` compiled from its vendored sources for this very build (the same ggml CPU
//! options), so `cargo build` yields opledger's llama.cpp engine in one command. The binary is
//! embedded in this crate (`bundled.rs`) and written out once at run time.
//!
//! `llama-cpp-sys-2` declares `links = "llama"` and tells its dependents where the CMake
//! package of the ggml it installed lies (`DEP_LLAMA_GGML_CMAKE_DIR` = `<prefix>/lib/cmake`):
//! the prefix holds `include/llama.h` and `lib/libllama.a`, which the worker's CMake project
//! links with `-DLLAMA_PREBUILT_DIR` (as `scripts/build-worker --from-cargo` does).

use std::path::{Path, PathBuf};

fn main() {
    // without `bundled`, nothing to build: the llama.cpp engine runs a worker the user built
    if std::env::var_os("CARGO_FEATURE_BUNDLED").is_none() {
        println!("cargo:rerun-if-changed=build.rs");
        return;
    }
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let root = manifest.join("../..");
    let src = root.join("tools/llama-worker");
    for f in ["CMakeLists.txt", "worker.h", "worker.cpp", "PROTOCOL.md"] {
        println!("cargo:rerun-if-changed={}", src.join(f).display());
    }
    // every source file of the worker, whatever its name
    println!("cargo:rerun-if-changed={}", src.display());
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_GGML_CMAKE_DIR");

    let cmake_dir = std::env::var("DEP_LLAMA_GGML_CMAKE_DIR").unwrap_or_else(|_| {
        fail("llama-cpp-sys-2 did not say where it installed llama.cpp (DEP_LLAMA_GGML_CMAKE_DIR is unset)")
    });
    // <prefix>/lib/cmake -> <prefix>
    let prefix = Path::new(&cmake_dir)
        .parent()
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| fail(&format!("{cmake_dir} is not <prefix>/lib/cmake")));
    if !prefix.join("include/llama.h").is_file() {
        fail(&format!(
            "{}: no include/llama.h in the llama.cpp llama-cpp-sys-2 installed",
            prefix.display()
        ));
    }
    let version = sys_version(&root.join("Cargo.lock")).unwrap_or_else(|| "unknown".into());
    let out = cmake::Config::new(&src)
        .profile("Release")
        .define("LLAMA_PREBUILT_DIR", &prefix)
        .define("OPLEDGER_LLAMA_BUILD", format!("llama-cpp-sys-2 {version}"))
        .build_target("opledger-llama-worker")
        .build();
    let bin = out.join("build").join("opledger-llama-worker");
    if !bin.is_file() {
        fail(&format!("the worker's build left no {}", bin.display()));
    }
    println!("cargo:rustc-env=OPLEDGER_BUNDLED_WORKER={}", bin.display());
}

/// The version of llama-cpp-sys-2 that Cargo.lock pins (the engine's version in manifests).
fn sys_version(lock: &Path) -> Option<String> {
    let text = std::fs::read_to_string(lock).ok()?;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if l == "name = \"llama-cpp-sys-2\"" {
            let v = lines.next()?;
            return v
                .strip_prefix("version = \"")
                .and_then(|v| v.strip_suffix('"'))
                .map(str::to_string);
        }
    }
    None
}

fn fail(why: &str) -> ! {
    eprintln!("opledger-worker: building the llama.cpp worker failed: {why}");
    std::process::exit(1);
}
