//! The GGUF gate on arbitrary bytes: the reader gives a file or an error, then the llama.cpp
//! validator and the data reader run on whatever it accepted. Any panic, overflow (built with
//! debug assertions), out-of-bounds access or oversized allocation is a crash.
#![no_main]

use std::io::Cursor;

use libfuzzer_sys::fuzz_target;
use opledger_gguf::{validate_for_llama, GgufFile};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::read_from(Cursor::new(data), "fuzz.gguf") else {
        return;
    };
    let _ = validate_for_llama(&file);
    // Tensor data lies inside the file (the reader checked it), so this reads at most the
    // input's size in all.
    let mut cursor = Cursor::new(data);
    for t in &file.tensors {
        let data = file.read_tensor_data(&mut cursor, &t.name);
        assert!(data.is_ok_and(|d| d.len() as u64 == t.size_bytes));
    }
});
