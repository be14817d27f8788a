//! The SMTP side: framing and the session machine (pure), replies, and the thin server.

pub mod framing;
pub mod reply;
pub mod sasl;
pub mod server;
pub mod session;
pub mod tls;
