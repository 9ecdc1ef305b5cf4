//! Rows nobody reads, on real llama.cpp graphs of tiny synthetic models the tool writes itself:
//! qwen3moe's last layer trims its FFN to the requested row (llama.cpp's `out_ids` selection
//! comes before it), qwen35moe's does not; with every logit requested nothing is wasted.
//! llama.cpp is opened as `--engine llama.cpp` opens it: the bundled worker, in its own process.

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use opledger_app::engines::EngineSettings;
use opledger_app::model::ModelFile;
use opledger_core::band::BandRules;
use opledger_core::engine::Work;
use opledger_core::profile::{measure, ProfileConfig};
use opledger_core::waste::{self, Kept, NodeNeed, WasteSummary};
use opledger_gguf::{synthesize, SynthOptions};

const CHUNK: u32 = 64;
const LAST_LAYER: u32 = 3;

fn synth(dir: &Path, preset: &str) -> PathBuf {
    let path = dir.join(format!("{preset}.gguf"));
    synthesize(&SynthOptions::new(preset), &path, &mut |_, _| {}).unwrap();
    path
}

/// Profiles one chunk (1 cycle) and analyses its waste.
fn analyse(
    path: &Path,
    all_logits: bool,
) -> (
    Vec<opledger_core::node::NodeInfo>,
    Vec<NodeNeed>,
    WasteSummary,
) {
    let file = ModelFile::open(path).unwrap();
    let rules = BandRules::builtin(&file.arch.arch).unwrap();
    let mut engine = crate::llama_cpp(path, &EngineSettings::new(2));
    let cfg = ProfileConfig {
        work: Work {
            all_logits,
            token_seed: 1,
            ..Work::prefill(CHUNK, 0)
        },
        cycles: 1,
        warmup: 0,
        overhead_pairs: 0,
        gate: Default::default(),
    };
    let raw = measure(engine.as_mut(), &cfg, &mut |_, _, _| {}).unwrap();
    let (_, needs, summary) = waste::analyse(&raw, &rules, &file.arch).unwrap();
    (raw.graph, needs, summary)
}

fn wasted(needs: &[NodeNeed], i: usize) -> bool {
    needs[i].needed < needs[i].rows
}

#[test]
fn qwen3moe_last_layer_ffn_is_already_trimmed() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (graph, needs, s) = analyse(&synth(dir.path(), "tiny-qwen3moe"), false);
    // llama.cpp selects the last row before the last layer's FFN: every MoE node computes 1 row
    for (i, n) in graph.iter().enumerate() {
        if n.op == "MUL_MAT_ID" && n.layer == Some(LAST_LAYER) {
            assert_eq!((needs[i].needed, needs[i].rows), (1, 1), "{}", n.name);
        }
    }
    let moe = s.bands.iter().find(|b| b.band == "moe").unwrap();
    assert_eq!(moe.wasted_ms_per_token, 0.0);
    assert_eq!(moe.nodes, 0);
    // what is left is the last layer's query path, attention and output projection
    assert!(!s.nodes.is_empty());
    for n in &s.nodes {
        assert_eq!(n.layer, Some(LAST_LAYER), "{}", n.name);
        assert!(
            n.band == "attention" || n.band == "projections",
            "unexpected waste in {} ({}, {})",
            n.name,
            n.op,
            n.band
        );
        assert_eq!((n.needed_rows, n.rows), (1, CHUNK), "{}", n.name);
    }
    assert!(s.nodes.iter().any(|n| n.op == "FLASH_ATTN_EXT"));
    let layers: Vec<Option<u32>> = s.layers.iter().map(|l| l.layer).collect();
    assert_eq!(layers, [Some(LAST_LAYER)]);
    // the K/V projections of the last layer feed cache writes: every row is read
    for (i, n) in graph.iter().enumerate() {
        if n.layer == Some(LAST_LAYER) && (n.name == "Kcur-3" || n.name == "Vcur-3") {
            assert_eq!(needs[i].needed, needs[i].rows, "{}", n.name);
        }
    }
    assert_eq!(s.kept.cache_writes, 8); // K and V of 4 layers
    assert_eq!((s.kept.logits_nodes, s.kept.logits_rows), (1, 1));
    assert!(s.kept.other_sinks.is_empty(), "{:?}", s.kept.other_sinks);
    assert!(s.unknown_ops.is_empty(), "{:?}", s.unknown_ops);
}

#[test]
fn qwen35moe_waste_names_its_last_layer() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (graph, needs, s) = analyse(&synth(dir.path(), "tiny-qwen35moe"), false);
    // the last layer's MoE runs on every row although one is read
    for (i, n) in graph.iter().enumerate() {
        if n.op == "MUL_MAT_ID" && n.layer == Some(LAST_LAYER) {
            assert_eq!((needs[i].needed, needs[i].rows), (1, CHUNK), "{}", n.name);
        }
        // linear-attention layers write their state from every row: nothing wasted there
        if n.layer.is_some_and(|l| l < LAST_LAYER) {
            assert!(!wasted(&needs, i), "{} ({})", n.name, n.op);
        }
    }
    let top = s
        .layers
        .iter()
        .max_by(|a, b| a.wasted_ms_per_token.total_cmp(&b.wasted_ms_per_token))
        .unwrap();
    assert_eq!(top.layer, Some(LAST_LAYER));
    assert!(s
        .layers
        .iter()
        .all(|l| l.layer.is_none() || l.layer == Some(LAST_LAYER)));
    let moe = s.bands.iter().find(|b| b.band == "moe").unwrap();
    assert!(moe.wasted_ms_per_token > 0.0);
    assert!(s.wasted_share > 0.0 && s.wasted_share < 1.0);
    // cache writes: K and V of the full-attention layer, conv and delta-net state of the others
    assert!(s.kept.cache_writes >= 2 + 2 * 3, "{}", s.kept.cache_writes);
    assert!(needs.iter().any(|d| d.kept == Some(Kept::Logits)));
    assert!(s.unknown_ops.is_empty(), "{:?}", s.unknown_ops);
}

#[test]
fn with_all_logits_nothing_is_wasted() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    for preset in ["tiny-qwen3moe", "tiny-qwen35moe"] {
        let (_, needs, s) = analyse(&synth(dir.path(), preset), true);
        assert_eq!(s.wasted_share, 0.0, "{preset}");
        assert!(s.nodes.is_empty(), "{preset}: {:?}", s.nodes.first());
        assert!(needs.iter().all(|d| d.needed == d.rows), "{preset}");
        assert_eq!(s.kept.logits_rows, CHUNK, "{preset}");
    }
}

#[test]
fn waste_command_measures_or_reads_a_stored_profile() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-qwen35moe");
    let opledger = || Command::cargo_bin("opledger").unwrap();
    let profile = dir.path().join("profile");
    opledger()
        .args([
            "profile", "-p", "64", "-r", "1", "--warmup", "0", "-t", "2", "-q", "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&profile)
        .assert()
        .success();
    let from_run = dir.path().join("waste-from-run");
    let out = opledger()
        .args(["waste", "--json", "--run"])
        .arg(&profile)
        .arg("-o")
        .arg(&from_run)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let s: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(s["schema_version"], 1);
    assert_eq!(s["tokens"], 64);
    assert_eq!(s["logits"], "last");
    assert!(s["wasted_share"].as_f64().unwrap() > 0.0);
    assert!(s["source_run"].as_str().unwrap().ends_with("profile"));
    for f in [
        "manifest.json",
        "raw.json",
        "summary.json",
        "table.txt",
        "summary.md",
        "nodes.csv",
    ] {
        assert!(from_run.join(f).is_file(), "{f} missing");
    }
    assert!(!from_run.join("INCOMPLETE").exists());
    let table = std::fs::read_to_string(from_run.join("table.txt")).unwrap();
    assert!(table.contains("is spent on rows nobody reads"), "{table}");

    // measured by the command itself, with every logit requested: no waste
    let measured = dir.path().join("waste-measured");
    let out = opledger()
        .args([
            "waste",
            "-p",
            "64",
            "-r",
            "1",
            "--warmup",
            "0",
            "-t",
            "2",
            "--all-logits",
            "--json",
            "-m",
        ])
        .arg(&model)
        .arg("-o")
        .arg(&measured)
        .assert()
        .success()
        .get_output()
        .stdout
        .clone();
    let s: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(s["logits"], "all");
    assert_eq!(s["wasted_share"], 0.0);

    // the folder is write-once, and --run takes no measuring options
    opledger()
        .args(["waste", "-q", "--run"])
        .arg(&profile)
        .arg("-o")
        .arg(&from_run)
        .assert()
        .failure();
    opledger()
        .args(["waste", "-p", "32", "--run"])
        .arg(&profile)
        .assert()
        .failure();
}
