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
    pub median: f64,
    pub min: f64,
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

/// Median of values known to be finite and non-empty, for internal use; `None` otherwise.
pub fn median(values: &[f64]) -> Option<f64> {
    Sample::new(values).ok().map(|s| s.median())
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
