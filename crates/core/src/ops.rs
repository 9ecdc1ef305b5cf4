//! Standalone op timing from the census: expert routings (first-k, uniform, captured) for the
//! expert matmuls, and the band times they add up to (per-call time x count) set against the
//! in-graph band times and the FUSED wall, so the user sees what standalone timing under- or
//! over-counts.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::tokens::splitmix64;

pub const OPS_SCHEMA_VERSION: u32 = 1;

/// How the expert ids of a standalone expert matmul are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Routing {
    /// Every token uses experts 0..k-1 (what many op benchmarks do).
    FirstK,
    /// Each token k distinct experts of n, uniformly at random (seeded).
    Uniform,
    /// The ids a real run of the model routed.
    Captured,
}

impl Routing {
    pub fn name(self) -> &'static str {
        match self {
            Routing::FirstK => "first-k",
            Routing::Uniform => "uniform",
            Routing::Captured => "captured",
        }
    }

    pub fn parse(s: &str) -> Option<Routing> {
        match s {
            "first-k" | "firstk" => Some(Routing::FirstK),
            "uniform" => Some(Routing::Uniform),
            "captured" => Some(Routing::Captured),
            _ => None,
        }
    }
}

/// Ids `[n_used, n_tokens]` (n_used fastest) where every token uses experts 0..n_used-1.
pub fn first_k_ids(n_used: u32, n_tokens: u32) -> Vec<i32> {
    (0..n_tokens).flat_map(|_| 0..n_used as i32).collect()
}

/// Ids `[n_used, n_tokens]`: each token `n_used` distinct experts of `n_experts`, uniformly
/// (a partial Fisher-Yates shuffle driven by SplitMix64 from `seed`).
pub fn uniform_ids(n_experts: u32, n_used: u32, n_tokens: u32, seed: u64) -> Vec<i32> {
    let k = n_used.min(n_experts) as usize;
    let mut state = seed;
    let mut pool: Vec<i32> = (0..n_experts as i32).collect();
    let mut out = Vec::with_capacity(k * n_tokens as usize);
    for _ in 0..n_tokens {
        for i in 0..k {
            state = splitmix64(state);
            let j = i + (state % (pool.len() - i) as u64) as usize;
            pool.swap(i, j);
            out.push(pool[i]);
        }
    }
    out
}

/// Distinct experts an ids tensor touches.
pub fn distinct_experts(ids: &[i32]) -> u32 {
    ids.iter().collect::<BTreeSet<_>>().len() as u32
}

/// One distinct (op, shapes, types) timed alone.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpRow {
    pub op: String,
    pub band: String,
    pub signature: String,
    /// Nodes of the graph with this signature.
    pub count: u32,
    /// The routing of an expert matmul (`None` for other ops).
    pub routing: Option<Routing>,
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    pub reps: u32,
    /// Distinct experts the ids touch, and the bytes of their weights.
    pub experts_touched: Option<u32>,
    pub expert_bytes: Option<u64>,
    /// Copies of the inputs the timing rotated over (so weights are not all cache-warm).
    pub rotation: u32,
}

/// One band, standalone against in-graph.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpsBandRow {
    pub band: String,
    /// TIMED share x FUSED wall / tokens, from a profile of the same chunk.
    pub in_graph_ms_per_token: f64,
    /// Per-call time x count / tokens, per routing.
    pub standalone_ms_per_token: BTreeMap<String, f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpsSummary {
    pub schema_version: u32,
    pub tokens: u32,
    pub fused_ms: f64,
    pub routings: Vec<Routing>,
    pub rows: Vec<OpRow>,
    pub bands: Vec<OpsBandRow>,
    /// Sum of standalone band times / FUSED wall, per routing.
    pub coverage: BTreeMap<String, f64>,
    /// How much lower the MoE band comes out with first-k routing than with captured routing
    /// (a share of the captured figure); `None` without both.
    pub moe_first_k_undercount: Option<f64>,
    pub moe_band: Option<String>,
}

/// Adds up per-call times into bands per routing. `rows` holds one row per signature for ops
/// without routing and one per (signature, routing) for expert matmuls.
pub fn summarise_ops(
    bands: &[String],
    in_graph: &BTreeMap<String, f64>,
    rows: Vec<OpRow>,
    routings: &[Routing],
    tokens: u32,
    fused_ms: f64,
    moe_band: Option<&str>,
) -> OpsSummary {
    let tok = tokens.max(1) as f64;
    let mut band_rows: Vec<OpsBandRow> = bands
        .iter()
        .map(|b| OpsBandRow {
            band: b.clone(),
            in_graph_ms_per_token: in_graph.get(b).copied().unwrap_or(0.0),
            standalone_ms_per_token: BTreeMap::new(),
        })
        .collect();
    let mut coverage = BTreeMap::new();
    for &r in routings {
        let mut total = 0.0;
        for br in &mut band_rows {
            let ms: f64 = rows
                .iter()
                .filter(|row| {
                    row.band == br.band && (row.routing.is_none() || row.routing == Some(r))
                })
                .map(|row| row.median_us * row.count as f64 / 1e3)
                .sum();
            total += ms;
            br.standalone_ms_per_token
                .insert(r.name().to_string(), ms / tok);
        }
        coverage.insert(
            r.name().to_string(),
            if fused_ms > 0.0 {
                total / fused_ms
            } else {
                0.0
            },
        );
    }
    let moe_first_k_undercount = moe_band.and_then(|m| {
        let row = band_rows.iter().find(|b| b.band == m)?;
        let fk = row.standalone_ms_per_token.get("first-k")?;
        let cap = row.standalone_ms_per_token.get("captured")?;
        (*cap > 0.0).then(|| (cap - fk) / cap)
    });
    OpsSummary {
        schema_version: OPS_SCHEMA_VERSION,
        tokens,
        fused_ms,
        routings: routings.to_vec(),
        rows,
        bands: band_rows,
        coverage,
        moe_first_k_undercount,
        moe_band: moe_band.map(str::to_string),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routings_touch_the_experts_they_should() {
        // first-k: exactly k experts
        let fk = first_k_ids(8, 512);
        assert_eq!(fk.len(), 8 * 512);
        assert_eq!(distinct_experts(&fk), 8);
        // uniform, 8 of 256 for 512 tokens: expected distinct = 256 (1 - (1 - 8/256)^512),
        // computed here independently of the generator
        let u = uniform_ids(256, 8, 512, 42);
        let expected = 256.0 * (1.0 - (1.0f64 - 8.0 / 256.0).powi(512));
        let got = distinct_experts(&u) as f64;
        assert!((got - expected).abs() <= 3.0, "{got} vs {expected:.1}");
        // every token's experts are distinct and in range
        for t in u.chunks(8) {
            let mut s = t.to_vec();
            s.sort_unstable();
            s.dedup();
            assert_eq!(s.len(), 8);
            assert!(t.iter().all(|&e| (0..256).contains(&e)));
        }
        // fewer tokens, fewer experts: 4 tokens x 8 = at most 32
        assert!(distinct_experts(&uniform_ids(256, 8, 4, 1)) <= 32);
        assert_eq!(uniform_ids(256, 8, 512, 42), u, "seeded");
    }

    #[test]
    fn band_times_and_the_first_k_undercount() {
        let bands = vec!["moe".to_string(), "other".into()];
        let row = |band: &str, routing: Option<Routing>, us: f64, count: u32| OpRow {
            op: "X".into(),
            band: band.into(),
            signature: "s".into(),
            count,
            routing,
            median_us: us,
            min_us: us,
            max_us: us,
            reps: 5,
            experts_touched: None,
            expert_bytes: None,
            rotation: 1,
        };
        let rows = vec![
            row("moe", Some(Routing::FirstK), 600.0, 10),
            row("moe", Some(Routing::Captured), 1000.0, 10),
            row("other", None, 100.0, 10),
        ];
        let in_graph = BTreeMap::from([("moe".to_string(), 0.02), ("other".to_string(), 0.002)]);
        let s = summarise_ops(
            &bands,
            &in_graph,
            rows,
            &[Routing::FirstK, Routing::Captured],
            512,
            12.0,
            Some("moe"),
        );
        // captured: moe 10 ms + other 1 ms over 12 ms of FUSED wall
        assert!((s.coverage["captured"] - 11.0 / 12.0).abs() < 1e-12);
        assert!((s.coverage["first-k"] - 7.0 / 12.0).abs() < 1e-12);
        assert!((s.moe_first_k_undercount.unwrap() - 0.4).abs() < 1e-12);
        assert!((s.bands[0].standalone_ms_per_token["captured"] - 10.0 / 512.0).abs() < 1e-12);
    }
}
