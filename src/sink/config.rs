//! The sink's settings, as the CLI (`SinkArgs`) or a test builds them.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use super::faults::FaultRule;
use super::webhook_sender::WebhookConfig;

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
            .finish()
    }
}
