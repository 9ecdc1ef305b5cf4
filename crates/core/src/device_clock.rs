//! The device's own clock beside the host's, for a measured profile on a device other than the
//! CPU. The host clock times a TIMED node from the scheduler's ask to its observe call: the
//! launch, the device's work and the wait for it. On a GPU that overstates small kernels (a HIP
//! study that timed every op from device timestamps found host-side timing 1.7-3x too high), so
//! each band's host figure is set beside the device's own figure for the same nodes, with their
//! ratio.
//!
//! Where the figures come from (the backend's own timestamps, read by the engine):
//! - Vulkan: ggml-vulkan's perf logger (`GGML_VK_PERF_LOGGER=1`) writes a timestamp query
//!   before and after every op it dispatches and, after every graph it computes, prints one
//!   line per op kind to stderr (`MUL_MAT_VEC q8_0 m=2048 n=1 k=256: 1 x 1673.18 us = 1673.18
//!   us (0.63 GFLOPS/s)`), the time in the device's timestamp period. The worker marks the
//!   bounds of each run and, in TIMED, the end of every node on the same stream
//!   ([`MARK`]); [`parse_run`] reads a run's lines. In TIMED every node is a graph of its own,
//!   so each node's lines are its own time; in FUSED a graph's lines are per op kind, summed.
//! - CUDA (a design, not built: no GPU here): CUPTI activity records of kernels, each kernel
//!   belonging to the node whose callbacks enclose its launch (PROTOCOL.md "The device's
//!   clock"); the same [`DeviceTiming`] carries them.
//!
//! Attribution: TIMED, node by node. FUSED, per op kind: a kind's device time is shared among
//! the bands whose nodes showed that kind in the TIMED runs of the same profile, in proportion to
//! their TIMED device time (a kind that only FUSED shows, ggml-vulkan's fused ops such as
//! `RMS_NORM_MUL RMS_NORM(...)`, is read as the kind after its fusion prefix: the first node of
//! the fusion; a kind found in no TIMED run is stated as unattributed, never dropped).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::band::Assignment;
use crate::node::NodeInfo;
use crate::stats::{Sample, Spread};

/// The prefix of the worker's marker lines on the stream the device clock prints to:
/// `opledger-device-clock begin <request id>`, `opledger-device-clock node <k>` (TIMED: node k
/// of the observed graph was observed: the lines since the previous marker are its own),
/// `opledger-device-clock end <request id>`.
pub const MARK: &str = "opledger-device-clock";

/// What the device clock is, as the summary names it.
pub const VULKAN_SOURCE: &str =
    "ggml-vulkan's perf logger (GGML_VK_PERF_LOGGER): the device's timestamp queries around every op";

/// One run's figures on the device's clock.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DeviceTiming {
    /// TIMED: per position of the graph (a graph over several devices: with its transfers), the
    /// device's time of that node in µs, `None` where the device timed nothing (a node on the
    /// CPU, a view, a transfer). Empty for a FUSED run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_us: Vec<Option<f64>>,
    /// TIMED: the device clock's name of each position's op kind (as `node_us`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub node_kind: Vec<Option<String>>,
    /// Per op kind, the device µs of the whole run (every mode).
    pub kinds: BTreeMap<String, f64>,
    /// Device µs the run's lines gave no node (TIMED: after the last node's marker).
    #[serde(default)]
    pub unattributed_us: f64,
}

impl DeviceTiming {
    /// The device µs of the whole run.
    pub fn total_us(&self) -> f64 {
        self.kinds.values().sum()
    }

    /// Adds another run of the same graph (the steps of one decode run): node by node and kind
    /// by kind.
    pub fn add(&mut self, other: &DeviceTiming) {
        if self.node_us.is_empty() {
            self.node_us = other.node_us.clone();
            self.node_kind = other.node_kind.clone();
        } else {
            for (a, b) in self.node_us.iter_mut().zip(&other.node_us) {
                *a = match (*a, *b) {
                    (Some(x), Some(y)) => Some(x + y),
                    (x, None) => x,
                    (None, y) => y,
                };
            }
            for (a, b) in self.node_kind.iter_mut().zip(&other.node_kind) {
                if a.is_none() {
                    a.clone_from(b);
                }
            }
        }
        for (k, v) in &other.kinds {
            *self.kinds.entry(k.clone()).or_insert(0.0) += v;
        }
        self.unattributed_us += other.unattributed_us;
    }

    /// Node times of the observed graph placed at the graph's positions (`at[p]`: the observed
    /// node at position p, `None` for a transfer or the outputs read back).
    pub fn placed(mut self, at: &[Option<usize>]) -> DeviceTiming {
        let us = std::mem::take(&mut self.node_us);
        let kind = std::mem::take(&mut self.node_kind);
        self.node_us = at
            .iter()
            .map(|p| p.and_then(|i| us.get(i).copied().flatten()))
            .collect();
        self.node_kind = at
            .iter()
            .map(|p| p.and_then(|i| kind.get(i).cloned().flatten()))
            .collect();
        self
    }
}

/// One line of ggml-vulkan's perf logger: an op kind, how many times it ran in the graph and
/// their device time in µs.
#[derive(Debug, Clone, PartialEq)]
pub struct PerfLine {
    pub kind: String,
    pub count: u64,
    pub total_us: f64,
}

/// Reads `KIND: COUNT x AVG us = TOTAL us` with an optional ` (G GFLOPS/s)` after it; `None`
/// for any other line (the table's header, `Total time: ...`, another log line).
pub fn parse_perf_line(line: &str) -> Option<PerfLine> {
    let l = line.trim_end();
    let l = match l.rfind(" (") {
        Some(i) if l.ends_with(" GFLOPS/s)") => &l[..i],
        _ => l,
    };
    let l = l.strip_suffix(" us")?;
    let (left, total) = l.rsplit_once(" us = ")?;
    let total_us: f64 = total.trim().parse().ok()?;
    let (left, avg) = left.rsplit_once(" x ")?;
    let _: f64 = avg.trim().parse().ok()?;
    let (kind, count) = left.rsplit_once(": ")?;
    let count: u64 = count.trim().parse().ok()?;
    if kind.is_empty() || !total_us.is_finite() || total_us < 0.0 {
        return None;
    }
    Some(PerfLine {
        kind: kind.to_string(),
        count,
        total_us,
    })
}

/// One run's lines (between the worker's begin and end markers) as a [`DeviceTiming`].
/// `timed_nodes`: the observed graph's node count in a TIMED run (each node's lines are those
/// before its marker), `None` for any other run (every line counts per kind). A marker naming
/// a node past the graph, or out of order, is an error naming it.
pub fn parse_run(lines: &[String], timed_nodes: Option<usize>) -> Result<DeviceTiming, String> {
    let mut t = DeviceTiming::default();
    if let Some(n) = timed_nodes {
        t.node_us = vec![None; n];
        t.node_kind = vec![None; n];
    }
    let mut pending: Vec<PerfLine> = Vec::new();
    let mut next = 0usize;
    let node_mark = format!("{MARK} node ");
    for line in lines {
        if let Some(k) = line.trim_end().strip_prefix(&node_mark) {
            let Some(n) = timed_nodes else {
                return Err(format!(
                    "a node marker in a run that is not TIMED: '{line}'"
                ));
            };
            let k: usize = k
                .trim()
                .parse()
                .map_err(|_| format!("a node marker without a node number: '{line}'"))?;
            if k >= n || k < next {
                return Err(format!(
                    "node marker {k} out of order or past the graph's {n} nodes (next expected {next})"
                ));
            }
            next = k + 1;
            if !pending.is_empty() {
                t.node_us[k] = Some(pending.iter().map(|p| p.total_us).sum());
                t.node_kind[k] = Some(
                    pending
                        .iter()
                        .map(|p| p.kind.as_str())
                        .collect::<Vec<_>>()
                        .join(" + "),
                );
                pending.clear();
            }
            continue;
        }
        if let Some(p) = parse_perf_line(line) {
            *t.kinds.entry(p.kind.clone()).or_insert(0.0) += p.total_us;
            if timed_nodes.is_some() {
                pending.push(p);
            }
        }
    }
    t.unattributed_us = pending.iter().map(|p| p.total_us).sum();
    Ok(t)
}

/// The device clock of a profile beside its host clock, per band.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceClockSummary {
    /// What the device clock is (its backend and how it is read).
    pub source: String,
    /// The nodes the device should have timed in every TIMED run (working nodes on a device
    /// other than the CPU) and those it timed in every one.
    pub nodes_expected: u32,
    pub nodes_matched: u32,
    /// Expected nodes the device timed in no TIMED run or not in all (their names, at most 10).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unmatched: Vec<String>,
    pub bands: Vec<DeviceClockBand>,
    /// The sums over bands of the medians: host TIMED, device TIMED, device FUSED (ms/token).
    pub host_timed_ms_per_token: f64,
    pub device_timed_ms_per_token: f64,
    pub device_fused_ms_per_token: f64,
    /// The FUSED runs' device time no TIMED kind explained: (kind, µs per run, median over
    /// cycles).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fused_unattributed: Vec<(String, f64)>,
}

/// One band on both clocks. Host TIMED and device TIMED cover the same nodes (those the device
/// timed); `ms_per_token` is the band's figure of the profile (its share of the TIMED sum x the
/// FUSED wall, every node of the band, whatever its device).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceClockBand {
    pub band: String,
    /// Nodes of the band the device timed.
    pub nodes: u32,
    pub host_timed_ms_per_token: Spread,
    pub device_timed_ms_per_token: Spread,
    /// Host TIMED over device TIMED (medians): what the host's clock adds per node (launch,
    /// submission, synchronisation) on top of the device's work.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub timed_ratio: f64,
    /// The band's device time in the FUSED runs (the backend's own graph execution), per op
    /// kind shared as the module says.
    pub device_fused_ms_per_token: Spread,
    /// The profile's ms/token of the band.
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub ms_per_token: f64,
    /// The profile's ms/token over device FUSED (medians).
    #[serde(deserialize_with = "crate::ab::nan_when_null")]
    pub fused_ratio: f64,
}

/// The kind a FUSED line is read as: itself when a TIMED node showed it, else the kind after
/// its fusion prefix (`RMS_NORM_MUL RMS_NORM(...)` -> `RMS_NORM(...)`) when a TIMED node showed
/// that.
fn timed_kind<'a>(
    kind: &'a str,
    known: &BTreeMap<String, BTreeMap<String, f64>>,
) -> Option<&'a str> {
    if known.contains_key(kind) {
        return Some(kind);
    }
    let (_, rest) = kind.split_once(' ')?;
    known.contains_key(rest).then_some(rest)
}

fn spread(values: &[f64]) -> Spread {
    match Sample::new(values) {
        Ok(s) => s.spread(),
        Err(_) => Spread {
            median: f64::NAN,
            min: f64::NAN,
            max: f64::NAN,
            n: 0,
        },
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if a.is_finite() && b.is_finite() && b > 0.0 {
        a / b
    } else {
        f64::NAN
    }
}

/// A cycle's device figures: its TIMED run's and its FUSED run's, with the TIMED run's host
/// node times.
pub struct CycleClocks<'a> {
    pub host_node_us: &'a [f64],
    pub timed: &'a DeviceTiming,
    pub fused: Option<&'a DeviceTiming>,
}

/// The device clock of a profile: per band, per cycle, host TIMED and device TIMED over the
/// nodes the device timed, device FUSED shared by op kind; each the median and range over
/// cycles. `band_ms` is the profile's ms/token of each band. `None` when no cycle has a
/// device clock.
pub fn summarise(
    graph: &[NodeInfo],
    assignments: &[Assignment],
    cycles: &[CycleClocks<'_>],
    tokens: f64,
    band_ms: &BTreeMap<String, f64>,
    source: &str,
) -> Option<DeviceClockSummary> {
    if cycles.is_empty() {
        return None;
    }
    let n = graph.len();
    let tok = tokens.max(1.0);
    // the nodes the device should time: working nodes on a device other than the CPU
    let expected: Vec<usize> = (0..n)
        .filter(|&i| {
            let g = &graph[i];
            g.is_working()
                && g.op != crate::split::TRANSFER_OP
                && g.device.as_deref().is_some_and(|d| d != "CPU")
        })
        .collect();
    let timed_everywhere = |i: usize| {
        cycles
            .iter()
            .all(|c| c.timed.node_us.get(i).copied().flatten().is_some())
    };
    let unmatched: Vec<usize> = expected
        .iter()
        .copied()
        .filter(|&i| !timed_everywhere(i))
        .collect();
    // the nodes compared on both clocks: timed by the device in every cycle
    let compared: Vec<usize> = (0..n).filter(|&i| timed_everywhere(i)).collect();
    let band_of = |i: usize| assignments.get(i).map_or("unassigned", |a| a.band.as_str());
    // bands in the order of the profile's figures, then any other
    let mut bands: Vec<String> = band_ms.keys().cloned().collect();
    for &i in &compared {
        if !bands.iter().any(|b| b == band_of(i)) {
            bands.push(band_of(i).to_string());
        }
    }
    // per TIMED kind, the device µs each band showed for it over all cycles (the FUSED shares)
    let mut known: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for c in cycles {
        for &i in &compared {
            if let (Some(Some(k)), Some(Some(us))) =
                (c.timed.node_kind.get(i), c.timed.node_us.get(i))
            {
                *known
                    .entry(k.clone())
                    .or_default()
                    .entry(band_of(i).to_string())
                    .or_insert(0.0) += us;
            }
        }
    }
    // each cycle's FUSED device µs per band, and what no TIMED kind explained
    let mut fused_band: Vec<BTreeMap<String, f64>> = Vec::new();
    let mut unexplained: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let fused_cycles: Vec<&DeviceTiming> = cycles.iter().filter_map(|c| c.fused).collect();
    for f in &fused_cycles {
        let mut per: BTreeMap<String, f64> = BTreeMap::new();
        let mut missing: BTreeMap<String, f64> = BTreeMap::new();
        for (kind, us) in &f.kinds {
            match timed_kind(kind, &known) {
                Some(k) => {
                    let shares = &known[k];
                    let total: f64 = shares.values().sum();
                    for (b, s) in shares {
                        let w = if total > 0.0 {
                            s / total
                        } else {
                            1.0 / shares.len() as f64
                        };
                        *per.entry(b.clone()).or_insert(0.0) += us * w;
                    }
                }
                None => *missing.entry(kind.clone()).or_insert(0.0) += us,
            }
        }
        for (k, us) in missing {
            unexplained.entry(k).or_default().push(us);
        }
        fused_band.push(per);
    }
    let mut rows = Vec::new();
    for b in &bands {
        let nodes: Vec<usize> = compared
            .iter()
            .copied()
            .filter(|&i| band_of(i) == b)
            .collect();
        let host: Vec<f64> = cycles
            .iter()
            .map(|c| {
                nodes
                    .iter()
                    .map(|&i| c.host_node_us.get(i).copied().unwrap_or(0.0))
                    .sum::<f64>()
                    / 1e3
                    / tok
            })
            .collect();
        let dev: Vec<f64> = cycles
            .iter()
            .map(|c| {
                nodes
                    .iter()
                    .filter_map(|&i| c.timed.node_us[i])
                    .sum::<f64>()
                    / 1e3
                    / tok
            })
            .collect();
        let fused: Vec<f64> = fused_band
            .iter()
            .map(|m| m.get(b).copied().unwrap_or(0.0) / 1e3 / tok)
            .collect();
        if nodes.is_empty() && fused.iter().all(|&v| v == 0.0) {
            continue;
        }
        let (host, dev, fused) = (spread(&host), spread(&dev), spread(&fused));
        let ms = band_ms.get(b).copied().unwrap_or(f64::NAN);
        rows.push(DeviceClockBand {
            band: b.clone(),
            nodes: nodes.len() as u32,
            timed_ratio: ratio(host.median, dev.median),
            fused_ratio: ratio(ms, fused.median),
            host_timed_ms_per_token: host,
            device_timed_ms_per_token: dev,
            device_fused_ms_per_token: fused,
            ms_per_token: ms,
        });
    }
    let sum = |f: &dyn Fn(&DeviceClockBand) -> f64| {
        rows.iter().map(f).filter(|v| v.is_finite()).sum::<f64>()
    };
    let fused_unattributed = unexplained
        .into_iter()
        .map(|(k, v)| (k, spread(&v).median))
        .collect();
    Some(DeviceClockSummary {
        source: source.to_string(),
        nodes_expected: expected.len() as u32,
        nodes_matched: (expected.len() - unmatched.len()) as u32,
        unmatched: unmatched
            .iter()
            .take(10)
            .map(|&i| graph[i].name.clone())
            .collect(),
        host_timed_ms_per_token: sum(&|r| r.host_timed_ms_per_token.median),
        device_timed_ms_per_token: sum(&|r| r.device_timed_ms_per_token.median),
        device_fused_ms_per_token: sum(&|r| r.device_fused_ms_per_token.median),
        bands: rows,
        fused_unattributed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    #[test]
    fn a_perf_logger_line_is_read_with_or_without_its_flops() {
        // as vk_perf_logger::print_timings writes them (std::cerr's default 6 digits)
        let p = parse_perf_line(
            "MUL_MAT_VEC q8_0 m=2048 n=1 k=256: 1 x 1673.18 us = 1673.18 us (0.63 GFLOPS/s)",
        )
        .unwrap();
        assert_eq!(p.kind, "MUL_MAT_VEC q8_0 m=2048 n=1 k=256");
        assert_eq!(p.count, 1);
        assert_eq!(p.total_us, 1673.18);
        let p = parse_perf_line("RMS_NORM(64,32,1,1): 3 x 10.5 us = 31.5 us").unwrap();
        assert_eq!(
            (p.kind.as_str(), p.count, p.total_us),
            ("RMS_NORM(64,32,1,1)", 3, 31.5)
        );
        // a large total in exponent form
        let p = parse_perf_line("ADD: 7 x 171429 us = 1.2e+06 us").unwrap();
        assert_eq!(p.total_us, 1.2e6);
        // a flash attention kind holds parentheses and commas of its own
        let p = parse_perf_line(
            "FLASH_ATTN_EXT dst(64,4,32,1),  q(64,32,4,1),  k(64,256,2,1),  v(64,256,2,1),  m(256,32,1,1): 1 x 99 us = 99 us (1.5 GFLOPS/s)",
        )
        .unwrap();
        assert!(p.kind.starts_with("FLASH_ATTN_EXT dst(64,4,32,1)"));
        assert!(p.kind.ends_with("m(256,32,1,1)"));
        for other in [
            "----------------",
            "Vulkan Timings:",
            "Total time: 1673.18 us.",
            "ggml_vulkan: Found 1 Vulkan devices:",
            "ADD: x 1 us = 1 us",
            "ADD: 1 x 1 us = -1 us",
        ] {
            assert_eq!(parse_perf_line(other), None, "{other}");
        }
    }

    #[test]
    fn a_timed_run_gives_each_node_the_lines_before_its_marker() {
        let text = "----------------\nVulkan Timings:\nGET_ROWS: 1 x 5 us = 5 us\nTotal time: 5 us.\n\
opledger-device-clock node 0\n\
opledger-device-clock node 1\n\
----------------\nVulkan Timings:\nMUL_MAT q8_0 m=64 n=32 k=64: 1 x 40 us = 40 us (1.2 GFLOPS/s)\nTotal time: 40 us.\n\
opledger-device-clock node 2\n\
----------------\nVulkan Timings:\nADD: 1 x 2.5 us = 2.5 us\nTotal time: 2.5 us.\n\
opledger-device-clock node 3\n\
----------------\nVulkan Timings:\nADD: 1 x 1 us = 1 us\nTotal time: 1 us.\n";
        let t = parse_run(&lines(text), Some(4)).unwrap();
        assert_eq!(t.node_us, [Some(5.0), None, Some(40.0), Some(2.5)]);
        assert_eq!(
            t.node_kind[2].as_deref(),
            Some("MUL_MAT q8_0 m=64 n=32 k=64")
        );
        assert_eq!(t.node_kind[1], None);
        assert_eq!(t.kinds["ADD"], 3.5);
        assert_eq!(t.total_us(), 48.5);
        // the line after the last marker belongs to no node
        assert_eq!(t.unattributed_us, 1.0);
        // a FUSED run: per kind only
        let f = parse_run(
            &lines("ADD: 2 x 1 us = 2 us\nMUL_MAT q8_0 m=64 n=32 k=64: 1 x 30 us = 30 us\n"),
            None,
        )
        .unwrap();
        assert!(f.node_us.is_empty());
        assert_eq!(f.total_us(), 32.0);
        // markers out of order, past the graph or in a FUSED run are refused
        assert!(parse_run(
            &lines("opledger-device-clock node 2\nopledger-device-clock node 1"),
            Some(4)
        )
        .is_err());
        assert!(parse_run(&lines("opledger-device-clock node 4"), Some(4)).is_err());
        assert!(parse_run(&lines("opledger-device-clock node 0"), None).is_err());
    }

    #[test]
    fn steps_add_up_and_positions_take_their_nodes() {
        let mut a = parse_run(
            &lines("ADD: 1 x 2 us = 2 us\nopledger-device-clock node 1"),
            Some(2),
        )
        .unwrap();
        let b = parse_run(
            &lines("ADD: 1 x 3 us = 3 us\nopledger-device-clock node 1"),
            Some(2),
        )
        .unwrap();
        a.add(&b);
        assert_eq!(a.node_us, [None, Some(5.0)]);
        assert_eq!(a.kinds["ADD"], 5.0);
        // a transfer before node 1: positions [node 0, transfer, node 1]
        let p = a.placed(&[Some(0), None, Some(1)]);
        assert_eq!(p.node_us, [None, None, Some(5.0)]);
        assert_eq!(p.node_kind[2].as_deref(), Some("ADD"));
    }

    fn node(name: &str, device: &str, view: bool) -> NodeInfo {
        let mut n: NodeInfo = serde_json::from_value(serde_json::json!({
            "index": 0, "op": if view { "VIEW" } else { "ADD" }, "name": name, "layer": null,
            "out": {"name": name, "ne": [1, 1, 1, 1], "type": "f32", "size_bytes": 4},
            "srcs": [], "is_view": view, "inplace": false
        }))
        .unwrap();
        n.device = Some(device.to_string());
        n
    }

    fn band(b: &str) -> Assignment {
        Assignment {
            band: b.to_string(),
            reason: crate::band::Reason::None,
        }
    }

    #[test]
    fn bands_set_both_clocks_side_by_side_and_fused_kinds_follow_the_timed_nodes() {
        // node 0 on the CPU (no device time), 1 and 2 working on Vulkan0, 3 a view there
        let graph = vec![
            node("inp", "CPU", false),
            node("a", "Vulkan0", false),
            node("b", "Vulkan0", false),
            node("v", "Vulkan0", true),
        ];
        let asg = vec![
            band("other"),
            band("attention"),
            band("dense_ffn"),
            band("dense_ffn"),
        ];
        let timed = |a: f64, b: f64| DeviceTiming {
            node_us: vec![None, Some(a), Some(b), None],
            node_kind: vec![None, Some("ADD".into()), Some("MUL_MAT x".into()), None],
            kinds: [("ADD".to_string(), a), ("MUL_MAT x".to_string(), b)].into(),
            unattributed_us: 0.0,
        };
        let fused = |add: f64, mm: f64, fusedk: f64| DeviceTiming {
            kinds: [
                ("ADD".to_string(), add),
                ("MUL_MAT_ADD MUL_MAT x".to_string(), mm),
                ("SOMETHING_ELSE".to_string(), fusedk),
            ]
            .into(),
            ..DeviceTiming::default()
        };
        let (t1, t2) = (timed(100.0, 300.0), timed(200.0, 500.0));
        let (f1, f2) = (fused(80.0, 200.0, 10.0), fused(60.0, 400.0, 30.0));
        let host1 = [7.0, 400.0, 600.0, 1.0];
        let host2 = [7.0, 600.0, 1000.0, 1.0];
        let cycles = [
            CycleClocks {
                host_node_us: &host1,
                timed: &t1,
                fused: Some(&f1),
            },
            CycleClocks {
                host_node_us: &host2,
                timed: &t2,
                fused: Some(&f2),
            },
        ];
        let band_ms: BTreeMap<String, f64> = [
            ("attention".to_string(), 0.5),
            ("dense_ffn".to_string(), 1.0),
            ("other".to_string(), 0.1),
        ]
        .into();
        let s = summarise(&graph, &asg, &cycles, 2.0, &band_ms, VULKAN_SOURCE).unwrap();
        assert_eq!((s.nodes_expected, s.nodes_matched), (2, 2));
        assert!(s.unmatched.is_empty());
        let att = s.bands.iter().find(|b| b.band == "attention").unwrap();
        // host per cycle 400/1e3/2 = 0.2, 600/1e3/2 = 0.3: median 0.25; device 0.05, 0.1: 0.075
        assert_eq!(att.nodes, 1);
        assert!((att.host_timed_ms_per_token.median - 0.25).abs() < 1e-12);
        assert!((att.device_timed_ms_per_token.median - 0.075).abs() < 1e-12);
        assert!((att.timed_ratio - 0.25 / 0.075).abs() < 1e-12);
        // FUSED: ADD 80 and 60 µs -> 0.04, 0.03 ms/token: median 0.035; profile 0.5 over it
        assert!((att.device_fused_ms_per_token.median - 0.035).abs() < 1e-12);
        assert!((att.fused_ratio - 0.5 / 0.035).abs() < 1e-12);
        // the fused matmul kind is read after its prefix: dense_ffn's 200 and 400 µs
        let ffn = s.bands.iter().find(|b| b.band == "dense_ffn").unwrap();
        assert!((ffn.device_fused_ms_per_token.median - 0.15).abs() < 1e-12);
        // a kind no TIMED node showed: stated, with its median µs a run
        assert_eq!(s.fused_unattributed, [("SOMETHING_ELSE".to_string(), 20.0)]);
        // the CPU's band has no node on the device and no FUSED time: no row
        assert!(s.bands.iter().all(|b| b.band != "other"));
        // a node the device left untimed in one cycle is unmatched, and compared in none
        let t3 = DeviceTiming {
            node_us: vec![None, None, Some(1.0), None],
            ..t1.clone()
        };
        let cycles = [
            CycleClocks {
                host_node_us: &host1,
                timed: &t1,
                fused: None,
            },
            CycleClocks {
                host_node_us: &host2,
                timed: &t3,
                fused: None,
            },
        ];
        let s = summarise(&graph, &asg, &cycles, 2.0, &band_ms, VULKAN_SOURCE).unwrap();
        assert_eq!((s.nodes_expected, s.nodes_matched), (2, 1));
        assert_eq!(s.unmatched, ["a"]);
        assert!(s.bands.iter().all(|b| b.band != "attention"));
    }
}
