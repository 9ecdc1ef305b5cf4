//! llama.cpp's RPC backend seen from opledger before a worker connects: the pre-flight. ggml's
//! RPC client (in the worker) aborts its process when a server cannot be reached or answers with
//! another protocol version, so every server is first asked for its version and device count
//! here, in plain Rust over TCP, each step within a timeout, and refused in words that name it.
//! A server that fails later, mid-run, ends the worker with a remote-failure status
//! (`tools/llama-worker/PROTOCOL.md`, "Faults"), which [`crate::WorkerError::RemoteFailed`]
//! carries.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// A server the pre-flight refused, or an endpoint that is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("RPC server {endpoint}: {why}")]
pub struct RpcError {
    pub endpoint: String,
    pub why: String,
}

/// The RPC protocol version of the vendored ggml (`ggml-rpc.h`: `RPC_PROTO_*_VERSION`). A client
/// accepts a server of the same major version and a minor version not above its own.
pub const PROTOCOL: (u8, u8, u8) = (7, 0, 0);
/// `RPC_CMD_HELLO` (fixed at 14 across versions) and `RPC_CMD_DEVICE_COUNT`.
const CMD_HELLO: u8 = 14;
const CMD_DEVICE_COUNT: u8 = 15;
/// `RPC_CONN_CAPS_SIZE`: the transport capabilities a HELLO carries (all zero: plain TCP).
const CONN_CAPS: usize = 24;

/// What a server answered to the pre-flight.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    pub endpoint: String,
    pub version: (u8, u8, u8),
    pub devices: u32,
}

/// Checks that `endpoint` is `host:port` as ggml parses it (one colon, a port 1..=65535).
pub fn parse_endpoint(endpoint: &str) -> Result<(String, u16), RpcError> {
    let bad = |why: &str| RpcError {
        endpoint: endpoint.to_string(),
        why: why.to_string(),
    };
    let (host, port) = endpoint
        .rsplit_once(':')
        .ok_or_else(|| bad("not HOST:PORT"))?;
    if host.is_empty() || host.contains(':') {
        return Err(bad(
            "not HOST:PORT (ggml's RPC client takes an IPv4 address or a name)",
        ));
    }
    let port: u16 = port
        .parse()
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| bad("the port is not a number in 1..=65535"))?;
    Ok((host.to_string(), port))
}

/// Connects to `endpoint`, says HELLO as ggml's client does and asks for the device count, each
/// step within `timeout`; refuses a server ggml's client would abort on.
pub fn preflight(endpoint: &str, timeout: Duration) -> Result<ServerInfo, RpcError> {
    let err = |why: String| RpcError {
        endpoint: endpoint.to_string(),
        why,
    };
    let (host, port) = parse_endpoint(endpoint)?;
    let addrs: Vec<_> = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| err(format!("cannot resolve {host}: {e}")))?
        .collect();
    // ggml's client connects over IPv4 only (gethostbyname, AF_INET): the first IPv4 address
    let addr = addrs.iter().find(|a| a.is_ipv4()).ok_or_else(|| {
        err(format!(
            "{host} resolves to no IPv4 address (ggml's RPC client connects over IPv4 only)"
        ))
    })?;
    let mut s = TcpStream::connect_timeout(addr, timeout).map_err(|e| {
        err(match e.kind() {
            std::io::ErrorKind::ConnectionRefused => {
                "connection refused: no RPC server listens there (start one with `opledger rpc-server`)".into()
            }
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => {
                format!("unreachable: no answer within {:.1} s", timeout.as_secs_f64())
            }
            _ => format!("unreachable: {e}"),
        })
    })?;
    let io = |what: &str, e: std::io::Error| {
        err(match e.kind() {
            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock => format!(
                "no answer to {what} within {:.1} s (is it serving another client? a ggml RPC server serves one at a time)",
                timeout.as_secs_f64()
            ),
            std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset => format!(
                "closed the connection during {what}: not a ggml RPC server of protocol {}.x, or one that refused this client's HELLO",
                PROTOCOL.0
            ),
            _ => format!("{what} failed: {e}"),
        })
    };
    s.set_read_timeout(Some(timeout))
        .map_err(|e| io("setup", e))?;
    s.set_write_timeout(Some(timeout))
        .map_err(|e| io("setup", e))?;
    let _ = s.set_nodelay(true);

    let mut hello = vec![CMD_HELLO];
    hello.extend_from_slice(&(CONN_CAPS as u64).to_le_bytes());
    hello.extend_from_slice(&[0u8; CONN_CAPS]);
    s.write_all(&hello).map_err(|e| io("the HELLO", e))?;
    let size = read_u64(&mut s).map_err(|e| io("the HELLO", e))?;
    if !(3..=1024).contains(&size) {
        return Err(err(format!(
            "answered HELLO with {size} bytes: not a ggml RPC server"
        )));
    }
    let mut body = vec![0u8; size as usize];
    s.read_exact(&mut body).map_err(|e| io("the HELLO", e))?;
    let version = (body[0], body[1], body[2]);
    if version.0 != PROTOCOL.0 || version.1 > PROTOCOL.1 {
        return Err(err(format!(
            "speaks RPC protocol {}.{}.{}, this opledger's llama.cpp (llama-cpp-sys-2) speaks {}.{}.{}: run `opledger rpc-server` of the same build there",
            version.0, version.1, version.2, PROTOCOL.0, PROTOCOL.1, PROTOCOL.2,
        )));
    }
    if size as usize != 4 + CONN_CAPS {
        return Err(err(format!(
            "answered HELLO with {size} bytes, protocol {}.x has {}",
            PROTOCOL.0,
            4 + CONN_CAPS
        )));
    }
    let mut ask = vec![CMD_DEVICE_COUNT];
    ask.extend_from_slice(&0u64.to_le_bytes());
    s.write_all(&ask).map_err(|e| io("the device count", e))?;
    let size = read_u64(&mut s).map_err(|e| io("the device count", e))?;
    if size != 4 {
        return Err(err(format!(
            "answered the device count with {size} bytes, not 4"
        )));
    }
    let mut n = [0u8; 4];
    s.read_exact(&mut n)
        .map_err(|e| io("the device count", e))?;
    let devices = u32::from_le_bytes(n);
    if devices == 0 {
        return Err(err("serves no device".into()));
    }
    Ok(ServerInfo {
        endpoint: endpoint.to_string(),
        version,
        devices,
    })
}

fn read_u64(s: &mut TcpStream) -> std::io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_host_and_port() {
        assert_eq!(
            parse_endpoint("127.0.0.1:50052").unwrap(),
            ("127.0.0.1".into(), 50052)
        );
        assert!(parse_endpoint("127.0.0.1").is_err());
        assert!(parse_endpoint(":50052").is_err());
        assert!(parse_endpoint("127.0.0.1:0").is_err());
        assert!(parse_endpoint("127.0.0.1:70000").is_err());
        assert!(parse_endpoint("::1:50052").is_err());
    }

    /// A fake server on loopback that answers HELLO with `version` and the device count with
    /// `devices`.
    fn fake(version: [u8; 3], devices: u32) -> (String, std::thread::JoinHandle<()>) {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = l.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut hello = [0u8; 1 + 8 + CONN_CAPS];
            s.read_exact(&mut hello).unwrap();
            assert_eq!(hello[0], CMD_HELLO);
            let mut rsp = ((3 + CONN_CAPS + 1) as u64).to_le_bytes().to_vec();
            rsp.extend_from_slice(&version);
            rsp.extend_from_slice(&[0; CONN_CAPS + 1]);
            s.write_all(&rsp).unwrap();
            if version[0] != PROTOCOL.0 {
                return;
            }
            let mut ask = [0u8; 9];
            s.read_exact(&mut ask).unwrap();
            assert_eq!(ask[0], CMD_DEVICE_COUNT);
            let mut rsp = 4u64.to_le_bytes().to_vec();
            rsp.extend_from_slice(&devices.to_le_bytes());
            s.write_all(&rsp).unwrap();
        });
        (endpoint, h)
    }

    #[test]
    fn the_preflight_reads_the_version_and_devices_and_refuses_in_words() {
        let t = Duration::from_secs(5);
        let (e, h) = fake([PROTOCOL.0, PROTOCOL.1, PROTOCOL.2], 2);
        let info = preflight(&e, t).unwrap();
        h.join().unwrap();
        assert_eq!((info.version, info.devices), (PROTOCOL, 2));
        let (e, h) = fake([PROTOCOL.0 - 1, 0, 0], 1);
        let err = preflight(&e, t).unwrap_err().to_string();
        h.join().unwrap();
        assert!(
            err.contains(&format!("speaks RPC protocol {}.0.0", PROTOCOL.0 - 1)),
            "{err}"
        );
        let (e, h) = fake([PROTOCOL.0, PROTOCOL.1, PROTOCOL.2], 0);
        let err = preflight(&e, t).unwrap_err().to_string();
        h.join().unwrap();
        assert!(err.contains("serves no device"), "{err}");
        // nothing listens: refused, by name
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = preflight(&format!("127.0.0.1:{port}"), t)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with(&format!("RPC server 127.0.0.1:{port}: connection refused")),
            "{err}"
        );
    }
}
