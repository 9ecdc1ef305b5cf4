//! The wiring of the `opledger` binary: one module per subcommand (arguments, validated into a
//! request for the application layer `opledger_app`, its typed result rendered and written), the
//! progress bars and the exit codes. Exposed as a library so the integration tests can drive the
//! same wiring.
#![forbid(unsafe_code)]

pub mod cmd;
pub mod exit;
pub mod progress;
