//! Tensor data for synthetic models: seeded random bytes shaped into valid blocks, generated chunk by chunk.
//!
//! Quantised blocks are random bytes whose f16 scale fields are overwritten with values that
//! keep weights around +-0.02 (block layouts from ggml-common.h): no float is quantised, which
//! keeps generation at the speed of the random generator.

use half::{bf16, f16};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::plan::Fill;
use super::preset::Llama3Rope;
use crate::types::GgmlType;

/// Half-width of the uniform distribution of float weights (standard deviation about 0.02).
pub const FLOAT_WEIGHT_RANGE: f32 = 0.035;

/// The f16 fields of one block that get fixed values: (byte offset, value).
/// Offsets and field meanings from ggml-common.h.
pub fn block_scales(t: GgmlType) -> &'static [(usize, f32)] {
    match t {
        // d; weights d * (q - 8), q in 0..16
        GgmlType::Q4_0 => &[(0, 0.02 / 8.0)],
        // d, m; weights d * q + m, q in 0..16
        GgmlType::Q4_1 => &[(0, 0.04 / 15.0), (2, -0.02)],
        // d; weights d * (q - 16), q in 0..32
        GgmlType::Q5_0 => &[(0, 0.02 / 16.0)],
        // d, m; weights d * q + m, q in 0..32
        GgmlType::Q5_1 => &[(0, 0.04 / 31.0), (2, -0.02)],
        // d; weights d * q, q in -128..128
        GgmlType::Q8_0 => &[(0, 0.02 / 128.0)],
        // scales[16], qs[64], then d, dmin: weights d * sc * q - dmin * m, sc, m in 0..16, q in 0..4
        GgmlType::Q2_K => &[(80, 0.04 / 45.0), (82, 0.02 / 15.0)],
        // hmask[32], qs[64], scales[12], then d: weights d * (sc - 32) * q, q in -4..4
        GgmlType::Q3_K => &[(108, 0.02 / 128.0)],
        // d, dmin first: weights d * sc * q - dmin * m, sc, m in 0..64, q in 0..16
        GgmlType::Q4_K => &[(0, 4e-5), (2, 3e-4)],
        // d, dmin first: q in 0..32
        GgmlType::Q5_K => &[(0, 2e-5), (2, 3e-4)],
        // ql[128], qh[64], int8 scales[16], then d: weights d * sc * (q - 32); with random
        // scales the typical |sc * (q - 32)| is about 1400, so d = 1.5e-5 gives ~0.02.
        GgmlType::Q6_K => &[(208, 1.5e-5)],
        _ => &[],
    }
}

/// The generator of one tensor's bytes: same seed and name, same bytes.
pub fn tensor_rng(seed: u64, name: &str) -> ChaCha8Rng {
    // FNV-1a of the name, then splitmix64 to spread (seed, name) over the 32-byte key.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in name.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let mut state = seed ^ h.rotate_left(29);
    let mut key = [0u8; 32];
    for (i, word) in key.chunks_exact_mut(8).enumerate() {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15 ^ (h.wrapping_mul(i as u64 + 1)));
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        word.copy_from_slice(&z.to_le_bytes());
    }
    ChaCha8Rng::from_seed(key)
}

/// Chunk size for a type: a whole number of blocks near `target_bytes`.
pub fn chunk_bytes(t: GgmlType, target_bytes: u64) -> u64 {
    let block = u64::from(t.type_size());
    (target_bytes / block).max(1) * block
}

/// Fills `buf` (a whole number of blocks, the chunk that starts at element `first_element`)
/// with the data `fill` asks for in type `t`.
pub fn fill_chunk(
    rng: &mut ChaCha8Rng,
    fill: Fill,
    t: GgmlType,
    first_element: u64,
    buf: &mut [u8],
) {
    match (fill, t) {
        (Fill::Weights, t) if t.is_quantized() => {
            rng.fill_bytes(buf);
            let scales = block_scales(t);
            let block = t.type_size() as usize;
            let fields: Vec<(usize, [u8; 2])> = scales
                .iter()
                .map(|&(offset, v)| (offset, f16::from_f32(v).to_le_bytes()))
                .collect();
            for b in buf.chunks_exact_mut(block) {
                for (offset, bytes) in &fields {
                    if let Some(field) = b.get_mut(*offset..*offset + 2) {
                        field.copy_from_slice(bytes);
                    }
                }
            }
        }
        (Fill::Weights, t) => uniform(rng, t, -FLOAT_WEIGHT_RANGE, FLOAT_WEIGHT_RANGE, buf),
        (Fill::Uniform { low, high }, t) => uniform(rng, t, low, high, buf),
        (Fill::Constant(c), t) => constant(t, c, buf),
        (Fill::Llama3RopeFactors { rope, dims, base }, _) => {
            let factors = llama3_rope_factors(&rope, dims, base);
            let first = usize::try_from(first_element).unwrap_or(usize::MAX);
            for (i, out) in buf.chunks_exact_mut(4).enumerate() {
                let f = factors.get(first.saturating_add(i)).copied().unwrap_or(1.0);
                out.copy_from_slice(&f.to_le_bytes());
            }
        }
    }
}

/// Uniform floats in [low, high) stored as F32, F16 or BF16.
fn uniform(rng: &mut ChaCha8Rng, t: GgmlType, low: f32, high: f32, buf: &mut [u8]) {
    rng.fill_bytes(buf);
    let span = high - low;
    match t {
        GgmlType::F16 | GgmlType::BF16 => {
            for c in buf.chunks_exact_mut(2) {
                let x = u16::from_le_bytes([
                    c.first().copied().unwrap_or(0),
                    c.get(1).copied().unwrap_or(0),
                ]);
                let v = low + span * (f32::from(x) / 65536.0);
                let bits = if t == GgmlType::F16 {
                    f16::from_f32(v).to_bits()
                } else {
                    bf16::from_f32(v).to_bits()
                };
                c.copy_from_slice(&bits.to_le_bytes());
            }
        }
        _ => {
            for c in buf.chunks_exact_mut(4) {
                let x = u32::from_le_bytes(c.try_into().unwrap_or([0; 4]));
                let v = low + span * ((x >> 8) as f32 / 16_777_216.0);
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
    }
}

fn constant(t: GgmlType, c: f32, buf: &mut [u8]) {
    match t {
        GgmlType::F16 => fill_pattern(buf, &f16::from_f32(c).to_le_bytes()),
        GgmlType::BF16 => fill_pattern(buf, &bf16::from_f32(c).to_le_bytes()),
        _ => fill_pattern(buf, &c.to_le_bytes()),
    }
}

fn fill_pattern(buf: &mut [u8], pattern: &[u8]) {
    for c in buf.chunks_exact_mut(pattern.len()) {
        c.copy_from_slice(pattern);
    }
}

/// The llama3 rope frequency factors, as convert_hf_to_gguf.py computes them: 1 for high
/// frequencies, `factor` for low ones, a smooth blend between.
pub fn llama3_rope_factors(r: &Llama3Rope, rope_dims: u32, base: f32) -> Vec<f32> {
    let low_freq_wavelen = r.original_context_length as f32 / r.low_freq_factor;
    let high_freq_wavelen = r.original_context_length as f32 / r.high_freq_factor;
    (0..rope_dims / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f32 / rope_dims as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < high_freq_wavelen {
                1.0
            } else if wavelen > low_freq_wavelen {
                r.factor
            } else {
                let smooth = (r.original_context_length as f32 / wavelen - r.low_freq_factor)
                    / (r.high_freq_factor - r.low_freq_factor);
                1.0 / ((1.0 - smooth) / r.factor + smooth)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_name_and_seed_give_the_same_stream() {
        let mut a = [0u8; 64];
        let mut b = [0u8; 64];
        tensor_rng(7, "blk.0.attn_q.weight").fill_bytes(&mut a);
        tensor_rng(7, "blk.0.attn_q.weight").fill_bytes(&mut b);
        assert_eq!(a, b);
        tensor_rng(8, "blk.0.attn_q.weight").fill_bytes(&mut b);
        assert_ne!(a, b);
        tensor_rng(7, "blk.0.attn_k.weight").fill_bytes(&mut b);
        assert_ne!(a, b);
    }

    #[test]
    fn scale_fields_lie_inside_their_blocks_and_are_finite() {
        for t in GgmlType::ALL {
            for &(offset, v) in block_scales(t) {
                assert!(offset + 2 <= t.type_size() as usize, "{t}");
                let h = f16::from_f32(v);
                assert!(h.to_f32().is_finite() && h.to_f32() != 0.0, "{t}: {v}");
            }
        }
    }

    #[test]
    fn float_fills_stay_in_range() {
        let mut rng = tensor_rng(1, "x");
        for t in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            let mut buf = vec![0u8; 4096];
            fill_chunk(
                &mut rng,
                Fill::Uniform {
                    low: -4.0,
                    high: -0.5,
                },
                t,
                0,
                &mut buf,
            );
            let values: Vec<f32> = match t {
                GgmlType::F32 => buf
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
                GgmlType::F16 => buf
                    .chunks_exact(2)
                    .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                _ => buf
                    .chunks_exact(2)
                    .map(|c| bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
            };
            assert!(values.iter().all(|v| (-4.0..=-0.5).contains(v)), "{t}");
        }
    }

    #[test]
    fn llama3_factors_match_the_converter() {
        let r = Llama3Rope {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_context_length: 8192,
        };
        let f = llama3_rope_factors(&r, 128, 500_000.0);
        assert_eq!(f.len(), 64);
        assert_eq!(f[0], 1.0);
        assert_eq!(f[63], 8.0);
        assert!(f.windows(2).all(|w| w[0] <= w[1]));
        assert!(f.iter().any(|&x| x > 1.0 && x < 8.0));
    }
}
