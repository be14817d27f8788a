//! Submits one prepared message to the relay over SMTP: lettre's `AsyncSmtpConnection`, each
//! phase under its own deadline (lettre bounds only the TCP connect), as the delivery side
//! does in `delivery::upstream`. The result says where it stopped and what the relay said;
//! [`exit_code`] turns that into sendmail's exit status.

use std::time::Duration;

use lettre::transport::smtp::authentication::{Credentials, Mechanism};
use lettre::transport::smtp::client::{AsyncSmtpConnection, Certificate, TlsParameters};
use lettre::transport::smtp::extension::ClientId;
use lettre::transport::smtp::response::Response;
use lettre::transport::smtp::Error as SmtpError;

pub(crate) use crate::delivery::outcome::Phase;

use super::args::TlsChoice;
use super::message::Prepared;
use super::sysexits::{EX_DATAERR, EX_TEMPFAIL, EX_UNAVAILABLE};

/// Where and how to reach the relay.
pub(crate) struct Server {
    pub host: String,
    pub port: u16,
    pub tls: Option<TlsChoice>,
    /// The name the relay's certificate must carry.
    pub tls_name: String,
    /// Extra trusted certificates (PEM), e.g. the relay's self-signed one.
    pub tls_ca: Option<Vec<u8>>,
    pub user: Option<String>,
    password: Option<String>,
    /// The deadline of each phase.
    pub timeout: Duration,
    /// Our EHLO name.
    pub hello: String,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("tls", &self.tls)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "********"))
            .finish()
    }
}

impl Server {
    pub(crate) fn new(host: String, port: u16, timeout: Duration, hello: String) -> Server {
        Server {
            tls_name: host.clone(),
            host,
            port,
            tls: None,
            tls_ca: None,
            user: None,
            password: None,
            timeout,
            hello,
        }
    }

    pub(crate) fn with_auth(mut self, user: String, password: String) -> Server {
        self.user = Some(user);
        self.password = Some(password);
        self
    }

    /// `host:port` as a person would type it (IPv6 in brackets).
    pub(crate) fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Why a submission stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Cause {
    /// The relay answered with this code; `text` is its reply line.
    Reply(u16),
    /// The relay lacks what the options ask for (STARTTLS, an AUTH mechanism).
    Unsupported,
    /// No usable answer: connection refused or lost, TLS failure, a phase timed out.
    Network,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Failure {
    pub phase: Phase,
    pub cause: Cause,
    /// The reply line, or what went wrong.
    pub text: String,
    /// Replies to the transactions that were accepted before this one failed (a message
    /// split because the relay took fewer recipients per transaction).
    pub accepted: Vec<String>,
}

/// sendmail's exit status (sysexits.h) for a failed submission:
/// - 4xx anywhere, and no answer at all (refused, lost, timed out; also after the final dot,
///   where the relay may have the message: a retry of the same input replays it) → 75
///   EX_TEMPFAIL, try again later;
/// - 5xx to the message itself (the reply to the final dot: size, NUL, line length, key
///   reuse) → 65 EX_DATAERR;
/// - 5xx anywhere else (greeting, EHLO, STARTTLS, AUTH, MAIL, RCPT, DATA), or a relay that
///   lacks STARTTLS or AUTH → 69 EX_UNAVAILABLE.
pub(crate) fn exit_code(failure: &Failure) -> u8 {
    match (&failure.cause, failure.phase) {
        (Cause::Reply(500..=599), Phase::Dot) => EX_DATAERR,
        (Cause::Reply(500..=599), _) | (Cause::Unsupported, _) => EX_UNAVAILABLE,
        _ => EX_TEMPFAIL,
    }
}

fn failure(phase: Phase, err: &SmtpError) -> Failure {
    let (cause, text) = match err.status() {
        Some(code) => {
            let code = u16::from(code);
            let text = std::error::Error::source(err)
                .map(|s| s.to_string())
                .unwrap_or_default();
            (
                Cause::Reply(code),
                format!("{code} {text}").trim_end().to_string(),
            )
        }
        None if err.is_timeout() => (Cause::Network, "timed out".to_string()),
        None => (Cause::Network, err.to_string()),
    };
    Failure {
        phase,
        cause,
        text,
        accepted: Vec::new(),
    }
}

fn local(phase: Phase, cause: Cause, text: impl Into<String>) -> Failure {
    Failure {
        phase,
        cause,
        text: text.into(),
        accepted: Vec::new(),
    }
}

async fn phase<T>(
    phase: Phase,
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, SmtpError>>,
) -> Result<T, Failure> {
    match tokio::time::timeout(limit, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(err)) => Err(failure(phase, &err)),
        Err(_) => Err(local(
            phase,
            Cause::Network,
            format!("no answer within {}", humantime::format_duration(limit)),
        )),
    }
}

fn reply_line(reply: &Response) -> (u16, String) {
    let code = u16::from(reply.code());
    let text = reply.message().collect::<Vec<_>>().join(" ");
    (code, format!("{code} {text}").trim_end().to_string())
}

/// Only `expected` counts as success: lettre takes any 2xx/3xx.
fn expect(phase: Phase, reply: &Response, expected: impl Fn(u16) -> bool) -> Result<(), Failure> {
    let (code, line) = reply_line(reply);
    if expected(code) {
        Ok(())
    } else {
        Err(local(phase, Cause::Reply(code), line))
    }
}

/// A command line as we write it: lettre's typed commands would validate addresses by their
/// own rules, and the relay's are the ones that count.
struct Line(String);

impl std::fmt::Display for Line {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}\r\n", self.0)
    }
}

fn tls_parameters(server: &Server) -> Result<TlsParameters, Failure> {
    let mut builder = TlsParameters::builder(server.tls_name.clone());
    if let Some(pem) = &server.tls_ca {
        let cert = Certificate::from_pem(pem).map_err(|e| {
            local(
                Phase::StartTls,
                Cause::Unsupported,
                format!("--tls-ca: {e}"),
            )
        })?;
        builder = builder.add_root_certificate(cert);
    }
    builder
        .build_rustls()
        .map_err(|e| local(Phase::StartTls, Cause::Unsupported, format!("TLS: {e}")))
}

async fn open(server: &Server) -> Result<AsyncSmtpConnection, Failure> {
    let t = server.timeout;
    let hello = ClientId::Domain(server.hello.clone());
    let addr = (server.host.as_str(), server.port);
    let mut conn = match server.tls {
        Some(TlsChoice::Implicit) => {
            let params = tls_parameters(server)?;
            // lettre does TCP, TLS, greeting and EHLO in one call here.
            phase(
                Phase::Connect,
                t * 3,
                AsyncSmtpConnection::connect_tokio1(addr, Some(t), &hello, Some(params), None),
            )
            .await?
        }
        _ => {
            let tcp = match tokio::time::timeout(t, tokio::net::TcpStream::connect(addr)).await {
                Ok(Ok(tcp)) => tcp,
                Ok(Err(e)) => return Err(local(Phase::Connect, Cause::Network, e.to_string())),
                Err(_) => {
                    return Err(local(
                        Phase::Connect,
                        Cause::Network,
                        "connect timed out".to_string(),
                    ))
                }
            };
            let _ = tcp.set_nodelay(true);
            phase(
                Phase::Greeting,
                t,
                AsyncSmtpConnection::connect_with_transport(Box::new(tcp), &hello),
            )
            .await?
        }
    };
    if server.tls == Some(TlsChoice::StartTls) {
        if !conn.can_starttls() {
            return Err(local(
                Phase::StartTls,
                Cause::Unsupported,
                "the relay does not offer STARTTLS here (a plain listener? drop --starttls)",
            ));
        }
        let params = tls_parameters(server)?;
        phase(Phase::StartTls, t, conn.starttls(params, &hello)).await?;
    }
    if let (Some(user), Some(password)) = (&server.user, &server.password) {
        let mechanisms = [Mechanism::Plain, Mechanism::Login];
        if conn.server_info().get_auth_mechanism(&mechanisms).is_none() {
            return Err(local(
                Phase::Auth,
                Cause::Unsupported,
                "the relay offers no AUTH PLAIN or LOGIN here (it needs TLS: --starttls or --smtps)",
            ));
        }
        let credentials = Credentials::new(user.clone(), password.clone());
        phase(Phase::Auth, t, conn.auth(&mechanisms, &credentials)).await?;
    }
    Ok(conn)
}

/// Sends the message and returns the relay's reply to each final dot (one, or more when the
/// relay took fewer recipients per transaction: it answers `452` past its limit, and the
/// rest follow in another transaction, as an MTA does).
pub(crate) async fn submit(server: &Server, message: &Prepared) -> Result<Vec<String>, Failure> {
    let t = server.timeout;
    let mut conn = open(server).await?;
    let mut accepted = Vec::new();
    let mut remaining: &[String] = &message.rcpt_to;
    while !remaining.is_empty() {
        match transaction(&mut conn, t, message, remaining).await {
            Ok((reply, taken)) => {
                accepted.push(reply);
                remaining = &remaining[taken..];
            }
            Err(mut failure) => {
                failure.accepted = accepted;
                return Err(failure);
            }
        }
    }
    let _ = tokio::time::timeout(t, conn.quit()).await;
    Ok(accepted)
}

/// One transaction for as many of `rcpt_to` as the relay takes; returns the reply to the
/// final dot and how many recipients it carried.
async fn transaction(
    conn: &mut AsyncSmtpConnection,
    t: Duration,
    message: &Prepared,
    rcpt_to: &[String],
) -> Result<(String, usize), Failure> {
    let mut mail = format!("MAIL FROM:<{}>", message.mail_from);
    if message.eight_bit {
        mail.push_str(" BODY=8BITMIME");
    }
    if message.smtputf8 {
        mail.push_str(" SMTPUTF8");
    }
    let r = phase(Phase::Mail, t, conn.command(Line(mail))).await?;
    expect(Phase::Mail, &r, |c| (200..300).contains(&c))?;
    let mut taken = 0;
    for rcpt in rcpt_to {
        match phase(
            Phase::Rcpt,
            t,
            conn.command(Line(format!("RCPT TO:<{rcpt}>"))),
        )
        .await
        {
            Ok(r) => expect(Phase::Rcpt, &r, |c| (200..300).contains(&c))?,
            // Too many recipients for one transaction: these go now, the rest next.
            Err(Failure {
                cause: Cause::Reply(452),
                ..
            }) if taken > 0 => break,
            Err(f) => return Err(f),
        }
        taken += 1;
    }
    let go = phase(Phase::Data, t, conn.command(Line("DATA".into()))).await?;
    expect(Phase::Data, &go, |c| c == 354)?;
    // lettre dot-stuffs and appends CRLF.CRLF: hand it the message without its last CRLF,
    // so the relay receives exactly the prepared bytes.
    let body = message
        .message
        .strip_suffix(b"\r\n")
        .unwrap_or(&message.message);
    let reply = phase(Phase::Dot, t, conn.message(body)).await?;
    let (code, line) = reply_line(&reply);
    if code != 250 {
        // Not a documented answer to the dot: the relay may or may not have it.
        return Err(local(Phase::Dot, Cause::Network, line));
    }
    Ok((line, taken))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(phase: Phase, cause: Cause) -> Failure {
        Failure {
            phase,
            cause,
            text: String::new(),
            accepted: Vec::new(),
        }
    }

    #[test]
    fn exit_codes() {
        use Cause::*;
        let rows = [
            (Phase::Connect, Network, EX_TEMPFAIL),
            (Phase::Greeting, Reply(421), EX_TEMPFAIL),
            (Phase::Greeting, Reply(554), EX_UNAVAILABLE),
            (Phase::StartTls, Network, EX_TEMPFAIL),
            (Phase::StartTls, Unsupported, EX_UNAVAILABLE),
            (Phase::Auth, Reply(535), EX_UNAVAILABLE),
            (Phase::Auth, Reply(454), EX_TEMPFAIL),
            (Phase::Auth, Unsupported, EX_UNAVAILABLE),
            (Phase::Mail, Reply(530), EX_UNAVAILABLE),
            (Phase::Mail, Reply(451), EX_TEMPFAIL),
            (Phase::Rcpt, Reply(550), EX_UNAVAILABLE),
            (Phase::Rcpt, Reply(452), EX_TEMPFAIL),
            (Phase::Data, Reply(554), EX_UNAVAILABLE),
            (Phase::Dot, Reply(552), EX_DATAERR),
            (Phase::Dot, Reply(554), EX_DATAERR),
            (Phase::Dot, Reply(550), EX_DATAERR),
            (Phase::Dot, Reply(451), EX_TEMPFAIL),
            // No answer after the dot: a retry of the same bytes replays if it was taken.
            (Phase::Dot, Network, EX_TEMPFAIL),
        ];
        for (phase, cause, code) in rows {
            let failure = f(phase, cause.clone());
            assert_eq!(exit_code(&failure), code, "{phase} {cause:?}");
        }
    }

    #[test]
    fn the_password_is_not_in_debug_output() {
        let s = Server::new("h".into(), 25, Duration::from_secs(1), "me".into())
            .with_auth("u".into(), "s3cret".into());
        assert!(!format!("{s:?}").contains("s3cret"));
        assert_eq!(s.address(), "h:25");
        let v6 = Server::new("::1".into(), 25, Duration::from_secs(1), "me".into());
        assert_eq!(v6.address(), "[::1]:25");
    }
}
