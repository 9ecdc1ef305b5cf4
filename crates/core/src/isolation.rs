//! What isolating each node cost in a TIMED run, taken out of its node times: the engine's
//! calibration node by node, then the remainder the calibration did not explain, equally from
//! every working node, so the times that are left sum to the FUSED wall.
//!
//! Why equally: isolating a node costs a synchronisation and, after a node that ran on one
//! thread, a wake-up of the pool, per node and not in proportion to the node's work. A decode
//! step's nodes do a few microseconds of work each, so what the calibration misses is of the
//! same size as the work; split in proportion to the node times (a share of the TIMED sum x the
//! FUSED wall) it would go to the bands with many nodes and grow with the wall as attention
//! grows with depth, making flat bands look as if they grew. The calibrated agreement (the
//! calibrated times against the wall) stays the check of how much was left unexplained.
//!
//! Decode runs only: a prefill chunk's nodes are large beside their isolation, and what sets
//! its TIMED sum apart from the FUSED wall (caches, barriers inside the ops) grows with the
//! work, which a share of the TIMED sum x the wall apportions.

/// TIMED node times with the isolation removed.
#[derive(Debug, Clone, PartialEq)]
pub struct Removed {
    /// Per node: its TIMED time less its calibrated isolation and the remainder; 0 for a node
    /// that does no work (it holds nothing but isolation).
    pub times_us: Vec<f64>,
    /// The sum after removing only the calibration (its ratio to the wall is the calibrated
    /// agreement).
    pub calibrated_sum_us: f64,
    /// The remainder taken from every working node, µs per node (negative: the calibration
    /// took too much, and this is given back).
    pub remainder_us: f64,
    /// Per node: a working node whose TIMED time was below what the calibration or the
    /// remainder took from it, so that it was stopped at 0 there. Its time is a lower bound: the
    /// node did work that the corrected figures do not show.
    pub clamped: Vec<bool>,
}

/// Removes the isolation from one TIMED run's node times: `calibrated_us(i)` is what isolating
/// node `i` cost by the engine's calibration (over the whole run: per step x steps), `working`
/// marks the nodes that do work, `wall_us` is the FUSED wall of the same work. Without working
/// nodes, or without a wall, only the calibration is removed.
pub fn remove_isolation(
    node_us: &[f64],
    working: &[bool],
    calibrated_us: &dyn Fn(usize) -> f64,
    wall_us: f64,
) -> Removed {
    // each node's calibration asked once (a summary calls this per cycle over every node)
    let cal: Vec<f64> = (0..node_us.len()).map(calibrated_us).collect();
    let calibrated: Vec<f64> = node_us
        .iter()
        .zip(&cal)
        .zip(working)
        .map(|((&v, &k), &w)| if w { (v - k).max(0.0) } else { 0.0 })
        .collect();
    let calibrated_sum_us: f64 = calibrated.iter().sum();
    let n_working = working.iter().filter(|&&w| w).count();
    let has_wall = wall_us.is_finite() && wall_us > 0.0;
    let calibration_clamped: Vec<bool> = node_us
        .iter()
        .zip(&cal)
        .zip(working)
        .map(|((&v, &k), &w)| w && v < k)
        .collect();
    if n_working == 0 || !has_wall || !calibrated_sum_us.is_finite() {
        return Removed {
            times_us: calibrated,
            calibrated_sum_us,
            remainder_us: 0.0,
            clamped: calibration_clamped,
        };
    }
    let left = |r: f64| -> f64 {
        calibrated
            .iter()
            .zip(working)
            .filter(|(_, &w)| w)
            .map(|(&c, _)| (c - r).max(0.0))
            .sum()
    };
    let remainder_us = if calibrated_sum_us <= wall_us {
        // every node gets the same back: nothing is clamped
        (calibrated_sum_us - wall_us) / n_working as f64
    } else {
        // the r in 0..max(c) where the working nodes' max(c - r, 0) sum to the wall: left(r)
        // falls monotonically from the calibrated sum at 0 to 0 at the largest node
        let (mut lo, mut hi) = (0.0, calibrated.iter().cloned().fold(0.0, f64::max));
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if left(mid) > wall_us {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    };
    Removed {
        times_us: calibrated
            .iter()
            .zip(working)
            .map(|(&c, &w)| if w { (c - remainder_us).max(0.0) } else { 0.0 })
            .collect(),
        calibrated_sum_us,
        remainder_us,
        clamped: calibrated
            .iter()
            .zip(working)
            .zip(&calibration_clamped)
            .map(|((&c, &w), &k)| k || (w && c < remainder_us))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6 * b.abs().max(1.0)
    }

    #[test]
    fn a_remainder_per_node_leaves_every_node_s_work() {
        // three working nodes of 10, 20 and 30 µs of work and a view; each paid 5 µs calibrated
        // and 2 µs more the calibration missed: the wall is the 60 µs of work
        let node_us = [17.0, 27.0, 37.0, 3.0];
        let working = [true, true, true, false];
        let r = remove_isolation(&node_us, &working, &|_| 5.0, 60.0);
        assert!(close(r.calibrated_sum_us, 66.0));
        assert!(close(r.remainder_us, 2.0), "{r:?}");
        for (got, want) in r.times_us.iter().zip([10.0, 20.0, 30.0, 0.0]) {
            assert!(close(*got, want), "{r:?}");
        }
    }

    #[test]
    fn a_node_smaller_than_the_remainder_stops_at_zero() {
        // 1 µs and 100 µs left after the calibration, a wall of 91: taking 5 from each would
        // leave -4; the small node stops at 0 and the large one gives 9
        let r = remove_isolation(&[1.0, 100.0], &[true, true], &|_| 0.0, 91.0);
        assert!(close(r.remainder_us, 9.0), "{r:?}");
        assert!(
            close(r.times_us[0], 0.0) && close(r.times_us[1], 91.0),
            "{r:?}"
        );
        // the small node is marked: its 0 hides the work it did
        assert_eq!(r.clamped, [true, false]);
    }

    #[test]
    fn a_node_below_its_calibration_is_marked_clamped() {
        // 3 µs TIMED against 5 µs calibrated: 0 left, marked; the other keeps 25 of 30
        let r = remove_isolation(&[3.0, 30.0, 1.0], &[true, true, false], &|_| 5.0, 0.0);
        assert_eq!(r.times_us, [0.0, 25.0, 0.0]);
        assert_eq!(r.clamped, [true, false, false]);
        // the same with a wall: clamped by the calibration stays marked
        let r = remove_isolation(&[3.0, 30.0, 1.0], &[true, true, false], &|_| 5.0, 25.0);
        assert_eq!(r.clamped, [true, false, false]);
    }

    #[test]
    fn a_calibration_that_took_too_much_gives_it_back_equally() {
        let r = remove_isolation(&[10.0, 30.0], &[true, true], &|i| [4.0, 4.0][i], 40.0);
        assert!(close(r.calibrated_sum_us, 32.0));
        assert!(close(r.remainder_us, -4.0));
        assert!(close(r.times_us[0], 10.0) && close(r.times_us[1], 30.0));
        assert_eq!(r.clamped, [false, false]);
    }

    #[test]
    fn without_a_wall_only_the_calibration_is_removed() {
        let r = remove_isolation(&[10.0, 30.0], &[true, false], &|_| 4.0, 0.0);
        assert_eq!(r.times_us, [6.0, 0.0]);
        assert_eq!(r.remainder_us, 0.0);
    }
}
