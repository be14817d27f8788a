//! The SMTP side: the protocol (framing, the PROXY header, the session machine) is the
//! `idemrelay_smtp` crate, pure and without tokio; here are the thin server that owns the
//! sockets, the connection limits and TLS.

pub use idemrelay_serve::tls;
pub use idemrelay_smtp::{address, framing, mail_rcpt, proxy_header, sasl, session};

pub(crate) mod limits;
pub mod server;
