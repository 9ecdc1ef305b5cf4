//! The output gate of an A/B of two builds: does B still compute the model A computes?
//!
//! Over every position's logits of the chunk (an untimed run per side) and greedy decode steps
//! after it, both sides fed A's greedy tokens: the normalised mean squared error of each row
//! against a stated bound (llama.cpp's own gates are NMSE based: `llama-results` allows 1e-6
//! over a prompt's logits with decode steps, `test-backend-ops` 1e-7, 5e-4 for MUL_MAT), top-1
//! agreement except where A's top two lie within a stated margin (a near tie, which a correct
//! reordering of a sum may flip: reported, not refused), and the first greedy token B would
//! choose differently (up to it, B's own greedy run would have fed the same tokens). A row that
//! is not finite fails the gate. Pure comparison ([`compare_rows`], [`GateTally`]) and the
//! driver over two engines ([`compare_outputs`]).

use serde::{Deserialize, Serialize};

use crate::ab::{compare_logits, Correctness, Tolerance};
use crate::engine::{EngineError, OutputReader, Work};

/// How strict the output gate is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OutputGateConfig {
    /// The largest NMSE of one row, `sum((b - a)^2) / sum(a^2)`, that still counts as the same
    /// output (default 1e-6, as `llama-results`).
    pub max_nmse: f64,
    /// Where A's two largest logits lie within this much of each other (in logits), a top-1
    /// that differs is a near tie: reported, not refused.
    pub near_tie: f64,
    /// Greedy decode steps after the chunk.
    pub steps: u32,
}

impl Default for OutputGateConfig {
    fn default() -> Self {
        OutputGateConfig {
            max_nmse: DEFAULT_MAX_NMSE,
            near_tie: DEFAULT_NEAR_TIE,
            steps: DEFAULT_STEPS,
        }
    }
}

/// `llama-results`' bound on the NMSE of a prompt's logits.
pub const DEFAULT_MAX_NMSE: f64 = 1e-6;
/// A's top two within 0.01 logits: a near tie.
pub const DEFAULT_NEAR_TIE: f64 = 1e-2;
/// Greedy steps after the chunk.
pub const DEFAULT_STEPS: u32 = 8;
/// Rows read from a side at a time (a row of a large vocabulary is a megabyte of text).
const ROWS_PER_READ: u32 = 8;

/// Where a row lies: a position of the chunk or a greedy step after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum At {
    Position(u32),
    Step(u32),
}

impl std::fmt::Display for At {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            At::Position(p) => write!(f, "position {p}"),
            At::Step(s) => write!(f, "greedy step {s}"),
        }
    }
}

/// One row compared.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RowFinding {
    pub at: At,
    /// `sum((b - a)^2) / sum(a^2)`; infinite where A's row is all zeros and B's is not, NaN
    /// (stored as null) where a value is not finite.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub nmse: f64,
    /// Greedy tokens (argmax) of each side.
    pub a_top: u32,
    pub b_top: u32,
    /// A's largest logit less its second largest.
    pub a_margin: f64,
    /// Values of either row that are NaN or infinite.
    pub non_finite: u32,
}

/// Compares one row of each side.
pub fn compare_rows(at: At, a: &[f32], b: &[f32]) -> RowFinding {
    let (mut err, mut norm) = (0.0f64, 0.0f64);
    let mut non_finite = 0u32;
    for (x, y) in a.iter().zip(b) {
        if !x.is_finite() || !y.is_finite() {
            non_finite += 1;
        }
        let (x, y) = (*x as f64, *y as f64);
        err += (y - x) * (y - x);
        norm += x * x;
    }
    non_finite += (a.len().abs_diff(b.len())) as u32;
    let nmse = if non_finite > 0 {
        f64::NAN
    } else if norm > 0.0 {
        err / norm
    } else if err == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    let (a_top, a_second) = top_two(a);
    let (b_top, _) = top_two(b);
    RowFinding {
        at,
        nmse,
        a_top: a_top.map_or(0, |(i, _)| i as u32),
        b_top: b_top.map_or(0, |(i, _)| i as u32),
        a_margin: match (a_top, a_second) {
            (Some((_, p)), Some((_, q))) => p as f64 - q as f64,
            _ => f64::INFINITY,
        },
        non_finite,
    }
}

/// A value and its index.
type Ranked = Option<(usize, f32)>;

/// The largest and second largest value with their indices (the first of equal values).
fn top_two(v: &[f32]) -> (Ranked, Ranked) {
    let (mut first, mut second): (Ranked, Ranked) = (None, None);
    for (i, &x) in v.iter().enumerate() {
        if first.is_none_or(|(_, f)| x > f) {
            second = first;
            first = Some((i, x));
        } else if second.is_none_or(|(_, s)| x > s) {
            second = Some((i, x));
        }
    }
    (first, second)
}

/// Rows whose top-1 differs beyond a near tie are kept up to this many (the count is whole).
const KEPT: usize = 16;

/// The gate's findings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OutputGate {
    pub config: OutputGateConfig,
    /// Positions of the chunk compared (every one).
    pub positions: u32,
    /// Greedy steps compared after the chunk.
    pub steps: u32,
    /// Every compared value has the same bits on both sides.
    pub bit_identical: bool,
    /// The largest NMSE of a row and where (NaN, stored as null, when a row was not finite).
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub max_nmse: f64,
    pub max_nmse_at: Option<At>,
    /// The mean NMSE over the rows.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub mean_nmse: f64,
    /// Rows whose NMSE is above the bound (or not finite), and the first of them.
    pub over_bound: u32,
    pub first_over_bound: Option<RowFinding>,
    /// Rows with a value that is NaN or infinite on either side.
    pub non_finite_rows: u32,
    /// Rows whose top-1 is the same on both sides.
    pub same_top1: u32,
    /// Rows whose top-1 differs where A's top two lie within the near-tie margin (reported, not
    /// refused), the first few.
    pub near_ties: u32,
    pub near_tie_rows: Vec<RowFinding>,
    /// Rows whose top-1 differs beyond a near tie (refused), the first few.
    pub top1_differs: u32,
    pub top1_differs_rows: Vec<RowFinding>,
    /// The first greedy token B would choose differently: the chunk's last position chooses
    /// token 0 of the continuation, greedy step `s` token `s + 1`.
    pub first_divergent_token: Option<u32>,
    /// A's greedy tokens after the chunk (both sides were fed them).
    pub tokens: Vec<u32>,
    pub passed: bool,
}

impl OutputGate {
    /// Why the gate refused B, in one sentence naming the first row that failed with its
    /// figures; `None` when it passed.
    pub fn refusal(&self) -> Option<String> {
        if self.passed {
            return None;
        }
        if let Some(f) = self.first_over_bound {
            return Some(if f.non_finite > 0 {
                format!(
                    "{}: {} logits are NaN or infinite ({} rows not finite)",
                    f.at, f.non_finite, self.non_finite_rows
                )
            } else {
                format!(
                    "{}: NMSE {:.3e} above the bound {:.1e} ({} of {} rows above it; top-1 {} on A, {} on B)",
                    f.at,
                    f.nmse,
                    self.config.max_nmse,
                    self.over_bound,
                    self.positions + self.steps,
                    f.a_top,
                    f.b_top
                )
            });
        }
        self.top1_differs_rows.first().map(|f| {
            format!(
                "{}: top-1 {} on A, {} on B, A's top two {:.4} logits apart (beyond the near-tie margin {}; {} rows differ)",
                f.at, f.a_top, f.b_top, f.a_margin, self.config.near_tie, self.top1_differs
            )
        })
    }
}

/// The gate's findings, row by row.
#[derive(Debug, Clone)]
pub struct GateTally {
    gate: OutputGate,
    nmse_sum: f64,
    rows: u32,
    // the old-style figures of the same rows (max relative error, cosine), for the reports
    correctness: Correctness,
}

impl GateTally {
    pub fn new(config: OutputGateConfig) -> GateTally {
        GateTally {
            gate: OutputGate {
                config,
                positions: 0,
                steps: 0,
                bit_identical: true,
                max_nmse: 0.0,
                max_nmse_at: None,
                mean_nmse: 0.0,
                over_bound: 0,
                first_over_bound: None,
                non_finite_rows: 0,
                same_top1: 0,
                near_ties: 0,
                near_tie_rows: Vec::new(),
                top1_differs: 0,
                top1_differs_rows: Vec::new(),
                first_divergent_token: None,
                tokens: Vec::new(),
                passed: false,
            },
            nmse_sum: 0.0,
            rows: 0,
            correctness: Correctness {
                rows: 0,
                same_top1: 0,
                max_rel_error: 0.0,
                min_cosine: 1.0,
                passed: false,
            },
        }
    }

    /// Adds one row of each side; `greedy_token` is the continuation token this row chooses
    /// (the chunk's last position and every step), `None` for other positions.
    pub fn add(&mut self, at: At, a: &[f32], b: &[f32], greedy_token: Option<u32>) {
        let f = compare_rows(at, a, b);
        let g = &mut self.gate;
        match at {
            At::Position(_) => g.positions += 1,
            At::Step(_) => g.steps += 1,
        }
        if a.len() != b.len() || a.iter().zip(b).any(|(x, y)| x.to_bits() != y.to_bits()) {
            g.bit_identical = false;
        }
        self.rows += 1;
        if f.non_finite > 0 {
            g.non_finite_rows += 1;
        } else {
            self.nmse_sum += f.nmse;
        }
        // NaN sorts above every bound: a row not finite is the largest error, and the first
        // such row stays the largest
        let larger = f.nmse.is_nan() || f.nmse > g.max_nmse;
        if g.max_nmse_at.is_none() || (larger && !g.max_nmse.is_nan()) {
            g.max_nmse = f.nmse;
            g.max_nmse_at = Some(at);
        }
        let within = f.nmse <= g.config.max_nmse;
        if !within {
            g.over_bound += 1;
            g.first_over_bound.get_or_insert(f);
        }
        if f.a_top == f.b_top {
            g.same_top1 += 1;
        } else if f.a_margin <= g.config.near_tie {
            g.near_ties += 1;
            if g.near_tie_rows.len() < KEPT {
                g.near_tie_rows.push(f);
            }
        } else {
            g.top1_differs += 1;
            if g.top1_differs_rows.len() < KEPT {
                g.top1_differs_rows.push(f);
            }
        }
        if let Some(t) = greedy_token {
            let k = g.tokens.len() as u32;
            g.tokens.push(t);
            if f.a_top != f.b_top && g.first_divergent_token.is_none() {
                g.first_divergent_token = Some(k);
            }
        }
        let c = compare_logits(&[a.to_vec()], &[b.to_vec()], &Tolerance::default());
        let o = &mut self.correctness;
        o.rows += c.rows;
        o.same_top1 += c.same_top1;
        o.max_rel_error = o.max_rel_error.max(c.max_rel_error);
        o.min_cosine = o.min_cosine.min(c.min_cosine);
    }

    /// The findings, and the same rows' figures as a [`Correctness`] whose `passed` is the
    /// gate's verdict.
    pub fn finish(mut self) -> (OutputGate, Correctness) {
        let finite_rows = self.rows - self.gate.non_finite_rows;
        self.gate.mean_nmse = if finite_rows > 0 {
            self.nmse_sum / finite_rows as f64
        } else {
            f64::NAN
        };
        let g = &mut self.gate;
        g.passed =
            self.rows > 0 && g.non_finite_rows == 0 && g.over_bound == 0 && g.top1_differs == 0;
        self.correctness.passed = g.passed;
        (self.gate, self.correctness)
    }
}

fn argmax(v: &[f32]) -> u32 {
    top_two(v).0.map_or(0, |(i, _)| i as u32)
}

/// The output gate of `work` over two engines: every position of its chunk, then
/// `cfg.steps` greedy steps on A's tokens. Leaves both engines unprepared.
pub fn compare_outputs(
    a: &mut dyn OutputReader,
    b: &mut dyn OutputReader,
    work: &Work,
    cfg: &OutputGateConfig,
) -> Result<(OutputGate, Correctness), EngineError> {
    let na = a.decode_outputs(work, cfg.steps)?;
    let nb = b.decode_outputs(work, cfg.steps)?;
    if na != nb || na == 0 {
        return Err(EngineError::Failed(format!(
            "the output gate: A's chunk holds {na} positions, B's {nb}"
        )));
    }
    let mut tally = GateTally::new(*cfg);
    let mut last_a = Vec::new();
    let mut first = 0;
    while first < na {
        let count = ROWS_PER_READ.min(na - first);
        let ra = a.output_rows(first, count)?;
        let rb = b.output_rows(first, count)?;
        if ra.len() != count as usize || rb.len() != count as usize {
            return Err(EngineError::Failed(format!(
                "the output gate asked for {count} rows from position {first}: A answered {}, B {}",
                ra.len(),
                rb.len()
            )));
        }
        for (i, (x, y)) in ra.iter().zip(&rb).enumerate() {
            let p = first + i as u32;
            let token = (p == na - 1).then(|| argmax(x));
            tally.add(At::Position(p), x, y, token);
        }
        last_a = ra.into_iter().last().unwrap_or_default();
        first += count;
    }
    let mut token = argmax(&last_a);
    for s in 0..cfg.steps {
        let x = a.greedy_step(token)?;
        let y = b.greedy_step(token)?;
        let next = argmax(&x);
        tally.add(At::Step(s), &x, &y, Some(next));
        token = next;
    }
    Ok(tally.finish())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_nmse_of_a_row_by_hand() {
        // a = (3, 4): sum a^2 = 25; b = (3, 4.5): error 0.25 -> 0.01
        let f = compare_rows(At::Position(0), &[3.0, 4.0], &[3.0, 4.5]);
        assert!((f.nmse - 0.01).abs() < 1e-12);
        assert_eq!((f.a_top, f.b_top), (1, 1));
        assert!((f.a_margin - 1.0).abs() < 1e-12);
        // identical rows: 0; zero rows: 0; zero A, nonzero B: infinite
        assert_eq!(
            compare_rows(At::Step(1), &[1.0, 2.0], &[1.0, 2.0]).nmse,
            0.0
        );
        assert_eq!(
            compare_rows(At::Step(1), &[0.0, 0.0], &[0.0, 0.0]).nmse,
            0.0
        );
        assert!(compare_rows(At::Step(1), &[0.0, 0.0], &[0.0, 1.0])
            .nmse
            .is_infinite());
        // a NaN: not finite, NaN NMSE
        let f = compare_rows(At::Position(2), &[1.0, 2.0], &[f32::NAN, 2.0]);
        assert_eq!(f.non_finite, 1);
        assert!(f.nmse.is_nan());
    }

    #[test]
    fn a_reordered_sum_passes_a_near_tie_is_reported_a_wrong_scale_is_refused() {
        let cfg = OutputGateConfig::default();
        // B off by a rounding (NMSE ~ 1e-10): passes, not bit-identical
        let a = [1.0f32, 5.0, 2.0, -3.0];
        let b = [1.0f32, 5.00005, 2.0, -3.0];
        let mut t = GateTally::new(cfg);
        t.add(At::Position(0), &a, &b, Some(1));
        let (g, c) = t.finish();
        assert!(g.passed && !g.bit_identical && c.passed, "{g:?}");
        assert!(g.max_nmse > 0.0 && g.max_nmse < 1e-9);
        assert_eq!(g.first_divergent_token, None);
        assert_eq!(g.tokens, vec![1]);

        // A's top two 0.0001 apart and B flips them by a rounding: a near tie, passed
        let a = [2.0f32, 2.0001, 0.5];
        let b = [2.0f32, 1.9999, 0.5];
        let mut t = GateTally::new(cfg);
        t.add(At::Position(0), &a, &a, None);
        t.add(At::Step(0), &a, &b, Some(1));
        let (g, _) = t.finish();
        assert!(g.passed, "{g:?}");
        assert_eq!((g.near_ties, g.top1_differs), (1, 0));
        assert_eq!(g.near_tie_rows[0].at, At::Step(0));
        assert_eq!(g.first_divergent_token, Some(0));
        assert_eq!((g.positions, g.steps), (1, 1));

        // a wrong scale: NMSE 0.25 at the first row, refused with its figures
        let a = [1.0f32, 3.0, 2.0];
        let b: Vec<f32> = a.iter().map(|x| x * 1.5).collect();
        let mut t = GateTally::new(cfg);
        t.add(At::Position(0), &a, &a, None);
        t.add(At::Position(1), &a, &b, None);
        let (g, c) = t.finish();
        assert!(!g.passed && !c.passed);
        assert_eq!(g.over_bound, 1);
        assert!((g.max_nmse - 0.25).abs() < 1e-12);
        assert_eq!(g.max_nmse_at, Some(At::Position(1)));
        let why = g.refusal().unwrap();
        assert!(
            why.starts_with("position 1: NMSE 2.500e-1 above the bound 1.0e-6"),
            "{why}"
        );

        // top-1 flipped beyond the margin with a small NMSE: refused
        let cfg = OutputGateConfig {
            max_nmse: 1.0,
            ..cfg
        };
        let a = [2.0f32, 3.0, 0.0];
        let b = [3.0f32, 2.0, 0.0];
        let mut t = GateTally::new(cfg);
        t.add(At::Position(0), &a, &b, None);
        let (g, _) = t.finish();
        assert!(!g.passed);
        assert_eq!(g.top1_differs, 1);
        assert!(g.refusal().unwrap().contains("top-1 1 on A, 0 on B"));
    }

    #[test]
    fn a_row_that_is_not_finite_fails_and_is_the_largest_error() {
        let mut t = GateTally::new(OutputGateConfig::default());
        t.add(At::Position(0), &[1.0, 2.0], &[1.0, 2.0], None);
        t.add(At::Position(1), &[1.0, 2.0], &[f32::INFINITY, 2.0], None);
        t.add(At::Position(2), &[1.0, 2.0], &[1.0, 2.5], None);
        let (g, _) = t.finish();
        assert!(!g.passed);
        assert_eq!(g.non_finite_rows, 1);
        assert!(g.max_nmse.is_nan());
        assert_eq!(g.max_nmse_at, Some(At::Position(1)));
        assert!(g.refusal().unwrap().contains("NaN or infinite"));
        // the mean over finite rows: (0 + 0.25 / 5) / 2
        assert!((g.mean_nmse - 0.025).abs() < 1e-12);
        let json = serde_json::to_string(&g).unwrap();
        let back: OutputGate = serde_json::from_str(&json).unwrap();
        assert!(back.max_nmse.is_nan() && back.over_bound == 2);
    }

    /// A side whose rows are scripted: position p's row is `base` rotated by p; a step's row
    /// `base` rotated by the token and step, times `scale`.
    struct Scripted {
        base: Vec<f32>,
        scale: f32,
        positions: u32,
        step: u32,
        fed: Vec<u32>,
    }

    impl OutputReader for Scripted {
        fn decode_outputs(&mut self, work: &Work, _steps: u32) -> Result<u32, EngineError> {
            self.step = 0;
            self.positions = work.chunk_tokens;
            Ok(work.chunk_tokens)
        }
        fn output_rows(&mut self, first: u32, count: u32) -> Result<Vec<Vec<f32>>, EngineError> {
            Ok((first..first + count)
                .map(|p| {
                    let mut r = self.base.clone();
                    let n = r.len();
                    r.rotate_left(p as usize % n);
                    r
                })
                .collect())
        }
        fn greedy_step(&mut self, token: u32) -> Result<Vec<f32>, EngineError> {
            self.fed.push(token);
            let mut r: Vec<f32> = self.base.iter().map(|x| x * self.scale).collect();
            let n = r.len();
            r.rotate_left((token + self.step) as usize % n);
            self.step += 1;
            Ok(r)
        }
    }

    #[test]
    fn the_driver_reads_every_position_in_batches_and_feeds_both_sides_a_s_tokens() {
        let base = vec![0.1f32, 0.9, 0.3, 0.2, 0.4];
        let side = |scale| Scripted {
            base: base.clone(),
            scale,
            positions: 0,
            step: 0,
            fed: Vec::new(),
        };
        let (mut a, mut b) = (side(1.0), side(1.0));
        let work = Work::prefill(19, 0);
        let cfg = OutputGateConfig {
            steps: 3,
            ..Default::default()
        };
        let (g, c) = compare_outputs(&mut a, &mut b, &work, &cfg).unwrap();
        assert!(g.passed && g.bit_identical && c.passed);
        assert_eq!((g.positions, g.steps, c.rows), (19, 3, 22));
        // position 18's row is base rotated by 18 % 5 = 3: [0.2, 0.4, 0.1, 0.9, 0.3], argmax 3;
        // step 0, fed 3: rotated by 3 + 0 -> argmax 3; step 1, fed 3: rotated by 4 ->
        // [0.4, 0.1, 0.9, 0.3, 0.2], argmax 2; step 2, fed 2: rotated by 4 -> argmax 2
        assert_eq!(a.fed, vec![3, 3, 2]);
        assert_eq!(b.fed, a.fed);
        assert_eq!(g.tokens, vec![3, 3, 2, 2]);
        // B scaled at the steps only: the chunk passes, the first step is refused
        let (mut a, mut b) = (side(1.0), side(1.5));
        let (g, _) = compare_outputs(&mut a, &mut b, &work, &cfg).unwrap();
        assert!(!g.passed);
        assert_eq!(g.first_over_bound.unwrap().at, At::Step(0));
        assert_eq!(g.over_bound, 3);
        // same argmax under a scale: no divergent token
        assert_eq!(g.first_divergent_token, None);
    }
}
