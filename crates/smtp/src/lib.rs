//! The SMTP protocol as idemrelay speaks it, free of I/O: strict CRLF framing, the PROXY header,
//! addresses and their ESMTP parameters, SASL, and the session machine that turns a client's
//! bytes into replies and actions. No tokio here: the relay's server owns the sockets and feeds
//! this crate bytes; the reply lines are the model crate's.

pub mod address;
pub mod framing;
pub mod mail_rcpt;
pub mod proxy_header;
pub mod sasl;
pub mod session;
