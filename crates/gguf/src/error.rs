//! The error of reading, validating and writing GGUF files; every message names the file.

use std::path::PathBuf;

use crate::types::GgmlType;

/// What went wrong with a GGUF file, and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: I/O error")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("{path}: not a GGUF file (magic {found:#010x})")]
    BadMagic { path: PathBuf, found: u32 },

    #[error("{path}: unsupported GGUF version {found} (this reader takes versions 2 and 3)")]
    BadVersion { path: PathBuf, found: u32 },

    #[error("{path}: truncated: {what} at offset {offset_bytes} runs past the end of the file")]
    Truncated {
        path: PathBuf,
        what: String,
        offset_bytes: u64,
    },

    #[error(
        "{path}: {what} is {count}, more than a file of {file_size_bytes} bytes can hold \
         (corrupt or hostile file)"
    )]
    CountTooLarge {
        path: PathBuf,
        what: String,
        count: u64,
        file_size_bytes: u64,
    },

    #[error("{path}: {what} is not valid UTF-8")]
    NotUtf8 { path: PathBuf, what: String },

    #[error("{path}: metadata key {index} is empty")]
    EmptyKey { path: PathBuf, index: u64 },

    #[error("{path}: duplicate metadata key '{key}'")]
    DuplicateKey { path: PathBuf, key: String },

    #[error("{path}: metadata key '{key}' has invalid value type {type_id}{detail}")]
    BadValueType {
        path: PathBuf,
        key: String,
        type_id: u32,
        detail: &'static str,
    },

    #[error("{path}: bad general.alignment: {detail}")]
    BadAlignment { path: PathBuf, detail: String },

    #[error("{path}: duplicate tensor name '{name}'")]
    DuplicateTensor { path: PathBuf, name: String },

    #[error("{path}: tensor name '{name}' is {len_bytes} bytes long; ggml allows at most 63")]
    NameTooLong {
        path: PathBuf,
        name: String,
        len_bytes: u64,
    },

    #[error("{path}: tensor '{name}': {detail}")]
    BadDims {
        path: PathBuf,
        name: String,
        detail: String,
    },

    #[error(
        "{path}: tensor '{name}': shape {dims:?} has more elements or bytes than fit in 63 bits"
    )]
    DimsOverflow {
        path: PathBuf,
        name: String,
        dims: Vec<u64>,
    },

    #[error("{path}: tensor '{name}': unknown ggml type id {type_id}{detail}")]
    BadType {
        path: PathBuf,
        name: String,
        type_id: u32,
        detail: String,
    },

    #[error(
        "{path}: tensor '{name}': ne[0] = {ne0} is not a multiple of the {ggml_type} block size \
         {block_size}"
    )]
    NotBlockMultiple {
        path: PathBuf,
        name: String,
        ggml_type: GgmlType,
        ne0: u64,
        block_size: u32,
    },

    #[error(
        "{path}: tensor '{name}': data offset {offset_bytes} is not a multiple of the alignment \
         {alignment}"
    )]
    Misaligned {
        path: PathBuf,
        name: String,
        offset_bytes: u64,
        alignment: u64,
    },

    #[error(
        "{path}: tensor '{name}': data ends at byte {end_bytes}, past the end of the file \
         ({file_size_bytes} bytes)"
    )]
    TensorOutOfBounds {
        path: PathBuf,
        name: String,
        end_bytes: u64,
        file_size_bytes: u64,
    },

    #[error("{path}: tensors '{first}' and '{second}' overlap in the data section")]
    Overlap {
        path: PathBuf,
        first: String,
        second: String,
    },

    #[error(
        "{path}: tensor '{name}' is at data offset {offset_bytes}; llama.cpp expects the tensors \
         packed in order, this one at {expected_bytes}"
    )]
    NotPacked {
        path: PathBuf,
        name: String,
        offset_bytes: u64,
        expected_bytes: u64,
    },

    #[error("{path}: no tensor named '{name}'")]
    NoSuchTensor { path: PathBuf, name: String },

    #[error("{path}: writer expected data for tensor '{expected}', got '{got}'")]
    WrongTensor {
        path: PathBuf,
        expected: String,
        got: String,
    },

    #[error(
        "{path}: tensor '{name}' takes {expected_bytes} bytes, but {got_bytes} bytes were given"
    )]
    WrongSize {
        path: PathBuf,
        name: String,
        expected_bytes: u64,
        got_bytes: u64,
    },

    #[error("{path}: finished after {written} of {expected} tensors; the file was not written")]
    Unfinished {
        path: PathBuf,
        written: usize,
        expected: usize,
    },

    #[error("{path}: metadata key '{key}' is missing; {required_by} requires it")]
    MissingKey {
        path: PathBuf,
        key: String,
        required_by: String,
    },

    #[error("{path}: metadata key '{key}' has type {found}; {expected} expected")]
    WrongKeyType {
        path: PathBuf,
        key: String,
        expected: String,
        found: String,
    },

    #[error("{path}: metadata key '{key}': {detail}")]
    BadKeyValue {
        path: PathBuf,
        key: String,
        detail: String,
    },

    #[error("{path}: metadata key 'general.architecture' is '{arch}': {reason}")]
    ArchNotLoadable {
        path: PathBuf,
        arch: String,
        reason: String,
    },

    #[error("{path}: tensor '{name}' is missing; llama.cpp's {arch} requires it")]
    MissingTensor {
        path: PathBuf,
        name: String,
        arch: String,
    },

    #[error(
        "{path}: tensor '{name}' has shape {found:?}; the {arch} metadata of the file implies \
         {expected:?}"
    )]
    WrongShape {
        path: PathBuf,
        name: String,
        arch: String,
        expected: Vec<u64>,
        found: Vec<u64>,
    },

    #[error(
        "{path}: the {arch} metadata of the file implies tensor '{name}' of shape {dims:?}, \
         more than ggml can hold"
    )]
    ImpliedShapeOverflow {
        path: PathBuf,
        name: String,
        arch: String,
        dims: Vec<u64>,
    },

    #[error("{path}: tensor '{name}' has type {ggml_type}, but {detail}")]
    UnsupportedType {
        path: PathBuf,
        name: String,
        ggml_type: GgmlType,
        detail: &'static str,
    },
}

impl GgufError {
    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        use GgufError::*;
        match self {
            Io { path, .. }
            | BadMagic { path, .. }
            | BadVersion { path, .. }
            | Truncated { path, .. }
            | CountTooLarge { path, .. }
            | NotUtf8 { path, .. }
            | EmptyKey { path, .. }
            | DuplicateKey { path, .. }
            | BadValueType { path, .. }
            | BadAlignment { path, .. }
            | DuplicateTensor { path, .. }
            | NameTooLong { path, .. }
            | BadDims { path, .. }
            | DimsOverflow { path, .. }
            | BadType { path, .. }
            | NotBlockMultiple { path, .. }
            | Misaligned { path, .. }
            | TensorOutOfBounds { path, .. }
            | Overlap { path, .. }
            | NotPacked { path, .. }
            | NoSuchTensor { path, .. }
            | WrongTensor { path, .. }
            | WrongSize { path, .. }
            | Unfinished { path, .. }
            | MissingKey { path, .. }
            | WrongKeyType { path, .. }
            | BadKeyValue { path, .. }
            | ArchNotLoadable { path, .. }
            | MissingTensor { path, .. }
            | WrongShape { path, .. }
            | ImpliedShapeOverflow { path, .. }
            | UnsupportedType { path, .. } => path,
        }
    }
}
