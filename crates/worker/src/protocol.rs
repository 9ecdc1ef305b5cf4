//! The worker's line protocol, version 3 (`tools/llama-worker/PROTOCOL.md`): the hello line, the
//! answers' shapes, and the node records of a capture. Pure: every function takes a line and
//! returns a typed value or a [`ProtocolError`] that says what was wrong with it (an unknown
//! field is an error, not a guess).

use serde::Deserialize;

use opledger_core::node::{is_view_op, layer_of, NodeInfo, TensorDesc};

/// The protocol version this opledger speaks.
pub const PROTOCOL_VERSION: u32 = 4;

/// The name a worker gives its protocol in its hello line.
pub const PROTOCOL_NAME: &str = "opledger-llama-worker";

/// What is wrong with a line the worker wrote.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProtocolError {
    #[error("wrote a line that is not the protocol ({why}): {line}")]
    NotProtocol { why: String, line: String },
    #[error("speaks the protocol '{name}' version {version}; this opledger speaks '{PROTOCOL_NAME}' version {PROTOCOL_VERSION} (rebuild the worker from this opledger's tools/llama-worker)")]
    Version { name: String, version: u64 },
    #[error("answered request {got} while request {expected} was waiting")]
    WrongId { expected: u64, got: String },
}

/// A line shortened for an error message.
pub(crate) fn excerpt(line: &str) -> String {
    const MAX: usize = 160;
    if line.len() <= MAX {
        return line.to_string();
    }
    let mut end = MAX;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}... ({} bytes)", &line[..end], line.len())
}

fn not_protocol(why: impl Into<String>, line: &str) -> ProtocolError {
    ProtocolError::NotProtocol {
        why: why.into(),
        line: excerpt(line),
    }
}

/// One device the worker's ggml sees.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Device {
    pub name: String,
    pub description: String,
    /// `cpu`, `gpu` or `other`.
    #[serde(rename = "type")]
    pub kind: String,
    pub memory_total: u64,
    pub memory_free: u64,
}

/// The llama.cpp build a worker was compiled against.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlamaBuild {
    /// The llama.cpp commit (`unknown` for a tree without git metadata).
    pub commit: String,
    /// The build number (`b1234`) or `unknown`.
    pub build: String,
    pub ggml_version: String,
    pub ggml_commit: String,
    pub compiler: String,
    /// The backend options the worker's llama.cpp was configured with (`GGML_CUDA=ON ...`).
    pub build_options: String,
    pub system_info: String,
    /// ggml's registered backends (`CPU`, `CUDA`, `RPC`, ...).
    pub backends: Vec<String>,
    pub devices: Vec<Device>,
    /// The worker's environment variables named `GGML_*`, `CUDA_*` or `LLAMA_*` (the backends'
    /// runtime switches: `GGML_CUDA_DISABLE_GRAPHS`, `CUDA_VISIBLE_DEVICES`, ...).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
}

/// The worker's first line.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hello {
    pub protocol: String,
    pub version: u64,
    pub llama: LlamaBuild,
}

impl Hello {
    /// One line naming the build: `llama.cpp b1234 (abc123), ggml 0.26.0`.
    pub fn build_label(&self) -> String {
        let l = &self.llama;
        format!(
            "llama.cpp {} ({}), ggml {}",
            l.build, l.commit, l.ggml_version
        )
    }
}

/// Reads the hello line: the protocol's name and version first (a worker of another version is
/// refused by name, whatever else its hello holds), then the rest.
pub fn parse_hello(line: &str) -> Result<Hello, ProtocolError> {
    let v: serde_json::Value = serde_json::from_str(line)
        .map_err(|e| not_protocol(format!("its hello is not JSON: {e}"), line))?;
    let name = v
        .get("protocol")
        .and_then(|p| p.as_str())
        .ok_or_else(|| not_protocol("its hello names no protocol", line))?;
    let version = v
        .get("version")
        .and_then(|p| p.as_u64())
        .ok_or_else(|| not_protocol("its hello has no protocol version", line))?;
    if name != PROTOCOL_NAME || version != PROTOCOL_VERSION as u64 {
        return Err(ProtocolError::Version {
            name: name.to_string(),
            version,
        });
    }
    serde_json::from_value(v).map_err(|e| not_protocol(format!("its hello: {e}"), line))
}

/// An answer: the request's own fields (`Ok`), or the worker's refusal in its own words.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer<T> {
    Ok(T),
    Refused(String),
}

/// Reads the answer to request `id`, its fields as `T` (every field of the answer but `id` and
/// `ok` must be one of `T`'s).
pub fn parse_answer<T: serde::de::DeserializeOwned>(
    line: &str,
    id: u64,
) -> Result<Answer<T>, ProtocolError> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| not_protocol(format!("not JSON: {e}"), line))?;
    let serde_json::Value::Object(mut map) = v else {
        return Err(not_protocol("an answer is a JSON object", line));
    };
    let got = map.remove("id");
    match got.as_ref().and_then(|g| g.as_u64()) {
        Some(g) if g == id => {}
        _ => {
            return Err(ProtocolError::WrongId {
                expected: id,
                got: got.map_or("none".into(), |g| g.to_string()),
            })
        }
    }
    match map.remove("ok") {
        Some(serde_json::Value::Bool(true)) => {}
        Some(serde_json::Value::Bool(false)) => {
            let why = map
                .remove("error")
                .and_then(|e| e.as_str().map(str::to_string))
                .ok_or_else(|| not_protocol("a refusal without its error", line))?;
            if !map.is_empty() {
                return Err(not_protocol("a refusal with other fields", line));
            }
            return Ok(Answer::Refused(why));
        }
        _ => return Err(not_protocol("an answer without 'ok'", line)),
    }
    serde_json::from_value(serde_json::Value::Object(map))
        .map(Answer::Ok)
        .map_err(|e| not_protocol(e.to_string(), line))
}

/// An answer with nothing in it (`clear`, `restore`, `seq_cp`, `seq_rm`, `quit`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Done {}

/// The answer to `load`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Loaded {
    pub n_vocab: u32,
    pub n_layer: u32,
    pub description: String,
    pub load_ms: f64,
    /// ggml's devices after the load (RPC servers' devices among them once added).
    #[serde(default)]
    pub devices: Vec<Device>,
}

/// The answer to `contexts`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Contexts {
    pub n_ctx: u32,
}

/// The answer to `save`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Saved {
    pub bytes: u64,
}

/// The answer to `logits`: the rows asked for, `null` where a value is not finite.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logits {
    pub rows: Vec<Vec<Option<f32>>>,
}

/// One tensor of a captured node.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireTensor {
    pub name: String,
    pub ne: [i64; 4],
    pub nb: [u64; 4],
    #[serde(rename = "type")]
    pub ggml_type: String,
    pub bytes: u64,
    pub weight: bool,
    #[serde(default)]
    pub producer: Option<u32>,
}

/// One captured node, as ggml describes it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireNode {
    /// `ggml_op_desc`.
    pub op: String,
    /// ggml's op code.
    pub code: u32,
    pub out: WireTensor,
    pub srcs: Vec<Option<WireTensor>>,
    /// The node views another tensor's memory.
    pub view_src: bool,
    /// ggml's COMPUTE flag (always true in a llama.cpp that has none).
    pub compute: bool,
    pub params: Vec<i32>,
    /// The threads ggml's CPU plan gives a graph of this node alone with 64 available (1: the
    /// CPU backend computes it on one thread).
    pub threads: u32,
    /// The device of the node's buffer (`CPU`, `CUDA0`), where it has one.
    pub device: Option<String>,
}

/// The answer to `decode` and `step`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Decoded {
    /// `llama_decode` and its synchronisation, summed over the batches, ns.
    pub wall_ns: u64,
    /// FNV-1a of each requested row of logits (opledger's `hash_f32`), in row order.
    pub row_hashes: Vec<u64>,
    /// Logits among the requested rows that are NaN or infinite, and all of them.
    pub non_finite: u64,
    pub values: u64,
    /// The abort after the first node stopped the decode (a capture that computes nothing).
    #[serde(default)]
    pub aborted: bool,
    /// The instrument's figures (the observed context only).
    #[serde(default)]
    pub nodes_seen: Option<u32>,
    #[serde(default)]
    pub node_ns: Option<Vec<u64>>,
    #[serde(default)]
    pub gap_ns: Option<Vec<u64>>,
    /// `timed`: from the last node's end to the end of the decode (outputs read back), ns.
    #[serde(default)]
    pub tail_ns: Option<u64>,
    #[serde(default)]
    pub ops: Option<Vec<u32>>,
    #[serde(default)]
    pub nodes: Option<Vec<WireNode>>,
    /// `timed` with `capture_ids`: each expert matmul's expert ids, in node order.
    #[serde(default)]
    pub ids: Option<Vec<WireIds>>,
    /// The run on the device's clock: not a field of the answer, but the lines the worker's
    /// stderr carried between the run's markers, read by the engine
    /// (`opledger_core::device_clock`).
    #[serde(skip)]
    pub device: Option<opledger_core::device_clock::DeviceTiming>,
}

/// The expert ids one MUL_MAT_ID node routed in a TIMED decode.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireIds {
    /// The node's position among the observed nodes.
    pub node: u32,
    /// Its ids source, `[n_used, n_tokens]`, token by token.
    pub ids: Vec<i32>,
}

/// The answer to `time_op`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimedOp {
    /// Every timed repetition, compute and synchronise, ns (the warm-up not among them).
    pub ns: Vec<u64>,
    /// Copies of the inputs rotated over.
    pub rotation: u32,
    /// The buffer type the weights lived in (`CPU_REPACK`, `CPU`, `CUDA0`).
    pub weight_buffer: String,
    /// The backend the op was computed on (`CPU`, `CUDA0`).
    pub backend: String,
}

/// A node as `time_op` sends it: the op, its parameters and device, and its tensors' shapes,
/// strides and types (`code`: ggml's op code as captured; `None`: the worker finds the op by
/// its name).
pub fn time_op_node(node: &NodeInfo) -> serde_json::Value {
    let tensor = |t: &TensorDesc| serde_json::json!({"ne": t.ne, "nb": t.nb, "type": t.ggml_type, "weight": t.is_weight});
    serde_json::json!({
        "op": node.op,
        "code": node.op_code,
        "params": node.op_params,
        "device": node.device,
        "out": tensor(&node.out),
        "srcs": node.srcs.iter().map(|s| s.as_ref().map(tensor)).collect::<Vec<_>>(),
    })
}

/// The answer to `replay`: a decode's figures and what the replays did.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replayed {
    /// `llama_decode` and its synchronisation, replays included, ns.
    pub wall_ns: u64,
    /// As `decode`'s.
    pub row_hashes: Vec<u64>,
    pub non_finite: u64,
    pub values: u64,
    pub nodes_seen: u32,
    /// Clones computed (with `launches`: launch rounds), over every replayed node.
    pub replayed: u32,
    /// Nodes marked for replay that were not replayed, and rounds ggml failed to compute.
    pub skipped: u32,
    pub failed: u32,
    /// The first skipped or failed node and why (absent when both counts are 0).
    #[serde(default)]
    pub problem: Option<String>,
}

/// The answer to `calibrate`: the raw rounds of the isolation calibration graph.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibrated {
    /// Per round, per node of the pattern: TIMED ns from ask to observe.
    pub timed_ns: Vec<Vec<u64>>,
    /// Per round: the FUSED graph's wall, ns.
    pub fused_ns: Vec<u64>,
}

fn tensor_desc(t: &WireTensor) -> TensorDesc {
    TensorDesc {
        name: t.name.clone(),
        ne: t.ne,
        ggml_type: t.ggml_type.clone(),
        size_bytes: t.bytes,
        is_weight: t.weight,
        nb: t.nb,
        producer: t.producer,
    }
}

/// A node's device as opledger names it: an RPC device with its server (`RPC0[host:port]`, the
/// device's description in ggml's list), any other as ggml
/// does (`CPU`, `CUDA0`).
pub fn device_label(name: &str, devices: &[Device]) -> String {
    match devices.iter().find(|d| d.name == name) {
        Some(d) if opledger_core::split::is_remote(name) && !d.description.is_empty() => {
            format!("{name}[{}]", d.description)
        }
        _ => name.to_string(),
    }
}

/// The captured nodes in opledger's schema; `devices` (ggml's list) names each node's device
/// (`None`: no device kept). A source's producer must be an earlier node.
pub fn node_infos(nodes: &[WireNode], devices: Option<&[Device]>) -> Result<Vec<NodeInfo>, String> {
    nodes
        .iter()
        .enumerate()
        .map(|(i, n)| {
            for s in n.srcs.iter().flatten() {
                if s.producer.is_some_and(|p| p as usize >= i) {
                    return Err(format!(
                        "node {i} ({}) reads node {} which comes after it",
                        n.out.name,
                        s.producer.unwrap_or(0)
                    ));
                }
            }
            let is_view = is_view_op(&n.op);
            Ok(NodeInfo {
                index: i as u32,
                layer: layer_of(&n.out.name),
                out: tensor_desc(&n.out),
                srcs: n.srcs.iter().map(|s| s.as_ref().map(tensor_desc)).collect(),
                inplace: !is_view && n.view_src,
                skipped: !is_view && !n.compute,
                op_code: Some(n.code),
                op_params: n.params.clone(),
                is_view,
                name: n.out.name.clone(),
                op: n.op.clone(),
                device: devices.and_then(|list| n.device.as_deref().map(|d| device_label(d, list))),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = r#"{"protocol":"opledger-llama-worker","version":4,"llama":{"commit":"abc","build":"b7","ggml_version":"0.26.0","ggml_commit":"x","compiler":"gcc 12","build_options":"GGML_AVX2=ON","system_info":"CPU : AVX2 = 1","backends":["CPU"],"devices":[{"name":"CPU","description":"AMD","type":"cpu","memory_total":10,"memory_free":5}]}}"#;

    #[test]
    fn a_hello_names_the_build_and_another_version_is_refused_by_name() {
        let h = parse_hello(HELLO).unwrap();
        assert_eq!(h.llama.devices[0].name, "CPU");
        assert_eq!(h.build_label(), "llama.cpp b7 (abc), ggml 0.26.0");
        let v1 = HELLO.replace("\"version\":4", "\"version\":1");
        let e = parse_hello(&v1).unwrap_err();
        assert_eq!(
            e,
            ProtocolError::Version {
                name: PROTOCOL_NAME.into(),
                version: 1
            }
        );
        assert!(e.to_string().contains("version 1"), "{e}");
        // another program's JSON
        assert!(matches!(
            parse_hello(r#"{"protocol":"lsp","version":1}"#),
            Err(ProtocolError::Version { .. })
        ));
        // an unknown field is an error, not a guess
        let extra = HELLO.replace("\"build\":\"b7\"", "\"build\":\"b7\",\"colour\":\"red\"");
        assert!(matches!(
            parse_hello(&extra),
            Err(ProtocolError::NotProtocol { .. })
        ));
    }

    #[test]
    fn answers_are_checked_for_their_id_their_fields_and_refusals() {
        let a: Answer<Contexts> = parse_answer(r#"{"id":3,"ok":true,"n_ctx":512}"#, 3).unwrap();
        assert_eq!(a, Answer::Ok(Contexts { n_ctx: 512 }));
        let r: Answer<Contexts> =
            parse_answer(r#"{"id":3,"ok":false,"error":"no model"}"#, 3).unwrap();
        assert_eq!(r, Answer::Refused("no model".into()));
        assert!(matches!(
            parse_answer::<Contexts>(r#"{"id":2,"ok":true,"n_ctx":512}"#, 3),
            Err(ProtocolError::WrongId { expected: 3, .. })
        ));
        assert!(matches!(
            parse_answer::<Contexts>(r#"{"id":3,"ok":true,"n_ctx":512,"x":1}"#, 3),
            Err(ProtocolError::NotProtocol { .. })
        ));
        assert!(matches!(
            parse_answer::<Contexts>(r#"{"id":3,"ok":true}"#, 3),
            Err(ProtocolError::NotProtocol { .. })
        ));
        // u64 hashes survive exactly (above 2^53)
        let d: Answer<Decoded> = parse_answer(
            r#"{"id":1,"ok":true,"wall_ns":5,"row_hashes":[18446744073709551557],"non_finite":0,"values":9}"#,
            1,
        )
        .unwrap();
        let Answer::Ok(d) = d else { panic!() };
        assert_eq!(d.row_hashes, [18_446_744_073_709_551_557]);
    }

    /// Garbage, truncated and mangled lines: every one is an error, none a panic.
    #[test]
    fn garbage_and_truncated_lines_are_errors_never_panics() {
        let good = r#"{"id":1,"ok":true,"wall_ns":5,"row_hashes":[1,2],"non_finite":0,"values":9,"nodes_seen":2,"ops":[1,2],"nodes":[{"op":"ADD","code":2,"out":{"name":"a-0","ne":[1,1,1,1],"nb":[4,4,4,4],"type":"f32","bytes":4,"weight":false},"srcs":[null],"view_src":false,"compute":true,"params":[],"threads":1,"device":"CPU"}]}"#;
        assert!(matches!(
            parse_answer::<Decoded>(good, 1),
            Ok(Answer::Ok(_))
        ));
        // every prefix of a good answer is refused
        for cut in 0..good.len() {
            let r = parse_answer::<Decoded>(&good[..cut], 1);
            assert!(r.is_err(), "prefix of {cut} bytes accepted");
        }
        // bytes flipped one at a time: never a panic
        let mut state = 0x1234_5678_u64;
        for _ in 0..2000 {
            state = opledger_core::tokens::splitmix64(state);
            let mut b = good.as_bytes().to_vec();
            let at = (state % b.len() as u64) as usize;
            b[at] = (state >> 32) as u8;
            let s = String::from_utf8_lossy(&b);
            let _ = parse_answer::<Decoded>(&s, 1);
            let _ = parse_hello(&s);
        }
        for junk in [
            "",
            "\u{0}",
            "[]",
            "null",
            "{",
            "}",
            "ok",
            "{\"id\":1}",
            "1e999",
        ] {
            assert!(parse_answer::<Decoded>(junk, 1).is_err(), "{junk:?}");
            assert!(parse_hello(junk).is_err(), "{junk:?}");
        }
    }

    #[test]
    fn a_timed_op_answers_every_repetition_and_a_timed_decode_its_expert_ids() {
        let a: Answer<TimedOp> = parse_answer(
            r#"{"id":4,"ok":true,"ns":[900,1100,1000],"rotation":3,"weight_buffer":"CPU_REPACK","backend":"CPU"}"#,
            4,
        )
        .unwrap();
        let Answer::Ok(t) = a else { panic!() };
        assert_eq!(
            (t.ns, t.rotation, t.weight_buffer.as_str()),
            (vec![900, 1100, 1000], 3, "CPU_REPACK")
        );
        // a summary is opledger's, never the worker's
        assert!(parse_answer::<TimedOp>(
            r#"{"id":4,"ok":true,"ns":[1],"rotation":1,"weight_buffer":"CPU","backend":"CPU","median_ns":1}"#,
            4
        )
        .is_err());
        let d: Answer<Decoded> = parse_answer(
            r#"{"id":5,"ok":true,"wall_ns":5,"row_hashes":[1],"non_finite":0,"values":9,"nodes_seen":9,"ids":[{"node":7,"ids":[3,1,0,2]}]}"#,
            5,
        )
        .unwrap();
        let Answer::Ok(d) = d else { panic!() };
        assert_eq!(
            d.ids,
            Some(vec![WireIds {
                node: 7,
                ids: vec![3, 1, 0, 2]
            }])
        );
        assert!(parse_answer::<Decoded>(
            r#"{"id":5,"ok":true,"wall_ns":5,"row_hashes":[1],"non_finite":0,"values":9,"ids":[{"node":7,"ids":[3],"n_used":1}]}"#,
            5
        )
        .is_err());
    }

    #[test]
    fn a_node_to_time_carries_its_op_shapes_strides_types_and_device() {
        let node = opledger_core::peaks::gemm_probe(None);
        let v = time_op_node(&node);
        assert_eq!(v["op"], "MUL_MAT");
        assert!(v["code"].is_null() && v["device"].is_null());
        assert_eq!(v["out"]["ne"], serde_json::json!([4096, 512, 1, 1]));
        assert_eq!(v["srcs"][0]["type"], "f32");
        assert_eq!(v["srcs"][0]["weight"], true);
        assert_eq!(
            v["srcs"][1]["nb"],
            serde_json::json!([4, 16384, 8388608, 8388608])
        );
        assert_eq!(v["srcs"].as_array().unwrap().len(), 2);
    }

    #[test]
    fn captured_nodes_become_node_records_with_producers_checked() {
        let t = |name: &str, producer: Option<u32>| WireTensor {
            name: name.into(),
            ne: [4, 2, 1, 1],
            nb: [4, 16, 32, 32],
            ggml_type: "f32".into(),
            bytes: 32,
            weight: false,
            producer,
        };
        let node = |op: &str, name: &str, srcs: Vec<Option<WireTensor>>, view_src: bool| WireNode {
            op: op.into(),
            code: 1,
            out: t(name, None),
            srcs,
            view_src,
            compute: true,
            params: vec![],
            threads: 64,
            device: Some("CPU".into()),
        };
        let nodes = vec![
            node("MUL_MAT", "Qcur-3", vec![Some(t("x", None))], false),
            node(
                "VIEW",
                "Qcur-3 (view)",
                vec![Some(t("Qcur-3", Some(0)))],
                true,
            ),
            node(
                "CPY",
                "k_cache-3",
                vec![Some(t("Qcur-3 (view)", Some(1)))],
                true,
            ),
        ];
        let infos = node_infos(&nodes, None).unwrap();
        assert_eq!(infos[0].layer, Some(3));
        assert!(infos[1].is_view && !infos[1].inplace);
        assert!(infos[2].inplace && !infos[2].is_view);
        assert_eq!(infos[2].srcs[0].as_ref().unwrap().producer, Some(1));
        assert_eq!(infos[0].device, None);
        let cpu = Device {
            name: "CPU".into(),
            description: "AMD EPYC".into(),
            kind: "cpu".into(),
            ..Device::default()
        };
        let rpc = Device {
            name: "RPC0".into(),
            description: "127.0.0.1:50052".into(),
            kind: "gpu".into(),
            ..Device::default()
        };
        let list = [cpu, rpc];
        assert_eq!(
            node_infos(&nodes, Some(&list)).unwrap()[0]
                .device
                .as_deref(),
            Some("CPU")
        );
        // an RPC device carries its server, a device not in the list its own name
        assert_eq!(device_label("RPC0", &list), "RPC0[127.0.0.1:50052]");
        assert_eq!(device_label("CUDA0", &list), "CUDA0");
        // a source produced by a later node is not a graph ggml computes
        let bad = vec![node("ADD", "a", vec![Some(t("b", Some(1)))], false)];
        assert!(node_infos(&bad, None).is_err());
    }
}
