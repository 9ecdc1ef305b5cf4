//! Reads a Chrome trace file with a built-in rule set's options, as `opledger import` reads it,
//! and prints the events, steps and the rate: `cargo run --release -p opledger-core --example
//! read_trace -- TRACE.json [RULES]` (RULES: `pytorch` by default). With
//! `scripts/kineto-trace-gen` it measures the reader on a Kineto-shaped trace.

use opledger_core::import_rules::ImportRules;
use opledger_core::trace::{read_chrome, read_chrome_sorted, TraceError, TraceOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let path = args.get(1).expect("usage: read_trace TRACE.json [RULES]");
    let rules = ImportRules::builtin(args.get(2).map_or("pytorch", String::as_str))
        .expect("a built-in rule set")
        .expect("valid rules");
    let opts = TraceOptions {
        step: regex::Regex::new(rules.text.step.as_deref().unwrap_or("^forward$")).unwrap(),
        arg_keys: rules.arg_keys(),
        context: rules.context(),
    };
    let open = || std::io::BufReader::with_capacity(1 << 20, std::fs::File::open(path).unwrap());
    let t0 = std::time::Instant::now();
    let s = match read_chrome(open(), path, &opts) {
        Err(TraceError::OutOfOrder { .. }) => read_chrome_sorted(open(), path, &opts),
        r => r,
    }
    .unwrap_or_else(|e| panic!("{e}"));
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{} events, {} steps, {} keys, {} device activities in {:.3} s = {:.3} M events/s",
        s.events,
        s.steps.len(),
        s.keys.len(),
        s.device.events,
        secs,
        s.events as f64 / secs / 1e6
    );
}
