//! The SMTP side: framing, the PROXY header and the session machine (pure) and the thin
//! server; the reply lines are `crate::reply`.

pub mod address;
pub mod framing;
pub(crate) mod limits;
pub(crate) mod mail_rcpt;
pub(crate) mod proxy_header;
pub(crate) mod sasl;
pub mod server;
pub mod session;
pub mod tls;
