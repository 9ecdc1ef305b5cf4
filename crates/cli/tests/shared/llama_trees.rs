//! Workers built from copies of the vendored llama.cpp sources, as is and with a patch the
//! copy carries (the vendored tree is never touched): the CI's test of two builds
//! (tests/cli/two_builds.rs) and the acceptance claims on them (tests/acceptance) build the same
//! four. Copies and builds live under the target folder (`two-builds/<name>/llama.cpp`), so a
//! later run rebuilds only what changed; `scripts/build-worker` keys each build folder by its
//! tree and compiles through ccache where it is installed.

use std::path::{Path, PathBuf};
use std::process::Command;

/// ggml's CPU options as cargo builds the bundled worker (not GGML_NATIVE: these VMs report AMX
/// and die of SIGILL in its kernels).
const CPU_OPTIONS: [&str; 5] = [
    "-DGGML_NATIVE=OFF",
    "-DGGML_AVX2=ON",
    "-DGGML_FMA=ON",
    "-DGGML_F16C=ON",
    "-DGGML_BMI2=ON",
];

/// The patch of the slowed build: GEGLU's forward computed 64 times (each time from its sources
/// into its own output: the same values).
const SLOW_FROM: &str = "static void ggml_compute_forward_geglu_f32(
        const ggml_compute_params * params,
        ggml_tensor * dst) {";
const SLOW_TO: &str = "static void ggml_compute_forward_geglu_f32_once(
        const ggml_compute_params * params,
        ggml_tensor * dst);
// opledger's test of two builds: a deliberate slowdown, the same values
static void ggml_compute_forward_geglu_f32(
        const ggml_compute_params * params,
        ggml_tensor * dst) {
    for (int rep = 0; rep < 64; ++rep) {
        ggml_compute_forward_geglu_f32_once(params, dst);
    }
}
static void ggml_compute_forward_geglu_f32_once(
        const ggml_compute_params * params,
        ggml_tensor * dst) {";

/// The patch of the wrong build: RMS norm's scale 1.5 times too large.
const WRONG_FROM: &str = "const float scale = 1.0f/sqrtf(mean + eps);";
const WRONG_TO: &str = "const float scale = 1.5f/sqrtf(mean + eps);";

/// The patch of the split build: Gemma 3's query scale as two scales of its square root.
const SPLIT_FROM: &str = "Qcur = ggml_scale(ctx0, Qcur, hparams.f_attention_scale);";
const SPLIT_TO: &str = "Qcur = ggml_scale(ctx0, ggml_scale(ctx0, Qcur, sqrtf(hparams.f_attention_scale)), sqrtf(hparams.f_attention_scale));";

/// The four builds: as is, slowed, wrong, split.
pub struct Builds {
    pub master: PathBuf,
    pub slow: PathBuf,
    // the acceptance target, which includes this file too, reads only master and slow
    #[allow(dead_code)]
    pub wrong: PathBuf,
    #[allow(dead_code)]
    pub split: PathBuf,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn target() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"))
}

/// The llama.cpp tree llama-cpp-sys-2 vendors, as cargo unpacked it.
fn vendored() -> PathBuf {
    let lock = std::fs::read_to_string(repo().join("Cargo.lock")).unwrap();
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"llama-cpp-sys-2\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .expect("llama-cpp-sys-2 in Cargo.lock");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap()).join(".cargo"));
    let registry = home.join("registry/src");
    std::fs::read_dir(&registry)
        .unwrap()
        .flatten()
        .map(|d| {
            d.path()
                .join(format!("llama-cpp-sys-2-{version}/llama.cpp"))
        })
        .find(|p| p.join("include/llama.h").is_file())
        .expect("the vendored llama.cpp unpacked by cargo")
}

/// Copies `from` into `to`, writing only the files whose bytes differ (a copy made by an
/// earlier run keeps its files' times, so its build stays incremental).
fn mirror(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let (src, dst) = (e.path(), to.join(e.file_name()));
        let kind = e.file_type().unwrap();
        if kind.is_dir() {
            mirror(&src, &dst);
        } else if kind.is_file() {
            let bytes = std::fs::read(&src).unwrap();
            if std::fs::read(&dst).ok().as_deref() != Some(&bytes[..]) {
                std::fs::write(&dst, &bytes).unwrap();
            }
        }
    }
}

/// A copy of the vendored tree at `name`, with `patch` (file, from, to) applied to the copy;
/// the patched file is written only when its text changes.
fn tree(name: &str, patch: Option<(&str, &str, &str)>) -> PathBuf {
    let dir = target().join("two-builds").join(name).join("llama.cpp");
    mirror(&vendored(), &dir);
    if let Some((file, from, to)) = patch {
        let path = dir.join(file);
        let original = std::fs::read_to_string(vendored().join(file)).unwrap();
        assert_eq!(
            original.matches(from).count(),
            1,
            "the patch of {name} expects one '{from}' in {file}"
        );
        let patched = original.replacen(from, to, 1);
        if std::fs::read_to_string(&path).ok().as_deref() != Some(&patched) {
            std::fs::write(&path, patched).unwrap();
        }
    }
    dir
}

/// `scripts/build-worker` on `tree` with the CPU options; the worker's path.
fn build(tree: &Path) -> PathBuf {
    let t0 = std::time::Instant::now();
    let o = Command::new(repo().join("scripts/build-worker"))
        .arg("--llama-cpp-dir")
        .arg(tree)
        .arg("--")
        .args(CPU_OPTIONS)
        .env("CARGO_TARGET_DIR", target())
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "building the worker against {} failed: {}",
        tree.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    eprintln!(
        "two builds: {} built in {:.0} s",
        tree.display(),
        t0.elapsed().as_secs_f64()
    );
    PathBuf::from(
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .trim(),
    )
}

/// The four builds, built in turn (the first about 8 minutes of 2 cores cold, each other about
/// a minute with ccache).
pub fn build_all() -> Builds {
    let ops = "ggml/src/ggml-cpu/ops.cpp";
    Builds {
        master: build(&tree("master", None)),
        slow: build(&tree("slow", Some((ops, SLOW_FROM, SLOW_TO)))),
        wrong: build(&tree("wrong", Some((ops, WRONG_FROM, WRONG_TO)))),
        split: build(&tree(
            "split",
            Some(("src/models/gemma3.cpp", SPLIT_FROM, SPLIT_TO)),
        )),
    }
}

/// The patch of the bisect's slowed commit: SWIGLU's forward (the FFN activation of the tiny
/// llama presets) computed 512 times (each time from its sources into its own output: the same
/// values), as [`SLOW_TO`] does to GEGLU.
const SWIGLU_FROM: &str = "static void ggml_compute_forward_swiglu_f32(
        const ggml_compute_params * params,
        ggml_tensor * dst) {";
const SWIGLU_TO: &str = "static void ggml_compute_forward_swiglu_f32_once(
        const ggml_compute_params * params,
        ggml_tensor * dst);
// opledger's test of bisect: a deliberate slowdown, the same values
static void ggml_compute_forward_swiglu_f32(
        const ggml_compute_params * params,
        ggml_tensor * dst) {
    for (int rep = 0; rep < 512; ++rep) {
        ggml_compute_forward_swiglu_f32_once(params, dst);
    }
}
static void ggml_compute_forward_swiglu_f32_once(
        const ggml_compute_params * params,
        ggml_tensor * dst) {";

/// The unbuildable commit's change: a line that is not C++ at the top of a compiled file.
const BROKEN_LINE: &str = "this line is not C++: the build of this commit fails\n";

/// A git history made from the vendored llama.cpp, oldest first: its checkout and the full
/// hash of each commit.
pub struct History {
    pub repo: PathBuf,
    pub commits: Vec<String>,
}

/// The places in [`history`] of the unbuildable commit and of the slowed one.
pub const BROKEN_AT: usize = 3;
pub const SLOWED_AT: usize = 5;

fn git(dir: &Path, args: &[&str], when: u32) {
    // fixed names and dates: the same history has the same hashes on every run
    let date = format!("2026-01-01T00:{:02}:00Z", when);
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args([
            "-c",
            "user.name=opledger",
            "-c",
            "user.email=tests@opledger",
        ])
        .args(["-c", "commit.gpgsign=false", "-c", "core.autocrlf=false"])
        .args(args)
        .env("GIT_AUTHOR_DATE", &date)
        .env("GIT_COMMITTER_DATE", &date)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "git {args:?} in {}: {}",
        dir.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn head(dir: &Path) -> String {
    let o = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(["rev-parse", "HEAD"])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// Eight commits over a copy of the vendored llama.cpp (under the target folder,
/// `bisect/history/llama.cpp`, made once: the same hashes every time): 0 the tree as is, then
/// harmless changes of text files, [`BROKEN_AT`] a line that is not C++ at the top of ggml-cpu's
/// ops.cpp (the next commit removes it), [`SLOWED_AT`] the SWIGLU slowdown. opledger's
/// worktrees of it go to `bisect/work` (given as --work-dir).
pub fn history() -> History {
    let base = target().join("bisect");
    let repo = base.join("history/llama.cpp");
    let ops = "ggml/src/ggml-cpu/ops.cpp";
    let original = std::fs::read_to_string(vendored().join(ops)).unwrap();
    assert_eq!(original.matches(SWIGLU_FROM).count(), 1);
    let slowed = original.replacen(SWIGLU_FROM, SWIGLU_TO, 1);
    type Change = Box<dyn Fn(&Path)>;
    let note = |file: &'static str, text: &'static str| -> Change {
        Box::new(move |dir: &Path| {
            let p = dir.join(file);
            let mut t = std::fs::read_to_string(&p).unwrap_or_default();
            t.push_str(text);
            std::fs::write(&p, t).unwrap();
        })
    };
    let (o1, o2, o3) = (original.clone(), original.clone(), slowed.clone());
    let steps: Vec<(&str, Change)> = vec![
        (
            "docs: a note on bisecting",
            note("BISECT-NOTES.md", "A note.\n"),
        ),
        (
            "docs: another note",
            note("BISECT-NOTES.md", "Another note.\n"),
        ),
        (
            "ggml-cpu: a change that does not compile",
            Box::new(move |dir: &Path| {
                std::fs::write(dir.join(ops), format!("{BROKEN_LINE}{o1}")).unwrap()
            }),
        ),
        (
            "ggml-cpu: fix the build",
            Box::new(move |dir: &Path| std::fs::write(dir.join(ops), &o2).unwrap()),
        ),
        (
            "ggml-cpu: swiglu computed 512 times",
            Box::new(move |dir: &Path| std::fs::write(dir.join(ops), &o3).unwrap()),
        ),
        (
            "docs: a third note",
            note("BISECT-NOTES.md", "A third note.\n"),
        ),
        (
            "docs: a fourth note",
            note("BISECT-NOTES.md", "A fourth note.\n"),
        ),
    ];
    // the history's record is named by what it holds: another patch makes it again
    let key = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (
            SWIGLU_TO,
            BROKEN_LINE,
            &steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        )
            .hash(&mut h);
        h.finish()
    };
    let done = base.join(format!("history/commits-{key:016x}.txt"));
    if let Ok(text) = std::fs::read_to_string(&done) {
        let commits: Vec<String> = text.lines().map(String::from).collect();
        if commits.len() == steps.len() + 1 && head(&repo) == commits[commits.len() - 1] {
            return History { repo, commits };
        }
    }
    // made again from scratch: opledger's worktrees of an old one go too
    let _ = std::fs::remove_dir_all(base.join("history"));
    let _ = std::fs::remove_dir_all(base.join("work"));
    mirror(&vendored(), &repo);
    git(&repo, &["init", "-q", "-b", "master"], 0);
    git(&repo, &["add", "-A"], 0);
    git(&repo, &["commit", "-q", "-m", "the vendored llama.cpp"], 0);
    let mut commits = vec![head(&repo)];
    for (i, (subject, change)) in steps.iter().enumerate() {
        change(&repo);
        git(&repo, &["add", "-A"], i as u32 + 1);
        git(&repo, &["commit", "-q", "-m", subject], i as u32 + 1);
        commits.push(head(&repo));
    }
    std::fs::write(&done, commits.join("\n")).unwrap();
    History { repo, commits }
}

/// The folder opledger's worktrees of [`history`] go to.
pub fn bisect_work_dir() -> PathBuf {
    target().join("bisect/work")
}
