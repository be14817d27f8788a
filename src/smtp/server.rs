//! Listeners and connections: the only SMTP code that does I/O. It moves bytes between the
//! socket (plain or TLS) and the session machine, runs intake and credential checks when the
//! session asks, and enforces connection caps, deadlines and shutdown.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::reply::Reply;
use super::session::{Output, Session, SessionConfig};
use super::tls::TlsCerts;
use crate::app::stopped;
use crate::auth::throttle::{AuthFailures, ThrottleLimits, Verdict};
use crate::auth::Users;
use crate::intake::{Intake, Origin};

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
pub struct ListenerPolicy {
    pub kind: ListenerKind,
    pub scope: String,
    pub allow_networks: Vec<IpNet>,
    /// Wait this long before the greeting, to catch clients that talk first.
    pub greet_delay: Duration,
}

impl ListenerPolicy {
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.allow_networks.iter().any(|net| net.contains(&ip))
    }
}

/// Deadlines that bound what one client can hold.
#[derive(Debug, Clone, Copy)]
pub struct SessionTimeouts {
    /// Silence allowed between reads.
    pub read: Duration,
    /// Whole-session limit.
    pub session: Duration,
    /// Bytes per second a message must arrive at, once `data_rate_grace` has passed.
    pub min_data_rate: u64,
    pub data_rate_grace: Duration,
}

/// The unit a client is counted by: its IPv4 address, or its IPv6 /64 (one host commonly has
/// a whole /64 to pick addresses from).
pub fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let bits = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(bits.into())
        }
        v4 => v4,
    }
}

/// Password checks are argon2 (tens of MB and ~100 ms each): at most a few run at once, and
/// failures are counted across reconnects per (client, user name) and per client, so that a
/// client that keeps failing is turned away for a while (see `auth::throttle`).
pub struct AuthThrottle {
    running: tokio::sync::Semaphore,
    failures: Mutex<AuthFailures>,
}

impl AuthThrottle {
    pub fn new(limits: ThrottleLimits) -> Self {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        AuthThrottle {
            running: tokio::sync::Semaphore::new(cpus),
            failures: Mutex::new(AuthFailures::new(limits)),
        }
    }

    pub fn check(&self, ip: IpAddr, user: &str) -> Verdict {
        self.failures
            .lock()
            .expect("auth failures")
            .check(client_key(ip), user, Instant::now())
    }

    pub fn record_failure(&self, ip: IpAddr, user: &str) {
        self.failures.lock().expect("auth failures").record_failure(
            client_key(ip),
            user,
            Instant::now(),
        );
    }

    pub fn record_success(&self, ip: IpAddr, user: &str) {
        self.failures.lock().expect("auth failures").record_success(
            client_key(ip),
            user,
            Instant::now(),
        );
    }
}

/// Global and per-address connection caps, shared by all listeners.
pub struct ConnectionLimits {
    max_total: usize,
    max_per_ip: usize,
    open: Mutex<(usize, HashMap<IpAddr, usize>)>,
}

pub struct ConnectionSlot<'a> {
    limits: &'a ConnectionLimits,
    ip: IpAddr,
}

impl ConnectionLimits {
    pub fn new(max_total: usize, max_per_ip: usize) -> Self {
        ConnectionLimits {
            max_total,
            max_per_ip,
            open: Mutex::new((0, HashMap::new())),
        }
    }

    /// Connections open now, on all listeners (for metrics).
    pub fn open_connections(&self) -> usize {
        self.open.lock().expect("connection counts").0
    }

    pub fn try_acquire(&self, ip: IpAddr) -> Option<ConnectionSlot<'_>> {
        let ip = client_key(ip);
        let mut open = self.open.lock().expect("connection counts");
        let per_ip = open.1.get(&ip).copied().unwrap_or(0);
        if open.0 >= self.max_total || per_ip >= self.max_per_ip {
            return None;
        }
        open.0 += 1;
        *open.1.entry(ip).or_insert(0) += 1;
        Some(ConnectionSlot { limits: self, ip })
    }
}

impl Drop for ConnectionSlot<'_> {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock().expect("connection counts");
        open.0 -= 1;
        if let Some(n) = open.1.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.1.remove(&self.ip);
            }
        }
    }
}

pub struct ServerContext {
    pub intake: Arc<Intake>,
    pub session: Arc<SessionConfig>,
    pub policy: ListenerPolicy,
    pub limits: Arc<ConnectionLimits>,
    pub timeouts: SessionTimeouts,
    pub tls: Option<Arc<TlsCerts>>,
    pub users: Option<Arc<Users>>,
    /// Delay before answering a failed AUTH (slows password guessing).
    pub auth_failure_delay: Duration,
    pub auth_throttle: Arc<AuthThrottle>,
}

/// Accepts until `shutdown` flips; each connection holds a clone of `alive` so the owner can
/// wait for all of them to end.
pub async fn serve(
    listener: TcpListener,
    ctx: Arc<ServerContext>,
    mut shutdown: watch::Receiver<bool>,
    alive: mpsc::Sender<()>,
) {
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let ctx = ctx.clone();
                    let shutdown = shutdown.clone();
                    let alive = alive.clone();
                    tokio::spawn(async move {
                        let _alive = alive;
                        if let Err(err) = connection(stream, peer, &ctx, shutdown).await {
                            tracing::debug!(%peer, error = %err, "connection ended with an I/O error");
                        }
                    });
                }
                Err(err) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = stopped(&mut shutdown) => break,
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

async fn connection(
    stream: TcpStream,
    peer: SocketAddr,
    ctx: &ServerContext,
    shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let Some(_slot) = ctx.limits.try_acquire(peer.ip()) else {
        return refuse(stream, Reply::too_many_connections()).await;
    };
    if *shutdown.borrow() {
        return refuse(stream, Reply::shutting_down()).await;
    }
    if !ctx.intake.store_healthy() {
        // Fail closed: nothing could be accepted, so say so before the client sends a message.
        return refuse(stream, Reply::store_unavailable_at_connect()).await;
    }
    // On implicit TLS the client rightly speaks first (its ClientHello).
    let implicit = ctx.policy.kind == ListenerKind::ImplicitTls;
    if !implicit && talks_first(&stream, ctx.policy.greet_delay).await {
        return refuse(stream, Reply::early_talker()).await;
    }
    let may_submit = ctx.policy.allows(peer.ip());
    let started = Instant::now();
    let conv = Conversation {
        ctx,
        origin: Origin {
            scope: ctx.policy.scope.clone(),
            peer: peer.ip().to_canonical(),
        },
        started,
    };
    match ctx.policy.kind {
        ListenerKind::ImplicitTls => {
            let Some(tls) = handshake(stream, ctx).await else {
                return Ok(());
            };
            let session = Session::new_tls(ctx.session.clone(), may_submit);
            conv.run(tls, session, true, shutdown).await.map(|_| ())
        }
        ListenerKind::Plain | ListenerKind::StartTls => {
            let session = Session::new(ctx.session.clone(), may_submit);
            match conv.run(stream, session, true, shutdown.clone()).await? {
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

/// True when the client sent something before our greeting (a spam-bot habit and a sign it
/// does not speak SMTP). Without a delay, only bytes already waiting are seen.
async fn talks_first(stream: &TcpStream, delay: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + delay;
    let mut probe = [0u8; 1];
    loop {
        // Readiness can be reported before any byte is there: only a read decides.
        match stream.try_read(&mut probe) {
            Ok(n) => return n > 0,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(_) => return false,
        }
        // Without a delay, only bytes already waiting count: a zero timeout would still wait
        // for the timer's next tick (a millisecond), before every greeting.
        if delay.is_zero() {
            return false;
        }
        if tokio::time::timeout_at(deadline, stream.readable())
            .await
            .is_err()
        {
            return false;
        }
    }
}

async fn handshake(
    stream: TcpStream,
    ctx: &ServerContext,
) -> Option<tokio_rustls::server::TlsStream<TcpStream>> {
    let acceptor = ctx.tls.as_ref()?.acceptor();
    // A client that never sends its ClientHello must not hold a slot for a whole read timeout.
    let limit = ctx.timeouts.read.min(Duration::from_secs(30));
    match tokio::time::timeout(limit, acceptor.accept(stream)).await {
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
    origin: Origin,
    started: Instant,
}

/// Tracks how fast a message arrives, to drop slowloris clients.
struct DataRate {
    since: Instant,
    bytes: u64,
}

impl Conversation<'_> {
    async fn run<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        mut stream: S,
        mut session: Session,
        greet: bool,
        mut shutdown: watch::Receiver<bool>,
    ) -> std::io::Result<Ended<S>> {
        let t = self.ctx.timeouts;
        if greet {
            write_all(&mut stream, &session.greeting().to_bytes(), t.read).await?;
        }
        let mut buf = vec![0u8; 64 * 1024];
        let mut told_shutdown = false;
        let mut rate: Option<DataRate> = None;
        loop {
            let left = t.session.saturating_sub(self.started.elapsed());
            if left.is_zero() {
                // Checked here too: with input always waiting, a read never times out.
                let outputs = session.close_now(Reply::session_too_long());
                self.drive(outputs, &mut session, &mut stream).await?;
                return Ok(Ended::Closed);
            }
            let wait = t.read.min(left);
            let outputs = tokio::select! {
                read = tokio::time::timeout(wait, stream.read(&mut buf)) => match read {
                    Err(_) if left <= t.read => session.close_now(Reply::session_too_long()),
                    Err(_) => session.timed_out(),
                    Ok(Ok(0)) => return Ok(Ended::Closed),
                    Ok(Ok(n)) => {
                        let mut outputs = session.feed(&buf[..n]);
                        if session.in_message() {
                            let r = rate.get_or_insert(DataRate { since: Instant::now(), bytes: 0 });
                            r.bytes += n as u64;
                            let elapsed = r.since.elapsed();
                            if elapsed > t.data_rate_grace
                                && (r.bytes as f64) < t.min_data_rate as f64 * elapsed.as_secs_f64()
                            {
                                outputs.extend(session.close_now(Reply::too_slow()));
                            }
                        } else {
                            rate = None;
                        }
                        outputs
                    }
                    Ok(Err(err)) => return Err(err),
                },
                _ = stopped(&mut shutdown), if !told_shutdown => {
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
            for output in outputs {
                match output {
                    Output::Reply(reply) => reply.write_to(&mut wire),
                    Output::Close => close = true,
                    Output::StartTls => starttls = true,
                    other => next = Some(other),
                }
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
                    let (reply, _) = self.ctx.intake.submit(&origin, &sub).await;
                    session.submission_done(reply)
                }
                Some(Output::Authenticate(presented)) => {
                    let throttle = &self.ctx.auth_throttle;
                    let peer = self.origin.peer;
                    // Only names of existing users reach the log: a failed name may be a
                    // password typed into the wrong field.
                    let name = presented.user.clone();
                    let known = self
                        .ctx
                        .users
                        .as_ref()
                        .is_some_and(|users| users.get(&name).is_some());
                    let shown = if known { name.as_str() } else { "<unknown>" };
                    match throttle.check(peer, &name) {
                        Verdict::Allowed => {}
                        verdict => {
                            let what = match verdict {
                                Verdict::UserLocked => "too many failed logins for this user from this client; refused",
                                _ => "too many failed logins from this client, across user names; refused",
                            };
                            tracing::warn!(target: "idemrelay::auth", %peer, user = shown, "{what}");
                            outputs = session.close_now(Reply::too_many_auth_failures());
                            continue;
                        }
                    }
                    let user = match self.ctx.users.clone() {
                        Some(users) => {
                            let _running = throttle.running.acquire().await.ok();
                            tokio::task::spawn_blocking(move || {
                                users.verify(&presented.user, &presented.password)
                            })
                            .await
                            .ok()
                            .flatten()
                        }
                        None => None,
                    };
                    match &user {
                        Some(user) => {
                            throttle.record_success(peer, &name);
                            tracing::info!(target: "idemrelay::auth", user = %user.name, %peer, "authenticated")
                        }
                        None => {
                            throttle.record_failure(peer, &name);
                            tracing::warn!(target: "idemrelay::auth", %peer, user = shown, "authentication failed");
                            tokio::time::sleep(self.ctx.auth_failure_delay).await;
                        }
                    }
                    session.auth_result(user)
                }
                Some(_) => unreachable!("replies, close and STARTTLS are handled above"),
            };
        }
    }
}

enum Step {
    Continue,
    Closed,
    StartTls,
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
