//! llama.cpp in a worker process (tools/llama-worker), two builds of it set against each other:
//! the worker cargo built and embedded in opledger (`worker=bundled`, what `--engine llama.cpp`
//! runs by default), and a worker built here separately against the same llama.cpp libraries
//! (`scripts/build-worker --from-cargo`, the same ggml CPU options). The two builds must capture
//! the same graph, compute the same logits bit for bit and give the same bands; an A/A of two
//! processes of one build, and of the two builds, passes its correctness gate and runs to a
//! verdict. A worker's faults are `worker_faults.rs`'s.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use opledger_core::profile::{CheckStatus, ProfileRaw, ProfileSummary};
use opledger_core::split::TRANSFER_OP;

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("opledger")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The worker built once against the llama.cpp libraries of this very build.
pub(crate) fn worker() -> PathBuf {
    static W: OnceLock<PathBuf> = OnceLock::new();
    W.get_or_init(|| {
        let exe = bin();
        let profile_dir = exe.parent().unwrap();
        let profile = profile_dir
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string();
        let target = profile_dir.parent().unwrap();
        let o = Command::new(repo().join("scripts/build-worker"))
            .args(["--from-cargo", "--profile", &profile])
            .env("CARGO_TARGET_DIR", target)
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "building the worker failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let out = String::from_utf8(o.stdout).unwrap();
        PathBuf::from(out.lines().last().unwrap().trim())
    })
    .clone()
}

fn run(args: &[&str], model: &Path, out: &Path, extra: &[&str]) -> Output {
    Command::new(bin())
        .args(args)
        .arg("-m")
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(extra)
        .output()
        .unwrap()
}

fn stored_profile(dir: &Path) -> (ProfileRaw, ProfileSummary) {
    let raw = serde_json::from_slice(&std::fs::read(dir.join("raw.json")).unwrap()).unwrap();
    let summary =
        serde_json::from_slice(&std::fs::read(dir.join("summary.json")).unwrap()).unwrap();
    (raw, summary)
}

/// The engine block of a run's manifest.
fn manifest_engine(run: &Path) -> serde_json::Value {
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("manifest.json")).unwrap()).unwrap();
    m["engine"].clone()
}

/// A run without `--llama-worker` was measured by the bundled worker: its manifest names the
/// bundled worker's bytes (so the comparison below is of two builds, not one build twice).
fn assert_measured_by_the_bundled_worker(run: &Path) {
    let engine = manifest_engine(run);
    assert_eq!(
        engine["settings"]["worker_blake3"],
        opledger_worker::bundled::blake3(),
        "the run without --llama-worker was not the bundled worker's: {engine}"
    );
}

/// A profile by the bundled worker and one by the worker built here from the same libraries:
/// the same graph node for node, the same logits bit for bit in every mode, the same bands.
#[test]
fn a_worker_built_separately_profiles_as_the_bundled_worker() {
    let _machine = crate::machine::shared();
    let w = worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let args = [
        "profile",
        "-p",
        "32",
        "-r",
        "2",
        "-t",
        "1",
        "--no-noise-gate",
        "-q",
    ];
    let (bundled, through) = (dir.path().join("bundled"), dir.path().join("worker"));
    let o = run(&args, &model, &bundled, &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = run(
        &args,
        &model,
        &through,
        &["--llama-worker", w.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_measured_by_the_bundled_worker(&bundled);
    let (raw_e, sum_e) = stored_profile(&bundled);
    let (raw_w, sum_w) = stored_profile(&through);
    // the same graph, node for node
    assert_eq!(raw_w.graph.len(), raw_e.graph.len());
    for (a, b) in raw_e.graph.iter().zip(&raw_w.graph) {
        assert_eq!((&a.op, &a.name, &a.out.ne), (&b.op, &b.name, &b.out.ne));
        assert_eq!(a.srcs, b.srcs, "sources of node {} ({})", a.index, a.name);
        assert_eq!(
            (a.is_view, a.inplace, a.skipped),
            (b.is_view, b.inplace, b.skipped)
        );
    }
    // the same logits, bit for bit, in every mode
    assert_eq!(
        raw_w.output_hashes, raw_e.output_hashes,
        "the two builds computed different logits"
    );
    // every node carries the device of its buffer; one device is no split
    assert!(
        raw_w
            .graph
            .iter()
            .all(|n| n.device.as_deref() == Some("CPU")),
        "{:?}",
        raw_w
            .graph
            .iter()
            .find(|n| n.device.as_deref() != Some("CPU"))
    );
    assert!(sum_w.devices.is_empty() && sum_w.splits.is_empty());
    assert!(!raw_w.graph.iter().any(|n| n.op == TRANSFER_OP));
    let file = opledger_app::model::ModelFile::open(&model).unwrap();
    let rules = opledger_core::band::BandRules::builtin(&file.arch.arch).unwrap();
    let (assignments, _) = opledger_core::profile::analyse(&raw_w, &rules, &file.arch).unwrap();
    crate::assert_profile_is_sound(&raw_w, &assignments, &sum_w);
    // the same bands
    let names = |s: &ProfileSummary| s.bands.iter().map(|b| b.band.clone()).collect::<Vec<_>>();
    assert_eq!(names(&sum_w), names(&sum_e), "the two builds' bands differ");
    // the manifest records the worker's build next to the model's hash
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(through.join("manifest.json")).unwrap()).unwrap();
    let engine = &m["engine"];
    assert!(
        engine["version"]
            .as_str()
            .unwrap()
            .starts_with("worker: llama.cpp"),
        "{engine}"
    );
    assert_eq!(engine["settings"]["worker"], w.to_str().unwrap());
    assert_eq!(
        engine["settings"]["worker_blake3"].as_str().unwrap().len(),
        64
    );
    assert_eq!(m["model"]["blake3"], {
        let me: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bundled.join("manifest.json")).unwrap()).unwrap();
        me["model"]["blake3"].clone()
    });
}

/// `ab` of two llama.cpp workers measured interleaved on one model.
fn ab(model: &Path, a: &str, b: &str, out: &Path) -> (i32, serde_json::Value, String) {
    let o = Command::new(bin())
        .args([
            "ab", "-p", "64", "-r", "6", "-t", "1", "--json", "--a", a, "--b", b, "-m",
        ])
        .arg(model)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (
        o.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// An A/A of two processes of the worker built here, and of the bundled worker against the worker
/// built here from the same libraries, runs to its end with the same logits on both sides (the correctness gate, bit for bit), every run of both sides and
/// the control, a per-band ledger, and the exit the verdict maps to. Which verdict two processes
/// of the same code get is the machine's affair on shared cores: that claim ("no change") is in
/// `scripts/acceptance` (worker-aa); verdicts under scripted timings and noise, a control that
/// moved included, are core::ab's tests.
#[test]
fn an_a_a_of_two_worker_processes_and_of_two_builds_is_the_same_output_and_runs_to_a_verdict() {
    let _machine = crate::machine::shared();
    let w = worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let worker_side = format!("worker={}", w.display());
    for (a, b, name) in [
        (worker_side.as_str(), worker_side.as_str(), "aa"),
        ("worker=bundled", worker_side.as_str(), "bundled-worker"),
    ] {
        let (code, r, err) = ab(&model, a, b, &dir.path().join(name));
        let s = &r["scenarios"][0];
        // the correctness gate: the same logits
        assert_eq!(s["correctness"]["passed"], true, "{name}: {r} {err}");
        assert_eq!(
            s["correctness"]["max_rel_error"].as_f64(),
            Some(0.0),
            "{name}: {r}"
        );
        let verdict = r["verdict"].as_str().unwrap_or_default();
        let code_of = |v: &str| match v {
            "inconclusive" => Some(5),
            "no_change" | "faster" | "slower" | "faster_in_some" => Some(0),
            _ => None,
        };
        assert_eq!(
            Some(code),
            code_of(verdict),
            "{name}: verdict {verdict}: {err}"
        );
        assert_eq!(s["a_ms"].as_array().unwrap().len(), 6);
        assert_eq!(s["b_ms"].as_array().unwrap().len(), 6);
        for k in [
            "ratio",
            "ratio_lo",
            "ratio_hi",
            "control_ratio",
            "control_lo",
            "control_hi",
        ] {
            assert!(
                s[k].as_f64().is_some_and(|x| x.is_finite() && x > 0.0),
                "{name}: {k} {}",
                s[k]
            );
        }
        assert!(s["ratio_lo"].as_f64() <= s["ratio_hi"].as_f64(), "{name}");
        assert!(!s["ledger"].as_array().unwrap().is_empty(), "{name}: {r}");
    }
}

/// Profiles of the bundled worker and the worker built here taken in turn: the same bands, with
/// the same node counts, each with a finite figure, on both. How far apart the two builds'
/// figures lie is a timing claim: `scripts/acceptance` (worker-bands, within 0.7-1.43 of each
/// other).
#[test]
fn the_bundled_worker_and_a_worker_built_separately_give_the_same_bands_with_figures() {
    let _machine = crate::machine::shared();
    let w = worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    let args = ["profile", "-p", "64", "-r", "3", "-t", "1", "-q"];
    let e = dir.path().join("e");
    let o = run(&args, &model, &e, &[]);
    assert!(
        matches!(o.status.code(), Some(0 | 3)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let t = dir.path().join("w");
    let o = run(&args, &model, &t, &["--llama-worker", w.to_str().unwrap()]);
    assert!(
        matches!(o.status.code(), Some(0 | 3)),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_measured_by_the_bundled_worker(&e);
    let (bundled, through) = (stored_profile(&e).1, stored_profile(&t).1);
    let rows = |s: &ProfileSummary| {
        s.bands
            .iter()
            .map(|b| (b.band.clone(), b.nodes, b.working_nodes))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        rows(&through),
        rows(&bundled),
        "the two builds' bands or their node counts differ"
    );
    for s in [&bundled, &through] {
        assert_eq!(s.coverage, 1.0);
        for b in &s.bands {
            assert!(
                b.ms_per_token.is_finite()
                    && b.ms_per_token >= 0.0
                    && b.ms_per_token_min <= b.ms_per_token
                    && b.ms_per_token <= b.ms_per_token_max,
                "{b:?}"
            );
        }
    }
}

/// A model split over two RPC servers on loopback through the worker built here: the same graph,
/// devices, transfers and logits as the bundled worker's split of the same layers; the isolation
/// of each device measured from that device's own nodes that do no work, stated and removed.
#[test]
fn a_worker_built_separately_splits_a_model_over_rpc_servers_as_the_bundled_worker_does() {
    let _m = crate::machine::shared();
    let w = worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::rpc::tiny_llama(dir.path());
    let (s1, s2) = (crate::rpc::Proc::server(), crate::rpc::Proc::server());
    let servers = [s1.endpoint(), s2.endpoint()];
    let (bundled, through) = (dir.path().join("bundled"), dir.path().join("worker"));
    let extra = ["-r", "2", "--rpc-split", "2,1,1"];
    let _ = crate::rpc::profiled(&model, &servers, &extra, &bundled);
    assert_measured_by_the_bundled_worker(&bundled);
    let mut with_worker = extra.to_vec();
    with_worker.extend(["--llama-worker", w.to_str().unwrap()]);
    let sum = crate::rpc::profiled(&model, &servers, &with_worker, &through);
    let (raw_e, _) = stored_profile(&bundled);
    let (raw, _) = stored_profile(&through);
    // node for node: op, name and device; the transfers in the same places, of the same bytes
    assert_eq!(raw.graph.len(), raw_e.graph.len());
    for (a, b) in raw_e.graph.iter().zip(&raw.graph) {
        assert_eq!((&a.op, &a.name, &a.device), (&b.op, &b.name, &b.device));
        assert_eq!(a.out.size_bytes, b.out.size_bytes, "{}", a.name);
    }
    let (r1, r2) = (
        format!("RPC0[{}]", s1.endpoint()),
        format!("RPC1[{}]", s2.endpoint()),
    );
    let devices: Vec<&str> = sum.splits.iter().map(|r| r.device.as_str()).collect();
    assert_eq!(devices, ["CPU", r1.as_str(), r2.as_str()]);
    assert_eq!(
        raw.graph.iter().filter(|n| n.op == TRANSFER_OP).count(),
        3,
        "two boundaries and the outputs"
    );
    // the bundled worker's split's logits, bit for bit, in every mode; one process's within
    // tolerance
    assert_eq!(
        raw.output_hashes, raw_e.output_hashes,
        "the two builds' splits computed different logits"
    );
    for name in ["devices", "split outputs", "outputs", "coverage"] {
        let c = sum.checks.iter().find(|c| c.name == name).unwrap();
        assert_eq!(c.status, CheckStatus::Pass, "{name}: {}", c.detail);
    }
    assert!(sum.band("network").is_some_and(|b| b.nodes == 3));

    // each device's isolation: the median over cycles of the median TIMED time of its nodes
    // that do no work, computed here from the stored node times
    assert_eq!(sum.isolation_source, "idle nodes of each device");
    let by_hand = |device: &str| {
        let mut per_cycle: Vec<f64> = raw
            .cycles
            .iter()
            .map(|c| {
                let mut v: Vec<f64> = raw
                    .graph
                    .iter()
                    .zip(&c.node_us)
                    .filter(|(n, _)| {
                        n.op != TRANSFER_OP
                            && !n.is_working()
                            && n.device.as_deref() == Some(device)
                    })
                    .map(|(_, &us)| us)
                    .collect();
                v.sort_by(f64::total_cmp);
                assert!(!v.is_empty(), "{device} has no idle node");
                let m = v.len() / 2;
                if v.len() % 2 == 1 {
                    v[m]
                } else {
                    (v[m - 1] + v[m]) / 2.0
                }
            })
            .collect();
        per_cycle.sort_by(f64::total_cmp);
        (per_cycle[0] + per_cycle[per_cycle.len() - 1]) / 2.0
    };
    let iso = &sum.isolation_device_us;
    assert_eq!(iso.len(), 3, "{iso:?}");
    for d in ["CPU", r1.as_str(), r2.as_str()] {
        let want = by_hand(d);
        assert!(
            (iso[d] - want).abs() <= 1e-9 * want.max(1.0),
            "{d}: {} vs {want}",
            iso[d]
        );
    }
    // a server's node that does no work is one graph sent and a round trip; the CPU's, a
    // callback and nothing computed
    assert!(iso[&r1] > iso["CPU"] && iso[&r2] > iso["CPU"], "{iso:?}");
    // removing them explains most of what isolating every remote node added to the TIMED sum
    assert!(
        sum.agreement_corrected.abs() < sum.agreement.abs(),
        "raw {:+.3}, corrected {:+.3}",
        sum.agreement,
        sum.agreement_corrected
    );
    // the manifest records the split and the devices the worker's ggml listed
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(through.join("manifest.json")).unwrap()).unwrap();
    let settings = &m["engine"]["settings"];
    assert_eq!(settings["rpc"], servers.join(","));
    assert_eq!(settings["rpc_split"], "2,1,1");
    let listed = settings["devices"].as_str().unwrap();
    for want in [
        format!("RPC0 ({}", s1.endpoint()),
        format!("RPC1 ({}", s2.endpoint()),
        "CPU (".to_string(),
    ] {
        assert!(listed.contains(&want), "{want} not in {listed}");
    }
    // a server nobody serves is refused before the worker's ggml client meets it (which
    // would abort the worker): the input's error, naming the server, and no run folder
    let nobody = format!(
        "127.0.0.1:{}",
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    );
    let out = dir.path().join("refused");
    let o = Command::new(bin())
        .args(["profile", "-p", "16", "-t", "1", "-q", "--rpc", &nobody])
        .args(["--llama-worker", w.to_str().unwrap(), "-m"])
        .arg(&model)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&nobody) && err.contains("connection refused"),
        "{err}"
    );
    assert!(!out.exists() || out.join("INCOMPLETE").exists());
}

/// A side's `env:NAME=VALUE` knob is set in that side's worker only, and the manifest records
/// the environment each side's worker saw: a worker named by its path, and the bundled worker.
/// A short A/B without the noise gate: what is checked is where the knobs went, not timing.
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

#[test]
fn an_env_knob_reaches_its_side_s_worker_and_the_manifest_says_so() {
    let _machine = crate::machine::shared();
    let w = worker();
    let dir = tempfile::tempdir().unwrap();
    let model = crate::synth(dir.path(), "tiny-qwen35moe");
    // each worker process started logs the requests it is asked under its pid, which its
    // hello reports in its environment: the manifest's side is the process that measured
    let logs = dir.path().join("requests");
    let w = logging_worker(&logs, &w);
    let a = format!("worker={}", w.display());
    let b = format!("worker={},env:GGML_OPLEDGER_SIDE=b", w.display());
    let out = dir.path().join("ab");
    let o = Command::new(bin())
        .args(QUICK_AB)
        .args(["--a", &a, "--b", &b, "-m"])
        .arg(&model)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    // an A/A on a shared machine: any verdict, but not a failure to run
    assert!(
        matches!(o.status.code(), Some(0 | 3 | 5)),
        "{:?}: {err}",
        o.status
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let settings = &m["engine"]["settings"];
    let env_of = |side: &str| {
        settings[format!("{side}.worker_env")]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(env_of("b").contains("GGML_OPLEDGER_SIDE=b"), "{settings}");
    assert!(!env_of("a").contains("GGML_OPLEDGER_SIDE"), "{settings}");
    // no CUDA backend in this worker: no CUDA graphs setting to record
    assert!(settings.get("a.cuda_graphs").is_none(), "{settings}");
    // each side's settings are those of the worker process that measured it: the process its
    // environment names loaded the model and decoded, and the sides' processes differ
    let pid_of = |side: &str| -> String {
        let env = env_of(side);
        env.split(' ')
            .find_map(|kv| kv.strip_prefix("GGML_OPLEDGER_PID="))
            .unwrap_or_else(|| panic!("{side}.worker_env names no pid: {env}"))
            .to_string()
    };
    let (pid_a, pid_b) = (pid_of("a"), pid_of("b"));
    assert_ne!(pid_a, pid_b, "{settings}");
    for (side, pid) in [("a", &pid_a), ("b", &pid_b)] {
        let asked = std::fs::read_to_string(logs.join(format!("requests.{pid}")))
            .unwrap_or_else(|e| panic!("{side}: no requests logged by worker {pid}: {e}"));
        for op in ["load", "decode"] {
            assert!(
                asked.contains(&format!("\"op\":\"{op}\"")),
                "{side}.worker_env is from worker process {pid}, which was not asked to {op} \
                 (the manifest was not written from the worker that measured): {asked}"
            );
        }
    }

    // the bundled worker takes the knob as any other worker does
    let out = dir.path().join("bundled");
    let o = Command::new(bin())
        .args(QUICK_AB)
        .args([
            "--a",
            "worker=bundled,env:GGML_OPLEDGER_SIDE=a",
            "--b",
            "worker=bundled",
        ])
        .arg("-m")
        .arg(&model)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        matches!(o.status.code(), Some(0 | 3 | 5)),
        "{:?}: {err}",
        o.status
    );
    let m: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("manifest.json")).unwrap()).unwrap();
    let settings = &m["engine"]["settings"];
    let env_of = |side: &str| {
        settings[format!("{side}.worker_env")]
            .as_str()
            .unwrap_or_else(|| panic!("no {side}.worker_env: {settings}"))
            .to_string()
    };
    assert!(
        env_of("a").contains("GGML_OPLEDGER_SIDE=a"),
        "the bundled worker of side a did not see its knob: {settings}"
    );
    assert!(
        !env_of("b").contains("GGML_OPLEDGER_SIDE"),
        "side a's knob reached side b: {settings}"
    );
}

/// `worker` behind a proxy that logs what each started process is asked: the proxy (the
/// process opledger starts) sets `GGML_OPLEDGER_PID` to its own pid, which the worker's hello
/// reports among its `GGML_*` environment, hands the worker a channel of its own, and copies
/// every request it passes on from its channel to `logs/requests.<pid>`.
fn logging_worker(logs: &Path, worker: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(logs).unwrap();
    let path = logs.join("logging-worker");
    std::fs::write(
        &path,
        format!(
            r#"#!/usr/bin/env python3
import os, socket, subprocess, sys, threading
pid = os.getpid()
os.environ["GGML_OPLEDGER_PID"] = str(pid)
args = sys.argv[1:]
at = args.index("--channel-fd") + 1
up = socket.socket(fileno=int(args[at]))
ours, theirs = socket.socketpair()
args[at] = str(theirs.fileno())
child = subprocess.Popen(["{worker}"] + args, pass_fds=[theirs.fileno()])
theirs.close()
def answers():
    while data := ours.recv(1 << 16):
        up.sendall(data)
    up.shutdown(socket.SHUT_WR)
threading.Thread(target=answers, daemon=True).start()
with open("{logs}/requests." + str(pid), "wb") as log:
    while data := up.recv(1 << 16):
        log.write(data)
        log.flush()
        ours.sendall(data)
ours.shutdown(socket.SHUT_WR)
sys.exit(child.wait())
"#,
            logs = logs.display(),
            worker = worker.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}
