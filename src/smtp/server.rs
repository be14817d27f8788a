//! Listeners and connections: the only SMTP code that does I/O. It moves bytes between the
//! socket and the session machine, calls intake when the session asks, and enforces read
//! deadlines and shutdown.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};

use super::reply::Reply;
use super::session::{Output, Session, SessionConfig};
use crate::app::stopped;
use crate::intake::{Intake, Origin};

/// Who may submit without authentication, and under which scope.
#[derive(Debug, Clone)]
pub struct ListenerPolicy {
    pub scope: String,
    pub allow_networks: Vec<IpNet>,
}

impl ListenerPolicy {
    pub fn allows(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.allow_networks.iter().any(|net| net.contains(&ip))
    }
}

pub struct ServerContext {
    pub intake: Arc<Intake>,
    pub session: Arc<SessionConfig>,
    pub policy: ListenerPolicy,
    pub read_timeout: Duration,
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

async fn connection(
    mut stream: TcpStream,
    peer: SocketAddr,
    ctx: &ServerContext,
    mut shutdown: watch::Receiver<bool>,
) -> std::io::Result<()> {
    let _ = stream.set_nodelay(true);
    let origin = Origin {
        scope: ctx.policy.scope.clone(),
        peer: peer.ip().to_canonical(),
    };
    if !ctx.intake.store_healthy() {
        // Fail closed: nothing could be accepted, so say so before the client sends a message.
        stream
            .write_all(&Reply::store_unavailable_at_connect().to_bytes())
            .await?;
        let _ = stream.shutdown().await;
        return Ok(());
    }
    if *shutdown.borrow() {
        let _ = write_all(&mut stream, &Reply::shutting_down().to_bytes(), ctx).await;
        let _ = stream.shutdown().await;
        return Ok(());
    }
    let mut session = Session::new(ctx.session.clone(), ctx.policy.allows(peer.ip()));
    write_all(&mut stream, &session.greeting().to_bytes(), ctx).await?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut told_shutdown = false;
    loop {
        let outputs = tokio::select! {
            read = tokio::time::timeout(ctx.read_timeout, stream.read(&mut buf)) => match read {
                Err(_) => session.timed_out(),
                Ok(Ok(0)) => return Ok(()),
                Ok(Ok(n)) => session.feed(&buf[..n]),
                Ok(Err(err)) => return Err(err),
            },
            _ = stopped(&mut shutdown), if !told_shutdown => {
                told_shutdown = true;
                session.begin_shutdown()
            }
        };
        if !drive(outputs, &mut session, &mut stream, ctx, &origin).await? {
            return Ok(());
        }
    }
}

/// A client that stops reading its replies must not pin the connection forever.
async fn write_all(
    stream: &mut TcpStream,
    bytes: &[u8],
    ctx: &ServerContext,
) -> std::io::Result<()> {
    match tokio::time::timeout(ctx.read_timeout, stream.write_all(bytes)).await {
        Ok(result) => result,
        Err(_) => Err(std::io::ErrorKind::TimedOut.into()),
    }
}

/// Writes replies, runs intake when asked, and repeats until the session has nothing more to
/// say. Returns false once the session closed.
async fn drive(
    mut outputs: Vec<Output>,
    session: &mut Session,
    stream: &mut TcpStream,
    ctx: &ServerContext,
    origin: &Origin,
) -> std::io::Result<bool> {
    loop {
        let mut wire = Vec::new();
        let mut submission = None;
        let mut close = false;
        for output in outputs {
            match output {
                Output::Reply(reply) => reply.write_to(&mut wire),
                Output::Submit(sub) => submission = Some(sub),
                Output::Close => close = true,
            }
        }
        if !wire.is_empty() {
            write_all(stream, &wire, ctx).await?;
        }
        if close {
            let _ = stream.shutdown().await;
            return Ok(false);
        }
        let Some(sub) = submission else {
            return Ok(true);
        };
        let (reply, _) = ctx.intake.submit(origin, &sub).await;
        outputs = session.submission_done(reply);
    }
}
