//! Replays the committed fuzz corpus (`fuzz/corpus/gguf`, minimised with `cargo fuzz cmin`)
//! through the gate exactly as the fuzz target does, so CI checks every input the fuzzer kept
//! without running the fuzzer: each must read to a file or an error, never a panic.

use std::io::Cursor;
use std::path::Path;

use opledger_gguf::{validate_for_llama, GgufFile};

#[test]
fn the_fuzz_corpus_reads_without_panics() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/gguf");
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    assert!(entries.len() >= 100, "only {} corpus files", entries.len());
    let (mut accepted, mut validated) = (0, 0);
    for path in &entries {
        let data = std::fs::read(path).unwrap();
        let Ok(file) = GgufFile::read_from(Cursor::new(&data), path) else {
            continue;
        };
        accepted += 1;
        if validate_for_llama(&file).is_ok() {
            validated += 1;
        }
        let mut cursor = Cursor::new(&data);
        for t in &file.tensors {
            let bytes = file.read_tensor_data(&mut cursor, &t.name).unwrap();
            assert_eq!(bytes.len() as u64, t.size_bytes, "{}", path.display());
        }
    }
    eprintln!(
        "{} corpus files: {accepted} read, {validated} validated",
        entries.len()
    );
    // The corpus reaches past the reader into the validator, and some of it passes both.
    assert!(
        accepted > 0 && validated > 0,
        "{accepted} read, {validated} validated"
    );
}
