//! The SMTP side: framing, the PROXY header and the session machine (pure), replies, and the
//! thin server.

pub mod address;
pub mod framing;
pub mod limits;
pub mod mail_rcpt;
pub mod proxy_header;
pub mod reply;
pub mod sasl;
pub mod server;
pub mod session;
pub mod tls;
