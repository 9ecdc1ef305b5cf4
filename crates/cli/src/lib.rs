//! The wiring of the `opledger` binary: one module per subcommand (arguments, conversion to a
//! configuration, calls into the core, engine and report crates), the model-file gate and the
//! progress bars. Exposed as a library so the integration tests can drive the same wiring.

pub mod cmd;
pub mod exit;
pub mod model_file;
pub mod progress;
