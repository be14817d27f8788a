//! The SMTP side: framing, the PROXY header and the session machine (pure), replies, and the
//! thin server.

pub mod address;
pub mod framing;
pub(crate) mod limits;
pub(crate) mod mail_rcpt;
pub(crate) mod proxy_header;
pub mod reply;
pub(crate) mod sasl;
pub mod server;
pub mod session;
pub mod tls;
