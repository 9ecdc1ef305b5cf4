//! In-graph replay and the isolation calibration of the worker engine: what to replay and
//! calibrate is decided here; the worker dispatches the clones and times the calibration graph
//! (PROTOCOL.md, `replay` and `calibrate`), and the figures are computed here and in
//! `opledger_core` (`calibration::isolation_from`, one copy for every engine).

use serde_json::json;

use opledger_core::calibration::{isolation_from, CalibrationRound, Dispatch};
use opledger_core::engine::{ChunkTiming, EngineError, IsolationCalibration, Mode, ReplayEngine};
use opledger_core::split::Slot;

use super::{rows_hash, Captured, WorkerEngine, CALIBRATION_ROUNDS, CLONES_PER_ROUND};
use crate::protocol::{Calibrated, Replayed};

/// The observed nodes a mask over the reported graph marks (transfers between devices are
/// copies the scheduler makes, not nodes: never cut at or replayed).
fn marked(slots: &[Slot], mask: &[bool]) -> Vec<u32> {
    slots
        .iter()
        .zip(mask)
        .filter_map(|(s, &m)| match s {
            Slot::Node(i) if m => Some(*i as u32),
            _ => None,
        })
        .collect()
}

impl WorkerEngine {
    /// A replay run (see [`ReplayEngine::replay`]); with `launches`, every marked node
    /// dispatches `k` rounds of one trivial clone instead of `k` clones.
    fn replay_run(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        k: u32,
        launches: bool,
    ) -> Result<ChunkTiming, EngineError> {
        let work = self
            .work
            .clone()
            .ok_or_else(|| EngineError::Failed("replay() before prepare()".into()))?;
        if work.is_decode() {
            return Err(EngineError::Unsupported {
                what: "replay of decode runs".into(),
                why: "replay measures one prefill chunk".into(),
            });
        }
        let g = self
            .graph
            .clone()
            .ok_or_else(|| EngineError::Failed("replay() before graph()".into()))?;
        let cut = marked(&g.slots, cut);
        let replay = marked(&g.slots, replay);
        self.restore("observed")?;
        let chunk = std::mem::take(&mut self.chunk);
        let r: Result<Replayed, EngineError> = self.req(
            "replay",
            json!({"ctx": "observed", "tokens": chunk, "pos0": work.depth_tokens,
                   "all_logits": work.all_logits, "cut": cut, "replay": replay, "k": k,
                   "launches": launches}),
        );
        self.chunk = chunk;
        self.last_mode = Some(Mode::FusedObserved);
        let r = r?;
        self.last_replay = Some((r.replayed, r.skipped, r.failed));
        if r.non_finite > 0 {
            return Err(EngineError::NonFiniteOutputs {
                what: "the replay run".into(),
                non_finite: r.non_finite,
                values: r.values,
            });
        }
        if r.nodes_seen as usize != g.ops.len() {
            return Err(self.graph_changed(EngineError::GraphChanged(format!(
                "the replay run asked about {} nodes, the captured graph has {}",
                r.nodes_seen,
                g.ops.len()
            ))));
        }
        if r.skipped > 0 || r.failed > 0 {
            return Err(EngineError::Failed(format!(
                "{} node(s) could not be replayed and {} replay(s) failed to compute: the run's \
                 timing would undercount ({})",
                r.skipped,
                r.failed,
                r.problem.as_deref().unwrap_or("the worker gave no reason")
            )));
        }
        let expected = k as u64 * replay.len() as u64;
        if r.replayed as u64 != expected {
            return Err(EngineError::Worker(format!(
                "the llama.cpp worker {}: {} {} over {} replayed nodes were asked for, it computed {}",
                self.cfg.worker.display(),
                k,
                if launches { "launch rounds" } else { "clones" },
                replay.len(),
                r.replayed
            )));
        }
        Ok(ChunkTiming {
            device: None,
            wall_ms: r.wall_ns as f64 / 1e6,
            node_us: Vec::new(),
            nodes_seen: r.nodes_seen,
            output_hash: rows_hash(&r.row_hashes, work.all_logits),
        })
    }

    /// The calibration graph's raw rounds from the worker, dispatched as `pattern`.
    fn calibration_rounds(
        &mut self,
        pattern: &[Dispatch],
    ) -> Result<Vec<CalibrationRound>, EngineError> {
        let codes: Vec<u8> = pattern
            .iter()
            .map(|d| match d {
                Dispatch::Idle => 0,
                Dispatch::OneThread => 1,
                Dispatch::AllThreads => 2,
            })
            .collect();
        let c: Calibrated = self.req(
            "calibrate",
            json!({"pattern": codes, "rounds": CALIBRATION_ROUNDS}),
        )?;
        if c.timed_ns.len() != CALIBRATION_ROUNDS as usize
            || c.fused_ns.len() != CALIBRATION_ROUNDS as usize
            || c.timed_ns.iter().any(|r| r.len() != pattern.len())
        {
            return Err(EngineError::Worker(format!(
                "the llama.cpp worker {}: a calibration of {} rounds of {} nodes answered {} TIMED rounds of {:?} nodes and {} FUSED walls",
                self.cfg.worker.display(),
                CALIBRATION_ROUNDS,
                pattern.len(),
                c.timed_ns.len(),
                c.timed_ns.iter().map(Vec::len).collect::<Vec<_>>(),
                c.fused_ns.len()
            )));
        }
        Ok(c.timed_ns
            .iter()
            .zip(&c.fused_ns)
            .map(|(t, &f)| CalibrationRound {
                timed_us: t.iter().map(|&ns| ns as f64 / 1e3).collect(),
                fused_us: f as f64 / 1e3,
            })
            .collect())
    }

    /// The isolation cost of `graph`'s nodes (the prepared work's, or the sweep's decode
    /// step): the calibration graph dispatched as the graph's nodes are, node for node, computed
    /// by the worker on its thread pool, for a graph computed on the CPU alone. A graph with
    /// nodes on another device (a GPU, an RPC server) is left to the estimate from each
    /// device's own idle nodes in the TIMED runs (`None`: the profile's summary takes it, the
    /// CPU's included, as it always has for the worker): the calibration graph runs on the CPU
    /// and says nothing of another device's launches, and the summary takes either a
    /// calibration or the devices' estimate, not both. No graph captured yet: the average of
    /// 64 working nodes, for every node.
    pub(super) fn calibrate_graph(
        &mut self,
        graph: Option<Captured>,
    ) -> Result<Option<IsolationCalibration>, EngineError> {
        let pattern = match &graph {
            Some(g) if g.split() || g.on_cpu.iter().any(|&c| !c) => return Ok(None),
            Some(g) => g.dispatch.clone(),
            None => Vec::new(),
        };
        let node_by_node = pattern.iter().any(|&d| d != Dispatch::Idle);
        let pattern = if node_by_node {
            pattern
        } else {
            vec![Dispatch::AllThreads; 64]
        };
        let working: Vec<bool> = pattern.iter().map(|&d| d != Dispatch::Idle).collect();
        let rounds = self.calibration_rounds(&pattern)?;
        let (_, _, each) = isolation_from(&rounds, &working);
        let n_working = working.iter().filter(|&&w| w).count().max(1) as f64;
        Ok(Some(IsolationCalibration {
            per_node_us: each.iter().sum::<f64>() / n_working,
            each_node_us: if node_by_node && graph.is_some() {
                each
            } else {
                Vec::new()
            },
        }))
    }
}

impl WorkerEngine {
    /// The last replay run's counts as the worker answered them: clones (or launch rounds)
    /// computed, nodes skipped, rounds failed.
    pub fn last_replay_counts(&self) -> Option<(u32, u32, u32)> {
        self.last_replay
    }
}

impl ReplayEngine for WorkerEngine {
    fn replay(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        k: u32,
    ) -> Result<ChunkTiming, EngineError> {
        self.replay_run(cut, replay, k, false)
    }

    fn replay_rounds(&self, k: u32) -> u32 {
        k.div_ceil(CLONES_PER_ROUND)
    }

    fn replay_launches(
        &mut self,
        cut: &[bool],
        replay: &[bool],
        rounds: u32,
    ) -> Result<ChunkTiming, EngineError> {
        self.replay_run(cut, replay, rounds, true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_name_observed_nodes_and_never_a_transfer() {
        let slots = [
            Slot::Node(0),
            Slot::TransferBefore(1),
            Slot::Node(1),
            Slot::Node(2),
            Slot::Output,
        ];
        assert_eq!(marked(&slots, &[true, true, false, true, true]), [0, 2]);
        assert_eq!(marked(&slots, &[false; 5]), Vec::<u32>::new());
    }
}
