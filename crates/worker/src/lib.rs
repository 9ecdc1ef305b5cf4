//! opledger-worker: the llama.cpp engine in another process. A small measurement worker
//! (`tools/llama-worker`, C++) is compiled in the user's own llama.cpp tree and driven over a
//! channel of its own (a Unix socket, the child's fd 3) with a versioned line protocol
//! (`tools/llama-worker/PROTOCOL.md`); this crate starts it, checks its protocol version, and
//! offers it as a [`opledger_core::engine::Engine`] with the capabilities it can honestly offer
//! (profile, decode, sweep, graph capture). The worker measures; everything that bands,
//! summarises or judges stays in opledger.
//!
//! With the feature `bundled`, `cargo build` also builds the worker against the llama.cpp that
//! `llama-cpp-sys-2` compiles from its vendored sources and embeds it ([`bundled`]); the
//! RPC pre-flight ([`rpc`]) asks each server for its version before a worker connects.
//!
//! Faults belong to the worker: every write and read has a timeout and an answer line a bound; a
//! worker that dies, hangs or writes something that is not the protocol ends the run with a
//! [`WorkerError`] naming it, and the child is always reaped.
#![forbid(unsafe_code)]

pub mod build_manifest;
#[cfg(feature = "bundled")]
pub mod bundled;
pub mod engine;
pub mod process;
pub mod protocol;
pub mod rpc;

pub use engine::{WorkerConfig, WorkerEngine, WorkerRpc};
pub use process::{identify, WorkerError, WorkerProcess};
pub use protocol::{Hello, PROTOCOL_VERSION};
