//! The sink's settings, as the CLI (`SinkArgs`) or a test builds them.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::faults::FaultRule;
use super::webhook_sender::WebhookConfig;

/// `--fault`'s long help.
pub(super) const FAULT_HELP: &str = "\
Fault rule, repeatable: comma-separated name=value pairs.
  phase=connect|ehlo|mail|rcpt|data|dot
  action=reply      answer code/text instead (nothing accepted; 421 also closes)
  action=drop       (dot only) commit the message, then close without replying
  action=delay      wait ms=N before the normal reply (at dot: committed first)
  action=disconnect close without replying (nothing accepted)
  code=4xx|5xx  text=...  ms=N  times=N (then spent)
  key=SUBSTRING (dot, webhook)  rcpt=SUBSTRING (rcpt, data, dot, webhook)
text= takes the rest of the rule, commas included; put it last.
phase=webhook acts on the event batches posted to --webhook (tried per batch:
injection, then delivery, then bounce, when the message is accepted):
  action=duplicate  post the batch twice (same webhook-id and body)
  action=reorder    post the injection batch after the delivery/bounce batches
  action=late       hold the batch ms=N before its first post
  action=lose_ack   treat the first 2xx as lost and post the batch again
Examples:
  --fault 'phase=dot,action=drop,times=1,key=abc'
  --fault 'phase=rcpt,action=reply,code=451,text=4.3.0 try later'
  --fault 'phase=dot,action=delay,ms=5000'
  --fault 'phase=webhook,action=duplicate,times=3'";

#[derive(Clone)]
pub struct SinkConfig {
    pub listen: SocketAddr,
    /// HTTP API address; none when `None`.
    pub api: Option<SocketAddr>,
    /// Each accepted message is also written to `<maildir>/<id>.eml` (created if missing).
    pub maildir: Option<PathBuf>,
    /// How long after acceptance a key replays.
    pub window: Duration,
    /// PEM certificate chain and private key; enables STARTTLS (or implicit TLS).
    pub tls: Option<(PathBuf, PathBuf)>,
    /// TLS from the first byte (needs `tls`); STARTTLS is then not offered.
    pub implicit_tls: bool,
    pub faults: Vec<FaultRule>,
    /// User and password that AUTH PLAIN/LOGIN must present before MAIL.
    pub require_auth: Option<(String, String)>,
    /// Advertised in EHLO SIZE and enforced.
    pub max_message_size: usize,
    pub hostname: String,
    /// Post signed events for accepted messages here.
    pub webhook: Option<WebhookConfig>,
    /// Offer DSN (RFC 3461): RET, ENVID, NOTIFY and ORCPT are accepted. Without it they are
    /// refused with 555, as a server without the extension may.
    pub dsn: bool,
    /// Offer REQUIRETLS (RFC 8689) once the session is under TLS; MAIL's REQUIRETLS is
    /// refused otherwise.
    pub requiretls: bool,
}

impl Default for SinkConfig {
    fn default() -> Self {
        SinkConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            api: None,
            maildir: None,
            window: Duration::from_secs(3 * 3600),
            tls: None,
            implicit_tls: false,
            faults: Vec::new(),
            require_auth: None,
            max_message_size: 25 * 1024 * 1024,
            hostname: "sink.localhost".into(),
            webhook: None,
            dsn: false,
            requiretls: false,
        }
    }
}

impl fmt::Debug for SinkConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkConfig")
            .field("listen", &self.listen)
            .field("api", &self.api)
            .field("maildir", &self.maildir)
            .field("window", &self.window)
            .field("tls", &self.tls)
            .field("implicit_tls", &self.implicit_tls)
            .field("faults", &self.faults)
            .field(
                "require_auth",
                &self
                    .require_auth
                    .as_ref()
                    .map(|(user, _)| (user, "<redacted>")),
            )
            .field("max_message_size", &self.max_message_size)
            .field("hostname", &self.hostname)
            .field("webhook", &self.webhook)
            .field("dsn", &self.dsn)
            .field("requiretls", &self.requiretls)
            .finish()
    }
}
