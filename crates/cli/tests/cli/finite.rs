//! The check "outputs finite": a GGUF whose weights are NaN (everything else valid) is not
//! timed. Its logits hash the same in every mode, so "outputs bit-identical" alone would pass
//! it; every engine checks the logits of every run and the command exits 3.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use assert_cmd::Command;
use predicates::prelude::*;

/// tiny-llama written by the synthesiser, then every byte of `output.weight` (Q8_0: blocks of an
/// f16 scale and 32 int8) set to 0xFF through the reader's tensor offsets: every scale is an
/// f16 NaN, so every logit is NaN in both engines. (A NaN activation alone is not enough for
/// candle: its quantised matmul quantises the activations with a max that skips NaN, and returns
/// finite zeros.)
fn nan_model(dir: &Path) -> PathBuf {
    let model = dir.join("nan.gguf");
    Command::cargo_bin("opledger")
        .unwrap()
        .args(["synth", "--preset", "tiny-llama", "-q", "-o"])
        .arg(&model)
        .assert()
        .success();
    let gguf = opledger_gguf::GgufFile::open(&model).unwrap();
    let t = gguf.tensor("output.weight").unwrap();
    assert_eq!(t.ggml_type.name(), "Q8_0");
    assert!(f16_is_nan(0xFFFF));
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(&model)
        .unwrap();
    f.seek(SeekFrom::Start(gguf.data_offset_bytes + t.offset_bytes))
        .unwrap();
    f.write_all(&vec![0xFF; t.size_bytes as usize]).unwrap();
    model
}

/// An f16 is NaN when its exponent bits are all set and its mantissa is not zero.
fn f16_is_nan(bits: u16) -> bool {
    bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0
}

#[test]
fn a_model_with_nan_weights_fails_profile_with_exit_3() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = nan_model(dir.path());
    // the file is still valid: the gate accepts it, only the numbers are NaN
    opledger_gguf::GgufFile::open(&model).unwrap();
    for engine in ["llama.cpp", "candle"] {
        let out = dir.path().join(format!("run-{engine}"));
        Command::cargo_bin("opledger")
            .unwrap()
            .args([
                "profile",
                "-p",
                "8",
                "-r",
                "1",
                "-t",
                "2",
                "--no-noise-gate",
            ])
            .args(["--engine", engine, "-m"])
            .arg(&model)
            .arg("-o")
            .arg(&out)
            .assert()
            .code(3)
            .stderr(
                predicate::str::contains("check failed")
                    .and(predicate::str::contains("outputs finite"))
                    .and(predicate::str::contains("non-finite logits")),
            );
        // nothing measured was written: no run folder is left behind
        assert!(
            !out.exists(),
            "{engine}: a folder was left at {}",
            out.display()
        );
    }
}

#[test]
fn every_measuring_command_refuses_nan_logits_with_exit_3() {
    let _machine = crate::machine::shared();
    let dir = tempfile::tempdir().unwrap();
    let model = nan_model(dir.path());
    let commands: [&[&str]; 7] = [
        &[
            "profile",
            "-p",
            "8",
            "-n",
            "2",
            "--parallel",
            "2",
            "-r",
            "1",
        ],
        &["sweep", "-p", "8", "--max-depth", "16", "-r", "1"],
        &["waste", "-p", "8", "-r", "1"],
        &["ops", "-p", "8", "-r", "1"],
        &["ledger", "-p", "8", "-r", "1", "--method", "share"],
        &["ab", "-p", "8", "-r", "4", "--b", "threads=1"],
        &["discover", "-p", "8", "-r", "4", "--knobs", "threads=1"],
    ];
    for (i, args) in commands.iter().enumerate() {
        Command::cargo_bin("opledger")
            .unwrap()
            .args(*args)
            .args(["-t", "2", "-m"])
            .arg(&model)
            .arg("-o")
            .arg(dir.path().join(format!("run-{i}")))
            .assert()
            .code(3)
            .stderr(predicate::str::contains("outputs finite"));
    }
}
