//! The eval-callback instrument: what llama.cpp's scheduler calls for every node, and the
//! trampoline that turns those calls into node records and timings without ever unwinding into C.

use std::collections::HashMap;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Instant;

use llama_cpp_sys_2 as sys;

use opledger_core::node::{is_view_op, layer_of, NodeInfo, TensorDesc};

use crate::model::c_chars_to_string;

/// What the instrument does during the next decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObserveMode {
    /// Answer "no" to every ask (native speed), only counting nodes.
    Count,
    /// Answer "no" to every ask (native speed) and record every node's description.
    Capture,
    /// Answer "yes" to every ask: every node computed alone, timed from ask to observe.
    Timed,
    /// Cut the graph at the plan's nodes and replay some of them k extra times into scratch
    /// (see [`crate::replay`]).
    Replay,
}

/// The callback's state. Lives in a Box owned by the context; llama.cpp holds a raw pointer to
/// it as `cb_eval_user_data` and calls back only from inside `llama_decode`.
#[derive(Debug)]
pub(crate) struct Observer {
    pub mode: ObserveMode,
    pub nodes_seen: u32,
    pub captured: Vec<NodeInfo>,
    /// Tensor address -> node index, to link sources to the nodes that compute them.
    producers: HashMap<usize, u32>,
    /// Per-node nanoseconds, TIMED mode, in the order the nodes were observed.
    pub timed_ns: Vec<u64>,
    /// The op code of every captured or timed node, to check a TIMED run against the captured
    /// graph.
    pub ops: Vec<u32>,
    t_ask: Option<Instant>,
    pub panic: Option<String>,
    /// In TIMED mode, copy the expert ids each MUL_MAT_ID node reads (its `src[2]`,
    /// `[n_used, n_tokens]`): (node index, ids).
    pub capture_ids: bool,
    pub ids: Vec<(u32, Vec<i32>)>,
    /// Replay mode: what to cut and replay, and the resources to do it.
    pub plan: crate::replay::ReplayPlan,
    pub replayer: Option<crate::replay::Replayer>,
    /// Capture mode: for every node, whether ggml's CPU backend splits it over the pool's
    /// threads (`true`) or computes it on one (views, and ops such as SUM_ROWS, GET_ROWS or
    /// SIGMOID), from ggml's own plan of a graph of that node alone.
    pub all_threads: Vec<bool>,
    planner: Option<Planner>,
    /// The graph is split across devices (RPC): record each node's device, and in TIMED mode
    /// wait for every remote node to finish (see [`crate::rpc::fence`]).
    pub devices: bool,
    /// TIMED mode: per node, the wall between the previous node's end and this node's start
    /// (where the device changes, the scheduler's copies of the split's inputs).
    pub gap_ns: Vec<u64>,
    /// TIMED mode: when the last node ended.
    pub last_end: Option<Instant>,
    /// TIMED mode, split graphs: the buffer type of the last node's output (its device).
    last_device: usize,
}

/// A small ggml context in which a graph of one node is planned (`ggml_graph_plan`): how many
/// of the pool's threads the CPU backend would give it.
#[derive(Debug)]
struct Planner(std::ptr::NonNull<sys::ggml_context>);

impl Planner {
    fn new() -> Option<Planner> {
        // SAFETY: a size query, then ggml_init with no_alloc: metadata only, owned or null.
        unsafe {
            let params = sys::ggml_init_params {
                mem_size: sys::ggml_graph_overhead_custom(1, false) + 1024,
                mem_buffer: std::ptr::null_mut(),
                no_alloc: true,
            };
            std::ptr::NonNull::new(sys::ggml_init(params)).map(Planner)
        }
    }

    /// Whether ggml plans `t` on more than one thread (asked with 64 threads available).
    fn all_threads(&mut self, t: &sys::ggml_tensor) -> bool {
        // SAFETY: the context is ours and reset before each use; the graph holds only a pointer
        // to t, a live node of the graph being computed, and ggml_graph_plan reads its fields
        // (op, parameters, sources' types and buffers) without writing anything or allocating.
        unsafe {
            sys::ggml_reset(self.0.as_ptr());
            let g = sys::ggml_new_graph_custom(self.0.as_ptr(), 1, false);
            if g.is_null() {
                return true;
            }
            sys::ggml_graph_add_node(g, t as *const _ as *mut _);
            sys::ggml_graph_plan(g, 64, std::ptr::null_mut()).n_threads > 1
        }
    }
}

impl Drop for Planner {
    fn drop(&mut self) {
        // SAFETY: from ggml_init, freed once; the graphs in it are not used after a plan.
        unsafe { sys::ggml_free(self.0.as_ptr()) }
    }
}

// SAFETY: the Planner is used only from the thread that runs llama_decode (inside the eval
// callback), never concurrently.
unsafe impl Send for Planner {}

impl Observer {
    pub fn new() -> Observer {
        Observer {
            mode: ObserveMode::Count,
            nodes_seen: 0,
            captured: Vec::new(),
            producers: HashMap::new(),
            timed_ns: Vec::new(),
            ops: Vec::new(),
            t_ask: None,
            panic: None,
            capture_ids: false,
            ids: Vec::new(),
            plan: crate::replay::ReplayPlan::default(),
            replayer: None,
            all_threads: Vec::new(),
            planner: None,
            devices: false,
            gap_ns: Vec::new(),
            last_end: None,
            last_device: 0,
        }
    }

    /// Clears the per-run records and sets the mode for the next decode.
    pub fn reset(&mut self, mode: ObserveMode) {
        self.mode = mode;
        self.nodes_seen = 0;
        self.captured.clear();
        self.producers.clear();
        self.timed_ns.clear();
        self.ops.clear();
        self.t_ask = None;
        self.panic = None;
        self.ids.clear();
        self.all_threads.clear();
        self.gap_ns.clear();
        self.last_end = None;
        self.last_device = 0;
    }

    fn on_eval(&mut self, t: &sys::ggml_tensor, ask: bool) -> bool {
        match (self.mode, ask) {
            (ObserveMode::Replay, true) => {
                let i = self.nodes_seen as usize;
                self.nodes_seen += 1;
                self.plan.cut.get(i).copied().unwrap_or(false)
            }
            (ObserveMode::Replay, false) => {
                let i = self.nodes_seen.saturating_sub(1) as usize;
                if self.plan.replay.get(i).copied().unwrap_or(false) {
                    if let Some(r) = self.replayer.as_mut() {
                        if self.plan.launches_only {
                            return r.launch_rounds(self.plan.k);
                        }
                        // SAFETY: t is the node the scheduler just computed; its sources are
                        // live tensors of the graph being computed.
                        return unsafe { r.replay(t as *const _ as *mut _, self.plan.k) };
                    }
                }
                true
            }
            (ObserveMode::Timed, true) => {
                self.nodes_seen += 1;
                if self.devices {
                    // the first node of a split on a remote device: its inputs were sent
                    // without waiting (ggml's set_tensor is one-way); wait for them to land, so
                    // the transfer is timed as the gap and not inside the node
                    let device = crate::rpc::device_id(t);
                    if device != self.last_device && crate::rpc::is_remote(t) {
                        crate::rpc::fence(t);
                    }
                    self.last_device = device;
                }
                let now = Instant::now();
                let gap = self
                    .last_end
                    .map_or(0, |t| now.duration_since(t).as_nanos() as u64);
                self.gap_ns.push(gap);
                self.t_ask = Some(now);
                true
            }
            (ObserveMode::Timed, false) => {
                let remote = self.devices && crate::rpc::is_remote(t);
                if remote {
                    crate::rpc::fence(t);
                }
                let ns = self
                    .t_ask
                    .take()
                    .map(|t0| t0.elapsed().as_nanos() as u64)
                    .unwrap_or(0);
                self.last_end = Some(Instant::now());
                let index = self.timed_ns.len() as u32;
                self.timed_ns.push(ns);
                self.ops.push(t.op);
                if self.capture_ids && t.op == sys::GGML_OP_MUL_MAT_ID {
                    if let Some(ids) = read_ids(t) {
                        self.ids.push((index, ids));
                    }
                }
                true
            }
            (ObserveMode::Count, true) => {
                self.nodes_seen += 1;
                false
            }
            (ObserveMode::Capture, true) => {
                let index = self.nodes_seen;
                self.nodes_seen += 1;
                let mut node = describe_node(t, index, &self.producers);
                if self.devices {
                    node.device = crate::rpc::buffer_device(t);
                }
                self.captured.push(node);
                self.producers.insert(t as *const _ as usize, index);
                self.ops.push(t.op);
                if self.planner.is_none() {
                    self.planner = Planner::new();
                }
                let all = self.planner.as_mut().is_none_or(|p| p.all_threads(t));
                self.all_threads.push(all);
                false
            }
            // An observe call we did not ask for cannot happen; keep computing if it does.
            (_, false) => true,
        }
    }
}

/// The trampoline llama.cpp calls for every node (`ggml_backend_sched_eval_callback`).
///
/// # Safety
/// `user_data` must point to a live `Observer` that nothing else accesses during the call, and
/// `t` must be null or a valid tensor of the graph being computed.
pub(crate) unsafe extern "C" fn eval_trampoline(
    t: *mut sys::ggml_tensor,
    ask: bool,
    user_data: *mut c_void,
) -> bool {
    if t.is_null() || user_data.is_null() {
        return false;
    }
    // SAFETY: the context passes the pointer of its boxed Observer as user data and touches it
    // only outside llama_decode, so we hold the only reference during the call.
    let obs = unsafe { &mut *(user_data as *mut Observer) };
    // SAFETY: t is a non-null node of the graph the scheduler is computing, valid for the call.
    let tensor = unsafe { &*t };
    crate::rpc::tick();
    match catch_unwind(AssertUnwindSafe(|| obs.on_eval(tensor, ask))) {
        Ok(answer) => answer,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            obs.panic.get_or_insert(msg);
            // "no" to an ask keeps computing natively; "false" to an observe stops the graph.
            false
        }
    }
}

/// The expert ids a MUL_MAT_ID node read (`src[2]`, I32 `[n_used, n_tokens]`, possibly strided),
/// copied out row by row. `None` when the tensor is not what is expected.
fn read_ids(t: &sys::ggml_tensor) -> Option<Vec<i32>> {
    let ids = t.src[2];
    if ids.is_null() {
        return None;
    }
    // SAFETY: a non-null source of the node just computed is a live, computed tensor.
    let ids = unsafe { &*ids };
    if ids.type_ != sys::GGML_TYPE_I32 || ids.buffer.is_null() || ids.ne[2] != 1 || ids.ne[3] != 1 {
        return None;
    }
    let (n_used, n_tokens) = (ids.ne[0].max(0) as usize, ids.ne[1].max(0) as usize);
    if ids.nb[0] != 4 {
        return None;
    }
    let mut out = vec![0i32; n_used * n_tokens];
    for (row, dst) in out.chunks_exact_mut(n_used.max(1)).enumerate() {
        // SAFETY: the row lies inside the tensor (row < ne[1], n_used x 4 bytes at stride
        // nb[1]); dst holds exactly n_used i32 values.
        unsafe {
            sys::ggml_backend_tensor_get(ids, dst.as_mut_ptr().cast(), row * ids.nb[1], n_used * 4);
        }
    }
    Some(out)
}

/// The description of one node in the common schema.
fn describe_node(t: &sys::ggml_tensor, index: u32, producers: &HashMap<usize, u32>) -> NodeInfo {
    // SAFETY: ggml_op_desc reads only t's op fields and returns a static string.
    let op = unsafe { static_str(sys::ggml_op_desc(t)) };
    let name = c_chars_to_string(&t.name);
    let srcs = t
        .src
        .iter()
        .rposition(|s| !s.is_null())
        .map(|last| {
            t.src[..=last]
                .iter()
                .map(|&s| {
                    if s.is_null() {
                        None
                    } else {
                        // SAFETY: a non-null source of a live graph node is a live tensor.
                        let mut d = describe_tensor(unsafe { &*s });
                        d.producer = producers.get(&(s as usize)).copied();
                        Some(d)
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let is_view = is_view_op(&op);
    NodeInfo {
        index,
        layer: layer_of(&name),
        out: describe_tensor(t),
        srcs,
        inplace: !is_view && !t.view_src.is_null(),
        skipped: !is_view && (t.flags & sys::GGML_TENSOR_FLAG_COMPUTE as i32) == 0,
        op_code: Some(t.op),
        op_params: {
            let mut p = t.op_params.to_vec();
            while p.last() == Some(&0) {
                p.pop();
            }
            p
        },
        is_view,
        name,
        op,
        device: None,
    }
}

fn describe_tensor(t: &sys::ggml_tensor) -> TensorDesc {
    // SAFETY: t is a live tensor; these functions only read its fields, and ggml_type_name
    // returns a static string.
    let (size_bytes, ggml_type) = unsafe {
        (
            sys::ggml_nbytes(t) as u64,
            static_str(sys::ggml_type_name(t.type_)),
        )
    };
    let is_weight = !t.buffer.is_null()
        // SAFETY: a non-null buffer of a live tensor is a live buffer.
        && unsafe { sys::ggml_backend_buffer_get_usage(t.buffer) }
            == sys::GGML_BACKEND_BUFFER_USAGE_WEIGHTS;
    TensorDesc {
        name: c_chars_to_string(&t.name),
        ne: t.ne,
        ggml_type,
        size_bytes,
        is_weight,
        producer: None,
        nb: t.nb.map(|v| v as u64),
    }
}

/// A static C string from ggml as a String ("?" when null).
///
/// # Safety
/// `p` must be null or point to a NUL-terminated string.
unsafe fn static_str(p: *const std::ffi::c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: per the contract, p is a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
