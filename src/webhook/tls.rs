//! HTTPS for the webhook listener: the SMTP listeners' certificates (reloaded in place), each
//! handshake in a task of its own and bounded in time, so a client that stalls in its
//! handshake holds up nobody else's.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_rustls::server::TlsStream;

use crate::smtp::tls::TlsCerts;

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Handshaken connections waiting for the server to take them.
const READY_QUEUE: usize = 64;

pub(crate) struct TlsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
    accepting: JoinHandle<()>,
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, certs: Arc<TlsCerts>) -> TlsListener {
        let local = listener
            .local_addr()
            .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
        let (tx, ready) = mpsc::channel(READY_QUEUE);
        let accepting = tokio::spawn(async move {
            loop {
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(err) => {
                        // Out of descriptors and the like: wait rather than spin.
                        tracing::warn!(target: "idemrelay::webhook", error = %err, "accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if tx.is_closed() {
                    return;
                }
                let acceptor = certs.acceptor();
                let tx = tx.clone();
                tokio::spawn(async move {
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                        Ok(Ok(tls)) => {
                            let _ = tx.send((tls, peer)).await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(target: "idemrelay::webhook", %peer, error = %err, "TLS handshake failed")
                        }
                        Err(_) => {
                            tracing::debug!(target: "idemrelay::webhook", %peer, "TLS handshake timed out")
                        }
                    }
                });
            }
        });
        TlsListener {
            ready,
            local,
            accepting,
        }
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.accepting.abort();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(ready) => ready,
            // The accept task only ends when aborted, which happens when this is dropped.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local)
    }
}
