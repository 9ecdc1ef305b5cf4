//! The GGUF gate end to end: `opledger graph` on broken models exits 2 with the file's name and
//! the problem, from the Rust validator, before llama.cpp loads anything (a crash in C would
//! end the process with a signal, not exit code 2).

use std::path::{Path, PathBuf};

use assert_cmd::Command;
use opledger_gguf::synth::plan;
use opledger_gguf::{GgufWriter, SynthOptions, TensorSpec, Value};
use predicates::prelude::*;

/// Writes `preset`'s model (zero data) with its metadata and tensors edited.
fn write_edited(
    path: &Path,
    preset: &str,
    edit_meta: impl FnOnce(&mut Vec<(String, Value)>),
    edit_tensors: impl FnOnce(&mut Vec<TensorSpec>),
) {
    let plan = plan(&SynthOptions::new(preset)).unwrap();
    let mut meta = plan.metadata.clone();
    edit_meta(&mut meta);
    let mut specs = plan.specs();
    edit_tensors(&mut specs);
    let mut w = GgufWriter::create(path, &meta, &specs).unwrap();
    for s in &specs {
        let size = usize::try_from(s.size_bytes().unwrap()).unwrap();
        w.write_tensor(&s.name, &vec![0u8; size]).unwrap();
    }
    w.finish().unwrap();
}

fn graph_refuses(model: &PathBuf, problem: &str) {
    let name = model.file_name().unwrap().to_str().unwrap().to_string();
    Command::cargo_bin("opledger")
        .unwrap()
        .args(["graph", "-p", "8", "-m"])
        .arg(model)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(name).and(predicate::str::contains(problem)));
}

#[test]
fn graph_refuses_broken_models_before_llama_cpp() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();

    let missing = dir.path().join("missing-key.gguf");
    write_edited(
        &missing,
        "tiny-qwen35moe",
        |m| m.retain(|(k, _)| k != "qwen35moe.ssm.state_size"),
        |_| {},
    );
    graph_refuses(
        &missing,
        "metadata key 'qwen35moe.ssm.state_size' is missing; llama.cpp's qwen35moe requires it",
    );

    let shape = dir.path().join("wrong-shape.gguf");
    write_edited(
        &shape,
        "tiny-qwen3",
        |_| {},
        |t| {
            let k = t
                .iter_mut()
                .find(|t| t.name == "blk.1.attn_k.weight")
                .unwrap();
            k.dims = vec![256, 512];
        },
    );
    graph_refuses(
        &shape,
        "tensor 'blk.1.attn_k.weight' has shape [256, 512]; the qwen3 metadata of the file \
         implies [256, 256]",
    );

    // A value llama.cpp would divide by (`(i + 1) % full_attention_interval`).
    let interval = dir.path().join("zero-interval.gguf");
    write_edited(
        &interval,
        "tiny-qwen35moe",
        |m| {
            for (k, v) in m.iter_mut() {
                if k == "qwen35moe.full_attention_interval" {
                    *v = Value::U32(0);
                }
            }
        },
        |_| {},
    );
    graph_refuses(
        &interval,
        "metadata key 'qwen35moe.full_attention_interval': is 0; it must be above 0",
    );

    let whole = dir.path().join("whole.gguf");
    write_edited(&whole, "tiny-llama", |_| {}, |_| {});
    let bytes = std::fs::read(&whole).unwrap();
    let truncated = dir.path().join("truncated-data.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() - 100]).unwrap();
    graph_refuses(&truncated, "tensor 'output.weight': data ends at byte");
}

/// `profile` on a file the linked llama.cpp would refuse or abort on: exit code 2, the file and
/// the key named, before anything is measured (no run folder is written).
fn profile_refuses(model: &Path, out: &Path, problem: &str) {
    let name = model.file_name().unwrap().to_str().unwrap().to_string();
    Command::cargo_bin("opledger")
        .unwrap()
        .args(["profile", "-p", "8", "-r", "1", "-q", "-m"])
        .arg(model)
        .arg("-o")
        .arg(out)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(name).and(predicate::str::contains(problem)));
    assert!(!out.exists(), "{}: a run folder was written", out.display());
}

#[test]
fn profile_refuses_unknown_architectures_and_family_aborts_before_llama_cpp() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();

    // An architecture the linked llama.cpp does not know.
    let unknown = dir.path().join("unknown-arch.gguf");
    write_edited(
        &unknown,
        "tiny-llama",
        |m| {
            for (k, v) in m.iter_mut() {
                if k == "general.architecture" {
                    *v = Value::String("llama5".into());
                }
            }
        },
        |_| {},
    );
    profile_refuses(
        &unknown,
        &dir.path().join("run-unknown"),
        "metadata key 'general.architecture' is 'llama5': not an architecture the linked \
         llama.cpp",
    );

    // A gemma2 whose sliding-window pattern leaves no layer sliding: llama.cpp would abort
    // (GGML_ASSERT(hparams.is_swa_any())) creating the context. Its metadata is checked
    // before any tensor, so one tensor is enough.
    let gemma2 = dir.path().join("gemma2-no-sliding-layer.gguf");
    let meta: Vec<(String, Value)> = [
        ("general.architecture", Value::String("gemma2".into())),
        ("gemma2.context_length", Value::U32(64)),
        ("gemma2.embedding_length", Value::U32(8)),
        ("gemma2.block_count", Value::U32(2)),
        ("gemma2.feed_forward_length", Value::U32(8)),
        ("gemma2.attention.head_count", Value::U32(2)),
        ("gemma2.attention.layer_norm_rms_epsilon", Value::F32(1e-6)),
        ("gemma2.attention.sliding_window", Value::U32(16)),
        ("gemma2.attention.sliding_window_pattern", Value::U32(1)),
        ("gemma2.vocab_size", Value::U32(4)),
        ("tokenizer.ggml.model", Value::String("none".into())),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let specs = [TensorSpec::new(
        "token_embd.weight",
        &[8, 4],
        opledger_gguf::GgmlType::F32,
    )];
    let mut w = GgufWriter::create(&gemma2, &meta, &specs).unwrap();
    w.write_tensor("token_embd.weight", &[0u8; 8 * 4 * 4])
        .unwrap();
    w.finish().unwrap();
    profile_refuses(
        &gemma2,
        &dir.path().join("run-gemma2"),
        "metadata key 'gemma2.attention.sliding_window_pattern': 1 leaves none of the 2 layers \
         with a sliding window",
    );
}

/// Through a worker of another build, an architecture the vendored llama.cpp does not know is
/// that build's to load or refuse: the gate lets it through with a note, and the worker's own
/// llama.cpp refuses it in its words (this worker is of the vendored sources, so it refuses),
/// the worker named, no run folder presented as complete.
#[test]
fn through_another_build_the_worker_s_llama_cpp_decides_which_architectures_load() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    // a llama under a new name, its keys under that name as a new architecture's would be
    let unknown = dir.path().join("unknown-arch.gguf");
    write_edited(
        &unknown,
        "tiny-llama",
        |m| {
            for (k, v) in m.iter_mut() {
                if k == "general.architecture" {
                    *v = Value::String("llama5".into());
                } else if let Some(rest) = k.strip_prefix("llama.") {
                    *k = format!("llama5.{rest}");
                }
            }
        },
        |_| {},
    );
    let worker = crate::worker::worker();
    let out = dir.path().join("run");
    let o = std::process::Command::new(assert_cmd::cargo::cargo_bin("opledger"))
        .args([
            "profile",
            "-p",
            "8",
            "-r",
            "1",
            "-q",
            "--no-noise-gate",
            "-m",
        ])
        .arg(&unknown)
        .arg("-o")
        .arg(&out)
        .arg("--llama-worker")
        .arg(&worker)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("note: 'llama5' is not an architecture the vendored llama.cpp"),
        "{err}"
    );
    assert!(
        err.contains(&worker.display().to_string()) && err.contains("refused 'load'"),
        "{err}"
    );
    assert!(
        err.contains("unknown model architecture: 'llama5'"),
        "{err}"
    );
    // the model is bad input for that build (README "Exit codes": 2), not a worker fault
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        !out.exists() || out.join("INCOMPLETE").exists(),
        "{} is presented as complete",
        out.display()
    );
}

#[test]
fn profile_prints_the_gates_notes_to_stderr_before_measuring() {
    let _machine = crate::machine::shared();
    // A qwen3 model relabelled qwen2: an architecture llama.cpp loads and opledger plans no
    // tensors for. The gate checks its keys and notes that its tensors were not checked;
    // llama.cpp then refuses the extra q/k norm tensors itself, with an error, not an abort.
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("qwen2-relabelled.gguf");
    write_edited(
        &model,
        "tiny-qwen3",
        |m| {
            for (k, v) in m.iter_mut() {
                if let Some(rest) = k.strip_prefix("qwen3.") {
                    *k = format!("qwen2.{rest}");
                }
                if k == "general.architecture" {
                    *v = Value::String("qwen2".into());
                }
            }
        },
        |_| {},
    );
    let out = Command::cargo_bin("opledger")
        .unwrap()
        .args(["profile", "-p", "8", "-r", "1", "-q", "--json", "-m"])
        .arg(&model)
        .arg("-o")
        .arg(dir.path().join("run"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stderr.contains("note: the tensors of this qwen2 file were not checked by opledger"),
        "{stderr}"
    );
    assert!(!stdout.contains("note:"), "{stdout}");
    // An exit code, not a signal: whatever happened after the note, nothing aborted.
    assert!(out.status.code().is_some(), "{:?}\n{stderr}", out.status);
}
