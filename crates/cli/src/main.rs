//! The `opledger` binary: parses arguments, builds each command's configuration, runs it. No
//! measurement or analysis logic lives here: that is in the core, engine and report crates.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Where does the time go in LLM inference, operator band by operator band?
#[derive(Parser)]
#[command(name = "opledger", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write a synthetic GGUF model with a real architecture's shapes and random valid weights.
    Synth(opledger::cmd::synth::SynthArgs),
    /// Profile one chunk per node: bands in ms/token (TIMED share x FUSED wall / tokens).
    Profile(opledger::cmd::profile::ProfileArgs),
    /// Sweep context depth: bands per depth, a fit per band, where attention overtakes the FFN.
    Sweep(opledger::cmd::sweep::SweepArgs),
    /// The census of the graph llama.cpp computes for a chunk, checked against the architecture.
    Graph(opledger::cmd::graph::GraphArgs),
    /// Two stored profile runs side by side by band, sorted by gap.
    Compare(opledger::cmd::ledger::CompareArgs),
    /// Profile two engines on the same model and compare them band by band (share x wall and
    /// in-graph replay), with byte and FLOP math.
    Ledger(opledger::cmd::ledger::LedgerArgs),
    /// Time every distinct op of the graph alone (expert matmuls under three routings) against
    /// the in-graph band times.
    Ops(opledger::cmd::ops::OpsArgs),
    /// Compare two runtime configurations interleaved: ratio with a confidence interval, a
    /// control, ablations and a correctness gate.
    Ab(opledger::cmd::ab::AbArgs),
    /// Search a grid of runtime knobs for the fastest configuration that returns the same output.
    Discover(opledger::cmd::ab::DiscoverArgs),
    /// Which commit of a llama.cpp checkout (or which of a list of trees) first moved a band,
    /// the total or an op: each step built, measured against both ends with a control and an
    /// output gate, stored as it ends.
    Bisect(opledger::cmd::bisect::BisectArgs),
    /// Import a trace an engine wrote of itself (Chrome trace-event JSON): bands by pattern
    /// rules, written as a run that `report` and `compare` take.
    Import(opledger::cmd::import::ImportArgs),
    /// Re-render a stored run from its raw data, without measuring again.
    Report(opledger::cmd::report::ReportArgs),
    /// Find the rows a graph computes that no output reads, and the time spent on them.
    Waste(opledger::cmd::waste::WasteArgs),
    /// Serve this machine's CPU as a remote device of llama.cpp's RPC backend (for `--rpc`).
    RpcServer(opledger::cmd::rpc_server::RpcServerArgs),
    /// Relay connections to an RPC server through a simulated slow link (delay, rate).
    RpcLink(opledger::cmd::rpc_link::RpcLinkArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Synth(a) => opledger::cmd::synth::run(a),
        Command::Profile(a) => opledger::cmd::profile::run(a),
        Command::Sweep(a) => opledger::cmd::sweep::run(a),
        Command::Graph(a) => opledger::cmd::graph::run(a),
        Command::Ops(a) => opledger::cmd::ops::run(a),
        Command::Compare(a) => opledger::cmd::ledger::run_compare(a),
        Command::Ledger(a) => opledger::cmd::ledger::run_ledger(a),
        Command::Ab(a) => opledger::cmd::ab::run_ab(a),
        Command::Discover(a) => opledger::cmd::ab::run_discover(a),
        Command::Bisect(a) => opledger::cmd::bisect::run(a),
        Command::Import(a) => opledger::cmd::import::run(a),
        Command::Report(a) => opledger::cmd::report::run(a),
        Command::Waste(a) => opledger::cmd::waste::run(a),
        Command::RpcServer(a) => opledger::cmd::rpc_server::run(a),
        Command::RpcLink(a) => opledger::cmd::rpc_link::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            let (code, words) = opledger::exit::of_error(&e);
            eprintln!("{words}");
            ExitCode::from(code)
        }
    }
}
