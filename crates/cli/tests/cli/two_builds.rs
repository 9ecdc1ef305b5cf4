//! Two builds of llama.cpp, one verdict: workers built with `scripts/build-worker` from copies
//! of the vendored llama.cpp sources, A as is and three patched copies the test writes (the
//! vendored tree is never touched): one CPU kernel made slower without changing a value (GEGLU
//! computed 64 times over), a wrong scale (RMS norm's scale x1.5), and one node split into two
//! (Gemma 3's query scale applied as two scales). On Gemma 3 270M: the slowed build passes the
//! output gate bit for bit and its graph matches A's node for node, the GEGLU op group timed over
//! every cycle; the wrong scale is refused by the gate with exit 4 naming the position; the split
//! is seen by the op diff; an A/A of two processes of one build passes its gate bit for bit with
//! its control measured; and one binary at two paths is refused as two builds. The timing
//! verdicts (the slowed band slower, the others not, the A/A no change) are
//! `scripts/acceptance`'s claims: nothing here asserts a timing.

use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::llama_trees::Builds;

fn builds() -> &'static Builds {
    static B: OnceLock<Builds> = OnceLock::new();
    B.get_or_init(|| {
        // about 8 minutes of both cores for the first, a minute each for the others (ccache)
        let _machine = crate::machine::alone();
        crate::llama_trees::build_all()
    })
}

/// `opledger ab` of worker `a` against worker `b` on Gemma 3 270M, prefill 32, 4 cycles, JSON:
/// its exit code, the report, and stderr.
fn ab(a: &Path, b: &Path, out: &Path) -> (i32, Value, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_opledger"))
        .args([
            "ab",
            "-p",
            "32",
            "-r",
            "4",
            "-t",
            "2",
            "--greedy-steps",
            "4",
        ])
        .args(["--no-noise-gate", "--json", "-m"])
        .arg(crate::published::gemma3_270m())
        .arg("--a")
        .arg(format!("worker={}", a.display()))
        .arg("--b")
        .arg(format!("worker={}", b.display()))
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    let json = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
    (
        o.status.code().unwrap_or(-1),
        json,
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

/// Each band's stored verdict is the one its interval and control give (the rule, applied to
/// the stored figures): the report says what its numbers say.
fn verdicts_follow_their_intervals(s: &Value, min_effect: f64) {
    use opledger_core::ab::{BandJudged, Verdict};
    for row in s["ledger"].as_array().unwrap() {
        let j: BandJudged = serde_json::from_value(row["judged"].clone()).unwrap();
        assert_eq!(j.a_cycles.len(), 4, "{row}");
        if j.ratio_lo.is_finite() {
            assert_eq!(
                j.verdict,
                Verdict::against_control(
                    j.ratio_lo,
                    j.ratio_hi,
                    j.control_lo,
                    j.control_hi,
                    min_effect
                ),
                "{row}"
            );
        }
        eprintln!(
            "two builds: {} B/A {:.3} [{:.3}–{:.3}] control {:.3} -> {:?}",
            row["band"], row["ratio"], j.ratio_lo, j.ratio_hi, j.control_ratio, j.verdict
        );
    }
}

#[test]
fn a_slowed_kernel_keeps_the_outputs_and_the_graph_and_is_timed_op_by_op() {
    let b = builds();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (code, r, err) = ab(&b.master, &b.slow, &dir.path().join("slow"));
    // faster, slower, no change (0) or inconclusive (5): never refused, never failed
    assert!(code == 0 || code == 5, "exit {code}: {err}\n{r}");
    let s = &r["scenarios"][0];
    let g = &s["outputs"];
    assert_eq!(g["passed"], true, "{g}");
    assert_eq!(g["bit_identical"], true, "{g}");
    assert_eq!(g["positions"], 32);
    assert_eq!(g["steps"], 4);
    verdicts_follow_their_intervals(s, 0.02);
    // the same graph node for node: everything matched, nothing added, removed or regrouped
    let d = &s["op_diff"];
    assert_eq!(d["a_nodes"], d["b_nodes"], "{d}");
    assert_eq!(d["matched"], d["a_nodes"], "{d}");
    for list in ["added", "removed", "changed", "regrouped"] {
        assert_eq!(d[list].as_array().unwrap().len(), 0, "{list}: {d}");
    }
    // the patched op's group: Gemma 3's GEGLU, one node a layer (18), timed over every cycle
    let ops = d["ops"].as_array().unwrap();
    let glu = ops
        .iter()
        .find(|o| o["op"] == "GEGLU")
        .unwrap_or_else(|| panic!("no GEGLU group in {d}"));
    assert_eq!(glu["nodes"], 18, "{glu}");
    assert!(glu["a_ms_per_token"].as_f64().unwrap() > 0.0, "{glu}");
    eprintln!(
        "two builds: GEGLU B/A {} [{}–{}] {}; the largest op groups: {}",
        glu["ratio"],
        glu["ratio_lo"],
        glu["ratio_hi"],
        glu["verdict"],
        ops.iter()
            .take(3)
            .map(|o| format!("{} {} {}", o["op"], o["name"], o["ratio"]))
            .collect::<Vec<_>>()
            .join("; ")
    );
    // each side says which build it is
    let m: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("slow/manifest.json")).unwrap(),
    )
    .unwrap();
    let set = &m["engine"]["settings"];
    assert_ne!(set["a.worker_blake3"], set["b.worker_blake3"], "{set}");
}

#[test]
fn a_wrong_scale_is_refused_by_the_gate_naming_the_position() {
    let b = builds();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (code, r, err) = ab(&b.master, &b.wrong, &dir.path().join("wrong"));
    assert_eq!(code, 4, "{err}\n{r}");
    let g = &r["scenarios"][0]["outputs"];
    assert_eq!(g["passed"], false, "{g}");
    // every row's logits move: the first position is the first above the bound
    assert_eq!(g["first_over_bound"]["at"]["position"], 0, "{g}");
    assert!(g["max_nmse"].as_f64().unwrap() > 1e-6, "{g}");
    assert_eq!(r["verdict"], "refused");
}

#[test]
fn a_node_split_in_two_is_seen_by_the_op_diff() {
    let b = builds();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (code, r, err) = ab(&b.master, &b.split, &dir.path().join("split"));
    // two scales of a square root round differently: the gate decides, and says why
    assert!([0, 4, 5].contains(&code), "exit {code}: {err}\n{r}");
    let d = &r["scenarios"][0]["op_diff"];
    // B has one more node a layer: a SCALE, either added or the second half of a split
    let (na, nb) = (
        d["a_nodes"].as_u64().unwrap(),
        d["b_nodes"].as_u64().unwrap(),
    );
    assert_eq!(nb, na + 18, "{d}");
    let added_scales = d["added"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["op"] == "SCALE")
        .count();
    let split_scales: usize = d["regrouped"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["kind"] == "split")
        .map(|g| {
            g["b"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|n| n["op"] == "SCALE")
                .count()
                - 1
        })
        .sum();
    assert_eq!(added_scales + split_scales, 18, "{d}");
}

#[test]
fn an_a_a_of_two_processes_of_one_build_passes_bit_for_bit() {
    let b = builds();
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let (code, r, err) = ab(&b.master, &b.master, &dir.path().join("aa"));
    assert!(code == 0 || code == 5, "exit {code}: {err}\n{r}");
    let s = &r["scenarios"][0];
    assert_eq!(s["outputs"]["bit_identical"], true, "{}", s["outputs"]);
    assert_eq!(s["control_ms"].as_array().unwrap().len(), 4);
    verdicts_follow_their_intervals(s, 0.02);
    eprintln!(
        "two builds: A/A B/A {} [{}–{}] {}, control {} [{}–{}]",
        s["ratio"],
        s["ratio_lo"],
        s["ratio_hi"],
        s["verdict"],
        s["control_ratio"],
        s["control_lo"],
        s["control_hi"]
    );
}

#[test]
fn one_binary_at_two_paths_is_refused_as_two_builds() {
    let b = builds();
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("opledger-llama-worker");
    std::fs::copy(&b.master, &copy).unwrap();
    let (code, r, err) = ab(&b.master, &copy, &dir.path().join("same"));
    assert_eq!(code, 2, "{err}\n{r}");
    assert!(err.contains("are one binary"), "{err}");
    // nothing measured: no run folder left behind
    assert!(!dir.path().join("same").exists());
}
