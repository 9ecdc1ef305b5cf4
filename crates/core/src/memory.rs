//! Memory a run needs before it starts: weights, KV cache, recurrent state and compute buffers,
//! set against the memory available, so a run that cannot fit is refused with both numbers
//! instead of failing (or swapping) an hour in.

use serde::{Deserialize, Serialize};

use crate::arch::{ArchInfo, LayerKind, Mixer};

/// What a run of `contexts` contexts of `n_ctx` tokens needs, by part.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemoryEstimate {
    pub weights_bytes: u64,
    pub kv_cache_bytes: u64,
    pub recurrent_state_bytes: u64,
    /// A deliberate over-estimate of the compute buffers (activations of one chunk, the
    /// attention scores of the soft-max path, the logits).
    pub compute_bytes: u64,
    pub total_bytes: u64,
}

impl MemoryEstimate {
    /// The part this machine holds of a model split over devices: `here` of its `layers`
    /// layers' weights, KV cache and recurrent state, in proportion (the token embedding and
    /// the output layer are counted as an average layer's share); the compute buffers whole,
    /// as every device has its own.
    pub fn share(self, here: u32, layers: u32) -> MemoryEstimate {
        let part = |b: u64| (b as u128 * here as u128 / layers.max(1) as u128) as u64;
        let (weights_bytes, kv_cache_bytes, recurrent_state_bytes) = (
            part(self.weights_bytes),
            part(self.kv_cache_bytes),
            part(self.recurrent_state_bytes),
        );
        MemoryEstimate {
            weights_bytes,
            kv_cache_bytes,
            recurrent_state_bytes,
            compute_bytes: self.compute_bytes,
            total_bytes: weights_bytes
                + kv_cache_bytes
                + recurrent_state_bytes
                + self.compute_bytes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the run needs about {} (weights {}, KV cache {}, recurrent state {}, compute {}) but {} is available",
    gib(.need.total_bytes), gib(.need.weights_bytes), gib(.need.kv_cache_bytes),
    gib(.need.recurrent_state_bytes), gib(.need.compute_bytes), gib(*.available_bytes)
)]
pub struct DoesNotFit {
    pub need: MemoryEstimate,
    pub available_bytes: u64,
}

fn gib(b: u64) -> String {
    format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64)
}

/// The estimate for `contexts` contexts (llama.cpp's profile uses two: plain and instrumented)
/// holding `n_ctx` tokens each and decoding chunks of `chunk_tokens`. The KV cache is F16, as
/// llama.cpp's default.
pub fn estimate(
    arch: &ArchInfo,
    weights_bytes: u64,
    n_ctx: u64,
    chunk_tokens: u64,
    contexts: u64,
    all_logits: bool,
) -> MemoryEstimate {
    // KV cache, F16: full-attention layers hold every token, sliding-window layers the window
    // plus one chunk (llama.cpp's SWA cache: n_swa + n_ubatch cells)
    let kv_row = arch.n_head_kv as u64 * (arch.key_length + arch.value_length) as u64 * 2;
    let kv_tokens: u64 = arch
        .layers
        .iter()
        .map(|l| match (l.kind, l.window) {
            (LayerKind::FullAttention, _) => n_ctx,
            (LayerKind::SlidingWindow, Some(w)) => n_ctx.min(w as u64 + chunk_tokens),
            (LayerKind::SlidingWindow, None) => n_ctx,
            _ => 0,
        })
        .sum();
    let kv_cache_bytes = kv_tokens.saturating_mul(kv_row).saturating_mul(contexts);
    let recurrent_state_bytes: u64 = arch
        .layers
        .iter()
        .filter(|l| l.kind == LayerKind::LinearAttention)
        .map(|l| recurrent_state_bytes(arch, l.mixer))
        .sum::<u64>()
        * contexts;
    let width = (arch.n_embd as u64)
        .max(arch.ffn_length as u64 * arch.n_experts_used.max(1) as u64)
        .max((arch.n_head as u64) * (arch.key_length as u64) * 2);
    let activations = chunk_tokens * width * 4 * 8;
    let scores = chunk_tokens * n_ctx * arch.n_head as u64 * 4;
    let logits = if all_logits { chunk_tokens } else { 1 } * arch.n_vocab as u64 * 4;
    let compute_bytes = (activations + scores + logits) * contexts;
    MemoryEstimate {
        weights_bytes,
        kv_cache_bytes,
        recurrent_state_bytes,
        compute_bytes,
        total_bytes: weights_bytes + kv_cache_bytes + recurrent_state_bytes + compute_bytes,
    }
}

/// One recurrent layer's state, F32. Gated delta-net: the conv state (kernel - 1) x conv_dim and
/// a state_size^2 matrix per value head. Mamba / Mamba-2: the conv state (kernel - 1) x the conv
/// channels and a state_size x inner_size scan state. Other mixers (RWKV, short conv): n_embd^2,
/// a deliberate over-estimate of states that are a few n_embd-wide rows.
fn recurrent_state_bytes(arch: &ArchInfo, mixer: Mixer) -> u64 {
    let d = arch.ssm_state_size as u64;
    let k = (arch.ssm_conv_kernel as u64).saturating_sub(1);
    match mixer {
        Mixer::DeltaNet => {
            let conv_dim = 2 * d * arch.ssm_group_count as u64 + d * arch.ssm_time_step_rank as u64;
            k * conv_dim * 4 + d * d * arch.ssm_time_step_rank as u64 * 4
        }
        Mixer::Mamba | Mixer::Mamba2 => {
            let inner = arch.ssm_inner_size as u64;
            let conv = inner + 2 * arch.ssm_group_count as u64 * d;
            k * conv * 4 + d * inner * 4
        }
        _ => (arch.n_embd as u64).pow(2) * 4,
    }
}

/// Refuses an estimate larger than the memory available.
pub fn check(need: MemoryEstimate, available_bytes: u64) -> Result<MemoryEstimate, DoesNotFit> {
    if need.total_bytes > available_bytes {
        Err(DoesNotFit {
            need,
            available_bytes,
        })
    } else {
        Ok(need)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;

    #[test]
    fn kv_and_recurrent_state_by_hand() {
        let mut md = qwen35moe_md(4);
        for (k, v) in [
            ("attention.key_length", 256u64),
            ("attention.value_length", 256),
            ("ssm.conv_kernel", 4),
            ("ssm.state_size", 128),
            ("ssm.group_count", 16),
            ("ssm.time_step_rank", 32),
            ("expert_feed_forward_length", 512),
        ] {
            md.u.insert(format!("qwen35moe.{k}"), v);
        }
        let arch = ArchInfo::from_metadata(&md).unwrap();
        let e = estimate(&arch, 1000, 16896, 512, 2, false);
        // 1 full-attention layer x 2 KV heads x (256 + 256) x 2 bytes = 2048 bytes a token
        assert_eq!(e.kv_cache_bytes, 16896 * 2048 * 2);
        // conv_dim = 2*128*16 + 128*32 = 8192; conv 3 x 8192 x 4 = 98304; state 128*128*32*4
        // = 2097152; 3 linear layers, 2 contexts
        assert_eq!(e.recurrent_state_bytes, 3 * (98_304 + 2_097_152) * 2);
        assert_eq!(
            e.total_bytes,
            1000 + e.kv_cache_bytes + e.recurrent_state_bytes + e.compute_bytes
        );
        let err = check(e, e.total_bytes - 1).unwrap_err();
        assert!(err.to_string().contains("is available"), "{err}");
        assert!(check(e, e.total_bytes).is_ok());
        // a split keeping 1 of the 4 layers here: a quarter of the weights, cache and state
        let q = e.share(1, 4);
        assert_eq!(q.weights_bytes, 250);
        assert_eq!(q.kv_cache_bytes, 16896 * 2048 * 2 / 4);
        assert_eq!(q.recurrent_state_bytes, 3 * (98_304 + 2_097_152) * 2 / 4);
        assert_eq!(q.compute_bytes, e.compute_bytes);
        assert_eq!(
            q.total_bytes,
            250 + q.kv_cache_bytes + q.recurrent_state_bytes + q.compute_bytes
        );
        assert_eq!(e.share(4, 4), e);
    }

    #[test]
    fn sliding_window_layers_keep_the_window_and_one_chunk() {
        // Gemma 3 270M's shape: 15 sliding layers (window 512), 3 full, 1 KV head of 256
        let mut md = crate::arch::tests::dense_md("gemma3", 18);
        md.u.insert("gemma3.attention.sliding_window".into(), 512);
        md.u.insert("gemma3.attention.key_length".into(), 256);
        md.u.insert("gemma3.attention.value_length".into(), 256);
        let arch = ArchInfo::from_metadata(&md).unwrap();
        let e = estimate(&arch, 0, 16896, 512, 1, false);
        // a row is 1 KV head x (256 + 256) x 2 bytes = 1024 bytes; full layers hold 16896
        // tokens, sliding ones 512 + 512
        assert_eq!(e.kv_cache_bytes, (3 * 16896 + 15 * 1024) * 1024);
        assert_eq!(e.recurrent_state_bytes, 0);
    }
}
