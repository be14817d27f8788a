//! The plumbing every idemrelay listener shares, below the relay and the test upstream alike:
//! TLS server configuration from PEM files, reloaded in place (`tls`), and serving an HTTP
//! router on a listener that may face the internet (`http_serve`).

pub mod http_serve;
pub mod tls;
