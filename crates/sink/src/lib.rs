//! `idemrelay sink`: the test upstream. An SMTP server that behaves like Bird's SMTP endpoint
//! as far as idempotency goes (docs/guides/sink.md), records everything it is sent, and misbehaves on
//! request, so that tests and demos can prove the relay delivers exactly once.
//!
//! # What it answers at the final dot
//!
//! The key is the message's `X-Bird-Idempotency-Key` header (unfolded), read by the sink's own
//! parser (`key.rs`), never the relay's: the sink checks the relay's reading of keys instead of
//! sharing it. A request is the
//! envelope (MAIL FROM, the recipient set, BODY=8BITMIME, SMTPUTF8) plus the message bytes after
//! dot-unstuffing, byte for byte.
//!
//! | situation | reply | counted as a message |
//! |---|---|---|
//! | new key, or no key | `250 2.0.0 OK <id>` | yes |
//! | same key and request, within `window` of acceptance | `250 2.0.0 OK <original id> (idempotent replay)` | no |
//! | same key, different request | `554 5.6.0 ... (E01005 IdempotencyKeyReuse)` | no |
//! | same key while the first is still running (its reply held by a `delay` rule) | `451 4.3.0 ... (E01004 RequestInProgress); retry later` | no |
//! | invalid key header (empty, > 255 characters, control characters, differing copies) | `554 5.6.0 ... (E01001)` | no |
//! | line > 998 octets / NUL / over SIZE | `550 5.6.0` / `554 5.6.0` / `552 5.3.4` | no |
//! | bare CR or LF anywhere | `521 5.5.2`, connection closed | no (not a transaction) |
//!
//! After `window` the same key starts a new operation (counted again). Every transaction that
//! reaches the final dot is recorded (`transactions()`, `GET /transactions`), whatever its fate.
//!
//! # Fault rules
//!
//! `--fault RULE` (repeatable), `POST /faults` (adds) or `PUT /faults` (replaces), or
//! [`SinkHandle::set_faults`]. A rule is
//! `name=value` pairs separated by commas:
//!
//! | field | meaning |
//! |---|---|
//! | `phase` | `connect` (greeting), `ehlo` (EHLO/HELO), `mail`, `rcpt`, `data` (the DATA command), `dot` (end of the message) |
//! | `action` | `reply` (answer `code text` instead; nothing accepted; 421 also closes), `drop` (dot only: commit the message as usual, then close without a reply), `delay` (wait `ms` before the normal reply; at dot the message is committed first), `disconnect` (close without a reply; nothing accepted) |
//! | `code` | reply: 400-599 |
//! | `text` | reply: the text after the code (default `<class>.0.0 sink fault at <phase>`); takes the rest of the string, commas included, so put it last |
//! | `ms` | delay: milliseconds |
//! | `times` | fire this many times, then the rule is spent (default: forever) |
//! | `key` | only when the message's key contains this (phase=dot only) |
//! | `rcpt` | only when a recipient contains this, ASCII case-insensitive (phase rcpt, data or dot; at rcpt, the recipient of that command) |
//!
//! Examples: `phase=dot,action=drop,times=1,key=abc`;
//! `phase=rcpt,action=reply,code=451,text=4.3.0 try later`; `phase=dot,action=delay,ms=5000`;
//! `phase=connect,action=reply,code=421`; `phase=data,action=disconnect,times=1`.
//! Rules are tried in order; the first unspent rule that matches fires, once per phase event.
//! The JSON form has the same fields: `[{"phase":"dot","action":"drop","times":1}]` (strings
//! in the CLI form are accepted in the array too).
//!
//! # HTTP API (`--api ADDR`)
//!
//! JSON in and out; every error is `{"error": "..."}` with its status (404 for an unknown id
//! or path, 400 for a bad body or an unknown query parameter). Times are RFC 3339 (UTC,
//! milliseconds), each with a `<name>_ms` twin in Unix milliseconds.
//!
//! - `GET /messages[?key=K][&rcpt=R][&text=T]`: accepted messages without their bytes (id,
//!   key, mail_from, rcpt_to, subject, size, blake3, received_at, tls, auth_user, raw: the
//!   path of the bytes). `key` is exact, `rcpt` a substring of a recipient (ASCII
//!   case-insensitive), `text` a substring of the decoded subject or body text
//!   (case-insensitive); given filters must all match.
//! - `GET /messages/{id}`: one message, with its bytes as `body` when they are UTF-8.
//! - `GET /messages/{id}/raw`: the exact bytes (`message/rfc822`).
//! - `GET /transactions[?key=K]`: every transaction that reached the dot, with its bytes,
//!   seq, outcome, message_id, reply (or `"none"`) and fault.
//! - `GET /webhooks[?key=K][&id=ID]`: every post of an event batch: seq, webhook_id, type,
//!   message_id, key, events, copy, attempt, webhook_timestamp (the header's Unix seconds),
//!   status or error, response, outcome, fault, sent_at.
//! - `GET /stats` (with `webhooks`: batches, attempts, delivered, failed, dropped, pending),
//!   `GET /counts` (the totals only).
//! - `GET /faults` (the rules with their fire counts), `POST /faults` (adds rules after the
//!   active ones), `PUT /faults` (replaces them), `DELETE /faults` (removes them).
//! - `POST /reset`: forgets messages, transactions, records, webhook posts and counts, removes
//!   the rules and empties the maildir.
//! - `POST /pause?mode=refuse|greet421`, `POST /resume`.
//! - `GET /ui`: the same for a browser (console.rs): messages (filtered like
//!   `/messages`), per-key counts, transactions with the fault that fired, the fault rules;
//!   `GET /ui/messages/{id}`: a message's raw source.
//!
//! # Webhooks (`--webhook URL --webhook-secret whsec_...`)
//!
//! For every message it accepts (committed at the final dot, also when a `drop` rule then
//! withholds the reply) the sink posts event batches, one JSON array per request and one event
//! per recipient ([`webhook::batches`] has the shape): `injection` at once, and `delivery` a
//! moment later (`--webhook-delivery-delay`), or `bounce` for the recipients that contain a
//! `--webhook-bounce` substring. Requests are signed as Standard Webhooks define
//! (`webhook-id` = `msg_<sink id>_<type>`, `webhook-timestamp`, `webhook-signature`). A post
//! without a 2xx (or without an answer) is retried with exponential backoff and jitter, the same
//! webhook-id and body, a fresh timestamp and signature, until `--webhook-attempts` or
//! `--webhook-deadline` runs out. Posting runs in tasks of its own: the SMTP side never waits
//! for it; at most 10 000 batches are pending, past that a message's batches are dropped and
//! counted. Pending posts are abandoned at shutdown.
//!
//! # Down modes
//!
//! [`Down::Refuse`] closes the listening socket, so connecting fails; [`Down::Greet421`] keeps
//! accepting and answers `421 4.3.2` at once. Either way open connections are closed when the
//! sink goes down (with a `421 4.3.2` in `Greet421` mode), as a real outage would.
//!
//! AUTH (when `require_auth` is set) is offered with or without TLS: this is a test tool, and
//! relay tests run it on loopback.

mod api;
mod config;
mod console;
pub(crate) mod faults;
mod key;
pub(crate) mod ledger;
mod life;
mod same_site;
mod search;
mod smtp;
mod state;
mod tls;
pub(crate) mod webhook;
mod webhook_sender;

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use url::Url;

pub use config::SinkConfig;
use config::FAULT_HELP;
pub use faults::{FaultAction, FaultError, FaultRule, FaultStage, RuleStatus, WebhookFault};
pub use life::Down;
pub use state::{DotDecision, ReceivedMessage, SinkStats, Transaction};
pub use webhook::{EventType, RetryPolicy, Secret};
pub use webhook_sender::{AttemptOutcome, WebhookAttempt, WebhookConfig, WebhookStats};

use life::Life;
use state::Shared;

/// Run the test upstream: an SMTP server with idempotency replay, fault injection and an HTTP API
#[derive(Clone, clap::Args)]
pub struct SinkArgs {
    /// SMTP listen address
    #[arg(long, env = "IDEMRELAY_SINK_LISTEN", default_value = "127.0.0.1:2526")]
    pub listen: SocketAddr,
    /// HTTP API listen address (GET /messages, /messages/{id}, /transactions, /webhooks,
    /// /stats; POST|PUT|DELETE /faults; POST /reset, /pause, /resume)
    #[arg(long, env = "IDEMRELAY_SINK_API")]
    pub api: Option<SocketAddr>,
    /// Write each accepted message to DIR/<id>.eml
    #[arg(long, env = "IDEMRELAY_SINK_MAILDIR", value_name = "DIR")]
    pub maildir: Option<PathBuf>,
    /// How long after acceptance the same key replays (e.g. 3h, 90s)
    #[arg(long, env = "IDEMRELAY_SINK_WINDOW", default_value = "3h", value_parser = parse_duration)]
    pub window: Duration,
    /// PEM certificate chain; enables STARTTLS
    #[arg(
        long,
        env = "IDEMRELAY_SINK_TLS_CERT",
        requires = "tls_key",
        value_name = "PEM"
    )]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key
    #[arg(
        long,
        env = "IDEMRELAY_SINK_TLS_KEY",
        requires = "tls_cert",
        value_name = "PEM"
    )]
    pub tls_key: Option<PathBuf>,
    /// TLS from the first byte (smtps) instead of STARTTLS
    #[arg(long, env = "IDEMRELAY_SINK_IMPLICIT_TLS", requires = "tls_cert")]
    pub implicit_tls: bool,
    #[arg(long = "fault", value_name = "RULE", value_parser = parse_fault, long_help = FAULT_HELP, help = "Fault rule, repeatable (e.g. 'phase=dot,action=drop,times=1'); see --help")]
    pub faults: Vec<FaultRule>,
    /// Require AUTH PLAIN/LOGIN with this user before MAIL (with --auth-password-file or
    /// IDEMRELAY_SINK_AUTH_PASSWORD)
    #[arg(long, env = "IDEMRELAY_SINK_AUTH_USER")]
    pub auth_user: Option<String>,
    /// Password for --auth-user. Prefer the environment variable or --auth-password-file: a
    /// flag's value is visible to every local user in the process list
    #[arg(
        long,
        env = "IDEMRELAY_SINK_AUTH_PASSWORD",
        requires = "auth_user",
        conflicts_with = "auth_password_file",
        hide_env_values = true
    )]
    pub auth_password: Option<String>,
    /// File holding the password for --auth-user (its first line)
    #[arg(
        long,
        env = "IDEMRELAY_SINK_AUTH_PASSWORD_FILE",
        requires = "auth_user",
        value_name = "FILE"
    )]
    pub auth_password_file: Option<PathBuf>,
    /// Largest message accepted (advertised as SIZE)
    #[arg(long, env = "IDEMRELAY_SINK_MAX_MESSAGE_SIZE", default_value_t = 25 * 1024 * 1024)]
    pub max_message_size: usize,
    /// Name in the greeting and EHLO reply
    #[arg(
        long,
        env = "IDEMRELAY_SINK_HOSTNAME",
        default_value = "sink.localhost"
    )]
    pub hostname: String,
    /// Post signed events (Standard Webhooks) for every accepted message to this http:// URL:
    /// an `injection` batch at acceptance, a `delivery` (or `bounce`) batch a moment later
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK", value_name = "URL")]
    pub webhook: Option<Url>,
    /// Signing secret for --webhook (whsec_<base64>); repeat it (or separate with commas) to
    /// sign with several, as during a rotation. Prefer the environment variable or
    /// --webhook-secret-file: a flag's value is visible in the process list
    #[arg(
        long = "webhook-secret",
        env = "IDEMRELAY_SINK_WEBHOOK_SECRET",
        value_name = "whsec_...",
        hide_env_values = true,
        value_delimiter = ',',
        requires = "webhook"
    )]
    pub webhook_secrets: Vec<String>,
    /// File holding signing secrets for --webhook, one per line
    #[arg(
        long = "webhook-secret-file",
        env = "IDEMRELAY_SINK_WEBHOOK_SECRET_FILE",
        value_name = "FILE",
        requires = "webhook"
    )]
    pub webhook_secret_file: Option<PathBuf>,
    /// How long after acceptance the delivery (or bounce) batch is due
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK_DELIVERY_DELAY", default_value = "200ms", value_parser = parse_duration)]
    pub webhook_delivery_delay: Duration,
    /// Recipients containing this (ASCII case-insensitive) get a `bounce` event instead of
    /// `delivery`; repeatable, or separated by commas
    #[arg(
        long = "webhook-bounce",
        env = "IDEMRELAY_SINK_WEBHOOK_BOUNCE",
        value_name = "SUBSTRING",
        value_delimiter = ','
    )]
    pub webhook_bounce: Vec<String>,
    /// Wait after a failed post (no 2xx, or no answer); doubles after each further failure,
    /// with jitter
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK_BACKOFF", default_value = "1s", value_parser = parse_duration)]
    pub webhook_backoff: Duration,
    /// Longest wait between two posts of a batch
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK_BACKOFF_MAX", default_value = "30s", value_parser = parse_duration)]
    pub webhook_backoff_max: Duration,
    /// Posts of one batch at most, the first included
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK_ATTEMPTS", default_value_t = 10)]
    pub webhook_attempts: u32,
    /// No post of a batch starts later than this after its first
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK_DEADLINE", default_value = "10m", value_parser = parse_duration)]
    pub webhook_deadline: Duration,
    /// Time allowed for one post, connecting included
    #[arg(long, env = "IDEMRELAY_SINK_WEBHOOK_TIMEOUT", default_value = "15s", value_parser = parse_duration)]
    pub webhook_timeout: Duration,
    /// Offer DSN (RFC 3461) in EHLO and accept RET, ENVID, NOTIFY and ORCPT
    #[arg(long, env = "IDEMRELAY_SINK_DSN")]
    pub dsn: bool,
    /// Offer REQUIRETLS (RFC 8689) in EHLO once the session is under TLS
    #[arg(long, env = "IDEMRELAY_SINK_REQUIRETLS", requires = "tls_cert")]
    pub requiretls: bool,
}

impl fmt::Debug for SinkArgs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkArgs")
            .field("listen", &self.listen)
            .field("api", &self.api)
            .field("maildir", &self.maildir)
            .field("window", &self.window)
            .field("tls_cert", &self.tls_cert)
            .field("tls_key", &self.tls_key)
            .field("implicit_tls", &self.implicit_tls)
            .field("faults", &self.faults)
            .field("auth_user", &self.auth_user)
            .field(
                "auth_password",
                &self.auth_password.as_ref().map(|_| "<redacted>"),
            )
            .field("auth_password_file", &self.auth_password_file)
            .field("webhook_secret_file", &self.webhook_secret_file)
            .field("max_message_size", &self.max_message_size)
            .field("hostname", &self.hostname)
            .field("webhook", &self.webhook)
            .field(
                "webhook_secrets",
                &vec!["<redacted>"; self.webhook_secrets.len()],
            )
            .field("webhook_delivery_delay", &self.webhook_delivery_delay)
            .field("webhook_bounce", &self.webhook_bounce)
            .field("webhook_backoff", &self.webhook_backoff)
            .field("webhook_backoff_max", &self.webhook_backoff_max)
            .field("webhook_attempts", &self.webhook_attempts)
            .field("webhook_deadline", &self.webhook_deadline)
            .field("webhook_timeout", &self.webhook_timeout)
            .field("dsn", &self.dsn)
            .field("requiretls", &self.requiretls)
            .finish()
    }
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| e.to_string())
}

/// The non-empty lines of a secrets file, trimmed (never printed: an error names the file).
fn secret_lines(path: &std::path::Path) -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("reading {}: {e}", path.display()))?;
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect())
}

fn parse_fault(s: &str) -> Result<FaultRule, String> {
    s.parse().map_err(|e: FaultError| e.to_string())
}

impl SinkArgs {
    pub fn into_config(self) -> anyhow::Result<SinkConfig> {
        let tls = match (self.tls_cert, self.tls_key) {
            (Some(cert), Some(key)) => Some((cert, key)),
            (None, None) => None,
            _ => anyhow::bail!("--tls-cert and --tls-key go together"),
        };
        let password = match (self.auth_password, &self.auth_password_file) {
            (Some(pass), _) => Some(pass),
            (None, Some(file)) => Some(
                secret_lines(file)?
                    .into_iter()
                    .next()
                    .ok_or_else(|| anyhow::anyhow!("{}: no password in it", file.display()))?,
            ),
            (None, None) => None,
        };
        let require_auth = match (self.auth_user, password) {
            (Some(user), Some(pass)) => Some((user, pass)),
            (None, None) => None,
            _ => anyhow::bail!(
                "--auth-user needs a password (--auth-password-file or IDEMRELAY_SINK_AUTH_PASSWORD)"
            ),
        };
        let mut secret_texts = self.webhook_secrets.clone();
        if let Some(file) = &self.webhook_secret_file {
            secret_texts.extend(secret_lines(file)?);
        }
        let webhook = match self.webhook {
            Some(url) => {
                let secrets = secret_texts
                    .iter()
                    .filter(|s| !s.trim().is_empty())
                    .map(|s| s.parse::<Secret>())
                    .collect::<Result<Vec<_>, _>>()?;
                if secrets.is_empty() {
                    anyhow::bail!("--webhook needs a signing secret (--webhook-secret-file or IDEMRELAY_SINK_WEBHOOK_SECRET)");
                }
                Some(WebhookConfig {
                    delivery_delay: self.webhook_delivery_delay,
                    bounce: self.webhook_bounce,
                    retry: RetryPolicy {
                        first: self.webhook_backoff,
                        max_delay: self.webhook_backoff_max,
                        max_attempts: self.webhook_attempts,
                        deadline: self.webhook_deadline,
                    },
                    timeout: self.webhook_timeout,
                    ..WebhookConfig::new(url, secrets)
                })
            }
            None => None,
        };
        let config = SinkConfig {
            listen: self.listen,
            api: self.api,
            maildir: self.maildir,
            window: self.window,
            tls,
            implicit_tls: self.implicit_tls,
            faults: self.faults,
            require_auth,
            max_message_size: self.max_message_size,
            hostname: self.hostname,
            webhook,
            dsn: self.dsn,
            requiretls: self.requiretls,
        };
        validate(&config)?;
        Ok(config)
    }
}

fn validate(config: &SinkConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        !config.implicit_tls || config.tls.is_some(),
        "implicit TLS needs a certificate and key"
    );
    anyhow::ensure!(
        config.max_message_size > 0,
        "max_message_size must be positive"
    );
    for rule in &config.faults {
        rule.validate()?;
    }
    if let Some(webhook) = &config.webhook {
        webhook.validate()?;
    }
    Ok(())
}

/// The sink API's limits: a test tool, but one that may be reachable from a network, held to the
/// relay's defaults. Its clients are scripts and a browser, a few connections at a time.
fn api_limits() -> idemrelay_serve::http_serve::HttpLimits {
    idemrelay_serve::http_serve::HttpLimits {
        header_timeout: Duration::from_secs(10),
        max_connections: idemrelay_serve::http_serve::connection_cap(128),
        shutdown_grace: Duration::from_secs(5),
    }
}

/// Starts the sink inside the current runtime.
pub struct Sink;

impl Sink {
    pub async fn start(config: SinkConfig) -> anyhow::Result<SinkHandle> {
        validate(&config)?;
        let tls = match &config.tls {
            Some((cert, key)) => Some(tls::acceptor(cert, key)?),
            None => None,
        };
        if let Some(dir) = &config.maildir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("creating maildir {}", dir.display()))?;
        }
        let listener = smtp::bind(config.listen)
            .with_context(|| format!("binding the sink SMTP listener on {}", config.listen))?;
        let smtp_addr = listener.local_addr()?;
        let api_listener = match config.api {
            Some(addr) => Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .with_context(|| format!("binding the sink API on {addr}"))?,
            ),
            None => None,
        };
        let api_addr = api_listener.as_ref().map(|l| l.local_addr()).transpose()?;

        let hooks = config
            .webhook
            .clone()
            .map(webhook_sender::Sender::new)
            .transpose()?;
        let (control_tx, control_rx) = mpsc::channel(8);
        let shared = Arc::new(Shared::new(config, tls, control_tx, hooks)?);
        let (alive_tx, alive_rx) = mpsc::channel(1);
        let mut tasks = vec![tokio::spawn(smtp::accept_loop(
            shared.clone(),
            listener,
            control_rx,
            alive_tx,
        ))];
        if let Some(listener) = api_listener {
            let mut life = shared.life.subscribe();
            // One listener, one router per view of the state.
            let router = axum::Router::new()
                .merge(api::router(shared.clone()))
                .merge(console::router(shared.clone()))
                .fallback(api::not_found)
                .layer(axum::middleware::from_fn(same_site::only));
            tasks.push(tokio::spawn(async move {
                let stop = async move { life::shutting_down(&mut life).await };
                idemrelay_serve::http_serve::serve(
                    "sink",
                    listener,
                    None,
                    router,
                    api_limits(),
                    stop,
                )
                .await;
            }));
        }
        tracing::info!(%smtp_addr, api = ?api_addr, "sink started");
        Ok(SinkHandle {
            inner: Arc::new(Inner {
                shared,
                smtp_addr,
                api_addr,
                tasks: Mutex::new(tasks),
                alive: tokio::sync::Mutex::new(Some(alive_rx)),
            }),
        })
    }
}

struct Inner {
    shared: Arc<Shared>,
    smtp_addr: SocketAddr,
    api_addr: Option<SocketAddr>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    alive: tokio::sync::Mutex<Option<mpsc::Receiver<()>>>,
}

/// A running sink. Clones share it; the sink runs until `shutdown` (or the runtime ends).
#[derive(Clone)]
pub struct SinkHandle {
    inner: Arc<Inner>,
}

impl fmt::Debug for SinkHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SinkHandle")
            .field("smtp_addr", &self.inner.smtp_addr)
            .field("api_addr", &self.inner.api_addr)
            .finish()
    }
}

impl SinkHandle {
    pub fn smtp_addr(&self) -> SocketAddr {
        self.inner.smtp_addr
    }

    pub fn api_addr(&self) -> Option<SocketAddr> {
        self.inner.api_addr
    }

    /// Accepted messages, in acceptance order; replays are not repeated here.
    pub fn messages(&self) -> Vec<ReceivedMessage> {
        self.inner.shared.messages()
    }

    /// Every transaction that reached the final dot, in order.
    pub fn transactions(&self) -> Vec<Transaction> {
        self.inner.shared.transactions()
    }

    /// Every post of a webhook event batch, in the order the posts ended.
    pub fn webhooks(&self) -> Vec<WebhookAttempt> {
        self.inner.shared.webhook_attempts()
    }

    pub fn stats(&self) -> SinkStats {
        self.inner.shared.stats()
    }

    /// The active rules and how often each has fired.
    pub fn faults(&self) -> Vec<RuleStatus> {
        self.inner.shared.faults()
    }

    /// Replaces the rules (fire counts start over). Refuses rules that could never fire.
    pub fn set_faults(&self, rules: Vec<FaultRule>) -> Result<(), FaultError> {
        self.inner.shared.set_faults(rules)
    }

    /// Simulates the upstream going down; resolves once the mode is in effect (for
    /// `Refuse`, the listening socket is closed).
    pub async fn pause(&self, down: Down) -> anyhow::Result<()> {
        self.inner.shared.pause(down).await
    }

    /// Back up on the same address.
    pub async fn resume(&self) -> anyhow::Result<()> {
        self.inner.shared.resume().await
    }

    /// Waits until `ready` holds for the stats, or fails after `timeout` with the last stats.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        ready: impl Fn(&SinkStats) -> bool,
    ) -> anyhow::Result<SinkStats> {
        let mut version = self.inner.shared.version.subscribe();
        let wait = async {
            loop {
                let _ = version.borrow_and_update();
                let stats = self.stats();
                if ready(&stats) {
                    return stats;
                }
                if version.changed().await.is_err() {
                    // The sender lives in `shared`, which we hold: unreachable in practice,
                    // but a plain poll keeps this honest if that ever changes.
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            }
        };
        match tokio::time::timeout(timeout, wait).await {
            Ok(stats) => Ok(stats),
            Err(_) => anyhow::bail!(
                "sink condition not met within {timeout:?}: {:?}",
                self.stats()
            ),
        }
    }

    /// Waits for at least `n` accepted messages and returns them.
    pub async fn wait_for_messages(
        &self,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<Vec<ReceivedMessage>> {
        self.wait_until(timeout, |s| s.messages >= n).await?;
        Ok(self.messages())
    }

    /// Stops listening, closes every connection (`421 4.3.2` to those that are open) and the
    /// API, and waits for them. Idempotent.
    pub async fn shutdown(&self) {
        self.inner.shared.life.send_replace(Life::ShuttingDown);
        let tasks =
            std::mem::take(&mut *self.inner.tasks.lock().unwrap_or_else(|e| e.into_inner()));
        for mut task in tasks {
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
        if let Some(mut alive) = self.inner.alive.lock().await.take() {
            // Every connection holds a sender; all gone means all closed.
            let _ = tokio::time::timeout(Duration::from_secs(5), alive.recv()).await;
        }
        tracing::info!(smtp_addr = %self.inner.smtp_addr, "sink stopped");
    }
}

/// `idemrelay sink`: runs until SIGTERM or SIGINT.
pub async fn run(config: SinkConfig) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let handle = Sink::start(config).await?;
    // One line on stdout that scripts can wait for.
    match handle.api_addr() {
        Some(api) => println!("sink smtp={} api={api}", handle.smtp_addr()),
        None => println!("sink smtp={}", handle.smtp_addr()),
    }
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    handle.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests;
