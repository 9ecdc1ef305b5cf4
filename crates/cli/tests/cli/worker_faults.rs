//! A llama.cpp worker that fails, in whatever phase: missing, of another protocol, crashing,
//! hanging, garbling its answers, writing a line past the bound, exiting unasked, killed by
//! SIGILL; during the load, the graph's capture, a TIMED run, decode steps or a sweep unit. Each
//! ends the command with the README's exit code, a message naming the worker, the request and
//! what happened, and no run folder presented as complete. Junk on the worker's stdout and
//! stderr (a backend's logger, a stray printf) is harmless: the protocol has a channel of its
//! own. The fake worker (tests/fixtures/fake_worker.py) answers at once, so the cases take the
//! timeout of the hanging ones and little more.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("opledger")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// A wrapper that runs the fake worker with `spec` (`FAULT` or `FAULT@PHASE`).
fn fake(dir: &Path, spec: &str) -> PathBuf {
    let script = repo().join("crates/cli/tests/fixtures/fake_worker.py");
    let path = dir.join(format!("worker-{}", spec.replace('@', "-at-")));
    std::fs::write(
        &path,
        format!(
            "#!/bin/sh\nexec python3 '{}' '{spec}' \"$@\"\n",
            script.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

/// The line bound the `long` fault writes past (1 MiB): lowered through the test-only
/// environment variable, so that no test writes the real bound's gigabytes.
const TEST_LINE_BOUND: &str = "65536";

/// The command that reaches `phase` of the fake worker: a prefill profile (load, capture, TIMED
/// runs), a decode profile (steps), or a sweep (its units past the first chunk).
fn command_for(phase: &str) -> Vec<&'static str> {
    match phase {
        "step" => vec![
            "profile",
            "-p",
            "16",
            "-n",
            "2",
            "-r",
            "2",
            "-t",
            "1",
            "--no-noise-gate",
            "-q",
        ],
        "sweep" => vec![
            "sweep",
            "-p",
            "16",
            "--max-depth",
            "48",
            "-r",
            "1",
            "-t",
            "1",
            "-q",
        ],
        _ => vec![
            "profile",
            "-p",
            "16",
            "-r",
            "2",
            "-t",
            "1",
            "--no-noise-gate",
            "-q",
        ],
    }
}

/// Runs `args` on `model` with the worker `w` into `out`, the worker's timeout 2 s.
fn run_with(args: &[&str], model: &Path, out: &Path, w: &Path, extra: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .arg("-m")
        .arg(model)
        .arg("-o")
        .arg(out)
        .arg("--llama-worker")
        .arg(w)
        .args(["--worker-timeout", "2"])
        .args(extra)
        .env("OPLEDGER_WORKER_LINE_BOUND", TEST_LINE_BOUND)
        .output()
        .unwrap()
}

/// A failed command's outcome: its exit code, the words its message must hold (the worker's
/// path besides), and no run folder presented as complete.
fn assert_fault(case: &str, o: &Output, w: &Path, out: &Path, code: i32, words: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{case}: {err}");
    for word in words {
        assert!(err.contains(word), "{case}: expected '{word}' in: {err}");
    }
    assert!(
        err.contains(&w.display().to_string()),
        "{case}: the message names the worker: {err}"
    );
    assert!(
        !out.exists() || out.join("INCOMPLETE").exists(),
        "{case}: {} is presented as complete",
        out.display()
    );
}

#[test]
fn worker_faults_end_in_clear_errors_and_no_complete_run_folder() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let missing = dir.path().join("no-such-worker");
    let not_exec = dir.path().join("not-executable");
    std::fs::write(&not_exec, "#!/bin/sh\n").unwrap();
    // (worker, exit code, words the message must hold)
    let cases: Vec<(PathBuf, i32, Vec<&str>)> = vec![
        (missing.clone(), 2, vec!["cannot be started"]),
        (not_exec.clone(), 2, vec!["not executable"]),
        (fake(dir.path(), "version"), 2, vec!["version 99"]),
        (fake(dir.path(), "hello"), 8, vec!["not the protocol"]),
        (fake(dir.path(), "garbage"), 8, vec!["not the protocol"]),
        (fake(dir.path(), "truncated"), 8, vec!["not the protocol"]),
        (
            fake(dir.path(), "wrongid"),
            8,
            vec!["while request 1 was waiting"],
        ),
        (fake(dir.path(), "segv"), 8, vec!["signal 11 (SIGSEGV)"]),
        (
            fake(dir.path(), "abort"),
            8,
            vec!["GGML_ASSERT(fake) failed"],
        ),
        (
            fake(dir.path(), "exit"),
            8,
            vec!["exited with status 3", "out of memory"],
        ),
        (
            fake(dir.path(), "sigill"),
            8,
            vec![
                "signal 4 (SIGILL)",
                "CPU features this machine cannot run",
                "-DGGML_NATIVE=OFF",
                "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON",
            ],
        ),
        (
            fake(dir.path(), "hang"),
            8,
            vec!["did not answer 'load' within"],
        ),
        (
            fake(dir.path(), "nodes"),
            8,
            vec!["the graph changed between runs"],
        ),
    ];
    for (i, (w, code, words)) in cases.iter().enumerate() {
        let out = dir.path().join(format!("run-{i}"));
        let t0 = Instant::now();
        let o = run_with(&command_for("load"), &model, &out, w, &[]);
        assert_fault(&w.display().to_string(), &o, w, &out, *code, words);
        // within the timeout, not the default five minutes
        assert!(t0.elapsed() < Duration::from_secs(60), "{}", w.display());
    }
}

/// Every fault in every phase: exit 8, the worker, the request and what happened named, no run
/// folder presented as complete.
#[test]
fn a_fault_in_any_phase_ends_in_exit_8_naming_the_request_and_what_happened() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    // (phase, the words naming its request)
    let phases = [
        ("load", "'load'"),
        ("capture", "'decode' (observe: capture)"),
        ("timed", "'decode' (observe: timed)"),
        ("step", "'step' (observe: "),
        ("sweep", "'decode' (observe: timed)"),
    ];
    // (fault, the words saying what happened)
    let faults = [
        (
            "segv",
            "was killed by signal 11 (SIGSEGV) while waiting for",
        ),
        ("hang", "did not answer"),
        ("garbage", "wrote a line that is not the protocol"),
        (
            "long",
            "past the bound on a line, 65536 bytes, in answer to",
        ),
        ("exit0", "exited with status 0 while waiting for"),
    ];
    let t0 = Instant::now();
    for (phase, request) in phases {
        for (fault, happened) in faults {
            let spec = format!("{fault}@{phase}");
            let w = fake(dir.path(), &spec);
            let out = dir.path().join(format!("run-{fault}-{phase}"));
            let o = run_with(&command_for(phase), &model, &out, &w, &[]);
            assert_fault(&spec, &o, &w, &out, 8, &[request, happened]);
        }
    }
    // 25 commands, five of them waiting out a 2 s timeout
    assert!(
        t0.elapsed() < Duration::from_secs(240),
        "{:?}",
        t0.elapsed()
    );
}

/// The two requests a profile and a ledger add to the decodes, faulted the same way: the
/// isolation calibration (after a profile's TIMED runs) and a round of in-graph replay (a
/// ledger's replay method, candle the other side on a tiny qwen3moe it loads).
#[test]
fn a_fault_during_the_calibration_or_a_replay_round_ends_in_exit_8() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let qwen3moe = crate::synth(dir.path(), "tiny-qwen3moe");
    let ledger = [
        "ledger",
        "--engines",
        "candle,llama.cpp",
        "--method",
        "replay",
        "-p",
        "16",
        "-r",
        "2",
        "-k",
        "4",
        "--replay-cycles",
        "1",
        "-t",
        "1",
        "-q",
    ];
    for (fault, happened) in [
        (
            "segv",
            "was killed by signal 11 (SIGSEGV) while waiting for",
        ),
        ("hang", "did not answer"),
        ("garbage", "wrote a line that is not the protocol"),
        ("exit0", "exited with status 0 while waiting for"),
    ] {
        for (phase, args, m) in [
            ("calibrate", command_for("timed"), &model),
            ("replay", ledger.to_vec(), &qwen3moe),
        ] {
            let spec = format!("{fault}@{phase}");
            let w = fake(dir.path(), &spec);
            let out = dir.path().join(format!("run-{fault}-{phase}"));
            let o = run_with(&args, m, &out, &w, &[]);
            assert_fault(&spec, &o, &w, &out, 8, &[&format!("'{phase}'"), happened]);
        }
    }
}

/// Junk on the worker's stdout and stderr, in any phase (bytes that are not UTF-8, more than a
/// pipe holds, a line without its end): the command ends as it does with a worker that prints
/// nothing (the fake graph's checks fail alike: exit 3, the run folder complete), and
/// `--verbose` passes the junk through to stderr.
#[test]
fn junk_on_the_worker_s_stdout_and_stderr_is_harmless_in_any_phase() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let files = |out: &Path| {
        let mut f: Vec<String> = std::fs::read_dir(out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        f.sort();
        f
    };
    for phase in ["load", "capture", "timed", "step", "sweep"] {
        let args = command_for(phase);
        let quiet = fake(dir.path(), &format!("ok@{phase}"));
        let noisy = fake(dir.path(), &format!("junk@{phase}"));
        let (out_q, out_n) = (
            dir.path().join(format!("quiet-{phase}")),
            dir.path().join(format!("junk-{phase}")),
        );
        let q = run_with(&args, &model, &out_q, &quiet, &[]);
        let n = run_with(&args, &model, &out_n, &noisy, &["--verbose"]);
        let (err_q, err_n) = (
            String::from_utf8_lossy(&q.stderr),
            String::from_utf8_lossy(&n.stderr),
        );
        assert!(
            !err_q.contains("llama.cpp worker") && !err_n.contains("llama.cpp worker"),
            "{phase}: {err_q}\n---\n{err_n}"
        );
        assert_eq!(q.status.code(), n.status.code(), "{phase}: {err_n}");
        assert!(matches!(n.status.code(), Some(0 | 3)), "{phase}: {err_n}");
        assert!(!out_n.join("INCOMPLETE").exists(), "{phase}");
        assert_eq!(files(&out_q), files(&out_n), "{phase}");
        if args[0] == "profile" {
            let hashes = |out: &Path| {
                let raw: serde_json::Value =
                    serde_json::from_slice(&std::fs::read(out.join("raw.json")).unwrap()).unwrap();
                raw["output_hashes"].clone()
            };
            assert_eq!(hashes(&out_q), hashes(&out_n), "{phase}");
        }
        // --verbose passes the worker's stdout and stderr through, lossily
        assert!(
            err_n.contains("ggml_vulkan: perf \u{fffd}"),
            "{phase}: {}",
            &err_n[..err_n.len().min(2000)]
        );
        assert!(!err_q.contains("ggml_vulkan"), "{phase}");
    }
}

/// The real worker speaks only on the channel it is handed: without one it says how it is run
/// and exits 2; `--hello` prints the hello on stdout and exits 0.
#[test]
fn the_real_worker_runs_on_its_channel_and_says_how_without_one() {
    let _machine = crate::machine::shared();
    let w = crate::worker::worker();
    let o = Command::new(&w).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("no channel") && err.contains("--channel-fd FD") && err.contains("--hello"),
        "{err}"
    );
    assert!(o.stdout.is_empty());

    let o = Command::new(&w)
        .args(["--channel-fd", "999"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--channel-fd 999 is not an open file descriptor"),
        "{err}"
    );

    let o = Command::new(&w).arg("--hello").output().unwrap();
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8(o.stdout).unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    let hello: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(hello["protocol"], "opledger-llama-worker", "{out}");
    assert_eq!(hello["version"], 4, "{out}");
}
