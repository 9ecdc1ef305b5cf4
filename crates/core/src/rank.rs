//! The Mann-Whitney rank test of two samples (the regression gate's test on cycles): does A rank
//! above B beyond chance? Exact for the sample sizes of profiles (the null distribution of U
//! from the Gaussian binomial coefficient), the normal approximation with the tie correction
//! for large ones (imported traces of thousands of steps). No crate of the field carries the
//! test (statrs has the distributions, not rank tests); `libm` gives `erfc`.

/// Above this many pairs (n x m) the normal approximation replaces the exact distribution
/// (n = m = 200: the exact one costs n x n x m = 8e6 steps).
const EXACT_PAIRS: usize = 40_000;

/// U of A against B: the pairs (a, b) with a > b, ties counting one half.
pub fn u_statistic(a: &[f64], b: &[f64]) -> f64 {
    let mut u = 0.0;
    for x in a {
        for y in b {
            if x > y {
                u += 1.0;
            } else if x == y {
                u += 0.5;
            }
        }
    }
    u
}

/// How many of the C(n + m, n) orderings of n values of A among m of B (no ties) give each U,
/// U = 0 ..= n x m: the coefficients of the Gaussian binomial [n + m choose n]_q, built as
/// the product over i = 1..=n of (1 - q^(m + i)) / (1 - q^i). Coefficients at the low end are
/// small integers and exact; the distribution is symmetric (U and n m - U are equally likely).
fn u_counts(n: usize, m: usize) -> Vec<f64> {
    let deg = n * m;
    let mut c = vec![0.0; deg + n + 1];
    c[0] = 1.0;
    let mut top = 0;
    for i in 1..=n {
        // times (1 - q^(m + i))
        let k = m + i;
        for j in (k..=top + k).rev() {
            c[j] -= c[j - k];
        }
        top += k;
        // divided by (1 - q^i): d[j] = c[j] + d[j - i]
        for j in i..=top {
            c[j] += c[j - i];
        }
        top -= i;
        // the division is exact: what lies above the degree is rounding, not count
        c[top + 1..].iter_mut().for_each(|x| *x = 0.0);
    }
    c.truncate(deg + 1);
    c
}

/// C(n + m, n) as a float.
fn orderings(n: usize, m: usize) -> f64 {
    (1..=n).fold(1.0, |acc, i| acc * (m + i) as f64 / i as f64)
}

/// The smallest one-sided p-value the exact test can give with n values against m: every A
/// above every B, 1 / C(n + m, n).
pub fn smallest_p(n: usize, m: usize) -> f64 {
    if n == 0 || m == 0 {
        1.0
    } else {
        1.0 / orderings(n, m)
    }
}

/// One-sided p-value of "A ranks above B": the chance, when both come from one distribution,
/// of a U of A against B at least this large. 1 when either sample is empty.
pub fn p_greater(a: &[f64], b: &[f64]) -> f64 {
    let (n, m) = (a.len(), b.len());
    if n == 0 || m == 0 {
        return 1.0;
    }
    let u = u_statistic(a, b);
    let nm = (n * m) as f64;
    if n * m <= EXACT_PAIRS {
        // P(U >= u) = P(U <= nm - u) by symmetry: summed from the exact low end; a tie's half
        // rounds toward the larger p-value
        let counts = u_counts(n.min(m), n.max(m));
        let last = (nm - u).ceil() as usize;
        let below: f64 = counts[..=last.min(counts.len() - 1)].iter().sum();
        return (below / orderings(n, m)).min(1.0);
    }
    // normal approximation with the tie correction and a continuity correction
    let mut all: Vec<f64> = a.iter().chain(b).copied().collect();
    all.sort_by(f64::total_cmp);
    let mut ties = 0.0;
    let mut i = 0;
    while i < all.len() {
        let mut j = i + 1;
        while j < all.len() && all[j] == all[i] {
            j += 1;
        }
        let t = (j - i) as f64;
        ties += t * t * t - t;
        i = j;
    }
    let total = (n + m) as f64;
    let var = nm / 12.0 * ((total + 1.0) - ties / (total * (total - 1.0)));
    if var <= 0.0 {
        return 1.0;
    }
    let z = (u - nm / 2.0 - 0.5) / var.sqrt();
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn u_and_its_exact_distribution_by_hand() {
        // n = m = 2: the 6 orderings give U = 0, 1, 2, 2, 3, 4
        assert_eq!(u_counts(2, 2), [1.0, 1.0, 2.0, 1.0, 1.0]);
        // n = 1: U is uniform on 0..=m
        assert_eq!(u_counts(1, 3), [1.0; 4]);
        assert_eq!(u_counts(3, 3).iter().sum::<f64>(), 20.0);
        assert_eq!(u_statistic(&[3.0, 5.0], &[4.0, 1.0]), 3.0);
        assert_eq!(u_statistic(&[2.0], &[2.0, 1.0]), 1.5);
        // U = 3 of 4: P(U >= 3) = 2 / 6
        assert!((p_greater(&[3.0, 5.0], &[4.0, 1.0]) - 2.0 / 6.0).abs() < 1e-12);
        // every A above every B: 1 / C(6, 3) = 0.05, and 1 / C(10, 5) = 1 / 252
        assert!((p_greater(&[4.0, 5.0, 6.0], &[1.0, 2.0, 3.0]) - 0.05).abs() < 1e-12);
        assert!((smallest_p(5, 5) - 1.0 / 252.0).abs() < 1e-15);
        assert!((smallest_p(2, 3) - 0.1).abs() < 1e-15);
        // every A below every B: p = 1
        assert_eq!(p_greater(&[1.0, 2.0], &[3.0, 4.0]), 1.0);
        assert_eq!(p_greater(&[], &[1.0]), 1.0);
    }

    #[test]
    fn the_normal_approximation_agrees_with_the_exact_distribution() {
        // 150 x 150 pairs: exact; the same data shifted past EXACT_PAIRS would use the normal
        // form, so compare the two forms on one U directly
        let a: Vec<f64> = (0..150).map(|i| i as f64 + 0.3).collect();
        let b: Vec<f64> = (0..150).map(|i| i as f64 * 0.97 + 1.1).collect();
        let exact = p_greater(&a, &b);
        let u = u_statistic(&a, &b);
        let nm = 150.0 * 150.0;
        let z = (u - nm / 2.0 - 0.5) / (nm / 12.0 * 301.0).sqrt();
        let normal = 0.5 * libm::erfc(z / std::f64::consts::SQRT_2);
        assert!((exact - normal).abs() < 0.005, "{exact} {normal}");
        assert!(exact > 0.001 && exact < 0.999, "{exact}");
        // a large sample goes through the approximation: a clear shift is tiny, none is 1/2
        let big_a: Vec<f64> = (0..300).map(|i| (i % 17) as f64 + 5.0).collect();
        let big_b: Vec<f64> = (0..300).map(|i| (i % 17) as f64).collect();
        assert!(p_greater(&big_a, &big_b) < 1e-6);
        let p = p_greater(&big_b, &big_b);
        assert!((p - 0.5).abs() < 0.02, "{p}");
    }
}
