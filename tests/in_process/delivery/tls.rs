//! TLS to the upstream: STARTTLS and implicit TLS with a custom CA, an untrusted certificate,
//! and a plaintext upstream.

use super::*;

/// A sink with TLS from a certificate made now, and AUTH required.
async fn tls_sink(implicit: bool) -> (SinkHandle, tempfile::TempDir) {
    let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("cert.pem");
    let key = dir.path().join("key.pem");
    std::fs::write(&cert, certified.cert.pem()).unwrap();
    std::fs::write(&key, certified.signing_key.serialize_pem()).unwrap();
    let sink = Sink::start(SinkConfig {
        tls: Some((cert, key)),
        implicit_tls: implicit,
        require_auth: Some(("relay-user".into(), "s3cret pass".into())),
        ..SinkConfig::default()
    })
    .await
    .unwrap();
    (sink, dir)
}

async fn deliver_over_tls(url: String, sink: &SinkHandle, ca: std::path::PathBuf) {
    let relay = relay_for(sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(url));
        s.delivery.ca_file = Some(ca);
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("tls-1"), "s", "b"),
    )
    .await;
    wait_state(&relay, &id, State::Delivered).await;
    let got = sink.messages();
    assert_eq!(got.len(), 1);
    assert!(got[0].tls, "delivered without TLS");
    assert_eq!(got[0].auth_user.as_deref(), Some("relay-user"));
    assert_eq!(got[0].bytes, relay.stored(&id).await.content.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn starttls_and_auth_with_a_custom_ca() {
    let (sink, dir) = tls_sink(false).await;
    let port = sink.smtp_addr().port();
    // The password is percent-encoded in the URL (it has a space).
    let url = format!("smtp://relay-user:s3cret%20pass@localhost:{port}");
    deliver_over_tls(url, &sink, dir.path().join("cert.pem")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn implicit_tls_and_auth_with_a_custom_ca() {
    let (sink, dir) = tls_sink(true).await;
    let port = sink.smtp_addr().port();
    let url = format!("smtps://relay-user:s3cret%20pass@localhost:{port}");
    deliver_over_tls(url, &sink, dir.path().join("cert.pem")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_certificate_is_not_delivered_to() {
    let (sink, _dir) = tls_sink(false).await;
    let port = sink.smtp_addr().port();
    let relay = relay_for(&sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(format!(
            "smtp://relay-user:s3cret%20pass@localhost:{port}"
        )));
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("tls-untrusted"), "s", "b"),
    )
    .await;
    eventually(LIMIT, "a failed TLS attempt", || async {
        let ledger = relay.store().attempts(&id).await.unwrap();
        ledger
            .first()
            .filter(|a| a.finished_at_ms.is_some())
            .cloned()
    })
    .await;
    let ledger = relay.store().attempts(&id).await.unwrap();
    assert_eq!(
        ledger[0].outcome.as_deref(),
        Some("transient"),
        "{ledger:?}"
    );
    assert_eq!(ledger[0].phase.as_deref(), Some("starttls"), "{ledger:?}");
    assert!(sink.messages().is_empty());
    assert_eq!(relay.stored(&id).await.state, State::Queued);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plaintext_upstream_without_starttls_is_refused_for_smtp_urls() {
    // `smtp://` without `?tls=none` requires STARTTLS: a sink that does not offer it is not
    // given the message (nor the password) in the clear.
    let sink = start_sink().await;
    let port = sink.smtp_addr().port();
    let relay = relay_for(&sink, |s| {
        s.upstream = Some(idemrelay::config::SecretUrl(format!(
            "smtp://user:pw@127.0.0.1:{port}"
        )));
    })
    .await;
    let id = submit(
        &relay,
        "sender@example.com",
        &["rcpt@example.com"],
        &message(Some("no-starttls"), "s", "b"),
    )
    .await;
    let attempt = eventually(LIMIT, "a refused attempt", || async {
        relay
            .store()
            .attempts(&id)
            .await
            .unwrap()
            .into_iter()
            .find(|a| a.finished_at_ms.is_some())
    })
    .await;
    assert_eq!(attempt.phase.as_deref(), Some("starttls"));
    assert_eq!(attempt.outcome.as_deref(), Some("transient"));
    assert_eq!(sink.transactions().len(), 0);
}
