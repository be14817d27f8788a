//! Listeners and connections: the only SMTP code that does I/O. It moves bytes between the
//! socket (plain or TLS) and the session machine, runs intake and credential checks when the
//! session asks, and enforces deadlines, shutdown and what `limits` decides (connection caps,
//! AUTH throttling, the minimum data rate).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::limits::DataRate;
use super::proxy_header::{self, Framing, Refusal};
use super::session::{Output, RefusalReason, Session, SessionConfig};
use super::tls::TlsCerts;
use crate::auth::{AuthGate, AuthVerdict, LiveUsers};
use crate::intake::{Intake, Origin};
use crate::metrics::Metrics;
use crate::reply::Reply;
use crate::shutdown::{Sessions, Stop};
use crate::store::StoreHealth;

// The listeners' shared limits, under the path the app and the admin listener name them by.
pub(crate) use super::limits::ConnectionLimits;

/// How a listener speaks TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenerKind {
    /// Plaintext, for allow-listed clients (loopback apps, test suites).
    Plain,
    /// Port 587 style: STARTTLS, required before MAIL and AUTH.
    StartTls,
    /// Port 465 style: TLS from the first byte.
    ImplicitTls,
}

/// Who may submit without authentication, and under which scope.
#[derive(Debug, Clone)]
pub(crate) struct ListenerPolicy {
    pub kind: ListenerKind,
    pub scope: String,
    pub allow_networks: Vec<IpNet>,
    /// Wait this long before the greeting, to catch clients that talk first.
    pub greet_delay: Duration,
    /// Load balancers whose connections start with a PROXY header naming the real client.
    pub proxy_from: Vec<IpNet>,
}

impl ListenerPolicy {
    pub(crate) fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.allow_networks.iter().any(|net| net.contains(&ip))
    }

    /// True when a connection from `ip` must start with a PROXY header.
    pub(crate) fn expects_proxy_header(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.proxy_from.iter().any(|net| net.contains(&ip))
    }
}

/// Deadlines that bound what one client can hold.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionTimeouts {
    /// Silence allowed between reads.
    pub read: Duration,
    /// Whole-session limit.
    pub session: Duration,
    /// Bytes per second a message must arrive at, once `data_rate_grace` has passed.
    pub min_data_rate: u64,
    pub data_rate_grace: Duration,
}

pub(crate) struct ServerContext {
    pub intake: Arc<Intake>,
    pub session: Arc<SessionConfig>,
    pub policy: ListenerPolicy,
    pub limits: Arc<ConnectionLimits>,
    pub timeouts: SessionTimeouts,
    pub tls: Option<Arc<TlsCerts>>,
    /// The users file in service (SIGHUP reloads it).
    pub users: Option<Arc<LiveUsers>>,
    /// AUTH attempts: lockouts, the password check, failure counts and delay.
    pub auth: Arc<AuthGate>,
    /// The store's health: new connections are refused while it is not writable.
    pub store_health: Arc<StoreHealth>,
    /// The relay's registry: refusals are counted in it.
    pub metrics: Arc<Metrics>,
    /// The before-queue mode, when a listener or the users file may use it
    /// (docs/guides/before-queue.md).
    pub before_queue: Option<Arc<crate::delivery::immediate::BeforeQueue>>,
    /// A before-queue listener: every client's end of DATA is answered with the upstream's
    /// verdict (elsewhere only users with `before_queue = true` get it).
    pub before_queue_listener: bool,
}

/// Accepts until `shutdown` is given; connections are spawned through `sessions` so the
/// owner can wait for all of them to end.
pub(crate) async fn serve(
    listener: TcpListener,
    ctx: Arc<ServerContext>,
    shutdown: Stop,
    sessions: Sessions,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let ctx = ctx.clone();
                    let shutdown = shutdown.clone();
                    // Boxed here: the connection's future is kilobytes (every state of the
                    // session), and spawn would move it by value several times.
                    sessions.spawn(Box::pin(async move {
                        connection(stream, peer, &ctx, &shutdown).await;
                    }));
                }
                Err(err) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutdown.stopped() => break,
        }
    }
}

/// Writes one reply and closes: for connections refused before the session starts.
async fn refuse(mut stream: TcpStream, reply: Reply) -> std::io::Result<()> {
    let _ = tokio::time::timeout(Duration::from_secs(5), stream.write_all(&reply.to_bytes())).await;
    let _ = stream.shutdown().await;
    linger(&mut stream).await;
    Ok(())
}

/// `refuse`, counted and logged: every connection turned away leaves a line and a count.
async fn refuse_connection(
    ctx: &ServerContext,
    stream: TcpStream,
    client: SocketAddr,
    reply: Reply,
    why: RefusalReason,
) -> std::io::Result<()> {
    ctx.metrics.connection_refused(why.as_str());
    tracing::info!(
        target: "idemrelay::smtp",
        client = %client.ip(),
        reason = %why.as_str(),
        reply = %reply.line(),
        "connection refused"
    );
    refuse(stream, reply).await
}

/// Reads and drops what the client still sends, briefly, after our last reply: closing with
/// unread input makes the kernel send a reset, and the client may then never see that reply.
async fn linger<S: AsyncRead + Unpin>(stream: &mut S) {
    let mut buf = [0u8; 4096];
    let mut drained = 0usize;
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while drained < 256 * 1024 {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => drained += n,
            }
        }
    })
    .await;
}

/// How long a listed proxy may take to send its header: the spec asks for at least 3 s (a
/// TCP retransmit); a proxy sends it at once, so only a broken one waits this long.
const PROXY_HEADER_WAIT: Duration = Duration::from_secs(10);

async fn connection(stream: TcpStream, peer: SocketAddr, ctx: &ServerContext, shutdown: &Stop) {
    if let Err((client, err)) = admit(stream, peer, ctx, shutdown).await {
        tracing::debug!(%client, %peer, error = %err, "connection ended with an I/O error");
    }
}

/// The caps, the PROXY header when `peer` is a listed proxy, then the conversation with the
/// client: the header's source, or `peer` itself. An I/O error comes back with that client.
async fn admit(
    mut stream: TcpStream,
    peer: SocketAddr,
    ctx: &ServerContext,
    shutdown: &Stop,
) -> Result<(), (SocketAddr, std::io::Error)> {
    let _ = stream.set_nodelay(true);
    let proxied = ctx.policy.expects_proxy_header(peer.ip());
    // A proxy's connection counts against its client once the header names it.
    let slot = if proxied {
        ctx.limits.try_acquire_unattributed()
    } else {
        ctx.limits.try_acquire(peer.ip())
    };
    let Some(mut slot) = slot else {
        return refuse_connection(
            ctx,
            stream,
            peer,
            Reply::too_many_connections(),
            RefusalReason::Caps,
        )
        .await
        .map_err(|e| (peer, e));
    };
    if shutdown.is_stopping() {
        return refuse_connection(
            ctx,
            stream,
            peer,
            Reply::shutting_down(),
            RefusalReason::Shutdown,
        )
        .await
        .map_err(|e| (peer, e));
    }
    if !ctx.store_health.is_writable() {
        // Fail closed: nothing could be accepted, so say so before the client sends a message.
        // The client came to submit and was told the store is unavailable: that is an
        // unavailable submission, and without counting it the counter stayed 0 through a
        // whole outage (every client is turned away here once the probe has seen it).
        ctx.metrics
            .submission(crate::intake::SubmissionResult::Unavailable.label());
        return refuse_connection(
            ctx,
            stream,
            peer,
            Reply::store_unavailable_at_connect(),
            RefusalReason::Store,
        )
        .await
        .map_err(|e| (peer, e));
    }
    let client = if proxied {
        let wait = ctx.timeouts.read.min(PROXY_HEADER_WAIT);
        let read = tokio::time::timeout(wait, read_proxy_header(&mut stream)).await;
        let named = match read.unwrap_or(Err(HeaderFailure::TimedOut(wait))) {
            Ok(named) => named,
            Err(why) => {
                // The spec has receivers just drop the connection; the log says why.
                ctx.metrics
                    .connection_refused(RefusalReason::Policy.as_str());
                tracing::warn!(target: "idemrelay::proxy", %peer, reason = %why, "connection closed: PROXY protocol");
                return Ok(());
            }
        };
        // UNKNOWN and LOCAL: the connection is the proxy's own (a health check).
        let client = named.unwrap_or(peer);
        tracing::debug!(target: "idemrelay::proxy", %client, proxy = %peer, "PROXY header read");
        if !slot.attribute(client.ip()) {
            return refuse_connection(
                ctx,
                stream,
                client,
                Reply::too_many_connections(),
                RefusalReason::Caps,
            )
            .await
            .map_err(|e| (client, e));
        }
        client
    } else {
        peer
    };
    converse(stream, peer, client, ctx, shutdown)
        .await
        .map_err(|e| (client, e))
}

async fn converse(
    stream: TcpStream,
    peer: SocketAddr,
    client: SocketAddr,
    ctx: &ServerContext,
    shutdown: &Stop,
) -> std::io::Result<()> {
    // On implicit TLS the client rightly speaks first (its ClientHello).
    let implicit = ctx.policy.kind == ListenerKind::ImplicitTls;
    if !implicit {
        if let Some(early) = talks_first(&stream, ctx.policy.greet_delay).await {
            if proxy_header::looks_like_header(&early) {
                unexpected_proxy_header(ctx, peer, client.ip());
                return Ok(());
            }
            return refuse_connection(
                ctx,
                stream,
                client,
                Reply::early_talker(),
                RefusalReason::Policy,
            )
            .await;
        }
    }
    let may_submit = ctx.policy.allows(client.ip());
    let started = Instant::now();
    let conv = Conversation {
        ctx,
        origin: Origin {
            scope: ctx.policy.scope.clone(),
            peer: client.ip().to_canonical(),
        },
        peer,
        started,
    };
    match ctx.policy.kind {
        ListenerKind::ImplicitTls => {
            match opens_with_proxy_header(&stream, ctx).await {
                Some(false) => {}
                Some(true) => {
                    unexpected_proxy_header(ctx, peer, client.ip());
                    return Ok(());
                }
                // Silent for the whole handshake allowance, or gone.
                None => return Ok(()),
            }
            let Some(tls) = handshake(stream, ctx).await else {
                return Ok(());
            };
            let session = Session::new_tls(ctx.session.clone(), may_submit);
            conv.run(tls, session, true, shutdown).await.map(|_| ())
        }
        ListenerKind::Plain | ListenerKind::StartTls => {
            let session = Session::new(ctx.session.clone(), may_submit);
            match conv.run(stream, session, true, shutdown).await? {
                Ended::Closed => Ok(()),
                Ended::StartTls(stream, mut session) => {
                    let session = {
                        session.tls_started();
                        *session
                    };
                    let Some(tls) = handshake(stream, ctx).await else {
                        return Ok(());
                    };
                    conv.run(tls, session, false, shutdown).await.map(|_| ())
                }
            }
        }
    }
}

/// Why a listed proxy's connection was closed before its client got a greeting.
#[derive(Debug)]
enum HeaderFailure {
    Refused(Refusal),
    TimedOut(Duration),
    /// The proxy closed the connection inside the header.
    Closed,
    Io(std::io::Error),
}

impl std::fmt::Display for HeaderFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HeaderFailure::Refused(why) => why.fmt(f),
            HeaderFailure::TimedOut(wait) => {
                write!(
                    f,
                    "no complete PROXY header within {}",
                    humantime::format_duration(*wait)
                )
            }
            HeaderFailure::Closed => f.write_str("closed before the end of its PROXY header"),
            HeaderFailure::Io(err) => write!(f, "reading the PROXY header: {err}"),
        }
    }
}

/// A PROXY header where none was expected: from an address outside `proxy_protocol_from`
/// (it could name any client it likes, so it is never believed), or a second one.
fn unexpected_proxy_header(ctx: &ServerContext, peer: SocketAddr, client: IpAddr) {
    let reason = if ctx.policy.expects_proxy_header(peer.ip()) {
        format!("a second PROXY header, after the one naming {client}")
    } else {
        "PROXY header from an address not in this listener's proxy_protocol_from".to_string()
    };
    ctx.metrics
        .connection_refused(RefusalReason::Policy.as_str());
    tracing::warn!(target: "idemrelay::proxy", %peer, %reason, "connection closed: PROXY protocol");
}

/// Consumes exactly the PROXY header at the start of `stream`, and returns the client it
/// names (`None`: the connection's own address stands). Bytes are peeked first and only the
/// header's are read, so what follows (SMTP, or a TLS ClientHello) stays in the socket.
async fn read_proxy_header(stream: &mut TcpStream) -> Result<Option<SocketAddr>, HeaderFailure> {
    let mut header = Vec::with_capacity(proxy_header::V1_MAX);
    let mut window = vec![0u8; proxy_header::MAX_HEADER];
    loop {
        // `frame` says Incomplete only below MAX_HEADER, so there is always room.
        let room = proxy_header::MAX_HEADER - header.len();
        let seen = stream
            .peek(&mut window[..room])
            .await
            .map_err(HeaderFailure::Io)?;
        if seen == 0 {
            return Err(HeaderFailure::Closed);
        }
        let had = header.len();
        header.extend_from_slice(&window[..seen]);
        match proxy_header::frame(&header) {
            Framing::Complete(len) => {
                stream
                    .read_exact(&mut window[..len - had])
                    .await
                    .map_err(HeaderFailure::Io)?;
                header.truncate(len);
                return proxy_header::parse(&header).map_err(HeaderFailure::Refused);
            }
            // All of it is header: take it, so the next peek waits for new bytes.
            Framing::Incomplete => {
                stream
                    .read_exact(&mut window[..seen])
                    .await
                    .map_err(HeaderFailure::Io)?;
            }
            Framing::Refused(why) => return Err(HeaderFailure::Refused(why)),
        }
    }
}

/// On implicit TLS, whether the first bytes (normally a ClientHello, which the handshake then
/// reads) are a PROXY header instead; `None` when none came within the handshake allowance.
/// Peeked, so nothing is taken from the handshake.
async fn opens_with_proxy_header(stream: &TcpStream, ctx: &ServerContext) -> Option<bool> {
    let mut first = [0u8; 16];
    match tokio::time::timeout(handshake_limit(ctx), stream.peek(&mut first)).await {
        Ok(Ok(n)) if n > 0 => Some(proxy_header::looks_like_header(&first[..n])),
        _ => None,
    }
}

/// A client that never sends its ClientHello must not hold a slot for a whole read timeout.
fn handshake_limit(ctx: &ServerContext) -> Duration {
    ctx.timeouts.read.min(Duration::from_secs(30))
}

/// What the client sent before our greeting, if anything (a spam-bot habit and a sign it does
/// not speak SMTP; or a PROXY header it should not send). Without a delay, only bytes already
/// waiting are seen.
async fn talks_first(stream: &TcpStream, delay: Duration) -> Option<Vec<u8>> {
    let deadline = tokio::time::Instant::now() + delay;
    let mut probe = [0u8; 16];
    loop {
        // Readiness can be reported before any byte is there: only a read decides.
        match stream.try_read(&mut probe) {
            Ok(0) => return None,
            Ok(n) => return Some(probe[..n].to_vec()),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return None,
        }
        // Without a delay, only bytes already waiting count: a zero timeout would still wait
        // for the timer's next tick (a millisecond), before every greeting.
        if delay.is_zero() {
            return None;
        }
        if tokio::time::timeout_at(deadline, stream.readable())
            .await
            .is_err()
        {
            return None;
        }
    }
}

async fn handshake(
    stream: TcpStream,
    ctx: &ServerContext,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let acceptor = ctx.tls.as_ref()?.acceptor();
    match tokio::time::timeout(handshake_limit(ctx), acceptor.accept(stream)).await {
        Ok(Ok(tls)) => Some(tls),
        Ok(Err(err)) => {
            tracing::debug!(error = %err, "TLS handshake failed");
            None
        }
        Err(_) => None,
    }
}

enum Ended<S> {
    Closed,
    /// The client asked for STARTTLS: the plain stream and the session, to be upgraded.
    StartTls(S, Box<Session>),
}

struct Conversation<'a> {
    ctx: &'a ServerContext,
    /// `peer` is the client here: the real one when a proxy named it.
    origin: Origin,
    /// The connection's own address (the proxy's, when there is one).
    peer: SocketAddr,
    started: Instant,
}

impl Conversation<'_> {
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut stream: S,
        mut session: Session,
        greet: bool,
        shutdown: &Stop,
    ) -> std::io::Result<Ended<S>> {
        let t = self.ctx.timeouts;
        if greet {
            write_all(&mut stream, &session.greeting().to_bytes(), t.read).await?;
        }
        // Read into spare capacity: zeroing 64 KiB for every connection cost more than
        // the parsing of a whole small message.
        let mut buf = Vec::with_capacity(64 * 1024);
        // The client's first bytes are checked for a PROXY header it was not to send.
        let mut first_read = greet;
        let mut told_shutdown = false;
        let mut rate: Option<DataRate> = None;
        loop {
            let (wait, session_ends) = match next_read(t.session, t.read, self.started.elapsed()) {
                NextRead::SessionOver => {
                    // Checked here too: with input always waiting, a read never times out.
                    let outputs = session.close_now(Reply::session_too_long());
                    self.drive(outputs, &mut session, &mut stream).await?;
                    return Ok(Ended::Closed);
                }
                NextRead::Wait {
                    limit,
                    session_ends,
                } => (limit, session_ends),
            };
            let outputs = tokio::select! {
                read = tokio::time::timeout(wait, { buf.clear(); stream.read_buf(&mut buf) }) => match read {
                    Err(_) if session_ends => session.close_now(Reply::session_too_long()),
                    Err(_) => session.timed_out(),
                    Ok(Ok(0)) => return Ok(Ended::Closed),
                    Ok(Ok(n)) if std::mem::take(&mut first_read)
                        && proxy_header::looks_like_header(&buf[..n]) =>
                    {
                        unexpected_proxy_header(self.ctx, self.peer, self.origin.peer);
                        return Ok(Ended::Closed);
                    }
                    Ok(Ok(n)) => {
                        let mut outputs = session.feed(&buf[..n]);
                        if session.in_message() {
                            let now = Instant::now();
                            let r = rate.get_or_insert_with(|| DataRate::start(now));
                            if r.record(n, now, t.min_data_rate, t.data_rate_grace) {
                                outputs.extend(session.close_now(Reply::too_slow()));
                            }
                        } else {
                            rate = None;
                        }
                        outputs
                    }
                    Ok(Err(err)) => return Err(err),
                },
                _ = shutdown.stopped(), if !told_shutdown => {
                    told_shutdown = true;
                    session.begin_shutdown()
                }
            };
            match self.drive(outputs, &mut session, &mut stream).await? {
                Step::Continue => {}
                Step::Closed => return Ok(Ended::Closed),
                Step::StartTls => return Ok(Ended::StartTls(stream, Box::new(session))),
            }
        }
    }

    /// Writes replies, runs intake and credential checks when asked, and repeats until the
    /// session has nothing more to say.
    async fn drive<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut outputs: Vec<Output>,
        session: &mut Session,
        stream: &mut S,
    ) -> std::io::Result<Step> {
        let read_timeout = self.ctx.timeouts.read;
        loop {
            let mut wire = Vec::new();
            let mut next = None;
            let mut close = false;
            let mut starttls = false;
            // Refusals among the replies, each with whether it is the last reply (the one a
            // closing session ends with).
            let mut refused: Vec<(RefusalReason, String, bool)> = Vec::new();
            for output in outputs {
                match output {
                    Output::Reply(reply) => {
                        if let Some(last) = refused.last_mut() {
                            last.2 = false;
                        }
                        // Classifying builds every refusal reply to compare: a positive
                        // reply (most of them) is none, so it skips that work.
                        let why = (!reply.is_positive()).then(|| RefusalReason::of(&reply));
                        if let Some(why) = why.flatten() {
                            refused.push((why, reply.line(), true));
                        }
                        reply.write_to(&mut wire);
                    }
                    Output::Close => close = true,
                    Output::StartTls => starttls = true,
                    other => next = Some(other),
                }
            }
            for (why, line, last) in refused {
                self.refused(why, &line, session, close && last);
            }
            if !wire.is_empty() {
                write_all(stream, &wire, read_timeout).await?;
            }
            if close {
                let _ = stream.shutdown().await;
                linger(stream).await;
                return Ok(Step::Closed);
            }
            if starttls {
                return Ok(Step::StartTls);
            }
            outputs = match next {
                None => return Ok(Step::Continue),
                Some(Output::Submit(sub)) => {
                    let origin = match &sub.auth_scope {
                        Some(scope) => Origin {
                            scope: scope.clone(),
                            peer: self.origin.peer,
                        },
                        None => self.origin.clone(),
                    };
                    let ctx = self.ctx;
                    // The client waits for the upstream's verdict on a before-queue listener,
                    // or as an AUTH user with `before_queue = true` in the users file in service.
                    let reply = match &ctx.before_queue {
                        Some(bq)
                            if ctx.before_queue_listener
                                || sub
                                    .auth_user
                                    .as_deref()
                                    .zip(ctx.users.as_deref())
                                    .is_some_and(|(name, users)| users.waits_for_verdict(name)) =>
                        {
                            ctx.intake.submit_and_wait(bq, &origin, &sub).await
                        }
                        _ => ctx.intake.submit(&origin, &sub).await.0,
                    };
                    session.submission_done(reply)
                }
                Some(Output::Authenticate(presented)) => {
                    match self.ctx.auth.attempt(self.origin.peer, presented).await {
                        AuthVerdict::LockedOut => {
                            outputs = session.close_now(Reply::too_many_auth_failures());
                            continue;
                        }
                        AuthVerdict::Authenticated(user) => session.auth_result(Some(user)),
                        AuthVerdict::Failed => session.auth_result(None),
                    }
                }
                Some(_) => unreachable!("replies, close and STARTTLS are handled above"),
            };
        }
    }
}

impl Conversation<'_> {
    /// One line and one count per refusal: a session refused or cut always leaves a trace
    /// (a bare LF's 521 used to leave none, even at debug).
    fn refused(&self, why: RefusalReason, reply: &str, session: &Session, closing: bool) {
        self.ctx.metrics.command_refused(why.as_str());
        let helo = session.helo().unwrap_or("-");
        let user = session.authenticated().map_or("-", |u| u.name.as_str());
        if closing {
            tracing::warn!(
                target: "idemrelay::smtp",
                client = %self.origin.peer,
                helo = %helo,
                user = %user,
                reason = %why.as_str(),
                reply = %reply,
                "session closed by the relay"
            );
        } else {
            tracing::info!(
                target: "idemrelay::smtp",
                client = %self.origin.peer,
                helo = %helo,
                user = %user,
                reason = %why.as_str(),
                reply = %reply,
                "command refused"
            );
        }
    }
}

enum Step {
    Continue,
    Closed,
    StartTls,
}

/// How long the next read may wait, from the session's limit, the read timeout and the time
/// the session has had so far.
#[derive(Debug, PartialEq, Eq)]
enum NextRead {
    /// The session's time is up.
    SessionOver,
    /// A read that waits `limit` in vain ends the session when `session_ends` (the session's
    /// limit came first), else it is an ordinary read timeout.
    Wait { limit: Duration, session_ends: bool },
}

fn next_read(session: Duration, read: Duration, elapsed: Duration) -> NextRead {
    let left = session.saturating_sub(elapsed);
    if left.is_zero() {
        return NextRead::SessionOver;
    }
    NextRead::Wait {
        limit: read.min(left),
        session_ends: left <= read,
    }
}

/// A client that stops reading its replies must not pin the connection forever.
async fn write_all<S: AsyncWrite + Unpin>(
    stream: &mut S,
    bytes: &[u8],
    limit: Duration,
) -> std::io::Result<()> {
    match tokio::time::timeout(limit, async {
        stream.write_all(bytes).await?;
        stream.flush().await
    })
    .await
    {
        Ok(result) => result,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

#[cfg(test)]
mod tests;
