//! The exit codes of every command (README.md, "Exit codes"): defined with what a result means
//! for them in the application layer, re-exported here for the binary and its tests.

pub use opledger_app::outcome::{
    is_failed_check, of_error, BAD_INPUT, CHECK_FAILED, INCONCLUSIVE, REFUSED, REGRESSED,
    REMOTE_FAILED, WORKER_FAILED,
};
