//! STARTTLS and implicit TLS, with AUTH PLAIN and LOGIN.

use super::*;

struct Tls {
    _dir: tempfile::TempDir,
    paths: (std::path::PathBuf, std::path::PathBuf),
    connector: tokio_rustls::TlsConnector,
}

fn tls_setup() -> Tls {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certified.cert.der().clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    Tls {
        _dir: dir,
        paths: (cert, key),
        connector: tokio_rustls::TlsConnector::from(Arc::new(config)),
    }
}

fn localhost() -> rustls::pki_types::ServerName<'static> {
    rustls::pki_types::ServerName::try_from("localhost").unwrap()
}

fn has_line(reply: &Reply, want: &str) -> bool {
    reply.lines.iter().any(|l| &l[4..] == want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_then_auth_plain_and_login() {
    let tls = tls_setup();
    let sink = start(SinkConfig {
        tls: Some(tls.paths.clone()),
        require_auth: Some(("relay".into(), "s3cret".into())),
        ..SinkConfig::default()
    })
    .await;

    let mut plain = connect(sink.smtp_addr()).await;
    let ehlo = plain.expect("EHLO client.test", 250).await;
    assert!(has_line(&ehlo, "STARTTLS"), "{ehlo:?}");
    assert!(has_line(&ehlo, "AUTH PLAIN LOGIN"), "{ehlo:?}");
    for ext in ["PIPELINING", "8BITMIME", "SMTPUTF8", "ENHANCEDSTATUSCODES"] {
        assert!(has_line(&ehlo, ext), "{ext} missing from {ehlo:?}");
    }
    plain.expect("MAIL FROM:<a@example.com>", 530).await;
    // A command pipelined behind STARTTLS in plaintext must be thrown away: were it run
    // inside the TLS session, its reply (503, no EHLO yet) would come first and be read below
    // as the answer to EHLO.
    plain
        .send(b"STARTTLS\r\nMAIL FROM:<injected@example.com>\r\n")
        .await;
    assert_eq!(plain.reply().await.unwrap().code, 220);
    let stream = tls
        .connector
        .connect(localhost(), plain.stream)
        .await
        .unwrap();
    let mut c = Client::new(stream);
    let ehlo = c.expect("EHLO client.test", 250).await;
    assert!(!has_line(&ehlo, "STARTTLS"), "{ehlo:?}");
    c.expect("NOOP", 250).await;

    let wrong = c
        .cmd(&format!("AUTH PLAIN {}", b64(b"\0relay\0wrong")))
        .await;
    assert_eq!(wrong.line(), "535 5.7.8 Authentication credentials invalid");
    c.expect(&format!("AUTH PLAIN {}", b64(b"\0relay\0s3cret")), 235)
        .await;
    c.expect("AUTH PLAIN", 503).await;
    let msg = message(Some("tls-1"), "over TLS");
    let reply = c
        .submit("a@example.com", &["b@example.com"], &msg)
        .await
        .unwrap();
    assert_eq!(reply.code, 250);
    c.expect("QUIT", 221).await;

    // AUTH LOGIN, in its two-step form, and PLAIN with the response on its own line.
    let mut plain = session(sink.smtp_addr()).await;
    plain.expect("STARTTLS", 220).await;
    let mut c = Client::new(
        tls.connector
            .connect(localhost(), plain.stream)
            .await
            .unwrap(),
    );
    c.expect("EHLO client.test", 250).await;
    assert_eq!(c.cmd("AUTH LOGIN").await.line(), "334 VXNlcm5hbWU6");
    assert_eq!(c.cmd(&b64(b"relay")).await.line(), "334 UGFzc3dvcmQ6");
    c.expect(&b64(b"nope"), 535).await;
    assert_eq!(c.cmd("AUTH PLAIN").await.code, 334);
    c.expect("*", 501).await;
    assert_eq!(
        c.cmd(&format!("AUTH LOGIN {}", b64(b"relay"))).await.code,
        334
    );
    c.expect(&b64(b"s3cret"), 235).await;

    let messages = sink.messages();
    assert_eq!(messages.len(), 1);
    assert!(messages[0].tls);
    assert_eq!(messages[0].auth_user.as_deref(), Some("relay"));
    assert_eq!(messages[0].bytes, msg);
    sink.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implicit_tls() {
    let tls = tls_setup();
    let sink = start(SinkConfig {
        tls: Some(tls.paths.clone()),
        implicit_tls: true,
        ..SinkConfig::default()
    })
    .await;
    let tcp = TcpStream::connect(sink.smtp_addr()).await.unwrap();
    let mut c = Client::new(tls.connector.connect(localhost(), tcp).await.unwrap());
    assert_eq!(c.reply().await.unwrap().code, 220);
    let ehlo = c.expect("EHLO client.test", 250).await;
    assert!(!has_line(&ehlo, "STARTTLS"), "{ehlo:?}");
    c.expect("STARTTLS", 502).await;
    let reply = c
        .submit(
            "a@example.com",
            &["b@example.com"],
            &message(Some("smtps"), "x"),
        )
        .await
        .unwrap();
    assert_eq!(reply.code, 250);
    assert!(sink.messages()[0].tls);
    sink.shutdown().await;
}
