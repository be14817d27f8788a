//! Serving an axum `Router` on a listener that may face the internet: the admin API and console,
//! the webhook listener (plain or TLS) and the sink's API all go through `serve`.
//!
//! Each listener is assumed to face clients that open connections and never finish them. So:
//! - a request head (request line and headers) is at most `MAX_HEAD_BYTES` (431/400 and close
//!   beyond it: hyper's read buffer limit), and must be complete within `header_timeout` of the
//!   connection opening or of the previous response: hyper's header read timer starts as soon
//!   as it waits for a head, so the same bound closes idle keep-alive connections;
//! - at most `max_connections` connections are open at once; one beyond that is answered 503
//!   and closed at once, so it holds a descriptor for no longer than the accept;
//! - at shutdown the listener closes, connections with no request being answered (idle, or a
//!   head still arriving) are closed at once, and requests in flight get `shutdown_grace`.
//!
//! The caps also keep the process's descriptors for SMTP and the store: see `connection_cap`.
//! Every answer carries `Cache-Control: no-store` and `X-Content-Type-Options: nosniff` unless
//! its handler set its own: the answers are the ledger's and the queue's state, for no cache to
//! keep, and a JSON or text answer must not be run by a browser as something else.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::{Body, Bytes, HttpBody};
use axum::http::{header, HeaderValue};
use axum::middleware::map_response;
use axum::response::Response;
use axum::Router;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper::server::conn::http1;
use hyper::service::Service;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};

use crate::tls::TlsCerts;

/// The largest request head taken. The longest legitimate head is a console request with its
/// session cookie or a webhook with its signature header (at most 1024 characters): a few KiB.
/// hyper's floor for this buffer is 8 KiB; its default, about 400 KiB per connection, is what
/// let idle connections grow the process by hundreds of megabytes.
pub const MAX_HEAD_BYTES: usize = 16 * 1024;

/// A TLS client gets this long to finish its handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// What a connection beyond the cap is told before it is closed. Written without waiting (a
/// fresh socket's send buffer is empty), so a refusal never holds the descriptor.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\nconnection: close\r\ncontent-length: 0\r\nretry-after: 1\r\n\r\n";

/// One listener's limits.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    /// From connecting, or from the previous response, to a complete request head.
    pub header_timeout: Duration,
    /// Connections open at once (after `connection_cap`).
    pub max_connections: usize,
    /// How long requests in flight at shutdown may run on.
    pub shutdown_grace: Duration,
}

/// The connection cap a listener gets: the configured one, but at most a quarter of the
/// process's descriptor limit (RLIMIT_NOFILE, soft). The relay runs two HTTP listeners (admin
/// and webhooks), so together they hold at most half the descriptors, however many clients
/// connect; the other half stays for SMTP sessions, upstream connections and the store. The
/// descriptor limit is per process: without this, idle HTTP connections starve SMTP's accept.
pub fn connection_cap(configured: usize) -> usize {
    cap_within(configured, open_files_limit())
}

fn cap_within(configured: usize, open_files: Option<u64>) -> usize {
    match open_files {
        Some(limit) => configured.min(usize::try_from(limit / 4).unwrap_or(usize::MAX).max(1)),
        None => configured,
    }
    .max(1)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn open_files_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes into the struct it is given and nothing else.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    (got == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn open_files_limit() -> Option<u64> {
    None
}

/// Serves `router` on `listener` (TLS on every connection with `tls`) until `stop` completes,
/// then closes as described in the module's comment and returns once every connection is gone.
/// `name` tells the listeners apart in the log.
pub async fn serve(
    name: &'static str,
    listener: TcpListener,
    tls: Option<Arc<TlsCerts>>,
    router: Router,
    limits: HttpLimits,
    stop: impl Future<Output = ()>,
) {
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES)
        .keep_alive(true);
    let http = Arc::new(http);
    let service = TowerToHyperService::new(router.layer(map_response(no_store_nosniff)));
    // At most what `acquire_many` counts (u32) and a semaphore holds: far above any
    // descriptor limit.
    let cap = limits
        .max_connections
        .clamp(1, (u32::MAX as usize).min(Semaphore::MAX_PERMITS));
    let permits = Arc::new(Semaphore::new(cap));
    let (stopping, stop_seen) = watch::channel(false);
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            () = &mut stop => break,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(err) => {
                // Out of descriptors and the like: wait rather than spin.
                tracing::warn!(target: "idemrelay::http", listener = name, error = %err, "accept failed");
                tokio::select! {
                    () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    () = &mut stop => break,
                }
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::debug!(target: "idemrelay::http", listener = name, %peer, cap, "connection refused: at the connection cap");
            let _ = stream.try_write(BUSY);
            continue;
        };
        let http = http.clone();
        let service = service.clone();
        let tls = tls.clone();
        let mut stop_seen = stop_seen.clone();
        let grace = limits.shutdown_grace;
        tokio::spawn(async move {
            let _permit = permit;
            let Some(certs) = tls else {
                connection(&http, stream, service, stop_seen, grace).await;
                return;
            };
            let handshake =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, certs.acceptor().accept(stream));
            let stream = tokio::select! {
                done = handshake => match done {
                    Ok(Ok(stream)) => stream,
                    Ok(Err(err)) => {
                        tracing::debug!(target: "idemrelay::http", listener = name, %peer, error = %err, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(target: "idemrelay::http", listener = name, %peer, "TLS handshake timed out");
                        return;
                    }
                },
                _ = stop_seen.wait_for(|stopping| *stopping) => return,
            };
            connection(&http, stream, service, stop_seen, grace).await;
        });
    }
    // New connections now meet a closed port instead of waiting in the backlog.
    drop(listener);
    let _ = stopping.send(true);
    // Every connection holds a permit until it ends: all of them back means all are closed.
    let _ = permits
        .acquire_many(u32::try_from(cap).unwrap_or(u32::MAX))
        .await;
}

async fn no_store_nosniff(mut response: Response) -> Response {
    let headers = response.headers_mut();
    headers
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("no-store"));
    headers
        .entry(header::X_CONTENT_TYPE_OPTIONS)
        .or_insert(HeaderValue::from_static("nosniff"));
    response
}

async fn connection<I>(
    http: &http1::Builder,
    io: I,
    service: TowerToHyperService<Router>,
    mut stop_seen: watch::Receiver<bool>,
    grace: Duration,
) where
    I: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let busy = Arc::new(AtomicUsize::new(0));
    let tracked = Tracked {
        inner: service,
        busy: busy.clone(),
    };
    let conn = http.serve_connection(TokioIo::new(io), tracked);
    tokio::pin!(conn);
    tokio::select! {
        // Errors here are the client's doing (a head too large or too slow, a reset): hyper
        // has already answered or closed, and there is nothing for the operator to act on.
        _ = conn.as_mut() => return,
        _ = stop_seen.wait_for(|stopping| *stopping) => {}
    }
    // Nothing being answered: an idle connection or one whose head is still arriving (hyper's
    // own graceful shutdown would wait for that head). Dropping closes it now.
    if busy.load(Ordering::Acquire) == 0 {
        return;
    }
    conn.as_mut().graceful_shutdown();
    let _ = tokio::time::timeout(grace, conn).await;
}

/// The router as hyper's service, counting the requests of one connection from the call until
/// their response body has been sent, so that shutdown knows which connections it may cut.
#[derive(Clone)]
struct Tracked {
    inner: TowerToHyperService<Router>,
    busy: Arc<AtomicUsize>,
}

impl Service<hyper::Request<Incoming>> for Tracked {
    type Response = hyper::Response<Guarded>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn call(&self, request: hyper::Request<Incoming>) -> Self::Future {
        let guard = Busy::enter(&self.busy);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response: Response = answer.await?;
            Ok(response.map(|body| Guarded {
                inner: body,
                _busy: guard,
            }))
        })
    }
}

/// One request being answered on a connection.
struct Busy(Arc<AtomicUsize>);

impl Busy {
    fn enter(count: &Arc<AtomicUsize>) -> Busy {
        count.fetch_add(1, Ordering::AcqRel);
        Busy(count.clone())
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted until hyper has sent (and dropped) it.
struct Guarded {
    inner: Body,
    _busy: Busy,
}

impl HttpBody for Guarded {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::cap_within;

    #[test]
    fn the_cap_leaves_three_quarters_of_the_descriptors_per_listener() {
        assert_eq!(cap_within(256, Some(400)), 100);
        assert_eq!(cap_within(256, Some(1024)), 256);
        assert_eq!(cap_within(256, Some(1_048_576)), 256);
        assert_eq!(cap_within(256, None), 256);
        assert_eq!(cap_within(256, Some(2)), 1);
        assert_eq!(cap_within(0, Some(400)), 1);
    }
}
