//! Statistics over a validated [`Sample`]: medians, spreads, linear fits. Pure functions.

use serde::{Deserialize, Serialize};

/// A sample of measurements. Invariants: at least one value, every value finite.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    sorted: Vec<f64>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SampleError {
    #[error("an empty sample")]
    Empty,
    #[error("a non-finite value ({0}) in a sample")]
    NotFinite(f64),
}

impl Sample {
    pub fn new(values: &[f64]) -> Result<Sample, SampleError> {
        if values.is_empty() {
            return Err(SampleError::Empty);
        }
        if let Some(&bad) = values.iter().find(|v| !v.is_finite()) {
            return Err(SampleError::NotFinite(bad));
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Ok(Sample { sorted })
    }

    pub fn len(&self) -> usize {
        self.sorted.len()
    }

    pub fn is_empty(&self) -> bool {
        false
    }

    pub fn min(&self) -> f64 {
        self.sorted[0]
    }

    pub fn max(&self) -> f64 {
        self.sorted[self.sorted.len() - 1]
    }

    /// The median (mean of the two middle values for an even count).
    pub fn median(&self) -> f64 {
        let n = self.sorted.len();
        if n % 2 == 1 {
            self.sorted[n / 2]
        } else {
            (self.sorted[n / 2 - 1] + self.sorted[n / 2]) / 2.0
        }
    }

    pub fn mean(&self) -> f64 {
        self.sorted.iter().sum::<f64>() / self.sorted.len() as f64
    }

    /// Sample standard deviation (n - 1); 0 for a single value.
    pub fn std_dev(&self) -> f64 {
        let n = self.sorted.len();
        if n < 2 {
            return 0.0;
        }
        let m = self.mean();
        let ss: f64 = self.sorted.iter().map(|v| (v - m) * (v - m)).sum();
        (ss / (n - 1) as f64).sqrt()
    }

    /// Coefficient of variation (std dev / |mean|); 0 when the mean is 0.
    pub fn cv(&self) -> f64 {
        let m = self.mean();
        if m == 0.0 {
            0.0
        } else {
            self.std_dev() / m.abs()
        }
    }

    pub fn spread(&self) -> Spread {
        Spread {
            median: self.median(),
            min: self.min(),
            max: self.max(),
            n: self.len() as u32,
        }
    }
}

/// Median with its range over the cycles it came from.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// NaN (null in JSON) where the figure was not measured.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub median: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub min: f64,
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub max: f64,
    pub n: u32,
}

impl Spread {
    /// Half the range relative to the median, as a fraction (0.05 = ±5 %).
    pub fn rel_half_range(&self) -> f64 {
        if self.median == 0.0 {
            0.0
        } else {
            (self.max - self.min) / 2.0 / self.median.abs()
        }
    }
}

/// Median of values known to be finite and non-empty, for internal use; `None` otherwise. The
/// same value as [`Sample::median`], found by selection rather than a sort (a summary takes one
/// per node, over thousands of cycles for an imported trace).
pub fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
        return None;
    }
    let mut v = values.to_vec();
    let n = v.len();
    let (lower, &mut mid, _) = v.select_nth_unstable_by(n / 2, f64::total_cmp);
    Some(match lower.iter().copied().max_by(f64::total_cmp) {
        Some(below) if n.is_multiple_of(2) => (below + mid) / 2.0,
        _ => mid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_and_even() {
        assert_eq!(Sample::new(&[3.0, 1.0, 2.0]).unwrap().median(), 2.0);
        assert_eq!(Sample::new(&[4.0, 1.0, 3.0, 2.0]).unwrap().median(), 2.5);
    }

    #[test]
    fn median_by_selection_is_the_sorted_median() {
        // odd and even counts, ties, signed zeros, and values in every order
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for n in 1..60 {
            let values: Vec<f64> = (0..n)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    match x % 7 {
                        0 => 0.0,
                        1 => -0.0,
                        _ => ((x >> 20) % 11) as f64 - 5.0 + (x % 3) as f64 * 0.25,
                    }
                })
                .collect();
            let sorted = Sample::new(&values).unwrap().median();
            assert_eq!(
                median(&values).unwrap().to_bits(),
                sorted.to_bits(),
                "{values:?}"
            );
        }
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[1.0, f64::INFINITY]), None);
    }

    #[test]
    fn rejects_empty_and_nan() {
        assert_eq!(Sample::new(&[]), Err(SampleError::Empty));
        assert!(matches!(
            Sample::new(&[1.0, f64::NAN]),
            Err(SampleError::NotFinite(_))
        ));
    }

    #[test]
    fn std_dev_and_cv_by_hand() {
        // values 2, 4, 4, 4, 5, 5, 7, 9: mean 5, sum of squares 32, n-1 = 7
        let s = Sample::new(&[2.0, 4.0, 4.0, 4.0, 5.0, 5.0, 7.0, 9.0]).unwrap();
        assert!((s.std_dev() - (32.0f64 / 7.0).sqrt()).abs() < 1e-12);
        assert!((s.cv() - (32.0f64 / 7.0).sqrt() / 5.0).abs() < 1e-12);
        let sp = s.spread();
        assert_eq!((sp.min, sp.max, sp.n), (2.0, 9.0, 8));
        assert!((sp.rel_half_range() - 3.5 / 4.5).abs() < 1e-12);
    }
}

/// An ordinary least-squares line y = a + b x with the standard errors a crossover needs.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LinearFit {
    /// Intercept (y at x = 0).
    pub a: f64,
    /// Slope.
    pub b: f64,
    pub se_a: f64,
    pub se_b: f64,
    /// Covariance of the intercept and the slope estimates.
    pub cov_ab: f64,
    /// Coefficient of determination (1 for a perfect line; 1 too when y does not vary at all).
    pub r2: f64,
    pub n: u32,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FitError {
    #[error("a line needs at least 2 points with distinct x ({0} given)")]
    TooFew(usize),
    #[error("x and y differ in length ({0} vs {1})")]
    Lengths(usize, usize),
    #[error("a non-finite value in the fit's data")]
    NotFinite,
}

/// Fits y = a + b x. Standard errors need 3 points or more (they are 0 with 2).
pub fn linear_fit(x: &[f64], y: &[f64]) -> Result<LinearFit, FitError> {
    if x.len() != y.len() {
        return Err(FitError::Lengths(x.len(), y.len()));
    }
    if x.iter().chain(y).any(|v| !v.is_finite()) {
        return Err(FitError::NotFinite);
    }
    let n = x.len();
    let nf = n as f64;
    if n < 2 {
        return Err(FitError::TooFew(n));
    }
    let mx = x.iter().sum::<f64>() / nf;
    let my = y.iter().sum::<f64>() / nf;
    let sxx: f64 = x.iter().map(|v| (v - mx) * (v - mx)).sum();
    if sxx == 0.0 {
        return Err(FitError::TooFew(n));
    }
    let sxy: f64 = x.iter().zip(y).map(|(u, v)| (u - mx) * (v - my)).sum();
    let b = sxy / sxx;
    let a = my - b * mx;
    let sse: f64 = x.iter().zip(y).map(|(u, v)| (v - a - b * u).powi(2)).sum();
    let sst: f64 = y.iter().map(|v| (v - my) * (v - my)).sum();
    let s2 = if n > 2 { sse / (nf - 2.0) } else { 0.0 };
    Ok(LinearFit {
        a,
        b,
        se_a: (s2 * (1.0 / nf + mx * mx / sxx)).sqrt(),
        se_b: (s2 / sxx).sqrt(),
        cov_ab: -mx * s2 / sxx,
        r2: if sst > 0.0 { 1.0 - sse / sst } else { 1.0 },
        n: n as u32,
    })
}

/// Where line `rising` crosses above line `other`: x* = (a_o - a_r) / (b_r - b_o), with its
/// standard error from the two fits' errors (independent fits, delta method). `None` when the
/// lines are parallel.
pub fn crossing(rising: &LinearFit, other: &LinearFit) -> Option<(f64, f64)> {
    let da = rising.a - other.a;
    let db = rising.b - other.b;
    if db == 0.0 {
        return None;
    }
    let x = -da / db;
    let var_da = rising.se_a.powi(2) + other.se_a.powi(2);
    let var_db = rising.se_b.powi(2) + other.se_b.powi(2);
    let cov = rising.cov_ab + other.cov_ab;
    let var = var_da / db.powi(2) + da.powi(2) / db.powi(4) * var_db - 2.0 * da / db.powi(3) * cov;
    Some((x, var.max(0.0).sqrt()))
}

#[cfg(test)]
mod fit_tests {
    use super::*;

    #[test]
    fn exact_line_is_recovered() {
        let x: Vec<f64> = (0..10).map(|i| i as f64 * 512.0).collect();
        let y: Vec<f64> = x.iter().map(|v| 0.5 + 2e-4 * v).collect();
        let f = linear_fit(&x, &y).unwrap();
        assert!((f.a - 0.5).abs() < 1e-12 && (f.b - 2e-4).abs() < 1e-15);
        assert!((f.r2 - 1.0).abs() < 1e-12);
        assert!(f.se_b < 1e-12);
    }

    #[test]
    fn noisy_line_by_hand() {
        // x = 0, 1, 2, 3; y = 1, 3, 2, 4: mean x 1.5, mean y 2.5, Sxx 5, Sxy 4 -> b = 0.8,
        // a = 1.3; residuals -0.3, 0.9, -0.9, 0.3 -> SSE 1.8, SST 5 -> R2 0.64;
        // s2 = 0.9, se_b = sqrt(0.9 / 5), se_a = sqrt(0.9 (1/4 + 2.25/5)), cov = -1.5 * 0.9 / 5
        let f = linear_fit(&[0.0, 1.0, 2.0, 3.0], &[1.0, 3.0, 2.0, 4.0]).unwrap();
        assert!((f.b - 0.8).abs() < 1e-12 && (f.a - 1.3).abs() < 1e-12);
        assert!((f.r2 - 0.64).abs() < 1e-12);
        assert!((f.se_b - (0.9f64 / 5.0).sqrt()).abs() < 1e-12);
        assert!((f.se_a - (0.9f64 * (0.25 + 2.25 / 5.0)).sqrt()).abs() < 1e-12);
        assert!((f.cov_ab + 1.5 * 0.9 / 5.0).abs() < 1e-12);
    }

    #[test]
    fn crossing_of_known_lines() {
        // attention 0.1 + 3e-4 L overtakes a flat 4.3: L* = 4.2 / 3e-4 = 14000
        let x: Vec<f64> = (0..33).map(|i| i as f64 * 512.0).collect();
        let attn = linear_fit(&x, &x.iter().map(|v| 0.1 + 3e-4 * v).collect::<Vec<_>>()).unwrap();
        let ffn = linear_fit(&x, &vec![4.3; x.len()]).unwrap();
        let (at, sigma) = crossing(&attn, &ffn).unwrap();
        assert!((at - 14_000.0).abs() < 1e-6, "{at}");
        assert!(sigma < 1e-6);
        assert!(crossing(&ffn, &ffn).is_none());
        assert!(matches!(
            linear_fit(&[1.0], &[1.0]),
            Err(FitError::TooFew(1))
        ));
        assert!(matches!(
            linear_fit(&[1.0, 1.0], &[1.0, 2.0]),
            Err(FitError::TooFew(2))
        ));
    }

    #[test]
    fn crossing_error_grows_with_noise() {
        let x: Vec<f64> = (0..20).map(|i| i as f64 * 512.0).collect();
        let wobble = |i: usize| if i.is_multiple_of(2) { 0.05 } else { -0.05 };
        let attn: Vec<f64> = x
            .iter()
            .enumerate()
            .map(|(i, v)| 0.1 + 3e-4 * v + wobble(i))
            .collect();
        let ffn: Vec<f64> = x.iter().enumerate().map(|(i, _)| 4.3 - wobble(i)).collect();
        let (at, sigma) = crossing(
            &linear_fit(&x, &attn).unwrap(),
            &linear_fit(&x, &ffn).unwrap(),
        )
        .unwrap();
        assert!((at - 14_000.0).abs() < 500.0, "{at}");
        assert!(sigma > 1.0 && sigma < 1000.0, "{sigma}");
    }
}
