//! llama.cpp's RPC backend (ggml-rpc, built in through `GGML_RPC=ON` in `.cargo/config.toml`):
//! serving this machine's CPU as a remote device, the pre-flight that talks to a server before
//! ggml does, the remote devices a model is split over, and what happens when a server fails
//! in the middle of a run.
//!
//! ggml's RPC client aborts the process (`GGML_ABORT`) when a server cannot be reached, answers
//! with another protocol version, or closes the connection mid-run. So every server is first
//! asked for its version and device count here, in Rust, with a timeout; and the abort that a
//! server failing later still causes is turned into a clear error and a chosen exit status by
//! [`on_abort`], with a watchdog ([`watch`]) for a server that stops answering without
//! closing the connection.

use std::ffi::{c_char, CStr, CString};
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use llama_cpp_sys_2 as sys;

use crate::backend::{log_tail, Backend};
use crate::error::LlamaError;

/// The RPC protocol version of the vendored ggml (`ggml-rpc.h`: `RPC_PROTO_*_VERSION`). A client
/// accepts a server of the same major version and a minor version not above its own.
pub const PROTOCOL: (u8, u8, u8) = (7, 0, 0);
/// `RPC_CMD_HELLO` (fixed at 14 across versions) and `RPC_CMD_DEVICE_COUNT`.
const CMD_HELLO: u8 = 14;
const CMD_DEVICE_COUNT: u8 = 15;
/// `RPC_CONN_CAPS_SIZE`: the transport capabilities a HELLO carries (all zero: plain TCP).
const CONN_CAPS: usize = 24;

/// A model split across this machine's CPU and remote servers, layer by layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcSplit {
    /// `host:port` of each server, in the order their devices take layers.
    pub servers: Vec<String>,
    /// Repeating layers per device: this machine's CPU first (at least one: the token embedding
    /// stays local, and llama.cpp would switch on pipeline parallelism with none), then each
    /// server's (at least one each). The output layer goes with the last server, as llama.cpp
    /// places it.
    pub layers: Vec<u32>,
    /// How long the pre-flight waits for each step, and how long one decode may go without a
    /// node finishing before the run is stopped.
    pub timeout: Duration,
}

impl RpcSplit {
    /// llama.cpp's `n_gpu_layers` and `tensor_split` for this split
    /// (`opledger_core::split::layer_split`).
    pub fn llama_split(&self) -> Result<(i32, Vec<f32>), LlamaError> {
        if self.layers.len() != self.servers.len() + 1 {
            return Err(LlamaError::Invalid(format!(
                "a split of {} devices for {} servers (the local CPU comes first)",
                self.layers.len(),
                self.servers.len()
            )));
        }
        opledger_core::split::layer_split(&self.layers).ok_or_else(|| {
            LlamaError::Invalid("every device of the split needs at least one layer".into())
        })
    }
}

/// What a server answered to the pre-flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub endpoint: String,
    pub version: (u8, u8, u8),
    pub devices: u32,
}

/// Checks that `endpoint` is `host:port` as ggml parses it (one colon, a port 1..=65535).
pub fn parse_endpoint(endpoint: &str) -> Result<(String, u16), LlamaError> {
    let bad = |why: &str| LlamaError::Rpc {
        endpoint: endpoint.to_string(),
        why: why.to_string(),
    };
    let (host, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| bad("not HOST:PORT"))?;
    if host.is_empty() || host.contains(':') {
        return Err(bad(
            "not HOST:PORT (ggml's RPC client takes an IPv4 address or a name)",
        ));
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| bad("the port is not a number in 1..=65535"))?;
    Ok((host.to_string(), port))
}

/// Connects to `endpoint`, says HELLO as ggml's client does and asks for the device count, each
/// step within `timeout`; refuses a server ggml's client would abort on.
pub fn preflight(endpoint: &str, timeout: Duration) -> Result<ServerInfo, LlamaError> {
    let err = |why: String| LlamaError::Rpc {
        endpoint: endpoint.to_string(),
        why,
    };
    let (host, port) = parse_endpoint(endpoint)?;
    let addrs: Vec<_> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve {host}: {e}")))?
        .collect();
    // ggml's client connects over IPv4 only (gethostbyname, AF_INET): the first IPv4 address
    let addr = addrs.iter().find(|a| a.is_ipv4()).ok_or_else(|| {
        err(format!(
            "{host} resolves to no IPv4 address (ggml's RPC client connects over IPv4 only)"
        ))
    })?;
    let mut s = TcpStream::connect_timeout(addr, timeout).map_err(|e| {
        err(match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused: no RPC server listens there (start one with `opledger rpc-server`)".into()
            }
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                format!("unreachable: no answer within {:.1} s", timeout.as_secs_f64())
            }
            _ => format!("unreachable: {e}"),
        })
    })?;
    let io = |what: &str, e: std::io::Error| {
        err(match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => format!(
                "no answer to {what} within {:.1} s (is it serving another client? a ggml RPC server serves one at a time)",
                timeout.as_secs_f64()
            ),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => format!(
                "closed the connection during {what}: not a ggml RPC server of protocol {}.x, or one that refused this client's HELLO",
                PROTOCOL.0
            ),
            _ => format!("{what} failed: {e}"),
        })
    };
    s.set_read_timeout(Some(timeout))
        .map_err(|e| io("setup", e))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| io("setup", e))?;
    let _ = s.set_nodelay(true);

    let mut hello = vec![CMD_HELLO];
    hello.extend_from_slice(&(CONN_CAPS as u64).to_le_bytes());
    hello.extend_from_slice(&[0u8; CONN_CAPS]);
    s.write_all(&hello).map_err(|e| io("the HELLO", e))?;
    let size = read_u64(&mut s).map_err(|e| io("the HELLO", e))?;
    if !(3..=1024).contains(&size) {
        return Err(err(format!(
            "answered HELLO with {size} bytes: not a ggml RPC server"
        )));
    }
    let mut body = vec![0u8; size as usize];
    s.read_exact(&mut body).map_err(|e| io("the HELLO", e))?;
    let version = (body[0], body[1], body[2]);
    if version.0 != PROTOCOL.0 || version.1 > PROTOCOL.1 {
        return Err(err(format!(
            "speaks RPC protocol {}.{}.{}, this opledger's llama.cpp speaks {}.{}.{} ({}): run `opledger rpc-server` of the same build there",
            version.0, version.1, version.2, PROTOCOL.0, PROTOCOL.1, PROTOCOL.2,
            crate::backend::LLAMA_CPP_SYS_VERSION
        )));
    }
    if size as usize != 4 + CONN_CAPS {
        return Err(err(format!(
            "answered HELLO with {size} bytes, protocol {}.x has {}",
            PROTOCOL.0,
            4 + CONN_CAPS
        )));
    }
    let mut ask = vec![CMD_DEVICE_COUNT];
    ask.extend_from_slice(&0u64.to_le_bytes());
    s.write_all(&ask).map_err(|e| io("the device count", e))?;
    let size = read_u64(&mut s).map_err(|e| io("the device count", e))?;
    if size != 4 {
        return Err(err(format!(
            "answered the device count with {size} bytes, not 4"
        )));
    }
    let mut n = [0u8; 4];
    s.read_exact(&mut n)
        .map_err(|e| io("the device count", e))?;
    let devices = u32::from_le_bytes(n);
    if devices == 0 {
        return Err(err("serves no device".into()));
    }
    Ok(ServerInfo {
        endpoint: endpoint.to_string(),
        version,
        devices,
    })
}

fn read_u64(s: &mut TcpStream) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

/// ggml's RPC backend registration.
fn rpc_reg(_backend: &Backend) -> Result<sys::ggml_backend_reg_t, LlamaError> {
    let name = CString::new("RPC").expect("no NUL");
    // SAFETY: a lookup in ggml's static registry by a NUL-terminated name; the backend token
    // proves the registry is initialised.
    let reg = unsafe { sys::ggml_backend_reg_by_name(name.as_ptr()) };
    if reg.is_null() {
        return Err(LlamaError::Invalid(
            "this llama.cpp was built without its RPC backend (GGML_RPC=ON in .cargo/config.toml)"
                .into(),
        ));
    }
    Ok(reg)
}

/// A function the RPC backend exports by name (`ggml-rpc.h` is not in the bindings).
fn proc_address(
    reg: sys::ggml_backend_reg_t,
    name: &str,
) -> Result<*mut std::ffi::c_void, LlamaError> {
    let c = CString::new(name).expect("no NUL");
    // SAFETY: reg is the live RPC registration; the name is NUL-terminated.
    let p = unsafe { sys::ggml_backend_reg_get_proc_address(reg, c.as_ptr()) };
    if p.is_null() {
        return Err(LlamaError::Invalid(format!(
            "ggml's RPC backend does not export {name}"
        )));
    }
    Ok(p)
}

type AddServerFn = unsafe extern "C" fn(*const c_char) -> sys::ggml_backend_reg_t;
type StartServerFn =
    unsafe extern "C" fn(*const c_char, *const c_char, usize, usize, *mut sys::ggml_backend_dev_t);

/// A remote device a model can be split over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RemoteDevice(pub sys::ggml_backend_dev_t);

// SAFETY: ggml's device handles are process-wide, immutable descriptions owned by the RPC
// registration (never freed); using one from any thread is what ggml itself does.
unsafe impl Send for RemoteDevice {}
// SAFETY: see above.
unsafe impl Sync for RemoteDevice {}

/// The first device of each server, in order, after a pre-flight of each.
pub(crate) fn remote_devices(
    backend: &Backend,
    servers: &[String],
    timeout: Duration,
) -> Result<Vec<RemoteDevice>, LlamaError> {
    let reg = rpc_reg(backend)?;
    let add = proc_address(reg, "ggml_backend_rpc_add_server")?;
    // SAFETY: ggml-rpc.h declares ggml_backend_rpc_add_server with this signature.
    let add: AddServerFn =
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, AddServerFn>(add) };
    let mut out = Vec::with_capacity(servers.len());
    for endpoint in servers {
        preflight(endpoint, timeout)?;
        let c = CString::new(endpoint.as_str()).map_err(|_| LlamaError::Rpc {
            endpoint: endpoint.clone(),
            why: "contains a NUL byte".into(),
        })?;
        // SAFETY: a NUL-terminated endpoint that answered the pre-flight; ggml keeps its own
        // copy of the string and returns a registration it never frees, or null.
        let server = unsafe { add(c.as_ptr()) };
        if server.is_null() {
            return Err(LlamaError::Rpc {
                endpoint: endpoint.clone(),
                why: format!("ggml could not add the server ({})", log_tail(2)),
            });
        }
        // SAFETY: server is a live registration with at least one device (the pre-flight
        // counted them).
        let dev = unsafe { sys::ggml_backend_reg_dev_get(server, 0) };
        if dev.is_null() {
            return Err(LlamaError::Rpc {
                endpoint: endpoint.clone(),
                why: "the server lists no device".into(),
            });
        }
        out.push(RemoteDevice(dev));
    }
    Ok(out)
}

/// Serves this machine's CPU to one RPC client at a time on `endpoint` (ggml's own server,
/// `ggml_backend_rpc_start_server`). Returns only when the server cannot start or stops.
pub fn serve(backend: &Backend, endpoint: &str, threads: u32) -> Result<(), LlamaError> {
    parse_endpoint(endpoint)?;
    let reg = rpc_reg(backend)?;
    let start = proc_address(reg, "ggml_backend_rpc_start_server")?;
    // SAFETY: ggml-rpc.h declares ggml_backend_rpc_start_server with this signature.
    let start: StartServerFn =
        unsafe { std::mem::transmute::<*mut std::ffi::c_void, StartServerFn>(start) };
    // SAFETY: a lookup in ggml's registry; the CPU backend is always built in.
    let mut cpu = unsafe { sys::ggml_backend_dev_by_type(sys::GGML_BACKEND_DEVICE_TYPE_CPU) };
    if cpu.is_null() {
        return Err(LlamaError::Invalid("ggml has no CPU device".into()));
    }
    let c = CString::new(endpoint).map_err(|_| LlamaError::Invalid("NUL in endpoint".into()))?;
    // SAFETY: endpoint is NUL-terminated; no cache directory (null); one device, the CPU's,
    // passed as a one-element array that outlives the call (which blocks while serving).
    unsafe {
        start(
            c.as_ptr(),
            std::ptr::null(),
            threads.max(1) as usize,
            1,
            &mut cpu,
        )
    };
    Err(LlamaError::Rpc {
        endpoint: endpoint.to_string(),
        why: format!("the RPC server stopped ({})", log_tail(2)),
    })
}

/// The buffer holding a tensor's memory (the buffer of the tensor it views when it has none;
/// null when neither has one).
fn buffer_of(t: &sys::ggml_tensor) -> sys::ggml_backend_buffer_t {
    if t.buffer.is_null() && !t.view_src.is_null() {
        // SAFETY: a non-null view source of a live tensor is a live tensor.
        unsafe { (*t.view_src).buffer }
    } else {
        t.buffer
    }
}

/// The device a tensor's memory lives on (null without a buffer or when its buffer type names
/// no device).
fn device_of(t: &sys::ggml_tensor) -> sys::ggml_backend_dev_t {
    let buf = buffer_of(t);
    if buf.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: a live buffer has a buffer type; the call reads its device pointer.
    unsafe { sys::ggml_backend_buft_get_device(sys::ggml_backend_buffer_get_type(buf)) }
}

/// The device a tensor's memory lives on, by name: the device of its buffer's type (`CPU` for
/// the CPU's plain, mapped and repacked buffers alike, `CUDA0`), an RPC device with its server
/// (`RPC1[127.0.0.1:50052]`: ggml numbers RPC devices across servers). Without a device, the
/// buffer's own name.
pub(crate) fn buffer_device(t: &sys::ggml_tensor) -> Option<String> {
    let text = |p: *const c_char| {
        // SAFETY: a NUL-terminated string ggml owns for the life of the device or buffer.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let dev = device_of(t);
    if dev.is_null() {
        let buf = buffer_of(t);
        // SAFETY: a live buffer; its name is a string it owns.
        return (!buf.is_null()).then(|| text(unsafe { sys::ggml_backend_buffer_name(buf) }))?;
    }
    // SAFETY: a live device; name and description are strings it owns.
    let name = text(unsafe { sys::ggml_backend_dev_name(dev) })?;
    if opledger_core::split::is_remote(&name) {
        // SAFETY: as above.
        let at = text(unsafe { sys::ggml_backend_dev_description(dev) }).unwrap_or_default();
        return Some(format!("{name}[{at}]"));
    }
    Some(name)
}

/// The device of a tensor's memory as an address (0 without one; the buffer type's address
/// when it names no device).
pub(crate) fn device_id(t: &sys::ggml_tensor) -> usize {
    let dev = device_of(t);
    if !dev.is_null() {
        return dev as usize;
    }
    let buf = buffer_of(t);
    if buf.is_null() {
        return 0;
    }
    // SAFETY: a live buffer; the call reads its type pointer.
    unsafe { sys::ggml_backend_buffer_get_type(buf) as usize }
}

/// Whether a tensor lives on a remote device (an RPC buffer: data that must never be read
/// through its pointer).
pub(crate) fn is_remote(t: &sys::ggml_tensor) -> bool {
    let buf = buffer_of(t);
    // SAFETY: a live buffer, or null (checked first).
    !buf.is_null() && unsafe { !sys::ggml_backend_buffer_is_host(buf) }
}

/// Waits until a remote device has done everything sent to it so far (computed `t`, stored the
/// inputs copied to it) by reading up to 4 bytes of `t` back: ggml's RPC client sends a graph or
/// a tensor without waiting for its end (the scheduler's "synchronize" only waits for the send),
/// and a server answers requests in order. Returns false when there is nothing to read.
pub(crate) fn fence(t: &sys::ggml_tensor) -> bool {
    // SAFETY: t is a live node of the graph being computed; ggml_nbytes reads its shape only.
    let n = unsafe { sys::ggml_nbytes(t) }.min(4);
    if n == 0 || t.data.is_null() {
        return false;
    }
    let mut out = [0u8; 4];
    // SAFETY: reads n <= nbytes bytes of t through its backend (a request to the server; the
    // remote pointer is never dereferenced here) into a 4-byte local buffer.
    unsafe { sys::ggml_backend_tensor_get(t, out.as_mut_ptr().cast(), 0, n) };
    true
}

/// What a failed remote device ends in: ggml's client aborts, so the process ends in the hook
/// given here (a message and an exit status chosen by the command), never in a crash.
static ABORT_HOOK: Mutex<Option<AbortHook>> = Mutex::new(None);

/// What [`on_abort`] is given: prints and records why the run stopped.
pub type AbortHook = Arc<dyn Fn(&str) + Send + Sync>;

/// Sets what the process does before it ends when ggml aborts (a remote server failed): the
/// hook prints and records, then the process exits with `status` without running destructors
/// (other threads are inside ggml). Replaces an earlier hook.
pub fn on_abort(hook: AbortHook, status: u8) {
    EXIT_STATUS.store(status as u64, Ordering::Relaxed);
    if let Ok(mut h) = ABORT_HOOK.lock() {
        *h = Some(hook);
    }
    // SAFETY: stores a function pointer with a 'static lifetime; abort_trampoline never unwinds.
    unsafe {
        sys::ggml_set_abort_callback(Some(abort_trampoline));
    }
}

static EXIT_STATUS: AtomicU64 = AtomicU64::new(1);

/// Ends the process after the hook: `_exit`, because ggml's other threads (the thread pool, the
/// RPC dispatcher) are still inside C++ and static destructors would race them.
fn end(message: &str) -> ! {
    static ENDING: AtomicBool = AtomicBool::new(false);
    if !ENDING.swap(true, Ordering::SeqCst) {
        // the hook prints and writes a file; should it block (a lock held by a thread stopped
        // inside ggml), the process still ends
        std::thread::spawn(|| {
            std::thread::sleep(Duration::from_secs(5));
            // SAFETY: _exit ends the process at once.
            unsafe { libc::_exit(EXIT_STATUS.load(Ordering::Relaxed) as i32) }
        });
        let hook = ABORT_HOOK.lock().ok().and_then(|g| g.clone());
        if let Some(hook) = hook {
            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| hook(message)));
        } else {
            eprintln!("error: {message}");
        }
        // SAFETY: _exit ends the process at once; nothing is used afterwards.
        unsafe { libc::_exit(EXIT_STATUS.load(Ordering::Relaxed) as i32) }
    }
    // another thread is ending the process: wait for it
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

unsafe extern "C" fn abort_trampoline(message: *const c_char) {
    let text = if message.is_null() {
        "ggml aborted".to_string()
    } else {
        // SAFETY: ggml passes a NUL-terminated message valid for the call.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    };
    // ggml's message starts with its source file and line: keep the words
    let words = text
        .split_once(": ")
        .filter(|(loc, _)| loc.contains(".c"))
        .map(|(_, w)| w.trim().to_string())
        .unwrap_or_else(|| text.trim().to_string());
    end(&format!("llama.cpp aborted the run: {words}"));
}

/// The watchdog: ends the process when one watched call into llama.cpp makes no progress for
/// the timeout. A server that stops answering without closing the connection (stopped, or its
/// host gone) would otherwise keep the run waiting forever inside ggml. Armed around every call
/// of a split model that talks to its servers ([`Watched`]: the load, a decode, a state saved
/// or restored), fed by the eval callback at every node and by the load's progress ([`tick`]);
/// it ends the process through the same hook as an abort.
#[derive(Debug)]
struct WatchState {
    start: Instant,
    timeout_ms: AtomicU64,
    last_ms: AtomicU64,
    armed: AtomicBool,
}

static WATCH: OnceLock<Arc<WatchState>> = OnceLock::new();

/// Starts the watchdog (once per process) or changes its timeout.
pub(crate) fn watch(timeout: Duration) {
    let state = WATCH.get_or_init(|| {
        let s = Arc::new(WatchState {
            start: Instant::now(),
            timeout_ms: AtomicU64::new(timeout.as_millis() as u64),
            last_ms: AtomicU64::new(0),
            armed: AtomicBool::new(false),
        });
        let w = s.clone();
        std::thread::spawn(move || loop {
            let timeout_ms = w.timeout_ms.load(Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis((timeout_ms / 10).clamp(10, 500)));
            // armed first, then the last progress: arming marks progress before it arms
            if !w.armed.load(Ordering::SeqCst) {
                continue;
            }
            let last = w.last_ms.load(Ordering::SeqCst);
            let now = w.start.elapsed().as_millis() as u64;
            if now.saturating_sub(last) > timeout_ms {
                end(&format!(
                    "no progress for {:.1} s (--rpc-timeout): a remote RPC server stopped answering, or one step of the run takes longer than the timeout (a FUSED decode, which reports no node, counts as one step; raise --rpc-timeout then)",
                    timeout_ms as f64 / 1e3
                ));
            }
        });
        s
    });
    state
        .timeout_ms
        .store(timeout.as_millis() as u64, Ordering::Relaxed);
}

/// Marks progress (a node computed); nothing when no watchdog runs.
pub(crate) fn tick() {
    if let Some(w) = WATCH.get() {
        w.last_ms
            .store(w.start.elapsed().as_millis() as u64, Ordering::SeqCst);
    }
}

/// Watches from now (around a decode) or stops watching.
fn arm(on: bool) {
    if let Some(w) = WATCH.get() {
        tick();
        w.armed.store(on, Ordering::SeqCst);
    }
}

/// Watches while it lives (when `on`: a call into llama.cpp that talks to remote devices).
pub(crate) struct Watched(bool);

impl Watched {
    pub(crate) fn new(on: bool) -> Watched {
        if on {
            arm(true);
        }
        Watched(on)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        if self.0 {
            arm(false);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_in_llama_cpp_terms_puts_the_output_with_the_last_server() {
        let split = RpcSplit {
            servers: vec!["a:1".into(), "b:2".into()],
            layers: vec![2, 3, 1],
            timeout: Duration::from_secs(1),
        };
        // 4 remote layers + the output slot; proportions 3 and 1 + 1
        assert_eq!(split.llama_split().unwrap(), (5, vec![3.0, 2.0]));
        // llama.cpp's rule (llama-model.cpp): slot k of the last n_gpu_layers goes to the
        // first device whose cumulative share exceeds k / n_gpu_layers
        let (n, s) = split.llama_split().unwrap();
        let total: f32 = s.iter().sum();
        let cum: Vec<f32> = s
            .iter()
            .scan(0.0, |a, x| {
                *a += x;
                Some(*a / total)
            })
            .collect();
        let device = |k: i32| cum.partition_point(|&c| c <= k as f32 / n as f32);
        let placed: Vec<usize> = (0..n).map(device).collect();
        // layers 2, 3, 4 on server 0; layer 5 and the output on server 1
        assert_eq!(placed, [0, 0, 0, 1, 1]);
        let bad = RpcSplit {
            layers: vec![0, 3, 1],
            ..split.clone()
        };
        assert!(bad.llama_split().is_err());
    }

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(
            parse_endpoint("127.0.0.1:50052").unwrap(),
            ("127.0.0.1".into(), 50052)
        );
        assert!(parse_endpoint("127.0.0.1").is_err());
        assert!(parse_endpoint(":50052").is_err());
        assert!(parse_endpoint("127.0.0.1:0").is_err());
        assert!(parse_endpoint("127.0.0.1:70000").is_err());
        assert!(parse_endpoint("::1:50052").is_err());
    }
}
