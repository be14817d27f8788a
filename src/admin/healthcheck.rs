//! `idemrelay healthcheck`: a tiny HTTP client for the container HEALTHCHECK (the runtime
//! image has no curl). GET /healthz; healthy only on 200.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::time::Duration;

/// The address to probe: a wildcard listen address (0.0.0.0, ::) is reached over loopback.
pub(crate) fn probe_addr(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), listen.port())
        }
        IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::new(IpAddr::V6(Ipv6Addr::LOCALHOST), listen.port())
        }
        _ => listen,
    }
}

/// The status code of `GET path`, within `timeout` for connect and for each read/write.
pub(crate) fn get_status(addr: SocketAddr, path: &str, timeout: Duration) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&probe_addr(addr), timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )?;
    let mut head = Vec::new();
    let mut buf = [0u8; 256];
    // The status line is all that is needed.
    while !head.windows(2).any(|w| w == b"\r\n") && head.len() < 4096 {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    line.split_whitespace()
        .nth(1)
        .filter(|_| line.starts_with("HTTP/"))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "the answer is not HTTP (is this the admin address?)",
            )
        })
}
