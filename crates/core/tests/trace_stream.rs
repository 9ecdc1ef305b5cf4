//! A trace far larger than the memory the reader may take: 256 MiB of events generated on the fly
//! (never held whole, by the test or the reader) go through `read_chrome`, and the process's
//! peak resident memory grows by a small fraction of that. A reader that held the events, or the
//! text, would grow by more than the trace.

use std::io::Read;

use opledger_core::trace::{read_chrome, TraceOptions};
use regex::Regex;

/// A Chrome trace of `steps` forward passes of 18 layers (attention with four matmuls, MLP with
/// three; B/E events on one thread, as `tracing-chrome` writes them), produced step by step.
struct Generated {
    steps: u64,
    step: u64,
    buf: Vec<u8>,
    at: usize,
    closed: bool,
    /// Bytes handed out so far.
    produced: u64,
}

impl Generated {
    fn new(steps: u64) -> Generated {
        Generated {
            steps,
            step: 0,
            buf: br#"{"traceEvents":["#.to_vec(),
            at: 0,
            closed: false,
            produced: 0,
        }
    }

    /// The events of one step (1040 µs), 2000 µs after the previous one.
    fn fill(&mut self) {
        self.buf.clear();
        self.at = 0;
        if self.step == self.steps {
            self.buf.extend_from_slice(b"]}");
            self.closed = true;
            return;
        }
        let mut ts = self.step as f64 * 2000.0;
        let ev = |ph: &str, name: &str, ts: f64, buf: &mut Vec<u8>| {
            buf.extend_from_slice(
                format!(
                    r#"{{"ph":"{ph}","pid":1,"tid":1,"name":"{name}","cat":"candle_transformers::models::quantized_gemma3","ts":{ts:.3}}},"#
                )
                .as_bytes(),
            )
        };
        let mut buf = std::mem::take(&mut self.buf);
        ev("B", "model", ts, &mut buf);
        for _ in 0..18 {
            for (block, matmuls) in [("attn", 4), ("attn-mlp", 3)] {
                ts += 0.5;
                ev("B", block, ts, &mut buf);
                for _ in 0..matmuls {
                    ts += 0.25;
                    ev("B", "qmatmul", ts, &mut buf);
                    ts += 7.0;
                    ev("E", "qmatmul", ts, &mut buf);
                }
                ts += 3.0;
                ev("E", block, ts, &mut buf);
            }
        }
        ts += 1.0;
        ev("E", "model", ts, &mut buf);
        if self.step + 1 == self.steps {
            buf.pop(); // the last event takes no comma
        }
        self.buf = buf;
        self.step += 1;
    }
}

impl Read for Generated {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        if self.at == self.buf.len() {
            if self.closed {
                return Ok(0);
            }
            self.fill();
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        self.produced += n as u64;
        Ok(n)
    }
}

/// The peak resident set of this process so far, in bytes (Linux).
fn peak_rss() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

#[test]
fn a_trace_larger_than_memory_allows_is_read_in_bounded_memory() {
    let Some(before) = peak_rss() else {
        eprintln!("no /proc/self/status: peak memory cannot be read on this system");
        return;
    };
    // one step is 326 events of about 110 bytes: 36 kB; 7500 steps are about 256 MiB
    let steps = 7500;
    let opts = TraceOptions {
        step: Regex::new("^model$").unwrap(),
        arg_keys: Vec::new(),
        context: None,
    };
    let mut reader = Generated::new(steps);
    let s = read_chrome(
        std::io::BufReader::new(&mut reader),
        "generated.json",
        &opts,
    )
    .unwrap();
    let bytes = reader.produced;
    assert!(bytes > 250 << 20, "{bytes} bytes");
    assert_eq!(s.steps.len() as u64, steps);
    assert_eq!(s.events, steps * 326);
    // per step the self time of every span key: attention 18 x (4 x 0.25 + 3) µs of its own
    let attn = s.keys.iter().position(|k| k.name == "attn").unwrap();
    assert!((s.steps[0].self_us[attn] - 18.0 * 4.0).abs() < 1e-6);
    assert_eq!(s.keys.len(), 5);
    let grown = peak_rss().unwrap().saturating_sub(before);
    // what is kept grows with the steps (a dense row of 6 keys each), not with the events:
    // well under a tenth of the trace
    assert!(
        grown < bytes / 10,
        "peak memory grew by {grown} bytes reading a trace of {bytes}"
    );
}
