//! Filler token ids: deterministic, spread over the whole vocabulary so that MoE routing looks
//! like routing on text rather than on one repeated token. Quality is irrelevant to op timing.

/// `n` token ids for positions `start..start + n` of the stream seeded by `seed`, each in
/// `0..vocab`. Position `p` always gets the same id for the same seed and vocabulary, so a chunk
/// at depth L is the same whether the context was filled in one call or in many.
pub fn filler_tokens(seed: u64, start: u32, n: u32, vocab: u32) -> Vec<i32> {
    let vocab = vocab.max(1) as u64;
    (start..start.saturating_add(n))
        .map(|p| (splitmix64(seed ^ (p as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)) % vocab) as i32)
        .collect()
}

/// The tokens of decode step `step` of `parallel` sequences decoded from depth `depth`: one per
/// sequence, each sequence its own stream (seed `seed` mixed with the sequence), at position
/// `depth + step`. Every engine decodes the same tokens.
pub fn decode_step_tokens(seed: u64, depth: u32, step: u32, parallel: u32, vocab: u32) -> Vec<i32> {
    (0..parallel.max(1))
        .map(|s| {
            filler_tokens(
                seed ^ (s as u64 + 1).wrapping_mul(0x9E37_79B9),
                depth + step,
                1,
                vocab,
            )[0]
        })
        .collect()
}

/// The tokens of one decode step at position `pos` of `parallel` sequences forked from a
/// shared context (a sweep's decode steps after each chunk): one per sequence, each sequence
/// its own stream, the same stream [`decode_step_tokens`] gives it.
pub fn forked_step_tokens(seed: u64, pos: u32, parallel: u32, vocab: u32) -> Vec<i32> {
    (0..parallel.max(1))
        .map(|s| {
            filler_tokens(
                seed ^ (s as u64 + 1).wrapping_mul(0x9E37_79B9),
                pos,
                1,
                vocab,
            )[0]
        })
        .collect()
}

/// SplitMix64: a small, well-mixed, stable hash (Vigna). Kept here rather than pulling in a
/// random-number crate because the sequence must never change between versions.
pub fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// FNV-1a over the bit patterns of `values`: equal only when the floats are bit-identical.
pub fn hash_f32(values: &[f32]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for v in values {
        for b in v.to_bits().to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tools/torch-trace/record.py reproduces this stream in Python for transformers: its
    /// `filler_tokens(0, 0, 6, 262144)` and `filler_tokens(0, 126, 2, 262144)` (Gemma 3's
    /// vocabulary) printed these ids.
    #[test]
    fn the_python_port_of_the_recording_tool_gives_the_same_ids() {
        assert_eq!(
            filler_tokens(0, 0, 6, 262_144),
            [118191, 91636, 83279, 33260, 29851, 172778]
        );
        assert_eq!(filler_tokens(0, 126, 2, 262_144), [8130, 236569]);
    }

    #[test]
    fn filler_is_positional_and_in_range() {
        let whole = filler_tokens(7, 0, 1024, 1000);
        let tail = filler_tokens(7, 512, 512, 1000);
        assert_eq!(&whole[512..], &tail[..]);
        assert!(whole.iter().all(|&t| (0..1000).contains(&t)));
        // spread: 1024 draws over 1000 ids hit far more than a handful of distinct ids
        let mut distinct = whole.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert!(distinct.len() > 500, "only {} distinct ids", distinct.len());
        assert_ne!(filler_tokens(8, 0, 16, 1000), filler_tokens(7, 0, 16, 1000));
    }

    #[test]
    fn splitmix_matches_reference_values() {
        // First outputs of the reference SplitMix64 generator seeded with 0 are obtained by
        // feeding it the running state 0, 0x9E37..., 2*0x9E37...: our function adds the
        // increment itself, so splitmix64(0) is the first output.
        assert_eq!(splitmix64(0), 0xE220_A839_7B1D_CDAF);
    }

    #[test]
    fn hash_sees_a_single_bit() {
        let a = [1.0f32, 2.0, 3.0];
        let b = [1.0f32, 2.0, f32::from_bits(3.0f32.to_bits() ^ 1)];
        assert_ne!(hash_f32(&a), hash_f32(&b));
        assert_eq!(hash_f32(&a), hash_f32(&[1.0, 2.0, 3.0]));
    }
}
