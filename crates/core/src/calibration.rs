//! The isolation calibration's arithmetic, engine-agnostic: how each captured node is
//! dispatched (the calibration graph mirrors it node for node), and the isolation cost of each
//! node from the calibration's raw rounds. The engines measure the rounds (the llama.cpp
//! worker through its `calibrate` request); this module turns them into figures.

use crate::node::NodeInfo;

/// How ggml's CPU backend dispatches a node: what the calibration graph mirrors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dispatch {
    /// No work: a view, or a node the backend skips (computed on one thread, if at all).
    Idle,
    /// Work on one thread (ops ggml does not split: SUM_ROWS, GET_ROWS, SIGMOID, ...).
    OneThread,
    /// Work split over every thread of the pool.
    AllThreads,
}

/// How each captured node is dispatched, from the node (views and skipped nodes do no work) and
/// whether ggml's CPU plan of the node alone splits it over the pool's threads (`all_threads`,
/// in graph order; a node past its end counts as split, as most working nodes are).
pub fn dispatch_of(nodes: &[NodeInfo], all_threads: &[bool]) -> Vec<Dispatch> {
    nodes
        .iter()
        .zip(all_threads.iter().chain(std::iter::repeat(&true)))
        .map(|(n, &all)| {
            if !n.is_working() {
                Dispatch::Idle
            } else if all {
                Dispatch::AllThreads
            } else {
                Dispatch::OneThread
            }
        })
        .collect()
}

/// One timed round of the calibration: the TIMED µs of every node in graph order, and the
/// FUSED µs of the whole graph.
#[derive(Debug, Clone, PartialEq)]
pub struct CalibrationRound {
    pub timed_us: Vec<f64>,
    pub fused_us: f64,
}

/// The isolation cost from the calibration's rounds (pure). `working[i]`: node i does work.
/// Returns (mean TIMED working node, FUSED µs per working node, each node's isolation): a
/// node's isolation is the mean over rounds of its TIMED time less the FUSED share of a working
/// node (the median over rounds of FUSED graph / working nodes), at least 0, and 0 for a node
/// without work. Means over rounds, not medians: whether a node must wake the pool varies from
/// round to round, and the correction must remove what it costs on average.
pub fn isolation_from(rounds: &[CalibrationRound], working: &[bool]) -> (f64, f64, Vec<f64>) {
    let n_working = working.iter().filter(|&&w| w).count().max(1) as f64;
    let n_rounds = rounds.len().max(1) as f64;
    let mut fused: Vec<f64> = rounds.iter().map(|r| r.fused_us / n_working).collect();
    fused.sort_by(f64::total_cmp);
    let fused_share = match fused.len() {
        0 => 0.0,
        n if n % 2 == 1 => fused[n / 2],
        n => (fused[n / 2 - 1] + fused[n / 2]) / 2.0,
    };
    let mean_timed: Vec<f64> = (0..working.len())
        .map(|i| {
            rounds
                .iter()
                .map(|r| r.timed_us.get(i).copied().unwrap_or(0.0))
                .sum::<f64>()
                / n_rounds
        })
        .collect();
    let timed_working = mean_timed
        .iter()
        .zip(working)
        .filter(|(_, &w)| w)
        .map(|(t, _)| t)
        .sum::<f64>()
        / n_working;
    let each = mean_timed
        .iter()
        .zip(working)
        .map(|(t, &w)| if w { (t - fused_share).max(0.0) } else { 0.0 })
        .collect();
    (timed_working, fused_share, each)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_node_pays_its_own_mean_timed_time_less_a_working_node_s_fused_share() {
        let round = |timed: &[f64], fused: f64| CalibrationRound {
            timed_us: timed.to_vec(),
            fused_us: fused,
        };
        // a view, then 3 working nodes, the second after a one-thread node waking the pool in
        // two rounds of three; FUSED graphs of 6, 9, 7.5 µs: 2, 3, 2.5 a working node (median
        // 2.5)
        let working = [false, true, true, true];
        let rounds = [
            round(&[12.0, 3.0, 21.5, 3.5], 6.0),
            round(&[12.0, 3.5, 3.5, 3.5], 9.0),
            round(&[12.0, 3.5, 21.5, 2.0], 7.5),
        ];
        let (timed, fused, each) = isolation_from(&rounds, &working);
        assert_eq!(fused, 2.5);
        // means over rounds: 3.333.., 15.5, 3 -> less 2.5; the view costs nothing to correct
        let want = [0.0, 10.0 / 3.0 - 2.5, 13.0, 0.5];
        for (e, w) in each.iter().zip(want) {
            assert!((e - w).abs() < 1e-12, "{each:?}");
        }
        assert!((timed - (10.0 / 3.0 + 15.5 + 3.0) / 3.0).abs() < 1e-12);
        // a TIMED node cheaper than its fused share costs nothing to isolate, never less
        assert_eq!(isolation_from(&[round(&[1.0], 40.0)], &[true]).2, vec![0.0]);
    }

    #[test]
    fn views_and_skipped_nodes_are_idle_and_the_plan_says_one_thread_or_all() {
        let node = |op: &str, is_view: bool, skipped: bool| NodeInfo {
            index: 0,
            op: op.into(),
            name: "n".into(),
            layer: None,
            out: crate::node::TensorDesc {
                name: "n".into(),
                ne: [1, 1, 1, 1],
                ggml_type: "f32".into(),
                size_bytes: 4,
                is_weight: false,
                producer: None,
                nb: [4, 4, 4, 4],
            },
            srcs: Vec::new(),
            is_view,
            inplace: false,
            skipped,
            op_code: None,
            op_params: Vec::new(),
            device: None,
        };
        let nodes = [
            node("VIEW", true, false),
            node("SUM_ROWS", false, false),
            node("MUL_MAT", false, false),
            node("GET_ROWS", false, true),
            node("ADD", false, false),
        ];
        // the last node has no plan: split, as most working nodes are
        assert_eq!(
            dispatch_of(&nodes, &[false, false, true, false]),
            [
                Dispatch::Idle,
                Dispatch::OneThread,
                Dispatch::AllThreads,
                Dispatch::Idle,
                Dispatch::AllThreads
            ]
        );
    }
}
