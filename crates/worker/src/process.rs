//! The worker process: started with a channel of its own, greeted, asked one request at a time
//! with a timeout on every write and read, and always reaped. Every fault names the worker and
//! what it did.
//!
//! The channel is one end of a Unix socket pair, given to the child as its file descriptor 3
//! (`--channel-fd 3`); requests and answers both travel on it. The child's stdout and stderr are
//! pipes that two threads drain as bytes for as long as the child lives, keeping their last lines
//! for error messages (and passing them through to this process's stderr with `--verbose`): what
//! llama.cpp, a backend or a stray `printf` writes there cannot touch the protocol, and a full
//! pipe never blocks the worker.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use command_fds::{CommandFdExt, FdMapping};

use crate::protocol::{excerpt, parse_answer, parse_hello, Answer, Hello, ProtocolError};

/// A fault of the worker, or a request it refused. `Fault` ends the run (README "Exit codes":
/// the worker failed); `Refused` is the worker's own error answer (llama.cpp refused the model,
/// a decode failed), said in its words.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("the llama.cpp worker {}: {what}", worker.display())]
    Fault { worker: PathBuf, what: String },
    #[error("the llama.cpp worker {} cannot be started: {why}", worker.display())]
    Start { worker: PathBuf, why: String },
    #[error("the llama.cpp worker {} {problem}", worker.display())]
    Protocol {
        worker: PathBuf,
        problem: ProtocolError,
    },
    #[error("the llama.cpp worker {} refused '{op}': {why}", worker.display())]
    Refused {
        worker: PathBuf,
        op: String,
        why: String,
    },
    /// A worker over RPC servers ended because a remote device failed mid-run: it exited with
    /// [`REMOTE_FAILED_STATUS`] (ggml's RPC client aborted, or its watchdog found no progress
    /// for the RPC timeout), or it died with ggml's RPC abort in its last words. `why` is its
    /// own last line.
    #[error("a remote device failed mid-run: {why} (the llama.cpp worker {} {what})", worker.display())]
    RemoteFailed {
        worker: PathBuf,
        why: String,
        what: String,
    },
}

/// The exit status of a worker over RPC servers whose remote device failed (PROTOCOL.md,
/// "Faults").
pub const REMOTE_FAILED_STATUS: i32 = 7;

/// The words ggml's RPC client aborts with when a server's connection broke or its answer was
/// malformed (`RPC_STATUS_ASSERT` in ggml-rpc.cpp).
pub const GGML_RPC_ABORT: &str = "Remote RPC server crashed";

/// The line prefix the worker writes on stderr before it ends as a remote failure.
const REMOTE_LINE: &str = "opledger-llama-worker: a remote device failed: ";

impl WorkerError {
    /// Whether the error is the worker misbehaving (died, hung, garbled), not a refusal or a
    /// worker that could not be started.
    pub fn is_fault(&self) -> bool {
        matches!(self, WorkerError::Fault { .. })
            || matches!(
                self,
                WorkerError::Protocol {
                    problem: ProtocolError::NotProtocol { .. } | ProtocolError::WrongId { .. },
                    ..
                }
            )
    }

    /// Whether the error is a remote device (an RPC server) failing mid-run.
    pub fn is_remote_failure(&self) -> bool {
        matches!(self, WorkerError::RemoteFailed { .. })
    }
}

/// The child's file descriptor of the channel (`--channel-fd`).
pub const CHANNEL_FD: i32 = 3;

/// The longest line the worker may write on its channel, in bytes: 2 GiB. The largest honest
/// answer is `logits` of every position of a 512-token chunk over a vocabulary of 150,000:
/// 76.8 million values of at most 16 bytes each (`%.9g` and a comma: `-1.17549435e-38,`), 1.2 GB;
/// a captured graph of a 40-layer model is a few MB. A line longer than this is a worker that
/// writes without end, and is stopped before it fills this process's memory.
pub const LINE_BOUND: usize = 2 << 30;

// logits of every position of a 512-token chunk over 150,000 values, each at most 16 bytes, the
// rows' brackets and the answer's other fields fit in the bound
const _: () = assert!(LINE_BOUND >= 512 * 150_000 * 16 + 512 * 3 + 64);

/// The environment variable that lowers the line bound, for tests that write a line past it
/// without writing gigabytes (a number of bytes).
pub const LINE_BOUND_ENV: &str = "OPLEDGER_WORKER_LINE_BOUND";

/// Lines of the worker's stdout and of its stderr kept for error messages.
const TAIL_LINES: usize = 12;

/// Bytes of one stdout or stderr line kept for error messages (the rest is dropped).
const TAIL_LINE_BYTES: usize = 1000;

/// The last lines of one of the worker's output streams, as a drain keeps them.
type Tail = Arc<Mutex<VecDeque<String>>>;

/// Lines of one run kept between the worker's device-clock markers at most (a TIMED run of a
/// large graph: one marker and one table of a few lines per node); past it the run's lines are
/// dropped and the run is reported as cut.
const DEVICE_LOG_LINES: usize = 1 << 20;

/// Finished runs' device-clock lines kept for the engine to take (older ones are let go).
const DEVICE_LOG_RUNS: usize = 4;

/// The lines the backend printed on the worker's stderr between the worker's markers of one
/// request (`opledger-device-clock begin ID` ... `end ID`: PROTOCOL.md "The device's clock"),
/// collected by the stderr drain as it reads them, so a run's lines are attributed to the
/// request that ran it whatever else the stream carries.
#[derive(Default)]
struct DeviceLogState {
    /// The run being read: its request id and its lines so far (`None` past the bound).
    open: Option<(u64, Option<Vec<String>>)>,
    /// Runs read to their end marker: (request id, lines, or `None` when cut).
    done: VecDeque<(u64, Option<Vec<String>>)>,
    /// The stream ended.
    closed: bool,
}

type DeviceLog = Arc<(Mutex<DeviceLogState>, Condvar)>;

/// One line of the worker's stderr, as the device log reads it.
fn device_log_line(log: &DeviceLog, line: &str) {
    let (lock, cv) = &**log;
    let Ok(mut st) = lock.lock() else { return };
    let prefix = opledger_core::device_clock::MARK;
    if let Some(rest) = line.strip_prefix(prefix).and_then(|r| r.strip_prefix(' ')) {
        if let Some(id) = rest
            .strip_prefix("begin ")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            st.open = Some((id, Some(Vec::new())));
            return;
        }
        if let Some(id) = rest
            .strip_prefix("end ")
            .and_then(|v| v.trim().parse::<u64>().ok())
        {
            if let Some((open, lines)) = st.open.take() {
                if open == id {
                    st.done.push_back((id, lines));
                    while st.done.len() > DEVICE_LOG_RUNS {
                        st.done.pop_front();
                    }
                    cv.notify_all();
                }
            }
            return;
        }
    }
    if let Some((_, Some(lines))) = st.open.as_mut() {
        if lines.len() < DEVICE_LOG_LINES {
            lines.push(line.to_string());
        } else if let Some(open) = st.open.as_mut() {
            open.1 = None;
        }
    }
}

/// A running worker.
pub struct WorkerProcess {
    path: PathBuf,
    child: Child,
    /// This process's end of the channel; `None` once closed.
    channel: Option<UnixStream>,
    /// Bytes read from the channel and not yet returned as a line.
    pending: Vec<u8>,
    /// How many bytes at the start of `pending` hold no newline.
    scanned: usize,
    line_bound: usize,
    stdout_tail: Tail,
    stderr_tail: Tail,
    device_log: DeviceLog,
    drains: Vec<JoinHandle<()>>,
    next_id: u64,
    timeout: Duration,
    hello: Hello,
    /// Set once the worker failed: nothing more is sent.
    dead: Option<String>,
    /// The worker loads over RPC servers: its end may be a remote failure.
    remote: bool,
    /// Why a remote device failed, when the worker's end said so (its own last line).
    remote_failure: Option<String>,
}

impl WorkerProcess {
    /// Starts the worker at `path` and reads its hello (within `timeout`, as every request).
    /// `verbose` passes the worker's stdout and stderr (llama.cpp's log) through to this
    /// process's stderr; `env` is set in the worker's environment over this process's (a
    /// backend's runtime switches).
    pub fn start(
        path: &Path,
        timeout: Duration,
        verbose: bool,
        env: &BTreeMap<String, String>,
    ) -> Result<WorkerProcess, WorkerError> {
        let bound = line_bound().map_err(|why| WorkerError::Start {
            worker: path.to_path_buf(),
            why,
        })?;
        Self::launch(path, timeout, verbose, env, bound)
    }

    /// [`WorkerProcess::start`] with the line bound given.
    fn launch(
        path: &Path,
        timeout: Duration,
        verbose: bool,
        env: &BTreeMap<String, String>,
        line_bound: usize,
    ) -> Result<WorkerProcess, WorkerError> {
        let start_err = |why: String| WorkerError::Start {
            worker: path.to_path_buf(),
            why,
        };
        let meta = std::fs::metadata(path).map_err(|e| start_err(format!("{e}")))?;
        if !meta.is_file() {
            return Err(start_err("not a file".into()));
        }
        {
            use std::os::unix::fs::PermissionsExt;
            if meta.permissions().mode() & 0o111 == 0 {
                return Err(start_err(
                    "not executable (build it with scripts/build-worker, or chmod +x)".into(),
                ));
            }
        }
        let (ours, theirs) = UnixStream::pair()
            .map_err(|e| start_err(format!("no socket pair for its channel: {e}")))?;
        let mut cmd = Command::new(path);
        cmd.envs(env);
        cmd.arg("--channel-fd").arg(CHANNEL_FD.to_string());
        if verbose {
            cmd.arg("--verbose");
        }
        cmd.fd_mappings(vec![FdMapping {
            parent_fd: theirs.into(),
            child_fd: CHANNEL_FD,
        }])
        .map_err(|e| start_err(format!("{e}")))?;
        let spawned = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn();
        // the command holds the child's end of the channel: closed here, so that the channel
        // reads the end of its stream as soon as the child is gone
        drop(cmd);
        let mut child = spawned.map_err(|e| start_err(format!("{e}")))?;
        let stdout_tail = Tail::default();
        let stderr_tail = Tail::default();
        let device_log = DeviceLog::default();
        let mut drains = Vec::new();
        if let Some(out) = child.stdout.take() {
            drains.push(drain(out, stdout_tail.clone(), verbose, None));
        }
        if let Some(err) = child.stderr.take() {
            drains.push(drain(
                err,
                stderr_tail.clone(),
                verbose,
                Some(device_log.clone()),
            ));
        }
        let mut p = WorkerProcess {
            path: path.to_path_buf(),
            child,
            channel: Some(ours),
            pending: Vec::new(),
            scanned: 0,
            line_bound,
            stdout_tail,
            stderr_tail,
            device_log,
            drains,
            next_id: 1,
            timeout,
            // read right below, before the process is handed out
            hello: Hello::default(),
            dead: None,
            remote: false,
            remote_failure: None,
        };
        let line = p.read_line("its hello")?;
        p.hello = parse_hello(&line).map_err(|problem| {
            p.dead = Some(problem.to_string());
            p.kill();
            WorkerError::Protocol {
                worker: p.path.clone(),
                problem,
            }
        })?;
        Ok(p)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The worker's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn hello(&self) -> &Hello {
        &self.hello
    }

    /// Sets how long a request may take before the worker is stopped.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// The longest answer line accepted, in bytes ([`LINE_BOUND`] unless lowered).
    pub fn line_bound(&self) -> usize {
        self.line_bound
    }

    /// The id the last request sent carried.
    pub fn last_request_id(&self) -> u64 {
        self.next_id - 1
    }

    /// The lines the worker's stderr carried between its device-clock markers of request `id`
    /// (PROTOCOL.md "The device's clock"), waiting up to `wait` for the stderr drain to read
    /// its end marker (the worker writes it before its answer, so it is in the pipe already).
    /// `Err` says why there are none: no end marker read in time, or the run's lines cut at
    /// the bound.
    pub fn device_log(&self, id: u64, wait: Duration) -> Result<Vec<String>, String> {
        let (lock, cv) = &*self.device_log;
        let deadline = Instant::now() + wait;
        let mut st = lock
            .lock()
            .map_err(|_| "the device log's lock was poisoned".to_string())?;
        loop {
            if let Some(at) = st.done.iter().position(|(i, _)| *i == id) {
                let (_, lines) = st.done.remove(at).expect("found above");
                return lines.ok_or_else(|| {
                    format!(
                        "request {id}'s device-clock lines passed {DEVICE_LOG_LINES} and were cut"
                    )
                });
            }
            let now = Instant::now();
            if st.closed || now >= deadline {
                return Err(format!(
                    "no device-clock end marker of request {id} on the worker's stderr within {:.1} s",
                    wait.as_secs_f64()
                ));
            }
            st = cv
                .wait_timeout(st, deadline - now)
                .map_err(|_| "the device log's lock was poisoned".to_string())?
                .0;
        }
    }

    /// Sends request `op` with `fields` and reads its answer as `T`, each within the timeout.
    pub fn request<T: serde::de::DeserializeOwned>(
        &mut self,
        op: &str,
        mut fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<T, WorkerError> {
        let what = describe_request(op, &fields);
        if let Some(why) = &self.dead {
            return Err(self.fault(format!(
                "failed earlier ({why}); {what} is not sent, nor anything more"
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        fields.insert("id".into(), id.into());
        fields.insert("op".into(), op.into());
        let mut line = serde_json::Value::Object(fields).to_string();
        line.push('\n');
        let deadline = Instant::now() + self.timeout;
        match self.send(line.as_bytes(), deadline) {
            Ok(()) => {}
            Err(e) if is_timeout(&e) => {
                let what = format!(
                    "did not read {what} within {:.0} s and was stopped (it stopped reading its channel)",
                    self.timeout.as_secs_f64()
                );
                return Err(self.fail(what));
            }
            Err(e) => {
                // a closed channel: the worker is gone; say how it ended
                let what = self.ended(&format!("when {what} was sent ({e})"));
                return Err(self.fail(what));
            }
        }
        let answer = self.read_line(&what)?;
        match parse_answer::<T>(&answer, id) {
            Ok(Answer::Ok(t)) => Ok(t),
            Ok(Answer::Refused(why)) => Err(WorkerError::Refused {
                worker: self.path.clone(),
                op: op.to_string(),
                why,
            }),
            Err(problem) => {
                self.dead = Some(problem.to_string());
                self.kill();
                Err(WorkerError::Protocol {
                    worker: self.path.clone(),
                    problem: in_answer_to(problem, &what),
                })
            }
        }
    }

    /// Writes `bytes` to the channel by `deadline`.
    fn send(&mut self, bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
        let Some(ch) = self.channel.as_mut() else {
            return Err(ErrorKind::BrokenPipe.into());
        };
        let mut at = 0;
        while at < bytes.len() {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ErrorKind::TimedOut.into());
            }
            ch.set_write_timeout(Some(left))?;
            match ch.write(&bytes[at..]) {
                Ok(0) => return Err(ErrorKind::WriteZero.into()),
                Ok(n) => at += n,
                Err(e) if e.kind() == ErrorKind::Interrupted || is_timeout(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// The next line of the channel (without its newline), within the timeout and the line
    /// bound.
    fn read_line(&mut self, waiting_for: &str) -> Result<String, WorkerError> {
        let t0 = Instant::now();
        let deadline = t0 + self.timeout;
        loop {
            if let Some(at) = self.pending[self.scanned..]
                .iter()
                .position(|&b| b == b'\n')
            {
                let end = self.scanned + at;
                if end > self.line_bound {
                    return Err(self.too_long(waiting_for));
                }
                let mut line: Vec<u8> = self.pending.drain(..=end).collect();
                self.scanned = 0;
                line.pop();
                if line.last() == Some(&b'\r') {
                    line.pop();
                }
                return String::from_utf8(line).map_err(|e| {
                    let problem = ProtocolError::NotProtocol {
                        why: format!("not UTF-8, in answer to {waiting_for}"),
                        line: excerpt(&String::from_utf8_lossy(e.as_bytes())),
                    };
                    self.dead = Some(problem.to_string());
                    self.kill();
                    WorkerError::Protocol {
                        worker: self.path.clone(),
                        problem,
                    }
                });
            }
            self.scanned = self.pending.len();
            if self.pending.len() > self.line_bound {
                return Err(self.too_long(waiting_for));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                let what = format!(
                    "did not answer {waiting_for} within {:.0} s and was stopped (raise --worker-timeout if a request of this model takes longer)",
                    t0.elapsed().as_secs_f64()
                );
                return Err(self.fail(what));
            }
            let Some(ch) = self.channel.as_mut() else {
                let what = self.ended(&format!("while waiting for {waiting_for}"));
                return Err(self.fail(what));
            };
            // at most the bound and one byte past it: a line without end is not read whole
            let mut chunk = [0u8; 1 << 16];
            let room = (self.line_bound + 1)
                .saturating_sub(self.pending.len())
                .clamp(1, chunk.len());
            let read = ch
                .set_read_timeout(Some(left))
                .and_then(|_| ch.read(&mut chunk[..room]));
            match read {
                Ok(0) => {
                    let what = self.ended(&format!("while waiting for {waiting_for}"));
                    return Err(self.fail(what));
                }
                Ok(n) => self.pending.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted || is_timeout(&e) => {}
                Err(e) => {
                    let what = format!(
                        "its channel could not be read while waiting for {waiting_for}: {e}"
                    );
                    return Err(self.fail(what));
                }
            }
        }
    }

    /// The fault of a line past the bound.
    fn too_long(&mut self, waiting_for: &str) -> WorkerError {
        let what = format!(
            "wrote a line past the bound on a line, {} bytes, in answer to {waiting_for} and was stopped (the largest honest answer, the logits of every position of a 512-token chunk over a vocabulary of 150,000, is about 1.2 GB)",
            self.line_bound
        );
        self.fail(what)
    }

    /// How the worker ended (it closed its channel): its exit status or signal, what that
    /// usually means, and the last lines of its stderr and stdout.
    fn ended(&mut self, when: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(5);
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(s)) => break Some(s),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10))
                }
                _ => break None,
            }
        };
        // the drains read the last lines once the pipes close (a moment at most; a grandchild
        // may hold them open longer)
        let deadline = Instant::now() + Duration::from_millis(500);
        while Instant::now() < deadline && self.drains.iter().any(|d| !d.is_finished()) {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut msg = match status {
            Some(s) => format!("{} {when}", describe_status(s)),
            None => format!("closed its channel {when}"),
        };
        if status.is_some_and(|s| signal_of(s) == Some(4)) {
            msg.push_str(&format!(" ({SIGILL_MEANS})"));
        }
        if self.remote {
            self.remote_failure = status.and_then(|s| remote_failure(s, &self.stderr_tail));
        }
        let (err, out) = (tail_of(&self.stderr_tail), tail_of(&self.stdout_tail));
        if !err.is_empty() {
            msg.push_str(&format!("; its last words: {err}"));
        }
        if !out.is_empty() {
            msg.push_str(&format!("; its last lines on stdout: {out}"));
        }
        msg
    }

    fn fault(&self, what: String) -> WorkerError {
        WorkerError::Fault {
            worker: self.path.clone(),
            what,
        }
    }

    /// Marks the worker failed, stops it, and returns the fault.
    fn fail(&mut self, what: String) -> WorkerError {
        self.dead = Some(what.clone());
        self.kill();
        match self.remote_failure.take() {
            Some(why) => WorkerError::RemoteFailed {
                worker: self.path.clone(),
                why,
                what,
            },
            None => self.fault(what),
        }
    }

    /// Says that the worker loads over RPC servers: from now on, its end with
    /// [`REMOTE_FAILED_STATUS`] or ggml's RPC abort is a [`WorkerError::RemoteFailed`].
    pub fn set_remote(&mut self, remote: bool) {
        self.remote = remote;
    }

    fn kill(&mut self) {
        self.channel = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    /// Asks the worker to quit, waits a moment, then stops it: the child is always reaped.
    fn drop(&mut self) {
        if self.dead.is_none() {
            let quit = format!("{{\"id\":{},\"op\":\"quit\"}}\n", self.next_id);
            let _ = self.send(quit.as_bytes(), Instant::now() + Duration::from_secs(1));
            // the end of the channel asks it too
            self.channel = None;
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = self.child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        self.kill();
    }
}

/// What a killing by SIGILL usually means.
pub const SIGILL_MEANS: &str = "an illegal instruction: usually a build for CPU features this machine cannot run, such as a GGML_NATIVE build on a virtual machine that reports AMX without enabling it, which dies in ggml's AMX kernels; build the worker with GGML_NATIVE off and the CPU features listed (llama.cpp's CMake turns GGML_NATIVE on unless told): scripts/build-worker ... -- -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON";

/// The line bound in force: [`LINE_BOUND`], or the number of bytes in [`LINE_BOUND_ENV`].
fn line_bound() -> Result<usize, String> {
    parse_line_bound(std::env::var(LINE_BOUND_ENV).ok().as_deref())
}

fn parse_line_bound(v: Option<&str>) -> Result<usize, String> {
    match v {
        None => Ok(LINE_BOUND),
        Some(v) => match v.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "{LINE_BOUND_ENV}={v} is not a number of bytes above 0"
            )),
        },
    }
}

/// A request in words, for messages: `'load'`, `'decode' (observe: timed)`.
fn describe_request(op: &str, fields: &serde_json::Map<String, serde_json::Value>) -> String {
    match fields.get("observe").and_then(|o| o.as_str()) {
        Some(o) => format!("'{op}' (observe: {o})"),
        None => format!("'{op}'"),
    }
}

/// A protocol error of an answer, saying which request it answered.
fn in_answer_to(problem: ProtocolError, what: &str) -> ProtocolError {
    match problem {
        ProtocolError::NotProtocol { why, line } => ProtocolError::NotProtocol {
            why: format!("{why}, in answer to {what}"),
            line,
        },
        p => p,
    }
}

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut)
}

/// Reads `stream` (the worker's stdout or stderr) as bytes to its end, keeping its last lines
/// (lossily decoded, each cut at [`TAIL_LINE_BYTES`]) in `tail`, and with `verbose` passing
/// every byte through to this process's stderr.
fn drain(
    stream: impl Read + Send + 'static,
    tail: Tail,
    verbose: bool,
    device_log: Option<DeviceLog>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::with_capacity(1 << 16, stream);
        let mut line: Vec<u8> = Vec::new();
        let keep = |line: &mut Vec<u8>| {
            let text = String::from_utf8_lossy(line).trim_end().to_string();
            line.clear();
            if let Some(log) = &device_log {
                device_log_line(log, &text);
            }
            if let Ok(mut t) = tail.lock() {
                t.push_back(text);
                while t.len() > TAIL_LINES {
                    t.pop_front();
                }
            }
        };
        loop {
            let buf = match r.fill_buf() {
                Ok(b) => b,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            };
            if buf.is_empty() {
                break;
            }
            let (part, ends_line) = match buf.iter().position(|&b| b == b'\n') {
                Some(i) => (&buf[..=i], true),
                None => (buf, false),
            };
            if verbose {
                let _ = std::io::stderr().lock().write_all(part);
            }
            let room = TAIL_LINE_BYTES.saturating_sub(line.len());
            line.extend_from_slice(&part[..part.len().min(room)]);
            let n = part.len();
            r.consume(n);
            if ends_line {
                keep(&mut line);
            }
        }
        if !line.is_empty() {
            keep(&mut line);
        }
        if let Some(log) = &device_log {
            if let Ok(mut st) = log.0.lock() {
                st.closed = true;
            }
            log.1.notify_all();
        }
    })
}

/// Why a worker over RPC servers ended, when its end was a remote failure: its own last line
/// (after exit status [`REMOTE_FAILED_STATUS`]), else ggml's RPC abort in its last words (a
/// worker built without the abort hook, killed by SIGABRT).
fn remote_failure(status: std::process::ExitStatus, stderr: &Tail) -> Option<String> {
    let lines: Vec<String> = stderr.lock().map(|t| t.iter().cloned().collect()).ok()?;
    let own = lines
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix(REMOTE_LINE).map(str::to_string));
    let ggml = lines
        .iter()
        .rev()
        .find(|l| l.contains(GGML_RPC_ABORT))
        .map(|l| format!("llama.cpp aborted the run: {}", l.trim()));
    if status.code() == Some(REMOTE_FAILED_STATUS) {
        Some(own.or(ggml).unwrap_or_else(|| {
            format!("the worker exited with status {REMOTE_FAILED_STATUS} (a remote device failed)")
        }))
    } else {
        own.or(ggml)
    }
}

fn tail_of(t: &Tail) -> String {
    t.lock()
        .map(|t| {
            t.iter()
                .filter(|l| !l.is_empty())
                .cloned()
                .collect::<Vec<_>>()
                .join(" | ")
        })
        .unwrap_or_default()
}

fn signal_of(s: std::process::ExitStatus) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    s.signal()
}

/// An exit status in words: `exited with status 3`, `was killed by signal 11 (SIGSEGV)`.
pub fn describe_status(s: std::process::ExitStatus) -> String {
    if let Some(sig) = signal_of(s) {
        let name = match sig {
            4 => " (SIGILL)",
            6 => " (SIGABRT)",
            7 => " (SIGBUS)",
            8 => " (SIGFPE)",
            9 => " (SIGKILL)",
            11 => " (SIGSEGV)",
            13 => " (SIGPIPE)",
            15 => " (SIGTERM)",
            _ => "",
        };
        format!("was killed by signal {sig}{name}")
    } else {
        format!("exited with status {}", s.code().unwrap_or(-1))
    }
}

/// The worker's hello (started with `env` set) and the BLAKE3 of its binary, without loading
/// anything: what a manifest records of a worker.
pub fn identify(
    path: &Path,
    timeout: Duration,
    env: &BTreeMap<String, String>,
) -> Result<(Hello, String), WorkerError> {
    let bytes = std::fs::read(path).map_err(|e| WorkerError::Start {
        worker: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let hash = blake3::hash(&bytes).to_hex().to_string();
    let p = WorkerProcess::start(path, timeout, false, env)?;
    Ok((p.hello().clone(), hash))
}

#[cfg(test)]
mod tests {
    use super::*;

    const HELLO: &str = r#"{"protocol":"opledger-llama-worker","version":4,"llama":{"commit":"c","build":"b","ggml_version":"0","ggml_commit":"g","compiler":"sh","build_options":"","system_info":"","backends":["CPU"],"devices":[]}}"#;

    /// A worker written in sh: `body` runs after the hello went out on the channel (fd 3).
    fn sh_worker(dir: &Path, name: &str, before: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        let script = format!(
            "#!/bin/sh\n[ \"$1\" = --channel-fd ] && [ \"$2\" = 3 ] || exit 64\n{before}\nprintf '%s\\n' '{HELLO}' >&3\n{body}\n"
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn launch(path: &Path, timeout_s: u64, bound: usize) -> Result<WorkerProcess, WorkerError> {
        WorkerProcess::launch(
            path,
            Duration::from_secs(timeout_s),
            false,
            &BTreeMap::new(),
            bound,
        )
    }

    fn ask(p: &mut WorkerProcess, op: &str) -> Result<serde_json::Value, WorkerError> {
        p.request(op, serde_json::Map::new())
    }

    /// The device clock's lines are a request's own between its begin and end markers on the
    /// worker's stderr; lines outside any markers belong to no request, and a request the
    /// worker never marked has none, said so.
    #[test]
    fn the_device_clock_lines_between_a_request_s_markers_are_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let w = sh_worker(
            dir.path(),
            "clock",
            "",
            "read req <&3\nprintf 'ADD: 1 x 9 us = 9 us\\n' >&2\nprintf 'opledger-device-clock begin 1\\nADD: 1 x 2 us = 2 us\\nopledger-device-clock node 0\\nggml log\\nopledger-device-clock end 1\\nMUL: 1 x 7 us = 7 us\\n' >&2\nprintf '{\"id\":1,\"ok\":true}\\n' >&3\nread req <&3\nprintf '{\"id\":2,\"ok\":true}\\n' >&3\nsleep 5",
        );
        let mut p = launch(&w, 20, LINE_BOUND).unwrap();
        ask(&mut p, "decode").unwrap();
        assert_eq!(p.last_request_id(), 1);
        let lines = p.device_log(1, Duration::from_secs(10)).unwrap();
        assert_eq!(
            lines,
            [
                "ADD: 1 x 2 us = 2 us",
                "opledger-device-clock node 0",
                "ggml log"
            ]
        );
        // taken once
        assert!(p.device_log(1, Duration::from_millis(100)).is_err());
        ask(&mut p, "clear").unwrap();
        let e = p.device_log(2, Duration::from_millis(200)).unwrap_err();
        assert!(e.contains("no device-clock end marker of request 2"), "{e}");
    }

    /// A worker that prints junk to stdout and stderr (not UTF-8, more than a pipe holds)
    /// before its hello and between answers still speaks the protocol; its last lines, shown
    /// lossily, go into the message of its death.
    #[test]
    fn junk_on_stdout_and_stderr_never_reaches_the_protocol() {
        let dir = tempfile::tempdir().unwrap();
        // 300 kB on each stream (a pipe holds 64 kB), lines of bytes that are not UTF-8
        let junk = "i=0; while [ $i -lt 3000 ]; do printf 'junk \\377\\376 line %s of a hundred bytes or so, to fill a pipe well beyond its buffer.......\\n' $i; printf 'err \\377 %s\\n' $i >&2; i=$((i+1)); done";
        let w = sh_worker(
            dir.path(),
            "junk",
            junk,
            &format!(
                "read req <&3\n{junk}\nprintf '{{\"id\":1,\"ok\":true}}\\n' >&3\nread req <&3\nprintf 'last \\377 words\\n' >&2\nexit 3"
            ),
        );
        let mut p = launch(&w, 20, LINE_BOUND).unwrap();
        assert_eq!(p.hello().version, crate::protocol::PROTOCOL_VERSION as u64);
        let v = ask(&mut p, "clear").unwrap();
        assert_eq!(v, serde_json::json!({}));
        let e = ask(&mut p, "save").unwrap_err();
        assert!(e.is_fault(), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("exited with status 3"), "{msg}");
        assert!(msg.contains("while waiting for 'save'"), "{msg}");
        assert!(msg.contains("last \u{fffd} words"), "{msg}");
        assert!(msg.contains("junk \u{fffd}\u{fffd} line 2999"), "{msg}");
        assert!(msg.contains(&w.display().to_string()), "{msg}");
        // nothing more is asked of a failed worker
        let again = ask(&mut p, "clear").unwrap_err().to_string();
        assert!(again.contains("failed earlier"), "{again}");
    }

    /// A worker that stops reading its channel cannot hang opledger: the write times out.
    #[test]
    fn a_worker_that_stops_reading_is_stopped_by_the_write_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let w = sh_worker(dir.path(), "deaf", "", "exec sleep 60");
        let mut p = launch(&w, 1, LINE_BOUND).unwrap();
        // far more than a socket's buffer
        let mut fields = serde_json::Map::new();
        fields.insert("tokens".into(), "x".repeat(32 << 20).into());
        let t0 = Instant::now();
        let e = p
            .request::<serde_json::Value>("decode", fields)
            .unwrap_err();
        assert!(t0.elapsed() < Duration::from_secs(30), "{:?}", t0.elapsed());
        let msg = e.to_string();
        assert!(e.is_fault(), "{msg}");
        assert!(msg.contains("did not read 'decode' within 1 s"), "{msg}");
        // reaped: the process is gone
        assert!(matches!(p.child.try_wait(), Ok(Some(_))));
    }

    /// A worker that does not answer in time is stopped; one whose answer passes the line bound
    /// is stopped with the bound named, whether the line ends or not.
    #[test]
    fn a_silent_worker_and_a_line_past_the_bound_are_faults() {
        let dir = tempfile::tempdir().unwrap();
        let w = sh_worker(dir.path(), "silent", "", "read req <&3\nexec sleep 60");
        let mut p = launch(&w, 1, LINE_BOUND).unwrap();
        let mut fields = serde_json::Map::new();
        fields.insert("observe".into(), "timed".into());
        let e = p.request::<serde_json::Value>("step", fields).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("did not answer 'step' (observe: timed) within 1 s"),
            "{msg}"
        );

        for (name, tail) in [("endless", ""), ("long", "\\n")] {
            let body = format!(
                "read req <&3\nprintf '{{\"id\":1,\"ok\":true,\"x\":\"' >&3\ni=0; while [ $i -lt 200 ]; do printf '%0100d' 0 >&3; i=$((i+1)); done\nprintf '\"}}{tail}' >&3\nexec sleep 60"
            );
            let w = sh_worker(dir.path(), name, "", &body);
            // the hello passes a bound of 4 kB; the answer, 20 kB, does not
            let mut p = launch(&w, 10, 4096).unwrap();
            assert_eq!(p.line_bound(), 4096);
            let e = ask(&mut p, "logits").unwrap_err();
            let msg = e.to_string();
            assert!(e.is_fault(), "{msg}");
            assert!(
                msg.contains("past the bound on a line, 4096 bytes,")
                    && msg.contains("in answer to 'logits'"),
                "{name}: {msg}"
            );
        }
    }

    /// An answer of many reads (3 MB, a captured graph's size) is one line, whole.
    #[test]
    fn a_long_honest_answer_is_read_whole() {
        let dir = tempfile::tempdir().unwrap();
        let body = "read req <&3\n{ printf '{\"id\":1,\"ok\":true,\"x\":\"'; head -c 3000000 /dev/zero | tr '\\0' 7; printf '\"}\\n'; } >&3\nread req <&3";
        let w = sh_worker(dir.path(), "graph", "", body);
        let mut p = launch(&w, 20, LINE_BOUND).unwrap();
        let v = ask(&mut p, "decode").unwrap();
        let x = v["x"].as_str().unwrap();
        assert_eq!(x.len(), 3_000_000);
        assert!(x.bytes().all(|b| b == b'7'));
    }

    /// A worker killed by SIGILL is told apart: the message says what that usually means and
    /// how to build instead.
    #[test]
    fn a_worker_killed_by_sigill_says_how_to_build_instead() {
        let dir = tempfile::tempdir().unwrap();
        let w = sh_worker(dir.path(), "sigill", "", "read req <&3\nkill -ILL $$");
        let mut p = launch(&w, 10, LINE_BOUND).unwrap();
        let msg = ask(&mut p, "load").unwrap_err().to_string();
        assert!(msg.contains("killed by signal 4 (SIGILL)"), "{msg}");
        assert!(msg.contains("while waiting for 'load'"), "{msg}");
        assert!(msg.contains("turns GGML_NATIVE on unless told"), "{msg}");
        assert!(msg.contains("-DGGML_NATIVE=OFF -DGGML_AVX2=ON"), "{msg}");
    }

    /// Answers that are not the protocol (not UTF-8, not JSON) are faults naming the request.
    #[test]
    fn an_answer_that_is_not_utf8_or_not_json_is_a_protocol_fault() {
        let dir = tempfile::tempdir().unwrap();
        for (name, line, words) in [
            (
                "bytes",
                "{\"id\":1,\"ok\":true,\"x\":\"\\377\"}",
                "not UTF-8",
            ),
            ("words", "the model is loaded", "not the protocol"),
        ] {
            let w = sh_worker(
                dir.path(),
                name,
                "",
                &format!("read req <&3\nprintf '{line}\\n' >&3\nexec sleep 60"),
            );
            let mut p = launch(&w, 10, LINE_BOUND).unwrap();
            let e = ask(&mut p, "load").unwrap_err();
            let msg = e.to_string();
            assert!(e.is_fault(), "{msg}");
            assert!(
                msg.contains(words) && msg.contains("in answer to 'load'"),
                "{name}: {msg}"
            );
            assert!(matches!(p.child.try_wait(), Ok(Some(_))));
        }
    }

    /// The bound (which holds the largest honest answer, checked where it is defined) is
    /// lowered for tests by a number of bytes and nothing else.
    #[test]
    fn the_line_bound_is_lowered_by_a_number_of_bytes_only() {
        assert_eq!(parse_line_bound(None), Ok(LINE_BOUND));
        assert_eq!(parse_line_bound(Some("4096")), Ok(4096));
        for bad in ["0", "-1", "4k", ""] {
            let e = parse_line_bound(Some(bad)).unwrap_err();
            assert!(e.contains(LINE_BOUND_ENV), "{e}");
        }
    }

    #[test]
    fn a_remote_failure_is_the_worker_s_own_line_or_ggml_s_rpc_abort() {
        use std::os::unix::process::ExitStatusExt;
        let tail = |lines: &[&str]| -> Tail {
            Arc::new(Mutex::new(lines.iter().map(|l| l.to_string()).collect()))
        };
        let exited = |code: i32| std::process::ExitStatus::from_raw(code << 8);
        let sigabrt = std::process::ExitStatus::from_raw(6);
        let own = tail(&[
            "llama.cpp log",
            "opledger-llama-worker: a remote device failed: no progress for 3.0 s (--rpc-timeout)",
        ]);
        assert_eq!(
            remote_failure(exited(REMOTE_FAILED_STATUS), &own).as_deref(),
            Some("no progress for 3.0 s (--rpc-timeout)")
        );
        // ggml's own words from a worker without the hook
        let ggml =
            tail(&["ggml-rpc.cpp:354: Remote RPC server crashed or returned malformed response"]);
        let why = remote_failure(sigabrt, &ggml).unwrap();
        assert!(why.contains("Remote RPC server crashed"), "{why}");
        // the status alone says it
        assert!(remote_failure(exited(REMOTE_FAILED_STATUS), &tail(&[])).is_some());
        // any other end is not
        assert_eq!(
            remote_failure(sigabrt, &tail(&["GGML_ASSERT(x) failed"])),
            None
        );
        assert_eq!(remote_failure(exited(1), &tail(&[])), None);
    }
}
