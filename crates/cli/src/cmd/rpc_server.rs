//! `opledger rpc-server`: this machine's CPU as a remote device of llama.cpp's RPC backend (ggml's
//! own server, the one `--rpc` connects to).

use std::net::{IpAddr, TcpListener};
use std::process::ExitCode;

use anyhow::{bail, Context, Result};
use clap::Args;

#[derive(Args)]
pub struct RpcServerArgs {
    /// The address to listen on. Loopback by default; any other needs --allow-remote.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// The port to listen on.
    #[arg(long, default_value_t = 50052, value_parser = clap::value_parser!(u16).range(1..))]
    pub port: u16,
    /// Threads of the CPU backend (default: the machine's available parallelism).
    #[arg(short, long, value_parser = super::flags::threads, allow_negative_numbers = true)]
    pub threads: Option<u32>,
    /// Listen on an address other than loopback. The RPC protocol has no authentication and
    /// no encryption: whoever reaches the port can run code on this machine's memory. Never
    /// on a network you do not trust.
    #[arg(long)]
    pub allow_remote: bool,
}

/// Whether `host` is a loopback address (or `localhost`).
pub fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

pub fn run(args: RpcServerArgs) -> Result<ExitCode> {
    if !is_loopback(&args.host) {
        if !args.allow_remote {
            bail!(
                "--host {}: serving beyond loopback exposes this machine to anyone who reaches the port (llama.cpp's RPC protocol has no authentication); pass --allow-remote to do it anyway, on a trusted network only",
                args.host
            );
        }
        eprintln!(
            "WARNING: serving on {}:{} without authentication or encryption: anyone who reaches this port can allocate memory and run graphs here. Never expose it to an untrusted network.",
            args.host, args.port
        );
    }
    if args.host.contains(':') {
        bail!(
            "--host {}: ggml's RPC server takes an IPv4 address or a name",
            args.host
        );
    }
    // a taken port fails here with a clear error rather than inside ggml
    drop(
        TcpListener::bind((args.host.as_str(), args.port))
            .with_context(|| format!("cannot listen on {}:{}", args.host, args.port))?,
    );
    let threads = args.threads.unwrap_or_else(super::flags::cpus);
    eprintln!(
        "opledger rpc-server: this machine's CPU ({threads} threads) on {}:{}, one client at a time; stop with Ctrl-C",
        args.host, args.port
    );
    opledger_app::rpc::serve(&args.host, args.port, threads)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_only_by_default() {
        assert!(is_loopback("127.0.0.1"));
        assert!(is_loopback("127.0.0.2"));
        assert!(is_loopback("localhost"));
        assert!(is_loopback("::1"));
        assert!(!is_loopback("0.0.0.0"));
        assert!(!is_loopback("192.168.1.4"));
        assert!(!is_loopback("example.org"));
    }
}
