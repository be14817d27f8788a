//! The upstream SMTP client: lettre's `AsyncSmtpConnection`, driven phase by phase, each
//! phase under its own deadline (lettre bounds only the TCP connect). A connection that
//! failed or timed out anywhere is dropped, never reused.

use std::time::{Duration, Instant};

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::Error as SmtpError;
use serde::{Deserialize, Serialize};

use super::extensions::{
    mail_command, needs_extensions, rcpt_command, requiretls_refusal, requiretls_refused, Offered,
};
use super::outcome::{after_dot, classify, Failure, Outcome, Phase};
pub(crate) use super::reply_class::ReplyClass;

/// How the connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TlsMode {
    /// `smtp://` (default): STARTTLS, and refuse to go on without it.
    StartTls,
    /// `smtps://`: TLS from the first byte.
    Implicit,
    /// `smtp://...?tls=none`: plaintext, for tests and loopback smarthosts.
    None,
}

/// A parsed upstream URL.
#[derive(Clone)]
pub(crate) struct UpstreamTarget {
    pub host: String,
    pub port: u16,
    pub tls: TlsMode,
    pub user: Option<String>,
    password: Option<String>,
    /// SASL mechanisms in order of preference (`?auth=login` forces LOGIN).
    mechanisms: Vec<Mechanism>,
}

impl std::fmt::Debug for UpstreamTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTarget")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "********"))
            .finish()
    }
}

impl UpstreamTarget {
    /// Parses `smtp://user:pass@host:587`, `smtps://host:465`, `smtp://host:2525?tls=none`.
    /// `password_override` (from `IDEMRELAY_UPSTREAM_PASSWORD`) wins over the URL's.
    pub(crate) fn parse(url: &str, password_override: Option<String>) -> anyhow::Result<Self> {
        let parsed = url::Url::parse(url).map_err(|e| anyhow::anyhow!("upstream URL: {e}"))?;
        let (mut tls, default_port) = match parsed.scheme() {
            "smtp" => (TlsMode::StartTls, 587),
            "smtps" => (TlsMode::Implicit, 465),
            other => anyhow::bail!("upstream URL: scheme {other:?} is not smtp or smtps"),
        };
        let mut mechanisms = vec![Mechanism::Plain, Mechanism::Login];
        for (k, v) in parsed.query_pairs() {
            match (k.as_ref(), v.as_ref()) {
                ("tls", "none") if tls == TlsMode::StartTls => tls = TlsMode::None,
                ("tls", "required" | "starttls") if tls == TlsMode::StartTls => {}
                ("auth", "login") => mechanisms = vec![Mechanism::Login],
                ("auth", "plain") => mechanisms = vec![Mechanism::Plain],
                _ => anyhow::bail!("upstream URL: unsupported parameter {k}={v}"),
            }
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| anyhow::anyhow!("upstream URL: no host"))?
            .trim_matches(['[', ']'])
            .to_string();
        let decode = |s: &str| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
                .unwrap_or_default()
        };
        let user = (!parsed.username().is_empty()).then(|| decode(parsed.username()));
        let password = password_override.or_else(|| parsed.password().map(decode));
        Ok(UpstreamTarget {
            host,
            port: parsed.port().unwrap_or(default_port),
            tls,
            user,
            password,
            mechanisms,
        })
    }

    /// The upstream account a URL names, as the store records which scope owns its key
    /// space (`Store::claim_key_space`): `user@host:port`, the host in lower case, the port
    /// the relay would connect to; the password, TLS mode and options are not part of it.
    /// Instances sharing a store must name one upstream alike for it to be one key space.
    /// A relay without an upstream only queues; its records are forwarded by instances that
    /// have one, so it names a key space of its own.
    pub(crate) fn key_space_of(url: Option<&str>) -> String {
        let Some(url) = url else {
            return "(no upstream)".to_string();
        };
        match UpstreamTarget::parse(url, None) {
            Ok(t) => {
                let user = t.user.map(|u| format!("{u}@")).unwrap_or_default();
                format!("{user}{}:{}", t.host.to_ascii_lowercase(), t.port)
            }
            // Refused at start by delivery anyway; named without its secrets meanwhile.
            Err(_) => crate::secret::SecretUrl(url.to_string()).redacted(),
        }
    }

    fn credentials(&self) -> Option<Credentials> {
        Some(Credentials::new(
            self.user.clone()?,
            self.password.clone().unwrap_or_default(),
        ))
    }
}

/// One deadline per phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PhaseTimeouts {
    #[serde(with = "crate::human_duration")]
    pub connect: Duration,
    /// Greeting and EHLO (lettre reads both in one call).
    #[serde(with = "crate::human_duration")]
    pub greeting: Duration,
    #[serde(with = "crate::human_duration")]
    pub starttls: Duration,
    #[serde(with = "crate::human_duration")]
    pub auth: Duration,
    #[serde(with = "crate::human_duration")]
    pub mail: Duration,
    #[serde(with = "crate::human_duration")]
    pub rcpt: Duration,
    #[serde(with = "crate::human_duration")]
    pub data: Duration,
    /// Sending the body and waiting for the reply to the final dot.
    #[serde(with = "crate::human_duration")]
    pub dot: Duration,
}

impl Default for PhaseTimeouts {
    /// RFC 5321 §4.5.3.2's minimums, shortened where a relay can afford to give up sooner.
    fn default() -> Self {
        PhaseTimeouts {
            connect: Duration::from_secs(30),
            greeting: Duration::from_secs(120),
            starttls: Duration::from_secs(60),
            auth: Duration::from_secs(60),
            mail: Duration::from_secs(120),
            rcpt: Duration::from_secs(120),
            data: Duration::from_secs(120),
            dot: Duration::from_secs(600),
        }
    }
}

impl PhaseTimeouts {
    /// The longest one attempt can take; the delivery lease must outlast it.
    pub(crate) fn worst_case(&self) -> Duration {
        self.connect
            + self.greeting
            + self.starttls
            + self.greeting
            + self.auth
            + self.mail
            + self.rcpt * 4
            + self.data
            + self.dot
    }

    /// How long a worker's claim on a message lasts: the longest attempt and a margin for the
    /// writes around it. Lease renewals come every third of it.
    pub(crate) fn lease(&self) -> Duration {
        self.worst_case() + Duration::from_secs(10)
    }
}

/// What to send: the envelope and the stored bytes, exactly.
pub(crate) struct UpstreamEnvelope<'a> {
    pub mail_from: &'a str,
    pub rcpt_to: &'a [String],
    pub eight_bit: bool,
    pub smtputf8: bool,
    pub requests: &'a crate::mail::DeliveryRequests,
}

pub(crate) struct UpstreamClient {
    target: UpstreamTarget,
    hello: ClientId,
    timeouts: PhaseTimeouts,
    tls: Option<TlsParameters>,
    /// Messages per connection before it is closed and a new one opened.
    pub max_per_connection: usize,
    /// An idle connection older than this is closed instead of reused.
    pub idle_close: Duration,
    /// Below this idle time, a pooled connection whose socket shows nothing from the upstream
    /// is reused without a NOOP round trip (one of five per message, and a WAN round trip
    /// each). Past it, a NOOP also catches a peer that vanished without a word (a NAT that
    /// forgot the flow).
    pub noop_after_idle: Duration,
    conn: Option<Idle>,
    /// What the upstream of the last `send` offered, when that message needed to know.
    last_offered: Option<Offered>,
}

struct Idle {
    conn: Connection,
    sent: usize,
    idle_since: Instant,
}

/// An upstream connection and, where we opened the TCP socket ourselves, a second handle on
/// it: a peek shows a parting reply (an unsolicited 421) or a close, without a round trip.
struct Connection {
    smtp: AsyncSmtpConnection,
    socket: Option<std::net::TcpStream>,
    /// Under TLS (STARTTLS or smtps), the certificate verified.
    encrypted: bool,
    /// The extensions lettre does not track, once a message needed them (a later message on
    /// this connection reuses them: they hold until the session ends).
    offered: Option<Offered>,
}

impl Connection {
    /// Some(true) when the upstream has neither sent anything nor closed since its last reply;
    /// None when there is no socket to look at (implicit TLS: lettre opens that one).
    fn is_quiet(&self) -> Option<bool> {
        let socket = self.socket.as_ref()?;
        // The duplicate shares tokio's non-blocking mode: nothing to read is WouldBlock.
        match socket.peek(&mut [0u8; 1]) {
            Err(e) => Some(e.kind() == std::io::ErrorKind::WouldBlock),
            // Bytes nobody asked for, or end of stream.
            Ok(_) => Some(false),
        }
    }
}

/// A failure in a phase, with the phase in flight (the final dot included).
struct PhaseError {
    phase: Phase,
    failure: Failure,
}

fn failure_of(err: &SmtpError) -> Failure {
    match err.status() {
        Some(code) => Failure::Reply {
            code: code.to_string().parse().unwrap_or(0),
            text: std::error::Error::source(err)
                .map(|s| s.to_string())
                .unwrap_or_default(),
        },
        None if err.is_tls() => Failure::Tls(err.to_string()),
        None if err.is_timeout() => Failure::Timeout,
        None => Failure::ConnectionLost(err.to_string()),
    }
}

async fn phase<T>(
    phase: Phase,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, SmtpError>>,
) -> Result<T, PhaseError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(err)) => Err(PhaseError {
            phase,
            failure: failure_of(&err),
        }),
        Err(_) => Err(PhaseError {
            phase,
            failure: Failure::Timeout,
        }),
    }
}

/// A raw command line: lettre's typed commands re-validate addresses, and the relay must pass
/// the envelope through exactly as it was accepted.
struct Line(String);

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\r\n", self.0)
    }
}

impl UpstreamClient {
    pub(crate) fn new(
        target: UpstreamTarget,
        hello: &str,
        timeouts: PhaseTimeouts,
        ca_file: Option<&std::path::Path>,
    ) -> anyhow::Result<Self> {
        let tls = match target.tls {
            TlsMode::None => None,
            TlsMode::StartTls | TlsMode::Implicit => {
                let mut builder = TlsParameters::builder(target.host.clone());
                if let Some(path) = ca_file {
                    let pem = std::fs::read(path)
                        .map_err(|e| anyhow::anyhow!("reading CA file {}: {e}", path.display()))?;
                    builder = builder.add_root_certificate(Certificate::from_pem(&pem)?);
                }
                Some(builder.build_rustls()?)
            }
        };
        Ok(UpstreamClient {
            target,
            hello: ClientId::Domain(hello.to_string()),
            timeouts,
            tls,
            max_per_connection: 100,
            idle_close: Duration::from_secs(50),
            noop_after_idle: Duration::from_secs(2),
            conn: None,
            last_offered: None,
        })
    }

    /// Sends one message and classifies what happened. With `data_by`, the message is not
    /// sent if DATA would start, or its body would begin, after that instant (the upstream's
    /// idempotency window for an earlier UNKNOWN attempt is closing): the attempt ends
    /// transient, before the dot.
    pub(crate) async fn send(
        &mut self,
        envelope: &UpstreamEnvelope<'_>,
        message: &[u8],
        data_by: Option<Instant>,
    ) -> Outcome {
        self.last_offered = None;
        let reused = self.take_idle().await;
        let (mut conn, sent) = match reused {
            Some(idle) => (idle.conn, idle.sent),
            None => match self.open().await {
                Ok(conn) => (conn, 0),
                Err(e) => return classify(e.phase, e.failure),
            },
        };
        let offered = match self.extensions(&mut conn, envelope).await {
            Ok(offered) => offered,
            Err(e) => return classify(e.phase, e.failure),
        };
        self.last_offered = offered;
        if let Some(reply) = requiretls_refusal(envelope.requests, conn.encrypted, offered) {
            // Nothing of the message was sent: the session is as good as before.
            self.conn = Some(Idle {
                conn,
                sent,
                idle_since: Instant::now(),
            });
            return requiretls_refused(reply);
        }
        match self
            .transaction(&mut conn.smtp, envelope, offered, message, data_by)
            .await
        {
            Ok((code, text)) => {
                let outcome = after_dot(code, &text);
                if matches!(outcome, Outcome::Accepted { .. }) && sent + 1 < self.max_per_connection
                {
                    self.conn = Some(Idle {
                        conn,
                        sent: sent + 1,
                        idle_since: Instant::now(),
                    });
                } else {
                    let _ = tokio::time::timeout(Duration::from_secs(5), conn.smtp.quit()).await;
                }
                outcome
            }
            // The connection is in an unknown state: drop it without a QUIT exchange.
            Err(e) => classify(e.phase, e.failure),
        }
    }

    /// What the upstream of the last `send` offered, when its message needed to know (it had
    /// DSN parameters or REQUIRETLS): the worker reads whether the upstream took over the
    /// duty of a success notice.
    pub(crate) fn last_offered(&self) -> Option<Offered> {
        self.last_offered
    }

    /// The extensions a message needs to know about, learnt once per connection by an EHLO
    /// of our own after connect, STARTTLS and AUTH: lettre's `ServerInfo` drops the keywords
    /// it does not know (DSN, REQUIRETLS). Asked only for a message with DSN parameters or
    /// REQUIRETLS, so ordinary mail costs no extra round trip. A second EHLO resets the
    /// transaction state only (RFC 5321 §4.1.4), never TLS or authentication.
    async fn extensions(
        &self,
        conn: &mut Connection,
        envelope: &UpstreamEnvelope<'_>,
    ) -> Result<Option<Offered>, PhaseError> {
        if !needs_extensions(envelope.requests) {
            return Ok(None);
        }
        if conn.offered.is_none() {
            let hello = Line(format!("EHLO {}", self.hello));
            let reply = phase(
                Phase::Ehlo,
                self.timeouts.greeting,
                conn.smtp.command(hello),
            )
            .await?;
            expect(Phase::Ehlo, &reply, |c| c == 250)?;
            conn.offered = Some(Offered::from_ehlo(reply.message()));
        }
        Ok(conn.offered)
    }

    /// A probe of the account: connect, greeting/EHLO, STARTTLS, AUTH, then a MAIL FROM:<>
    /// (quota and suspension refusals often come only there) that is reset, never sent.
    pub(crate) async fn probe(&mut self) -> Result<(), Outcome> {
        self.conn = None;
        let mut conn = self
            .open()
            .await
            .map_err(|e| classify(e.phase, e.failure))?
            .smtp;
        let mail = phase(
            Phase::Mail,
            self.timeouts.mail,
            conn.command(Line("MAIL FROM:<>".into())),
        )
        .await
        .and_then(|r| expect(Phase::Mail, &r, |c| (200..300).contains(&c)));
        if let Err(e) = mail {
            return Err(classify(e.phase, e.failure));
        }
        let _ =
            tokio::time::timeout(Duration::from_secs(5), conn.command(Line("RSET".into()))).await;
        let _ = tokio::time::timeout(Duration::from_secs(5), conn.quit()).await;
        Ok(())
    }

    /// Closes an idle connection that is too old (call from an idle timer).
    pub(crate) async fn close_idle(&mut self) {
        if let Some(idle) = &self.conn {
            if idle.idle_since.elapsed() >= self.idle_close {
                if let Some(mut idle) = self.conn.take() {
                    let _ =
                        tokio::time::timeout(Duration::from_secs(5), idle.conn.smtp.quit()).await;
                }
            }
        }
    }

    async fn take_idle(&mut self) -> Option<Idle> {
        let mut idle = self.conn.take()?;
        let idle_for = idle.idle_since.elapsed();
        if idle_for >= self.idle_close || idle.conn.smtp.has_broken() {
            return None;
        }
        // The upstream may have closed it meanwhile (often with a parting 421): found out
        // before the message's MAIL would, so a dead connection costs no attempt.
        match idle.conn.is_quiet() {
            Some(false) => return None,
            Some(true) if idle_for < self.noop_after_idle => return Some(idle),
            _ => {}
        }
        match tokio::time::timeout(self.timeouts.mail, idle.conn.smtp.test_connected()).await {
            Ok(true) => Some(idle),
            _ => None,
        }
    }

    async fn open(&self) -> Result<Connection, PhaseError> {
        let t = &self.timeouts;
        let addr = (self.target.host.as_str(), self.target.port);
        let mut socket = None;
        let mut conn = match self.target.tls {
            TlsMode::Implicit => {
                // lettre does TCP, TLS, greeting and EHLO in one call here.
                phase(
                    Phase::Connect,
                    t.connect + t.greeting,
                    AsyncSmtpConnection::connect_tokio1(
                        addr,
                        Some(t.connect),
                        &self.hello,
                        self.tls.clone(),
                        None,
                    ),
                )
                .await?
            }
            TlsMode::StartTls | TlsMode::None => {
                let tcp =
                    match tokio::time::timeout(t.connect, tokio::net::TcpStream::connect(addr))
                        .await
                    {
                        Ok(Ok(tcp)) => tcp,
                        Ok(Err(e)) => {
                            return Err(PhaseError {
                                phase: Phase::Connect,
                                failure: Failure::ConnectionLost(e.to_string()),
                            })
                        }
                        Err(_) => {
                            return Err(PhaseError {
                                phase: Phase::Connect,
                                failure: Failure::Timeout,
                            })
                        }
                    };
                let _ = tcp.set_nodelay(true);
                socket = std::os::fd::AsFd::as_fd(&tcp)
                    .try_clone_to_owned()
                    .ok()
                    .map(std::net::TcpStream::from);
                phase(
                    Phase::Greeting,
                    t.greeting,
                    AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &self.hello),
                )
                .await?
            }
        };
        if self.target.tls == TlsMode::StartTls {
            if !conn.can_starttls() {
                return Err(PhaseError {
                    phase: Phase::StartTls,
                    failure: Failure::Tls("upstream does not offer STARTTLS".into()),
                });
            }
            let params = self.tls.clone().expect("TLS parameters for STARTTLS");
            phase(
                Phase::StartTls,
                t.starttls + t.greeting,
                conn.starttls(params, &self.hello),
            )
            .await?;
        }
        if let Some(credentials) = self.target.credentials() {
            phase(
                Phase::Auth,
                t.auth,
                conn.auth(&self.target.mechanisms, &credentials),
            )
            .await?;
        }
        Ok(Connection {
            smtp: conn,
            socket,
            encrypted: self.target.tls != TlsMode::None,
            offered: None,
        })
    }

    async fn transaction(
        &self,
        conn: &mut AsyncSmtpConnection,
        envelope: &UpstreamEnvelope<'_>,
        offered: Option<Offered>,
        message: &[u8],
        data_by: Option<Instant>,
    ) -> Result<(u16, String), PhaseError> {
        let t = &self.timeouts;
        let mail = mail_command(
            envelope.mail_from,
            envelope.eight_bit,
            envelope.smtputf8,
            envelope.requests,
            offered,
        );
        let r = phase(Phase::Mail, t.mail, conn.command(Line(mail))).await?;
        expect(Phase::Mail, &r, |c| (200..300).contains(&c))?;
        for rcpt in envelope.rcpt_to {
            let line = rcpt_command(rcpt, envelope.requests, offered);
            let r = phase(Phase::Rcpt, t.rcpt, conn.command(Line(line))).await?;
            expect(Phase::Rcpt, &r, |c| (200..300).contains(&c))?;
        }
        window_open(data_by)?;
        let go = phase(Phase::Data, t.data, conn.command(Line("DATA".into()))).await?;
        expect(Phase::Data, &go, |c| c == 354)?;
        // The 354 may take up to the DATA timeout: checked again before the first body byte.
        // Failing here drops the connection in the middle of DATA, which the upstream takes
        // as no message (there was no final dot).
        window_open(data_by)?;
        // lettre appends CRLF.CRLF itself: hand it the message without its own final CRLF
        // so that the upstream receives the stored bytes, not an extra empty line.
        let body = message.strip_suffix(b"\r\n").unwrap_or(message);
        // Writing the body and reading the final reply are one lettre call, so a failure
        // anywhere in it counts as after the dot: UNKNOWN, the safe side.
        let reply = phase(Phase::Dot, t.dot, conn.message(body)).await?;
        Ok(code_and_text(&reply))
    }
}

/// With `data_by`, no body byte may leave after it (an earlier attempt's outcome is unknown
/// and the upstream's idempotency window is closing).
fn window_open(data_by: Option<Instant>) -> Result<(), PhaseError> {
    if data_by.is_some_and(|by| Instant::now() >= by) {
        return Err(PhaseError {
            phase: Phase::Data,
            failure: Failure::Other(
                "not sent: the upstream idempotency window for an earlier unknown attempt is closing"
                    .into(),
            ),
        });
    }
    Ok(())
}

fn code_and_text(reply: &lettre::transport::smtp::response::Response) -> (u16, String) {
    let code = reply.code().to_string().parse().unwrap_or(0);
    (code, reply.message().collect::<Vec<_>>().join(" "))
}

/// lettre takes any 2xx/3xx as success; each phase has its own expected code.
fn expect(
    phase: Phase,
    reply: &lettre::transport::smtp::response::Response,
    ok: impl Fn(u16) -> bool,
) -> Result<(), PhaseError> {
    let (code, text) = code_and_text(reply);
    if ok(code) {
        Ok(())
    } else {
        Err(PhaseError {
            phase,
            failure: Failure::Reply { code, text },
        })
    }
}

#[cfg(test)]
#[path = "upstream_extension_tests.rs"]
mod extension_tests;

#[cfg(test)]
mod tests;
