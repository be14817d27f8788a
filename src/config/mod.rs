//! Settings: TOML file, then `IDEMRELAY_*` environment, then flags. Validation and redaction.

mod before_queue;
mod default_file;
mod delivery;
pub(crate) mod parts;
mod webhooks;

pub(crate) use default_file::default_config_file;
pub use default_file::DEFAULT_CONFIG;

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::mail::{is_valid_key, MissingKey};

pub(crate) use crate::hostname::system_hostname;
pub use crate::secret::{Secret, SecretUrl};
pub use before_queue::BeforeQueueConfig;
pub(crate) use delivery::DeliveryConfig;
pub use webhooks::{WebhookFields, WebhookSource, WebhookTypes};

/// Where the admin HTTP API listens; `off` runs the relay without it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdminListen(pub Option<SocketAddr>);

impl std::str::FromStr for AdminListen {
    type Err = String;
    /// `HOST:PORT`, or a URL `http://HOST[:PORT][/]` as `idemrelay queue --admin` is often
    /// given one (a host name is resolved now, to its first address), or `off`.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("off") {
            return Ok(AdminListen(None));
        }
        let lower = s.to_ascii_lowercase();
        if lower.starts_with("https://") {
            return Err(format!(
                "{s:?}: the admin API speaks plain HTTP (no TLS); give http://HOST:PORT, through \
                 an SSH tunnel if it is not on this network"
            ));
        }
        let (rest, default_port) = match lower.strip_prefix("http://") {
            Some(_) => (s["http://".len()..].trim_end_matches('/'), Some(80)),
            None => (s, None),
        };
        if rest.contains('/') {
            return Err(format!("{s:?}: the admin address takes no path"));
        }
        if let Ok(addr) = rest.parse::<SocketAddr>() {
            return Ok(AdminListen(Some(addr)));
        }
        let with_port = match (default_port, rest.rsplit_once(':')) {
            (Some(port), None) => format!("{rest}:{port}"),
            (Some(port), Some((_, p))) if p.parse::<u16>().is_err() => format!("{rest}:{port}"),
            _ => rest.to_string(),
        };
        use std::net::ToSocketAddrs as _;
        match with_port.to_socket_addrs() {
            Ok(mut addrs) => addrs.next().map(|a| AdminListen(Some(a))).ok_or_else(|| {
                format!("{s:?}: the name has no address")
            }),
            Err(e) => Err(format!(
                "{s:?} is neither an address like 127.0.0.1:8025 (or http://127.0.0.1:8025) nor \"off\" ({e})"
            )),
        }
    }
}

impl fmt::Display for AdminListen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(addr) => write!(f, "{addr}"),
            None => f.write_str("off"),
        }
    }
}

impl Serialize for AdminListen {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for AdminListen {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Settings {
    /// Plain SMTP listeners (allow-listed clients).
    pub listen: Vec<SocketAddr>,
    /// Submission listeners with STARTTLS, required before MAIL and AUTH (port 587 style).
    pub submission_listen: Vec<SocketAddr>,
    /// Submission listeners with implicit TLS (port 465 style).
    pub submissions_listen: Vec<SocketAddr>,
    /// PEM certificate chain and private key for the TLS listeners (reloaded on change/SIGHUP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_cert: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key: Option<PathBuf>,
    #[serde(with = "crate::human_duration")]
    pub tls_reload_interval: Duration,
    /// Users allowed to AUTH (TOML, argon2 hashes; `idemrelay user add`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub users_file: Option<PathBuf>,
    /// Networks allowed to submit without AUTH on the TLS listeners (default: none).
    pub submission_allow_networks: Vec<IpNet>,
    /// Load balancers in front of the plain listeners: connections from these networks must
    /// start with a PROXY protocol header (v1 or v2), whose client address then counts for
    /// allow lists, caps, AUTH throttling, the Received line and logs (default: none).
    pub proxy_protocol_from: Vec<IpNet>,
    /// The same for the TLS listeners (the header comes before STARTTLS or the handshake).
    pub submission_proxy_protocol_from: Vec<IpNet>,
    /// `sqlite://PATH` (created if missing) or `postgres://USER[:PASSWORD]@HOST/DB` (shared by
    /// several relay instances).
    pub store: SecretUrl,
    /// Where accepted mail goes (delivery is a separate component).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub upstream: Option<SecretUrl>,
    /// Name in the greeting and in the Received line.
    pub hostname: String,
    /// Idempotency scope of unauthenticated (allow-listed) clients.
    pub scope: String,
    /// Networks allowed to submit without authentication.
    pub allow_networks: Vec<IpNet>,
    pub missing_key: MissingKey,
    /// How long a delivered or rejected record replays after acceptance. Every record also
    /// keeps its key until the upstream window has closed on its last attempt.
    #[serde(with = "crate::human_duration")]
    pub retention: Duration,
    /// How long `failed` and `unresolved` records wait for an operator after they were parked.
    #[serde(with = "crate::human_duration")]
    pub parked_retention: Duration,
    /// How long a submission waits for a concurrent one with the same key (then E01004).
    #[serde(with = "crate::human_duration")]
    pub in_progress_wait: Duration,
    pub max_message_size: usize,
    pub max_recipients: usize,
    /// Mail transactions per session (RFC 9422 MAILMAX, advertised in EHLO).
    pub max_transactions: usize,
    pub max_errors: usize,
    /// Read deadline per command or DATA read.
    #[serde(with = "crate::human_duration")]
    pub read_timeout: Duration,
    /// How long a store write may wait for the database lock before the message is refused.
    #[serde(with = "crate::human_duration")]
    pub store_busy_timeout: Duration,
    #[serde(with = "crate::human_duration")]
    pub purge_interval: Duration,
    /// How often the store is probed for writability (new connections get 421 4.3.2 while
    /// it is not writable).
    #[serde(with = "crate::human_duration")]
    pub store_probe_interval: Duration,
    /// How long sessions inside a message may run on after SIGTERM.
    #[serde(with = "crate::human_duration")]
    pub shutdown_grace: Duration,
    /// Pause before the greeting on the plain / TLS listeners; a client that talks first gets
    /// 554 5.5.0.
    #[serde(with = "crate::human_duration")]
    pub greet_delay: Duration,
    #[serde(with = "crate::human_duration")]
    pub submission_greet_delay: Duration,
    /// Connection caps (421 4.7.0 beyond them).
    pub max_connections: usize,
    pub max_connections_per_ip: usize,
    /// Whole-session limit (421 4.4.2).
    #[serde(with = "crate::human_duration")]
    pub session_timeout: Duration,
    /// Bytes per second a message must arrive at after `data_rate_grace` (421 4.4.2).
    pub min_data_rate: u64,
    #[serde(with = "crate::human_duration")]
    pub data_rate_grace: Duration,
    /// Failed AUTH attempts per connection before 421 4.7.0, and the delay before each 535.
    pub max_auth_failures: usize,
    #[serde(with = "crate::human_duration")]
    pub auth_failure_delay: Duration,
    /// Failed AUTHs for one user name from one client (IPv4 address, IPv6 /64), across
    /// reconnects, before that name is refused at AUTH from that client (421 4.7.0).
    pub max_auth_failures_per_user: u32,
    /// Failed AUTHs from one client across all user names before every AUTH from it is
    /// refused (stops a client cycling through names); at least `max_auth_failures_per_user`.
    pub max_auth_failures_per_ip: u32,
    /// A failure count is forgotten after this long without a new failure, so a lockout lasts
    /// this long after the last failed password.
    #[serde(with = "crate::human_duration")]
    pub auth_failure_window: Duration,
    /// Admin HTTP API (health, metrics, the ledger); `off` disables it.
    pub admin: AdminListen,
    /// Bearer token required by `/metrics` and `/api/` when set (health checks stay open).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub admin_token: Option<Secret>,
    /// Without `admin_token`, operator actions (pause, retry, cancel...) through the admin
    /// listener are refused unless this is on: any program on the host, or any web page the
    /// operator's browser shows that finds a way in, could otherwise act as the operator.
    pub admin_allow_changes_without_token: bool,
    /// Host names the admin listener answers to besides IP addresses, `localhost` and
    /// `hostname` (e.g. the name a reverse proxy forwards); any other `Host` is refused, which
    /// is what stops a DNS rebinding page.
    pub admin_hosts: Vec<String>,
    /// Write the envelope (`from`, `to`) on each message's submission line and last delivery
    /// line, so that "did ann@ get yesterday's mail?" can be answered from the logs after
    /// retention removed the record. Off by default: addresses are personal data, and logs
    /// are often kept longer and read by more people than the store.
    pub log_recipients: bool,
    /// Delivery upstream (used only when `upstream` is set).
    pub delivery: DeliveryConfig,
    /// Listeners whose clients hear the upstream's verdict at the end of DATA.
    pub before_queue: BeforeQueueConfig,
    /// Listener for upstream events (`POST /webhooks/{name}`, docs/concepts/webhooks.md); unset: off. TLS when
    /// `tls_cert` and `tls_key` are set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub webhook_listen: Option<SocketAddr>,
    /// Webhook sources by name (the `{name}` of the endpoint).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub webhooks: BTreeMap<String, WebhookSource>,
    /// The HTTP listeners (admin, webhooks): how long a client has, from connecting or from
    /// its previous response, to send a complete request head; idle keep-alive connections
    /// are closed after it too.
    #[serde(with = "crate::human_duration")]
    pub http_header_timeout: Duration,
    /// Connections open at once per HTTP listener (503 and closed beyond it); never more than
    /// a quarter of the process's open-files limit, so SMTP keeps its descriptors.
    pub http_max_connections: usize,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            listen: vec!["127.0.0.1:2525".parse().unwrap()],
            submission_listen: Vec::new(),
            submissions_listen: Vec::new(),
            tls_cert: None,
            tls_key: None,
            tls_reload_interval: Duration::from_secs(30),
            users_file: None,
            submission_allow_networks: Vec::new(),
            proxy_protocol_from: Vec::new(),
            submission_proxy_protocol_from: Vec::new(),
            store: SecretUrl("sqlite://idemrelay.db".into()),
            upstream: None,
            hostname: system_hostname(),
            scope: "default".into(),
            allow_networks: vec!["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()],
            missing_key: MissingKey::Derive,
            retention: Duration::from_secs(3 * 3600),
            parked_retention: Duration::from_secs(30 * 24 * 3600),
            in_progress_wait: Duration::from_secs(2),
            max_message_size: 25 * 1024 * 1024,
            max_recipients: 100,
            max_transactions: 1000,
            max_errors: 20,
            read_timeout: Duration::from_secs(300),
            store_busy_timeout: Duration::from_secs(5),
            purge_interval: Duration::from_secs(60),
            store_probe_interval: Duration::from_secs(2),
            shutdown_grace: Duration::from_secs(30),
            greet_delay: Duration::ZERO,
            submission_greet_delay: Duration::from_millis(500),
            max_connections: 1000,
            max_connections_per_ip: 100,
            session_timeout: Duration::from_secs(30 * 60),
            min_data_rate: 256,
            data_rate_grace: Duration::from_secs(30),
            max_auth_failures: 3,
            auth_failure_delay: Duration::from_secs(1),
            max_auth_failures_per_user: 10,
            max_auth_failures_per_ip: 50,
            auth_failure_window: Duration::from_secs(15 * 60),
            admin: AdminListen(Some(SocketAddr::from(([127, 0, 0, 1], 8025)))),
            admin_token: None,
            admin_allow_changes_without_token: false,
            admin_hosts: Vec::new(),
            log_recipients: false,
            delivery: DeliveryConfig::default(),
            before_queue: BeforeQueueConfig::default(),
            webhook_listen: None,
            webhooks: BTreeMap::new(),
            http_header_timeout: Duration::from_secs(10),
            http_max_connections: 256,
        }
    }
}

/// The settings' flags, global: accepted before or after any subcommand (docs/operations/). Each also
/// reads its `IDEMRELAY_*` variable; `idemrelay sink` has settings of its own and shares only
/// the ids of `--listen`, `--hostname`, `--tls-cert`, `--tls-key` and `--max-message-size`.
#[derive(Debug, Clone, Default, clap::Args)]
pub(crate) struct ConfigArgs {
    /// TOML configuration file (default: /etc/idemrelay/idemrelay.toml when it exists).
    #[arg(global = true, long, env = "IDEMRELAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Plain SMTP listener address (repeatable).
    #[arg(global = true, long, env = "IDEMRELAY_LISTEN", value_delimiter = ',')]
    pub listen: Vec<SocketAddr>,
    /// STARTTLS submission listener address (repeatable), e.g. 0.0.0.0:587.
    #[arg(
        global = true,
        long,
        env = "IDEMRELAY_SUBMISSION_LISTEN",
        value_delimiter = ','
    )]
    pub submission_listen: Vec<SocketAddr>,
    /// Implicit-TLS submission listener address (repeatable), e.g. 0.0.0.0:465.
    #[arg(
        global = true,
        long,
        env = "IDEMRELAY_SUBMISSIONS_LISTEN",
        value_delimiter = ','
    )]
    pub submissions_listen: Vec<SocketAddr>,
    /// PEM certificate chain for the TLS listeners (reloaded when it changes and on SIGHUP).
    #[arg(global = true, long, env = "IDEMRELAY_TLS_CERT")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(global = true, long, env = "IDEMRELAY_TLS_KEY")]
    pub tls_key: Option<PathBuf>,
    /// Users allowed to AUTH (TOML with argon2 hashes; written by `idemrelay user add`).
    #[arg(global = true, long, env = "IDEMRELAY_USERS_FILE")]
    pub users_file: Option<PathBuf>,
    /// Store URL, e.g. sqlite://idemrelay.db or postgres://relay@db.internal/idemrelay.
    #[arg(global = true, long, env = "IDEMRELAY_STORE", hide_env_values = true)]
    pub store: Option<String>,
    /// Upstream SMTP URL, e.g. smtp://user:pass@host:587.
    #[arg(
        global = true,
        long,
        env = "IDEMRELAY_UPSTREAM",
        hide_env_values = true
    )]
    pub upstream: Option<String>,
    /// Name in the SMTP greeting and the Received line (default: this host's name); `idemrelay queue` shows it as the relay's name.
    #[arg(global = true, long, env = "IDEMRELAY_HOSTNAME")]
    pub hostname: Option<String>,
    /// Idempotency scope: of unauthenticated clients (`serve`), and of the key a `queue` or
    /// `key` command is given.
    #[arg(global = true, long, env = "IDEMRELAY_SCOPE")]
    pub scope: Option<String>,
    /// Network allowed to submit without AUTH (repeatable; replaces the default).
    #[arg(
        global = true,
        long = "allow-network",
        env = "IDEMRELAY_ALLOW_NETWORKS",
        value_delimiter = ','
    )]
    pub allow_networks: Vec<IpNet>,
    /// Load balancer whose connections to the plain listener start with a PROXY header
    /// (repeatable; replaces the file's proxy_protocol_from).
    #[arg(
        global = true,
        long = "proxy-protocol-from",
        env = "IDEMRELAY_PROXY_PROTOCOL_FROM",
        value_delimiter = ','
    )]
    pub proxy_protocol_from: Vec<IpNet>,
    /// A message without an idempotency key: `derive` one, `pass` it on without
    /// deduplication, or `reject` it.
    #[arg(global = true, long, env = "IDEMRELAY_MISSING_KEY", value_enum)]
    pub missing_key: Option<MissingKey>,
    /// How long a delivered or rejected record replays after acceptance (e.g. 3h).
    #[arg(global = true, long, env = "IDEMRELAY_RETENTION", value_parser = humantime::parse_duration)]
    pub retention: Option<Duration>,
    /// How long `failed`, `unresolved` and `cancelled` records wait for an operator (e.g. 30d).
    #[arg(global = true, long, env = "IDEMRELAY_PARKED_RETENTION", value_parser = humantime::parse_duration)]
    pub parked_retention: Option<Duration>,
    /// How long a submission waits for a concurrent one with the same key (then E01004).
    #[arg(global = true, long, env = "IDEMRELAY_IN_PROGRESS_WAIT", value_parser = humantime::parse_duration)]
    pub in_progress_wait: Option<Duration>,
    /// Largest message accepted, in bytes (SIZE).
    #[arg(global = true, long, env = "IDEMRELAY_MAX_MESSAGE_SIZE")]
    pub max_message_size: Option<usize>,
    /// Most recipients one message may have.
    #[arg(global = true, long, env = "IDEMRELAY_MAX_RECIPIENTS")]
    pub max_recipients: Option<usize>,
    /// Read deadline per SMTP command or DATA read.
    #[arg(global = true, long, env = "IDEMRELAY_READ_TIMEOUT", value_parser = humantime::parse_duration)]
    pub read_timeout: Option<Duration>,
    /// How long a store write may wait for the database lock before the message is refused.
    #[arg(global = true, long, env = "IDEMRELAY_STORE_BUSY_TIMEOUT", value_parser = humantime::parse_duration)]
    pub store_busy_timeout: Option<Duration>,
    /// How often records past their retention are deleted.
    #[arg(global = true, long, env = "IDEMRELAY_PURGE_INTERVAL", value_parser = humantime::parse_duration)]
    pub purge_interval: Option<Duration>,
    /// How often the store is probed for writability (new connections get 421 4.3.2 while it is not writable).
    #[arg(global = true, long, env = "IDEMRELAY_STORE_PROBE_INTERVAL", value_parser = humantime::parse_duration)]
    pub store_probe_interval: Option<Duration>,
    /// How long sessions inside a message may run on after SIGTERM.
    #[arg(global = true, long, env = "IDEMRELAY_SHUTDOWN_GRACE", value_parser = humantime::parse_duration)]
    pub shutdown_grace: Option<Duration>,
    /// Extra trusted CA certificates (PEM) for the upstream's TLS.
    #[arg(global = true, long, env = "IDEMRELAY_UPSTREAM_CA_FILE")]
    pub upstream_ca_file: Option<PathBuf>,
    /// The upstream's idempotency window (UNKNOWN outcomes are retried only inside it).
    #[arg(global = true, long, env = "IDEMRELAY_UPSTREAM_WINDOW", value_parser = humantime::parse_duration)]
    pub upstream_window: Option<Duration>,
    /// First delay before a delivery is retried (then doubled, with jitter, up to the cap).
    #[arg(global = true, long, env = "IDEMRELAY_RETRY_BASE", value_parser = humantime::parse_duration)]
    pub retry_base: Option<Duration>,
    /// Concurrent upstream connections.
    #[arg(global = true, long, env = "IDEMRELAY_UPSTREAM_CONNECTIONS")]
    pub upstream_connections: Option<usize>,
    /// Admin HTTP API address (health, metrics, ledger), or `off`: where `serve` listens, and
    /// the relay `queue` and `healthcheck` ask (HOST:PORT or http://HOST:PORT).
    #[arg(global = true, long, env = "IDEMRELAY_ADMIN")]
    pub admin: Option<AdminListen>,
    /// Bearer token for the admin API's /metrics and /api/ (prefer the variable: flags show
    /// in the process list).
    #[arg(
        global = true,
        long,
        env = "IDEMRELAY_ADMIN_TOKEN",
        hide_env_values = true
    )]
    pub admin_token: Option<String>,
    /// Allow operator actions through the admin API and console without `admin_token`
    /// (refused by default).
    #[arg(
        global = true,
        long,
        env = "IDEMRELAY_ADMIN_ALLOW_CHANGES_WITHOUT_TOKEN",
        value_name = "BOOL",
        num_args = 0..=1,
        default_missing_value = "true",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    pub admin_allow_changes_without_token: Option<bool>,
    /// Listener for signed upstream events (`POST /webhooks/{name}`), e.g. 127.0.0.1:8027;
    /// the sources are configured in the file (`[webhooks.NAME]`).
    #[arg(global = true, long, env = "IDEMRELAY_WEBHOOK_LISTEN")]
    pub webhook_listen: Option<SocketAddr>,
}

impl Settings {
    /// The limits of the relay's HTTP listeners (admin, webhooks), the connection cap bounded
    /// by the descriptor limit (`http_serve::connection_cap`).
    pub(crate) fn http_limits(&self) -> crate::http_serve::HttpLimits {
        crate::http_serve::HttpLimits {
            header_timeout: self.http_header_timeout,
            max_connections: crate::http_serve::connection_cap(self.http_max_connections),
            shutdown_grace: self.shutdown_grace,
        }
    }

    /// Parses a settings file. Errors name the line but never quote it: the line may hold
    /// the upstream password.
    pub fn from_toml(text: &str) -> anyhow::Result<Settings> {
        toml::from_str(text).map_err(|e| {
            let Some(span) = e.span() else {
                return anyhow::anyhow!("{}", e.message());
            };
            let start = span.start.min(text.len());
            let line_no = text[..start].matches('\n').count() + 1;
            let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
            // The key name is safe to show; the value is not.
            let key = text[line_start..]
                .split(['=', '\n'])
                .next()
                .map(str::trim)
                .filter(|k| !k.is_empty() && k.len() < 64 && !k.contains(['"', '\'', ':', '@']));
            match key {
                Some(key) => anyhow::anyhow!("line {line_no} ({key}): {}", e.message()),
                None => anyhow::anyhow!("line {line_no}: {}", e.message()),
            }
        })
    }

    /// File first, then environment and flags (clap already ranks a flag over its variable).
    pub(crate) fn load(args: &ConfigArgs) -> anyhow::Result<Settings> {
        let mut s = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                Settings::from_toml(&text).with_context(|| format!("in {}", path.display()))?
            }
            None => Settings::default(),
        };
        if !args.listen.is_empty() {
            s.listen = args.listen.clone();
        }
        if !args.submission_listen.is_empty() {
            s.submission_listen = args.submission_listen.clone();
        }
        if !args.submissions_listen.is_empty() {
            s.submissions_listen = args.submissions_listen.clone();
        }
        for (arg, field) in [
            (&args.tls_cert, &mut s.tls_cert),
            (&args.tls_key, &mut s.tls_key),
            (&args.users_file, &mut s.users_file),
        ] {
            if arg.is_some() {
                field.clone_from(arg);
            }
        }
        if !args.allow_networks.is_empty() {
            s.allow_networks = args.allow_networks.clone();
        }
        if !args.proxy_protocol_from.is_empty() {
            s.proxy_protocol_from = args.proxy_protocol_from.clone();
        }
        macro_rules! overlay {
            ($($field:ident),*) => { $( if let Some(v) = &args.$field { s.$field = v.clone(); } )* };
        }
        overlay!(
            hostname,
            scope,
            missing_key,
            retention,
            parked_retention,
            in_progress_wait,
            max_message_size,
            max_recipients,
            read_timeout,
            store_busy_timeout,
            purge_interval,
            store_probe_interval,
            shutdown_grace
        );
        if let Some(url) = &args.store {
            s.store = SecretUrl(url.clone());
        }
        if let Some(url) = &args.upstream {
            s.upstream = Some(SecretUrl(url.clone()));
        }
        if let Some(path) = &args.upstream_ca_file {
            s.delivery.ca_file = Some(path.clone());
        }
        if let Some(window) = args.upstream_window {
            s.delivery.upstream_window = window;
        }
        if let Some(base) = args.retry_base {
            s.delivery.retry_base = base;
        }
        if let Some(n) = args.upstream_connections {
            s.delivery.connections = n;
        }
        if let Some(admin) = args.admin {
            s.admin = admin;
        }
        if let Some(token) = &args.admin_token {
            s.admin_token = Some(Secret(token.clone()));
        }
        if let Some(allow) = args.admin_allow_changes_without_token {
            s.admin_allow_changes_without_token = allow;
        }
        if let Some(addr) = args.webhook_listen {
            s.webhook_listen = Some(addr);
        }
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> anyhow::Result<()> {
        if self.listen.is_empty()
            && self.submission_listen.is_empty()
            && self.submissions_listen.is_empty()
            && !self.before_queue.in_use()
        {
            bail!("listen: at least one listener is required");
        }
        let tls_listeners =
            !self.submission_listen.is_empty() || !self.submissions_listen.is_empty();
        if tls_listeners && (self.tls_cert.is_none() || self.tls_key.is_none()) {
            bail!("tls_cert and tls_key are required by submission_listen/submissions_listen");
        }
        if self.http_max_connections == 0 || self.http_header_timeout.is_zero() {
            bail!("http_max_connections and http_header_timeout must be positive");
        }
        if self.max_connections == 0
            || self.max_connections_per_ip == 0
            || self.max_auth_failures == 0
        {
            bail!("max_connections, max_connections_per_ip and max_auth_failures must be positive");
        }
        if self.max_auth_failures_per_user == 0 || self.auth_failure_window.is_zero() {
            bail!("max_auth_failures_per_user and auth_failure_window must be positive");
        }
        if self.max_auth_failures_per_ip < self.max_auth_failures_per_user {
            bail!("max_auth_failures_per_ip must be at least max_auth_failures_per_user (it counts the failures of all user names together)");
        }
        let store = self.store.expose();
        if !["sqlite:", "postgres:", "postgresql:"]
            .iter()
            .any(|scheme| store.starts_with(scheme))
        {
            bail!(
                "store: {:?} is not a supported URL (sqlite://PATH or postgres://…)",
                self.store.redacted()
            );
        }
        if let Some(url) = &self.upstream {
            let ok = ["smtp://", "smtps://"]
                .iter()
                .any(|p| url.expose().starts_with(p));
            if !ok {
                bail!(
                    "upstream: {} must start with smtp:// or smtps://",
                    url.redacted()
                );
            }
            crate::delivery::upstream::UpstreamTarget::parse(url.expose(), None)
                .map_err(|e| anyhow::anyhow!("upstream {}: {e}", url.redacted()))?;
        }
        let d = &self.delivery;
        if d.connections == 0 || d.max_messages_per_connection == 0 || d.max_attempts == 0 {
            bail!("delivery: connections, max_messages_per_connection and max_attempts must be positive");
        }
        if !(d.rate > 0.0 && d.burst >= 1.0) {
            bail!("delivery: rate must be positive and burst at least 1");
        }
        if d.retry_cap < d.retry_base {
            bail!("delivery: retry_cap must not be smaller than retry_base");
        }
        if d.window_margin < d.timeouts.dot {
            bail!("delivery: window_margin must cover timeouts.dot (a body sent just inside the window must land inside it)");
        }
        if d.window_margin >= d.upstream_window {
            bail!("delivery: window_margin must be smaller than upstream_window");
        }
        d.validate_breaker()?;
        self.before_queue.validate()?;
        if let Some(token) = &self.admin_token {
            let t = token.expose();
            if t.len() < 16 || t.bytes().any(|b| !b.is_ascii_graphic()) {
                bail!("admin_token: must be at least 16 printable characters without spaces");
            }
            if guessable_token(t) {
                bail!("admin_token: too easy to guess (it repeats itself or uses fewer than 6 different characters); make one with `openssl rand -hex 24`");
            }
        }
        for name in &self.admin_hosts {
            let ok = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
            if !ok {
                bail!("admin_hosts: {name:?} is not a host name (letters, digits, - and . only, no port)");
            }
        }
        if !is_valid_key(&self.scope) {
            bail!("scope: must be 1-255 printable characters");
        }
        if self.hostname.is_empty() || self.hostname.bytes().any(|b| b <= b' ' || b == 0x7f) {
            bail!("hostname: must be a non-empty name without spaces");
        }
        if self.max_message_size == 0 || self.max_recipients == 0 || self.max_transactions == 0 {
            bail!("max_message_size, max_recipients and max_transactions must be positive");
        }
        if self.retention.is_zero()
            || self.parked_retention.is_zero()
            || self.purge_interval.is_zero()
            || self.store_probe_interval.is_zero()
        {
            bail!("retention, parked_retention, purge_interval and store_probe_interval must be positive");
        }
        if self.webhook_listen.is_some() && self.webhooks.is_empty() {
            bail!("webhook_listen: no webhook source is configured ([webhooks.NAME] with secrets and fields)");
        }
        for (name, source) in &self.webhooks {
            source.validate(name)?;
        }
        // A key must stay taken while the upstream may still hold it (docs/concepts/contract.md "What the relay answers at the end of DATA" Retention).
        if self.retention < d.upstream_window || self.parked_retention < d.upstream_window {
            bail!(
                "retention ({}) and parked_retention ({}) may not be shorter than delivery.upstream_window ({})",
                humantime::format_duration(self.retention),
                humantime::format_duration(self.parked_retention),
                humantime::format_duration(d.upstream_window)
            );
        }
        Ok(())
    }

    /// How long records keep their keys, for the store.
    pub(crate) fn retention_policy(&self) -> crate::store::Retention {
        crate::store::Retention {
            replay: self.retention,
            upstream_window: self.delivery.upstream_window,
            parked: self.parked_retention,
        }
    }

    /// The effective settings as TOML, secrets redacted.
    pub(crate) fn to_redacted_toml(&self) -> String {
        toml::to_string(self).unwrap_or_else(|e| format!("# cannot render settings: {e}\n"))
    }

    /// The top-level names a config file takes (optional settings that are unset by default
    /// are missing: they have variables).
    pub fn file_setting_names() -> std::collections::BTreeSet<String> {
        let text = Settings::default().to_redacted_toml();
        toml::from_str::<toml::Table>(&text)
            .map(|table| table.keys().cloned().collect())
            .unwrap_or_default()
    }
}

/// A token that repeats a shorter string (`passwordpassword`) or draws on fewer than 6
/// different characters: guessable whatever its length. A random token of 16 hex digits or
/// more passes (fewer than 6 different digits in 16 random ones is a chance of about 1 in
/// 10,000,000).
fn guessable_token(token: &str) -> bool {
    let bytes = token.as_bytes();
    let distinct = bytes
        .iter()
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    let repeats = (1..=bytes.len() / 2).any(|n| {
        bytes.len().is_multiple_of(n) && bytes.chunks(n).all(|chunk| chunk == &bytes[..n])
    });
    distinct < 6 || repeats
}

#[cfg(test)]
mod tests;
