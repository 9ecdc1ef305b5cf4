//! The streaming GGUF writer: header first, then tensor data in order, into a temp file renamed on finish.
//!
//! The layout is the one ggml's own writer produces and llama.cpp's gguf.cpp requires: tensors
//! stored in the order of their infos, each padded to the alignment, the first at offset 0 of a
//! data section that starts at the header's end padded to the alignment.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::reader::{
    align_up, check_tensor_shape, TensorInfo, ALIGNMENT_KEY, DEFAULT_ALIGNMENT, GGUF_MAGIC,
};
use crate::types::GgmlType;
use crate::value::{Array, Value};

/// The version this writer writes.
pub const GGUF_VERSION: u32 = 3;

/// Capacity of the write buffer; bigger chunks go straight to the file.
const BUFFER_BYTES: usize = 4 << 20;

/// A tensor to write: its name, dims (ne[0] first) and type. Offsets are computed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
}

impl TensorSpec {
    pub fn new(name: impl Into<String>, dims: &[u64], ggml_type: GgmlType) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type,
        }
    }

    /// Bytes of data, or `None` when the shape does not fit the type.
    pub fn size_bytes(&self) -> Option<u64> {
        self.ggml_type.tensor_bytes(&self.dims)
    }
}

/// Where everything goes in a file: computed from metadata and tensor specs, before writing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub alignment: u64,
    /// Bytes of the header (magic to the last tensor info), before padding.
    pub header_size_bytes: u64,
    pub data_offset_bytes: u64,
    /// The tensor infos with their offsets (relative to the data section) and sizes.
    pub tensors: Vec<TensorInfo>,
    /// Total size of the file, padding after the last tensor included.
    pub file_size_bytes: u64,
}

impl Layout {
    /// Validates the metadata and tensors (the same rules the reader applies) and places them.
    /// `path` only names the file in errors.
    pub fn compute(
        path: &Path,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> Result<Layout, GgufError> {
        let overflow = |name: &str, dims: &[u64]| GgufError::DimsOverflow {
            path: path.to_path_buf(),
            name: name.to_string(),
            dims: dims.to_vec(),
        };
        let mut keys = std::collections::HashSet::new();
        let mut header: u64 = 4 + 4 + 8 + 8;
        for (i, (key, value)) in metadata.iter().enumerate() {
            if key.is_empty() {
                return Err(GgufError::EmptyKey {
                    path: path.to_path_buf(),
                    index: i as u64,
                });
            }
            if !keys.insert(key.as_str()) {
                return Err(GgufError::DuplicateKey {
                    path: path.to_path_buf(),
                    key: key.clone(),
                });
            }
            header = header.saturating_add(8 + key.len() as u64 + 4 + value.encoded_size_bytes());
        }
        let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
            None => DEFAULT_ALIGNMENT,
            Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
            Some((_, v)) => {
                return Err(GgufError::BadAlignment {
                    path: path.to_path_buf(),
                    detail: format!("{v} ({}); it must be a u32 power of two", v.value_type()),
                })
            }
        };
        let mut names = std::collections::HashSet::new();
        let mut infos = Vec::with_capacity(tensors.len());
        let mut offset: u64 = 0;
        for t in tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufError::DuplicateTensor {
                    path: path.to_path_buf(),
                    name: t.name.clone(),
                });
            }
            let size_bytes = check_tensor_shape(path, &t.name, &t.dims, t.ggml_type)?;
            header = header
                .saturating_add(8 + t.name.len() as u64 + 4 + 8 * t.dims.len() as u64 + 4 + 8);
            infos.push(TensorInfo {
                name: t.name.clone(),
                dims: t.dims.clone(),
                ggml_type: t.ggml_type,
                offset_bytes: offset,
                size_bytes,
            });
            offset = offset
                .checked_add(size_bytes)
                .and_then(|end| align_up(end, alignment))
                .ok_or_else(|| overflow(&t.name, &t.dims))?;
        }
        let data_offset_bytes = if infos.is_empty() {
            header
        } else {
            align_up(header, alignment).unwrap_or(u64::MAX)
        };
        let file_size_bytes = data_offset_bytes.saturating_add(offset);
        Ok(Layout {
            alignment,
            header_size_bytes: header,
            data_offset_bytes,
            tensors: infos,
            file_size_bytes,
        })
    }
}

/// Writes one GGUF file tensor by tensor without holding the data in memory.
///
/// The file is written to a temporary file next to the final path and renamed over it by
/// [`GgufWriter::finish`]; a writer dropped before that removes its temporary file, so a
/// half-written file never sits at the final path.
#[derive(Debug)]
pub struct GgufWriter {
    final_path: PathBuf,
    tmp_path: PathBuf,
    out: Option<BufWriter<File>>,
    layout: Layout,
    /// Index of the tensor whose data comes next.
    current: usize,
    written_in_current_bytes: u64,
    bytes_written: u64,
}

impl GgufWriter {
    /// Computes the layout, creates the temporary file and writes the header.
    pub fn create(
        path: impl AsRef<Path>,
        metadata: &[(String, Value)],
        tensors: &[TensorSpec],
    ) -> Result<GgufWriter, GgufError> {
        let final_path = path.as_ref().to_path_buf();
        let layout = Layout::compute(&final_path, metadata, tensors)?;
        let tmp_path = temp_path_for(&final_path);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp_path)
            .map_err(|source| GgufError::Io {
                path: tmp_path.clone(),
                source,
            })?;
        let mut writer = GgufWriter {
            final_path,
            tmp_path,
            out: Some(BufWriter::with_capacity(BUFFER_BYTES, file)),
            layout,
            current: 0,
            written_in_current_bytes: 0,
            bytes_written: 0,
        };
        let header = encode_header(metadata, &writer.layout.tensors);
        if header.len() as u64 != writer.layout.header_size_bytes {
            return Err(writer.io_error(std::io::Error::other(format!(
                "header is {} bytes, layout computed {}",
                header.len(),
                writer.layout.header_size_bytes
            ))));
        }
        writer.write_raw(&header)?;
        writer.pad_to(writer.layout.data_offset_bytes)?;
        Ok(writer)
    }

    /// The layout being written.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// Bytes the finished file will have.
    pub fn total_size_bytes(&self) -> u64 {
        self.layout.file_size_bytes
    }

    /// Bytes written so far, header and padding included.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    /// The tensor whose data comes next, if any.
    pub fn next_tensor(&self) -> Option<&TensorInfo> {
        self.layout.tensors.get(self.current)
    }

    /// Writes the whole data of the next tensor, which must be named `name`.
    pub fn write_tensor(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufError> {
        let expected = self.expect_tensor(name)?.size_bytes;
        if self.written_in_current_bytes != 0 || bytes.len() as u64 != expected {
            return Err(GgufError::WrongSize {
                path: self.final_path.clone(),
                name: name.to_string(),
                expected_bytes: expected,
                got_bytes: self.written_in_current_bytes + bytes.len() as u64,
            });
        }
        self.write_tensor_chunk(name, bytes)
    }

    /// Writes the next piece of the data of tensor `name`; the tensor is complete when its
    /// pieces add up to its size, and the next call moves on to the next tensor.
    pub fn write_tensor_chunk(&mut self, name: &str, bytes: &[u8]) -> Result<(), GgufError> {
        let info = self.expect_tensor(name)?;
        let size_bytes = info.size_bytes;
        let end_offset = self.layout.data_offset_bytes + info.offset_bytes + size_bytes;
        let got = self
            .written_in_current_bytes
            .saturating_add(bytes.len() as u64);
        if got > size_bytes {
            return Err(GgufError::WrongSize {
                path: self.final_path.clone(),
                name: name.to_string(),
                expected_bytes: size_bytes,
                got_bytes: got,
            });
        }
        self.write_raw(bytes)?;
        self.written_in_current_bytes = got;
        if got == size_bytes {
            let padded = align_up(end_offset, self.layout.alignment).unwrap_or(end_offset);
            self.pad_to(padded)?;
            self.current += 1;
            self.written_in_current_bytes = 0;
        }
        Ok(())
    }

    /// Checks that every tensor was written, flushes, syncs to disk and renames the temporary
    /// file to the final path. Returns the file size.
    pub fn finish(mut self) -> Result<u64, GgufError> {
        let expected = self.layout.tensors.len();
        if self.current != expected {
            return Err(GgufError::Unfinished {
                path: self.final_path.clone(),
                written: self.current,
                expected,
            });
        }
        let Some(out) = self.out.take() else {
            return Err(self.io_error(std::io::Error::other("writer already closed")));
        };
        let file = out.into_inner().map_err(|e| GgufError::Io {
            path: self.tmp_path.clone(),
            source: e.into_error(),
        })?;
        file.sync_all().map_err(|e| self.io_error(e))?;
        drop(file);
        std::fs::rename(&self.tmp_path, &self.final_path).map_err(|source| GgufError::Io {
            path: self.final_path.clone(),
            source,
        })?;
        // Make the rename durable; not every platform lets a directory be opened, so this is
        // best effort.
        if let Some(dir) = self.final_path.parent() {
            let dir = if dir.as_os_str().is_empty() {
                Path::new(".")
            } else {
                dir
            };
            if let Ok(d) = File::open(dir) {
                let _ = d.sync_all();
            }
        }
        // Renamed: nothing left for Drop to remove.
        self.tmp_path = PathBuf::new();
        Ok(self.bytes_written)
    }

    fn expect_tensor(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        match self.layout.tensors.get(self.current) {
            Some(info) if info.name == name => Ok(info),
            Some(info) => Err(GgufError::WrongTensor {
                path: self.final_path.clone(),
                expected: info.name.clone(),
                got: name.to_string(),
            }),
            None => Err(GgufError::WrongTensor {
                path: self.final_path.clone(),
                expected: "(none: every tensor is written)".to_string(),
                got: name.to_string(),
            }),
        }
    }

    fn io_error(&self, source: std::io::Error) -> GgufError {
        GgufError::Io {
            path: self.tmp_path.clone(),
            source,
        }
    }

    fn write_raw(&mut self, bytes: &[u8]) -> Result<(), GgufError> {
        let Some(out) = self.out.as_mut() else {
            return Err(self.io_error(std::io::Error::other("writer already closed")));
        };
        if let Err(e) = out.write_all(bytes) {
            return Err(self.io_error(e));
        }
        self.bytes_written += bytes.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, target: u64) -> Result<(), GgufError> {
        const ZEROS: [u8; 4096] = [0; 4096];
        while self.bytes_written < target {
            let n = (target - self.bytes_written).min(ZEROS.len() as u64) as usize;
            self.write_raw(ZEROS.get(..n).unwrap_or(&ZEROS))?;
        }
        Ok(())
    }
}

impl Drop for GgufWriter {
    fn drop(&mut self) {
        if self.tmp_path.as_os_str().is_empty() {
            return;
        }
        // Unfinished: close and remove the temporary file. Errors cannot be reported here.
        drop(self.out.take());
        let _ = std::fs::remove_file(&self.tmp_path);
    }
}

/// `<dir>/<file name>.<pid>.tmp`: in the same directory, so the final rename is atomic.
fn temp_path_for(path: &Path) -> PathBuf {
    let mut name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "gguf".into());
    name.push(format!(".{}.tmp", std::process::id()));
    path.with_file_name(name)
}

/// The header bytes: magic, version, counts, key-value pairs and tensor infos.
fn encode_header(metadata: &[(String, Value)], tensors: &[TensorInfo]) -> Vec<u8> {
    let mut buf = Vec::new();
    buf.extend_from_slice(&GGUF_MAGIC);
    buf.extend_from_slice(&GGUF_VERSION.to_le_bytes());
    buf.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    buf.extend_from_slice(&(metadata.len() as u64).to_le_bytes());
    for (key, value) in metadata {
        put_string(&mut buf, key);
        buf.extend_from_slice(&value.value_type().id().to_le_bytes());
        put_value(&mut buf, value);
    }
    for t in tensors {
        put_string(&mut buf, &t.name);
        buf.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
        for d in &t.dims {
            buf.extend_from_slice(&d.to_le_bytes());
        }
        buf.extend_from_slice(&t.ggml_type.id().to_le_bytes());
        buf.extend_from_slice(&t.offset_bytes.to_le_bytes());
    }
    buf
}

fn put_string(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
    buf.extend_from_slice(s.as_bytes());
}

fn put_value(buf: &mut Vec<u8>, value: &Value) {
    match value {
        Value::U8(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I8(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::U16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I16(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::U32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::U64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::I64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::F32(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::F64(v) => buf.extend_from_slice(&v.to_le_bytes()),
        Value::Bool(v) => buf.push(u8::from(*v)),
        Value::String(s) => put_string(buf, s),
        Value::Array(a) => put_array(buf, a),
    }
}

fn put_array(buf: &mut Vec<u8>, array: &Array) {
    buf.extend_from_slice(&array.elem_type().id().to_le_bytes());
    buf.extend_from_slice(&(array.len() as u64).to_le_bytes());
    fn each<T: Copy, const N: usize>(buf: &mut Vec<u8>, items: &[T], f: fn(T) -> [u8; N]) {
        for &item in items {
            buf.extend_from_slice(&f(item));
        }
    }
    match array {
        Array::U8(v) => buf.extend_from_slice(v),
        Array::I8(v) => each(buf, v, i8::to_le_bytes),
        Array::U16(v) => each(buf, v, u16::to_le_bytes),
        Array::I16(v) => each(buf, v, i16::to_le_bytes),
        Array::U32(v) => each(buf, v, u32::to_le_bytes),
        Array::I32(v) => each(buf, v, i32::to_le_bytes),
        Array::U64(v) => each(buf, v, u64::to_le_bytes),
        Array::I64(v) => each(buf, v, i64::to_le_bytes),
        Array::F32(v) => each(buf, v, f32::to_le_bytes),
        Array::F64(v) => each(buf, v, f64::to_le_bytes),
        Array::Bool(v) => buf.extend(v.iter().map(|&b| u8::from(b))),
        Array::String(v) => {
            for s in v {
                put_string(buf, s);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::GgufFile;

    fn metadata() -> Vec<(String, Value)> {
        vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("general.alignment".into(), Value::U32(64)),
            ("a.u8".into(), Value::U8(7)),
            ("a.i8".into(), Value::I8(-7)),
            ("a.u16".into(), Value::U16(700)),
            ("a.i16".into(), Value::I16(-700)),
            ("a.u32".into(), Value::U32(70_000)),
            ("a.i32".into(), Value::I32(-70_000)),
            ("a.u64".into(), Value::U64(1 << 40)),
            ("a.i64".into(), Value::I64(-(1 << 40))),
            ("a.f32".into(), Value::F32(1e-6)),
            ("a.f64".into(), Value::F64(-2.5)),
            ("a.bool".into(), Value::Bool(true)),
            (
                "a.sections".into(),
                Value::Array(Array::I32(vec![11, 11, 10, 0])),
            ),
            (
                "a.words".into(),
                Value::Array(Array::String(vec!["x".into(), "".into(), "yz".into()])),
            ),
            (
                "a.flags".into(),
                Value::Array(Array::Bool(vec![true, false])),
            ),
            ("a.floats".into(), Value::Array(Array::F32(vec![0.5, -1.0]))),
            ("a.empty".into(), Value::Array(Array::U64(vec![]))),
        ]
    }

    fn tensors() -> Vec<TensorSpec> {
        vec![
            TensorSpec::new("token_embd.weight", &[256, 3], GgmlType::Q4_K),
            TensorSpec::new("norm.weight", &[5], GgmlType::F32),
            TensorSpec::new("experts", &[64, 2, 3], GgmlType::Q8_0),
        ]
    }

    fn data_for(info: &TensorInfo) -> Vec<u8> {
        (0..info.size_bytes)
            .map(|i| (i * 31 + info.offset_bytes) as u8)
            .collect()
    }

    #[test]
    fn round_trip_preserves_metadata_infos_and_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rt.gguf");
        let meta = metadata();
        let mut w = GgufWriter::create(&path, &meta, &tensors()).unwrap();
        let infos = w.layout().tensors.clone();
        for info in &infos {
            let data = data_for(info);
            // Write the 3-D tensor in uneven chunks, the others whole.
            if info.dims.len() == 3 {
                for chunk in data.chunks(100) {
                    w.write_tensor_chunk(&info.name, chunk).unwrap();
                }
            } else {
                w.write_tensor(&info.name, &data).unwrap();
            }
        }
        let total = w.total_size_bytes();
        assert_eq!(w.finish().unwrap(), total);

        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.metadata, meta);
        assert_eq!(f.tensors, infos);
        assert_eq!(f.alignment, 64);
        assert_eq!(f.file_size_bytes, total);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), total);
        f.check_packed().unwrap();
        let mut file = File::open(&path).unwrap();
        for info in &infos {
            assert_eq!(
                f.read_tensor_data(&mut file, &info.name).unwrap(),
                data_for(info)
            );
            assert_eq!(info.offset_bytes % 64, 0);
        }
        // Only the final file remains in the directory.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn layout_matches_the_written_header() {
        let layout = Layout::compute(Path::new("x.gguf"), &metadata(), &tensors()).unwrap();
        let header = encode_header(&metadata(), &layout.tensors);
        assert_eq!(header.len() as u64, layout.header_size_bytes);
        assert_eq!(layout.data_offset_bytes % 64, 0);
        let data: u64 = layout
            .tensors
            .iter()
            .map(|t| t.size_bytes.div_ceil(64) * 64)
            .sum();
        assert_eq!(layout.file_size_bytes, layout.data_offset_bytes + data);
    }

    #[test]
    fn wrong_order_and_wrong_sizes_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.gguf");
        let mut w = GgufWriter::create(&path, &metadata(), &tensors()).unwrap();
        let e = w.write_tensor("norm.weight", &[0; 20]).unwrap_err();
        assert!(matches!(e, GgufError::WrongTensor { .. }), "{e}");
        let e = w.write_tensor("token_embd.weight", &[0; 10]).unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::WrongSize {
                    expected_bytes: 432,
                    got_bytes: 10,
                    ..
                }
            ),
            "{e}"
        );
        w.write_tensor_chunk("token_embd.weight", &[0; 400])
            .unwrap();
        let e = w
            .write_tensor_chunk("token_embd.weight", &[0; 40])
            .unwrap_err();
        assert!(
            matches!(e, GgufError::WrongSize { got_bytes: 440, .. }),
            "{e}"
        );
        assert!(e.to_string().contains("w.gguf"));
    }

    #[test]
    fn unfinished_writers_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("u.gguf");
        let mut w = GgufWriter::create(&path, &metadata(), &tensors()).unwrap();
        w.write_tensor("token_embd.weight", &[0; 432]).unwrap();
        let e = w.finish().unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::Unfinished {
                    written: 1,
                    expected: 3,
                    ..
                }
            ),
            "{e}"
        );
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);

        let w = GgufWriter::create(&path, &metadata(), &tensors()).unwrap();
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        drop(w);
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn invalid_specs_are_refused_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bad.gguf");
        let bad = [TensorSpec::new(
            "blk.0.ffn_down.weight",
            &[96, 4],
            GgmlType::Q4_K,
        )];
        let e = GgufWriter::create(&path, &[], &bad).unwrap_err();
        assert!(matches!(e, GgufError::NotBlockMultiple { .. }), "{e}");
        let dup = [
            TensorSpec::new("t", &[8], GgmlType::F32),
            TensorSpec::new("t", &[8], GgmlType::F32),
        ];
        assert!(matches!(
            GgufWriter::create(&path, &[], &dup).unwrap_err(),
            GgufError::DuplicateTensor { .. }
        ));
        let meta = [("general.alignment".to_string(), Value::U32(24))];
        assert!(matches!(
            GgufWriter::create(&path, &meta, &[]).unwrap_err(),
            GgufError::BadAlignment { .. }
        ));
        let meta = [
            ("k".to_string(), Value::U32(1)),
            ("k".to_string(), Value::U32(2)),
        ];
        assert!(matches!(
            GgufWriter::create(&path, &meta, &[]).unwrap_err(),
            GgufError::DuplicateKey { .. }
        ));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_file_without_tensors_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty.gguf");
        let meta = vec![("general.name".to_string(), Value::String("empty".into()))];
        GgufWriter::create(&path, &meta, &[])
            .unwrap()
            .finish()
            .unwrap();
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(f.metadata, meta);
        assert!(f.tensors.is_empty());
        assert_eq!(f.data_offset_bytes, f.file_size_bytes);
    }
}
