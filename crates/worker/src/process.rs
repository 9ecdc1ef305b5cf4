//! The worker process: started, greeted, asked one request at a time with a timeout, and always
//! reaped. Every fault names the worker and what it did.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::{parse_answer, parse_hello, Answer, Hello, ProtocolError};

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
}

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
}

/// A running worker.
pub struct WorkerProcess {
    path: PathBuf,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<std::io::Result<String>>,
    stderr_tail: Arc<Mutex<VecDeque<String>>>,
    next_id: u64,
    timeout: Duration,
    hello: Hello,
    /// Set once the worker failed: nothing more is sent.
    dead: Option<String>,
}

/// Lines of the worker's stderr kept for error messages.
const STDERR_LINES: usize = 12;

impl WorkerProcess {
    /// Starts the worker at `path` and reads its hello (within `timeout`, as every request).
    /// `verbose` passes llama.cpp's log through to this process's stderr; `env` is set in the
    /// worker's environment over this process's (a backend's runtime switches).
    pub fn start(
        path: &Path,
        timeout: Duration,
        verbose: bool,
        env: &BTreeMap<String, String>,
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
        let mut cmd = Command::new(path);
        cmd.envs(env);
        if verbose {
            cmd.arg("--verbose");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| start_err(format!("{e}")))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            loop {
                let mut line = String::new();
                match r.read_line(&mut line) {
                    Ok(0) => break,
                    Ok(_) => {
                        if tx.send(Ok(line)).is_err() {
                            break;
                        }
                    }
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        break;
                    }
                }
            }
        });
        let tail = Arc::new(Mutex::new(VecDeque::new()));
        let tail_w = tail.clone();
        std::thread::spawn(move || {
            let r = BufReader::new(stderr);
            for line in r.lines() {
                let Ok(line) = line else { break };
                if verbose {
                    eprintln!("{line}");
                }
                if let Ok(mut t) = tail_w.lock() {
                    t.push_back(line);
                    while t.len() > STDERR_LINES {
                        t.pop_front();
                    }
                }
            }
        });
        let mut p = WorkerProcess {
            path: path.to_path_buf(),
            stdin: child.stdin.take(),
            child,
            lines: rx,
            stderr_tail: tail,
            next_id: 1,
            timeout,
            // read right below, before the process is handed out
            hello: Hello::default(),
            dead: None,
        };
        let line = p.read_line("its hello")?;
        p.hello = parse_hello(line.trim_end()).map_err(|problem| {
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

    /// Sends request `op` with `fields` and reads its answer as `T`.
    pub fn request<T: serde::de::DeserializeOwned>(
        &mut self,
        op: &str,
        mut fields: serde_json::Map<String, serde_json::Value>,
    ) -> Result<T, WorkerError> {
        if let Some(why) = &self.dead {
            return Err(self.fault(format!(
                "failed earlier ({why}); nothing more is asked of it"
            )));
        }
        let id = self.next_id;
        self.next_id += 1;
        fields.insert("id".into(), id.into());
        fields.insert("op".into(), op.into());
        let mut line = serde_json::Value::Object(fields).to_string();
        line.push('\n');
        let sent = self
            .stdin
            .as_mut()
            .map(|s| s.write_all(line.as_bytes()).and_then(|_| s.flush()));
        if !matches!(sent, Some(Ok(()))) {
            // a closed pipe: the worker is gone; say how it ended
            let what = self.ended(&format!("'{op}' was sent"));
            return Err(self.fail(what));
        }
        let answer = self.read_line(&format!("'{op}'"))?;
        match parse_answer::<T>(answer.trim_end(), id) {
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
                    problem,
                })
            }
        }
    }

    /// The next line of the worker's stdout, within the timeout.
    fn read_line(&mut self, waiting_for: &str) -> Result<String, WorkerError> {
        let t0 = Instant::now();
        match self.lines.recv_timeout(self.timeout) {
            Ok(Ok(line)) => Ok(line),
            Ok(Err(e)) => {
                let what = format!("could not be read while waiting for {waiting_for}: {e}");
                Err(self.fail(what))
            }
            Err(RecvTimeoutError::Timeout) => {
                let what = format!(
                    "did not answer {waiting_for} within {:.0} s and was stopped (raise --worker-timeout if a request of this model takes longer)",
                    t0.elapsed().as_secs_f64()
                );
                Err(self.fail(what))
            }
            Err(RecvTimeoutError::Disconnected) => {
                let what = self.ended(&format!("while waiting for {waiting_for}"));
                Err(self.fail(what))
            }
        }
    }

    /// How the worker ended (it closed its stdout): its exit status or signal, and its stderr's
    /// last lines.
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
        // the stderr reader may still hold the last lines for a moment
        std::thread::sleep(Duration::from_millis(50));
        let how = match status {
            Some(s) => describe_status(s),
            None => "closed its output".to_string(),
        };
        let tail = self.stderr_tail();
        if tail.is_empty() {
            format!("{how} {when}")
        } else {
            format!("{how} {when}; its last words: {tail}")
        }
    }

    fn stderr_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .map(|t| t.iter().cloned().collect::<Vec<_>>().join(" | "))
            .unwrap_or_default()
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
        self.fault(what)
    }

    fn kill(&mut self) {
        self.stdin = None;
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for WorkerProcess {
    /// Asks the worker to quit, waits a moment, then stops it: the child is always reaped.
    fn drop(&mut self) {
        if self.dead.is_none() {
            if let Some(s) = self.stdin.as_mut() {
                let _ = s
                    .write_all(format!("{{\"id\":{},\"op\":\"quit\"}}\n", self.next_id).as_bytes());
                let _ = s.flush();
            }
            self.stdin = None;
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

/// An exit status in words: `exited with status 3`, `was killed by signal 11 (SIGSEGV)`.
pub fn describe_status(s: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = s.signal() {
        let name = match sig {
            4 => " (SIGILL)",
            6 => " (SIGABRT)",
            7 => " (SIGBUS)",
            8 => " (SIGFPE)",
            9 => " (SIGKILL)",
            11 => " (SIGSEGV)",
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
