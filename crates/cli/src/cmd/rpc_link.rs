//! `opledger rpc-link`: a slow network simulated between this machine and an RPC server (a relay
//! with a one-way delay and a rate in each direction), for asking what a slower link would cost
//! band by band. Loopback only.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Result};
use clap::Args;

#[derive(Args)]
pub struct RpcLinkArgs {
    /// The loopback address to listen on (HOST:PORT); point `--rpc` at it.
    #[arg(long, value_parser = super::flags::endpoint)]
    pub listen: String,
    /// The RPC server to relay to (HOST:PORT).
    #[arg(long, value_parser = super::flags::endpoint)]
    pub to: String,
    /// One-way delay in milliseconds, each direction.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    pub delay_ms: f64,
    /// Rate in Mbit/s, each direction (default: unlimited).
    #[arg(long, value_parser = rate)]
    pub rate_mbit: Option<f64>,
}

fn non_negative(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(0.0..=10_000.0).contains(&v) {
        return Err(format!("{v} is not a delay in 0..=10000 ms"));
    }
    Ok(v)
}

fn rate(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number"))?;
    if !(v > 0.0 && v.is_finite()) {
        return Err(format!("{v} is not a rate above 0 Mbit/s"));
    }
    Ok(v)
}

pub fn run(args: RpcLinkArgs) -> Result<ExitCode> {
    if !opledger_app::rpc::is_loopback(&args.listen) {
        bail!(
            "--listen {}: the simulated link listens on loopback only",
            args.listen
        );
    }
    let link = opledger_app::rpc::Link {
        delay: Duration::from_secs_f64(args.delay_ms / 1e3),
        rate: args.rate_mbit.map(|m| m * 1e6 / 8.0),
    };
    opledger_app::rpc::relay(&args.listen, &args.to, link, &mut |addr| {
        eprintln!(
            "opledger rpc-link: {addr} -> {} with {} ms one-way delay{}",
            args.to,
            args.delay_ms,
            args.rate_mbit
                .map(|m| format!(" and {m} Mbit/s"))
                .unwrap_or_default()
        );
    })?;
    Ok(ExitCode::SUCCESS)
}
