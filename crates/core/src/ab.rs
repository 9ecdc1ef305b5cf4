//! A/B attribution: two configurations of an engine run interleaved on the same work, a bootstrap
//! confidence interval of the time ratio, a verdict with stated thresholds, a control that must
//! not move (the baseline's runs where it ran second against those where it ran first), a correctness gate (the model still
//! returns the same thing) and a per-band ledger of where the difference lives.

use std::collections::BTreeMap;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::arch::ArchInfo;
use crate::band::{BandRules, Categoriser};
use crate::engine::{Engine, EngineError, Mode, Work};
use crate::noise::{Gate, GateConfig, GateStats};
use crate::outputs::{compare_outputs, OutputGate, OutputGateConfig};
use crate::stats::Sample;
use crate::tokens::splitmix64;

/// Runtime settings an A/B compares: `threads=2,flash_attn=on,ubatch=256`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Knobs(pub BTreeMap<String, String>);

/// The knobs opledger knows, with the values each accepts.
pub const KNOWN_KNOBS: [(&str, &str); 7] = [
    ("threads", "a positive integer"),
    ("flash_attn", "on, off or auto"),
    (
        "ubatch",
        "a positive integer (physical batch; the chunk is split into ubatches)",
    ),
    ("type_k", "f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1"),
    ("type_v", "f16, bf16, f32, q8_0, q4_0, q4_1, q5_0, q5_1"),
    ("repack", "on or off (CPU weight repacking)"),
    (
        "worker",
        "the path of a llama.cpp worker (tools/llama-worker) built in another llama.cpp tree, or `bundled` for the worker built with this opledger",
    ),
];

/// The prefix of a knob that sets an environment variable in a llama.cpp worker's process:
/// `env:GGML_CUDA_DISABLE_GRAPHS=1` (name and value kept as written).
pub const ENV_KNOB_PREFIX: &str = "env:";

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    #[error(
        "unknown knob '{0}' (known: threads, flash_attn, ubatch, type_k, type_v, repack, worker, env:NAME)"
    )]
    Unknown(String),
    #[error("knob {key}={value}: expected {expected}")]
    BadValue {
        key: String,
        value: String,
        expected: String,
    },
    #[error("'{0}' is not key=value")]
    Syntax(String),
}

fn check_value(key: &str, value: &str) -> Result<(), KnobError> {
    if let Some(name) = key.strip_prefix(ENV_KNOB_PREFIX) {
        let named = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !named {
            return Err(KnobError::BadValue {
                key: key.into(),
                value: value.into(),
                expected: "an environment variable's name after env: (letters, digits, _)".into(),
            });
        }
        return Ok(());
    }
    let ok = match key {
        "threads" | "ubatch" => value.parse::<u32>().is_ok_and(|v| v > 0),
        "flash_attn" => matches!(value, "on" | "off" | "auto"),
        "type_k" | "type_v" => matches!(
            value,
            "f16" | "bf16" | "f32" | "q8_0" | "q4_0" | "q4_1" | "q5_0" | "q5_1"
        ),
        "repack" => matches!(value, "on" | "off"),
        "worker" => !value.is_empty(),
        _ => return Err(KnobError::Unknown(key.to_string())),
    };
    if ok {
        Ok(())
    } else {
        let expected = KNOWN_KNOBS
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, e)| e.to_string())
            .unwrap_or_default();
        Err(KnobError::BadValue {
            key: key.into(),
            value: value.into(),
            expected,
        })
    }
}

impl FromStr for Knobs {
    type Err = KnobError;

    /// `key=value` pairs separated by commas or spaces; the empty string is the defaults.
    fn from_str(s: &str) -> Result<Knobs, KnobError> {
        let mut map = BTreeMap::new();
        for part in s.split([',', ' ']).filter(|p| !p.trim().is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| KnobError::Syntax(part.to_string()))?;
            // an environment variable's name and value are kept as written
            let (k, v) = match k.trim() {
                e if e.to_lowercase().starts_with(ENV_KNOB_PREFIX) => (
                    format!("{ENV_KNOB_PREFIX}{}", &e[ENV_KNOB_PREFIX.len()..]),
                    v.trim().to_string(),
                ),
                // a worker's path too (a file system's names have case)
                k if k.eq_ignore_ascii_case("worker") => ("worker".into(), v.trim().to_string()),
                k => (k.to_lowercase(), v.trim().to_lowercase()),
            };
            check_value(&k, &v)?;
            map.insert(k, v);
        }
        Ok(Knobs(map))
    }
}

impl std::fmt::Display for Knobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return write!(f, "defaults");
        }
        let parts: Vec<String> = self.0.iter().map(|(k, v)| format!("{k}={v}")).collect();
        write!(f, "{}", parts.join(","))
    }
}

impl Knobs {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(String::as_str)
    }

    /// Knobs where `other` differs from `self` (set in one and not the other, or different).
    pub fn differences(&self, other: &Knobs) -> Vec<String> {
        let mut keys: Vec<&String> = self.0.keys().chain(other.0.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .filter(|k| self.0.get(*k) != other.0.get(*k))
            .cloned()
            .collect()
    }

    /// `self` with `key` set back to its value in `base` (or removed).
    pub fn reverted(&self, key: &str, base: &Knobs) -> Knobs {
        let mut k = self.clone();
        match base.0.get(key) {
            Some(v) => k.0.insert(key.to_string(), v.clone()),
            None => k.0.remove(key),
        };
        k
    }
}

/// How close two engines' outputs must be to count as the same model output.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Tolerance {
    /// max |a - b| / max |a| over the logits.
    pub max_rel_error: f64,
    /// Cosine similarity of the logit vectors at least this.
    pub min_cosine: f64,
}

impl Default for Tolerance {
    fn default() -> Self {
        Tolerance {
            max_rel_error: 2e-2,
            min_cosine: 0.999,
        }
    }
}

/// The correctness gate's findings for one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Correctness {
    /// Rows compared (last token, or one per sequence in decode).
    pub rows: u32,
    /// Rows whose greedy (argmax) token is the same.
    pub same_top1: u32,
    pub max_rel_error: f64,
    pub min_cosine: f64,
    pub passed: bool,
}

/// Compares two sets of logit rows under a tolerance.
pub fn compare_logits(a: &[Vec<f32>], b: &[Vec<f32>], tol: &Tolerance) -> Correctness {
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .max_by(|x, y| x.1.total_cmp(y.1))
            .map(|(i, _)| i)
    };
    let mut same = 0;
    let mut max_rel: f64 = 0.0;
    let mut min_cos: f64 = 1.0;
    let rows = a.len().min(b.len());
    let mut shapes_match = a.len() == b.len();
    for (x, y) in a.iter().zip(b) {
        if x.len() != y.len() || x.is_empty() {
            shapes_match = false;
            continue;
        }
        if argmax(x) == argmax(y) {
            same += 1;
        }
        let scale = x
            .iter()
            .map(|v| v.abs() as f64)
            .fold(0.0, f64::max)
            .max(1e-30);
        let diff = x
            .iter()
            .zip(y)
            .map(|(p, q)| (*p as f64 - *q as f64).abs())
            .fold(0.0, f64::max);
        max_rel = max_rel.max(diff / scale);
        let dot: f64 = x.iter().zip(y).map(|(p, q)| *p as f64 * *q as f64).sum();
        let nx: f64 = x.iter().map(|p| (*p as f64).powi(2)).sum::<f64>().sqrt();
        let ny: f64 = y.iter().map(|q| (*q as f64).powi(2)).sum::<f64>().sqrt();
        let cos = if nx > 0.0 && ny > 0.0 {
            dot / (nx * ny)
        } else {
            0.0
        };
        min_cos = min_cos.min(cos);
    }
    Correctness {
        rows: rows as u32,
        same_top1: same,
        max_rel_error: max_rel,
        min_cosine: min_cos,
        passed: shapes_match
            && rows > 0
            && same == rows as u32
            && max_rel <= tol.max_rel_error
            && min_cos >= tol.min_cosine,
    }
}

/// A comparison's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The whole confidence interval of B/A lies below 1 - min_effect and below the control's
    /// interval.
    Faster,
    /// The whole interval lies above 1 + min_effect and above the control's interval.
    Slower,
    /// The whole interval lies within ±min_effect.
    NoChange,
    /// The interval is not beyond the noise: it reaches into ±min_effect or into the interval
    /// of the control (A against itself), so the noise does not allow a verdict.
    WithinNoise,
    /// The A/A control moved: A against itself lies wholly beyond ±min_effect (its own verdict
    /// is faster or slower), so the measurement is biased by more than the smallest effect a
    /// verdict may claim, whatever B's interval says.
    Inconclusive,
}

impl Verdict {
    /// An interval judged against the threshold alone (the control's own verdict).
    pub fn of(lo: f64, hi: f64, min_effect: f64) -> Verdict {
        if hi < 1.0 - min_effect {
            Verdict::Faster
        } else if lo > 1.0 + min_effect {
            Verdict::Slower
        } else if lo >= 1.0 - min_effect && hi <= 1.0 + min_effect {
            Verdict::NoChange
        } else {
            Verdict::WithinNoise
        }
    }

    /// A control with this verdict moved: its whole interval lies beyond the threshold.
    pub fn moved(self) -> bool {
        matches!(self, Verdict::Faster | Verdict::Slower)
    }

    /// The noise a control shows, as bounds on B/A: the control's interval `[c_lo, c_hi]`
    /// rescaled from the runs it compares (A's n/2 runs of the even-numbered pairs against its
    /// n/2 of the odd-numbered ones, [`judge`]) to the n runs a side
    /// B/A compares: the spread of a ratio of medians goes as sqrt(1/n_a + 1/n_b), so each
    /// bound's distance from 1 (as a log ratio) is divided by sqrt(2).
    pub fn noise_bounds(c_lo: f64, c_hi: f64) -> (f64, f64) {
        let scale = |c: f64| {
            if c > 0.0 && c.is_finite() {
                (c.ln() / std::f64::consts::SQRT_2).exp()
            } else {
                c
            }
        };
        (scale(c_lo), scale(c_hi))
    }

    /// The verdict of a scenario from B/A's interval `[lo, hi]` and the control's interval
    /// `[c_lo, c_hi]` (A's runs where it ran second against those where it ran first, [`judge`]). A control that moved (its whole
    /// interval beyond ±min_effect) makes the scenario inconclusive. A control that did not
    /// move may still be wide: it shows how far A strays from itself, so it sets the smallest
    /// effect a verdict may claim ([`Verdict::noise_bounds`]). Faster when B/A's whole
    /// interval lies below both 1 - min_effect and the noise's lower bound, slower when above
    /// both 1 + min_effect and its upper bound; no change when it lies within ±min_effect; else
    /// within the noise.
    pub fn of_scenario(lo: f64, hi: f64, c_lo: f64, c_hi: f64, min_effect: f64) -> Verdict {
        let (n_lo, n_hi) = Verdict::noise_bounds(c_lo, c_hi);
        if Verdict::of(c_lo, c_hi, min_effect).moved() {
            Verdict::Inconclusive
        } else if hi < (1.0 - min_effect).min(n_lo) {
            Verdict::Faster
        } else if lo > (1.0 + min_effect).max(n_hi) {
            Verdict::Slower
        } else if lo >= 1.0 - min_effect && hi <= 1.0 + min_effect {
            Verdict::NoChange
        } else {
            Verdict::WithinNoise
        }
    }
}

impl Verdict {
    /// The verdict of B/A's interval `[lo, hi]` against a control measured with as many runs
    /// as B/A (a second process of A against A, cycle by cycle, [`judge_with_control`]): its
    /// interval is the noise itself, with no rescaling. A control that moved (its whole
    /// interval beyond ±min_effect) makes it inconclusive; faster when the whole interval lies
    /// below both 1 - min_effect and the control's lower bound, slower when above both 1 +
    /// min_effect and the control's upper bound; no change within ±min_effect; else within the
    /// noise.
    pub fn against_control(lo: f64, hi: f64, c_lo: f64, c_hi: f64, min_effect: f64) -> Verdict {
        if Verdict::of(c_lo, c_hi, min_effect).moved() {
            Verdict::Inconclusive
        } else if hi < (1.0 - min_effect).min(c_lo) {
            Verdict::Faster
        } else if lo > (1.0 + min_effect).max(c_hi) {
            Verdict::Slower
        } else if lo >= 1.0 - min_effect && hi <= 1.0 + min_effect {
            Verdict::NoChange
        } else {
            Verdict::WithinNoise
        }
    }
}

/// B/A and the control of one scenario: the ratios, their intervals and the verdicts.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    pub ratio: f64,
    pub lo: f64,
    pub hi: f64,
    pub verdict: Verdict,
    pub control_ratio: f64,
    pub control_lo: f64,
    pub control_hi: f64,
    pub control_verdict: Verdict,
}

/// Judges one scenario's interleaved FUSED walls: B/A with its bootstrap interval
/// ([`ratio_ci`]), the control (A's odd-numbered runs against its even-numbered ones, counting
/// from 0: with the order alternating by pair, A where it ran second against A where it ran
/// first, the ratio of their medians with its bootstrap interval; [`ratio_ci`] pairs them by
/// position, so an odd number of pairs leaves A's last run out) and the verdict
/// ([`Verdict::of_scenario`]). `None` without a measured pair.
pub fn judge(
    a_ms: &[f64],
    b_ms: &[f64],
    resamples: u32,
    seed: u64,
    min_effect: f64,
) -> Option<Judged> {
    let (ratio, lo, hi) = ratio_ci(a_ms, b_ms, resamples, seed)?;
    let even: Vec<f64> = a_ms.iter().step_by(2).copied().collect();
    let odd: Vec<f64> = a_ms.iter().skip(1).step_by(2).copied().collect();
    // a control that cannot be formed (one run of A) bounds nothing: it counts as moved
    let (c_ratio, c_lo, c_hi) =
        ratio_ci(&even, &odd, resamples, seed ^ 0xC0).unwrap_or((1.0, 0.0, f64::INFINITY));
    let control_verdict = if odd.is_empty() {
        Verdict::Inconclusive
    } else {
        Verdict::of(c_lo, c_hi, min_effect)
    };
    let verdict = if control_verdict == Verdict::Inconclusive {
        Verdict::Inconclusive
    } else {
        Verdict::of_scenario(lo, hi, c_lo, c_hi, min_effect)
    };
    Some(Judged {
        ratio,
        lo,
        hi,
        verdict,
        control_ratio: c_ratio,
        control_lo: c_lo,
        control_hi: c_hi,
        control_verdict,
    })
}

/// Judges B/A against a control that is a second process of A (`control`, measured in the
/// same cycles, interleaved): B/A with its bootstrap interval at `1 - alpha` ([`ratio_ci_at`]),
/// the control's A2/A by the same estimator at the same level, and the verdict
/// ([`Verdict::against_control`]). `None` without a measured cycle.
pub fn judge_with_control(
    a: &[f64],
    b: &[f64],
    control: &[f64],
    resamples: u32,
    seed: u64,
    min_effect: f64,
    alpha: f64,
) -> Option<Judged> {
    let (ratio, lo, hi) = ratio_ci_at(a, b, resamples, seed, alpha)?;
    let (control_ratio, control_lo, control_hi) =
        ratio_ci_at(a, control, resamples, seed ^ 0xC0, alpha)?;
    let control_verdict = Verdict::of(control_lo, control_hi, min_effect);
    Some(Judged {
        ratio,
        lo,
        hi,
        verdict: Verdict::against_control(lo, hi, control_lo, control_hi, min_effect),
        control_ratio,
        control_lo,
        control_hi,
        control_verdict,
    })
}

/// The overall verdict of an A/B over its scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A scenario failed the correctness gate: B changes the model's output.
    Refused,
    /// A scenario's control moved: the noise was larger than the threshold.
    Inconclusive,
    /// Faster in every scenario.
    Faster,
    /// Slower in at least one scenario.
    Slower,
    /// Faster in some scenarios, no worse in the others.
    FasterInSome,
    /// No change beyond the noise.
    NoChange,
}

impl Outcome {
    /// The overall verdict: refused before inconclusive (a changed output makes speed moot),
    /// inconclusive before any speed claim.
    pub fn of(scenarios: &[ScenarioResult]) -> Outcome {
        if scenarios.iter().any(|s| !s.correctness.passed) {
            return Outcome::Refused;
        }
        let verdicts: Vec<Verdict> = scenarios.iter().map(|s| s.verdict).collect();
        if verdicts.contains(&Verdict::Inconclusive) {
            Outcome::Inconclusive
        } else if !verdicts.is_empty() && verdicts.iter().all(|v| *v == Verdict::Faster) {
            Outcome::Faster
        } else if verdicts.contains(&Verdict::Slower) {
            Outcome::Slower
        } else if verdicts.contains(&Verdict::Faster) {
            Outcome::FasterInSome
        } else {
            Outcome::NoChange
        }
    }

    /// The verdict in words.
    pub fn words(self) -> &'static str {
        match self {
            Outcome::Refused => "refused: the model's output changed beyond the tolerance",
            Outcome::Inconclusive => {
                "inconclusive: the A/A control moved beyond the threshold (the measurement is biased by more than the smallest effect it may claim)"
            }
            Outcome::Faster => "faster in every scenario",
            Outcome::Slower => "slower in at least one scenario",
            Outcome::FasterInSome => "faster in some scenarios, no worse in the others",
            Outcome::NoChange => "no change beyond the noise",
        }
    }

    /// The name `ab.json` stores (version 2).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Refused => "refused",
            Outcome::Inconclusive => "inconclusive",
            Outcome::Faster => "faster",
            Outcome::Slower => "slower",
            Outcome::FasterInSome => "faster_in_some",
            Outcome::NoChange => "no_change",
        }
    }

    /// Reads the verdict of an `ab.json` of either version: version 2's names, or the exact
    /// sentences version 1 wrote (see [`AbReport::upgrade`]).
    fn from_stored(s: &str) -> Option<Outcome> {
        [
            Outcome::Refused,
            Outcome::Inconclusive,
            Outcome::Faster,
            Outcome::Slower,
            Outcome::FasterInSome,
            Outcome::NoChange,
        ]
        .into_iter()
        .find(|o| o.name() == s || o.words() == s)
    }
}

fn outcome_v1_or_v2<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Outcome, D::Error> {
    let s = String::deserialize(d)?;
    Outcome::from_stored(&s)
        .ok_or_else(|| serde::de::Error::custom(format!("unknown A/B verdict '{s}'")))
}

/// Ratio of medians B / A with a percentile bootstrap confidence interval (95 %), resampling
/// the interleaved pairs together; deterministic for a seed.
pub fn ratio_ci(a: &[f64], b: &[f64], resamples: u32, seed: u64) -> Option<(f64, f64, f64)> {
    ratio_ci_at(a, b, resamples, seed, 0.05)
}

/// The confidence level of one of `tests` intervals read together, Bonferroni corrected: each
/// interval is taken at `1 - alpha / tests`, so that all of them hold at once with probability
/// at least `1 - alpha` (`alpha` 0.05: 95 % family-wise).
pub fn bonferroni(alpha: f64, tests: usize) -> f64 {
    alpha / tests.max(1) as f64
}

/// [`ratio_ci`] at the confidence level `1 - alpha` (its percentiles `alpha / 2` and
/// `1 - alpha / 2`, the nearest resample's; `alpha` from [`bonferroni`] where several intervals
/// are read together: the resamples should then be many more than `2 / alpha`).
pub fn ratio_ci_at(
    a: &[f64],
    b: &[f64],
    resamples: u32,
    seed: u64,
    alpha: f64,
) -> Option<(f64, f64, f64)> {
    let n = a.len().min(b.len());
    if n == 0 {
        return None;
    }
    let ratio = Sample::new(&b[..n]).ok()?.median() / Sample::new(&a[..n]).ok()?.median();
    if n == 1 {
        return Some((ratio, ratio, ratio));
    }
    let mut state = seed;
    let mut ratios = Vec::with_capacity(resamples as usize);
    let (mut ra, mut rb) = (vec![0.0; n], vec![0.0; n]);
    for _ in 0..resamples.max(1) {
        for i in 0..n {
            state = splitmix64(state);
            let j = (state % n as u64) as usize;
            ra[i] = a[j];
            rb[i] = b[j];
        }
        ratios.push(Sample::new(&rb).ok()?.median() / Sample::new(&ra).ok()?.median());
    }
    ratios.sort_by(f64::total_cmp);
    let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q.clamp(0.0, 1.0)).round() as usize];
    Some((ratio, at(alpha / 2.0), at(1.0 - alpha / 2.0)))
}

/// One band, side by side.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerRow {
    pub band: String,
    /// The band's ms/token: the median over cycles of each cycle's TIMED share x FUSED wall /
    /// tokens (one run per side in files of version 3 and older).
    pub a_ms_per_token: f64,
    pub b_ms_per_token: f64,
    /// b - a (positive: B spends more here).
    pub gap_ms_per_token: f64,
    /// b / a; NaN (stored as `null`) where A spends nothing in the band.
    #[serde(deserialize_with = "nan_when_null")]
    pub ratio: f64,
    /// The band judged over every interleaved cycle (absent in files of version 3 and older,
    /// which measured the bands once per side).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judged: Option<BandJudged>,
}

/// One band's B/A over the cycles of an A/B, against the control (a second process of A) in
/// the same band, each interval at the Bonferroni-corrected level of all the bands read together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BandJudged {
    #[serde(deserialize_with = "nan_when_null")]
    pub ratio_lo: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub ratio_hi: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub control_ratio: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub control_lo: f64,
    #[serde(deserialize_with = "nan_when_null")]
    pub control_hi: f64,
    pub verdict: Verdict,
    /// The confidence level of each interval (`1 - 0.05 / bands`).
    pub level: f64,
    /// Each cycle's ms/token of A, B and the control, in cycle order.
    pub a_cycles: Vec<f64>,
    pub b_cycles: Vec<f64>,
    pub control_cycles: Vec<f64>,
}

/// serde_json writes a NaN as `null`; read it back as NaN so a stored ledger round-trips.
pub(crate) fn nan_when_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Bands of two sides sorted by the size of their gap.
pub fn ledger(bands: &[String], a: &[f64], b: &[f64]) -> Vec<LedgerRow> {
    let mut rows: Vec<LedgerRow> = bands
        .iter()
        .zip(a.iter().zip(b))
        .map(|(band, (&x, &y))| LedgerRow {
            band: band.clone(),
            a_ms_per_token: x,
            b_ms_per_token: y,
            gap_ms_per_token: y - x,
            ratio: if x > 0.0 { y / x } else { f64::NAN },
            judged: None,
        })
        .collect();
    rows.sort_by(|p, q| {
        q.gap_ms_per_token
            .abs()
            .total_cmp(&p.gap_ms_per_token.abs())
    });
    rows
}

/// How to run an A/B.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbConfig {
    pub scenarios: Vec<Work>,
    /// Interleaved pairs per scenario (A B, then B A, ...).
    pub pairs: u32,
    pub gate: GateConfig,
    pub tolerance: Tolerance,
    /// The smallest change a verdict calls faster or slower (0.02 = 2 %).
    pub min_effect: f64,
    pub resamples: u32,
    pub seed: u64,
    /// The output gate (absent in files of version 3 and older, gated by `tolerance` on one
    /// row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<OutputGateConfig>,
}

/// One scenario's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScenarioResult {
    pub work: Work,
    /// FUSED walls in interleaved order.
    pub a_ms: Vec<f64>,
    pub b_ms: Vec<f64>,
    /// median B / median A, with its 95 % bootstrap interval.
    pub ratio: f64,
    pub ratio_lo: f64,
    pub ratio_hi: f64,
    pub verdict: Verdict,
    /// A's odd-numbered runs against its even-numbered ones, counting from 0 (where it ran
    /// second in a pair against where it ran first): must show no change.
    pub control_ratio: f64,
    pub control_lo: f64,
    pub control_hi: f64,
    pub control_verdict: Verdict,
    pub correctness: Correctness,
    /// Band ms/token of each side, sorted by gap: with a control process, judged over every
    /// cycle ([`BandJudged`]); in files of version 3 and older, from one TIMED run per side.
    pub ledger: Vec<LedgerRow>,
    pub gate: GateStats,
    /// The control's FUSED walls, a second process of A run in the same cycles (empty where
    /// the control is A's runs where it ran second against those where it ran first).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub control_ms: Vec<f64>,
    /// The output gate over every position of the chunk and greedy steps after it (absent
    /// where the gate compared one row under `tolerance`: files of version 3 and older).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outputs: Option<OutputGate>,
    /// The two graphs matched node by node, and per matched op B/A over the cycles against the
    /// control (with a control process only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub op_diff: Option<crate::opdiff::OpDiff>,
}

/// Each band's ms/token of one run: the band's share of the TIMED node times x the FUSED wall
/// `fused_ms` / tokens, in the order of `rules.bands`.
pub fn band_ms(
    rules: &BandRules,
    categorised: &[crate::band::Assignment],
    node_us: &[f64],
    fused_ms: f64,
    tokens: u32,
) -> Vec<f64> {
    let total: f64 = node_us.iter().sum();
    rules
        .bands
        .iter()
        .map(|b| {
            let us: f64 = node_us
                .iter()
                .zip(categorised)
                .filter(|(_, x)| x.band == b.name)
                .map(|(u, _)| u)
                .sum();
            if total > 0.0 {
                us / total * fused_ms / tokens.max(1) as f64
            } else {
                0.0
            }
        })
        .collect()
}

/// The engines of an A/B: A, B and, where the A/B has one, the control, a second process of A
/// (the same build, loaded the same way) measured in the same cycles.
pub struct AbSides<'e> {
    pub a: &'e mut dyn Engine,
    pub b: &'e mut dyn Engine,
    pub control: Option<&'e mut dyn Engine>,
}

/// The order of the sides (0 A, 1 B, 2 the control) in cycle `p`: A and B alternate; with a
/// control, the six orders of three in turn (each side first, second and third equally often
/// over six cycles, and each pair of sides in both orders).
pub fn cycle_order(p: u32, with_control: bool) -> Vec<usize> {
    if with_control {
        const ORDERS: [[usize; 3]; 6] = [
            [0, 1, 2],
            [1, 2, 0],
            [2, 0, 1],
            [0, 2, 1],
            [2, 1, 0],
            [1, 0, 2],
        ];
        ORDERS[p as usize % 6].to_vec()
    } else if p.is_multiple_of(2) {
        vec![0, 1]
    } else {
        vec![1, 0]
    }
}

/// One scenario's runs, side by side: FUSED walls and, with a control, TIMED node times per
/// cycle.
#[derive(Debug, Default, Clone)]
pub struct CycleRuns {
    /// FUSED wall ms per side (A, B, control) in cycle order.
    pub wall_ms: [Vec<f64>; 3],
    /// TIMED µs per node per side, one per cycle (with a control only).
    pub node_us: [Vec<Vec<f64>>; 3],
}

/// The scenario's label in progress lines.
fn scenario_label(work: &Work) -> String {
    if work.is_decode() {
        format!(
            "decode {}x{} at {}",
            work.decode_tokens, work.parallel, work.depth_tokens
        )
    } else {
        format!("prefill {} at {}", work.chunk_tokens, work.depth_tokens)
    }
}

/// The output gate of one scenario: every position of its chunk and greedy steps on both sides
/// (`cfg.outputs`), or, in a configuration without one, the last row of a FUSED run under
/// `cfg.tolerance`. Leaves both engines to be prepared again.
fn gate_outputs(
    a: &mut dyn Engine,
    b: &mut dyn Engine,
    work: &Work,
    cfg: &AbConfig,
) -> Result<(Correctness, Option<OutputGate>), EngineError> {
    match &cfg.outputs {
        Some(o) => {
            let (gate, correctness) =
                compare_outputs(a.output_reader()?, b.output_reader()?, work, o)?;
            Ok((correctness, Some(gate)))
        }
        None => {
            a.prepare(work)?;
            b.prepare(work)?;
            a.run(Mode::Fused)?;
            let logits_a = a.logits()?;
            b.run(Mode::Fused)?;
            let logits_b = b.logits()?;
            Ok((compare_logits(&logits_a, &logits_b, &cfg.tolerance), None))
        }
    }
}

/// Runs every scenario on both engines (and the control, where there is one), interleaved;
/// `progress(done, total, what)`. Per scenario: the output gate, then `cfg.pairs` cycles, each
/// a FUSED run of every side and, with a control, a TIMED run of every side, in the cycle's
/// order ([`cycle_order`]), every run under the noise gate. B/A is judged against the control
/// (with a control process: [`judge_with_control`]; without: A's halves, [`judge`]); with a
/// control every band is judged over the cycles too, at the Bonferroni-corrected level of all
/// the bands.
pub fn run_ab(
    sides: AbSides,
    cfg: &AbConfig,
    rules: &BandRules,
    arch: &ArchInfo,
    progress: &mut dyn FnMut(u32, u32, &str),
) -> Result<Vec<ScenarioResult>, EngineError> {
    let AbSides { a, b, mut control } = sides;
    let mut out = Vec::new();
    let total = cfg.scenarios.len() as u32 * cfg.pairs;
    for (si, work) in cfg.scenarios.iter().enumerate() {
        let label = scenario_label(work);
        progress(
            si as u32 * cfg.pairs,
            total,
            &format!("{label}: output gate"),
        );
        let (correctness, outputs) = gate_outputs(&mut *a, &mut *b, work, cfg)?;
        a.prepare(work)?;
        b.prepare(work)?;
        let graph_a = a.graph()?;
        let graph_b = b.graph()?;
        if let Some(c) = control.as_deref_mut() {
            c.prepare(work)?;
            let graph_c = c.graph()?;
            let ops =
                |g: &[crate::node::NodeInfo]| g.iter().map(|n| n.op.clone()).collect::<Vec<_>>();
            if ops(&graph_c) != ops(&graph_a) {
                return Err(EngineError::Failed(format!(
                    "the control (a second process of A) computed another graph than A: {} nodes against {}",
                    graph_c.len(),
                    graph_a.len()
                )));
            }
        }
        // (the output gate's runs and the graph's capture were the warm-up)
        // the canary on the largest of the engines' thread counts
        let threads = a.info().threads.max(b.info().threads);
        let mut gate = Gate::new(&cfg.gate, threads);
        let with_control = control.is_some();
        let mut runs = CycleRuns::default();
        for p in 0..cfg.pairs {
            progress(si as u32 * cfg.pairs + p, total, &label);
            let order = cycle_order(p, with_control);
            let modes: &[Mode] = if with_control {
                &[Mode::Fused, Mode::Timed]
            } else {
                &[Mode::Fused]
            };
            for &mode in modes {
                for &side in &order {
                    let engine: &mut dyn Engine = match side {
                        0 => &mut *a,
                        1 => &mut *b,
                        _ => control.as_deref_mut().expect("a control side"),
                    };
                    let (r, _) = gate.run(|| engine.run(mode))?;
                    if mode == Mode::Fused {
                        runs.wall_ms[side].push(r.wall_ms);
                    } else {
                        runs.node_us[side].push(r.node_us);
                    }
                }
            }
        }
        let seed = cfg.seed ^ si as u64;
        let [a_ms, b_ms, control_ms] = &runs.wall_ms;
        let j = if with_control {
            judge_with_control(
                a_ms,
                b_ms,
                control_ms,
                cfg.resamples,
                seed,
                cfg.min_effect,
                0.05,
            )
        } else {
            judge(a_ms, b_ms, cfg.resamples, seed, cfg.min_effect)
        }
        .ok_or_else(|| EngineError::Failed("no measured pair".into()))?;
        let (ledger, op_diff) = if with_control {
            let ledger = band_ledger(rules, arch, &graph_a, &graph_b, &runs, work, cfg, seed)?;
            let times = crate::opdiff::CycleTimes {
                a: &runs.node_us[0],
                b: &runs.node_us[1],
                control: &runs.node_us[2],
                a_wall_ms: &runs.wall_ms[0],
                b_wall_ms: &runs.wall_ms[1],
                control_wall_ms: &runs.wall_ms[2],
                tokens: work.tokens_per_run(),
            };
            let diff = crate::opdiff::op_diff(
                &graph_a,
                &graph_b,
                &times,
                &crate::opdiff::OpDiffConfig {
                    resamples: OP_DIFF_RESAMPLES,
                    seed: seed ^ 0x0D1F,
                    min_effect: cfg.min_effect,
                    alpha: 0.05,
                },
            );
            (ledger, Some(diff))
        } else {
            (Vec::new(), None)
        };
        out.push(ScenarioResult {
            work: work.clone(),
            ratio: j.ratio,
            ratio_lo: j.lo,
            ratio_hi: j.hi,
            verdict: j.verdict,
            control_ratio: j.control_ratio,
            control_lo: j.control_lo,
            control_hi: j.control_hi,
            control_verdict: j.control_verdict,
            correctness,
            ledger,
            gate: gate.stats,
            a_ms: a_ms.clone(),
            b_ms: b_ms.clone(),
            control_ms: control_ms.clone(),
            outputs,
            op_diff,
        });
    }
    progress(total, total, "done");
    Ok(out)
}

/// Bootstrap resamples of each op group's interval in the op diff: its intervals are read
/// together (Bonferroni over the groups, often a hundred or more), so their percentiles lie far
/// out in the tails.
pub const OP_DIFF_RESAMPLES: u32 = 20_000;

/// The band ledger of one scenario from every cycle: each band's ms/token per cycle and side
/// ([`band_ms`] of that cycle's TIMED run and FUSED wall), B/A against the control per band at
/// the Bonferroni-corrected level of the bands either graph holds, sorted by gap.
#[allow(clippy::too_many_arguments)]
fn band_ledger(
    rules: &BandRules,
    arch: &ArchInfo,
    graph_a: &[crate::node::NodeInfo],
    graph_b: &[crate::node::NodeInfo],
    runs: &CycleRuns,
    work: &Work,
    cfg: &AbConfig,
    seed: u64,
) -> Result<Vec<LedgerRow>, EngineError> {
    let cat = Categoriser::new(rules, arch);
    let (in_a, in_b) = (cat.categorise(graph_a), cat.categorise(graph_b));
    let tokens = work.tokens_per_run();
    // per side, per cycle, per band (the control computes A's graph)
    let per_cycle = |side: usize, cats: &[crate::band::Assignment]| -> Vec<Vec<f64>> {
        runs.node_us[side]
            .iter()
            .zip(&runs.wall_ms[side])
            .map(|(us, &wall)| band_ms(rules, cats, us, wall, tokens))
            .collect()
    };
    let cycles = [
        per_cycle(0, &in_a),
        per_cycle(1, &in_b),
        per_cycle(2, &in_a),
    ];
    let kept: Vec<usize> = (0..rules.bands.len())
        .filter(|&i| {
            in_a.iter()
                .chain(&in_b)
                .any(|y| y.band == rules.bands[i].name)
        })
        .collect();
    let alpha = bonferroni(0.05, kept.len());
    let resamples = cfg.resamples.max((40.0 / alpha).ceil() as u32);
    let med = |v: &[f64]| Sample::new(v).map(|s| s.median()).unwrap_or(0.0);
    let mut rows = Vec::new();
    for (k, &i) in kept.iter().enumerate() {
        let series = |side: usize| -> Vec<f64> { cycles[side].iter().map(|c| c[i]).collect() };
        let (sa, sb, sc) = (series(0), series(1), series(2));
        let (x, y) = (med(&sa), med(&sb));
        let band_seed = seed ^ ((k as u64 + 1) << 20);
        let judged = if x > 0.0 && med(&sc) > 0.0 {
            judge_with_control(&sa, &sb, &sc, resamples, band_seed, cfg.min_effect, alpha).map(
                |j| BandJudged {
                    ratio_lo: j.lo,
                    ratio_hi: j.hi,
                    control_ratio: j.control_ratio,
                    control_lo: j.control_lo,
                    control_hi: j.control_hi,
                    verdict: j.verdict,
                    level: 1.0 - alpha,
                    a_cycles: sa.clone(),
                    b_cycles: sb.clone(),
                    control_cycles: sc.clone(),
                },
            )
        } else {
            // a band A spends nothing in: no ratio to judge
            Some(BandJudged {
                ratio_lo: f64::NAN,
                ratio_hi: f64::NAN,
                control_ratio: f64::NAN,
                control_lo: f64::NAN,
                control_hi: f64::NAN,
                verdict: Verdict::WithinNoise,
                level: 1.0 - alpha,
                a_cycles: sa.clone(),
                b_cycles: sb.clone(),
                control_cycles: sc.clone(),
            })
        };
        rows.push(LedgerRow {
            band: rules.bands[i].name.clone(),
            a_ms_per_token: x,
            b_ms_per_token: y,
            gap_ms_per_token: y - x,
            ratio: if x > 0.0 { y / x } else { f64::NAN },
            judged,
        });
    }
    rows.sort_by(|p, q| {
        q.gap_ms_per_token
            .abs()
            .total_cmp(&p.gap_ms_per_token.abs())
    });
    Ok(rows)
}

/// Version of `ab.json`; bumped on any incompatible change. 2: the overall verdict is a name
/// ([`Outcome`]) and a scenario whose control moved is `inconclusive`. 3: a control moved only
/// when its whole interval lies beyond the threshold; one that did not move sets the smallest
/// effect a verdict may claim ([`Verdict::of_scenario`]). 4: a control process (a second
/// process of A, `control_ms`) judged with [`Verdict::against_control`], the bands judged over
/// every cycle ([`BandJudged`]), the output gate over every position ([`OutputGate`]); files of
/// version 3 read as they were.
pub const AB_SCHEMA_VERSION: u32 = 4;

/// One A/B with its ablations: the `ab.json` of an `ab` run folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AbReport {
    /// Absent in files written before it was recorded (version 1).
    #[serde(default = "ab_schema_v1")]
    pub schema_version: u32,
    pub a: Knobs,
    pub b: Knobs,
    pub config: AbConfig,
    pub scenarios: Vec<ScenarioResult>,
    /// B with one changed knob turned back off, against A, on the first scenario.
    pub ablations: Vec<Ablation>,
    /// The overall verdict ([`Outcome::of`] the scenarios).
    #[serde(deserialize_with = "outcome_v1_or_v2")]
    pub verdict: Outcome,
}

impl AbReport {
    /// Brings a report read from an older `ab.json` to this version's rules: version 1 judged
    /// a scenario without its control and version 2 called every control that was not "no
    /// change" moved, so every scenario verdict is judged again from its stored intervals and
    /// the overall verdict follows from them (an ablation stores no control: its verdict stays
    /// as written).
    pub fn upgrade(&mut self) {
        if self.schema_version < 3 {
            let min_effect = self.config.min_effect;
            for s in &mut self.scenarios {
                s.control_verdict = Verdict::of(s.control_lo, s.control_hi, min_effect);
                s.verdict = Verdict::of_scenario(
                    s.ratio_lo,
                    s.ratio_hi,
                    s.control_lo,
                    s.control_hi,
                    min_effect,
                );
            }
            self.verdict = Outcome::of(&self.scenarios);
        }
        self.schema_version = self.schema_version.max(AB_SCHEMA_VERSION);
    }
}

fn ab_schema_v1() -> u32 {
    1
}

/// B with one knob turned back to A's value, against A.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ablation {
    /// The knob turned back to A's value.
    pub reverted: String,
    pub knobs: Knobs,
    pub ratio: f64,
    pub ratio_lo: f64,
    pub ratio_hi: f64,
    pub verdict: Verdict,
    pub correct: bool,
    /// The share of B's gain over A this knob carries: what turning it back alone loses.
    #[serde(default)]
    pub share_of_gain: Option<f64>,
}

/// (ratio with the knob turned back - ratio of B) / (1 - ratio of B): 1 when turning the knob
/// back loses the whole gain, 0 when it loses none; `None` when B gained nothing to share.
pub fn share_of_gain(ratio_b: f64, ratio_reverted: f64) -> Option<f64> {
    (ratio_b < 1.0).then(|| (ratio_reverted - ratio_b) / (1.0 - ratio_b))
}

/// Version of `discover.json`.
pub const DISCOVER_SCHEMA_VERSION: u32 = 1;

/// One candidate of a `discover` search: its knobs against the baseline on the first scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub knobs: Knobs,
    pub ratio: f64,
    pub ratio_lo: f64,
    pub ratio_hi: f64,
    pub correct: bool,
}

/// A `discover` search: the `discover.json` of its run folder.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiscoverReport {
    /// Absent in files written before it was recorded.
    #[serde(default = "discover_schema_v1")]
    pub schema_version: u32,
    pub baseline: Knobs,
    /// Fastest first.
    pub candidates: Vec<Candidate>,
    /// The winner's confirmation: a full A/B against the baseline with ablations and control.
    pub confirmation: Option<AbReport>,
}

fn discover_schema_v1() -> u32 {
    1
}

impl DiscoverReport {
    /// The outcome of the search: that of the winner's confirmation (a refused or inconclusive
    /// confirmation is not a discovery), or `None` when no candidate was faster and correct.
    pub fn outcome(&self) -> Option<Outcome> {
        self.confirmation.as_ref().map(|c| c.verdict)
    }
}

/// A `--knobs` grid specification could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GridError {
    #[error("'{0}' is not knob=value,value")]
    NotAKnob(String),
    #[error("{0} has no values")]
    NoValues(String),
    #[error(transparent)]
    Knob(#[from] KnobError),
    #[error("the grid has more than {0} candidates; narrow it or raise --max-candidates")]
    TooLarge(usize),
}

/// Every combination of a grid specification, knobs separated by `;` and values by `,`:
/// `threads=1,2;flash_attn=on,off` is four candidates. More than `max` is refused.
pub fn grid(spec: &str, max: usize) -> Result<Vec<Knobs>, GridError> {
    let mut axes: Vec<(String, Vec<String>)> = Vec::new();
    for part in spec.split(';').filter(|p| !p.trim().is_empty()) {
        let (k, vs) = part
            .split_once('=')
            .ok_or_else(|| GridError::NotAKnob(part.to_string()))?;
        let values: Vec<String> = vs
            .split(',')
            .map(|v| v.trim().to_string())
            .filter(|v| !v.is_empty())
            .collect();
        if values.is_empty() {
            return Err(GridError::NoValues(k.trim().to_string()));
        }
        for v in &values {
            format!("{}={v}", k.trim()).parse::<Knobs>()?;
        }
        axes.push((k.trim().to_lowercase(), values));
    }
    let mut out = vec![Knobs::default()];
    for (k, values) in &axes {
        let mut next = Vec::new();
        for base in &out {
            for v in values {
                let mut c = base.clone();
                c.0.insert(k.clone(), v.to_lowercase());
                next.push(c);
            }
        }
        out = next;
        if out.len() > max {
            return Err(GridError::TooLarge(max));
        }
    }
    Ok(out)
}

impl Knobs {
    /// `self` without the knobs set to the value they have in `defaults` (a knob set to its
    /// default is no change).
    pub fn without_defaults(&self, defaults: &Knobs) -> Knobs {
        Knobs(
            self.0
                .iter()
                .filter(|(k, v)| defaults.0.get(*k) != Some(*v))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_env_knob_keeps_its_name_and_value_as_written() {
        let k: Knobs = "threads=2,ENV:GGML_CUDA_DISABLE_GRAPHS=1,env:CUDA_VISIBLE_DEVICES=Gpu-0"
            .parse()
            .unwrap();
        assert_eq!(k.get("env:GGML_CUDA_DISABLE_GRAPHS"), Some("1"));
        assert_eq!(k.get("env:CUDA_VISIBLE_DEVICES"), Some("Gpu-0"));
        assert_eq!(k.get("threads"), Some("2"));
        assert_eq!(
            k.to_string(),
            "env:CUDA_VISIBLE_DEVICES=Gpu-0,env:GGML_CUDA_DISABLE_GRAPHS=1,threads=2"
        );
        // a name a shell could not set is refused
        for bad in ["env:=1", "env:A-B=1", "env:A B=1"] {
            assert!(bad.parse::<Knobs>().is_err(), "{bad}");
        }
        // a worker's path keeps its case too
        let k: Knobs = "Worker=/tmp/gpu-check.AbC/opledger-llama-worker"
            .parse()
            .unwrap();
        assert_eq!(
            k.get("worker"),
            Some("/tmp/gpu-check.AbC/opledger-llama-worker")
        );
        // a value may be empty (the variable set to nothing)
        let k: Knobs = "env:GGML_CUDA_DISABLE_GRAPHS=".parse().unwrap();
        assert_eq!(k.get("env:GGML_CUDA_DISABLE_GRAPHS"), Some(""));
    }

    #[test]
    fn the_share_of_the_gain_by_hand() {
        // B is 20 % faster; without the knob it is only 5 % faster: the knob carries 75 %
        assert!((share_of_gain(0.8, 0.95).unwrap() - 0.75).abs() < 1e-12);
        assert_eq!(share_of_gain(0.8, 0.8), Some(0.0));
        assert!((share_of_gain(0.8, 1.0).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(share_of_gain(1.02, 0.9), None);
        let d: Knobs = "threads=2,ubatch=512,repack=on".parse().unwrap();
        let w: Knobs = "threads=2,ubatch=128,flash_attn=off".parse().unwrap();
        assert_eq!(
            w.without_defaults(&d).to_string(),
            "flash_attn=off,ubatch=128"
        );
    }

    #[test]
    fn a_grid_is_every_combination_and_refuses_what_it_cannot_read() {
        let g = grid("threads=1,2; flash_attn=on,off", 64).unwrap();
        let names: Vec<String> = g.iter().map(|k| k.to_string()).collect();
        assert_eq!(
            names,
            [
                "flash_attn=on,threads=1",
                "flash_attn=off,threads=1",
                "flash_attn=on,threads=2",
                "flash_attn=off,threads=2"
            ]
        );
        assert_eq!(
            grid("threads=1,2;ubatch=128,256", 3),
            Err(GridError::TooLarge(3))
        );
        assert_eq!(
            grid("threads", 8),
            Err(GridError::NotAKnob("threads".into()))
        );
        assert_eq!(
            grid("threads=", 8),
            Err(GridError::NoValues("threads".into()))
        );
        assert!(matches!(grid("speed=max", 8), Err(GridError::Knob(_))));
    }

    #[test]
    fn knobs_parse_validate_and_diff() {
        let a: Knobs = "threads=2, flash_attn=on".parse().unwrap();
        let b: Knobs = "threads=1,flash_attn=on,ubatch=256".parse().unwrap();
        assert_eq!(a.to_string(), "flash_attn=on,threads=2");
        assert_eq!(b.differences(&a), vec!["threads", "ubatch"]);
        assert_eq!(
            b.reverted("ubatch", &a).to_string(),
            "flash_attn=on,threads=1"
        );
        assert!(matches!(
            "speed=max".parse::<Knobs>(),
            Err(KnobError::Unknown(_))
        ));
        let e = "type_k=q9".parse::<Knobs>().unwrap_err();
        assert!(
            e.to_string().contains("type_k=q9") && e.to_string().contains("q8_0"),
            "{e}"
        );
        assert!(matches!(
            "threads".parse::<Knobs>(),
            Err(KnobError::Syntax(_))
        ));
        assert_eq!("".parse::<Knobs>().unwrap().to_string(), "defaults");
    }

    #[test]
    fn verdicts_follow_the_interval() {
        assert_eq!(Verdict::of(0.90, 0.95, 0.02), Verdict::Faster);
        assert_eq!(Verdict::of(1.05, 1.10, 0.02), Verdict::Slower);
        assert_eq!(Verdict::of(0.99, 1.01, 0.02), Verdict::NoChange);
        assert_eq!(Verdict::of(0.95, 1.01, 0.02), Verdict::WithinNoise);
    }

    #[test]
    fn bootstrap_brackets_a_clear_speed_up() {
        // B is 20 % faster with ±2 % noise: ratio 0.8, interval well below 0.98
        let a: Vec<f64> = (0..12).map(|i| 100.0 + (i % 3) as f64).collect();
        let b: Vec<f64> = a.iter().map(|x| x * 0.8).collect();
        let (r, lo, hi) = ratio_ci(&a, &b, 2000, 7).unwrap();
        assert!((r - 0.8).abs() < 1e-12);
        assert!(lo <= r && r <= hi && hi < 0.98, "{lo} {hi}");
        assert_eq!(Verdict::of(lo, hi, 0.02), Verdict::Faster);
        // same seed, same interval
        assert_eq!(ratio_ci(&a, &b, 2000, 7), ratio_ci(&a, &b, 2000, 7));
    }

    #[test]
    fn correctness_gate_by_hand() {
        let tol = Tolerance::default();
        let a = vec![vec![1.0f32, 5.0, 2.0]];
        let same = compare_logits(&a, &a, &tol);
        assert!(same.passed && same.max_rel_error == 0.0 && same.same_top1 == 1);
        // a 1 % nudge keeps the top token and passes
        let b = vec![vec![1.05f32, 5.0, 2.0]];
        let near = compare_logits(&a, &b, &tol);
        assert!(near.passed, "{near:?}");
        assert!((near.max_rel_error - 0.01).abs() < 1e-6);
        // a different greedy token fails whatever the error
        let c = vec![vec![1.0f32, 5.0, 5.1]];
        let other = compare_logits(&a, &c, &tol);
        assert!(!other.passed && other.same_top1 == 0);
    }

    fn scenario(verdict: Verdict, control: Verdict, passed: bool) -> ScenarioResult {
        ScenarioResult {
            work: Work::prefill(8, 0),
            a_ms: vec![1.0; 4],
            b_ms: vec![1.0; 4],
            ratio: 1.0,
            ratio_lo: 1.0,
            ratio_hi: 1.0,
            verdict,
            control_ratio: 1.0,
            control_lo: 1.0,
            control_hi: 1.0,
            control_verdict: control,
            correctness: Correctness {
                rows: 1,
                same_top1: passed as u32,
                max_rel_error: 0.0,
                min_cosine: 1.0,
                passed,
            },
            ledger: Vec::new(),
            gate: GateStats::default(),
            control_ms: Vec::new(),
            outputs: None,
            op_diff: None,
        }
    }

    #[test]
    fn a_control_that_moved_makes_the_verdict_inconclusive() {
        // B's interval is far below 0.98, but A against itself moved by 5-10 %: no verdict
        assert_eq!(
            Verdict::of_scenario(0.50, 0.55, 1.05, 1.10, 0.02),
            Verdict::Inconclusive
        );
        assert_eq!(
            Verdict::of_scenario(0.50, 0.55, 0.90, 0.95, 0.02),
            Verdict::Inconclusive
        );
        assert_eq!(
            Verdict::of_scenario(0.50, 0.55, 0.99, 1.01, 0.02),
            Verdict::Faster
        );
        // one inconclusive scenario makes the whole A/B inconclusive; a refused one wins
        let faster = scenario(Verdict::Faster, Verdict::NoChange, true);
        let moved = scenario(Verdict::Inconclusive, Verdict::Faster, true);
        assert_eq!(Outcome::of(std::slice::from_ref(&faster)), Outcome::Faster);
        assert_eq!(
            Outcome::of(&[faster.clone(), moved.clone()]),
            Outcome::Inconclusive
        );
        let changed = scenario(Verdict::Faster, Verdict::NoChange, false);
        assert_eq!(Outcome::of(&[moved, changed]), Outcome::Refused);
        let noise = scenario(Verdict::WithinNoise, Verdict::NoChange, true);
        assert_eq!(
            Outcome::of(&[faster.clone(), noise.clone()]),
            Outcome::FasterInSome
        );
        assert_eq!(Outcome::of(&[noise]), Outcome::NoChange);
    }

    #[test]
    fn ab_with_a_moving_control_is_inconclusive_not_faster() {
        use crate::arch::tests::qwen35moe_md;
        use crate::mock::{MockEngine, MockNode};
        const NODES: [MockNode; 2] = [
            ("MUL_MAT", "Qcur_full-3", "blk.3.attn_q.weight", 500.0),
            ("ADD", "l_out-3", "", 500.0),
        ];
        // A alternates 1.0 and 1.5 (runs: warm-up, then one per pair): its even-numbered runs
        // all 1.5, its odd ones 1.0, so A against itself is 0.67; B is twice as fast
        let mut a = MockEngine::new(&NODES);
        a.noise = vec![1.0, 1.5];
        let mut b = MockEngine::new(&NODES);
        b.fused_factor = 0.5;
        let cfg = AbConfig {
            scenarios: vec![Work::prefill(8, 0)],
            pairs: 8,
            gate: GateConfig {
                enabled: false,
                ..GateConfig::default()
            },
            tolerance: Tolerance::default(),
            min_effect: 0.02,
            resamples: 200,
            seed: 1,
            outputs: None,
        };
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let arch = ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap();
        let sides = AbSides {
            a: &mut a,
            b: &mut b,
            control: None,
        };
        let r = run_ab(sides, &cfg, &rules, &arch, &mut |_, _, _| {}).unwrap();
        let s = &r[0];
        assert_eq!(
            s.a_ms.iter().step_by(2).copied().collect::<Vec<_>>(),
            [1.5; 4]
        );
        assert!(
            (s.control_ratio - 1.0 / 1.5).abs() < 1e-12,
            "{}",
            s.control_ratio
        );
        assert_eq!(s.control_verdict, Verdict::Faster);
        // B/A is 0.5 / 1.25 = 0.4: the old verdict said "faster"
        assert!(s.ratio_hi < 0.98, "{}", s.ratio_hi);
        assert_eq!(s.verdict, Verdict::Inconclusive);
        assert_eq!(Outcome::of(&r), Outcome::Inconclusive);
    }

    #[test]
    fn a_version_1_report_is_judged_again_with_its_control() {
        let mut r = AbReport {
            schema_version: 1,
            a: Knobs::default(),
            b: "threads=1".parse().unwrap(),
            config: AbConfig {
                scenarios: vec![Work::prefill(8, 0)],
                pairs: 8,
                gate: GateConfig::default(),
                tolerance: Tolerance::default(),
                min_effect: 0.02,
                resamples: 10,
                seed: 0,
                outputs: None,
            },
            scenarios: vec![ScenarioResult {
                ratio_lo: 0.5,
                ratio_hi: 0.6,
                control_lo: 1.05,
                control_hi: 1.10,
                ..scenario(Verdict::Faster, Verdict::Slower, true)
            }],
            ablations: Vec::new(),
            verdict: Outcome::Faster,
        };
        let mut v = serde_json::to_value(&r).unwrap();
        // version 1 stored the sentence
        v["verdict"] = "faster in every scenario".into();
        let back: AbReport = serde_json::from_value(v).unwrap();
        assert_eq!(back.verdict, Outcome::Faster);
        r.upgrade();
        assert_eq!(r.scenarios[0].verdict, Verdict::Inconclusive);
        assert_eq!(r.verdict, Outcome::Inconclusive);
        assert_eq!(r.schema_version, AB_SCHEMA_VERSION);
        // version 2 called a wide control that held 1.0 moved: judged again, B is faster
        r.schema_version = 2;
        r.scenarios[0].control_lo = 0.827;
        r.scenarios[0].control_hi = 1.467;
        r.scenarios[0].control_verdict = Verdict::WithinNoise;
        r.scenarios[0].verdict = Verdict::Inconclusive;
        r.verdict = Outcome::Inconclusive;
        r.upgrade();
        assert_eq!(r.scenarios[0].verdict, Verdict::Faster);
        assert_eq!(r.verdict, Outcome::Faster);
        let bad = serde_json::json!("faster-ish");
        assert!(outcome_v1_or_v2(bad).is_err());
    }

    #[test]
    fn a_noisy_control_that_did_not_move_sets_the_smallest_effect() {
        // `ab -m tiny-qwen35moe --a threads=1 --b threads=2 -p 128`: the control holds 1.0 and
        // is wider than ±2 %; B/A lies wholly below it: faster (it was "inconclusive")
        assert_eq!(Verdict::of(0.827, 1.467, 0.02), Verdict::WithinNoise);
        assert!(!Verdict::WithinNoise.moved());
        assert_eq!(
            Verdict::of_scenario(0.642, 0.785, 0.827, 1.467, 0.02),
            Verdict::Faster
        );
        // the control compares 4 runs with 4, B/A 8 with 8: its bounds' log distance from 1
        // shrinks by sqrt(2), ln 0.827 = -0.190 -> -0.134 -> 0.874 and ln 1.467 = 0.383 ->
        // 0.271 -> 1.311
        let (n_lo, n_hi) = Verdict::noise_bounds(0.827, 1.467);
        assert!(
            (n_lo - 0.8743).abs() < 1e-3 && (n_hi - 1.3111).abs() < 1e-3,
            "{n_lo} {n_hi}"
        );
        let e = |x: f64| x.exp();
        let (lo, hi) = Verdict::noise_bounds(
            e(-0.1 * std::f64::consts::SQRT_2),
            e(0.2 * std::f64::consts::SQRT_2),
        );
        assert!((lo - e(-0.1)).abs() < 1e-12 && (hi - e(0.2)).abs() < 1e-12);
        // B/A reaching into the noise is within it, however far below 1 - 2 % it lies
        assert_eq!(
            Verdict::of_scenario(0.70, 0.90, 0.827, 1.467, 0.02),
            Verdict::WithinNoise
        );
        // slower: above both 1 + 2 % and the noise's upper bound
        assert_eq!(
            Verdict::of_scenario(1.32, 1.60, 0.827, 1.467, 0.02),
            Verdict::Slower
        );
        assert_eq!(
            Verdict::of_scenario(1.25, 1.60, 0.827, 1.467, 0.02),
            Verdict::WithinNoise
        );
        // a tight control: the threshold decides, as before
        assert_eq!(
            Verdict::of_scenario(0.95, 0.97, 0.99, 1.01, 0.02),
            Verdict::Faster
        );
        assert_eq!(
            Verdict::of_scenario(0.99, 1.01, 0.99, 1.01, 0.02),
            Verdict::NoChange
        );
        // a control inside ±2 % that misses 1.0 has not moved beyond the threshold
        assert_eq!(
            Verdict::of_scenario(0.90, 0.95, 1.005, 1.015, 0.02),
            Verdict::Faster
        );
        // a control of one run of A (one pair) bounds nothing
        let one = judge(&[100.0], &[50.0], 100, 1, 0.02).unwrap();
        assert_eq!(one.verdict, Verdict::Inconclusive);
    }

    /// Uniform in [0, 1) and standard normal (Box-Muller) from a SplitMix64 state.
    fn uniform(state: &mut u64) -> f64 {
        *state = splitmix64(*state);
        (*state >> 11) as f64 / (1u64 << 53) as f64
    }

    fn normal(state: &mut u64) -> f64 {
        let u = uniform(state).max(1e-300);
        let v = uniform(state);
        (-2.0 * u.ln()).sqrt() * (2.0 * std::f64::consts::PI * v).cos()
    }

    /// One simulated scenario of `pairs` interleaved pairs: every run is 100 ms x (1 + noise x
    /// a standard normal), B's also x (1 + effect); with probability `outliers` a run is 30 %
    /// slower (another process woke up). Judged as `run_ab` judges (8 pairs, 2 % threshold).
    fn simulate(effect: f64, noise: f64, outliers: f64, pairs: usize, seed: u64) -> Judged {
        let mut state = seed;
        let mut run = |scale: f64| {
            let slow = if uniform(&mut state) < outliers {
                1.3
            } else {
                1.0
            };
            100.0 * scale * (1.0 + noise * normal(&mut state)) * slow
        };
        let mut a = Vec::new();
        let mut b = Vec::new();
        for p in 0..pairs {
            // the order alternates by pair, as in run_ab
            if p % 2 == 0 {
                a.push(run(1.0));
                b.push(run(1.0 + effect));
            } else {
                b.push(run(1.0 + effect));
                a.push(run(1.0));
            }
        }
        judge(&a, &b, 1000, seed ^ 0x5eed, 0.02).unwrap()
    }

    /// Of `trials` simulated A/Bs, how many end in each overall verdict.
    fn verdicts(
        effect: f64,
        noise: f64,
        outliers: f64,
        pairs: usize,
        trials: u64,
    ) -> BTreeMap<&'static str, u32> {
        let mut counts = BTreeMap::new();
        for t in 0..trials {
            let j = simulate(effect, noise, outliers, pairs, 0xab_0000 + t);
            let mut s = scenario(j.verdict, j.control_verdict, true);
            s.ratio_lo = j.lo;
            s.ratio_hi = j.hi;
            *counts.entry(Outcome::of(&[s]).name()).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn an_a_a_run_claims_no_effect_at_least_95_percent_of_the_time() {
        // B is A (effect 0): 3 % noise, then 3 % noise with one run in ten 30 % slower. 1000
        // trials each gave 1 and 1 claims of an effect (0.1 %), the rest "no change" or
        // "within noise" (overall: no change beyond the noise) and 1.5 % and 2.7 % inconclusive
        for outliers in [0.0, 0.1] {
            let c = verdicts(0.0, 0.03, outliers, 8, 600);
            let claims = c.get("faster").unwrap_or(&0) + c.get("slower").unwrap_or(&0);
            let quiet = c.get("no_change").unwrap_or(&0) + c.get("inconclusive").unwrap_or(&0);
            assert_eq!(claims + quiet, 600, "{c:?}");
            assert!(
                claims as f64 / 600.0 <= 0.05,
                "A/A with outliers {outliers}: {c:?}"
            );
        }
    }

    #[test]
    fn a_ten_percent_effect_in_three_percent_noise_is_found() {
        // 1000 trials each gave: 8 pairs (the default) 87 % faster (84 % slower for +10 %),
        // 12 pairs 96 %, 16 pairs 99 %; the rule before (any control wider than ±2 % made the
        // scenario inconclusive) found it in 1.5 % of them
        let rate = |c: &BTreeMap<&str, u32>, k: &str, n: f64| *c.get(k).unwrap_or(&0) as f64 / n;
        let faster = verdicts(-0.10, 0.03, 0.0, 8, 300);
        assert!(rate(&faster, "faster", 300.0) >= 0.8, "{faster:?}");
        let slower = verdicts(0.10, 0.03, 0.0, 8, 300);
        assert!(rate(&slower, "slower", 300.0) >= 0.8, "{slower:?}");
        // never the wrong way
        assert_eq!(faster.get("slower"), None, "{faster:?}");
        assert_eq!(slower.get("faster"), None, "{slower:?}");
        // more pairs, more power
        let more = verdicts(-0.10, 0.03, 0.0, 16, 200);
        assert!(rate(&more, "faster", 200.0) >= 0.95, "{more:?}");
    }

    #[test]
    fn ledger_sorts_by_gap() {
        let bands = vec!["attention".to_string(), "moe".into(), "other".into()];
        let rows = ledger(&bands, &[1.0, 4.0, 0.5], &[1.2, 3.0, 0.5]);
        assert_eq!(rows[0].band, "moe");
        assert!((rows[0].gap_ms_per_token + 1.0).abs() < 1e-12);
        assert_eq!(rows[1].band, "attention");
        assert_eq!(rows[2].gap_ms_per_token, 0.0);
    }
}

#[cfg(test)]
mod control_tests {
    use super::*;

    #[test]
    fn bonferroni_divides_the_error_rate_among_the_intervals() {
        assert_eq!(bonferroni(0.05, 5), 0.01);
        assert_eq!(bonferroni(0.05, 0), 0.05);
    }

    #[test]
    fn an_exact_ratio_has_an_interval_of_one_point_at_any_level() {
        let a = [10.0, 11.0, 9.0, 12.0, 10.5];
        let b: Vec<f64> = a.iter().map(|x| x * 2.0).collect();
        for alpha in [0.05, 0.001] {
            let (r, lo, hi) = ratio_ci_at(&a, &b, 500, 7, alpha).unwrap();
            assert_eq!((r, lo, hi), (2.0, 2.0, 2.0));
        }
    }

    #[test]
    fn a_stricter_level_widens_the_interval() {
        // scripted noise: B 1.3x A, each run off by a fixed pattern of up to ±6 %
        let noise = [1.0, 1.06, 0.95, 1.02, 0.97, 1.04, 0.99, 0.94, 1.05, 1.01];
        let a: Vec<f64> = noise.iter().map(|n| 10.0 * n).collect();
        let b: Vec<f64> = noise.iter().rev().map(|n| 13.0 * n).collect();
        let (_, lo95, hi95) = ratio_ci_at(&a, &b, 4000, 1, 0.05).unwrap();
        let (_, lo99, hi99) = ratio_ci_at(&a, &b, 4000, 1, bonferroni(0.05, 5)).unwrap();
        assert!(
            lo99 <= lo95 && hi99 >= hi95,
            "{lo99}..{hi99} vs {lo95}..{hi95}"
        );
        assert!(lo99 < hi99);
    }

    #[test]
    fn a_verdict_against_a_second_process_uses_its_interval_as_the_noise() {
        // a control 0.97..1.04 that did not move (2 % threshold): B must clear it
        assert_eq!(
            Verdict::against_control(1.03, 1.10, 0.97, 1.04, 0.02),
            Verdict::WithinNoise
        );
        assert_eq!(
            Verdict::against_control(1.05, 1.10, 0.97, 1.04, 0.02),
            Verdict::Slower
        );
        assert_eq!(
            Verdict::against_control(0.90, 0.96, 0.97, 1.04, 0.02),
            Verdict::Faster
        );
        assert_eq!(
            Verdict::against_control(0.99, 1.01, 0.97, 1.04, 0.02),
            Verdict::NoChange
        );
        // a control that moved: nothing may be claimed
        assert_eq!(
            Verdict::against_control(1.5, 1.6, 1.03, 1.08, 0.02),
            Verdict::Inconclusive
        );
    }

    #[test]
    fn a_second_process_that_runs_slower_is_a_control_that_moved() {
        // scripted: A2 (the second process of A) 10 % slower than A in every cycle, B as A2
        let noise = [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99];
        let a: Vec<f64> = noise.iter().map(|n| 10.0 * n).collect();
        let a2: Vec<f64> = noise.iter().map(|n| 11.0 * n).collect();
        let j = judge_with_control(&a, &a2, &a2, 2000, 3, 0.02, 0.05).unwrap();
        assert_eq!(j.control_verdict, Verdict::Slower);
        assert_eq!(j.verdict, Verdict::Inconclusive);
        // the same B against a control that stayed put: slower
        let j = judge_with_control(&a, &a2, &a, 2000, 3, 0.02, 0.05).unwrap();
        assert_eq!(j.control_verdict, Verdict::NoChange);
        assert_eq!(j.verdict, Verdict::Slower);
        assert!((j.ratio - 1.1).abs() < 1e-12);
    }
}

#[cfg(test)]
mod process_control_tests {
    use super::*;
    use crate::arch::tests::qwen35moe_md;
    use crate::mock::MockEngine;

    fn arch() -> ArchInfo {
        ArchInfo::from_metadata(&qwen35moe_md(4)).unwrap()
    }

    /// A mock of the qwen35moe graph with exact shares (no isolation cost) and scripted noise
    /// of up to ±4 % per run, starting at `phase` in the pattern.
    fn side(phase: usize) -> MockEngine {
        let mut e = MockEngine::for_arch(&arch());
        e.isolation_us = 0.0;
        e.logits = vec![0.25, 1.5, -0.5, 0.75, 0.1, 1.2];
        // seven values: a side's FUSED runs (every other run) go through all of them twice
        // in 14 cycles, whatever the phase
        let noise = [1.0, 1.04, 0.97, 1.02, 0.99, 1.03, 0.96];
        e.noise = (0..noise.len())
            .map(|i| noise[(i + phase) % noise.len()])
            .collect();
        e
    }

    fn config(pairs: u32) -> AbConfig {
        AbConfig {
            scenarios: vec![Work::prefill(16, 0)],
            pairs,
            gate: GateConfig {
                enabled: false,
                ..GateConfig::default()
            },
            tolerance: Tolerance::default(),
            min_effect: 0.02,
            resamples: 2000,
            seed: 5,
            outputs: Some(OutputGateConfig {
                steps: 3,
                ..Default::default()
            }),
        }
    }

    fn run(
        a: &mut MockEngine,
        b: &mut MockEngine,
        c: &mut MockEngine,
        pairs: u32,
    ) -> ScenarioResult {
        let rules = BandRules::builtin("qwen35moe").unwrap();
        let sides = AbSides {
            a,
            b,
            control: Some(c),
        };
        let mut r = run_ab(sides, &config(pairs), &rules, &arch(), &mut |_, _, _| {}).unwrap();
        r.remove(0)
    }

    #[test]
    fn the_orders_of_a_cycle_balance_every_side_over_every_position() {
        for with_control in [false, true] {
            let n = if with_control { 3 } else { 2 };
            let period = if with_control { 6 } else { 2 };
            let mut at = vec![vec![0; n]; n];
            for p in 0..period {
                let o = cycle_order(p, with_control);
                assert_eq!(o.len(), n);
                for (pos, side) in o.iter().enumerate() {
                    at[*side][pos] += 1;
                }
            }
            // each side once in each position per half period (2) or per two in six (3)
            for row in &at {
                assert!(row.iter().all(|&k| k == period as usize / n), "{at:?}");
            }
        }
    }

    #[test]
    fn a_band_made_three_times_slower_is_the_one_band_called_slower() {
        let mut a = side(0);
        let mut c = side(3);
        let mut b = side(5);
        // B: every attention core three times as costly
        for (n, cost) in b.graph.clone().iter().zip(b.cost_us.iter_mut()) {
            if n.op == "FLASH_ATTN_EXT" {
                *cost *= 3.0;
            }
        }
        let s = run(&mut a, &mut b, &mut c, 14);
        assert_eq!(s.control_ms.len(), 14);
        assert_eq!(s.a_ms.len(), 14);
        // the control saw the same walls in another order: its point is 1, its interval the
        // noise's width, and it did not move
        assert!((s.control_ratio - 1.0).abs() < 1e-12, "{}", s.control_ratio);
        assert!(!s.control_verdict.moved(), "{:?}", s.control_verdict);
        assert!(s.correctness.passed && s.outputs.as_ref().unwrap().bit_identical);
        let bands: Vec<(&str, Verdict)> = s
            .ledger
            .iter()
            .map(|r| (r.band.as_str(), r.judged.as_ref().unwrap().verdict))
            .collect();
        // the largest gap first: attention
        assert_eq!(bands[0], ("attention", Verdict::Slower), "{bands:?}");
        for (band, v) in &bands[1..] {
            assert!(!v.moved(), "{band}: {v:?}");
        }
        let att = &s.ledger[0];
        let j = att.judged.as_ref().unwrap();
        // every cycle measured on every side, at the corrected level of the bands read
        assert_eq!(j.a_cycles.len(), 14);
        assert!((j.level - (1.0 - 0.05 / s.ledger.len() as f64)).abs() < 1e-12);
        // attention's cost: 20 µs an attention layer in A, 60 in B; the wall ratio brings in
        // the noise
        assert!(j.ratio_lo > 2.5 && j.ratio_hi < 3.5, "{j:?}");
        let layers = a.graph.iter().filter(|n| n.op == "FLASH_ATTN_EXT").count() as f64;
        assert!(layers >= 1.0);
        // ms per run within the noise (±4 %) of 20 µs a layer, a fused factor of 1
        let per_run_ms = att.a_ms_per_token * 16.0;
        assert!(
            (per_run_ms / (layers * 0.020) - 1.0).abs() < 0.05,
            "{per_run_ms}"
        );
    }

    #[test]
    fn a_second_process_of_a_that_runs_slower_makes_every_verdict_inconclusive() {
        let mut a = side(0);
        let mut b = side(5);
        let mut c = side(3);
        // the control: the same build in another process, 10 % slower
        c.fused_factor = 1.1;
        b.fused_factor = 0.8;
        let s = run(&mut a, &mut b, &mut c, 14);
        assert_eq!(s.control_verdict, Verdict::Slower);
        assert_eq!(s.verdict, Verdict::Inconclusive);
        assert!(s
            .ledger
            .iter()
            .all(|r| r.judged.as_ref().unwrap().verdict == Verdict::Inconclusive));
    }

    #[test]
    fn a_b_that_computes_other_outputs_is_refused_by_the_gate() {
        let mut a = side(0);
        let mut c = side(3);
        let mut b = side(5);
        b.logits = a.logits.iter().map(|x| x * 1.5).collect();
        let s = run(&mut a, &mut b, &mut c, 4);
        let g = s.outputs.as_ref().unwrap();
        assert!(!s.correctness.passed && !g.passed);
        // every row scaled by 1.5: NMSE 0.25 each, 16 positions and 3 steps
        assert_eq!((g.positions, g.steps, g.over_bound), (16, 3, 19));
        assert!((g.max_nmse - 0.25).abs() < 1e-6);
        assert_eq!(Outcome::of(std::slice::from_ref(&s)), Outcome::Refused);
    }
}
