//! A graph split across devices (llama.cpp's RPC backend: the local CPU and remote servers):
//! which node ran where, the transfers between devices as nodes of their own, the census of
//! splits, and the bands per device.
//!
//! The scheduler copies a split's inputs from the device that computed them before the split
//! starts; the eval callback never sees those copies, only their results as sources named
//! `<device>#<tensor>#<copy>`. [`with_transfers`] inserts one `TRANSFER` node wherever the
//! device changes (its sources: the copies the next run of nodes reads; its bytes: their sum),
//! and one after the last node when the outputs are read back from a remote device. A TIMED run
//! times a transfer as the wall between the last node of one device and the first of the next
//! (the remote nodes before it were waited for), so transfers are shares of the TIMED sum like
//! any node, and the `network` band holds them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::node::{NodeInfo, TensorDesc};

/// The op of a transfer node.
pub const TRANSFER_OP: &str = "TRANSFER";
/// The band of transfer nodes.
pub const NETWORK_BAND: &str = "network";

/// The devices other than this machine's CPU that compute nodes of `graph` (transfers aside),
/// sorted: where a backend may fuse ops when it runs the graph whole and not node by node.
pub fn off_cpu_devices(graph: &[NodeInfo]) -> Vec<&str> {
    let set: std::collections::BTreeSet<&str> = graph
        .iter()
        .filter(|n| n.op != TRANSFER_OP)
        .filter_map(|n| n.device.as_deref())
        .filter(|d| *d != "CPU")
        .collect();
    set.into_iter().collect()
}

/// Whether a device name is a remote one (ggml's RPC devices are named `RPC<k>[host:port]`).
pub fn is_remote(device: &str) -> bool {
    device.starts_with("RPC")
}

/// llama.cpp's `n_gpu_layers` and `tensor_split` for a model split layer by layer over this
/// machine and remote devices: `layers` are the repeating layers per device, this machine's
/// first, then each remote device's. Of llama.cpp's `n_layer + 1` slots (the repeating layers,
/// then the output), the last `n_gpu_layers` go to the devices, slot k to the first device whose
/// cumulative share exceeds k / n_gpu_layers; so the remote slots are the remote layers plus the
/// output, and integer proportions place exactly `layers[1 + d]` layers on device d (the output
/// with the last). `None` when a device has no layer or there is no remote device.
pub fn layer_split(layers: &[u32]) -> Option<(i32, Vec<f32>)> {
    if layers.len() < 2 || layers.contains(&0) {
        return None;
    }
    let remote: u64 = layers[1..].iter().map(|&l| l as u64).sum();
    let mut split: Vec<f32> = layers[1..].iter().map(|&l| l as f32).collect();
    if let Some(last) = split.last_mut() {
        *last += 1.0;
    }
    Some((i32::try_from(remote + 1).ok()?, split))
}

/// What a position of the graph with transfers holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    /// Node i of the observed graph.
    Node(usize),
    /// The transfer into node i's device, before node i: timed as the gap before node i.
    TransferBefore(usize),
    /// The outputs read back from the last node's device after the graph.
    Output,
}

/// The name of the scheduler's copy: `(device, tensor)` of `<device>#<tensor>#<copy>`.
pub fn copy_of(name: &str) -> Option<(&str, &str)> {
    let (rest, copy) = name.rsplit_once('#')?;
    copy.parse::<u32>().ok()?;
    let (device, tensor) = rest.split_once('#')?;
    Some((device, tensor))
}

/// The longest tensor name ggml keeps (`GGML_MAX_NAME` 64 with its terminating NUL): the
/// scheduler's copy names are cut there.
pub const MAX_NAME_LEN: usize = 63;

/// The distinct sources that look like scheduler copies whose names ggml cut at
/// [`MAX_NAME_LEN`] (a long device name, `RPC<k>[host:port]` with a long host name, before a
/// long tensor name): their copy number is lost, so [`with_transfers`] cannot count them.
pub fn cut_copies(graph: &[NodeInfo]) -> Vec<String> {
    let mut cut: Vec<String> = graph
        .iter()
        .flat_map(|n| n.srcs.iter().flatten())
        .filter(|s| s.name.len() >= MAX_NAME_LEN && s.name.contains('#'))
        .filter(|s| copy_of(&s.name).is_none())
        .map(|s| s.name.clone())
        .collect();
    cut.sort();
    cut.dedup();
    cut
}

/// The graph with a transfer node at every change of device (and for the outputs when the last
/// node ran remotely), renumbered, and what each position holds. A graph without devices comes
/// back as it was.
pub fn with_transfers(nodes: Vec<NodeInfo>) -> (Vec<NodeInfo>, Vec<Slot>) {
    if nodes.iter().all(|n| n.device.is_none()) {
        let slots = (0..nodes.len()).map(Slot::Node).collect();
        return (nodes, slots);
    }
    let devices = node_devices(&nodes);
    let mut slots = Vec::with_capacity(nodes.len() + 4);
    for i in 0..nodes.len() {
        if i > 0 && devices[i] != devices[i - 1] {
            slots.push(Slot::TransferBefore(i));
        }
        slots.push(Slot::Node(i));
    }
    if devices.last().is_some_and(|d| is_remote(d)) {
        slots.push(Slot::Output);
    }
    // old index -> new index, for the sources' producers
    let mut new_index = vec![0u32; nodes.len()];
    for (pos, s) in slots.iter().enumerate() {
        if let Slot::Node(i) = s {
            new_index[*i] = pos as u32;
        }
    }
    // a copy's producer is the node that computed the tensor it copies (the latest of that
    // name before it), so a node reading a copy reads its producer as on one device
    let mut latest: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    let mut copy_producer: Vec<Vec<Option<u32>>> = Vec::with_capacity(nodes.len());
    for (i, n) in nodes.iter().enumerate() {
        copy_producer.push(
            n.srcs
                .iter()
                .map(|s| {
                    let s = s.as_ref()?;
                    let (_, tensor) = copy_of(&s.name)?;
                    latest.get(tensor).copied()
                })
                .collect(),
        );
        latest.insert(n.name.as_str(), i as u32);
    }
    let mut out = Vec::with_capacity(slots.len());
    for (pos, s) in slots.iter().enumerate() {
        let node = match *s {
            Slot::Node(i) => {
                let mut n = nodes[i].clone();
                n.index = pos as u32;
                for (k, src) in n.srcs.iter_mut().enumerate() {
                    if let Some(src) = src {
                        src.producer = src
                            .producer
                            .or(copy_producer[i][k])
                            .map(|p| new_index[p as usize]);
                    }
                }
                n
            }
            Slot::TransferBefore(i) => {
                let end = (i..nodes.len())
                    .find(|&j| devices[j] != devices[i])
                    .unwrap_or(nodes.len());
                let mut copies: BTreeMap<String, TensorDesc> = BTreeMap::new();
                // the copies carry no producer here: a transfer is not a consumer a band rule
                // should follow (the nodes reading the copies are)
                for n in &nodes[i..end] {
                    for s in n.srcs.iter().flatten() {
                        if copy_of(&s.name).is_some() {
                            copies.entry(s.name.clone()).or_insert_with(|| TensorDesc {
                                producer: None,
                                ..s.clone()
                            });
                        }
                    }
                }
                transfer(
                    pos,
                    nodes[i].layer,
                    &format!("{} -> {}", devices[i - 1], devices[i]),
                    copies.into_values().collect(),
                )
            }
            Slot::Output => {
                let last = nodes.last().expect("a graph with devices has nodes");
                let mut read = last.out.clone();
                read.producer = Some(new_index[nodes.len() - 1]);
                transfer(
                    pos,
                    last.layer,
                    &format!("{} -> host (outputs)", devices[nodes.len() - 1]),
                    vec![read],
                )
            }
        };
        out.push(node);
    }
    (out, slots)
}

/// Each node's device: its own, else the previous node's (a node whose buffer was unknown).
fn node_devices(nodes: &[NodeInfo]) -> Vec<String> {
    let first = nodes
        .iter()
        .find_map(|n| n.device.clone())
        .unwrap_or_default();
    let mut cur = first;
    nodes
        .iter()
        .map(|n| {
            if let Some(d) = &n.device {
                cur = d.clone();
            }
            cur.clone()
        })
        .collect()
}

fn transfer(index: usize, layer: Option<u32>, link: &str, srcs: Vec<TensorDesc>) -> NodeInfo {
    let bytes: u64 = srcs.iter().map(|s| s.size_bytes).sum();
    NodeInfo {
        index: index as u32,
        op: TRANSFER_OP.into(),
        name: format!("transfer {link}"),
        layer,
        out: TensorDesc {
            name: format!("transfer {link}"),
            ne: [bytes as i64, 1, 1, 1],
            ggml_type: "I8".into(),
            size_bytes: bytes,
            is_weight: false,
            nb: [0; 4],
            producer: None,
        },
        srcs: srcs.into_iter().map(Some).collect(),
        is_view: false,
        inplace: false,
        skipped: false,
        op_code: None,
        op_params: Vec::new(),
        device: Some(link.to_string()),
    }
}

/// The time of each position of the graph with transfers, from a TIMED run of the observed
/// graph: a node's own time, a transfer's the gap before the node it feeds, the outputs' the
/// tail after the last node. `gap_us[i]` is the wall between node i-1's end and node i's start.
pub fn slot_times(slots: &[Slot], node_us: &[f64], gap_us: &[f64], tail_us: f64) -> Vec<f64> {
    slots
        .iter()
        .map(|s| match *s {
            Slot::Node(i) => node_us.get(i).copied().unwrap_or(0.0),
            Slot::TransferBefore(i) => gap_us.get(i).copied().unwrap_or(0.0),
            Slot::Output => tail_us,
        })
        .collect()
}

/// What isolating each node costs on its own device, for a graph over several devices whose
/// engine has no calibration of its own (a llama.cpp worker): the median TIMED time of the
/// nodes that do no work on that device (views: each one the backend's dispatch of nothing and
/// its synchronisation, the launch-and-wait a TIMED node pays there; on an RPC device one graph
/// sent and one round trip). A transfer into a
/// remote device pays half of it (its first node's read of the inputs: the answer's way back,
/// which the FUSED run does not wait for); a transfer into any other device, and the outputs
/// read back, nothing (the scheduler's copies there are synchronous in FUSED runs too).
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceIsolation {
    /// The devices, in graph order.
    pub names: Vec<String>,
    /// Per node: its device's index and the share of that device's cost it pays.
    node: Vec<Option<(usize, f64)>>,
    /// Per device: its nodes that do no work.
    idle: Vec<Vec<usize>>,
}

impl DeviceIsolation {
    /// Each device's median idle-node time in one TIMED run (`fallback` for a device without
    /// idle nodes).
    pub fn idle_medians(&self, node_us: &[f64], fallback: f64) -> Vec<f64> {
        self.idle
            .iter()
            .map(|nodes| {
                let v: Vec<f64> = nodes
                    .iter()
                    .filter_map(|&i| node_us.get(i).copied())
                    .collect();
                crate::stats::median(&v).unwrap_or(fallback)
            })
            .collect()
    }

    /// Each node's isolation from its device's cost (`per_device`, as [`Self::idle_medians`]).
    pub fn each_node(&self, per_device: &[f64]) -> Vec<f64> {
        self.node
            .iter()
            .map(|n| {
                n.map_or(0.0, |(d, share)| {
                    per_device.get(d).copied().unwrap_or(0.0) * share
                })
            })
            .collect()
    }
}

/// The devices a graph's isolation is measured on (see [`DeviceIsolation`]); `None` for a graph
/// on fewer than two devices.
pub fn isolation_devices(graph: &[NodeInfo]) -> Option<DeviceIsolation> {
    // each node's device (a node without one: the node before it), transfers aside
    let mut names: Vec<String> = Vec::new();
    let mut cur: Option<usize> = None;
    let mut of: Vec<Option<usize>> = Vec::with_capacity(graph.len());
    for n in graph {
        if n.op == TRANSFER_OP {
            of.push(None);
            continue;
        }
        if let Some(d) = &n.device {
            cur = Some(names.iter().position(|x| x == d).unwrap_or_else(|| {
                names.push(d.clone());
                names.len() - 1
            }));
        }
        of.push(cur);
    }
    if names.len() < 2 {
        return None;
    }
    let mut idle = vec![Vec::new(); names.len()];
    let mut node = Vec::with_capacity(graph.len());
    for (i, n) in graph.iter().enumerate() {
        if n.op == TRANSFER_OP {
            // the device of the node it feeds
            let into = (i + 1..graph.len()).find_map(|j| of[j]);
            node.push(into.filter(|&d| is_remote(&names[d])).map(|d| (d, 0.5)));
            continue;
        }
        if let Some(d) = of[i] {
            if !n.is_working() {
                idle[d].push(i);
            }
        }
        node.push(of[i].map(|d| (d, 1.0)));
    }
    Some(DeviceIsolation { names, node, idle })
}

/// One contiguous run of nodes on one device: the census of splits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceRun {
    pub device: String,
    /// First and last layer of the run's nodes (None: no node names a layer).
    pub layers: Option<(u32, u32)>,
    pub nodes: u32,
    pub working_nodes: u32,
    /// Bytes copied into the run from the device before it (its transfer node), 0 for the first.
    pub bytes_in: u64,
    /// The scheduler's copies the run reads (`<device>#<tensor>#<copy>`), by tensor name.
    pub inputs: Vec<String>,
}

/// The device runs of a graph with transfers, in order (empty for a graph without devices).
pub fn device_runs(graph: &[NodeInfo]) -> Vec<DeviceRun> {
    let mut runs: Vec<DeviceRun> = Vec::new();
    let mut pending: Option<(u64, Vec<String>)> = None;
    for n in graph {
        let Some(device) = &n.device else { continue };
        if n.op == TRANSFER_OP {
            let inputs = n
                .srcs
                .iter()
                .flatten()
                .filter_map(|s| copy_of(&s.name).map(|(_, t)| t.to_string()))
                .collect();
            pending = Some((n.out.size_bytes, inputs));
            continue;
        }
        let new_run = runs.last().is_none_or(|r| &r.device != device);
        if new_run {
            let (bytes_in, inputs) = pending.take().unwrap_or_default();
            runs.push(DeviceRun {
                device: device.clone(),
                layers: None,
                nodes: 0,
                working_nodes: 0,
                bytes_in,
                inputs,
            });
        }
        let r = runs.last_mut().expect("pushed above");
        r.nodes += 1;
        r.working_nodes += n.is_working() as u32;
        if let Some(l) = n.layer {
            r.layers = Some(r.layers.map_or((l, l), |(a, b)| (a.min(l), b.max(l))));
        }
    }
    runs
}

/// One (device, band) row of a split profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeviceBandRow {
    /// The device (`CPU`, `RPC0[host:port]`) or, for the network band, the link.
    pub device: String,
    pub band: String,
    /// The median over cycles of the per-cycle value (share of that cycle's TIMED sum x its
    /// FUSED wall / tokens), and the min..max of the same values.
    pub ms_per_token: f64,
    pub ms_per_token_min: f64,
    pub ms_per_token_max: f64,
    /// The same with each node's isolation removed (the corrected columns of the profile).
    pub ms_per_token_corrected: f64,
    pub nodes: u32,
}

/// The bands per device of a profile of a split graph: every (device, band) group through the
/// profile's one estimator, raw and corrected; largest first within each device, devices in
/// graph order.
pub fn device_bands(
    graph: &[NodeInfo],
    bands: &[String],
    raw: &[&[f64]],
    corrected: &[&[f64]],
    fused_ms: &[f64],
    tokens: f64,
) -> Vec<DeviceBandRow> {
    let mut order: Vec<String> = Vec::new();
    let mut groups: BTreeMap<(String, String), Vec<usize>> = BTreeMap::new();
    for (i, n) in graph.iter().enumerate() {
        let Some(device) = &n.device else { continue };
        if !order.contains(device) {
            order.push(device.clone());
        }
        groups
            .entry((device.clone(), bands[i].clone()))
            .or_default()
            .push(i);
    }
    let median = |v: &[f64]| crate::stats::median(v).unwrap_or(0.0);
    let mut rows = Vec::new();
    for device in &order {
        let mut dev_rows: Vec<DeviceBandRow> = groups
            .iter()
            .filter(|((d, _), _)| d == device)
            .map(|((d, band), members)| {
                let w = |i: usize| if members.contains(&i) { 1.0 } else { 0.0 };
                let per = crate::profile::per_cycle_ms_per_token(raw, fused_ms, tokens, &w);
                let cor = crate::profile::per_cycle_ms_per_token(corrected, fused_ms, tokens, &w);
                DeviceBandRow {
                    device: d.clone(),
                    band: band.clone(),
                    ms_per_token: median(&per),
                    ms_per_token_min: per.iter().copied().fold(f64::INFINITY, f64::min),
                    ms_per_token_max: per.iter().copied().fold(f64::NEG_INFINITY, f64::max),
                    ms_per_token_corrected: median(&cor),
                    nodes: members.len() as u32,
                }
            })
            .collect();
        dev_rows.sort_by(|a, b| b.ms_per_token.total_cmp(&a.ms_per_token));
        rows.extend(dev_rows);
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, bytes: u64) -> TensorDesc {
        TensorDesc {
            name: name.into(),
            ne: [bytes as i64 / 4, 1, 1, 1],
            ggml_type: "F32".into(),
            size_bytes: bytes,
            is_weight: false,
            nb: [0; 4],
            producer: None,
        }
    }

    fn node(i: u32, name: &str, device: &str, srcs: Vec<TensorDesc>) -> NodeInfo {
        NodeInfo {
            index: i,
            op: "ADD".into(),
            name: name.into(),
            layer: crate::node::layer_of(name),
            out: tensor(name, 64),
            srcs: srcs.into_iter().map(Some).collect(),
            is_view: false,
            inplace: false,
            skipped: false,
            op_code: None,
            op_params: Vec::new(),
            device: Some(device.into()),
        }
    }

    #[test]
    fn copies_are_named_device_tensor_copy() {
        assert_eq!(
            copy_of("RPC0[127.0.0.1:5]#l_out-1#0"),
            Some(("RPC0[127.0.0.1:5]", "l_out-1"))
        );
        assert_eq!(copy_of("l_out-1"), None);
        assert_eq!(copy_of("a#b"), None);
    }

    #[test]
    fn copies_whose_names_ggml_cut_are_found() {
        // ggml's "%s#%s#%d" into a 64-byte name: a 40-character device name leaves 22 for the
        // tensor and the copy number
        let device = "RPC0[gpu-node-17.cluster.example.org:50052]";
        let full = format!("{device}#ffn_moe_weights_norm-12#0");
        assert!(full.len() > MAX_NAME_LEN);
        let cut = full[..MAX_NAME_LEN].to_string();
        let short = format!("{device}#l_out-1#0");
        assert!(short.len() <= MAX_NAME_LEN);
        let g = vec![
            node(0, "x-1", device, vec![tensor(&cut, 64), tensor(&short, 64)]),
            node(1, "y-1", device, vec![tensor(&cut, 64)]),
        ];
        assert_eq!(cut_copies(&g), vec![cut]);
        assert!(cut_copies(&g[..0]).is_empty());
    }

    #[test]
    fn a_transfer_sits_at_each_change_of_device_with_the_copies_it_carries() {
        let r0 = "RPC0[127.0.0.1:5]";
        let mut b = node(1, "l_out-0", "CPU", vec![]);
        b.srcs.push(Some(TensorDesc {
            producer: Some(0),
            ..tensor("x-0", 64)
        }));
        let g = vec![
            node(0, "x-0", "CPU", vec![]),
            b,
            node(
                2,
                "attn_norm-1",
                r0,
                vec![tensor(&format!("{r0}#l_out-0#0"), 2048)],
            ),
            node(
                3,
                "kq-1",
                r0,
                vec![
                    tensor(&format!("{r0}#inp_pos#0"), 16),
                    tensor(&format!("{r0}#l_out-0#0"), 2048),
                ],
            ),
            node(4, "result_output", r0, vec![]),
        ];
        let (out, slots) = with_transfers(g);
        assert_eq!(
            slots,
            vec![
                Slot::Node(0),
                Slot::Node(1),
                Slot::TransferBefore(2),
                Slot::Node(2),
                Slot::Node(3),
                Slot::Node(4),
                Slot::Output
            ]
        );
        assert_eq!(out.len(), 7);
        assert!(out.iter().enumerate().all(|(i, n)| n.index == i as u32));
        // the producer of node 1's source moved with renumbering (0 stays 0)
        assert_eq!(out[1].srcs[0].as_ref().unwrap().producer, Some(0));
        let t = &out[2];
        assert_eq!(t.op, TRANSFER_OP);
        // each copy once: 2048 + 16
        assert_eq!(t.out.size_bytes, 2064);
        assert_eq!(t.device.as_deref(), Some("CPU -> RPC0[127.0.0.1:5]"));
        let o = &out[6];
        assert_eq!(o.out.size_bytes, 64);
        assert_eq!(o.srcs[0].as_ref().unwrap().producer, Some(5));
        // a node reading a copy reads the node that computed the copied tensor
        assert_eq!(out[3].srcs[0].as_ref().unwrap().producer, Some(1));
        assert_eq!(out[4].srcs[0].as_ref().unwrap().producer, None);

        let runs = device_runs(&out);
        assert_eq!(runs.len(), 2);
        assert_eq!((runs[0].nodes, runs[0].layers), (2, Some((0, 0))));
        assert_eq!(
            (runs[1].nodes, runs[1].layers, runs[1].bytes_in),
            (3, Some((1, 1)), 2064)
        );
        assert_eq!(runs[1].inputs, ["inp_pos", "l_out-0"]);

        let times = slot_times(
            &slots,
            &[1.0, 2.0, 3.0, 4.0, 5.0],
            &[0.0, 0.1, 7.0, 0.2, 0.3],
            9.0,
        );
        assert_eq!(times, [1.0, 2.0, 7.0, 3.0, 4.0, 5.0, 9.0]);
    }

    #[test]
    fn each_device_pays_its_own_idle_nodes_and_a_transfer_into_a_server_half() {
        let r0 = "RPC0[127.0.0.1:5]";
        let view = |i: u32, name: &str, device: &str| NodeInfo {
            is_view: true,
            op: "VIEW".into(),
            ..node(i, name, device, vec![])
        };
        let mut g = vec![
            node(0, "a-0", "CPU", vec![]),
            view(1, "v-0", "CPU"),
            view(2, "w-0", "CPU"),
            node(3, "b-1", "CUDA0", vec![]),
            view(4, "x-1", "CUDA0"),
            node(5, "c-2", r0, vec![]),
            view(6, "y-2", r0),
        ];
        // a node whose buffer named no device runs where the node before it ran
        g[4].device = None;
        let (g, _) = with_transfers(g);
        // CPU a v w | T(CPU->CUDA0) | CUDA0 b x | T(CUDA0->RPC0) | RPC0 c y | outputs
        let ops: Vec<&str> = g.iter().map(|n| n.op.as_str()).collect();
        assert_eq!(
            ops,
            [
                "ADD",
                "VIEW",
                "VIEW",
                TRANSFER_OP,
                "ADD",
                "VIEW",
                TRANSFER_OP,
                "ADD",
                "VIEW",
                TRANSFER_OP
            ]
        );
        let d = isolation_devices(&g).unwrap();
        assert_eq!(d.names, ["CPU", "CUDA0", r0]);
        let us = [50.0, 2.0, 4.0, 30.0, 40.0, 9.0, 7.0, 300.0, 100.0, 11.0];
        // CPU: median of 2 and 4; CUDA0: 9; RPC0: 100
        let per = d.idle_medians(&us, -1.0);
        assert_eq!(per, [3.0, 9.0, 100.0]);
        assert_eq!(
            d.each_node(&per),
            [3.0, 3.0, 3.0, 0.0, 9.0, 9.0, 50.0, 100.0, 100.0, 0.0]
        );
        // a device without idle nodes takes the fallback
        let mut lone = g.clone();
        lone[5].is_view = false;
        assert_eq!(
            isolation_devices(&lone).unwrap().idle_medians(&us, -1.0),
            [3.0, -1.0, 100.0]
        );
        // one device: nothing to tell apart
        assert!(isolation_devices(&g[..3]).is_none());
    }

    #[test]
    fn a_graph_without_devices_is_left_alone() {
        let mut a = node(0, "x-0", "CPU", vec![]);
        a.device = None;
        let (out, slots) = with_transfers(vec![a.clone()]);
        assert_eq!(out, vec![a]);
        assert_eq!(slots, vec![Slot::Node(0)]);
        assert!(device_runs(&out).is_empty());
    }

    #[test]
    fn device_bands_split_share_x_wall_by_hand() {
        // two cycles; nodes: CPU a (band x), RPC b (band x), RPC c (band y)
        let g = vec![
            node(0, "a-0", "CPU", vec![]),
            node(1, "b-1", "RPC0[h:1]", vec![]),
            node(2, "c-1", "RPC0[h:1]", vec![]),
        ];
        let bands: Vec<String> = ["x", "x", "y"].iter().map(|s| s.to_string()).collect();
        let c1 = [1.0, 2.0, 1.0];
        let c2 = [2.0, 1.0, 1.0];
        let raw: Vec<&[f64]> = vec![&c1, &c2];
        // FUSED walls 8 and 4 ms over 2 tokens
        let rows = device_bands(&g, &bands, &raw, &raw, &[8.0, 4.0], 2.0);
        let get = |d: &str, b: &str| {
            rows.iter()
                .find(|r| r.device == d && r.band == b)
                .unwrap()
                .clone()
        };
        // CPU x: 1/4*8/2 = 1.0, 2/4*4/2 = 1.0
        assert!((get("CPU", "x").ms_per_token - 1.0).abs() < 1e-12);
        // RPC x: 2/4*8/2 = 2.0, 1/4*4/2 = 0.5 -> median 1.25, range 0.5..2.0
        let r = get("RPC0[h:1]", "x");
        assert!((r.ms_per_token - 1.25).abs() < 1e-12);
        assert_eq!((r.ms_per_token_min, r.ms_per_token_max), (0.5, 2.0));
        assert_eq!(rows[0].device, "CPU");
    }
}
