//! TLS for the submission listeners: the server configuration from PEM files, swapped in place
//! when the files change or on SIGHUP, so certificate renewals need no restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use anyhow::Context as _;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::ServerConfig;
use tokio_rustls::TlsAcceptor;

/// Builds a rustls server configuration (ring provider) from a PEM chain and key.
pub fn server_config(cert: &Path, key: &Path) -> anyhow::Result<Arc<ServerConfig>> {
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading TLS certificates from {}", cert.display()))?;
    anyhow::ensure!(!certs.is_empty(), "no certificate in {}", cert.display());
    let key = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading TLS private key from {}", key.display()))?;
    // Explicit provider: the process links more than one, and then there is no default.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("TLS certificate and key do not fit together")?;
    Ok(Arc::new(config))
}

pub struct TlsCerts {
    cert: PathBuf,
    key: PathBuf,
    current: RwLock<Loaded>,
}

struct Loaded {
    config: Arc<ServerConfig>,
    stamp: (Option<SystemTime>, Option<SystemTime>),
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl TlsCerts {
    pub fn load(cert: &Path, key: &Path) -> anyhow::Result<TlsCerts> {
        Ok(TlsCerts {
            current: RwLock::new(Loaded {
                config: server_config(cert, key)?,
                stamp: (modified(cert), modified(key)),
            }),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        })
    }

    /// An acceptor for one handshake, with the configuration current now.
    pub fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(self.current.read().expect("tls config").config.clone())
    }

    /// Reloads when forced (SIGHUP) or when either file changed. A pair that does not load
    /// (say, the key is being rewritten) keeps the old configuration in service.
    pub fn reload(&self, force: bool) -> anyhow::Result<bool> {
        let stamp = (modified(&self.cert), modified(&self.key));
        if !force && self.current.read().expect("tls config").stamp == stamp {
            return Ok(false);
        }
        let config = server_config(&self.cert, &self.key)?;
        *self.current.write().expect("tls config") = Loaded { config, stamp };
        Ok(true)
    }
}

/// Writes a self-signed certificate and key for local use (`idemrelay certs generate`).
pub fn generate_self_signed(dir: &Path, names: &[String]) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let certified = rcgen::generate_simple_self_signed(names.to_vec())?;
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certified.cert.pem())?;
    write_private(&key, certified.signing_key.serialize_pem().as_bytes())?;
    Ok((cert, key))
}

fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_pair_loads_and_reloads_on_change() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = generate_self_signed(dir.path(), &["localhost".into()]).unwrap();
        let mode = std::os::unix::fs::PermissionsExt::mode(
            &std::fs::metadata(&key).unwrap().permissions(),
        );
        assert_eq!(mode & 0o777, 0o600);
        let certs = TlsCerts::load(&cert, &key).unwrap();
        assert!(!certs.reload(false).unwrap());
        assert!(certs.reload(true).unwrap());
        // A broken file keeps the old configuration serving.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(&key, b"not a key").unwrap();
        assert!(certs.reload(false).is_err());
        let _still_serving = certs.acceptor();
        generate_self_signed(dir.path(), &["localhost".into()]).unwrap();
        assert!(certs.reload(false).unwrap());
    }
}
