//! TLS for the submission listeners: the server configuration from PEM files, swapped in place
//! when the files change or on SIGHUP, so certificate renewals need no restart.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

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
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("TLS certificate and key do not fit together")?;
    // The provider lists its suites strongest first; a client's order may put a weaker one
    // first (testssl: "Has server cipher order? no").
    config.ignore_client_order = true;
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

/// How long a generated certificate is valid: under the 398 days that browsers and TLS
/// libraries accept for a server certificate, and long enough for a test or a demo setup.
pub const SELF_SIGNED_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// The names a generated certificate carries unless told otherwise: what clients on this host
/// connect to (msmtp checks an IP address against the IP SANs, not against `localhost`).
pub fn default_certificate_names(host_name: &str) -> Vec<String> {
    let mut names: Vec<String> = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
    if !names.iter().any(|n| n.eq_ignore_ascii_case(host_name)) {
        names.push(host_name.to_string());
    }
    names
}

/// The certificate's fields: `names` as SANs (IP addresses as IP SANs), the first as its common
/// name, a server-authentication certificate valid from an hour before `now` (clocks differ)
/// for [`SELF_SIGNED_VALIDITY`].
pub fn self_signed_params(
    names: &[String],
    now: SystemTime,
) -> anyhow::Result<rcgen::CertificateParams> {
    anyhow::ensure!(!names.is_empty(), "a certificate needs at least one name");
    let mut params = rcgen::CertificateParams::new(names.to_vec())
        .context("a name is neither a DNS name nor an IP address")?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, names[0].clone());
    params.distinguished_name.push(
        rcgen::DnType::OrganizationName,
        "idemrelay self-signed".to_string(),
    );
    params.not_before = time::OffsetDateTime::from(now - Duration::from_secs(3600));
    params.not_after = time::OffsetDateTime::from(now + SELF_SIGNED_VALIDITY);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    Ok(params)
}

/// Writes a self-signed certificate and key for local use (`idemrelay certs generate`).
pub fn generate_self_signed(dir: &Path, names: &[String]) -> anyhow::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let signing_key = rcgen::KeyPair::generate()?;
    let certificate = self_signed_params(names, SystemTime::now())?.self_signed(&signing_key)?;
    let cert = dir.join("cert.pem");
    let key = dir.join("key.pem");
    std::fs::write(&cert, certificate.pem())?;
    write_private(&key, signing_key.serialize_pem().as_bytes())?;
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

    #[test]
    fn default_names_cover_loopback_and_the_host_name_once() {
        assert_eq!(
            default_certificate_names("mail.example.net"),
            ["localhost", "127.0.0.1", "::1", "mail.example.net"]
        );
        assert_eq!(
            default_certificate_names("LOCALHOST"),
            ["localhost", "127.0.0.1", "::1"]
        );
    }

    #[test]
    fn generated_certificates_carry_ip_sans_and_a_validity_tools_accept() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let names = default_certificate_names("relay.test");
        let params = self_signed_params(&names, now).unwrap();
        assert_eq!(
            params.subject_alt_names,
            [
                rcgen::SanType::DnsName("localhost".try_into().unwrap()),
                rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()),
                rcgen::SanType::IpAddress("::1".parse().unwrap()),
                rcgen::SanType::DnsName("relay.test".try_into().unwrap()),
            ]
        );
        let days = (params.not_after - params.not_before).whole_days();
        assert!((365..398).contains(&days), "{days} days");
        assert!(params.not_before < time::OffsetDateTime::from(now));
        assert!(self_signed_params(&[], now).is_err());
        assert!(self_signed_params(&["r\u{e9}sum\u{e9}.example".into()], now).is_err());
    }

    /// Drives a handshake between two in-memory connections.
    fn handshake(client: &mut rustls::ClientConnection, server: &mut rustls::ServerConnection) {
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).unwrap();
            server.read_tls(&mut &buf[..]).unwrap();
            server.process_new_packets().unwrap();
            buf.clear();
            server.write_tls(&mut buf).unwrap();
            client.read_tls(&mut &buf[..]).unwrap();
            client.process_new_packets().unwrap();
            if !client.is_handshaking() && !server.is_handshaking() {
                return;
            }
        }
        panic!("handshake did not finish");
    }

    #[test]
    fn the_server_picks_the_cipher_suite_by_its_own_order() {
        use rustls::crypto::ring::{cipher_suite, default_provider};
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = generate_self_signed(dir.path(), &["localhost".into()]).unwrap();
        let server_config = server_config(&cert, &key).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(&cert).unwrap() {
            roots.add(c.unwrap()).unwrap();
        }
        // A client that prefers the weakest suites first, TLS 1.3 and 1.2 alike.
        for (versions, suites, strongest) in [
            (
                &[&rustls::version::TLS13][..],
                vec![
                    cipher_suite::TLS13_CHACHA20_POLY1305_SHA256,
                    cipher_suite::TLS13_AES_128_GCM_SHA256,
                    cipher_suite::TLS13_AES_256_GCM_SHA384,
                ],
                cipher_suite::TLS13_AES_256_GCM_SHA384,
            ),
            (
                &[&rustls::version::TLS12][..],
                vec![
                    cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
                    cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                    cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
                ],
                cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            ),
        ] {
            let provider = rustls::crypto::CryptoProvider {
                cipher_suites: suites,
                ..default_provider()
            };
            let client_config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
                .with_protocol_versions(versions)
                .unwrap()
                .with_root_certificates(roots.clone())
                .with_no_client_auth();
            let mut client = rustls::ClientConnection::new(
                Arc::new(client_config),
                "localhost".try_into().unwrap(),
            )
            .unwrap();
            let mut server = rustls::ServerConnection::new(server_config.clone()).unwrap();
            handshake(&mut client, &mut server);
            assert_eq!(
                server.negotiated_cipher_suite().unwrap().suite(),
                strongest.suite()
            );
        }
    }
}
