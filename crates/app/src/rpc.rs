//! llama.cpp's RPC backend from the application's side: serving this machine's CPU to a client
//! elsewhere (in a worker process), the run folder of a run whose remote device failed mid-run,
//! the servers on this machine, and a simulated link.

use std::path::Path;

use anyhow::Result;

/// Serves this machine's CPU as a remote device on `host:port` with `threads` threads (ggml's own
/// RPC server: one client at a time) by replacing this process with the bundled llama.cpp worker
/// (`opledger-llama-worker --rpc-server`, `exec`): opledger links no llama.cpp of its own, and
/// the server is this very process, so a signal sent to it (a stop, a kill) reaches ggml's
/// server and no orphan is left serving. Returns only when the worker cannot be started.
pub fn serve(host: &str, port: u16, threads: u32) -> Result<()> {
    use std::os::unix::process::CommandExt;
    let worker = crate::engines::bundled_worker()?;
    let e = std::process::Command::new(&worker)
        .arg("--rpc-server")
        .arg(format!("{host}:{port}"))
        .arg("--threads")
        .arg(threads.max(1).to_string())
        .exec();
    anyhow::bail!(
        "the RPC server on {host}:{port} cannot start: the llama.cpp worker {} cannot be run: {e}",
        worker.display()
    )
}

/// When `e` is a remote device failing mid-run ([`crate::outcome::is_remote_failure`]: the
/// worker over RPC servers ended as a remote failure), writes the reason into `folder`'s
/// INCOMPLETE marker, so the run folder is kept, marked incomplete with why
/// (`opledger_core::run_folder::mark_stopped`). Returns whether it did: false for any other
/// error, or a folder already finished.
pub fn mark_stopped(folder: &Path, e: &anyhow::Error) -> bool {
    if !crate::outcome::is_remote_failure(e) {
        return false;
    }
    opledger_core::run_folder::mark_stopped(folder, &format!("{e:#}")).unwrap_or(false)
}

/// Whether `host` is a loopback address (or `localhost`).
pub fn is_loopback_host(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

/// Whether a `host:port` endpoint names this machine's loopback.
pub fn is_loopback(endpoint: &str) -> bool {
    endpoint
        .rsplit_once(':')
        .is_some_and(|(host, _)| is_loopback_host(host))
}

/// The processes serving `servers` on this machine (loopback endpoints; a server elsewhere has
/// no process here), and the servers a relay among them is connected to (`rpc-link`): call it
/// once the connections are up.
pub fn local_server_pids(servers: &[String]) -> Vec<u32> {
    let me = std::process::id();
    let mut pids: Vec<u32> = servers
        .iter()
        .filter(|e| is_loopback(e))
        .filter_map(|e| e.rsplit_once(':')?.1.parse::<u16>().ok())
        .flat_map(opledger_core::system::listening_pids)
        .filter(|&p| p != me)
        .collect();
    let tables: String = ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .filter_map(|t| std::fs::read_to_string(t).ok())
        .collect::<Vec<_>>()
        .join("\n");
    let mut behind = Vec::new();
    for &pid in &pids {
        let inodes = opledger_core::system::socket_inodes(pid);
        for port in opledger_core::system::loopback_peer_ports(&tables, &inodes) {
            behind.extend(opledger_core::system::listening_pids(port));
        }
    }
    pids.extend(behind.into_iter().filter(|&p| p != me));
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// A simulated link: one-way delay and a rate, applied to each direction of a TCP connection.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    pub delay: std::time::Duration,
    /// Bytes per second (`None`: as fast as the machine copies).
    pub rate: Option<f64>,
}

impl Link {
    /// When a chunk of `len` bytes that arrived at `arrived` is delivered, and when the link is
    /// free again: it waits for the link (a chunk queued behind earlier ones), takes `len / rate`
    /// to send, and arrives `delay` after its last byte left.
    pub fn schedule(
        &self,
        arrived: std::time::Instant,
        len: usize,
        link_free: std::time::Instant,
    ) -> (std::time::Instant, std::time::Instant) {
        let start = arrived.max(link_free);
        let sending = self
            .rate
            .map(|r| std::time::Duration::from_secs_f64(len as f64 / r))
            .unwrap_or_default();
        let free = start + sending;
        (free + self.delay, free)
    }
}

/// Relays every connection to `listen` on to `to` through a simulated [`Link`] in each
/// direction (a slow network between this machine and an RPC server, without a kernel qdisc).
/// Serves until the listener fails; `ready` is called once it listens.
pub fn relay(listen: &str, to: &str, link: Link, ready: &mut dyn FnMut(&str)) -> Result<()> {
    use anyhow::Context as _;
    let listener = std::net::TcpListener::bind(listen)
        .with_context(|| format!("cannot listen on {listen}"))?;
    ready(&listener.local_addr()?.to_string());
    for conn in listener.incoming() {
        let Ok(client) = conn else { continue };
        let Ok(server) = std::net::TcpStream::connect(to) else {
            // the client sees its connection closed, as with the server gone
            continue;
        };
        for s in [&client, &server] {
            let _ = s.set_nodelay(true);
        }
        let (c2, s2) = (client.try_clone()?, server.try_clone()?);
        std::thread::spawn(move || pump(client, server, link));
        std::thread::spawn(move || pump(s2, c2, link));
    }
    Ok(())
}

/// One direction of a relayed connection: a reader stamps each chunk as it arrives, a writer
/// delivers it when the link schedule says.
fn pump(mut from: std::net::TcpStream, mut to: std::net::TcpStream, link: Link) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(std::time::Instant, Vec<u8>)>();
    let writer = std::thread::spawn(move || {
        let mut free = std::time::Instant::now();
        for (arrived, data) in rx {
            let (deliver, next_free) = link.schedule(arrived, data.len(), free);
            free = next_free;
            let now = std::time::Instant::now();
            if deliver > now {
                std::thread::sleep(deliver - now);
            }
            if to.write_all(&data).is_err() {
                break;
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Both);
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if tx
                    .send((std::time::Instant::now(), buf[..n].to_vec()))
                    .is_err()
                {
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.join();
    let _ = from.shutdown(std::net::Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn loopback_only_by_default() {
        for host in ["127.0.0.1", "127.0.0.2", "localhost", "::1"] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in ["0.0.0.0", "192.168.1.4", "example.org"] {
            assert!(!is_loopback_host(host), "{host}");
        }
        assert!(is_loopback("localhost:50052") && is_loopback("127.0.0.1:1"));
        assert!(!is_loopback("10.0.0.7:50052") && !is_loopback("127.0.0.1"));
    }

    #[test]
    fn a_link_queues_sends_at_its_rate_and_delivers_after_its_delay() {
        let link = Link {
            delay: Duration::from_millis(1),
            rate: Some(1e6), // 1 MB/s: 1000 bytes take 1 ms
        };
        let t0 = Instant::now();
        // an idle link: 1 ms to send, 1 ms to arrive
        let (deliver, free) = link.schedule(t0, 1000, t0);
        assert_eq!(free - t0, Duration::from_millis(1));
        assert_eq!(deliver - t0, Duration::from_millis(2));
        // a second chunk arriving at once waits for the first to leave
        let (deliver2, free2) = link.schedule(t0, 1000, free);
        assert_eq!(free2 - t0, Duration::from_millis(2));
        assert_eq!(deliver2 - t0, Duration::from_millis(3));
        // without a rate, only the delay
        let fast = Link {
            delay: Duration::from_millis(5),
            rate: None,
        };
        let (d, f) = fast.schedule(t0, 1 << 20, t0);
        assert_eq!((d - t0, f - t0), (Duration::from_millis(5), Duration::ZERO));
    }
}
