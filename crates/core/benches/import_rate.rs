//! Reading a Chrome trace (`opledger import`): one million B/E events in the shape
//! `tracing-chrome` writes for candle-transformers' modules (a step span, per layer an attention
//! span with four matmul spans, an MLP span with three), read from memory through the same
//! streamed reader a file goes through. Goal: at least 1 million events a second on one core.
//! Run with `cargo bench -p opledger-core --bench import_rate`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use opledger_core::trace::{read_chrome, TraceOptions};
use regex::Regex;

/// About `events` events of steps of 18 layers, as one JSON object with `traceEvents`.
fn trace(events: usize) -> (Vec<u8>, u64) {
    let mut out = String::from(r#"{"traceEvents":["#);
    let mut n = 0u64;
    let mut ts = 0.0f64;
    let push = |out: &mut String, n: &mut u64, ph: &str, name: &str, ts: f64| {
        if *n > 0 {
            out.push_str(",\n");
        }
        out.push_str(&format!(
            r#"{{"ph":"{ph}","pid":1,"tid":1,"name":"{name}","cat":"candle_transformers::models::quantized_gemma3","ts":{ts:.3}}}"#
        ));
        *n += 1;
    };
    while (n as usize) < events {
        push(&mut out, &mut n, "B", "model", ts);
        for _ in 0..18 {
            for (block, matmuls) in [("attn", 4), ("attn-mlp", 3)] {
                ts += 0.5;
                push(&mut out, &mut n, "B", block, ts);
                for _ in 0..matmuls {
                    ts += 0.25;
                    push(&mut out, &mut n, "B", "qmatmul", ts);
                    ts += 7.125;
                    push(&mut out, &mut n, "E", "qmatmul", ts);
                }
                ts += 3.0;
                push(&mut out, &mut n, "E", block, ts);
            }
        }
        ts += 1.0;
        push(&mut out, &mut n, "E", "model", ts);
    }
    out.push_str("]}");
    (out.into_bytes(), n)
}

fn bench(c: &mut Criterion) {
    let (bytes, events) = trace(1_000_000);
    let opts = TraceOptions {
        step: Regex::new("^model$").unwrap(),
        arg_keys: Vec::new(),
        context: None,
    };
    let mut g = c.benchmark_group("import");
    g.sample_size(10);
    g.throughput(Throughput::Elements(events));
    g.bench_function("chrome trace, 1M B/E events", |b| {
        b.iter(|| {
            let s = read_chrome(bytes.as_slice(), "bench.json", &opts).unwrap();
            assert_eq!(s.events, events);
            s.steps.len()
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
