//! The ggml tensor types: ids, names, block sizes and bytes per block, as in the vendored ggml.

use std::fmt;
use std::str::FromStr;

/// A ggml tensor type, with the id it has in `ggml/include/ggml.h` (`enum ggml_type`).
///
/// Ids that ggml removed (4, 5: Q4_2/Q4_3; 31-33: Q4_0_4_4/4_8/8_8; 36-38: IQ4_NL_4_4/4_8/8_8)
/// have no variant: [`GgmlType::from_u32`] returns `None` for them, and
/// [`removed_type_name`] names them for error messages.
#[allow(non_camel_case_types, clippy::upper_case_acronyms)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum GgmlType {
    F32 = 0,
    F16 = 1,
    Q4_0 = 2,
    Q4_1 = 3,
    Q5_0 = 6,
    Q5_1 = 7,
    Q8_0 = 8,
    Q8_1 = 9,
    Q2_K = 10,
    Q3_K = 11,
    Q4_K = 12,
    Q5_K = 13,
    Q6_K = 14,
    Q8_K = 15,
    IQ2_XXS = 16,
    IQ2_XS = 17,
    IQ3_XXS = 18,
    IQ1_S = 19,
    IQ4_NL = 20,
    IQ3_S = 21,
    IQ2_S = 22,
    IQ4_XS = 23,
    I8 = 24,
    I16 = 25,
    I32 = 26,
    I64 = 27,
    F64 = 28,
    IQ1_M = 29,
    BF16 = 30,
    TQ1_0 = 34,
    TQ2_0 = 35,
    MXFP4 = 39,
    NVFP4 = 40,
    Q1_0 = 41,
    Q2_0 = 42,
}

/// `QK_K` in ggml-common.h: elements per super-block of the k-quants and i-quants.
const QK_K: u32 = 256;

impl GgmlType {
    /// Every type this ggml knows, in id order.
    pub const ALL: [GgmlType; 35] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
        GgmlType::Q2_0,
    ];

    /// The type with this id, or `None` for an unknown or removed id.
    pub fn from_u32(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The id written in GGUF tensor infos.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// Elements per block (`blck_size` in ggml.c `type_traits`).
    pub fn block_size(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 | F16 | BF16 | F64 | I8 | I16 | I32 | I64 => 1,
            Q4_0 | Q4_1 | Q5_0 | Q5_1 | Q8_0 | Q8_1 | IQ4_NL | MXFP4 => 32,
            NVFP4 | Q2_0 => 64,
            Q1_0 => 128,
            Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | Q8_K | IQ2_XXS | IQ2_XS | IQ3_XXS | IQ1_S
            | IQ3_S | IQ2_S | IQ4_XS | IQ1_M | TQ1_0 | TQ2_0 => QK_K,
        }
    }

    /// Bytes per block (`type_size` in ggml.c `type_traits`, the `sizeof(block_*)` of
    /// ggml-common.h; the `static_assert`s there give each sum).
    pub fn type_size(self) -> u32 {
        use GgmlType::*;
        match self {
            F32 => 4,
            F16 | BF16 => 2,
            F64 | I64 => 8,
            I8 => 1,
            I16 => 2,
            I32 => 4,
            Q4_0 => 2 + 16,                // d + qs[16]
            Q4_1 => 2 * 2 + 16,            // d, m + qs[16]
            Q5_0 => 2 + 4 + 16,            // d + qh[4] + qs[16]
            Q5_1 => 2 * 2 + 4 + 16,        // d, m + qh[4] + qs[16]
            Q8_0 => 2 + 32,                // d + qs[32]
            Q8_1 => 2 * 2 + 32,            // d, s + qs[32]
            MXFP4 => 1 + 16,               // e + qs[16]
            NVFP4 => 4 + 32,               // d[4] + qs[32]
            Q1_0 => 2 + 16,                // d + qs[128/8]
            Q2_0 => 2 + 16,                // d + qs[64/4]
            Q2_K => 2 * 2 + 16 + 64,       // d, dmin + scales[16] + qs[64]
            Q3_K => 2 + 64 + 32 + 12,      // d + qs[64] + hmask[32] + scales[12]
            Q4_K => 2 * 2 + 12 + 128,      // d, dmin + scales[12] + qs[128]
            Q5_K => 2 * 2 + 12 + 128 + 32, // d, dmin + scales[12] + qs[128] + qh[32]
            Q6_K => 2 + 16 + 128 + 64,     // d + scales[16] + ql[128] + qh[64]
            Q8_K => 4 + 256 + 16 * 2,      // f32 d + qs[256] + bsums[16]
            IQ2_XXS => 2 + 64,             // d + u16 qs[32]
            IQ2_XS => 2 + 64 + 8,          // d + u16 qs[32] + scales[8]
            IQ3_XXS => 2 + 96,             // d + qs[96]
            IQ1_S => 2 + 32 + 16,          // d + qs[32] + u16 qh[8]
            IQ4_NL => 2 + 16,              // d + qs[16]
            IQ3_S => 2 + 13 * 8 + 4,       // d + 13*(QK_K/32) + scales[QK_K/64]
            IQ2_S => 2 + 64 + 16,          // d + qs[64] + qh[8] + scales[8]
            IQ4_XS => 2 + 2 + 4 + 128,     // d + scales_h + scales_l[4] + qs[128]
            IQ1_M => 32 + 16 + 8,          // qs[32] + qh[16] + scales[8]
            TQ1_0 => 48 + 4 + 2,           // qs[(256 - 16)/5] + qh[4] + d
            TQ2_0 => 64 + 2,               // qs[64] + d
        }
    }

    /// The ggml name, upper-cased: "F32", "Q4_K", "IQ2_XXS", "BF16".
    pub fn name(self) -> &'static str {
        use GgmlType::*;
        match self {
            F32 => "F32",
            F16 => "F16",
            Q4_0 => "Q4_0",
            Q4_1 => "Q4_1",
            Q5_0 => "Q5_0",
            Q5_1 => "Q5_1",
            Q8_0 => "Q8_0",
            Q8_1 => "Q8_1",
            Q2_K => "Q2_K",
            Q3_K => "Q3_K",
            Q4_K => "Q4_K",
            Q5_K => "Q5_K",
            Q6_K => "Q6_K",
            Q8_K => "Q8_K",
            IQ2_XXS => "IQ2_XXS",
            IQ2_XS => "IQ2_XS",
            IQ3_XXS => "IQ3_XXS",
            IQ1_S => "IQ1_S",
            IQ4_NL => "IQ4_NL",
            IQ3_S => "IQ3_S",
            IQ2_S => "IQ2_S",
            IQ4_XS => "IQ4_XS",
            I8 => "I8",
            I16 => "I16",
            I32 => "I32",
            I64 => "I64",
            F64 => "F64",
            IQ1_M => "IQ1_M",
            BF16 => "BF16",
            TQ1_0 => "TQ1_0",
            TQ2_0 => "TQ2_0",
            MXFP4 => "MXFP4",
            NVFP4 => "NVFP4",
            Q1_0 => "Q1_0",
            Q2_0 => "Q2_0",
        }
    }

    /// Whether the type stores blocks of quantised values (block size above one).
    pub fn is_quantized(self) -> bool {
        self.block_size() > 1
    }

    /// Bytes of one row of `ne0` elements, or `None` when `ne0` is not a multiple of the block
    /// size (or the byte count overflows).
    pub fn row_bytes(self, ne0: u64) -> Option<u64> {
        let block_size = u64::from(self.block_size());
        if !ne0.is_multiple_of(block_size) {
            return None;
        }
        (ne0 / block_size).checked_mul(u64::from(self.type_size()))
    }

    /// Bytes of a tensor with these dims (`ne[0]` first), or `None` when `ne[0]` does not fit
    /// the block size, a dim is zero, there are no dims, or the count overflows.
    pub fn tensor_bytes(self, dims: &[u64]) -> Option<u64> {
        let (&ne0, rest) = dims.split_first()?;
        if dims.contains(&0) {
            return None;
        }
        rest.iter()
            .try_fold(self.row_bytes(ne0)?, |acc, &d| acc.checked_mul(d))
    }
}

/// The name of an id that ggml removed from GGUF files, for error messages.
pub fn removed_type_name(id: u32) -> Option<&'static str> {
    match id {
        4 => Some("Q4_2"),
        5 => Some("Q4_3"),
        31 => Some("Q4_0_4_4"),
        32 => Some("Q4_0_4_8"),
        33 => Some("Q4_0_8_8"),
        36 => Some("IQ4_NL_4_4"),
        37 => Some("IQ4_NL_4_8"),
        38 => Some("IQ4_NL_8_8"),
        _ => None,
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The error of parsing a type name that ggml does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown ggml type '{0}' (expected a name such as F32, F16, BF16, Q8_0, Q4_K)")]
pub struct ParseGgmlTypeError(pub String);

impl FromStr for GgmlType {
    type Err = ParseGgmlTypeError;

    /// Parses a name case-insensitively: "q4_k", "Q4_K", "bf16".
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let trimmed = s.trim();
        GgmlType::ALL
            .iter()
            .copied()
            .find(|t| t.name().eq_ignore_ascii_case(trimmed))
            .ok_or_else(|| ParseGgmlTypeError(s.to_string()))
    }
}

impl serde::Serialize for GgmlType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for GgmlType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_removed_ids_are_unknown() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_u32(t.id()), Some(t));
        }
        for id in [4, 5, 31, 32, 33, 36, 37, 38, 43, 1000, u32::MAX] {
            assert_eq!(GgmlType::from_u32(id), None, "id {id}");
        }
        assert_eq!(removed_type_name(31), Some("Q4_0_4_4"));
        // ggml.h: GGML_TYPE_COUNT = 43, eight ids removed.
        assert_eq!(GgmlType::ALL.len(), 43 - 8);
    }

    #[test]
    fn sizes_match_ggml_common() {
        // Values of sizeof(block_*) computed from ggml-common.h.
        let expected = [
            (GgmlType::F32, 1, 4),
            (GgmlType::F16, 1, 2),
            (GgmlType::BF16, 1, 2),
            (GgmlType::Q4_0, 32, 18),
            (GgmlType::Q4_1, 32, 20),
            (GgmlType::Q5_0, 32, 22),
            (GgmlType::Q5_1, 32, 24),
            (GgmlType::Q8_0, 32, 34),
            (GgmlType::Q8_1, 32, 36),
            (GgmlType::Q2_K, 256, 84),
            (GgmlType::Q3_K, 256, 110),
            (GgmlType::Q4_K, 256, 144),
            (GgmlType::Q5_K, 256, 176),
            (GgmlType::Q6_K, 256, 210),
            (GgmlType::Q8_K, 256, 292),
            (GgmlType::IQ2_XXS, 256, 66),
            (GgmlType::IQ2_XS, 256, 74),
            (GgmlType::IQ3_XXS, 256, 98),
            (GgmlType::IQ1_S, 256, 50),
            (GgmlType::IQ4_NL, 32, 18),
            (GgmlType::IQ3_S, 256, 110),
            (GgmlType::IQ2_S, 256, 82),
            (GgmlType::IQ4_XS, 256, 136),
            (GgmlType::IQ1_M, 256, 56),
            (GgmlType::TQ1_0, 256, 54),
            (GgmlType::TQ2_0, 256, 66),
            (GgmlType::MXFP4, 32, 17),
            (GgmlType::NVFP4, 64, 36),
            (GgmlType::Q1_0, 128, 18),
            (GgmlType::Q2_0, 64, 18),
        ];
        for (t, block, size) in expected {
            assert_eq!((t.block_size(), t.type_size()), (block, size), "{t}");
        }
    }

    #[test]
    fn names_parse_case_insensitively() {
        assert_eq!("q4_k".parse::<GgmlType>(), Ok(GgmlType::Q4_K));
        assert_eq!("Bf16".parse::<GgmlType>(), Ok(GgmlType::BF16));
        assert_eq!("iq2_xxs".parse::<GgmlType>(), Ok(GgmlType::IQ2_XXS));
        for t in GgmlType::ALL {
            assert_eq!(t.name().to_lowercase().parse::<GgmlType>(), Ok(t));
        }
        let err = "q4_z".parse::<GgmlType>().unwrap_err();
        assert!(err.to_string().contains("q4_z"));
    }

    #[test]
    fn row_bytes_checks_the_block_multiple() {
        assert_eq!(GgmlType::Q4_K.row_bytes(2048), Some(8 * 144));
        assert_eq!(GgmlType::Q4_K.row_bytes(2048 + 32), None);
        assert_eq!(GgmlType::Q8_0.row_bytes(96), Some(3 * 34));
        assert_eq!(GgmlType::F32.row_bytes(3), Some(12));
        assert_eq!(GgmlType::F32.row_bytes(u64::MAX), None);
        assert_eq!(GgmlType::Q4_K.tensor_bytes(&[256, 3, 2]), Some(6 * 144));
        assert_eq!(GgmlType::F32.tensor_bytes(&[4, 0]), None);
        assert_eq!(GgmlType::F32.tensor_bytes(&[]), None);
        assert_eq!(GgmlType::F32.tensor_bytes(&[1 << 40, 1 << 40]), None);
    }
}
