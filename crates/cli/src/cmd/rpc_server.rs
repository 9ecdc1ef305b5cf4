//! `opledger rpc-server`: this machine's CPU as a remote device of llama.cpp's RPC backend (ggml's
//! own server, the one `--rpc` connects to).

use std::net::{Ipv4Addr, TcpListener};
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

/// The IPv4 address ggml's server binds (it takes a numeric address only, `inet_addr`):
/// `localhost` is 127.0.0.1.
pub fn ipv4_host(host: &str) -> Result<Ipv4Addr> {
    if host.eq_ignore_ascii_case("localhost") {
        return Ok(Ipv4Addr::LOCALHOST);
    }
    host.parse::<Ipv4Addr>().map_err(|_| {
        anyhow::anyhow!(
            "--host {host}: ggml's RPC server listens on a numeric IPv4 address only (such as 127.0.0.1)"
        )
    })
}

pub fn run(args: RpcServerArgs) -> Result<ExitCode> {
    let host = ipv4_host(&args.host)?;
    if !host.is_loopback() {
        if !args.allow_remote {
            bail!(
                "--host {}: serving beyond loopback exposes this machine to anyone who reaches the port (llama.cpp's RPC protocol has no authentication); pass --allow-remote to do it anyway, on a trusted network only",
                args.host
            );
        }
        eprintln!(
            "WARNING: serving on {}:{} without authentication or encryption: anyone who reaches this port can allocate memory and run graphs here. Never expose it to an untrusted network.",
            host, args.port
        );
    }
    let host = host.to_string();
    // a taken port fails here with a clear error rather than inside ggml
    drop(
        TcpListener::bind((host.as_str(), args.port))
            .with_context(|| format!("cannot listen on {host}:{}", args.port))?,
    );
    let threads = args.threads.unwrap_or_else(super::flags::cpus);
    eprintln!(
        "opledger rpc-server: this machine's CPU ({threads} threads) on {host}:{}, one client at a time; stop with Ctrl-C",
        args.port
    );
    opledger_app::rpc::serve(&host, args.port, threads)?;
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_server_binds_a_numeric_ipv4_address() {
        assert_eq!(ipv4_host("localhost").unwrap(), Ipv4Addr::LOCALHOST);
        assert_eq!(ipv4_host("10.0.0.7").unwrap(), Ipv4Addr::new(10, 0, 0, 7));
        for bad in ["::1", "example.org", "127.0.0.256", ""] {
            let e = ipv4_host(bad).unwrap_err().to_string();
            assert!(e.contains("numeric IPv4"), "{bad}: {e}");
        }
    }
}
