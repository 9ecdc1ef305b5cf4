//! A trace whose events are not in start order, far larger than the memory its sort may take:
//! 256 MiB of events generated on the fly, each step's inner spans written before the spans
//! that hold them (as Kineto writes a thread's CPU ops before its Python calls), go through
//! `read_chrome_sorted`, which sorts them in runs on disk, and the process's peak resident memory
//! grows by a small fraction of the trace. Holding the events to sort them would take more than
//! twice the trace (an event held is 216 bytes and its strings, about 300; its text here 127).

use std::io::Read;

use opledger_core::trace::{read_chrome, read_chrome_sorted, TraceError, TraceOptions};
use regex::Regex;

/// A Chrome trace of `steps` forward passes of 18 layers (attention with four matmuls, MLP with
/// three) as `X` events on one thread, produced step by step; each step's matmuls come first,
/// then the model and block spans (each run in start order).
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

    /// The events of one step (1040.5 µs), 2000 µs after the previous one.
    fn fill(&mut self) {
        self.buf.clear();
        self.at = 0;
        if self.step == self.steps {
            self.buf.extend_from_slice(b"]}");
            self.closed = true;
            return;
        }
        // (name, start, end), inner and outer
        let mut inner = Vec::new();
        let mut outer = Vec::new();
        let start = self.step as f64 * 2000.0;
        let mut ts = start;
        for _ in 0..18 {
            for (block, matmuls) in [("attn", 4), ("attn-mlp", 3)] {
                ts += 0.5;
                let from = ts;
                for _ in 0..matmuls {
                    ts += 0.25;
                    inner.push(("qmatmul", ts, ts + 7.0));
                    ts += 7.0;
                }
                ts += 3.0;
                outer.push((block, from, ts));
            }
        }
        ts += 1.0;
        outer.insert(0, ("model", start, ts));
        let mut buf = std::mem::take(&mut self.buf);
        for (name, from, to) in inner.into_iter().chain(outer) {
            buf.extend_from_slice(
                format!(
                    r#"{{"ph":"X","pid":1,"tid":1,"name":"{name}","cat":"candle_transformers::models::quantized_gemma3","ts":{from:.3},"dur":{:.3}}},"#,
                    to - from
                )
                .as_bytes(),
            );
        }
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
fn a_trace_out_of_start_order_larger_than_memory_allows_is_sorted_in_bounded_memory() {
    let opts = TraceOptions {
        step: Regex::new("^model$").unwrap(),
        arg_keys: Vec::new(),
        context: None,
    };
    // the streamed read refuses it: the events are out of order
    let e = read_chrome(Generated::new(2), "generated.json", &opts).unwrap_err();
    assert!(matches!(e, TraceError::OutOfOrder { .. }), "{e}");
    let Some(before) = peak_rss() else {
        eprintln!("no /proc/self/status: peak memory cannot be read on this system");
        return;
    };
    // one step is 163 events of about 127 bytes: 21 kB; 12400 steps are about 256 MiB
    let steps = 12400;
    let mut reader = Generated::new(steps);
    let s = read_chrome_sorted(
        std::io::BufReader::new(&mut reader),
        "generated.json",
        &opts,
    )
    .unwrap();
    let bytes = reader.produced;
    assert!(bytes > 240 << 20, "{bytes} bytes");
    assert_eq!(s.steps.len() as u64, steps);
    assert_eq!(s.events, steps * 163);
    assert_eq!(s.keys.len(), 5);
    assert!(
        s.notes.iter().any(|n| n.contains(&format!(
            "the {} events were sorted by start in {} runs",
            steps * 163,
            (steps * 163).div_ceil(1 << 15)
        ))),
        "{:?}",
        s.notes
    );
    // per step: model 1040.5 less 18 x (32 + 24.75) of blocks; attention 18 x (32 - 4 x 7);
    // MLP 18 x (24.75 - 3 x 7); the matmuls 18 x 7 x 7
    let self_of = |step: usize, name: &str| -> f64 {
        s.keys
            .iter()
            .enumerate()
            .filter(|(_, k)| k.name == name)
            .map(|(i, _)| s.steps[step].self_us[i])
            .sum()
    };
    for step in [0, 1, steps as usize / 2, steps as usize - 1] {
        assert!((s.steps[step].wall_us - 1040.5).abs() < 1e-6);
        assert!((self_of(step, "model") - 19.0).abs() < 1e-6);
        assert!((self_of(step, "attn") - 72.0).abs() < 1e-6);
        assert!((self_of(step, "attn-mlp") - 67.5).abs() < 1e-6);
        assert!((self_of(step, "qmatmul") - 882.0).abs() < 1e-6);
    }
    let grown = peak_rss().unwrap().saturating_sub(before);
    eprintln!("peak memory grew by {grown} bytes reading a trace of {bytes}");
    // what is held is one run of events (2^15, about 10 MB), the runs' read buffers (4 MiB),
    // the chunks in flight between the parser threads and the steps' rows, not the events:
    // about 30 MB here whatever the trace's length, under a fifth of this one (holding the
    // events would take more than twice it)
    assert!(
        grown < bytes / 5,
        "peak memory grew by {grown} bytes reading a trace of {bytes}"
    );
}
