//! The acceptance benchmark: the claims about real engines' timing, measured on real models and
//! held against their original bounds. Not part of `cargo test` (the target has `test = false`:
//! a shared, noisy machine decides these figures, not the code alone); run by hand or on a quiet
//! machine through `scripts/acceptance`, which prints every claim with its figure, its bound and
//! pass or fail, writes them as JSON, and exits 1 when any claim failed.
//!
//! Where each claim's method is tested exactly (scripted timings and noise on the mock engine)
//! is said in ARCHITECTURE.md, "Where a timing claim is tested"; this file holds what only a
//! real engine on a real machine can show: that the method's figures come out right there.
//!
//! Usage (after `--` of `cargo test --test acceptance`): `[--json FILE] [--list] [GROUP ...]`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use opledger_core::profile::{CheckStatus, ProfileSummary};
use serde::Serialize;

#[path = "../shared/runs.rs"]
mod runs;

#[path = "../shared/llama_trees.rs"]
mod llama_trees;

/// One claim: what is claimed, the figure measured, the bound it is held against (as written),
/// and whether it held.
#[derive(Debug, Clone, Serialize)]
struct Claim {
    group: &'static str,
    name: String,
    figure: Option<f64>,
    bound: String,
    pass: bool,
    detail: String,
}

/// A group's claims as they are measured.
struct Claims {
    group: &'static str,
    list: Vec<Claim>,
}

impl Claims {
    fn new(group: &'static str) -> Claims {
        Claims {
            group,
            list: Vec::new(),
        }
    }

    /// `figure` held against `bound` (written out for the reader) by `pass`.
    fn add(&mut self, name: &str, figure: f64, bound: &str, pass: bool, detail: String) {
        self.list.push(Claim {
            group: self.group,
            name: name.into(),
            figure: figure.is_finite().then_some(figure),
            bound: bound.into(),
            pass: pass && figure.is_finite(),
            detail,
        });
    }

    /// A claim that is a yes or no (a verdict, a check's status).
    /// The op group of an op diff (its JSON) with the largest B/A is `op`.
    fn op_moved_most(
        &mut self,
        name: &str,
        op_diff: &serde_json::Value,
        op: &str,
    ) -> Result<(), String> {
        let largest = op_diff["ops"]
            .as_array()
            .ok_or("no op diff")?
            .iter()
            .filter(|o| o["ratio"].is_number())
            .max_by(|p, q| {
                p["ratio"]
                    .as_f64()
                    .unwrap_or(0.0)
                    .total_cmp(&q["ratio"].as_f64().unwrap_or(0.0))
            })
            .ok_or("no op group timed")?;
        self.says(
            name,
            &format!(
                "{} {} B/A {}",
                largest["op"], largest["name"], largest["ratio"]
            ),
            op,
            largest["op"] == op,
        );
        Ok(())
    }

    fn says(&mut self, name: &str, said: &str, bound: &str, pass: bool) {
        self.list.push(Claim {
            group: self.group,
            name: name.into(),
            figure: None,
            bound: bound.into(),
            pass,
            detail: said.into(),
        });
    }
}

type Group = fn(&Ctx, &mut Claims) -> Result<(), String>;

/// The claim groups, in the order they run.
const GROUPS: &[(&str, &str, Group)] = &[
    (
        "profile-tiny",
        "the default tiny qwen35moe, 512 tokens: agreement, overhead, no node corrected at 0",
        profile_tiny,
    ),
    (
        "profile-gemma3",
        "Gemma 3 270M, 128 tokens: agreement, overhead, no node corrected at 0",
        profile_gemma3,
    ),
    (
        "isolation",
        "the isolation calibration through the callback costs more than the bare graph compute",
        isolation,
    ),
    (
        "sweep-prefill",
        "tiny qwen35moe, depths 0..8192: attention grows (slope, R²), the MoE band is flat",
        sweep_prefill,
    ),
    (
        "sweep-decode",
        "tiny qwen35moe decode after depths 512..4608: attention grows, experts and projections change far less, the isolation cost removed",
        sweep_decode,
    ),
    (
        "replay-gemma3",
        "in-graph replay of Gemma 3 270M's 128 tokens: the three validations within their bounds",
        replay_gemma3,
    ),
    (
        "replay-tiny",
        "the tiny qwen3moe ledger's llama.cpp replay: reliable, exit 0",
        replay_tiny,
    ),
    (
        "worker-aa",
        "A/A: two processes of the worker built here, and the bundled worker against it (two builds), no change",
        worker_aa,
    ),
    (
        "worker-bands",
        "the bands of the worker built here against the bundled worker's, profiles in turn: within 0.7-1.43",
        worker_bands,
    ),
    (
        "ops-worker",
        "ops timed alone in the worker built here against the bundled worker (tiny qwen35moe, Gemma 3 270M), and the GEMM peak: within 0.8-1.25",
        ops_worker,
    ),
    (
        "two-builds",
        "Gemma 3 270M, workers from copies of the vendored llama.cpp: GEGLU 64x slower is the one band slower and the op that moved most; an A/A of two processes no change",
        two_builds,
    ),
    (
        "bisect",
        "tiny-llama over a git history of the vendored llama.cpp (SWIGLU 512x slower in one commit): dense_ffn named with every step decided, the first bad's band and op; the attention band and harmless ends refused",
        bisect,
    ),
];

struct Ctx {
    dir: tempfile::TempDir,
    worker: std::cell::OnceCell<Result<PathBuf, String>>,
}

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_opledger"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(args: &[&str], extra: &[&Path]) -> Result<Output, String> {
    Command::new(bin())
        .args(args)
        .args(extra)
        .output()
        .map_err(|e| format!("running opledger {}: {e}", args.join(" ")))
}

/// Fails with the command's stderr unless it exited with one of `codes`.
fn expect(o: &Output, codes: &[i32], what: &str) -> Result<(), String> {
    match o.status.code() {
        Some(c) if codes.contains(&c) => Ok(()),
        _ => Err(format!(
            "{what}: {:?}: {}",
            o.status,
            tail(&String::from_utf8_lossy(&o.stderr))
        )),
    }
}

fn tail(s: &str) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(8)..].join("\n")
}

fn json(path: &Path) -> Result<serde_json::Value, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", path.display()))
}

fn num(v: &serde_json::Value, what: &str) -> Result<f64, String> {
    v.as_f64()
        .ok_or_else(|| format!("{what}: not a number: {v}"))
}

impl Ctx {
    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn synth(&self, preset: &str) -> Result<PathBuf, String> {
        let model = self.path(&format!("{preset}.gguf"));
        if !model.exists() {
            let o = run(&["synth", "--preset", preset, "-q", "-o"], &[&model])?;
            expect(&o, &[0], "synth")?;
        }
        Ok(model)
    }

    fn gemma3(&self) -> Result<PathBuf, String> {
        let script = repo().join("scripts/fetch-models");
        let o = Command::new(&script)
            .arg("gemma-3-270m-q4_k_m")
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if !o.status.success() {
            return Err(format!(
                "{} failed: {}",
                script.display(),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        Ok(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
    }

    /// The worker, built once against the llama.cpp libraries of this build.
    fn worker(&self) -> Result<PathBuf, String> {
        self.worker
            .get_or_init(|| {
                let exe = bin();
                let profile_dir = exe.parent().unwrap();
                let profile = profile_dir.file_name().unwrap().to_string_lossy();
                let o = Command::new(repo().join("scripts/build-worker"))
                    .args(["--from-cargo", "--profile", &profile])
                    .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap())
                    .output()
                    .map_err(|e| format!("scripts/build-worker: {e}"))?;
                if !o.status.success() {
                    return Err(format!(
                        "building the worker: {}",
                        tail(&String::from_utf8_lossy(&o.stderr))
                    ));
                }
                let out = String::from_utf8_lossy(&o.stdout);
                Ok(PathBuf::from(out.lines().last().unwrap_or("").trim()))
            })
            .clone()
    }
}

/// A profile's timing claims: agreement within its goal, the instrument's overhead within its
/// goal, and no working node stopped at 0 by removing the isolation cost. The goals are the
/// README's (±3 %, ≤ 1.01), written here, not read from the code that judges them.
fn profile_claims(c: &mut Claims, run: &Path) -> Result<(), String> {
    let s: ProfileSummary = serde_json::from_value(json(&run.join("summary.json"))?)
        .map_err(|e| format!("summary.json: {e}"))?;
    c.add(
        "agreement",
        s.agreement,
        "|sum TIMED / FUSED - 1| <= 0.03",
        s.agreement.abs() <= 0.03,
        format!("{:+.2} %", s.agreement * 100.0),
    );
    c.add(
        "overhead",
        s.overhead,
        "FUSED with instrument / without <= 1.01",
        s.overhead <= 1.01,
        format!("{:.4}", s.overhead),
    );
    let clamped = s
        .checks
        .iter()
        .find(|k| k.name == "corrected at 0")
        .map(|k| k.detail.clone());
    c.says(
        "corrected at 0",
        clamped.as_deref().unwrap_or("no working node stopped at 0"),
        "no working node's TIMED time below its isolation cost",
        clamped.is_none(),
    );
    for name in ["cycles", "noise"] {
        if let Some(k) = s.checks.iter().find(|k| k.name == name) {
            c.says(
                name,
                &k.detail,
                "the check passes",
                k.status == CheckStatus::Pass,
            );
        }
    }
    Ok(())
}

fn profile_tiny(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let run_dir = x.path("profile-tiny");
    let o = run(&["profile", "-q", "-o"], &[&run_dir])?;
    expect(&o, &[0, 3], "profile")?;
    profile_claims(c, &run_dir)
}

fn profile_gemma3(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let model = x.gemma3()?;
    let run_dir = x.path("profile-gemma3");
    let o = run(
        &["profile", "-p", "128", "-r", "5", "-q", "-m"],
        &[&model, Path::new("-o"), &run_dir],
    )?;
    expect(&o, &[0, 3], "profile")?;
    profile_claims(c, &run_dir)
}

/// llama.cpp as `--engine llama.cpp` opens it (the bundled worker) on `model`, `threads` threads.
fn llama_cpp(model: &Path, threads: u32) -> Result<Box<dyn opledger_core::engine::Engine>, String> {
    let file = opledger_app::model::ModelFile::open(model).map_err(|e| e.to_string())?;
    opledger_app::engines::open_engine(
        opledger_app::engines::EngineKind::LlamaCpp,
        &file,
        &opledger_app::engines::EngineSettings::new(threads),
    )
    .map_err(|e| format!("{e:#}"))
}

/// The worker's isolation calibration on the tiny qwen35moe's captured graph (512 tokens, 2
/// threads): each working node's TIMED time through the callback, less a working node's share
/// of the bare graph compute, clamped at 0 node by node, averaged. The callback's path holds
/// the bare compute and more, so the average is above 0; 0 means no node's callback path cost
/// more than the bare compute. (The 1 µs of slack the embedded engine's bare/TIMED comparison
/// had needs the calibration's raw rounds, which the worker engine does not return.)
fn isolation(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    use opledger_core::engine::Work;
    let model = x.synth("tiny-qwen35moe")?;
    let mut e = llama_cpp(&model, 2)?;
    e.prepare(&Work::prefill(512, 0))
        .map_err(|e| e.to_string())?;
    let graph = e.graph().map_err(|e| e.to_string())?;
    let k = e
        .calibrate_isolation()
        .map_err(|e| e.to_string())?
        .ok_or("no calibration of a graph on the CPU")?;
    let working = graph.iter().filter(|n| n.is_working()).count();
    let above = k.each_node_us.iter().filter(|&&us| us > 0.0).count();
    c.add(
        "per node through the callback beyond bare, µs",
        k.per_node_us,
        "> 0",
        k.per_node_us > 0.0,
        format!("{above} of {working} working nodes above 0"),
    );
    Ok(())
}

/// A fit of a sweep's summary: (slope, its standard error, R², change across the sweep, flat).
fn fit(fits: &serde_json::Value, band: &str) -> Result<(f64, f64, f64, f64, bool), String> {
    let f = fits
        .as_array()
        .and_then(|a| a.iter().find(|f| f["band"] == band))
        .ok_or_else(|| format!("no fit of {band}"))?;
    Ok((
        num(&f["fit"]["b"], "b")?,
        num(&f["fit"]["se_b"], "se_b")?,
        num(&f["fit"]["r2"], "r2")?,
        num(&f["change"], "change")?,
        f["flat"].as_bool().ok_or("flat: not a bool")?,
    ))
}

/// Attention grows with depth: a slope beyond three standard errors and a line that explains
/// most of the variation (R² > 0.7).
fn attention_grows(c: &mut Claims, prefix: &str, (b, se, r2, ..): (f64, f64, f64, f64, bool)) {
    c.add(
        &format!("{prefix}attention slope / its standard error"),
        b / se,
        "> 3",
        b > 3.0 * se,
        format!("slope {b:.3e} ± {se:.1e}"),
    );
    c.add(
        &format!("{prefix}attention R²"),
        r2,
        "> 0.7",
        r2 > 0.7,
        String::new(),
    );
}

fn sweep_prefill(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let model = x.synth("tiny-qwen35moe")?;
    let run_dir = x.path("sweep-prefill");
    let o = run(runs::SWEEP_PREFILL, &[&model, Path::new("-o"), &run_dir])?;
    expect(&o, &[0, 3], "sweep")?;
    let s = json(&run_dir.join("summary.json"))?;
    let att = fit(&s["fits"], "attention")?;
    attention_grows(c, "", att);
    c.says(
        "attention not flat",
        &format!("flat = {}", att.4),
        "flat = false",
        !att.4,
    );
    // the FFN does not depend on the context: the sweep's own fit finds it flat (within 10 % or
    // no significant slope), the bound this claim had before it left CI
    let moe = fit(&s["fits"], "moe")?;
    c.says(
        "moe flat",
        &format!("flat = {}, change {:+.1} %", moe.4, moe.3 * 100.0),
        "flat = true",
        moe.4,
    );
    Ok(())
}

fn sweep_decode(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let model = x.synth("tiny-qwen35moe")?;
    let run_dir = x.path("sweep-decode");
    let o = run(runs::SWEEP_DECODE, &[&model, Path::new("-o"), &run_dir])?;
    expect(&o, &[0, 3], "sweep")?;
    let s = json(&run_dir.join("summary.json"))?;
    let d = &s["decode"];
    let att = fit(&d["fits"], "attention")?;
    attention_grows(c, "decode ", att);
    c.add(
        "decode attention change",
        att.3,
        "> 1.0 (more than doubles)",
        att.3 > 1.0,
        String::new(),
    );
    // the bound before it was loosened (e303bc6): under half of their mean, and under a third
    // of attention's relative change
    for band in ["moe", "projections"] {
        let f = fit(&d["fits"], band)?;
        c.add(
            &format!("decode {band} change"),
            f.3,
            "|change| < 0.5 and < attention's / 3",
            f.3.abs() < 0.5 && f.3.abs() < att.3 / 3.0,
            format!("attention's {:.3}", att.3),
        );
    }
    let (corr, raw) = (
        num(&d["mean_abs_agreement_corrected"], "corrected agreement")?,
        num(&d["mean_abs_agreement"], "agreement")?,
    );
    c.add(
        "decode |agreement| corrected / raw",
        corr / raw,
        "< 1 (removing the isolation cost brings TIMED closer to FUSED)",
        corr < raw,
        format!("{corr:.4} against {raw:.4}"),
    );
    Ok(())
}

/// A replay's three validations against the bounds they had when replay was written (1 ± 0.15,
/// 1 ± 0.15, a spread of at most 1.5 and R² of 0.9 or more), written here, not read from
/// `core::replay`.
fn replay_claims(c: &mut Claims, r: &opledger_core::replay::ReplayResult) {
    c.add(
        "replay-all / baseline work",
        r.replay_all_over_baseline,
        "1 ± 0.15",
        (r.replay_all_over_baseline - 1.0).abs() <= 0.15,
        format!("scale {}", r.scale),
    );
    c.add(
        "sum of bands / replay-all",
        r.sum_over_replay_all,
        "1 ± 0.15",
        (r.sum_over_replay_all - 1.0).abs() <= 0.15,
        format!(
            "skipped {:?}",
            r.skipped.iter().map(|b| &b.band).collect::<Vec<_>>()
        ),
    );
    c.add(
        "per-replay cost spread over k",
        r.scaling_spread,
        "<= 1.5",
        r.scaling_spread <= 1.5,
        format!("{:?} ms per replay at k", r.scaling_ms_per_replay),
    );
    c.add(
        "R² of the per-replay line over k",
        r.scaling_r2,
        ">= 0.9",
        r.scaling_r2 >= 0.9,
        String::new(),
    );
    c.says(
        "outputs",
        &format!("identical = {}", r.outputs_identical),
        "bit-identical logits",
        r.outputs_identical,
    );
}

fn replay_gemma3(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    use opledger_core::engine::Work;
    let model = x.gemma3()?;
    let file = opledger_app::model::ModelFile::open(&model).map_err(|e| e.to_string())?;
    let rules =
        opledger_core::band::BandRules::builtin(&file.arch.arch).map_err(|e| e.to_string())?;
    let mut e = llama_cpp(&model, 2)?;
    // each band's expected cost from a profile of three cycles, as `ledger` measures it
    let work = Work::prefill(128, 0);
    let cfg = opledger_core::profile::ProfileConfig {
        work: work.clone(),
        cycles: 3,
        warmup: 1,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = opledger_core::profile::measure(e.as_mut(), &cfg, &mut |_, _, _| {})
        .map_err(|e| e.to_string())?;
    let (_, summary) =
        opledger_core::profile::analyse(&raw, &rules, &file.arch).map_err(|e| e.to_string())?;
    let expected = summary
        .bands
        .iter()
        .map(|b| (b.band.clone(), b.ms_per_token * 128.0))
        .collect();
    e.prepare(&work).map_err(|e| e.to_string())?;
    let graph = e.graph().map_err(|e| e.to_string())?;
    let a = opledger_core::band::Categoriser::new(&rules, &file.arch).categorise(&graph);
    let r = opledger_core::replay::measure_replay(
        e.replayer().map_err(|e| e.to_string())?,
        &graph,
        &a,
        &rules.bands_in(&a),
        128,
        &opledger_core::replay::ReplayConfig { k: 4, cycles: 3 },
        &expected,
        &mut |_, _, _| {},
    )
    .map_err(|e| format!("no replay: {e}"))?;
    replay_claims(c, &r);
    // the bands that carry the work stand out of the noise at some k: the plan may skip only a
    // small one, and the sum of bands then covers the rest
    let skipped: f64 = r.skipped.iter().map(|b| b.expected_ms).sum();
    c.add(
        "skipped bands' share of the work",
        skipped / r.baseline_work_ms,
        "< 0.05",
        skipped < 0.05 * r.baseline_work_ms,
        format!("noise {:.1} ms", r.noise_ms),
    );
    Ok(())
}

fn replay_tiny(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let model = x.synth("tiny-qwen3moe")?;
    let run_dir = x.path("replay-tiny");
    let o = run(runs::LEDGER_REPLAY, &[&model, Path::new("-o"), &run_dir])?;
    expect(&o, &[0, 3], "ledger")?;
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())?;
    if r["replay_b"].is_null() {
        return Err(format!("no llama.cpp replay: {}", r["notes"]));
    }
    let rb: opledger_core::replay::ReplayResult =
        serde_json::from_value(r["replay_b"].clone()).map_err(|e| e.to_string())?;
    replay_claims(c, &rb);
    c.says(
        "exit",
        &format!("{:?}", o.status.code()),
        "0 (every check passed)",
        o.status.code() == Some(0),
    );
    Ok(())
}

fn ab(x: &Ctx, model: &Path, a: &str, b: &str, name: &str) -> Result<serde_json::Value, String> {
    let out = x.path(name);
    let o = run(
        &[
            "ab", "-p", "64", "-r", "6", "-t", "1", "--json", "--a", a, "--b", b, "-m",
        ],
        &[model, Path::new("-o"), &out],
    )?;
    expect(&o, &[0, 5], "ab")?;
    serde_json::from_slice(&o.stdout).map_err(|e| e.to_string())
}

fn worker_aa(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let w = x.worker()?;
    let model = x.synth("tiny-qwen35moe")?;
    let side = format!("worker={}", w.display());
    for (a, b, name) in [
        (side.as_str(), side.as_str(), "worker against worker"),
        ("worker=bundled", side.as_str(), "bundled against worker"),
    ] {
        let r = ab(x, &model, a, b, &name.replace(' ', "-"))?;
        let s = &r["scenarios"][0];
        let verdict = r["verdict"].as_str().unwrap_or("none");
        c.says(
            &format!("{name}: verdict"),
            &format!(
                "{verdict}: B/A {} [{}-{}], control {} [{}-{}]",
                s["ratio"],
                s["ratio_lo"],
                s["ratio_hi"],
                s["control_ratio"],
                s["control_lo"],
                s["control_hi"]
            ),
            "no_change",
            verdict == "no_change",
        );
        // "no change" is also an interval too wide to say anything: the same code in two
        // processes (one build or two of the same sources) must hold 1 inside B/A's interval
        let (lo, hi) = (
            num(&s["ratio_lo"], "ratio_lo")?,
            num(&s["ratio_hi"], "ratio_hi")?,
        );
        c.add(
            &format!("{name}: B/A"),
            num(&s["ratio"], "ratio")?,
            "1 within its interval",
            lo <= 1.0 && 1.0 <= hi,
            format!("[{lo:.3}-{hi:.3}]"),
        );
    }
    Ok(())
}

/// Two builds of llama.cpp from copies of the vendored sources (tests/shared/llama_trees.rs):
/// GEGLU made 64 times slower must be the one band called slower (dense_ffn) and the op diff's
/// largest ratio, every other band without a verdict, the control unmoved; an A/A of two
/// processes of one build no change.
fn two_builds(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let b = llama_trees::build_all();
    let model = x.gemma3()?;
    let side = |w: &Path| format!("worker={}", w.display());
    let r = ab(
        x,
        &model,
        &side(&b.master),
        &side(&b.slow),
        "two-builds-slow",
    )?;
    let s = &r["scenarios"][0];
    c.says(
        "slowed GEGLU: control",
        &format!(
            "A2/A {} [{}-{}] {}",
            s["control_ratio"],
            s["control_lo"],
            s["control_hi"],
            s["control_verdict"].as_str().unwrap_or("none")
        ),
        "not moved",
        !["faster", "slower"].contains(&s["control_verdict"].as_str().unwrap_or("")),
    );
    for row in s["ledger"].as_array().ok_or("no ledger")? {
        let band = row["band"].as_str().unwrap_or("?");
        let j = &row["judged"];
        let verdict = j["verdict"].as_str().unwrap_or("none");
        let (expected, pass) = if band == "dense_ffn" {
            ("slower", verdict == "slower")
        } else {
            ("no verdict", verdict != "slower" && verdict != "faster")
        };
        c.add(
            &format!("slowed GEGLU: {band}"),
            num(&row["ratio"], "ratio")?,
            expected,
            pass,
            format!("[{}-{}] {verdict}", j["ratio_lo"], j["ratio_hi"]),
        );
    }
    c.op_moved_most(
        "slowed GEGLU: the op that moved most",
        &s["op_diff"],
        "GEGLU",
    )?;
    let r = ab(
        x,
        &model,
        &side(&b.master),
        &side(&b.master),
        "two-builds-aa",
    )?;
    let verdict = r["verdict"].as_str().unwrap_or("none");
    let s = &r["scenarios"][0];
    c.says(
        "A/A of two processes of one build",
        &format!(
            "{verdict}: B/A {} [{}-{}], control {} [{}-{}]",
            s["ratio"],
            s["ratio_lo"],
            s["ratio_hi"],
            s["control_ratio"],
            s["control_lo"],
            s["control_hi"]
        ),
        "no_change",
        verdict == "no_change",
    );
    Ok(())
}

fn worker_bands(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let w = x.worker()?;
    let model = x.synth("tiny-qwen35moe")?;
    let args = ["profile", "-p", "64", "-r", "3", "-t", "1", "-q", "-m"];
    let (mut bundled, mut through) = (Vec::new(), Vec::new());
    for round in 0..3 {
        for (list, name, extra) in [
            (&mut bundled, "b", None),
            (&mut through, "w", Some(w.as_path())),
        ] {
            let dir = x.path(&format!("bands-{name}{round}"));
            let mut tail: Vec<&Path> = vec![&model, Path::new("-o"), &dir];
            if let Some(w) = extra {
                tail.extend([Path::new("--llama-worker"), w]);
            }
            let o = run(&args, &tail)?;
            expect(&o, &[0, 3], "profile")?;
            let s: ProfileSummary = serde_json::from_value(json(&dir.join("summary.json"))?)
                .map_err(|e| e.to_string())?;
            list.push(s);
        }
    }
    let median = |v: &[ProfileSummary], band: &str| {
        let mut p: Vec<f64> = v
            .iter()
            .filter_map(|s| s.bands.iter().find(|b| b.band == band))
            .map(|b| b.ms_per_token)
            .collect();
        p.sort_by(f64::total_cmp);
        p[p.len() / 2]
    };
    let total: f64 = bundled[0].bands.iter().map(|b| b.ms_per_token).sum();
    for b in &bundled[0].bands {
        if b.ms_per_token < 0.1 * total {
            continue;
        }
        let ratio = median(&through, &b.band) / median(&bundled, &b.band);
        c.add(
            &format!("{}: worker built here / bundled", b.band),
            ratio,
            "0.7 ..= 1.43",
            (0.7..=1.43).contains(&ratio),
            String::new(),
        );
    }
    Ok(())
}

/// `opledger ops` through the worker built here and the bundled worker in turn, two rounds each,
/// on the tiny model and Gemma 3 270M: per op row, the median over rounds of each build's
/// median; the geometric mean of built here / bundled over the rows of 5 µs or more (two builds
/// of the same sources against the same libraries: the same kernels on the same thread pool),
/// each row printed. Then the GEMM probe of both builds, in turn.
fn ops_worker(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let w = x.worker()?;
    let models = [
        ("tiny", x.synth("tiny-qwen35moe")?),
        ("gemma3", x.gemma3()?),
    ];
    let args = [
        "ops",
        "-p",
        "64",
        "-r",
        "1",
        "--reps",
        "15",
        "-t",
        "1",
        "-q",
        "--rotate-mib",
        "64",
        "-m",
    ];
    for (label, model) in &models {
        let (mut bundled, mut through) = (Vec::new(), Vec::new());
        for round in 0..2 {
            for (list, name, extra) in [
                (&mut bundled, "b", None),
                (&mut through, "w", Some(w.as_path())),
            ] {
                let dir = x.path(&format!("ops-{label}-{name}{round}"));
                let mut tail: Vec<&Path> = vec![model, Path::new("-o"), &dir];
                if let Some(w) = extra {
                    tail.extend([Path::new("--llama-worker"), w]);
                }
                let o = run(&args, &tail)?;
                expect(&o, &[0], "ops")?;
                list.push(json(&dir.join("ops.json"))?);
            }
        }
        let rows = |runs: &[serde_json::Value]| -> Result<Vec<(String, f64)>, String> {
            let first = runs[0]["rows"].as_array().ok_or("ops.json without rows")?;
            (0..first.len())
                .map(|i| {
                    let r = &first[i];
                    let key = format!("{} {} {}", r["op"], r["signature"], r["routing"]);
                    let mut m: Vec<f64> = runs
                        .iter()
                        .map(|run| num(&run["rows"][i]["median_us"], "median_us"))
                        .collect::<Result<_, _>>()?;
                    m.sort_by(f64::total_cmp);
                    Ok((key, m[m.len() / 2]))
                })
                .collect()
        };
        let (e, t) = (rows(&bundled)?, rows(&through)?);
        if e.iter().map(|r| &r.0).ne(t.iter().map(|r| &r.0)) {
            return Err(format!(
                "{label}: the op rows of the worker built here differ from the bundled worker's"
            ));
        }
        let mut logs = Vec::new();
        for ((key, eu), (_, wu)) in e.iter().zip(&t) {
            eprintln!("    {label} {key}: bundled {eu:.1} µs, built here {wu:.1} µs");
            if *eu >= 5.0 {
                logs.push((wu / eu).ln());
            }
        }
        if logs.is_empty() {
            return Err(format!("{label}: no op row of 5 µs or more"));
        }
        let geo = (logs.iter().sum::<f64>() / logs.len() as f64).exp();
        let (lo, hi) = logs
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), l| (a.min(*l), b.max(*l)));
        c.add(
            &format!("{label}: ops built here / bundled"),
            geo,
            "0.8 ..= 1.25",
            (0.8..=1.25).contains(&geo),
            format!(
                "{} rows, each {:.2} to {:.2}",
                logs.len(),
                lo.exp(),
                hi.exp()
            ),
        );
    }
    // the GEMM probe, the two builds in turn
    let file = opledger_app::model::ModelFile::open(&models[0].1).map_err(|e| e.to_string())?;
    let settings = |worker: Option<&Path>| opledger_app::engines::EngineSettings {
        threads: 1,
        flash_attn: opledger_app::engines::FlashAttn::Auto,
        gpu_layers: 0,
        verbose: false,
        no_repack: false,
        knobs: Default::default(),
        rpc: None,
        worker: worker.map(|p| opledger_app::engines::WorkerSettings {
            path: p.to_path_buf(),
            timeout: opledger_app::engines::DEFAULT_WORKER_TIMEOUT,
        }),
    };
    let kind = opledger_app::engines::EngineKind::LlamaCpp;
    let open = |s| opledger_app::engines::open_engine(kind, &file, &s).map_err(|e| e.to_string());
    let mut engines = [open(settings(None))?, open(settings(Some(&w)))?];
    let mut peaks = [Vec::new(), Vec::new()];
    for _ in 0..3 {
        for (e, p) in engines.iter_mut().zip(&mut peaks) {
            let (gflops, _) = e
                .gemm_peak()
                .map_err(|e| e.to_string())?
                .ok_or("no GEMM peak")?;
            p.push(gflops);
        }
    }
    for p in &mut peaks {
        p.sort_by(f64::total_cmp);
    }
    let ratio = peaks[1][1] / peaks[0][1];
    c.add(
        "GEMM peak built here / bundled",
        ratio,
        "0.8 ..= 1.25",
        (0.8..=1.25).contains(&ratio),
        format!(
            "GFLOP/s bundled {:.1} ({:.1}-{:.1}), built here {:.1} ({:.1}-{:.1})",
            peaks[0][1], peaks[0][0], peaks[0][2], peaks[1][1], peaks[1][0], peaks[1][2]
        ),
    );
    Ok(())
}

/// `opledger bisect` over [`llama_trees::history`] from `good` to `bad` on tiny-llama, one
/// thread (as the CI test: two threads' spin barriers on a machine shared with other work
/// turned the ends' control 0.62 [0.27-2.67] in a trial run): its exit code and report.
fn bisect_run(
    x: &Ctx,
    good: usize,
    bad: usize,
    band: &str,
    name: &str,
) -> Result<(i32, serde_json::Value), String> {
    let h = llama_trees::history();
    let model = x.synth("tiny-llama")?;
    let out = x.path(name);
    let o = Command::new(bin())
        .args([
            "bisect",
            "-p",
            "128",
            "-t",
            "1",
            "--json",
            "--band",
            band,
            "--good",
            &h.commits[good],
            "--bad",
            &h.commits[bad],
        ])
        .arg("-m")
        .arg(&model)
        .arg("--repo")
        .arg(&h.repo)
        .arg("--work-dir")
        .arg(llama_trees::bisect_work_dir())
        .arg("-o")
        .arg(&out)
        .output()
        .map_err(|e| format!("running opledger bisect: {e}"))?;
    let code = o.status.code().unwrap_or(-1);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).map_err(|e| {
        format!(
            "bisect {name}: exit {code}, no JSON ({e}): {}",
            tail(&String::from_utf8_lossy(&o.stderr))
        )
    })?;
    Ok((code, r))
}

fn bisect(x: &Ctx, c: &mut Claims) -> Result<(), String> {
    let n = llama_trees::history().commits.len();
    let (code, r) = bisect_run(x, 0, n - 1, "dense_ffn", "bisect-ffn")?;
    let t = &r["ends"]["target"];
    c.add(
        "ends: dense_ffn bad/good, interval's low end",
        num(&t["bad_good"]["lo"], "lo")?,
        "> 2 and slower",
        num(&t["bad_good"]["lo"], "lo")? > 2.0 && t["verdict"] == "slower",
        format!("{} {}", t["bad_good"], t["verdict"]),
    );
    c.says(
        "ends: the control (good's second process)",
        &t["control"].to_string(),
        "within ±5 % (not moved)",
        num(&t["control"]["lo"], "lo")? >= 0.95 && num(&t["control"]["hi"], "hi")? <= 1.05,
    );
    let steps = r["steps"].as_array().ok_or("no steps")?;
    let measured: Vec<&serde_json::Value> = steps
        .iter()
        .filter(|s| s["decision"] != "skipped")
        .collect();
    c.says(
        "the commit named",
        &format!("exit {code}: {}", r["found"]),
        &format!("first bad at {}", llama_trees::SLOWED_AT),
        code == 0
            && r["found"]["kind"] == "first_bad"
            && r["found"]["index"] == llama_trees::SLOWED_AT,
    );
    c.add(
        "measured steps",
        measured.len() as f64,
        "1 to 4",
        !measured.is_empty() && measured.len() <= 4,
        String::new(),
    );
    let skipped: Vec<&serde_json::Value> = steps
        .iter()
        .filter(|s| s["decision"] == "skipped")
        .collect();
    c.says(
        "the unbuildable commit skipped",
        &format!("{} skipped", skipped.len()),
        &format!("the one at {}", llama_trees::BROKEN_AT),
        skipped.len() == 1 && skipped[0]["index"] == llama_trees::BROKEN_AT,
    );
    for s in &measured {
        let cycles = num(&s["cycles"], "cycles")?;
        c.add(
            &format!("step {}: decided in its first round", s["number"]),
            cycles,
            "4 cycles (--cycles), good or bad",
            cycles <= 4.0 && (s["decision"] == "good" || s["decision"] == "bad"),
            format!(
                "mid/good {} mid/bad {} {}",
                s["mid_good"], s["mid_bad"], s["decision"]
            ),
        );
    }
    let fb = &r["first_bad"]["scenario"];
    for row in fb["ledger"].as_array().ok_or("no band table")? {
        let band = row["band"].as_str().unwrap_or("?");
        let verdict = row["judged"]["verdict"].as_str().unwrap_or("none");
        let (expected, pass) = if band == "dense_ffn" {
            ("slower", verdict == "slower")
        } else {
            ("no verdict", verdict != "slower" && verdict != "faster")
        };
        c.add(
            &format!("first bad against its parent: {band}"),
            num(&row["ratio"], "ratio")?,
            expected,
            pass,
            verdict.to_string(),
        );
    }
    c.op_moved_most(
        "first bad against its parent: the op that moved most",
        &fb["op_diff"],
        "SWIGLU",
    )?;
    c.add(
        "wall time: builds",
        num(&r["wall"]["build_seconds"], "builds")?,
        "reported",
        true,
        format!(
            "measurement {} s, in all {} s",
            r["wall"]["measure_seconds"], r["wall"]["total_seconds"]
        ),
    );
    // a band that did not move while the total did
    let (code, r) = bisect_run(x, 0, n - 1, "attention", "bisect-attention")?;
    let why = r["found"]["why"].as_str().unwrap_or("");
    c.says(
        "attention between the same ends: refused, the total moved",
        why,
        "exit 4, did not move while the total did",
        code == 4 && why.contains("did not move") && why.contains("while the total did"),
    );
    // harmless ends
    let (code, r) = bisect_run(x, 0, 2, "dense_ffn", "bisect-aa")?;
    c.says(
        "harmless ends refused",
        r["found"]["why"].as_str().unwrap_or(""),
        "exit 4, nothing to bisect",
        code == 4 && r["found"]["kind"] == "refused",
    );
    Ok(())
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut json_out: Option<PathBuf> = None;
    let mut only: Vec<String> = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--json" => json_out = args.next().map(PathBuf::from),
            "--list" => {
                for (name, what, _) in GROUPS {
                    println!("{name:16} {what}");
                }
                return;
            }
            // what cargo's harness would take: ignored, this target has its own
            "--nocapture" | "--quiet" | "-q" => {}
            g if GROUPS.iter().any(|(n, ..)| *n == g) => only.push(g.into()),
            other => {
                eprintln!("acceptance: unknown argument or group '{other}' (--list names them)");
                std::process::exit(2);
            }
        }
    }
    let ctx = Ctx {
        dir: tempfile::tempdir().expect("a temporary folder"),
        worker: Default::default(),
    };
    let started = Instant::now();
    let mut claims = Vec::new();
    for (name, what, group) in GROUPS {
        if !only.is_empty() && !only.iter().any(|o| o == name) {
            continue;
        }
        eprintln!("acceptance: {name}: {what}");
        let t0 = Instant::now();
        let mut c = Claims::new(name);
        if let Err(e) = group(&ctx, &mut c) {
            c.says("measured", &e, "the measurement runs", false);
        }
        for k in &c.list {
            eprintln!(
                "  {} {:38} {:>10}  bound {}  {}",
                if k.pass { "pass" } else { "FAIL" },
                k.name,
                k.figure.map_or("-".into(), |f| format!("{f:.4}")),
                k.bound,
                k.detail
            );
        }
        eprintln!("  ({:.0} s)", t0.elapsed().as_secs_f64());
        claims.extend(c.list);
    }
    let failed = claims.iter().filter(|c| !c.pass).count();
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let doc = serde_json::json!({
        "claims": claims,
        "passed": claims.len() - failed,
        "failed": failed,
        "seconds": started.elapsed().as_secs_f64(),
        "loadavg_at_end": load.trim(),
        "cpus": std::thread::available_parallelism().map_or(0, |n| n.get()),
    });
    if let Some(p) = &json_out {
        if let Some(d) = p.parent() {
            let _ = std::fs::create_dir_all(d);
        }
        std::fs::write(p, serde_json::to_vec_pretty(&doc).unwrap())
            .unwrap_or_else(|e| panic!("writing {}: {e}", p.display()));
        eprintln!("acceptance: claims written to {}", p.display());
    }
    println!("{} passed, {} failed", claims.len() - failed, failed);
    std::process::exit(if failed == 0 { 0 } else { 1 });
}
