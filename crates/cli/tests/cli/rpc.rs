//! A model split across this machine's CPU and llama.cpp RPC servers (`opledger rpc-server`
//! processes on loopback): the same logits as one process, every node on a device, the bytes
//! between devices against the architecture, the network's share growing with a slower link,
//! and the faults (an unreachable server, another protocol version, a server that never
//! answers, one killed or stopped mid-run) ending in clear errors within the timeout.
//!
//! Every process a test starts is killed and waited for when its guard drops (no zombies).

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use opledger_app::model::ModelFile;
use opledger_core::profile::{CheckStatus, ProfileRaw, ProfileSummary};
use opledger_core::split::{copy_of, TRANSFER_OP};
use opledger_gguf::{synthesize, SynthOptions};

fn bin() -> PathBuf {
    assert_cmd::cargo::cargo_bin("opledger")
}

/// A port nothing listens on right now.
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A child process killed and reaped on drop.
pub(crate) struct Proc {
    child: Child,
    port: u16,
}

impl Proc {
    /// `opledger <args>` listening on `port`, once it accepts connections.
    fn listening(args: &[&str], port: u16) -> Proc {
        let child = Command::new(bin())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let p = Proc { child, port };
        let t0 = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{args:?} never listened"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    pub(crate) fn server() -> Proc {
        let port = free_port();
        let p = port.to_string();
        Proc::listening(&["rpc-server", "--port", &p, "-t", "1"], port)
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn tiny_llama(dir: &Path) -> PathBuf {
    let path = dir.join("tiny-llama.gguf");
    synthesize(&SynthOptions::new("tiny-llama"), &path, &mut |_, _| {}).unwrap();
    path
}

/// `opledger profile` of a 16-token chunk over `servers`, run as a process of its own (a failed
/// remote device ends the process).
fn profile(model: &Path, servers: &[String], extra: &[&str], out: &Path) -> Command {
    let mut c = Command::new(bin());
    c.arg("profile")
        .arg("-m")
        .arg(model)
        .args(["-p", "16", "-t", "1", "--no-noise-gate", "--json"])
        .arg("--rpc")
        .arg(servers.join(","))
        .args(extra)
        .arg("-o")
        .arg(out);
    c
}

/// A profile over `servers` that succeeds, and its summary.
pub(crate) fn profiled(
    model: &Path,
    servers: &[String],
    extra: &[&str],
    out: &Path,
) -> ProfileSummary {
    let o = profile(model, servers, extra, out).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Waits for a child for at most `limit`; kills it and fails the test past that (a hang).
fn wait_at_most(child: &mut Child, limit: Duration) -> ExitStatus {
    let t0 = Instant::now();
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the run did not end within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

#[test]
fn a_split_across_two_servers_computes_one_process_logits_with_every_node_and_byte_accounted() {
    let _m = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_llama(dir.path());
    let arch = ModelFile::open(&model).unwrap().arch;
    assert_eq!(arch.layers.len(), 4);
    let (s1, s2) = (Proc::server(), Proc::server());
    let run = dir.path().join("run");
    let summary = profiled(
        &model,
        &[s1.endpoint(), s2.endpoint()],
        &["-r", "2", "--rpc-split", "2,1,1"],
        &run,
    );
    let raw = ProfileRaw::read(&run.join("raw.json")).unwrap();
    let check = |name: &str| {
        let c = summary.checks.iter().find(|c| c.name == name).unwrap();
        assert_eq!(c.status, CheckStatus::Pass, "{name}: {}", c.detail);
    };
    // the split's logits are one process's within the A/B tolerance; every node on a device
    check("split outputs");
    check("devices");
    check("coverage");
    assert!(raw.graph.iter().all(|n| n.device.is_some()));
    let (cpu, r1, r2) = (
        "CPU".to_string(),
        format!("RPC0[{}]", s1.endpoint()),
        format!("RPC1[{}]", s2.endpoint()),
    );
    // the weights of each layer were read on the device the split asked for
    for n in raw.graph.iter().filter(|n| n.op != TRANSFER_OP) {
        for w in n.srcs.iter().flatten().filter(|s| s.is_weight) {
            let layer = w
                .name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next());
            let want = match layer.map(|l| l.parse::<u32>().unwrap()) {
                Some(0 | 1) => &cpu,
                Some(2) => &r1,
                Some(3) => &r2,
                // token embedding on the CPU; output norm and head with the last server
                _ if w.name.starts_with("token_embd") => &cpu,
                _ if w.name.starts_with("output") => &r2,
                // tensors every layer shares (rope_freqs) go where each layer runs
                _ => continue,
            };
            assert_eq!(n.device.as_ref(), Some(want), "{} reads {}", n.name, w.name);
        }
    }
    let devices: Vec<&str> = summary.splits.iter().map(|r| r.device.as_str()).collect();
    assert_eq!(devices, [cpu.as_str(), r1.as_str(), r2.as_str()]);

    // bytes between devices: activations of [n_embd, tokens] f32 and the graph inputs the
    // next device reads, each as large as on the CPU; the outputs one row of logits
    let residual = arch.n_embd as u64 * 16 * 4;
    let cpu_inputs: std::collections::BTreeMap<&str, u64> = raw
        .graph
        .iter()
        .filter(|n| n.device.as_deref() == Some("CPU"))
        .flat_map(|n| n.srcs.iter().flatten())
        .filter(|s| s.producer.is_none() && !s.is_weight)
        .map(|s| (s.name.as_str(), s.size_bytes))
        .collect();
    let transfers: Vec<_> = raw.graph.iter().filter(|n| n.op == TRANSFER_OP).collect();
    assert_eq!(transfers.len(), 3, "two boundaries and the outputs");
    for (k, t) in transfers[..2].iter().enumerate() {
        let mut activations = 0;
        let mut expected = 0u64;
        for s in t.srcs.iter().flatten() {
            let (_, tensor) = copy_of(&s.name).expect("a transfer carries copies");
            let computed = raw.graph.iter().any(|n| n.name == tensor);
            if computed {
                assert_eq!(s.ne, [arch.n_embd as i64, 16, 1, 1], "{}", s.name);
                assert_eq!(s.size_bytes, residual, "{}", s.name);
                activations += 1;
                expected += residual;
            } else {
                // a graph input: as large as where the CPU reads it, else by hand for 16
                // tokens and one row of logits (positions i32, row selection i32, KV cell
                // indices i64)
                let by_hand = match tensor {
                    "inp_pos" => Some(16 * 4),
                    "out_ids" => Some(4),
                    "attn_inp_k_idxs" | "attn_inp_v_idxs" => Some(16 * 8),
                    _ => None,
                };
                let want = cpu_inputs.get(tensor).copied().or(by_hand);
                assert_eq!(want, Some(s.size_bytes), "input {tensor}");
                expected += s.size_bytes;
            }
        }
        assert!(activations >= 1, "boundary {k} carries no activation");
        assert_eq!(t.out.size_bytes, expected);
        assert_eq!(summary.splits[k + 1].bytes_in, expected);
    }
    assert_eq!(transfers[2].out.size_bytes, arch.n_vocab as u64 * 4);
    let network = summary.band("network").expect("a network band");
    assert!(network.ms_per_token > 0.0 && network.nodes == 3);
    assert_eq!(summary.one_process_fused_ms.map(|s| s.n), Some(2));
    crate::assert_report_reproduces_summary(&run);

    // without the one-process comparison: the split stands, its outputs unverified (a warning)
    let run = dir.path().join("alone");
    let summary = profiled(
        &model,
        &[s1.endpoint(), s2.endpoint()],
        &["-r", "1", "--no-one-process"],
        &run,
    );
    assert!(summary.one_process_fused_ms.is_none());
    assert_eq!(
        summary.one_process_skipped.as_deref(),
        Some("--no-one-process")
    );
    let c = summary
        .checks
        .iter()
        .find(|c| c.name == "split outputs")
        .unwrap();
    assert_eq!(c.status, CheckStatus::Warn, "{}", c.detail);
    crate::assert_report_reproduces_summary(&run);
    // the markdown rendering carries the devices and the splits as the text does
    let md = Command::new(bin())
        .args(["report", "--format", "md"])
        .arg(&run)
        .output()
        .unwrap();
    let md = String::from_utf8_lossy(&md.stdout);
    for want in [
        "By device",
        &format!("| {r1} "),
        "- splits (3): CPU layers 0-",
        "one process not measured: --no-one-process",
    ] {
        assert!(md.contains(want), "{want} not in\n{md}");
    }
}

#[test]
fn a_slower_link_grows_the_network_band() {
    // the test compares two timings of the network: nothing else may run beside it
    let _m = crate::machine::alone();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_llama(dir.path());
    let server = Proc::server();
    let port = free_port();
    let (listen, to) = (format!("127.0.0.1:{port}"), server.endpoint());
    let link = Proc::listening(
        &[
            "rpc-link",
            "--listen",
            &listen,
            "--to",
            &to,
            "--delay-ms",
            "3",
        ],
        port,
    );
    let network = |endpoint: String, name: &str| {
        let run = dir.path().join(name);
        let s = profiled(&model, &[endpoint], &["-r", "3"], &run);
        let band = s.band("network").unwrap().clone();
        (band, s.fused_ms_spread.min)
    };
    let (direct, direct_ms) = network(server.endpoint(), "direct");
    let (slow, slow_ms) = network(link.endpoint(), "slow");
    eprintln!(
        "network TIMED {:.3} -> {:.3} ms, {:.4} -> {:.4} ms/token (corrected {:.4} -> {:.4}), fastest FUSED {direct_ms:.2} -> {slow_ms:.2} ms",
        direct.timed_ms, slow.timed_ms, direct.ms_per_token, slow.ms_per_token,
        direct.ms_per_token_corrected, slow.ms_per_token_corrected,
    );
    // the transfers' TIMED times hold the link: the inputs' wait for a read on the server and
    // the outputs' read back are a round trip (2 x 3 ms) each; one of them as the bound
    assert!(
        slow.timed_ms - direct.timed_ms > 6.0,
        "network TIMED {:.3} -> {:.3} ms",
        direct.timed_ms,
        slow.timed_ms
    );
    // the FUSED run waits for the link at least once each way (the fastest run of each: a busy
    // machine only adds)
    assert!(
        slow_ms - direct_ms > 3.0,
        "fastest FUSED {direct_ms:.2} -> {slow_ms:.2} ms"
    );
    // and the band grows with it, once each node's isolation is taken out (the raw share does
    // not say: every remote node's TIMED time is a round trip of the link too)
    assert!(
        slow.ms_per_token_corrected > direct.ms_per_token_corrected,
        "network corrected {:.4} -> {:.4} ms/token",
        direct.ms_per_token_corrected,
        slow.ms_per_token_corrected
    );
}

#[test]
fn remote_faults_end_in_clear_errors_within_the_timeout() {
    let _m = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = tiny_llama(dir.path());
    let limit = Duration::from_secs(60);

    // nothing listens: refused before any C code runs, nothing measured, no folder left
    let run = dir.path().join("unreachable");
    let t0 = Instant::now();
    let out = profile(
        &model,
        &[format!("127.0.0.1:{}", free_port())],
        &["--rpc-timeout", "5"],
        &run,
    )
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("connection refused"), "{err}");
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert!(!run.exists());

    // a server of another protocol version, and one that accepts but never answers
    for (name, answer) in [("version", true), ("silent", false)] {
        let fake = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = fake.local_addr().unwrap().to_string();
        let server = std::thread::spawn(move || {
            let (mut s, _) = fake.accept().unwrap();
            let mut hello = [0u8; 1 + 8 + 24];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(hello[0], 14, "HELLO");
            if answer {
                let mut rsp = 28u64.to_le_bytes().to_vec();
                rsp.extend_from_slice(&[6, 0, 0, 0]);
                rsp.extend_from_slice(&[0; 24]);
                s.write_all(&rsp).unwrap();
            }
            // hold the connection until the client gives up
            let _ = s.read(&mut [0u8; 1]);
        });
        let run = dir.path().join(name);
        let t0 = Instant::now();
        let out = profile(&model, &[endpoint], &["--rpc-timeout", "2"], &run)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{name}: {err}");
        if answer {
            assert!(err.contains("speaks RPC protocol 6.0.0"), "{err}");
        } else {
            assert!(err.contains("no answer to the HELLO within 2.0 s"), "{err}");
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{name}");
        assert!(!run.exists());
        server.join().unwrap();
    }

    // a server killed (SIGKILL) or stopped (SIGSTOP) in the middle of a run
    for (name, stop) in [("killed", false), ("stopped", true)] {
        let mut server = Proc::server();
        let run = dir.path().join(name);
        // under a guard too: a failed assertion must not leave the run behind
        let mut run_proc = Proc {
            child: profile(
                &model,
                &[server.endpoint()],
                &["-r", "100000", "--rpc-timeout", "3"],
                &run,
            )
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
            port: 0,
        };
        let child = &mut run_proc.child;
        // mid-run: the folder is there and the cycles have started
        let t0 = Instant::now();
        while !run.exists() {
            assert!(t0.elapsed() < limit, "{name}: no run folder");
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(3));
        assert!(
            child.try_wait().unwrap().is_none(),
            "{name}: the run ended early"
        );
        let t1 = Instant::now();
        if stop {
            let pid = server.child.id().to_string();
            assert!(Command::new("kill")
                .args(["-STOP", &pid])
                .status()
                .unwrap()
                .success());
        } else {
            server.child.kill().unwrap();
            server.child.wait().unwrap();
        }
        let status = wait_at_most(child, limit);
        let ended = t1.elapsed();
        let err = stderr_of(child);
        assert_eq!(status.code(), Some(7), "{name}: {err}");
        if stop {
            assert!(err.contains("no progress for 3.0 s"), "{err}");
            assert!(ended < Duration::from_secs(10), "{name}: {ended:?}");
        } else {
            // ggml's own words for a connection that broke
            assert!(err.contains("Remote RPC server crashed"), "{err}");
            assert!(ended < Duration::from_secs(5), "{name}: {ended:?}");
        }
        let marker = std::fs::read_to_string(run.join("INCOMPLETE")).unwrap();
        assert!(marker.starts_with("this run was stopped:"), "{marker}");
        // the stopped server is killed and reaped by its guard
        drop(server);
    }
}

#[test]
fn the_rpc_server_listens_beyond_loopback_only_when_told() {
    let out = Command::new(bin())
        .args(["rpc-server", "--host", "0.0.0.0", "--port", "1"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--allow-remote") && err.contains("no authentication"),
        "{err}"
    );
}
