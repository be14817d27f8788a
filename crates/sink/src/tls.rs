//! The sink's TLS server configuration, loaded from PEM files.

use std::path::Path;

use tokio_rustls::TlsAcceptor;

pub(crate) fn acceptor(cert: &Path, key: &Path) -> anyhow::Result<TlsAcceptor> {
    Ok(TlsAcceptor::from(idemrelay_serve::tls::server_config(
        cert, key,
    )?))
}
