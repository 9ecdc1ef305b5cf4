//! The validating GGUF reader: header, metadata and tensor infos, checked before any C code sees the file.
//!
//! The file format is the one `ggml/src/gguf.cpp` reads: magic "GGUF", a u32 version, u64 tensor
//! and key-value counts, the key-value pairs, the tensor infos (name, u32 n_dims, u64 dims with
//! ne[0] first, u32 type, u64 offset), padding to the alignment, then the data section. All
//! numbers are little-endian. Every count and length is checked against the bytes the file has
//! left before anything is allocated for it, and vectors grow only as items are actually read,
//! so no input can make this reader panic or allocate more than a small multiple of the file.

use std::collections::HashSet;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use crate::error::GgufError;
use crate::types::{removed_type_name, GgmlType};
use crate::value::{Array, Value, ValueType};

/// The magic at the start of every GGUF file ("GGUF" read as a little-endian u32).
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`).
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// ggml's `GGML_MAX_NAME`: a tensor name takes at most this many bytes minus one.
pub const MAX_TENSOR_NAME_BYTES: usize = 64;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;

/// Fewest bytes one key-value pair takes: key length (8), a one-byte key, type (4), a u8 value.
const MIN_KV_BYTES: u64 = 8 + 1 + 4 + 1;
/// Fewest bytes one tensor info takes: name length (8), n_dims (4), one dim (8), type (4),
/// offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 8 + 4 + 8 + 4 + 8;

/// One tensor's entry in the file's tensor infos.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    pub name: String,
    /// Dimensions, ne[0] first (the order ggml and the file use).
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the data from the start of the data section.
    pub offset_bytes: u64,
    /// Bytes of data (without padding).
    pub size_bytes: u64,
}

impl TensorInfo {
    /// The number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A validated GGUF file's header: metadata in file order and tensor infos. Data stays on disk.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufFile {
    /// The path given when reading, used in error messages.
    pub path: PathBuf,
    pub version: u32,
    /// Key-value pairs in the order of the file.
    pub metadata: Vec<(String, Value)>,
    pub tensors: Vec<TensorInfo>,
    pub alignment: u64,
    /// Where the data section starts, from the start of the file.
    pub data_offset_bytes: u64,
    pub file_size_bytes: u64,
}

impl GgufFile {
    /// Opens and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let file = File::open(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        GgufFile::read_from(file, path)
    }

    /// Reads and validates a GGUF header from `reader` (which must start at the file's first
    /// byte), naming `path_for_errors` in every error.
    pub fn read_from<R: Read + Seek>(
        reader: R,
        path_for_errors: impl AsRef<Path>,
    ) -> Result<GgufFile, GgufError> {
        let path = path_for_errors.as_ref().to_path_buf();
        let mut src = Source::new(BufReader::with_capacity(1 << 16, reader), path)?;
        parse(&mut src)
    }

    /// The value of `key`.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, value)| value)
    }

    /// An integer value of any type that fits a `u32`.
    pub fn get_u32(&self, key: &str) -> Option<u32> {
        self.get(key).and_then(Value::as_u32)
    }

    /// An integer value of any type that fits a `u64`.
    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(Value::as_u64)
    }

    /// An `f32` (or `f64`) value.
    pub fn get_f32(&self, key: &str) -> Option<f32> {
        self.get(key).and_then(Value::as_f32)
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }

    /// A bool value.
    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(Value::as_bool)
    }

    /// An array of integers that all fit an `i32`.
    pub fn get_i32_array(&self, key: &str) -> Option<Vec<i32>> {
        self.get(key)
            .and_then(Value::as_array)
            .and_then(Array::to_i32_vec)
    }

    /// `general.architecture`.
    pub fn arch(&self) -> Option<&str> {
        self.get_str("general.architecture")
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Bytes of tensor data, the sum of every tensor's size (without padding).
    pub fn tensor_data_size_bytes(&self) -> u64 {
        self.tensors.iter().map(|t| t.size_bytes).sum()
    }

    /// Reads the data of the tensor named `name` from `reader` (the same file).
    pub fn read_tensor_data<R: Read + Seek>(
        &self,
        reader: &mut R,
        name: &str,
    ) -> Result<Vec<u8>, GgufError> {
        let tensor = self.tensor(name).ok_or_else(|| GgufError::NoSuchTensor {
            path: self.path.clone(),
            name: name.to_string(),
        })?;
        // The bounds were checked when the file was read, so these cannot overflow.
        let start = self.data_offset_bytes.saturating_add(tensor.offset_bytes);
        let io = |source| GgufError::Io {
            path: self.path.clone(),
            source,
        };
        reader.seek(SeekFrom::Start(start)).map_err(io)?;
        let len = usize::try_from(tensor.size_bytes).map_err(|_| GgufError::DimsOverflow {
            path: self.path.clone(),
            name: name.to_string(),
            dims: tensor.dims.clone(),
        })?;
        let mut data = vec![0u8; len];
        reader.read_exact(&mut data).map_err(|e| {
            if e.kind() == std::io::ErrorKind::UnexpectedEof {
                GgufError::Truncated {
                    path: self.path.clone(),
                    what: format!("data of tensor '{name}'"),
                    offset_bytes: start,
                }
            } else {
                io(e)
            }
        })?;
        Ok(data)
    }

    /// Checks the stricter layout llama.cpp's gguf.cpp requires: tensors stored in the order of
    /// their infos, each at the previous one's end padded to the alignment, the first at 0.
    /// Files written by [`crate::GgufWriter`] and by ggml always pass.
    pub fn check_packed(&self) -> Result<(), GgufError> {
        let mut expected: u64 = 0;
        for t in &self.tensors {
            if t.offset_bytes != expected {
                return Err(GgufError::NotPacked {
                    path: self.path.clone(),
                    name: t.name.clone(),
                    offset_bytes: t.offset_bytes,
                    expected_bytes: expected,
                });
            }
            // Sizes and offsets were bounded by the file size when reading.
            expected =
                align_up(expected.saturating_add(t.size_bytes), self.alignment).unwrap_or(u64::MAX);
        }
        Ok(())
    }
}

/// `n` rounded up to a multiple of `alignment` (a power of two), or `None` on overflow.
pub(crate) fn align_up(n: u64, alignment: u64) -> Option<u64> {
    let mask = alignment.checked_sub(1)?;
    Some(n.checked_add(mask)? & !mask)
}

/// The checks a tensor info must pass whatever its offset: name length, 1 to 4 non-zero dims,
/// an element count and a byte size that fit 63 bits, ne[0] a multiple of the block size.
/// Returns the size in bytes.
pub(crate) fn check_tensor_shape(
    path: &Path,
    name: &str,
    dims: &[u64],
    ggml_type: GgmlType,
) -> Result<u64, GgufError> {
    if name.len() >= MAX_TENSOR_NAME_BYTES {
        return Err(GgufError::NameTooLong {
            path: path.to_path_buf(),
            name: name.to_string(),
            len_bytes: name.len() as u64,
        });
    }
    if dims.is_empty() || dims.len() > MAX_DIMS {
        return Err(GgufError::BadDims {
            path: path.to_path_buf(),
            name: name.to_string(),
            detail: format!("{} dims; ggml takes 1 to {MAX_DIMS}", dims.len()),
        });
    }
    if let Some(j) = dims.iter().position(|&d| d == 0) {
        return Err(GgufError::BadDims {
            path: path.to_path_buf(),
            name: name.to_string(),
            detail: format!("dim {j} is 0"),
        });
    }
    let overflow = || GgufError::DimsOverflow {
        path: path.to_path_buf(),
        name: name.to_string(),
        dims: dims.to_vec(),
    };
    // ggml holds ne[] and byte sizes in int64_t: keep both at most i64::MAX.
    let limit = i64::MAX as u64;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .filter(|&n| n <= limit)
        .ok_or_else(overflow)?;
    let ne0 = dims.first().copied().unwrap_or(1);
    let size_bytes = match ggml_type.tensor_bytes(dims) {
        Some(size) => size,
        None if ne0 % u64::from(ggml_type.block_size()) != 0 => {
            return Err(GgufError::NotBlockMultiple {
                path: path.to_path_buf(),
                name: name.to_string(),
                ggml_type,
                ne0,
                block_size: ggml_type.block_size(),
            })
        }
        None => return Err(overflow()),
    };
    if size_bytes > limit || n_elements == 0 {
        return Err(overflow());
    }
    Ok(size_bytes)
}

/// A reader that knows its position and the file's size, so every read is checked first.
struct Source<R> {
    inner: R,
    path: PathBuf,
    pos: u64,
    size: u64,
}

impl<R: Read + Seek> Source<R> {
    fn new(mut inner: R, path: PathBuf) -> Result<Self, GgufError> {
        let io = |source| GgufError::Io {
            path: path.clone(),
            source,
        };
        let size = inner.seek(SeekFrom::End(0)).map_err(io)?;
        inner.seek(SeekFrom::Start(0)).map_err(io)?;
        Ok(Source {
            inner,
            path,
            pos: 0,
            size,
        })
    }
}

impl<R: Read> Source<R> {
    fn remaining(&self) -> u64 {
        self.size.saturating_sub(self.pos)
    }

    fn truncated(&self, what: String) -> GgufError {
        GgufError::Truncated {
            path: self.path.clone(),
            what,
            offset_bytes: self.pos,
        }
    }

    /// Checks that `count` items of at least `min_bytes` each can be read: more than the whole
    /// file could hold is a lie (`CountTooLarge`), more than what is left is a truncation.
    fn check_count(
        &self,
        count: u64,
        min_bytes: u64,
        what: impl Fn() -> String,
    ) -> Result<(), GgufError> {
        match count.checked_mul(min_bytes) {
            Some(n) if n <= self.remaining() => Ok(()),
            Some(n) if n <= self.size => Err(self.truncated(what())),
            _ => Err(GgufError::CountTooLarge {
                path: self.path.clone(),
                what: what(),
                count,
                file_size_bytes: self.size,
            }),
        }
    }

    fn read_into(&mut self, buf: &mut [u8], what: impl Fn() -> String) -> Result<(), GgufError> {
        let n = buf.len() as u64;
        if n > self.remaining() {
            return Err(self.truncated(what()));
        }
        match self.inner.read_exact(buf) {
            Ok(()) => {
                self.pos += n;
                Ok(())
            }
            // The file shrank while being read.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(self.truncated(what())),
            Err(source) => Err(GgufError::Io {
                path: self.path.clone(),
                source,
            }),
        }
    }

    /// Reads `len` bytes, checked against the bytes left; the buffer grows as data arrives,
    /// so a reader that reports a larger size than it delivers cannot force a big allocation.
    fn bytes(&mut self, len: u64, what: impl Fn() -> String) -> Result<Vec<u8>, GgufError> {
        if len > self.remaining() {
            return Err(self.truncated(what()));
        }
        let mut buf = Vec::with_capacity(usize::try_from(len.min(1 << 20)).unwrap_or(0));
        let read = (&mut self.inner)
            .take(len)
            .read_to_end(&mut buf)
            .map_err(|source| GgufError::Io {
                path: self.path.clone(),
                source,
            })?;
        if read as u64 != len {
            // The file shrank while being read.
            return Err(self.truncated(what()));
        }
        self.pos += len;
        Ok(buf)
    }

    fn array<const N: usize>(&mut self, what: impl Fn() -> String) -> Result<[u8; N], GgufError> {
        let mut buf = [0u8; N];
        self.read_into(&mut buf, what)?;
        Ok(buf)
    }

    fn u32(&mut self, what: impl Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: impl Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: impl Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(|| format!("length of {}", what()))?;
        self.check_count(len, 1, || format!("length of {}", what()))?;
        let bytes = self.bytes(len, &what)?;
        String::from_utf8(bytes).map_err(|_| GgufError::NotUtf8 {
            path: self.path.clone(),
            what: what(),
        })
    }

    fn scalar(&mut self, ty: ValueType, key: &str) -> Result<Value, GgufError> {
        let what = || format!("value of key '{key}'");
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            // gguf.cpp reads a bool as an int8 and takes any non-zero byte as true.
            ValueType::Bool => Value::Bool(u8::from_le_bytes(self.array(what)?) != 0),
            ValueType::String => Value::String(self.string(what)?),
            // `value` reads arrays itself and never passes their type here.
            ValueType::Array => {
                return Err(GgufError::BadValueType {
                    path: self.path.clone(),
                    key: key.to_string(),
                    type_id: ty.id(),
                    detail: " (array where a scalar was expected)",
                })
            }
        })
    }

    /// The elements of a numeric array: `count` must have been checked already.
    fn numeric<const N: usize, T>(
        &mut self,
        count: u64,
        what: impl Fn() -> String,
        convert: fn([u8; N]) -> T,
    ) -> Result<Vec<T>, GgufError> {
        let len = count.saturating_mul(N as u64);
        let bytes = self.bytes(len, &what)?;
        Ok(bytes
            .chunks_exact(N)
            .map(|c| convert(c.try_into().unwrap_or([0u8; N])))
            .collect())
    }

    fn value(&mut self, key: &str, type_id: u32) -> Result<Value, GgufError> {
        let what = || format!("value of key '{key}'");
        let path = self.path.clone();
        let bad_type = |type_id, detail| GgufError::BadValueType {
            path: path.clone(),
            key: key.to_string(),
            type_id,
            detail,
        };
        let ty = ValueType::from_u32(type_id).ok_or_else(|| bad_type(type_id, ""))?;
        if ty != ValueType::Array {
            return self.scalar(ty, key);
        }
        let elem_id = self.u32(|| format!("array element type of key '{key}'"))?;
        let elem =
            ValueType::from_u32(elem_id).ok_or_else(|| bad_type(elem_id, " (array element)"))?;
        if elem == ValueType::Array {
            return Err(bad_type(elem_id, " (arrays of arrays are not supported)"));
        }
        let count = self.u64(|| format!("array length of key '{key}'"))?;
        let what_count = || format!("array length of key '{key}'");
        self.check_count(count, elem.min_size_bytes(), what_count)?;
        let array = match elem {
            ValueType::U8 => Array::U8(self.numeric(count, what, u8::from_le_bytes)?),
            ValueType::I8 => Array::I8(self.numeric(count, what, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(self.numeric(count, what, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(self.numeric(count, what, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(self.numeric(count, what, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(self.numeric(count, what, i32::from_le_bytes)?),
            ValueType::U64 => Array::U64(self.numeric(count, what, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(self.numeric(count, what, i64::from_le_bytes)?),
            ValueType::F32 => Array::F32(self.numeric(count, what, f32::from_le_bytes)?),
            ValueType::F64 => Array::F64(self.numeric(count, what, f64::from_le_bytes)?),
            ValueType::Bool => {
                Array::Bool(self.numeric(count, what, |b: [u8; 1]| u8::from_le_bytes(b) != 0)?)
            }
            ValueType::String => {
                let mut items = Vec::new();
                for i in 0..count {
                    items.push(self.string(|| format!("element {i} of key '{key}'"))?);
                }
                Array::String(items)
            }
            ValueType::Array => return Err(bad_type(elem_id, "")),
        };
        Ok(Value::Array(array))
    }
}

fn parse<R: Read>(src: &mut Source<R>) -> Result<GgufFile, GgufError> {
    let path = src.path.clone();

    let magic: [u8; 4] = src.array(|| "magic".to_string())?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            path,
            found: u32::from_le_bytes(magic),
        });
    }
    let version = src.u32(|| "version in the header".to_string())?;
    if !(2..=3).contains(&version) {
        return Err(GgufError::BadVersion {
            path,
            found: version,
        });
    }
    let n_tensors = src.u64(|| "tensor count in the header".to_string())?;
    let n_kv = src.u64(|| "key-value count in the header".to_string())?;
    src.check_count(n_kv, MIN_KV_BYTES, || "key-value count".to_string())?;

    let mut metadata: Vec<(String, Value)> = Vec::new();
    let mut seen_keys: HashSet<String> = HashSet::new();
    for i in 0..n_kv {
        let key = src.string(|| format!("key {i}"))?;
        if key.is_empty() {
            return Err(GgufError::EmptyKey { path, index: i });
        }
        if !seen_keys.insert(key.clone()) {
            return Err(GgufError::DuplicateKey { path, key });
        }
        let type_id = src.u32(|| format!("value type of key '{key}'"))?;
        let value = src.value(&key, type_id)?;
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == ALIGNMENT_KEY) {
        None => DEFAULT_ALIGNMENT,
        // gguf.cpp requires the type u32.
        Some((_, Value::U32(a))) if a.is_power_of_two() => u64::from(*a),
        Some((_, Value::U32(a))) => {
            return Err(GgufError::BadAlignment {
                path,
                detail: format!("{a} is not a non-zero power of two"),
            })
        }
        Some((_, other)) => {
            return Err(GgufError::BadAlignment {
                path,
                detail: format!("type {} (must be u32)", other.value_type()),
            })
        }
    };

    // Checked after the metadata, so that a file cut inside its metadata is reported there.
    src.check_count(n_tensors, MIN_TENSOR_INFO_BYTES, || {
        "tensor count".to_string()
    })?;
    let mut tensors: Vec<TensorInfo> = Vec::new();
    let mut seen_names: HashSet<String> = HashSet::new();
    for i in 0..n_tensors {
        let name = src.string(|| format!("name of tensor {i}"))?;
        if !seen_names.insert(name.clone()) {
            return Err(GgufError::DuplicateTensor { path, name });
        }
        let n_dims = src.u32(|| format!("n_dims of tensor '{name}'"))?;
        if n_dims == 0 || n_dims as usize > MAX_DIMS {
            return Err(GgufError::BadDims {
                path,
                name,
                detail: format!("{n_dims} dims; ggml takes 1 to {MAX_DIMS}"),
            });
        }
        let mut dims = Vec::new();
        for j in 0..n_dims {
            dims.push(src.u64(|| format!("dim {j} of tensor '{name}'"))?);
        }
        let type_id = src.u32(|| format!("type of tensor '{name}'"))?;
        let ggml_type = GgmlType::from_u32(type_id).ok_or_else(|| GgufError::BadType {
            path: path.clone(),
            name: name.clone(),
            type_id,
            detail: removed_type_name(type_id)
                .map(|n| format!(" ({n}, removed from GGUF by ggml)"))
                .unwrap_or_default(),
        })?;
        let size_bytes = check_tensor_shape(&path, &name, &dims, ggml_type)?;
        let offset_bytes = src.u64(|| format!("data offset of tensor '{name}'"))?;
        tensors.push(TensorInfo {
            name,
            dims,
            ggml_type,
            offset_bytes,
            size_bytes,
        });
    }

    // gguf.cpp pads to the alignment before the data section only when there are tensors.
    let data_offset_bytes = if tensors.is_empty() {
        src.pos
    } else {
        align_up(src.pos, alignment).unwrap_or(u64::MAX)
    };
    let file_size_bytes = src.size;

    for t in &tensors {
        if t.offset_bytes % alignment != 0 {
            return Err(GgufError::Misaligned {
                path,
                name: t.name.clone(),
                offset_bytes: t.offset_bytes,
                alignment,
            });
        }
        let end_bytes = data_offset_bytes
            .checked_add(t.offset_bytes)
            .and_then(|start| start.checked_add(t.size_bytes));
        match end_bytes {
            Some(end) if end <= file_size_bytes => {}
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    path,
                    name: t.name.clone(),
                    end_bytes: end_bytes.unwrap_or(u64::MAX),
                    file_size_bytes,
                })
            }
        }
    }

    let mut by_offset: Vec<&TensorInfo> = tensors.iter().collect();
    by_offset.sort_by_key(|t| t.offset_bytes);
    for pair in by_offset.windows(2) {
        if let [a, b] = pair {
            // Both ranges lie inside the file, so the sum cannot overflow.
            if a.offset_bytes.saturating_add(a.size_bytes) > b.offset_bytes {
                return Err(GgufError::Overlap {
                    path,
                    first: a.name.clone(),
                    second: b.name.clone(),
                });
            }
        }
    }

    Ok(GgufFile {
        path,
        version,
        metadata,
        tensors,
        alignment,
        data_offset_bytes,
        file_size_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    const NAME: &str = "bad-model.gguf";

    /// Builds GGUF bytes by hand, valid or not.
    #[derive(Default)]
    struct Bytes(Vec<u8>);

    impl Bytes {
        fn header(version: u32, n_tensors: u64, n_kv: u64) -> Bytes {
            let mut b = Bytes::default();
            b.raw(b"GGUF").u32(version).u64(n_tensors).u64(n_kv);
            b
        }
        fn raw(&mut self, bytes: &[u8]) -> &mut Self {
            self.0.extend_from_slice(bytes);
            self
        }
        fn u32(&mut self, v: u32) -> &mut Self {
            self.raw(&v.to_le_bytes())
        }
        fn u64(&mut self, v: u64) -> &mut Self {
            self.raw(&v.to_le_bytes())
        }
        fn string(&mut self, s: &str) -> &mut Self {
            self.u64(s.len() as u64).raw(s.as_bytes())
        }
        fn kv_u32(&mut self, key: &str, v: u32) -> &mut Self {
            self.string(key).u32(ValueType::U32.id()).u32(v)
        }
        fn kv_str(&mut self, key: &str, v: &str) -> &mut Self {
            self.string(key).u32(ValueType::String.id()).string(v)
        }
        fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut Self {
            self.string(name).u32(dims.len() as u32);
            for &d in dims {
                self.u64(d);
            }
            self.u32(ty).u64(offset)
        }
        /// Pads with zeros to the 32-byte alignment, where the data section starts.
        fn pad(&mut self) -> &mut Self {
            while !self.0.len().is_multiple_of(32) {
                self.0.push(0);
            }
            self
        }
        fn zeros(&mut self, n: usize) -> &mut Self {
            self.0.resize(self.0.len() + n, 0);
            self
        }
        fn read(&self) -> Result<GgufFile, GgufError> {
            GgufFile::read_from(Cursor::new(self.0.clone()), NAME)
        }
    }

    /// A valid file: two keys, two F32 tensors of 8 x 4 bytes each.
    fn valid() -> Bytes {
        let mut b = Bytes::header(3, 2, 2);
        b.kv_str("general.architecture", "llama")
            .kv_u32("llama.block_count", 1)
            .tensor("a", &[8], 0, 0)
            .tensor("b", &[8], 0, 32)
            .pad()
            .zeros(64);
        b
    }

    fn err_of(b: &Bytes) -> GgufError {
        let e = b.read().expect_err("the file should be rejected");
        assert!(
            e.to_string().contains(NAME),
            "message lacks the file name: {e}"
        );
        e
    }

    #[test]
    fn valid_file_reads() {
        let f = valid().read().unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(f.arch(), Some("llama"));
        assert_eq!(f.get_u32("llama.block_count"), Some(1));
        assert_eq!(f.tensors.len(), 2);
        assert_eq!(f.tensors[1].offset_bytes, 32);
        assert_eq!(f.tensors[1].size_bytes, 32);
        assert_eq!(f.alignment, 32);
        assert_eq!(f.data_offset_bytes % 32, 0);
        assert_eq!(f.file_size_bytes, f.data_offset_bytes + 64);
        f.check_packed().unwrap();
    }

    #[test]
    fn truncated_at_every_length_is_an_error_not_a_panic() {
        let full = valid();
        for len in 0..full.0.len() {
            let cut = Bytes(full.0[..len].to_vec());
            let e = err_of(&cut);
            assert!(
                matches!(
                    e,
                    GgufError::Truncated { .. }
                        | GgufError::TensorOutOfBounds { .. }
                        | GgufError::CountTooLarge { .. }
                ),
                "length {len}: {e}"
            );
        }
    }

    #[test]
    fn truncated_in_header_names_the_part() {
        let b = Bytes(valid().0[..10].to_vec());
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::Truncated { ref what, .. } if what.contains("header")),
            "{e}"
        );
    }

    #[test]
    fn truncated_inside_a_kv() {
        let mut b = Bytes::header(3, 0, 1);
        b.string("general.name")
            .u32(ValueType::String.id())
            .u64(10)
            .raw(b"abc");
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::Truncated { ref what, .. } if what.contains("general.name")),
            "{e}"
        );
    }

    #[test]
    fn truncated_inside_tensor_infos() {
        // Long enough to pass the tensor-count check, cut after the first of two dims.
        let mut b = Bytes::header(3, 1, 0);
        b.string(&"a".repeat(30)).u32(2).u64(8);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::Truncated { ref what, .. } if what.contains("dim 1")),
            "{e}"
        );
    }

    #[test]
    fn truncated_inside_data() {
        let mut b = valid();
        b.0.truncate(b.0.len() - 1);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::TensorOutOfBounds { ref name, .. } if name == "b"),
            "{e}"
        );
    }

    #[test]
    fn bad_magic() {
        let mut b = valid();
        b.0[..4].copy_from_slice(b"GGML");
        let e = err_of(&b);
        assert!(
            matches!(
                e,
                GgufError::BadMagic {
                    found: 0x4c4d_4747,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("0x4c4d4747"), "{e}");
    }

    #[test]
    fn bad_versions() {
        for version in [0, 1, 4, 0x0300_0000] {
            let e = err_of(&Bytes::header(version, 0, 0));
            assert!(
                matches!(e, GgufError::BadVersion { found, .. } if found == version),
                "{e}"
            );
        }
        // Version 2 has the same layout and is accepted.
        Bytes::header(2, 0, 0).read().unwrap();
    }

    #[test]
    fn lying_counts() {
        let e = err_of(&Bytes::header(3, u64::MAX, 0));
        assert!(
            matches!(
                e,
                GgufError::CountTooLarge {
                    count: u64::MAX,
                    ..
                }
            ),
            "{e}"
        );
        let e = err_of(&Bytes::header(3, 0, u64::MAX));
        assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
        let e = err_of(&Bytes::header(3, 1 << 40, 1 << 40));
        assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");

        // A string whose length is far beyond the file.
        let mut b = Bytes::header(3, 0, 1);
        b.u64(u64::MAX - 3).raw(b"key").zeros(16);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::CountTooLarge { count, .. } if count == u64::MAX - 3),
            "{e}"
        );

        // An array whose count times its element size overflows.
        let mut b = Bytes::header(3, 0, 1);
        b.string("k")
            .u32(ValueType::Array.id())
            .u32(ValueType::U64.id())
            .u64(u64::MAX / 4);
        let e = err_of(&b);
        assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");

        // A string array claiming more elements than length prefixes fit.
        let mut b = Bytes::header(3, 0, 1);
        b.string("k")
            .u32(ValueType::Array.id())
            .u32(ValueType::String.id())
            .u64(1 << 20);
        let e = err_of(&b);
        assert!(matches!(e, GgufError::CountTooLarge { .. }), "{e}");
    }

    #[test]
    fn tensor_out_of_bounds() {
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("far", &[8], 0, 1 << 20).pad().zeros(32);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::TensorOutOfBounds { ref name, end_bytes, file_size_bytes, .. }
                if name == "far" && end_bytes > file_size_bytes),
            "{e}"
        );
        // An offset near u64::MAX must not overflow.
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("wrap", &[8], 0, u64::MAX - 31).pad().zeros(32);
        let e = err_of(&b);
        assert!(matches!(e, GgufError::TensorOutOfBounds { .. }), "{e}");
    }

    #[test]
    fn overlapping_tensors() {
        let mut b = Bytes::header(3, 2, 0);
        b.tensor("a", &[16], 0, 0)
            .tensor("b", &[8], 0, 32)
            .pad()
            .zeros(64);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::Overlap { ref first, ref second, .. } if first == "a" && second == "b"),
            "{e}"
        );
    }

    #[test]
    fn misaligned_offset() {
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("a", &[8], 0, 4).pad().zeros(64);
        let e = err_of(&b);
        assert!(
            matches!(
                e,
                GgufError::Misaligned {
                    offset_bytes: 4,
                    alignment: 32,
                    ..
                }
            ),
            "{e}"
        );
    }

    #[test]
    fn custom_alignment_is_used_and_checked() {
        let mut b = Bytes::header(3, 1, 1);
        b.kv_u32(ALIGNMENT_KEY, 64).tensor("a", &[8], 0, 0);
        while !b.0.len().is_multiple_of(64) {
            b.0.push(0);
        }
        b.zeros(32);
        let f = b.read().unwrap();
        assert_eq!(f.alignment, 64);
        assert_eq!(f.data_offset_bytes % 64, 0);

        for bad in [0, 3, 48] {
            let mut b = Bytes::header(3, 0, 1);
            b.kv_u32(ALIGNMENT_KEY, bad);
            let e = err_of(&b);
            assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
        }
        let mut b = Bytes::header(3, 0, 1);
        b.string(ALIGNMENT_KEY).u32(ValueType::U64.id()).u64(32);
        let e = err_of(&b);
        assert!(matches!(e, GgufError::BadAlignment { .. }), "{e}");
    }

    #[test]
    fn unknown_and_removed_types() {
        for id in [31, 43, 9999] {
            let mut b = Bytes::header(3, 1, 0);
            b.tensor("t", &[256], id, 0).pad().zeros(1024);
            let e = err_of(&b);
            assert!(
                matches!(e, GgufError::BadType { type_id, .. } if type_id == id),
                "{e}"
            );
        }
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("t", &[256], 31, 0);
        assert!(err_of(&b).to_string().contains("Q4_0_4_4"));
    }

    #[test]
    fn dims_product_overflow() {
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("huge", &[1 << 32, 1 << 32, 4], 0, 0).pad();
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::DimsOverflow { ref name, .. } if name == "huge"),
            "{e}"
        );
        // One dim above i64::MAX alone.
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("neg", &[u64::MAX], 24, 0).pad();
        let e = err_of(&b);
        assert!(matches!(e, GgufError::DimsOverflow { .. }), "{e}");
    }

    #[test]
    fn bad_dim_counts_and_zero_dims() {
        for dims in [&[][..], &[1, 1, 1, 1, 1][..], &[8, 0][..]] {
            let mut b = Bytes::header(3, 1, 0);
            b.tensor("t", dims, 0, 0).pad().zeros(64);
            let e = err_of(&b);
            assert!(matches!(e, GgufError::BadDims { .. }), "{dims:?}: {e}");
        }
    }

    #[test]
    fn ne0_not_a_block_multiple() {
        let mut b = Bytes::header(3, 1, 0);
        b.tensor("blk.0.ffn_up.weight", &[288, 2], GgmlType::Q4_K.id(), 0)
            .pad()
            .zeros(4096);
        let e = err_of(&b);
        assert!(
            matches!(
                e,
                GgufError::NotBlockMultiple {
                    ne0: 288,
                    block_size: 256,
                    ggml_type: GgmlType::Q4_K,
                    ..
                }
            ),
            "{e}"
        );
        assert!(e.to_string().contains("blk.0.ffn_up.weight"));
    }

    #[test]
    fn non_utf8_strings() {
        let mut b = Bytes::header(3, 0, 1);
        b.u64(2)
            .raw(&[0xff, 0xfe])
            .u32(ValueType::U8.id())
            .raw(&[1]);
        let e = err_of(&b);
        assert!(matches!(e, GgufError::NotUtf8 { .. }), "{e}");

        let mut b = Bytes::header(3, 0, 1);
        b.string("k")
            .u32(ValueType::String.id())
            .u64(1)
            .raw(&[0xc3]);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::NotUtf8 { ref what, .. } if what.contains("'k'")),
            "{e}"
        );

        let mut b = Bytes::header(3, 1, 0);
        b.u64(1)
            .raw(&[0x80])
            .u32(1)
            .u64(8)
            .u32(0)
            .u64(0)
            .pad()
            .zeros(32);
        let e = err_of(&b);
        assert!(matches!(e, GgufError::NotUtf8 { .. }), "{e}");
    }

    #[test]
    fn duplicate_keys_and_tensors() {
        let mut b = Bytes::header(3, 0, 2);
        b.kv_u32("a.b", 1).kv_u32("a.b", 2);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::DuplicateKey { ref key, .. } if key == "a.b"),
            "{e}"
        );

        let mut b = Bytes::header(3, 2, 0);
        b.tensor("t", &[8], 0, 0)
            .tensor("t", &[8], 0, 32)
            .pad()
            .zeros(64);
        let e = err_of(&b);
        assert!(
            matches!(e, GgufError::DuplicateTensor { ref name, .. } if name == "t"),
            "{e}"
        );

        let mut b = Bytes::header(3, 0, 1);
        b.kv_u32("", 1);
        assert!(matches!(err_of(&b), GgufError::EmptyKey { .. }));
    }

    #[test]
    fn bad_value_types() {
        let mut b = Bytes::header(3, 0, 1);
        b.string("k").u32(13).u32(0);
        assert!(matches!(
            err_of(&b),
            GgufError::BadValueType { type_id: 13, .. }
        ));
        let mut b = Bytes::header(3, 0, 1);
        b.string("k")
            .u32(ValueType::Array.id())
            .u32(ValueType::Array.id())
            .u64(0);
        assert!(matches!(
            err_of(&b),
            GgufError::BadValueType { type_id: 9, .. }
        ));
    }

    #[test]
    fn long_tensor_names_are_rejected() {
        let long = "x".repeat(64);
        let mut b = Bytes::header(3, 1, 0);
        b.tensor(&long, &[8], 0, 0).pad().zeros(32);
        assert!(matches!(
            err_of(&b),
            GgufError::NameTooLong { len_bytes: 64, .. }
        ));
    }

    #[test]
    fn typed_getters_accept_fitting_integers() {
        let mut b = Bytes::header(3, 0, 5);
        b.string("u64").u32(ValueType::U64.id()).u64(40960);
        b.string("big").u32(ValueType::U64.id()).u64(1 << 40);
        b.string("eps")
            .u32(ValueType::F32.id())
            .raw(&1e-6f32.to_le_bytes());
        b.string("flag").u32(ValueType::Bool.id()).raw(&[1]);
        b.string("sections")
            .u32(ValueType::Array.id())
            .u32(ValueType::I32.id())
            .u64(4);
        for v in [11i32, 11, 10, 0] {
            b.raw(&v.to_le_bytes());
        }
        let f = b.read().unwrap();
        assert_eq!(f.get_u32("u64"), Some(40960));
        assert_eq!(f.get_u32("big"), None);
        assert_eq!(f.get_u64("big"), Some(1 << 40));
        assert_eq!(f.get_f32("eps"), Some(1e-6));
        assert_eq!(f.get_bool("flag"), Some(true));
        assert_eq!(f.get_i32_array("sections"), Some(vec![11, 11, 10, 0]));
        assert_eq!(f.get_str("u64"), None);
        assert_eq!(f.arch(), None);
        assert_eq!(
            f.metadata
                .iter()
                .map(|(k, _)| k.as_str())
                .collect::<Vec<_>>(),
            ["u64", "big", "eps", "flag", "sections"]
        );
    }

    #[test]
    fn not_packed_is_reported_by_check_packed() {
        let mut b = Bytes::header(3, 2, 0);
        b.tensor("a", &[8], 0, 64)
            .tensor("b", &[8], 0, 0)
            .pad()
            .zeros(96);
        let f = b.read().unwrap();
        let e = f.check_packed().unwrap_err();
        assert!(
            matches!(
                e,
                GgufError::NotPacked {
                    expected_bytes: 0,
                    ..
                }
            ),
            "{e}"
        );
    }

    /// Random bytes after a valid start read to Ok or Err, never a panic.
    #[test]
    fn random_garbage_never_panics() {
        use rand_chacha::rand_core::{RngCore, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for i in 0..2000u32 {
            let len = (rng.next_u32() % 200) as usize;
            let mut garbage = vec![0u8; len];
            rng.fill_bytes(&mut garbage);
            let mut b = Bytes::header(3, u64::from(i % 3), u64::from(i % 4));
            b.raw(&garbage);
            let _ = b.read();
            garbage.truncate(len.min(24));
            let _ = Bytes(garbage).read();
        }
    }

    /// Every single-byte corruption of a valid file reads to Ok or Err, never a panic.
    #[test]
    fn byte_flips_never_panic() {
        let base = valid();
        for i in 0..base.0.len() {
            for v in [0x00, 0x01, 0x7f, 0x80, 0xff] {
                let mut b = Bytes(base.0.clone());
                b.0[i] = v;
                let _ = b.read();
            }
        }
    }

    #[test]
    fn open_names_missing_files() {
        let e = GgufFile::open("/nonexistent/dir/model.gguf").unwrap_err();
        assert!(matches!(e, GgufError::Io { .. }));
        assert!(e.to_string().contains("/nonexistent/dir/model.gguf"));
    }
}
