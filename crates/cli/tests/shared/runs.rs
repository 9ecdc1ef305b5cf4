//! The real-engine runs both the CI tests (`tests/cli`, what does not depend on the machine's
//! speed) and the acceptance benchmark (`tests/acceptance`, the timing claims at their original
//! bounds) make: one definition, so the two judge the same measurement.

/// A prefill sweep of the tiny qwen35moe: 512-token chunks from depth 0 to 8192 (17 depths),
/// 3 cycles, 2 threads; the model follows `-m`.
pub const SWEEP_PREFILL: &[&str] = &[
    "sweep",
    "-p",
    "512",
    "--max-depth",
    "8192",
    "-r",
    "3",
    "-t",
    "2",
    "-q",
    "-m",
];

/// A decode sweep of the tiny qwen35moe: 8 steps of 4 sequences after every 512-token chunk up
/// to depth 4096 (a tiny model's decode nodes do microseconds of work, so a step of four tokens
/// keeps the work above what isolating a node costs); the model follows `-m`.
pub const SWEEP_DECODE: &[&str] = &[
    "sweep",
    "-p",
    "512",
    "--max-depth",
    "4096",
    "-n",
    "8",
    "--parallel",
    "4",
    "-r",
    "3",
    "-t",
    "2",
    "-q",
    "-m",
];

/// The ledger of the tiny qwen3moe with its replays: 3 cycles, k = 4, 7 replay cycles, 2
/// threads, JSON on stdout; the model follows `-m`.
pub const LEDGER_REPLAY: &[&str] = &[
    "ledger",
    "-r",
    "3",
    "-k",
    "4",
    "--replay-cycles",
    "7",
    "-t",
    "2",
    "--json",
    "-m",
];
